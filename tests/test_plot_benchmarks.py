"""docs/img/benchmarks.svg is what tools/plot_benchmarks.py draws from BENCHMARKS.md's summary table, and
BENCHMARKS.md links it: the picture cannot go stale while the lead edits the table's rows."""

from __future__ import annotations

from pathlib import Path

from .helpers import load_tool

ROOT = Path(__file__).resolve().parent.parent


def _tool():
    return load_tool("plot_benchmarks")


def test_the_committed_svg_is_up_to_date_with_the_table():
    tool = _tool()
    svg = tool.render((ROOT / "BENCHMARKS.md").read_text())
    assert tool.render((ROOT / "BENCHMARKS.md").read_text()) == svg  # the same twice
    assert (ROOT / "docs" / "img" / "benchmarks.svg").read_text() == svg, \
        "docs/img/benchmarks.svg is out of date: run python tools/plot_benchmarks.py"
    assert "(docs/img/benchmarks.svg)" in (ROOT / "BENCHMARKS.md").read_text()


def test_each_kind_of_row_becomes_its_bars():
    tool = _tool()
    text = """# title

## Summary: headline

Some words.

| what | wgpar | PyTorch | ratio | device, date | section |
|---|---|---|---|---|---|
| step & <b> | 2 ms | 1 ms | 2.00x (was 4.5x) | H200, 2026-01-01 | s |
| plain | 3 ms | 1 ms | 3.0x | H100, 2026-01-02 | s |
| matmul 1024 / 2048 | 25 / 50% of torch's TFLOP/s | | | H200, 2026-01-03 | s |
| overhead | +14% | | | H200, 2026-01-04 | s |

| another table | not read |
|---|---|
| 9.9x | x |
"""
    drawn, skipped = tool.bars(tool.summary_rows(text))
    assert [(b.label, b.ratio, b.was) for b in drawn] == [
        ("step & <b>", 2.0, 4.5), ("plain", 3.0, None), ("matmul 1024", 4.0, None), ("matmul 2048", 2.0, None)]
    assert skipped == ["overhead"]
    svg = tool.render(text)
    assert svg.startswith("<svg ") and svg.count("<rect ") == 1 + 4 + 1  # background, 4 bars, 1 "was" bar
    assert "step &amp; &lt;b&gt;" in svg and "overhead" in svg and "9.9x" not in svg
