"""State dicts and checkpoints of a sharded model: full, sharded, and reloaded on another number of ranks.

- ``full_state_dict(model)``: every parameter and buffer whole, as NumPy arrays under the names the
  unsharded model's ``state_dict`` uses (a tied one under each of its names; loads into it with
  ``load_state_dict``); one gather per unit, host memory
  only (the whole model need not fit on one device).
- ``sharded_state_dict(model)``: this rank's rows of each parameter (``LocalShard``), no communication.
- ``save_sharded_checkpoint(model, dir, optimizer)``: every rank writes its rows of every parameter
  and of its optimizer state to ``rank<r>-of-<N>.safetensors`` (the rows it holds are in the file's
  metadata); rank 0 adds ``index.json`` (world size, names, optimizer hyperparameters).
- ``load_sharded_checkpoint(model, dir, optimizer)``: on any number of ranks (or into an unsharded
  model on one device), each rank reads the rows its shards need from whichever files hold them
  (safetensors slices: it never reads the whole model) and loads the optimizer state the same way.

Checkpoint files name parameters as ``model.named_parameters()`` (each once); a parameter's dim-0 rows
are what moves between layouts, so a checkpoint saved on 4 ranks continues on 2 ranks or on 1 exactly.
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ...autograd.grad_mode import no_grad
from ...nn.module import Module
from ...serialization import write_atomic
from ...tensor import Tensor
from ..group import ProcessGroup
from .param import FSDPParam, OffloadedShard, fsdp_param_of

FORMAT = "wgpar-fsdp-sharded/1"
_META = "wgpar.fsdp"


@dataclass
class LocalShard:
    """Rows ``rows[0]:rows[1]`` of dim 0 of a parameter of ``shape``, held by this rank (``data``)."""

    data: np.ndarray
    shape: tuple[int, ...]
    rows: tuple[int, int]


def _groups(model: Module) -> list:
    out = []
    for m in model.modules():
        st = m.__dict__.get("_fsdp_state")
        if st is not None and st.group is not None:
            out.append(st.group)
    return out


def _settle(model: Module) -> None:
    """Checkpoints read and write shards: no gathered copy may outlive a load."""
    for grp in _groups(model):
        grp.reshard()


def _rows2d(shape: tuple[int, ...]) -> tuple[int, int]:
    rows = shape[0] if shape else 1
    return rows, int(np.prod(shape[1:])) if len(shape) > 1 else 1


def full_state_dict(model: Module, *, rank0_only: bool = False,
                    group: ProcessGroup | None = None) -> dict[str, np.ndarray]:
    """The whole parameters and buffers of ``model`` by name, as NumPy arrays (the shards' dtype).

    A collective: every rank of the model's group calls it (one gather per sharded unit).

    Arguments:
        model: the sharded model (an unsharded one works too: its own values).
        rank0_only: other ranks get an empty dict (they still take part in the gathers).
        group: the model's ProcessGroup, needed with ``rank0_only`` to know the rank (default: the root's).
    """
    groups = _groups(model)
    values: dict[int, np.ndarray] = {}
    for grp in groups:
        for fp, v in zip(grp.params, grp.full_values()):
            values[id(fp)] = v
    rank = _rank(model, group)
    if rank0_only and rank != 0:
        return {}
    out: dict[str, np.ndarray] = {}
    for name, p in model.named_parameters(remove_duplicate=False):  # a tied one under each name, as state_dict
        fp = fsdp_param_of(p)
        out[name] = values[id(fp)] if fp is not None else p.numpy()
    for name, b in model.named_buffers(remove_duplicate=False):
        out[name] = b.numpy()
    return out


def full_tensor_state_dict(model: Module) -> OrderedDict[str, Tensor]:
    """``FSDPModule.state_dict``: whole parameters and buffers as Tensors on this rank's device (a collective)."""
    values = full_state_dict(model)
    params = list(model.named_parameters(remove_duplicate=False))  # every name of a tied parameter, as above
    buffers = list(model.named_buffers(remove_duplicate=False))
    devices = {n: t.device for n, t in [*params, *buffers]}
    dtypes = {n: (fsdp_param_of(p).group.dtype if fsdp_param_of(p) is not None else p.dtype)
              for n, p in params} | {n: b.dtype for n, b in buffers}
    return OrderedDict((n, Tensor.from_numpy(v, device=devices[n], dtype=dtypes[n])) for n, v in values.items())


