"""Gradient synchronisation: bucketed AllReduce or parameter servers, as the plan says.

A ``GradientSync`` owns the gradients of a set of parameters held by a set of
ranks (the replicas of a group, or the stages that share a tied weight). Each
rank's loss is already weighted by its share of the global batch, so the
gradient every rank must end with is the **sum** of the ranks' gradients.

Buckets follow the plan (``fusion.gradient_buckets``: op ids whose parameters
are reduced together, in launch order); parameters of ops in no bucket form one
last bucket. Each bucket keeps its gradients in one flat buffer, and every
parameter's ``.grad`` is a view into it, so autograd accumulates straight into
the buffer (as DDP's ``gradient_as_bucket_view``).

* **AllReduce**: with ``overlap``, a bucket's all-reduce starts as soon as the
  backward pass has produced all its gradients (post-accumulate-grad hooks),
  strictly in bucket order so every rank issues the same sequence; the rest
  start when the backward pass ends. Every rank then applies the optimizer to
  every parameter.
* **Parameter server**: parameters are sharded over the server ranks (greedy,
  balanced by bytes); within each bucket a server's parameters are contiguous.
  Pushing a bucket sends each worker's slice point-to-point to its server,
  which adds the slices it receives to its own (a PS's push; gloo's ``reduce``
  collective was measured 4x slower than one transfer on loopback). Each
  server applies the optimizer to its shard only, then broadcasts the new
  values (pull). Non-server ranks hold no optimizer state.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from dl_nfv.artifacts import SyncMethod

from .comm import Comm
from .sfb import allreduce_sent_bytes

PS_TAG = 1 << 30  # tags of parameter-server pushes, apart from the units' transfers


@dataclass(eq=False)
class _Bucket:
    index: int
    params: list[torch.nn.Parameter]
    grad: torch.Tensor  # flat gradient buffer; each param's .grad is a view into it
    value: torch.Tensor | None = None  # PS: flat parameter buffer (params are views into it)
    parts: list[tuple[int, int, int]] = field(default_factory=list)  # PS: (server, lo, hi)
    ready: int = 0
    launched: bool = False
    works: list = field(default_factory=list)
    received: list = field(default_factory=list)  # PS server: (lo, hi, buffer) to add
    buffers: dict = field(default_factory=dict)  # PS server: (lo, src) -> receive buffer


class GradientSync:
    """Sum the gradients of ``buckets`` over ``ranks`` by AllReduce or through PS servers.

    Parameters
    ----------
    buckets : parameter lists in launch order (every parameter in exactly one).
    ranks : global ranks holding these parameters (this rank among them).
    method : ``allreduce``, ``ps`` or ``none`` (a single rank: nothing to send).
    servers : global ranks of the parameter servers (``ps`` only).
    group : the process group of ``ranks`` (``None``: the world).
    overlap : start all-reduces from backward hooks as buckets fill.
    accumulations : parameter (by id) -> how many backward passes of a step
        accumulate into it on this rank (microbatches x units using it; default 1);
        a bucket is ready once every parameter has had all of them.
    """

    def __init__(self, buckets: Sequence[Sequence[torch.nn.Parameter]], *, ranks: Sequence[int],
                 rank: int, comm: Comm, method: SyncMethod = SyncMethod.ALLREDUCE,
                 servers: Sequence[int] = (), group=None, overlap: bool = True,
                 accumulations: dict[int, int] | None = None):
        self.rank = rank
        self.ranks = tuple(ranks)
        self.comm = comm
        self.group = group
        self.method = method if len(self.ranks) > 1 else SyncMethod.NONE
        self.servers = tuple(servers)
        if self.method is SyncMethod.PS and not self.servers:
            raise ValueError("a parameter-server sync needs at least one server rank")
        self.overlap = overlap and self.method is SyncMethod.ALLREDUCE
        owner = _shard(buckets, self.servers) if self.method is SyncMethod.PS else {}
        self.owner = owner
        self._buckets = [self._make_bucket(i, list(b), owner)
                         for i, b in enumerate(b for b in buckets if b)]
        self._next = 0
        self._hooks = []
        self._expected = {id(p): (accumulations or {}).get(id(p), 1) for p in self.params}
        self._seen: dict[int, int] = {}
        self.sent_bytes = 0  # this step's AllReduce bytes sent by this rank (ring algorithm)
        if self.overlap:
            for index, bucket in enumerate(self._buckets):
                for p in bucket.params:
                    self._hooks.append(p.register_post_accumulate_grad_hook(
                        lambda p, index=index: self._grad_ready(index, p)))

    # ------------------------------------------------------------------ set-up
    def _make_bucket(self, index: int, params: list[torch.nn.Parameter],
                     owner: dict[int, int]) -> _Bucket:
        if owner:  # PS: group each server's parameters together inside the bucket
            order = {s: i for i, s in enumerate(self.servers)}
            params = sorted(params, key=lambda p: order[owner[id(p)]])
        numel = sum(p.numel() for p in params)
        ref = params[0]
        grad = torch.zeros(numel, dtype=ref.dtype, device=ref.device)
        bucket = _Bucket(index=index, params=params, grad=grad)
        offset = 0
        for p in params:
            p.grad = grad[offset:offset + p.numel()].view_as(p)
            offset += p.numel()
        if owner:
            value = torch.empty(numel, dtype=ref.dtype, device=ref.device)
            offset = 0
            start, current = 0, None
            for p in params:
                n = p.numel()
                value[offset:offset + n].copy_(p.detach().reshape(-1))
                p.data = value[offset:offset + n].view_as(p)
                server = owner[id(p)]
                if server != current:
                    if current is not None:
                        bucket.parts.append((current, start, offset))
                    current, start = server, offset
                offset += n
            bucket.parts.append((current, start, offset))
            bucket.value = value
        return bucket

    @property
    def params(self) -> list[torch.nn.Parameter]:
        return [p for b in self._buckets for p in b.params]

    def owned_params(self) -> list[torch.nn.Parameter]:
        """The parameters this rank's optimizer updates (PS: its shard; else all)."""
        if self.method is SyncMethod.PS:
            return [p for p in self.params if self.owner[id(p)] == self.rank]
        return self.params

    def close(self) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks.clear()

    # -------------------------------------------------------------------- steps
    def zero_grad(self) -> None:
        for b in self._buckets:
            b.grad.zero_()
            b.ready = 0
            b.launched = False
            b.works = []
        self._next = 0
        self._seen.clear()
        self.sent_bytes = 0

    def _grad_ready(self, index: int, param: torch.nn.Parameter) -> None:
        key = id(param)
        self._seen[key] = self._seen.get(key, 0) + 1
        if self._seen[key] != self._expected[key]:
            return
        bucket = self._buckets[index]
        bucket.ready += 1
        if bucket.ready == len(bucket.params):
            while self._next < len(self._buckets) and (
                    self._buckets[self._next].ready >= len(self._buckets[self._next].params)):
                self._launch(self._buckets[self._next])
                self._next += 1

    def _launch(self, bucket: _Bucket) -> None:
        if bucket.launched:
            return
        bucket.launched = True
        if self.method is SyncMethod.ALLREDUCE:
            bucket.works.append(dist.all_reduce(bucket.grad, group=self.group, async_op=True))
            self.sent_bytes += allreduce_sent_bytes(bucket.grad.numel() * bucket.grad.element_size(),
                                                    len(self.ranks))
        elif self.method is SyncMethod.PS:
            for part, (server, lo, hi) in enumerate(bucket.parts):
                tag = PS_TAG + bucket.index * 256 + part
                if server != self.rank:
                    bucket.works.append(dist.isend(bucket.grad[lo:hi], server, group=self.group,
                                                   tag=tag))
                    continue
                for src in self.ranks:
                    if src == self.rank:
                        continue
                    buf = bucket.buffers.get((lo, src))
                    if buf is None:
                        buf = bucket.buffers[(lo, src)] = torch.empty_like(bucket.grad[lo:hi])
                    bucket.works.append(dist.irecv(buf, src, group=self.group, tag=tag))
                    bucket.received.append((lo, hi, buf))

    def reduce(self) -> None:
        """Finish the gradient exchange of this step (push, for PS); blocks until done."""
        if self.method is SyncMethod.NONE:
            return
        for bucket in self._buckets:
            self._launch(bucket)
        for bucket in self._buckets:
            for work in bucket.works:
                self.comm.wait(work)
            bucket.works = []
            for lo, hi, buf in bucket.received:  # PS server: sum the workers' pushes
                bucket.grad[lo:hi].add_(buf)
            bucket.received = []

    def pull(self) -> None:
        """PS only: broadcast every shard's updated parameters from its server."""
        if self.method is not SyncMethod.PS:
            return
        works = []
        for bucket in self._buckets:
            assert bucket.value is not None
            for server, lo, hi in bucket.parts:
                works.append(dist.broadcast(bucket.value[lo:hi], src=server, group=self.group,
                                            async_op=True))
        for work in works:
            self.comm.wait(work)


