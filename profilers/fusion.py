"""Measured times of fused op groups: each group compiled by ``torch.compile`` against its
eager ops, on this machine (``dl-nfv profile fusion``).

Method. The op graph names the model it was profiled from (``graph.model``); the model
is rebuilt (``runtime.model.build_workload``) and traced as the runtime traces it
(``profilers.capture``, the graph's granularity and leaf modules), so op ids match. One
forward pass records every fx node's value. For each group (a tuple of op ids, sampled
by the caller: ``planners.disco.fusible.sample_groups``) the group's nodes are pulled
into one submodule by the runtime's own code (``runtime.fusion.fuse_unit``), and that
submodule is run on the recorded values of its inputs (floating ones requiring
gradients) twice: eagerly (its ops one by one, as an unfused plan runs them) and
compiled by ``torch.compile`` (inductor; C++ on a CPU) through the runtime's own
``runtime.fusion.compile_region``, as a fused plan runs it. Each is
timed forward, and forward then backward (the backward is the difference), the minimum
over ``repeats`` after one untimed call, on ``threads`` intra-op threads. On one thread
(the default) the clock is the process's CPU time, not the wall: on a loaded machine a
process waits for a core for a large and varying part of every call longer than a
scheduler slice (milliseconds), which wall-clock minima over a few repeats do not
remove; CPU time counts only the work. On several threads it is the wall clock.

The **per-call cost** of a compiled region (its guards, the autograd function around
the generated code, the call into it) is measured once on a region of one elementwise
op over a 1-element tensor: the compiled call's time less the eager op's, forward and
backward. The cost model charges it to every fused group (``disco.estimator``).

Compiling is slow on a CPU (seconds per group; tens of seconds for the first); groups
are compiled in order until ``compile_budget_s`` of wall time is spent, and every group
not measured is recorded with the reason (budget spent, compilation failed, fewer than
two fx nodes). Inductor keeps a cache of generated code across processes, so groups of
a repeated block compile fast after the first.

The graph must have been profiled on this machine (its ``profile.machine``, where it
records one): a group's ops carry the graph's times beside the eager and fused times
measured here, and a graph profiled on another CPU sets another machine's op times
beside them.

Output: the ``fusion-times`` artifact (``FusionTimes``), which carries each group's ops
with what an estimator reads (kind, FLOPs, bytes, the op graph's own times) and the
edges inside it, so training needs no graph. ``load_fusion_times`` validates a file.

Limits: one machine's CPU (or GPU) and thread count; values recorded at the graph's
batch; the per-call cost is measured on the smallest region and grows somewhat with a
region's inputs and outputs (more guards), which is left out.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import field
from pathlib import Path

import torch
from torch import fx

from dl_nfv.artifacts import BadInput, InvalidArtifact, ModelRef, OpGraph, OpKind, fingerprint
from dl_nfv.artifacts.io import read_document
from dl_nfv.artifacts.records import check, from_data, record
from dl_nfv.profilers.measure import machine_name
from dl_nfv.runtime.fusion import compile_region

KIND = "fusion-times"
SCHEMA_VERSION = 1


@record
class GroupOp:
    """One op of a measured group: what an estimator reads (from the op graph)."""

    id: str
    kind: OpKind
    flops: float = 0.0
    bwd_flops: float = 0.0
    bytes_accessed: float = 0.0
    output_bytes: int = 0
    param_bytes: int = 0
    fwd_ms: float = 0.0  # the op graph's time of the op on the measured device type
    bwd_ms: float = 0.0

    def __post_init__(self) -> None:
        for name in ("flops", "bwd_flops", "bytes_accessed", "output_bytes", "param_bytes",
                     "fwd_ms", "bwd_ms"):
            check(getattr(self, name) >= 0, f"op {self.id!r}: {name} must be >= 0, "
                                            f"got {getattr(self, name)}")


@record
class GroupTime:
    """One group, measured: its ops (topological order), the edges between them (indices
    into ``ops`` and bytes), and its eager and compiled times (min over repeats)."""

    ops: tuple[GroupOp, ...]
    edges: tuple[tuple[int, int, int], ...] = ()
    eager_fwd_ms: float
    eager_bwd_ms: float
    fused_fwd_ms: float
    fused_bwd_ms: float
    compile_s: float = 0.0

    def __post_init__(self) -> None:
        check(len(self.ops) >= 2, f"a measured group has at least two ops, got {len(self.ops)}")
        for name in ("eager_fwd_ms", "eager_bwd_ms", "fused_fwd_ms", "fused_bwd_ms", "compile_s"):
            check(getattr(self, name) >= 0, f"group {self.ops[0].id!r}: {name} must be >= 0, "
                                            f"got {getattr(self, name)}")
        for src, dst, nbytes in self.edges:
            check(0 <= src < len(self.ops) and 0 <= dst < len(self.ops) and nbytes >= 0,
                  f"group {self.ops[0].id!r}: edge ({src}, {dst}, {nbytes}) does not index its "
                  f"{len(self.ops)} ops")


@record
class SkippedGroup:
    """A sampled group that was not measured, and why."""

    ops: tuple[str, ...]
    reason: str


@record
class FusionTimes:
    """The ``fusion-times`` artifact: fused groups of one model measured on one machine."""

    kind: str = KIND
    schema_version: int = SCHEMA_VERSION
    model: ModelRef
    graph_sha256: str
    device_type: str
    threads: int
    torch_version: str = ""
    repeats: int
    per_call_fwd_ms: float
    per_call_bwd_ms: float
    groups: tuple[GroupTime, ...] = ()
    skipped: tuple[SkippedGroup, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        check(self.kind == KIND, f"kind must be {KIND!r}, got {self.kind!r}")
        check(self.threads >= 1, f"threads must be >= 1, got {self.threads}")
        check(self.repeats >= 1, f"repeats must be >= 1, got {self.repeats}")
        check(self.per_call_fwd_ms >= 0 and self.per_call_bwd_ms >= 0,
              f"per-call costs must be >= 0, got {self.per_call_fwd_ms}, {self.per_call_bwd_ms}")


def load_fusion_times(path: str | Path) -> FusionTimes:
    """Load and validate a ``fusion-times`` file; ``InvalidArtifact`` naming the file, the
    field and the value, ``BadInput`` for a missing file."""
    doc = read_document(path)
    try:
        if doc.get("kind") != KIND:
            raise InvalidArtifact(f"expected kind {KIND!r}, got {doc.get('kind')!r}", field="kind")
        version = doc.get("schema_version")
        if not isinstance(version, int) or isinstance(version, bool) or not 1 <= version <= SCHEMA_VERSION:
            raise InvalidArtifact(f"schema_version must be an integer in [1, {SCHEMA_VERSION}], "
                                  f"got {version!r}", field="schema_version")
        return from_data(FusionTimes, doc)
    except InvalidArtifact as exc:
        raise exc.at(file=str(path)) from None


def clock() -> Callable[[], float]:
    """The timer of a measurement: the process's CPU time on one intra-op thread (module
    docstring), the wall clock on more."""
    return time.process_time if torch.get_num_threads() == 1 else time.perf_counter


def _min_ms(fn: Callable[[], object], repeats: int) -> float:
    best = math.inf
    now = clock()
    for _ in range(repeats):
        t0 = now()
        fn()
        best = min(best, now() - t0)
    return best * 1e3


def _as_tuple(out) -> tuple[torch.Tensor, ...]:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def time_region(module: Callable, args: Sequence[torch.Tensor], repeats: int) -> tuple[float, float]:
    """(forward ms, backward ms) of ``module(*args)``: min over ``repeats`` after one untimed
    call (which compiles a compiled module); backward from ones over every float output."""
    def forward():
        return _as_tuple(module(*args))

    def both():
        outs = [o for o in forward() if isinstance(o, torch.Tensor) and o.requires_grad]
        if outs:
            torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])
        for a in args:
            if isinstance(a, torch.Tensor):
                a.grad = None

    both()
    with torch.enable_grad():
        fwd = _min_ms(forward, repeats)
        total = _min_ms(both, repeats)
    return fwd, max(total - fwd, 0.0)


def per_call_ms(backend: str, repeats: int) -> tuple[float, float]:
    """The per-call (forward, backward) ms of a compiled region: one elementwise op over a
    1-element tensor, compiled less eager (clipped at 0)."""
    gm = fx.symbolic_trace(_Scale())
    x = torch.ones(1, requires_grad=True)
    eager = time_region(gm, (x,), repeats)
    compiled = time_region(compile_region(copy.deepcopy(gm), backend), (x,), repeats)
    return max(compiled[0] - eager[0], 0.0), max(compiled[1] - eager[1], 0.0)


class _Scale(torch.nn.Module):
    def forward(self, x):
        return x * 2.0


def _node_values(gm: fx.GraphModule, inputs: Sequence[torch.Tensor]) -> dict[str, object]:
    """Every fx node's value on ``inputs`` (one forward pass, no gradients)."""
    values: dict[str, object] = {}

    class Recorder(fx.Interpreter):
        def run_node(self, n):
            out = super().run_node(n)
            values[n.name] = out
            return out

    with torch.no_grad():
        Recorder(gm).run(*inputs)
    return values