def load_full_state_dict(model: Module, state: dict, strict: bool = True) -> tuple[list[str], list[str]]:
    """``FSDPModule.load_state_dict``: whole tensors (or arrays) by name; each rank writes the rows it holds
    (no communication). Raises KeyError (strict) and ValueError for a shape mismatch, like Module's."""
    named = list(model.named_parameters())
    buffers = list(model.named_buffers())
    # A tied parameter may come under any of its names (torch's state_dict lists every one): the first
    # name present stands for it, and it is missing only when none is.
    aliases: dict[int, list[str]] = {}
    for n, p in model.named_parameters(remove_duplicate=False):
        aliases.setdefault(id(p), []).append(n)
    every = {n for names in aliases.values() for n in names} | {n for n, _ in buffers}
    missing = [n for n, p in named if not any(a in state for a in aliases[id(p)])]
    missing += [n for n, _ in buffers if n not in state]
    unexpected = [k for k in state if k not in every]
    if strict and (missing or unexpected):
        raise KeyError(f"load_state_dict for {type(model).__name__}: missing keys {missing}, unexpected keys "
                       f"{unexpected}")
    arrays = {k: (v.numpy() if isinstance(v, Tensor) else np.asarray(v)) for k, v in state.items() if k in every}
    for n, p in named:
        given = [a for a in aliases[id(p)] if a in arrays]
        if given and n not in arrays:
            arrays[n] = arrays[given[0]]
        for a in given[1:]:
            if not np.array_equal(arrays[given[0]], arrays[a]):
                raise ValueError(f"load_state_dict: {given[0]!r} and {a!r} name one (tied) parameter but hold "
                                 f"different values")
    for name, p in named:
        if name in arrays:
            shape = _local_rows(p)[1]
            if tuple(arrays[name].shape) != shape:
                raise ValueError(f"load_state_dict: {name!r} has shape {tuple(arrays[name].shape)} in the state "
                                 f"dict but {shape} in the model")
    _settle(model)
    with no_grad():
        for name, p in named:
            if name in arrays:
                fp, shape, (lo, hi) = _local_rows(p)
                rows = arrays[name].reshape(_rows2d(shape))[lo:hi]
                _write(p, _padded(rows, tuple(p.shape)) if fp is not None and fp.sharded else
                       rows.reshape(shape))
        for name, b in buffers:
            if name in arrays:
                b.copy_(Tensor.from_numpy(arrays[name], device=b.device, dtype=b.dtype))
    return missing, unexpected


def _rank(model: Module, group: ProcessGroup | None) -> int:
    if group is not None:
        return group.rank
    for grp in _groups(model):
        return grp.comms.dp.rank
    return 0


def _world(model: Module) -> int:
    for grp in _groups(model):
        return grp.comms.dp.world_size
    return 1


def _dp_group(model: Module) -> ProcessGroup | None:
    for grp in _groups(model):
        return grp.comms.dp
    return None


def _local_rows(p: Tensor) -> tuple[FSDPParam | None, tuple[int, ...], tuple[int, int]]:
    """(FSDPParam or None, full shape, rows [lo, hi) of dim 0 this rank holds) for a registered parameter."""
    fp = fsdp_param_of(p)
    if fp is None:
        return None, tuple(p.shape), (0, _rows2d(tuple(p.shape))[0])
    if fp.sharded:
        return fp, fp.geometry.shape, fp.geometry.real_rows()
    return fp, fp.shape, (0, _rows2d(fp.shape)[0])


def _registered_values(p: Tensor) -> np.ndarray:
    return p.host.copy() if isinstance(p, OffloadedShard) else p.numpy()


