"""Each worker runs its device: the topology's cores are its threads, pinned to CPUs of its own."""

from __future__ import annotations

import os
import time

import pytest

from dl_nfv.artifacts import from_data, load
from dl_nfv.artifacts.topology import Topology
from dl_nfv.runtime.inputs import cpu_set, device_threads

from .helpers import ROOT, devices, dl_nfv, dp_plan, graph_of, write

LOCAL_CPU = ROOT / "examples" / "topologies" / "local-cpu.yaml"


def _topology(*cores: int | None) -> Topology:
    entries = [{"type": "cpu", "count": 1, "memory_gib": 4, **({"cores": c} if c else {})}
               for c in cores]
    return from_data(Topology, {
        "kind": "topology", "schema_version": 1, "name": "cores",
        "hosts": [{"name": "local", "devices": entries,
                   "interconnect": {"kind": "loopback", "bandwidth_gbps": 8, "latency_us": 40}}]})


def test_a_device_has_the_cores_its_topology_states_whatever_the_workers():
    topo = _topology(3, None, 2)
    devs = devices(3)
    assert device_threads(topo, devs, None, local_world=3) == [3, 1, 2]
    assert device_threads(topo, devs[:1], None, local_world=1) == [3]
    assert device_threads(topo, devs, 4, local_world=3) == [4, 4, 4]  # --threads wins


def test_cpu_sets_are_side_by_side_blocks_or_none_when_they_do_not_fit():
    available = [0, 1, 2, 3, 6, 7]
    assert [cpu_set([2, 1, 3], r, available) for r in range(3)] == [(0, 1), (2,), (3, 6, 7)]
    assert cpu_set([4, 3], 0, available) == ()  # 7 threads on 6 CPUs: not pinned


def test_a_one_device_plan_on_local_cpu_runs_one_thread(tmp_path):
    """local-cpu has two one-core devices: a plan using one of them runs one thread on one
    CPU, not the host's cores shared by one worker."""
    graph, topo = graph_of("mlp-tiny", batch_size=8), load(LOCAL_CPU, expect="topology")
    write(tmp_path, graph, topo, dp_plan(graph, topo, devices(1)))
    result = dl_nfv("train", str(tmp_path / "plan.json"), "--steps", "2", "-o",
                    str(tmp_path / "run.json"))
    assert result.returncode == 0, result.stderr
    (rank,) = load(tmp_path / "run.json", expect="run-report").per_rank
    assert rank.threads == 1
    assert len(rank.cpus) == 1 and rank.cpus[0] in os.sched_getaffinity(0)
    # one device: its steps are computation and the update, and no communication
    assert rank.breakdown_ms["communication"] == (0.0, 0.0)
    assert all(c > 0 and u > 0 for c, u in zip(rank.breakdown_ms["compute"],
                                                rank.breakdown_ms["update"]))


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="no CPU affinity here")
def test_workers_of_unequal_devices_run_their_own_cores(tmp_path):
    graph, topo = graph_of("mlp-tiny", batch_size=8), _topology(2, 1)
    write(tmp_path, graph, topo, dp_plan(graph, topo, devices(2)))
    result = dl_nfv("train", str(tmp_path / "plan.json"), "--steps", "2", "-o",
                    str(tmp_path / "run.json"))
    assert result.returncode == 0, result.stderr
    report = load(tmp_path / "run.json", expect="run-report")
    assert [r.threads for r in report.per_rank] == [2, 1] and report.threads == 2
    available = sorted(os.sched_getaffinity(0))
    if len(available) >= 3:
        assert [r.cpus for r in report.per_rank] == [tuple(available[:2]), (available[2],)]
    else:  # three threads on fewer CPUs: shared, and said so
        assert all(r.cpus == () for r in report.per_rank)
        assert any("not pinned" in n for n in report.notes), report.notes


def test_a_device_type_may_state_its_cores_and_a_bad_count_is_refused():
    from dl_nfv.artifacts import InvalidArtifact

    data = {"kind": "topology", "schema_version": 1, "name": "typed",
            "device_types": [{"name": "xeon-4c", "kind": "cpu", "memory_gib": 8,
                              "fp32_tflops": 0.4, "fp16_tflops": 0.4,
                              "memory_bandwidth_gb_per_s": 40, "cores": 4}],
            "hosts": [{"name": "h", "devices": [{"type": "xeon-4c", "count": 2},
                                                {"type": "xeon-4c", "prefix": "small",
                                                 "cores": 2}],
                       "interconnect": {"kind": "loopback", "bandwidth_gbps": 8}}]}
    topo = from_data(Topology, data)
    names = ("h/cpu0", "h/cpu1", "h/small0")
    assert device_threads(topo, names, None, local_world=3) == [4, 4, 2]
    data["hosts"][0]["devices"][1]["cores"] = 0
    with pytest.raises(InvalidArtifact, match="cores must be > 0, got 0"):
        from_data(Topology, data)


def test_a_worker_at_a_thread_count_the_profile_did_not_time_is_noted():
    from types import SimpleNamespace

    from dl_nfv.artifacts import ProfileInfo
    from dl_nfv.runtime.session import _thread_notes

    graph = SimpleNamespace(profile=ProfileInfo(device_type="cpu", threads=2, thread_counts=(1, 2)))
    results = [{"device": "h/cpu0", "threads": 1, "cpus": (0,)},
               {"device": "h/cpu1", "threads": 3, "cpus": (1, 2, 3)}]
    assert _thread_notes(graph, results) == [
        "the graph's ops were timed at 1, 2 thread(s), h/cpu1 ran with 3: the simulator's op "
        "times for them are scaled from those (docs/cost-model.md, Threads)"]


@pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="no SCHED_BATCH on this OS")
def test_gloo_s_event_loop_does_not_preempt_the_worker_s_thread(tmp_path):
    # a world of one in this process: its gloo event loop becomes SCHED_BATCH, and only it
    import torch.distributed as dist

    from dl_nfv.runtime.comm import TRANSPORT_THREAD, defer_transport_threads

    def policies() -> dict[int, tuple[str, int]]:
        out = {}
        for tid in os.listdir("/proc/self/task"):
            try:  # (a thread that ends meanwhile is left out)
                with open(f"/proc/self/task/{tid}/comm") as fh:
                    out[int(tid)] = (fh.read().strip(), os.sched_getscheduler(int(tid)))
            except OSError:
                continue
        return out

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)
    try:
        loops: set[int] = set()
        deadline = time.monotonic() + 5  # the thread names itself once it runs
        while not loops and time.monotonic() < deadline:
            loops = {t for t, (name, _) in policies().items()
                     if name.startswith(TRANSPORT_THREAD)}
            time.sleep(0.01)
        assert loops, "gloo started no event-loop thread"
        assert set(defer_transport_threads()) == loops
        after = policies()
        assert all(after[t][1] == os.SCHED_BATCH for t in loops)
        assert all(p == os.SCHED_OTHER for t, (_, p) in after.items() if t not in loops)
    finally:
        dist.destroy_process_group()
