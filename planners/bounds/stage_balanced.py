"""The stage-balanced lower bound: the best any synchronous pipeline could do, links all but free.

Family bounded: plans whose stages are sets of ops run by one group of
devices each (replicas with any batch shares, gradients AllReduced), every
device in at most one stage, stages ordered so data flows forward, ``m``
microbatches with a flush (pure data parallelism is the one-stage case).
Links are taken as free of other traffic: a gradient AllReduce costs only its
floor (the bytes no algorithm of the cost model can avoid, over the widest
routes and the narrowest cuts, ``_host_limits``; on clusters of at most
``EXACT_GROUPS_UP_TO`` devices the cost model's own per-byte cost of its best group of
that size, or of that mix of device classes, ``_group_floors``), an activation costs
only the least time one sample of it takes to cross a boundary (``_Hops``), and the
memory for activations is free, so the bound holds however busy the links are.

For a stage holding ops ``R`` on ``k`` devices with ``m`` microbatches:

* **busy**: its slowest replica works at least ``m x fix(R) + scal(R) / cap_k``
  per iteration, where ``fix`` is the cost model's fixed part that does not shrink
  with the batch, ``scal`` the part that does (both at the fastest device
  type, op by op), and ``cap_k`` the largest sum of ``k`` device speeds
  (each device's best speed relative to the fastest type, ``sigma_d``) among
  devices whose memory holds ``R``'s parameters, gradients and optimizer
  state (shares summing to 1 mean some replica holds at least its capacity
  share of the work); shares are whole samples, so ``1 / cap_k`` is in fact the
  least ``max_d c_d / sigma_d`` over integer splits ``c`` of a microbatch
  (over ``B``, times ``m``), which assigning samples one at a time to the
  device that would finish first attains;
  and each of its ``m`` backward passes adds the stage's weight gradients into
  their buckets (a fixed part per microbatch, at the best memory bandwidth,
  on every replica whatever its share: counted in ``fix``);
* **outside the ops**: a replica also zeroes its gradient buckets and does at
  least a ``1/k`` share of its optimizer update, at the best memory
  bandwidth: ``T >= busy + that``, with no chain offset (the update may
  overlap the drain of earlier stages). Both come after the replica's last
  backward (and a replicated stage's update after its AllReduce, which ends on
  every replica at once): so the AllReduce terms below (*sync*, *wait*) gain
  the ``1/k`` share, and the terms that end with a stage's last backward
  (*around*, and the busy time after the forward chain) gain the ``tail``, the
  zeroing and, on one device, the whole update (a replica's share of it is
  unknown). The last microbatch's way back through the stages in front may
  overlap the tail, so it counts after the forward chain only (the chain offset
  less ``_drain_most``, as for split backwards below);
* **sync**: a replicated stage's gradients are final only after its last
  microbatch's backward (replicas sum them once per flush), so its AllReduce floor
  comes after every forward and all but the last backward of its slowest replica,
  after the first forward of a microbatch that must then pass the stages after it
  both ways (their least chain on the devices left, as in *around*) and all but one
  backward, and after the slowest replica's every forward and that round trip of the
  microbatch of its last forward; no chain offset;
* **tied weights**: a stage holding the later user of a tied weight but not the
  earlier one splits the tie, whose gradient is then AllReduced over at least two
  devices after the earlier user's last backward, which the last microbatch reaches
  only after passing back from this stage: its chain-offset term gains that
  AllReduce's floor (less the chain of the ops before the earlier user); where the
  plans may exchange the tie (``TieSync.EXCHANGE``), the floor of sending the earlier
  user's rows instead;
* **chain**: microbatch 0 cannot reach a stage before it passed the stages
  in front of it, and after a stage's last backward the last microbatch still
  has to pass them backwards: each earlier stage adds at least its first
  replica's time, the smallest share ``c`` of a microbatch on the fastest device
  (``fix + scal x c / (batch x sigma_max)``), or the whole microbatch when the
  stage is not replicated. A small first share leaves more to the other
  replicas, so both DPs take each replicated stage in one of a few *options*
  (ranges of ``c``: 1, 2-3, 4-7, the rest), each with the chain at the range's least
  ``c`` and the busy time at its largest (``_share_options``).

* **around** (the cheap DP): a replica's first backward waits for a microbatch it
  forwarded to pass every later stage forward and back, and the microbatch of its last
  forward must do the same before its backward there; so with ``F``/``B`` the forward
  and backward parts, ``T >= sum_{s<k} chain_s + max(F_first + B_busy, F_busy +
  B_first)_k + sum_{s>k} chain_s``. Counted from the forward chain instead (as the
  *tail* is), ``B`` is the whole backward with its W's (none can start before the
  first I) and the tail follows. The chain after ``k`` is taken at its least over
  every partition of the rest on the devices left (a DP of its own), which keeps the
  min-max one DP; this term stops a partition from making its last stages light. (The
  class DP takes it too where it has at most ``SMALL_CLASS_STATES`` states, with its own
  least chain after.) That least chain may come from partitions no plan near the bound
  uses (the rest replicated, with a one-sample first share, whatever its AllReduce
  costs); so the cheap DP (on clusters of at most ``EXACT_COUNTS_UP_TO`` devices) also
  takes it over partitions whose every stage's busy and sync terms are at most a limit
  ``L``: a plan with a longer stage takes more than ``L`` anyway, so ``min(L, that DP)``
  bounds too, and ``L`` is bisected towards where the two meet (``AFTER_ROUNDS`` more
  DPs per microbatch count).
* **boundaries**: where a cut between two single-op regions is certain to send the edge
  between them, a stage's replica receives at least its share of it before its first
  forward and sends the gradient back after its last backward (``_Hops``): its busy,
  chain and around terms gain both.
* **split backwards**: a plan may run a stage's backward as I (input gradients, sent
  back) and a later W (weight gradients), which may then overlap the drain of the
  stages in front (the op graph's ``bwd_input_flops`` say how much of each backward
  is I). So wherever a microbatch's way through the pipeline is counted (*chain*,
  *around*, and the busy time after a chain offset) a stage that has weight gradients
  to defer and is not the first counts its forwards and I's alone (``fixc_r``), and its
  whole busy time counts after the forward chain only (the offset less the most the
  stages in front could add to it, ``_drain_most``); the terms without a chain offset
  keep the whole backward. Graphs without the split counted bound as before.
* **waiting for the stages after**: a replicated stage's AllReduce waits for the last
  gradient to come back, which comes only after every later stage is done; so its first
  forward, the crossing into the next stage, the least the later stages take on the
  devices it leaves (the uncapped DP of the rest without tied weights, which bounds
  when that gradient arrives) and its AllReduce floor add up to one more sync term
  (``wait``; no chain offset, as the drain of the stages before it may overlap it).

* **the samples' average way** (the cheap DP): the chain through a replicated stage is
  its first replica's, whose share may be one sample; but every sample passes every
  stage, each held there for its own replica's whole share. A sample ``x`` waits for
  ``sum_{s<k} tau_s(x)`` before stage ``k`` (its replica's time for its share of one
  microbatch, forward and I, there and back) and the replica holding it at ``k`` does all
  its own work in between, so ``T >= sum_{s<k} tau_s(x) + work_k(x)`` for every ``x``,
  and so for their average over the samples, which is at least the same sums at the
  stage's balanced fractional share (``sum_d c_d^2 / sigma_d >= S^2 / sum_d sigma_d``):
  the same DP with each stage on its ``k`` fastest holders at that balance (``averaged``),
  its round trip term too, and its AllReduce after that way's forwards and round trip.
  It counts at few microbatches, where one-sample shares made a microbatch's way through
  replicated stages nearly free (BERT-large on the 2x4 A100 cluster 34.2 to 35.5 ms: the
  bound had been m = 1's; GPT-2 XL there 32.9 to 35.8). Its replicated stages' AllReduce
  terms count from the forward chain as well (after the stage's own first forward). The
  class DP takes the same way where it has at most ``SMALL_CLASS_STATES`` states, each
  class at its own time of a range (``_Ranges.balanced``): VGG-19 on the HeteroG testbed
  45.1 to 47.7 ms.

So ``T >= max_k (sum_{s<k} chain_s + busy_k)``, and the bound is the minimum
of that over partitions, device counts and every ``m`` dividing the batch,
computed exactly by dynamic programming over the suffix of a topological
order: ``g(i, r) = min_{j,k} max(busy(i, j, k), chain(i, j, k) + g(j, r - k))``.

Partitions of branchy graphs need not be ranges of one topological order;
the bound covers them by relaxation: the order is cut into regions at
positions every topological order shares (each op before them is an ancestor
of each op after), a region of several ops may be split between stages in
any way, and such a region is then counted for neither stage (only
under-counting work, so the bound stays valid). For a chain graph every
region is one op, and this relaxation costs nothing.

On clusters of more than ``EXACT_COUNTS_UP_TO`` (32) devices the cheap DP takes the device
counts on a grid (``_Counts``), a relaxation of the same DP.

On mixed clusters the class DP (devices counted per class: speed, memory and type, so no two
stages can both use the fastest devices) takes each class's own time of a range of ops, not
the fastest type's divided by the class's best speed over all ops (``_Ranges.scalable``): a
P100 of the HeteroG testbed runs BERT-large's embedding at 0.81 of a V100's speed but its
layers at 0.59, and the bound had it run four layers in 48 ms that take it 67 (BERT-large
there: 55.9 to 59.1 ms, ResNet-152 29.3 to 30.5).

Complexity: O(U^2 x D x C x O x divisors) for U regions, D devices, C <= D device counts
(at most 40 beyond 32 devices) and O <= 4 share options, vectorised; the class DP for mixed
clusters is O(U^2 x S x K x O) per microbatch count (S states, K class vectors); the counts
are taken best first, one level at a time (cheap DP at its first caps, refined, class DP
without its AllReduce caps, with them).
"""

