"""Write docs/api.md, the API overview, from wgpar's docstrings.

    python tools/gen_api.py            # rewrite docs/api.md
    python tools/gen_api.py --check    # exit 1 if docs/api.md is not what this would write

Every public name of each public module (its ``__all__``, or the public functions it defines), with its
signature and the first paragraph of its docstring; a class lists its own public methods and properties
under it. A name appears once, in the first section that has it (subpackages before their parent). A
missing docstring shows as such, and tests/test_api_docs.py fails on one (and while docs/api.md is
out of date).
"""

from __future__ import annotations

import argparse
import enum
import importlib
import inspect
import re
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
OUTPUT = ROOT / "docs" / "api.md"

# (module, what it is for): the order of the sections.
SECTIONS = [
    ("wgpar", "tensors, factories, devices, memory, checkpoints, and the elementwise ops as functions"),
    ("wgpar.Tensor", "the tensor: its methods and properties"),
    ("wgpar.autograd", "graphs, tapes, backward, custom functions"),
    ("wgpar.nn.utils", "gradient utilities"),
    ("wgpar.nn", "Module, Parameter and layers"),
    ("wgpar.nn.functional", "losses and activations as functions"),
    ("wgpar.nn.init", "parameter initialisation"),
    ("wgpar.linalg", "linear algebra (vector norms)"),
    ("wgpar.optim.lr_scheduler", "learning-rate schedules"),
    ("wgpar.optim", "optimizers"),
    ("wgpar.amp", "mixed precision: autocast and GradScaler"),
    ("wgpar.models", "ready-made models (GPT)"),
    ("wgpar.utils.data", "datasets, samplers, DataLoader"),
    ("wgpar.utils.checkpoint", "activation checkpointing"),
    ("wgpar.profiler", "the profiler: kernel and range timings"),
    ("wgpar.memory", "memory statistics, history snapshots and timelines"),
    ("wgpar.distributed.tensor_parallel", "tensor parallelism"),
    ("wgpar.distributed.pipeline", "pipeline parallelism"),
    ("wgpar.distributed.fsdp", "fully sharded data parallelism"),
    ("wgpar.distributed.functional", "differentiable collectives"),
    ("wgpar.distributed.single_controller", "one process driving several devices"),
    ("wgpar.distributed", "process groups, collectives, launching, data parallelism"),
]
SKIP_METHODS_OF_LAYERS = {"forward", "extra_repr"}  # every layer has them; Module documents them once

HEADER = """# wgpar API overview

Generated from the docstrings by `python tools/gen_api.py`; do not edit by hand
(`tests/test_api_docs.py` fails when this file is out of date). Each entry is a signature and the
first paragraph of its docstring; `help(wgpar.<name>)` shows the whole docstring. The
[README](../README.md) shows how the pieces fit together, [design.md](design.md) why they are so.
"""


def _summary(obj) -> str:
    doc = obj.__doc__ if isinstance(obj.__doc__, str) else None
    if isinstance(obj, property):
        doc = obj.fget.__doc__ if obj.fget is not None else None
    if not doc or not doc.strip():
        return "*(no docstring)*"
    first = inspect.cleandoc(doc).split("\n\n")[0]
    return " ".join(line.strip() for line in first.splitlines())


class _Raw(str):
    """An annotation kept as the source wrote it (``from __future__ import annotations`` makes strings)."""

    def __repr__(self) -> str:
        return str(self)


def _signature(obj, method: bool = False) -> str:
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return "(...)"
    params = list(sig.parameters.values())
    if method and params and params[0].kind in (params[0].POSITIONAL_ONLY, params[0].POSITIONAL_OR_KEYWORD):
        params = params[1:]  # the instance, whatever its name (the registry's methods call it x or a)
    raw = lambda a: _Raw(a) if isinstance(a, str) else a  # noqa: E731
    sig = sig.replace(parameters=[p.replace(annotation=raw(p.annotation)) for p in params],
                      return_annotation=raw(sig.return_annotation))
    return re.sub(r" at 0x[0-9a-f]+", "", str(sig))  # no addresses: the file must not change between runs


def _public_names(module: ModuleType) -> list[str]:
    names = getattr(module, "__all__", None)
    if names is None:
        names = sorted(n for n, v in vars(module).items()
                       if not n.startswith("_") and callable(v) and getattr(v, "__module__", None) == module.__name__)
    return [n for n in names if not isinstance(getattr(module, n, None), ModuleType)]


def _is_layer(cls: type) -> bool:
    nn = importlib.import_module("wgpar.nn")
    return isinstance(cls, type) and issubclass(cls, nn.Module) and cls is not nn.Module


def _members(cls: type) -> list[str]:
    lines = []
    for name, value in vars(cls).items():
        if name.startswith("_") or (_is_layer(cls) and name in SKIP_METHODS_OF_LAYERS):
            continue
        if isinstance(value, property):
            lines.append(f"  - `.{name}`: {_summary(value)}")
        elif isinstance(value, (staticmethod, classmethod)):
            fn = value.__func__
            lines.append(f"  - `.{name}{_signature(getattr(cls, name))}`: {_summary(fn)}")
        elif inspect.isfunction(value) or inspect.isbuiltin(value):
            lines.append(f"  - `.{name}{_signature(value, method=True)}`: {_summary(value)}")
    return sorted(lines, key=str.lower)


def _entry(qualname: str, obj) -> list[str]:
    if isinstance(obj, type) and issubclass(obj, enum.Enum):
        members = ", ".join(m.name for m in obj)
        return [f"- `{qualname}` (enum: {members}): {_summary(obj)}"]
    if isinstance(obj, type):
        return [f"- class `{qualname}{_signature(obj)}`: {_summary(obj)}", *_members(obj)]
    if callable(obj):
        return [f"- `{qualname}{_signature(obj)}`: {_summary(obj)}"]
    return [f"- `{qualname}` = `{obj!r}`"]


def render() -> str:
    import wgpar

    seen: set[int] = set()
    out = [HEADER]
    toc, bodies = [], []
    for section, purpose in SECTIONS:
        lines = []
        if section == "wgpar.Tensor":
            lines.append(f"class `wgpar.Tensor`: {_summary(wgpar.Tensor)}\n")
            lines += [line[2:] for line in _members(wgpar.Tensor)]  # its members at the top level of the section
            seen.add(id(wgpar.Tensor))
        else:
            module = importlib.import_module(section)
            for name in _public_names(module):
                obj = getattr(module, name)
                if id(obj) in seen or obj is wgpar.Tensor:
                    continue
                if not isinstance(obj, (int, float, str, tuple, frozenset)):  # constants may repeat by value
                    seen.add(id(obj))
                lines += _entry(f"{section}.{name}", obj)
        anchor = section.replace(".", "")
        toc.append(f"- [{section}](#{anchor}): {purpose}")
        bodies.append(f"## {section}\n\n{purpose[0].upper()}{purpose[1:]}.\n\n" + "\n".join(lines) + "\n")
    return "\n".join(out + ["\n".join(toc) + "\n"] + bodies)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="only compare with docs/api.md; exit 1 if it differs")
    args = ap.parse_args(argv)
    text = render()
    if args.check:
        if not OUTPUT.exists() or OUTPUT.read_text() != text:
            print(f"{OUTPUT.relative_to(ROOT)} is out of date: run python tools/gen_api.py", file=sys.stderr)
            return 1
        return 0
    OUTPUT.write_text(text)
    print(f"wrote {OUTPUT.relative_to(ROOT)} ({text.count(chr(10))} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
