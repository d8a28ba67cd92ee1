"""The Chrome trace's schema, and the sim-report's figures against the result they summarise."""

from __future__ import annotations

import json
from collections import defaultdict

import pytest

from dl_nfv.artifacts import Group, Pipeline, SyncMethod, dumps, from_document, load, save
from dl_nfv.simulator import simulate
from dl_nfv.simulator.synthetic import one_f_one_b

from .helpers import chain, one_group, plan, star


@pytest.fixture(scope="module")
def pipeline_result():
    g = chain(4, 1.0, 2.0, param_bytes=2**20, edge_bytes=2**20, batch_size=8)
    t = star(4, per_host=2, nic_gbps=25.0)
    d = t.device_names
    groups = [Group(id="s0", ops=("op0", "op1"), devices=(d[0], d[2])),
              Group(id="s1", ops=("op2", "op3"), devices=(d[4], d[6]), sync=SyncMethod.PS,
                    ps_servers=(d[7],))]
    sched = {d[0]: one_f_one_b(2, 4, 0), d[2]: one_f_one_b(2, 4, 0),
             d[4]: one_f_one_b(2, 4, 1), d[6]: one_f_one_b(2, 4, 1)}
    p = plan(g, t, groups, pipeline=Pipeline(microbatches=4, stages=("s0", "s1"), schedule=sched))
    return simulate(p, g, t)


def test_trace_is_valid_chrome_json(pipeline_result):
    trace = json.loads(json.dumps(pipeline_result.trace()))
    events = trace["traceEvents"]
    complete = [e for e in events if e["ph"] == "X"]
    assert complete
    for e in complete:
        assert {"name", "cat", "ph", "ts", "dur", "pid", "tid"} <= set(e)
        assert isinstance(e["ts"], (int, float)) and e["dur"] >= 0
    tracks = defaultdict(list)
    for e in complete:
        tracks[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"]))
    for spans in tracks.values():
        assert spans == sorted(spans), "timestamps must be monotone on every track"
        for (_, end), (start, _) in zip(spans, spans[1:]):
            assert start >= end - 1e-3
    named = {(e["pid"], e["tid"]) for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert set(tracks) <= named, "every track has a name"
    processes = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert set(pipeline_result.tasks.device_names) <= processes and "links" in processes
    cats = {e["cat"] for e in complete}
    assert {"forward", "backward", "transfer", "allreduce", "ps-push", "update"} <= cats
    counters = [e for e in events if e["ph"] == "C"]
    assert counters and all(e["name"] == "memory" for e in counters)
    end_us = max(e["ts"] + e["dur"] for e in complete)
    assert end_us == pytest.approx(pipeline_result.iteration_ms * 1e3, abs=1e-2)


def test_report_round_trips_and_matches_the_result(pipeline_result, tmp_path):
    report = pipeline_result.to_report()
    path = save(report, tmp_path / "r.json")
    again = load(path, expect="sim-report")
    assert again == report
    assert from_document(json.loads(dumps(report))) == report
    assert report.iteration_ms == pytest.approx(pipeline_result.iteration_ms, abs=1e-6)
    assert report.microbatches == 4 and report.feasible
    assert report.tasks == len(pipeline_result.tasks)
    busy = {d.device: d.busy_ms for d in report.devices}
    assert busy == pytest.approx(pipeline_result.busy_ms, abs=1e-5)
    assert report.transfers == 2 * 4 * 2  # 2 aligned replica pairs, 4 microbatches, F and B
    # the critical path is contiguous and ends the iteration
    path_steps = report.critical_path
    assert path_steps[-1].end_ms == pytest.approx(report.iteration_ms, abs=1e-5)
    for a, b in zip(path_steps, path_steps[1:]):
        assert b.start_ms >= a.end_ms - 1e-5
    assert report.critical_path_ms <= report.iteration_ms + 1e-6
    # links: busy time never exceeds the iteration; NIC traffic adds up over both directions
    assert all(0 <= lk.busy_fraction <= 1 for lk in report.links)
    assert sum(lk.transfer_bytes for lk in report.links) > 0
    assert 0.0 <= report.comm_hidden_fraction <= 1.0


def test_single_device_report_has_no_communication():
    g = chain(3)
    t = star(1)
    result = simulate(plan(g, t, [one_group(g, t.device_names)]), g, t)
    report = result.to_report()
    assert report.comm_ms == 0 and report.transfers == 0 and report.collectives == 0
    assert report.comm_hidden_fraction == 0
    assert [c.kind for c in report.critical_path] == ["forward", "backward", "update"]
    assert report.critical_path[0].tasks == 3


def test_breakdown_of_one_device_is_its_ops_and_its_update():
    """Three ops of 1 ms forward and 2 ms backward on one device: 9 ms of compute, then the
    update, back to back: no communication, no idle time."""
    g = chain(3, 1.0, 2.0)
    t = star(1)
    result = simulate(plan(g, t, [one_group(g, t.device_names)]), g, t)
    (parts,) = result.breakdown_ms().values()
    assert parts["compute"] == pytest.approx(9.0, abs=1e-6)
    assert parts["update"] == pytest.approx(result.iteration_ms - 9.0, abs=1e-6)
    assert parts["update"] > 0
    assert parts["communication"] == 0 and parts["idle"] == pytest.approx(0.0, abs=1e-6)


@pytest.mark.parametrize("device_type", ["cpu", "V100-16GB"])
def test_breakdown_sums_to_the_iteration_and_counts_communication_once(device_type):
    """Data parallelism on two devices: the AllReduce is communication on both. A CPU's own
    cores do it, so all of it is; a GPU's overlaps its backward, and only the rest is."""
    from dl_nfv.simulator.tasks import TaskKind

    from .helpers import mesh

    g = chain(4, 1.0, 2.0, param_bytes=8 << 20)
    t = mesh(2, device_type=device_type, bandwidth_gbps=10.0)
    p = plan(g, t, [one_group(g, t.device_names, sync=SyncMethod.ALLREDUCE)])
    result = simulate(p, g, t)
    tg, s = result.tasks, result.schedule
    allreduce = sum(s.end_ms[i] - s.start_ms[i] for i, k in enumerate(tg.kind)
                    if k == TaskKind.ALLREDUCE)
    assert allreduce > 0
    usage = {d.device: d for d in result.to_report().devices}
    for device, parts in result.breakdown_ms().items():
        assert sum(parts.values()) == pytest.approx(result.iteration_ms)
        assert parts["compute"] + parts["update"] == pytest.approx(result.busy_ms[device])
        exposed = usage[device].comm_ms - usage[device].hidden_comm_ms
        assert parts["communication"] == pytest.approx(exposed, abs=1e-6)
        if device_type == "cpu":
            assert parts["communication"] == pytest.approx(allreduce)
