"""The joint graph of TAG: op groups and devices as nodes of one heterogeneous graph, and
the network that reads it.

Graph (``joint_graph``; a ``torch_geometric.data.HeteroData``). Node types:

* ``group``: the op groups of a coarsening, features ``learned.features`` group features
  (``GROUP_FEATURES``) plus two flags: decided (its strategy is in the partial
  placement) and current (the group being decided);
* ``device``: the cluster's devices, ``learned.features`` device features.

Edge types (every figure from the cost model; ``log1p`` of ms, MiB or us):

* ``(group, flows, group)``: data flow between groups, both directions, bytes (MiB);
* ``(device, link, device)``: every ordered pair of devices, the latency (us) and the
  ms per MiB of the cost model's route between them (``CostModel.transfer_affine``);
* ``(group, runs_on, device)`` and its reverse ``(device, can_run, group)``: every group
  on every device, the group's forward plus backward ms on that device's type;
* ``(group, placed, device)`` and its reverse ``(device, hosts, group)``: the partial
  placement, a decided group to each device of its replica set (and its parameter
  server), the device's batch fraction (1 for a server).

Network (``JointNet``): input MLPs to ``hidden``, then ``layers`` rounds of
``torch_geometric.nn.HeteroConv`` (``GATConv`` with edge features on every edge type,
summed per destination type) with residual connections and layer norms. The policy
head scores the candidates of the current group (``learned.decoder.candidates``,
embedded by ``learned.decoder.candidate_embeddings``) as ``MLP(group ‖ candidate)``;
the value head reads the mean group and mean device embeddings and predicts the log
of the iteration time the search will reach from this state, relative to the best
data-parallel baseline (lower is better).

Sizes: G groups, D devices: O(G x D + D^2 + edges) edges, parameters independent of
G and D. Same inputs give bit-identical tensors.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch_geometric.data import HeteroData
from torch_geometric.nn import GATConv, HeteroConv

from ..learned.decoder import SUBSET_PROP, Candidate, candidate_embeddings
from ..learned.features import DEVICE_FEATURES, GROUP_FEATURES, GroupGraph

GROUP_INPUT = GROUP_FEATURES + 2
EDGE_DIMS = {("group", "flows", "group"): 1, ("device", "link", "device"): 2,
             ("group", "runs_on", "device"): 1, ("device", "can_run", "group"): 1,
             ("group", "placed", "device"): 1, ("device", "hosts", "group"): 1}


class JointStatic:
    """The parts of the joint graph that do not change during a search, kept as tensors so
    that each state costs only its placement edges."""

    def __init__(self, features: GroupGraph, options: Sequence[Candidate]):
        self.features = features
        self.options = list(options)
        groups, devices = features.group_device_ms.shape
        gi = torch.arange(groups).repeat_interleave(devices)
        di = torch.arange(devices).repeat(groups)
        self.runs_on = torch.stack([gi, di])
        self.runs_attr = features.group_device_ms.reshape(-1, 1)
        pairs = [(a, b) for a in range(devices) for b in range(devices) if a != b]
        self.link = torch.tensor(pairs, dtype=torch.long).t().reshape(2, -1)
        self.link_attr = (features.device_pair[self.link[0], self.link[1]] if pairs
                          else torch.zeros((0, 2)))


def joint_graph(static: JointStatic, decided: Sequence[int | None], current: int) -> HeteroData:
    """The joint graph of a partial placement: ``decided[g]`` is group ``g``'s candidate
    index (into ``static.options``) or None; ``current`` the group being decided (-1:
    none)."""
    f = static.features
    groups = f.x.shape[0]
    flags = torch.zeros((groups, 2))
    src, dst, frac = [], [], []
    for g, pick in enumerate(decided):
        if pick is None:
            continue
        flags[g, 0] = 1.0
        c = static.options[pick]
        for m in c.members:
            src.append(g)
            dst.append(m)
            frac.append(1.0 / len(c.members))
        if c.server >= 0:
            src.append(g)
            dst.append(c.server)
            frac.append(1.0)
    if current >= 0:
        flags[current, 1] = 1.0
    data = HeteroData()
    data["group"].x = torch.cat([f.x, flags], dim=1)
    data["device"].x = f.device_x
    data["group", "flows", "group"].edge_index = f.edge_index
    data["group", "flows", "group"].edge_attr = f.edge_attr
    data["device", "link", "device"].edge_index = static.link
    data["device", "link", "device"].edge_attr = static.link_attr
    data["group", "runs_on", "device"].edge_index = static.runs_on
    data["group", "runs_on", "device"].edge_attr = static.runs_attr
    data["device", "can_run", "group"].edge_index = static.runs_on.flip(0)
    data["device", "can_run", "group"].edge_attr = static.runs_attr
    placed = torch.tensor([src, dst], dtype=torch.long).reshape(2, -1)
    attr = torch.tensor(frac, dtype=torch.float32).reshape(-1, 1)
    data["group", "placed", "device"].edge_index = placed
    data["group", "placed", "device"].edge_attr = attr
    data["device", "hosts", "group"].edge_index = placed.flip(0)
    data["device", "hosts", "group"].edge_attr = attr
    return data


class JointNet(nn.Module):
    """Encoder, policy head and value head over the joint graph (module docstring).

    Parameters
    ----------
    hidden : int
        Embedding width.
    layers : int
        Heterogeneous convolution rounds.
    heads : int
        Attention heads per convolution (``hidden`` divisible by it).
    """

    def __init__(self, *, hidden: int = 48, layers: int = 2, heads: int = 2):
        super().__init__()
        if hidden % heads:
            raise ValueError(f"hidden ({hidden}) must be divisible by heads ({heads})")
        self.group_in = nn.Sequential(nn.Linear(GROUP_INPUT, hidden), nn.ReLU(), nn.Linear(hidden, hidden))
        self.device_in = nn.Sequential(nn.Linear(DEVICE_FEATURES, hidden), nn.ReLU(),
                                       nn.Linear(hidden, hidden))
        self.convs = nn.ModuleList(HeteroConv({
            edge: GATConv((hidden, hidden), hidden // heads, heads=heads, edge_dim=dim,
                          add_self_loops=False)
            for edge, dim in EDGE_DIMS.items()}, aggr="sum") for _ in range(layers))
        self.norms = nn.ModuleList(nn.ModuleDict({"group": nn.LayerNorm(hidden),
                                                  "device": nn.LayerNorm(hidden)})
                                   for _ in range(layers))
        self.kind = nn.Embedding(SUBSET_PROP + 1, hidden)
        self.score = nn.Sequential(nn.Linear(2 * hidden, hidden), nn.ReLU(), nn.Linear(hidden, 1))
        self.value = nn.Sequential(nn.Linear(2 * hidden, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def embed(self, data: HeteroData) -> dict[str, torch.Tensor]:
        """Group and device embeddings of a joint graph."""
        h = {"group": self.group_in(data["group"].x), "device": self.device_in(data["device"].x)}
        edges = {e: data[e].edge_index for e in EDGE_DIMS}
        attrs = {e: data[e].edge_attr for e in EDGE_DIMS}
        for conv, norms in zip(self.convs, self.norms):
            out = conv(h, edges, edge_attr_dict=attrs)
            h = {k: norms[k](v + torch.relu(out[k])) if k in out else v for k, v in h.items()}
        return h

    def forward(self, data: HeteroData, current: int, options: Sequence[Candidate]
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(logits [candidates], value [])`` for deciding group ``current``."""
        h = self.embed(data)
        cands = candidate_embeddings(h["device"], list(options), self.kind)
        group = h["group"][current].expand(cands.shape[0], -1)
        logits = self.score(torch.cat([group, cands], dim=1)).squeeze(-1)
        pooled = torch.cat([h["group"].mean(dim=0), h["device"].mean(dim=0)])
        return logits, self.value(pooled).squeeze(-1)
