"""``chain-report`` and ``chain-bench``: what ``dl-nfv nfv chain`` and its bench write (JSON).

A chain report counts packets per NF of the l4_chain (in, out, dropped by
reason), the NAT's bindings, the LB's flows per backend and the monitor's
flows, with the engine's time per stage, end-to-end Mpps and Gbps (wire bytes)
and per-batch latency percentiles in milliseconds.
"""

from __future__ import annotations

from dataclasses import field

from .records import check, record


@record
class BatchLatency:
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float


@record
class StageCounts:
    nf: str
    packets_in: int
    packets_out: int
    dropped: dict[str, int] = field(default_factory=dict)
    time_s: float = 0.0

    def __post_init__(self) -> None:
        dropped = sum(self.dropped.values())
        check(self.packets_in - dropped == self.packets_out,
              f"stage {self.nf!r}: {self.packets_in} in - {dropped} dropped != "
              f"{self.packets_out} out")


@record
class NatUse:
    translations: int
    exhausted: int
    pool_size: int
    in_use: int
    peak_in_use: int


@record
class MonitorCounts:
    flows: int
    exported: int
    packets: int
    bytes: int


@record
class ChainReport:
    kind: str = "chain-report"
    schema_version: int = 1
    config: str
    trace: str
    engine: str
    device: str
    batch_size: int
    frames: int
    ingress_dropped: dict[str, int] = field(default_factory=dict)
    packets_in: int
    packets_out: int
    wire_bytes: int
    batches: int
    elapsed_s: float
    mpps: float
    gbps: float
    latency: BatchLatency
    stages: tuple[StageCounts, ...]
    nat: NatUse | None = None
    lb: dict[str, int] = field(default_factory=dict)
    monitor: MonitorCounts | None = None
    written: int | None = None

    def __post_init__(self) -> None:
        check(self.kind == "chain-report", f"kind must be 'chain-report', got {self.kind!r}")
        check(0 <= self.packets_out <= self.packets_in,
              f"packets_out {self.packets_out} is not within 0..packets_in {self.packets_in}")


@record
class ChainBenchRow:
    engine: str
    batch_size: int
    device: str
    mpps: float
    gbps: float
    p50_ms: float
    p99_ms: float
    packets_out: int


@record
class ChainBench:
    kind: str = "chain-bench"
    schema_version: int = 1
    config: str
    trace: str
    packets: int
    rows: tuple[ChainBenchRow, ...]

    def __post_init__(self) -> None:
        check(self.kind == "chain-bench", f"kind must be 'chain-bench', got {self.kind!r}")
