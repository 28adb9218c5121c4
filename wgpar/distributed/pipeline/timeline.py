"""A pipeline step as it ran, next to the schedule's model of it.

Under ``wgpar.profiler.profile`` the runtime marks every action with a host range named as in the
schedule ("0F3": forward of micro-batch 3 on stage 0; category "pipeline", ``args["rank"]``), from
its input's arrival to the end of its work. :func:`measured` reads them back per rank;
:func:`modelled` runs the schedule's model (blocking receives, free communication) with the mean
measured cost of each kind of action, so the two timelines differ exactly where the step spent
time the model does not count: transfers between stages, host work between actions, waits.
:func:`text` prints both as a step x rank grid and :func:`plot` draws them (``.html`` or ``.svg``,
self-contained).
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from .schedules import KINDS, Action, Schedule, Timed

COLORS = {"F": "#4e79a7", "B": "#e15759", "I": "#f28e2b", "W": "#59a14f"}
_W, _LEFT, _RIGHT, _TOP, _LANE, _GAP = 1000, 120, 20, 40, 22, 14


def measured(prof: Any, schedule: Schedule) -> list[list[Timed]]:
    """Per rank of ``schedule``, its actions in the order they ran, in seconds since the profile started.

    ``prof``: a stopped ``wgpar.profiler.profile`` (or its ``results``) around pipeline steps.
    """
    res = getattr(prof, "results", prof)
    out: list[list[Timed]] = [[] for _ in range(schedule.num_ranks)]
    for r in res.ranges:  # sorted by start
        if r.cat == "pipeline" and 0 <= r.args.get("rank", -1) < schedule.num_ranks:
            out[r.args["rank"]].append(Timed(Action.parse(r.name), r.start / 1e9, (r.start + r.dur) / 1e9))
    if not any(out):
        raise ValueError("the profile holds no pipeline actions: profile a training step of this schedule")
    return out


def mean_costs(runs: list[list[Timed]]) -> dict[str, float]:
    """The mean measured duration (seconds) of each kind of action that ran."""
    total: dict[str, list[float]] = {}
    for t in (t for rank in runs for t in rank):
        total.setdefault(t.action.kind, []).append(t.end - t.start)
    return {k: sum(v) / len(v) for k, v in total.items()}


def modelled(schedule: Schedule, runs: list[list[Timed]]) -> list[list[Timed]]:
    """The schedule's simulated timeline with the measured mean cost of each kind (free communication)."""
    return schedule.simulate(mean_costs(runs))


def _from_zero(runs: list[list[Timed]]) -> list[list[Timed]]:
    t0 = min(t.start for rank in runs for t in rank)
    return [[Timed(t.action, t.start - t0, t.end - t0) for t in rank] for rank in runs]


def _bubble(timed: list[list[Timed]]) -> tuple[float, float]:
    """(makespan, idle share of rank-time) of timelines starting at 0."""
    span = max(t.end for rank in timed for t in rank)
    busy = sum(t.end - t.start for rank in timed for t in rank)
    return span, (1.0 - busy / (len(timed) * span) if span > 0 else 0.0)


def _summary(schedule: Schedule, runs: list[list[Timed]], model: list[list[Timed]]) -> str:
    (ms, mb), (ss, sb) = _bubble(runs), _bubble(model)
    costs = ", ".join(f"{k}={v * 1e3:.2f} ms" for k, v in mean_costs(runs).items())
    return (f"{schedule.name}, {schedule.num_microbatches} micro-batches on {schedule.num_ranks} ranks: measured "
            f"{ms * 1e3:.2f} ms, bubble {mb:.1%}; schedule's model with the measured mean costs ({costs}) and "
            f"free communication {ss * 1e3:.2f} ms, bubble {sb:.1%}")


def text(schedule: Schedule, runs: list[list[Timed]]) -> str:
    """Per rank a "run" row (measured) above a "model" row (the schedule with measured mean costs): one
    column per time unit (the shortest mean cost), the action running there, '.' for idle."""
    runs = _from_zero(runs)
    model = modelled(schedule, runs)
    unit = min(mean_costs(runs).values()) or 1e-9
    multi = schedule.num_stages > schedule.num_ranks

    def label(a: Action) -> str:
        return str(a) if multi else f"{a.kind}{a.mb}"

    cols = max(1, round(max(_bubble(runs)[0], _bubble(model)[0]) / unit))
    width = max(len(label(t.action)) for rank in runs + model for t in rank) + 1

    def row(timed: list[Timed]) -> str:
        cells = ["."] * cols
        free = 0
        for t in timed:  # at least one cell each, after the previous action's: every action shows, in order
            a = max(round(t.start / unit), free)
            free = max(a + 1, round(t.end / unit))
            cells += ["."] * (free - len(cells))
            cells[a:free] = [label(t.action)] * (free - a)
        return "".join(c.ljust(width) for c in cells).rstrip()

    name_w = len(f"rank {schedule.num_ranks - 1} model") + 2
    rows = [_summary(schedule, runs, model), f"one column = {unit * 1e3:.2f} ms"]
    for r in range(schedule.num_ranks):
        rows.append(f"rank {r} run".ljust(name_w) + row(runs[r]))
        rows.append(f"rank {r} model".ljust(name_w) + row(model[r]))
    return "\n".join(rows)


