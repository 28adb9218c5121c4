"""The examples: every flag documented with its default, bad values refused with a usage error, and the
demo's report (announced single-device run with its time, MiB, the honest speed-up)."""

from __future__ import annotations

import argparse
import gc
import importlib.util
import re
import sys
from pathlib import Path

import pytest

import wgpar

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
NAMES = ["train_mlp", "data_parallel", "pipeline", "fsdp"]


@pytest.fixture(autouse=True)
def collect_garbage():
    """A DataParallel model lives in reference cycles (its gradient hooks): free it before the next test
    counts device memory."""
    yield
    gc.collect()


@pytest.fixture(scope="module")
def examples():
    sys.path.insert(0, str(EXAMPLES))  # the examples import common.py and train_mlp.py as scripts do
    try:
        mods = {}
        for name in NAMES:
            spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
            mods[name] = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mods[name])
        yield mods
    finally:
        sys.path.remove(str(EXAMPLES))


@pytest.mark.parametrize("name", NAMES)
def test_every_flag_has_help_and_shows_its_default(examples, name):
    ap = examples[name].build_parser()
    assert issubclass(ap.formatter_class, argparse.ArgumentDefaultsHelpFormatter)
    flags = [a for a in ap._actions if not isinstance(a, argparse._HelpAction)]
    assert flags
    for action in flags:
        assert action.help, f"{name}: {action.option_strings} has no help text"
    text = ap.format_help()
    assert "(default: " in text


BAD = [
    ("train_mlp", ["--epochs", "0"], "argument --epochs: must be >= 1, got 0"),
    ("train_mlp", ["--lr", "0"], "argument --lr: must be > 0"),
    ("train_mlp", ["--device", "-1"], "argument --device: must be >= 0"),
    ("data_parallel", ["--devices", "0"], "argument --devices: must be >= 1, got 0"),
    ("data_parallel", ["--epochs", "0"], "argument --epochs: must be >= 1"),
    ("data_parallel", ["--devices", "4", "--batch-size", "3"], "--batch-size 3 cannot feed --devices 4"),
    ("pipeline", ["--devices", "0"], "argument --devices: must be >= 1"),
    ("pipeline", ["--microbatches", "8", "--batch-size", "4"], "cannot be cut into --microbatches 8"),
    ("fsdp", ["--devices", "0"], "argument --devices: must be >= 1"),
    ("fsdp", ["--steps", "0"], "argument --steps: must be >= 1"),
]


@pytest.mark.parametrize("name,argv,message", BAD, ids=[f"{n}{' '.join(a)}" for n, a, _ in BAD])
def test_bad_values_are_usage_errors(examples, capsys, name, argv, message):
    with pytest.raises(SystemExit) as exc:
        examples[name].parse_args(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_a_device_past_the_adapters_is_a_usage_error_naming_them(examples, capsys):
    n = len(wgpar.adapter_names())
    with pytest.raises(SystemExit):
        examples["train_mlp"].parse_args(["--device", str(n)])
    err = capsys.readouterr().err
    assert f"--device {n} is out of range: this machine has {n} adapter(s)" in err
    assert wgpar.adapter_names()[0] in err


def _accuracies(out: str) -> list[float]:
    return [float(a) for a in re.findall(r"test accuracy ([\d.]+)% in [\d.]+ s", out)]


@pytest.mark.multidevice
def test_the_demo_reports_both_runs_their_times_and_the_speed_up(examples, capsys):
    examples["data_parallel"].main(["--devices", "2", "--epochs", "2", "--batch-size", "192", "--lr", "1e-2"])
    out = capsys.readouterr().out
    assert "rank 0: wgpu:0 (" in out
    assert re.search(r"rank 1 memory: allocated \d+ B \([\d.]+ MiB\), peak \d+ B \([\d.]+ MiB\)", out)
    assert "for comparison, on one device: the same model, seed and batches on wgpu:0 (" in out
    assert re.search(r"single device: test accuracy [\d.]+% in [\d.]+ s", out)
    assert re.search(r"speed-up on 2 devices: [\d.]+x \(epochs 2-2: [\d.]+ s on 2 devices, [\d.]+ s on one\)", out)
    parallel, single = _accuracies(out)
    assert parallel > 90 and abs(parallel - single) <= 1.0  # the same training, to float rounding
    if wgpar.device(0).adapter_type.lower() == "cpu":
        assert "lavapipe" in out and "runs devices one after another" in out


@pytest.mark.multidevice
def test_the_per_rank_demo_reads_its_share_through_a_distributed_sampler(examples, capsys):
    examples["data_parallel"].main(["--devices", "2", "--epochs", "1", "--backend", "threads", "--no-baseline",
                                    "--batch-size", "128", "--lr", "1e-2"])
    out = capsys.readouterr().out
    assert re.search(r"rank 1 on wgpu:1 \(.*\): allocated \d+ B \([\d.]+ MiB\)", out)
    (acc,) = _accuracies(out)
    assert acc > 85
    assert "for comparison" not in out


def test_train_mlp_prints_a_short_device_line_and_memory_in_mib(examples, capsys):
    examples["train_mlp"].main(["--epochs", "1"])
    out = capsys.readouterr().out
    dev = wgpar.device(0)
    assert out.startswith(f"device: wgpu:0 ({dev.adapter_name}, {dev.backend})\n")
    assert re.search(r"wgpu:0 memory: allocated \d+ B \([\d.]+ MiB\)", out)
    assert _accuracies(out.replace("final test accuracy", "test accuracy"))[0] > 85


@pytest.mark.multidevice
@pytest.mark.parametrize("name,argv", [
    ("fsdp", ["--devices", "2", "--width", "16", "--layers", "2", "--steps", "2", "--batch", "8"]),
    ("pipeline", ["--devices", "2", "--layers", "4", "--width", "16", "--epochs", "1", "--schedule", "gpipe"]),
])
def test_memory_plot_flag_writes_the_timeline(examples, capsys, tmp_path, name, argv):
    out = tmp_path / f"{name}.html"
    examples[name].main([*argv, "--memory-plot", str(out)])
    assert f"memory timeline: {out}" in capsys.readouterr().out
    text = out.read_text()
    assert "<svg" in text and "parameter" in text and "gradient" in text


@pytest.mark.multidevice
def test_pipeline_timeline_flag_draws_the_measured_step(examples, capsys, tmp_path):
    out = tmp_path / "timeline.svg"
    examples["pipeline"].main(["--devices", "2", "--layers", "4", "--width", "16", "--epochs", "1",
                               "--microbatches", "4", "--timeline", str(out)])
    printed = capsys.readouterr().out
    assert f"pipeline timeline: {out}" in printed and "rank 1 run" in printed and "rank 1 model" in printed
    text = out.read_text()
    assert text.startswith("<svg") and all(f"<title>{s}F{m}: " in text for s in (0, 1) for m in range(4))
