"""TAG's refinement: boundary and single-group moves and the batching repaired for its
microbatch count reach the enumerated optimum of a toy chain from a bad seed, and the
repair gives every replica a sample per microbatch."""

from __future__ import annotations

import itertools

from dl_nfv.planners.heterog import problem_of
from dl_nfv.planners.learned.env import GroupStrategy
from dl_nfv.planners.tag.batching import ONE, BatchedEnv, Batching
from dl_nfv.planners.tag.polish import options, polish, repaired
from tests.planners.test_dp_baselines import v100_t4_topology
from tests.planners.test_learned import _graph
from tests.planners.test_tag_batching import A, B, _chain

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


def test_boundary_moves_take_a_seeds_strategy_outside_the_candidates():
    """A seed's replica set that is no HeteroG candidate is among the options (with its
    other balance), so a stage boundary can move onto it."""
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
