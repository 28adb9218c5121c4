"""GPT-2's byte-level BPE tokenizer, read from the ``vocab.json`` and ``merges.txt`` of a local folder.

Nothing is downloaded: get ``vocab.json`` and ``merges.txt`` (with ``model.safetensors`` and
``config.json`` for ``GPT.from_pretrained``) from the Hugging Face repository "gpt2"
(https://huggingface.co/gpt2/tree/main) into one folder.

As OpenAI's encoder.py: text is split by GPT-2's pattern, each piece's UTF-8 bytes are mapped to
printable characters (``bytes_to_unicode``), and the piece is merged pair by pair in the order of
``merges.txt`` (lowest rank first). The pattern's letter and number classes (``\\p{L}``, ``\\p{N}``
in the original, which needs the ``regex`` package) are Python's ``[^\\W\\d_]`` and ``\\d``: the same
for every letter and decimal digit; they differ only for numeric characters that are not decimal
digits (superscripts, Roman numerals), which then go with the punctuation class.
"""

from __future__ import annotations

import json
import os
import re
from functools import lru_cache
from pathlib import Path

_PATTERN = re.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?[^\W\d_]+| ?\d+| ?(?:[^\s\w]|_)+|\s+(?!\S)|\s+""")


@lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> character map: printable bytes map to themselves, the rest to characters from 256 on."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    chars = list(keep)
    n = 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + n)
            n += 1
    return dict(zip(keep, map(chr, chars)))


class GPT2Tokenizer:
    """``encode(text) -> list[int]`` and ``decode(ids) -> str`` with GPT-2's vocabulary and merges.

    Arguments:
        vocab: token string -> id (``vocab.json``).
        merges: the BPE merges in rank order, each a pair of token strings (``merges.txt``).
    """

    def __init__(self, vocab: dict[str, int], merges: list[tuple[str, str]]) -> None:
        self.encoder = dict(vocab)
        self.decoder = {i: s for s, i in self.encoder.items()}
        self.ranks = {pair: i for i, pair in enumerate(merges)}
        self.byte_encoder = bytes_to_unicode()
        self.byte_decoder = {c: b for b, c in self.byte_encoder.items()}
        self._cache: dict[str, list[str]] = {}

    @property
    def vocab_size(self) -> int:
        """The number of tokens in the vocabulary (the encoder's size)."""
        return len(self.encoder)

    @property
    def eot_token(self) -> int | None:
        """The id of ``<|endoftext|>`` (50256 in GPT-2), None if the vocabulary has none."""
        return self.encoder.get("<|endoftext|>")

    def _bpe(self, piece: str) -> list[str]:
        if piece in self._cache:
            return self._cache[piece]
        word = list(piece)
        while len(word) > 1:
            pair = min(zip(word, word[1:]), key=lambda p: self.ranks.get(p, float("inf")))
            if pair not in self.ranks:
                break
            first, second = pair
            merged, i = [], 0
            while i < len(word):  # every occurrence of the pair, left to right
                if i + 1 < len(word) and word[i] == first and word[i + 1] == second:
                    merged.append(first + second)
                    i += 2
                else:
                    merged.append(word[i])
                    i += 1
            word = merged
        self._cache[piece] = word
        return word

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``. A piece with no token (a vocabulary without every byte) raises KeyError."""
        ids = []
        for piece in _PATTERN.findall(text):
            mapped = "".join(self.byte_encoder[b] for b in piece.encode("utf-8"))
            for token in self._bpe(mapped):
                if token not in self.encoder:
                    raise KeyError(f"GPT2Tokenizer: {token!r} (from {piece!r}) is not in the vocabulary")
                ids.append(self.encoder[token])
        return ids

    def decode(self, ids) -> str:
        """The text of token ids (a list or a 1-d array); invalid UTF-8 becomes U+FFFD, as GPT-2's decoder."""
        try:
            text = "".join(self.decoder[int(i)] for i in ids)
        except KeyError as exc:
            raise KeyError(f"GPT2Tokenizer: token id {exc.args[0]} is not in the vocabulary of "
                           f"{self.vocab_size}") from None
        return bytes(self.byte_decoder[c] for c in text).decode("utf-8", errors="replace")


def gpt2_tokenizer(path: str | os.PathLike) -> GPT2Tokenizer:
    """GPT-2's tokenizer from a folder holding ``vocab.json`` and ``merges.txt`` (module docstring: where
    to get them).

    Arguments:
        path: the folder (or the path of its ``vocab.json``).
    """
    folder = Path(path)
    if folder.is_file():
        folder = folder.parent
    vocab_file, merges_file = folder / "vocab.json", folder / "merges.txt"
    for f in (vocab_file, merges_file):
        if not f.is_file():
            raise FileNotFoundError(f"gpt2_tokenizer: {f} not found; download vocab.json and merges.txt from the "
                                    "Hugging Face repository 'gpt2' into that folder")
    vocab = json.loads(vocab_file.read_text(encoding="utf-8"))
    merges = []
    for line in merges_file.read_text(encoding="utf-8").splitlines():
        if line.startswith("#version") or not line.strip():
            continue
        a, b = line.split()
        merges.append((a, b))
    return GPT2Tokenizer(vocab, merges)


__all__ = ["GPT2Tokenizer", "gpt2_tokenizer", "bytes_to_unicode"]
