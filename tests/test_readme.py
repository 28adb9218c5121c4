"""Every ```python block of README.md runs on its own, verbatim, in a fresh process, and prints nothing to
stderr. Blocks that use several devices ask for logical ones (MultiAdapterContext(2), run_spmd(fn, 2)),
which wgpar makes on one adapter, so they run on lavapipe too."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import wgpar

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
TIMEOUT = 180  # seconds per snippet


# The README's long sections live on these pages; their snippets are held to the same rule.
PAGES = [README, ROOT / "docs" / "distributed.md", ROOT / "docs" / "profiling.md"]


def snippets() -> list[tuple[str, str]]:
    """(id, code) of every ```python block: the id is the page, the section heading above the block and its
    line."""
    found = []
    for page in PAGES:
        text = page.read_text()
        for m in re.finditer(r"^```python\n(.*?)^```", text, re.S | re.M):
            line = text.count("\n", 0, m.start()) + 1
            headings = re.findall(r"^#+ (.+)$", text[:m.start()], re.M)
            found.append((f"{page.name}: {headings[-1] if headings else 'top'} (line {line})", m.group(1)))
    return found


SNIPPETS = snippets()


def _run(code: str, cwd: Path) -> subprocess.CompletedProcess:
    # The wgpar under test (this checkout) first; nothing else of the test process's environment changes.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(Path(wgpar.__file__).parent.parent),
                                                                    os.environ.get("PYTHONPATH")])))
    try:
        return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=TIMEOUT)
    except subprocess.TimeoutExpired as exc:
        return subprocess.CompletedProcess(exc.cmd, -1, exc.stdout or "", f"timed out after {TIMEOUT} s")


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """Every snippet's run. Several at once only on machines with cores to spare: lavapipe already computes
    on every core, and each process spends most of its ~3 s starting wgpu and compiling shaders."""
    dirs = [tmp_path_factory.mktemp(f"snippet{i}") for i in range(len(SNIPPETS))]  # each writes where it runs
    with ThreadPoolExecutor(max(1, (os.cpu_count() or 1) // 4)) as pool:
        return list(pool.map(_run, [code for _, code in SNIPPETS], dirs))


def test_the_readme_has_its_snippets():
    assert len(SNIPPETS) >= 8, [name for name, _ in SNIPPETS]
    assert all(sum(name.startswith(p.name) for name, _ in SNIPPETS) for p in PAGES), [n for n, _ in SNIPPETS]


@pytest.mark.parametrize("index", range(len(SNIPPETS)), ids=[name for name, _ in SNIPPETS])
def test_a_readme_snippet_runs_on_its_own(results, index):
    name, code = SNIPPETS[index]
    out = results[index]
    assert out.returncode == 0, f"README snippet '{name}' failed:\n{code}\n--- stderr:\n{out.stderr}"
    assert out.stderr == "", f"README snippet '{name}' wrote to stderr:\n{out.stderr}"
    assert out.stdout.strip(), f"README snippet '{name}' printed nothing"
