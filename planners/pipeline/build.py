"""From a layout (stages on device runs, microbatch count) to scheduler inputs and to a Plan.

* ``replica_counts``: samples of each microbatch per replica, integer, chosen
  to equalise the replicas' times (largest remainder on the continuous
  balance, then moving single samples from the slowest replica while that
  helps); replicas left with no sample are dropped.
* ``stage_costs``: the ``StageCosts`` the scheduler times: slowest replica's
  forward and backward time per microbatch (and the part of the backward that
  computes input gradients, for split backwards), per stage pair the transfer of
  one microbatch between replicas whose batch intervals overlap (concurrent
  flows on the real routes) and the links each direction occupies, the part
  of the stage's gradient AllReduce that
  outlasts its last backward plus the optimizer update (the first stage's
  gradients go in buckets, each AllReduced, one after the other, as soon as
  the last microbatch's backward has produced it, of 25 MiB or of 1 MiB,
  whichever outlasts the backward less; later stages AllReduce once after
  their last backward, see ``_bucketed``), and each
  stage's in-flight cap (the
  memory left after parameters, gradients and optimizer state, over one
  microbatch of stashed activations). Tied weights shared by two stages are
  held by both and summed by one AllReduce over both stages' devices (``_tied``).
* ``groups_and_pipeline``: the plan's groups (one per stage), batch shares and
  the pipeline with every device's action list.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass

from dl_nfv.artifacts import Fusion, Group, Pipeline, ScheduleKind, SyncMethod, TieSync
from dl_nfv.planners.base import gradient_buckets, integer_shares
from dl_nfv.planners.schedules import Schedule, schedule_kind_of
from dl_nfv.simulator.costs import Flow

from .partition import Layout, StageSpec
from .problem import Problem
from .scheduler import StageCosts

# Memory kept free on every device for what the cost model does not count (workspace).
RESERVE_FRACTION = 0.0
# Gradient bucket caps of a replicated first stage: DDP's default (as the dp baseline) and
# the cap of DDP's first bucket, whichever leaves less AllReduce after the last backward.
BUCKET_CAPS = (25 * 2**20, 2**20)
BUCKET_BYTES = BUCKET_CAPS[0]


@dataclass(frozen=True, slots=True)
class Replicas:
    """A stage's replicas and their samples per microbatch."""

    devices: tuple[str, ...]
    counts: tuple[int, ...]

    @property
    def total(self) -> int:
        return sum(self.counts)

    def shares(self) -> tuple[float, ...]:
        total = self.total
        shares = [c / total for c in self.counts]
        return (*shares[:-1], 1.0 - sum(shares[:-1]))


def replica_counts(problem: Problem, stage: StageSpec, microbatches: int) -> Replicas:
    """Integer samples per replica that equalise the replicas' per-microbatch times."""
    mb = problem.batch_size // microbatches
    devices = stage.devices
    if len(devices) == 1:
        return Replicas(devices, (mb,))

    def time(d: str, count: int) -> float:
        if count == 0:
            return 0.0
        f, b = problem.times(stage.start, stage.stop, d, count / problem.batch_size)
        return f + b

    per_sample = [max(time(d, 1) - 0.0, 1e-12) for d in devices]
    weights = [1.0 / w for w in per_sample]
    counts = integer_shares(mb, weights)
    for _ in range(4 * len(devices) + mb):
        times = [time(d, c) for d, c in zip(devices, counts)]
        slow = max(range(len(devices)), key=lambda i: (times[i], -i))
        if counts[slow] == 0:
            break
        after = [time(d, c + 1) for d, c in zip(devices, counts)]
        fast = min((i for i in range(len(devices)) if i != slow), key=lambda i: (after[i], i))
        if after[fast] >= times[slow] - 1e-12:
            break
        counts[slow] -= 1
        counts[fast] += 1
    kept = [(d, c) for d, c in zip(devices, counts) if c > 0]
    return Replicas(tuple(d for d, _ in kept), tuple(c for _, c in kept))


def all_replicas(problem: Problem, layout: Layout) -> list[Replicas]:
    """``replica_counts`` of every stage (memoised per stage in ``problem.cache``)."""
    memo = problem.cache.setdefault("replicas", {})
    out = []
    for s in layout.stages:
        key = (s.start, s.stop, s.devices, layout.microbatches)
        if key not in memo:
            memo[key] = replica_counts(problem, s, layout.microbatches)
        out.append(memo[key])
    return out


