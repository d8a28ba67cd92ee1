"""NFVactor's flow switch: maps flows to runtimes, commits outputs, detects failures.

The switch classifies each packet into its flow (both directions one flow), gives it
the flow's next sequence number, keeps it until its output is acknowledged (the
*un-acked buffer*) and forwards it to the flow's primary runtime, naming the replica.
Acknowledgements come from the replica once it has applied the packet's state delta
(output commit); the switch lets outputs out strictly in sequence per flow and drops
duplicates, so every packet leaves exactly once and in order.

Heartbeats: every runtime sends the switch a beacon each ``heartbeat_ms`` from a thread
of its own (so a long round of packet work does not silence it), and the switch pings
every runtime as often (so runtimes notice a dead switch and exit). A runtime that has
been heard once and then stays silent for ``heartbeat_timeout_ms`` is declared dead;
silence is counted only while the switch itself runs (a switch that was descheduled
does not declare every runtime dead on waking). From
then on its messages are ignored (here and, once told, at every runtime). Each of its
flows' replicas is promoted to primary with a new replica on another runtime, and the
flow's un-acked packets are resent to it in order; each flow it replicated gets a new
replica, made from a snapshot of the primary. The switch records the detection time
(silence until declaration) and the takeover time (declaration until every affected
flow has committed what was outstanding and every new replica is installed).

Migration of N flows from one runtime to another: ``actor`` mode (NFVactor; ``runtime.py``
says what each runtime does) and ``central`` mode (OpenNF's controller, run here:
``controller.py``). Run as ``python -m dl_nfv.nfv.actors.switch CLUSTER``.
"""

from __future__ import annotations

import gc
import os
import time
from collections import defaultdict
from functools import partial
from itertools import compress, islice, repeat
from operator import attrgetter, eq

from .chain import flow_key
from .cluster import ClusterSpec, load_cluster
from .controller import BUFFERED, NORMAL, CentralController
from .runtime import SESSION_KINDS
from .wire import Endpoint

LOAD_SLACK = 10  # heartbeat time-outs of silence that declare a runtime dead during a load


class Flow:
    """The switch's view of one flow."""

    __slots__ = ("id", "primary", "replica", "next_seq", "committed", "unacked", "acked",
                 "mode", "buffer")

    def __init__(self, flow_id: int, primary: str, replica: str | None) -> None:
        self.id = flow_id
        self.primary = primary
        self.replica = replica
        self.next_seq = 1
        self.committed = 0
        self.unacked: dict[int, tuple] = {}  # seq -> packet, until its output is let out
        self.acked: dict[int, tuple] = {}  # seq -> output acknowledged ahead of a gap
        self.mode = NORMAL
        self.buffer: dict[int, tuple] = {}  # seq -> packet held by the controller


ID, PRIMARY, REPLICA, COMMITTED = (attrgetter(name) for name in
                                   ("id", "primary", "replica", "committed"))


class RuntimeView:
    """What the switch knows of one runtime."""

    __slots__ = ("name", "address", "joined", "live", "last_heard", "pid", "report",
                 "declared_at", "standby")

    def __init__(self, name: str, address: str) -> None:
        self.name, self.address = name, address
        self.joined = self.live = False
        self.standby = False  # restarted after it was declared dead: live at the next load
        self.last_heard = 0.0
        self.pid = 0
        self.report: dict = {}
        self.declared_at = 0.0


class Migration:
    __slots__ = ("reply", "mode", "source", "destination", "waiting", "started", "flows",
                 "imported", "replicas", "forwarded", "failed", "orphaned")

    def __init__(self, reply, mode, source, destination, flows: list[int], started: float
                 ) -> None:
        self.reply, self.mode = reply, mode
        self.source, self.destination = source, destination
        self.flows = flows
        self.waiting = set(self.flows)
        self.imported: set[int] = set()  # central mode: flows whose put is acknowledged
        self.replicas: dict[int, str | None] = {}  # each flow's replica before the move
        self.forwarded: set[int] = set()  # central mode: flows whose state was put
        self.failed = ""  # why the migration did not complete, if it did not
        self.orphaned: set[int] = set()  # flows whose replica died meanwhile
        self.started = started


