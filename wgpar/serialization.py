"""Checkpoints in the safetensors format: ``wgpar.save(obj, path)`` / ``wgpar.load(path)``. Never pickle.

Tensors go into the safetensors body under their (dotted) key paths, so a
model's ``state_dict()`` saved here reads in any safetensors tool. Everything
else (nesting, int keys, tuples, scalar hyperparameters such as an optimizer's
``lr`` and ``step``) is a JSON tree in the header's metadata under
``wgpar.tree``, whose leaves point at the tensors by name. Files without that
tree (written by other tools) load as a flat dict of tensors; their float64, bfloat16 and float8
tensors become float32 (exactly, but for float64's rounding), any integer type int32 (each value
checked to fit first).
"""

from __future__ import annotations

import json
import os
import reprlib
import secrets
import struct
from pathlib import Path
from typing import Any

import numpy as np

from .runtime import adapters as _adapters
from .tensor import Tensor

_TREE = "wgpar.tree"
_FORMAT = 1
_RESERVED = "__metadata__"  # safetensors' header key for the metadata: no tensor may be named so
_MAX_DEPTH = 100  # nesting levels of a saved tree (state dicts use a handful)

# safetensors dtype -> NumPy dtype of the stored (little-endian) bytes
_NATIVE = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "U64": "<u8", "I32": "<i4", "U32": "<u4",
           "I16": "<i2", "U16": "<u2", "I8": "i1", "U8": "u1", "BOOL": "?"}


def _e4m3_table() -> np.ndarray:
    """float32 value of every float8 E4M3FN byte (bias 7, no infinities, S.1111.111 is NaN)."""
    b = np.arange(256)
    exp, mant = (b >> 3) & 0xF, (b & 7).astype(np.float64)
    mag = np.where(exp == 0, mant * 2.0**-9, (1 + mant / 8) * 2.0 ** (exp - 7))
    mag = np.where((exp == 15) & (mant == 7), np.nan, mag)
    return np.where(b & 0x80, -mag, mag).astype(np.float32)


def _from_bits(data: bytes, dtype: str) -> np.ndarray | None:
    """Exact float32 values of the low-precision float types NumPy lacks; None for other dtypes."""
    if dtype == "BF16":  # the top half of a float32
        return (np.frombuffer(data, "<u2").astype(np.uint32) << 16).view(np.float32)
    if dtype == "F8_E5M2":  # the top byte of a float16
        return (np.frombuffer(data, "u1").astype(np.uint16) << 8).view(np.float16).astype(np.float32)
    if dtype == "F8_E4M3":
        return _e4m3_table()[np.frombuffer(data, "u1")]
    return None


def _host_array(name: str, view: dict, path: Path) -> np.ndarray:
    """One tensor of a safetensors file as a NumPy array wgpar can upload, ranges checked first."""
    dtype, shape, data = view["dtype"], view["shape"], view["data"]
    arr = _from_bits(data, dtype)
    if arr is None:
        if dtype not in _NATIVE:
            raise TypeError(f"{path}: tensor {name!r} has dtype {dtype}, which wgpar cannot represent (it reads "
                            "F64, F32, F16, BF16, F8_E4M3 and F8_E5M2 as floats, integer types as int32, BOOL as bool)")
        arr = np.frombuffer(data, _NATIVE[dtype])
    arr = arr.reshape(shape)
    if dtype == "F64":
        with np.errstate(over="ignore"):  # overflow is looked for just below
            narrow = arr.astype(np.float32)
        lost = np.isfinite(arr) & ~np.isfinite(narrow)
        if lost.any():
            raise ValueError(f"{path}: tensor {name!r} (F64) holds {arr[lost].flat[0]!r}, beyond float32's range")
        return narrow
    if arr.dtype.kind in "iu" and arr.size:
        lo, hi = int(arr.min()), int(arr.max())
        if lo < -(2**31) or hi >= 2**31:
            raise ValueError(f"{path}: tensor {name!r} ({dtype}) holds values in [{lo}, {hi}], beyond int32's range")
    return arr


def _corrupt(path: Path, why: str) -> ValueError:
    return ValueError(f"{path}: corrupt checkpoint: wgpar metadata {why}")


def _require_safetensors():
    try:
        import safetensors.numpy as stn
    except ImportError:  # a core dependency; only a broken install lands here
        raise ImportError("wgpar.save/load need the safetensors package: pip install safetensors") from None
    return stn


def _encode(obj: Any, path: list[str], arrays: dict[str, np.ndarray], open_: set[int] | None = None) -> Any:
    """JSON for ``obj``; tensors move to ``arrays`` under a unique name built from their key path.

    ``open_`` holds the ids of the containers being encoded (a container inside itself is an error).
    """
    if isinstance(obj, (Tensor, np.ndarray)):
        arr = obj.numpy() if isinstance(obj, Tensor) else obj
        name = ".".join(path) or "tensor"
        base, n = name, 1
        while name in arrays or name == _RESERVED:  # the tree maps the key back; other tools see "__metadata__#1"
            name, n = f"{base}#{n}", n + 1
        arrays[name] = np.ascontiguousarray(arr).reshape(arr.shape)  # (ascontiguousarray makes 0-d 1-d)
        return {"tensor": name}
    if isinstance(obj, (dict, list, tuple)):
        where = ".".join(path) or "<root>"
        open_ = set() if open_ is None else open_
        if id(obj) in open_:
            raise ValueError(f"wgpar.save: the {type(obj).__name__} at {where} contains itself")
        if len(path) >= _MAX_DEPTH:
            raise ValueError(f"wgpar.save: nesting deeper than {_MAX_DEPTH} levels at {where}")
        open_.add(id(obj))
        try:
            return _encode_container(obj, path, arrays, open_)
        finally:
            open_.discard(id(obj))
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, (np.bool_, np.integer, np.floating)):
        return obj.item()
    raise TypeError(f"wgpar.save: cannot store a {type(obj).__name__} at {'.'.join(path) or '<root>'}; "
                    "only tensors, NumPy arrays, dicts, lists, tuples, numbers, strings and None")


