"""The memory timeline as a picture: per device, bytes by category stacked over time, with the phases.

``.html`` and ``.svg`` are written here (self-contained, nothing to install); ``.png`` goes through
matplotlib (``pip install wgpar[plot]``).
"""

from __future__ import annotations

import html
from pathlib import Path

from ..runtime import memory_history as _hist
from .timeline import CATEGORIES, MemorySnapshot, Timeline

# Bottom to top: what lives all step first, the cache and staging last.
ORDER = (_hist.PARAMETER, _hist.OPTIMIZER_STATE, _hist.GRADIENT, _hist.FSDP_UNIT, _hist.SAVED_ACTIVATION,
         _hist.PIPELINE_ACTIVATION, _hist.OTHER, _hist.CACHE, _hist.STAGING)
COLORS = {
    _hist.PARAMETER: "#4e79a7", _hist.OPTIMIZER_STATE: "#9c755f", _hist.GRADIENT: "#e15759",
    _hist.FSDP_UNIT: "#f28e2b", _hist.SAVED_ACTIVATION: "#59a14f", _hist.PIPELINE_ACTIVATION: "#b07aa1",
    _hist.OTHER: "#bab0ac", _hist.CACHE: "#d7d7d7", _hist.STAGING: "#76b7b2",
}
PHASE_COLORS = {"forward": "#dddddd", "backward": "#8cb4e0", "optimizer": "#f5b66f"}
_W, _H, _LEFT, _RIGHT, _TOP, _BOTTOM = 960, 230, 70, 250, 26, 34
_MIB = 1 << 20


def plot(snapshot: MemorySnapshot, path, title: str | None = None) -> Path:
    """Draw ``snapshot`` to ``path``: per device, a stacked area of bytes by category over time, and a
    strip with the phases (forward / backward / optimizer) of the threads that used that device.

    Arguments:
        snapshot: from ``wgpar.memory.snapshot()``.
        path: ``.html`` or ``.svg`` (written without any extra package) or ``.png`` (needs matplotlib).
        title: a heading; the default names the devices and the recording's length.

    Returns the path written.
    """
    if not isinstance(snapshot, MemorySnapshot):
        raise TypeError(f"plot() takes a MemorySnapshot (wgpar.memory.snapshot()), got {type(snapshot).__name__}")
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in (".html", ".htm", ".svg", ".png"):
        raise ValueError(f"plot(): cannot write {path.name!r}; use a .html, .svg or .png path")
    timelines = [snapshot.timeline(d) for d in snapshot.devices]
    if title is None:
        title = (f"memory by category, {len(timelines)} device(s), "
                 f"{(snapshot.end_ns - snapshot.start_ns) / 1e6:.1f} ms")
    if suffix == ".png":
        _png(snapshot, timelines, path, title)
        return path
    svg = _svg(snapshot, timelines, title)
    if suffix == ".svg":
        path.write_text(svg)
    else:
        path.write_text(_html(snapshot, timelines, svg, title))
    return path


def _phase_spans(snapshot: MemorySnapshot, device: int) -> list[tuple[str, int, int]]:
    threads = snapshot.device_threads(device)
    return [(p.name, p.start_ns, p.end_ns) for p in snapshot.phases if p.thread in threads]


def _columns(tl: Timeline, t0: int, t1: int, width: int) -> list[int]:
    """The points to draw: per pixel column the one with the most memory (a peak never disappears)."""
    span = max(1, t1 - t0)
    top = [a + s for a, s in zip(tl.reserved, tl.staging)]
    best: dict[int, int] = {}
    for i, t in enumerate(tl.times_ns):
        col = int((t - t0) * width / span)
        j = best.get(col)
        if j is None or top[i] > top[j]:
            best[col] = i
    keep = sorted(best.values())
    if keep[-1] != len(tl.times_ns) - 1:
        keep.append(len(tl.times_ns) - 1)  # the final state holds to the end
    return keep


def _nice_step(vmax: float, ticks: int = 4) -> float:
    raw = vmax / ticks
    mag = 10 ** len(str(int(raw))) / 10 if raw >= 1 else 1.0
    for m in (1, 2, 2.5, 5, 10):
        if raw <= m * mag:
            return m * mag
    return 10 * mag


