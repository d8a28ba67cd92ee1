"""The ``op-graph`` artifact: a model's operators, their measured costs, and data edges.

Produced by ``dl-nfv profile model`` (or an importer); consumed by planners,
the simulator and the runtime. Times are per device *type*: ``fwd_ms`` and
``bwd_ms`` map a catalog name (``cpu``, ``V100-16GB``) to the median measured
time of the op at the graph's batch size on that type. ``flops`` and
``bwd_flops`` count floating-point operations of the whole batch;
``bwd_input_flops`` those of the backward that compute input gradients.

``colocation`` lists groups of ops that must share a placement: every op of a
group runs on the same device set, and in a pipeline in the same stage. A
group holds at least two distinct ops of the graph, and no op is in two
groups. Importers fill it from the source's own constraints (the colour
classes of the NeurIPS 2020 placement inputs); every planner honours it and
``validate_plan`` rejects a plan that splits a group
(``dl_nfv.planners.colocation`` holds the helpers).
"""

from __future__ import annotations

from dataclasses import field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from .errors import InvalidArtifact
from .records import check, record, unique

if TYPE_CHECKING:  # networkx is imported where a graph is built: it costs ~0.1 s at start-up
    import networkx as nx

SCHEMA_VERSION = 1


class OpKind(StrEnum):
    INPUT = "input"
    CONV = "conv"
    MATMUL = "matmul"
    ATTENTION = "attention"
    NORM = "norm"
    ACTIVATION = "activation"
    POOL = "pool"
    ELEMENTWISE = "elementwise"
    EMBEDDING = "embedding"
    RNN = "rnn"
    REDUCTION = "reduction"
    SHAPE = "shape"
    LOSS = "loss"
    BLOCK = "block"
    OTHER = "other"


class Granularity(StrEnum):
    OP = "op"
    LAYER = "layer"


@record
class TensorSpec:
    shape: tuple[int, ...]
    dtype: str = "float32"

    def __post_init__(self) -> None:
        check(all(s >= 1 for s in self.shape), f"shape dimensions must be >= 1, got {list(self.shape)}")


@record
class ModelRef:
    """What was profiled: a zoo name or ``module:callable``, and its inputs."""

    name: str
    source: str = "zoo"
    batch_size: int
    dtype: str = "float32"
    inputs: tuple[TensorSpec, ...] = ()
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check(bool(self.name), "model name must not be empty")
        check(self.batch_size >= 1, f"batch_size must be >= 1, got {self.batch_size}")


