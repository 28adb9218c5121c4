"""What the examples share: argument parsing with defaults and checks, progress bars, memory and speed reports,
a byte corpus and its batches, and a training run over one device or several with its checkpoints."""

from __future__ import annotations

import argparse
import contextlib
import sysconfig
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

import wgpar
from wgpar import distributed as dist
from wgpar.amp import GradScaler

MIB = 1 << 20


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """--help shows every flag's default and keeps the module docstring's layout."""


def parser(doc: str | None) -> argparse.ArgumentParser:
    return argparse.ArgumentParser(description=doc, formatter_class=HelpFormatter)


def at_least(low: int):
    """An argparse type: an int >= ``low`` (argparse turns the ValueError into a usage error naming the flag)."""
    def check(text: str) -> int:
        value = int(text)
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        return value

    check.__name__ = f"int >= {low}"
    return check


def positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def check_device_index(ap: argparse.ArgumentParser, index: int, flag: str = "--device") -> None:
    """Refuse an index past the adapters (wgpar.devices() lists them), naming what exists."""
    names = wgpar.adapter_names()
    if not 0 <= index < len(names):
        listing = "; ".join(f"{i}: {n}" for i, n in enumerate(names))
        ap.error(f"{flag} {index} is out of range: this machine has {len(names)} adapter(s) ({listing})")


def progress(total: int, show: bool = True, initial: int = 0):
    """A tqdm bar (None without tqdm, or when not shown); ``initial`` steps already done (a resumed run)."""
    if not show:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, initial=initial, unit="step", leave=False, dynamic_ncols=True)


def report(bar, msg: str) -> None:
    """Print above the bar (or plainly without one)."""
    bar.write(msg) if bar else print(msg, flush=True)


def mib(nbytes: int) -> str:
    """``1579956 B (1.51 MiB)``."""
    return f"{nbytes} B ({nbytes / MIB:.2f} MiB)"


def memory_line(label: str, device) -> str:
    s = wgpar.memory_stats(device)
    return (f"{label} memory: allocated {mib(s['allocated_bytes'])}, peak {mib(s['peak_allocated_bytes'])}, "
            f"reserved {mib(s['reserved_bytes'])}")


def why_no_speedup(devices: Sequence) -> str | None:
    """Why several devices cannot beat one on this machine, or None where they may."""
    if all(str(d.adapter_type).lower() == "cpu" for d in devices):
        return (f"lavapipe ({devices[0].adapter_name}, a software adapter) runs devices one after another,\n"
                f"  so {len(devices)} devices cannot be faster than one here; on several GPUs they run at once")
    if any(d.logical for d in devices):
        return ("these are logical devices sharing one adapter: they take turns on it, so expect no speed-up;\n"
                "  on several GPUs they run at once")
    return None


# -- a byte corpus --------------------------------------------------------------------------------------
def stdlib_sources() -> list[Path]:
    """Every .py file of this Python's standard library (third-party packages excluded), sorted."""
    root = Path(sysconfig.get_paths()["stdlib"])
    return sorted(p for p in root.rglob("*.py") if not {"site-packages", "dist-packages"} & set(p.parts))


def load_corpus(path: str | None, max_bytes: int = 0) -> np.ndarray:
    """The corpus as bytes (uint8): ``path``, or the standard library's sources joined; at most
    ``max_bytes`` (0: all)."""
    if path:
        data = Path(path).read_bytes()
    else:
        chunks, total = [], 0
        for f in stdlib_sources():
            chunks.append(f.read_bytes())
            total += len(chunks[-1])
            if max_bytes and total >= max_bytes:
                break
        data = b"\n".join(chunks)
    if max_bytes:
        data = data[:max_bytes]
    return np.frombuffer(data, dtype=np.uint8)


def unigram_loss(train: np.ndarray, val: np.ndarray) -> float:
    """Cross-entropy (nats per byte) of ``val`` under ``train``'s byte frequencies (add-one smoothed):
    what a model that ignores context reaches."""
    counts = np.bincount(train, minlength=256).astype(np.float64) + 1.0
    logp = np.log(counts / counts.sum())
    return float(-np.mean(logp[val]))


