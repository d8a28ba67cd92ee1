"""Point-to-point and collective calls, timed: the runtime's only door to torch.distributed.

Every blocking wait (a ``recv``, a collective's ``wait``, draining sends) is
timed into ``wait_ms`` of the current step, so that a rank's step splits into
compute time and time spent waiting for peers. Sends are non-blocking
(``isend``) and drained at the end of the step, so a rank following a valid
schedule never blocks on a peer that has not reached its matching ``recv``.

Receives are posted ahead of their need (``post``, at the start of a step, for
every receive its schedule makes). Gloo moves a message's bytes only once the
receiver has posted its receive: a send that finds the receive posted writes
at once, in the sender's own thread, while a send that does not is left to
gloo's I/O thread, to be written when the receive's notice arrives. On a
worker that has one core, that thread shares the core with the compute of
the next actions, and the scheduler may keep it waiting for a slice
(milliseconds) per message. With every receive posted, a transfer starts
when its producer sends it, as the simulator has it.

Which needs the sender to know of the receive. Its notice comes over the
socket to gloo's event loop, which runs deferred (``defer_transport_threads``):
while the worker computes, the notice waits unread, and a send made meanwhile
is left to the loop, until the worker next waits for a peer, up to whole
actions later. So ``isend`` yields the core first (``os.sched_yield``): a loop
the notice woke runs, records the receive (and writes sends it held), and the
send then writes at once. With nothing else runnable the yield returns at once
(one system call). It matters where a step hands values back and forth many
times (a placement of many small units, a pipeline of short microbatches); a
pipeline of long microbatches rarely sends while a notice waits.

Every call runs under the process group's timeout (set at
``init_process_group``): a peer that died or hangs turns into an exception
here, never a hang.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

import torch
import torch.distributed as dist

from .timeline import StepTimeline

_yield = getattr(os, "sched_yield", lambda: None)  # (POSIX)


class Comm:
    """Timed send/recv and collectives of one rank on one torch device."""

    def __init__(self, rank: int, device: torch.device, *, synchronize: bool = False):
        self.rank = rank
        self.device = device
        self.synchronize = synchronize  # CUDA: make waits measure the transfer, not the launch
        self.wait_ms = 0.0
        self.timeline = StepTimeline()  # the step's spans: every wait is one of communication
        self._sends: list[tuple[dist.Work, torch.Tensor]] = []
        self._posted: dict[tuple[int, int], tuple[dist.Work, torch.Tensor]] = {}

    # ------------------------------------------------------------------ timing
    def _timed_wait(self, work: dist.Work | None, what: str = "wait") -> None:
        t0 = time.perf_counter()
        if work is not None:
            work.wait()
        if self.synchronize:
            torch.cuda.synchronize(self.device)
        t1 = time.perf_counter()
        self.wait_ms += (t1 - t0) * 1e3
        self.timeline.add("communication", what, t0, t1)

    def take_wait_ms(self) -> float:
        """The wait time accumulated since the last call (one step's), and reset it."""
        value, self.wait_ms = self.wait_ms, 0.0
        return value

    # ------------------------------------------------------------ point to point
    def isend(self, tensor: torch.Tensor, dst: int, tag: int) -> None:
        tensor = tensor.detach().contiguous()
        _yield()  # a woken event loop first records the peer's posted receive (module doc)
        self._sends.append((dist.isend(tensor, dst, tag=tag), tensor))

    def post(self, shape: Sequence[int], dtype: torch.dtype, src: int, tag: int) -> None:
        """Post the receive of ``tag`` from ``src`` now; ``recv`` with the same ``src`` and
        ``tag`` waits for it."""
        buffer = torch.empty(tuple(shape), dtype=dtype, device=self.device)
        self._posted[(src, tag)] = (dist.irecv(buffer, src, tag=tag), buffer)

    def recv(self, shape: Sequence[int], dtype: torch.dtype, src: int, tag: int) -> torch.Tensor:
        posted = self._posted.pop((src, tag), None)
        if posted is None:
            buffer = torch.empty(tuple(shape), dtype=dtype, device=self.device)
            posted = (dist.irecv(buffer, src, tag=tag), buffer)
        self._timed_wait(posted[0], f"recv from rank {src}")
        return posted[1]

    def unclaimed(self) -> list[tuple[int, int]]:
        """``(src, tag)`` of the posted receives no ``recv`` has waited for."""
        return list(self._posted)

    def drain(self) -> None:
        """Wait for every send still in flight."""
        sends, self._sends = self._sends, []
        for work, _ in sends:
            self._timed_wait(work, "send")

    # -------------------------------------------------------------- collectives
    def wait(self, work: dist.Work | None) -> None:
        self._timed_wait(work)

    def all_reduce(self, tensor: torch.Tensor, group=None) -> None:
        self._timed_wait(dist.all_reduce(tensor, group=group, async_op=True), "all_reduce")

    def barrier(self) -> None:
        self._timed_wait(dist.barrier(async_op=True), "barrier")


TRANSPORT_THREAD = "gloo"  # gloo names its transport's event-loop threads gloo_tcp_loop


def defer_transport_threads() -> list[int]:
    """Make gloo's event-loop threads of this process wait their turn (``SCHED_BATCH``):
    call it once every process group of the worker exists; returns their thread ids.

    gloo's TCP event loop handles a ready socket only if it gets the connection's lock
    at once; if not, it returns to ``epoll_wait``, which reports the same (level-
    triggered) event again at once: it spins until the lock is free. The thread that
    holds the lock is the worker's own thread, posting a receive or sending. On a worker
    of one core the two share it, and when incoming data wakes the event loop, the
    scheduler lets it preempt the worker's thread, lock held, and spin for its whole time
    slice (up to a scheduler tick: milliseconds) before the worker can release the lock.
    The worker's CPU time then equals its step time, and steps come out bimodal, the slow
    ones a tick longer. A ``SCHED_BATCH`` thread does not preempt on wake-up: the event
    loop runs when the worker's thread blocks (waiting for a peer, which is when its
    data is needed) or at the next tick, as the device's core would serve it. Nothing
    else changes (ProcessGroupGloo's own threads, which run collectives, keep theirs).
    Where the OS has no such policy, or the thread is gone, nothing is done."""
    if not hasattr(os, "SCHED_BATCH"):
        return []
    changed = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as fh:
                name = fh.read().strip()
            if name.startswith(TRANSPORT_THREAD):
                os.sched_setscheduler(int(tid), os.SCHED_BATCH, os.sched_param(0))
                changed.append(int(tid))
        except OSError:  # the thread ended meanwhile
            continue
    return changed


def tag_of(value_index: int, microbatch: int, backward: bool, part: int = 0) -> int:
    """A tag unique to one transfer of a step: value, microbatch, direction and row part."""
    return ((value_index * 1024 + microbatch) * 2 + int(backward)) * 64 + part
