"""One training process: ``python -m dl_nfv.runtime.worker PLAN [options]``.

The same entry point runs under ``dl-nfv train`` (which spawns one per plan
device on this machine) and under ``torchrun`` (many hosts). It reads its
place from the environment torchrun sets (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``): rank ``r`` executes the
plan's device ``plan.devices[r]`` (first-use order, as ``dl-nfv show plan``
lists them), so ``WORLD_SIZE`` must equal the number of plan devices.

Rank 0 gathers every rank's measurements and writes the ``run-report``
(``-o``). A failure is one line on stderr, ``rank R (device D): Error: ...``,
also written to ``<run-dir>/rank<R>.error`` when a run directory is given,
and exit status 1.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

ENV_LAUNCHER_PID = "DL_NFV_LAUNCHER_PID"
ENV_RUN_DIR = "DL_NFV_RUN_DIR"


@dataclass
class WorkerOptions:
    """What a worker needs besides the plan; the launcher and torchrun users pass them as flags."""

    plan: str
    graph: str | None = None
    topology: str | None = None
    steps: int = 10
    warmup: int | None = None
    threads: int | None = None
    backend: str = "auto"
    timeout_s: float = 60.0
    seed: int = 0
    lr: float | None = None
    data: str | None = None
    trace: str | None = None
    output: str | None = None
    save_params: str | None = None
    run_dir: str | None = None
    extra: dict = field(default_factory=dict)

    def argv(self) -> list[str]:
        """The command-line flags that rebuild these options in a worker."""
        out = [self.plan]
        for flag, value in (("--graph", self.graph), ("--topology", self.topology),
                            ("--steps", self.steps), ("--warmup", self.warmup),
                            ("--threads", self.threads), ("--backend", self.backend),
                            ("--timeout-s", self.timeout_s), ("--seed", self.seed),
                            ("--lr", self.lr), ("--data", self.data), ("--trace", self.trace),
                            ("-o", self.output), ("--save-params", self.save_params),
                            ("--run-dir", self.run_dir)):
            if value is not None:
                out += [flag, str(value)]
        return out


def parse_args(argv: list[str]) -> WorkerOptions:
    parser = argparse.ArgumentParser(prog="python -m dl_nfv.runtime.worker",
                                     description="One dl-nfv training process (see dl-nfv train).")
    parser.add_argument("plan")
    parser.add_argument("--graph")
    parser.add_argument("--topology")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int)
    parser.add_argument("--threads", type=int)
    parser.add_argument("--backend", default="auto", choices=("auto", "gloo", "nccl"))
    parser.add_argument("--timeout-s", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float)
    parser.add_argument("--data")
    parser.add_argument("--trace")
    parser.add_argument("-o", "--output")
    parser.add_argument("--save-params")
    parser.add_argument("--run-dir")
    ns = parser.parse_args(argv)
    return WorkerOptions(plan=ns.plan, graph=ns.graph, topology=ns.topology, steps=ns.steps,
                         warmup=ns.warmup, threads=ns.threads, backend=ns.backend,
                         timeout_s=ns.timeout_s, seed=ns.seed, lr=ns.lr, data=ns.data,
                         trace=ns.trace, output=ns.output, save_params=ns.save_params,
                         run_dir=ns.run_dir)


def _watch_launcher(pid: int) -> None:
    """Exit at once if the launcher that started us is gone (no orphaned workers)."""
    def loop() -> None:
        while True:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                os._exit(3)
            except PermissionError:  # pragma: no cover - the pid was reused by another user
                os._exit(3)
            time.sleep(0.5)

    threading.Thread(target=loop, name="dl-nfv-parent-watch", daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    options = parse_args(sys.argv[1:] if argv is None else argv)
    rank = int(os.environ.get("RANK", "0"))
    launcher = os.environ.get(ENV_LAUNCHER_PID)
    if launcher:
        _watch_launcher(int(launcher))
    run_dir = options.run_dir or os.environ.get(ENV_RUN_DIR)
    device = "?"
    try:
        from .session import run_worker

        def on_device(name: str) -> None:
            nonlocal device
            device = name

        run_worker(options, rank=rank, on_device=on_device)
        return 0
    except BaseException as exc:  # report every failure as one line naming the rank
        if isinstance(exc, KeyboardInterrupt):
            line = "interrupted"
        else:
            first = (str(exc).strip().splitlines() or [""])[0]
            line = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
        message = f"rank {rank} (device {device}): {line}"
        if run_dir:
            try:
                Path(run_dir, f"rank{rank}.error").write_text(message + "\n")
            except OSError:
                pass
        sys.stderr.write(traceback.format_exc())
        sys.stderr.write(f"error: {message}\n")
        sys.stderr.flush()
        from dl_nfv.artifacts import DlNfvError

        return exc.exit_code if isinstance(exc, DlNfvError) else 1


if __name__ == "__main__":  # pragma: no cover
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Leave without interpreter finalisation: communication threads of a process group
    # (broken, or just destroyed) must not run into a half-torn-down interpreter.
    os._exit(code)