def _region_args(region: fx.GraphModule, values: dict[str, object]) -> tuple:
    """The region's inputs from the recorded values: floating tensors detached and
    requiring gradients (as inside a training step), the rest as recorded."""
    args = []
    for n in region.graph.nodes:
        if n.op != "placeholder":
            continue
        v = values[n.name]
        if isinstance(v, torch.Tensor) and v.is_floating_point():
            v = v.detach().clone().requires_grad_(True)
        args.append(v)
    return tuple(args)


def _group_record(graph: OpGraph, ops: Sequence[str], device_type: str, times, compile_s) -> GroupTime:
    index = graph.index
    pos = {op: i for i, op in enumerate(ops)}
    members = tuple(GroupOp(id=op, kind=index[op].kind, flops=index[op].flops,
                            bwd_flops=index[op].bwd_flops, bytes_accessed=index[op].bytes_accessed,
                            output_bytes=index[op].output_bytes, param_bytes=index[op].param_bytes,
                            fwd_ms=index[op].fwd_ms.get(device_type, 0.0),
                            bwd_ms=index[op].bwd_ms.get(device_type, 0.0)) for op in ops)
    edges = tuple((pos[e.src], pos[e.dst], e.bytes) for e in graph.edges
                  if e.src in pos and e.dst in pos)
    (ef, eb), (ff, fb) = times
    return GroupTime(ops=members, edges=edges, eager_fwd_ms=ef, eager_bwd_ms=eb, fused_fwd_ms=ff,
                     fused_bwd_ms=fb, compile_s=compile_s)


