"""The import layers of docs/design.md, enforced: a module imports only from its own layer or below.

runtime -> tensor -> ops -> autograd -> nn / optim -> distributed. Every import
counts, also those inside functions (a lazy import is still a dependency).
"""

from __future__ import annotations

import ast
from pathlib import Path

import wgpar

ROOT = Path(wgpar.__file__).resolve().parent

# (module prefix, layer): the longest matching prefix decides.
LAYERS = [
    ("wgpar.errors", 0), ("wgpar.dtypes", 0), ("wgpar.hooks", 0), ("wgpar.runtime", 0),
    ("wgpar.storage", 1), ("wgpar.tensor", 1), ("wgpar.memory", 1), ("wgpar.autocast_mode", 1),
    ("wgpar.ops", 2), ("wgpar.creation", 2),
    ("wgpar.autograd", 3),
    ("wgpar.nn", 4), ("wgpar.optim", 4), ("wgpar.amp", 4), ("wgpar.models", 4), ("wgpar.checkpoint", 4),
    ("wgpar.functional", 4),
    ("wgpar.distributed", 5), ("wgpar.parallel", 5),
]
NAMES = {0: "runtime", 1: "tensor", 2: "ops", 3: "autograd", 4: "nn/optim", 5: "distributed"}

# Upward imports that exist today, each a known cycle in the core that the issue "One definition per op,
# one declaration per kernel, and a core without import cycles" removes. The list must only shrink:
# a new upward import fails, and so does an entry that no longer exists.
KNOWN_CYCLES = {
    ("wgpar.tensor", "wgpar.autograd.engine"),
    ("wgpar.tensor", "wgpar.autograd.functions"),
}


def layer(module: str) -> int | None:
    best = None
    for prefix, lay in LAYERS:
        if (module == prefix or module.startswith(prefix + ".")) and (best is None or len(prefix) > len(best[0])):
            best = (prefix, lay)
    return best[1] if best else None


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name: str) -> bool:
    rel = Path(*name.split("."))
    return (ROOT.parent / rel).with_suffix(".py").exists() or (ROOT.parent / rel / "__init__.py").exists()


def imports(path: Path) -> set[str]:
    """Every wgpar module ``path`` imports (relative imports resolved, ``from pkg import mod`` as mod)."""
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("wgpar")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("wgpar"):
                continue
            subs = [f"{target}.{a.name}" for a in node.names if _is_module(f"{target}.{a.name}")]
            found |= set(subs) if subs else {target}
    return found


def upward_imports() -> set[tuple[str, str]]:
    bad = set()
    for path in sorted(ROOT.rglob("*.py")):
        me = module_name(path)
        mine = layer(me)
        if mine is None:  # the package root re-exports everything
            continue
        for target in imports(path):
            theirs = layer(target)
            if theirs is not None and theirs > mine:
                bad.add((me, target))
    return bad


def test_every_module_has_a_layer():
    unplaced = [m for m in map(module_name, ROOT.rglob("*.py")) if layer(m) is None and m != "wgpar"]
    assert not unplaced, f"add these modules to LAYERS in tests/test_layers.py: {unplaced}"


def test_no_module_imports_from_a_layer_above_it():
    bad = upward_imports()
    new = sorted(bad - KNOWN_CYCLES)
    assert not new, "upward imports: " + "; ".join(
        f"{a} ({NAMES[layer(a)]}) imports {b} ({NAMES[layer(b)]})" for a, b in new)
    gone = sorted(KNOWN_CYCLES - bad)
    assert not gone, f"these known cycles are gone: remove them from KNOWN_CYCLES: {gone}"

