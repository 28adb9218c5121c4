"""The memory timeline (wgpar.memory.record_history / snapshot / plot): replayed, its events give
memory_stats exactly at every event; categories follow the FSDP lifecycle and the pipeline schedule;
nothing is recorded when it is off; the plot is written with or without matplotlib."""

from __future__ import annotations

import gc
import importlib.util

import numpy as np
import pytest

import wgpar
from wgpar import memory, nn, optim
from wgpar.distributed import FSDP, MultiAdapterContext, PipelineExecutor
from wgpar.nn import functional as F
from wgpar.runtime import memory_history

from .fsdp_models import mlp

PARAM, GRAD, STATE, SAVED = "parameter", "gradient", "optimizer state", "saved activation"
UNIT, PIPE, STAGING, CACHE, OTHER = ("FSDP gathered unit", "pipeline activation in flight",
                                     "staging / upload buffer", "allocator cache", "other")


@pytest.fixture(autouse=True)
def _stopped():
    yield
    memory.record_history(enabled=False)


def check_exact(snap: memory.MemorySnapshot, devices) -> None:
    """At every event the replayed totals are the allocator's counts; at the end, memory_stats'."""
    for d in devices:
        tl = snap.timeline(d.index)
        checked = 0
        for i, rec in enumerate(tl.recorded):
            tensors = sum(tl.bytes[c][i] for c in memory_history.TENSOR_CATEGORIES)
            assert tensors == tl.allocated[i]
            assert tensors + tl.bytes[CACHE][i] == tl.reserved[i]
            assert min(tl.bytes[c][i] for c in memory.CATEGORIES) >= 0, (d, i, tl.events[i])
            if rec is not None:
                assert rec == (tl.allocated[i], tl.reserved[i], tl.staging[i]), (d, i, tl.events[i])
                checked += 1
        assert checked > 10
        s = wgpar.memory_stats(d)
        assert (tl.allocated[-1], tl.reserved[-1], tl.staging[-1]) == (
            s["allocated_bytes"], s["reserved_bytes"], s["staging_bytes"])


def at(snap: memory.MemorySnapshot, device: int, seq: int) -> dict[str, int]:
    """Bytes by category right after the device's event ``seq`` (0: when the history started)."""
    tl = snap.timeline(device)
    i = 0 if seq == 0 else next(i for i, e in enumerate(tl.events) if e is not None and e.seq == seq)
    return {c: tl.bytes[c][i] for c in memory.CATEGORIES}


def leftovers(devices) -> dict[int, dict[str, int]]:
    """Bytes by category that earlier tests left alive on ``devices`` (a model in a reference cycle outlives
    its test until a collection, and a pytest-xdist worker runs the files in its own order): the baseline
    of a test's own counts, after a collection so that none is freed while the test runs."""
    gc.collect()
    memory.record_history()
    snap = memory.snapshot()
    memory.record_history(enabled=False)
    return {d.index: at(snap, d.index, 0) for d in devices}


def test_one_device_step_by_category_and_stacks(rng):
    d = wgpar.device(0)
    base = leftovers([d])[0]
    model = nn.Sequential(nn.Linear(24, 40), nn.ReLU(), nn.Linear(40, 7))
    opt = optim.AdamW(model.parameters(), lr=1e-3)
    x = wgpar.tensor(rng.standard_normal((13, 24)).astype(np.float32))
    param_bytes = sum(p.nbytes for p in model.parameters())
    memory.record_history()
    loss = F.cross_entropy(model(x), rng.integers(0, 7, 13).astype(np.int32))
    mid = at(memory.snapshot(), 0, d.allocator._seq)  # after forward: what backward will need is saved
    loss.backward()
    del loss
    opt.step()
    end = at(memory.snapshot(), 0, d.allocator._seq)
    opt.zero_grad()
    memory.record_history(enabled=False)
    snap = memory.snapshot()
    check_exact(snap, [d])
    mid, end = ({c: v - base[c] for c, v in m.items()} for m in (mid, end))  # this test's own bytes
    assert mid[PARAM] == end[PARAM] == param_bytes  # tagged before the history started
    assert mid[SAVED] > 0 and mid[GRAD] == 0 and mid[STATE] == 0
    assert end[GRAD] == param_bytes and end[STATE] == 2 * param_bytes and end[SAVED] == 0
    assert at(snap, 0, snap.timeline(0).events[-1].seq)[GRAD] == base[GRAD]  # zero_grad freed them
    kinds = {e.action for e in snap.events}
    assert {"alloc", "free", "retag"} <= kinds
    ev = next(e for e in snap.events if e.action == "alloc")
    assert ev.device == 0 and ev.nbytes > 0 and ev.time_ns >= snap.start_ns and 0 < len(ev.stack) <= 6
    assert all(isinstance(f, str) and isinstance(line, int) for f, line, _ in ev.stack)
    assert {p.name for p in snap.phases} == {"backward", "optimizer"}


def test_off_records_nothing():
    d = wgpar.device(0)
    memory.record_history()
    memory.record_history(enabled=False)
    n = len(memory.snapshot().events)
    seq = d.allocator._seq
    y = wgpar.ones((64,)) * 3
    del y
    assert memory_history.ACTIVE is None and d.allocator._seq == seq
    assert len(memory.snapshot().events) == n


