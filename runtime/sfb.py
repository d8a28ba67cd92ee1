"""Sufficient-factor broadcasting at run time: exact weight gradients of ``nn.Linear`` layers.

For ``y = x W^T + b`` over the rows of a step (every sample, every token), the
weight gradient is ``dW = dy^T x`` and the bias gradient ``db = sum_rows dy``,
with ``x`` the layer's input and ``dy`` the gradient of the (share-weighted) loss
with respect to its output. Summed over the replicas of a group, these are sums
over the union of their rows. So instead of all-reducing ``dW`` and ``db``
(``out x in + out`` values), each replica all-gathers its factors ``[x | dy]``
(``rows x (in + out)`` values) and rebuilds both sums from the gathered rows,
concatenated in rank order: every replica ends with the same gradient, bit for
bit, equal to the AllReduce's up to floating-point summation order.

Which layers: in every group whose plan says ``compression: sfb`` (synchronised
by AllReduce over two or more devices), each op traced as a call of an
``nn.Linear`` whose parameters belong to that module alone (a tied weight is also
used elsewhere, so its gradient is not a sum of this layer's factors: it stays on
AllReduce). The simulator switches only the layers where the exchange pays
(``planners.sfb.sfb_ops``); the runtime switches every such layer of the group.

How: a forward hook keeps each call's input rows and hooks its output to keep
the output gradient rows; ``reduce`` (after the backward pass) all-gathers the
row counts of every layer once, then per layer the rows padded to the largest
count, and writes ``dW`` and ``db`` into the parameters' ``.grad``. Hooks record
only between ``zero_grad`` and ``reduce`` of a step.

Bytes sent (per rank and step, the ring algorithms gloo and NCCL run): an
all-gather of ``c`` bytes per rank sends ``(n - 1) c``; an AllReduce of ``S``
bytes sends ``2 (n - 1) / n x S``. ``GradientSync`` counts its AllReduces with the
same formula, so the run report compares the two (``sent_bytes`` of each rank).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import torch
import torch.distributed as dist

from dl_nfv.artifacts import Compression, Plan, SyncMethod

from .comm import Comm


def allgather_sent_bytes(nbytes_per_rank: float, ranks: int) -> int:
    """Bytes one rank sends in a ring all-gather of ``nbytes_per_rank`` from every rank."""
    return int((ranks - 1) * nbytes_per_rank) if ranks > 1 else 0


def allreduce_sent_bytes(nbytes: float, ranks: int) -> int:
    """Bytes one rank sends in a ring AllReduce of ``nbytes``: ``2 (n - 1) / n x S``."""
    return int(round(2 * (ranks - 1) * nbytes / ranks)) if ranks > 1 else 0


class _Layer:
    """One ``nn.Linear`` under SFB: the factors of the current step's calls."""

    def __init__(self, module: torch.nn.Linear, sync: SfbSync):
        self.module = module
        self.inputs: list[torch.Tensor] = []
        self.grads: dict[int, torch.Tensor] = {}
        self.hook = module.register_forward_hook(
            lambda mod, args, out: sync._forward(self, args, out))


class SfbSync:
    """Sum the gradients of ``layers`` (``nn.Linear``) over ``ranks`` by sufficient factors.

    The same interface as ``GradientSync`` (``params``, ``owned_params``,
    ``zero_grad``, ``reduce``, ``pull``, ``close``, ``sent_bytes``).
    """

    def __init__(self, layers: Sequence[torch.nn.Linear], *, ranks: Sequence[int], rank: int,
                 comm: Comm, group=None):
        self.ranks = tuple(ranks)
        self.rank = rank
        self.comm = comm
        self.group = group
        self.sent_bytes = 0
        self._recording = False
        self._layers = [_Layer(m, self) for m in layers]
        for p in self.params:
            p.grad = torch.zeros_like(p)

    @property
    def params(self) -> list[torch.nn.Parameter]:
        return [p for layer in self._layers for p in layer.module.parameters()]

    def owned_params(self) -> list[torch.nn.Parameter]:
        return self.params

    def close(self) -> None:
        for layer in self._layers:
            layer.hook.remove()

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad.zero_()
        for layer in self._layers:
            layer.inputs, layer.grads = [], {}
        self.sent_bytes = 0
        self._recording = True

    def _forward(self, layer: _Layer, args: tuple, out: torch.Tensor) -> None:
        if not self._recording or not torch.is_grad_enabled() or not out.requires_grad:
            return
        k = len(layer.inputs)
        layer.inputs.append(args[0].detach().reshape(-1, layer.module.in_features))

        def keep(grad: torch.Tensor, k: int = k) -> None:
            layer.grads[k] = grad.detach().reshape(-1, layer.module.out_features)

        out.register_hook(keep)

    def _factors(self, layer: _Layer) -> torch.Tensor:
        """This rank's ``[x | dy]`` rows of every call of ``layer`` in the step."""
        m = layer.module
        missing = [k for k in range(len(layer.inputs)) if k not in layer.grads]
        if missing:
            raise RuntimeError(f"sfb: a call of a Linear({m.in_features}, {m.out_features}) got "
                               f"no output gradient in the backward pass")
        if not layer.inputs:
            w = m.weight
            return torch.zeros((0, m.in_features + m.out_features), dtype=w.dtype, device=w.device)
        return torch.cat([torch.cat((x, layer.grads[k].to(x.dtype)), dim=1)
                          for k, x in enumerate(layer.inputs)])

    def reduce(self) -> None:
        """All-gather every layer's factors and write the summed gradients; blocks."""
        self._recording = False
        n = len(self.ranks)
        factors = [self._factors(layer) for layer in self._layers]
        device = self.params[0].device
        counts = torch.tensor([f.shape[0] for f in factors], dtype=torch.int64, device=device)
        gathered_counts = [torch.empty_like(counts) for _ in range(n)]
        self.comm.wait(dist.all_gather(gathered_counts, counts, group=self.group, async_op=True))
        self.sent_bytes += allgather_sent_bytes(counts.numel() * counts.element_size(), n)
        rows = torch.stack(gathered_counts).tolist()  # [rank][layer]
        works = []
        for i, f in enumerate(factors):
            most = max(r[i] for r in rows)
            padded = f.new_zeros((most, f.shape[1]))
            padded[:f.shape[0]] = f
            parts = [torch.empty_like(padded) for _ in range(n)]
            works.append((dist.all_gather(parts, padded, group=self.group, async_op=True), parts))
            self.sent_bytes += allgather_sent_bytes(padded.numel() * padded.element_size(), n)
        for i, (work, parts) in enumerate(works):
            self.comm.wait(work)
            layer = self._layers[i]
            m = layer.module
            rows_all = torch.cat([part[:rows[r][i]] for r, part in enumerate(parts)])
            x, dy = rows_all[:, :m.in_features], rows_all[:, m.in_features:]
            m.weight.grad.copy_(dy.t() @ x)
            if m.bias is not None:
                m.bias.grad.copy_(dy.sum(dim=0))
            layer.inputs, layer.grads = [], {}

    def pull(self) -> None:
        """Nothing to pull: every replica updates its own copy from the same sum."""