from __future__ import annotations

from functools import lru_cache
from heapq import heapify, heappop, heappush
from itertools import combinations
from typing import TYPE_CHECKING

import networkx as nx
import numpy as np

from dl_nfv.artifacts import TieSync

if TYPE_CHECKING:
    from dl_nfv.planners.pipeline.problem import Problem

SHARE_OPTIONS = 4  # ranges of a replicated stage's smallest share the DPs tell apart
CAPS_PER_PASS = 12  # caps one vectorised pass of the capped DP solves at once
CAP_PRECISION = 0.01  # the class DP's caps stop within this of the exact min-max
MAX_CAP_SOLVES = 6  # or after this many capped solves (each is a whole class DP)
# clusters of at most this many class-count states (the HeteroG testbed's 45, not TAG's
# 225) also take the round trip term in the class DP and its caps 10x finer (0.1%, up
# to 14 solves): a few per cent more bound for about twice the time
SMALL_CLASS_STATES = 64
EXACT_GROUPS_UP_TO = 12  # clusters this small take the AllReduce floor over every group
# the cheap DP takes every device count on clusters of at most this many devices; on larger
# ones, counts on a grid (``_Counts``): a relaxation of the same bound
EXACT_COUNTS_UP_TO = 32
# the chain after a stage taken over partitions of stages no longer than a limit: DPs per
# microbatch count, and the first limit's (and each step up's) ratio to the bound below it
AFTER_ROUNDS = 3
AFTER_STEP = 1.25


def forced_cuts(problem: Problem) -> list[int]:
    """Op positions i (0 < i < n) where every op before i is an ancestor of every op after."""
    order, pos = problem.order, problem.pos
    n = len(order)
    preds: dict[int, list[int]] = {i: [] for i in range(n)}
    for e in problem.graph.edges:
        preds[pos[e.dst]].append(pos[e.src])
    anc = [0] * n
    for v in range(n):
        mask = 0
        for u in preds[v]:
            mask |= anc[u] | (1 << u)
        anc[v] = mask
    # z[v]: positions 0..z-1 are all ancestors of v
    z = [((~a) & (a + 1)).bit_length() - 1 for a in anc]
    cuts = []
    suffix_min = n
    mins = [0] * (n + 1)
    mins[n] = n
    for v in range(n - 1, -1, -1):
        suffix_min = min(suffix_min, z[v])
        mins[v] = suffix_min
    for i in range(1, n):
        if mins[i] >= i:
            cuts.append(i)
    return cuts


