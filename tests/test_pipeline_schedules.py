"""Pipeline schedules as data: builders, validation, bubble, peak activations, timeline (no devices)."""

from __future__ import annotations

import pytest

from wgpar.distributed.pipeline import (
    Action,
    Schedule,
    ScheduleError,
    build,
    gpipe,
    interleaved_1f1b,
    one_f_one_b,
    zero_bubble,
)

SHAPES = [(p, m) for p in (1, 2, 3, 4, 6) for m in (1, 2, 3, 4, 5, 8, 13)]


def _kinds_per_microbatch(s: Schedule) -> dict:
    seen: dict = {}
    for acts in s.actions:
        for a in acts:
            seen.setdefault((a.stage, a.mb), []).append(a.kind)
    return seen


@pytest.mark.parametrize("p,m", SHAPES)
def test_gpipe_and_1f1b_bubble_is_the_textbook_one(p, m):
    theory = (p - 1) / (m + p - 1)  # with B = 2 F
    for s in (gpipe(p, m), one_f_one_b(p, m)):
        assert s.bubble_fraction() == pytest.approx(theory, abs=1e-12), s.name
        assert sorted(map(sorted, _kinds_per_microbatch(s).values())) == [["B", "F"]] * (p * m)
    assert gpipe(p, m).peak_activations() == dict.fromkeys(range(p), m)
    assert one_f_one_b(p, m).peak_activations() == {s: min(m, p - s) for s in range(p)}


@pytest.mark.parametrize("p,m", SHAPES)
def test_zero_bubble_keeps_1f1b_memory_with_a_smaller_bubble(p, m):
    zb, base = zero_bubble(p, m), one_f_one_b(p, m)
    assert zb.split_backward and not base.split_backward
    assert sorted(map(sorted, _kinds_per_microbatch(zb).values())) == [["F", "I", "W"]] * (p * m)
    assert zb.peak_activations() == base.peak_activations()
    # F = I = W = 1 against F = 1, B = 2: the same work per micro-batch.
    if p > 1:
        assert zb.bubble_fraction() < base.bubble_fraction()
    else:
        assert zb.bubble_fraction() == 0


@pytest.mark.parametrize("p,m", [(2, 4), (4, 6), (4, 8), (3, 5), (8, 16)])
def test_zero_bubble_with_more_memory_reaches_the_papers_bubble(p, m):
    zb = zero_bubble(p, m, max_inflight=[2 * p - s - 1 for s in range(p)])
    assert zb.bubble_fraction() == pytest.approx((p - 1) / (3 * m + p - 1), abs=1e-12)


@pytest.mark.parametrize("p,m", SHAPES)
@pytest.mark.parametrize("v", [1, 2, 3])
def test_interleaved_runs_every_stage_on_its_rank(p, m, v):
    s = interleaved_1f1b(p, m, v)
    assert s.num_stages == p * v and s.num_ranks == p
    assert all(s.rank_of(k) == k % p for k in range(p * v))
    assert all(s.stages_of(r) == list(range(r, p * v, p)) for r in range(p))
    assert len(_kinds_per_microbatch(s)) == p * v * m


@pytest.mark.parametrize("p,m", [(2, 4), (2, 8), (4, 4), (4, 8), (3, 6)])
def test_interleaving_shrinks_the_bubble(p, m):
    # A fraction of the step: comparable although each interleaved stage does half a rank's work.
    flat = one_f_one_b(p, m).bubble_fraction()
    two, three = interleaved_1f1b(p, m, 2), interleaved_1f1b(p, m, 3)
    assert three.bubble_fraction() < two.bubble_fraction() < flat


def test_user_written_schedule_is_validated_and_ranks_are_inferred():
    s = Schedule.from_actions([["0F0", "0F1", "0B0", "0B1"], ["1F0", "1B0", "1F1", "1B1"]], 2)
    assert s.stage_to_rank == (0, 1) and s.num_stages == 2
    assert s.peak_activations() == {0: 2, 1: 1}
    assert Action.parse("12W3") == Action(12, "W", 3) and str(Action(1, "I", 0)) == "1I0"


