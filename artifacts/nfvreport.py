"""``nfv-report``: what ``dl-nfv nfv run`` measured and what the NFs decided (JSON).

Throughput (Gbps of reassembled payload, messages/s, Mpps of captured
packets) is end to end: over ``wall_s``, from opening the capture to the
finished report (reading, decoding, flows, starting workers, the NFs, building
the report; ``stages_s`` names each part). ``parse_s`` is the capture's part
(read, decode, flows), ``startup_s`` the workers' start and ``elapsed_s`` the
engine's processing. A report over a trace parsed before (``nfv bench``) has
``parse_s`` 0 and its throughput is over the rest.
``alerts`` is a top-level list; the per-NF summaries in ``outputs`` carry a
``digest`` (sha256 of the NF's full output rows, sorted), equal across
engines when their outputs are identical.
"""

from __future__ import annotations

from dataclasses import field

from .records import check, record


@record
class FiveTuple:
    proto: str
    src: str
    sport: int
    dst: str
    dport: int


@record
class Alert:
    sid: int
    msg: str
    flow: FiveTuple
    message_index: int


@record
class Latency:
    p50_us: float
    p90_us: float
    p99_us: float
    max_us: float


@record
class BatchSplit:
    """One batch: how its flows and messages were split and how long each side took."""

    index: int
    mode: str
    messages: int
    flows: int
    gpu_flows: int
    gpu_messages: int
    gpu_bytes: int
    cpu_messages: int
    cpu_bytes: int
    gpu_ms: float
    cpu_ms: float
    enqueue_ms: float
    wall_ms: float


@record
class FlowStats:
    flow: FiveTuple
    messages: int
    packets: int
    bytes: int
    duration_us: int


@record
class MonitorOutput:
    flows: int
    messages: int
    packets: int
    bytes: int
    top_flows: tuple[FlowStats, ...] = ()
    digest: str


@record
class HttpOutput:
    requests: int
    responses: int
    methods: dict[str, int]
    statuses: dict[str, int]
    backends: dict[str, int]
    digest: str


@record
class Drop:
    flow: FiveTuple
    messages: int


@record
class FirewallOutput:
    dropped_messages: int
    dropped_flows: int
    drops: tuple[Drop, ...] = ()
    digest: str


@record
class IdsOutput:
    rules: int
    patterns: int
    alerts: int
    stride_bytes: int
    digest: str


@record
class NfOutputs:
    monitor: MonitorOutput | None = None
    http: HttpOutput | None = None
    firewall: FirewallOutput | None = None
    ids: IdsOutput | None = None


@record
class NfvReport:
    kind: str = "nfv-report"
    schema_version: int = 1
    config: str
    trace: str
    engine: str
    device: str
    workers: int
    packets: int
    wire_bytes: int
    flows: int
    messages: int
    payload_bytes: int
    parse_s: float
    startup_s: float
    elapsed_s: float
    wall_s: float = 0.0
    stages_s: dict[str, float] = field(default_factory=dict)
    gbps: float
    messages_per_s: float
    mpps: float
    latency: Latency
    batches: tuple[BatchSplit, ...] = ()
    calibration: dict[str, float] = field(default_factory=dict)
    malformed: dict[str, int] = field(default_factory=dict)
    tcp: dict[str, int] = field(default_factory=dict)
    alerts: tuple[Alert, ...] = ()
    outputs: NfOutputs = NfOutputs()

    def __post_init__(self) -> None:
        check(self.kind == "nfv-report", f"kind must be 'nfv-report', got {self.kind!r}")
        for name in ("packets", "flows", "messages", "payload_bytes", "workers"):
            check(getattr(self, name) >= 0, f"{name} must be >= 0, got {getattr(self, name)}")
        check(self.elapsed_s >= 0, f"elapsed_s must be >= 0, got {self.elapsed_s}")