def stage_balanced_bound_ms(problem: Problem, devices: list[str] | None = None,
                            tie_sync: TieSync | None = None) -> float:
    """The bound described in the module docstring (ms); inf when nothing fits in memory.

    ``tie_sync`` says how the bounded plans may sum tied weights (default: as the
    problem's plans do); ``EXCHANGE`` bounds plans that AllReduce them too."""
    p = problem
    devices = list(devices or p.devices)
    cols = sorted({int(p.type_of[p.device_index[d]]) for d in devices})
    n_ops = len(p.order)
    t = p.fwd_ms[:, cols] + p.bwd_ms[:, cols]  # full batch, per op and type (fwd + bwd)
    fixed_f = p.fwd_fixed_ms[:, cols]
    fixed_b = p.bwd_fixed_ms[:, cols]
    fixed = fixed_f + fixed_b
    scal = t - fixed
    scal_min = scal.min(axis=1)
    # the owner of a tied weight no longer sums its sharer's gradient in the graph once a
    # plan splits them (the simulator takes that time out of the owner's backward)
    untie = p.tie_sum_ms[:, cols]
    fix_min = (fixed - untie).min(axis=1)
    fix_b_min = (fixed_b - untie).min(axis=1)
    rate = min(p.cm.accumulate_ms_per_byte(d) for d in devices)
    fix_f_min = fixed_f.min(axis=1)
    scal_f_min = (p.fwd_ms[:, cols] - fixed_f).min(axis=1)
    scal_b_min = (p.bwd_ms[:, cols] - fixed_b).min(axis=1)
    # device speeds relative to the fastest type, op by op (best case for each device), of
    # the forward and the backward apart too: the DPs divide each part by these speeds
    sigma_type = {}
    parts = [(scal_min, scal), (scal_f_min, p.fwd_ms[:, cols] - fixed_f),
             (scal_b_min, p.bwd_ms[:, cols] - fixed_b)]
    for k, c in enumerate(cols):
        ratios = np.concatenate([least[least > 0] / np.maximum(x[least > 0, k], 1e-12)
                                 for least, x in parts])
        sigma_type[c] = float(ratios.max()) if ratios.size else 1.0
    sigma = np.array([sigma_type[int(p.type_of[p.device_index[d]])] for d in devices])
    memory = np.array([p.cm.memory_bytes(d) for d in devices], dtype=np.float64)
    sigma_max = float(sigma.max())
    # regions between forced cuts
    bounds = [0, *forced_cuts(p), n_ops]
    U = len(bounds) - 1
    multi = np.array([bounds[k + 1] - bounds[k] > 1 for k in range(U)])
    cidx = np.asarray(bounds)

    def prefix(values):
        out = np.zeros(n_ops + 1)
        np.cumsum(values, out=out[1:])
        return out[cidx]

    F = prefix(fix_min)
    Sc = prefix(scal_min)
    Ff = prefix(fix_f_min)
    Scf = prefix(scal_f_min)
    Fb = prefix(fix_b_min)
    Scb = prefix(scal_b_min)
    order_ids = [p.cm.op_index[o] for o in p.order]
    Pp = prefix(p.cm.param_bytes[order_ids])
    # a split backward's I (input gradients, ``CostModel.bwd_input_share``): all an op's
    # backward, with adding its weight gradients into buckets, where it has no weight
    # gradients to defer (share 1), else its share of the backward less the tie's sum
    share = p.cm.bwd_input_share[order_ids]
    splits = share < 1.0
    Fbi = prefix(((fixed_b - untie) * share[:, None]).min(axis=1))
    Scbi = prefix(((p.bwd_ms[:, cols] - fixed_b) * share[:, None]).min(axis=1))
    Pin = prefix(p.cm.param_bytes[order_ids] * ~splits)
    Sp = prefix(splits.astype(float))
    fix_r = F[None, :] - F[:, None]  # [i, j] range of regions [i, j)
    scal_r = Sc[None, :] - Sc[:, None]
    fixf_r = Ff[None, :] - Ff[:, None]
    scalf_r = Scf[None, :] - Scf[:, None]
    fixb_r = Fb[None, :] - Fb[:, None]
    scalb_r = Scb[None, :] - Scb[:, None]
    params_r = Pp[None, :] - Pp[:, None]
    static_r = params_r * (2.0 + p.state_factor)
    D = len(devices)
    # the devices that can hold each range: few distinct sets (by memory), keyed by speeds
    holders = {}
    for i in range(U + 1):
        for j in range(i + 1, U + 1):
            holders[(i, j)] = tuple(sorted(sigma[memory >= static_r[i, j]].tolist(), reverse=True))
    # AllReduce floor of a stage on k devices (see _host_limits), and on small clusters the
    # exact least over every group of k, and of each class-count vector (``vector_floor``)
    kk = np.arange(D + 1)
    limits = _host_limits(p, devices)
    col_of = [cols.index(int(p.type_of[p.device_index[d]])) for d in devices]
    classes = _classes(sigma, memory, col_of)
    kvecs = _class_states(tuple(c[2] for c in classes))[0]
    vector_floor = limits[np.array([sum(kv) for kv in kvecs])]
    if D <= EXACT_GROUPS_UP_TO:
        index = {(c[0], c[1], c[3]): n for n, c in enumerate(classes)}
        floors = _group_floors(p, devices, [index[key] for key in zip(
            sigma.tolist(), memory.tolist(), col_of)], len(classes))
        exact: dict[int, float] = {}
        for kv, value in floors.items():
            exact[sum(kv)] = min(exact.get(sum(kv), np.inf), value)
        for k, value in exact.items():
            limits[k] = max(limits[k], value)
        vector_floor = np.array([max(float(limits[sum(kv)]), floors.get(kv, 0.0))
                                 for kv in kvecs])
    ar_floor = params_r[:, :, None] * limits[None, None, :]
    B = p.batch_size
    update = min(p.cm.update_ms_per_byte(d, p.optimizer) for d in devices)
    zero = min(p.cm.upkeep_ms_per_byte(d, 0) for d in devices)  # zeroing the buckets
    # every backward of a microbatch adds the range's weight gradients into its buckets,
    # on every replica whatever its share: a fixed part per microbatch
    acc_r = (Pp[None, :] - Pp[:, None]) * rate
    fix_r = fix_r + acc_r
    fixb_r = fixb_r + acc_r
    # A stage's work that a microbatch's way through the pipeline waits for (its chain,
    # around and chain-offset busy terms): where a plan may split its backwards (some op
    # with weight gradients to defer, and not the first stage, which no stage waits on),
    # the forward and the I alone; the W may come after the gradients went back.
    whole = (np.arange(U + 1) == 0)[:, None] | ((Sp[None, :] - Sp[:, None]) == 0)
    fixbc_r = np.where(whole, fixb_r, Fbi[None, :] - Fbi[:, None]
                       + (Pin[None, :] - Pin[:, None]) * rate)
    scalbc_r = np.where(whole, scalb_r, Scbi[None, :] - Scbi[:, None])
    fixc_r = np.where(whole, fix_r, fixf_r + fixbc_r)
    scalc_r = np.where(whole, scal_r, scalf_r + scalbc_r)
    # what crossing the boundary before each region adds to microbatch 0's way forward
    # and the last one's way back, per sample it carries
    hops = _Hops(p, bounds, multi, devices)
    tie_r = _tie_terms(p, bounds, fix_r[0] + scal_r[0] / (B * sigma_max)
                       + np.cumsum(hops.ms(np.ones(1))[:, 0]),
                       limits, (tie_sync or p.tie_sync) is TieSync.EXCHANGE)
    outside = params_r[:, :, None] * (zero + update / np.maximum(kk, 1)[None, None, :])
    # what a replica does after its own last backward (``tail``): zero its buckets, and on
    # one device the whole update (replicas share theirs in an unknown split: their 1/k
    # counts after the AllReduce, which ends at once on all of them). The last microbatch's
    # way back through the stages in front may overlap it, so it counts after the forward
    # chain only (as ``whole_busy`` below)
    tail = params_r[:, :, None] * (zero + update * (kk == 1)[None, None, :])

    counts = _Counts(D) if D > EXACT_COUNTS_UP_TO else None

    # the parts' fixed times, and their scalable times on a stage's ``k`` fastest holders at
    # their fractional balance ([i, j, k]), for the samples' average way
    inv_frac = _fractional_capacity(holders, U, D)
    avg_fixed = {"c": fixc_r, "f": fixf_r, "b": fixb_r, "bc": fixbc_r}
    with np.errstate(invalid="ignore"):
        avg_balanced = {"c": scalc_r[:, :, None] * inv_frac, "f": scalf_r[:, :, None] * inv_frac,
                        "b": scalb_r[:, :, None] * inv_frac, "bc": scalbc_r[:, :, None] * inv_frac}

    def averaged(m: int, busy, hop) -> tuple:
        """The cheap DP's terms along the samples' average way (``_capped_dp``'s busy,
        chain, around and after; see the module docstring): each stage on its ``k``
        fastest holders at their fractional balance."""
        chain, work, around, before_rest = _average_way(avg_fixed, avg_balanced,
                                                        np.isfinite(busy), m, hop)
        after = _chain_after(busy, chain, multi, U, D)
        # a replicated stage's AllReduce after its forwards and the round trip of the last
        # one's microbatch, or its first forward, that round trip and all but one backward
        lead = (ar_floor + outside)[..., None] + before_rest + after[None, :, ::-1, None]
        sync = np.where((kk[None, None, :, None] > 1) & np.isfinite(lead), lead, 0.0)
        return work, chain, around, after, sync

    def cheap(m: int, enough: float) -> float:
        """The bound letting every stage take the fastest devices, for ``m`` microbatches
        (refined only until it reaches ``enough``)."""
        inv_cap, first = _share_options(holders, U, D, B, m)  # [i, j, k, o], [k, o]
        first_ms = first / (B * sigma_max)
        fixf, scalf = fixf_r[:, :, None, None], scalf_r[:, :, None, None]
        fixb, scalb = fixb_r[:, :, None, None], scalb_r[:, :, None, None]
        fixbc, scalbc = fixbc_r[:, :, None, None], scalbc_r[:, :, None, None]
        with np.errstate(divide="ignore", invalid="ignore"):
            busy = np.where(np.isfinite(inv_cap),
                            m * fix_r[:, :, None, None] + scal_r[:, :, None, None] * inv_cap,
                            np.inf)
            # of that, what the drain of the stages before waits for (``fixc_r``)
            crit = np.where(np.isfinite(inv_cap),
                            m * fixc_r[:, :, None, None] + scalc_r[:, :, None, None] * inv_cap,
                            np.inf)
            # the slowest replica's forwards and backwards (up to their I), and the first
            # replica's share of one microbatch (the chain's), each way
            f_busy, b_busy = m * fixf + scalf * inv_cap, m * fixbc + scalbc * inv_cap
            f_first, b_first = fixf + scalf * first_ms, fixbc + scalbc * first_ms
            # a stage's gradients are final only after the last microbatch's backward (the
            # replicas sum them once per flush): its AllReduce starts after every forward
            # and all but the last backward of its slowest replica
            backs = (m - 1) * fixb + scalb * inv_cap * ((m - 1) / m)
            sync = np.where(kk[None, None, :, None] > 1,
                            f_busy + backs + ar_floor[..., None] + outside[..., None], 0.0)
            # and its compute plus the memory traffic outside the ops (no chain offset: the
            # update may overlap the drain of the stages before it)
            sync = np.maximum(sync, busy + outside[..., None])
        busy[:, :, 0] = np.inf
        crit[:, :, 0] = np.inf
        # microbatch 0 leaves a stage when its first replica is done: the whole microbatch
        # on one device, else the smallest share (``first`` samples) on the fastest
        with np.errstate(invalid="ignore"):
            # and reaches the next after crossing the boundary there, at least the next
            # stage's first share, which the stage's gradient crosses back: a stage's
            # terms gain the boundary before it, at its own first share
            hop = hops.ms(first)[:, None]  # [i, 1, k, o]
            hop_in = hops.ms(first, True)[:, None]  # the boundary before, the way in only
            # the most the chain offset adds beyond the forward chain (``_drain_most``)
            drain = _drain_most(fixb_r[0], scalb_r[0] / (m * sigma_max), hops,
                                B / m)[:, None, None, None]
            chain = np.where(np.isfinite(first), fixc_r[:, :, None, None]
                             + scalc_r[:, :, None, None] * first_ms + hop, np.inf)
            # a replica's first backward waits for a microbatch to pass the stages after
            # it both ways, and its last forward is of a microbatch that must still do so
            # and come back: (first forward + all its backwards) or (all its forwards +
            # one backward), each plus the chain of the stages after it
            around = np.maximum(f_first + b_busy, f_busy + b_first) + hop
            # counted from the forward chain, it ends with the stage's tail, after its W's:
            # none can start before the first I, so they all come after the round trip too
            with_w = np.maximum(f_first + m * fixb + scalb * inv_cap,
                                f_busy + fixb + scalb * first_ms)
            around = np.where(np.isfinite(around), np.maximum(
                around, with_w + hop_in - drain + tail[..., None]), np.inf)
            if counts is None:
                after = _chain_after(busy, chain, multi, U, D)
            else:  # on the grid; per count, at the grid value at or above it
                after_grid = _chain_after(counts.reduce(busy, 2), counts.reduce(chain, 2),
                                          multi, U, D, counts)
                after = after_grid[:, counts.up]
            # and its first backward waits for a microbatch to pass the stages after it
            # both ways (on at most the devices the stage leaves), as does the microbatch
            # of its own last forward
            rest = after[None, :, ::-1, None]
            lead = (ar_floor + outside)[..., None] + np.maximum(f_first + backs + rest,
                                                                f_busy + rest)
            sync = np.where((kk[None, None, :, None] > 1) & np.isfinite(lead),
                            np.maximum(sync, lead), sync)
            # a replicated stage's AllReduce also waits for the last gradient to come back:
            # after microbatch 0 went through it, every stage after it must finish
            wait = np.where(kk[None, None, :, None] > 1, f_first + hops.ms(first, True)[:, None]
                            + (ar_floor + outside)[..., None], -np.inf)
        # the drain of the stages before may overlap the W's: the whole busy time counts
        # from the forward chain only (the chain offset less the most it adds beyond it)
        whole_busy = busy + hop_in - drain
        # and so does its AllReduce, which follows its work: the sync terms count from there
        # too (they stay terms of their own without the chain offset, for the caps below)
        from_chain = np.maximum(whole_busy + tail[..., None], sync + hop_in - drain)
        staged = np.maximum(crit + hop + tie_r[:, :, None, None], from_chain)
        # with split backwards the chain-offset terms above count the W's of no stage but
        # the first; a stage still starts after microbatch 0's forward chain and does all
        # its work: the same DP over that chain alone and the whole busy time bounds too
        split_dp = bool(np.any(~whole))
        if split_dp:
            chain_f = np.where(np.isfinite(first), f_first + hop_in, np.inf)
            forward = (np.maximum(busy + tail[..., None], sync) + hop_in, chain_f, sync)
        if counts is None:
            value = _capped_dp(staged, chain, sync, multi, U, D, around, after, enough=enough,
                               wait=wait, untied=crit + hop)
            # the chain after a stage over partitions whose every stage is at most
            # ``limit`` (busy and sync): a plan with a stage above it takes longer anyway
            value = _bisect_limit(value, enough, lambda limit: _capped_dp(
                staged, chain, sync, multi, U, D, around, _chain_after(
                    np.where((busy <= limit) & (sync <= limit), busy, np.inf), chain, multi,
                    U, D), enough=enough, wait=wait, untied=crit + hop))
            if split_dp and value < enough:
                value = max(value, _capped_dp(*forward, multi, U, D, enough=enough))
            if value < enough:  # the same DP over the samples' average way (``_average``)
                work, chain_avg, around_avg, after_avg, lead = averaged(m, busy, hop)
                value = max(value, _capped_dp(work, chain_avg, np.maximum(sync, lead), multi,
                                              U, D, around_avg,
                                              after_avg, enough=enough, wait=wait,
                                              untied=work))
            return value
        staged, chain, sync, around, wait, untied = (
            counts.reduce(x, 2) for x in (staged, chain, sync, around, wait, crit + hop))
        value = _capped_dp(staged, chain, sync, multi, U, D, around, after_grid, enough=enough,
                           wait=wait, untied=untied, counts=counts)
        if split_dp and value < enough:
            value = max(value, _capped_dp(*(counts.reduce(x, 2) for x in forward), multi, U, D,
                                          enough=enough, counts=counts))
        return value

    # the class DP's scalable parts per device class, range by range (see ``_Ranges``)
    by_type = {"scal": scal, "scalf": p.fwd_ms[:, cols] - fixed_f,
               "scalb": p.bwd_ms[:, cols] - fixed_b}
    by_type["scalbi"] = by_type["scalb"] * share[:, None]
    typed = {name: np.stack([prefix(x[:, k]) for k in range(len(cols))], axis=-1)
             for name, x in by_type.items()}
    typed = {name: x[None, :, :] - x[:, None, :] for name, x in typed.items()}  # [i, j, T]
    typed["scalbc"] = np.where(whole[..., None], typed["scalb"], typed.pop("scalbi"))
    typed["scalc"] = np.where(whole[..., None], typed["scal"],
                              typed["scalf"] + typed["scalbc"])
    by_class = {name: np.stack([x[:, :, c[3]] for c in classes], axis=-1)
                for name, x in typed.items()}
    ranges = _Ranges(fix_r, scal_r, fixf_r, scalf_r, fixb_r, scalb_r, params_r, static_r,
                     multi, U, tie_r, hops, (fixc_r, scalc_r, fixbc_r, scalbc_r), by_class,
                     np.array([c[0] for c in classes]))
    # Every value below bounds every plan of its m microbatches, each level at least the
    # one before: the cheap bound after its first caps (level 0), refined (level 1; final
    # where all devices are alike); on mixed devices, the exact class-count DP without its
    # AllReduce caps (level 2), then with them (level 3, refined until it reaches the best
    # so far). Best first: the count with the least value so far is taken one level
    # further, until every count not finished is at least the best finished one. (Each
    # level rebuilds its arrays: keeping every count's would take 60 MB each on TAG.)
    last = 1 if len(classes) == 1 else 3
    heap = [(cheap(m, enough=0.0), 0, m) for m in range(1, B + 1) if B % m == 0]
    heapify(heap)
    best = np.inf
    uncapped: dict[int, np.ndarray] = {}  # per count: the class DP's table without caps
    while heap and heap[0][0] < best:
        value, level, m = heappop(heap)
        if level == 0:
            value = max(value, cheap(m, enough=best))
        elif level == 1:
            uncapped[m] = _class_bound(ranges, classes, vector_floor, B, m, zero, update,
                                       enough=None)
            value = max(value, float(uncapped[m][0, -1]))
        else:
            value = max(value, _class_bound(ranges, classes, vector_floor, B, m, zero, update,
                                            enough=best, uncapped=uncapped[m], known=value))
        if level + 1 == last:
            best = min(best, value)
        else:
            heappush(heap, (value, level + 1, m))
    return best


