"""docs/differences.md stays true: every ```python block on the page runs as written (each in its own
namespace, in this process) and its assertions hold; the README links the page."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "differences.md"


def _blocks() -> list[tuple[str, str]]:
    text = PAGE.read_text()
    found = []
    for m in re.finditer(r"^```python\n(.*?)^```", text, re.S | re.M):
        heading = re.findall(r"^#+ (.+)$", text[:m.start()], re.M)[-1]
        found.append((f"{heading} (line {text.count(chr(10), 0, m.start()) + 1})", m.group(1)))
    return found


BLOCKS = _blocks()


def test_the_page_has_checks_and_the_readme_links_it():
    assert len(BLOCKS) >= 4
    assert "docs/differences.md" in (ROOT / "README.md").read_text()


@pytest.mark.parametrize("code", [c for _, c in BLOCKS], ids=[n for n, _ in BLOCKS])
def test_every_difference_holds(code):
    exec(compile(code, str(PAGE), "exec"), {"__name__": "differences"})
