"""The benchmark models in PyTorch, layer for layer those of examples/common/models.cc.

ResNet18Cifar: 3x3 stem (no max-pool), BasicBlocks [2, 2, 2, 2], widths 64..512, 10 classes.
ResNet50: torchvision's layout (7x7/2 stem, 3x3/2 max-pool, Bottlenecks [3, 4, 6, 3] with the
stride on the 3x3 conv, expansion 4), 10 classes. BatchNorm momentum 0.1, eps 1e-5 everywhere.
"""
import torch
from torch import nn
import torch.nn.functional as F


def conv3x3(cin, cout, stride=1):
    return nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)


def shortcut(cin, cout, stride):
    """Identity, or a strided 1x1 conv + BatchNorm where the shape changes."""
    if stride == 1 and cin == cout:
        return nn.Sequential()
    return nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1, self.bn1 = conv3x3(cin, cout, stride), nn.BatchNorm2d(cout)
        self.conv2, self.bn2 = conv3x3(cout, cout), nn.BatchNorm2d(cout)
        self.shortcut = shortcut(cin, cout, stride)

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + self.shortcut(x))


class ResNet18Cifar(nn.Module):
    def __init__(self, width=64, classes=10):
        super().__init__()
        self.stem, self.stem_bn = conv3x3(3, width), nn.BatchNorm2d(width)
        blocks, cin = [], width
        for stage in range(4):
            cout = width << stage
            blocks += [BasicBlock(cin, cout, 1 if stage == 0 else 2), BasicBlock(cout, cout, 1)]
            cin = cout
        self.layers = nn.Sequential(*blocks)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        x = F.relu(self.stem_bn(self.stem(x)))
        x = self.layers(x)
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


class Bottleneck(nn.Module):
    def __init__(self, cin, mid, stride):
        super().__init__()
        cout = mid * 4
        self.conv1, self.bn1 = nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid)
        self.conv2, self.bn2 = conv3x3(mid, mid, stride), nn.BatchNorm2d(mid)
        self.conv3, self.bn3 = nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout)
        self.shortcut = shortcut(cin, cout, stride)

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return F.relu(y + self.shortcut(x))


class ResNet50(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.stem = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.stem_bn = nn.BatchNorm2d(64)
        blocks, cin = [], 64
        for stage, count in enumerate([3, 4, 6, 3]):
            mid = 64 << stage
            for i in range(count):
                blocks.append(Bottleneck(cin, mid, 2 if (i == 0 and stage > 0) else 1))
                cin = mid * 4
        self.layers = nn.Sequential(*blocks)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.stem_bn(self.stem(x))), 3, stride=2, padding=1)
        x = self.layers(x)
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


def make(name):
    return {"resnet18": ResNet18Cifar, "resnet50": ResNet50}[name]()


def parameter_count(model):
    return sum(p.numel() for p in model.parameters())


if __name__ == "__main__":
    for name in ("resnet18", "resnet50"):
        m = make(name)
        print(name, parameter_count(m), tuple(m(torch.randn(2, 3, 32, 32)).shape))
