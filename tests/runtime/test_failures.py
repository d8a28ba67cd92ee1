"""A worker that dies or fails stops the whole run quickly, naming its rank; nothing is left."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dl_nfv.artifacts import RuntimeFailure
from dl_nfv.runtime.launcher import train
from dl_nfv.runtime.worker import WorkerOptions
from tests.processes import live_children

from .helpers import ROOT, devices, dp_plan, graph_of, topology, write


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


def _gone(pid: int) -> bool:
    """True when no process ``pid`` exists any more (a zombie still counts as left behind)."""
    return not Path(f"/proc/{pid}").exists()


@pytest.fixture
def plan_path(tmp_path):
    graph, topo = graph_of("mlp-tiny", batch_size=8), topology(2)
    return write(tmp_path, graph, topo, dp_plan(graph, topo, devices(2)))


def test_killed_worker_stops_train_within_60s_naming_the_rank(plan_path):
    proc = subprocess.Popen([sys.executable, "-m", "dl_nfv", "train", str(plan_path),
                             "--steps", "1000000", "--timeout-s", "30"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        deadline = time.monotonic() + 120
        workers: dict[int, int] = {}
        while time.monotonic() < deadline:
            for pid in live_children(proc.pid):
                try:
                    env = _environ(pid)
                except OSError:
                    continue
                if "RANK" in env and "DL_NFV_RUN_DIR" in env:
                    workers[int(env["RANK"])] = pid
                    run_dir = Path(env["DL_NFV_RUN_DIR"])
            if len(workers) == 2 and (run_dir / "rank1.running").exists():
                break  # both train: rank 1 has finished a step
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.2)
        else:
            pytest.fail("the workers did not start training within 120 s")
        os.kill(workers[1], signal.SIGKILL)
        killed_at = time.monotonic()
        _, err = proc.communicate(timeout=60)
        took = time.monotonic() - killed_at
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 1, err
    assert took < 60
    assert "rank 1 (device local/cpu1) was killed by SIGKILL" in err, err
    assert err.count("\n") == 1  # one line, no traceback
    for pid in workers.values():
        assert _gone(pid), f"worker {pid} left behind"


def test_failing_worker_names_rank_and_error(plan_path):
    options = WorkerOptions(plan=str(plan_path), steps=50, threads=1, timeout_s=30,
                            data="tests.runtime.models:batches_failing_on_rank1")
    started: list[int] = []
    t0 = time.monotonic()
    with pytest.raises(RuntimeFailure, match=r"rank 1 \(device local/cpu1\): ValueError: corrupt batch 2"):
        train(options, on_start=started.extend, start_method="forkserver")
    assert time.monotonic() - t0 < 60 + 30
    assert len(started) == 2
    for pid in started:
        assert _gone(pid)
