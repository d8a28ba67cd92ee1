"""Every command has help with an example, and docs/cli.md is the current reference."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml
from click.testing import CliRunner

from dl_nfv.cli.main import cli
from dl_nfv.cli.reference import iter_commands, render
from tests.conftest import ROOT

COMMANDS = list(iter_commands())


def test_top_level_lists_every_subcommand():
    result = CliRunner().invoke(cli, ["--help"])
    assert result.exit_code == 0
    for name in ("profile", "plan", "simulate", "train", "nfv", "show"):
        assert f"  {name} " in result.output


@pytest.mark.parametrize("name,command", COMMANDS, ids=[n for n, _ in COMMANDS])
def test_every_command_has_help_with_an_example(name, command):
    args = name.split()[1:] + ["--help"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert (command.help or "").strip(), f"{name} has no help text"
    assert "Example" in result.output, f"{name} --help has no example"


def test_cli_reference_is_current():
    doc = (ROOT / "docs" / "cli.md").read_text()
    assert doc == render(), "docs/cli.md is stale: python -m dl_nfv.cli.reference > docs/cli.md"


def test_python_dash_m_matches_the_command():
    out = subprocess.run([sys.executable, "-m", "dl_nfv", "--help"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and "simulate" in out.stdout


def test_unknown_command_is_a_usage_error():
    result = CliRunner().invoke(cli, ["frobnicate"])
    assert result.exit_code == 2 and "No such command" in result.output


@pytest.mark.parametrize("args, words, where", [
    (["--bogus"], "No such option '--bogus'", "dl-nfv"),
    (["plan", "nosuch"], "No such command 'nosuch'", "dl-nfv plan"),
    (["plan", "pipeline", "--graph", "g.json"], "Missing option '--topology'", "dl-nfv plan pipeline"),
    (["train", "plan.json", "--steps", "0"], "0 is not in the range x>=1", "dl-nfv train"),
])
def test_usage_errors_are_one_line_naming_the_command(args, words, where):
    result = CliRunner().invoke(cli, args, prog_name="dl-nfv")
    assert result.exit_code == 2
    assert result.output.splitlines() == [result.output.strip()], result.output
    assert result.output.startswith("error: ") and words in result.output
    assert f"(see '{where} --help')" in result.output


def test_show_json_prints_the_normalised_document(tmp_path):
    import json

    from tests.conftest import TOPOLOGIES

    result = CliRunner().invoke(cli, ["show", str(TOPOLOGIES[0]), "--json"])
    assert result.exit_code == 0
    doc = json.loads(result.output)
    assert doc["kind"] == "topology" and doc["schema_version"] == 1


def test_show_renders_the_bandwidth_matrix():
    from tests.conftest import EXAMPLES

    result = CliRunner().invoke(cli, ["show", str(EXAMPLES / "topologies" / "heterog-testbed8.yaml"),
                                      "--width", "160"])
    assert result.exit_code == 0
    assert "bandwidth between devices" in result.output
    # 8 GPUs: 4 x V100 (15.7) ... total FP32 = 2*15.7 + 4*11.3 + 2*9.3 = 95.2
    assert "95.2" in result.output


def test_show_topology_gives_the_allreduce_figures_of_a_measured_link():
    from tests.conftest import EXAMPLES

    result = CliRunner().invoke(cli, ["show", str(EXAMPLES / "topologies" / "local-cpu.yaml"),
                                      "--width", "200"])
    assert result.exit_code == 0
    row = next(line for line in result.output.splitlines() if "loopback" in line and "cpu1" in line)
    # the loopback link's own figures, then the ones an AllReduce crosses it with
    ic = yaml.safe_load((EXAMPLES / "topologies" / "local-cpu.yaml").read_text())["hosts"][0][
        "interconnect"]
    assert [float(cell) for cell in row.split("│")[4:8]] == [
        ic["bandwidth_gbps"], ic["latency_us"], ic["collective_bandwidth_gbps"],
        ic["collective_latency_us"]]
    plain = CliRunner().invoke(cli, ["show", str(EXAMPLES / "topologies" / "heterog-testbed8.yaml"),
                                     "--width", "200"])
    assert "AllReduce" not in plain.output


def test_show_plan_lists_the_planner_notes_and_group_notes(tmp_path):
    from dl_nfv.artifacts import Group, save
    from tests.simulator.helpers import chain, mesh, plan

    g, t = chain(2), mesh(2)
    group = Group(id="all", ops=("op0", "op1"), devices=t.device_names, note="replicated 2-way")
    path = tmp_path / "plan.json"
    save(plan(g, t, [group], notes=("kept: data parallel", "2 candidate simulations")), path)
    result = CliRunner().invoke(cli, ["show", str(path), "--width", "160"])
    assert result.exit_code == 0, result.output
    assert "planner notes" in result.output and "kept: data parallel" in result.output
    assert "2 candidate simulations" in result.output and "replicated 2-way" in result.output


def _planner_help(name: str) -> str:
    result = CliRunner().invoke(cli, ["plan", name, "--help"], terminal_width=100)
    assert result.exit_code == 0, result.output
    return result.output


def _planner_names():
    from dl_nfv.planners import PLANNERS

    return list(PLANNERS)


@pytest.mark.parametrize("name", _planner_names())
def test_a_planner_says_what_it_does_once_in_whole_sentences(name):
    from dl_nfv.planners import PLANNERS

    text = _planner_help(name).split("Example:")[0]
    paragraphs = [" ".join(p.split()) for p in text.split("\n\n")[1:] if p.strip()]
    assert len(paragraphs) == (2 if PLANNERS[name].preset else 1), paragraphs
    assert all(p.endswith(".") for p in paragraphs), paragraphs


@pytest.mark.parametrize("name", _planner_names())
def test_planner_options_are_typed(name):
    import inspect

    from dl_nfv.planners import PLANNERS

    text = _planner_help(name).split("Options:")[1]
    params = inspect.signature(PLANNERS[name].load()).parameters
    if "optimizer" in params:
        assert "--optimizer [sgd|adam]" in text
    assert "[default: ]" not in text and "TEXT RANGE" not in text
    for fixed in PLANNERS[name].preset:
        assert f"--{fixed.replace('_', '-')} " not in text, f"{name} offers --{fixed}, which it fixes"


def test_presets_hide_what_they_fix_and_files_are_files():
    dp_ps = _planner_help("dp-ps")
    assert "The `dp` planner with --sync ps." in dp_ps
    options = dp_ps.split("Options:")[1]
    assert "--collective" not in options and "--sync" not in options
    assert "--refine-with RUN_REPORT" in _planner_help("fastt")
