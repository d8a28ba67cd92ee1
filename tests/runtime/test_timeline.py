"""The runtime's timeline of a real run: where each rank's step goes, span by span, and
``simulate --compare`` / ``--trace`` setting it beside the simulated one."""

from __future__ import annotations

import json
import statistics

import pytest

from dl_nfv.artifacts import SyncMethod, load
from dl_nfv.artifacts.runreport import CATEGORIES
from dl_nfv.simulator import simulate

from .helpers import (
    devices,
    dl_nfv,
    dp_plan,
    graph_of,
    pipeline_plan,
    schedule_1f1b,
    topology,
    write,
)

STEPS, WARMUP = 4, 1


@pytest.fixture(scope="module")
def pipeline_run(tmp_path_factory):
    """mlp-tiny in two 1F1B stages of 2 microbatches on two workers, trained for real."""
    tmp = tmp_path_factory.mktemp("timeline")
    graph, topo = graph_of("mlp-tiny", batch_size=8), topology(2)
    d = devices(2)
    plan = pipeline_plan(graph, topo, [[d[0]], [d[1]]], microbatches=2, kind="1f1b")
    write(tmp, graph, topo, plan)
    result = dl_nfv("train", str(tmp / "plan.json"), "--steps", str(STEPS), "--warmup",
                    str(WARMUP), "-o", str(tmp / "run.json"))
    assert result.returncode == 0, result.stderr
    return tmp, plan, graph, topo, load(tmp / "run.json", expect="run-report")


def test_every_step_splits_into_the_four_categories(pipeline_run):
    *_, run = pipeline_run
    for rank in run.per_rank:
        assert set(rank.breakdown_ms) == set(CATEGORIES)
        for step, total in enumerate(rank.iteration_ms):
            parts = [rank.breakdown_ms[c][step] for c in CATEGORIES]
            assert sum(parts) == pytest.approx(total, abs=1e-3), (rank.rank, step, parts)
            assert rank.breakdown_ms["compute"][step] > 0
            assert rank.breakdown_ms["communication"][step] > 0  # each stage receives
            assert rank.breakdown_ms["update"][step] > 0


def test_zeroing_the_gradients_is_update_time_at_the_step_start(pipeline_run):
    # the simulator's update task holds the zeroing, so the measured update must too
    *_, run = pipeline_run
    for rank in run.per_rank:
        spans = sorted((s for s in run.timeline if s.rank == rank.rank),
                       key=lambda s: s.start_ms)
        assert (spans[0].category, spans[0].name) == ("update", "zero gradients")
        assert [s.name for s in spans if s.category == "update"] == ["zero gradients", "update"]


def _exclusive(spans) -> dict[str, float]:
    """Each category's time from the spans alone: a span's length less the spans inside it."""
    out = dict.fromkeys(CATEGORIES[:3], 0.0)
    for s in spans:
        inner = sum(t.end_ms - t.start_ms for t in spans if t is not s
                    and s.start_ms <= t.start_ms and t.end_ms <= s.end_ms
                    and not any(u is not s and u is not t and s.start_ms <= u.start_ms
                                and u.end_ms <= s.end_ms and u.start_ms <= t.start_ms
                                and t.end_ms <= u.end_ms for u in spans))
        out[s.category] += s.end_ms - s.start_ms - inner
    return out


