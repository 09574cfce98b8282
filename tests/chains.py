"""Chains of layers that more than one planner test measures."""
import torch
from torch import nn


def shrinking_convnet() -> list:
    """Conv-BN-ReLU layers whose resolution halves twice, then a pooled linear head."""
    torch.manual_seed(0)

    def conv(ci, co, stride=1):
        return nn.Sequential(nn.Conv2d(ci, co, 3, stride=stride, padding=1, bias=False),
                             nn.BatchNorm2d(co), nn.ReLU())
    return [conv(3, 4), conv(4, 4), conv(4, 8, 2), conv(8, 8), conv(8, 16, 2), conv(16, 16),
            nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))]
