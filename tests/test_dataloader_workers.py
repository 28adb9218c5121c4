"""DataLoader with worker processes (num_workers > 0): the batches of num_workers=0 in the same order,
torch's per-worker seeding and get_worker_info, worker_init_fn, errors raised in the loop naming the
worker and batch, dead and stuck workers, persistent workers, and no process left behind."""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import time

import numpy as np
import pytest

import wgpar
from wgpar.utils.data import DataLoader, Dataset, TensorDataset, get_worker_info

# Datasets and hooks live at module level: workers start with "spawn", which pickles them by name.


class Augmented(Dataset):
    """Sample i: its index, a noisy copy of row i (the augmentation draws from NumPy's global generator,
    as host-side augmentation does), and which worker made it."""

    def __init__(self, n: int) -> None:
        self.x = np.arange(n * 3, dtype=np.float32).reshape(n, 3)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i):
        info = get_worker_info()
        return {"i": i, "x": self.x[i], "noise": np.random.rand(2).astype(np.float32), "py": random.random(),
                "worker": -1 if info is None else info.id, "seed": -1 if info is None else info.seed,
                "tag": _tag}


_tag = "main"


def tag_worker(worker_id: int) -> None:
    global _tag
    _tag = f"init-{worker_id}-of-{get_worker_info().num_workers}"


def failing_init(worker_id: int) -> None:
    if worker_id == 1:
        raise KeyError("no shard for worker 1")


class Failing(Dataset):
    def __init__(self, n: int, bad: int, how: str) -> None:
        self.n, self.bad, self.how = n, bad, how

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        if i == self.bad:
            if self.how == "raise":
                raise ValueError(f"corrupt sample {i}")
            if self.how == "unpicklable":
                raise Unpicklable(i)
            if self.how == "exit":
                os._exit(3)
            if self.how == "sleep":
                time.sleep(3)
        return np.full(2, i, dtype=np.float32)


class Unpicklable(Exception):
    def __init__(self, i: int) -> None:
        super().__init__(f"sample {i}")
        self.lock = __import__("threading").Lock()  # cannot be pickled


def _alive(pids) -> list[int]:
    out = []
    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        # A reaped child is gone; an unreaped zombie would still answer: check its state.
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split()[2] == "Z":
                    continue
        except FileNotFoundError:
            continue
        out.append(pid)
    return out


def _batches(loader):
    return [{k: (v.numpy() if isinstance(v, wgpar.Tensor) else v) for k, v in b.items()} for b in loader]


def test_same_batches_in_order_as_without_workers(dev):
    ds = Augmented(23)
    kw = dict(batch_size=4, shuffle=True, generator=11, drop_last=False)
    want = _batches(DataLoader(ds, **kw))
    loader = DataLoader(ds, num_workers=2, device=dev, pin_memory=True, **kw)
    got = _batches(loader)
    assert len(got) == len(want) == len(loader) == 6
    for k, (g, w) in enumerate(zip(got, want)):
        np.testing.assert_array_equal(g["i"], w["i"])
        np.testing.assert_array_equal(g["x"], w["x"])  # uploaded by the main process
        assert list(g["worker"]) == [k % 2] * len(g["i"]), "batch k goes to worker k % num_workers"
    assert get_worker_info() is None


def test_seeds_worker_init_fn_and_repeatability():
    ds = Augmented(12)
    runs = []
    for _ in range(2):
        loader = DataLoader(ds, batch_size=2, num_workers=3, worker_init_fn=tag_worker, generator=5,
                            prefetch_factor=1)
        runs.append(_batches(loader))
    for run in runs:
        seeds = {int(b["worker"][0]): int(b["seed"][0]) for b in run}
        base = seeds[0]
        assert seeds == {w: base + w for w in range(3)}, "worker w is seeded with base_seed + w"
        assert [b["tag"] for b in run] == [[f"init-{k % 3}-of-3"] * 2 for k in range(6)]
        # Each worker's NumPy and random draws follow from its seed: different workers draw differently.
        first = [b["noise"][0] for b in run[:3]]
        assert not np.array_equal(first[0], first[1]) and not np.array_equal(first[1], first[2])
    for a, b in zip(*runs):  # generator=5: the same seeds, so the same augmentation, run after run
        np.testing.assert_array_equal(a["noise"], b["noise"])
        np.testing.assert_array_equal(a["py"], b["py"])
    assert runs[0][0]["seed"][0] != _batches(DataLoader(ds, batch_size=2, num_workers=3, generator=6))[0]["seed"][0]


