"""Attention layers: torch's nn.MultiheadAttention, and GPT's causal self-attention block.

Both run ``F.scaled_dot_product_attention``, so the fused kernels serve them whenever no explicit
mask, dropout or returned weights are asked for. ``CausalSelfAttention`` is the block that
``wgpar.distributed.ParallelCausalSelfAttention`` splits by heads.
"""

from __future__ import annotations

import math

import numpy as np

from .. import dtypes as _dt
from ..autograd import differentiable as D
from ..tensor import Tensor
from . import functional as F
from . import init
from .layers import Linear, _param
from .module import Module


class MultiheadAttention(Module):
    """torch.nn.MultiheadAttention: the same parameters (``in_proj_weight`` [3E, E], ``in_proj_bias``,
    ``out_proj``), initialisation, arguments and results, so a torch state_dict loads as is.

    ``forward(query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
    average_attn_weights=True, is_causal=False)`` returns ``(output, weights or None)``. Inputs are
    [L, N, E] (or [N, L, E] with ``batch_first``, or unbatched [L, E]). As in torch, a bool
    ``attn_mask`` / ``key_padding_mask`` marks with True what may NOT be attended (the opposite of
    ``scaled_dot_product_attention``'s bool mask) and a float one is added to the scores. Unlike torch,
    ``is_causal=True`` also works without an ``attn_mask`` (torch requires the mask as well): that,
    with ``need_weights=False`` and no padding mask, is the fused causal path. Integer masks raise (torch's
    too). A query that may attend to nothing gets zeros with ``need_weights=False`` and NaN (output and
    weights) with ``need_weights=True``, exactly as torch's two paths do.

    Arguments:
        embed_dim: model width E.
        num_heads: heads (E must divide by them).
        dropout: dropout on the attention weights in training.
        bias: biases on the input and output projections.
        batch_first: inputs and output are [N, L, E] instead of [L, N, E].
        device, dtype: of the parameters.
        add_bias_kv, add_zero_attn, kdim, vdim: only their defaults are supported.
    """

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 add_bias_kv: bool = False, add_zero_attn: bool = False, kdim: int | None = None,
                 vdim: int | None = None, batch_first: bool = False, device=None, dtype=_dt.float32) -> None:
        super().__init__()
        if embed_dim < 1 or num_heads < 1 or embed_dim % num_heads:
            raise ValueError(f"MultiheadAttention: embed_dim {embed_dim} must be a positive multiple of num_heads "
                             f"{num_heads}")
        if add_bias_kv or add_zero_attn or kdim not in (None, embed_dim) or vdim not in (None, embed_dim):
            raise NotImplementedError("MultiheadAttention: add_bias_kv, add_zero_attn and kdim / vdim other than "
                                      "embed_dim are not supported")
        self.embed_dim, self.num_heads, self.head_dim = embed_dim, num_heads, embed_dim // num_heads
        self.dropout, self.batch_first = float(dropout), batch_first
        self.in_proj_weight = _param((3 * embed_dim, embed_dim), device, dtype)
        init.xavier_uniform_(self.in_proj_weight)
        self.in_proj_bias = _param((3 * embed_dim,), device, dtype) if bias else None
        self.out_proj = Linear(embed_dim, embed_dim, bias, device=device, dtype=dtype)
        if bias:
            init.zeros_(self.in_proj_bias)
            init.zeros_(self.out_proj.bias)

    def forward(self, query: Tensor, key: Tensor, value: Tensor, key_padding_mask=None, need_weights: bool = True,
                attn_mask=None, average_attn_weights: bool = True, is_causal: bool = False):
        unbatched = query.ndim == 2
        # Unbatched [L, E] input is made [L, 1, E]: sequence first whatever batch_first says (torch ignores
        # batch_first for unbatched input).
        seq_first = unbatched or not self.batch_first
        if unbatched:
            query, key, value = (D.unsqueeze(t, 1) for t in (query, key, value))
            if key_padding_mask is not None:
                key_padding_mask = np.asarray(key_padding_mask)[None]
        if query.ndim != 3 or key.ndim != 3 or value.ndim != 3 or query.shape[-1] != self.embed_dim:
            raise ValueError(f"MultiheadAttention: expected [L, N, {self.embed_dim}] inputs (batch_first=False) or "
                             f"[N, L, {self.embed_dim}], got {query.shape}, {key.shape}, {value.shape}")
        if seq_first:
            query, key, value = (D.transpose(t, 0, 1) for t in (query, key, value))
        n, lq, e = query.shape
        lk = key.shape[1]
        h, hd = self.num_heads, self.head_dim
        w, b = self.in_proj_weight, self.in_proj_bias
        if query is key and key is value:  # self-attention: one projection, split in three
            q, k, v = D.split_views(F.linear(query, w, b), -1, [e] * 3)  # one gradient buffer, joined
        else:
            ws = D.split_views(w, 0, [e] * 3)
            bs = (None,) * 3 if b is None else D.split_views(b, 0, [e] * 3)
            q, k, v = (F.linear(x, wi, bi) for x, wi, bi in zip((query, key, value), ws, bs))
        q, k, v = (D.transpose(D.reshape(t, (n, -1, h, hd)), 1, 2) for t in (q, k, v))
        mask = self._mask(attn_mask, key_padding_mask, is_causal, n, lq, lk, query)
        dropout_p = self.dropout if self.training else 0.0
        weights = None
        if need_weights:
            scores = D.binary("mul", D.matmul(q, D.transpose(k, -2, -1)), 1.0 / math.sqrt(hd))
            if mask is not None:
                scores = D.where(mask, scores, float("-inf")) if mask.dtype is _dt.bool_ else \
                    D.binary("add", scores, mask)
            weights = D.softmax(scores, -1)
            out = D.matmul(F.dropout(weights, dropout_p, True) if dropout_p else weights, v)
            if average_attn_weights:
                weights = D.reduce("mean", weights, 1)
            if unbatched:
                weights = D.squeeze(weights, 0)
        else:
            causal = is_causal and mask is None
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=causal)
        out = self.out_proj(D.reshape(D.transpose(out, 1, 2), (n, lq, e)))
        if seq_first:
            out = D.transpose(out, 0, 1)
        if unbatched:
            out = D.squeeze(out, 1)
        return out, weights

    def _mask(self, attn_mask, key_padding_mask, is_causal: bool, n: int, lq: int, lk: int, like: Tensor):
        """One mask for the scores [n, heads, lq, lk]: bool (True: may attend) or float (added); None when
        causal alone (the fused path) or nothing."""
        dev = like.device
        parts_bool, parts_float = [], []
        if attn_mask is not None:
            m = _host_mask("attn_mask", attn_mask)
            want = (lq, lk) if m.ndim == 2 else (n * self.num_heads, lq, lk)
            if m.shape != want:
                raise F.AttentionMaskError(f"MultiheadAttention: attn_mask of shape {m.shape}, expected {(lq, lk)} "
                                           f"or {(n * self.num_heads, lq, lk)} ([batch * num_heads, L, S])")
            if m.ndim == 3:
                m = m.reshape(n, self.num_heads, lq, lk)
            (parts_bool if m.dtype == bool else parts_float).append(~m if m.dtype == bool else m.astype(np.float32))
        elif is_causal and key_padding_mask is None:
            return None
        elif is_causal:
            parts_bool.append(np.tril(np.ones((lq, lk), dtype=bool)))
        if key_padding_mask is not None:
            kpm = _host_mask("key_padding_mask", key_padding_mask)
            if kpm.shape != (n, lk):
                raise F.AttentionMaskError(f"MultiheadAttention: key_padding_mask of shape {kpm.shape}, "
                                           f"expected {(n, lk)}")
            if kpm.dtype == bool:
                parts_bool.append(~kpm[:, None, None, :])
            else:
                parts_float.append(kpm.astype(np.float32)[:, None, None, :])
        if not parts_bool and not parts_float:
            return None
        if not parts_float:
            allowed = parts_bool[0]
            for m in parts_bool[1:]:
                allowed = allowed & m
            return Tensor.from_numpy(allowed, device=dev)
        total = sum(parts_float)
        for m in parts_bool:
            total = np.where(m, total, -np.inf)
        return Tensor.from_numpy(np.asarray(total, dtype=np.float32), device=dev)

    def extra_repr(self) -> str:
        return f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, batch_first={self.batch_first}"


