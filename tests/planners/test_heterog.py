"""`plan heterog` and `plan learn heterog`: plans are valid and never slower than the best DP
baseline, a policy trained by the recipe learns a toy's enumerated best strategy, bad
policies are refused with exit 2 naming what is wrong."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from dl_nfv.artifacts import load, save
from dl_nfv.cli.main import cli
from dl_nfv.planners import run
from dl_nfv.planners.heterog import DEFAULT_POLICY, best_baseline, learn, load_policy, problem_of
from dl_nfv.planners.learned.decoder import candidates, greedy
from dl_nfv.planners.learned.features import FEATURE_SCHEMA_VERSION
from dl_nfv.planners.learned.policy import read_policy
from dl_nfv.planners.validate import validate_plan
from tests.planners.test_dp_baselines import v100_t4_topology
from tests.planners.test_learned import _graph

ROOT = Path(__file__).resolve().parents[2]
PROFILES = ROOT / "bench" / "profiles"
TESTBED = ROOT / "examples" / "topologies" / "heterog-testbed8.yaml"
MIB = 2**20


@pytest.mark.parametrize("param_bytes", [64 * MIB, 1024])
def test_the_training_recipe_learns_the_toys_enumerated_best(param_bytes):
    """Two op groups on a V100 + T4: every one of the 36 strategy pairs is simulated, and the
    policy `learn` trains (150 episodes, seeded) decodes the best of them where keeping the
    model on the V100 is best (64 MiB per op), and one within 0.1% of it where replicating
    is (1 KiB per op: AllReduce and a server on either device within 0.1% of each other)."""
    graph, topology = _graph(n=4, param_bytes=param_bytes), v100_t4_topology()
    policy = learn([("toy", graph)], [("v100-t4", topology)], episodes=150, seed=0, groups=2,
                   search_s=5.0, max_evaluations=200)
    problem = problem_of(graph, topology, groups=2)
    env = problem.env
    options = candidates(env.cm.cluster)
    best = max(env.evaluate([a.strategy, b.strategy]).reward for a in options for b in options)
    decoded = greedy(load_policy(policy), env, problem.graph)
    learned = env.evaluate(decoded).reward
    assert learned >= best * (1 + 1e-3)  # rewards are negative: within 0.1% of the best
    if param_bytes > MIB:
        assert learned == best and all(len(s.devices) == 1 for s in decoded)
    else:
        assert all(len(s.devices) == 2 for s in decoded)
    assert policy.trained_on.graphs == ("toy",) and policy.trained_on.max_devices == 2
    assert policy.trained_on.episodes == 150 and policy.feature_schema_version == FEATURE_SCHEMA_VERSION


@pytest.mark.parametrize("model", ["vgg19-b32-r3", "inception-v3-b32-r3"])
@pytest.mark.parametrize("start", ["policy", "greedy", "random"])
def test_every_heterog_plan_is_valid_and_no_slower_than_the_best_dp_baseline(model, start):
    graph = load(PROFILES / f"{model}.json", expect="op-graph")
    topology = load(TESTBED, expect="topology")
    plan = run("heterog", graph, topology, start=start, max_evaluations=60, seed=3)
    validate_plan(plan, graph, topology, check_fingerprints=True)
    assert plan.planner == "heterog" and plan.seed == 3
    baseline = best_baseline(graph, topology, "sgd")
    assert plan.prediction.iteration_ms <= baseline.prediction.iteration_ms * (1 + 1e-9)


def test_the_shipped_policy_is_small_and_says_how_it_was_made():
    policy = read_policy(DEFAULT_POLICY)
    assert DEFAULT_POLICY.stat().st_size < 4 * MIB
    assert policy.planner == "heterog" and policy.feature_schema_version == FEATURE_SCHEMA_VERSION
    assert policy.command.startswith("dl-nfv plan learn heterog ")
    assert f"--seed {policy.seed}" in policy.command
    assert f"--episodes {policy.trained_on.episodes}" in policy.command
    # weights load into the network (names and shapes match)
    assert sum(p.numel() for p in load_policy(policy).parameters()) == policy.parameter_count


# ------------------------------------------------------------------------------ command line
def _plan_args(tmp_path, policy: Path) -> list[str]:
    return ["plan", "heterog", "--graph", str(PROFILES / "inception-v3-b32-r3.json"),
            "--topology", str(TESTBED), "--policy", str(policy), "--max-evaluations", "30",
            "-o", str(tmp_path / "plan.json")]


def _edited_policy(tmp_path, **changes) -> Path:
    data = json.loads(DEFAULT_POLICY.read_text())
    for key, value in changes.items():
        if key == "max_devices":
            data.setdefault("trained_on", {})["max_devices"] = value
        else:
            data[key] = value
    path = tmp_path / "edited.policy.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize(("changes", "words"), [
    ({"feature_schema_version": FEATURE_SCHEMA_VERSION + 1}, "feature schema"),
    ({"planner": "tag"}, "the policy is for planner 'tag', not 'heterog'"),
])
def test_a_policy_of_another_schema_or_planner_is_refused(tmp_path, changes, words):
    result = CliRunner().invoke(cli, _plan_args(tmp_path, _edited_policy(tmp_path, **changes)))
    assert result.exit_code == 2, result.output
    assert words in result.output and "Traceback" not in result.output
    assert not (tmp_path / "plan.json").exists()


def test_a_file_that_is_not_a_policy_is_refused(tmp_path):
    result = CliRunner().invoke(cli, _plan_args(tmp_path, TESTBED))
    assert result.exit_code == 2, result.output
    assert "not a policy" in result.output and str(TESTBED) in result.output


def test_a_cluster_larger_than_the_policy_saw_is_planned_with_a_note(tmp_path):
    result = CliRunner().invoke(cli, _plan_args(tmp_path, _edited_policy(tmp_path, max_devices=2)))
    assert result.exit_code == 0, result.output
    plan = load(tmp_path / "plan.json", expect="plan")
    assert any("at most 2 devices, this one has 8" in n for n in plan.notes), plan.notes


def test_plan_learn_heterog_writes_a_policy_that_records_its_training(tmp_path):
    graph_path = tmp_path / "toy.json"
    topology_path = tmp_path / "v100-t4.json"
    save(_graph(n=4), graph_path)
    save(v100_t4_topology(), topology_path)
    out = tmp_path / "my.policy.json"
    args = ["plan", "learn", "heterog", "--graphs", str(graph_path), "--topologies",
            str(topology_path), "--episodes", "4", "--search-s", "1", "--seed", "5", "-o", str(out)]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    policy = read_policy(out)
    assert policy.seed == 5 and policy.trained_on.graphs == ("toy",)
    assert policy.trained_on.topologies == ("v100-t4",) and policy.trained_on.episodes == 4
    assert policy.command == "dl-nfv " + " ".join(args)
    torch.manual_seed(0)
    shown = CliRunner().invoke(cli, ["show", str(out)], terminal_width=200)
    assert shown.exit_code == 0 and "largest cluster" in shown.output and "2 devices" in shown.output
