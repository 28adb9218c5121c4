"""Draw docs/img/benchmarks.svg, a bar chart of the headline figures, from BENCHMARKS.md's summary table.

    python tools/plot_benchmarks.py            # rewrite docs/img/benchmarks.svg
    python tools/plot_benchmarks.py --check    # exit 1 if the SVG is not what this would write

It reads the first table under the "## Summary" heading of BENCHMARKS.md as it is (the rows are
edited by hand; this tool never writes BENCHMARKS.md) and draws one bar per figure: wgpar's time over
PyTorch's, on a log scale with a line at parity, and a pale bar for the figure before ("was 4.28x").
A row's figure is the ``1.75x`` at the start of its ratio cell; a row with no ratio but "a / b / c%
of torch's ..." in its wgpar cell becomes one bar per percentage (time ratio 100 / p), named after
the matching "x / y / z" list in its first cell. Rows with neither (an overhead, not a comparison)
are named under the chart as not drawn. Plain SVG text, no dependencies; tests/test_plot_benchmarks.py
fails when the committed SVG is out of date with the table.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from pathlib import Path
from typing import NamedTuple
from xml.sax.saxutils import escape

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "BENCHMARKS.md"
OUTPUT = ROOT / "docs" / "img" / "benchmarks.svg"

_RATIO = re.compile(r"^\s*(\d+(?:\.\d+)?)x(?:\s*\(was (\d+(?:\.\d+)?)x\))?")
_PERCENTS = re.compile(r"^\s*(\d+(?:\.\d+)?(?:\s*/\s*\d+(?:\.\d+)?)*)\s*% of torch")
_SLASH_LIST = re.compile(r"^(.*?)\s*(\S+(?:\s*/\s*\S+)+)\s*$")


class Bar(NamedTuple):
    label: str
    ratio: float  # wgpar's time over torch's
    was: float | None  # the ratio before, where the row gives one
    note: str  # what the table says, shown beside the bar
    where: str  # device, date


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def summary_rows(text: str) -> list[dict[str, str]]:
    """The rows of the first table under the ``## Summary`` heading, as {column name: cell}."""
    m = re.search(r"^## Summary.*$", text, re.M)
    if m is None:
        raise ValueError("BENCHMARKS.md has no '## Summary' heading")
    lines = text[m.end():].splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("|")), None)
    if start is None:
        raise ValueError("no table under BENCHMARKS.md's '## Summary' heading")
    table = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        table.append(line)
    header = _cells(table[0])
    return [dict(zip(header, _cells(line))) for line in table[2:]]


def bars(rows: list[dict[str, str]]) -> tuple[list[Bar], list[str]]:
    """The bars to draw, and the names of the rows that have no ratio to torch."""
    out, skipped = [], []
    for row in rows:
        what, ratio_cell = row.get("what", ""), row.get("ratio", "")
        wgpar_cell, where = row.get("wgpar", ""), row.get("device, date", "")
        m = _RATIO.match(ratio_cell)
        if m:
            was = float(m.group(2)) if m.group(2) else None
            out.append(Bar(what, float(m.group(1)), was, ratio_cell, where))
            continue
        p = _PERCENTS.match(wgpar_cell)
        if p:
            percents = [float(v) for v in re.split(r"\s*/\s*", p.group(1))]
            names = [f"{what} ({i + 1})" for i in range(len(percents))]
            lm = _SLASH_LIST.match(what)
            if lm:
                items = re.split(r"\s*/\s*", lm.group(2))
                if len(items) == len(percents):
                    names = [f"{lm.group(1)} {item}".strip() for item in items]
            for name, pct in zip(names, percents):
                out.append(Bar(name, 100.0 / pct, None, f"{100.0 / pct:.2f}x ({pct:g}% of torch's rate)", where))
            continue
        skipped.append(what)
    return out, skipped


# Layout, in pixels.
_WIDTH, _LABEL_W, _NOTE_W, _ROW_H, _TOP, _FONT = 1000, 330, 300, 26, 58, 12
_PLOT_X0, _PLOT_X1 = _LABEL_W + 10, _WIDTH - _NOTE_W - 10


