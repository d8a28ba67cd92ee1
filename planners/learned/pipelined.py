"""Micro-batched execution of a per-group strategy: the batching searched jointly with the
placement (dl-nfv's extension of HeteroG; TAG's ``tag.batching`` runs the pipeline).

HeteroG's strategies run each iteration as one batch: on a chain of layers (most CNNs) a
group placed on one device leaves every other device idle while it runs, so model
parallelism only pays where a group's gradients are too costly to synchronise. Run as a
synchronous pipeline of ``M`` microbatches (``tag.batching.Batching``: the op groups, in
topological order, are its stages; GPipe or 1F1B over the runs of groups that take one
strategy), the same placement keeps every device busy: this module searches the
microbatch count and the schedule together with the placement.

Method (``pipelined``):

1. **Starts.** The given strategy (HeteroG's refined one), and the **stage starts**: the
   op groups cut into contiguous stages, one per unit, each unit's share of the work
   (forward plus backward on the fastest device type) proportional to its speed
   (``base.device_speeds``, summed over a unit's devices); units are the single devices
   in the cluster's order and in reverse, and the hosts (their devices as a replica set
   with AllReduce and proportional shares, a host's candidate in ``decoder.candidates``)
   in order and in reverse.
2. **Batching.** Every start is simulated under every batching (``tag.batching.batchings``:
   one microbatch, then each count of ``MICROBATCH_COUNTS`` dividing the batch, up to
   ``microbatches``, with each schedule; a batching under which some replica would
   hold fewer samples than microbatches is invalid and penalised); the best pair is kept.
3. **Refinement.** Where the best pair has more than one microbatch, TAG's refinement
   (``tag.polish``) climbs it: each stage cut at its best position between its
   neighbours, then the batching with the placement repaired for it, then every
   single-group move over HeteroG's candidates, first improvement, until a local optimum
   or ``max_evaluations`` simulations in all or ``time_limit_s`` CPU seconds; the result
   is simulated at every batching last.

Returns the best (strategies, batching) met and its outcome, never worse than the given
strategy at one microbatch. Complexity: (starts x batchings) + ``max_evaluations``
simulations; a simulation of ``M`` microbatches costs about ``M`` times one of a batch.

Limits: those of ``tag.batching`` (GPipe and 1F1B over op-group boundaries, one gradient
synchronisation per group, no list-scheduled orders) and of ``tag.polish`` (single-group
moves); the stage starts are rules, not the policy's (the policy decodes placements at
one microbatch).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from ..base import device_speeds
from ..tag.batching import ONE, BatchedEnv, Batching, batchings
from ..tag.polish import IMPROVEMENT, polish
from .env import GroupStrategy, Outcome, StrategyEnv

MICROBATCHES = 32


@dataclass(frozen=True, kw_only=True, slots=True)
class Pipelined:
    """The best strategy and batching met, its outcome, the start it came from and the
    simulations spent."""

    strategies: tuple[GroupStrategy, ...]
    batching: Batching
    outcome: Outcome
    origin: str
    evaluations: int


def pipelined(env: StrategyEnv, strategies: Sequence[GroupStrategy], *,
              microbatches: int = MICROBATCHES, max_evaluations: int = 300,
              time_limit_s: float = 30.0) -> Pipelined:
    """The batching searched jointly with the placement (module docstring)."""
    batched = BatchedEnv(env)
    choices = [b for b in batchings(batched.batch_size) if b.microbatches <= microbatches]
    cpu0 = time.process_time()
    given = tuple(strategies)
    best = batched.evaluate(given, ONE)
    found, batching, origin, evaluations = given, ONE, "the refined strategy", 1
    for name, start in (("the refined strategy", given), *stage_starts(env)):
        for b in choices:
            if (start, b) == (given, ONE):
                continue
            outcome = batched.evaluate(start, b)
            evaluations += 1
            if outcome.reward > best.reward + IMPROVEMENT * abs(best.reward):
                best, found, batching, origin = outcome, start, b, name
    if batching.microbatches == 1:
        return Pipelined(strategies=found, batching=batching, outcome=best, origin=origin,
                         evaluations=evaluations)
    left = max(0.0, time_limit_s - (time.process_time() - cpu0))
    polished = polish(batched, found, batching, choices, max_evaluations=max_evaluations,
                      time_limit_s=left)
    return Pipelined(strategies=polished.strategies, batching=polished.batching,
                     outcome=polished.outcome, origin=origin,
                     evaluations=evaluations + polished.evaluations)


def stage_starts(env: StrategyEnv) -> list[tuple[str, tuple[GroupStrategy, ...]]]:
    """The stage starts (module docstring), each with a word on its units."""
    devices = env.devices
    hosts: dict[str, list[str]] = {}
    for d in devices:
        hosts.setdefault(env.cm.cluster.device(d).host, []).append(d)
    singles = [GroupStrategy(devices=(d,)) for d in devices]
    per_host = [GroupStrategy(devices=tuple(ds)) if len(ds) == 1 else
                GroupStrategy(devices=tuple(ds), balance="proportional") for ds in hosts.values()]
    out = []
    for name, units in (("devices", singles), ("hosts", per_host)):
        if len(units) < 2:
            continue
        out.append((f"a stage per {name[:-1]}", stages(env, units)))
        out.append((f"a stage per {name[:-1]}, last first", stages(env, units[::-1])))
    return out


def stages(env: StrategyEnv, units: Sequence[GroupStrategy]) -> tuple[GroupStrategy, ...]:
    """The op groups cut into contiguous stages, one per unit in order: a group goes to the
    unit whose interval of the cumulative work (each unit's width proportional to its
    speed) holds the group's midpoint. Work: forward plus backward on the fastest type."""
    cm = env.cm
    speed = dict(zip(env.devices, device_speeds(cm, env.devices)))
    fastest = max(env.devices, key=speed.__getitem__)
    work = [sum(cm.ops_ms(ops, fastest, 1.0)) for ops in env.coarsening.groups]
    weights = [sum(speed[d] for d in u.devices) for u in units]
    total, scale = sum(work), sum(work) / sum(weights)
    ends, acc = [], 0.0
    for w in weights:
        acc += w * scale
        ends.append(acc)
    out, done, k = [], 0.0, 0
    for w in work:
        mid = done + w / 2
        while k < len(units) - 1 and mid > ends[k] and total:
            k += 1
        out.append(units[k])
        done += w
    return tuple(out)