def get_batch(data: np.ndarray, batch: int, block: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``batch`` random windows of ``block`` bytes and the same windows shifted by one (the targets)."""
    starts = rng.integers(0, len(data) - block - 1, size=batch)
    x = np.stack([data[s:s + block] for s in starts]).astype(np.int32)
    y = np.stack([data[s + 1:s + 1 + block] for s in starts]).astype(np.int32)
    return x, y


# -- a training run on one device or several, and its checkpoints --------------------------------------
@dataclass
class Run:
    """``train(x, y)`` one optimizer step on the step's whole batch, returning its mean loss (a 0-d tensor,
    read back only when the bar is updated); ``evaluate``, ``generate``; per rank its model, optimizer and
    schedule (``sharded``: every rank's is saved, else rank 0's alone)."""

    train: Callable[[np.ndarray, np.ndarray], wgpar.Tensor]
    evaluate: Callable[[np.ndarray, np.ndarray], float]
    generate: Callable[[np.ndarray, int, int], np.ndarray]
    models: list
    opts: list
    scheds: list
    scaler: GradScaler
    devices: list
    ctx: dist.MultiAdapterContext | None = None
    sharded: bool = False
    on_resume: Callable[[int], None] = field(default=lambda step: None)

    def rank_states(self) -> list[dict]:  # a sharded model's state_dict may be a collective: all ranks at once
        states = self.ctx.run(lambda r: self.models[r].state_dict()) if self.ctx else [self.models[0].state_dict()]
        return [{"model": m, "optim": o.state_dict(), "sched": s.state_dict()}
                for m, o, s in zip(states, self.opts, self.scheds)]


@contextlib.contextmanager
def evaluating(models, amp: bool):
    """Eval mode (no dropout), no graph, autocast as in training; train mode again after."""
    for m in models:
        m.eval()
    try:
        with wgpar.no_grad(), wgpar.autocast(enabled=amp):
            yield
    finally:
        for m in models:
            m.train()


def save_checkpoint(run: Run, out: Path, step: int, cfg, args) -> None:
    out.mkdir(parents=True, exist_ok=True)
    meta = {"step": step, "config": asdict(cfg), "parallel": args.parallel, "world_size": len(run.models),
            "scaler": run.scaler.state_dict(), "seed": args.seed}
    states = run.rank_states()
    for r, state in enumerate(states if run.sharded else states[:1]):
        wgpar.save({"meta": meta, **state}, out / f"ckpt-rank{r}.safetensors")


def load_checkpoint(run: Run, out: Path, cfg, args) -> int:
    """Restore every rank from ``out``; returns the step to continue from."""
    paths = [out / f"ckpt-rank{r if run.sharded else 0}.safetensors" for r in range(len(run.models))]
    for path in paths:
        if not path.exists():
            raise SystemExit(f"--resume: {path} is missing (a sharded checkpoint needs one file per rank)")
    states = [wgpar.load(path, device=d) for path, d in zip(paths, run.devices)]
    meta = states[0]["meta"]
    if meta["config"] != asdict(cfg):
        raise SystemExit(f"--resume: the checkpoint's model {meta['config']} differs from this run's {asdict(cfg)}")
    if run.sharded and (meta["parallel"] != args.parallel or meta["world_size"] != len(run.models)):
        raise SystemExit(f"--resume: the checkpoint holds {meta['world_size']} {meta['parallel']} shards; run with "
                         f"--parallel {meta['parallel']} --devices {meta['world_size']}")
    if run.ctx:
        run.ctx.run(lambda r: run.models[r].load_state_dict(states[r]["model"]))
    else:
        run.models[0].load_state_dict(states[0]["model"])
    for o, s, state in zip(run.opts, run.scheds, states):
        o.load_state_dict(state["optim"])
        s.load_state_dict(state["sched"])
    run.scaler.load_state_dict(meta["scaler"])
    return int(meta["step"])
