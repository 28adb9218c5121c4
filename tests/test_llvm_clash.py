"""Triton's library is loaded before the first adapter is enumerated (see wgpar/runtime/llvm_clash.py).

A CUDA build of PyTorch brings triton; loading its ``libtriton.so`` after Mesa's LLVM (which the Vulkan
loader brings in with lavapipe) crashed the process. The order is what matters, so a stand-in triton
package records when it was imported relative to wgpu's adapter enumeration.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PROGRAM = textwrap.dedent("""
    import wgpu
    import wgpu.backends.wgpu_native  # selects the backend, which replaces wgpu.gpu: spy on the real one
    events = []
    real = wgpu.gpu.enumerate_adapters_sync
    def spy(*a, **k):
        events.append("enumerate")
        return real(*a, **k)
    wgpu.gpu.enumerate_adapters_sync = spy
    import builtins
    builtins.EVENTS = events
    import wgpar
    wgpar.device(0)
    print(",".join(events))
""")


def _fake_triton(root: Path) -> None:
    pkg = root / "triton" / "_C"
    pkg.mkdir(parents=True)
    (root / "triton" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "libtriton.py").write_text("import builtins\nbuiltins.EVENTS.append('triton')\n")


def _run(tmp_path: Path, with_triton: bool) -> str:
    path = [str(Path(__file__).resolve().parents[1])]
    if with_triton:
        _fake_triton(tmp_path)
        path.insert(0, str(tmp_path))
    if os.environ.get("PYTHONPATH"):  # keep where wgpu comes from (a --target install on the GPU machine)
        path.append(os.environ["PYTHONPATH"])
    out = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(path)})
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1]


def test_triton_loads_before_adapters(tmp_path):
    if not sys.platform.startswith("linux"):
        pytest.skip("the clash is between ELF shared libraries: Linux only")
    assert _run(tmp_path, with_triton=True) == "triton,enumerate"


def test_no_triton_costs_nothing(tmp_path):
    if importlib.util.find_spec("triton") is not None:
        pytest.skip("a real triton is installed here")
    assert _run(tmp_path, with_triton=False) == "enumerate"