def _host_mask(name: str, mask) -> np.ndarray:
    """A MultiheadAttention mask as a NumPy array, refusing integer ones as torch does: adding a 0/1 mask to
    the scores would silently differ from the bool mask it means."""
    m = mask.numpy() if isinstance(mask, Tensor) else np.asarray(mask)
    if m.dtype.kind not in "bf":
        raise F.AttentionMaskError(f"MultiheadAttention: {name} must be bool (True: may NOT attend) or float "
                                   f"(added to the scores), got {m.dtype.name}")
    return m


class CausalSelfAttention(Module):
    """GPT-2's multi-head causal self-attention, input and output [batch, seq, d_model].

    A fused projection gives q, k and v (``qkv``: d_model -> 3 * d_model, q|k|v blocks, heads in order
    within each); ``scaled_dot_product_attention(q, k, v, is_causal=True)`` (the fused kernels when
    head_dim is a multiple of 4: no [seq, seq] matrix) reads them in place; ``out_proj`` maps the joined
    heads back to d_model. The forward reads the number of heads off the projection's width, so
    ``wgpar.distributed.ParallelCausalSelfAttention`` (a rank's share of the heads) runs it unchanged.

    Arguments:
        d_model: features (a multiple of n_heads).
        n_heads: attention heads.
        bias: whether the projections have biases.
        dropout: dropout on the attention weights in training (the composed path when > 0).
        device, dtype: of the parameters.
    """

    def __init__(self, d_model: int, n_heads: int, bias: bool = True, dropout: float = 0.0, device=None,
                 dtype=_dt.float32) -> None:
        super().__init__()
        self._setup(d_model, n_heads, dropout)
        self.qkv = Linear(d_model, 3 * d_model, bias, device=device, dtype=dtype)
        self.out_proj = Linear(d_model, d_model, bias, device=device, dtype=dtype)

    def _setup(self, d_model: int, n_heads: int, dropout: float = 0.0) -> None:
        if n_heads < 1 or d_model < 1 or d_model % n_heads:
            raise ValueError(f"attention: d_model {d_model} is not a positive multiple of n_heads {n_heads}")
        self.d_model, self.n_heads, self.head_dim = d_model, n_heads, d_model // n_heads
        self.dropout = float(dropout)

    def forward(self, x: Tensor) -> Tensor:
        if not isinstance(x, Tensor) or x.ndim != 3 or x.shape[-1] != self.d_model:
            shape = x.shape if isinstance(x, Tensor) else type(x).__name__
            raise ValueError(f"{type(self).__name__}: expected input [batch, seq, {self.d_model}], got {shape}")
        b, t, _ = x.shape
        qkv = self.qkv(x)
        width = qkv.shape[-1] // 3  # local heads x head_dim: all heads on one device, this rank's under TP
        hd = self.head_dim
        # split: one buffer holds the three gradients (slicing would widen each to qkv's shape and add them)
        q, k, v = (D.transpose(D.reshape(p, (b, t, -1, hd)), 1, 2) for p in D.split_views(qkv, -1, [width] * 3))
        dropout_p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)
        return self.out_proj(D.reshape(D.transpose(y, 1, 2), (b, t, width)))

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, n_heads={self.n_heads}"


__all__ = ["MultiheadAttention", "CausalSelfAttention"]