def stage_costs(problem: Problem, layout: Layout, reps: Sequence[Replicas]) -> StageCosts:
    """Scheduler inputs of ``layout`` with replicas ``reps`` (see the module docstring).

    A stage's terms and a stage pair's transfers are functions of what their keys hold
    (the stage's ops, replicas and what tied weights add to it; the pair's bytes and
    replicas), memoised in ``problem.cache``: the search's neighbours share most stages."""
    M = layout.microbatches
    tied = _tied(problem, layout, reps)
    memo = problem.cache.setdefault("stage_terms", {})
    terms = []
    for s, (stage, r) in enumerate(zip(layout.stages, reps)):
        key = (stage.start, stage.stop, r, M, _bucketed(layout, stage), tied.borrowed[s],
               tied.borrowed_whole[s], tied.lent[s], tied.unsummed[s], tied.add_ms[s])
        if key not in memo:
            memo[key] = _stage_terms(problem, *key)
        terms.append(memo[key])
    f_ms, b_ms, bi_ms, sync_ms, caps = (tuple(col) for col in zip(*terms))
    bounds = [s.start for s in layout.stages] + [layout.stages[-1].stop]
    sends = problem.cache.setdefault("stage_sends", {})
    send_ms, links = {}, {}
    for (s, t), nbytes in problem.pair_bytes(bounds).items():
        key = (reps[s], reps[t], nbytes, M)
        if key not in sends:
            sends[key] = _sends(problem, *key)
        send_ms[(s, t)], links[(s, t, "F")], links[(s, t, "B")] = sends[key]
    return StageCosts(f_ms=f_ms, b_ms=b_ms, send_ms=send_ms, sync_ms=sync_ms,
                      caps=caps, microbatches=M, links=links, ties=tied.allreduces,
                      exchanges=tied.exchanges, bi_ms=bi_ms)


def _stage_terms(problem: Problem, start: int, stop: int, r: Replicas, M: int, bucketed: bool,
                 borrowed: float, borrowed_whole: float, lent: float, unsummed: tuple[str, ...],
                 add_ms: float) -> tuple[float, float, float, float, int]:
    """One stage's forward, backward, input-gradient and sync ms and in-flight cap."""
    cm, B = problem.cm, problem.batch_size
    times = [problem.times(start, stop, d, c / B) for d, c in zip(r.devices, r.counts)]
    own = problem.params(start, stop)
    # each backward adds the stage's weight gradients (and tied copies) into their buckets;
    # an owner of a tied weight split across stages no longer sums it in the graph
    added = own + borrowed
    backs = [max(0.0, t[1] + added * cm.accumulate_ms_per_byte(d)
                 - sum(cm.tie_sum_ms(o, d) for o in unsummed))
             for t, d in zip(times, r.devices)]
    # a split backward's I: the input gradients, and all of the backward of the ops
    # that defer nothing (no weight gradients, or the split not profiled), with their
    # adding into buckets and less their tie sums, as the simulator lowers them
    whole = float(problem.whole_param_prefix[stop] - problem.whole_param_prefix[start])
    whole += borrowed_whole
    inputs = [problem.input_ms(start, stop, d, c / B) + whole * cm.accumulate_ms_per_byte(d)
              - sum(cm.tie_sum_ms(o, d) for o in unsummed if problem.whole_op[o])
              for d, c in zip(r.devices, r.counts)]
    bi = max(min(max(i, 0.0), back) for i, back in zip(inputs, backs))
    params = own - lent
    sync = 0.0
    if len(r.devices) > 1 and params > 0:
        sync += (_exposed_allreduce_ms(problem, StageSpec(start, stop, r.devices), r)[0]
                 if bucketed else cm.allreduce_ms(r.devices, params))
    held = own + borrowed
    if held > 0:
        sync += max(cm.update_ms(held, d, problem.optimizer) + cm.upkeep_ms(held, d, 0)
                    for d in r.devices)
    static = problem.static_bytes(start, stop) + borrowed * (2.0 + problem.state_factor)
    act = problem.activation_bytes(start, stop)
    cap = M
    for d, c in zip(r.devices, r.counts):
        free = cm.memory_bytes(d) * (1 - RESERVE_FRACTION) - static
        per_mb = act * c / B
        if per_mb > 0:
            cap = min(cap, math.floor(free / per_mb) if free > 0 else 0)
        elif free < 0:
            cap = 0
    return max(t[0] for t in times), max(backs), bi, sync + add_ms, cap


def _sends(problem: Problem, a: Replicas, b: Replicas, nbytes: float, M: int) -> tuple:
    """A stage pair's transfer of one microbatch (ms) and the links it takes each way."""
    cm = problem.cm
    flows = [Flow(da, db, nbytes * overlap / M) for da, db, overlap in _overlaps(a, b)]
    return (cm.concurrent_ms(flows), cm.flow_links(flows),
            cm.flow_links(Flow(f.dst, f.src, f.nbytes) for f in flows))


