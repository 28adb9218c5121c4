"""Neural-network building blocks: Module, Parameter, layers, losses, functional, init."""

from . import functional, init, utils
from .attention import CausalSelfAttention, MultiheadAttention
from .containers import ModuleDict, ModuleList
from .layers import (
                     GELU,
                     MLP,
                     CrossEntropyLoss,
                     Dropout,
                     Embedding,
                     LayerNorm,
                     Linear,
                     MSELoss,
                     ReLU,
                     Sequential,
                     Sigmoid,
                     Softmax,
                     Tanh,
)
from .module import Module
from .parameter import Parameter
from .utils import clip_grad_norm_

__all__ = ["Module", "Parameter", "Linear", "ReLU", "GELU", "Tanh", "Sigmoid", "Softmax", "LayerNorm",
           "Embedding", "Dropout", "Sequential", "ModuleList", "ModuleDict", "CrossEntropyLoss", "MSELoss",
           "MLP", "MultiheadAttention", "CausalSelfAttention", "functional", "init", "utils",
           "clip_grad_norm_"]
