"""Recurrent layers as torch.nn: RNN, LSTM, GRU and their cells, with torch's parameters and results.

Every layer is a loop over time of composed differentiable ops, so backward (through time) comes
from autograd. Per layer and direction the input projection of all steps is one matmul
``x @ weight_ih.T`` ([T, N, gates * H]); each step then adds one matmul ``h @ weight_hh.T`` and a few
elementwise kernels for the gates (LSTM: one sigmoid over all four gate blocks, tanh of the cell
block, the cell update and tanh(c)). A sequence of T steps thus costs about 10 T dispatches per
layer and direction (forward; backward about twice that): fine for short sequences and large
batches, slow where a dispatch costs more than a step's arithmetic (long sequences, tiny batches).
"""

from __future__ import annotations

import math

from .. import creation
from .. import dtypes as _dt
from .. import functional as W
from ..tensor import Tensor
from . import functional as F
from . import init
from .layers import _param
from .module import Module

_GATES = {"RNN_TANH": 1, "RNN_RELU": 1, "LSTM": 4, "GRU": 3}


def _rnn_step(mode: str, xp: Tensor, h: Tensor, c: Tensor | None, w_hh: Tensor, b_hh: Tensor | None):
    """One step of ``mode`` from the input projection ``xp`` [N, gates * H] (bias_ih, and bias_hh except for
    GRU, already added): the new (h, c); c is None but for LSTM."""
    hs = h.shape[-1]
    if mode == "GRU":  # bias_hh's new-gate part sits inside r * (...), so it cannot join xp
        gh = F.linear(h, w_hh, b_hh)
        rz = W.sigmoid(xp[..., :2 * hs] + gh[..., :2 * hs])
        n = W.tanh(xp[..., 2 * hs:] + rz[..., :hs] * gh[..., 2 * hs:])
        return n + rz[..., hs:] * (h - n), None
    pre = xp + F.linear(h, w_hh)
    if mode == "RNN_TANH":
        return W.tanh(pre), None
    if mode == "RNN_RELU":
        return F.relu(pre), None
    act = W.sigmoid(pre)  # gates i, f, g, o: one kernel for all four (g's sigmoid unused)
    c = act[..., hs:2 * hs] * c + act[..., :hs] * W.tanh(pre[..., 2 * hs:3 * hs])
    return act[..., 3 * hs:] * W.tanh(c), c


def _input_bias(mode: str, b_ih: Tensor | None, b_hh: Tensor | None) -> Tensor | None:
    """The bias added once to all steps' input projection: both biases but for GRU."""
    if b_ih is None or mode == "GRU":
        return b_ih
    return b_ih + b_hh


def _check_state(name: str, what: str, t, want: tuple[int, ...]) -> Tensor:
    if not isinstance(t, Tensor):
        raise TypeError(f"{name}: {what} must be a wgpar.Tensor, got {type(t).__name__}")
    if t.shape != want:
        raise ValueError(f"{name}: {what} of shape {t.shape}, expected {want}")
    return t


