"""An NF chain: the NFs of an ``nf-config`` in order, run per message (CPU) or per batch (GPU).

A message goes through the NFs in order; an NF that drops it (the firewall)
stops it, and later NFs do not see it. The CPU path loops over a block of
messages with plain per-flow logic; the GPU path runs each NF's batched kernel
over a whole share, passing the mask of messages still alive down the chain.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dl_nfv.artifacts.errors import UnknownName

from .base import FlowTable, GpuBatch, Outputs
from .firewall import Firewall
from .http_lb import HttpLb
from .ids import Ids
from .lazy_torch import torch
from .monitor import Monitor

NF_CLASSES = {"monitor": Monitor, "http-lb": HttpLb, "ids": Ids, "firewall": Firewall}


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
    """Messages handed to a CPU worker: columns plus their bytes back to back."""

    flow: np.ndarray
    direction: np.ndarray
    index: np.ndarray
    length: np.ndarray
    header_len: np.ndarray
    kind: np.ndarray
    ts_us: np.ndarray
    packets: np.ndarray
    blob: bytes


class Chain:
    """The NFs of a config, built for the flows of one trace."""

    def __init__(self, specs, flows: FlowTable):
        self.nfs = []
        for spec in specs:
            cls = NF_CLASSES.get(str(spec.nf))
            if cls is None:
                raise UnknownName(f"unknown NF {spec.nf!r}; valid: {', '.join(NF_CLASSES)}")
            self.nfs.append(cls(spec, flows))
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

    def cpu_run(self, block: Block, states: dict, out: Outputs) -> None:
        """Per-flow logic, one message at a time, in the block's order. O(bytes + messages)."""
        ctx = MessageContext()
        nfs = self.nfs
        blob = block.blob
        pos = 0
        cols = zip(block.flow.tolist(), block.direction.tolist(), block.index.tolist(),
                   block.length.tolist(), block.header_len.tolist(), block.kind.tolist(),
                   block.ts_us.tolist(), block.packets.tolist())
        for flow, direction, index, length, header_len, kind, ts_us, packets in cols:
            state = states.get(flow)
            if state is None:
                state = states[flow] = [nf.cpu_state(flow) for nf in nfs]
            ctx.flow, ctx.index, ctx.direction, ctx.kind = flow, index, direction, kind
            ctx.header_len, ctx.ts_us, ctx.packets = header_len, ts_us, packets
            payload = blob[pos:pos + length]
            pos += length
            for nf, nf_state in zip(nfs, state):
                if not nf.cpu(nf_state, ctx, payload, out):
                    break

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
