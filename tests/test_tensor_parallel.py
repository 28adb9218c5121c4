"""Tensor parallelism is exact: outputs and every gradient equal the single-device model's, on 2 and 4 ranks.

Sizes are chosen so they do not divide by the ranks (uneven splits: the first ranks get one more unit).
"Equal" is 1e-5 relative to the tensor's largest entry (float32 sums in another order). Each rank's
parameters are slices of the single-device ones; the helpers cut the same slices from the reference.
"""

from __future__ import annotations

import ast
import math
from pathlib import Path

import numpy as np
import pytest

import wgpar
from wgpar import nn, optim
from wgpar.distributed import (
    MLP,
    CausalSelfAttention,
    ColumnParallelLinear,
    ColwiseParallel,
    DistributedDataParallel,
    MultiAdapterContext,
    ParallelCausalSelfAttention,
    ParallelMLP,
    RankError,
    RowParallelLinear,
    RowwiseParallel,
    parallelize_module,
    tensor_data_grid,
)
from wgpar.distributed.tensor_parallel import shard_sizes
from wgpar.nn import functional as F

from . import gradcheck
from .helpers import np_sdpa

pytestmark = pytest.mark.multidevice


@pytest.fixture(scope="module", params=[2, 4], ids=["2dev", "4dev"])
def _ctx(request):
    c = MultiAdapterContext(request.param, timeout=60)
    yield c
    c.close()


@pytest.fixture
def ctx(_ctx):
    yield _ctx
    if _ctx.group.broken:  # a failed test must not fail the next ones
        _ctx.reset()


def _rel(got, want) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, f"shape {got.shape} != {want.shape}"
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))


def _assert_rel(got, want, what: str, tol: float = 1e-5) -> None:
    rel = _rel(got, want)
    assert rel < tol, f"{what}: relative difference {rel:.2e}"


def _layer_of(model: nn.Module, pname: str):
    *path, _ = pname.split(".")
    m = model
    for p in path:
        m = m._modules[p]
    return m


def _expected_slice(model: nn.Module, pname: str, full: np.ndarray) -> np.ndarray:
    """What rank's ``pname`` holds of the single-device array ``full``."""
    layer, leaf = _layer_of(model, pname), pname.rsplit(".", 1)[-1]
    if isinstance(layer, ColumnParallelLinear):
        return np.concatenate([full[lo:hi] for lo, hi in layer.ranges], axis=0)
    if isinstance(layer, RowParallelLinear) and leaf == "weight":
        (lo, hi), = layer.ranges
        return full[:, lo:hi]
    return full  # replicated: a row-parallel bias, LayerNorm, a plain Linear


def _state(model: nn.Module) -> dict[str, np.ndarray]:
    return {k: v.numpy() for k, v in model.state_dict().items()}


def _check_grads(model: nn.Module, ref_grads: dict[str, np.ndarray], rank: int) -> None:
    names = [k for k, _ in model.named_parameters()]
    assert sorted(names) == sorted(ref_grads), names
    for k, p in model.named_parameters():
        _assert_rel(p.grad.numpy(), _expected_slice(model, k, ref_grads[k]), f"rank {rank} grad {k}")


def _single_device(model: nn.Module, x: np.ndarray, w: np.ndarray):
    """Output, input gradient and parameter gradients of sum(model(x) * w) on device 0."""
    xt = wgpar.tensor(x).requires_grad_()
    y = model(xt)
    (y * wgpar.tensor(w)).sum().backward()
    return y.numpy(), xt.grad.numpy(), {k: p.grad.numpy() for k, p in model.named_parameters()}


def _tp_run(ctx, make_tp, x: np.ndarray, w: np.ndarray, want, extra=None) -> None:
    """Every rank builds its block with ``make_tp(group)`` and compares output and gradients with ``want``."""
    y_ref, gx_ref, grads_ref = want

    def rank(r: int) -> None:
        group = ctx.comm(r)
        tp = make_tp(group)
        xt = wgpar.tensor(x, device=group.device).requires_grad_()
        group.reset_traffic()
        y = tp(xt)
        (y * wgpar.tensor(w, device=group.device)).sum().backward()
        traffic = group.traffic()
        _assert_rel(y.numpy(), y_ref, f"rank {r} output")
        _assert_rel(xt.grad.numpy(), gx_ref, f"rank {r} input grad")
        _check_grads(tp, grads_ref, r)
        # Column then row: one all-reduce of the output in forward, one of the input gradient in backward.
        assert traffic["collectives"] == 2, traffic
        assert traffic["d2h_bytes"] == traffic["h2d_bytes"] == 2 * x.nbytes, traffic
        if extra is not None:
            extra(tp, group)

    ctx.run(rank)