def _real(arr: np.ndarray, shape: tuple[int, ...], lo: int, hi: int) -> np.ndarray:
    """The real rows of a shard-shaped array (padding dropped), as rows of the full parameter."""
    rows, row = _rows2d(shape)
    return np.ascontiguousarray(arr.reshape(-1, row)[:hi - lo])


def sharded_state_dict(model: Module) -> dict[str, LocalShard]:
    """This rank's rows of every parameter (padding dropped) and its buffers whole; no communication."""
    _settle(model)
    out: dict[str, LocalShard] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        fp, shape, (lo, hi) = _local_rows(p)
        out[name] = LocalShard(_real(_registered_values(p), shape, lo, hi).reshape((hi - lo, *shape[1:]) if shape
                                                                                 else (hi - lo,)), shape, (lo, hi))
    return out


def _to_host(value: Any) -> Any:
    if isinstance(value, Tensor):
        return value.numpy()
    return value


def save_sharded_checkpoint(model: Module, path: str | os.PathLike, optimizer=None) -> None:
    """Write this rank's shards (and optimizer state) under directory ``path``; every rank calls it.

    Arguments:
        model: the sharded model (or an unsharded one: a one-file checkpoint).
        path: a directory (made if needed); files of an earlier checkpoint there are replaced.
        optimizer: its state is saved with the parameters (rows like theirs), hyperparameters in the index.
    """
    import safetensors.numpy as stn

    _settle(model)
    directory = Path(path)
    directory.mkdir(parents=True, exist_ok=True)
    rank, world = _rank(model, None), _world(model)
    named = list(model.named_parameters())
    names = {id(p): n for n, p in named}
    arrays: dict[str, np.ndarray] = {}
    meta: dict[str, Any] = {"rank": rank, "world": world, "params": {}, "optim": {}, "buffers": []}
    for name, p in named:
        fp, shape, (lo, hi) = _local_rows(p)
        if fp is not None and not fp.sharded and rank != 0:
            continue  # replicated: rank 0's copy is the one
        arrays[f"param/{name}"] = _real(_registered_values(p), shape, lo, hi)
        meta["params"][name] = {"shape": list(shape), "rows": [lo, hi], "dtype": str(arrays[f"param/{name}"].dtype)}
    if rank == 0:
        for name, b in model.named_buffers():
            arrays[f"buffer/{name}"] = np.ascontiguousarray(b.numpy())
            meta["buffers"].append(name)
    index: dict[str, Any] = {"format": FORMAT, "world_size": world, "params": [n for n, _ in named],
                             "optimizer": None}
    if optimizer is not None:
        sd = optimizer.state_dict()
        order = [p for g in optimizer.param_groups for p in g["params"]]
        groups = []
        for g, saved in zip(optimizer.param_groups, sd["param_groups"]):
            hyper = {k: (list(v) if isinstance(v, tuple) else v) for k, v in saved.items() if k != "params"}
            groups.append({**hyper, "params": [names[id(p)] for p in g["params"]]})
        index["optimizer"] = {"type": type(optimizer).__name__, "param_groups": groups}
        for i, entry in sd["state"].items():
            p = order[int(i)]
            name = names[id(p)]
            if name not in meta["params"]:
                continue  # a replicated parameter on a rank other than 0
            fp, shape, (lo, hi) = _local_rows(p)
            scalars = {}
            for key, value in entry.items():
                value = _to_host(value)
                if isinstance(value, np.ndarray) and value.ndim and value.shape == tuple(p.shape):
                    arrays[f"optim/{name}/{key}"] = _real(value, shape, lo, hi)
                else:
                    scalars[key] = np.asarray(value).item() if isinstance(value, np.ndarray) else value
            meta["optim"][name] = {"scalars": scalars,
                                   "arrays": sorted(k.split("/")[-1] for k in arrays if k.startswith(f"optim/{name}/"))}
    data = stn.save(arrays, metadata={_META: json.dumps(meta)})
    write_atomic(directory / f"rank{rank:05d}-of-{world:05d}.safetensors", data)
    if rank == 0:
        write_atomic(directory / "index.json", json.dumps(index, indent=1).encode())
    group = _dp_group(model)
    if group is not None and group.world_size > 1:
        group.barrier(label="fsdp:checkpoint")  # every file is complete before anyone reads them


