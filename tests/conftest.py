"""Shared fixtures: skip the whole suite cleanly when no adapter works; seeded NumPy inputs."""

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
    if _DEV is None:
        skip = pytest.mark.skip(reason=_WHY)
        for item in items:
            item.add_marker(skip)


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