class RNNBase(Module):
    """What RNN, LSTM and GRU share: torch's parameters (``weight_ih_l{k}[_reverse]`` [gates * H, in],
    ``weight_hh_l{k}[_reverse]`` [gates * H, H], ``bias_ih_l{k}``, ``bias_hh_l{k}``, in torch's order,
    initialised uniform in +-1 / sqrt(hidden_size)) and the loop over layers, directions and time."""

    def __init__(self, mode: str, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False, device=None,
                 dtype=_dt.float32) -> None:
        super().__init__()
        name = type(self).__name__
        for what, v in (("input_size", input_size), ("hidden_size", hidden_size), ("num_layers", num_layers)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}: {what} must be a positive int, got {v!r}")
        if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0 <= dropout <= 1:
            raise ValueError(f"{name}: dropout must be a number in [0, 1], got {dropout!r}")
        self.mode, self.input_size, self.hidden_size, self.num_layers = mode, input_size, hidden_size, num_layers
        self.bias, self.batch_first, self.dropout = bias, batch_first, float(dropout)
        self.bidirectional = bool(bidirectional)
        gates = _GATES[mode] * hidden_size
        for layer in range(num_layers):
            for suffix in ("", "_reverse")[:self.num_directions]:
                fan_in = input_size if layer == 0 else hidden_size * self.num_directions
                shapes = [("weight_ih", (gates, fan_in)), ("weight_hh", (gates, hidden_size))]
                if bias:
                    shapes += [("bias_ih", (gates,)), ("bias_hh", (gates,))]
                for kind, shape in shapes:
                    setattr(self, f"{kind}_l{layer}{suffix}", _param(shape, device, dtype))
        self.reset_parameters()

    @property
    def num_directions(self) -> int:
        """2 for a bidirectional layer, else 1."""
        return 2 if self.bidirectional else 1

    def reset_parameters(self) -> None:
        """Draw every weight and bias from U(-1/sqrt(hidden_size), 1/sqrt(hidden_size)), as torch's RNN layers do."""
        bound = 1.0 / math.sqrt(self.hidden_size)
        for p in self.parameters():
            init.uniform_(p, -bound, bound)

    def _weights(self, layer: int, direction: int) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
        suffix = f"_l{layer}" + ("_reverse" if direction else "")
        w_ih, w_hh, b_ih, b_hh = (getattr(self, kind + suffix, None)
                                  for kind in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"))
        return w_ih, w_hh, b_ih, b_hh

    def _input(self, input) -> tuple[Tensor, bool]:
        """The input as [T, N, input_size] and whether it had a batch dim."""
        name = type(self).__name__
        if not isinstance(input, Tensor):
            raise TypeError(f"{name}: input must be a wgpar.Tensor, got {type(input).__name__}")
        if input.ndim not in (2, 3) or input.shape[-1] != self.input_size:
            layout = "[N, T, in]" if self.batch_first else "[T, N, in]"
            raise ValueError(f"{name}: expected input {layout} or unbatched [T, in] with in = {self.input_size}, "
                             f"got {input.shape}")
        if not input.dtype.is_float:
            raise TypeError(f"{name}: needs a float input, got {input.dtype.name}")
        x = input.unsqueeze(1) if input.ndim == 2 else input.transpose(0, 1) if self.batch_first else input
        if x.shape[0] == 0:
            raise ValueError(f"{name}: the input {input.shape} has no time steps")
        return x, input.ndim == 3

    def _state(self, what: str, t, batched: bool, n: int, like: Tensor) -> Tensor:
        """An initial state [L * D, N, H] (zeros when None), unbatched ones given as [L * D, H]."""
        want = (self.num_layers * self.num_directions, n, self.hidden_size)
        if t is None:
            return creation.zeros(*want, dtype=like.dtype, device=like.device)
        if batched:
            return _check_state(type(self).__name__, what, t, want)
        return _check_state(type(self).__name__, what, t, (want[0], want[2])).unsqueeze(1)

    def _run(self, x: Tensor, h0: Tensor, c0: Tensor | None) -> tuple[Tensor, Tensor, Tensor | None]:
        """The output [T, N, D * H] and final states [L * D, N, H] of the stack on ``x`` [T, N, in]."""
        steps = x.shape[0]
        h_n, c_n = [], []
        for layer in range(self.num_layers):
            outs = []
            for d in range(self.num_directions):
                k = layer * self.num_directions + d
                w_ih, w_hh, b_ih, b_hh = self._weights(layer, d)
                xp = F.linear(x, w_ih, _input_bias(self.mode, b_ih, b_hh))  # every step's projection at once
                h, c = h0[k], None if c0 is None else c0[k]
                ys: list[Tensor | None] = [None] * steps
                for t in (range(steps - 1, -1, -1) if d else range(steps)):
                    h, c = _rnn_step(self.mode, xp[t], h, c, w_hh, b_hh)
                    ys[t] = h
                outs.append(W.stack(ys, 0))
                h_n.append(h)
                c_n.append(c)
            x = outs[0] if len(outs) == 1 else W.cat(outs, -1)
            if self.dropout and self.training and layer < self.num_layers - 1:
                x = F.dropout(x, self.dropout, True)
        return x, W.stack(h_n, 0), None if c0 is None else W.stack(c_n, 0)

    def _output(self, y: Tensor, batched: bool) -> Tensor:
        if not batched:
            return y.squeeze(1)
        return y.transpose(0, 1) if self.batch_first else y

    def extra_repr(self) -> str:
        s = f"{self.input_size}, {self.hidden_size}"
        if self.num_layers != 1:
            s += f", num_layers={self.num_layers}"
        if not self.bias:
            s += ", bias=False"
        if self.batch_first:
            s += ", batch_first=True"
        if self.dropout:
            s += f", dropout={self.dropout}"
        return s + (", bidirectional=True" if self.bidirectional else "")


def _state_out(h: Tensor, batched: bool) -> Tensor:
    return h if batched else h.squeeze(1)


class RNN(RNNBase):
    """Elman RNN, h_t = tanh(x_t W_ih^T + b_ih + h_{t-1} W_hh^T + b_hh) (or relu), as ``torch.nn.RNN``.

    ``forward(input, hx=None)`` returns ``(output, h_n)``: output [T, N, D * H] ([N, T, D * H] with
    ``batch_first``, [T, D * H] unbatched), h_n [num_layers * D, N, H] (D = 2 if bidirectional). A loop over
    time: per step one matmul and one activation (module docstring: speed).

    Arguments:
        input_size, hidden_size: features of the input and of the hidden state.
        num_layers: stacked layers, each taking the previous one's output.
        nonlinearity: 'tanh' or 'relu'.
        bias: the biases bias_ih and bias_hh.
        batch_first: input and output are [N, T, features] (states stay [L * D, N, H], as torch).
        dropout: dropout on each layer's output but the last, in training.
        bidirectional: a second pass over reversed time per layer, outputs joined along features.
        device, dtype: of the parameters.
    """

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, nonlinearity: str = "tanh",
                 bias: bool = True, batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False,
                 device=None, dtype=_dt.float32) -> None:
        if nonlinearity not in ("tanh", "relu"):
            raise ValueError(f"RNN: nonlinearity must be 'tanh' or 'relu', got {nonlinearity!r}")
        super().__init__(f"RNN_{nonlinearity.upper()}", input_size, hidden_size, num_layers, bias, batch_first,
                         dropout, bidirectional, device, dtype)
        self.nonlinearity = nonlinearity

    def forward(self, input: Tensor, hx: Tensor | None = None) -> tuple[Tensor, Tensor]:
        x, batched = self._input(input)
        y, h_n, _ = self._run(x, self._state("hx", hx, batched, x.shape[1], x), None)
        return self._output(y, batched), _state_out(h_n, batched)