def _encode_container(obj, path: list[str], arrays: dict[str, np.ndarray], open_: set[int]) -> Any:
    if isinstance(obj, dict):
        items = []
        for k, v in obj.items():
            if isinstance(k, (bool, np.bool_)) or not isinstance(k, (str, int, np.integer)):
                raise TypeError(f"wgpar.save: dict keys must be str or int, got {type(k).__name__} ({k!r}) at "
                                f"{'.'.join(path) or '<root>'}")
            key = k if isinstance(k, str) else int(k)
            items.append([key, _encode(v, path + [str(key)], arrays, open_)])
        return {"dict": items}
    kind = "tuple" if isinstance(obj, tuple) else "list"
    return {kind: [_encode(v, path + [str(i)], arrays, open_) for i, v in enumerate(obj)]}


def _decode(node: Any, tensors: dict[str, Tensor], path: Path, depth: int = 0) -> Any:
    """Rebuild what ``_encode`` wrote; anything else is a corrupt checkpoint (never a bare KeyError,
    unpacking error or RecursionError)."""
    if node is None or isinstance(node, (bool, int, float, str)):
        return node
    if isinstance(node, dict) and len(node) == 1:
        (kind, body), = node.items()
        if kind == "tensor" and isinstance(body, str):
            if body not in tensors:
                raise _corrupt(path, f"names a tensor {body!r} the file does not hold")
            return tensors[body]
        if depth >= _MAX_DEPTH:  # as save counts it: containers only
            raise _corrupt(path, f"nests deeper than {_MAX_DEPTH} levels")
        if kind == "dict" and isinstance(body, list) and all(
                isinstance(kv, list) and len(kv) == 2 and isinstance(kv[0], (str, int)) and not isinstance(kv[0], bool)
                for kv in body):
            return {k: _decode(v, tensors, path, depth + 1) for k, v in body}
        if kind in ("list", "tuple") and isinstance(body, list):
            items = [_decode(v, tensors, path, depth + 1) for v in body]
            return tuple(items) if kind == "tuple" else items
    raise _corrupt(path, f"holds an unexpected node {reprlib.repr(node)}")


def save(obj: Any, path: str | os.PathLike) -> None:
    """Write tensors (a state_dict, or nested dicts/lists with numbers) to a safetensors file.
    Differs from torch: a safetensors file, not a pickle: other Python objects raise TypeError.

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
    write_atomic(Path(path), stn.save(arrays, metadata=metadata))


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to a new file next to ``path`` and rename it over ``path``.

    A crash never leaves a half-written file under the final name, and the file gets the
    permissions a plain ``open(path, "wb")`` would give (0o666 less the umask; ``tempfile.mkstemp``
    would make it 0o600, unreadable to the user's group).

    Arguments:
        path: the file to write.
        data: its contents.
    """
    for _ in range(100):
        tmp = path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
            break
        except FileExistsError:
            continue
    else:
        raise FileExistsError(f"could not create a temporary file next to {path}")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def load(path: str | os.PathLike, device=None) -> Any:
    """Read a safetensors file written by ``save`` (or any safetensors file) back as wgpar tensors.
    Differs from torch: no ``map_location=``, ``weights_only=`` or ``mmap=`` (``device=`` places the tensors).

    Arguments:
        path: the file to read.
        device: where the tensors go (a Device, an index, ``"wgpu:1"``; default device 0).

    Returns:
        what ``save`` was given, with tensors (and NumPy arrays) as wgpar Tensors; for a
        file from another tool, a dict of its tensors. Raises ValueError naming the path
        when the file is not a complete safetensors file.
    """
    _require_safetensors()
    from safetensors import SafetensorError, deserialize

    path = Path(path)
    data = path.read_bytes()
    try:
        views = deserialize(data)  # checks the header, every offset and every size
    except SafetensorError as exc:
        raise ValueError(f"{path}: not a valid safetensors file (truncated or another format): {exc}") from None
    (header_len,) = struct.unpack("<Q", data[:8])
    metadata = json.loads(data[8:8 + header_len]).get(_RESERVED) or {}  # a str -> str map (checked above)
    dev = _adapters.resolve(device)
    arrays = {name: _host_array(name, view, path) for name, view in views}  # every range before any upload
    tensors = {name: Tensor.from_numpy(arr, device=dev) for name, arr in arrays.items()}
    if _TREE not in metadata:
        return tensors
    try:
        tree = json.loads(metadata[_TREE])
    except json.JSONDecodeError as exc:
        raise _corrupt(path, f"is not JSON: {exc}") from None
    except RecursionError:
        raise _corrupt(path, "nests too deeply to parse") from None
    return _decode(tree, tensors, path)


__all__ = ["save", "load", "write_atomic"]
