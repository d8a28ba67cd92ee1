"""Stateful firewall whose connection state lives in the store (StatelessNF's firewall).

The semantics of ``nfv/nfs/firewall.py``: a flow is NEW until its first
client message, which is checked against the ACL (first matching rule, else
the default): allowed flows become ESTABLISHED and pass both ways, denied ones
DENIED and drop; a server message on a NEW flow is dropped. The state is read
from the store for every message and written when it changes (``E``/``D``;
absent means NEW); deleted at the flow's end. Drops equal ``nfv run``'s.
"""

from __future__ import annotations

from dl_nfv.nfv.nfs.base import FlowTable
from dl_nfv.nfv.nfs.firewall import Firewall

from .runtime import BlockingNf, CallbackNf

NAME = "firewall"
NEEDS_DNS = False
ESTABLISHED, DENIED = b"E", b"D"


class Logic:
    def __init__(self, spec, trace) -> None:
        self.firewall = Firewall(spec, FlowTable.of(trace))

    def decide(self, flow: int) -> bytes:
        return ESTABLISHED if self.firewall.allowed(flow) else DENIED


async def run(flow, env):
    key = flow.key("fw")
    async for msg in flow.messages():
        state = await env.store.get(key)
        if state is None and msg.direction == 0:
            state = env.logic.decide(flow.id)
            await env.store.set(key, state)
        if state != ESTABLISHED:
            flow.drop()
    await env.store.delete(key)


class Callback(CallbackNf):

    def message(self, flow, msg, done):
        env = self.env
        key = flow.key("fw")

        def verdict(state):
            if state != ESTABLISHED:
                flow.drop()
            done()

        def stored(fut, state):
            if fut.exception() is not None:
                return done(fut.exception())
            verdict(state)

        def got(fut):
            if fut.exception() is not None:
                return done(fut.exception())
            state = fut.result()
            if state is None and msg.direction == 0:
                state = env.logic.decide(flow.id)
                env.store.set(key, state).add_done_callback(lambda f: stored(f, state))
            else:
                verdict(state)

        env.store.get(key).add_done_callback(got)

    def close(self, flow, done):
        self.env.store.delete(flow.key("fw")).add_done_callback(lambda f: done(f.exception()))


class Blocking(BlockingNf):

    def message(self, flow, msg):
        env = self.env
        key = flow.key("fw")
        state = env.store.get(key)
        if state is None and msg.direction == 0:
            state = env.logic.decide(flow.id)
            env.store.set(key, state)
        if state != ESTABLISHED:
            flow.drop()

    def close(self, flow):
        self.env.store.delete(flow.key("fw"))