@pytest.mark.parametrize("actions,m,match", [
    # 1 waits for micro-batch 1's activations, which rank 0 sends only after a backward that needs 1's gradient
    ([["0F0", "0B0", "0F1", "0B1"], ["1F1", "1B1", "1F0", "1B0"]], 2,
     r"deadlocks: rank 0 waits at position 1, 0B0 \(backward of micro-batch 0 on stage 0\), for the gradient from "
     r"1B0 \(rank 1, not run yet\); rank 1 waits at position 0, 1F1 \(forward of micro-batch 1 on stage 1\), for the "
     r"activations from 0F1"),
    ([["0F0", "0B0"], ["1B0", "1F0"]], 1, r"rank 1 runs 1B0 \(backward of micro-batch 0 on stage 1\) at position 0, "
                                          r"before its forward 1F0 at position 1"),
    ([["0F0", "0I0", "0F1", "0B1"], ["1F0", "1B0", "1F1", "1B1"]], 2, r"never runs its weight-gradient half \(W\) of "
                                                                        r"micro-batch 0 on stage 0"),
    ([["0F0", "0W0", "0I0"], ["1F0", "1B0"]], 1, r"runs 0W0 .* before its input-gradient half 0I0"),
    ([["0F0", "0B0"], ["1F0"]], 1, r"rank 1 never runs the backward .* of micro-batch 0 on stage 1"),
    ([["0F0", "0B0", "0F0"], ["1F0", "1B0"]], 1, r"rank 0 lists 0F0 .* twice \(positions 0 and 2\)"),
    ([["0F0", "0B0", "0F1"], ["1F0", "1B0"]], 1, r"rank 0 lists 0F1 .* but a step has micro-batches 0..0"),
    ([["0F0", "0B0", "1F0"], ["1F0", "1B0"]], 1, r"stage 1 has actions on rank 0 and on rank 1"),
    ([["0F0", "0B0", "0B0x"]], 1, r"cannot read action '0B0x'"),
    ([["0F0", "0B0", "0I0", "0W0"]], 1, r"both as one backward \(B\) and split"),
    ([["0F0", "0B0"], ["2F0", "2B0"]], 1, r"stage\(s\) \[1\] appear on no rank"),
])
def test_validator_rejects_with_a_message_naming_the_stage_and_action(actions, m, match):
    with pytest.raises(ScheduleError, match=match):
        Schedule.from_actions(actions, m)


def test_a_rank_waiting_on_its_own_later_action_is_a_deadlock():
    Schedule([["0F0", "1F0", "1B0", "0B0"]], 1, stage_to_rank=[0, 0])  # both stages on one rank: fine
    with pytest.raises(ScheduleError, match=r"rank 0 waits at position 0, 1F0 .* for the activations from 0F0 "
                                            r"\(itself, later in its own list\)"):
        Schedule([["1F0", "0F0", "1B0", "0B0"]], 1, stage_to_rank=[0, 0])


def test_explicit_stage_to_rank_is_checked():
    with pytest.raises(ScheduleError, match=r"rank 0 lists 1F0 .* but stage 1 runs on rank 1"):
        Schedule([["0F0", "1F0", "1B0", "0B0"], []], 1, stage_to_rank=[0, 1])


def test_builders_reject_bad_sizes_and_names():
    with pytest.raises(ScheduleError, match="num_microbatches must be a positive int"):
        gpipe(2, 0)
    with pytest.raises(ScheduleError, match="num_stages must be a positive int"):
        one_f_one_b(0, 3)
    with pytest.raises(ScheduleError, match="stages_per_rank"):
        interleaved_1f1b(2, 3, 0)
    with pytest.raises(ScheduleError, match="max_inflight"):
        zero_bubble(2, 3, max_inflight=[1])
    with pytest.raises(ScheduleError, match="unknown schedule 'pipedream'"):
        build("pipedream", 2, 4)
    assert build("ZB-H1", 2, 4).name == "ZB-H1" and build("1F1B", 3, 2).name == "1F1B"
    assert build("interleaved", 2, 4, stages_per_rank=3).num_stages == 6


def test_timeline_shows_one_row_per_rank_and_idle_time():
    text = one_f_one_b(2, 3).timeline()
    lines = text.splitlines()
    assert lines[0].startswith("1F1B: 2 stages on 2 ranks, 3 micro-batches; F=1, B=2 time units; bubble 25.0%")
    assert lines[1].split() == ["time", *map(str, range(12))]
    assert lines[2].split() == ["rank", "0", "F0", "F1", ".", ".", "B0", "B0", "F2", "B1", "B1", ".", "B2", "B2"]
    assert lines[3].split() == ["rank", "1", ".", "F0", "B0", "B0", "F1", "B1", "B1", "F2", "B2", "B2", ".", "."]
    inter = interleaved_1f1b(2, 2, 2).timeline()
    assert "0F0" in inter and "3B1" in inter and len(inter.splitlines()) == 4
    assert "I=1, W=1" in zero_bubble(3, 3).timeline()


def test_the_pipeline_uses_no_backend_internals():
    """Written against the ProcessGroup interface only, so it runs on any backend (threads, MPI)."""
    import ast
    from pathlib import Path

    import wgpar.distributed.pipeline as pkg

    from .test_layers import imports

    for path in sorted(Path(pkg.__file__).parent.glob("*.py")):
        mods = imports(path)
        assert not [m for m in mods if m.startswith("wgpar.distributed.backends")], path.name
        tree = ast.parse(path.read_text())
        names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and not n.level}
        assert not [n for n in names if n.split(".")[0] == "wgpu"], path.name
