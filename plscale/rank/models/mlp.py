"""A small multilayer perceptron for 28x28 images (MNIST-sized)."""

import torch
from torch import nn


def mlp(hidden: int = 256, layers: int = 2, classes: int = 10, inputs: int = 28 * 28) -> nn.Module:
    blocks, width = [nn.Flatten()], inputs
    for _ in range(layers):
        blocks += [nn.Linear(width, hidden), nn.ReLU()]
        width = hidden
    blocks.append(nn.Linear(width, classes))
    return nn.Sequential(*blocks)


def images_to_tensor(images, device=None) -> torch.Tensor:
    """uint8 (n, 28, 28) -> float (n, 28, 28), scaled and centred like the usual MNIST transform."""
    x = torch.tensor(images, device=device).float().div_(255.0)
    return (x - 0.1307) / 0.3081
