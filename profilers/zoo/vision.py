"""Image classifiers of the zoo, in plain torch: MLP, VGG-19, ResNet-50/101/152,
Inception-v3 and MobileNet-v2.

Layer names and shapes follow the published models (the torchvision layouts), so
parameter counts match them exactly; ``tests/profilers/test_zoo.py`` checks that.
Blocks are modules with named children (no nested containers inside a block),
so ``--granularity layer`` keeps each bottleneck / inception / inverted-residual
block as one op. Every ``forward`` is free of data-dependent control flow, so
torch.fx can trace it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def _init_conv_bn(module: nn.Module) -> None:
    """Initialisation of the torchvision reference models (kaiming for convs, unit BN)."""
    for m in module.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, (nn.BatchNorm2d, nn.GroupNorm)):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)


# ---------------------------------------------------------------------------- MLP
class MLP(nn.Module):
    """A plain ReLU multi-layer perceptron over flattened inputs."""

    def __init__(self, in_features: int, hidden: tuple[int, ...], num_classes: int):
        super().__init__()
        widths = (in_features, *hidden)
        self.layers = nn.Sequential()
        for i, (a, b) in enumerate(zip(widths, widths[1:])):
            self.layers.add_module(f"fc{i}", nn.Linear(a, b))
            self.layers.add_module(f"relu{i}", nn.ReLU())
        self.head = nn.Linear(widths[-1], num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.layers(x.flatten(1)))


# ---------------------------------------------------------------------------- VGG
VGG19_CFG = (64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M",
             512, 512, 512, 512, "M", 512, 512, 512, 512, "M")


class VGG(nn.Module):
    """VGG (Simonyan & Zisserman 2015), configuration E = VGG-19, without batch norm."""

    def __init__(self, cfg=VGG19_CFG, num_classes: int = 1000, hidden: int = 4096,
                 pool: int = 7, width_div: int = 1):
        super().__init__()
        layers: list[nn.Module] = []
        channels = 3
        for v in cfg:
            if v == "M":
                layers.append(nn.MaxPool2d(kernel_size=2, stride=2))
            else:
                out = max(1, int(v) // width_div)
                layers += [nn.Conv2d(channels, out, kernel_size=3, padding=1), nn.ReLU(inplace=True)]
                channels = out
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d((pool, pool))
        self.classifier = nn.Sequential(
            nn.Linear(channels * pool * pool, hidden), nn.ReLU(inplace=True), nn.Dropout(0.5),
            nn.Linear(hidden, hidden), nn.ReLU(inplace=True), nn.Dropout(0.5),
            nn.Linear(hidden, num_classes),
        )
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0, 0.01)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.avgpool(self.features(x))
        return self.classifier(torch.flatten(x, 1))


# ---------------------------------------------------------------------------- ResNet
class Bottleneck(nn.Module):
    """ResNet v1.5 bottleneck: 1x1 -> 3x3 (stride here) -> 1x1, expansion 4."""

    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1):
        super().__init__()
        out = planes * self.expansion
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or inplanes != out:
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, out, 1, stride=stride, bias=False),
                                            nn.BatchNorm2d(out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return self.relu(y + identity)


class ResNet(nn.Module):
    """ResNet (He et al. 2016) with bottleneck blocks, torchvision layout."""

    def __init__(self, layers: tuple[int, int, int, int], num_classes: int = 1000, width: int = 64):
        super().__init__()
        self.inplanes = width
        self.conv1 = nn.Conv2d(3, width, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        self.layer1 = self._stage(width, layers[0], 1)
        self.layer2 = self._stage(width * 2, layers[1], 2)
        self.layer3 = self._stage(width * 4, layers[2], 2)
        self.layer4 = self._stage(width * 8, layers[3], 2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(width * 8 * Bottleneck.expansion, num_classes)
        del self.inplanes
        _init_conv_bn(self)

    def _stage(self, planes: int, blocks: int, stride: int) -> nn.Sequential:
        stage = [Bottleneck(self.inplanes, planes, stride)]
        self.inplanes = planes * Bottleneck.expansion
        stage += [Bottleneck(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*stage)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


# ---------------------------------------------------------------------------- Inception-v3
class BasicConv2d(nn.Module):
    def __init__(self, cin: int, cout: int, **kwargs):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, bias=False, **kwargs)
        self.bn = nn.BatchNorm2d(cout, eps=0.001)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.bn(self.conv(x)), inplace=True)


class InceptionA(nn.Module):
    def __init__(self, cin: int, pool_features: int, c):
        super().__init__()
        self.branch1x1 = BasicConv2d(cin, c(64), kernel_size=1)
        self.branch5x5_1 = BasicConv2d(cin, c(48), kernel_size=1)
        self.branch5x5_2 = BasicConv2d(c(48), c(64), kernel_size=5, padding=2)
        self.branch3x3dbl_1 = BasicConv2d(cin, c(64), kernel_size=1)
        self.branch3x3dbl_2 = BasicConv2d(c(64), c(96), kernel_size=3, padding=1)
        self.branch3x3dbl_3 = BasicConv2d(c(96), c(96), kernel_size=3, padding=1)
        self.branch_pool = BasicConv2d(cin, pool_features, kernel_size=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b1 = self.branch1x1(x)
        b5 = self.branch5x5_2(self.branch5x5_1(x))
        b3 = self.branch3x3dbl_3(self.branch3x3dbl_2(self.branch3x3dbl_1(x)))
        bp = self.branch_pool(F.avg_pool2d(x, kernel_size=3, stride=1, padding=1))
        return torch.cat([b1, b5, b3, bp], 1)


class InceptionB(nn.Module):
    def __init__(self, cin: int, c):
        super().__init__()
        self.branch3x3 = BasicConv2d(cin, c(384), kernel_size=3, stride=2)
        self.branch3x3dbl_1 = BasicConv2d(cin, c(64), kernel_size=1)
        self.branch3x3dbl_2 = BasicConv2d(c(64), c(96), kernel_size=3, padding=1)
        self.branch3x3dbl_3 = BasicConv2d(c(96), c(96), kernel_size=3, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b3 = self.branch3x3(x)
        bd = self.branch3x3dbl_3(self.branch3x3dbl_2(self.branch3x3dbl_1(x)))
        return torch.cat([b3, bd, F.max_pool2d(x, kernel_size=3, stride=2)], 1)


class InceptionC(nn.Module):
    def __init__(self, cin: int, c7: int, c):
        super().__init__()
        self.branch1x1 = BasicConv2d(cin, c(192), kernel_size=1)
        self.branch7x7_1 = BasicConv2d(cin, c7, kernel_size=1)
        self.branch7x7_2 = BasicConv2d(c7, c7, kernel_size=(1, 7), padding=(0, 3))
        self.branch7x7_3 = BasicConv2d(c7, c(192), kernel_size=(7, 1), padding=(3, 0))
        self.branch7x7dbl_1 = BasicConv2d(cin, c7, kernel_size=1)
        self.branch7x7dbl_2 = BasicConv2d(c7, c7, kernel_size=(7, 1), padding=(3, 0))
        self.branch7x7dbl_3 = BasicConv2d(c7, c7, kernel_size=(1, 7), padding=(0, 3))
        self.branch7x7dbl_4 = BasicConv2d(c7, c7, kernel_size=(7, 1), padding=(3, 0))
        self.branch7x7dbl_5 = BasicConv2d(c7, c(192), kernel_size=(1, 7), padding=(0, 3))
        self.branch_pool = BasicConv2d(cin, c(192), kernel_size=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b1 = self.branch1x1(x)
        b7 = self.branch7x7_3(self.branch7x7_2(self.branch7x7_1(x)))
        bd = self.branch7x7dbl_1(x)
        bd = self.branch7x7dbl_3(self.branch7x7dbl_2(bd))
        bd = self.branch7x7dbl_5(self.branch7x7dbl_4(bd))
        bp = self.branch_pool(F.avg_pool2d(x, kernel_size=3, stride=1, padding=1))
        return torch.cat([b1, b7, bd, bp], 1)


class InceptionD(nn.Module):
    def __init__(self, cin: int, c):
        super().__init__()
        self.branch3x3_1 = BasicConv2d(cin, c(192), kernel_size=1)
        self.branch3x3_2 = BasicConv2d(c(192), c(320), kernel_size=3, stride=2)
        self.branch7x7x3_1 = BasicConv2d(cin, c(192), kernel_size=1)
        self.branch7x7x3_2 = BasicConv2d(c(192), c(192), kernel_size=(1, 7), padding=(0, 3))
        self.branch7x7x3_3 = BasicConv2d(c(192), c(192), kernel_size=(7, 1), padding=(3, 0))
        self.branch7x7x3_4 = BasicConv2d(c(192), c(192), kernel_size=3, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b3 = self.branch3x3_2(self.branch3x3_1(x))
        b7 = self.branch7x7x3_2(self.branch7x7x3_1(x))
        b7 = self.branch7x7x3_4(self.branch7x7x3_3(b7))
        return torch.cat([b3, b7, F.max_pool2d(x, kernel_size=3, stride=2)], 1)


class InceptionE(nn.Module):
    def __init__(self, cin: int, c):
        super().__init__()
        self.branch1x1 = BasicConv2d(cin, c(320), kernel_size=1)
        self.branch3x3_1 = BasicConv2d(cin, c(384), kernel_size=1)
        self.branch3x3_2a = BasicConv2d(c(384), c(384), kernel_size=(1, 3), padding=(0, 1))
        self.branch3x3_2b = BasicConv2d(c(384), c(384), kernel_size=(3, 1), padding=(1, 0))
        self.branch3x3dbl_1 = BasicConv2d(cin, c(448), kernel_size=1)
        self.branch3x3dbl_2 = BasicConv2d(c(448), c(384), kernel_size=3, padding=1)
        self.branch3x3dbl_3a = BasicConv2d(c(384), c(384), kernel_size=(1, 3), padding=(0, 1))
        self.branch3x3dbl_3b = BasicConv2d(c(384), c(384), kernel_size=(3, 1), padding=(1, 0))
        self.branch_pool = BasicConv2d(cin, c(192), kernel_size=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b1 = self.branch1x1(x)
        b3 = self.branch3x3_1(x)
        b3 = torch.cat([self.branch3x3_2a(b3), self.branch3x3_2b(b3)], 1)
        bd = self.branch3x3dbl_2(self.branch3x3dbl_1(x))
        bd = torch.cat([self.branch3x3dbl_3a(bd), self.branch3x3dbl_3b(bd)], 1)
        bp = self.branch_pool(F.avg_pool2d(x, kernel_size=3, stride=1, padding=1))
        return torch.cat([b1, b3, bd, bp], 1)


class InceptionV3(nn.Module):
    """Inception-v3 (Szegedy et al. 2016), torchvision layout without the auxiliary head.

    ``width_div`` divides every channel count (1 = the published model).
    """

    def __init__(self, num_classes: int = 1000, width_div: int = 1):
        super().__init__()

        def c(n: int) -> int:
            return max(1, n // width_div)

        self.Conv2d_1a_3x3 = BasicConv2d(3, c(32), kernel_size=3, stride=2)
        self.Conv2d_2a_3x3 = BasicConv2d(c(32), c(32), kernel_size=3)
        self.Conv2d_2b_3x3 = BasicConv2d(c(32), c(64), kernel_size=3, padding=1)
        self.maxpool1 = nn.MaxPool2d(kernel_size=3, stride=2)
        self.Conv2d_3b_1x1 = BasicConv2d(c(64), c(80), kernel_size=1)
        self.Conv2d_4a_3x3 = BasicConv2d(c(80), c(192), kernel_size=3)
        self.maxpool2 = nn.MaxPool2d(kernel_size=3, stride=2)
        a_out = lambda pool: c(64) + c(64) + c(96) + pool  # noqa: E731
        self.Mixed_5b = InceptionA(c(192), c(32), c)
        self.Mixed_5c = InceptionA(a_out(c(32)), c(64), c)
        self.Mixed_5d = InceptionA(a_out(c(64)), c(64), c)
        cin = a_out(c(64))
        self.Mixed_6a = InceptionB(cin, c)
        cin = c(384) + c(96) + cin
        self.Mixed_6b = InceptionC(cin, c(128), c)
        cin = 4 * c(192)
        self.Mixed_6c = InceptionC(cin, c(160), c)
        self.Mixed_6d = InceptionC(cin, c(160), c)
        self.Mixed_6e = InceptionC(cin, c(192), c)
        self.Mixed_7a = InceptionD(cin, c)
        cin = c(320) + c(192) + cin
        self.Mixed_7b = InceptionE(cin, c)
        cin = c(320) + 4 * c(384) + c(192)
        self.Mixed_7c = InceptionE(cin, c)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.dropout = nn.Dropout(0.5)
        self.fc = nn.Linear(cin, num_classes)
        for m in self.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                nn.init.trunc_normal_(m.weight, mean=0.0, std=0.1, a=-2, b=2)
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.Conv2d_2b_3x3(self.Conv2d_2a_3x3(self.Conv2d_1a_3x3(x)))
        x = self.Conv2d_4a_3x3(self.Conv2d_3b_1x1(self.maxpool1(x)))
        x = self.maxpool2(x)
        x = self.Mixed_5d(self.Mixed_5c(self.Mixed_5b(x)))
        x = self.Mixed_6e(self.Mixed_6d(self.Mixed_6c(self.Mixed_6b(self.Mixed_6a(x)))))
        x = self.Mixed_7c(self.Mixed_7b(self.Mixed_7a(x)))
        x = self.dropout(self.avgpool(x))
        return self.fc(torch.flatten(x, 1))


# ---------------------------------------------------------------------------- MobileNet-v2
class ConvBNReLU6(nn.Module):
    def __init__(self, cin: int, cout: int, kernel: int = 3, stride: int = 1, groups: int = 1):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False)
        self.bn = nn.BatchNorm2d(cout)
        self.act = nn.ReLU6(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.bn(self.conv(x)))


class InvertedResidual(nn.Module):
    """MobileNet-v2 block: 1x1 expand, 3x3 depthwise, 1x1 linear projection, residual."""

    def __init__(self, cin: int, cout: int, stride: int, expand_ratio: int):
        super().__init__()
        hidden = int(round(cin * expand_ratio))
        self.use_residual = stride == 1 and cin == cout
        self.expand = ConvBNReLU6(cin, hidden, kernel=1) if expand_ratio != 1 else None
        self.depthwise = ConvBNReLU6(hidden, hidden, stride=stride, groups=hidden)
        self.project = nn.Conv2d(hidden, cout, 1, bias=False)
        self.project_bn = nn.BatchNorm2d(cout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x if self.expand is None else self.expand(x)
        y = self.project_bn(self.project(self.depthwise(y)))
        return x + y if self.use_residual else y


def _make_divisible(v: float, divisor: int = 8) -> int:
    new_v = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return new_v + divisor if new_v < 0.9 * v else new_v


MOBILENET_V2_SETTINGS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                         (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1))


class MobileNetV2(nn.Module):
    """MobileNet-v2 (Sandler et al. 2018), torchvision layout; ``width_mult`` scales channels."""

    def __init__(self, num_classes: int = 1000, width_mult: float = 1.0):
        super().__init__()
        cin = _make_divisible(32 * width_mult)
        last = _make_divisible(1280 * max(1.0, width_mult))
        blocks: list[nn.Module] = [ConvBNReLU6(3, cin, stride=2)]
        for t, c, n, s in MOBILENET_V2_SETTINGS:
            cout = _make_divisible(c * width_mult)
            for i in range(n):
                blocks.append(InvertedResidual(cin, cout, s if i == 0 else 1, t))
                cin = cout
        blocks.append(ConvBNReLU6(cin, last, kernel=1))
        self.features = nn.Sequential(*blocks)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.dropout = nn.Dropout(0.2)
        self.classifier = nn.Linear(last, num_classes)
        _init_conv_bn(self)
        nn.init.normal_(self.classifier.weight, 0, 0.01)
        nn.init.zeros_(self.classifier.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.flatten(self.avgpool(self.features(x)), 1)
        return self.classifier(self.dropout(x))