class Switch(CentralController):
    def __init__(self, spec: ClusterSpec) -> None:
        self.spec = spec
        self.endpoint = Endpoint(spec.switch.name, spec.switch.endpoint)
        self.runtimes = {r.name: RuntimeView(r.name, r.endpoint) for r in spec.runtimes}
        self.order = [r.name for r in spec.runtimes]
        self.replication = spec.replication
        self.running = True
        self.reset()
        self.events: list[dict] = []
        self.recoveries: list[dict] = []  # takeovers still in progress
        self.migrations: dict[int, Migration] = {}  # flow id -> its migration
        self.pending: dict[str, list] = defaultdict(list)  # runtime -> packets to forward
        self.outputs: list = []
        self.sink: str | None = None
        self.loading: dict | None = None
        self.dumping: dict | None = None
        self.next_primary = 0
        self.session = 0

    def reset(self) -> None:
        self.flows: dict[tuple, Flow] = {}
        self.by_id: list[Flow] = []
        self.lost_flows = 0

    # The loop --------------------------------------------------------------------------
    def serve(self) -> None:
        parent = os.getppid()
        interval = self.spec.heartbeat_ms / 1000
        next_ping = 0.0
        last_round = time.monotonic()
        while self.running:
            for kind, sender, payload in self.endpoint.receive(min(interval, 0.01), limit=64):
                view = self.runtimes.get(sender)
                if view is not None and view.joined and not view.live and kind != "pong":
                    continue  # declared dead: fenced off (``on_pong`` takes a restart)
                if kind in SESSION_KINDS:
                    session, payload = payload
                    if session != self.session:
                        continue  # about flows of an earlier load
                handler = getattr(self, f"on_{kind}", None)
                if handler is not None:
                    handler(sender, payload)
            now = time.monotonic()
            if now - last_round > 2 * interval:
                # The switch itself did not run (descheduled, or a long round): silence
                # counts only while the switch listens, or it would declare every runtime
                # dead at once after its own pause.
                for view in self.runtimes.values():
                    view.last_heard += now - last_round - interval
            last_round = now
            if now >= next_ping:
                next_ping = now + interval
                for view in self.runtimes.values():
                    if view.live or view.standby or not view.joined:
                        self.endpoint.send(view.address, "ping", now)
                if os.getppid() != parent:
                    self.on_stop("", None)
            # A runtime building a chain may miss heartbeats: while a load is under way,
            # silence counts only past LOAD_SLACK timeouts (a runtime killed meanwhile
            # must not hold the load up for ever).
            self.check_heartbeats(now, 1 if self.loading is None else LOAD_SLACK)
            self.flush()
        self.endpoint.close()

    def flush(self) -> None:
        for name, batch in self.pending.items():
            if batch:
                self.endpoint.send(self.runtimes[name].address, "packets", batch)
        self.pending.clear()
        if self.outputs and self.sink is not None:
            self.endpoint.send(self.sink, "outputs", self.outputs)
        self.outputs = []

    def live(self) -> list[str]:
        return [n for n in self.order if self.runtimes[n].live]

    def replica_for(self, primary: str) -> str | None:
        """The next live runtime after ``primary`` in the cluster's order, if replicating."""
        if not self.replication:
            return None
        live = self.live()
        if primary not in self.order:
            return None
        start = self.order.index(primary)
        for step in range(1, len(self.order)):
            name = self.order[(start + step) % len(self.order)]
            if name in live:
                return name
        return None

    # Clients -------------------------------------------------------------------------
    def on_hello(self, sender: str, reply: str) -> None:
        self.endpoint.send(reply, "hello", self.status())

    def on_status(self, sender: str, reply: str) -> None:
        self.endpoint.send(reply, "status", self.status())

    def on_stop(self, sender: str, reply) -> None:
        for view in self.runtimes.values():
            self.endpoint.send(view.address, "exit")
        if reply:
            self.endpoint.send(reply, "stopped")
        self.running = False

    def on_load(self, sender: str, payload) -> None:
        reply, document, replication = payload
        self.reset()
        gc.collect()
        self.replication = self.spec.replication if replication is None else replication
        self.sink = reply
        self.rejoin()
        live = self.live()
        self.loading = {"reply": reply, "waiting": set(live)}
        self.session += 1
        for name in live:
            self.endpoint.send(self.runtimes[name].address, "load", (document, self.session))

    def on_loaded(self, sender: str, name: str) -> None:
        self.on_pong(sender, {**self.runtimes[sender].report, "pid": self.runtimes[sender].pid})
        if self.loading is not None:
            self.loading["waiting"].discard(name)
            if not self.loading["waiting"]:
                self.endpoint.send(self.loading["reply"], "loaded", self.live())
                self.loading = None

    def on_dump(self, sender: str, payload) -> None:
        if sender not in self.runtimes:  # a client asks
            live = self.live()
            self.dumping = {"reply": payload, "waiting": set(live), "flows": {},
                            "replicas": {}}
            for name in live:
                self.endpoint.send(self.runtimes[name].address, "dump")
            return
        if self.dumping is None:
            return
        self.dumping["flows"].update(payload["flows"])
        for flow, seq in payload["replicas"].items():
            self.dumping["replicas"].setdefault(flow, []).append((payload["runtime"], seq))
        self.dumping["waiting"].discard(sender)
        if not self.dumping["waiting"]:
            self.endpoint.send(self.dumping["reply"], "dump", {
                "flows": self.dumping["flows"], "replicas": self.dumping["replicas"],
                "status": self.status()})
            self.dumping = None

    # Packets and outputs ------------------------------------------------------------------
    def on_packets(self, sender: str, packets: list) -> None:
        for packet in packets:
            key = flow_key(packet)
            flow = self.flows.get(key)
            if flow is None:
                live = self.live()
                if not live:
                    continue  # no runtime left to run the flow: the packet is not routed
                primary = live[self.next_primary % len(live)]
                self.next_primary += 1
                flow = self.flows[key] = Flow(len(self.by_id), primary,
                                              self.replica_for(primary))
                self.by_id.append(flow)
            seq = flow.next_seq
            flow.next_seq += 1
            flow.unacked[seq] = packet
            if flow.mode == BUFFERED:
                flow.buffer[seq] = packet
            else:
                self.pending[flow.primary].append((flow.id, seq, flow.replica, flow.committed,
                                                   packet))

    def on_acks(self, sender: str, acks: list) -> None:
        for flow_id, seq, output in acks:
            if flow_id >= len(self.by_id):
                continue  # from before the last load
            flow = self.by_id[flow_id]
            if seq <= flow.committed:
                continue
            flow.acked[seq] = output
            while (output := flow.acked.pop(flow.committed + 1, None)) is not None:
                flow.committed += 1
                flow.unacked.pop(flow.committed, None)
                self.outputs.append(output)
        if self.recoveries:
            self.progress_recoveries()

    # Failures ------------------------------------------------------------------------------
    def on_pong(self, sender: str, report: dict) -> None:
        view = self.runtimes.get(sender)
        if view is None:
            return
        if view.joined and not view.live:
            if report["pid"] == view.pid or any(r["event"]["runtime"] == sender
                                                for r in self.recoveries):
                return  # the process declared dead, or its takeover is not over
            # A new process under the name (restarted): it holds nothing, and waits for
            # the next load; what was queued for the one it replaces is dropped.
            self.endpoint.forget(view.address)
            view.standby = True
            view.last_heard = time.monotonic()
            view.pid, view.report = report["pid"], report
            return
        view.joined = view.live = True
        view.last_heard = time.monotonic()
        view.pid, view.report = report["pid"], report

    def rejoin(self) -> None:
        """Make the restarted runtimes live (a load starts a new session, so nothing sent
        to or by the processes they replace counts any more); every runtime is told."""
        back = [view for view in self.runtimes.values() if view.standby]
        for view in back:
            view.standby, view.live = False, True
            for name in self.live():
                if name != view.name:
                    self.endpoint.send(self.runtimes[name].address, "alive", view.name)
            for dead in self.runtimes.values():
                if dead.joined and not dead.live:
                    self.endpoint.send(view.address, "dead", dead.name)

    def check_heartbeats(self, now: float, slack: float = 1) -> None:
        timeout_s = slack * self.spec.heartbeat_timeout_ms / 1000
        for view in self.runtimes.values():
            if view.live and now - view.last_heard > timeout_s:
                self.declare_dead(view, now)
            elif view.standby and now - view.last_heard > timeout_s:
                view.standby = False  # the restarted process is gone too

    def declare_dead(self, view: RuntimeView, now: float) -> None:
        """Fence ``view`` off and hand its flows to their replicas (module docstring)."""
        view.live = False
        view.declared_at = now
        dead = view.name
        self.pending.pop(dead, None)
        self.flush()  # packets routed so far go before the commands below, on each channel
        self.endpoint.send(view.address, "exit")
        if self.dumping is not None:
            self.dumping["waiting"].discard(dead)
        if self.loading is not None:  # the load goes on without it
            self.loading["waiting"].discard(dead)
            if not self.loading["waiting"]:
                self.endpoint.send(self.loading["reply"], "loaded", self.live())
                self.loading = None
        for name in self.live():
            self.endpoint.send(self.runtimes[name].address, "dead", dead)
        handover = self.break_migrations(dead)
        promote, rereplicate = defaultdict(list), defaultdict(list)
        outstanding, replicas = {}, set()
        for flow in self.by_id:
            if flow.replica == dead and flow.primary != dead and flow.id in self.migrations:
                # Its migration (between two live runtimes) is under way: the destination
                # may not hold the state yet. It gets a new replica once it does.
                self.migrations[flow.id].orphaned.add(flow.id)
                replicas.add(flow.id)
                continue
            if flow.primary == dead:
                if flow.replica is not None and self.runtimes[flow.replica].live:
                    flow.primary = flow.replica
                elif not self.live():
                    break  # no runtime left: nothing to hand the flows to
                else:  # primary and replica both gone (or none): the state is lost
                    self.lost_flows += 1
                    live = self.live()
                    flow.primary = live[flow.id % len(live)]
                flow.replica = self.replica_for(flow.primary)
                promote[flow.primary].append((flow.id, flow.replica, flow.committed))
            elif flow.replica == dead:
                flow.replica = self.replica_for(flow.primary)
                rereplicate[flow.primary].append((flow.id, flow.replica, flow.committed))
            else:
                continue
            if flow.unacked:
                outstanding[flow.id] = max(flow.unacked)
            if flow.replica is not None:
                replicas.add(flow.id)
        for name, batch in handover.items():
            self.endpoint.send(self.runtimes[name].address, "handover", batch)
            for flow_id, destination in batch:
                flow = self.by_id[flow_id]
                self.pending[destination].extend(
                    (flow_id, seq, flow.replica, flow.committed, packet)
                    for seq, packet in sorted(flow.unacked.items()))
                if flow.unacked:
                    outstanding[flow_id] = max(flow.unacked)
                replicas.add(flow_id)
        for name, batch in promote.items():
            self.endpoint.send(self.runtimes[name].address, "promote", batch)
        for name, batch in rereplicate.items():
            self.endpoint.send(self.runtimes[name].address, "rereplicate", batch)
        # Resend what was not acknowledged, in order: a new primary (or one made from a
        # copy that lags) needs it; a primary that has it skips it.
        for name, batch in (*promote.items(), *rereplicate.items()):
            for flow_id, replica, committed in batch:
                flow = self.by_id[flow_id]
                if flow.mode == NORMAL:
                    self.pending[name].extend((flow_id, seq, replica, committed, packet)
                                              for seq, packet in sorted(flow.unacked.items()))
        event = {"runtime": dead, "detection_ms": (now - view.last_heard) * 1000,
                 "declared_at": now, "promoted": sum(map(len, promote.values())),
                 "rereplicated": sum(map(len, rereplicate.values())), "takeover_ms": None,
                 "lost_flows": self.lost_flows}
        self.events.append(event)
        self.recoveries.append({"event": event, "outstanding": outstanding,
                                "replicas": replicas})
        self.progress_recoveries()

    def break_migrations(self, dead: str) -> dict[str, list]:
        """Settle every flow of an unconfirmed migration from or to ``dead``, so that no
        packet waits for a state that will not come; the migration reports that it failed.
        The flows whose state is elsewhere are marked for ``declare_dead``'s loop (their
        primary set to ``dead``, their replica to the runtime holding a copy); returns the
        *handovers*: flows whose source died, by the live replica that holds their copy,
        which sends it to the destination (the destination stays the primary)."""
        handover: dict[str, list] = defaultdict(list)
        for flow_id, migration in list(self.migrations.items()):
            if dead not in (migration.source, migration.destination):
                continue
            flow = self.by_id[flow_id]
            holder = migration.replicas[flow_id]  # its replica before the move
            holder_live = holder is not None and self.runtimes[holder].live
            if migration.mode == "central":
                self.break_central(migration, flow, dead, holder)
            elif dead == migration.source:
                if holder_live and holder != migration.destination:
                    handover[holder].append((flow_id, migration.destination))
                else:  # the destination's own copy (a replica, or none: the state is lost)
                    self.lost_flows += 0 if holder_live else 1
                    flow.primary, flow.replica = dead, migration.destination
            # (destination dead, actor mode: the flow's primary is already ``dead``)
            self.migrations.pop(flow_id)
            migration.waiting.discard(flow_id)
            migration.failed = (f"runtime {dead!r} died during the migration; its flows were "
                                f"taken over by the runtimes holding their state")
            if not migration.waiting:
                self.report_migration(migration)
        return handover

    def on_replicated(self, sender: str, flows: list) -> None:
        for recovery in self.recoveries:
            recovery["replicas"].difference_update(flows)
        self.progress_recoveries()

    def on_promoted(self, sender: str, flows: list) -> None:
        pass

    def progress_recoveries(self) -> None:
        done = []
        for recovery in self.recoveries:
            outstanding = recovery["outstanding"]
            for flow_id in [f for f, seq in outstanding.items()
                            if self.by_id[f].committed >= seq]:
                del outstanding[flow_id]
            if not outstanding and not recovery["replicas"]:
                event = recovery["event"]
                event["takeover_ms"] = (time.monotonic() - event["declared_at"]) * 1000
                done.append(recovery)
                # Drop what is still queued for the dead process ("exit" included), so
                # that a process restarted under its name does not receive it.
                self.endpoint.forget(self.runtimes[event["runtime"]].address)
        for recovery in done:
            self.recoveries.remove(recovery)

    # Migration -------------------------------------------------------------------------------
    def on_migrate(self, sender: str, payload: dict) -> None:
        reply, source, destination = payload["reply"], payload["source"], payload["destination"]
        problem = None
        for name in (source, destination):
            if name not in self.runtimes:
                problem = f"no runtime {name!r} in the cluster"
            elif not self.runtimes[name].live:
                problem = (f"runtime {name!r} is not live (live: "
                           f"{', '.join(self.live()) or 'none'})")
        if problem is None and source == destination:
            problem = f"the flows are on {source!r} already: migrate them to another runtime"
        on_source = compress(self.by_id, map(partial(eq, source), map(PRIMARY, self.by_id)))
        movable = (f for f in on_source if f.mode == NORMAL and f.id not in self.migrations)
        flows = list(islice(movable, payload["flows"]))
        if problem is None and len(flows) < payload["flows"]:
            problem = (f"runtime {source!r} holds {len(flows)} flows that can move, "
                       f"fewer than the {payload['flows']} asked for")
        if problem is not None:
            self.endpoint.send(reply, "migrate_error", problem)
            return
        started = time.perf_counter()  # both modes are timed from here
        self.flush()  # packets routed to the source so far go before the command
        # A flow moved onto its replica's runtime gets the source as its replica, which
        # keeps the state it sends as the replica's copy.
        ids, before = list(map(ID, flows)), list(map(REPLICA, flows))
        replicas = [source if replica == destination else replica for replica in before]
        marks = list(map(COMMITTED, flows))
        if payload["mode"] == "actor":
            # One message for all the flows, by column: ids, committed marks, replicas;
            # sent before the switch's own bookkeeping below, which the source need not
            # wait for (nothing else runs here in between).
            self.endpoint.send(self.runtimes[source].address, "migrate_out",
                               (destination, ids, marks, replicas))
        migration = Migration(reply, payload["mode"], source, destination, ids, started)
        migration.replicas = dict(zip(ids, before))
        self.migrations.update(zip(migration.flows, repeat(migration)))
        if source in replicas:
            for flow, replica in zip(flows, replicas):
                flow.replica = replica
        if payload["mode"] == "central":
            self.start_central(migration, flows, list(zip(ids, marks, replicas)))
            return
        for flow in flows:  # the flows' next packets go to the destination, which holds them
            flow.primary = destination

    def on_migrated(self, sender: str, flows: list) -> None:
        """The destination runs ``flows``: settled per migration, not per flow."""
        found = list(map(self.migrations.pop, flows, repeat(None)))
        for migration in set(found) - {None}:
            self.settle(migration, [f for f, m in zip(flows, found) if m is migration])

    def finish_migration(self, flow_id: int) -> None:
        migration = self.migrations.pop(flow_id, None)
        if migration is not None:
            self.settle(migration, [flow_id])

    def settle(self, migration: Migration, flows: list) -> None:
        """``flows`` of ``migration`` (no longer in ``self.migrations``) are done."""
        migration.waiting.difference_update(flows)
        for flow_id in migration.orphaned.intersection(flows):
            # Its replica died meanwhile: make a new one.
            flow = self.by_id[flow_id]
            flow.replica = self.replica_for(flow.primary)
            self.endpoint.send(self.runtimes[flow.primary].address, "rereplicate",
                               [(flow_id, flow.replica, flow.committed)])
        if not migration.waiting:
            self.report_migration(migration)

    def report_migration(self, migration: Migration) -> None:
        self.flush()
        ms = (time.perf_counter() - migration.started) * 1000
        result = {"mode": migration.mode, "source": migration.source,
                  "destination": migration.destination, "flows": len(migration.flows),
                  "completion_ms": ms}
        if migration.failed:
            result["failed"] = migration.failed
        self.events.append({"migration": result})
        self.endpoint.send(migration.reply, "migrated", result)

    # Status ------------------------------------------------------------------------------------
    def status(self) -> dict:
        now = time.monotonic()
        primaries, replicas, lag = defaultdict(int), defaultdict(int), defaultdict(int)
        for flow in self.by_id:
            primaries[flow.primary] += 1
            if flow.replica is not None:
                replicas[flow.replica] += 1
            lag[flow.primary] += len(flow.unacked)
        runtimes = {}
        for name, view in self.runtimes.items():
            runtimes[name] = {
                "address": view.address, "joined": view.joined, "live": view.live,
                "standby": view.standby,
                "pid": view.pid, "flows": primaries[name], "replicas": replicas[name],
                "unacked_packets": lag[name],
                "silent_ms": round((now - view.last_heard) * 1000, 1) if view.joined else None,
                "processed": view.report.get("processed", 0)}
        return {"switch": self.spec.switch.name, "switch_pid": os.getpid(),
                "replication": self.replication, "flows": len(self.by_id),
                "lost_flows": self.lost_flows, "runtimes": runtimes,
                "events": [dict(e) for e in self.events]}


def main(argv: list[str]) -> int:
    gc.disable()  # collected once per load instead (runtime.py says why)
    switch = Switch(load_cluster(argv[0]))
    switch.serve()
    return 0


if __name__ == "__main__":
    from .wire import exit_with

    exit_with(main)
