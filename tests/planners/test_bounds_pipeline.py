"""The stage-balanced bound's parts against hand computations and enumeration.

(The bound against every simulated plan of tiny problems: ``test_bounds_oracle.py``.)
"""

from __future__ import annotations

from itertools import combinations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dl_nfv.artifacts import TieSync, from_data, load
from dl_nfv.artifacts.topology import Topology
from dl_nfv.planners import run
from dl_nfv.planners.bounds import dp, ranges, stage_balanced
from dl_nfv.planners.bounds.dp import (
    DeviceGrid,
    Shape,
    StageTerms,
    capped_min_max,
    least_chain_after,
)
from dl_nfv.planners.bounds.network import _cut_limits, _group_floors, _host_limits
from dl_nfv.planners.bounds.ranges import coarse_cuts, forced_cuts
from dl_nfv.planners.bounds.shares import class_share_options, share_buckets, share_options
from dl_nfv.planners.bounds.stage_balanced import stage_balanced_bound_ms
from dl_nfv.planners.pipeline.problem import Problem
from tests.planners.test_pipeline import GIB, V100, chain, nvlink
from tests.planners.test_pipeline_scheduler import _diamond, _topology


def test_forced_cuts_of_a_diamond_and_a_chain():

    topo = nvlink(2)
    assert forced_cuts(Problem(_diamond(3), topo)) == [1, 4]  # a | b0 b1 b2 | d
    assert forced_cuts(Problem(chain(4), topo)) == [1, 2, 3]


def test_allreduce_floor_across_hosts():
    """One 2 GiB layer on two single-V100 hosts behind 25 Gbps NICs: splitting the batch would
    halve the compute (15 ms) but the AllReduce must push 2 GiB into each host (687 ms), so the
    bound is the layer on one device, 10 + 20 ms, plus that device's memory traffic outside the
    ops (its optimizer step and gradient-bucket upkeep); the same over NVLink (86 ms of
    AllReduce)."""

    graph = chain(1, param_bytes=2 * GIB)
    problem = Problem(graph, _topology([V100, V100]))
    dev = problem.devices[0]
    outside = 2 * GIB * (problem.cm.update_ms_per_byte(dev) + problem.cm.upkeep_ms_per_byte(dev, 1))
    assert stage_balanced_bound_ms(problem) == pytest.approx(30.0 + outside)
    # over one 200 Gbps NVLink each replica still sends 2 GiB (86 ms): one device wins again
    assert stage_balanced_bound_ms(Problem(graph, nvlink(2))) == pytest.approx(30.0 + outside)
    # with 1 MiB of parameters splitting the batch pays: 15 ms, the floor is 0.04 ms
    small = chain(1, param_bytes=2**20)
    assert stage_balanced_bound_ms(Problem(small, nvlink(2))) == pytest.approx(15.0, rel=0.01)


def test_share_options_trade_the_first_replica_against_the_slowest():
    """Two equal devices, 8 samples in one microbatch: a first replica of 1 sample leaves 7
    to the other (busy 7/8 of the batch time), of 2-3 leaves at most 6-5 (taken at 5), of 4
    the even split; devices of speeds 2 and 1 with 6 samples split 4:2 (1/3 each)."""

    assert share_buckets(8, 2) == [(1, 1), (2, 3), (4, 4)]
    assert share_buckets(8, 3) == [(1, 1), (2, 2)]
    assert share_buckets(2, 4) == [(1, 1)]  # fewer samples than replicas: some hold one
    assert share_buckets(64, 2) == [(1, 1), (2, 3), (4, 7), (8, 32)]  # at most 4 ranges
    options = share_options({(0, 1): (1.0, 1.0)}, regions=1, devices=2, batch=8, m=1)
    share, first = options.busy, options.first
    assert share[0, 1, 1, 0] == pytest.approx(1.0)  # one device: the whole microbatch
    assert share[0, 1, 2].tolist() == pytest.approx([7 / 8, 5 / 8, 4 / 8])
    assert first[1, 0] == 8 and first[2].tolist() == [1, 2, 4]
    options = share_options({(0, 1): (2.0, 1.0)}, regions=1, devices=2, batch=6, m=1)
    share, first = options.busy, options.first
    # 5 samples on the fast device alone take 2.5 / 6; 3 take 1.5 / 6 < the even 2 / 6
    assert share[0, 1, 2].tolist() == pytest.approx([2.5 / 6, 2 / 6])
    assert first[2].tolist() == [1, 2]
    share = share_options({(0, 1): (1.0, 1.0)}, regions=1, devices=2, batch=8, m=2).busy  # 4 per microbatch
    assert share[0, 1, 2].tolist() == pytest.approx([2 * 3 / 8, 2 * 2 / 8])


