"""User models (``file.py:callable``) that the planners' runnable-plan tests profile, plan and train.

Written as a user outside the project would write them, with the kind of structure zoo
models lack: a model whose ops return tuples (``torch.chunk``) and take shapes from their
input (``x.size``), with skip connections, and one with a fixed batch. The top-2
Mixture-of-Experts (data-dependent routing: ``torch.topk``, ``index_add``, boolean masks)
is the fidelity bench's, ``bench/models/moe.py``.
"""

from __future__ import annotations

import torch
from torch import nn


class ChunkedResidual(nn.Module):
    """Residual blocks that split their input in two with ``torch.chunk`` (a tuple whose
    items are ``getitem`` ops), gate one half by the other, and add a skip connection;
    the head flattens with a shape read from the input (``x.size(0)``)."""

    def __init__(self, width: int = 64, blocks: int = 3, classes: int = 10):
        super().__init__()
        self.stem = nn.Linear(32, width)
        self.blocks = nn.ModuleList(nn.Linear(width // 2, width) for _ in range(blocks))
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.stem(x.view(x.size(0), -1)))
        for block in self.blocks:
            a, b = torch.chunk(h, 2, dim=-1)
            h = h + block(a * torch.sigmoid(b))
        return self.head(h)


def chunked_residual() -> nn.Module:
    """Chunked residual blocks for ``--input-shape 16,4,8`` (flattened to 32 features)."""
    return ChunkedResidual()


class FixedBatch(nn.Module):
    """A model that reshapes to its profiled batch of 8 (``x.view(8, -1)``): it runs at no
    other batch size, so nothing can be learnt from running it at a few small ones."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.view(8, -1))


def fixed_batch() -> nn.Module:
    """For ``--input-shape 8,4,4``."""
    return FixedBatch()
