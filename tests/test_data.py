"""wgpar.utils.data: batches, shuffles, drop_last, collate, the background upload, shutdown, errors,
and DistributedSampler's split across ranks."""

from __future__ import annotations

import gc
import threading
import time
from collections import namedtuple

import numpy as np
import pytest

import wgpar
from wgpar import nn, optim
from wgpar.distributed import DataParallel, DistributedDataParallel, MultiAdapterContext, run_spmd
from wgpar.nn import functional as F
from wgpar.utils.data import (
    BatchSampler,
    DataLoader,
    Dataset,
    DistributedSampler,
    RandomSampler,
    SequentialSampler,
    TensorDataset,
    default_collate,
)


def _loader_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "wgpar-DataLoader"]


@pytest.fixture(autouse=True)
def no_leaked_thread():
    """Every test here ends with no DataLoader thread alive (nothing may leak into the next test)."""
    yield
    gc.collect()
    deadline = time.monotonic() + 5
    while _loader_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not _loader_threads(), "a DataLoader thread outlived its test"


def _data(rng, n=37, d=3):
    return rng.standard_normal((n, d)).astype(np.float32), rng.integers(0, 5, n).astype(np.int64)


class Slow(Dataset):
    """Samples that take ``delay`` seconds each; counts the loads; raises at index ``bad``."""

    def __init__(self, n: int, delay: float = 0.0, bad: int | None = None) -> None:
        self.n, self.delay, self.bad, self.loads = n, delay, bad, 0

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        time.sleep(self.delay)
        self.loads += 1
        if i == self.bad:
            raise ValueError(f"sample {i} is corrupt")
        return np.full(4, i, np.float32), i


# -- batching and order -------------------------------------------------------------------------
@pytest.mark.parametrize("prefetch", [0, 2])
@pytest.mark.parametrize("drop_last", [False, True])
def test_batches_in_order_against_slicing(prefetch, drop_last, rng):
    x, y = _data(rng)
    loader = DataLoader(TensorDataset(x, y), batch_size=5, drop_last=drop_last, prefetch=prefetch)
    got = list(loader)
    starts = range(0, 35 if drop_last else 37, 5)
    assert len(got) == len(loader) == len(starts) == (7 if drop_last else 8)
    for (xb, yb), s in zip(got, starts):
        assert isinstance(xb, np.ndarray) and xb.dtype == np.float32
        np.testing.assert_array_equal(xb, x[s:s + 5])
        np.testing.assert_array_equal(yb, y[s:s + 5])
    assert len(got[-1][0]) == (5 if drop_last else 2)


def test_uploaded_batches_are_on_the_device_with_the_values(rng, devs2):
    x, y = _data(rng, 23)
    dev = devs2[1]
    for k, (xb, yb) in enumerate(DataLoader(TensorDataset(x, y), batch_size=6, device=dev)):
        assert isinstance(xb, wgpar.Tensor) and xb.device is dev and yb.device is dev
        assert xb.dtype == wgpar.float32 and yb.dtype == wgpar.int32
        np.testing.assert_array_equal(xb.numpy(), x[6 * k:6 * k + 6])
        np.testing.assert_array_equal(yb.numpy(), y[6 * k:6 * k + 6])
    assert k == 3


def test_a_tensor_dataset_of_device_tensors_moves_batches_to_the_loader_device(rng, devs2):
    x, _ = _data(rng, 19)
    ids = np.arange(19)
    ds = TensorDataset(wgpar.tensor(x, device=devs2[0]), ids)
    perm = np.random.default_rng([3, 0]).permutation(19)
    got = []
    for xb, ib in DataLoader(ds, batch_size=4, shuffle=True, generator=3, device=devs2[1]):
        assert xb.device is devs2[1] and ib.device is devs2[1]
        np.testing.assert_array_equal(xb.numpy(), x[ib.numpy()])
        got.append(ib.numpy())
    np.testing.assert_array_equal(np.concatenate(got), perm)
    xs = [xb for xb, _ in DataLoader(ds, batch_size=4, shuffle=True, generator=3)]  # one gather each
    assert all(xb.device is devs2[0] for xb in xs)
    np.testing.assert_array_equal(np.concatenate([xb.numpy() for xb in xs]), x[perm])
    assert ds[-1][0].device is devs2[0] and len(ds) == 19


