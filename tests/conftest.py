"""Shared fixtures: skip the whole suite cleanly when no adapter works; seeded NumPy inputs; PyTorch.

Every test checks against NumPy float64 (or plain Python); PyTorch is an extra reference, reached only
through the ``torch`` fixture. A test that asks for it is skipped where torch is not installed and is
marked ``torch`` so CI can run those comparisons on their own (``pytest -m torch``).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import wgpar

try:
    _DEV = wgpar.device(0)
except Exception as exc:  # no adapter at all: every test needs one
    _DEV = None
    _WHY = f"no WebGPU adapter: {exc}"


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason=_WHY) if _DEV is None else None
    for item in items:
        if skip is not None:
            item.add_marker(skip)
        # Marked at collection (not when the fixture runs) so that `-m torch` selects these tests.
        if "torch" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.torch)


@pytest.fixture(scope="session")
def dev():
    return _DEV


@pytest.fixture(scope="session")
def devs2():
    return wgpar.devices(2)


@pytest.fixture
def rng(request):
    # A fresh seed per test (printed on failure) so inputs differ between runs yet reproduce.
    seed = int.from_bytes(os.urandom(4), "little")
    request.node.user_properties.append(("seed", seed))
    return np.random.default_rng(seed)



@pytest.fixture(scope="session")
def torch():
    """The torch module, or a skip of the asking test where it is not installed."""
    return pytest.importorskip("torch")


@pytest.fixture(params=[None, pytest.param("torch", marks=pytest.mark.torch)], ids=["float64", "torch"])
def reference(request):
    """Runs the asking test twice: against its NumPy float64 reference (None) and against PyTorch (the
    torch module; that run is marked ``torch`` and skipped where torch is not installed)."""
    return request.getfixturevalue("torch") if request.param else None
