"""ResNet-50 v1.5 with every batch norm written as its tensor arithmetic, for operator-level
planning benchmarks.

The zoo's ResNet-50 traces a batch norm as one op; here it is the batch statistics and the
affine step op by op (a mean, a subtraction, a square, a second mean, an epsilon, a square
root, a division, a scale and a shift), as a framework's operator-level graph records a
training-mode batch norm, which brings the graph to about 600 ops. Bottleneck blocks
(3, 4, 6, 3), stride on the 3x3 convolution, 1,000 classes.

    dl-nfv profile model bench/models/resnet_ops.py:resnet50 --input-shape 8,3,224,224
"""

from __future__ import annotations

import torch
from torch import nn


class Norm(nn.Module):
    """Training-mode batch norm over (N, H, W), op by op."""

    def __init__(self, channels: int):
        super().__init__()
        self.gamma = nn.Parameter(torch.ones(1, channels, 1, 1))
        self.beta = nn.Parameter(torch.zeros(1, channels, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        centred = x - x.mean(dim=(0, 2, 3), keepdim=True)
        var = (centred * centred).mean(dim=(0, 2, 3), keepdim=True)
        return centred / torch.sqrt(var + 1e-5) * self.gamma + self.beta


def conv_norm(c_in: int, c_out: int, kernel: int, stride: int = 1) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(c_in, c_out, kernel, stride, kernel // 2, bias=False),
                         Norm(c_out))


class Bottleneck(nn.Module):
    def __init__(self, c_in: int, width: int, stride: int):
        super().__init__()
        c_out = 4 * width
        self.a = conv_norm(c_in, width, 1)
        self.b = conv_norm(width, width, 3, stride)
        self.c = conv_norm(width, c_out, 1)
        self.skip = conv_norm(c_in, c_out, 1, stride) if stride != 1 or c_in != c_out else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.c(torch.relu(self.b(torch.relu(self.a(x)))))
        return torch.relu(y + (x if self.skip is None else self.skip(x)))


class ResNetOps(nn.Module):
    def __init__(self, blocks=(3, 4, 6, 3), classes: int = 1000):
        super().__init__()
        self.stem = conv_norm(3, 64, 7, 2)
        self.pool = nn.MaxPool2d(3, 2, 1)
        layers, c_in = [], 64
        for i, count in enumerate(blocks):
            width = 64 * 2**i
            for j in range(count):
                layers.append(Bottleneck(c_in, width, 2 if i > 0 and j == 0 else 1))
                c_in = 4 * width
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(c_in, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layers(self.pool(torch.relu(self.stem(x))))
        return self.fc(torch.flatten(x.mean(dim=(2, 3), keepdim=True), 1))


def resnet50() -> nn.Module:
    return ResNetOps()