def test_fsdp_gathered_units_live_for_their_forward(rng):
    width, layers, batch = 32, 4, 8
    X = rng.standard_normal((batch, width)).astype(np.float32)
    Y = rng.integers(0, 5, batch).astype(np.int32)
    with MultiAdapterContext(2, timeout=60) as ctx:
        base = leftovers(ctx.devices)
        fsdp = FSDP(mlp(3, width, layers, 5, device=ctx.devices[0]), ctx, persist_threshold=0, prefetch=0)
        opts = fsdp.optimizers(lambda ps: optim.AdamW(ps, lr=1e-3))
        marks: list[dict] = [{}, {}]

        def step(r: int, record: bool) -> None:
            d, model = ctx.devices[r], fsdp.modules[r]
            x = wgpar.tensor(X[4 * r:4 * r + 4], device=d)
            units = [g for g in model.fsdp_groups() if g.params]
            handles = []
            if record:
                for k, m in enumerate(model):
                    if any(p.requires_grad for p in m.parameters(recurse=False)) or list(m.parameters()):
                        handles.append(m.register_forward_pre_hook(
                            lambda mod, args, k=k: marks[r].setdefault("forward", []).append((k, d.allocator._seq))))
            out = model(x)
            marks[r]["after_forward"] = d.allocator._seq
            loss = F.cross_entropy(out, Y[4 * r:4 * r + 4])
            del out
            loss.backward()
            del loss
            opts[r].step()
            marks[r]["end"] = d.allocator._seq
            marks[r]["units"] = [g.full_bytes() for g in units]
            marks[r]["shards"] = sum(g.shard_bytes() for g in units)
            marks[r]["grads"] = sum(4 * g.chunk for g in units)
            marks[r]["state"] = sum(v.nbytes for st in opts[r].state.values() for v in st.values()
                                    if isinstance(v, wgpar.Tensor))
            for h in handles:
                h.remove()

        ctx.run(lambda r: step(r, False))  # warm: gradients and optimizer state exist
        for o in opts:
            o.zero_grad()
        memory.record_history()
        ctx.run(lambda r: step(r, True))
        memory.record_history(enabled=False)
        snap = memory.snapshot()
        check_exact(snap, ctx.devices)
        for r, d in enumerate(ctx.devices):
            m = marks[r]

            def own(seq: int, d=d) -> dict[str, int]:  # this test's bytes by category after event seq
                return {c: v - base[d.index][c] for c, v in at(snap, d.index, seq).items()}

            # Each unit's full weights are "FSDP gathered unit" while its forward runs, and only those.
            fwd = m["forward"]
            assert len(fwd) == layers
            for (k, seq), full in zip(fwd, m["units"]):
                assert own(seq)[UNIT] == full, (r, k)
            after = own(m["after_forward"])
            assert after[UNIT] == 0 and after[SAVED] > 0  # FULL_SHARD freed them; the graph kept activations
            assert snap.peak(UNIT, d.index) >= max(m["units"])  # gathered again in backward
            end = own(m["end"])
            assert end[UNIT] == 0 and end[SAVED] == 0 and end[PIPE] == 0
            assert end[PARAM] == m["shards"] and end[GRAD] == m["grads"] and end[STATE] == m["state"]
            assert snap.peak(STAGING, d.index) > 0  # the collectives' host-mapped buffers


def _blocks(stages: int, h: int) -> list[nn.Module]:
    with wgpar.rng_stream(7):
        return [b for _ in range(stages) for b in (nn.Linear(h, h), nn.GELU(), nn.Linear(h, h))]


def test_pipeline_activations_in_flight_1f1b_below_gpipe(rng):
    h, rows, m = 32, 8, 6
    X = rng.standard_normal((rows * m, h)).astype(np.float32)
    peaks = {}
    with MultiAdapterContext(2, timeout=60) as ctx:
        for schedule in ("gpipe", "1f1b"):
            pipe = PipelineExecutor(_blocks(2, h), ctx, m, schedule, F.mse_loss)
            pipe.step(X, X)
            memory.record_history()
            pipe.step(X, X)
            memory.record_history(enabled=False)
            snap = memory.snapshot()
            check_exact(snap, ctx.devices)
            peaks[schedule] = [snap.peak(PIPE, d.index) for d in ctx.devices]
            for d in ctx.devices:  # every micro-batch's backward freed its activations (what was there is)
                last = snap.timeline(d.index)
                assert last.bytes[PIPE][-1] == last.bytes[PIPE][0]
                assert last.bytes[SAVED][-1] == last.bytes[SAVED][0]
            del pipe
    # Stage 0 holds all 6 micro-batches under GPipe, 2 (the number of stages) under 1F1B.
    one = peaks["gpipe"][0] // m
    assert one > 0 and peaks["gpipe"][0] == m * one and peaks["1f1b"][0] == 2 * one, peaks
    assert peaks["1f1b"][1] <= peaks["gpipe"][1]


@pytest.mark.parametrize("suffix", [".html", ".svg"])
def test_plot_writes_self_contained_html_and_svg(tmp_path, suffix):
    memory.record_history()
    model = nn.Linear(16, 8)
    opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(wgpar.ones((4, 16))).sum().backward()
    opt.step()
    memory.record_history(enabled=False)
    out = memory.plot(memory.snapshot(), tmp_path / f"mem{suffix}")
    text = out.read_text()
    assert "<svg" in text and "parameter" in text and "backward" in text and "optimizer" in text
    assert "http://" not in text.replace("http://www.w3.org/2000/svg", "")  # nothing fetched
    with pytest.raises(ValueError, match=r"\.html, \.svg or \.png"):
        memory.plot(memory.snapshot(), tmp_path / "mem.pdf")


@pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None, reason="matplotlib is not installed")
def test_plot_writes_png_through_matplotlib(tmp_path):
    memory.record_history()
    y = wgpar.ones((256,)) + 1
    del y
    memory.record_history(enabled=False)
    out = memory.plot(memory.snapshot(), tmp_path / "mem.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
