"""Ready-made models built from wgpar.nn: ``GPT`` (examples/train_gpt.py trains it; ``GPT.from_pretrained``
loads GPT-2's weights) and GPT-2's tokenizer (``gpt2_tokenizer``)."""

from .gpt import GPT, PRESETS, Block, GPTConfig, preset
from .tokenizer import GPT2Tokenizer, gpt2_tokenizer

__all__ = ["GPT", "GPTConfig", "Block", "PRESETS", "preset", "GPT2Tokenizer", "gpt2_tokenizer"]