def test_class_share_options_remove_the_first_replica_from_the_best_class():
    """Speeds 2 and 1, one device each, 6 samples: a first replica of 1 sample leaves 5,
    best on the fast device (2.5 / 6); of 2-3 leaves 3 (1.5 / 6), below the even 2 / 6."""

    options = class_share_options([(0, 0), (1, 0), (0, 1), (1, 1)], np.array([2.0, 1.0]),
                                  samples=6, m=1, batch=6)
    share, first = options.busy, options.first
    assert np.isinf(share[0]).all() and np.isinf(first[0]).all()  # no device
    assert share[1, 0] == pytest.approx(3 / 6) and first[1, 0] == 6  # the fast one alone
    assert share[2, 0] == pytest.approx(6 / 6) and np.isinf(share[2, 1])
    assert share[3].tolist() == pytest.approx([2.5 / 6, 2 / 6])
    assert first[3].tolist() == [1, 2]


def _min_max_by_enumeration(busy, chain, sync, around, U: int, D: int) -> float:
    """``min over partitions of max(max_k (chain before k + busy_k), max_k (chain before k
    + around_k + least chain after k), max_k sync_k)``, every partition of regions
    ``0..U`` into ranges, device counts and options enumerated (the least chain after a
    stage as well, over every partition of the regions after it on the devices left)."""
    def stages(i, left):
        for j in range(i + 1, U + 1):
            for k in range(1, left + 1):
                for o in range(busy.shape[3]):
                    if busy[i, j, k, o] < float("inf"):
                        yield j, k, o

    def least_chain(i, left):
        if i == U:
            return 0.0
        return min((chain[i, j, k, o] + least_chain(j, left - k) for j, k, o in stages(i, left)),
                   default=float("inf"))

    best = float("inf")

    def walk(i, left, before, value, top):
        nonlocal best
        if i == U:
            best = min(best, max(value, top))
            return
        for j, k, o in stages(i, left):
            beside = before + around[i, j, k, o] + least_chain(j, left - k)
            walk(j, left - k, before + chain[i, j, k, o],
                 max(value, before + busy[i, j, k, o], beside), max(top, sync[i, j, k, o]))

    walk(0, D, 0.0, 0.0, 0.0)
    return best


@settings(max_examples=40, deadline=None)
@given(U=st.integers(1, 4), D=st.integers(1, 3), options=st.integers(1, 2), seed=st.integers(0, 2**31),
       zeros=st.floats(0.0, 0.6))
def test_capped_dp_is_the_exact_min_max(U, D, options, seed, zeros):
    """The capped DP of the cheap bound gives exactly the min-max an enumeration of every
    partition finds, sync terms (some zero, some large) and the terms around each stage
    (with the least chain after it) included."""

    rng = np.random.default_rng(seed)
    shape = (U + 1, U + 1, D + 1, options)
    busy = rng.uniform(1.0, 10.0, shape)
    busy[:, :, 0] = np.inf
    busy[rng.random(shape) < 0.1] = np.inf  # some stages do not fit
    # one microbatch through a stage never takes longer than its busy time
    chain = np.where(np.isfinite(busy), busy * rng.uniform(0.0, 0.5, shape), 1.0)
    around = np.where(np.isfinite(busy), busy * rng.uniform(0.3, 1.0, shape), np.inf)
    sync = np.where(rng.random(shape) < zeros, 0.0, rng.uniform(0.0, 25.0, shape))
    expected = _min_max_by_enumeration(busy, chain, sync, around, U, D)
    shape = Shape(split=np.zeros(U, dtype=bool), devices=D)
    got = capped_min_max(StageTerms(busy=busy, chain=chain, sync=sync, around=around,
                                    after=least_chain_after(busy, chain, shape)), shape)
    assert got == pytest.approx(expected, rel=1e-12)


def test_a_replicated_stage_s_allreduce_waits_for_the_stages_after_it():
    """Two regions on three devices: the first on two replicas (busy 10, chain 1, its
    AllReduce term 5), the second on the third (busy 20), or both on all three (50). The
    chain alone gives 1 + 20 = 21; but the first stage's AllReduce can start only after the
    last gradient comes back, after the second stage's 20, so with 2 before that (its first
    forward and the AllReduce floor) the bound is 22."""

    U, D = 2, 3
    busy = np.full((U + 1, U + 1, D + 1, 1), np.inf)
    chain, sync, wait = np.ones_like(busy), np.zeros_like(busy), np.full_like(busy, -np.inf)
    busy[0, 1, 2], sync[0, 1, 2], wait[0, 1, 2] = 10.0, 5.0, 2.0
    busy[1, 2, 1] = 20.0
    busy[0, 2, 3], sync[0, 2, 3] = 40.0, 50.0
    shape = Shape(split=np.zeros(U, dtype=bool), devices=D)
    assert capped_min_max(StageTerms(busy=busy, chain=chain, sync=sync),
                          shape) == pytest.approx(21.0)
    assert capped_min_max(StageTerms(busy=busy, chain=chain, sync=sync, wait=wait, untied=busy),
                          shape) == pytest.approx(22.0)


