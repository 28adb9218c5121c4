"""Neural-network building blocks: Module, Parameter, layers, losses, functional, init."""

from . import functional, init, utils
from .attention import CausalSelfAttention, MultiheadAttention
from .batchnorm import BatchNorm1d, BatchNorm2d
from .containers import ModuleDict, ModuleList
from .conv import Conv1d, Conv2d, ConvTranspose1d, ConvTranspose2d
from .functional import conv_transpose1d, conv_transpose2d
from .layers import (
                     ELU,
                     GELU,
                     MLP,
                     Dropout,
                     Dropout2d,
                     Embedding,
                     Flatten,
                     Identity,
                     LayerNorm,
                     LeakyReLU,
                     Linear,
                     LogSoftmax,
                     MSELoss,
                     ReLU,
                     Sequential,
                     Sigmoid,
                     SiLU,
                     Softmax,
                     Tanh,
)
from .loss import (
    BCELoss,
    BCEWithLogitsLoss,
    CrossEntropyLoss,
    HuberLoss,
    KLDivLoss,
    L1Loss,
    NLLLoss,
    SmoothL1Loss,
)
from .module import Module
from .normalization import GroupNorm, RMSNorm
from .parameter import Parameter
from .pooling import AdaptiveAvgPool2d, AvgPool2d, MaxPool2d
from .rnn import GRU, LSTM, RNN, GRUCell, LSTMCell, RNNBase, RNNCell, RNNCellBase
from .transformer import (
    Transformer,
    TransformerDecoder,
    TransformerDecoderLayer,
    TransformerEncoder,
    TransformerEncoderLayer,
)
from .utils import clip_grad_norm_

__all__ = ["Module", "Parameter", "Linear", "ReLU", "GELU", "Tanh", "Sigmoid", "Softmax", "LogSoftmax", "LayerNorm",
           "Embedding", "Dropout", "Sequential", "ModuleList", "ModuleDict", "CrossEntropyLoss", "MSELoss",
           "MLP", "MultiheadAttention", "CausalSelfAttention", "functional", "init", "utils",
           "clip_grad_norm_", "Conv1d", "Conv2d", "MaxPool2d", "AvgPool2d", "BatchNorm1d", "BatchNorm2d", "Flatten",
           "Identity", "SiLU", "LeakyReLU", "ELU", "Dropout2d",
           "GroupNorm", "RMSNorm", "AdaptiveAvgPool2d",
           "NLLLoss", "BCELoss", "BCEWithLogitsLoss", "L1Loss", "SmoothL1Loss", "HuberLoss", "KLDivLoss",
           "RNNBase", "RNN", "LSTM", "GRU", "RNNCellBase", "RNNCell", "LSTMCell", "GRUCell",
           "TransformerEncoderLayer", "TransformerDecoderLayer", "TransformerEncoder", "TransformerDecoder",
           "Transformer", "ConvTranspose1d", "ConvTranspose2d", "conv_transpose1d", "conv_transpose2d"]