def _shard(buckets: Sequence[Sequence[torch.nn.Parameter]], servers: Sequence[int]) -> dict[int, int]:
    """Parameter (by id) -> server rank, greedily balancing bytes; deterministic."""
    load = {s: 0 for s in servers}
    owner: dict[int, int] = {}
    for bucket in buckets:
        for p in bucket:
            server = min(servers, key=lambda s: (load[s], servers.index(s)))
            owner[id(p)] = server
            load[server] += p.numel() * p.element_size()
    return owner


TIE_TAG = 3 << 29  # tags of tie exchanges (4 per tie), apart from transfers and PS pushes


class TieExchange:
    """A tied weight summed by exchange (``TieSync.EXCHANGE``) between two ranks.

    The owner's op is a lookup, so its gradient of the weight is non-zero only in the
    rows of the ids it read; the sharer's is dense. When its step's tasks are done the
    sharer sends its whole gradient to the owner, which has had the receive posted since
    the step began; when the owner's are done, it sends the indices and values of its
    non-zero rows and adds the sharer's gradient into its own, and the sharer adds the
    rows it receives. Both end with the same sum, bitwise (each element is one sum of two
    addends, and adding a zero row changes nothing). On its own communicator (``group``),
    the calls pair up in the order each side issues them: the owner receives the dense
    gradient, then sends the count, rows and values; the sharer the other way round.
    """

    def __init__(self, param: torch.nn.Parameter, *, owner: int, sharer: int, rank: int,
                 comm: Comm, group=None, index: int = 0):
        self.param, self.owner, self.sharer, self.rank = param, owner, sharer, rank
        self.comm, self.group = comm, group
        self.tag = TIE_TAG + 4 * index
        param.grad = torch.zeros_like(param)
        self._dense = torch.empty_like(param) if rank == owner else None
        self._works: list = []

    @property
    def params(self) -> list[torch.nn.Parameter]:
        return [self.param]

    def owned_params(self) -> list[torch.nn.Parameter]:
        return [self.param]

    def close(self) -> None:
        """Nothing to release (no hooks)."""

    def zero_grad(self) -> None:
        self.param.grad.zero_()
        self._works = []
        if self.rank == self.owner:
            self._works.append(dist.irecv(self._dense, self.sharer, group=self.group,
                                          tag=self.tag))

    def reduce(self) -> None:
        """Exchange this step's gradients; blocks until this rank has the sum."""
        grad = self.param.grad
        if self.rank == self.owner:
            rows = grad.reshape(grad.shape[0], -1).ne(0).any(dim=1).nonzero().flatten()
            count = torch.tensor([rows.numel()], dtype=torch.int64, device=grad.device)
            values = grad.index_select(0, rows)
            payload = (count, rows, values) if rows.numel() else (count,)
            sends = [dist.isend(t, self.sharer, group=self.group, tag=self.tag + k)
                     for k, t in enumerate(payload, start=1)]
            for work in self._works:
                self.comm.wait(work)
            grad.add_(self._dense)
            for work in sends:
                self.comm.wait(work)
        else:
            send = dist.isend(grad, self.owner, group=self.group, tag=self.tag)
            count = torch.empty(1, dtype=torch.int64, device=grad.device)
            self.comm.wait(dist.irecv(count, self.owner, group=self.group, tag=self.tag + 1))
            n = int(count.item())
            rows = torch.empty(n, dtype=torch.int64, device=grad.device)
            values = torch.empty((n, *grad.shape[1:]), dtype=grad.dtype, device=grad.device)
            if n:
                self.comm.wait(dist.irecv(rows, self.owner, group=self.group, tag=self.tag + 2))
                self.comm.wait(dist.irecv(values, self.owner, group=self.group,
                                          tag=self.tag + 3))
            self.comm.wait(send)  # the dense gradient has left before the rows are added
            grad.index_add_(0, rows, values)
        self._works = []

    def pull(self) -> None:
        """Nothing to pull: both ranks update their own copy from the same sum."""