def plot(schedule: Schedule, runs: list[list[Timed]], path, title: str | None = None) -> Path:
    """Draw, per rank, the measured actions over time (ms from the first one) above the schedule's model
    with the measured mean costs, to ``path`` (``.html`` or ``.svg``). Returns the path."""
    path = Path(path)
    if path.suffix.lower() not in (".html", ".htm", ".svg"):
        raise ValueError(f"plot(): cannot write {path.name!r}; use a .html or .svg path")
    runs = _from_zero(runs)
    model = modelled(schedule, runs)
    title = title or f"{schedule.name}: measured step and schedule"
    svg = _svg(schedule, runs, model, title)
    if path.suffix.lower() == ".svg":
        path.write_text(svg)
    else:
        path.write_text(
            f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            "<style>body{font-family:sans-serif;margin:16px}</style></head><body>"
            f"{svg}<p>{html.escape(_summary(schedule, runs, model))}.</p><p>Each rank's upper lane: its actions as "
            "they ran, from the arrival of their input to the end of their work; the lower lane: the schedule's "
            "model (a receive waits for its send, communication is free) with the measured mean cost of each "
            "kind. Where the upper lane has gaps the lower one lacks, the step waited for something the model "
            "does not count (transfers between stages, host work).</p>"
            f"<pre>{html.escape(text(schedule, runs))}</pre></body></html>")
    return path


def _svg(schedule: Schedule, runs: list[list[Timed]], model: list[list[Timed]], title: str) -> str:
    span = max(_bubble(runs)[0], _bubble(model)[0]) or 1e-9
    pw = _W - _LEFT - _RIGHT
    height = _TOP + schedule.num_ranks * (2 * _LANE + _GAP) + 40
    x_of = lambda t: _LEFT + t * pw / span  # noqa: E731
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{height}" '
           f'viewBox="0 0 {_W} {height}" font-family="sans-serif" font-size="11">',
           f'<text x="{_LEFT}" y="18" font-size="14">{html.escape(title)}</text>']
    for r in range(schedule.num_ranks):
        oy = _TOP + r * (2 * _LANE + _GAP)
        for lane, (what, timed) in enumerate((("run", runs[r]), ("model", model[r]))):
            y = oy + lane * _LANE
            out.append(f'<text x="{_LEFT - 6}" y="{y + _LANE / 2 + 4}" text-anchor="end">rank {r} {what}</text>')
            out.append(f'<rect x="{_LEFT}" y="{y + 1}" width="{pw}" height="{_LANE - 2}" fill="#f4f4f4"/>')
            for t in timed:
                x0, x1 = x_of(t.start), x_of(t.end)
                name = str(t.action)
                tip = (f"{name}: {KINDS[t.action.kind]} of micro-batch {t.action.mb} on stage {t.action.stage}, "
                       f"{(t.end - t.start) * 1e3:.3f} ms from {t.start * 1e3:.3f} ms")
                out.append(f'<rect x="{x0:.2f}" y="{y + 2}" width="{max(x1 - x0, 0.5):.2f}" height="{_LANE - 4}" '
                           f'fill="{COLORS[t.action.kind]}" stroke="#fff" stroke-width="0.5">'
                           f'<title>{html.escape(tip)}</title></rect>')
                if x1 - x0 >= 7 * len(name):  # the label only where it fits
                    out.append(f'<text x="{(x0 + x1) / 2:.2f}" y="{y + _LANE / 2 + 4}" text-anchor="middle" '
                               f'fill="#fff">{name}</text>')
    ay = _TOP + schedule.num_ranks * (2 * _LANE + _GAP)
    out.append(f'<line x1="{_LEFT}" y1="{ay}" x2="{_LEFT + pw}" y2="{ay}" stroke="#333"/>')
    for k in range(6):
        t = span * k / 5
        out.append(f'<text x="{x_of(t):.1f}" y="{ay + 14}" text-anchor="middle">{t * 1e3:.2f} ms</text>')
    lx = _LEFT
    for kind in sorted({t.action.kind for rank in runs for t in rank}, key="FBIW".index):
        out.append(f'<rect x="{lx}" y="{ay + 22}" width="10" height="10" fill="{COLORS[kind]}"/>'
                   f'<text x="{lx + 14}" y="{ay + 31}">{KINDS[kind]}</text>')
        lx += 30 + 7 * len(KINDS[kind])
    out.append("</svg>")
    return "\n".join(out)
