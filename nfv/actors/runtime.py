"""An NFVactor runtime: one OS process hosting many flow actors.

A flow actor is one small object per flow and role: a *primary* processes the flow's
packets through the chain; a *replica* (on another runtime) holds a copy of its state.
Every packet the switch forwards carries the flow's sequence number ``seq`` (1, 2, ...),
the replica's name and the switch's *committed* mark (the highest ``seq`` whose output
the switch has let out). The runtime's rules:

* **Process once.** A primary processes ``seq`` only if it is its last ``seq`` + 1; a
  lower one is a copy resent after a failover and is ignored (its effect is already in
  the state). The output of every ``seq`` above the committed mark stays in the actor's
  log until the switch commits it.
* **Output commit.** After processing, the primary sends the delta and the output to the
  replica; the replica applies deltas strictly in sequence (a duplicate is ignored, one
  ahead of a gap waits) and only then acknowledges the output to the switch, which lets
  the packet leave. Without a replica the primary acknowledges it itself.
* **Snapshots** (state, ``seq`` and the output log) make or refresh a replica: applied
  when not older than the replica, they acknowledge every logged output again (the
  switch drops what it has).
* **Promote** turns a replica into the primary (or makes a fresh actor when the replica
  had not seen the flow yet) and snapshots it to the new replica; **rereplicate**
  snapshots a primary to a new replica.
* **Migration** (decentralised): ``migrate_out`` sends the source actors' states
  straight to the destination in one message, and the switch routes the flows' next
  packets to the destination. A packet of a flow with no primary here that is not the
  flow's first (``seq`` > 1) belongs to a flow whose state is on its way: the runtime
  makes a *held* actor that keeps the packets. ``migrate_in`` installs the states,
  tells the switch, and replays the held packets in order. Either may come first (they
  come from different senders, and a receiver takes its senders' messages in turn).
  Each moved flow's replica then gets a snapshot, after the switch is told; when a flow
  moves onto its replica's runtime, the source keeps the state it sent as the new
  replica instead. If the source dies before the state arrives, ``handover`` has the
  flow's replica send its copy to the destination (``recover_in``), or ``promote`` makes
  the destination's own copy the primary.
* **Central** (OpenNF's southbound calls, the controller in ``controller.py``):
  ``enable_events`` makes the packets of the named flows *raise events* (sent to the
  controller, not processed) from then on, also once the state is gone; ``get_perflow``
  sends one ``chunk`` per flow (its state, removed here); ``put_perflow`` installs one
  chunk and acknowledges it (``put_ack``); ``disable_events`` stops raising and answers
  ``events_disabled`` after every event raised before it.

Messages from a runtime the switch declared dead are ignored. Run as
``python -m dl_nfv.nfv.actors.runtime CLUSTER NAME``.
"""

from __future__ import annotations

import gc
import os
import pickle
import threading
import time
from collections import defaultdict
from itertools import count
from operator import attrgetter

import zmq

from .batch import pack, unpack
from .chain import Chain, apply_delta, build_chain
from .cluster import ClusterSpec, load_cluster
from .wire import Endpoint

# Python's cyclic collector walks every flow's state again and again as the flows grow,
# and pauses whatever handler it lands in (a full pass of a big heap takes tens of ms,
# which a latency percentile or a migration then shows). Actors make no cycles: the
# processes run without the collector and collect once per load, before it starts.
AFTER_S = 0.001  # how long a runtime waits for a message before its deferred work
ORPHAN_CHECK_S = 0.5  # how often a runtime checks that its parent and switch are alive
# Messages about flows carry the session (one per load): a message of an earlier session
# that arrives late (another sender's, so not ordered with the load) is dropped.
SESSION_KINDS = frozenset({"deltas", "snapshot", "migrate_in", "recover_in", "acks",
                           "replicated", "promoted", "migrated", "chunk", "put_ack", "events",
                           "events_disabled"})


SEQ, STATES = attrgetter("seq"), attrgetter("states")


