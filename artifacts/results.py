"""Result tables: ``plan-comparison`` (``dl-nfv plan compare -o``), ``nfv-bench``
(``dl-nfv nfv bench -o``) and ``network-probe`` (``dl-nfv profile network --report``).

Each is a table of rows, one per planner or engine, under ``rows`` (a comparison)
or ``engines`` (a bench), so scripts can read a row's figures by name. A row of a
planner that could not plan the problem has ``feasible: false`` and the reason in
``error`` instead of figures.
"""

from __future__ import annotations

from dataclasses import field

from .records import check, record, unique


@record
class ComparisonRow:
    """One planner's plan, simulated: its iteration time and how it compares."""

    planner: str
    feasible: bool
    iteration_ms: float | None = None
    bound_ms: float | None = None
    ratio_to_bound: float | None = None  # iteration_ms / bound_ms
    speedup_vs_dp: float | None = None  # dp's iteration_ms / this one's
    stages: int | None = None
    microbatches: int | None = None
    devices: int | None = None
    peak_memory_bytes: int | None = None
    plan_s: float | None = None
    error: str = ""

    def __post_init__(self) -> None:
        check(self.feasible or bool(self.error),
              f"planner {self.planner!r}: an infeasible row must say why (error)")
        check(self.iteration_ms is None or self.iteration_ms >= 0,
              f"planner {self.planner!r}: iteration_ms must be >= 0, got {self.iteration_ms}")
        for name in ("bound_ms", "plan_s", "peak_memory_bytes"):
            value = getattr(self, name)
            check(value is None or value >= 0, f"{name} must be >= 0, got {value}")


@record
class PlanComparison:
    """Several planners on one op graph and topology, each plan simulated by the same model."""

    kind: str = "plan-comparison"
    schema_version: int = 1
    graph: str  # the model's name
    topology: str  # the topology's name
    optimizer: str = "sgd"
    seed: int = 0
    rows: tuple[ComparisonRow, ...]

    def __post_init__(self) -> None:
        check(self.kind == "plan-comparison", f"kind must be 'plan-comparison', got {self.kind!r}")
        check(bool(self.rows), "rows must name at least one planner")
        unique((r.planner for r in self.rows), "planner")


@record
class EngineResult:
    """One engine's best run over the trace."""

    engine: str
    gbps: float
    messages_per_s: float
    elapsed_s: float
    gpu_message_share: float  # the fraction of messages the tensor ("GPU") path took
    batches: int
    device: str  # where the tensor path ran: cpu, cuda, cuda:N
    workers: int
    alerts: int

    def __post_init__(self) -> None:
        check(0.0 <= self.gpu_message_share <= 1.0,
              f"gpu_message_share must be in [0, 1], got {self.gpu_message_share}")
        for name in ("gbps", "messages_per_s", "elapsed_s", "batches", "workers", "alerts"):
            check(getattr(self, name) >= 0, f"{name} must be >= 0, got {getattr(self, name)}")


@record
class NfvBench:
    """Engines compared on one trace and NF chain; their NF outputs were identical."""

    kind: str = "nfv-bench"
    schema_version: int = 1
    trace: str
    messages: int
    flows: int
    payload_bytes: int
    outputs_identical: bool
    engines: tuple[EngineResult, ...]

    def __post_init__(self) -> None:
        check(self.kind == "nfv-bench", f"kind must be 'nfv-bench', got {self.kind!r}")
        check(bool(self.engines), "engines must name at least one engine")
        unique((e.engine for e in self.engines), "engine")


@record
class NetworkProbe:
    """What ``dl-nfv profile network --report`` measured, before fitting it into a topology.

    ``p2p_one_way_s`` and ``fits`` are keyed by rank pair ``"i-j"``; the lists of
    ``p2p_one_way_s`` and ``allreduce_s`` follow ``sizes_bytes``.
    """

    kind: str = "network-probe"
    schema_version: int = 1
    backend: str
    world_size: int
    hosts: tuple[str, ...]  # per rank
    devices: tuple[str, ...]  # per rank
    sizes_bytes: tuple[int, ...]
    p2p_one_way_s: dict[str, tuple[float, ...]] = field(default_factory=dict)
    # per pair and size, the CPU seconds one message took its busier end (gloo on CPUs)
    p2p_cpu_per_message_s: dict[str, tuple[float, ...]] = field(default_factory=dict)
    allreduce_s: tuple[float, ...] = ()
    fits: dict[str, dict[str, float]] = field(default_factory=dict)  # latency_us, bandwidth_gbps
    matmul_gflops: tuple[float, ...] = ()  # per rank
    memory_gb_per_s: tuple[float, ...] = ()  # per rank
    memory_gib: dict[str, float] = field(default_factory=dict)  # per host
    threads: int = 0  # every rank's intra-op threads where --threads gave them; 0: not given
    rounds: int = 0  # rounds timed: every time above is a size's fastest (0: not in rounds)
    # per pair and size, and per size: the median round (how much other jobs added)
    p2p_median_round_s: dict[str, tuple[float, ...]] = field(default_factory=dict)
    allreduce_median_round_s: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        check(self.threads >= 0, f"threads must be >= 0, got {self.threads}")
        check(self.kind == "network-probe", f"kind must be 'network-probe', got {self.kind!r}")
        check(len(self.hosts) == len(self.devices) == self.world_size,
              f"hosts ({len(self.hosts)}) and devices ({len(self.devices)}) must name every one "
              f"of the {self.world_size} ranks")
        for pair, times in self.p2p_one_way_s.items():
            check(len(times) == len(self.sizes_bytes),
                  f"p2p_one_way_s.{pair} has {len(times)} times for {len(self.sizes_bytes)} sizes")
