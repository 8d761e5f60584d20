"""The transformer feed-forward block: ``fc2(drop(act(fc1(x))))``, then dropout."""
from typing import Optional

import torch
from mmcv.cnn import build_activation_layer
from torch import nn


class Mlp(nn.Module):
    """Token-wise MLP, ``[B, N, C_in] -> [B, N, C_out]`` with a hidden width ``hidden_features``.

    Parameter names ``fc1``/``fc2`` follow timm and the official PVT/PolaFormer/SOFT checkpoints.
    """

    def __init__(self, in_features: int, hidden_features: Optional[int] = None,
                 out_features: Optional[int] = None, act_cfg: dict = dict(type='GELU'),
                 drop: float = 0.0):
        super().__init__()
        hidden_features = hidden_features or in_features
        out_features = out_features or in_features
        self.fc1 = nn.Linear(in_features, hidden_features)
        self.act = build_activation_layer(act_cfg)
        self.fc2 = nn.Linear(hidden_features, out_features)
        self.drop = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.fc2(self.drop(self.act(self.fc1(x)))))
