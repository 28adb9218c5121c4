"""GPT: a GPT-2 style decoder-only language model (nanoGPT's layout), wgpar's flagship workload.

Token and position embeddings, ``n_layer`` pre-LayerNorm blocks (causal self-attention on the fused
attention kernels, a 4x GELU-tanh MLP, residuals), a final LayerNorm and an output layer whose
weight is the token embedding (tied). GPT-2's initialisation: normal(0, 0.02) weights, zero biases,
the residual projections scaled by 1 / sqrt(2 * n_layer). examples/train_gpt.py trains it; the
presets are what the README and the benchmarks quote.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import asdict, dataclass, replace

import numpy as np

from .. import dtypes as _dt
from ..autograd.grad_mode import no_grad
from ..nn import functional as F
from ..nn import init
from ..nn.attention import CausalSelfAttention
from ..nn.containers import ModuleList
from ..nn.layers import GELU, MLP, Dropout, Embedding, LayerNorm, Linear
from ..nn.module import Module
from ..nn.parameter import Parameter
from ..tensor import Tensor


@dataclass(frozen=True)
class GPTConfig:
    """Model sizes. ``block_size`` is the context length; ``vocab_size`` 256 for byte-level text."""

    vocab_size: int = 256
    block_size: int = 128
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.0
    bias: bool = True

    def __post_init__(self) -> None:
        if self.n_embd % self.n_head:
            raise ValueError(f"GPTConfig: n_embd {self.n_embd} must be a multiple of n_head {self.n_head}")
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            if getattr(self, name) < 1:
                raise ValueError(f"GPTConfig: {name} must be positive, got {getattr(self, name)}")

    def num_params(self) -> int:
        """Parameters (the tied output layer counted once)."""
        d, v, t, n = self.n_embd, self.vocab_size, self.block_size, self.n_layer
        bias = int(self.bias)
        per_block = 2 * 2 * d + (3 * d * d + 3 * d * bias) + (d * d + d * bias) + (4 * d * d + 4 * d * bias) \
            + (4 * d * d + d * bias)
        return v * d + t * d + n * per_block + 2 * d

    def flops_per_token(self) -> int:
        """Training FLOPs per token (forward + backward, 6 per parameter-use plus attention), as PaLM counts."""
        d, t, n = self.n_embd, self.block_size, self.n_layer
        return 6 * (self.num_params() - t * d) + 12 * n * d * t


# tiny: seconds per hundred steps on lavapipe; small: nanoGPT's character-level Shakespeare model;
# gpt2: GPT-2 small (124M with a 50257 vocabulary; 86M with 256 byte tokens).
PRESETS: dict[str, GPTConfig] = {
    "tiny": GPTConfig(block_size=64, n_layer=2, n_head=4, n_embd=64),
    "small": GPTConfig(block_size=256, n_layer=6, n_head=6, n_embd=384),
    "gpt2": GPTConfig(block_size=1024, n_layer=12, n_head=12, n_embd=768),
}


def preset(name: str, **overrides) -> GPTConfig:
    """A preset's config with fields overridden (``preset("tiny", dropout=0.1)``)."""
    if name not in PRESETS:
        raise ValueError(f"unknown GPT preset {name!r}; choose from {sorted(PRESETS)}")
    return replace(PRESETS[name], **{k: v for k, v in overrides.items() if v is not None})


class Block(Module):
    """Pre-LayerNorm transformer block: ``x + attn(ln_1(x))``, then ``x + mlp(ln_2(x))``."""

    def __init__(self, cfg: GPTConfig, device=None, dtype=_dt.float32) -> None:
        super().__init__()
        d = cfg.n_embd
        self.ln_1 = LayerNorm(d, device=device, dtype=dtype)
        self.attn = CausalSelfAttention(d, cfg.n_head, cfg.bias, cfg.dropout, device=device, dtype=dtype)
        self.ln_2 = LayerNorm(d, device=device, dtype=dtype)
        self.mlp = MLP(d, 4 * d, cfg.bias, activation=GELU("tanh"), device=device, dtype=dtype)
        self.drop = Dropout(cfg.dropout)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.drop(self.attn(self.ln_1(x)))
        return x + self.drop(self.mlp(self.ln_2(x)))


