"""The run-report artifact: round trip, invariants, rendering."""

from __future__ import annotations

import io
import json
from dataclasses import replace

import pytest
from click.testing import CliRunner
from rich.console import Console

from dl_nfv.artifacts import InvalidArtifact, from_data, load, save, to_data
from dl_nfv.artifacts.runreport import ExecutionMode, RankRun, RunReport, median_iteration_ms
from dl_nfv.cli.main import cli
from dl_nfv.cli.render_run import render


def _report() -> RunReport:
    per_rank = (
        RankRun(rank=0, device="local/cpu0", iteration_ms=(9.0, 4.0, 5.0, 6.0), compute_ms=4.0,
                wait_ms=1.0, peak_memory_bytes=1 << 20),
        RankRun(rank=1, device="local/cpu1", iteration_ms=(9.5, 4.5, 7.0, 5.5), compute_ms=3.5,
                wait_ms=2.0, peak_memory_bytes=2 << 20),
    )
    fields = dict(plan_sha256="a" * 64, planner="dp", mode=ExecutionMode.DATA_PARALLEL, batch_size=8,
                  world_size=2, ranks={"local/cpu0": 0, "local/cpu1": 1}, backend="gloo",
                  steps=4, warmup=1, iteration_ms=median_iteration_ms(per_rank, 1),
                  losses=(1.0, 0.9, 0.8, 0.7), per_rank=per_rank,
                  op_fwd_ms={"cpu": {"fc1": 0.25}})
    return RunReport(**fields)


def test_median_is_of_the_slowest_rank_per_step():
    # measured steps: max(4, 4.5)=4.5, max(5, 7)=7, max(6, 5.5)=6 -> median 6
    assert _report().iteration_ms == 6.0
    assert _report().step_ms == (4.5, 7.0, 6.0)


def test_round_trip(tmp_path):
    report = _report()
    path = save(report, tmp_path / "run.json")
    assert load(path, expect="run-report") == report
    assert json.loads(path.read_text())["kind"] == "run-report"


@pytest.mark.parametrize("over, words", [
    ({"world_size": 3}, "world_size is 3"),
    ({"warmup": 4}, "warmup must be in [0, steps=4)"),
    ({"ranks": {"local/cpu0": 0, "local/cpu1": 0}}, "ranks must be 0..1"),
    ({"losses": (1.0,)}, "1 losses for 4 steps"),
    ({"plan_sha256": "xyz"}, "plan_sha256 must be 64 hex digits"),
])
def test_invariants_name_the_numbers(over, words):
    base = to_data(_report())
    base.update(to_data_values(over))
    with pytest.raises(InvalidArtifact, match=words.replace("[", r"\[").replace(")", r"\)")):
        from_data(RunReport, base)


def to_data_values(over):
    return {k: list(v) if isinstance(v, tuple) else v for k, v in over.items()}


def test_render_and_show(tmp_path):
    console = Console(file=io.StringIO(), width=100)
    console.print(render(_report()))
    text = console.file.getvalue()
    assert "6.000 ms" in text and "local/cpu1" in text and "2.0 MiB" in text
    path = save(_report(), tmp_path / "run.json")
    result = CliRunner().invoke(cli, ["show", str(path), "--width", "100"])
    assert result.exit_code == 0, result.output
    assert "data-parallel" in result.output


def test_each_rank_shows_its_threads_and_cpus():
    report = _report()
    first, second = report.per_rank
    per_rank = (replace(first, threads=2, cpus=(0, 1)), replace(second, threads=1))
    console = Console(file=io.StringIO(), width=140)
    console.print(render(replace(report, per_rank=per_rank, threads=2)))
    rows = {line.split("│")[2].strip(): line.split("│")[4].strip()
            for line in console.file.getvalue().splitlines() if "local/cpu" in line}
    assert rows == {"local/cpu0": "2 @0-1", "local/cpu1": "1"}


def test_show_gives_each_ranks_median_step_by_category():
    report = _report()
    breakdown = {"compute": (7.0, 3.0, 4.0, 5.0), "communication": (1.0, 0.5, 0.25, 0.75),
                 "update": (0.5, 0.25, 0.5, 0.5), "idle": (0.5, 0.25, 0.25, 0.25)}
    per_rank = tuple(replace(r, breakdown_ms=breakdown) for r in report.per_rank)
    console = Console(file=io.StringIO(), width=140)
    console.print(render(replace(report, per_rank=per_rank)))
    text = console.file.getvalue().split("where each rank's step goes")[1]
    rows = [[c.strip() for c in line.split("│")[1:-1]] for line in text.splitlines()
            if "local/cpu" in line]
    # medians of the 3 steps after the warm-up one
    assert rows == [[str(r), f"local/cpu{r}", "4.000", "0.500", "0.500", "0.250"] for r in (0, 1)]


def test_show_gives_each_ranks_gradient_bytes_by_method():
    report = _report()
    first, second = report.per_rank
    per_rank = (replace(first, sent_bytes={"allreduce": 3 << 20, "sfb": 1 << 20}),
                replace(second, sent_bytes={"allreduce": 4 << 20}))
    console = Console(file=io.StringIO(), width=200)
    console.print(render(replace(report, per_rank=per_rank)))
    rows = {line.split("│")[2].strip(): line.split("│")[10].strip()
            for line in console.file.getvalue().splitlines() if "local/cpu" in line}
    assert rows == {"local/cpu0": "4.0 MiB (allreduce 3.0 MiB, sfb 1.0 MiB)",
                    "local/cpu1": "4.0 MiB (allreduce)"}
    # reports of runs that counted nothing keep the table as it was
    plain = Console(file=io.StringIO(), width=200)
    plain.print(render(report))
    assert "gradient bytes sent" not in plain.file.getvalue()
