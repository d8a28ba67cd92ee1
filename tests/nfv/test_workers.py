"""``nfv run``'s worker processes do not outlive the process that started them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dl_nfv.nfv.traffic.generate import TraceSpec, generate_trace
from tests.processes import live_children

from .helpers import EXAMPLES

DL_NFV = Path(sys.executable).with_name("dl-nfv")


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
def test_workers_exit_when_the_run_is_killed(tmp_path):
    trace = tmp_path / "t.pcap"
    generate_trace(TraceSpec(flows=400, mean_exchanges=6, seed=5), trace)
    # batch size 1: thousands of round trips to the workers, so the run is still going
    # when it is killed
    proc = subprocess.Popen([str(DL_NFV), "nfv", "run", "--config", str(EXAMPLES / "ids.yaml"),
                             "--trace", str(trace), "--engine", "cpu", "--workers", "2",
                             "--batch-size", "1", "-o", str(tmp_path / "r.json")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        workers: list[int] = []
        # two workers: this process is the first shard, one forked process the second
        while not workers and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
            workers = live_children(proc.pid)
        assert workers, "the run never started its second worker"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 5
        while any(_alive(w) for w in workers) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not [w for w in workers if _alive(w)]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for w in live_children(proc.pid):
            os.kill(w, signal.SIGKILL)