def test_the_bound_counts_the_boundary_transfer_both_ways():
    """Two 4 GiB layers that do not fit one 16 GiB GPU together, on two hosts joined by one
    25 Gbps link, with 1 GiB of activations per sample: every plan sends at least one
    sample's activations over the link and its gradient back, 2 x (5 us + 1 GiB / 25 Gbps)
    = 687 ms that the bound adds to the same graph's with small activations (all but the
    optimizer step's memory traffic, under a millisecond, which a term without the
    transfers bounds on its own)."""

    topo = from_data(Topology, {
        "kind": "topology", "schema_version": 1, "name": "pair",
        "hosts": [{"name": f"h{i}", "devices": [{"type": V100}]} for i in range(2)],
        "links": [{"endpoints": ["h0/gpu0", "h1/gpu0"], "bandwidth_gbps": 25,
                   "latency_us": 5}]})
    big = chain(2, param_bytes=4 * GIB, out_bytes=2 * GIB, batch=2)
    small = chain(2, param_bytes=4 * GIB, out_bytes=2**10, batch=2)
    hop_ms = 2 * (5e-3 + GIB * 8 / 25e9 * 1e3)
    bound = stage_balanced_bound_ms(Problem(big, topo))
    assert bound - stage_balanced_bound_ms(Problem(small, topo)) >= hop_ms - 1.0
    assert bound <= run("pipeline", big, topo).prediction.iteration_ms


def test_allreduce_floors_of_a_ring_of_uneven_links():
    """The ring example (100, 25, 100, 10, 100, 25, 100, 40 Gbps): two GPUs are at best
    joined by a cut of 110 Gbps (their 100 Gbps link and the 10), all eight by 35 (the 10
    and a 25); the cost model's own AllReduce of all eight is slower still, and every
    group size's floor is the least over its groups."""

    problem = Problem(chain(2), load("examples/topologies/ring8-mixed.yaml"))
    devices = list(problem.devices)
    cut = _cut_limits(problem.cm.capacity_graph(collective=True), devices)
    assert cut[2] == pytest.approx(8 / 110e6) and cut[8] == pytest.approx(8 / 35e6)
    groups = _group_floors(problem, devices, [0] * 8, 1)  # one class: per group size
    assert groups[(8,)] == pytest.approx(problem.cm.allreduce_ms_per_byte(devices))
    assert groups[(8,)] > cut[8]
    assert groups[(3,)] == pytest.approx(min(problem.cm.allreduce_ms_per_byte(g)
                                             for g in combinations(devices, 3)))
    assert (_host_limits(problem, devices) >= cut - 1e-18).all()


def test_round_trip_is_taken_over_stages_no_longer_than_the_bound(monkeypatch):
    """Three layers of 2 GiB on three V100s over 25 Gbps: replicating layers would AllReduce
    gigabytes over the slow links, far longer than any pipeline of them, so the round trip a
    stage waits for passes single-device stages, a whole microbatch each way. The least
    chain after a stage taken over every partition (replicas with a one-sample first share)
    misses that; taken over partitions of stages no longer than the bound, it does not."""

    graph = chain(3, param_bytes=2 * GIB, batch=4)
    topo = _topology([V100] * 3)
    problem = Problem(graph, topo, tie_sync=TieSync.EXCHANGE)
    tight = stage_balanced_bound_ms(problem)
    plan = run("pipeline", graph, topo)
    assert tight <= plan.prediction.iteration_ms
    monkeypatch.setattr(dp, "AFTER_ROUNDS", 0)
    loose = stage_balanced_bound_ms(problem)
    assert tight >= 1.09 * loose  # 98.6 against 90.0 ms (the plan: 106.1)
def _bounds_with_counts(problem, monkeypatch, **grid):
    """The stage-balanced bound exactly, and with the device counts on a grid."""

    exact = stage_balanced_bound_ms(problem)
    monkeypatch.setattr(stage_balanced, "EXACT_COUNTS_UP_TO", 0)
    real = DeviceGrid.__init__
    monkeypatch.setattr(DeviceGrid, "__init__", lambda self, n: real(self, n, **grid))
    return exact, stage_balanced_bound_ms(problem)


