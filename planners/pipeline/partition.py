"""Partition + device mapping by dynamic programming over stage boundaries and device groups.

Given a device **ordering** (a sequence of the cluster's devices in which
neighbours are well connected, see ``mapping``), a stage is a range of ops
``[a, b)`` placed on a contiguous run of the ordering ``[j0, j1)``, replicated
over those devices with batch shares that equalise their times (faster devices
take more samples). Devices before the first and after the last stage stay
unused, so a slow end of the ordering can be left out.

For ``m`` microbatches the cost of a stage is estimated analytically:

* ``t`` = its per-microbatch forward+backward time with balanced shares, plus
  adding the weight gradients into their buckets (each backward does),
* ``load = m x t + allreduce(params over the group) + optimizer update``: the
  time the stage is busy per iteration,
* ``c`` = the per-microbatch transfer of the activations crossing its left
  boundary, over the route between the last device of the previous group and
  the first of this one (both directions carry it once per microbatch).

A synchronous pipeline with a flush takes about
``(m - 1) x bottleneck + sum over stages of (t + 2c)``: the bottleneck stage
runs ``m`` microbatches back to back, and one microbatch has to travel through
every stage to fill and drain the pipeline. So for a cap ``tau`` on every
stage's ``load`` (and on ``m x c``, a link's load) the DP minimises the sum
``sum(t + 2c)``; ``tau`` sweeps a grid above the smallest feasible cap
(found by a min-max DP). Each ``tau`` yields one layout; all are timed
exactly afterwards by the scheduler and the best kept.

Memory: every replica holds its stage's parameters, gradients and optimizer
state plus one microbatch of stashed activations (the scheduler then caps the
microbatches in flight by what is left).

Device runs start and end anywhere on an ordering of at most ``MAX_DEVICE_SLOTS`` (32)
devices; on a longer one every ``g = ceil(D / 32)`` devices, and anywhere within the first and
the last ``g`` (``device_slots``: 64 devices in pairs, 128 in fours, with single devices at
both ends, where a model's embedding, head and tied weights are), which keeps the tables'
size and time nearly independent of the cluster's beyond that (GPT-2 XL on 128 V100s: 6 GB
and four minutes of tables with every run, 0.7 GB and seconds now).

Complexity: O(n^2 x J^2 x T) to build the tables (n ops, J <= min(D, 32 + 2g) + 1 run
boundaries, T device types) and O(n^2 x J^2 x K) for the DP over K caps, vectorised with numpy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dl_nfv.artifacts import Collective

from .problem import Problem
from .symmetry import collective_key

INF = np.inf
TAU_GRID = (1.0, 1.02, 1.05, 1.1, 1.17, 1.25, 1.35, 1.5, 1.7, 2.0, 2.5, 3.5)
# the tables hold every pair of device-run boundaries: on a longer ordering, runs start and end
# only every ``ceil(devices / MAX_DEVICE_SLOTS)`` devices (``device_slots``)
MAX_DEVICE_SLOTS = 32


def device_slots(devices: int, most: int = MAX_DEVICE_SLOTS) -> tuple[int, ...]:
    """Where the device runs of an ordering of ``devices`` may start and end: every position
    up to ``most`` devices, else every ``ceil(devices / most)``-th, and every position of the
    first and the last such slot (the first and the last stage, which hold a model's
    embedding and head and often a tied weight, can then be a single device)."""
    if devices <= most:
        return tuple(range(devices + 1))
    step = -(-devices // most)
    edges = set(range(0, step + 1)) | set(range(max(devices - step, 0), devices + 1))
    return tuple(sorted(set(range(0, devices, step)) | edges | {devices}))


@dataclass(frozen=True, slots=True)
class StageSpec:
    """One stage of a layout: ops ``order[start:stop]`` replicated on ``devices``."""

    start: int
    stop: int
    devices: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Layout:
    """A pipeline layout before scheduling: stages and the microbatch count."""

    stages: tuple[StageSpec, ...]
    microbatches: int
    origin: str = "dp"

    @property
    def key(self) -> tuple:
        return (tuple((s.start, s.stop, s.devices) for s in self.stages), self.microbatches)


def _untied(p: Problem) -> np.ndarray:
    """``[T, a, b]``: the tie sums a stage of units ``[a, b)`` does not do, as the scheduler's
    stage costs charge them: a stage holding a tied weight's owner and none of its sharers
    leaves the sum of their gradients to the AllReduce (``CostModel.tie_sum_ms``)."""
    if "untied" in p.cache:
        return p.cache["untied"]
    n = p.n
    out = np.zeros((p.f_fixed.shape[0], n + 1, n + 1))
    sharers: dict[tuple[str, int], list[int]] = {}
    for name, owner, sharer, _ in p.ties:
        sharers.setdefault((p.tie_owner[name], owner), []).append(sharer)
    a = np.arange(n + 1)[:, None]
    b = np.arange(n + 1)[None, :]
    for (op, unit), units in sorted(sharers.items()):
        alone = (a <= unit) & (unit < b)
        for s in units:
            alone &= ~((a <= s) & (s < b))
        out += p.tie_sum_ms[p.pos[op]][:, None, None] * alone[None]
    p.cache["untied"] = out
    return out


class OrderingTables:
    """What the stage costs of one ordering share across microbatch counts.

    Per (op range, device run): the balance terms of the group's compute
    (``sum 1/scalable`` and ``sum fixed/scalable`` over its devices), parameter
    and activation bytes, the smallest memory, AllReduce plus update time, and
    the neighbour routes. ``for_microbatches(m)`` finishes the tables for ``m``.
    """

    def __init__(self, problem: Problem, ordering: Sequence[str], collective_cache: dict | None = None):
        p = problem
        self.problem = p
        self.ordering = tuple(ordering)
        n, D = p.n, len(ordering)
        # runs [j0, j1) are between slot boundaries: the tables are [J, J] over them
        self.cuts = cuts = device_slots(D)
        J = len(cuts)
        dev_idx = np.array([p.device_index[d] for d in ordering])
        types = p.type_of[dev_idx]
        T = p.f_fixed.shape[0]
        onehot = np.zeros((D, T))
        onehot[np.arange(D), types] = 1.0
        cum = np.zeros((D + 1, T))
        cum[1:] = np.cumsum(onehot, axis=0)
        cum = cum[list(cuts)]
        counts = cum[None, :, :] - cum[:, None, :]  # [j0, j1, T]
        counts[counts < 0] = 0.0
        self.size = counts.sum(axis=2)  # [j0, j1]
        fixed = (p.f_fixed + p.b_fixed)
        scal = (p.f_scal + p.b_scal)
        fix_ab = fixed[:, None, :] - fixed[:, :, None]  # [T, a, b]
        fix_ab -= _untied(p)
        scal_ab = np.maximum(scal[:, None, :] - scal[:, :, None], 1e-9)
        self.inv = np.einsum("tab,jkt->abjk", 1.0 / scal_ab, counts)
        self.fx = np.einsum("tab,jkt->abjk", fix_ab / scal_ab, counts)
        params = p.param_prefix[None, :] - p.param_prefix[:, None]  # [a, b]
        self.static = params * (2.0 + p.state_factor)
        self.act = p.out_prefix[None, :] - p.out_prefix[:, None] + p.cut_bytes[:, None] * (
            np.arange(n + 1)[:, None] > 0)
        mem = p.memory_bytes[dev_idx]
        self.min_mem = _over_runs(mem, cuts, np.minimum, INF)
        sync_a, sync_b = self._sync_coefficients(p, ordering, cuts, collective_cache)
        ar = np.min(sync_a[:, None, None, :, :] + sync_b[:, None, None, :, :]
                    * params[None, :, :, None, None], axis=0)
        # optimizer step and gradient-bucket upkeep of the slowest replica (the cost model's)
        # (zeroing its buckets once per step; adding into them in every microbatch's backward)
        upd = np.array([p.cm.update_ms_per_byte(d, p.optimizer) + p.cm.upkeep_ms_per_byte(d, 0)
                        for d in ordering])
        acc = np.array([p.cm.accumulate_ms_per_byte(d) for d in ordering])
        launch = np.array([p.cm.update_launch_ms(d) for d in ordering])
        per_byte = _over_runs(upd, cuts, np.maximum, 0.0)
        acc_per_byte = _over_runs(acc, cuts, np.maximum, 0.0)
        upd_launch = _over_runs(launch, cuts, np.maximum, 0.0)
        has = params[:, :, None, None] > 0
        self.sync = np.where(has, ar + upd_launch[None, None] + per_byte[None, None]
                             * params[:, :, None, None], 0.0)
        self.accumulate = np.where(has, acc_per_byte[None, None] * params[:, :, None, None], 0.0)
        self.route_lat_ms = np.zeros(J)
        self.route_ms_per_byte = np.zeros(J)
        for j0 in range(1, J - 1):  # a stage starting at slot boundary j0 > 0 receives there
            self.route_lat_ms[j0], self.route_ms_per_byte[j0] = p.cm.transfer_affine(
                ordering[cuts[j0] - 1], ordering[cuts[j0]])
        ab = np.triu(np.ones((n + 1, n + 1), dtype=bool), 1)
        jj = np.triu(np.ones((J, J), dtype=bool), 1)
        self.shape_ok = ab[:, :, None, None] & jj[None, None]

    def for_microbatches(self, m: int) -> Tables:
        return Tables(self, m)

    def devices(self, j0: int, j1: int) -> tuple[str, ...]:
        """The devices of the run between slot boundaries ``j0`` and ``j1``."""
        return self.ordering[self.cuts[j0]:self.cuts[j1]]

    @staticmethod
    def _sync_coefficients(p: Problem, ordering: Sequence[str], cuts: Sequence[int],
                           cache: dict | None):
        """AllReduce time of every device run as ``min over algorithms of a + b x bytes``, each
        algorithm's ``(a, b)`` the cost model's (``allreduce_affine``), asked once per
        ``symmetry.collective_key``: per device set, or on a uniform cluster per class of
        device sets that its automorphisms map onto each other."""
        J = len(cuts)
        algos = (Collective.RING, Collective.TREE, Collective.HIERARCHICAL)
        a = np.zeros((len(algos), J, J))
        b = np.zeros((len(algos), J, J))
        cache = cache if cache is not None else {}
        for j0 in range(J - 1):
            for j1 in range(j0 + 1, J):
                group = tuple(ordering[cuts[j0]:cuts[j1]])
                if len(group) < 2:
                    continue
                key = collective_key(p.cm, p.labels, group)  # a class of groups, exactly
                coeffs = cache.get(key)
                if coeffs is None:
                    coeffs = cache[key] = [p.cm.allreduce_affine(group, alg) for alg in algos]
                for k, (ca, cb) in enumerate(coeffs):
                    a[k, j0, j1] = ca
                    b[k, j0, j1] = cb
        return a, b


def _over_runs(values: np.ndarray, cuts: Sequence[int], ufunc, empty: float) -> np.ndarray:
    """``[j0, j1]``: ``ufunc`` (``np.minimum`` or ``np.maximum``) of ``values`` over the devices
    from slot boundary ``j0`` to ``j1`` (``empty`` where ``j1 <= j0``)."""
    J = len(cuts)
    out = np.full((J, J), empty)
    for j0 in range(J - 1):
        run = ufunc.accumulate(values[cuts[j0]:])  # over the first k devices of the run
        out[j0, j0 + 1:] = run[np.asarray(cuts[j0 + 1:]) - cuts[j0] - 1]
    return out


class Tables:
    """Stage costs of every (op range, device run) of one ordering at ``m`` microbatches."""

    def __init__(self, base: OrderingTables, m: int):
        p = base.problem
        self.problem = p
        self.base = base
        self.ordering = base.ordering
        self.m = m
        with np.errstate(divide="ignore", invalid="ignore"):
            t = (1.0 + m * base.fx) / (m * base.inv)
        need_mem = base.static[:, :, None, None] + \
            base.act[:, :, None, None] / (m * np.maximum(base.size, 1.0))[None, None, :, :]
        valid = base.shape_ok & (need_mem <= base.min_mem[None, None, :, :])
        valid &= (base.size <= p.batch_size // m)[None, None]
        valid &= np.isfinite(t)
        load = m * t + base.sync + m * base.accumulate
        comm = base.route_lat_ms[None, :] + (p.cut_bytes[:, None] / m) * base.route_ms_per_byte[None, :]
        comm[0, :] = 0.0
        comm[:, 0] = 0.0
        self.t = t
        self.need = np.where(valid, np.maximum(load, m * comm[:, None, :, None]), INF)
        self.sumc = t + base.accumulate + 2 * comm[:, None, :, None]

    # ------------------------------------------------------------------- DPs
    def min_bottleneck(self) -> float:
        """The smallest cap ``tau`` any layout of this ordering meets (inf if none fits)."""
        n, J = self.problem.n, len(self.base.cuts)
        best = np.full((n + 1, J), INF)
        best[0, :] = 0.0
        for i in range(1, n + 1):
            cand = np.maximum(best[:i, :, None], self.need[:i, i, :, :])  # [a, j0, j1]
            best[i] = cand.min(axis=(0, 1))
        return float(best[n].min())

    def layouts(self, taus: Sequence[float], max_stages: int = 0, origin: str = "dp") -> list[Layout]:
        """For each cap in ``taus``, the layout minimising the fill/drain sum (None-free list)."""
        n, J = self.problem.n, len(self.base.cuts)
        K = len(taus)
        tau = np.asarray(taus, dtype=np.float64)
        S = max_stages if 0 < max_stages < min(J - 1, n) else 0
        if S:
            return self._layouts_limited(tau, S, origin)
        best = np.full((K, n + 1, J), INF)
        best[:, 0, :] = 0.0
        arg = np.zeros((K, n + 1, J), dtype=np.int64)
        for i in range(1, n + 1):
            cost = np.where(self.need[None, :i, i, :, :] <= tau[:, None, None, None],
                            self.sumc[None, :i, i, :, :], INF)  # [K, a, j0, j1]
            cand = best[:, :i, :, None] + cost
            flat = cand.reshape(K, i * J, J)
            k = flat.argmin(axis=1)
            arg[:, i] = k
            best[:, i] = np.take_along_axis(flat, k[:, None, :], axis=1)[:, 0]
        out = []
        for kk in range(K):
            j1 = int(best[kk, n].argmin())
            if not np.isfinite(best[kk, n, j1]):
                continue
            stages = []
            i = n
            while i > 0:
                a, j0 = divmod(int(arg[kk, i, j1]), J)
                stages.append(StageSpec(a, i, self.base.devices(j0, j1)))
                i, j1 = a, j0
            out.append(Layout(tuple(reversed(stages)), self.m, origin))
        return out

    def _layouts_limited(self, tau: np.ndarray, S: int, origin: str) -> list[Layout]:
        """As ``layouts`` with at most ``S`` stages (an extra DP dimension)."""
        n, J = self.problem.n, len(self.base.cuts)
        K = len(tau)
        best = np.full((K, S + 1, n + 1, J), INF)
        best[:, 0, 0, :] = 0.0
        arg = np.zeros((K, S + 1, n + 1, J), dtype=np.int64)
        for i in range(1, n + 1):
            cost = np.where(self.need[None, :i, i, :, :] <= tau[:, None, None, None],
                            self.sumc[None, :i, i, :, :], INF)  # [K, a, j0, j1]
            cand = best[:, :S, :i, :, None] + cost[:, None]  # [K, s-1, a, j0, j1]
            flat = cand.reshape(K, S, i * J, J)
            k = flat.argmin(axis=2)
            arg[:, 1:, i] = k
            best[:, 1:, i] = np.take_along_axis(flat, k[:, :, None, :], axis=2)[:, :, 0]
        out = []
        for kk in range(K):
            final = best[kk, :, n, :]
            s, j1 = np.unravel_index(int(final.argmin()), final.shape)
            if not np.isfinite(final[s, j1]):
                continue
            stages = []
            i = n
            while i > 0:
                a, j0 = divmod(int(arg[kk, s, i, j1]), J)
                stages.append(StageSpec(a, i, self.base.devices(j0, j1)))
                i, j1, s = a, j0, s - 1
            out.append(Layout(tuple(reversed(stages)), self.m, origin))
        return out