def sfb_layers(plan: Plan, capture, module: torch.nn.Module, holders: dict[int, set[str]]
               ) -> tuple[dict[tuple[str, ...], list[torch.nn.Linear]], list[str]]:
    """Devices -> the ``nn.Linear`` modules their groups run under SFB (module docstring),
    and the ids of the groups with at least one such layer.

    ``holders`` maps a parameter (by id) to the devices that hold it; a layer is switched
    only when they are exactly its group's devices.
    """
    uses: dict[int, int] = defaultdict(int)
    for sub in module.modules():
        for p in sub.parameters(recurse=False):
            uses[id(p)] += 1
    gm = capture.graph_module
    out: dict[tuple[str, ...], list[torch.nn.Linear]] = defaultdict(list)
    seen: set[int] = set()
    switched: list[str] = []
    for g in plan.groups:
        if (g.compression is not Compression.SFB or g.sync is not SyncMethod.ALLREDUCE
                or len(g.devices) < 2):
            continue
        for op in g.ops:
            for node in capture.nodes(op) if op in capture.nodes_of else ():
                if node.op != "call_module":
                    continue
                sub = gm.get_submodule(str(node.target))
                if not isinstance(sub, torch.nn.Linear) or id(sub) in seen:
                    continue
                params = list(sub.parameters())
                if any(uses[id(p)] != 1 or holders.get(id(p)) != set(g.devices) or
                       not p.requires_grad for p in params):
                    continue
                seen.add(id(sub))
                out[tuple(sorted(g.devices))].append(sub)
                switched += [] if g.id in switched else [g.id]
    return dict(out), switched


def sfb_syncs(plan: Plan, capture, module: torch.nn.Module, holders: dict[int, set[str]], *,
              rank: int, rank_of: dict[str, int], world_size: int, comm: Comm
              ) -> tuple[set[int], list[SfbSync], list[str]]:
    """The parameters (by id) synchronised by SFB, this rank's ``SfbSync`` objects, and the
    groups with a layer under SFB.

    Every rank calls this, in the same place: it creates a process group per device set
    that is not the whole world, in the same order everywhere (torch.distributed's rule).
    """
    layers, switched = sfb_layers(plan, capture, module, holders)
    ids = {id(p) for mods in layers.values() for m in mods for p in m.parameters()}
    everyone = tuple(range(world_size))
    syncs = []
    for devices in sorted(layers, key=lambda ds: sorted(rank_of[d] for d in ds)):
        ranks = tuple(sorted(rank_of[d] for d in devices))
        group = dist.new_group(list(ranks)) if ranks != everyone else None
        if rank in ranks:
            syncs.append(SfbSync(layers[devices], ranks=ranks, rank=rank, comm=comm, group=group))
    return ids, syncs, switched


def sent_bytes(syncs: Sequence) -> dict[str, int]:
    """Bytes this rank sent in its last step to synchronise gradients, by method."""
    out: dict[str, int] = {}
    for s in syncs:
        if isinstance(s, SfbSync):
            key = "sfb"
        elif getattr(s, "method", None) is SyncMethod.ALLREDUCE:
            key = "allreduce"
        else:
            continue  # parameter servers and tie exchanges are not counted
        out[key] = out.get(key, 0) + int(s.sent_bytes)
    return out