def _svg(snapshot: MemorySnapshot, timelines: list[Timeline], title: str) -> str:
    t0, t1 = snapshot.start_ns, max([snapshot.end_ns] + [tl.times_ns[-1] for tl in timelines])
    pw, ph = _W - _LEFT - _RIGHT, _H - _TOP - _BOTTOM
    height = 30 + len(timelines) * _H
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{height}" '
           f'viewBox="0 0 {_W} {height}" font-family="sans-serif" font-size="11">',
           f'<text x="{_LEFT}" y="18" font-size="14">{html.escape(title)}</text>']
    x_of = lambda t: _LEFT + (t - t0) * pw / max(1, t1 - t0)  # noqa: E731
    for k, tl in enumerate(timelines):
        oy = 30 + k * _H
        tops = [a + s for a, s in zip(tl.reserved, tl.staging)]
        vmax = max(max(tops), 1)
        step = _nice_step(vmax / _MIB) * _MIB
        ymax = max(vmax, step * -(-vmax // step))
        y_of = lambda v: oy + _TOP + ph - v * ph / ymax  # noqa: E731, B023
        out.append(f'<g><text x="{_LEFT}" y="{oy + 10}" font-weight="bold">device wgpu:{tl.device}</text>')
        # The phase strip: forward underneath, backward and optimizer ranges over it.
        sy = oy + 14
        out.append(f'<rect x="{_LEFT}" y="{sy}" width="{pw}" height="7" fill="{PHASE_COLORS["forward"]}">'
                   f'<title>forward (outside backward and the optimizer step)</title></rect>')
        for name, a, b in _phase_spans(snapshot, tl.device):
            xa, xb = x_of(a), x_of(b)
            out.append(f'<rect x="{xa:.1f}" y="{sy}" width="{max(xb - xa, 0.5):.1f}" height="7" '
                       f'fill="{PHASE_COLORS.get(name, "#999")}"><title>{html.escape(name)} '
                       f'{(a - t0) / 1e6:.2f}-{(b - t0) / 1e6:.2f} ms</title></rect>')
            out.append(f'<rect x="{xa:.1f}" y="{oy + _TOP}" width="{max(xb - xa, 0.5):.1f}" height="{ph}" '
                       f'fill="{PHASE_COLORS.get(name, "#999")}" opacity="0.12"/>')
        keep = _columns(tl, t0, t1, pw)
        lower = [0] * len(keep)
        for cat in ORDER:
            vals = tl.bytes[cat]
            upper = [lo + vals[i] for lo, i in zip(lower, keep)]
            if any(upper[j] != lower[j] for j in range(len(keep))):
                pts = _step_points(keep, tl.times_ns, upper, t1, x_of, y_of)
                back = _step_points(keep, tl.times_ns, lower, t1, x_of, y_of)[::-1]
                peak = max(vals)
                out.append(f'<polygon fill="{COLORS[cat]}" stroke="none" points="{" ".join(pts + back)}">'
                           f'<title>{html.escape(cat)}: peak {peak / _MIB:.2f} MiB</title></polygon>')
            lower = upper
        # Axes: MiB up the left, ms along the bottom.
        out.append(f'<line x1="{_LEFT}" y1="{oy + _TOP + ph}" x2="{_LEFT + pw}" y2="{oy + _TOP + ph}" stroke="#333"/>')
        out.append(f'<line x1="{_LEFT}" y1="{oy + _TOP}" x2="{_LEFT}" y2="{oy + _TOP + ph}" stroke="#333"/>')
        v = 0.0
        while v <= ymax + 1:
            y = y_of(v)
            out.append(f'<line x1="{_LEFT - 4}" y1="{y:.1f}" x2="{_LEFT}" y2="{y:.1f}" stroke="#333"/>'
                       f'<text x="{_LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{v / _MIB:g} MiB</text>')
            v += step
        ms = (t1 - t0) / 1e6
        tstep = _nice_step(ms, 6) if ms > 0 else 1.0
        t = 0.0
        while t <= ms + 1e-9:
            x = x_of(t0 + t * 1e6)
            out.append(f'<line x1="{x:.1f}" y1="{oy + _TOP + ph}" x2="{x:.1f}" y2="{oy + _TOP + ph + 4}" '
                       f'stroke="#333"/><text x="{x:.1f}" y="{oy + _TOP + ph + 15}" text-anchor="middle">'
                       f'{t:g}</text>')
            t += tstep
        out.append(f'<text x="{_LEFT + pw}" y="{oy + _TOP + ph + 28}" text-anchor="end">time (ms)</text>')
        # Legend with each category's peak on this device.
        lx = _LEFT + pw + 14
        for j, cat in enumerate(reversed(ORDER)):
            ly = oy + _TOP + j * 15
            out.append(f'<rect x="{lx}" y="{ly}" width="10" height="10" fill="{COLORS[cat]}"/>'
                       f'<text x="{lx + 14}" y="{ly + 9}">{html.escape(cat)} '
                       f'({max(tl.bytes[cat]) / _MIB:.2f})</text>')
        ly = oy + _TOP + len(ORDER) * 15 + 4
        for j, name in enumerate(("forward", "backward", "optimizer")):
            out.append(f'<rect x="{lx + j * 70}" y="{ly}" width="10" height="7" fill="{PHASE_COLORS[name]}"/>'
                       f'<text x="{lx + 13 + j * 70}" y="{ly + 7}">{name}</text>')
        out.append("</g>")
    out.append("</svg>")
    return "\n".join(out)


def _step_points(keep, times, values, t_end, x_of, y_of) -> list[str]:
    pts = []
    for j, i in enumerate(keep):
        x = x_of(times[i])
        if j:
            pts.append(f"{x:.1f},{y_of(values[j - 1]):.1f}")  # hold the previous value until this event
        pts.append(f"{x:.1f},{y_of(values[j]):.1f}")
    pts.append(f"{x_of(t_end):.1f},{y_of(values[-1]):.1f}")
    return pts


def _html(snapshot: MemorySnapshot, timelines: list[Timeline], svg: str, title: str) -> str:
    rows = "".join(
        f"<tr><td>wgpu:{tl.device}</td>" + "".join(f"<td>{max(tl.bytes[c]) / _MIB:.2f}</td>" for c in CATEGORIES)
        + f"<td>{max(tl.allocated) / _MIB:.2f}</td><td>{max(tl.reserved) / _MIB:.2f}</td></tr>"
        for tl in timelines)
    head = "".join(f"<th>{html.escape(c)}</th>" for c in CATEGORIES)
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            "<style>body{font-family:sans-serif;margin:16px}table{border-collapse:collapse;font-size:12px}"
            "td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}</style></head><body>"
            f"{svg}<p>Bytes per category after every allocation and free (the tensor categories add up to "
            "memory_stats' allocated_bytes; with the allocator cache to reserved_bytes; staging buffers are "
            "counted apart). The strip above each device: its threads' backward passes and optimizer steps; "
            "the rest is forward. Peaks (MiB):</p>"
            f"<table><tr><th>device</th>{head}<th>allocated</th><th>reserved</th></tr>{rows}</table>"
            f"<p>{len(snapshot.events)} events.</p></body></html>")


def _png(snapshot: MemorySnapshot, timelines: list[Timeline], path: Path, title: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ImportError("plot() needs matplotlib for a .png (pip install 'wgpar[plot]'); .html and .svg need "
                          "nothing") from exc
    t0 = snapshot.start_ns
    fig, axes = plt.subplots(len(timelines), 1, figsize=(11, 3.2 * len(timelines)), squeeze=False)
    for ax, tl in zip(axes[:, 0], timelines):
        ms = [(t - t0) / 1e6 for t in tl.times_ns] + [(snapshot.end_ns - t0) / 1e6]
        lower = [0.0] * len(tl.times_ns)
        for cat in ORDER:
            upper = [lo + v / _MIB for lo, v in zip(lower, tl.bytes[cat])]
            if any(u != lo for u, lo in zip(upper, lower)):
                ax.fill_between(ms, lower + lower[-1:], upper + upper[-1:], step="post", color=COLORS[cat],
                                label=cat, linewidth=0)
            lower = upper
        for name, a, b in _phase_spans(snapshot, tl.device):
            ax.axvspan((a - t0) / 1e6, (b - t0) / 1e6, color=PHASE_COLORS.get(name, "#999"), alpha=0.2, lw=0)
        ax.set_title(f"device wgpu:{tl.device} (shaded: backward blue, optimizer orange; the rest forward)",
                     fontsize=9)
        ax.set_ylabel("MiB")
        ax.set_xlabel("time (ms)")
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
