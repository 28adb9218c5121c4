"""Repository metadata that tools read: the license, the linter pin, CI running the linter."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_the_license_file_matches_the_metadata():
    project = _project()
    assert project["license"] == "MIT" and project["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("MIT License\n") and "Permission is hereby granted, free of charge" in text


def test_ruff_is_pinned_to_a_range_and_ci_runs_the_linter():
    (ruff,) = [r for r in _project()["optional-dependencies"]["dev"] if r.startswith("ruff")]
    assert ">=" in ruff and "<" in ruff.replace("<=", ""), f"ruff needs an upper bound: {ruff}"
    assert "lint" in (ROOT / ".ci" / "run").read_text().split("make", 1)[1]
    makefile = (ROOT / "Makefile").read_text()
    assert "\nlint: setup\n" in makefile  # lint installs what it needs, like test
