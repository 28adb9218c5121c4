"""Transformer layers as torch.nn: TransformerEncoderLayer, TransformerDecoderLayer, TransformerEncoder,
TransformerDecoder and Transformer, with torch's submodules (so state dict keys) and arguments.

Attention is wgpar's ``MultiheadAttention`` (its masks and their meaning: True / -inf = may NOT attend), called
with ``need_weights=False``, so ``scaled_dot_product_attention``'s fused kernels serve a layer with no mask but
the causal one and no attention dropout (eval mode, or dropout=0). torch's eval-mode "fast path" (nested
tensors) is an optimisation whose results at padded positions differ (zeros); wgpar always computes the
ordinary math, which is what torch returns with gradients enabled.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import numpy as np

from .. import dtypes as _dt
from ..tensor import Tensor
from . import functional as F
from . import init
from .attention import MultiheadAttention
from .containers import ModuleList
from .layers import Dropout, LayerNorm, Linear
from .module import Module


def _activation(activation, name: str):
    if activation == "relu":
        return F.relu
    if activation == "gelu":
        return F.gelu
    if callable(activation):
        return activation
    raise ValueError(f"{name}: activation must be 'relu', 'gelu' or a callable, got {activation!r}")


def _layer_norm(d_model: int, eps: float, bias: bool, device, dtype) -> LayerNorm:
    return LayerNorm(d_model, eps, bias=bias, device=device, dtype=dtype)


class _TransformerLayer(Module):
    """What the encoder and decoder layers share: their submodules (torch's names and order, so state dict
    keys), the self-attention block and the feed-forward block. ``cross`` adds the attention over the
    encoder's output (``multihead_attn``) and a third residual block (``norm3``, ``dropout3``)."""

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int, dropout: float, activation,
                 layer_norm_eps: float, batch_first: bool, norm_first: bool, bias: bool, device, dtype,
                 cross: bool) -> None:
        super().__init__()

        def attention() -> MultiheadAttention:
            return MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias, batch_first=batch_first,
                                      device=device, dtype=dtype)

        self.self_attn = attention()
        if cross:
            self.multihead_attn = attention()
        self.linear1 = Linear(d_model, dim_feedforward, bias, device=device, dtype=dtype)
        self.dropout = Dropout(dropout)
        self.linear2 = Linear(dim_feedforward, d_model, bias, device=device, dtype=dtype)
        self.norm_first = norm_first
        blocks = 3 if cross else 2
        for k in range(1, blocks + 1):
            setattr(self, f"norm{k}", _layer_norm(d_model, layer_norm_eps, bias, device, dtype))
        for k in range(1, blocks + 1):
            setattr(self, f"dropout{k}", Dropout(dropout))
        self._ff_dropout = f"dropout{blocks}"
        self.activation = _activation(activation, type(self).__name__)

    def _sa_block(self, x: Tensor, attn_mask, key_padding_mask, is_causal: bool) -> Tensor:
        x = self.self_attn(x, x, x, attn_mask=attn_mask, key_padding_mask=key_padding_mask, need_weights=False,
                           is_causal=is_causal)[0]
        return self.dropout1(x)

    def _ff_block(self, x: Tensor) -> Tensor:
        return getattr(self, self._ff_dropout)(self.linear2(self.dropout(self.activation(self.linear1(x)))))


class TransformerEncoderLayer(_TransformerLayer):
    """Self-attention then a feed-forward block, each with a residual and a LayerNorm, as
    ``torch.nn.TransformerEncoderLayer``.

    ``forward(src, src_mask=None, src_key_padding_mask=None, is_causal=False)``: src [S, N, E] ([N, S, E] with
    ``batch_first``, or unbatched [S, E]); the masks as ``MultiheadAttention``'s attn_mask ([S, S] or
    [N * nhead, S, S]) and key_padding_mask ([N, S]); ``is_causal=True`` without ``src_mask`` applies the
    causal mask itself (torch takes it as a hint that src_mask is causal).

    Arguments:
        d_model: features E.
        nhead: attention heads (E must divide by them).
        dim_feedforward: the feed-forward block's hidden width.
        dropout: on the attention weights, inside the feed-forward block and on each residual branch.
        activation: 'relu', 'gelu' or a callable (a Module is registered as a submodule).
        layer_norm_eps: the LayerNorms' eps.
        batch_first: inputs and output are [N, S, E].
        norm_first: LayerNorm before each block (pre-norm) instead of after each residual (post-norm).
        bias: biases in the linear layers, the attention and the LayerNorms.
        device, dtype: of the parameters.
    """

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int = 2048, dropout: float = 0.1,
                 activation: str | Callable[[Tensor], Tensor] = "relu", layer_norm_eps: float = 1e-5,
                 batch_first: bool = False, norm_first: bool = False, bias: bool = True, device=None,
                 dtype=_dt.float32) -> None:
        super().__init__(d_model, nhead, dim_feedforward, dropout, activation, layer_norm_eps, batch_first,
                         norm_first, bias, device, dtype, cross=False)

    def forward(self, src: Tensor, src_mask=None, src_key_padding_mask=None, is_causal: bool = False) -> Tensor:
        x = src
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), src_mask, src_key_padding_mask, is_causal)
            return x + self._ff_block(self.norm2(x))
        x = self.norm1(x + self._sa_block(x, src_mask, src_key_padding_mask, is_causal))
        return self.norm2(x + self._ff_block(x))