# -- sharding ---------------------------------------------------------------------------------
def test_shard_sizes_uneven_and_in_units():
    assert shard_sizes(11, 4) == [3, 3, 3, 2]
    assert shard_sizes(30, 4, unit=5) == [10, 10, 5, 5]  # 6 heads of 5 over 4 ranks: whole heads
    with pytest.raises(ValueError, match="cannot be split over 4 ranks: every rank needs at least one"):
        shard_sizes(3, 4)
    with pytest.raises(ValueError, match="of 10 is not a multiple of the unit 4"):
        shard_sizes(10, 2, unit=4)


# -- blocks: forward and every gradient -------------------------------------------------------
def test_mlp_matches_single_device(ctx, rng):
    d, hidden = 7, 13  # neither divides by 2 or 4
    wgpar.manual_seed(int(rng.integers(1 << 30)))
    ref = MLP(d, hidden)
    state = _state(ref)
    x = rng.standard_normal((3, 5, d)).astype(np.float32)
    w = rng.standard_normal((3, 5, d)).astype(np.float32)
    want = _single_device(ref, x, w)

    def make(group):
        m = MLP(d, hidden, device=group.device)
        m.load_state_dict(state)
        tp = ParallelMLP.from_dense(m, group)
        assert isinstance(tp, ParallelMLP) and isinstance(m.fc1, nn.Linear)  # the dense block keeps its layers
        assert tp.fc1.local_out_features == shard_sizes(hidden, group.world_size)[group.rank]
        return tp

    _tp_run(ctx, make, x, w, want)


def test_attention_matches_single_device(ctx, rng):
    heads, hd = 5, 3  # 5 heads: [3, 2] on 2 ranks, [2, 1, 1, 1] on 4
    d = heads * hd
    wgpar.manual_seed(int(rng.integers(1 << 30)))
    ref = CausalSelfAttention(d, heads)
    state = _state(ref)
    x = rng.standard_normal((2, 6, d)).astype(np.float32)
    w = rng.standard_normal((2, 6, d)).astype(np.float32)
    want = _single_device(ref, x, w)

    def make(group):
        m = CausalSelfAttention(d, heads, device=group.device)
        m.load_state_dict(state)
        return ParallelCausalSelfAttention.from_dense(m, group)

    def heads_split(tp, group):
        assert tp.local_heads == shard_sizes(heads, group.world_size)[group.rank]

    _tp_run(ctx, make, x, w, want, heads_split)


def _np_causal_attention(x, p, heads):
    """CausalSelfAttention in float64 NumPy: qkv projection, causal SDPA per head, output projection."""
    b, t, d = x.shape
    q, k, v = np.split(x @ p["qkv.weight"].T + p["qkv.bias"], 3, -1)
    q, k, v = (a.reshape(b, t, heads, d // heads).transpose(0, 2, 1, 3) for a in (q, k, v))
    y = np_sdpa(q, k, v, causal=True).transpose(0, 2, 1, 3).reshape(b, t, d)
    return y @ p["out_proj.weight"].T + p["out_proj.bias"]


def _attention_problem(rng):
    b, t, heads, hd = 2, 7, 3, 4
    d = heads * hd
    wgpar.manual_seed(int(rng.integers(1 << 30)))
    m = CausalSelfAttention(d, heads)
    m.load_state_dict({k: (0.5 * rng.standard_normal(v.shape)).astype(np.float32)  # biases not zero
                       for k, v in _state(m).items()})
    x = rng.standard_normal((b, t, d)).astype(np.float32)
    w = rng.standard_normal((b, t, d)).astype(np.float32)
    return m, heads, x, w


def test_single_device_attention_matches_float64(rng):
    """The reference block itself: causal multi-head attention in float64 NumPy, gradients by central
    differences."""
    m, heads, x, w = _attention_problem(rng)
    y, gx, grads = _single_device(m, x, w)
    state = {k: v.astype(np.float64) for k, v in _state(m).items()}
    names = list(state)

    def f(x, *params):
        return _np_causal_attention(x, dict(zip(names, params)), heads)

    want = gradcheck.numeric_grad(f, [x.astype(np.float64)] + list(state.values()), w)
    _assert_rel(y, f(x.astype(np.float64), *state.values()), "output")
    _assert_rel(gx, want[0], "input grad")
    for name, g in zip(names, want[1:]):
        _assert_rel(grads[name], g, f"grad {name}")


def test_single_device_attention_matches_torch(rng, torch):
    """The reference block itself: causal multi-head attention as torch computes it, float64."""
    m, heads, x, w = _attention_problem(rng)
    (b, t, d), hd = x.shape, x.shape[-1] // heads
    y, gx, grads = _single_device(m, x, w)
    P = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True) for k, v in _state(m).items()}
    X = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    q, k, v = (X @ P["qkv.weight"].T + P["qkv.bias"]).split(d, -1)
    q, k, v = (a.reshape(b, t, heads, hd).transpose(1, 2) for a in (q, k, v))
    Y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
    Y = Y @ P["out_proj.weight"].T + P["out_proj.bias"]
    (Y * torch.tensor(w, dtype=torch.float64)).sum().backward()
    _assert_rel(y, Y.detach().numpy(), "output")
    _assert_rel(gx, X.grad.numpy(), "input grad")
    for name, g in grads.items():
        _assert_rel(g, P[name].grad.numpy(), f"grad {name}")


