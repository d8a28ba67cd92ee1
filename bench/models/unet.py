"""A small U-Net, written as a user outside dl-nfv would write one, for the fidelity bench.

Two down-sampling levels and a bottleneck, each a pair of 3x3 convolutions with batch
norm and ReLU; the way up doubles the resolution with ``ConvTranspose2d`` and
concatenates the skip connection of the same level before its convolutions; a 1x1
convolution gives per-pixel class scores, averaged to one score vector per image (the
loss of a user model is taken on its output as a whole).

    dl-nfv profile model bench/models/unet.py:build --input-shape 8,3,64,64
"""

from __future__ import annotations

import torch
from torch import nn


def _block(c_in: int, c_out: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU(),
        nn.Conv2d(c_out, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU())


class UNet(nn.Module):
    def __init__(self, channels: int = 3, width: int = 16, classes: int = 4):
        super().__init__()
        self.down1 = _block(channels, width)
        self.down2 = _block(width, 2 * width)
        self.bottom = _block(2 * width, 4 * width)
        self.pool = nn.MaxPool2d(2)
        self.up2 = nn.ConvTranspose2d(4 * width, 2 * width, 2, stride=2)
        self.dec2 = _block(4 * width, 2 * width)
        self.up1 = nn.ConvTranspose2d(2 * width, width, 2, stride=2)
        self.dec1 = _block(2 * width, width)
        self.head = nn.Conv2d(width, classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s1 = self.down1(x)
        s2 = self.down2(self.pool(s1))
        h = self.bottom(self.pool(s2))
        h = self.dec2(torch.cat([self.up2(h), s2], dim=1))
        h = self.dec1(torch.cat([self.up1(h), s1], dim=1))
        return self.head(h).mean(dim=(2, 3))


def build() -> nn.Module:
    """U-Net of width 16 for ``--input-shape 8,3,64,64``."""
    return UNet()