def test_default_collate_keeps_the_structure():
    Pair = namedtuple("Pair", "a b")
    samples = [{"img": np.full((2, 2), i, np.float32), "label": i, "name": f"s{i}", "p": Pair(i, [i, -i])}
               for i in range(3)]
    batch = default_collate(samples)
    np.testing.assert_array_equal(batch["img"], np.stack([s["img"] for s in samples]))
    np.testing.assert_array_equal(batch["label"], [0, 1, 2])
    assert batch["name"] == ["s0", "s1", "s2"]
    assert isinstance(batch["p"], Pair)
    np.testing.assert_array_equal(batch["p"].a, [0, 1, 2])
    assert isinstance(batch["p"].b, list)
    np.testing.assert_array_equal(batch["p"].b[1], [0, -1, -2])
    with pytest.raises(ValueError, match="different shapes"):
        default_collate([np.zeros(2), np.zeros(3)])
    with pytest.raises(TypeError, match="collate_fn"):
        default_collate([object()])


def test_a_plain_dataset_is_collated_and_uploaded(dev):
    ds = Slow(10)
    batches = list(DataLoader(ds, batch_size=4, device=dev))
    assert [len(b[1]) for b in batches] == [4, 4, 2]
    x, i = batches[1]
    assert x.device is dev and i.device is dev
    np.testing.assert_array_equal(x.numpy(), np.repeat(np.arange(4, 8, dtype=np.float32)[:, None], 4, 1))
    np.testing.assert_array_equal(i.numpy(), np.arange(4, 8))
    custom = list(DataLoader(ds, batch_size=3, collate_fn=lambda s: [idx for _, idx in s]))
    assert custom == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]


# -- shuffling ----------------------------------------------------------------------------------
def _epoch(loader) -> np.ndarray:
    return np.concatenate([yb for _, yb in loader])


def test_a_seeded_shuffle_repeats_and_changes_per_epoch():
    ids = np.arange(41)
    ds = TensorDataset(ids.astype(np.float32)[:, None], ids)
    a, b = (DataLoader(ds, batch_size=8, shuffle=True, generator=7) for _ in range(2))
    epochs_a = [_epoch(a) for _ in range(3)]
    epochs_b = [_epoch(b) for _ in range(3)]
    for e, (ea, eb) in enumerate(zip(epochs_a, epochs_b)):
        np.testing.assert_array_equal(ea, eb)  # another loader with the seed: the same run
        np.testing.assert_array_equal(np.sort(ea), ids)  # every sample once per epoch
        np.testing.assert_array_equal(ea, np.random.default_rng([7, e]).permutation(41))
    assert not np.array_equal(epochs_a[0], epochs_a[1])
    assert not np.array_equal(epochs_a[0], _epoch(DataLoader(ds, batch_size=8, shuffle=True, generator=8)))


def test_shuffle_without_a_seed_follows_manual_seed_and_a_numpy_generator():
    ds = TensorDataset(np.zeros((30, 1), np.float32), np.arange(30))
    runs = []
    for _ in range(2):
        wgpar.manual_seed(5)
        loader = DataLoader(ds, batch_size=7, shuffle=True)
        runs.append([_epoch(loader), _epoch(loader)])
    np.testing.assert_array_equal(runs[0], runs[1])
    assert not np.array_equal(runs[0][0], runs[0][1])
    g1, g2 = np.random.default_rng(11), np.random.default_rng(11)
    np.testing.assert_array_equal(_epoch(DataLoader(ds, batch_size=4, shuffle=True, generator=g1)),
                                  _epoch(DataLoader(ds, batch_size=4, shuffle=True, generator=g2)))


def test_samplers_and_argument_errors():
    ds = TensorDataset(np.zeros((10, 1), np.float32))
    assert list(SequentialSampler(ds)) == list(range(10))
    assert sorted(RandomSampler(ds, 1)) == list(range(10))
    assert list(BatchSampler(SequentialSampler(ds), 4, drop_last=True)) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert len(BatchSampler(range(10), 4)) == 3
    bs = DataLoader(ds, batch_sampler=[[9, 0], [3]])
    assert [b[0][:, 0].tolist() for b in bs] == [[0.0, 0.0], [0.0]]
    with pytest.raises(ValueError, match="sampler excludes shuffle"):
        DataLoader(ds, shuffle=True, sampler=SequentialSampler(ds))
    with pytest.raises(ValueError, match="batch_sampler excludes"):
        DataLoader(ds, batch_size=4, batch_sampler=[[0]])
    with pytest.raises(ValueError, match="batch_size"):
        DataLoader(ds, batch_size=0)
    with pytest.raises(ValueError, match="prefetch"):
        DataLoader(ds, prefetch=-1)
    with pytest.raises(ValueError, match="timeout"):
        DataLoader(ds, timeout=0)
    with pytest.raises(ValueError, match="not a wgpar device"):
        DataLoader(ds, device="cuda:0")
    with pytest.raises(TypeError, match="__getitem__"):
        DataLoader(5)
    with pytest.raises(ValueError, match=r"shapes \(3, 2\), \(4,\)"):
        TensorDataset(np.zeros((3, 2)), np.zeros(4))
    with pytest.raises(TypeError, match="NumPy arrays"):
        TensorDataset([1, 2, 3])
    with pytest.raises(IndexError, match="out of range for 10"):
        ds[10]