class GPT(Module):
    """The model: ``forward(idx)`` gives logits [B, T, vocab] for int tokens [B, T];
    ``forward(idx, targets)`` gives the mean cross-entropy loss against int targets [B, T].

    Arguments:
        cfg: a GPTConfig (or see ``PRESETS``).
        device, dtype: of the parameters.
    """

    def __init__(self, cfg: GPTConfig, device=None, dtype=_dt.float32) -> None:
        super().__init__()
        self.cfg = cfg
        d = cfg.n_embd
        self.wte = Embedding(cfg.vocab_size, d, device=device, dtype=dtype)
        self.wpe = Embedding(cfg.block_size, d, device=device, dtype=dtype)
        self.drop = Dropout(cfg.dropout)
        self.blocks = ModuleList([Block(cfg, device, dtype) for _ in range(cfg.n_layer)])
        self.ln_f = LayerNorm(d, device=device, dtype=dtype)
        self.lm_head = Linear(d, cfg.vocab_size, bias=False, device=device, dtype=dtype)
        self.lm_head.weight = self.wte.weight  # tied: one parameter, used as input and output embedding
        self._init_weights()

    def _init_weights(self) -> None:
        proj_std = 0.02 / math.sqrt(2 * self.cfg.n_layer)
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                init.zeros_(p)
            elif name.startswith("ln") or ".ln_" in name:
                init.ones_(p)
            elif name.endswith("out_proj.weight") or name.endswith("fc2.weight"):
                init.normal_(p, 0.0, proj_std)  # GPT-2: residual projections scaled by depth
            else:
                init.normal_(p, 0.0, 0.02)

    def forward(self, idx, targets=None) -> Tensor:
        logits = self.lm_head(self.ln_f(self._trunk(self.embed(idx))))
        return logits if targets is None else lm_loss(logits, targets)

    def embed(self, idx) -> Tensor:
        """Token plus position embeddings of int token ids [B, T] (dropout applied)."""
        return _embed(self.wte, self.wpe, self.drop, self.cfg.block_size, idx)

    def _trunk(self, x: Tensor) -> Tensor:
        for block in self.blocks:
            x = block(x)
        return x

    def pipeline_blocks(self) -> list[Module]:
        """The model as a chain for pipeline parallelism (``split_module``): the embeddings, each block,
        then the final LayerNorm with the output layer; the last returns logits (``lm_loss`` is the
        loss_fn). The output layer still shares the token embedding's weight: a pipeline that puts them
        on different devices gives the output layer its own copy (``untie``) and sums the two gradients
        after each step (PipelineExecutor refuses the tied weight across ranks, saying so)."""
        return [GPTInput(self), *self.blocks, GPTOutput(self)]

    def optimizer_groups(self, weight_decay: float) -> list[dict]:
        """AdamW parameter groups as GPT-2 / nanoGPT use them (see ``decay_groups``)."""
        return decay_groups(self.parameters(), weight_decay)

    @no_grad()
    def generate(self, idx: np.ndarray, max_new_tokens: int, temperature: float = 1.0, top_k: int | None = None,
                 rng: np.random.Generator | None = None) -> np.ndarray:
        """Extend token ids [B, T] by sampling ``max_new_tokens`` tokens, one forward per token (the
        context cropped to ``block_size``). Sampling runs on the host from the last position's logits.

        Arguments:
            idx: int token ids [B, T] (T >= 1; a single sequence is ``idx[None]``), each in [0, vocab_size).
            max_new_tokens: tokens to add (an int >= 0).
            temperature: divides the logits (lower: more conservative); 0 is greedy decoding (the most
                likely token, the limit of ever lower temperatures; ``rng`` and ``top_k`` unused).
                Negative or NaN raises.
            top_k: sample only among the k most likely tokens (an int >= 1; more than the vocabulary
                means all of it); None samples from every token.
            rng: NumPy generator (default: a fresh one).
        """
        was_training = self.training
        self.eval()
        try:
            return sample(self, idx, max_new_tokens, self.cfg.block_size, temperature, top_k, rng,
                          vocab_size=self.cfg.vocab_size)
        finally:
            self.train(was_training)

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in asdict(self.cfg).items())


class GPTInput(Module):
    """A pipelined GPT's first stage: token ids -> token + position embeddings (the GPT's own modules)."""

    def __init__(self, gpt: GPT) -> None:
        super().__init__()
        self.wte, self.wpe, self.drop = gpt.wte, gpt.wpe, gpt.drop
        self.block_size = gpt.cfg.block_size

    def forward(self, idx) -> Tensor:
        return _embed(self.wte, self.wpe, self.drop, self.block_size, idx)


def _embed(wte: Embedding, wpe: Embedding, drop: Dropout, block_size: int, idx) -> Tensor:
    # Host token ids stay on the host for the embeddings: no readback in their backward.
    if not isinstance(idx, Tensor):
        idx = np.asarray(idx, dtype=np.int32)
    if idx.ndim != 2:
        raise ValueError(f"GPT: expected token ids [batch, seq], got shape {tuple(idx.shape)}")
    t = idx.shape[1]
    if t > block_size:
        raise ValueError(f"GPT: a sequence of {t} tokens is longer than the context of {block_size}")
    return drop(wte(idx) + wpe(np.arange(t, dtype=np.int32)))


