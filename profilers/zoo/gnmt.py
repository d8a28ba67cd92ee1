"""GNMT (Wu et al. 2016) in its GNMT-v2 form (the MLPerf / NVIDIA reference):
an LSTM sequence-to-sequence translator with normalised Bahdanau attention.

Encoder: a bidirectional LSTM, then three unidirectional LSTMs (residual
connections from the third layer on). Decoder: an LSTM whose outputs query the
attention, then three LSTMs fed with ``[x, context]`` (residual from the second
on), and a classifier over the vocabulary. Source and target share one
embedding. With vocabulary 32,320 and hidden size 1,024 it has 160,671,297
parameters, the published figure. Training uses teacher forcing, so the decoder
runs over the whole target sequence at once (no Python loop: fx traces it).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class GNMTConfig:
    vocab: int = 32320
    hidden: int = 1024
    encoder_layers: int = 4
    decoder_layers: int = 4
    dropout: float = 0.2


class BahdanauAttention(nn.Module):
    """Additive attention with weight normalisation of the score vector (GNMT-v2)."""

    def __init__(self, hidden: int):
        super().__init__()
        self.linear_q = nn.Linear(hidden, hidden, bias=False)
        self.linear_k = nn.Linear(hidden, hidden, bias=False)
        self.linear_att = nn.Parameter(torch.empty(hidden).uniform_(-0.1, 0.1))
        self.normalize_scalar = nn.Parameter(torch.tensor([1.0 / hidden ** 0.5]))
        self.normalize_bias = nn.Parameter(torch.zeros(hidden))

    def forward(self, query: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        q = self.linear_q(query).unsqueeze(2)  # (B, Tq, 1, H)
        k = self.linear_k(keys).unsqueeze(1)  # (B, 1, Tk, H)
        v = self.linear_att / self.linear_att.norm() * self.normalize_scalar
        scores = torch.tanh(q + k + self.normalize_bias).matmul(v)  # (B, Tq, Tk)
        return torch.bmm(F.softmax(scores, dim=-1), keys)


class GNMTEncoder(nn.Module):
    def __init__(self, c: GNMTConfig):
        super().__init__()
        self.bidirectional = nn.LSTM(c.hidden, c.hidden, batch_first=True, bidirectional=True)
        self.layers = nn.ModuleList([nn.LSTM(2 * c.hidden, c.hidden, batch_first=True)]
                                    + [nn.LSTM(c.hidden, c.hidden, batch_first=True)
                                       for _ in range(c.encoder_layers - 2)])
        self.drop = nn.Dropout(c.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.bidirectional(self.drop(x))[0]
        x = self.layers[0](self.drop(x))[0]
        for layer in self.layers[1:]:
            x = x + layer(self.drop(x))[0]
        return x


class GNMTDecoder(nn.Module):
    def __init__(self, c: GNMTConfig):
        super().__init__()
        self.att_rnn = nn.LSTM(c.hidden, c.hidden, batch_first=True)
        self.attention = BahdanauAttention(c.hidden)
        self.layers = nn.ModuleList(nn.LSTM(2 * c.hidden, c.hidden, batch_first=True)
                                    for _ in range(c.decoder_layers - 1))
        self.classifier = nn.Linear(c.hidden, c.vocab)
        self.drop = nn.Dropout(c.dropout)

    def forward(self, x: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
        x = self.att_rnn(self.drop(x))[0]
        context = self.attention(x, memory)
        x = self.layers[0](torch.cat([self.drop(x), context], dim=2))[0]
        for layer in self.layers[1:]:
            x = x + layer(torch.cat([self.drop(x), context], dim=2))[0]
        return self.classifier(x)


class GNMT(nn.Module):
    """GNMT-v2: shared embedding, 4-layer LSTM encoder and decoder, attention."""

    def __init__(self, c: GNMTConfig = GNMTConfig()):
        super().__init__()
        self.embedding = nn.Embedding(c.vocab, c.hidden)
        nn.init.uniform_(self.embedding.weight, -0.1, 0.1)
        self.encoder = GNMTEncoder(c)
        self.decoder = GNMTDecoder(c)

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        memory = self.encoder(self.embedding(src))
        return self.decoder(self.embedding(tgt), memory)
