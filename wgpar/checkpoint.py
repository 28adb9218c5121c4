"""Checkpoints in the safetensors format: ``wgpar.save(obj, path)`` / ``wgpar.load(path)``. Never pickle.

Tensors go into the safetensors body under their (dotted) key paths, so a
model's ``state_dict()`` saved here reads in any safetensors tool. Everything
else (nesting, int keys, tuples, scalar hyperparameters such as an optimizer's
``lr`` and ``step``) is a JSON tree in the header's metadata under
``wgpar.tree``, whose leaves point at the tensors by name. Files without that
tree (written by other tools) load as a flat dict of tensors.
"""

from __future__ import annotations

import json
import os
import struct
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from .runtime import adapters as _adapters
from .tensor import Tensor

_TREE = "wgpar.tree"
_FORMAT = 1


def _require_safetensors():
    try:
        import safetensors.numpy as stn
    except ImportError:  # a core dependency; only a broken install lands here
        raise ImportError("wgpar.save/load need the safetensors package: pip install safetensors") from None
    return stn


def _encode(obj: Any, path: list[str], arrays: dict[str, np.ndarray]) -> Any:
    """JSON for ``obj``; tensors move to ``arrays`` under a unique name built from their key path."""
    if isinstance(obj, (Tensor, np.ndarray)):
        arr = obj.numpy() if isinstance(obj, Tensor) else obj
        name = ".".join(path) or "tensor"
        base, n = name, 1
        while name in arrays:
            name, n = f"{base}#{n}", n + 1
        arrays[name] = np.ascontiguousarray(arr).reshape(arr.shape)  # (ascontiguousarray makes 0-d 1-d)
        return {"tensor": name}
    if isinstance(obj, dict):
        items = []
        for k, v in obj.items():
            if isinstance(k, (bool, np.bool_)) or not isinstance(k, (str, int, np.integer)):
                raise TypeError(f"wgpar.save: dict keys must be str or int, got {type(k).__name__} ({k!r}) at "
                                f"{'.'.join(path) or '<root>'}")
            key = k if isinstance(k, str) else int(k)
            items.append([key, _encode(v, path + [str(key)], arrays)])
        return {"dict": items}
    if isinstance(obj, (list, tuple)):
        kind = "tuple" if isinstance(obj, tuple) else "list"
        return {kind: [_encode(v, path + [str(i)], arrays) for i, v in enumerate(obj)]}
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, (np.bool_, np.integer, np.floating)):
        return obj.item()
    raise TypeError(f"wgpar.save: cannot store a {type(obj).__name__} at {'.'.join(path) or '<root>'}; "
                    "only tensors, NumPy arrays, dicts, lists, tuples, numbers, strings and None")


def _decode(node: Any, tensors: dict[str, Tensor], path: Path) -> Any:
    if not isinstance(node, dict):
        return node
    if len(node) == 1:
        (kind, body), = node.items()
        if kind == "tensor" and body in tensors:
            return tensors[body]
        if kind == "dict":
            return {k: _decode(v, tensors, path) for k, v in body}
        if kind in ("list", "tuple"):
            items = [_decode(v, tensors, path) for v in body]
            return tuple(items) if kind == "tuple" else items
    raise ValueError(f"{path}: corrupt wgpar metadata (unexpected node {str(node)[:80]})")


def save(obj: Any, path: str | os.PathLike) -> None:
    """Write tensors (a state_dict, or nested dicts/lists with numbers) to a safetensors file.

    The file is written next to ``path`` and renamed over it, so a crash never
    leaves a half-written checkpoint under the final name.

    Arguments:
        obj: a dict of tensors (``model.state_dict()``), or any nesting of dicts (str or int keys),
            lists and tuples whose leaves are Tensors, NumPy arrays, numbers, strings or None
            (``{"model": model.state_dict(), "optim": opt.state_dict(), "epoch": 3}``).
        path: the file to write.
    """
    stn = _require_safetensors()
    arrays: dict[str, np.ndarray] = {}
    tree = _encode(obj, [], arrays)
    metadata = {"wgpar.format": str(_FORMAT), _TREE: json.dumps(tree)}
    data = stn.save(arrays, metadata=metadata)
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load(path: str | os.PathLike, device=None) -> Any:
    """Read a safetensors file written by ``save`` (or any safetensors file) back as wgpar tensors.

    Arguments:
        path: the file to read.
        device: where the tensors go (a Device, an index, ``"wgpu:1"``; default device 0).

    Returns:
        what ``save`` was given, with tensors (and NumPy arrays) as wgpar Tensors; for a
        file from another tool, a dict of its tensors. Raises ValueError naming the path
        when the file is not a complete safetensors file.
    """
    stn = _require_safetensors()
    from safetensors import SafetensorError

    path = Path(path)
    data = path.read_bytes()
    try:
        arrays = stn.load(data)
    except SafetensorError as exc:
        raise ValueError(f"{path}: not a valid safetensors file (truncated or another format): {exc}") from None
    (header_len,) = struct.unpack("<Q", data[:8])
    metadata = json.loads(data[8:8 + header_len]).get("__metadata__") or {}
    dev = _adapters.resolve(device)
    tensors = {name: Tensor.from_numpy(arr, device=dev) for name, arr in arrays.items()}
    if _TREE not in metadata:
        return tensors
    try:
        tree = json.loads(metadata[_TREE])
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: corrupt wgpar metadata: {exc}") from None
    return _decode(tree, tensors, path)


__all__ = ["save", "load"]
