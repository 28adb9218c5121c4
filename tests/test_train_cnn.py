"""examples/train_cnn.py: a short run trains, its flags are checked, and (opt-in, about a minute on
lavapipe: WGPAR_SLOW_TESTS=1) the full run reaches the README's accuracy."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("sklearn", reason="the example needs scikit-learn (wgpar[examples])")

_PATH = Path(__file__).resolve().parents[1] / "examples" / "train_cnn.py"
_spec = importlib.util.spec_from_file_location("train_cnn", _PATH)
train_cnn = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(train_cnn)


def test_a_short_run_lowers_the_loss(dev):
    model, history = train_cnn.train(dev, epochs=2, batch_size=32, lr=1e-2, width=8, limit=192, progress=False)
    losses = [loss for _, loss, _ in history]
    assert len(history) == 2 and np.isfinite(losses).all()
    assert losses[1] < 0.8 * losses[0]
    assert history[-1][2] > 0.3  # ten classes: chance is 0.1
    assert model[1].num_batches_tracked.item() == 2 * 6  # BatchNorm counted every step


def test_main_prints_the_result(capsys):
    train_cnn.main(["--epochs", "1", "--limit", "64", "--width", "4", "--no-progress"])
    out = capsys.readouterr().out
    assert "device: " in out and "final test accuracy" in out and "memory_stats: " in out


@pytest.mark.parametrize("argv, message", [
    (["--epochs", "0"], "--epochs: must be positive, got 0"),
    (["--batch-size", "1"], "--batch-size must be at least 2"),
    (["--lr", "-1"], "--lr: must be positive"),
    (["--device", "99"], "--device 99 is out of range"),
])
def test_bad_flags_exit_with_a_clear_message(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        train_cnn.main(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.skipif(not os.environ.get("WGPAR_SLOW_TESTS"), reason="about a minute on lavapipe: WGPAR_SLOW_TESTS=1")
def test_default_run_reaches_97_percent(dev):
    args = train_cnn.DEFAULTS
    _, history = train_cnn.train(dev, args["epochs"], args["batch_size"], args["lr"], width=args["width"],
                                 progress=False)
    assert history[-1][2] >= 0.97