# -- the background thread ----------------------------------------------------------------------
def test_the_next_batches_load_while_the_step_runs():
    """A dataset that takes 40 ms per batch and a step of 40 ms: with prefetch the epoch takes about the
    steps' time, without it the sum of both."""
    def epoch(prefetch: int) -> float:
        loader = DataLoader(Slow(16, delay=0.02), batch_size=2, prefetch=prefetch)
        t0 = time.perf_counter()
        for _ in loader:
            time.sleep(0.04)  # the training step
        return time.perf_counter() - t0

    serial, ahead = epoch(0), epoch(2)
    assert serial > 0.6  # 8 x (40 + 40) ms
    assert ahead < 0.75 * serial, f"prefetch=2 took {ahead:.3f} s, loading in the loop {serial:.3f} s"


@pytest.mark.parametrize("depth", [1, 3])
def test_the_look_ahead_is_bounded_by_prefetch(depth):
    ds = Slow(40)
    it = iter(DataLoader(ds, batch_size=2, prefetch=depth))
    next(it)
    time.sleep(0.3)  # the thread would run to the end if nothing held it back
    assert ds.loads == 2 * (1 + depth)
    next(it)
    time.sleep(0.3)
    assert ds.loads == 2 * (2 + depth)
    it.close()


def test_device_memory_holds_at_most_prefetch_plus_two_batches(dev, rng):
    x, y = _data(rng, 200, 64)
    batch_bytes = 10 * 64 * 4 + 10 * 4
    wgpar.synchronize(dev)
    base = wgpar.memory_allocated(dev)
    wgpar.reset_peak_memory_stats(dev)
    total = None
    for batch in DataLoader(TensorDataset(x, y), batch_size=10, device=dev, prefetch=2):
        s = batch[0].sum()
        total = s if total is None else total + s
        time.sleep(0.005)
    np.testing.assert_allclose(total.item(), x.sum(dtype=np.float64), rtol=1e-4)
    del batch, s, total
    assert wgpar.memory_allocated(dev) == base
    assert wgpar.memory_stats(dev)["peak_allocated_bytes"] - base <= 4 * batch_bytes + 64


def test_an_early_break_stops_the_thread():
    loader = DataLoader(Slow(100, delay=0.001), batch_size=2)
    for k, _ in enumerate(loader):
        assert _loader_threads()
        if k == 2:
            break
    assert not _loader_threads()  # joined at the break, not later by a collector
    it = iter(loader)
    next(it)
    del it
    assert not _loader_threads()


def test_an_exception_in_the_loop_stops_the_thread():
    def train():
        for k, _ in enumerate(DataLoader(Slow(100), batch_size=2)):
            if k == 1:
                raise KeyError("step failed")

    with pytest.raises(KeyError):
        train()
    assert not _loader_threads()


@pytest.mark.parametrize("prefetch", [0, 2])
def test_an_error_while_loading_is_raised_in_the_loop_with_the_batch_named(prefetch):
    seen = []
    with pytest.raises(ValueError, match="sample 13 is corrupt") as info:
        for _, idx in DataLoader(Slow(30, bad=13), batch_size=4, prefetch=prefetch):
            seen.append(idx.tolist())
    assert seen == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]  # every batch before the bad one, in order
    note = "\n".join(info.value.__notes__)
    assert "batch 3" in note and "[12, 13, 14, 15]" in note
    assert not _loader_threads()


def test_a_stuck_dataset_times_out():
    with pytest.raises(TimeoutError, match="batch 0|item 0"):
        next(iter(DataLoader(Slow(4, delay=0.5), batch_size=2, timeout=0.2)))


