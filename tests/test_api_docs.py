"""docs/api.md is what tools/gen_api.py makes of the current docstrings."""

from __future__ import annotations

from pathlib import Path

from .helpers import load_tool

ROOT = Path(__file__).resolve().parent.parent


def _tool():
    return load_tool("gen_api")


def test_the_api_overview_is_up_to_date():
    tool = _tool()
    text = tool.render()
    assert tool.render() == text  # the same twice: no addresses or set orders in it
    assert (ROOT / "docs" / "api.md").read_text() == text, "docs/api.md is out of date: run python tools/gen_api.py"


def test_the_overview_covers_every_section_and_the_readme_links_it():
    text = (ROOT / "docs" / "api.md").read_text()
    for section in ("wgpar", "wgpar.Tensor", "wgpar.nn", "wgpar.optim", "wgpar.utils.data", "wgpar.distributed"):
        assert f"\n## {section}\n" in text
    for name in ("wgpar.tensor(", "`.backward(", "class `wgpar.nn.Linear(", "class `wgpar.utils.data.DataLoader(",
                 "class `wgpar.distributed.fsdp.FSDP("):
        assert name in text, name
    assert "(docs/api.md)" in (ROOT / "README.md").read_text()


def test_every_public_name_has_a_docstring():
    text = (ROOT / "docs" / "api.md").read_text()
    undocumented = [line.strip() for line in text.splitlines() if "*(no docstring)*" in line]
    assert not undocumented, f"{len(undocumented)} public names lack a docstring:\n" + "\n".join(undocumented[:20])


def test_the_overview_has_the_submodule_sections():
    text = (ROOT / "docs" / "api.md").read_text()
    for section in ("wgpar.nn.utils", "wgpar.linalg", "wgpar.utils.checkpoint", "wgpar.profiler", "wgpar.memory",
                    "wgpar.models", "wgpar.distributed.functional", "wgpar.distributed.single_controller"):
        assert f"\n## {section}\n" in text, section
