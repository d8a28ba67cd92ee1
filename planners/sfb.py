"""Sufficient-factor broadcasting (SFB): which replicated groups exchange factors, by an ILP.

For a fully-connected layer ``y = x W^T + b`` the weight gradient over a batch is
a sum of outer products, ``dW = sum_rows dy^T x``. Replicas can therefore
all-gather the *sufficient factors* (their rows of the layer input ``x`` and of
the output gradient ``dy``: ``rows x (in + out)`` values) instead of all-reducing
the ``in x out`` gradient, and rebuild the exact sum locally (TAG's lossless
compression; Xie et al.'s SFB). It pays when ``rows x (in + out)`` is small next to
``in x out``: wide layers, small per-replica batches, slow links.

Granularity. A plan marks SFB per group (``Group.compression``). Inside an SFB
group the simulator (``simulator/lower.py``) gives each matmul op an all-gather and
a recomputation when the factors' all-gather plus the slowest replica's
recomputation beat that op's own AllReduce, and AllReduces the rest, so one group
mixes both. ``sfb_ops`` states that rule once, for this planner and the runtime.
The decision here is therefore one binary per *candidate group*: a group synchronised
by AllReduce over two or more devices with at least one op the rule switches.

Model (linearised from one simulation of the plan with no SFB). With ``x_g`` in
{0, 1} for candidate group ``g`` and ``T`` the iteration time:

* switching ``g`` removes ``saved_g`` ms of AllReduce (the cost model's AllReduce of
  each gradient bucket of ``g`` with and without the switched ops' bytes), adds
  ``gather_g`` ms of all-gathers (``CostModel.sfb_op_ms`` per op) and ``rc_gd`` ms of
  recomputation on device ``d`` (``CostModel.sfb_recompute_ms``);
* **overlap with backward**: ``g``'s gradient exchange starts when its AllReduce
  started in the simulation (its backward done, its stream free), so
  ``T >= start_g + allreduce_g - saved_g x_g + (gather_g + max_d rc_gd) x_g + update_g``;
* **links and streams** (every directed link and every device's collective stream the
  simulator holds): a collective holds its resources for its whole duration, so
  ``T >= first_use_r + busy_r + sum_g x_g (gather_g [r in gather_g] - saved_g [r in
  allreduce_g])``;
* **compute**: ``T >= last_backward_end_d + sum_g x_g rc_gd + update_d``;
* **memory**: the factors of the other replicas, ``(1 - share_d) x (input + output
  bytes)`` per switched op, are held on top of the simulated peak:
  ``peak_d + sum_g x_g held_gd <= capacity_d`` (conservative: the peak and the factors
  need not coincide). A plan whose peak already exceeds a device makes the ILP
  infeasible: ``InfeasiblePlan`` (exit 2) names the device and the bytes.

The objective is ``T`` plus ``1e-3`` times the net communication change of the chosen
groups (a tie-break towards the groups that save most when ``T`` is set elsewhere).
CBC (through PuLP) solves it within ``time_limit_s``.

Verification. The chosen set is simulated; each chosen group whose removal does not
raise the simulated time is dropped (smallest modelled gain first), and if the
result is still slower than the plan without SFB, nothing is switched: the simulated
iteration time never rises.

Limits: the model is linear around one simulation (start times do not move with the
choice); AllReduce savings ignore tied weights summed by their own AllReduce; the
bias of a switched layer is charged nothing (the runtime sums it from the gathered
output gradients).
"""

from __future__ import annotations

import time
import warnings
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pulp

from dl_nfv.artifacts import (
    Compression,
    Group,
    InfeasiblePlan,
    OpGraph,
    Plan,
    Prediction,
    SolverError,
    SyncMethod,
    Topology,
)
from dl_nfv.simulator import CostModel, SimResult, simulate
from dl_nfv.simulator.lower import ELEMENT_BYTES
from dl_nfv.simulator.tasks import COMPUTE_KINDS, TaskKind

