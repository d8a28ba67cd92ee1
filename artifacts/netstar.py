"""NetStar's results: ``netstar-report`` (``dl-nfv nfv netstar run``) and ``netstar-bench``
(``dl-nfv nfv netstar bench``).

A report lists what every NF of the chain did over one trace in one programming
style (async, callback, blocking) against one store, and the counters of the
external services it waited on; a bench compares the styles' throughput at
several store latencies and their lines of code.
"""

from __future__ import annotations

from dataclasses import field

from .nfvreport import FiveTuple
from .records import check, record

STYLES = ("async", "callback", "blocking")


@record
class NetstarAlert:
    nf: str
    code: str
    msg: str
    flow_id: int
    message_index: int
    flow: FiveTuple


@record
class FlowNote:
    """A per-flow output of an NF (a NAT mapping, for one)."""

    flow_id: int
    flow: FiveTuple
    value: str


@record
class NetstarNfOutput:
    messages: int
    alerts: int
    dropped_messages: int
    dropped_flows: int
    digest: str  # sha256 of the NF's alerts, drops and notes
    notes: tuple[FlowNote, ...] = ()


@record
class ServiceCounters:
    """What a run asked of one external service, and how often it had to wait or retry."""

    requests: int
    retries: int
    cache_hits: int
    held_requests: int
    held_flows: int
    peak_outstanding: int

    def __post_init__(self) -> None:
        for name in ("requests", "retries", "cache_hits", "held_requests", "held_flows",
                     "peak_outstanding"):
            check(getattr(self, name) >= 0, f"{name} must be >= 0, got {getattr(self, name)}")


@record
class NetstarReport:
    kind: str = "netstar-report"
    schema_version: int = 1
    config: str
    trace: str
    style: str
    store: str
    dns: str | None = None
    flows: int
    messages: int
    elapsed_s: float
    messages_per_s: float
    outputs_digest: str
    alerts: tuple[NetstarAlert, ...] = ()
    outputs: dict[str, NetstarNfOutput] = field(default_factory=dict)
    services: dict[str, ServiceCounters] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check(self.kind == "netstar-report", f"kind must be 'netstar-report', got {self.kind!r}")
        check(self.style in STYLES, f"style must be one of {', '.join(STYLES)}, got {self.style!r}")
        check(self.elapsed_s >= 0 and self.messages_per_s >= 0,
              f"elapsed_s and messages_per_s must be >= 0, got {self.elapsed_s}, "
              f"{self.messages_per_s}")


@record
class LatencyRow:
    """Every style's best run at one added store latency."""

    store_latency_ms: float
    messages_per_s: dict[str, float]
    elapsed_s: dict[str, float]

    def __post_init__(self) -> None:
        check(self.store_latency_ms >= 0,
              f"store_latency_ms must be >= 0, got {self.store_latency_ms}")
        check(set(self.messages_per_s) == set(self.elapsed_s),
              f"messages_per_s names {sorted(self.messages_per_s)} but elapsed_s "
              f"{sorted(self.elapsed_s)}")


@record
class NetstarBench:
    kind: str = "netstar-bench"
    schema_version: int = 1
    config: str
    trace: str
    flows: int
    messages: int
    store: str
    outputs_identical: bool
    lines: dict[str, dict[str, int]]  # style -> NF -> source lines, and "total"
    throughput: tuple[LatencyRow, ...]

    def __post_init__(self) -> None:
        check(self.kind == "netstar-bench", f"kind must be 'netstar-bench', got {self.kind!r}")
        check(bool(self.throughput), "throughput must hold at least one store latency")