# -- layers on their own ----------------------------------------------------------------------
def test_layers_gather_scatter_and_fused_chunks(ctx, rng):
    """Column with gather_output over a fused 3-chunk weight (outputs back in the full layer's order);
    row taking its slice of a replicated input; fresh layers: row bias zero on every rank."""
    n_in, unit, n_out = 5, 2, 3 * 2 * 5  # 3 chunks of 5 units of 2
    wgpar.manual_seed(int(rng.integers(1 << 30)))
    col, row = nn.Linear(n_in, n_out), nn.Linear(n_out, 4)
    cs, rs = _state(col), _state(row)
    x = rng.standard_normal((3, n_in)).astype(np.float32)
    w = rng.standard_normal((3, 4)).astype(np.float32)
    want = _single_device(nn.Sequential(col, row), x, w)

    def rank(r: int) -> None:
        group = ctx.comm(r)
        dense = nn.Sequential(nn.Linear(n_in, n_out, device=group.device), nn.Linear(n_out, 4, device=group.device))
        dense.load_state_dict({**{f"0.{k}": v for k, v in cs.items()}, **{f"1.{k}": v for k, v in rs.items()}})
        tp = parallelize_module(dense, group, {"0": ColwiseParallel(gather_output=True, unit=unit, chunks=3),
                                               "1": RowwiseParallel(input_is_parallel=False)})
        xt = wgpar.tensor(x, device=group.device).requires_grad_()
        hidden = tp[0](xt)
        _assert_rel(hidden.numpy(), x @ cs["weight"].T + cs["bias"], f"rank {r} gathered chunks")
        y = tp[1](hidden)
        (y * wgpar.tensor(w, device=group.device)).sum().backward()
        _assert_rel(y.numpy(), want[0], f"rank {r} output")
        _assert_rel(xt.grad.numpy(), want[1], f"rank {r} input grad")
        _check_grads(tp, want[2], r)
        with pytest.raises(ValueError, match=r"input of shape \(3, 4\) does not end in in_features \(5\)"):
            tp[0](wgpar.zeros(3, 4, device=group.device))

        fresh = RowParallelLinear(9, 4, group)
        assert not fresh.bias.numpy().any() and fresh.weight.shape == (4, shard_sizes(9, group.world_size)[r])
        bound = 1 / math.sqrt(9)
        assert np.abs(fresh.weight.numpy()).max() <= bound
        col_fresh = ColumnParallelLinear(9, 11, group)
        assert np.abs(col_fresh.weight.numpy()).max() <= bound

    ctx.run(rank)


# -- parallelize_module -----------------------------------------------------------------------
def _dense_model(device=None) -> nn.Module:
    return nn.Sequential(nn.Linear(5, 9, device=device), nn.GELU(), nn.Linear(9, 7, device=device), nn.Tanh(),
                         nn.Linear(7, 10, device=device), nn.Linear(10, 3, device=device))