class _Counts:
    """Device counts on a grid, for the cheap DP on a large cluster.

    A stage's count ``k`` falls in the bucket of the grid value ``lo <= k`` below it; the
    bucket's terms are the least of its counts' (each term of a stage on ``k`` devices is
    at least that) and it takes only ``lo`` devices from what is left; what is left is
    looked up at the grid value at or above it (a DP over more devices is no larger). Every
    plan's stages map to buckets whose value is at most the plan's, so the DP on the grid
    bounds every plan too; with every count on the grid it is the exact DP.

    ``lo``: the grid (0, 1, ..., 16, then about 24 geometric steps to ``D``); ``up[r]``: the
    position of the least grid value ``>= r``; ``ks[q]``: the buckets (``>= 1``) a stage may
    take with ``lo[q]`` devices left; ``at[q][b]``: the position of what is left after it.
    """

    def __init__(self, D: int, dense: int = 16, steps: int = 24):
        grid = set(range(min(dense, D) + 1)) | {D}
        if D > dense:
            grid |= {int(round(x)) for x in np.geomspace(dense, D, steps)}
        self.lo = np.array(sorted(grid))
        self.up = np.searchsorted(self.lo, np.arange(D + 1))  # lo[up[r]] >= r, the least
        self.ks = [np.nonzero((self.lo >= 1) & (self.lo <= r))[0] for r in self.lo]
        self.at = [self.up[np.maximum(r - self.lo, 0)] for r in self.lo]
        self.left = self.up[D - self.lo]  # after a stage of bucket b on the whole cluster

    def reduce(self, x: np.ndarray, axis: int) -> np.ndarray:
        """``x`` over counts ``0..D`` on ``axis`` as buckets: the least over each."""
        return np.minimum.reduceat(x, self.lo, axis=axis)


class _Hops:
    """The least time crossing the boundary before each region adds to a microbatch.

    Where regions ``i - 1`` and ``i`` are single ops, every plan that cuts there sends
    the edge between the two (the op before is an ancestor of every op after) from other
    devices (every device is in at most one stage) to each replica after it, before its
    first forward: its share, ``c`` samples, perhaps in parts from several replicas, and
    the gradient back after its last backward when that op needs one. A transfer takes
    its route's latency plus its bytes over the route's bandwidth, and the parts share
    the links into the device: at least one sample over the best route, and at least
    the least latency plus ``c`` samples over the most bandwidth any device has into
    it. Where a region may be split the cut may fall inside it: nothing.
    """

    def __init__(self, p: Problem, bounds: list[int], multi: np.ndarray, devices: list[str]):
        U = len(bounds) - 1
        self.one = np.zeros(U + 1)  # one sample over the best route (ms)
        self.per_sample = np.zeros(U + 1)  # ms per sample through the widest way in
        self.ways = np.zeros(U + 1)
        self.latency = 0.0  # the least route latency (ms)
        cm = p.cm
        pairs = [(a, b) for a in devices for b in devices if a != b]
        if not pairs:
            return
        self.latency = min(cm.transfer_affine(a, b)[0] for a, b in pairs)
        # the most bytes per ms any device can receive, all of its links at once
        inbound = min(cm.inbound_ms_per_byte([d]) for d in devices)
        largest: dict[tuple[str, str], float] = {}
        for e in p.graph.edges:
            largest[(e.src, e.dst)] = max(largest.get((e.src, e.dst), 0.0), float(e.bytes))
        for i in range(1, U):
            if multi[i - 1] or multi[i]:
                continue
            u, v = p.order[bounds[i] - 1], p.order[bounds[i]]
            nbytes = largest.get((u, v), 0.0) / p.batch_size
            if nbytes > 0:
                self.one[i] = min(cm.transfer_ms(a, b, nbytes) for a, b in pairs)
                self.per_sample[i] = nbytes * inbound
                self.ways[i] = 2 if p.needs_grad[u] else 1

    def ms(self, samples: np.ndarray, one_way: bool = False) -> np.ndarray:
        """``[i, *samples.shape]``: the boundary before region ``i`` for a replica of
        ``samples``, both ways (or the way in only); 0 where there is nothing to count or
        ``samples`` is not finite."""
        samples = np.where(np.isfinite(samples), samples, 0.0)
        shape = (-1, *[1] * samples.ndim)
        one, per_sample, ways = (x.reshape(shape) for x in (
            self.one, self.per_sample, np.minimum(self.ways, 1) if one_way else self.ways))
        with np.errstate(invalid="ignore"):
            out = ways * np.maximum(one, self.latency + per_sample * samples[None])
        return np.where((samples[None] > 0) & (one > 0), out, 0.0)


def _bisect_limit(value: float, enough: float, solve) -> float:
    """The most of ``min(L, solve(L))`` over a few limits ``L``.

    ``solve(L)`` bounds every plan whose stages all take at most ``L``, and a plan with a
    longer stage takes more than ``L``, so ``min(L, solve(L))`` bounds every plan;
    ``solve`` falls as ``L`` grows. From ``value`` (a bound already), ``L`` steps up by
    ``AFTER_STEP`` until ``solve`` falls below it, then bisects: ``AFTER_ROUNDS`` solves
    at most, none once the bound reaches ``enough`` (or where ``enough`` is 0: the first
    caps' pass)."""
    lo, hi = value, np.inf
    limit = value * AFTER_STEP
    for _ in range(AFTER_ROUNDS if enough > 0 else 0):
        if lo >= enough:
            break
        v = solve(limit)
        if v >= limit:
            lo = limit
        else:
            lo, hi = max(lo, v), limit
        limit = lo * AFTER_STEP if hi == np.inf else 0.5 * (lo + hi)
    return lo


def _drain_most(fixb: np.ndarray, scalb: np.ndarray, hops: _Hops, samples: float) -> np.ndarray:
    """``[i]``: the most the stages in front of region ``i`` add to a chain offset beyond their
    forwards: the backward of every op before ``i`` (``fixb + scalb``, that range's fixed and
    per-microbatch parts as the chain takes them, at a whole microbatch) and the way back
    over every boundary before it. So ``chain offset - this`` is at most the forward chain,
    after which a stage may start and must then do all its work: with split backwards its
    W's may overlap the drain of the stages in front, so only that offset holds for them."""
    back = hops.ms(np.array(samples), one_way=True)
    crossings = np.concatenate([[0.0], np.cumsum(back)[:-1]])  # boundaries before i
    return fixb + scalb + crossings