class GPTOutput(Module):
    """A pipelined GPT's last stage: the final LayerNorm and the output layer, giving logits."""

    def __init__(self, gpt: GPT) -> None:
        super().__init__()
        self.ln_f, self.lm_head = gpt.ln_f, gpt.lm_head

    def forward(self, x: Tensor) -> Tensor:
        return self.lm_head(self.ln_f(x))


def untie(output: GPTOutput) -> Parameter:
    """Give the output layer its own copy of the (tied) embedding weight; returns the new parameter."""
    w = output.lm_head.weight
    output.lm_head.weight = Parameter(w.detach().clone(), w.requires_grad)
    return output.lm_head.weight


def lm_loss(logits: Tensor, targets) -> Tensor:
    """Mean cross entropy of logits [B, T, V] against int targets [B, T] (host arrays or tensors)."""
    b, t, v = logits.shape
    flat = targets.reshape(-1) if isinstance(targets, Tensor) else np.asarray(targets, dtype=np.int32).reshape(-1)
    return F.cross_entropy(logits.reshape(b * t, v), flat)


@no_grad()
def sample(forward, idx: np.ndarray, max_new_tokens: int, block_size: int, temperature: float = 1.0,
           top_k: int | None = None, rng: np.random.Generator | None = None,
           vocab_size: int | None = None) -> np.ndarray:
    """``GPT.generate`` for any ``forward(token ids [B, T]) -> logits [B, T, V]`` (a pipeline's stages in turn);
    ``vocab_size``, when given, checks the prompt's ids before the first forward."""
    out = _prompt(idx, vocab_size)
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, numbers.Integral):
        raise TypeError(f"generate: max_new_tokens must be an int, got {max_new_tokens!r}")
    if max_new_tokens < 0:
        raise ValueError(f"generate: max_new_tokens must be >= 0, got {max_new_tokens}")
    if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real):
        raise TypeError(f"generate: temperature must be a number, got {temperature!r}")
    if not temperature >= 0.0:  # NaN too: it would make every probability NaN
        raise ValueError(f"generate: temperature must be >= 0 (0: greedy), got {temperature}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, numbers.Integral)):
        raise TypeError(f"generate: top_k must be an int or None, got {top_k!r}")
    if top_k is not None and top_k < 1:
        raise ValueError(f"generate: top_k must be >= 1 (None: every token), got {top_k}")
    rng = rng or np.random.default_rng()
    for _ in range(max_new_tokens):
        logits = forward(out[:, -block_size:])[:, -1, :].float().numpy().astype(np.float64)
        if temperature == 0.0:
            nxt = logits.argmax(-1).astype(np.int32)[:, None]
        else:
            logits /= temperature
            if top_k is not None:
                kth = np.sort(logits, axis=-1)[:, -min(top_k, logits.shape[-1])][:, None]
                logits = np.where(logits < kth, -np.inf, logits)
            probs = np.exp(logits - logits.max(-1, keepdims=True))
            probs /= probs.sum(-1, keepdims=True)
            nxt = np.array([[rng.choice(len(p), p=p)] for p in probs], dtype=np.int32)
        out = np.concatenate([out, nxt], axis=1)
    return out


def _prompt(idx, vocab_size: int | None) -> np.ndarray:
    """The prompt as int32 [B, T], refusing what would otherwise be truncated or fail deep inside."""
    arr = idx.numpy() if isinstance(idx, Tensor) else np.asarray(idx)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"generate: idx must hold integer token ids, got dtype {arr.dtype}")
    if arr.ndim != 2:
        raise ValueError(f"generate: idx must be token ids [batch, seq], got shape {arr.shape} (a single "
                         f"sequence is idx[None])")
    if arr.size == 0:
        raise ValueError(f"generate: idx needs at least one sequence of at least one token, got shape {arr.shape}")
    lo, hi = int(arr.min()), int(arr.max())
    bound = 2 ** 31 if vocab_size is None else vocab_size  # int32 ids at most
    if lo < 0 or hi >= bound:
        raise ValueError(f"generate: idx holds token id {lo if lo < 0 else hi}, outside [0, "
                         f"{'2**31' if vocab_size is None else f'vocab_size = {vocab_size}'})")
    return arr.astype(np.int32)


def decay_groups(params, weight_decay: float) -> list[dict]:
    """AdamW parameter groups: weight decay on matrices and embeddings (2-d parameters), none on biases
    and LayerNorm gains (GPT-2, nanoGPT)."""
    params = list(params)
    return [{"params": [p for p in params if p.ndim >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]


__all__ = ["GPT", "GPTConfig", "Block", "PRESETS", "preset", "GPTInput", "GPTOutput", "untie", "lm_loss",
           "decay_groups", "sample"]
