"""What the examples share: argument parsing with defaults and checks, progress bars, memory and speed reports."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import wgpar

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
