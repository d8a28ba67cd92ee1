"""The strategy decoder learns a 2-device toy's best strategy by REINFORCE (seeded, fast).

The best strategy is found by enumerating every strategy pair of the toy's two op groups
on the environment, independently of the policy.
"""

from __future__ import annotations

import pytest
import torch

from dl_nfv.artifacts import BadInput, cluster_of, load
from dl_nfv.planners.learned.coarsen import coarsen
from dl_nfv.planners.learned.decoder import (
    SINGLE,
    SUBSET_PROP,
    StrategyPolicy,
    candidates,
    greedy,
    replica_subsets,
)
from dl_nfv.planners.learned.env import StrategyEnv
from dl_nfv.planners.learned.features import group_graph
from dl_nfv.planners.learned.refine import refine
from dl_nfv.planners.learned.reinforce import Problem, reinforce
from dl_nfv.simulator.costs import CostModel
from tests.planners.test_dp_baselines import v100_t4_topology
from tests.planners.test_learned import _graph

MIB = 2**20
EPISODES = 150


def _problem(param_bytes: int):
    graph, topology = _graph(n=4, param_bytes=param_bytes), v100_t4_topology()
    cm = CostModel(graph, topology)
    c = coarsen(cm, target=2)
    return StrategyEnv(graph, topology, c, cost_model=cm), group_graph(cm, c)


def _enumerated(env: StrategyEnv) -> dict[tuple[int, int], float]:
    options = candidates(env.cm.cluster)
    return {(i, j): env.evaluate([a.strategy, b.strategy]).reward
            for i, a in enumerate(options) for j, b in enumerate(options)}


def _trained(env, gg, seed: int = 0):
    torch.manual_seed(seed)
    policy = StrategyPolicy(hidden=32, layers=1, heads=2)
    return policy, reinforce(policy, [Problem(env=env, graph=gg)], episodes=EPISODES, seed=seed)[0]


def test_candidates_are_each_device_and_the_whole_cluster_four_ways():
    options = candidates(cluster_of(v100_t4_topology()))
    # one device per type and per host: no replica subsets
    assert len(options) == 2 * 2 + 2
    assert [c.strategy.devices for c in options if c.kind == SINGLE] == [("a/gpu0",), ("b/gpu0",)]
    assert {c.strategy.ps_server for c in options} == {"", "a/gpu0", "b/gpu0"}


def test_replica_subsets_are_each_type_and_each_host_once(topology_path):
    """The HeteroG testbed: hosts v100 (2 V100), gtx0 and gtx1 (2 1080Ti each), p100
    (2 P100). Types give {v100}, {gtx0, gtx1} (4 devices), {p100}; hosts add gtx0 and
    gtx1 alone (v100 and p100 repeat their types)."""
    cluster = cluster_of(load(topology_path))
    hosts = [[n for n in cluster.device_names if n.startswith(h + "/")]
             for h in ("v100", "gtx0", "gtx1", "p100")]
    subsets = [tuple(cluster.device_names[i] for i in s) for s in replica_subsets(cluster)]
    assert subsets == [tuple(hosts[0]), (*hosts[1], *hosts[2]), tuple(hosts[3]),
                       tuple(hosts[1]), tuple(hosts[2])]
    options = candidates(cluster)
    assert len(options) == 2 * 8 + 2 + 5
    assert all(c.strategy.balance == "proportional" for c in options if c.kind == SUBSET_PROP)


@pytest.mark.parametrize("param_bytes", [64 * MIB, 1024])
def test_reinforce_learns_the_toys_best_strategy(param_bytes):
    """64 MiB of parameters per op over 25 Gbps: synchronising costs more than the T4's help,
    so both groups on the V100 alone is best by far. 1 KiB per op: replicating over both
    with proportional shares is best (AllReduce and a server on either device within
    0.1% of each other), well ahead of the V100 alone."""
    env, gg = _problem(param_bytes)
    rewards = _enumerated(env)
    best = max(rewards.values())
    policy, training = _trained(env, gg)
    learned = env.evaluate(greedy(policy, env, gg)).reward
    assert learned >= best * (1 + 1e-3)  # rewards are negative: within 0.1% of the best
    single_best = max(r for (i, j), r in rewards.items() if i < 2 and j < 2)
    if param_bytes > MIB:
        assert best == rewards[(0, 0)] and learned == best
    else:
        assert learned > single_best * 0.8  # at least 20% faster than any single-device plan
    assert training.best_outcome.reward == max(training.rewards)


def test_one_policy_learns_two_problems_whose_best_strategies_differ():
    """Trained on both toys in turn, the policy tells them apart by their features: the
    V100 alone where parameters are heavy, both devices where they are light."""
    problems = [Problem(env=env, graph=gg) for env, gg in (_problem(64 * MIB), _problem(1024))]
    torch.manual_seed(0)
    policy = StrategyPolicy(hidden=32, layers=1, heads=2)
    trainings = reinforce(policy, problems, episodes=4 * EPISODES, seed=0, learning_rate=0.002)
    assert [len(t.rewards) for t in trainings] == [2 * EPISODES, 2 * EPISODES]
    for p in problems:
        best = max(_enumerated(p.env).values())
        assert p.env.evaluate(greedy(policy, p.env, p.graph)).reward >= best * (1 + 1e-3)


def test_training_is_reproducible_from_its_seed_and_needs_a_problem():
    env, gg = _problem(64 * MIB)
    runs = []
    for _ in range(2):
        torch.manual_seed(3)
        policy = StrategyPolicy(hidden=32, layers=1, heads=2)
        runs.append(reinforce(policy, [Problem(env=env, graph=gg)], episodes=30, seed=3)[0])
    assert runs[0].rewards == runs[1].rewards and len(set(runs[0].rewards)) > 1
    with pytest.raises(BadInput, match="at least one problem"):
        reinforce(policy, [], episodes=10)


# ---------------------------------------------------------------------------- refinement
@pytest.mark.parametrize("param_bytes", [64 * MIB, 1024])
def test_refinement_reaches_the_enumerated_best_from_every_start(param_bytes):
    """On the toy no single-group move from a non-best pair is a dead end: hill climbing
    from each of the 36 starting pairs ends at the best pair's reward."""
    env, _ = _problem(param_bytes)
    rewards = _enumerated(env)
    best = max(rewards.values())
    options = candidates(env.cm.cluster)
    for (i, j), start in rewards.items():
        result = refine(env, [options[i].strategy, options[j].strategy])
        assert result.start.reward == start
        assert result.outcome.reward == best and result.local_optimum, (i, j)
        assert env.evaluate(result.strategies).reward == best


def test_refinement_stops_at_its_evaluation_budget_never_worse_than_its_start():
    env, _ = _problem(1024)
    options = candidates(env.cm.cluster)
    start = [options[1].strategy, options[1].strategy]  # both groups on the T4
    result = refine(env, start, max_evaluations=4)
    assert result.evaluations == 4 and not result.local_optimum
    assert result.outcome.reward >= result.start.reward
    assert result.start.reward == env.evaluate(start).reward