class TransformerDecoderLayer(_TransformerLayer):
    """Self-attention, attention over the encoder's output (memory), then a feed-forward block, each with a
    residual and a LayerNorm, as ``torch.nn.TransformerDecoderLayer``.

    ``forward(tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
    memory_key_padding_mask=None, tgt_is_causal=False, memory_is_causal=False)``: tgt [T, N, E], memory
    [S, N, E] (batch first or unbatched as the encoder layer); tgt_mask [T, T], memory_mask [T, S], padding masks
    [N, T] and [N, S], with ``MultiheadAttention``'s meaning.

    Arguments:
        d_model, nhead, dim_feedforward, dropout, activation, layer_norm_eps, batch_first, norm_first, bias,
        device, dtype: as ``TransformerEncoderLayer``'s.
    """

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int = 2048, dropout: float = 0.1,
                 activation: str | Callable[[Tensor], Tensor] = "relu", layer_norm_eps: float = 1e-5,
                 batch_first: bool = False, norm_first: bool = False, bias: bool = True, device=None,
                 dtype=_dt.float32) -> None:
        super().__init__(d_model, nhead, dim_feedforward, dropout, activation, layer_norm_eps, batch_first,
                         norm_first, bias, device, dtype, cross=True)

    def forward(self, tgt: Tensor, memory: Tensor, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
                memory_key_padding_mask=None, tgt_is_causal: bool = False, memory_is_causal: bool = False) -> Tensor:
        x = tgt
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), tgt_mask, tgt_key_padding_mask, tgt_is_causal)
            x = x + self._mha_block(self.norm2(x), memory, memory_mask, memory_key_padding_mask, memory_is_causal)
            return x + self._ff_block(self.norm3(x))
        x = self.norm1(x + self._sa_block(x, tgt_mask, tgt_key_padding_mask, tgt_is_causal))
        x = self.norm2(x + self._mha_block(x, memory, memory_mask, memory_key_padding_mask, memory_is_causal))
        return self.norm3(x + self._ff_block(x))

    def _mha_block(self, x: Tensor, mem: Tensor, attn_mask, key_padding_mask, is_causal: bool) -> Tensor:
        x = self.multihead_attn(x, mem, mem, attn_mask=attn_mask, key_padding_mask=key_padding_mask,
                                need_weights=False, is_causal=is_causal)[0]
        return self.dropout2(x)


def _clones(layer: Module, n: int, name: str) -> ModuleList:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"{name}: num_layers must be a positive int, got {n!r}")
    return ModuleList([copy.deepcopy(layer) for _ in range(n)])


class TransformerEncoder(Module):
    """``num_layers`` copies of ``encoder_layer`` (deep copies: equal at first, trained apart; keys
    ``layers.{i}.*``), then ``norm`` if given, as ``torch.nn.TransformerEncoder``.

    ``forward(src, mask=None, src_key_padding_mask=None, is_causal=None)``: each layer gets the same masks.

    Arguments:
        encoder_layer: a ``TransformerEncoderLayer`` (or any module with its forward arguments).
        num_layers: the copies.
        norm: a final module (torch's ``nn.Transformer`` passes a LayerNorm), or None.
        enable_nested_tensor, mask_check: accepted for torch's signature; they steer torch's eval-mode fast path,
            which wgpar does not have (module docstring).
    """

    def __init__(self, encoder_layer: Module, num_layers: int, norm: Module | None = None,
                 enable_nested_tensor: bool = True, mask_check: bool = True) -> None:
        super().__init__()
        self.layers = _clones(encoder_layer, num_layers, "TransformerEncoder")
        self.num_layers = num_layers
        self.norm = norm

    def forward(self, src: Tensor, mask=None, src_key_padding_mask=None, is_causal: bool | None = None) -> Tensor:
        x = src
        for layer in self.layers:
            x = layer(x, src_mask=mask, src_key_padding_mask=src_key_padding_mask, is_causal=bool(is_causal))
        return x if self.norm is None else self.norm(x)