def test_worker_error_names_worker_and_batch_and_workers_stop():
    loader = DataLoader(Failing(20, bad=13, how="raise"), batch_size=4, num_workers=2)
    seen = []
    with pytest.raises(ValueError, match="corrupt sample 13") as info:
        for b in loader:
            seen.append(b)
    notes = "\n".join(info.value.__notes__)
    assert "worker process 1" in notes and "batch 3" in notes and "13" in notes and "Traceback" in notes
    assert len(seen) == 3  # batches before the failing one arrive
    with pytest.raises(RuntimeError, match="Unpicklable") as info:
        list(DataLoader(Failing(8, bad=2, how="unpicklable"), batch_size=2, num_workers=2))
    assert "worker process 1" in "\n".join(info.value.__notes__)
    with pytest.raises(KeyError, match="no shard") as info:
        list(DataLoader(Failing(8, bad=-1, how="raise"), batch_size=2, num_workers=2, worker_init_fn=failing_init))
    assert "worker process 1 while starting" in "\n".join(info.value.__notes__)


def test_break_stops_workers_and_persistent_workers_survive_epochs(dev):
    ds = Augmented(40)
    loader = DataLoader(ds, batch_size=2, num_workers=2)
    for k, _ in enumerate(loader):
        if k == 1:
            pids = [p.pid for p in mp.active_children() if p.name.startswith("wgpar-DataLoader-worker")]
            break
    assert len(pids) == 2 and loader._pool is None and not _alive(pids), "break stops and joins the workers"
    persistent = DataLoader(ds, batch_size=3, shuffle=True, generator=2, num_workers=2, persistent_workers=True)
    for k, _ in enumerate(persistent):  # leave the first epoch early: its late results must be dropped
        if k == 2:
            break
    pids = persistent._pool.pids
    assert len(_alive(pids)) == 2
    epoch = _batches(persistent)
    assert persistent._pool.pids == pids, "persistent workers are reused"
    idx = np.concatenate([b["i"] for b in epoch])
    assert sorted(idx.tolist()) == list(range(40)) and len(epoch) == 14
    del persistent
    deadline = time.monotonic() + 10
    while _alive(pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pids), "collecting the loader stops its persistent workers"


def test_dead_and_stuck_workers_raise_and_are_cleaned_up():
    with pytest.raises(RuntimeError, match="exited unexpectedly with exit code 3"):
        list(DataLoader(Failing(8, bad=5, how="exit"), batch_size=2, num_workers=2))
    loader = DataLoader(Failing(8, bad=3, how="sleep"), batch_size=2, num_workers=2, timeout=1.0)
    t0 = time.monotonic()
    # Batch 1 (samples 2, 3) is stuck; batch 0 may already time out while the workers start (spawn).
    with pytest.raises(TimeoutError, match=r"batch [01] was not ready after 1 s \(worker [01] is still loading"):
        list(loader)
    assert time.monotonic() - t0 < 15, "the stuck worker is stopped, not waited for"


def test_fork_context_and_arguments(dev):
    ds = Augmented(6)
    got = list(DataLoader(ds, batch_size=3, num_workers=2, multiprocessing_context="fork",
                          collate_fn=lambda s: [d["i"] for d in s]))
    assert got == [[0, 1, 2], [3, 4, 5]]
    with pytest.raises(Exception, match="lambda|pickle|local") as info:
        list(DataLoader(ds, batch_size=3, num_workers=1, collate_fn=lambda s: s))
    assert "module-level functions" in "\n".join(getattr(info.value, "__notes__", []))
    with pytest.raises(ValueError, match="num_workers > 0"):
        DataLoader(ds, prefetch_factor=2)
    with pytest.raises(ValueError, match="num_workers > 0"):
        DataLoader(ds, persistent_workers=True)
    with pytest.raises(ValueError, match="num_workers"):
        DataLoader(ds, num_workers=-1)
    with pytest.raises(ValueError, match="start methods"):
        DataLoader(ds, num_workers=1, multiprocessing_context="threads")
    with pytest.raises(ValueError, match="wgpar tensors"):
        DataLoader(TensorDataset(wgpar.zeros(4, 2, device=dev)), num_workers=1)