TIE_BREAK = 1e-3  # weight of the net communication change in the objective
GIB = 2**30


@dataclass(frozen=True, kw_only=True, slots=True)
class SfbCandidate:
    """One replicated group and what switching it to SFB changes (ms, bytes)."""

    group: str
    ops: tuple[str, ...]  # the matmul ops the simulator would switch
    saved_ms: float  # AllReduce time removed
    gather_ms: float  # all-gathers added (one per op, on the same streams)
    recompute_ms: dict[str, float] = field(default_factory=dict)  # per device
    held_bytes: dict[str, float] = field(default_factory=dict)  # other replicas' factors

    @property
    def net_ms(self) -> float:
        """Communication and recomputation added minus AllReduce removed (negative: a gain)."""
        return self.gather_ms + max(self.recompute_ms.values(), default=0.0) - self.saved_ms


def sfb_ops(cm: CostModel, group: Group, ops: Sequence[str], elem_bytes: int = 4) -> list[str]:
    """The ops of ``group`` (among ``ops``) that SFB switches: matmuls whose factor all-gather
    plus the slowest replica's recomputation beat their own AllReduce (the simulator's rule)."""
    names = list(group.devices)
    out = []
    for op in ops:
        gather_ms = cm.sfb_op_ms(op, names, elem_bytes=elem_bytes)
        if gather_ms is None:
            continue
        recompute = max(cm.sfb_recompute_ms(op, d, s) for d, s in zip(names, group.shares))
        plain_ms = cm.allreduce_ms(names, float(cm.param_bytes[cm.op_index[op]]), group.collective)
        if gather_ms + recompute < plain_ms:
            out.append(op)
    return out


def sfb_files(plan_path: str | Path, *, graph: str | Path | None = None,
              topology: str | Path | None = None, time_limit_s: float = 30.0
              ) -> tuple[Plan, dict[str, Any], Path, Path]:
    """Load the plan at ``plan_path`` and its graph and topology (``graph``/``topology``, else
    the paths it records), check their sha256 against the plan's, and ``apply_sfb``.

    Returns the plan, the report and the graph and topology paths read. Raises
    ``InvalidArtifact`` for a file that is not a plan, ``ArtifactMismatch`` naming the file
    whose sha256 differs from the plan's, and what ``apply_sfb`` raises.
    """
    from dl_nfv.simulator.files import plan_artifacts

    plan, graph_doc, topology_doc, graph_path, topology_path = plan_artifacts(
        plan_path, graph, topology)
    out, report = apply_sfb(plan, graph_doc, topology_doc, time_limit_s=time_limit_s)
    return out, report, graph_path, topology_path


