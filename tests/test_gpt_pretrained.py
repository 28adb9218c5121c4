"""GPT.from_pretrained reads a GPT-2 checkpoint in Hugging Face's exact layout (Conv1D weights [in, out],
the attn.bias / masked_bias buffers, an optional transformer. prefix, a tied lm_head) and computes the
logits of GPT-2's architecture, written here in NumPy float64 from its definition; generate and the
byte-level BPE tokenizer work on it."""

from __future__ import annotations

import json

import numpy as np
import pytest
from safetensors.numpy import save_file

import wgpar
from wgpar.models import GPT, gpt2_tokenizer
from wgpar.models.tokenizer import bytes_to_unicode

HF = dict(vocab_size=61, n_positions=20, n_layer=2, n_head=3, n_embd=24)


def _hf_weights(rng, prefix: str) -> dict[str, np.ndarray]:
    d, v, t = HF["n_embd"], HF["vocab_size"], HF["n_positions"]

    def w(*shape, scale=0.2):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    out = {f"{prefix}wte.weight": w(v, d), f"{prefix}wpe.weight": w(t, d),
           f"{prefix}ln_f.weight": 1 + w(d), f"{prefix}ln_f.bias": w(d)}
    for i in range(HF["n_layer"]):
        h = f"{prefix}h.{i}."
        out |= {h + "ln_1.weight": 1 + w(d), h + "ln_1.bias": w(d), h + "ln_2.weight": 1 + w(d),
                h + "ln_2.bias": w(d),
                h + "attn.c_attn.weight": w(d, 3 * d), h + "attn.c_attn.bias": w(3 * d),  # Conv1D: [in, out]
                h + "attn.c_proj.weight": w(d, d), h + "attn.c_proj.bias": w(d),
                h + "mlp.c_fc.weight": w(d, 4 * d), h + "mlp.c_fc.bias": w(4 * d),
                h + "mlp.c_proj.weight": w(4 * d, d), h + "mlp.c_proj.bias": w(d),
                # HF's causal-mask buffers, saved by older transformers versions
                h + "attn.bias": np.tril(np.ones((t, t), np.float32))[None, None],
                h + "attn.masked_bias": np.array(-1e4, np.float32)}
    out["lm_head.weight"] = out[f"{prefix}wte.weight"]
    return out