def test_the_timeline_nests_follows_the_schedule_and_adds_up(pipeline_run):
    _, plan, *_, run = pipeline_run
    assert run.warmup <= run.timeline_step < run.steps
    slowest = [max(r.iteration_ms[i] for r in run.per_rank) for i in range(run.warmup, run.steps)]
    assert max(r.iteration_ms[run.timeline_step] for r in run.per_rank) == (
        sorted(slowest)[(len(slowest) - 1) // 2])
    assert min(s.start_ms for s in run.timeline) >= 0.0
    for rank in run.per_rank:
        spans = [s for s in run.timeline if s.rank == rank.rank]
        extent = max(s.end_ms for s in spans) - min(s.start_ms for s in spans)
        assert extent <= rank.iteration_ms[run.timeline_step] + 1e-3  # within its step
        for a in spans:  # two spans are apart, or one holds the other
            for b in spans:
                apart = a.end_ms <= b.start_ms or b.end_ms <= a.start_ms
                inside = (a.start_ms <= b.start_ms and b.end_ms <= a.end_ms) or (
                    b.start_ms <= a.start_ms and a.end_ms <= b.end_ms)
                assert apart or inside, (a, b)
        actions = [s.name for s in sorted(spans, key=lambda s: s.start_ms)
                   if s.category == "compute"]
        stage = rank.rank
        expected = [f"{'forward' if a[1] == 'F' else 'backward'} stage{a[0]} mb{a[2]}"
                    for a in schedule_1f1b(stage, 2, 2).split()]
        assert actions == expected
        assert plan.pipeline.schedule[rank.device] == schedule_1f1b(stage, 2, 2)
        recomputed = _exclusive(spans)
        for category, ms in recomputed.items():
            assert ms == pytest.approx(rank.breakdown_ms[category][run.timeline_step], abs=2e-3)


def test_compare_and_trace_set_the_measured_timeline_beside_the_simulated(pipeline_run):
    tmp, plan, graph, topo, run = pipeline_run
    result = dl_nfv("simulate", str(tmp / "plan.json"), "--compare", str(tmp / "run.json"),
                    "--trace", str(tmp / "both.json"), "--json")
    assert result.returncode == 0, result.stderr
    comparison = json.loads(result.stdout)["comparison"]
    simulated = simulate(plan, graph, topo).breakdown_ms()
    for rank in run.per_rank:
        measured = comparison["measured_breakdown_ms_by_device"][rank.device]
        assert measured == {c: pytest.approx(statistics.median(rank.breakdown_ms[c][WARMUP:]),
                                             abs=1e-6) for c in CATEGORIES}
        predicted = comparison["predicted_breakdown_ms_by_device"][rank.device]
        assert predicted == {c: pytest.approx(v, abs=1e-6)
                             for c, v in simulated[rank.device].items()}
    events = json.loads((tmp / "both.json").read_text())["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events
             if e["ph"] == "M" and e["name"] == "process_name"}
    assert set(names) == {1, 2}
    assert names[1].startswith("simulated") and names[2].startswith(f"measured (step "
                                                                    f"{run.timeline_step}")
    threads = {e["tid"]: e["args"]["name"] for e in events
               if e["ph"] == "M" and e["name"] == "thread_name" and e["pid"] == 2}
    assert threads == {r + 1: f"{d} (rank {r})" for d, r in run.ranks.items()}
    measured = [e for e in events if e["ph"] == "X" and e["pid"] == 2]
    assert len(measured) == len(run.timeline)
    assert {e["name"] for e in measured if e["tid"] == 1} == {
        s.name for s in run.timeline if s.rank == 0}
    assert any(e["ph"] == "X" and e["pid"] == 1 for e in events)


def test_a_parameter_servers_pull_is_communication_after_the_update(tmp_path):
    # the simulator's ps-pull is a communication task after the server's update task, and
    # gloo makes the server's send of its shard in the caller's thread: the measured pull
    # (its send included) must be communication, never update time
    graph, topo = graph_of("mlp-tiny", batch_size=8), topology(2)
    d = devices(2)
    plan = dp_plan(graph, topo, d, sync=SyncMethod.PS, servers=(d[0],))
    write(tmp_path, graph, topo, plan)
    result = dl_nfv("train", str(tmp_path / "plan.json"), "--steps", str(STEPS), "--warmup",
                    str(WARMUP), "-o", str(tmp_path / "run.json"))
    assert result.returncode == 0, result.stderr
    run = load(tmp_path / "run.json", expect="run-report")
    for rank in run.per_rank:
        spans = sorted((s for s in run.timeline if s.rank == rank.rank), key=lambda s: s.start_ms)
        assert [s.name for s in spans if s.category == "update"] == ["zero gradients", "update"]
        update = next(s for s in spans if s.name == "update")
        pull = next(s for s in spans if s.name == "pull parameters")
        assert pull.category == "communication" and pull.start_ms >= update.end_ms
        assert spans[-1].end_ms <= pull.end_ms  # the step's last span: its wait nests in it
