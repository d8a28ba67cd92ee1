"""Flow monitor: messages, packets, payload bytes and duration per flow.

Counts the messages that reach it (after any firewall before it in the
chain), with the data packets and payload bytes that carried them and the
first and last message timestamps. Partial counts from the CPU and GPU sides
merge by sum/min/max, so no state has to follow a flow between sides.
"""

from __future__ import annotations

import numpy as np

from .base import GpuBatch, Outputs
from .lazy_torch import torch

NAME = "monitor"


class Monitor:
    kind = NAME
    portable = False

    def __init__(self, spec, flows) -> None:
        self.n_flows = len(flows)

    # CPU path -----------------------------------------------------------------
    def cpu_state(self, flow: int):
        return None

    def cpu(self, state, ctx, payload: bytes, out: Outputs) -> bool:
        row = out.monitor.get(ctx.flow)
        if row is None:
            out.monitor[ctx.flow] = [1, ctx.packets, len(payload), ctx.ts_us, ctx.ts_us]
        else:
            row[0] += 1
            row[1] += ctx.packets
            row[2] += len(payload)
            row[3] = min(row[3], ctx.ts_us)
            row[4] = max(row[4], ctx.ts_us)
        return True

    def cpu_block(self, block, data, starts, alive, states, position, out: Outputs
                  ) -> np.ndarray:
        """``cpu`` over a whole block at once: per flow, one row of segment reductions."""
        rows = np.flatnonzero(alive)
        if len(rows):
            flows, inv = np.unique(block.flow[rows], return_inverse=True)
            table = np.empty((len(flows), 6), dtype=np.int64)
            table[:, 0] = flows
            table[:, 1] = np.bincount(inv, minlength=len(flows))
            table[:, 2] = np.bincount(inv, weights=block.packets[rows], minlength=len(flows))
            table[:, 3] = np.bincount(inv, weights=block.length[rows], minlength=len(flows))
            ts = block.ts_us[rows]
            table[:, 4] = np.iinfo(np.int64).max
            np.minimum.at(table[:, 4], inv, ts)
            table[:, 5] = np.iinfo(np.int64).min
            np.maximum.at(table[:, 5], inv, ts)
            out.add_chunk("monitor", table)
        return alive

    # GPU path -----------------------------------------------------------------
    def gpu(self, batch: GpuBatch, alive: torch.Tensor, out: Outputs) -> torch.Tensor:
        """Segment sums/min/max over the batch's live messages (scatter-reduce)."""
        dev = batch.device
        idx = alive.nonzero().squeeze(1)
        if idx.numel() == 0:
            return alive
        flow = torch.from_numpy(batch.flow).to(dev)[idx]
        uniq, inv = torch.unique(flow, return_inverse=True)
        k = uniq.numel()
        ones = torch.ones_like(inv)
        packets = torch.from_numpy(batch.packets).to(dev)[idx]
        nbytes = torch.from_numpy(batch.length).to(dev)[idx]
        ts = torch.from_numpy(batch.ts_us).to(dev)[idx]
        agg = torch.zeros((5, k), dtype=torch.int64, device=dev)
        agg[0].scatter_add_(0, inv, ones)
        agg[1].scatter_add_(0, inv, packets)
        agg[2].scatter_add_(0, inv, nbytes)
        agg[3].fill_(np.iinfo(np.int64).max).scatter_reduce_(0, inv, ts, "amin")
        agg[4].fill_(np.iinfo(np.int64).min).scatter_reduce_(0, inv, ts, "amax")
        table = torch.cat([uniq[None, :], agg]).T.cpu().numpy()
        out.add_chunk("monitor", table)
        return alive