class LSTM(RNNBase):
    """Long short-term memory, as ``torch.nn.LSTM``: gates i, f, g, o (in that order in the weights' rows),
    c_t = f c_{t-1} + i g, h_t = o tanh(c_t).

    ``forward(input, hx=None)`` with ``hx = (h_0, c_0)`` (each [num_layers * D, N, H], unbatched
    [num_layers * D, H]; zeros when None) returns ``(output, (h_n, c_n))``: output [T, N, D * H]
    ([N, T, D * H] with ``batch_first``, [T, D * H] unbatched). A loop over time: one matmul for all steps'
    input projection per layer and direction, then per step one matmul and the gates' elementwise kernels
    (about 10 dispatches; module docstring: speed).

    Arguments:
        input_size, hidden_size: features of the input and of the hidden state.
        num_layers: stacked layers, each taking the previous one's output.
        bias: the biases bias_ih and bias_hh.
        batch_first: input and output are [N, T, features] (states stay [L * D, N, H], as torch).
        dropout: dropout on each layer's output but the last, in training.
        bidirectional: a second pass over reversed time per layer, outputs joined along features.
        proj_size: only 0 (no projection of h) is supported.
        device, dtype: of the parameters.
    """

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False, proj_size: int = 0,
                 device=None, dtype=_dt.float32) -> None:
        if proj_size != 0:
            raise NotImplementedError(f"LSTM: proj_size={proj_size} is not supported (only 0, no projection)")
        super().__init__("LSTM", input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional,
                         device, dtype)
        self.proj_size = 0

    def forward(self, input: Tensor, hx: tuple[Tensor, Tensor] | None = None):
        x, batched = self._input(input)
        n = x.shape[1]
        if hx is not None and (not isinstance(hx, (tuple, list)) or len(hx) != 2):
            raise TypeError(f"LSTM: hx must be a pair (h_0, c_0), got {type(hx).__name__}")
        h0 = self._state("h_0", None if hx is None else hx[0], batched, n, x)
        c0 = self._state("c_0", None if hx is None else hx[1], batched, n, x)
        y, h_n, c_n = self._run(x, h0, c0)
        return self._output(y, batched), (_state_out(h_n, batched), _state_out(c_n, batched))