def profile_fusion(graph: OpGraph, groups: Sequence[Sequence[str]], *, repeats: int = 5,
                   threads: int = 1, seed: int = 0, backend: str = "inductor",
                   compile_budget_s: float = 600.0,
                   progress: Callable[[str, int, int], None] | None = None) -> FusionTimes:
    """Measure ``groups`` of ``graph``'s model fused and unfused (module docstring).

    Parameters
    ----------
    graph : the op graph (``profile model``); its ``model`` is rebuilt and traced.
    groups : op-id tuples, each a valid fused group of the graph.
    repeats : timed calls per measurement (the minimum is kept).
    threads : intra-op CPU threads.
    backend : the ``torch.compile`` backend.
    compile_budget_s : wall seconds of measuring after which the remaining groups are
        skipped (recorded as such).

    Raises ``BadInput`` for a graph whose model cannot be rebuilt, a group naming an op the
    traced model lacks, a backend that cannot compile here, or bad numbers. Cost: one
    compile per group (seconds each on a CPU).
    """
    from torch._inductor import config as inductor_config

    from dl_nfv.runtime.fusion import compile_available

    if repeats < 1 or threads < 1 or not compile_budget_s > 0:
        raise BadInput(f"profile fusion: repeats, threads and the compile budget must be > 0, got "
                       f"{repeats}, {threads}, {compile_budget_s}")
    check_same_machine(graph)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    # compile in this process: a pool of compile workers costs more to start than it saves
    # on the small regions measured here
    try:
        with inductor_config.patch(compile_threads=1):
            why = compile_available(backend)
            if why is not None:
                raise BadInput(f"profile fusion: {why}")
            call_fwd, call_bwd = per_call_ms(backend, repeats)
            measured, skipped = _measure(graph, groups, repeats=repeats, seed=seed,
                                         backend=backend, budget_s=compile_budget_s,
                                         progress=progress)
    finally:
        torch.set_num_threads(previous)
    return FusionTimes(model=graph.model, graph_sha256=fingerprint(graph),
                       device_type=_device_type(graph), threads=threads,
                       torch_version=torch.__version__, repeats=repeats,
                       per_call_fwd_ms=call_fwd, per_call_bwd_ms=call_bwd, groups=tuple(measured),
                       skipped=tuple(skipped),
                       notes=(f"timed by {'process CPU time' if threads == 1 else 'wall clock'}",))


