"""Stateful IDS whose per-flow state lives in the store (StatelessNF's IDS, NetStar's HTTP IDS).

The matching is the IDS of ``nfv/nfs/ids.py`` (Snort-style rules, contents
matched per direction as a continuous stream, a rule alerts once per flow at
the message where the last of its contents is first seen). What differs is
where a flow's matcher state is: for every message of a flow the rules watch,
the NF reads the flow's state from the store (the per-direction automaton
nodes and the patterns seen so far, in the IDS's portable form), matches the
message, and writes the state back; at the flow's end it deletes it. Flows no
rule applies to cost no request. Alerts equal ``nfv run``'s for the same rules.
"""

from __future__ import annotations

import json

from dl_nfv.nfv.nfs.base import FlowTable, Outputs
from dl_nfv.nfv.nfs.ids import Ids
from dl_nfv.nfv.nfs.snort import load_rules

from .runtime import BlockingNf, CallbackNf

NAME = "ids"
NEEDS_DNS = False


class Logic:
    """The matcher, shared by all flows; ``inspect`` turns (stored state, message) into
    (state to store, sids that alert)."""

    def __init__(self, spec, trace) -> None:
        rules = load_rules(spec.rules)
        self.ids = Ids(spec, FlowTable.of(trace), rules)
        self.watched = self.ids.watched.any(axis=1).tolist()  # per flow: a rule applies in either direction
        self.rule_msg = {r.sid: r.msg for r in rules}
        self.out = Outputs()

    def inspect(self, stored: bytes | None, msg) -> tuple[bytes, list[int]]:
        ids = self.ids
        state = ids.cpu_state(msg.flow) if stored is None else ids.import_flow(decode(stored))
        ids.cpu(state, msg, msg.payload, self.out)
        sids = [sid for _, _, sid in self.out.alerts]
        self.out.alerts.clear()
        return encode(ids.export_flow(state)), sids


def encode(portable) -> bytes:
    """The IDS's portable flow state (nested lists, tuples, int-keyed dicts) as JSON bytes."""
    return json.dumps(_plain(portable), separators=(",", ":")).encode()


def decode(raw: bytes):
    return _back(json.loads(raw))


def _plain(x):
    if isinstance(x, dict):
        return {"d": [[_plain(k), _plain(v)] for k, v in x.items()]}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return x


def _back(x):
    if isinstance(x, dict):
        return {_back(k): _back(v) for k, v in x["d"]}
    if isinstance(x, list):
        return [_back(v) for v in x]
    return x


async def run(flow, env):
    if not env.logic.watched[flow.id]:
        return
    key = flow.key("ids")
    async for msg in flow.messages():
        state, sids = env.logic.inspect(await env.store.get(key), msg)
        for sid in sids:
            flow.alert(sid, env.logic.rule_msg[sid])
        await env.store.set(key, state)
    await env.store.delete(key)


class Callback(CallbackNf):

    def message(self, flow, msg, done):
        env = self.env
        if not env.logic.watched[flow.id]:
            return done()
        key = flow.key("ids")

        def got(fut):
            if fut.exception() is not None:
                return done(fut.exception())
            state, sids = env.logic.inspect(fut.result(), msg)
            for sid in sids:
                flow.alert(sid, env.logic.rule_msg[sid])
            env.store.set(key, state).add_done_callback(lambda f: done(f.exception()))

        env.store.get(key).add_done_callback(got)

    def close(self, flow, done):
        if not self.env.logic.watched[flow.id]:
            return done()
        self.env.store.delete(flow.key("ids")).add_done_callback(lambda f: done(f.exception()))


class Blocking(BlockingNf):

    def message(self, flow, msg):
        env = self.env
        if not env.logic.watched[flow.id]:
            return
        key = flow.key("ids")
        state, sids = env.logic.inspect(env.store.get(key), msg)
        for sid in sids:
            flow.alert(sid, env.logic.rule_msg[sid])
        env.store.set(key, state)

    def close(self, flow):
        if self.env.logic.watched[flow.id]:
            self.env.store.delete(flow.key("ids"))