@record
class ProfileInfo:
    """Where and how the op times were measured."""

    device_type: str
    threads: int = 1
    torch_version: str = ""
    repeats: int = 0
    warmup: int = 0
    step_ms: float | None = None
    op_sum_ms: float | None = None
    peak_memory_bytes: int | None = None
    scaling_batch_size: int | None = None  # the smaller batch the ops' fixed parts came from
    # heap policy while timing (``dl_nfv.profilers.allocator``): kept, system; "" not recorded
    allocator: str = ""
    # every intra-op thread count the ops were timed with (``threads`` among them; the
    # others in ``Op.fwd_ms_by_threads``); empty: ``threads`` alone
    thread_counts: tuple[int, ...] = ()
    # spread over the timed rounds at ``threads``, as the interquartile range over the median
    # (None: not recorded): of the per-op sum of a round, of the whole step, and of each op
    # (the median over ops, weighted by their time)
    op_sum_spread: float | None = None
    step_spread: float | None = None
    op_spread: float | None = None
    # share of the per-op sum in ops whose median was still uncertain by more than the
    # profiler's tolerance when it stopped adding rounds (None: not recorded)
    noisy_share: float | None = None
    # the instrumentation's cost per event taken off every op (µs; keys fwd, bwd, and
    # fwd_small, bwd_small at the smaller batch) and what it took off the per-op sum (ms)
    instrumentation_us: dict[str, float] = field(default_factory=dict)
    instrumentation_taken_ms: float | None = None
    # CPU the training runtime spends per unit action (a unit's forward or backward on a
    # microbatch) beyond the ops' own time, on one thread (None: not measured)
    unit_action_ms: float | None = None
    # of that, what one more action costs alone: measured with every op a unit of its own
    # (an op placement's units), on one thread (None: not measured)
    op_action_ms: float | None = None
    # CPU one more turn between forward and backward costs the runtime (a forward right
    # after a backward, or a backward right after a forward, beyond a step's one such
    # turn), on the whole model, one thread (None: not measured)
    turn_ms: float | None = None
    # CPU a step's first forward and first backward cost more than ones right after a step
    # of their own size (what the step's other work left cold), on the whole model at the
    # smaller batch, one thread (None: not measured)
    cold_fwd_ms: float | None = None
    cold_bwd_ms: float | None = None
    # the loss (outside the graph: forward + backward) at the profiled batch and its
    # batch-independent part, on one thread where timed there (None: not measured)
    loss_ms: float | None = None
    loss_fixed_ms: float | None = None
    # the runtime's optimizer step (per optimizer: sgd, adam), the zeroing of its gradient
    # buckets and one backward's adding into them, ns per parameter byte, timed over the
    # model's parameters on one thread (empty / None: not measured; the cost model then
    # charges memory passes)
    update_ns_per_byte: dict[str, float] = field(default_factory=dict)
    zero_ns_per_byte: float | None = None
    accumulate_ns_per_byte: float | None = None
    # how much slower a 1-thread plain step runs while a second process runs the same step
    # on another core of the machine (>= 1; ``profilers.corun``; None: not measured)
    co_run_slowdown: float | None = None
    # how much slower the runtime's update (the optimizer's step and the gradients' zeroing)
    # runs, in lockstep with a second process's training iterations on another core (>= 1;
    # ``profilers.corun``; None: not measured)
    update_co_run_slowdown: float | None = None
    # the device the ops were timed on: the CPU's model name or the CUDA device's name
    # (``profilers.measure.machine_name``; "": not recorded)
    machine: str = ""
    note: str = ""

    def __post_init__(self) -> None:
        check(self.threads >= 1, f"threads must be >= 1, got {self.threads}")
        check(all(n >= 1 for n in self.thread_counts),
              f"thread_counts must be >= 1, got {list(self.thread_counts)}")
        check(not self.thread_counts or self.threads in self.thread_counts,
              f"thread_counts {list(self.thread_counts)} must include threads ({self.threads})")
        for name, us in self.instrumentation_us.items():
            check(us >= 0, f"instrumentation_us[{name!r}] must be >= 0, got {us}")
        for name, ns in self.update_ns_per_byte.items():
            check(name in ("sgd", "adam"), f"update_ns_per_byte: unknown optimizer {name!r}")
            check(ns >= 0, f"update_ns_per_byte[{name!r}] must be >= 0, got {ns}")
        for name in ("op_sum_spread", "step_spread", "op_spread", "noisy_share",
                     "instrumentation_taken_ms", "unit_action_ms", "op_action_ms", "turn_ms",
                     "cold_fwd_ms", "cold_bwd_ms",
                     "loss_ms",
                     "loss_fixed_ms",
                     "zero_ns_per_byte", "accumulate_ns_per_byte"):
            value = getattr(self, name)
            check(value is None or value >= 0, f"{name} must be >= 0, got {value}")
        check(self.step_ms is None or self.step_ms >= 0, f"step_ms must be >= 0, got {self.step_ms}")
        for name in ("co_run_slowdown", "update_co_run_slowdown"):
            value = getattr(self, name)
            check(value is None or value >= 1, f"{name} must be >= 1, got {value}")


