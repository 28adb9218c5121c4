"""Ready-made models built from wgpar.nn: ``GPT`` (examples/train_gpt.py trains it)."""

from .gpt import GPT, PRESETS, Block, GPTConfig, preset

__all__ = ["GPT", "GPTConfig", "Block", "PRESETS", "preset"]