@dataclass(frozen=True, slots=True)
class _Tied:
    """Per stage, what tied weights shared across stages add (as the simulator lowers them)."""

    borrowed: tuple[float, ...]  # bytes of other stages' parameters held, summed and updated here
    # of those, the bytes used by ops whose backward defers nothing (Problem.whole_op)
    borrowed_whole: tuple[float, ...]
    lent: tuple[float, ...]  # bytes of own parameters summed with the sharers instead
    unsummed: tuple[tuple[str, ...], ...]  # the owner ops of those (CostModel.tie_sum_ms)
    # per tie, the stages holding it and its AllReduce: it starts after the last of their
    # backwards, and every one of them updates after it
    allreduces: tuple[tuple[tuple[int, ...], float], ...]
    # ties summed by exchange (StageCosts.exchanges), and per stage the time of its sums
    exchanges: tuple[tuple[int, int, float, frozenset, float, frozenset], ...] = ()
    add_ms: tuple[float, ...] = ()


def _tied(problem: Problem, layout: Layout, reps: Sequence[Replicas]) -> _Tied:
    """Tied weights across stages: every device of the owner's and the sharers' stages holds
    the weight, and one AllReduce over all of them sums its gradient after the last of their
    backwards, before any of them updates; or, when the problem's plans exchange ties and
    this one qualifies (``CostModel.exchangeable``), the sharer's dense gradient goes to
    the owner and the owner's rows come back (``StageCosts.exchanges``), and each adds
    what it receives before its update (``add_ms``), as the simulator lowers it."""
    S = len(layout.stages)
    borrowed, lent, ar, ex, add = [0.0] * S, [0.0] * S, [], [], [0.0] * S
    borrowed_whole = [0.0] * S
    unsummed: list[list[str]] = [[] for _ in range(S)]
    if not problem.ties:
        return _Tied(tuple(borrowed), tuple(borrowed_whole), tuple(lent),
                     tuple(map(tuple, unsummed)), (), (), tuple(add))
    cm = problem.cm
    stops = [st.stop for st in layout.stages]
    sharers: dict[tuple[str, int], tuple[float, set[int], str]] = {}
    whole_sharers: set[tuple[str, int]] = set()  # (tie, stage) used there by a whole backward
    for (name, owner, sharer, nbytes), (_, _, sharer_op, _) in zip(problem.ties, cm.ties):
        so, ss = bisect.bisect_right(stops, owner), bisect.bisect_right(stops, sharer)
        if so != ss:
            sharers.setdefault((name, so), (nbytes, set(), problem.tie_owner[name]))[1].add(ss)
            if problem.whole_op[sharer_op]:
                whole_sharers.add((name, ss))
    for (name, so), (nbytes, stages, owner) in sorted(sharers.items()):
        holders = list(dict.fromkeys(d for s in (so, *sorted(stages)) for d in reps[s].devices))
        extra = [s for s in stages if set(reps[s].devices) - set(reps[so].devices)]
        if not extra:
            continue
        lent[so] += nbytes
        if owner not in unsummed[so]:
            unsummed[so].append(owner)
        for s in extra:
            borrowed[s] += nbytes
            if (name, s) in whole_sharers:
                borrowed_whole[s] += nbytes
        if problem.tie_sync is TieSync.EXCHANGE and len(extra) == 1 and cm.exchangeable(
                owner, reps[so].devices, [reps[s].devices for s in stages]):
            (st,) = extra
            (a,), (b,) = reps[so].devices, reps[st].devices
            rows = cm.tie_rows[owner]
            ex.append((so, st, cm.transfer_ms(b, a, nbytes), cm.flow_links([Flow(b, a, nbytes)]),
                       cm.transfer_ms(a, b, rows), cm.flow_links([Flow(a, b, rows)])))
            add[so] += cm.exchange_add_ms(a, nbytes)
            add[st] += cm.exchange_add_ms(b, rows)
            continue
        ar.append(((so, *sorted(extra)), cm.allreduce_ms(holders, nbytes)))
    return _Tied(tuple(borrowed), tuple(borrowed_whole), tuple(lent), tuple(map(tuple, unsummed)),
                 tuple(ar), tuple(ex), tuple(add))


