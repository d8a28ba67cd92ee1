"""`plan tag`: the tree search finds an enumerated optimum, is deterministic for a seed,
the joint graph says what it should, plans are valid and never slower than the best DP
baseline, `plan learn tag` trains a policy the planner loads, and bad input exits 2."""

from __future__ import annotations

import itertools
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from dl_nfv.artifacts import load, save
from dl_nfv.cli.main import cli
from dl_nfv.planners import run
from dl_nfv.planners.heterog import best_baseline, problem_of
from dl_nfv.planners.learned.decoder import candidates
from dl_nfv.planners.tag.joint import JointStatic, joint_graph
from dl_nfv.planners.tag.learn import learn
from dl_nfv.planners.tag.mcts import decision_order, search
from dl_nfv.planners.tag.planner import DEFAULT_POLICY, load_net, new_net
from dl_nfv.planners.tag.topogen import generate
from dl_nfv.planners.validate import validate_plan
from tests.planners.test_dp_baselines import v100_t4_topology
from tests.planners.test_learned import _graph

ROOT = Path(__file__).resolve().parents[2]
PROFILES = ROOT / "bench" / "profiles"
TESTBED = ROOT / "examples" / "topologies" / "heterog-testbed8.yaml"
MIB = 2**20


def _toy(param_bytes: int):
    """A chain cut into 3 op groups on a V100 and a T4: 6 candidates, 216 strategies."""
    problem = problem_of(_graph(n=6, param_bytes=param_bytes), v100_t4_topology(), groups=3)
    assert len(problem.env.coarsening.groups) == 3
    return problem


@pytest.mark.parametrize("param_bytes", [64 * MIB, 4 * MIB, 1024])
@pytest.mark.parametrize("guided", [False, True])
def test_the_search_finds_the_enumerated_optimum_of_a_three_group_chain(param_bytes, guided):
    """Every one of the 6^3 strategies is simulated; the search, from the worst of them as
    its incumbent, with 300 playouts (100 per decision) returns one as good as the best
    (within 0.1% where the best few are near ties)."""
    problem = _toy(param_bytes)
    env = problem.env
    options = [c.strategy for c in candidates(env.cm.cluster)]
    every = {s: env.evaluate(s).reward for s in itertools.product(options, repeat=3)}
    best, worst = max(every.values()), min(every, key=every.get)
    assert every[worst] < best
    net = new_net(0) if guided else None  # untrained: its priors only, not its values
    found = search(env, problem.graph, worst, ref_ms=-best, net=net, playouts=300, seed=1,
                   value_weight=0.0)
    # at 1 KiB per op replicating on either device or a server are within 0.01% of each other
    assert found.outcome.reward == pytest.approx(best, rel=1e-12 if param_bytes > MIB else 1e-3)
    assert found.start.reward == every[worst]
    assert len(found.samples) == 3 and all(abs(sum(s.visits) - 1) < 1e-9 for s in found.samples)


def test_the_search_is_deterministic_for_a_seed():
    problem = _toy(4 * MIB)
    env = problem.env
    start = (candidates(env.cm.cluster)[1].strategy,) * 3
    runs = [search(env, problem.graph, start, ref_ms=10.0, net=new_net(0), playouts=9, seed=s)
            for s in (5, 5)]
    assert runs[0].strategies == runs[1].strategies and runs[0].samples == runs[1].samples
    assert runs[0].evaluations == runs[1].evaluations


def test_decisions_go_largest_group_first():
    problem = problem_of(load(PROFILES / "vgg19-b32-r3.json", expect="op-graph"),
                         load(TESTBED, expect="topology"), groups=16)
    order = decision_order(problem.graph)
    work = problem.graph.x[:, 0].tolist()
    assert sorted(order) == list(range(len(work)))
    assert all(work[a] >= work[b] for a, b in zip(order, order[1:]))


def test_the_joint_graph_carries_candidates_links_and_the_partial_placement():
    problem = problem_of(load(PROFILES / "vgg19-b32-r3.json", expect="op-graph"),
                         load(TESTBED, expect="topology"), groups=8)
    options = candidates(problem.env.cm.cluster)
    static = JointStatic(problem.graph, options)
    groups, devices = problem.graph.group_device_ms.shape
    ps = next(i for i, c in enumerate(options) if c.server >= 0)  # every device and a server
    decided = [None] * groups
    decided[2], decided[5] = 0, ps
    data = joint_graph(static, decided, current=3)
    assert data["group", "runs_on", "device"].edge_index.shape == (2, groups * devices)
    assert data["device", "link", "device"].edge_index.shape == (2, devices * (devices - 1))
    placed = data["group", "placed", "device"].edge_index
    # group 2 on device 0; group 5 on every device plus its server
    assert placed.shape == (2, 1 + devices + 1)
    assert placed[0].tolist().count(2) == 1 and placed[0].tolist().count(5) == devices + 1
    flags = data["group"].x[:, -2:]
    assert flags[:, 0].nonzero().flatten().tolist() == [2, 5]
    assert flags[:, 1].nonzero().flatten().tolist() == [3]
    logits, value = new_net(0)(data, 3, options)
    assert logits.shape == (len(options),) and value.shape == ()


@pytest.mark.parametrize("model", ["vgg19-b32-r3", "inception-v3-b32-r3"])
def test_a_tag_plan_is_valid_and_no_slower_than_the_best_dp_baseline(model):
    graph = load(PROFILES / f"{model}.json", expect="op-graph")
    topology = load(TESTBED, expect="topology")
    plan = run("tag", graph, topology, playouts=32, max_evaluations=40, seed=2, others="")
    validate_plan(plan, graph, topology, check_fingerprints=True)
    assert plan.planner == "tag" and plan.seed == 2
    baseline = best_baseline(graph, topology, "sgd")
    assert plan.prediction.iteration_ms <= baseline.prediction.iteration_ms * (1 + 1e-9)
    again = run("tag", graph, topology, playouts=32, max_evaluations=40, seed=2, others="")
    assert again.groups == plan.groups and again.prediction == plan.prediction


