"""TAG's refinement: cut placement and single-group moves and the batching repaired for
its microbatch count reach the enumerated optimum of a toy chain from a bad seed; a cut
is placed at its best position past a local optimum of one-group steps; the repair gives
every replica a sample per microbatch."""

from __future__ import annotations

import itertools
from pathlib import Path

from dl_nfv.artifacts import load
from dl_nfv.planners.heterog import problem_of
from dl_nfv.planners.learned.env import GroupStrategy
from dl_nfv.planners.tag.batching import ONE, BatchedEnv, Batching
from dl_nfv.planners.tag.polish import _Budget, cut_moves, options, place_cuts, polish, repaired
from dl_nfv.planners.tag.topogen import generate
from tests.planners.test_dp_baselines import v100_t4_topology
from tests.planners.test_learned import _graph
from tests.planners.test_tag_batching import A, B, _chain

ROOT = Path(__file__).resolve().parents[2]
CHOICES = (ONE, Batching(2, "1f1b"), Batching(4, "1f1b"))


def test_refinement_beats_its_seed_and_reaches_the_enumerated_optimum_of_a_chain():
    """Every strategy of the 3-group chain over the refinement's options at each of three
    batchings is simulated; from the whole chain on one device with one microbatch (the
    seed), refinement returns a strategy as fast as the best of them, faster than the
    seed."""
    env = BatchedEnv(_chain().env)
    seed = (GroupStrategy(devices=A),) * 3
    moves = options(env, seed)
    every = {(s, b): env.evaluate(s, b).reward
             for b in CHOICES for s in itertools.product(moves, repeat=3)}
    best = max(every.values())
    got = polish(env, seed, ONE, CHOICES, max_evaluations=5000)
    assert got.outcome.reward == best
    assert got.outcome.reward > every[seed, ONE] * 0.99 > every[seed, ONE]
    assert every[got.strategies, got.batching] == got.outcome.reward


def test_single_group_moves_take_a_seeds_strategy_outside_the_candidates():
    """A seed's replica set that is no HeteroG candidate is among the options (with its
    other balance), so a group can move onto it."""
    env = BatchedEnv(_chain().env)
    odd = GroupStrategy(devices=(*B, *A), balance="proportional")  # reversed: no candidate
    moves = options(env, [odd])
    assert odd in moves and GroupStrategy(devices=(*B, *A)) in moves
    assert len(moves) == len(set(moves))


def test_the_repair_gives_every_replica_a_sample_per_microbatch():
    """Batch 8 on a V100 and a T4: speed-proportional shares leave the T4 fewer than 4
    samples, so for 4 microbatches the group takes even shares (4 and 4); for 8, where
    even shares hold 4 each, the V100 alone."""
    problem = problem_of(_graph(n=6, param_bytes=1024, batch=8), v100_t4_topology(), groups=3)
    env = BatchedEnv(problem.env)
    devices = problem.env.devices
    prop = GroupStrategy(devices=devices, balance="proportional")
    shares = problem.env.group_of(0, prop).shares
    assert min(round(x * 8) for x in shares) < 4
    fixed = repaired(env, [prop] * 3, 4)
    assert all(s == GroupStrategy(devices=devices) for s in fixed)
    assert [round(x * 8) for x in problem.env.group_of(0, fixed[0]).shares] == [4, 4]
    fastest = next(d for d in devices if d.startswith("a/"))  # the V100
    assert repaired(env, [prop] * 3, 8) == (GroupStrategy(devices=(fastest,)),) * 3
    assert repaired(env, [prop] * 3, 1) == (prop,) * 3


def test_cut_moves_are_every_other_position_of_one_boundary():
    """Runs [0, 2) of x and [2, 5) of y in a chain of 6 ending in z: the boundary moves to
    0, 1, 3, 4 and 5 (x or y vanishing at the ends); the groups outside stay."""
    x, y, z = (GroupStrategy(devices=(f"h{i}/gpu0",)) for i in range(3))
    current = (x, x, y, y, y, z)
    got = cut_moves(current, range(0, 2), range(2, 5))
    assert got == [(y,) * 5 + (z,), (x,) + (y,) * 4 + (z,), (x,) * 3 + (y,) * 2 + (z,),
                   (x,) * 4 + (y, z), (x,) * 5 + (z,)]


def test_a_cut_moves_past_a_local_optimum_of_one_group_steps():
    """VGG-19 on generated cluster 1001 at 8 microbatches (1F1B): two stages, the first on
    the two V100-16GB hosts, the second on the V100-32GB pair. With the cut after op group
    2, moving it by one group is slower either way (its neighbours' activations are
    larger), yet a cut further on is faster: the cut placement finds the best position of
    the boundary, as an enumeration of every position does."""
    graph = load(ROOT / "bench" / "profiles" / "vgg19-b32-r3.json", expect="op-graph")
    env = BatchedEnv(problem_of(graph, generate(1001), groups=16).env)
    first = GroupStrategy(devices=("r2h0/gpu0", "r2h1/gpu0"), balance="proportional")
    rest = GroupStrategy(devices=("r0h0/gpu0", "r0h0/gpu1"), balance="proportional")
    eight = Batching(8, "1f1b")
    at = {k: env.evaluate((first,) * k + (rest,) * (16 - k), eight).reward for k in range(17)}
    assert at[1] < at[2] > at[3]  # a local optimum of one-group steps
    budget = _Budget(env, 100, 600.0)
    start = (first,) * 2 + (rest,) * 14
    got, outcome, moved = place_cuts(start, eight, budget.evaluate(start, eight), budget)
    best = max(at, key=at.__getitem__)
    assert moved and got == (first,) * best + (rest,) * (16 - best)
    assert outcome.reward == at[best] > at[2]
