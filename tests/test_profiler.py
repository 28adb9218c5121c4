"""wgpar.profiler: GPU timestamps per dispatch, host ranges, collectives per rank, the table and the Chrome
trace, the fallback without timestamp queries, and nothing at all while no profile runs."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest

import wgpar
from wgpar import nn
from wgpar.nn import functional as F
from wgpar.profiler import profile, record_function
from wgpar.runtime import profiling


def _train_step(dev, rng):
    """One step of a Linear + cross-entropy model with SGD; returns the loss."""
    model = nn.Linear(37, 5).to(dev)
    opt = wgpar.optim.SGD(model.parameters(), lr=0.1)
    x = wgpar.tensor(rng.standard_normal((19, 37)).astype(np.float32), device=dev)
    y = wgpar.tensor(rng.integers(0, 5, 19).astype(np.int32), device=dev)
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    wgpar.synchronize(dev)
    return loss


def _dispatched_labels(dev, monkeypatch, fn) -> Counter:
    """The kernel labels ``fn`` dispatches on ``dev``, counted by wrapping Device.dispatch."""
    seen: Counter = Counter()
    real = dev.dispatch

    def counting(kspec, *args, **kwargs):
        seen[kspec.label] += 1
        return real(kspec, *args, **kwargs)

    monkeypatch.setattr(dev, "dispatch", counting)
    fn()
    monkeypatch.undo()
    return seen


def test_every_kernel_of_a_training_step_is_timed_with_its_phase(dev, rng, monkeypatch):
    expected = _dispatched_labels(dev, monkeypatch, lambda: _train_step(dev, rng))
    with profile() as prof:
        _train_step(dev, rng)
    kernels = [k for k in prof.kernels() if k.device == dev.index]
    assert Counter(k.name for k in kernels) == expected
    families = Counter(k.family for k in kernels)
    assert families["optim_sgd"] == 2  # weight and bias
    assert families["cross_entropy"] == 2  # forward and backward
    assert all(k.gpu_dur is not None and k.gpu_dur > 0 for k in kernels)
    phases = {k.family: k.phase for k in kernels if k.family in ("optim_sgd", "matmul")}
    assert phases["optim_sgd"] == "optimizer"
    assert {k.phase for k in kernels if "BACKWARD=true" in k.name} == {"backward"}
    assert {k.phase for k in kernels if "BACKWARD=false" in k.name} == {"forward"}
    matmuls = [k for k in kernels if k.family.startswith("matmul")]
    assert matmuls[0].flops == 2 * 19 * 37 * 5  # the forward x @ W^T
    assert all(k.flops > 0 for k in matmuls)
    table = prof.key_averages().table(sort_by="gpu_time_total", row_limit=50)
    assert "GPU time from timestamp queries" in table and "GPU time by phase" in table
    row = next(r for r in prof.key_averages() if r.kind == "kernel" and "optim_sgd" in r.key)
    assert row.count == 2 and row.gpu_time_total > 0 and row.host_time_total > 0
    assert any(r.gflops for r in prof.key_averages() if r.kind == "kernel" and r.key.startswith("wgpar:matmul"))


@pytest.mark.parametrize("timing", ["kernels", "exact"])
def test_gpu_times_are_positive_do_not_overlap_and_fit_in_the_wall_time(dev, rng, timing):
    with profile(timing=timing) as prof:
        _train_step(dev, rng)
        a = wgpar.tensor(rng.standard_normal(1000).astype(np.float32), device=dev)
        for _ in range(1100):  # more than one submit's worth of timestamp slots (1024 dispatches)
            a = a + 1.0
        a.numpy()
    res = prof.results
    kernels = [k for k in res.kernels if k.device == dev.index]
    assert len(kernels) > 1100
    assert all(k.gpu_dur > 0 and k.gpu_start >= 0 and k.host_dur > 0 for k in kernels)
    assert sum(k.gpu_dur for k in kernels) <= res.wall
    spans = sorted((k.gpu_start, k.gpu_start + k.gpu_dur) for k in kernels)
    assert all(end <= nxt + 1000 for (_, end), (nxt, _) in zip(spans, spans[1:]))  # one queue: in sequence
    assert max(end for _, end in spans) <= res.wall + 1000


def _stamps_written(monkeypatch) -> list:
    written = []
    real = profiling.write_timestamp
    monkeypatch.setattr(profiling, "write_timestamp", lambda cp, qs, i: (written.append(i), real(cp, qs, i)))
    return written


@pytest.mark.parametrize("timing", ["kernels", "exact"])
def test_kernels_timing_shares_one_stamp_between_consecutive_dispatches(dev, rng, monkeypatch, timing):
    """The default writes one timestamp per dispatch plus one per compute pass, and a pass's kernels
    follow each other without gaps; "exact" writes two per dispatch."""
    a = wgpar.tensor(rng.standard_normal(1000).astype(np.float32), device=dev)
    monkeypatch.setattr(dev, "_early", False)  # a GPU's early submits after the wait would end the pass
    wgpar.synchronize(dev)
    written = _stamps_written(monkeypatch)
    with profile(timing=timing) as prof:
        b = a
        for _ in range(7):  # one pass: no copy ends it
            b = b * 1.5
        b.numpy()
    kernels = [k for k in prof.kernels() if k.device == dev.index]
    assert len(kernels) == 7 and all(k.gpu_dur > 0 for k in kernels)
    assert len(written) == (8 if timing == "kernels" else 14)
    gaps = [nxt.gpu_start - (k.gpu_start + k.gpu_dur) for k, nxt in zip(kernels, kernels[1:])]
    if timing == "kernels":
        assert all(abs(g) <= 1 for g in gaps)  # each starts at the stamp that ended the one before
    else:
        assert all(g >= -1 for g in gaps)
    np.testing.assert_allclose(b.numpy(), a.numpy() * 1.5 ** 7, rtol=1e-6)


def test_an_unknown_timing_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="timing='fast'.*'kernels', 'exact'"):
        profile(timing="fast")


def test_the_chrome_trace_is_well_formed(dev, rng, tmp_path):
    with profile() as prof, record_function("train step"):
        _train_step(dev, rng)
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(path)
    trace = json.loads(path.read_text())
    events = trace["traceEvents"]
    named = {(e["pid"], e["tid"]) for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    processes = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    complete = [e for e in events if e["ph"] == "X"]
    assert complete
    for e in events:
        assert isinstance(e["name"], str) and e["name"]
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int)
        assert e["ph"] in ("X", "M")
    for e in complete:
        assert isinstance(e["ts"], (int, float)) and isinstance(e["dur"], (int, float))
        assert e["ts"] >= 0 and e["dur"] >= 0
        assert isinstance(e["cat"], str) and isinstance(e["args"], dict)
        assert (e["pid"], e["tid"]) in named and e["pid"] in processes
    gpu = [e for e in complete if e["cat"] == "kernel"]
    assert gpu and {processes[e["pid"]] for e in gpu} == {f"GPU {dev}"}
    host_cats = {e["cat"] for e in complete if e["pid"] == 0}
    assert {"range", "phase", "dispatch", "submit", "transfer"} <= host_cats
    assert any(e["cat"] == "kernel" and "flops" in e["args"] and "GFLOP/s" in e["args"] for e in gpu)


def test_record_function_ranges_nest_as_context_and_decorator(dev, rng):
    @record_function("inner")
    def inner(t):
        return (t * 2.0).sum()

    x = wgpar.tensor(rng.standard_normal(300).astype(np.float32), device=dev)
    with profile() as prof:
        with record_function("outer"):
            inner(x)
            inner(x)
        (x + 1.0).numpy()
    ranges = {r.name: [] for r in prof.ranges()}
    for r in prof.ranges():
        ranges[r.name].append(r)
    (outer,) = ranges["outer"]
    assert len(ranges["inner"]) == 2
    for r in ranges["inner"]:
        assert outer.start <= r.start and r.start + r.dur <= outer.start + outer.dur
        assert r.thread == outer.thread
    rows = {r.key: r for r in prof.key_averages() if r.kind == "range"}
    assert rows["inner"].count == 2 and rows["outer"].count == 1
    # kernels recorded inside them; the totals are float sums of the same durations in another order
    assert 0 < rows["inner"].gpu_time_total <= rows["outer"].gpu_time_total * (1 + 1e-9)


def test_a_two_rank_all_reduce_shows_on_each_ranks_track():
    def fn(g):
        t = wgpar.full((1000,), float(g.rank + 1), device=g.device)
        g.all_reduce(t)
        return t.numpy()

    with profile() as prof:
        out = wgpar.distributed.run_spmd(fn, 2)
    assert all(np.array_equal(o, np.full(1000, 3.0, np.float32)) for o in out)
    res = prof.results
    reduces = [r for r in res.ranges if r.cat == "collective" and r.name == "all_reduce"]
    assert sorted(r.args["rank"] for r in reduces) == [0, 1]
    assert len({r.thread for r in reduces}) == 2  # each rank's communication thread: a track of its own
    for r in reduces:
        inside = [q for q in res.ranges if q.thread == r.thread and r.start <= q.start <= r.start + r.dur]
        names = {q.name for q in inside}
        assert {"map wait", "rendezvous", "host reduce", "staging -> device"} <= names, names
        assert res.threads[r.thread].startswith("wgpar-comm")
    launches = [r for r in res.ranges if r.name == "device -> staging"]
    assert {r.args["device"] for r in launches} >= {d.index for d in wgpar.devices(2)}
    assert "all_reduce" in prof.key_averages().table(sort_by="host_time_total")


def test_no_query_set_or_recorder_exists_while_no_profile_runs(dev, rng, monkeypatch):
    made = []
    gpu_device = type(dev._dev)
    real = gpu_device.create_query_set

    def counting(self, **kwargs):
        made.append(kwargs)
        return real(self, **kwargs)

    monkeypatch.setattr(gpu_device, "create_query_set", counting)
    _train_step(dev, rng)
    assert made == [] and profiling.ACTIVE is None and dev._ptrack is None
    with profile():
        _train_step(dev, rng)
        assert dev._ptrack is not None
    opened = list(profiling.DEVICES)  # each open device gets its query set when the profile starts
    assert len(made) == len(opened) and dev in opened
    assert {m["label"] for m in made} == {f"wgpar:{d.index}:profiler" for d in opened}
    mine = [m for m in made if m["label"] == f"wgpar:{dev.index}:profiler"]
    assert len(mine) == 1 and mine[0]["count"] == 2 * dev.max_dispatches_per_submit
    assert profiling.ACTIVE is None and dev._ptrack is None
    _train_step(dev, rng)
    assert len(made) == len(opened)


def test_without_timestamp_queries_it_falls_back_to_host_times_and_says_so(dev, rng, monkeypatch, tmp_path):
    monkeypatch.setattr(dev, "features", dev.features - {"timestamp-query-inside-passes"})
    with profile() as prof:
        loss = _train_step(dev, rng)
    assert np.isfinite(loss.item())
    kernels = [k for k in prof.kernels() if k.device == dev.index]
    assert kernels and all(k.gpu_dur is None and k.host_dur > 0 for k in kernels)
    table = prof.key_averages().table()
    assert "GPU time NOT measured" in table and "timestamp-query-inside-passes" in table
    prof.export_chrome_trace(tmp_path / "t.json")
    events = json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    assert not [e for e in events if e.get("cat") == "kernel"]
    assert any(e.get("cat") == "submit" and e["pid"] == dev.index + 1 for e in events)  # submit boundaries


def test_a_query_set_that_cannot_be_made_falls_back_too(dev, rng, monkeypatch):
    def refuse(self, **kwargs):
        raise RuntimeError("no queries today")

    monkeypatch.setattr(type(dev._dev), "create_query_set", refuse)
    with profile() as prof:
        _train_step(dev, rng)
    assert all(k.gpu_dur is None for k in prof.kernels() if k.device == dev.index)
    assert "GPU time NOT measured (the device lacks a timestamp query set (no queries today))" in \
        prof.key_averages().table()


def test_profiles_do_not_nest_and_results_wait_for_the_stop(dev):
    prof = profile()
    prof.start()
    try:
        with pytest.raises(RuntimeError, match="already running"), profile():
            pass
        with pytest.raises(RuntimeError, match="still running"):
            prof.key_averages()
    finally:
        prof.stop()
    assert profiling.ACTIVE is None
    with pytest.raises(ValueError, match="cannot sort by"):
        prof.key_averages().table(sort_by="nonsense")