def _exposed_allreduce_ms(problem: Problem, stage: StageSpec, reps: Replicas) -> tuple[float, float]:
    """How long the stage's bucketed AllReduces run past the end of its last backward, at
    the bucket cap of ``BUCKET_CAPS`` that leaves the least; returns (ms, cap).

    The last microbatch's backward visits the stage's ops in reverse order on
    the slowest replica; a bucket is AllReduced when its last op is done and
    the previous bucket's AllReduce has finished (one collective stream). Large
    buckets pay the collectives' latency fewer times; small ones start sooner and
    leave less to run after the backward (a stage of few parameters: all of them
    in one 25 MiB bucket that waits for the backward's end).
    """
    key = (stage.start, stage.stop, reps)
    cache = problem.cache.setdefault("exposed", {})
    if key in cache:
        return cache[key]
    cm = problem.cm
    ops = problem.stage_ops(stage.start, stage.stop)
    slowest = max(zip(reps.devices, reps.counts), key=lambda dc: sum(
        problem.times(stage.start, stage.stop, dc[0], dc[1] / problem.batch_size)))
    frac = slowest[1] / problem.batch_size
    needs = problem.needs_grad
    done_at: dict[str, float] = {}
    clock = 0.0
    for op in reversed(ops):
        if needs[op]:
            clock += cm.op_ms(op, slowest[0], "bwd", frac)
        done_at[op] = clock
    best = (float("inf"), BUCKET_BYTES)
    for cap in BUCKET_CAPS:
        end = 0.0
        for bucket in _buckets(problem, stage, cap):
            ready = max(done_at[op] for op in bucket)
            nbytes = float(sum(cm.param_bytes[cm.op_index[op]] for op in bucket))
            end = max(end, ready) + cm.allreduce_ms(reps.devices, nbytes)
        exposed = max(0.0, end - clock)
        if exposed < best[0] - 1e-9:
            best = (exposed, cap)
    cache[key] = best
    return best


def _buckets(problem: Problem, stage: StageSpec, cap: float = BUCKET_BYTES) -> list[tuple[str, ...]]:
    """The stage's gradient buckets of ``cap`` bytes (``base.gradient_buckets``, memoised)."""
    key = (stage.start, stage.stop, cap)
    cache = problem.cache.setdefault("buckets", {})
    if key not in cache:
        ops = problem.stage_ops(stage.start, stage.stop)
        cache[key] = list(gradient_buckets(problem.graph, ops, cap))
    return cache[key]


def _bucketed(layout: Layout, stage: StageSpec) -> bool:
    """Whether the stage's gradients go in buckets: only for the first stage.

    A bucket's AllReduce starts while the last microbatch's backward still runs and
    holds the replicas' links; on a later stage it would take them just before the
    activation gradient for the stage in front is sent, and delay that stage's last
    backward and everything upstream. One AllReduce after the last backward queues
    behind that send instead (and overlaps the rest of the drain).
    """
    return stage.start == layout.stages[0].start


def first_stage_cap(problem: Problem, layout: Layout, reps: Sequence[Replicas]) -> float | None:
    """The bucket cap of the first stage's gradients, the one of ``BUCKET_CAPS`` that leaves
    the least of their AllReduce after its last backward; None when it is not replicated."""
    stage, r = layout.stages[0], reps[0]
    if len(r.devices) < 2:
        return None
    return _exposed_allreduce_ms(problem, stage, r)[1]


def stage_buckets(problem: Problem, layout: Layout, reps: Sequence[Replicas],
                  cap: float | None = None) -> Fusion | None:
    """Gradient buckets of the first stage when replicated (see ``_bucketed``), of ``cap``
    bytes (default: ``first_stage_cap``); None when it is not replicated."""
    chosen = first_stage_cap(problem, layout, reps)
    if chosen is None:
        return None
    buckets = _buckets(problem, layout.stages[0], cap or chosen)
    return Fusion(gradient_buckets=tuple(buckets)) if buckets else None


def _overlaps(a: Replicas, b: Replicas):
    """Replica pairs whose batch intervals overlap, with the overlap (fraction of the batch)."""
    out = []
    lo_a = 0.0
    for da, sa in zip(a.devices, a.shares()):
        lo_b = 0.0
        for db, sb in zip(b.devices, b.shares()):
            o = min(lo_a + sa, lo_b + sb) - max(lo_a, lo_b)
            if o > 1e-12:
                out.append((da, db, o))
            lo_b += sb
        lo_a += sa
    return out


def groups_and_pipeline(problem: Problem, layout: Layout, reps: Sequence[Replicas],
                        schedule: Schedule) -> tuple[list[Group], Pipeline]:
    """The plan's groups (``stage0``, ``stage1``, ...) and its pipeline."""
    groups = []
    for s, (stage, r) in enumerate(zip(layout.stages, reps)):
        multi = len(r.devices) > 1
        groups.append(Group(id=f"stage{s}", ops=problem.stage_ops(stage.start, stage.stop),
                            devices=r.devices, batch_shares=r.shares() if multi else (),
                            sync=SyncMethod.ALLREDUCE if multi else SyncMethod.NONE))
    kind = ScheduleKind(schedule_kind_of(schedule))
    pipeline = Pipeline(microbatches=layout.microbatches, stages=tuple(g.id for g in groups),
                        schedule_kind=kind,
                        schedule=schedule.device_schedules([r.devices for r in reps]))
    return groups, pipeline