def check_same_machine(graph: OpGraph, where: str = "") -> None:
    """``BadInput`` where ``graph`` was profiled on another machine than this one: a group's
    ops carry the graph's times, which must be this machine's beside the fused and eager
    times measured here (a graph that records no machine is taken as it is)."""
    recorded = graph.profile.machine if graph.profile is not None else ""
    if not recorded:
        return
    here = machine_name(torch.device("cuda" if _device_type(graph) == "cuda" else "cpu"))
    if recorded != here:
        raise BadInput(f"{where}profile.machine: {recorded!r}: the op graph was profiled on another "
                       f"machine than this one ({here!r}); profile the model here first")


def _device_type(graph: OpGraph) -> str:
    return graph.profile.device_type if graph.profile is not None else "cpu"


def _measure(graph: OpGraph, groups, *, repeats: int, seed: int, backend: str, budget_s: float,
             progress) -> tuple[list[GroupTime], list[SkippedGroup]]:
    """Each group's eager and compiled times, until ``budget_s`` wall seconds are spent."""
    from dl_nfv.profilers.capture import capture
    from dl_nfv.runtime.fusion import compile_errors, fuse_unit
    from dl_nfv.runtime.model import build_workload

    workload = build_workload(graph.model, seed)
    inputs, _ = workload.make_batch(graph.model.batch_size, seed)
    leaves = tuple(graph.model.options.get("leaf_modules", ()))
    cap = capture(workload.module, inputs, granularity=graph.granularity, leaf_modules=leaves)
    values = _node_values(cap.graph_module, inputs)
    measured, skipped = [], []
    t0 = time.perf_counter()
    for k, ops in enumerate(groups):
        absent = [op for op in ops if op not in cap.nodes_of]
        if absent:
            raise BadInput(f"profile fusion: group {list(ops)} names op {absent[0]!r}, which "
                           f"the traced model {graph.model.name!r} does not have")
        if time.perf_counter() - t0 > budget_s:
            skipped.append(SkippedGroup(ops=tuple(ops), reason="compile budget spent"))
            continue
        gm = fx.GraphModule(cap.graph_module, copy.deepcopy(cap.graph_module.graph))
        fused, names = fuse_unit(gm, [ops], cap.nodes_of, compile_with=None, notes=[])
        if not names:
            skipped.append(SkippedGroup(ops=tuple(ops), reason="fewer than two fx nodes"))
            continue
        region = getattr(fused, names[0]).eager
        args = _region_args(region, values)
        try:
            eager = time_region(region, args, repeats)
            c0 = time.perf_counter()
            compiled = compile_region(region, backend)
            time_region(compiled, args, 1)
            compile_s = time.perf_counter() - c0
            times = (eager, time_region(compiled, args, repeats))
        except compile_errors() as exc:
            text = str(exc).splitlines()[0][:120] if str(exc) else ""
            skipped.append(SkippedGroup(ops=tuple(ops), reason=f"{type(exc).__name__}: {text}"))
            continue
        measured.append(_group_record(graph, ops, _device_type(graph), times, compile_s))
        if progress is not None:
            progress(f"group {k + 1}", k + 1, len(groups))
    return measured, skipped