def _tie_terms(p: Problem, bounds: list[int], before: np.ndarray, floor: np.ndarray,
               exchange: bool) -> np.ndarray:
    """``[i, j]``: what tied weights add after the busy time of a stage of regions ``[i, j)``.

    A stage that holds the later user of a tied weight and not the earlier one splits the
    tie: the weight's gradient is summed over both users' devices (at least two) after the
    earlier user's last backward, and that comes only after this stage's last backward
    has passed back through the stages in front of it. So the stage's chain-offset term
    gains the AllReduce floor of a two-device group (``floor[2]`` per byte), less the
    chain of the regions before the earlier user (their backward may overlap it). Where
    the plans may exchange the tie (``exchange``, an owner that is a lookup), the later
    user needs only the owner's rows, one way, at the same floor per byte
    (``2 (k - 1) / k`` is 1 for two devices). Ties within one region that may be
    split are left out (the region counts for neither).
    """
    U = len(bounds) - 1
    out = np.zeros((U + 1, U + 1))
    if len(floor) < 3 or not p.cm.ties:
        return out
    region = np.searchsorted(np.asarray(bounds), np.arange(len(p.order)), side="right") - 1
    for _, owner, sharer, nbytes in p.cm.ties:
        a, b = sorted((int(region[p.pos[owner]]), int(region[p.pos[sharer]])))
        if a == b:
            continue
        if exchange and owner in p.cm.tie_rows:  # only the owner's rows need come back
            nbytes = min(nbytes, p.cm.tie_rows[owner])
        term = max(0.0, nbytes * float(floor[2]) - float(before[a]))
        # stages [i, j) with a < i <= b < j
        out[a + 1:b + 1, b + 1:] += term
    return out


def _slowest_samples(speeds, samples: int) -> float:
    """The least ``max_d c_d / speeds_d`` over whole-sample splits ``c`` of ``samples``
    (inf with no device and samples left). Giving samples one at a time to the device
    that would finish first attains it, and that takes the values ``j / speeds_d``
    (``j >= 1``) in increasing order: the answer is the ``samples``-th smallest."""
    if samples <= 0:
        return 0.0
    if not len(speeds):
        return np.inf
    values = np.arange(1, samples + 1)[None, :] / np.asarray(speeds, dtype=float)[:, None]
    return float(np.partition(values.ravel(), samples - 1)[samples - 1])