def test_uniform_priors_plan_without_a_policy_and_no_sfb_leaves_groups_uncompressed():
    graph = load(PROFILES / "vgg19-b32-r3.json", expect="op-graph")
    plan = run("tag", graph, generate(3), playouts=16, max_evaluations=20, priors="uniform",
               sfb=False, policy="no-such-file.json")
    assert all(g.compression.value == "none" for g in plan.groups)
    assert plan.options["priors"] == "uniform" and not plan.options["sfb"]


def test_the_shipped_policy_loads_and_says_how_it_was_made():
    from dl_nfv.planners.learned.policy import read_policy

    policy = read_policy(DEFAULT_POLICY)
    assert policy.planner == "tag" and policy.command.startswith("dl-nfv plan learn tag")
    assert any(t.startswith("random-") for t in policy.trained_on.topologies)
    net = load_net(policy)
    assert sum(p.numel() for p in net.parameters()) == sum(w.count for w in policy.weights)


def test_learn_trains_a_policy_the_planner_loads(tmp_path):
    graph, topology = _graph(n=6, param_bytes=4 * MIB), v100_t4_topology()
    before = {k: v.clone() for k, v in new_net(0).state_dict().items()}
    policy = learn([("toy", graph)], [("v100-t4", topology)], iterations=2, playouts=12, groups=3,
                   batch=4, updates=2)
    assert policy.trained_on.graphs == ("toy",) and policy.trained_on.episodes == 2
    save(policy, tmp_path / "p.json")
    net = load_net(load(tmp_path / "p.json", expect="policy"))
    after = net.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)  # it trained
    plan = run("tag", graph, topology, policy=str(tmp_path / "p.json"), playouts=12,
               max_evaluations=10, groups=3, sfb=False)
    assert plan.planner == "tag"


@pytest.mark.parametrize(("args", "words"), [
    (["--playouts", "0"], "playouts must be at least 1, got 0"),
    (["--priors", "learned"], "priors must be one of gnn, uniform"),
    (["--microbatches", "0"], "microbatches must be at least 1, got 0"),
    (["--others", "pipeline,nope"], "others names 'nope', which is not another planner"),
    (["--others", "tag"], "others names 'tag', which is not another planner"),
])
def test_bad_plan_options_exit_2_naming_them(tmp_path, args, words):
    result = CliRunner().invoke(cli, ["plan", "tag", "--graph", str(PROFILES / "vgg19-b32-r3.json"),
                                      "--topology", str(TESTBED), *args])
    assert result.exit_code == 2 and words in result.output


@pytest.mark.parametrize("spec", ["random:", "random:0", "random:x", "random:2:y", "randomly"])
def test_an_unparsable_random_spec_exits_2_naming_it(tmp_path, spec):
    result = CliRunner().invoke(cli, ["plan", "learn", "tag", "--graphs",
                                      str(PROFILES / "vgg19-b32-r3.json"), "--topologies", spec,
                                      "-o", str(tmp_path / "p.json")])
    assert result.exit_code == 2 and repr(spec) in result.output
    assert not (tmp_path / "p.json").exists()


def test_plan_learn_tag_writes_a_policy_that_records_its_training(tmp_path):
    graph = replace(_graph(n=6, param_bytes=4 * MIB))
    save(graph, tmp_path / "toy.json")
    result = CliRunner().invoke(cli, ["plan", "learn", "tag", "--graphs", str(tmp_path / "toy.json"),
                                      "--topologies", "random:1:7", "--iterations", "1",
                                      "--playouts", "8", "-o", str(tmp_path / "p.json")])
    assert result.exit_code == 0, result.output
    policy = load(tmp_path / "p.json", expect="policy")
    assert policy.trained_on.topologies == ("random-7",) and "random:1:7" in policy.command


def test_plan_learn_tag_init_fine_tunes_a_policy_and_refuses_another_planners(tmp_path):
    from dl_nfv.planners.heterog import DEFAULT_POLICY as HETEROG_POLICY
    from dl_nfv.planners.learned.policy import read_policy

    save(_graph(n=6, param_bytes=4 * MIB), tmp_path / "toy.json")
    args = ["plan", "learn", "tag", "--graphs", str(tmp_path / "toy.json"), "--topologies",
            "random:1:7", "--iterations", "1", "--playouts", "8"]
    result = CliRunner().invoke(cli, [*args, "--init", str(DEFAULT_POLICY), "-o",
                                      str(tmp_path / "p.json")])
    assert result.exit_code == 0, result.output
    tuned = load(tmp_path / "p.json", expect="policy")
    assert "--init" in tuned.command
    shipped = load_net(read_policy(DEFAULT_POLICY)).state_dict()
    fresh = new_net(0).state_dict()
    after = load_net(tuned).state_dict()
    # one iteration of 4 small Adam steps moves the shipped weights only a little
    gap = lambda a: sum(float((after[k] - a[k]).abs().sum()) for k in after)  # noqa: E731
    assert 0 < gap(shipped) < gap(fresh)
    bad = CliRunner().invoke(cli, [*args, "--init", str(HETEROG_POLICY), "-o",
                                   str(tmp_path / "q.json")])
    assert bad.exit_code == 2 and "heterog" in bad.output and not (tmp_path / "q.json").exists()