@pytest.mark.parametrize("devices, layers, batch", [(8, 6, 8), (12, 10, 32), (6, 4, 16)])
def test_the_bound_on_a_grid_of_every_count_is_the_exact_bound(monkeypatch, devices, layers,
                                                                batch):

    graph = chain(layers, param_bytes=GIB // 4, batch=batch, slower={"P100": 1.7})
    topo = from_data(Topology, {
        "kind": "topology", "schema_version": 1, "name": "two-types",
        "hosts": [{"name": "h", "devices": [{"type": V100, "count": devices // 2},
                                            {"type": "P100", "count": devices - devices // 2}],
                   "interconnect": {"kind": "pcie", "bandwidth_gbps": 100, "latency_us": 2}}]})
    exact, on_grid = _bounds_with_counts(Problem(graph, topo), monkeypatch)
    assert on_grid == exact  # at most 16 devices: every count is on the grid


@pytest.mark.parametrize("devices, layers, batch", [(8, 6, 8), (12, 10, 32), (16, 12, 64)])
def test_the_bound_on_a_coarse_grid_is_a_relaxation(monkeypatch, devices, layers, batch):

    graph = chain(layers, param_bytes=GIB // 4, batch=batch)
    exact, coarse = _bounds_with_counts(Problem(graph, nvlink(devices)), monkeypatch, dense=2,
                                        steps=3)
    assert 0 < coarse <= exact


def test_device_count_grid():

    c = DeviceGrid(128)
    assert list(c.lo[:17]) == list(range(17)) and c.lo[-1] == 128 and len(c.lo) <= 17 + 24
    for r in range(129):  # the least grid value at or above r
        assert c.lo[c.up[r]] >= r and (c.up[r] == 0 or c.lo[c.up[r] - 1] < r)
    q = int(np.searchsorted(c.lo, 40))  # with 40 devices left a stage takes a bucket of at
    assert all(1 <= c.lo[b] <= 40 for b in c.ks[q])  # most 40, and what is left is on the
    assert all(c.lo[c.at[q][b]] >= 40 - c.lo[b] for b in c.ks[q])  # grid at or above it
    x = np.arange(129.0)[None, :] * np.ones((2, 1))
    assert np.array_equal(c.reduce(x, 1)[0], c.lo.astype(float))  # the least of a bucket




def test_coarse_cuts_keep_heavy_regions_and_never_two_blocks_side_by_side():

    cuts = list(range(11))  # ten single-op regions
    work = np.array([1, 1, 9, 1, 1, 1, 9, 1, 9, 1.0])
    # heavy regions 2, 6, 8 stay; the light runs 0-1 and 3-5 become blocks
    assert coarse_cuts(cuts, work, keep=set(), most=7) == [0, 2, 3, 6, 7, 8, 9, 10]
    # a kept position's region stays as it is
    assert coarse_cuts(cuts, work, keep={4}, most=9) == [0, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    assert coarse_cuts(cuts, work, keep=set(), most=10) == cuts  # few enough already
    # where the next threshold would merge everything, the finer one stays
    assert coarse_cuts(cuts, work, keep=set(), most=6) == [0, 2, 3, 6, 7, 8, 9, 10]
    # a region of several ops stays too
    assert coarse_cuts([0, 1, 2, 5, 6, 7], np.ones(7), keep=set(), most=4) == [0, 2, 5, 7]


def _uneven_chain(layers: int, batch: int):
    """A chain of heavy layers with two light ones after each."""
    from dataclasses import replace

    graph = chain(layers, param_bytes=GIB // 16, batch=batch)
    ops = tuple(replace(op, fwd_ms={V100: 10.0 if i % 3 == 0 else 1.0},
                        bwd_ms={V100: 20.0 if i % 3 == 0 else 2.0})
                for i, op in enumerate(graph.ops))
    return replace(graph, ops=ops)


@pytest.mark.parametrize("devices, layers, most", [(4, 12, 8), (3, 15, 10), (8, 30, 20), (4, 12, 5)])
def test_the_bound_over_merged_regions_is_a_relaxation(monkeypatch, devices, layers, most):

    problem = Problem(_uneven_chain(layers, batch=8), nvlink(devices))
    exact = stage_balanced_bound_ms(problem)
    monkeypatch.setattr(ranges, "EXACT_REGIONS_UP_TO", layers)
    assert stage_balanced_bound_ms(problem) == exact  # every forced cut kept
    monkeypatch.setattr(ranges, "EXACT_REGIONS_UP_TO", most)
    assert 0 < stage_balanced_bound_ms(problem) <= exact