class FlowActor:
    """The state of one flow on one runtime, and what the actor still owes the switch."""

    __slots__ = ("flow", "seq", "states", "log", "replica", "held", "ahead", "backup")

    def __init__(self, flow: int, states: tuple, replica: str | None = None, seq: int = 0
                 ) -> None:
        self.flow = flow
        self.seq = seq
        self.states = states
        self.log: dict[int, tuple] = {}  # seq -> output not yet committed by the switch
        self.replica = replica
        self.held: list | None = None  # packets held while the state is on its way
        self.ahead: dict[int, tuple] = {}  # deltas (replica) or packets ahead of a gap
        self.backup: FlowActor | None = None  # held: this runtime's replica of the flow

    def trim(self, committed: int) -> None:
        if self.log and min(self.log) <= committed:
            self.log = {s: o for s, o in self.log.items() if s > committed}

    def snapshot(self) -> tuple:
        return (self.flow, self.seq, self.states, dict(self.log))


class Runtime:
    """The runtime's actors and its message handlers (one per message kind)."""

    def __init__(self, spec: ClusterSpec, name: str) -> None:
        self.spec = spec
        self.name = name
        self.addresses = {m.name: m.endpoint for m in (spec.switch, *spec.runtimes)}
        self.switch = spec.switch.endpoint
        self.endpoint = Endpoint(name, spec.member(name).endpoint)
        self.chain: Chain = build_chain({"chain": [{"nf": "flow-monitor"}]})
        self.primaries: dict[int, FlowActor] = {}
        self.replicas: dict[int, FlowActor] = {}
        self.dead: set[str] = set()
        self.raising: set[int] = set()  # flows whose packets raise events (central mode)
        self.processed = 0
        self.running = True
        self.loader: threading.Thread | None = None  # building the chain of a load
        self.built: list = []  # the chain it built
        self.session = 0
        self.last_ping = time.monotonic()
        # Batches built while handling one round of messages, sent at its end.
        self.deltas: dict[str, list] = defaultdict(list)
        self.snapshots: dict[str, list] = defaultdict(list)
        self.acks: list = []
        self.events: list = []
        # Work a handler leaves for after its messages are out: done once the process has
        # waited ``AFTER_S`` for the next message (the wait lets ZeroMQ's I/O thread send
        # meanwhile on a busy machine), and always before the next message is handled.
        self.after: list = []

    # The loop ------------------------------------------------------------------------
    def serve(self) -> None:
        parent = os.getppid()
        stop = threading.Event()
        beacon = threading.Thread(target=self.beacon, args=(stop,), daemon=True)
        beacon.start()
        next_check = time.monotonic() + ORPHAN_CHECK_S
        while self.running:
            messages = self.endpoint.receive(AFTER_S if self.after else 0.05, limit=16)
            self.settle()  # before the messages that came meanwhile, if any
            for kind, sender, payload in messages:
                if sender in self.dead:
                    continue
                if kind in SESSION_KINDS:
                    session, payload = payload
                    if session != self.session:
                        continue
                handler = getattr(self, f"on_{kind}", None)
                if handler is not None:
                    handler(sender, payload)
            self.flush()
            if self.loader is not None:
                self.loaded()
            now = time.monotonic()
            if now >= next_check:
                next_check = now + ORPHAN_CHECK_S
                silent_s = 20 * self.spec.heartbeat_timeout_ms / 1000
                if os.getppid() != parent or now - self.last_ping > max(silent_s, 10.0):
                    break  # the process that started us, or the switch, is gone
        stop.set()
        beacon.join()
        self.endpoint.close()

    def settle(self) -> None:
        """Do the work a handler left for after its messages went (``after``)."""
        for work in self.after:
            work()
        self.after.clear()

    def flush(self) -> None:
        # Snapshots before deltas: a delta made after a snapshot must not overtake it.
        for name, batch in self.snapshots.items():
            if batch:
                self.tell(self.addresses[name], "snapshot", batch)
        for name, batch in self.deltas.items():
            if batch:
                self.tell(self.addresses[name], "deltas", batch)
        if self.acks:
            self.tell(self.switch, "acks", self.acks)
        if self.events:
            self.tell(self.switch, "events", self.events)
        self.deltas.clear()
        self.snapshots.clear()
        self.acks, self.events = [], []

    # Control ---------------------------------------------------------------------------
    def on_ping(self, sender: str, payload) -> None:
        self.last_ping = time.monotonic()

    def beacon(self, stop: threading.Event) -> None:
        """Tell the switch this process is alive every heartbeat, from a thread of its own
        (its own socket), so that a long round of packet work does not silence it; a
        stopped or killed process sends nothing."""
        sock = self.endpoint.context.socket(zmq.PUSH)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(self.switch)
        interval = self.spec.heartbeat_ms / 1000
        try:
            while not stop.wait(interval):
                report = {"pid": os.getpid(), "primaries": len(self.primaries),
                          "replicas": len(self.replicas), "processed": self.processed}
                try:
                    sock.send(pickle.dumps(("pong", self.name, report)), zmq.NOBLOCK)
                except zmq.Again:
                    pass
        finally:
            sock.close(linger=0)

    def tell(self, address: str, kind: str, body) -> None:
        """Send a message about flows, marked with this session."""
        self.endpoint.send(address, kind, (self.session, body))

    def on_load(self, sender: str, payload: tuple) -> None:
        """Build the chain on a thread, so that the runtime keeps handling messages (a
        Maglev table takes longer than a heartbeat time-out); ``serve`` reports it loaded."""
        document, self.session = payload
        self.primaries.clear()
        self.replicas.clear()
        self.raising.clear()
        gc.collect()
        self.processed = 0
        self.built = built = []
        self.loader = threading.Thread(target=lambda: built.append(build_chain(document)),
                                       daemon=True)
        self.loader.start()

    def loaded(self) -> None:
        if not self.loader.is_alive():
            self.loader = None
            if self.built:
                self.chain = self.built.pop()
                self.endpoint.send(self.switch, "loaded", self.name)

    def on_dead(self, sender: str, name: str) -> None:
        self.dead.add(name)
        self.endpoint.forget(self.addresses[name])

    def on_alive(self, sender: str, name: str) -> None:
        """``name``, declared dead, was restarted and rejoins at this load: its messages
        count again; what was queued for the process it replaces is dropped."""
        self.dead.discard(name)
        self.endpoint.forget(self.addresses[name])

    def on_exit(self, sender: str, payload) -> None:
        self.running = False

    def on_dump(self, sender: str, payload) -> None:
        self.endpoint.send(self.switch, "dump", {
            "runtime": self.name,
            "flows": {f: (a.seq, a.states) for f, a in self.primaries.items()},
            "replicas": {f: a.seq for f, a in self.replicas.items()}})

    # Packets and replication -------------------------------------------------------------
    def on_packets(self, sender: str, batch: list) -> None:
        raising = self.raising
        for flow, seq, replica, committed, packet in batch:
            if raising and flow in raising:  # moving (central mode): the controller's
                self.events.append((flow, seq, packet))
                continue
            actor = self.primaries.get(flow)
            if actor is None:
                actor = self.primaries[flow] = FlowActor(flow, self.chain.initial(), replica)
                if seq > 1:  # not the flow's first packet: its state is migrating here
                    actor.held = []
                    actor.backup = self.replicas.pop(flow, None)
            if actor.held is not None:
                actor.held.append((seq, committed, packet))
            else:
                self.process(actor, seq, committed, packet)

    def process(self, actor: FlowActor, seq: int, committed: int, packet) -> None:
        """Run packet ``seq`` if it is the actor's next; an earlier one is a copy resent
        after a failover (already in the state), a later one waits in ``ahead`` until
        the packets before it come (resent: the actor was made from a copy that lags)."""
        if seq != actor.seq + 1:
            if seq > actor.seq:
                actor.ahead[seq] = (committed, packet)
            return
        self.run(actor, seq, committed, packet)
        while actor.ahead and (step := actor.ahead.pop(actor.seq + 1, None)) is not None:
            self.run(actor, actor.seq + 1, *step)

    def run(self, actor: FlowActor, seq: int, committed: int, packet) -> None:
        output, actor.states, delta = self.chain.process(actor.flow, actor.states, packet)
        actor.seq = seq
        actor.trim(committed)
        actor.log[seq] = output
        self.processed += 1
        if actor.replica is not None:
            self.deltas[actor.replica].append((actor.flow, seq, delta, output, committed))
        else:
            self.acks.append((actor.flow, seq, output))

    def on_deltas(self, sender: str, batch: list) -> None:
        for flow, seq, delta, output, committed in batch:
            actor = self.replicas.get(flow)
            if actor is None:
                if flow in self.primaries:
                    continue  # this runtime took the flow over; the old primary is stale
                actor = self.replicas[flow] = FlowActor(flow, self.chain.initial())
            if seq <= actor.seq:
                continue
            actor.ahead[seq] = (delta, output, committed)
            self.advance(actor)

    def advance(self, actor: FlowActor) -> None:
        """Apply the replica's deltas that now follow its ``seq`` without a gap."""
        while (step := actor.ahead.pop(actor.seq + 1, None)) is not None:
            delta, output, committed = step
            actor.seq += 1
            actor.states = apply_delta(actor.states, delta)
            actor.trim(committed)
            actor.log[actor.seq] = output
            self.acks.append((actor.flow, actor.seq, output))

    def on_snapshot(self, sender: str, batch: list) -> None:
        installed = []
        for flow, seq, states, log in batch:
            primary = self.primaries.get(flow)
            if primary is not None and primary.held is not None:
                continue  # an old primary's, overtaken by the flow's move to this runtime
            # (a primary not held is one this runtime is about to give away: its
            # ``migrate_out`` is queued behind other messages, and the flow's new
            # primary already counts on this runtime as the replica)
            actor = self.replicas.get(flow)
            if actor is None:
                actor = self.replicas[flow] = FlowActor(flow, states)
            if seq >= actor.seq:
                actor.seq, actor.states = seq, states
                actor.log.update(log)
                actor.ahead = {s: v for s, v in actor.ahead.items() if s > seq}
                self.acks.extend((flow, s, o) for s, o in sorted(log.items()))
                self.advance(actor)
            installed.append(flow)
        self.tell(self.switch, "replicated", installed)

    # Failover -------------------------------------------------------------------------
    def on_promote(self, sender: str, batch: list) -> None:
        for flow, replica, committed in batch:
            self.take_charge(flow, replica, committed)
        self.tell(self.switch, "promoted", [flow for flow, _, _ in batch])

    def on_rereplicate(self, sender: str, batch: list) -> None:
        for flow, replica, committed in batch:
            if flow in self.primaries:
                self.take_charge(flow, replica, committed)

    def take_charge(self, flow: int, replica: str | None, committed: int) -> None:
        """Make this runtime the flow's primary, with ``replica`` as its new replica, from
        what it holds: its primary (if that was held for a migrated state that will not
        come, its source having died, from this runtime's copy of the flow); else its
        replica; else a fresh actor (the state is lost). The new replica gets a snapshot;
        with none, the primary acknowledges what it logged."""
        self.raising.discard(flow)  # a central move that broke off: the flow is ours again
        actor = self.primaries.get(flow)
        held = []
        if actor is None:
            actor = self.replicas.pop(flow, None)
            if actor is None:  # lost: afresh, after what is out already
                actor = FlowActor(flow, self.chain.initial())
                actor.seq = committed
            self.primaries[flow] = actor
            actor.ahead = {}
        elif actor.held is not None:
            copy = actor.backup or self.replicas.pop(flow, None)
            held, actor.held, actor.backup = actor.held, None, None
            if copy is not None:
                actor.seq, actor.states, actor.log = copy.seq, copy.states, dict(copy.log)
            else:
                actor.seq = committed
        actor.replica = replica
        actor.trim(committed)
        for seq, committed_then, packet in held:
            self.process(actor, seq, committed_then, packet)
        if replica is not None:
            self.snapshots[replica].append(actor.snapshot())
        else:  # no runtime left to replicate to: what the replica owed, the primary sends
            self.acks.extend((flow, s, o) for s, o in sorted(actor.log.items()))

    def on_handover(self, sender: str, batch: list) -> None:
        """A migration's source died: send this runtime's copy of each flow (its replica)
        to the flow's destination, which installs it unless the source's state came."""
        copies = defaultdict(list)
        for flow, destination in batch:
            copy = self.replicas.get(flow)
            copies[destination].append(
                (flow, 0, self.chain.initial(), {}, self.name) if copy is None
                else (flow, copy.seq, copy.states, dict(copy.log), self.name))
        for destination, entries in copies.items():
            self.tell(self.addresses[destination], "recover_in", entries)

    def on_recover_in(self, sender: str, batch: list) -> None:
        """The replica's copies of flows whose source died mid-migration: installed where
        the source's state had not come, and every flow snapshotted to its replica (which
        may have missed the source's last deltas)."""
        self.tell(self.switch, "migrated", self.take_in(batch, sender))
        for flow, *_ in batch:
            actor = self.primaries.get(flow)
            if actor is not None and actor.held is None and actor.replica is not None:
                self.snapshots[actor.replica].append(actor.snapshot())

    # Migration ----------------------------------------------------------------------------
    def give_away(self, flows: list) -> list[tuple]:
        """The states of the primaries ``flows`` (``(flow, committed, replica)``) for a
        migration: ``(flow, seq, states, log, replica)``, the log trimmed to what the
        switch has not let out. An actor whose new replica is this runtime (the flow moves
        onto its replica's runtime) stays here as the replica: it holds the state sent."""
        given = []
        pop, name, replicas = self.primaries.pop, self.name, self.replicas
        for flow, committed, replica in flows:
            actor = pop(flow, None)
            if actor is None:
                continue
            log = actor.log
            if log:
                log = {s: o for s, o in log.items() if s > committed} if max(log) > committed \
                    else {}
            given.append((flow, actor.seq, actor.states, log, replica))
            if replica == name:
                actor.replica, actor.log = None, dict(log)
                replicas[flow] = actor
        return given

    def on_migrate_out(self, sender: str, payload) -> None:
        destination, flows, committed, replicas = payload
        packed, kept = self.export(flows, committed, replicas)
        self.tell(self.addresses[destination], "migrate_in", packed)
        self.after.append(lambda: self.keep(kept))  # the destination need not wait for it

    def export(self, flows: list, committed: list, replicas: list) -> tuple[tuple, list]:
        """``give_away`` for a whole batch, by column (``batch.py``): the primaries
        ``flows`` leave this runtime as one packed batch, with the switch's committed mark
        and the new replica of each; and the actors to ``keep`` as the replica (those
        whose new replica is this runtime), each with its log. Python work per flow: a
        dict pop and two attribute reads; only the logs holding outputs the switch has
        not let out are trimmed and sent."""
        pop = self.primaries.pop
        actors = [pop(flow, None) for flow in flows]
        if None in actors:  # no longer here (taken over elsewhere): not sent
            present = [i for i, actor in enumerate(actors) if actor is not None]
            flows, committed, replicas, actors = ([column[i] for i in present] for column in
                                                  (flows, committed, replicas, actors))
        seqs = list(map(SEQ, actors))
        logs = {}  # a log holds no seq past the actor's: only flows ahead of their mark
        for i in [i for i, seq, mark in zip(count(), seqs, committed) if seq > mark]:
            log = {s: o for s, o in actors[i].log.items() if s > committed[i]}
            if log:
                logs[i] = log
        kept = []
        if self.name in replicas:  # moved onto their replica's runtime: kept as the replica
            kept = [(actors[i], logs.get(i)) for i, replica in enumerate(replicas)
                    if replica == self.name]
        return pack(flows, seqs, list(map(STATES, actors)), logs, replicas), kept

    def keep(self, kept: list) -> None:
        """Keep the actors given away as the replicas of their flows (``export``)."""
        copies = self.replicas
        for actor, log in kept:
            actor.replica, actor.log = None, {} if log is None else dict(log)
            copies[actor.flow] = actor

    def on_migrate_in(self, sender: str, packed: tuple) -> None:
        installed, replaced = self.import_batch(packed, sender)
        self.tell(self.switch, "migrated", installed)
        self.after.append(replaced.clear)  # freed once the switch is told (and the
        # snapshots, sent in ``flush``, are out)

    def import_batch(self, packed: tuple, source: str) -> tuple[list[int], list]:
        """``take_in`` for a packed batch: the flows that arrived before their state (held
        actors here) are installed one by one; the others, usually all, in bulk: one
        ``FlowActor`` each, made in one ``map``, and one dict update. The flows
        installed, and the replica actors they replace here (freeing them touches each
        old state: the caller drops them once the switch is told)."""
        flows, seqs, states, logs, replicas = unpack(packed)
        primaries = self.primaries
        here = primaries.keys() & flows
        if here:  # some of the flows' packets came first
            rows = [(flow, seqs[i], states[i], logs.get(i, {}), replicas[i])
                    for i, flow in enumerate(flows) if flow in here]
            installed = self.take_in(rows, source)
            fresh = [i for i, flow in enumerate(flows) if flow not in here]
            flows, seqs, states, replicas = ([column[i] for i in fresh] for column in
                                             (flows, seqs, states, replicas))
            logs = {j: logs[i] for j, i in enumerate(fresh) if i in logs}
        else:
            installed = []
        actors = list(map(FlowActor, flows, states, replicas, seqs))
        for i, log in logs.items():
            actors[i].log = log
        copies = self.replicas
        replaced = [copies.pop(flow) for flow in copies.keys() & flows]  # held replicas
        primaries.update(zip(flows, actors))
        if replicas.count(source) == len(replicas):  # the source keeps the copies
            for i in logs:
                self.replicate_moved(actors[i], source)
        else:
            for actor in actors:
                self.replicate_moved(actor, source)
        return installed + flows, replaced

    def take_in(self, batch: list, source: str) -> list[int]:
        """Install migrated states ``(flow, seq, states, log, replica)`` from ``source``
        (in held actors, whose packets then run); the flows installed."""
        installed = []
        primaries, replicas = self.primaries, self.replicas
        for flow, seq, states, log, replica in batch:
            actor = primaries.get(flow)
            if actor is None:  # before any packet of the flow came here
                replicas.pop(flow, None)
                actor = primaries[flow] = FlowActor(flow, states, replica)
                actor.seq, actor.log = seq, log
                self.replicate_moved(actor, source)
            elif actor.held is not None:
                self.install(actor, seq, states, log, source)
            else:
                continue  # installed already
            installed.append(flow)
        return installed

    def install(self, actor: FlowActor, seq: int, states: tuple, log: dict, source: str
                ) -> None:
        """Install a migrated flow's state in its held actor and process the packets held
        meanwhile, in order."""
        held, actor.held, actor.backup = actor.held, None, None
        actor.seq, actor.states, actor.log = seq, states, log
        self.replicate_moved(actor, source)
        for seq, committed, packet in held:
            self.process(actor, seq, committed, packet)

    def replicate_moved(self, actor: FlowActor, source: str) -> None:
        """A moved flow's replica: on the source, it holds this very state, so the outputs
        logged are replicated and acknowledged here; elsewhere, it gets a snapshot, sent
        after the switch is told (so the migration's completion does not wait for it). An
        unchanged replica would apply the source's last deltas and then this runtime's,
        but a source that dies may never send the former."""
        if actor.replica is None:
            return
        if actor.replica == source:
            if actor.log:
                self.acks.extend((actor.flow, s, o) for s, o in sorted(actor.log.items()))
        else:
            self.snapshots[actor.replica].append(actor.snapshot())

    # Central mode: OpenNF's southbound calls, one message each --------------------------
    def on_enable_events(self, sender: str, flows: list) -> None:
        self.raising.update(flows)

    def on_get_perflow(self, sender: str, flows: list) -> None:
        for chunk in self.give_away(flows):
            self.tell(self.switch, "chunk", chunk)

    def on_put_perflow(self, sender: str, payload) -> None:
        chunk, source = payload
        self.take_in([chunk], source)
        self.tell(self.switch, "put_ack", chunk[0])

    def on_disable_events(self, sender: str, flows: list) -> None:
        """Stop raising events for ``flows``; the answer follows every event raised so far
        (one channel, in order), which is how the controller knows the source drained."""
        self.raising.difference_update(flows)
        if self.events:
            self.tell(self.switch, "events", self.events)
            self.events = []
        self.tell(self.switch, "events_disabled", flows)


def main(argv: list[str]) -> int:
    cluster_path, name = argv
    gc.disable()  # see the comment at the top
    from . import l4  # noqa: F401  (imported before joining, not while heartbeats run)
    runtime = Runtime(load_cluster(cluster_path), name)
    runtime.serve()
    return 0


if __name__ == "__main__":
    from .wire import exit_with

    exit_with(main)
