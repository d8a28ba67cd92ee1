"""The CPU side: worker processes running the NF chain's per-flow logic.

Workers are forked once per run and keep the state of the flows pinned to
them between batches. A worker exits when the process that forked it dies,
even by SIGKILL (``PR_SET_PDEATHSIG``, or a parent-pid watch where that does
not exist). A batch share arrives as a ``Block`` (columns plus the bytes of
its messages, or their offsets into the trace's payload the workers inherited
when forked) with the portable state of flows handed over from the
tensor path; an ``export`` request hands flows back. A worker that fails
reports the error, and the engine raises ``RuntimeFailure``.
"""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import os
import queue
import signal
import sys
import threading
import time
import traceback
from collections import deque

import numpy as np

from dl_nfv.artifacts.errors import RuntimeFailure

from ..nfs.base import Outputs
from ..nfs.chain import Block, Chain

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _pack(out: Outputs) -> dict:
    return {"http": out.table("http", 9), "drops": out.table("drops", 2),
            "alerts": list(out.alerts), "monitor": out.table("monitor", 6)}


def die_with_parent(parent: int) -> None:
    """End this worker when the process that forked it dies, however it dies (SIGKILL too).

    On Linux the kernel does it (``PR_SET_PDEATHSIG``); elsewhere a daemon thread
    watches the parent pid. Both check once at start: the parent may already be
    gone. (A worker's pipes cannot tell: every later worker inherits the
    earlier workers' pipe ends, so EOF never arrives.)
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        linked = libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0
    except (OSError, AttributeError):  # not Linux
        linked = False
    if os.getppid() != parent:
        os._exit(3)
    if linked:
        return

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(3)

    threading.Thread(target=watch, name="dl-nfv-parent-watch", daemon=True).start()


def _worker(commands, results, chain: Chain, parent: int, payload: bytes | None) -> None:
    die_with_parent(parent)
    states: dict[int, list] = {}
    # CPU time since the previous reply: receiving and unpickling a block counts, and so
    # does sending the previous reply (blocking in recv costs none)
    since = time.thread_time()
    torch = sys.modules.get("torch")  # loaded by the parent for a tensor path: one thread here
    if torch is not None:
        torch.set_num_threads(1)
    while True:
        try:
            command = commands.recv()
        except EOFError:
            return
        try:
            if command[0] == "stop":
                return
            if command[0] == "run":
                _, block, imports = command
                for flow, value in imports.items():
                    states[flow] = chain.cpu_import(flow, value)
                out = Outputs()
                chain.cpu_run(block, states, out, payload)
                packed = _pack(out)
                now = time.thread_time()  # CPU time: other load does not count
                results.send(("ok", now - since, packed))
                since = now
            elif command[0] == "export":
                exports = {f: chain.cpu_export(states.pop(f)) for f in command[1] if f in states}
                results.send(("exports", exports))
        except Exception as exc:  # reported to the engine, which raises RuntimeFailure
            results.send(("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))


class WorkerPool:
    """``workers`` forked processes; ``pin(flow)`` is the worker a flow belongs to.

    ``payload`` (the trace's message bytes) is inherited by the forked workers,
    pages shared with this process, so blocks can name messages by offset
    (``Block.offset``) instead of carrying their bytes through the pipes.

    Each worker has a command pipe and a result pipe. Commands are written by
    one sender thread per worker, so this process never blocks on a full pipe
    while a worker blocks writing its results (batches are queued ahead).
    """

    def __init__(self, chain: Chain, workers: int, payload: bytes | None = None):
        self.size = workers
        context = mp.get_context("fork" if hasattr(os, "fork") else "spawn")
        self.results = []
        self.queues: list[queue.Queue] = []
        self.senders = []
        self.procs = []
        for _ in range(workers):
            cmd_read, cmd_write = context.Pipe(duplex=False)
            res_read, res_write = context.Pipe(duplex=False)
            proc = context.Process(target=_worker, daemon=True,
                                   args=(cmd_read, res_write, chain, os.getpid(), payload))
            proc.start()
            cmd_read.close()
            res_write.close()
            q: queue.Queue = queue.Queue()
            sender = threading.Thread(target=_send_loop, args=(q, cmd_write), daemon=True)
            sender.start()
            self.results.append(res_read)
            self.queues.append(q)
            self.senders.append(sender)
            self.procs.append(proc)

    @staticmethod
    def pin(flows: np.ndarray, workers: int) -> np.ndarray:
        return (flows * 2654435761 % (1 << 32)) % workers

    def submit(self, worker: int, block: Block, imports: dict) -> None:
        self.queues[worker].put(("run", block, imports))

    def warm_up(self, block: Block) -> None:
        """One round trip of ``block`` (empty) through every worker: the first use of the
        pipes, sender threads and worker loop is paid at start-up, not by the first batch."""
        for w in range(self.size):
            self.submit(w, block, {})
        for w in range(self.size):
            self.receive(w)

    def request_export(self, worker: int, flows: list[int]) -> None:
        self.queues[worker].put(("export", flows))

    def receive(self, worker: int):
        try:
            reply = self.results[worker].recv()
        except EOFError:
            raise RuntimeFailure(f"CPU worker {worker} exited unexpectedly") from None
        if reply[0] == "error":
            raise RuntimeFailure(f"CPU worker {worker} failed: {reply[1].splitlines()[0]}")
        return reply

    def close(self) -> None:
        for q in self.queues:
            q.put(("stop",))
        for sender in self.senders:
            sender.join(timeout=5)
        for proc in self.procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.terminate()
        for conn in self.results:
            conn.close()


class InlinePool:
    """One "worker" that is this process: ``WorkerPool``'s interface, each command run as
    it is submitted and its reply queued for ``receive``, in order. For the ``cpu``
    engine with one worker there is nothing to run concurrently with, so a forked
    process would only add the fork and the pipes."""

    size = 1
    pin = staticmethod(WorkerPool.pin)

    def __init__(self, chain: Chain, payload: bytes | None = None):
        self.chain = chain
        self.payload = payload
        self.states: dict[int, list] = {}
        self.replies: deque = deque()

    def submit(self, worker: int, block: Block, imports: dict) -> None:
        began = time.thread_time()
        for flow, value in imports.items():
            self.states[flow] = self.chain.cpu_import(flow, value)
        out = Outputs()
        self.chain.cpu_run(block, self.states, out, self.payload)
        self.replies.append(("ok", time.thread_time() - began, _pack(out)))

    def warm_up(self, block: Block) -> None:
        """Nothing to warm up: no pipes."""

    def request_export(self, worker: int, flows: list[int]) -> None:
        self.replies.append(("exports", {f: self.chain.cpu_export(self.states.pop(f))
                                         for f in flows if f in self.states}))

    def receive(self, worker: int):
        return self.replies.popleft()

    def close(self) -> None:
        self.replies.clear()


def _send_loop(q: queue.Queue, conn) -> None:
    """Write queued commands to one worker, in order; ends after ``stop``."""
    while True:
        command = q.get()
        try:
            conn.send(command)
        except (OSError, BrokenPipeError):
            break
        if command[0] == "stop":
            break
    conn.close()
