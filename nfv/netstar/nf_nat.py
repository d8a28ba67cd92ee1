"""NAT whose mappings live in the store (StatelessNF's NAT).

Each flow gets a public address and port from the pool (``pool`` addresses x
``ports`` range: the slots). Slots are claimed (``store.claim``) on the slot's
key, starting at slot ``flow id mod slots`` and probing the next ones while a
slot is held by a live flow; a slot is released at its flow's end. Because
flow ids follow the trace's order, the i-th flow's first choice is fixed,
so mappings do not depend on how waits interleave (only when more flows than
slots are alive at once can the probing order matter). The flow's mapping is
written under the flow's key and read back for every message (the header
rewrite needs it); a flow that finds every slot taken is mapped to ``-`` and
its messages are dropped. Each flow's mapping is an output (``note``).
"""

from __future__ import annotations

import ipaddress

from dl_nfv.artifacts.nfconfig import port_range

from .runtime import BlockingNf, CallbackNf

NAME = "nat"
NEEDS_DNS = False
UNMAPPED = b"-"


class Logic:
    def __init__(self, spec, trace) -> None:
        self.pool = [str(ipaddress.IPv4Address(a)) for a in spec.pool]
        lo, hi = port_range(spec.ports)
        self.port_lo, ports = lo, hi - lo + 1
        self.ports = ports
        self.capacity = len(self.pool) * ports

    def slots(self, flow: int):
        """The slots flow ``flow`` tries, in order."""
        first = flow % self.capacity
        return (first + i if first + i < self.capacity else first + i - self.capacity
                for i in range(self.capacity))

    def address(self, slot: int | None) -> bytes:
        if slot is None:
            return UNMAPPED
        return f"{self.pool[slot // self.ports]}:{self.port_lo + slot % self.ports}".encode()


async def run(flow, env):
    nat, key, slot = env.logic, flow.key("nat"), None
    for candidate in nat.slots(flow.id):
        if await env.store.claim(env.key("nat-slot", candidate), flow.id):
            slot = candidate
            break
    await env.store.set(key, nat.address(slot))
    flow.note(nat.address(slot).decode())
    async for _ in flow.messages():
        if await env.store.get(key) in (None, UNMAPPED):
            flow.drop()
    await env.store.delete(key)
    if slot is not None:
        await env.store.delete(env.key("nat-slot", slot))


class Callback(CallbackNf):
    def __init__(self, env):
        super().__init__(env)
        self.slots = {}

    def open(self, flow, done):
        env, nat = self.env, self.env.logic
        candidates = iter(nat.slots(flow.id))

        def assign(slot):
            self.slots[flow.id] = slot
            flow.note(nat.address(slot).decode())
            env.store.set(flow.key("nat"), nat.address(slot)).add_done_callback(
                lambda f: done(f.exception()))

        def claimed(fut, slot):
            if fut.exception() is not None:
                return done(fut.exception())
            if fut.result():
                return assign(slot)
            try_next()

        def try_next():
            slot = next(candidates, None)
            if slot is None:
                return assign(None)
            env.store.claim(env.key("nat-slot", slot), flow.id).add_done_callback(
                lambda f: claimed(f, slot))

        try_next()

    def message(self, flow, msg, done):
        def got(fut):
            if fut.exception() is not None:
                return done(fut.exception())
            if fut.result() in (None, UNMAPPED):
                flow.drop()
            done()

        self.env.store.get(flow.key("nat")).add_done_callback(got)

    def close(self, flow, done):
        env, slot = self.env, self.slots.pop(flow.id)

        def released(fut):
            if fut.exception() is not None:
                return done(fut.exception())
            if slot is None:
                return done()
            env.store.delete(env.key("nat-slot", slot)).add_done_callback(
                lambda f: done(f.exception()))

        env.store.delete(flow.key("nat")).add_done_callback(released)


class Blocking(BlockingNf):
    def __init__(self, env):
        super().__init__(env)
        self.slots = {}

    def open(self, flow):
        env, nat, slot = self.env, self.env.logic, None
        for candidate in nat.slots(flow.id):
            if env.store.claim(env.key("nat-slot", candidate), flow.id):
                slot = candidate
                break
        self.slots[flow.id] = slot
        env.store.set(flow.key("nat"), nat.address(slot))
        flow.note(nat.address(slot).decode())

    def message(self, flow, msg):
        if self.env.store.get(flow.key("nat")) in (None, UNMAPPED):
            flow.drop()

    def close(self, flow):
        env, slot = self.env, self.slots.pop(flow.id)
        env.store.delete(flow.key("nat"))
        if slot is not None:
            env.store.delete(env.key("nat-slot", slot))
