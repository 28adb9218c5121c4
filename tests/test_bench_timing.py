"""benchmarks/_report.timed: warm-up, batches closed by a sync, and the median of several rounds."""

from benchmarks import _report


class _Clock:
    """A fake perf_counter: each call of ``fn`` advances it by the next cost in ``costs``."""

    def __init__(self, costs):
        self.now, self.costs, self.calls, self.syncs = 0.0, list(costs), 0, 0

    def perf_counter(self):
        return self.now

    def fn(self):
        self.now += self.costs[self.calls % len(self.costs)]
        self.calls += 1

    def sync(self):
        self.syncs += 1


def test_rounds_return_the_median_of_the_round_means(monkeypatch):
    # warm-up call (cost 0), then 3 rounds of 4 calls: one round with a 40 ms stall, two of 1 ms calls
    clock = _Clock([0.0] + [0.010, 0.010, 0.010, 0.010] + [0.001] * 4 + [0.002] * 4)
    clock.costs += [0.001] * 100
    monkeypatch.setattr(_report.time, "perf_counter", clock.perf_counter)
    sec = _report.timed(clock.fn, clock.sync, 4, warmup=1, rounds=3)
    assert clock.calls == 1 + 3 * 4 and clock.syncs == 1 + 3
    assert abs(sec - 0.002) < 1e-12  # round means 10, 1 and 2 ms: the median, not the mean (4.33 ms)


def test_one_round_is_the_mean_until_min_time(monkeypatch):
    clock = _Clock([0.0] + [0.003] * 100)
    monkeypatch.setattr(_report.time, "perf_counter", clock.perf_counter)
    sec = _report.timed(clock.fn, clock.sync, 2, 0.010, warmup=1)
    # batches of 2 calls (6 ms each) until 10 ms: two batches, 4 calls
    assert clock.calls == 1 + 4 and clock.syncs == 1 + 2
    assert abs(sec - 0.003) < 1e-12
