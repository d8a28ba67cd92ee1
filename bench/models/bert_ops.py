"""BERT-base written in primitive tensor operations, for operator-level planning benchmarks.

The zoo's BERT traces a layer norm, a GELU or a projection as one op each; here every one
of them is the tensors' arithmetic (a layer norm is a mean, a subtraction, a square, a
second mean, an epsilon, a square root, a division, a scale and a shift; a projection is a
matrix product and a bias), as a framework's operator-level graph records it (the
NeurIPS 2020 device-placement inputs are such graphs). d 768, 12 heads, FFN 3072, as
BERT-base; the masked-LM decoder is its own projection (not tied to the embeddings), and
the vocabulary is cut to 8,192 tokens so that two CPU cores profile it in minutes.

    dl-nfv profile model bench/models/bert_ops.py:bert3 --input-shape 8,64 --input-dtype int64
"""

from __future__ import annotations

import math

import torch
from torch import nn

HIDDEN, HEADS, FFN, VOCAB, POSITIONS = 768, 12, 3072, 8192, 512


def _param(*shape: int, std: float = 0.02) -> nn.Parameter:
    return nn.Parameter(torch.randn(*shape) * std)


class Dense(nn.Module):
    """``x @ W + b`` as two ops."""

    def __init__(self, d_in: int, d_out: int):
        super().__init__()
        self.weight = _param(d_in, d_out)
        self.bias = nn.Parameter(torch.zeros(d_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.matmul(x, self.weight) + self.bias


class Norm(nn.Module):
    """Layer norm over the last dimension, op by op."""

    def __init__(self, d: int):
        super().__init__()
        self.gamma = nn.Parameter(torch.ones(d))
        self.beta = nn.Parameter(torch.zeros(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        centred = x - x.mean(-1, keepdim=True)
        var = (centred * centred).mean(-1, keepdim=True)
        return centred / torch.sqrt(var + 1e-12) * self.gamma + self.beta


def gelu(x: torch.Tensor) -> torch.Tensor:
    """GELU, tanh approximation, op by op."""
    inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)
    return 0.5 * x * (1.0 + torch.tanh(inner))


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.q, self.k, self.v, self.o = (Dense(HIDDEN, HIDDEN) for _ in range(4))
        self.norm1, self.norm2 = Norm(HIDDEN), Norm(HIDDEN)
        self.up, self.down = Dense(HIDDEN, FFN), Dense(FFN, HIDDEN)
        self.drop = nn.Dropout(0.1)

    def heads(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        return x.view(b, s, HEADS, HIDDEN // HEADS).permute(0, 2, 1, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = self.heads(self.q(x)), self.heads(self.k(x)), self.heads(self.v(x))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(HIDDEN // HEADS)
        context = torch.matmul(self.drop(torch.softmax(scores, dim=-1)), v)
        context = context.permute(0, 2, 1, 3).reshape(b, s, HIDDEN)
        x = self.norm1(x + self.drop(self.o(context)))
        return self.norm2(x + self.drop(self.down(gelu(self.up(x)))))


class BertOps(nn.Module):
    def __init__(self, layers: int):
        super().__init__()
        self.words = nn.Embedding(VOCAB, HIDDEN)
        self.positions = _param(POSITIONS, HIDDEN)
        self.norm = Norm(HIDDEN)
        self.layers = nn.ModuleList(Layer() for _ in range(layers))
        self.transform = Dense(HIDDEN, HIDDEN)
        self.head_norm = Norm(HIDDEN)
        self.decoder = Dense(HIDDEN, VOCAB)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.norm(self.words(ids) + self.positions[: ids.shape[1]])
        for layer in self.layers:
            x = layer(x)
        return self.decoder(self.head_norm(gelu(self.transform(x))))


def bert3() -> nn.Module:
    return BertOps(3)


def bert6() -> nn.Module:
    return BertOps(6)


def bert12() -> nn.Module:
    return BertOps(12)
