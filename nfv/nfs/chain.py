"""An NF chain: the NFs of an ``nf-config`` in order, run per message (CPU) or per batch (GPU).

A message goes through the NFs in order; an NF that drops it (the firewall)
stops it, and later NFs do not see it. The CPU path loops over a block of
messages with plain per-flow logic; the GPU path runs each NF's batched kernel
over a whole share, passing the mask of messages still alive down the chain.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

import numpy as np

from dl_nfv.artifacts.errors import UnknownName

from .base import FlowTable, GpuBatch, Outputs
from .lazy_torch import torch

# NF name -> "module:class" of this package, imported when a chain has that NF
NF_CLASSES = {"monitor": "monitor:Monitor", "http-lb": "http_lb:HttpLb", "ids": "ids:Ids",
              "firewall": "firewall:Firewall"}


def nf_class(name: str) -> type:
    """The class of the NF ``name`` (``UnknownName`` for any other name)."""
    where = NF_CLASSES.get(name)
    if where is None:
        raise UnknownName(f"unknown NF {name!r}; valid: {', '.join(NF_CLASSES)}")
    module, cls = where.split(":")
    return getattr(importlib.import_module(f".{module}", __package__), cls)


@dataclass(slots=True)
class MessageContext:
    """The fields of the message an NF's CPU path is looking at."""

    flow: int = 0
    index: int = 0
    direction: int = 0
    kind: int = 0
    header_len: int = 0
    ts_us: int = 0
    packets: int = 0


@dataclass(slots=True)
class Block:
    """Messages handed to a CPU worker: columns, and where their bytes are.

    Either ``blob`` holds the messages' bytes back to back (``offset`` None), or
    ``offset`` says where each message starts in the trace's payload, which a
    worker forked after the trace was read already holds (``cpu_run``'s
    ``payload``): then no message byte is copied or pickled to hand a block over.
    """

    flow: np.ndarray
    direction: np.ndarray
    index: np.ndarray
    length: np.ndarray
    header_len: np.ndarray
    kind: np.ndarray
    ts_us: np.ndarray
    packets: np.ndarray
    blob: bytes
    offset: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.flow.shape[0])

    def bytes_and_starts(self, payload: bytes | None = None) -> tuple[bytes, np.ndarray]:
        """The buffer the messages lie in and each message's start in it."""
        if self.offset is not None:
            if payload is None:
                raise ValueError("a block of trace offsets needs the trace's payload")
            return payload, self.offset
        starts = np.zeros(len(self.length), dtype=np.int64)
        if len(starts):
            np.cumsum(self.length[:-1], out=starts[1:])
        return self.blob, starts


class Chain:
    """The NFs of a config, built for the flows of one trace."""

    def __init__(self, specs, flows: FlowTable):
        self.nfs = []
        for spec in specs:
            self.nfs.append(nf_class(str(spec.nf))(spec, flows))
        self.kinds = [nf.kind for nf in self.nfs]

    def nf(self, kind: str):
        return next((nf for nf in self.nfs if nf.kind == kind), None)

    # CPU path -----------------------------------------------------------------
    def cpu_state(self, flow: int) -> list:
        return [nf.cpu_state(flow) for nf in self.nfs]

    def cpu_import(self, flow: int, value: list) -> list:
        return [nf.import_flow(v) if nf.portable else nf.cpu_state(flow)
                for nf, v in zip(self.nfs, value)]

    def cpu_export(self, state: list) -> list:
        return [nf.export_flow(s) if nf.portable else None for nf, s in zip(self.nfs, state)]

    def cpu_run(self, block: Block, states: dict, out: Outputs,
                payload: bytes | None = None) -> None:
        """Per-flow logic over a block, in the block's order per flow. O(bytes + messages).

        NF by NF over the whole block, each seeing the messages the NFs before it
        let through: the same as message by message through the chain, because an
        NF's state is its own and output rows are merged as sets. An NF with a
        ``cpu_block`` method (monitor, IDS) takes the block at once; the others run
        ``cpu`` per message. ``payload``: the trace's payload, for a block of offsets.
        """
        data, starts = block.bytes_and_starts(payload)
        # (counts asked for: a plain np.unique imports numpy.ma, 10 ms of a run)
        for flow in np.unique(block.flow, return_counts=True)[0].tolist():
            if flow not in states:
                states[flow] = [nf.cpu_state(flow) for nf in self.nfs]
        alive = np.ones(len(block), dtype=bool)
        for position, nf in enumerate(self.nfs):
            if not alive.any():
                return
            whole = getattr(nf, "cpu_block", None)
            if whole is not None:
                alive = whole(block, data, starts, alive, states, position, out)
            else:
                alive = self._per_message(nf, position, block, data, starts, alive, states, out)

    @staticmethod
    def _per_message(nf, position: int, block: Block, data: bytes, starts: np.ndarray,
                     alive: np.ndarray, states: dict, out: Outputs) -> np.ndarray:
        """``nf.cpu`` on each live message of ``block`` in order; the messages it keeps."""
        ctx = MessageContext()
        rows = np.flatnonzero(alive)
        kept = alive.copy()
        cols = zip(rows.tolist(), block.flow[rows].tolist(), block.direction[rows].tolist(),
                   block.index[rows].tolist(), starts[rows].tolist(), block.length[rows].tolist(),
                   block.header_len[rows].tolist(), block.kind[rows].tolist(),
                   block.ts_us[rows].tolist(), block.packets[rows].tolist())
        for row, flow, direction, index, start, length, header_len, kind, ts_us, packets in cols:
            ctx.flow, ctx.index, ctx.direction, ctx.kind = flow, index, direction, kind
            ctx.header_len, ctx.ts_us, ctx.packets = header_len, ts_us, packets
            if not nf.cpu(states[flow][position], ctx, data[start:start + length], out):
                kept[row] = False
        return kept

    # GPU path -----------------------------------------------------------------
    def gpu_export(self, flow: int) -> list:
        return [nf.gpu_export(flow) if nf.portable else None for nf in self.nfs]

    def gpu_import(self, flow: int, value: list) -> None:
        for nf, v in zip(self.nfs, value):
            if nf.portable:
                nf.gpu_import(flow, v)

    def warm_up(self, device: torch.device) -> None:
        """One-time set-up of every NF's tensors on ``device`` (tables, compiled loops)."""
        for nf in self.nfs:
            if hasattr(nf, "warm_up"):
                nf.warm_up(device)

    def gpu_run(self, batch: GpuBatch, out: Outputs) -> None:
        """Every NF's batched kernel over the whole share, in chain order."""
        if batch.size == 0:
            return
        alive = torch.ones(batch.size, dtype=torch.bool, device=batch.device)
        with torch.inference_mode():
            for nf in self.nfs:
                alive = nf.gpu(batch, alive, out)
