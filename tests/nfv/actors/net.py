"""A cluster's switch and runtimes in one process, their messages delivered by hand.

``Net`` puts a ``Switch`` and one ``Runtime`` per runtime of a cluster file in this
process and routes what they send through per-channel queues (one per sender and
receiver, in order, as ZeroMQ keeps them), so a test decides exactly which message is
handled next: a seeded random choice among the channels interleaves senders as a
receiver's fair queuing may, deterministically. ``sent`` records every message between
the processes as ``(sender, receiver, kind)``. ``kill`` drops a runtime and every
message it had queued (lost in flight); ``declare_dead`` is the switch's own handler.
"""

from __future__ import annotations

import random
from collections import deque

from dl_nfv.nfv.actors.runtime import Runtime
from dl_nfv.nfv.actors.switch import Switch


class Net:
    def __init__(self, spec, chain, seed: int = 0) -> None:
        self.rng = random.Random(seed)
        self.switch = Switch(spec)
        self.runtimes = {name: Runtime(spec, name) for name in spec.runtime_names}
        self.name_of = {m.endpoint: m.name for m in (spec.switch, *spec.runtimes)}
        self.channels: dict[tuple[str, str], deque] = {}
        self.outputs: list = []
        self.replies: list = []
        self.sent: list[tuple[str, str, str]] = []
        self.killed: set[str] = set()
        self.switch.endpoint.send = self._sender("switch", sessioned=False)
        self.switch.sink = "client"
        for name, runtime in self.runtimes.items():
            runtime.chain = chain
            runtime.tell = self._sender(name, sessioned=True)
            runtime.endpoint.send = self._sender(name, sessioned=False)
            self.switch.on_pong(name, {"pid": 0})

    def _sender(self, name: str, sessioned: bool):
        def send(address, kind, payload=None):
            to = self.name_of.get(address, address)
            if to in self.killed or name in self.killed:
                return True
            if to == "switch" or to in self.runtimes:
                self.sent.append((name, to, kind))
                self.channels.setdefault((name, to), deque()).append((kind, payload))
            elif kind == "outputs":
                self.outputs.extend(payload)
            else:
                self.replies.append((kind, payload))
            return True
        return send

    def packets(self, batch: list) -> None:
        self.switch.on_packets("client", batch)
        self.switch.flush()

    def migrate(self, flows: int, source: str, destination: str, mode: str) -> None:
        self.switch.on_migrate("client", {"reply": "client", "flows": flows, "source": source,
                                          "destination": destination, "mode": mode})
        self.switch.flush()

    def step(self) -> bool:
        """Handle one message from a channel chosen at random; False when none is left."""
        busy = [c for c, q in self.channels.items() if q]
        if not busy:
            return False
        sender, to = self.rng.choice(sorted(busy))
        kind, payload = self.channels[(sender, to)].popleft()
        if to == "switch":
            view = self.switch.runtimes.get(sender)
            if view is None or view.live:
                handler = getattr(self.switch, f"on_{kind}", None)
                if handler is not None:
                    handler(sender, payload)
            self.switch.flush()
        else:
            runtime = self.runtimes[to]
            if sender not in runtime.dead:
                handler = getattr(runtime, f"on_{kind}", None)
                if handler is not None:
                    handler(sender, payload)
            runtime.flush()
            runtime.settle()  # (the process does it before its next message)
        return True

    def run(self, limit: int = 1_000_000) -> None:
        while limit and self.step():
            limit -= 1

    def kill(self, name: str) -> None:
        """kill -9 ``name``: it handles nothing more, and what it had sent is lost."""
        self.killed.add(name)
        for (sender, to), queue in self.channels.items():
            if name in (sender, to):
                queue.clear()
        self.switch.declare_dead(self.switch.runtimes[name], 0.0)
        self.switch.flush()

    def states(self) -> dict:
        """Every flow's (seq, states) at its primary, on the live runtimes."""
        return {f: (a.seq, a.states) for name, r in self.runtimes.items()
                if name not in self.killed for f, a in r.primaries.items()}

    def close(self) -> None:
        self.switch.endpoint.close()
        for runtime in self.runtimes.values():
            runtime.endpoint.close()
