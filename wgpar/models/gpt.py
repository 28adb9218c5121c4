"""GPT: a GPT-2 style decoder-only language model (nanoGPT's layout), wgpar's flagship workload.

Token and position embeddings, ``n_layer`` pre-LayerNorm blocks (causal self-attention on the fused
attention kernels, a 4x GELU-tanh MLP, residuals), a final LayerNorm and an output layer whose
weight is the token embedding (tied). GPT-2's initialisation: normal(0, 0.02) weights, zero biases,
the residual projections scaled by 1 / sqrt(2 * n_layer). examples/train_gpt.py trains it; the
presets are what the README and the benchmarks quote.
"""

from __future__ import annotations

import json
import math
import numbers
import os
from dataclasses import asdict, dataclass, replace
from pathlib import Path

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
from ..utils.checkpoint import checkpoint


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
    # Recompute each block's activations in backward instead of keeping them (wgpar.utils.checkpoint).
    checkpoint_activations: bool = False

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
        gradient_checkpointing: checkpoint each block (``wgpar.utils.checkpoint``: its activations are
            recomputed in backward, not kept); default ``cfg.checkpoint_activations``.
    """

    def __init__(self, cfg: GPTConfig, device=None, dtype=_dt.float32, gradient_checkpointing: bool | None = None
                 ) -> None:
        super().__init__()
        if gradient_checkpointing is not None:
            cfg = replace(cfg, checkpoint_activations=bool(gradient_checkpointing))
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
            x = checkpoint(block, x) if self.cfg.checkpoint_activations else block(x)
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

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, device=None, dtype=_dt.float32, **overrides) -> GPT:
        """A GPT-2 checkpoint in Hugging Face's layout, from local files (nothing is downloaded).

        Download ``model.safetensors`` and ``config.json`` from the Hugging Face repository "gpt2" (or
        "gpt2-medium", "gpt2-large", "gpt2-xl"; https://huggingface.co/gpt2/tree/main) into one folder; for
        text, also ``vocab.json`` and ``merges.txt`` (``wgpar.models.gpt2_tokenizer``). wgpar's GPT is
        GPT-2's architecture (pre-LayerNorm blocks with eps 1e-5, fused q|k|v projection, GELU-tanh MLP,
        tied output layer), so the weights map one to one: ``h.{i}.attn.c_attn`` -> ``blocks.{i}.attn.qkv``,
        ``attn.c_proj`` -> ``attn.out_proj``, ``mlp.c_fc`` / ``mlp.c_proj`` -> ``mlp.fc1`` / ``mlp.fc2``,
        HF's Conv1D weights ([in, out]) transposed to Linear's [out, in]; the ``attn.bias`` /
        ``attn.masked_bias`` buffers (the causal mask) are ignored, ``lm_head`` is ``wte``, and names may
        carry a ``transformer.`` prefix. A config wgpar cannot express exactly raises ValueError.

        Arguments:
            path: the folder, or the ``.safetensors`` file with ``config.json`` beside it.
            device, dtype: of the parameters.
            overrides: GPTConfig fields to set (``dropout`` defaults to 0.0, ``checkpoint_activations``).
        """
        from .. import load  # through the package: the module behind it is being renamed

        path = Path(path)
        weights = path / "model.safetensors" if path.is_dir() else path
        config_file = weights.parent / "config.json"
        for f in (weights, config_file):
            if not f.is_file():
                raise FileNotFoundError(f"GPT.from_pretrained: {f} not found (download model.safetensors and "
                                        "config.json from the Hugging Face repository 'gpt2')")
        cfg = replace(_hf_config(json.loads(config_file.read_text()), config_file), **overrides)
        model = cls(cfg, device=device, dtype=dtype)
        model.load_state_dict(_hf_state(load(weights, device=model.wte.weight.device), cfg.n_layer, weights))
        return model


def _hf_config(hf: dict, where: Path) -> GPTConfig:
    """GPTConfig of a Hugging Face GPT2Config, refusing what wgpar's GPT would compute differently."""
    checks = {  # field: (GPT-2's value, what wgpar computes)
        "activation_function": (("gelu_new", "gelu_pytorch_tanh", "gelu_fast"), "GELU with the tanh approximation"),
        "layer_norm_epsilon": ((1e-5,), "LayerNorm eps 1e-5"),
        "scale_attn_weights": ((True,), "attention scaled by 1/sqrt(head_dim)"),
        "scale_attn_by_inverse_layer_idx": ((False,), "no per-layer attention scaling"),
        "reorder_and_upcast_attn": ((False,), "float32 attention"),
        "add_cross_attention": ((False,), "no cross-attention"),
    }
    for key, (allowed, ours) in checks.items():
        if key in hf and hf[key] not in allowed:
            raise ValueError(f"GPT.from_pretrained: {where} has {key} = {hf[key]!r}; wgpar's GPT computes {ours}")
    if hf.get("n_inner") not in (None, 4 * hf["n_embd"]):
        raise ValueError(f"GPT.from_pretrained: {where} has n_inner = {hf['n_inner']}; wgpar's MLP is 4 * n_embd "
                         f"= {4 * hf['n_embd']} wide")
    return GPTConfig(vocab_size=hf["vocab_size"], block_size=hf["n_positions"], n_layer=hf["n_layer"],
                     n_head=hf["n_head"], n_embd=hf["n_embd"], dropout=0.0, bias=True)


# Hugging Face GPT-2 name -> (wgpar name, whether it is a Conv1D weight stored [in, out]).
_HF_BLOCK = {"ln_1.weight": ("ln_1.weight", False), "ln_1.bias": ("ln_1.bias", False),
             "attn.c_attn.weight": ("attn.qkv.weight", True), "attn.c_attn.bias": ("attn.qkv.bias", False),
             "attn.c_proj.weight": ("attn.out_proj.weight", True), "attn.c_proj.bias": ("attn.out_proj.bias", False),
             "ln_2.weight": ("ln_2.weight", False), "ln_2.bias": ("ln_2.bias", False),
             "mlp.c_fc.weight": ("mlp.fc1.weight", True), "mlp.c_fc.bias": ("mlp.fc1.bias", False),
             "mlp.c_proj.weight": ("mlp.fc2.weight", True), "mlp.c_proj.bias": ("mlp.fc2.bias", False)}
_HF_TOP = {"wte.weight": "wte.weight", "wpe.weight": "wpe.weight", "ln_f.weight": "ln_f.weight",
           "ln_f.bias": "ln_f.bias"}


def _hf_state(hf: dict[str, Tensor], n_layer: int, where: Path) -> dict[str, Tensor]:
    """wgpar GPT state_dict from a Hugging Face GPT-2 one (module docstring of ``from_pretrained``)."""
    state: dict[str, Tensor] = {}
    for name, t in hf.items():
        key = name.removeprefix("transformer.")
        if key == "lm_head.weight" or key.split(".", 2)[-1] in ("attn.bias", "attn.masked_bias"):
            continue  # the output layer is tied to wte; the causal-mask buffers
        if key in _HF_TOP:
            state[_HF_TOP[key]] = t
            continue
        parts = key.split(".", 2)
        if len(parts) != 3 or parts[0] != "h" or not parts[1].isdigit() or parts[2] not in _HF_BLOCK \
                or int(parts[1]) >= n_layer:
            raise ValueError(f"GPT.from_pretrained: {where} holds {name!r}, not a GPT-2 weight of this config")
        ours, conv1d = _HF_BLOCK[parts[2]]
        state[f"blocks.{parts[1]}.{ours}"] = t.transpose(0, 1) if conv1d else t
    return state


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