class _Reader:
    """The files of a sharded checkpoint; reads rows of a named array from whichever files hold them."""

    def __init__(self, directory: Path) -> None:
        from safetensors import safe_open

        index_path = directory / "index.json"
        if not index_path.exists():
            raise FileNotFoundError(f"{directory}: no index.json (not a sharded checkpoint, or not complete)")
        try:
            self.index = json.loads(index_path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(f"{index_path}: not a valid sharded-checkpoint index ({exc})") from None
        if not isinstance(self.index, dict):
            raise ValueError(f"{index_path}: not a valid sharded-checkpoint index (a JSON object is expected)")
        if self.index.get("format") != FORMAT:
            raise ValueError(f"{index_path}: format {self.index.get('format')!r}, expected {FORMAT!r}")
        world = int(self.index["world_size"])
        self.files = []
        for r in range(world):
            f = directory / f"rank{r:05d}-of-{world:05d}.safetensors"
            if not f.exists():
                raise FileNotFoundError(f"{directory}: {f.name} is missing ({world} ranks saved this checkpoint)")
            handle = safe_open(str(f), framework="numpy")
            self.files.append((handle, json.loads(handle.metadata()[_META])))

    def info(self, name: str) -> dict[str, Any]:
        for _, meta in self.files:
            if name in meta["params"]:
                return meta["params"][name]
        raise KeyError(f"the checkpoint has no parameter {name!r}")

    def rows(self, key: str, name: str, lo: int, hi: int) -> np.ndarray:
        """Rows [lo, hi) of ``key`` (``param/<name>`` or ``optim/<name>/<state>``), from every file holding some."""
        shape = tuple(self.info(name)["shape"])
        rows, row = _rows2d(shape)
        out: np.ndarray | None = None
        covered = 0
        for handle, meta in self.files:
            entry = meta["params"].get(name)
            if entry is None or key not in handle.keys():
                continue
            flo, fhi = entry["rows"]
            a, b = max(lo, flo), min(hi, fhi)
            if a >= b:
                continue
            piece = handle.get_slice(key)[a - flo:b - flo]
            if out is None:
                out = np.zeros((hi - lo, row), dtype=piece.dtype)
            out[a - lo:b - lo] = piece.reshape(b - a, row)
            covered += b - a
        if hi > lo and covered < hi - lo:
            raise ValueError(f"the checkpoint holds only {covered} of rows [{lo}, {hi}) of {key}")
        return out if out is not None else np.zeros((0, row), dtype=np.float32)

    def scalars(self, name: str) -> dict[str, Any]:
        for _, meta in self.files:
            if name in meta["optim"]:
                return meta["optim"][name]
        return {}

    def buffer(self, name: str) -> np.ndarray | None:
        for handle, meta in self.files:
            if name in meta["buffers"]:
                return handle.get_tensor(f"buffer/{name}")
        return None


def _padded(rows: np.ndarray, shard_shape: tuple[int, ...]) -> np.ndarray:
    """Real rows laid out in a shard of ``shard_shape`` (zero rows after them)."""
    out = np.zeros(shard_shape, dtype=np.float32)
    flat = out.reshape(shard_shape[0] if shard_shape else 1, -1)
    flat[:rows.shape[0]] = rows.reshape(rows.shape[0], flat.shape[1])
    return out


def load_sharded_checkpoint(model: Module, path: str | os.PathLike, optimizer=None) -> None:
    """Load a checkpoint saved by ``save_sharded_checkpoint`` on any number of ranks; every rank calls it.

    Arguments:
        model: the sharded model, on any number of ranks (or an unsharded one on one device), with the
            checkpoint's parameter names and shapes.
        path: the checkpoint directory.
        optimizer: built over ``model.parameters()`` (same parameter groups as when saved); its state
            and hyperparameters are loaded.
    """
    reader = _Reader(Path(path))
    if optimizer is not None:  # before any parameter is written: a refused load changes nothing
        _check_optimizer_type(reader, optimizer)
    _settle(model)
    named = list(model.named_parameters())
    with no_grad():
        for name, p in named:
            fp, shape, (lo, hi) = _local_rows(p)
            saved = tuple(reader.info(name)["shape"])
            if saved != shape:
                raise ValueError(f"load_sharded_checkpoint: {name!r} has shape {saved} in the checkpoint but "
                                 f"{shape} in the model")
            value = _padded(reader.rows(f"param/{name}", name, lo, hi), tuple(p.shape))
            _write(p, value)
        for name, b in model.named_buffers():
            value = reader.buffer(name)
            if value is not None:
                b.copy_(Tensor.from_numpy(value, device=b.device, dtype=b.dtype))
    if optimizer is not None:
        optimizer.load_state_dict(_optimizer_state(reader, named, optimizer))


def _write(p: Tensor, value: np.ndarray) -> None:
    if isinstance(p, OffloadedShard):
        p.host[...] = value
        p._storage.bump_version()  # gathered copies are stale
    else:
        p.copy_(Tensor.from_numpy(value.astype(p.dtype.np, copy=False), device=p.device, dtype=p.dtype))


def _algorithm(optimizer_type: str | None) -> str | None:
    """HostAdamW keeps AdamW's state (on the host): a checkpoint moves between the two."""
    return optimizer_type[4:] if optimizer_type and optimizer_type.startswith("Host") else optimizer_type


def _check_optimizer_type(reader: _Reader, optimizer) -> None:
    saved = reader.index.get("optimizer")
    if saved is None:
        raise ValueError("load_sharded_checkpoint: the checkpoint was saved without an optimizer")
    mine = type(optimizer).__name__
    if _algorithm(saved.get("type")) != _algorithm(mine):
        # Another optimizer's state has other keys and meaning (AdamW's moments are no SGD momentum).
        raise TypeError(f"load_sharded_checkpoint: the checkpoint holds {saved.get('type')} state, which cannot "
                        f"be loaded into {mine}; build a {saved.get('type')} (or load the model without it)")


def _optimizer_state(reader: _Reader, named, optimizer) -> dict[str, Any]:
    saved = reader.index.get("optimizer")
    if saved is None:
        raise ValueError("load_sharded_checkpoint: the checkpoint was saved without an optimizer")
    names = {id(p): n for n, p in named}
    if len(saved["param_groups"]) != len(optimizer.param_groups):
        raise ValueError(f"the checkpoint's optimizer has {len(saved['param_groups'])} parameter groups, this one "
                         f"{len(optimizer.param_groups)}")
    groups, state, index = [], {}, 0
    for g, sg in zip(optimizer.param_groups, saved["param_groups"]):
        mine = [names.get(id(p)) for p in g["params"]]
        if mine != sg["params"]:
            raise ValueError(f"optimizer parameter group {len(groups)} holds {mine}, the checkpoint's {sg['params']}")
        groups.append({**{k: v for k, v in sg.items() if k != "params"},
                       "params": list(range(index, index + len(mine)))})
        for p, name in zip(g["params"], mine):
            fp, shape, (lo, hi) = _local_rows(p)
            info = reader.scalars(name)
            if info:
                entry: dict[str, Any] = dict(info["scalars"])
                for key in info["arrays"]:
                    entry[key] = _padded(reader.rows(f"optim/{name}/{key}", name, lo, hi), tuple(p.shape))
                state[index] = entry
            index += 1
    return {"state": state, "param_groups": groups}


__all__ = ["full_state_dict", "sharded_state_dict", "save_sharded_checkpoint", "load_sharded_checkpoint",
           "LocalShard"]
