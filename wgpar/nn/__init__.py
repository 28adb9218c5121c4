"""Neural-network building blocks: Module, Parameter, layers, losses, functional, init."""

from . import functional, init, utils
from .batchnorm import BatchNorm1d, BatchNorm2d
from .conv import Conv1d, Conv2d
from .layers import (
                     GELU,
                     CrossEntropyLoss,
                     Dropout,
                     Embedding,
                     Flatten,
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
from .pooling import AvgPool2d, MaxPool2d
from .utils import clip_grad_norm_

__all__ = ["Module", "Parameter", "Linear", "ReLU", "GELU", "Tanh", "Sigmoid", "Softmax", "LayerNorm",
           "Embedding", "Dropout", "Sequential", "CrossEntropyLoss", "MSELoss", "functional", "init", "utils",
           "clip_grad_norm_", "Conv1d", "Conv2d", "MaxPool2d", "AvgPool2d", "BatchNorm1d", "BatchNorm2d", "Flatten"]
