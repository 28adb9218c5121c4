"""The import layers of docs/design.md, enforced: a module imports only from its own layer or below,
and no module is part of an import cycle.

runtime -> tensor -> ops -> autograd -> nn / optim (and utils) -> distributed. Every import
counts, also those inside functions (a lazy import is still a dependency).
"""

from __future__ import annotations

import ast
from pathlib import Path

import wgpar

ROOT = Path(wgpar.__file__).resolve().parent

# (module prefix, layer): the longest matching prefix decides.
LAYERS = [
    ("wgpar.errors", 0), ("wgpar.dtypes", 0), ("wgpar.hooks", 0), ("wgpar.runtime", 0), ("wgpar.return_types", 0),
    ("wgpar.profiler", 0),
    ("wgpar.storage", 1), ("wgpar.tensor", 1), ("wgpar.memory", 1),
    ("wgpar.ops", 2), ("wgpar.creation", 2),
    ("wgpar.autograd", 3), ("wgpar.autocast_mode", 3),
    ("wgpar.nn", 4), ("wgpar.optim", 4), ("wgpar.amp", 4), ("wgpar.models", 4), ("wgpar.serialization", 4),
    ("wgpar.checkpoint", 4),
    ("wgpar.functional", 4), ("wgpar.linalg", 4), ("wgpar.utils", 4),
    ("wgpar.distributed", 5),
]
NAMES = {0: "runtime", 1: "tensor", 2: "ops", 3: "autograd", 4: "nn/optim", 5: "distributed"}

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
    """Every wgpar module ``path`` imports (relative imports resolved, ``from pkg import mod`` as mod;
    ``if TYPE_CHECKING:`` imports left out)."""
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found = set()
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):  # imports for annotations only are no dependency
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            node.body = []
    for node in ast.walk(tree):
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
    bad = sorted(upward_imports())
    assert not bad, "upward imports: " + "; ".join(
        f"{a} ({NAMES[layer(a)]}) imports {b} ({NAMES[layer(b)]})" for a, b in bad)


def import_cycles(modules: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []
    for root in sorted(modules):
        if root in index:
            continue
        work = [(root, iter(sorted(modules[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in modules:
                    continue
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(modules[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    component.append(m)
                    if m == node:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))
    return cycles


def test_no_import_cycle():
    modules = {module_name(p): imports(p) for p in sorted(ROOT.rglob("*.py")) if module_name(p) != "wgpar"}
    assert not import_cycles(modules), f"import cycles: {import_cycles(modules)}"
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]  # the check works


def test_no_import_order_pins():
    """Import order is not load order anywhere: no module keeps ruff from sorting its imports."""
    text = (ROOT.parent / "pyproject.toml").read_text()
    assert "I001" not in text
    for path in ROOT.rglob("*.py"):
        assert "noqa: E402" not in path.read_text(), path