class GRU(RNNBase):
    """Gated recurrent unit, as ``torch.nn.GRU``: gates r, z, n (in that order in the weights' rows),
    n_t = tanh(x W_in^T + b_in + r (h W_hn^T + b_hn)), h_t = (1 - z) n_t + z h_{t-1}.

    ``forward(input, hx=None)`` returns ``(output, h_n)``: output [T, N, D * H] ([N, T, D * H] with
    ``batch_first``, [T, D * H] unbatched), h_n [num_layers * D, N, H]. A loop over time: one matmul for all
    steps' input projection per layer and direction, then per step one matmul and the gates' elementwise
    kernels (module docstring: speed).

    Arguments: as ``LSTM``'s but proj_size (input_size, hidden_size, num_layers, bias, batch_first, dropout,
    bidirectional, device, dtype).
    """

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False, device=None,
                 dtype=_dt.float32) -> None:
        super().__init__("GRU", input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional,
                         device, dtype)

    def forward(self, input: Tensor, hx: Tensor | None = None) -> tuple[Tensor, Tensor]:
        x, batched = self._input(input)
        y, h_n, _ = self._run(x, self._state("hx", hx, batched, x.shape[1], x), None)
        return self._output(y, batched), _state_out(h_n, batched)


class RNNCellBase(Module):
    """One step of a recurrent layer: parameters ``weight_ih`` [gates * H, in], ``weight_hh``
    [gates * H, H], ``bias_ih``, ``bias_hh`` as torch's cells."""

    def __init__(self, mode: str, input_size: int, hidden_size: int, bias: bool = True, device=None,
                 dtype=_dt.float32) -> None:
        super().__init__()
        name = type(self).__name__
        for what, v in (("input_size", input_size), ("hidden_size", hidden_size)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}: {what} must be a positive int, got {v!r}")
        self.mode, self.input_size, self.hidden_size, self.bias = mode, input_size, hidden_size, bias
        gates = _GATES[mode] * hidden_size
        self.weight_ih = _param((gates, input_size), device, dtype)
        self.weight_hh = _param((gates, hidden_size), device, dtype)
        self.bias_ih = _param((gates,), device, dtype) if bias else None
        self.bias_hh = _param((gates,), device, dtype) if bias else None
        bound = 1.0 / math.sqrt(hidden_size)
        for p in self.parameters():
            init.uniform_(p, -bound, bound)

    def _step(self, input, hx, cx=None, lstm: bool = False):
        name = type(self).__name__
        if not isinstance(input, Tensor) or input.ndim not in (1, 2) or input.shape[-1] != self.input_size:
            shape = input.shape if isinstance(input, Tensor) else type(input).__name__
            raise ValueError(f"{name}: expected input [N, {self.input_size}] or [{self.input_size}], got {shape}")
        batched = input.ndim == 2
        x = input if batched else input.unsqueeze(0)
        want = (x.shape[0], self.hidden_size)

        def state(what: str, t):
            if t is None:
                return creation.zeros(*want, dtype=x.dtype, device=x.device)
            return _check_state(name, what, t, want if batched else want[1:]).reshape(want)

        xp = F.linear(x, self.weight_ih, _input_bias(self.mode, self.bias_ih, self.bias_hh))
        h, c = _rnn_step(self.mode, xp, state("hx", hx), state("cx", cx) if lstm else None, self.weight_hh,
                         self.bias_hh)
        if not batched:
            h, c = h.squeeze(0), None if c is None else c.squeeze(0)
        return h, c

    def extra_repr(self) -> str:
        return f"{self.input_size}, {self.hidden_size}" + ("" if self.bias else ", bias=False")


