"""A model with a data-dependent shape: token pruning by ``masked_select``.

An encoder MLP scores every token of every sequence; the tokens whose score is positive
are kept (``masked_select`` on a boolean mask: how many depends on the data) and go
through a wider MLP alone; ``masked_scatter`` puts them back in place, and the sequence
is averaged into a class score vector. As in adaptive-computation models, the work of
the wide MLP follows the data, not the batch's shape.

    dl-nfv profile model bench/models/prune.py:build --input-shape 16,32,64
"""

from __future__ import annotations

import torch
from torch import nn


class TokenPruning(nn.Module):
    def __init__(self, d_model: int = 64, hidden: int = 256, classes: int = 10):
        super().__init__()
        self.d_model = d_model
        self.encode = nn.Sequential(nn.Linear(d_model, d_model), nn.GELU())
        self.score = nn.Linear(d_model, 1)
        self.wide = nn.Sequential(nn.Linear(d_model, hidden), nn.GELU(), nn.Linear(hidden, d_model))
        self.head = nn.Linear(d_model, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encode(x)
        keep = (self.score(h) > 0).expand_as(h)
        kept = torch.masked_select(h, keep).view(-1, self.d_model)
        h = h.masked_scatter(keep, self.wide(kept) + kept)
        return self.head(h.mean(dim=1))


def build() -> nn.Module:
    """Token pruning for ``--input-shape 16,32,64`` (16 sequences of 32 tokens of 64)."""
    return TokenPruning()
