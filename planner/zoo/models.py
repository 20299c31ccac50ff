"""Small convolutional and dense models written in the project (no downloads) for tracing, tests
and benchmarks: MLP, ResNet, U-Net, DenseNet, a ResNet-50-like CNN. The sequence models are
planner.zoo.token_models."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class MLP(nn.Module):
    def __init__(
        self, in_features: int = 256, hidden: int = 512, depth: int = 4, classes: int = 10
    ):
        super().__init__()
        layers: list[nn.Module] = []
        width = in_features
        for _ in range(depth):
            layers += [nn.Linear(width, hidden), nn.GELU(), nn.Dropout(0.1)]
            width = hidden
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.head(self.body(x)), target)


class BasicBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(
                nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class ResNet(nn.Module):
    """ResNet-style CNN: a stem, stages of basic blocks, global pooling, a classifier."""

    def __init__(self, widths: tuple[int, ...] = (16, 32, 64), blocks: int = 2, classes: int = 10):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, widths[0], 3, 1, 1, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU()
        )
        layers: list[nn.Module] = []
        c = widths[0]
        for i, w in enumerate(widths):
            for b in range(blocks):
                layers.append(BasicBlock(c, w, stride=2 if (i > 0 and b == 0) else 1))
                c = w
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(c, classes)

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        h = self.layers(self.stem(x))
        return F.cross_entropy(self.fc(h.mean(dim=(2, 3))), target)


class DoubleConv(nn.Sequential):
    def __init__(self, c_in: int, c_out: int):
        super().__init__(
            nn.Conv2d(c_in, c_out, 3, padding=1),
            nn.GroupNorm(4, c_out),
            nn.SiLU(),
            nn.Conv2d(c_out, c_out, 3, padding=1),
            nn.GroupNorm(4, c_out),
            nn.SiLU(),
        )


class UNet(nn.Module):
    """U-Net: an encoder, a decoder, skip connections by concatenation."""

    def __init__(self, channels: int = 3, base: int = 16, depth: int = 3, classes: int = 2):
        super().__init__()
        widths = [base * 2**i for i in range(depth + 1)]
        self.down = nn.ModuleList()
        c = channels
        for w in widths[:-1]:
            self.down.append(DoubleConv(c, w))
            c = w
        self.bottom = DoubleConv(c, widths[-1])
        self.up = nn.ModuleList()
        self.dec = nn.ModuleList()
        for w in reversed(widths[:-1]):
            self.up.append(nn.ConvTranspose2d(w * 2, w, 2, stride=2))
            self.dec.append(DoubleConv(w * 2, w))
        self.out = nn.Conv2d(widths[0], classes, 1)

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        skips = []
        for block in self.down:
            x = block(x)
            skips.append(x)
            x = F.max_pool2d(x, 2)
        x = self.bottom(x)
        for up, dec, skip in zip(self.up, self.dec, reversed(skips), strict=True):
            x = dec(torch.cat([up(x), skip], dim=1))
        return F.cross_entropy(self.out(x), target)


class DenseLayer(nn.Module):
    """BN-ReLU-Conv1x1 (bottleneck), BN-ReLU-dropout-Conv3x3 on the concatenation of its inputs.

    The dropout call is unconditional, as many implementations write it: with p = 0 it is the
    identity in eager (and a clone in the joint graph)."""

    def __init__(self, c_in: int, growth: int, bottleneck: int = 4, dropout: float = 0.0):
        super().__init__()
        self.bn1 = nn.BatchNorm2d(c_in)
        self.conv1 = nn.Conv2d(c_in, bottleneck * growth, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(bottleneck * growth)
        self.conv2 = nn.Conv2d(bottleneck * growth, growth, 3, padding=1, bias=False)
        self.dropout = dropout

    def forward(self, features: list[torch.Tensor]) -> torch.Tensor:
        x = torch.cat(features, dim=1)
        x = self.conv1(F.relu(self.bn1(x)))
        x = F.dropout(F.relu(self.bn2(x)), self.dropout, self.training)
        return self.conv2(x)


class DenseBlock(nn.Module):
    def __init__(self, c_in: int, layers: int, growth: int, dropout: float = 0.0):
        super().__init__()
        self.layers = nn.ModuleList(
            DenseLayer(c_in + i * growth, growth, dropout=dropout) for i in range(layers)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = [x]
        for layer in self.layers:
            features.append(layer(features))
        return torch.cat(features, dim=1)


class Transition(nn.Sequential):
    def __init__(self, c_in: int, c_out: int):
        super().__init__(
            nn.BatchNorm2d(c_in), nn.ReLU(), nn.Conv2d(c_in, c_out, 1, bias=False),
            nn.AvgPool2d(2),
        )


class DenseNet(nn.Module):
    """DenseNet-like CNN: each layer of a dense block reads the concatenation of all earlier
    feature maps of the block; transitions halve channels and resolution."""

    def __init__(self, growth: int = 12, blocks: tuple[int, ...] = (4, 4, 4), stem: int = 24,
                 dropout: float = 0.0, classes: int = 10):
        super().__init__()
        self.stem = nn.Conv2d(3, stem, 3, padding=1, bias=False)
        stages: list[nn.Module] = []
        c = stem
        for i, n in enumerate(blocks):
            stages.append(DenseBlock(c, n, growth, dropout))
            c += n * growth
            if i < len(blocks) - 1:
                stages.append(Transition(c, c // 2))
                c //= 2
        self.features = nn.Sequential(*stages)
        self.bn = nn.BatchNorm2d(c)
        self.fc = nn.Linear(c, classes)

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.bn(self.features(self.stem(x))))
        return F.cross_entropy(self.fc(h.mean(dim=(2, 3))), target)


class Bottleneck(nn.Module):
    """ResNet-50's bottleneck: 1×1 reduce, 3×3, 1×1 expand (×4), BatchNorm, ReLU, residual
    (projected when the shape changes)."""

    expansion = 4

    def __init__(self, cin: int, width: int, stride: int = 1):
        super().__init__()
        cout = width * self.expansion
        self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, cout, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(cout)
        self.down = (
            nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))
            if stride != 1 or cin != cout else nn.Identity()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)))
        return F.relu(self.bn3(self.conv3(y)) + self.down(x))


class ResNet50Like(nn.Module):
    """ResNet-50's layout (stages of 3, 4, 6, 3 bottlenecks) at a small base width."""

    def __init__(self, base: int = 8, stages: tuple[int, ...] = (3, 4, 6, 3), classes: int = 10):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, base, 3, padding=1, bias=False), nn.BatchNorm2d(base), nn.ReLU()
        )
        blocks: list[nn.Module] = []
        cin = base
        for i, count in enumerate(stages):
            width = base * 2**i
            for j in range(count):
                blocks.append(Bottleneck(cin, width, stride=2 if i and j == 0 else 1))
                cin = width * Bottleneck.expansion
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.stem(x))
        return F.cross_entropy(self.fc(x.mean(dim=(2, 3))), target)


def resnet50_like(batch_size: int = 4, image: int = 32, base: int = 8
                  ) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """(model, inputs) of `ResNet50Like` at a small width."""
    torch.manual_seed(0)
    model = ResNet50Like(base)
    return model, (torch.randn(batch_size, 3, image, image), torch.randint(0, 10, (batch_size,)))
