"""What every NF shares: the flow context, the per-message CPU context, the GPU batch.

An NF is written twice. The CPU path is plain per-flow logic: ``cpu(state,
msg)`` for one message of one flow, with that flow's state, in order. The GPU
path is a batched torch kernel: ``gpu(batch, alive)`` over every message of a
batch's GPU share at once, with the per-flow state kept in tensors/arrays
between batches. Both paths write the same output rows, so engines can be
compared row for row.

Per-flow state that must follow a flow from one side to the other (firewall
connection state, IDS automaton states and seen patterns) has a *portable*
form: ``export_flow``/``import_flow`` on the CPU side, ``gpu_export``/
``gpu_import`` on the GPU side. Counters that merge by addition (flow monitor)
need no hand-over.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..traffic.trace import Trace
from .lazy_torch import torch

PROTO_CODES = {"tcp": 6, "udp": 17}


@dataclass(slots=True)
class FlowTable:
    """Static per-flow facts the NFs read, as arrays indexed by flow id."""

    proto: np.ndarray  # int64: 6 tcp, 17 udp
    client_port: np.ndarray
    server_port: np.ndarray
    client_addr: np.ndarray  # [flows, 2] int64 (IPv6 hi, lo; IPv4 mapped)
    server_addr: np.ndarray
    names: list[str]  # proto names
    established: np.ndarray  # bool: TCP handshake seen

    @classmethod
    def of(cls, trace: Trace) -> FlowTable:
        client, server = trace.flow_addresses()
        return cls(proto=np.array([PROTO_CODES.get(f.proto, 0) for f in trace.flows],
                                  dtype=np.int64),
                   client_port=np.array([f.client_port for f in trace.flows], dtype=np.int64),
                   server_port=np.array([f.server_port for f in trace.flows], dtype=np.int64),
                   client_addr=client, server_addr=server,
                   names=[f.proto for f in trace.flows],
                   established=np.array([f.established for f in trace.flows], dtype=bool))

    def __len__(self) -> int:
        return int(self.proto.shape[0])


@dataclass(slots=True)
class Outputs:
    """Output rows of one share of a batch (CPU or GPU), merged by the engine."""

    http: list = field(default_factory=list)  # rows (flow, index, kind, method, status,
    #                                             content length, host hash, url hash, backend)
    drops: list = field(default_factory=list)  # rows (flow, index)
    alerts: list = field(default_factory=list)  # rows (flow, index, sid)
    monitor: dict = field(default_factory=dict)  # flow -> [messages, packets, bytes, first, last]
    chunks: dict = field(default_factory=dict)  # "http"/"drops"/"monitor" -> list of arrays

    def add_chunk(self, name: str, array: np.ndarray) -> None:
        self.chunks.setdefault(name, []).append(array)

    def table(self, name: str, width: int) -> np.ndarray:
        """All rows of ``name`` (per-message rows and array chunks) as one int64 array."""
        parts = [a for a in self.chunks.get(name, []) if len(a)]
        rows = getattr(self, name) if name != "monitor" else [
            [f, *v] for f, v in self.monitor.items()]
        if rows:
            parts.append(np.asarray(rows, dtype=np.int64).reshape(-1, width))
        if not parts:
            return np.zeros((0, width), dtype=np.int64)
        return np.concatenate(parts).astype(np.int64, copy=False)


@dataclass(slots=True)
class GpuBatch:
    """The GPU share of a batch: messages sorted by (flow, index), payload on the host.

    ``flow``, ``direction``, ``index``, ``offset``, ``length``, ``header_len``,
    ``kind``, ``ts_us``, ``packets`` are int64 numpy arrays of the share's
    messages; ``payload`` is the trace's byte buffer; ``device`` where kernels run.
    """

    flow: np.ndarray
    direction: np.ndarray
    index: np.ndarray
    offset: np.ndarray
    length: np.ndarray
    header_len: np.ndarray
    kind: np.ndarray
    ts_us: np.ndarray
    packets: np.ndarray
    payload: np.ndarray
    device: torch.device
    blob: bytes = b""

    @property
    def size(self) -> int:
        return int(self.flow.shape[0])


def join_bytes(blob: bytes, offset: np.ndarray, length: np.ndarray) -> bytes:
    """``blob[offset[i]:offset[i]+length[i]]`` for every i, back to back (one copy).

    A Python loop over messages, but each step is a zero-copy view: much
    cheaper than per-byte index arithmetic for messages of hundreds of bytes.
    """
    view = memoryview(blob)
    return b"".join([view[o:o + n] for o, n in zip(offset.tolist(), length.tolist())])