def _ticks(hi: float) -> list[float]:
    ticks, decade = [], 1.0
    while decade <= hi:
        ticks += [t * decade for t in (1, 2, 5) if t * decade <= hi]
        decade *= 10
    return ticks


def render(text: str) -> str:
    drawn, skipped = bars(summary_rows(text))
    if not drawn:
        raise ValueError("no row of BENCHMARKS.md's summary table has a ratio to torch")
    hi = max(max(b.ratio, b.was or 0.0) for b in drawn)
    hi = next(t for t in _ticks(hi * 10) if t >= hi * 1.05)  # the axis ends at a 1, 2 or 5 tick
    x = lambda r: _PLOT_X0 + (_PLOT_X1 - _PLOT_X0) * math.log10(max(r, 1.0)) / math.log10(hi)  # noqa: E731
    height = _TOP + _ROW_H * len(drawn) + 40 + (18 if skipped else 0)
    bottom = _TOP + _ROW_H * len(drawn)
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_WIDTH}" height="{height}" '
        f'viewBox="0 0 {_WIDTH} {height}" font-family="sans-serif" font-size="{_FONT}">',
        f'<rect width="{_WIDTH}" height="{height}" fill="white"/>',
        '<text x="10" y="20" font-size="15" font-weight="bold">wgpar time / PyTorch time '
        '(lower is better; 1x is parity)</text>',
        '<text x="10" y="38" fill="#555">Drawn from the summary table of BENCHMARKS.md by '
        'tools/plot_benchmarks.py; log scale, pale bar: the figure before.</text>',
    ]
    for t in _ticks(hi):
        tx = x(t)
        colour = "#333" if t == 1 else "#ddd"
        out.append(f'<line x1="{tx:.1f}" y1="{_TOP - 6}" x2="{tx:.1f}" y2="{bottom}" stroke="{colour}"/>')
        out.append(f'<text x="{tx:.1f}" y="{bottom + 14}" text-anchor="middle" fill="#555">{t:g}x</text>')
    for i, b in enumerate(drawn):
        y = _TOP + i * _ROW_H
        out.append(f'<text x="{_LABEL_W}" y="{y + 14}" text-anchor="end">{escape(b.label)}</text>')
        if b.was is not None:
            out.append(f'<rect x="{_PLOT_X0}" y="{y + 2}" width="{x(b.was) - _PLOT_X0:.1f}" height="16" '
                       f'fill="#c6d9ec"/>')
        colour = "#2b6cb0" if b.ratio <= 2 else "#dd8a2b" if b.ratio <= 4 else "#c53030"
        out.append(f'<rect x="{_PLOT_X0}" y="{y + 5}" width="{max(x(b.ratio) - _PLOT_X0, 1.0):.1f}" height="10" '
                   f'fill="{colour}"/>')
        out.append(f'<text x="{_PLOT_X1 + 10}" y="{y + 14}">{escape(b.note)}</text>')
        out.append(f'<text x="{_WIDTH - 8}" y="{y + 14}" text-anchor="end" fill="#777">{escape(b.where)}</text>')
    out.append(f'<text x="{(_PLOT_X0 + _PLOT_X1) / 2:.1f}" y="{bottom + 30}" text-anchor="middle" fill="#555">'
               'wgpar / PyTorch, time</text>')
    if skipped:
        out.append(f'<text x="10" y="{bottom + 50}" fill="#555">Not drawn (no ratio to torch in the table): '
                   f'{escape("; ".join(skipped))}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="only compare with the SVG; exit 1 if it differs")
    args = ap.parse_args(argv)
    svg = render(SOURCE.read_text())
    if args.check:
        if not OUTPUT.exists() or OUTPUT.read_text() != svg:
            print(f"{OUTPUT.relative_to(ROOT)} is out of date: run python tools/plot_benchmarks.py", file=sys.stderr)
            return 1
        return 0
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    OUTPUT.write_text(svg)
    print(f"wrote {OUTPUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