def _share_buckets(samples: int, k: int) -> list[tuple[int, int]]:
    """Ranges ``(lo, hi)`` of the smallest replica share (samples of a microbatch) that
    cover every split of ``samples`` over ``k >= 2`` replicas: 1, 2-3, 4-7, then the rest
    up to ``samples // k`` (at least 1: with fewer samples than replicas some replica
    holds one); at most ``SHARE_OPTIONS`` ranges, which bounds the DPs' work."""
    top = max(1, samples // k)
    out, lo = [], 1
    while lo <= top:
        hi = top if len(out) == SHARE_OPTIONS - 1 else min(top, 2 * lo - 1)
        out.append((lo, hi))
        lo = hi + 1
    return out


def _share_options(holders: dict, U: int, D: int, B: int, m: int
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Per range, device count and *option*: the slowest replica's share and the first one's.

    A microbatch of ``S = B / m`` samples split over ``k`` of the devices that can hold
    range ``[i, j)``, ``c_d`` samples on device ``d``: the stage's busy time scales with
    ``m x max_d c_d / (B sigma_d)`` and microbatch 0 leaves the stage when its first
    replica is done, which takes at least the smallest share ``c`` on the fastest device.
    A small ``c`` leaves more to the other ``k - 1``, so each option is a bucket
    ``lo <= c <= hi`` (``_share_buckets``) taken at its best for both: the chain at
    ``lo`` samples, the busy share at least the whole-sample optimum over ``k`` devices
    and over the fastest ``k - 1`` with ``S - hi`` samples (assigning samples one at a
    time to the device that would finish first is optimal for this min-max). Without
    replicas (``k = 1``) one option: the whole microbatch.

    Returns ``share[i, j, k, o]`` (inf for ``k = 0``, no holder or no such option) and
    ``first[k, o]``: the chain's samples (``S`` for ``k = 1``; inf for no option).
    """
    samples = B // m
    buckets = {k: _share_buckets(samples, k) for k in range(2, D + 1)}
    options = max([1, *(len(b) for b in buckets.values())])
    first = np.full((D + 1, options), np.inf)
    first[1, 0] = samples
    for k, bucket in buckets.items():
        first[k, :len(bucket)] = [lo for lo, _ in bucket]

    memo: dict[tuple, np.ndarray] = {}
    out = np.full((U + 1, U + 1, D + 1, options), np.inf)
    for (i, j), speeds in holders.items():
        row = memo.get(speeds)
        if row is None:
            row = np.full((D + 1, options), np.inf)
            for k in range(1, min(D, len(speeds)) + 1):
                shares = _option_shares(speeds[:k], [speeds[:k - 1]], buckets.get(k, ()),
                                        samples, m, B)
                row[k, :len(shares)] = shares
            memo[speeds] = row
        out[i, j] = row
    return out, first


def _average_way(fixed: dict, balanced: dict, fit: np.ndarray, m: int, hop: np.ndarray) -> tuple:
    """A stage's terms along the samples' average way (see the module docstring), from each
    part's fixed time per microbatch (``fixed[part]``, ``[i, j]``) and scalable time of the
    whole batch at the replicas' balance (``balanced[part]``, ``[i, j, K]``), where ``fit``
    (``[i, j, K, o]``); parts: ``"c"`` the forwards and I's, ``"f"`` forwards, ``"b"`` whole
    backwards, ``"bc"`` the I's. Returns its chain and work (each way across ``hop``), its
    round trip term (before the least chain after it), and what its AllReduce follows
    before the round trip of a microbatch through the stages after it: its forwards, or its
    first forward and all but one backward."""

    def per(part: str, microbatches: int):  # the part's time for that many microbatches
        with np.errstate(invalid="ignore"):
            value = microbatches * fixed[part][:, :, None] + balanced[part] * (microbatches / m)
        return np.where(fit, value[..., None], np.inf)

    chain = per("c", 1) + hop
    work = per("c", m) + hop
    around = np.maximum(per("f", 1) + per("bc", m), per("f", m) + per("bc", 1)) + hop
    return chain, work, around, np.maximum(per("f", 1) + per("b", m - 1), per("f", m))


def _fractional_capacity(holders: dict, U: int, D: int) -> np.ndarray:
    """``[i, j, k]``: one over the sum of the ``k`` largest speeds among the devices that
    hold range ``[i, j)`` (inf where fewer hold it, or ``k = 0``)."""
    out = np.full((U + 1, U + 1, D + 1), np.inf)
    memo: dict[tuple, np.ndarray] = {}
    for (i, j), speeds in holders.items():
        row = memo.get(speeds)
        if row is None:
            row = np.full(D + 1, np.inf)
            row[1:len(speeds) + 1] = 1.0 / np.cumsum(speeds)
            memo[speeds] = row
        out[i, j] = row
    return out


def _option_shares(speeds, others, buckets, samples: int, m: int, B: int) -> list[float]:
    """Per option (``buckets``) of replicas of ``speeds``: the slowest one's share,
    ``m x max_d c_d / (B sigma_d)``, at least the whole-sample optimum over all of them
    and over the best of ``others`` (the replicas left beside the first) holding the
    samples less the option's largest first share. One device: the whole microbatch."""
    balanced = m * _slowest_samples(speeds, samples) / B
    if len(speeds) == 1:
        return [balanced]
    return [max(balanced, m * min(_slowest_samples(rest, samples - hi) for rest in others) / B)
            for _, hi in buckets]


def _class_share_options(kvecs, sig, samples: int, m: int, B: int
                         ) -> tuple[np.ndarray, np.ndarray]:
    """``_share_options`` for replicas given as class-count vectors: per vector and
    option, the slowest replica's share and the first one's samples (inf: no option).

    The first replica (smallest share ``c`` in the option's range) is on some class
    present in the vector; the others are the vector less one device of that class,
    whichever leaves the least busy share.
    """
    K = len(kvecs)
    totals = [sum(kv) for kv in kvecs]
    buckets = {k: _share_buckets(samples, k) for k in set(totals) if k >= 2}
    options = max([1, *(len(b) for b in buckets.values())])
    share = np.full((K, options), np.inf)
    first = np.full((K, options), np.inf)
    for n, kv in enumerate(kvecs):
        speeds = [sig[c] for c, k in enumerate(kv) for _ in range(k)]
        if not speeds:
            continue
        bucket = buckets.get(len(speeds), ())
        others = [[sig[c2] for c2, k2 in enumerate(kv) for _ in range(k2 - (c2 == c))]
                  for c, k in enumerate(kv) if k]
        shares = _option_shares(speeds, others, bucket, samples, m, B)
        share[n, :len(shares)] = shares
        first[n, :len(shares)] = [lo for lo, _ in bucket] if bucket else [samples]
    return share, first


def _then(g: np.ndarray, multi: np.ndarray) -> np.ndarray:
    """``[..., j, :]`` for a DP table ``g`` over regions ``0..U+1`` (second-last axis): what
    follows a stage that ends before region ``j``, ``g(j)``, or where region ``j`` may be
    split (the next stage may start inside it), the lesser of ``g(j)`` and ``g(j + 1)``."""
    U = len(multi)
    out = g[..., :U + 1, :].copy()
    out[..., :U, :] = np.where(multi[:, None], np.minimum(g[..., :U, :], g[..., 1:U + 1, :]),
                               g[..., :U, :])
    return out


def _chain_after(busy, chain, multi, U: int, D: int, counts: _Counts | None = None) -> np.ndarray:
    """``[j, r]``: the least chain of the stages of regions ``j..`` on at most ``r`` devices,
    over every partition of them into stages that fit (``busy`` finite); where region
    ``j`` may be split, the stages may also start at ``j + 1``. ``busy`` and ``chain`` are
    ``[i, j, k, o]`` as in ``_capped_dp``: its DP with every stage that fits worth nothing
    but its chain. (With ``counts``: over its buckets, and ``r`` its grid positions.)"""
    fits = np.where(np.isfinite(busy), -np.inf, np.inf)
    return _then(_table(fits[None], chain, multi, U, D, counts=counts)[0], multi)


def _table(busy, chain, multi, U: int, D: int, around=None, after=None,
           counts: _Counts | None = None) -> np.ndarray:
    """``[G, i, r]``: the min-max DP of ``_capped_dp`` over regions ``i..`` on at most ``r``
    devices, for each of the ``G`` stage costs ``busy`` (``[G, i, j, k, o]``); ``around``
    and ``after``, when given, add the round trip term. With ``counts``, ``k`` are its
    buckets and ``r`` its grid positions (``_Counts``)."""
    if counts is not None:
        return _table_on_grid(busy, chain, multi, U, counts, around, after)
    G = len(busy)
    g = np.full((G, U + 2, D + 1), np.inf)
    g[:, U, :] = 0.0
    g[:, U + 1, :] = 0.0
    for i in range(U - 1, -1, -1):
        cont = _then(g, multi)  # continuation after [i, j)
        for r in range(1, D + 1):
            # stages [i, j) for j > i on k = 1..r devices, r - k left (slices, no copies)
            busy_ijk = busy[:, i, i + 1:, 1:r + 1]  # [G, j, k, o]
            chain_ijk = chain[i, i + 1:, 1:r + 1]
            rest = cont[:, i + 1:, r - 1::-1]  # [G, j, k]
            val = np.maximum(busy_ijk, chain_ijk[None] + rest[..., None])
            if around is not None:
                beside = around[i, i + 1:, 1:r + 1] + after[i + 1:, r - 1::-1][..., None]
                val = np.maximum(val, beside[None])
            g[:, i, r] = np.minimum(g[:, i, r - 1], val.reshape(G, -1).min(axis=1))
        if multi[i]:
            g[:, i] = np.minimum(g[:, i], g[:, i + 1])
    return g


def _table_on_grid(busy, chain, multi, U: int, c: _Counts, around=None, after=None) -> np.ndarray:
    """``_table`` over device-count buckets and what is left on the grid (``_Counts``).

    The same DP as ``_table``'s loop, with gathered indices where that one takes slices: on
    a grid of every count it gives the same table, but the gathers copy, which made the
    bound 15-35% slower on the benchmark's clusters, so those keep the slicing loop."""
    G, R = len(busy), len(c.lo)
    g = np.full((G, U + 2, R), np.inf)
    g[:, U, :] = 0.0
    g[:, U + 1, :] = 0.0
    for i in range(U - 1, -1, -1):
        cont = _then(g, multi)
        for q in range(1, R):
            ks, at = c.ks[q], c.at[q][c.ks[q]]
            rest = cont[:, i + 1:, at]  # [G, j, b]: the rest on what the stage leaves
            # (index ``i`` first: an integer beside an index array would move their axes)
            val = np.maximum(busy[:, i][:, i + 1:][:, :, ks],
                             chain[i][i + 1:][:, ks][None] + rest[..., None])
            if around is not None:
                beside = around[i][i + 1:][:, ks] + after[i + 1:, at][..., None]
                val = np.maximum(val, beside[None])
            g[:, i, q] = np.minimum(g[:, i, q - 1], val.reshape(G, -1).min(axis=1))
        if multi[i]:
            g[:, i] = np.minimum(g[:, i], g[:, i + 1])
    return g


def _capped_dp(busy, chain, sync, multi, U: int, D: int, around=None, after=None,
               enough: float = np.inf, wait=None, untied=None,
               counts: _Counts | None = None) -> float:
    """``min over partitions of max(max_k (chain before k + busy_k),
    max_k (chain before k + around_k + least chain after k), max_k sync_k)``.

    ``busy``, ``chain``, ``sync`` and ``around`` are ``[i, j, k, o]``: a stage of regions
    ``[i, j)`` on ``k`` devices, in option ``o`` (``_share_options``); a stage takes any
    one option. The chain after a stage is taken at its least over every partition of
    the regions after it on the devices left (``after``, from ``_chain_after``), which
    keeps the min-max one DP.

    The sync terms carry no chain offset, so they are handled by caps. With ``A(c)``
    the DP over stages whose sync is at most ``c`` (non-increasing in ``c``), and
    caps at some of the distinct positive sync values ``v``, a partition whose
    largest sync lies in ``(c', c]`` (consecutive caps) is at least
    ``max(next v above c', A(c))``; the partitions with no positive sync at least
    ``A(0)``. The least of these bounds them all. The caps start at a few ranks of the
    values, and the interval that gives the least is split again (``CAPS_PER_PASS`` new
    caps in one vectorised pass: half just above its bound, where ``A`` usually meets
    the caps, half spread over its ranks) until it holds one value: then the bound is
    exact, the optimum of the min-max. A caller that needs no more than ``enough`` gets
    the first bound that reaches it (``enough = 0``: the one of the first caps).

    ``wait`` (``[i, j, k, o]``, with ``untied``, the busy terms without tied weights'
    AllReduces) adds a sync term for what a stage's AllReduce waits on after its first
    forward: ``wait + `` the least the stages after it take on the devices it leaves
    (the uncapped DP without ties, which bounds when the last gradient comes back).
    """
    def solve(caps: np.ndarray, busy=busy, table: bool = False) -> np.ndarray:
        masked = np.where(sync[None] <= caps[:, None, None, None, None], busy[None], np.inf)
        g = _table(masked, chain, multi, U, D, around, after, counts)
        return g if table else g[:, 0, -1]

    if wait is not None:
        g = solve(np.array([np.inf]), busy=untied, table=True)[0]
        # [j, k]: the rest on the D - k devices left
        later = _then(g, multi)[:, D - np.arange(D + 1) if counts is None else counts.left]
        with np.errstate(invalid="ignore"):
            sync = np.maximum(sync, wait + later[None, :, :, None])
    values = np.unique(sync[np.isfinite(busy) & (sync > 0)])
    N = len(values)
    if N == 0:
        return float(solve(np.array([np.inf]))[0])
    # A at cap 0, at the largest value (every stage allowed) and at a few ranks between
    ranks = np.unique(np.linspace(0, N - 1, 4).round().astype(int))
    first = solve(np.concatenate([[0.0], values[ranks]]))
    zero = float(first[0])
    A = dict(zip(ranks.tolist(), first[1:].tolist()))
    while True:
        held = sorted(A)
        lows = [0, *(q + 1 for q in held[:-1])]  # the lowest rank each cap's interval holds
        bounds = [max(values[lo], A[q]) for lo, q in zip(lows, held)]
        n = int(np.argmin(bounds))
        lo, q = lows[n], held[n]
        if lo == q or bounds[n] >= min(zero, enough):  # exact, or enough, or the no-sync
            return min(zero, bounds[n])  # partitions are lower
        # the crossing is usually just above the interval's bound: half the new caps at
        # values a little above it (0.5%, 1%, 2%, ...), half spread over the ranks
        near = bounds[n] * (1.0 + 0.005 * 2.0 ** np.arange(CAPS_PER_PASS // 2))
        new = np.concatenate([np.searchsorted(values, near, side="right") - 1,
                              np.linspace(lo, q - 1, CAPS_PER_PASS // 2).round()])
        new = np.unique(np.clip(new, lo, q - 1).astype(int))
        new = new[[r not in A for r in new.tolist()]]
        A.update(zip(new.tolist(), solve(values[new]).tolist()))


def _host_limits(p: Problem, devices: list[str]) -> np.ndarray:
    """Per group size k: the least ms per parameter byte an AllReduce of k devices can take.

    The cost model's AllReduce is the fastest of ring, tree and hierarchical (the only
    gradient synchronisation of the family), and each takes at least
    ``2 (k - 1) / k`` bytes per parameter byte over one route at a time:

    * ring: ``2 (k - 1)`` steps, each moving ``1 / k`` of the bytes over every ring edge,
      timed by its busiest link;
    * tree: every level moves the whole payload over an edge, up and then down: 2;
    * hierarchical, ``m`` hosts of at most ``l`` members: the largest host's ring,
      ``2 (l - 1) / l``, then rings over hosts each carrying ``1 / l`` of the bytes,
      ``2 (m - 1) / (m l)``; the sum is ``2 (1 - 1 / (m l))`` with ``m l >= k``.

    No route is faster than the widest between two of the devices, so ``2 (k - 1) / k``
    over that bandwidth is a floor of all three. And a group no single host holds spans
    hosts, where each of its hosts must receive at least the parameters through its
    inbound links: the best such group takes hosts by decreasing inbound bandwidth
    until they hold ``k`` devices, and the last host taken limits it. The largest of
    these two and the narrowest cut a group of ``k`` can have (``_cut_limits``).
    """
    cm = p.cm
    cluster = cm.cluster
    sizes: dict[str, int] = {}
    for d in devices:
        host = cluster.device(d).host
        sizes[host] = sizes.get(host, 0) + 1
    # ms per byte into each host over its links from outside, as an AllReduce sees them
    inbound = {host: cm.inbound_ms_per_byte(
        {host, *(d.name for d in cluster.devices if d.host == host)}, collective=True)
        for host in sizes}
    widest = max(sizes.values())
    ranked = sorted(sizes, key=lambda h: (inbound[h], -sizes[h], h))
    out = np.zeros(len(devices) + 1)
    for k in range(widest + 1, len(devices) + 1):
        held = 0
        for h in ranked:
            held += sizes[h]
            if held >= k:
                per_byte = inbound[h]
                break
        out[k] = per_byte if np.isfinite(per_byte) else 0.0
    # any group: 2 (k - 1) / k bytes per byte over routes no faster than the fastest
    fastest = min((cm.route_ms_per_byte(d, e, collective=True) for d in devices for e in devices
                   if e != d), default=0.0)
    for k in range(2, len(devices) + 1):
        out[k] = max(out[k], 2.0 * (k - 1) / k * fastest)
    return np.maximum(out, _cut_limits(cm.capacity_graph(collective=True), devices))


def _group_floors(p: Problem, devices: list[str], klass: list[int],
                  classes: int) -> dict[tuple[int, ...], float]:
    """Per class-count vector: the least ms per byte of the cost model's own AllReduce (the
    fastest of its algorithms, ``allreduce_ms_per_byte``) over every group of at least two
    ``devices`` with those counts of each class (``klass[d]`` the class of device ``d``)."""
    out: dict[tuple[int, ...], float] = {}
    for k in range(2, len(devices) + 1):
        for group in combinations(range(len(devices)), k):
            counts = [0] * classes
            for d in group:
                counts[klass[d]] += 1
            key = tuple(counts)
            value = p.cm.allreduce_ms_per_byte([devices[d] for d in group])
            if value < out.get(key, np.inf):
                out[key] = value
    return out


def _cut_limits(graph, devices: list[str]) -> np.ndarray:
    """Per group size k: the least ms per byte over the best-connected cut of any k devices.

    Whichever of the three algorithms runs, a cut of the network with members of the
    group on both sides is crossed by at least the whole payload each way (a ring
    crosses it once a step with ``1 / k`` of the bytes over ``2 (k - 1)`` steps; a
    tree's edges up and down; a hierarchical AllReduce's host ring, or the ring of
    the host the cut splits), and a phase takes at least the bytes it puts over the
    cut's links divided by their summed bandwidth. So ``1 / mincut(G)`` is a floor
    for a group ``G``, and the least over groups of ``k`` devices is the largest
    ``lambda`` at which some component of the Gomory-Hu tree, cut at the edges
    narrower than ``lambda``, holds ``k`` of the devices.
    """
    out = np.zeros(len(devices) + 1)
    if len(devices) < 2 or not nx.is_connected(graph):
        return out
    tree = nx.gomory_hu_tree(graph, capacity="bytes_per_ms")
    count = {v: int(v in devices) for v in tree}
    parent = {v: v for v in tree}

    def root(v):
        while parent[v] != v:
            parent[v] = parent[parent[v]]
            v = parent[v]
        return v

    largest = max(count.values())
    for a, b, w in sorted(tree.edges(data="weight"), key=lambda e: -e[2]):
        ra, rb = root(a), root(b)
        parent[ra] = rb
        count[rb] += count[ra]
        # groups of up to count[rb] devices have a min cut of at least w
        for k in range(largest + 1, count[rb] + 1):
            out[k] = 1.0 / w
        largest = max(largest, count[rb])
    return out


class _Ranges:
    """Per region range ``[i, j)``: fastest-type fixed and scalable times, parameters, state."""

    def __init__(self, fix_r, scal_r, fixf_r, scalf_r, fixb_r, scalb_r, params_r, static_r,
                 multi, U, tie_r, hops, critical, by_class, class_sigma):
        self.fix, self.scal, self.fixf, self.scalf = fix_r, scal_r, fixf_r, scalf_r
        self.fixb, self.scalb = fixb_r, scalb_r
        self.params, self.static, self.multi, self.U = params_r, static_r, multi, U
        self.tie, self.hops = tie_r, hops
        # what the drain waits for (split backwards: up to the I; see the cheap DP)
        self.fixc, self.scalc, self.fixbc, self.scalbc = critical
        # per device class ``q`` (last axis), the class's own scalable time of the range:
        # ``scal``, ``scalf``, ``scalb``, ``scalc``, ``scalbc`` as above; and each class's
        # best speed relative to the fastest type (``sigma_q``)
        self.by_class, self.class_sigma = by_class, class_sigma

    def balanced(self, name: str, kvecs: list[tuple[int, ...]]) -> np.ndarray:
        """``[i, j, K]``: the scalable time ``name`` of each range on the devices of each class
        vector at their fractional balance, ``1 / sum_q k_q / scal_q(R)`` (each class at its
        own time of the range; inf for the empty vector)."""
        own = self.by_class[name]  # scal_q(R)
        counts = np.array(kvecs, dtype=np.float64)  # [K, C]
        rate = np.zeros((*own.shape[:2], len(counts)))
        with np.errstate(divide="ignore", invalid="ignore"):
            for q in range(own.shape[2]):  # (a class absent adds nothing, even at 1 / 0)
                k = counts[:, q]
                rate += np.where(k > 0, k / own[:, :, q, None], 0.0)
            return 1.0 / rate

    def scalable(self, name: str, used: np.ndarray) -> np.ndarray:
        """``[i, j, K, 1]``: the scalable time ``name`` of each range that the class DP
        divides by a replica's speed (``sigma``), on the replicas of each class vector.

        A replica of class ``q`` with ``c`` of a microbatch's ``B / m`` samples takes at
        least ``scal_q(R) c / B = (sigma_q scal_q(R)) c / (B sigma_q)``: so the fastest
        type's time ``scal(R)`` may be replaced by the least ``sigma_q scal_q(R)`` over
        the classes the vector uses. It is never less (``sigma_q``, the class's best speed
        relative to the fastest type op by op, is at least its speed on any range), and
        on a range of ops a class is slower at than ``sigma_q`` says (a P100's attention
        layers against its embedding), as much more as that."""
        x = self.by_class[name] * self.class_sigma
        out = np.full((*x.shape[:2], len(used)), np.inf)
        for q in range(x.shape[2]):
            out = np.where(used[:, q], np.minimum(out, x[:, :, q, None]), out)
        return np.maximum(out, getattr(self, name)[:, :, None])[..., None]


def _classes(sigma: np.ndarray, memory: np.ndarray, kind: list[int]
             ) -> list[tuple[float, float, int, int]]:
    """Devices grouped by speed, memory and type (``kind``, its column): ``(sigma, memory
    bytes, count, kind)``, fastest first. Two types with the same best speed and memory are
    still two classes: on most ranges of ops one of them is slower (``_Ranges.scalable``)."""
    counts: dict[tuple[float, float, int], int] = {}
    for key in zip(sigma.tolist(), memory.tolist(), kind):
        counts[key] = counts.get(key, 0) + 1
    return sorted(((s, m, c, k) for (s, m, k), c in counts.items()), reverse=True)


@lru_cache(maxsize=8)
def _class_states(counts: tuple[int, ...]) -> tuple[list[tuple[int, ...]], list[np.ndarray],
                                                    list[np.ndarray]]:
    """Every class-count vector up to ``counts`` (``itertools.product`` order, so
    ``counts`` itself is the last), and per vector the indices of its non-zero
    sub-vectors and of what each leaves of it."""
    import itertools

    kvecs = list(itertools.product(*(range(n + 1) for n in counts)))
    index = {kv: n for n, kv in enumerate(kvecs)}
    subs, rests = [], []
    for kv in kvecs:
        ks = [n for n, k2 in enumerate(kvecs) if any(k2) and all(a <= b for a, b in zip(k2, kv))]
        subs.append(np.array(ks, dtype=np.int64))
        rests.append(np.array([index[tuple(b - a for a, b in zip(kvecs[n], kv))] for n in ks],
                              dtype=np.int64))
    return kvecs, subs, rests


def _class_bound(r: _Ranges, classes, floor: np.ndarray, B: int, m: int, zero: float = 0.0,
                 update: float = 0.0, enough: float | None = np.inf,
                 uncapped: np.ndarray | None = None, known: float = 0.0):
    """The stage-balanced bound for ``m`` microbatches with devices counted per class.

    Like the cheap DP, but the state is how many devices of each class are left, so
    no two stages can both use the fastest devices; a stage's replicas are a vector
    of class counts, its share split by whole samples over exactly those devices, in
    one of the share options (``_class_share_options``), and its AllReduce floor that
    vector's (``floor[n]`` ms per byte for vector ``n`` of ``_class_states``).
    The AllReduce terms (no chain offset) are handled by caps ``c``: every partition is
    at least ``min(A(c), next sync value above c)``, ``A(c)`` the DP over stages whose
    term is at most ``c``; the caps are searched for the largest such bound (see below)
    and stop once it reaches ``enough`` (a caller that keeps the least bound over ``m``
    needs no more). ``enough = None`` returns the table of ``A(inf)`` (``[region, state]``)
    instead, which a later call takes as ``uncapped``. ``known``, a bound for ``m`` already
    found (the cheap DP's), is where the search for the caps starts when it is above
    ``A(inf)``: with a handful of DPs, galloping up from ``A(inf)`` may never pass it.
    """
    U = r.U
    sig = np.array([c[0] for c in classes])
    mem = np.array([c[1] for c in classes])
    kvecs, subs, rests = _class_states(tuple(c[2] for c in classes))
    K = len(kvecs)
    small = K <= SMALL_CLASS_STATES
    used = np.array([[k > 0 for k in kv] for kv in kvecs])  # [K, C]
    total = np.array([sum(kv) for kv in kvecs])
    samples = B // m
    share, first = _class_share_options(kvecs, sig, samples, m, B)  # [K, o] each
    sig_max = np.array([sig[u].max() if u.any() else np.inf for u in used])
    fits = mem[None, None, :] >= r.static[:, :, None]  # [i, j, C]
    allowed = ((~fits).astype(float) @ used.T.astype(float) == 0)[..., None]  # [i, j, K, 1]
    fix, scal = r.fix[:, :, None, None], r.scalable("scal", used)
    fixc, scalc = r.fixc[:, :, None, None], r.scalable("scalc", used)
    scalf, scalb, scalbc = (r.scalable(x, used) for x in ("scalf", "scalb", "scalbc"))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        outside = (r.params[:, :, None] * (zero + update / np.maximum(total, 1)[None, None]))
        tail = (r.params[:, :, None] * (zero + update * (total == 1)[None, None]))[..., None]
        busy = np.where(allowed & np.isfinite(share), m * fix + scal * share, np.inf)
        crit = np.where(allowed & np.isfinite(share), m * fixc + scalc * share, np.inf)
        # microbatch 0 leaves a stage when its first replica is done (see _share_options)
        hop = r.hops.ms(first)[:, None]  # [i, 1, K, o]: the boundary before (as above)
        hop_in = r.hops.ms(first, True)[:, None]
        drain = _drain_most(r.fixb[0], r.scalb[0] / (m * sig.min()), r.hops,
                            samples)[:, None, None, None]
        chain = np.where(np.isfinite(first), fixc + scalc * first / (B * sig_max[:, None]) + hop,
                         np.inf)
        f_first = r.fixf[:, :, None, None] + scalf * first / (B * sig_max[:, None])
        if small:
            # a replica's first backward and its last forward's microbatch wait for the
            # round trip through the stages after it (the cheap DP's around term; small
            # clusters only, see SMALL_CLASS_STATES)
            b_first = r.fixbc[:, :, None, None] + scalbc * first / (B * sig_max[:, None])
            f_busy = m * r.fixf[:, :, None, None] + scalf * share
            b_busy = m * r.fixbc[:, :, None, None] + scalbc * share
            around = np.maximum(f_first + b_busy, f_busy + b_first) + hop
            with_w = np.maximum(  # with the W's, from the forward chain (as in the cheap DP)
                f_first + m * r.fixb[:, :, None, None] + scalb * share,
                f_busy + r.fixb[:, :, None, None] + scalb * first / (B * sig_max[:, None]))
            around = np.where(np.isfinite(busy), np.maximum(
                around, with_w + hop_in - drain + tail), np.inf)
        # the AllReduce after every forward and all but the last backward (as above)
        floor_r = (r.params[:, :, None] * floor[None, None, :])[..., None]
        sync = np.where((total >= 2)[:, None] & np.isfinite(share),
                        m * r.fixf[:, :, None, None] + scalf * share
                        + (m - 1) * r.fixb[:, :, None, None]
                        + scalb * share * ((m - 1) / m) + floor_r
                        + outside[..., None], 0.0)
        # after sync: the update may overlap the tie's AllReduce
        sync = np.where(allowed, np.maximum(sync, busy + outside[..., None]), sync)
        untied = crit + hop
        # (the whole busy time and the sync from the forward chain only, as in the cheap DP)
        busy = np.maximum(untied + r.tie[:, :, None, None],
                          np.maximum(busy + tail, sync) + hop_in - drain)
    busy[:, :, 0] = np.inf
    untied[:, :, 0] = np.inf
    full = K - 1  # every device left

    def solve(cap: float, busy=busy, table: bool = False, beside: bool = small,
              way: tuple | None = None):
        """``A(cap)`` (``table``: per region and state); ``beside``: with the round trip
        term, which needs ``after``; ``way``: ``(chain, around, after, sync)`` instead of
        this DP's own (the samples' average way)."""
        chain_, around_, after_, sync_ = way or (chain, None, None, sync)
        if beside and way is None:
            around_, after_ = around, after
        b = busy if cap == np.inf else np.where(sync_ <= cap, busy, np.inf)
        g = np.full((U + 2, K), np.inf)
        g[U] = 0.0
        g[U + 1] = 0.0
        for i in range(U - 1, -1, -1):
            cont = _then(g, r.multi)
            # per class vector first ([K, j, o], [K, j]): each state gathers whole rows
            bi = np.ascontiguousarray(b[i, i + 1:].transpose(1, 0, 2))
            ci = np.ascontiguousarray(chain_[i, i + 1:].transpose(1, 0, 2))
            conti = np.ascontiguousarray(cont[i + 1:].T)
            if beside:
                ai = np.ascontiguousarray(around_[i, i + 1:].transpose(1, 0, 2))
                afteri = np.ascontiguousarray(after_[i + 1:].T)
            for n in range(K):
                ks = subs[n]
                if ks.size == 0:
                    continue
                val = np.maximum(bi[ks], ci[ks] + conti[rests[n], :, None])
                if beside:
                    val = np.maximum(val, ai[ks] + afteri[rests[n], :, None])
                g[i, n] = val.min()
            if r.multi[i]:
                g[i] = np.minimum(g[i], g[i + 1])
        return g if table else float(g[0, full])

    if small:
        # the least chain of the stages after each region on each state's devices: the
        # same DP with every stage that fits worth nothing but its chain
        after = _then(solve(np.inf, busy=np.where(np.isfinite(busy), -np.inf, np.inf),
                            table=True, beside=False), r.multi)

    table = solve(np.inf, table=True) if uncapped is None else uncapped  # A(inf)
    if enough is None:
        return table
    best = max(float(table[0, full]), known)
    if best >= enough:
        return best
    with np.errstate(invalid="ignore", over="ignore"):
        # and after its first forward and the stages after it on the devices it leaves
        # (as in the cheap DP, ``_capped_dp``'s ``wait``)
        g = solve(np.inf, busy=untied, table=True) if r.tie.any() else table
        cont = _then(g, r.multi)
        left = np.full(K, full)
        left[subs[full]] = rests[full]
        wait = np.where((total >= 2)[:, None], f_first + r.hops.ms(first, True)[:, None]
                        + floor_r + outside[..., None] + cont[None, :, left, None], -np.inf)
        sync = np.maximum(sync, wait)
    best = _search_caps(best, busy, sync, solve, enough, small)
    if small and best < enough:
        # the same along the samples' average way (the cheap DP's ``averaged``), each
        # stage's replicas at their fractional balance with each class at its own times
        fixed = {"c": r.fixc, "f": r.fixf, "b": r.fixb, "bc": r.fixbc}
        balanced = {part: r.balanced("scal" + part, kvecs) for part in fixed}
        chain_a, work, around_a, before_rest = _average_way(
            fixed, balanced, allowed & np.isfinite(share), m, hop)
        work[:, :, 0] = np.inf
        after_a = _then(solve(np.inf, busy=np.where(np.isfinite(work), -np.inf, np.inf),
                              table=True, beside=False, way=(chain_a, None, None, sync)),
                        r.multi)
        with np.errstate(invalid="ignore"):
            lead = np.where((total >= 2)[:, None], floor_r + outside[..., None] + before_rest
                            + after_a[None, :, left, None], -np.inf)
        way = (chain_a, around_a, after_a, np.maximum(sync, lead))
        begin = max(best, solve(np.inf, busy=work, way=way))
        best = max(best, _search_caps(begin, work, way[3], lambda cap: solve(
            cap, busy=work, way=way), enough, small))
    return best


def _search_caps(best: float, busy, sync, solve, enough: float, small: bool) -> float:
    """The class DP's bound over its AllReduce caps, from ``best`` (at least ``A(inf)``).

    Caps at the distinct sync values above it, v_0 < v_1 < ...: a partition whose
    largest sync is at most v_q is at least A(v_q) (``solve(v_q)``), any other at least
    v_{q+1}, so f(q) = min(v_{q+1}, A(v_q)) bounds all; the first term grows with q and the
    second shrinks, so the largest f is where they cross (the exact min-max). The search
    first tries the cap a caller needs (``enough``), then gallops up from ``best`` (the
    crossing is usually a few per cent above it) and bisects once it is bracketed, until
    the bound is within the precision of the min-max (10x finer on ``small`` clusters)."""
    values = np.unique(sync[np.isfinite(busy) & (sync > best)])
    lo, hi = -1, len(values) - 1  # A(v_lo) > v_lo+1 (lo = -1: none known), A(v_hi) <= v_hi+1
    top = max(float(values[hi]), best) if len(values) else best  # some partition's value
    precision, most = (CAP_PRECISION / 10, 14) if small else (CAP_PRECISION, MAX_CAP_SOLVES)
    step, bracketed, solves = precision, False, 0
    while (hi - lo > 1 and best < enough and best * (1.0 + precision) < top
           and solves < most):
        below = float(values[lo + 1]) if lo >= 0 else best
        if enough < top:
            target = enough
        elif bracketed:
            target = float(np.sqrt(below * top))
        else:
            target, step = below * (1.0 + step), 2.0 * step
        q = int(np.searchsorted(values, target, side="left")) - 1  # the largest value below
        q = min(max(q, lo + 1), hi - 1)
        a, solves = solve(float(values[q])), solves + 1
        best = max(best, min(float(values[q + 1]), a))
        if a > values[q + 1]:
            lo = q
        else:
            hi, top, bracketed = q, min(top, max(float(values[q]), a)), True
    return best
