"""Shared by the benchmark scripts: device description and BENCHMARKS.md sections."""

from __future__ import annotations

import datetime
import os
import re
import shlex
import sys
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