def apply_sfb(plan: Plan, graph: OpGraph, topology: Topology, *,
              time_limit_s: float = 30.0) -> tuple[Plan, dict[str, Any]]:
    """Choose the groups of ``plan`` that synchronise by SFB; return the plan and a report.

    Parameters
    ----------
    plan, graph, topology : the plan and the graph and topology it was made for.
    time_limit_s : seconds CBC may spend on the ILP.

    Returns
    -------
    (plan, report): the plan with ``compression: sfb`` on the chosen groups (none on the
    other AllReduce groups) and its simulated prediction; the report holds the chosen
    groups and layers, the simulated iteration time and the bytes per link class before
    and after, and the ILP's status and estimate.

    Raises
    ------
    ArtifactMismatch
        ``graph`` or ``topology`` is not the one the plan was made for.
    InfeasiblePlan
        The ILP is infeasible (a device's simulated peak exceeds its memory), naming
        the device and the bytes.
    SolverError
        CBC ended without a solution.

    Complexity: one simulation, an ILP of (candidate groups) binaries and (devices +
    links + groups) constraints, then at most (chosen + 1) simulations.
    """
    started = time.perf_counter()
    cm = CostModel(graph, topology)
    elem = ELEMENT_BYTES.get(graph.model.dtype, 4)
    base_plan = _with_sfb(plan, ())
    base = simulate(base_plan, graph, topology, cost_model=cm)  # (refuses a mismatched pair)
    candidates = _candidates(base_plan, base, cm, elem)
    chosen, ilp = _solve(base, candidates, cm, time_limit_s)
    kept, final = _verify(base_plan, base, candidates, chosen, graph, topology, cm)
    out = replace(_with_sfb(plan, kept),
                  prediction=Prediction(iteration_ms=round(final.iteration_ms, 6),
                                        peak_memory_bytes={d: int(b) for d, b in
                                                           final.peak_memory_bytes.items()}))
    layers = _switched_layers(final)
    note = (f"sfb: {len(kept)} of {len(candidates)} candidate groups exchange sufficient factors "
            f"({len(layers)} layers); simulated {base.iteration_ms:.3f} -> "
            f"{final.iteration_ms:.3f} ms")
    out = replace(out, notes=(*[n for n in plan.notes if not n.startswith("sfb:")], note))
    report = {
        "candidates": [c.group for c in candidates],
        "ilp_groups": list(chosen),
        "groups": list(kept),
        "layers": layers,
        "iteration_ms": {"before": round(float(base.iteration_ms), 6),
                         "after": round(float(final.iteration_ms), 6)},
        "ilp": ilp,
        "bytes_by_link_class": _bytes_by_class(base, final),
        "wall_time_s": round(time.perf_counter() - started, 4),
    }
    return out, report


def _with_sfb(plan: Plan, groups: Sequence[str]) -> Plan:
    """``plan`` with ``compression: sfb`` on exactly ``groups`` (among its AllReduce groups)."""
    chosen = set(groups)
    new = []
    for g in plan.groups:
        want = Compression.SFB if g.id in chosen else Compression.NONE
        if g.sync is SyncMethod.ALLREDUCE or g.compression is Compression.SFB:
            g = replace(g, compression=want)
        new.append(g)
    return replace(plan, groups=tuple(new))


def _candidates(plan: Plan, base: SimResult, cm: CostModel, elem: int) -> list[SfbCandidate]:
    """The groups SFB can change, and what it changes in each (see the module docstring)."""
    index = {o.id: o for o in cm.graph.ops}
    fusion = plan.fusion.gradient_buckets if plan.fusion is not None else ()
    in_bucket = {op for bucket in fusion for op in bucket}
    out = []
    for g in plan.groups:
        if g.sync is not SyncMethod.ALLREDUCE or len(g.devices) < 2:
            continue
        param_ops = [op for op in g.ops if index[op].param_bytes > 0]
        ops = sfb_ops(cm, g, param_ops, elem)
        if not ops:
            continue
        mine = set(param_ops)
        buckets = [[op for op in b if op in mine] for b in fusion]
        buckets.append([op for op in param_ops if op not in in_bucket])
        switched = set(ops)
        saved = 0.0
        names = list(g.devices)
        for bucket in buckets:
            total = float(sum(index[op].param_bytes for op in bucket))
            left = float(sum(index[op].param_bytes for op in bucket if op not in switched))
            saved += cm.allreduce_ms(names, total, g.collective) - cm.allreduce_ms(
                names, left, g.collective)
        gather = sum(cm.sfb_op_ms(op, names, elem_bytes=elem) or 0.0 for op in ops)
        recompute = {d: sum(cm.sfb_recompute_ms(op, d, s) for op in ops)
                     for d, s in zip(names, g.shares)}
        held = {d: sum(cm.sfb_factor_bytes(op) * (1.0 - s) for op in ops)
                for d, s in zip(names, g.shares)}
        out.append(SfbCandidate(group=g.id, ops=tuple(ops), saved_ms=saved, gather_ms=gather,
                                recompute_ms=recompute, held_bytes=held))
    return out


