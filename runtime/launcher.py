"""Local launcher: one worker process per plan device on this machine, watched to the end.

``train`` spawns ``python -m dl_nfv.runtime.worker`` once per device of the
plan, with the environment ``torchrun`` would give it (``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``,
``MASTER_PORT``), so the same entry point serves both. It then polls the
workers:

* all exit 0: the run report rank 0 wrote is loaded, per-rank traces are merged
  into one Chrome trace, the scratch folder is removed;
* one exits non-zero or is killed: every other worker is stopped (SIGTERM,
  then SIGKILL after ``STOP_GRACE_S``), all are reaped, and ``RuntimeFailure``
  (``BadInput`` for a worker's bad-input error) names the rank, its device and
  its error; worker logs stay in the scratch folder, named in the message.

Workers also exit by themselves if the launcher disappears (they watch its
process), so no run leaves processes behind.

``start_method="forkserver"`` forks the workers from a server process that has
imported torch once (Python's ``multiprocessing`` forkserver), instead of
starting a fresh interpreter per worker: the same worker code and the same
torch.distributed processes, without paying the import for every run (test
suites that launch many short runs use it).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from dl_nfv.artifacts import BadInput, RuntimeFailure, load
from dl_nfv.artifacts.runreport import RunReport
from dl_nfv.profilers.allocator import requested_policy

from .inputs import default_warmup, device_threads, load_inputs, trace_path_of
from .worker import ENV_LAUNCHER_PID, ENV_RUN_DIR, WorkerOptions

POLL_S = 0.05
STOP_GRACE_S = 5.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Process:
    """A worker started either as ``python -m`` (Popen) or forked from the forkserver."""

    def __init__(self, handle):
        self.handle = handle

    @property
    def pid(self) -> int:
        return self.handle.pid

    def poll(self) -> int | None:
        if isinstance(self.handle, subprocess.Popen):
            return self.handle.poll()
        return self.handle.exitcode

    def terminate(self) -> None:
        self.handle.terminate()

    def kill(self) -> None:
        self.handle.kill()

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds; True once the process has exited (and is reaped)."""
        if isinstance(self.handle, subprocess.Popen):
            try:
                self.handle.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                return False
            return True
        self.handle.join(timeout)
        return self.handle.exitcode is not None


def _forked_main(argv: list[str], env: dict[str, str], log_path: str) -> None:
    """Entry of a forkserver-started worker: its environment and log, then the worker."""
    from . import worker

    os.environ.clear()
    os.environ.update(env)
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    code = worker.main(argv)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def train(options: WorkerOptions, *, on_start: Callable[[list[int]], None] | None = None,
          start_method: str = "exec") -> RunReport:
    """Run ``options.plan`` on local worker processes and return the run report.

    The plan, its graph and topology are loaded and checked here first, so bad
    input fails before any process starts (``BadInput``, exit 2). ``on_start``
    receives the worker pids (tests use it). Raises ``RuntimeFailure`` when a
    worker fails or dies, naming the rank. Cost: the run itself plus process
    start-up (importing torch, building the model) on every rank.
    """
    plan, graph, topology, graph_path = load_inputs(options.plan, options.graph, options.topology)
    devices = plan.devices
    n = len(devices)
    if options.steps < 1:
        raise BadInput(f"--steps must be >= 1, got {options.steps}")
    warmup = default_warmup(options.steps) if options.warmup is None else options.warmup
    if not 0 <= warmup < options.steps:
        raise BadInput(f"--warmup must be in [0, {options.steps}), got {warmup}")
    requested_policy()  # a bad DL_NFV_ALLOCATOR fails here, before any worker starts
    if options.data:
        from .model import load_data_factory

        load_data_factory(options.data)
    threads = device_threads(topology, devices, options.threads, n)
    run_dir = Path(tempfile.mkdtemp(prefix="dl-nfv-train-"))
    worker_options = replace(
        options, plan=str(Path(options.plan).resolve()), graph=str(graph_path.resolve()),
        topology=str(Path(options.topology).resolve()) if options.topology else None,
        warmup=warmup, output=str(run_dir / "run.json"), run_dir=str(run_dir),
        trace=str(Path(options.trace).resolve()) if options.trace else None)
    env = dict(os.environ)
    env.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
                "WORLD_SIZE": str(n), "LOCAL_WORLD_SIZE": str(n),
                ENV_LAUNCHER_PID: str(os.getpid()), ENV_RUN_DIR: str(run_dir)})
    procs: list[_Process] = []
    ok = False
    previous = _on_sigterm()
    try:
        for rank in range(n):
            rank_env = {**env, "RANK": str(rank), "LOCAL_RANK": str(rank),
                        "OMP_NUM_THREADS": str(threads[rank]),
                        "MKL_NUM_THREADS": str(threads[rank])}
            log_path = run_dir / f"rank{rank}.log"
            procs.append(_start(worker_options.argv(), rank_env, log_path, start_method))
        if on_start is not None:
            on_start([p.pid for p in procs])
        _watch(procs, devices, run_dir)
        report = load(run_dir / "run.json", expect="run-report")
        if options.trace:
            merge_traces(Path(options.trace), devices)
            report = replace(report, trace_path=str(options.trace))
        report = replace(report, plan_path=str(options.plan))
        ok = True
        return report
    finally:
        _stop(procs)
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        if ok:
            shutil.rmtree(run_dir, ignore_errors=True)