def _gpt2_logits(W: dict[str, np.ndarray], idx: np.ndarray, prefix: str) -> np.ndarray:
    """GPT-2 (modeling_gpt2.py, eval mode) in float64."""
    W = {k.removeprefix(prefix): v.astype(np.float64) for k, v in W.items()}
    d, nh = HF["n_embd"], HF["n_head"]
    hd = d // nh

    def ln(x, g, b):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + 1e-5) * g + b

    def gelu_new(x):
        return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))

    b, t = idx.shape
    x = W["wte.weight"][idx] + W["wpe.weight"][np.arange(t)]
    mask = np.tril(np.ones((t, t), bool))
    for i in range(HF["n_layer"]):
        p = f"h.{i}."
        qkv = ln(x, W[p + "ln_1.weight"], W[p + "ln_1.bias"]) @ W[p + "attn.c_attn.weight"] + W[p + "attn.c_attn.bias"]
        q, k, v = (qkv[..., j * d:(j + 1) * d].reshape(b, t, nh, hd).transpose(0, 2, 1, 3) for j in range(3))
        s = np.where(mask, q @ k.transpose(0, 1, 3, 2) / np.sqrt(hd), -np.inf)
        a = np.exp(s - s.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        y = (a @ v).transpose(0, 2, 1, 3).reshape(b, t, d)
        x = x + y @ W[p + "attn.c_proj.weight"] + W[p + "attn.c_proj.bias"]
        h2 = ln(x, W[p + "ln_2.weight"], W[p + "ln_2.bias"])
        hmid = gelu_new(h2 @ W[p + "mlp.c_fc.weight"] + W[p + "mlp.c_fc.bias"])
        x = x + hmid @ W[p + "mlp.c_proj.weight"] + W[p + "mlp.c_proj.bias"]
    return ln(x, W["ln_f.weight"], W["ln_f.bias"]) @ W["wte.weight"].T


def _write(folder, weights, **config) -> None:
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    hf = {"model_type": "gpt2", "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5, "n_inner": None,
          "n_ctx": HF["n_positions"], **HF, **config}
    (folder / "config.json").write_text(json.dumps(hf))


@pytest.mark.parametrize("prefix", ["", "transformer."])
def test_logits_match_gpt2_and_generate_runs(prefix, tmp_path, rng):
    W = _hf_weights(rng, prefix)
    _write(tmp_path, W)
    model = GPT.from_pretrained(tmp_path if prefix else tmp_path / "model.safetensors")
    cfg = model.cfg
    assert (cfg.vocab_size, cfg.block_size, cfg.n_layer, cfg.n_head, cfg.n_embd) == (61, 20, 2, 3, 24)
    assert model.lm_head.weight is model.wte.weight
    np.testing.assert_array_equal(model.blocks[1].attn.qkv.weight.numpy(), W[f"{prefix}h.1.attn.c_attn.weight"].T)
    model.eval()
    idx = rng.integers(0, 61, (2, 17)).astype(np.int32)
    want = _gpt2_logits(W, idx, prefix)
    got = model(idx).numpy()
    rel = np.abs(got - want).max() / np.abs(want).max()
    assert rel <= 1e-4, rel

    prompt = idx[:, :5]
    out = model.generate(prompt, 4, temperature=0.0)
    ids = prompt.copy()
    for _ in range(4):  # greedy decoding with the reference
        ids = np.concatenate([ids, _gpt2_logits(W, ids, prefix)[:, -1].argmax(-1)[:, None]], axis=1)
    np.testing.assert_array_equal(out, ids)


def test_training_flags_pass_through(tmp_path, rng):
    _write(tmp_path, _hf_weights(rng, ""))
    model = GPT.from_pretrained(tmp_path, dropout=0.1, checkpoint_activations=True)
    assert model.cfg.dropout == 0.1 and model.cfg.checkpoint_activations
    idx = rng.integers(0, 61, (2, 9)).astype(np.int32)
    model(idx, idx).backward()
    assert all(p.grad is not None for p in model.parameters())


@pytest.mark.parametrize("config,match", [({"activation_function": "relu"}, "activation_function"),
                                          ({"layer_norm_epsilon": 1e-6}, "layer_norm_epsilon"),
                                          ({"n_inner": 50}, "n_inner")])
def test_configs_wgpar_cannot_express_are_refused(config, match, tmp_path, rng):
    _write(tmp_path, _hf_weights(rng, ""), **config)
    with pytest.raises(ValueError, match=match):
        GPT.from_pretrained(tmp_path)


def test_foreign_weights_and_missing_files_are_refused(tmp_path, rng):
    W = _hf_weights(rng, "")
    W["h.0.attn.q_proj.weight"] = W["h.0.attn.c_proj.weight"]
    _write(tmp_path, W)
    with pytest.raises(ValueError, match="q_proj"):
        GPT.from_pretrained(tmp_path)
    with pytest.raises(FileNotFoundError, match="gpt2"):
        GPT.from_pretrained(tmp_path / "elsewhere")


def _tiny_vocab(folder) -> None:
    """A GPT-2 style vocabulary: the 256 byte characters, a few merges, <|endoftext|> last."""
    chars = list(bytes_to_unicode().values())
    merges = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("l", "l"), ("e", "ll"), ("Ġ", "w"), ("o", "r"), ("Ġw", "or"),
              ("Ġwor", "ld"), ("l", "d")]
    vocab = {c: i for i, c in enumerate(chars)}
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    vocab["<|endoftext|>"] = len(vocab)
    (folder / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(f"{a} {b}" for a, b in merges) + "\n",
                                       encoding="utf-8")


def test_tokenizer_encodes_with_merges_and_round_trips(tmp_path):
    _tiny_vocab(tmp_path)
    tok = gpt2_tokenizer(tmp_path)
    v = tok.encoder
    assert tok.eot_token == len(v) - 1
    # " the": Ġ+t, then Ġt+he. "hello": h+e (rank 1) before l+l (3), so "ell" (4) never forms. " world":
    # Ġ+w, o+r, Ġw+or, then l+d (9) makes the pair Ġwor+ld (8) possible.
    assert tok.encode(" the") == [v["Ġthe"]]
    assert tok.encode("hello world") == [v["he"], v["ll"], v["o"], v["Ġworld"]]
    assert tok.encode("it's 42!") == [v["i"], v["t"], v["'"], v["s"], v["Ġ"], v["4"], v["2"], v["!"]]
    for text in ["hello world", "naïve café — 日本語\n\n  tabs\tand_underscores 3.14", ""]:
        assert tok.decode(tok.encode(text)) == text
    assert tok.decode([v["Ã"]]) == "\ufffd"  # half of a two-byte character
    with pytest.raises(KeyError, match="999"):
        tok.decode([999])
    with pytest.raises(FileNotFoundError, match="merges.txt"):
        (tmp_path / "merges.txt").unlink()
        gpt2_tokenizer(tmp_path)


def test_generate_decodes_through_the_tokenizer(tmp_path, rng):
    _tiny_vocab(tmp_path)
    tok = gpt2_tokenizer(tmp_path)
    wgpar.manual_seed(0)
    W = _hf_weights(rng, "")
    W["wte.weight"] = (rng.standard_normal((tok.vocab_size, HF["n_embd"])) * 0.2).astype(np.float32)
    W["lm_head.weight"] = W["wte.weight"]
    _write(tmp_path, W, vocab_size=tok.vocab_size)
    model = GPT.from_pretrained(tmp_path)
    ids = model.generate(np.array([tok.encode("hello")], np.int32), 6, top_k=5, rng=np.random.default_rng(1))
    assert ids.shape == (1, len(tok.encode("hello")) + 6)
    assert tok.decode(ids[0]).startswith("hello")