@dataclass(slots=True)
class _Timings:
    """What the ILP reads off the simulation of the plan without SFB."""

    group_start: dict[str, float] = field(default_factory=dict)
    group_allreduce: dict[str, float] = field(default_factory=dict)
    group_resources: dict[str, set[int]] = field(default_factory=dict)
    first_use: dict[int, float] = field(default_factory=dict)
    busy: dict[int, float] = field(default_factory=lambda: defaultdict(float))
    compute_end: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    update: dict[str, float] = field(default_factory=lambda: defaultdict(float))


def _timings(base: SimResult, groups: set[str]) -> _Timings:
    tg, sched = base.tasks, base.schedule
    out = _Timings()
    for t, kind in enumerate(tg.kind):
        start, end = sched.start_ms[t], sched.end_ms[t]
        if kind in COMPUTE_KINDS:
            device = tg.device_names[tg.device[t]]
            if kind == TaskKind.UPDATE:
                out.update[device] = max(out.update[device], end - start)
            else:
                out.compute_end[device] = max(out.compute_end[device], end)
            continue
        for r in tg.resources[t]:
            out.busy[r] += end - start
            out.first_use[r] = min(out.first_use.get(r, start), start)
        if kind == TaskKind.ALLREDUCE:
            label = str(tg.info[t][0])
            gid = label.split(" bucket ")[0] if label not in groups else label
            if gid in groups:
                out.group_start[gid] = min(out.group_start.get(gid, start), start)
                out.group_allreduce[gid] = out.group_allreduce.get(gid, 0.0) + end - start
                out.group_resources.setdefault(gid, set()).update(tg.resources[t])
    return out


def _solve(base: SimResult, candidates: list[SfbCandidate], cm: CostModel,
           time_limit_s: float) -> tuple[list[str], dict[str, Any]]:
    """The ILP of the module docstring; returns the chosen groups and its status."""
    _check_memory(base, candidates, cm)
    if not candidates:
        return [], {"status": "no candidates", "estimate_ms": round(base.iteration_ms, 6)}
    tim = _timings(base, {c.group for c in candidates})
    tg = base.tasks
    rid = {name: r for r, name in enumerate(tg.resource_names)}
    group_of = {g.id: g for g in base.plan.groups}
    prob = pulp.LpProblem("sfb", pulp.LpMinimize)
    x = {c.group: prob.add_variable(f"x{i}", lowBound=0, upBound=1, cat="Integer")
         for i, c in enumerate(candidates)}
    T = prob.add_variable("T", lowBound=0)
    prob += T + TIE_BREAK * pulp.lpSum(c.net_ms * x[c.group] for c in candidates)
    gather_res: dict[int, list[SfbCandidate]] = defaultdict(list)
    saved_res: dict[int, list[SfbCandidate]] = defaultdict(list)
    for c in candidates:
        g = group_of[c.group]
        held = tim.group_resources.get(c.group, set())
        update = max(tim.update[d] for d in g.devices)
        prob += T >= (tim.group_start.get(c.group, 0.0) + tim.group_allreduce.get(c.group, 0.0)
                      + (c.net_ms) * x[c.group] + update)
        for r in held:
            saved_res[r].append(c)
        links = set()
        for op in c.ops:
            rows_bytes = cm.sfb_factor_bytes(op) / len(g.devices)
            links.update(rid[h] for h, b in cm.collective_link_bytes(
                "allgather", list(g.devices), rows_bytes).items() if b > 0 and h in rid)
        for r in links | {r for r in held if r >= tg.n_links}:
            gather_res[r].append(c)
    for r in set(gather_res) | set(saved_res):
        prob += T >= (tim.first_use.get(r, 0.0) + tim.busy.get(r, 0.0)
                      + pulp.lpSum(c.gather_ms * x[c.group] for c in gather_res[r])
                      - pulp.lpSum(c.saved_ms * x[c.group] for c in saved_res[r]))
    devices = sorted({d for c in candidates for d in c.recompute_ms})
    capacity = {d: cm.memory_bytes(d) for d in devices}
    for d in devices:
        mine = [c for c in candidates if d in c.recompute_ms]
        prob += T >= tim.compute_end[d] + tim.update[d] + pulp.lpSum(
            c.recompute_ms[d] * x[c.group] for c in mine)
        prob += pulp.lpSum(c.held_bytes[d] * x[c.group] for c in mine) <= (
            capacity[d] - base.peak_memory_bytes[d])
    with warnings.catch_warnings():  # PuLP 3 flags its bundled CBC as deprecated; it still ships
        warnings.simplefilter("ignore", DeprecationWarning)
        status = prob.solve(pulp.PULP_CBC_CMD(msg=False, timeLimit=time_limit_s))
    name = pulp.LpStatus[status]
    if T.varValue is None or name == "Infeasible":  # (choosing nothing fits: see _check_memory)
        raise SolverError(f"plan sfb: CBC ended {name!r} without a solution")
    chosen = [c.group for c in candidates if (x[c.group].varValue or 0.0) > 0.5]
    return chosen, {"status": name.lower(), "estimate_ms": round(float(T.varValue), 6),
                    "candidates": len(candidates)}


