"""A GNN encoder over the op-group graph, conditioned on the cluster's devices.

Model (after HeteroG's graph encoder): each device is embedded by an MLP over its
features (``features.DEVICE_FEATURES``); the cluster's context is the mean device
embedding. Each op group is embedded by an MLP over its features joined with that
context and with a device-attention summary of its time on each device (a softmax
over devices of ``-group_device_ms``: where the group runs fast), then refined by
``layers`` graph-attention convolutions (``torch_geometric.nn.GATConv``, edge feature:
the bytes crossing the edge) over the coarsened graph with residual connections.

Output: group embeddings ``[groups, hidden]`` and device embeddings
``[devices, hidden]``, from which a decoder scores each group's strategy.

Sizes: a graph of G groups and E edges on D devices costs O((G + E) x hidden^2 + G x D)
per forward pass; the parameters do not depend on G, E or D, so one encoder serves
every graph and cluster of the same feature schema.
"""

from __future__ import annotations

import torch
from torch import nn
from torch_geometric.nn import GATConv

from .features import DEVICE_FEATURES, FEATURE_SCHEMA_VERSION, GROUP_FEATURES, GroupGraph


class GroupEncoder(nn.Module):
    """Group and device embeddings of a ``GroupGraph``.

    Parameters
    ----------
    hidden : int
        Embedding width.
    layers : int
        Graph-attention layers.
    heads : int
        Attention heads per layer (``hidden`` must be divisible by it).
    """

    schema_version = FEATURE_SCHEMA_VERSION

    def __init__(self, *, hidden: int = 64, layers: int = 2, heads: int = 4):
        super().__init__()
        if hidden % heads:
            raise ValueError(f"hidden ({hidden}) must be divisible by heads ({heads})")
        self.hidden = hidden
        self.device_mlp = nn.Sequential(nn.Linear(DEVICE_FEATURES, hidden), nn.ReLU(),
                                        nn.Linear(hidden, hidden))
        self.group_mlp = nn.Sequential(nn.Linear(GROUP_FEATURES + 2 * hidden, hidden), nn.ReLU(),
                                       nn.Linear(hidden, hidden))
        self.convs = nn.ModuleList(GATConv(hidden, hidden // heads, heads=heads, edge_dim=1)
                                   for _ in range(layers))
        self.norms = nn.ModuleList(nn.LayerNorm(hidden) for _ in range(layers))

    def forward(self, graph: GroupGraph) -> tuple[torch.Tensor, torch.Tensor]:
        devices = self.device_mlp(graph.device_x)  # [D, H]
        context = devices.mean(dim=0, keepdim=True).expand(graph.x.shape[0], -1)
        fast = torch.softmax(-graph.group_device_ms, dim=1) @ devices  # [G, H]
        h = self.group_mlp(torch.cat([graph.x, context, fast], dim=1))
        for conv, norm in zip(self.convs, self.norms):
            h = norm(h + torch.relu(conv(h, graph.edge_index, graph.edge_attr)))
        return h, devices