def test_parallelize_module_reproduces_a_trained_model(ctx, rng):
    """Train on one device, load the same checkpoint on every rank, parallelize: same outputs. Rank 1's
    copy is perturbed first; the broadcast from rank 0 (the default) makes every rank slice rank 0's."""
    wgpar.manual_seed(int(rng.integers(1 << 30)))
    ref = _dense_model()
    opt = optim.AdamW(ref.parameters(), lr=0.05)
    X = rng.standard_normal((16, 5)).astype(np.float32)
    Y = rng.integers(0, 3, 16).astype(np.int32)
    for _ in range(5):
        opt.zero_grad()
        F.cross_entropy(ref(wgpar.tensor(X)), Y).backward()
        opt.step()
    state = _state(ref)
    with wgpar.no_grad():
        want = ref(wgpar.tensor(X)).numpy()
    plan = {"0": ColwiseParallel(), "2": RowwiseParallel(), "4": ColwiseParallel(gather_output=True),
            "5": RowwiseParallel(input_is_parallel=False)}

    def rank(r: int):
        group = ctx.comm(r)
        model = _dense_model(group.device)
        model.load_state_dict({k: v + (1.0 if r == 1 else 0.0) for k, v in state.items()})
        same = parallelize_module(model, group, plan)
        assert same is model and [type(m).__name__ for m in model][::2] == ["ColumnParallelLinear",
                                                                             "RowParallelLinear",
                                                                             "ColumnParallelLinear"]
        with wgpar.no_grad():
            _assert_rel(model(wgpar.tensor(X, device=group.device)).numpy(), want, f"rank {r} output")
        # src_rank=None slices each rank's own copy, without communicating.
        fresh = _dense_model(group.device)
        fresh.load_state_dict(state)
        group.reset_traffic()
        parallelize_module(fresh, group, {"0": ColwiseParallel(), "2": RowwiseParallel()}, src_rank=None)
        assert group.traffic()["collectives"] == 0
        with wgpar.no_grad():
            _assert_rel(fresh(wgpar.tensor(X, device=group.device)).numpy(), want, f"rank {r} output, no broadcast")

    ctx.run(rank)


def test_parallelize_module_bad_plans():
    with MultiAdapterContext(2, timeout=30) as ctx:
        def rank(r: int) -> None:
            group = ctx.comm(r)
            with pytest.raises(KeyError, match=r"'fc9' matches no sub-module of Sequential; its Linear layers are "
                                               r"\['0', '2', '4', '5'\]"):
                parallelize_module(_dense_model(group.device), group, {"fc9": ColwiseParallel()})
            with pytest.raises(TypeError, match="ColwiseParallel shards an nn.Linear, but '1' is a GELU"):
                parallelize_module(_dense_model(group.device), group, {"1": ColwiseParallel()})
            with pytest.raises(KeyError, match="'2' is matched by plan entries '2' and '\\*'"):
                parallelize_module(_dense_model(group.device), group, {"2": ColwiseParallel(), "*": RowwiseParallel()})
            with pytest.raises(TypeError, match=r"plan\['0'\] must be a ParallelStyle"):
                parallelize_module(_dense_model(group.device), group, {"0": "colwise"})
            other = ctx.devices[1 - r]
            with pytest.raises(ValueError, match="move the model there first, or pass src_rank=None"):
                parallelize_module(_dense_model(other), group, {"0": ColwiseParallel()})
            with pytest.raises(ValueError, match="heads|at least one unit"):
                ParallelCausalSelfAttention(4, 1, group)  # one head cannot be split over 2 ranks

        ctx.run(rank)
        ctx.run(lambda r: None)  # the failures left the group usable


# -- training ---------------------------------------------------------------------------------
class _Block(nn.Module):
    def __init__(self, d: int, heads: int, hidden: int, device=None) -> None:
        super().__init__()
        # No projection biases: k's has an exactly zero gradient (softmax ignores a shift shared by all keys),
        # whose float32 noise AdamW would normalise into full-size steps, differently on each side.
        self.ln1, self.attn = nn.LayerNorm(d, device=device), CausalSelfAttention(d, heads, bias=False, device=device)
        self.ln2, self.mlp = nn.LayerNorm(d, device=device), MLP(d, hidden, device=device)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class _Tiny(nn.Module):
    """A transformer block and a classifier head (replicated under TP)."""

    def __init__(self, d=6, heads=3, hidden=10, classes=5, device=None) -> None:
        super().__init__()
        self.blocks = nn.Sequential(_Block(d, heads, hidden, device))
        self.head = nn.Linear(d, classes, device=device)
        self.classes = classes

    def forward(self, x):
        return self.head(self.blocks(x)).reshape(-1, self.classes)


def _tiny_plan(hd: int) -> dict:
    return {"blocks.*.attn.qkv": ColwiseParallel(unit=hd, chunks=3),
            "blocks.*.attn.out_proj": RowwiseParallel(unit=hd),
            "blocks.*.mlp.fc1": ColwiseParallel(), "blocks.*.mlp.fc2": RowwiseParallel()}


def _adamw(params):
    # eps above float32 noise: a gradient entry near 0 must not turn its step on the summation order.
    return optim.AdamW(params, lr=0.01, eps=1e-5)