def _check_memory(base: SimResult, candidates: list[SfbCandidate], cm: CostModel) -> None:
    """The ILP has no solution when a device's simulated peak already exceeds its memory
    (every choice, none included, holds at least that): say which device, by how much."""
    for device, peak in sorted(base.peak_memory_bytes.items()):
        capacity = cm.memory_bytes(device)
        if peak > capacity:
            factors = max((c.held_bytes.get(device, 0.0) for c in candidates), default=0.0)
            raise InfeasiblePlan(
                f"plan sfb: infeasible: device {device!r} needs {peak / GIB:.3f} GiB at its "
                f"peak without SFB ({peak} bytes) but has {capacity / GIB:.3f} GiB ({capacity} "
                f"bytes); SFB would hold up to {int(factors)} bytes of factors more")


def _verify(base_plan: Plan, base: SimResult, candidates: list[SfbCandidate], chosen: list[str],
            graph: OpGraph, topology: Topology, cm: CostModel) -> tuple[list[str], SimResult]:
    """Keep the ILP's choice only where the simulated time does not rise (module docstring)."""
    if not chosen:
        return [], base

    def run(groups: list[str]) -> SimResult:
        return simulate(_with_sfb(base_plan, groups), graph, topology, cost_model=cm,
                        check_fingerprints=False)

    gain = {c.group: c.net_ms for c in candidates}
    kept = list(chosen)
    current = run(kept)
    for gid in sorted(chosen, key=lambda g: (-gain[g], g)):  # smallest modelled gain first
        trial = [g for g in kept if g != gid]
        result = run(trial) if trial else base
        if result.iteration_ms <= current.iteration_ms and result.feasible:
            kept, current = trial, result
    if current.iteration_ms > base.iteration_ms or not current.feasible:
        return [], base
    return kept, current


def _switched_layers(result: SimResult) -> list[str]:
    """Ops the simulation gave an all-gather of factors (their ``"<op> factors"`` label)."""
    tg = result.tasks
    return [str(tg.info[t][0]).removesuffix(" factors") for t, k in enumerate(tg.kind)
            if k == TaskKind.ALLGATHER]


def _bytes_by_class(before: SimResult, after: SimResult) -> dict[str, dict[str, int]]:
    """Bytes carried (transfers and collectives) per link class (its bandwidth), both runs."""
    out: dict[str, dict[str, int]] = {}
    for when, result in (("before", before), ("after", after)):
        sums: dict[str, float] = defaultdict(float)
        for link in result.to_report().links:
            sums[f"{link.bandwidth_gbps:g} Gbps"] += link.transfer_bytes + link.collective_bytes
        for cls, nbytes in sums.items():
            out.setdefault(cls, {"before": 0, "after": 0})[when] = int(nbytes)
    return dict(sorted(out.items(), key=lambda kv: float(kv[0].split()[0])))