@record
class Op:
    id: str
    name: str
    kind: OpKind = OpKind.OTHER
    flops: float = 0.0
    bwd_flops: float = 0.0
    # of bwd_flops, those that compute input gradients (what the backward passes on to the
    # ops before); the rest compute weight gradients. None: not counted
    bwd_input_flops: float | None = None
    bytes_accessed: float = 0.0
    param_bytes: int = 0
    output_bytes: int = 0
    # bytes the op holds on every device that runs it for the whole iteration, whatever its
    # batch share, beyond its parameters (with their gradients and optimizer state) and its
    # outputs: a footprint a source measured as one figure (placement-json's `size`)
    resident_bytes: int = 0
    # the source recorded backward work for the op whatever its parameters (placement-json's
    # backward nodes): its backward runs, and so do those of the ops after it
    runs_backward: bool = False
    params: tuple[str, ...] = ()
    # parameters this op uses that another op owns (tied weights): name -> bytes
    shared_params: dict[str, int] = field(default_factory=dict)
    fwd_ms: dict[str, float] = field(default_factory=dict)
    bwd_ms: dict[str, float] = field(default_factory=dict)
    fwd_fixed_ms: dict[str, float] = field(default_factory=dict)
    bwd_fixed_ms: dict[str, float] = field(default_factory=dict)
    # of bwd_ms, the time autograd spends summing the gradients of the tied weights the op
    # owns from their uses (batch-independent; gone where a plan splits the uses)
    tie_sum_ms: dict[str, float] = field(default_factory=dict)
    # the op's times on the profile's device type at other intra-op thread counts than the
    # profile's ``threads`` (key: the thread count, as text), timed in the same profile run;
    # the cost model scales the op to a CPU device's cores from them (``ProfileInfo``)
    fwd_ms_by_threads: dict[str, float] = field(default_factory=dict)
    bwd_ms_by_threads: dict[str, float] = field(default_factory=dict)
    # the batch-independent parts of those times, measured at those thread counts (empty:
    # the cost model scales ``*_fixed_ms`` by the op's own factor)
    fwd_fixed_ms_by_threads: dict[str, float] = field(default_factory=dict)
    bwd_fixed_ms_by_threads: dict[str, float] = field(default_factory=dict)
    splittable_dims: tuple[int, ...] = ()
    module: str = ""

    def __post_init__(self) -> None:
        check(bool(self.id), "op id must not be empty")
        for name in ("flops", "bwd_flops", "bytes_accessed", "param_bytes", "output_bytes",
                     "resident_bytes"):
            value = getattr(self, name)
            check(value >= 0, f"op {self.id!r}: {name} must be >= 0, got {value}")
        if self.bwd_input_flops is not None:
            check(0 <= self.bwd_input_flops <= self.bwd_flops * (1 + 1e-9),
                  f"op {self.id!r}: bwd_input_flops must be in [0, bwd_flops = {self.bwd_flops}], "
                  f"got {self.bwd_input_flops}")
        for name in ("fwd_ms", "bwd_ms", "fwd_fixed_ms", "bwd_fixed_ms", "tie_sum_ms",
                     "fwd_ms_by_threads", "bwd_ms_by_threads", "fwd_fixed_ms_by_threads",
                     "bwd_fixed_ms_by_threads"):
            for device_type, ms in getattr(self, name).items():
                check(ms >= 0, f"op {self.id!r}: {name}[{device_type!r}] must be >= 0, got {ms}")
        for name in ("fwd_ms_by_threads", "bwd_ms_by_threads", "fwd_fixed_ms_by_threads",
                     "bwd_fixed_ms_by_threads"):
            for threads in getattr(self, name):
                check(threads.isdigit() and int(threads) >= 1,
                      f"op {self.id!r}: {name} keys are thread counts >= 1, got {threads!r}")
        for device_type, ms in self.tie_sum_ms.items():
            check(device_type in self.bwd_ms,
                  f"op {self.id!r}: tie_sum_ms[{device_type!r}] is part of a backward time, but "
                  f"bwd_ms has no {device_type!r}")
            check(ms <= self.bwd_ms[device_type] + 1e-9,
                  f"op {self.id!r}: tie_sum_ms[{device_type!r}] = {ms} must not exceed "
                  f"bwd_ms[{device_type!r}] = {self.bwd_ms[device_type]}")
        for name, nbytes in self.shared_params.items():
            check(nbytes >= 0, f"op {self.id!r}: shared_params[{name!r}] must be >= 0, got {nbytes}")
            check(name not in self.params,
                  f"op {self.id!r}: shared_params names {name!r}, which the op owns (params)")
        for name in ("fwd", "bwd"):
            full, fixed = getattr(self, f"{name}_ms"), getattr(self, f"{name}_fixed_ms")
            for device_type, ms in fixed.items():
                check(device_type in full and ms <= full[device_type] + 1e-9,
                      f"op {self.id!r}: {name}_fixed_ms[{device_type!r}] = {ms} must not exceed "
                      f"{name}_ms[{device_type!r}] = {full.get(device_type)}")
            full, fixed = getattr(self, f"{name}_ms_by_threads"), getattr(self, f"{name}_fixed_ms_by_threads")
            for threads, ms in fixed.items():
                check(threads in full and ms <= full[threads] + 1e-9,
                      f"op {self.id!r}: {name}_fixed_ms_by_threads[{threads!r}] = {ms} must not "
                      f"exceed {name}_ms_by_threads[{threads!r}] = {full.get(threads)}")


@record
class Edge:
    src: str
    dst: str
    bytes: int = 0

    def __post_init__(self) -> None:
        check(self.bytes >= 0, f"edge {self.src}->{self.dst}: bytes must be >= 0, got {self.bytes}")
        check(self.src != self.dst, f"edge {self.src}->{self.dst} is a self-loop")


