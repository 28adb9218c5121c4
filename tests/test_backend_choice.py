"""One programming model: the backend follows from how the program was started, and the core works
without MPI installed."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import wgpar
from wgpar.distributed import ProcessGroup, default_backend, init_process_group, run_spmd
from wgpar.distributed.backends import mpi_world


@pytest.mark.parametrize("var", mpi_world.LAUNCH_VARS)
def test_an_mpi_launcher_selects_the_mpi_backend(monkeypatch, var):
    for v in mpi_world.LAUNCH_VARS:
        monkeypatch.delenv(v, raising=False)
    assert default_backend() == "threads"
    monkeypatch.setenv(var, "0")
    assert default_backend() == "mpi"


def test_without_a_launcher_init_process_group_is_one_rank_on_one_device(monkeypatch):
    for v in mpi_world.LAUNCH_VARS:
        monkeypatch.delenv(v, raising=False)
    g = init_process_group(timeout=30)
    assert init_process_group() is g
    assert isinstance(g, ProcessGroup) and g.backend == "threads"
    assert (g.rank, g.world_size, g.device) == (0, 1, wgpar.device(0))
    t = wgpar.tensor(np.array([1.5, -2.0], np.float32))
    assert g.all_reduce(t, "sum") is t
    np.testing.assert_array_equal(t.numpy(), [1.5, -2.0])
    with pytest.raises(ValueError, match="unknown backend 'gloo'"):
        init_process_group("gloo")


def test_run_spmd_under_mpi_refuses_explicit_devices():
    with pytest.raises(ValueError, match="each process picks its own device"):
        run_spmd(lambda g: None, 2, devices=[0, 1], backend="mpi")


def test_the_core_never_imports_mpi4py():
    code = "import sys, wgpar, wgpar.distributed; print('mpi4py' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "False", out.stderr


def test_a_missing_mpi4py_gives_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "mpi4py", None)  # import mpi4py now raises ImportError
    with pytest.raises(ImportError, match=r"pip install 'wgpar\[mpi\]'"):
        mpi_world.load_mpi()
