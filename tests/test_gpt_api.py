"""GPT's user-facing edges: ``generate``'s arguments (clear errors instead of silently different sampling;
temperature 0 is greedy) and state dicts that list the tied weight under both of its names (PyTorch's
layout), loading either form; nn.Module's state dict of shared parameters as torch's."""

from __future__ import annotations

import numpy as np
import pytest

import wgpar
from wgpar import nn
from wgpar.models.gpt import GPT, GPTConfig

CFG = GPTConfig(vocab_size=29, block_size=8, n_layer=1, n_head=2, n_embd=16)


@pytest.fixture(scope="module")
def model():
    wgpar.manual_seed(0)
    return GPT(CFG)


PROMPT = np.array([[1, 5, 7], [2, 3, 4]], dtype=np.int32)


@pytest.mark.parametrize("kwargs, exc, words", [
    ({"temperature": -0.5}, ValueError, ["temperature", "-0.5"]),
    ({"temperature": float("nan")}, ValueError, ["temperature", "nan"]),
    ({"top_k": 0}, ValueError, ["top_k", "0"]),
    ({"top_k": -3}, ValueError, ["top_k", "-3"]),
    ({"top_k": 2.5}, TypeError, ["top_k", "2.5"]),
], ids=["negative-temperature", "nan-temperature", "top_k-0", "negative-top_k", "float-top_k"])
def test_generate_refuses_bad_sampling_arguments(model, kwargs, exc, words):
    with pytest.raises(exc) as info:
        model.generate(PROMPT, 2, **kwargs)
    for w in words:
        assert w in str(info.value)


@pytest.mark.parametrize("prompt, exc, words", [
    (np.array([[1.5, 2.7]]), TypeError, ["idx", "float64"]),
    (np.zeros((1, 0), np.int32), ValueError, ["idx", "(1, 0)"]),
    (np.zeros((0, 3), np.int32), ValueError, ["idx", "(0, 3)"]),
    (np.array([1, 2, 3], np.int32), ValueError, ["idx", "(3,)", "[batch, seq]"]),
    (np.array([[1, 29]], np.int32), ValueError, ["idx", "29", "vocab_size"]),
    (np.array([[1, -1]], np.int32), ValueError, ["idx", "-1"]),
], ids=["float", "empty-seq", "empty-batch", "1-d", "past-vocab", "negative"])
def test_generate_refuses_bad_prompts(model, prompt, exc, words):
    with pytest.raises(exc) as info:
        model.generate(prompt, 2)
    for w in words:
        assert w in str(info.value)


@pytest.mark.parametrize("n, exc", [(-1, ValueError), (1.5, TypeError)])
def test_generate_refuses_bad_token_counts(model, n, exc):
    with pytest.raises(exc, match="max_new_tokens"):
        model.generate(PROMPT, n)


def test_temperature_zero_is_greedy(model):
    out = model.generate(PROMPT, 4, temperature=0.0, rng=np.random.default_rng(1))
    again = model.generate(PROMPT, 4, temperature=0.0, rng=np.random.default_rng(2))
    np.testing.assert_array_equal(out, again)
    assert out.shape == (2, 7) and (out[:, :3] == PROMPT).all()
    for t in range(3, 7):
        logits = model(out[:, :t]).numpy()[:, -1]
        np.testing.assert_array_equal(out[:, t], logits.argmax(-1))


def test_top_k_samples_only_the_k_most_likely(model):
    logits = model(PROMPT).numpy()[:, -1]
    top2 = np.argsort(logits, -1)[:, -2:]
    out = model.generate(PROMPT, 1, top_k=2, temperature=5.0, rng=np.random.default_rng(3))
    assert all(out[b, -1] in top2[b] for b in range(2))
    full = model.generate(PROMPT, 1, top_k=1000, rng=np.random.default_rng(3))  # more than the vocabulary: all
    assert full.shape == (2, 4)


def test_state_dict_lists_the_tied_weight_under_both_names(model):
    sd = model.state_dict()
    assert "wte.weight" in sd and "lm_head.weight" in sd
    np.testing.assert_array_equal(sd["wte.weight"].numpy(), sd["lm_head.weight"].numpy())
    assert len(sd) == len(list(model.named_parameters())) + 1


@pytest.mark.parametrize("form", ["both", "wte only", "lm_head only"])
def test_load_state_dict_takes_either_form_of_the_tied_weight(model, form, rng):
    state = {k: v.numpy() for k, v in model.state_dict().items()}
    w = rng.standard_normal(state["wte.weight"].shape).astype(np.float32)
    state["wte.weight"] = state["lm_head.weight"] = w
    if form == "wte only":
        del state["lm_head.weight"]
    elif form == "lm_head only":
        del state["wte.weight"]
    wgpar.manual_seed(1)
    other = GPT(CFG)
    assert other.load_state_dict(state) == ([], [])
    assert other.lm_head.weight is other.wte.weight
    np.testing.assert_array_equal(other.wte.weight.numpy(), w)


def test_load_state_dict_refuses_tied_names_that_disagree(model):
    state = {k: v.numpy() for k, v in model.state_dict().items()}
    state["lm_head.weight"] = state["lm_head.weight"] + 1.0
    with pytest.raises(ValueError, match=r"wte\.weight.*lm_head\.weight"):
        GPT(CFG).load_state_dict(state)
    del state["wte.weight"], state["lm_head.weight"]
    with pytest.raises(KeyError, match=r"missing keys \['wte\.weight', 'lm_head\.weight'\]"):
        GPT(CFG).load_state_dict(state)


def test_shared_parameters_and_modules_named_as_torch(torch):
    keys = {}
    for name, lib in (("wgpar", nn), ("torch", torch.nn)):
        shared = lib.Linear(3, 3)
        m = lib.Sequential(shared, lib.ReLU(), shared, lib.Linear(3, 4), lib.BatchNorm1d(4))
        keys[name] = (list(m.state_dict()), [k for k, _ in m.named_parameters()],
                      [k for k, _ in m.named_parameters(remove_duplicate=False)])
    assert keys["wgpar"] == keys["torch"]