class RNNCell(RNNCellBase):
    """One Elman RNN step, as ``torch.nn.RNNCell``: ``forward(input [N, in] or [in], hx=None)`` -> h'.

    Arguments:
        input_size, hidden_size: features of the input and of the hidden state.
        bias: the biases bias_ih and bias_hh.
        nonlinearity: 'tanh' or 'relu'.
        device, dtype: of the parameters.
    """

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, nonlinearity: str = "tanh",
                 device=None, dtype=_dt.float32) -> None:
        if nonlinearity not in ("tanh", "relu"):
            raise ValueError(f"RNNCell: nonlinearity must be 'tanh' or 'relu', got {nonlinearity!r}")
        super().__init__(f"RNN_{nonlinearity.upper()}", input_size, hidden_size, bias, device, dtype)
        self.nonlinearity = nonlinearity

    def forward(self, input: Tensor, hx: Tensor | None = None) -> Tensor:
        return self._step(input, hx)[0]


class _GatedCell(RNNCellBase):
    """A cell whose constructor is torch's ``(input_size, hidden_size, bias, device, dtype)``: its mode
    (``_MODE``) is the class's."""

    _MODE = ""

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, device=None,
                 dtype=_dt.float32) -> None:
        super().__init__(self._MODE, input_size, hidden_size, bias, device, dtype)


class LSTMCell(_GatedCell):
    """One LSTM step, as ``torch.nn.LSTMCell``: ``forward(input [N, in] or [in], hx=None)`` with
    ``hx = (h, c)`` (zeros when None) -> ``(h', c')``.

    Arguments:
        input_size, hidden_size: features of the input and of the hidden state.
        bias: the biases bias_ih and bias_hh.
        device, dtype: of the parameters.
    """

    _MODE = "LSTM"

    def forward(self, input: Tensor, hx: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor]:
        if hx is not None and (not isinstance(hx, (tuple, list)) or len(hx) != 2):
            raise TypeError(f"LSTMCell: hx must be a pair (h, c), got {type(hx).__name__}")
        return self._step(input, *(hx if hx is not None else (None, None)), lstm=True)


class GRUCell(_GatedCell):
    """One GRU step, as ``torch.nn.GRUCell``: ``forward(input [N, in] or [in], hx=None)`` -> h'.

    Arguments: as ``LSTMCell``'s (input_size, hidden_size, bias, device, dtype).
    """

    _MODE = "GRU"

    def forward(self, input: Tensor, hx: Tensor | None = None) -> Tensor:
        return self._step(input, hx)[0]


__all__ = ["RNNBase", "RNN", "LSTM", "GRU", "RNNCellBase", "RNNCell", "LSTMCell", "GRUCell"]
