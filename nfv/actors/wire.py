"""The messaging layer between NFVactor's processes: ZeroMQ PUSH/PULL over TCP.

Each process binds one PULL socket at its address and keeps one PUSH socket per peer
it sends to. A message is ``(kind, sender, payload)`` pickled without a memo (pickle's
*fast* mode: a message is a tree of tuples, lists, dicts and numbers, with no cycles,
and a batch of many small per-flow tuples pickles several times faster without
memoising each one; a shared object is written once per reference). ZeroMQ keeps the
messages of one sender to one receiver in order (TCP), which the protocols rely on
(a command sent after packets is handled after them). Sends never block: a peer that
is gone queues up to ``QUEUE_LIMIT`` messages and then loses them, which is what a
dead runtime's traffic should do; the protocols above recover what matters.
"""

from __future__ import annotations

import io
import math
import pickle
import select
import time
from typing import Any

import zmq

from dl_nfv.artifacts.errors import BadInput

QUEUE_LIMIT = 1_000_000  # messages queued towards one peer before sends are dropped


class Endpoint:
    """A process's inbox (bound PULL) and its outboxes (one PUSH per peer address)."""

    def __init__(self, name: str, bind: str | None = None):
        self.name = name
        self.context = zmq.Context()
        self.peers: dict[str, zmq.Socket] = {}
        self.inbox = self.context.socket(zmq.PULL)
        self.inbox.setsockopt(zmq.RCVHWM, QUEUE_LIMIT)
        self.inbox.setsockopt(zmq.LINGER, 0)
        try:
            self.inbox.bind(bind or "tcp://127.0.0.1:*")
        except zmq.ZMQError as exc:
            self.close()
            raise BadInput(f"{name}: cannot listen on {bind}: {exc.strerror}") from None
        self.address = self.inbox.getsockopt(zmq.LAST_ENDPOINT).decode()
        self.poller = zmq.Poller()
        self.poller.register(self.inbox, zmq.POLLIN)
        self.fd = self.inbox.getsockopt(zmq.FD)
        self.buffer = io.BytesIO()
        self.pickler = pickle.Pickler(self.buffer, protocol=pickle.HIGHEST_PROTOCOL)
        self.pickler.fast = True  # no memo (module docstring)

    def encode(self, message: tuple) -> bytes:
        self.buffer.seek(0)
        self.buffer.truncate()
        self.pickler.dump(message)
        return self.buffer.getvalue()

    def send(self, address: str, kind: str, payload: Any = None) -> bool:
        """Queue one message to ``address``; False if it was dropped (the peer's queue is full)."""
        sock = self.peers.get(address)
        if sock is None:
            sock = self.peers[address] = self.context.socket(zmq.PUSH)
            sock.setsockopt(zmq.SNDHWM, QUEUE_LIMIT)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(address)
        try:
            sock.send(self.encode((kind, self.name, payload)), zmq.NOBLOCK)
        except zmq.Again:
            return False
        return True

    def forget(self, address: str) -> None:
        """Drop the outbox to ``address`` and whatever it still queues (a dead peer)."""
        sock = self.peers.pop(address, None)
        if sock is not None:
            sock.close(linger=0)

    def receive(self, timeout_s: float, limit: int = 4096, exact: bool = False
                ) -> list[tuple[str, str, Any]]:
        """The messages waiting (``limit`` at most), after waiting up to ``timeout_s`` for
        the first one; heartbeats (``ping``, ``pong``) first, so that a long round of work
        does not delay them. ZeroMQ's poll counts whole milliseconds (a wait is rounded
        up); ``exact`` waits the time given (``wait``)."""
        out = []
        if self.wait(timeout_s) if exact else \
                self.poller.poll(max(0, math.ceil(timeout_s * 1000))):
            while True:
                try:
                    raw = self.inbox.recv(zmq.NOBLOCK)
                except zmq.Again:
                    break
                out.append(pickle.loads(raw))
                if len(out) >= limit:
                    break
        if len(out) > 1:
            out.sort(key=lambda message: message[0] not in ("ping", "pong"))
        return out

    def wait(self, timeout_s: float) -> bool:
        """Whether a message came within ``timeout_s`` (to the microsecond): a select on
        the inbox's file descriptor, which signals that its events may have changed (edge-
        triggered), so they are read again after each wake-up and before each wait."""
        deadline = time.perf_counter() + timeout_s
        while not self.inbox.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            left = deadline - time.perf_counter()
            if left <= 0:
                return False
            select.select([self.fd], [], [], left)
        return True

    def request(self, address: str, kind: str, payload: Any, expect: str, timeout_s: float,
                what: str) -> Any:
        """Send one message and wait for the first reply of kind ``expect``; ``BadInput``
        naming ``what`` if none comes within ``timeout_s`` (a dead or absent process)."""
        self.send(address, kind, payload)
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            for got, _, reply in self.receive(min(left, 0.1)):
                if got == expect:
                    return reply
        raise BadInput(f"{what} is not answering (no reply in {timeout_s:g} s)")

    def close(self) -> None:
        for sock in self.peers.values():
            sock.close(linger=0)
        self.peers = {}
        self.inbox.close(linger=0)
        self.context.term()


def exit_with(main) -> None:
    """Run a process's ``main(argv)`` and exit with its code: a ``DlNfvError`` as one
    ``error:`` line and its exit code, Ctrl-C as 130."""
    import sys

    from dl_nfv.artifacts.errors import DlNfvError

    try:
        sys.exit(main(sys.argv[1:]))
    except DlNfvError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)