@record
class OpGraph:
    kind: str = "op-graph"
    schema_version: int = SCHEMA_VERSION
    model: ModelRef
    granularity: Granularity = Granularity.OP
    profile: ProfileInfo | None = None
    ops: tuple[Op, ...]
    edges: tuple[Edge, ...] = ()
    # groups of op ids that must share a placement (device set, pipeline stage)
    colocation: tuple[tuple[str, ...], ...] = ()

    def __post_init__(self) -> None:
        check(len(self.ops) >= 1, "an op graph needs at least one op")
        unique((op.id for op in self.ops), "op id")
        ids = {op.id for op in self.ops}
        pairs = set()
        owned = {name for op in self.ops for name in op.params}
        for op in self.ops:
            for name in op.shared_params:
                check(name in owned, f"op {op.id!r}: shared_params names {name!r}, which no op "
                                     f"owns (no op lists it in params)")
        for edge in self.edges:
            for end in (edge.src, edge.dst):
                check(end in ids, f"edge {edge.src}->{edge.dst} names unknown op {end!r}")
            check((edge.src, edge.dst) not in pairs, f"duplicate edge {edge.src}->{edge.dst}")
            pairs.add((edge.src, edge.dst))
        import networkx as nx

        graph = nx.DiGraph()
        graph.add_nodes_from(op.id for op in self.ops)
        graph.add_edges_from((e.src, e.dst) for e in self.edges)
        if not nx.is_directed_acyclic_graph(graph):
            cycle = nx.find_cycle(graph)
            path = " -> ".join([cycle[0][0], *(v for _, v in cycle)])
            raise ValueError(f"the op graph has a cycle: {path}")
        self._check_colocation(ids)

    def _check_colocation(self, ids: set[str]) -> None:
        owner: dict[str, int] = {}
        for i, group in enumerate(self.colocation):
            where = f"colocation[{i}]"
            if len(group) < 2:
                raise InvalidArtifact(f"a colocation group needs at least 2 ops, got "
                                      f"{list(group)}", field=where)
            seen: set[str] = set()
            for op_id in group:
                if op_id not in ids:
                    raise InvalidArtifact(f"unknown op {op_id!r}", field=where)
                if op_id in seen:
                    raise InvalidArtifact(f"op {op_id!r} is listed twice", field=where)
                if op_id in owner:
                    raise InvalidArtifact(f"op {op_id!r} is already in colocation"
                                          f"[{owner[op_id]}]", field=where)
                seen.add(op_id)
                owner[op_id] = i

    def op(self, op_id: str) -> Op:
        return self.index[op_id]

    @property
    def index(self) -> dict[str, Op]:
        return {op.id: op for op in self.ops}

    def to_networkx(self) -> nx.DiGraph:
        """A DiGraph with every op as a node (attribute ``op``) and edges with ``bytes``."""
        import networkx as nx

        graph = nx.DiGraph()
        for op in self.ops:
            graph.add_node(op.id, op=op)
        for edge in self.edges:
            graph.add_edge(edge.src, edge.dst, bytes=edge.bytes)
        return graph

    def topological_ids(self) -> list[str]:
        """Op ids in a topological order that keeps file order among independent ops."""
        import networkx as nx

        position = {op.id: i for i, op in enumerate(self.ops)}
        return list(nx.lexicographical_topological_sort(self.to_networkx(), key=position.__getitem__))

    def blocked_units(self, unit_of: dict[str, Any]) -> set:
        """The units of the graph's ops grouped by ``unit_of`` (op id -> unit; ops it does not
        map are left out) that lie on a cycle of the unit graph, or after one: empty when the
        units, joined by the edges between them, form a DAG. Kahn's algorithm, O(ops + edges).
        """
        succ: dict[Any, set] = {}
        indeg: dict[Any, int] = dict.fromkeys(unit_of.values(), 0)
        for e in self.edges:
            a, b = unit_of.get(e.src), unit_of.get(e.dst)
            if a is None or b is None or a == b or b in succ.setdefault(a, set()):
                continue
            succ[a].add(b)
            indeg[b] += 1
        ready = [u for u, n in indeg.items() if n == 0]
        while ready:
            u = ready.pop()
            for v in succ.get(u, ()):
                indeg[v] -= 1
                if indeg[v] == 0:
                    ready.append(v)
        return {u for u, n in indeg.items() if n > 0}

    @property
    def total_param_bytes(self) -> int:
        return sum(op.param_bytes for op in self.ops)