# -- data parallel ------------------------------------------------------------------------------
@pytest.mark.parametrize("n,world,drop_last", [(40, 4, False), (41, 4, False), (43, 3, True), (2, 3, False)])
def test_distributed_sampler_splits_the_data_among_ranks(n, world, drop_last):
    ds = TensorDataset(np.zeros((n, 1), np.float32))
    for epoch in range(2):
        shares = []
        for r in range(world):
            s = DistributedSampler(ds, world, r, seed=4, drop_last=drop_last)
            s.set_epoch(epoch)
            shares.append(list(s))
            assert len(shares[-1]) == len(s) == (n // world if drop_last else -(-n // world))
        every = np.concatenate(shares)
        counts = np.bincount(every, minlength=n)
        if n % world == 0:
            assert (counts == 1).all()  # every sample exactly once across the ranks
        elif drop_last:
            assert counts.max() == 1 and counts.sum() == n - n % world
        else:  # padded by repeating the first samples of the epoch's order
            assert counts.min() >= 1 and counts.sum() == world * -(-n // world)
        perm = np.random.default_rng([4, epoch]).permutation(n)
        np.testing.assert_array_equal(np.stack(shares, 1).ravel()[:min(n, len(every))], perm[:min(n, len(every))])


def test_distributed_sampler_steps_match_a_single_device_loader():
    """Per-rank batches of B on W ranks hold, step by step, the samples of one loader's batches of W * B."""
    ids = np.arange(103)
    ds = TensorDataset(ids)
    world, per_rank = 3, 4
    for epoch in range(2):
        single = DataLoader(ds, batch_size=world * per_rank, shuffle=True, generator=9, drop_last=True)
        for _ in range(epoch):
            _ = list(iter(single.sampler))  # the single loader's epoch counter reaches this epoch
        want = [b[0] for b in single]
        ranks = []
        for r in range(world):
            s = DistributedSampler(ds, world, r, seed=9, drop_last=True)
            s.set_epoch(epoch)
            ranks.append([b[0] for b in DataLoader(ds, batch_size=per_rank, sampler=s, drop_last=True)])
        assert all(len(r) == len(want) for r in ranks)
        for k, w in enumerate(want):
            np.testing.assert_array_equal(np.sort(np.concatenate([r[k] for r in ranks])), np.sort(w))


def test_distributed_sampler_arguments():
    ds = list(range(10))

    class Group:
        rank, world_size = 1, 3

    assert list(DistributedSampler(ds, group=Group(), shuffle=False)) == [1, 4, 7, 0]
    with pytest.raises(ValueError, match="num_replicas and rank, or group"):
        DistributedSampler(ds)
    with pytest.raises(ValueError, match="rank 3 is out of range for 3 ranks"):
        DistributedSampler(ds, 3, 3)
    s = DistributedSampler(ds, 2, 0)
    ds.append(10)
    with pytest.raises(RuntimeError, match="length changed from 10 to 11"):
        list(s)


@pytest.mark.multidevice
def test_each_rank_loads_its_share_onto_its_device_for_ddp(rng):
    x, y = _data(rng, 30, 6)
    y = y % 4
    seed = int(rng.integers(1 << 30))

    def train(group):
        sampler = DistributedSampler(TensorDataset(x, y), group=group, seed=seed)
        loader = DataLoader(TensorDataset(x, y), batch_size=5, sampler=sampler, device=group.device)
        wgpar.manual_seed(0)
        model = DistributedDataParallel(nn.Linear(6, 4, device=group.device), group)
        opt = optim.SGD(model.parameters(), lr=0.1)
        seen = []
        for epoch in range(2):
            sampler.set_epoch(epoch)
            for xb, yb in loader:
                assert xb.device is group.device and yb.device is group.device
                seen.append((xb.numpy(), yb.numpy()))
                opt.zero_grad()
                F.cross_entropy(model(xb), yb).backward()
                opt.step()
        return seen, model.module.weight.numpy()

    results = run_spmd(train, 2, timeout=60)
    for r, (seen, _) in enumerate(results):
        want = [np.random.default_rng([seed, e]).permutation(30)[r::2] for e in range(2)]
        got_x = np.concatenate([sx for sx, _ in seen])
        np.testing.assert_array_equal(got_x, x[np.concatenate(want)])
    np.testing.assert_array_equal(results[0][1], results[1][1])  # the replicas stayed identical


@pytest.mark.multidevice
def test_host_batches_feed_data_parallel_like_one_device(rng):
    x, y = _data(rng, 26, 6)
    y = (y % 4).astype(np.int32)

    def model():
        wgpar.manual_seed(1)
        return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 4))

    ref = model()
    opt = optim.SGD(ref.parameters(), lr=0.1)
    want = []
    for xb, yb in DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True, generator=2, device=0):
        opt.zero_grad()
        loss = F.cross_entropy(ref(xb), yb)
        loss.backward()
        opt.step()
        want.append(loss.item())
    with MultiAdapterContext(2, timeout=60) as ctx:
        dp = DataParallel(model(), ctx)
        opts = dp.optimizers(lambda ps: optim.SGD(ps, lr=0.1))
        got = [dp.train_step(xb, yb, F.cross_entropy, opts).item()
               for xb, yb in DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True, generator=2)]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