class TransformerDecoder(Module):
    """``num_layers`` copies of ``decoder_layer`` (keys ``layers.{i}.*``), then ``norm`` if given, as
    ``torch.nn.TransformerDecoder``.

    ``forward(tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
    memory_key_padding_mask=None, tgt_is_causal=None, memory_is_causal=False)``: each layer gets the same masks.

    Arguments:
        decoder_layer: a ``TransformerDecoderLayer``.
        num_layers: the copies.
        norm: a final module, or None.
    """

    def __init__(self, decoder_layer: Module, num_layers: int, norm: Module | None = None) -> None:
        super().__init__()
        self.layers = _clones(decoder_layer, num_layers, "TransformerDecoder")
        self.num_layers = num_layers
        self.norm = norm

    def forward(self, tgt: Tensor, memory: Tensor, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
                memory_key_padding_mask=None, tgt_is_causal: bool | None = None,
                memory_is_causal: bool = False) -> Tensor:
        x = tgt
        for layer in self.layers:
            x = layer(x, memory, tgt_mask=tgt_mask, memory_mask=memory_mask, tgt_key_padding_mask=tgt_key_padding_mask,
                      memory_key_padding_mask=memory_key_padding_mask, tgt_is_causal=bool(tgt_is_causal),
                      memory_is_causal=memory_is_causal)
        return x if self.norm is None else self.norm(x)


class Transformer(Module):
    """The encoder-decoder model of "Attention Is All You Need", as ``torch.nn.Transformer``: ``encoder``
    (num_encoder_layers layers and a LayerNorm), ``decoder`` (likewise); every weight matrix initialised
    xavier-uniform, as torch's.

    ``forward(src, tgt, src_mask=None, tgt_mask=None, memory_mask=None, src_key_padding_mask=None,
    tgt_key_padding_mask=None, memory_key_padding_mask=None, src_is_causal=None, tgt_is_causal=None,
    memory_is_causal=False)``: src [S, N, E], tgt [T, N, E] (or batch first) -> [T, N, E].

    Arguments:
        d_model, nhead, dim_feedforward, dropout, activation, layer_norm_eps, batch_first, norm_first, bias,
        device, dtype: as ``TransformerEncoderLayer``'s.
        num_encoder_layers, num_decoder_layers: the stacks' depths.
        custom_encoder, custom_decoder: modules used instead of the stacks.
    """

    def __init__(self, d_model: int = 512, nhead: int = 8, num_encoder_layers: int = 6, num_decoder_layers: int = 6,
                 dim_feedforward: int = 2048, dropout: float = 0.1,
                 activation: str | Callable[[Tensor], Tensor] = "relu", custom_encoder: Module | None = None,
                 custom_decoder: Module | None = None, layer_norm_eps: float = 1e-5, batch_first: bool = False,
                 norm_first: bool = False, bias: bool = True, device=None, dtype=_dt.float32) -> None:
        super().__init__()
        kw = dict(dim_feedforward=dim_feedforward, dropout=dropout, activation=activation,
                  layer_norm_eps=layer_norm_eps, batch_first=batch_first, norm_first=norm_first, bias=bias,
                  device=device, dtype=dtype)
        self.encoder = custom_encoder if custom_encoder is not None else TransformerEncoder(
            TransformerEncoderLayer(d_model, nhead, **kw), num_encoder_layers,
            _layer_norm(d_model, layer_norm_eps, bias, device, dtype))
        self.decoder = custom_decoder if custom_decoder is not None else TransformerDecoder(
            TransformerDecoderLayer(d_model, nhead, **kw), num_decoder_layers,
            _layer_norm(d_model, layer_norm_eps, bias, device, dtype))
        self.d_model, self.nhead, self.batch_first = d_model, nhead, batch_first
        for p in self.parameters():
            if p.ndim > 1:
                init.xavier_uniform_(p)

    def forward(self, src: Tensor, tgt: Tensor, src_mask=None, tgt_mask=None, memory_mask=None,
                src_key_padding_mask=None, tgt_key_padding_mask=None, memory_key_padding_mask=None,
                src_is_causal: bool | None = None, tgt_is_causal: bool | None = None,
                memory_is_causal: bool = False) -> Tensor:
        batch = 0 if self.batch_first else 1
        if src.ndim == 3 and tgt.ndim == 3 and src.shape[batch] != tgt.shape[batch]:
            raise ValueError(f"Transformer: src {src.shape} and tgt {tgt.shape} must have the same batch size")
        if src.shape[-1] != self.d_model or tgt.shape[-1] != self.d_model:
            raise ValueError(f"Transformer: src {src.shape} and tgt {tgt.shape} must have d_model = {self.d_model} "
                             "features")
        memory = self.encoder(src, mask=src_mask, src_key_padding_mask=src_key_padding_mask, is_causal=src_is_causal)
        return self.decoder(tgt, memory, tgt_mask=tgt_mask, memory_mask=memory_mask,
                            tgt_key_padding_mask=tgt_key_padding_mask,
                            memory_key_padding_mask=memory_key_padding_mask, tgt_is_causal=tgt_is_causal,
                            memory_is_causal=memory_is_causal)

    @staticmethod
    def generate_square_subsequent_mask(sz: int, device=None, dtype=_dt.float32) -> Tensor:
        """The causal float mask [sz, sz]: -inf above the diagonal (may not attend), 0 elsewhere."""
        mask = np.triu(np.full((sz, sz), -np.inf, dtype=np.float32), 1)
        return Tensor.from_numpy(mask, device=device, dtype=dtype)


__all__ = ["TransformerEncoderLayer", "TransformerDecoderLayer", "TransformerEncoder", "TransformerDecoder",
           "Transformer"]
