"""Shared by the benchmark scripts: timing, the torch reference, report flags and BENCHMARKS.md sections."""

from __future__ import annotations

import datetime
import os
import re
import shlex
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")  # lavapipe's WSI complains without it

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS_MD = ROOT / "BENCHMARKS.md"
_HEADER = ("# wgpar benchmarks\n\n"
           "Each section is written by the script it names (it replaces its own section on every run);\n"
           "figures are from the device, date and command the section states.\n")


def command_line() -> str:
    """The exact command that produced the figures (as run from the repository root)."""
    script = Path(sys.argv[0]).resolve()
    try:
        script_s = str(script.relative_to(ROOT))
    except ValueError:
        script_s = sys.argv[0]
    args, skip = [], False
    for a in sys.argv[1:]:  # where the markdown went is not part of how the figures were made
        if skip or a == "--md":
            skip = not skip
            continue
        args.append(a)
    return " ".join(["python", shlex.quote(script_s), *map(shlex.quote, args)])


def mpi_command_line(processes: int) -> str:
    """The command under mpiexec, with the WGPAR_MPI_* settings it ran with."""
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(os.environ.items()) if k.startswith("WGPAR_MPI_"))
    return " ".join(filter(None, [env, f"mpiexec -n {processes}", command_line()]))


def today() -> str:
    return os.environ.get("WGPAR_BENCH_DATE") or datetime.date.today().isoformat()


def device_line(dev) -> str:
    return f"{dev.adapter_name} ({dev.backend}, {dev.adapter_type or 'unknown type'})"


def slug(name: str) -> str:
    """A BENCHMARKS.md section key from an adapter name ("NVIDIA H200" -> "nvidia-h200")."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:40]


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def write_section(key: str, body: str, path: Path = BENCHMARKS_MD) -> None:
    """Replace (or append) the block between the markers for ``key`` in BENCHMARKS.md."""
    start, end = f"<!-- bench:{key} -->", f"<!-- /bench:{key} -->"
    block = f"{start}\n{body.rstrip()}\n{end}"
    text = path.read_text() if path.exists() else _HEADER
    pat = re.compile(re.escape(start) + r".*?" + re.escape(end), re.S)
    text = pat.sub(lambda _: block, text) if pat.search(text) else text.rstrip() + "\n\n" + block + "\n"
    path.write_text(text)


def timed(fn, sync, repeat: int = 1, min_time: float = 0.0, *, warmup: int = 1, rounds: int = 1) -> float:
    """Seconds per call of ``fn``: ``warmup`` calls and a ``sync``, then batches of ``repeat`` calls each
    followed by one ``sync``, until the batches took ``min_time`` seconds in all (one batch when 0).
    With ``rounds`` > 1 that measurement is made ``rounds`` times and the median returned: a batch of
    tens of microseconds a call moves by 2-3x with one slow submit or a clock change (the same layer
    read 0.13 and 0.32 ms in two runs on an H100), so a single batch cannot rank small kernels."""
    for _ in range(warmup):
        fn()
    sync()
    means = []
    for _ in range(max(1, rounds)):
        n, total = 0, 0.0
        while True:
            t0 = time.perf_counter()
            for _ in range(repeat):
                fn()
            sync()
            total += time.perf_counter() - t0
            n += repeat
            if total >= min_time:
                break
        means.append(total / n)
    return statistics.median(means)


def torch_or_none(cuda_only: bool = False):
    """``(torch, "cuda")`` with TF32 off when CUDA is there, else ``(torch, "cpu")``; ``(None, None)`` without
    torch, or without CUDA when ``cuda_only`` (a host reference is then no fair comparison)."""
    try:
        import torch
    except ImportError:
        return None, None
    if torch.cuda.is_available():
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        return torch, "cuda"
    return (None, None) if cuda_only else (torch, "cpu")


def add_report_flags(ap) -> None:
    """``--md PATH`` and ``--no-write``, the same on every script (``--no-md`` is the old spelling)."""
    ap.add_argument("--md", type=Path, default=BENCHMARKS_MD, help="markdown file to update")
    ap.add_argument("--no-write", action="store_true", help="only print; leave the markdown file alone")
    ap.add_argument("--no-md", dest="no_write", action="store_true", help="old spelling of --no-write")


def finish(args, key: str, body: str) -> None:
    """The end of every script: the section ``key`` of ``args.md`` becomes ``body`` unless ``--no-write``."""
    if args.no_write:
        return
    write_section(key, body, args.md)
    print(f"updated {args.md}")