def _on_sigterm():
    """Turn SIGTERM into an exception while workers run, so they are stopped and reaped."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return None

    def handler(signum, frame):
        raise RuntimeFailure("dl-nfv train was terminated (SIGTERM); the workers were stopped")

    return signal.signal(signal.SIGTERM, handler)


def _start(argv: list[str], env: dict[str, str], log_path: Path, start_method: str) -> _Process:
    if start_method == "exec":
        with open(log_path, "wb") as log:
            return _Process(subprocess.Popen(
                [sys.executable, "-m", "dl_nfv.runtime.worker", *argv], env=env, stdout=log,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
    if start_method == "forkserver":
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["dl_nfv.runtime.session", "dl_nfv.profilers.capture",
                                    "dl_nfv.profilers.zoo"])
        process = ctx.Process(target=_forked_main, args=(argv, env, str(log_path)),
                              daemon=False)
        process.start()
        return _Process(process)
    raise BadInput(f"start_method must be 'exec' or 'forkserver', got {start_method!r}")


def _watch(procs: list[_Process], devices, run_dir: Path) -> None:
    while True:
        codes = [p.poll() for p in procs]
        failed = [r for r, c in enumerate(codes) if c not in (None, 0)]
        if failed:
            time.sleep(0.2)  # let near-simultaneous failures land, to pick the first cause
            codes = [p.poll() for p in procs]
            failed = [r for r, c in enumerate(codes) if c not in (None, 0)]
            _stop(procs)
            raise _failure(failed, codes, devices, run_dir)
        if all(c == 0 for c in codes):
            return
        time.sleep(POLL_S)


def _failure(failed: list[int], codes, devices, run_dir: Path) -> Exception:
    def cause_order(rank: int):
        error = run_dir / f"rank{rank}.error"
        if codes[rank] < 0 or not error.exists():
            return (0, 0.0, rank)  # killed (or died without a word): the likeliest first cause
        return (1, error.stat().st_mtime, rank)

    rank = min(failed, key=cause_order)
    code = codes[rank]
    error = run_dir / f"rank{rank}.error"
    where = f"worker logs in {run_dir}"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return RuntimeFailure(f"rank {rank} (device {devices[rank]}) was killed by {name}; "
                              f"the other workers were stopped ({where})")
    if error.exists():
        line = error.read_text().strip()
        cls = BadInput if code == 2 else RuntimeFailure
        return cls(f"{line} ({where})")
    return RuntimeFailure(f"rank {rank} (device {devices[rank]}) exited with status {code} "
                          f"({where})")


def _stop(procs: list[_Process]) -> None:
    """Terminate every worker still running, kill those that linger, reap all."""
    alive = [p for p in procs if p.poll() is None]
    for p in alive:
        p.terminate()
    deadline = time.monotonic() + STOP_GRACE_S
    for p in alive:
        if not p.wait(max(deadline - time.monotonic(), 0.01)):
            p.kill()
    for p in procs:
        p.wait(STOP_GRACE_S)


def merge_traces(target: Path, devices) -> None:
    """Merge the per-rank Chrome traces into ``target``, one process row per rank."""
    events = []
    for rank, device in enumerate(devices):
        part = trace_path_of(str(target), rank)
        if not part.exists():
            continue
        doc = json.loads(part.read_text())
        events.append({"name": "process_name", "ph": "M", "pid": rank,
                       "args": {"name": f"rank {rank} ({device})"}})
        for e in doc.get("traceEvents", []):
            if isinstance(e, dict):
                events.append({**e, "pid": rank})
        part.unlink()
    target.write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}))