def test_adamw_training_matches_single_device(ctx, rng):
    """10 AdamW steps of a transformer block: 3 heads on 2 ranks ([2, 1]), 5 on 4 ranks ([2, 1, 1, 1])."""
    heads = 5 if ctx.world_size == 4 else 3
    d, hidden = 2 * heads, 11
    wgpar.manual_seed(int(rng.integers(1 << 30)))
    ref = _Tiny(d, heads, hidden)
    init = _state(ref)
    X = rng.standard_normal((10, 3, 4, d)).astype(np.float32)
    Y = rng.integers(0, 5, (10, 12)).astype(np.int32)
    opt = _adamw(ref.parameters())
    ref_losses = []
    for k in range(10):
        opt.zero_grad()
        loss = F.cross_entropy(ref(wgpar.tensor(X[k])), Y[k])
        loss.backward()
        opt.step()
        ref_losses.append(loss.item())
    want = _state(ref)

    def rank(r: int):
        group = ctx.comm(r)
        model = _Tiny(d, heads, hidden, device=group.device)
        model.load_state_dict(init)
        parallelize_module(model, group, _tiny_plan(2))
        o = _adamw(model.parameters())
        losses = []
        for k in range(10):
            o.zero_grad()
            loss = F.cross_entropy(model(wgpar.tensor(X[k], device=group.device)), Y[k])
            loss.backward()
            o.step()
            losses.append(loss.item())
        # A loss near zero is log-sum-exp less the target's logit: its error is absolute (float32's
        # epsilon times the logits), so a relative bound alone fails by chance as training converges.
        np.testing.assert_allclose(losses, ref_losses, rtol=1e-5, atol=1e-6 * max(ref_losses))
        got = _state(model)
        assert sorted(got) == sorted(want)
        for k, v in got.items():
            # Adam divides by sqrt(v): a near-zero gradient summed in another order can move a step by a
            # few 1e-5 of a bias's largest entry after 10 steps (1.8e-5 seen once in ~20 runs).
            _assert_rel(v, _expected_slice(model, k, want[k]), f"rank {r} {k} after 10 steps", tol=1e-4)

    ctx.run(rank)


def test_tensor_x_data_grid_on_4_devices(rng):
    """2 x 2: TP inside rank pairs (0, 1) and (2, 3), DistributedDataParallel across them (0, 2) and (1, 3),
    each pair on half the batch; trains like one device on the whole batch."""
    d, hidden = 5, 9
    wgpar.manual_seed(int(rng.integers(1 << 30)))
    ref = MLP(d, hidden)
    init = _state(ref)
    X = rng.standard_normal((4, 6, d)).astype(np.float32)
    T = rng.standard_normal((4, 6, d)).astype(np.float32)
    opt = _adamw(ref.parameters())
    for k in range(4):
        opt.zero_grad()
        F.mse_loss(ref(wgpar.tensor(X[k])), wgpar.tensor(T[k])).backward()
        opt.step()
    want = _state(ref)

    with MultiAdapterContext(4, timeout=60) as ctx:
        def rank(r: int):
            group = ctx.comm(r)
            grid = tensor_data_grid(group, 2)
            assert grid.tensor.ranks == (r // 2 * 2, r // 2 * 2 + 1) and grid.data.ranks == (r % 2, r % 2 + 2)
            dense = MLP(d, hidden, device=group.device)
            dense.load_state_dict(init)
            ddp = DistributedDataParallel(ParallelMLP.from_dense(dense, grid.tensor), grid.data, bucket_cap_mb=0.0001)
            o = _adamw(ddp.parameters())
            lo = grid.data.rank * 3
            for k in range(4):
                o.zero_grad()
                x = wgpar.tensor(X[k, lo:lo + 3], device=group.device)
                F.mse_loss(ddp(x), wgpar.tensor(T[k, lo:lo + 3], device=group.device)).backward()
                ddp.finish()
                o.step()
            for k, v in _state(ddp.module).items():
                _assert_rel(v, _expected_slice(ddp.module, k, want[k]), f"rank {r} {k}")

        ctx.run(rank)
        with pytest.raises(RankError, match="tensor_parallel_size 3 does not divide the group's 4 ranks"):
            ctx.run(lambda r: tensor_data_grid(ctx.comm(r), 3))


# -- layering ---------------------------------------------------------------------------------
def test_tensor_parallel_uses_only_the_process_group_interface():
    """No backend internals, no wgpu: the package runs unchanged on any ProcessGroup backend."""
    root = Path(wgpar.__file__).parent / "distributed" / "tensor_parallel"
    for path in root.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                mod = "." * node.level + (node.module or "")
            elif isinstance(node, ast.Import):
                mod = ",".join(a.name for a in node.names)
            else:
                continue
            for banned in ("backends", "context", "launch", "wgpu", "runtime", "staging"):
                assert banned not in mod, f"{path.name} imports {mod}"
