"""The digit-images recipe's CNN (recipes/digit_images.py), in a module of its own: a class
of torch's imports torch, which the launcher must not (runner/lazy.py)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class DigitCNN(nn.Module):
    def __init__(self, channels: list[int], hidden: int, dropout: float, classes: int = 10):
        super().__init__()
        c1, c2 = channels
        self.conv1 = nn.Conv2d(1, c1, 3, padding=1)
        self.conv2 = nn.Conv2d(c1, c2, 3, padding=1)
        self.fc1 = nn.Linear(c2 * 4 * 4, hidden)
        self.fc2 = nn.Linear(hidden, classes)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)  # 8x8 -> 4x4
        x = self.dropout(F.relu(self.fc1(x.flatten(1))))
        return self.fc2(x)
