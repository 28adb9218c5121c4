"""bench_gpt_gemms: "auto" rows plan with the library's own tilings; ``--tilings`` extras run only when forced."""

from __future__ import annotations

import sys

from benchmarks import bench_gpt_gemms

mm = sys.modules["wgpar.ops.matmul"]


def test_extra_tilings_are_timed_but_never_chosen_by_auto(monkeypatch, capsys):
    original = mm.TILINGS
    seen = []  # (forced variant, tilings auto could pick from) at each plan
    real = mm.plan

    def plan(*args, **kwargs):
        seen.append((mm._force, tuple(mm.TILINGS)))
        return real(*args, **kwargs)

    monkeypatch.setattr(mm, "plan", plan)
    assert bench_gpt_gemms.main(["--tokens", "40", "--d", "24", "--vocab", "20", "--only", "lm_head fwd",
                                 "--tilings", "32x32x16x4x4u", "--repeat", "1", "--no-write"]) == 0
    extra = "tile32x32x16r4x4u"
    autos = [t for force, t in seen if force is None]
    assert autos and all(t == tuple(original) for t in autos)  # the extra is no candidate of auto
    assert any(force == extra and extra in t for force, t in seen)  # and it was timed, forced
    assert mm.TILINGS is original
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("lm_head fwd")]
    assert any(f"{extra:>26s} -> {extra}" in line for line in rows)
    assert not any(line.split()[3] == "auto" and extra in line for line in rows)
