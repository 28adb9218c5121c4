"""Neural-network building blocks: Module, Parameter, layers, losses, functional, init."""

from . import functional, init
from .layers import (GELU, CrossEntropyLoss, Dropout, Embedding, LayerNorm, Linear, MSELoss, ReLU, Sequential,
                     Sigmoid, Softmax, Tanh)
from .module import Module
from .parameter import Parameter

__all__ = ["Module", "Parameter", "Linear", "ReLU", "GELU", "Tanh", "Sigmoid", "Softmax", "LayerNorm",
           "Embedding", "Dropout", "Sequential", "CrossEntropyLoss", "MSELoss", "functional", "init"]
