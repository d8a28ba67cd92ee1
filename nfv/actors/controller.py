"""The baseline of NFVactor's migration: OpenNF's controller, moving flows centrally.

OpenNF (SIGCOMM 2014) moves flows through a controller that calls the NFs' southbound
API; its *loss-free, order-preserving move*, re-created step for step, each step one
message over the same messaging layer as the actor mode (``wire.py``):

1. ``enable_events`` (controller to source; OpenNF's ``enableEvents(filter, drop)``):
   from then on the source raises every packet of the flows to the controller as an
   event instead of processing it (``events``, batched per round of the source like
   every other message), and the controller buffers the packets.
2. ``get_perflow`` (controller to source; ``getPerflow``): the source answers with one
   ``chunk`` per flow, the flow's state, and deletes it (``delPerflow``).
3. ``put_perflow`` (controller to destination; ``putPerflow``), one per chunk, sent as
   each chunk comes (OpenNF's parallelised get and put), each acknowledged by the
   destination (``put_ack``).
4. Once every put is acknowledged, the two-phase forwarding update: first the flows'
   packets are routed to the controller (which buffers them) instead of the source,
   and ``disable_events`` (controller to source) drains the source: its answer,
   ``events_disabled``, comes after every event the source raised (one channel, in
   order), so no packet is in flight to or from it any more.
5. The controller releases the buffered packets to the destination in order, then
   routes the flows there: the move is complete.

The controller runs in the switch process, so its updates of the switch's routing are
local calls and not OpenFlow messages: OpenNF's controller-to-switch round trips are
not counted against it. ``enable_events`` and ``get_perflow`` are sent back to back
without waiting for an answer (the source takes them in order).

If the source dies mid-move, the flows whose state was put go on at the destination
(every packet not acknowledged is resent; the destination skips what its state has
seen); the others, and every flow when the destination dies, are taken over by the
runtime holding their copy, as any failure's.
"""

from __future__ import annotations

NORMAL, BUFFERED = 0, 1  # a flow's routing: to its primary, or held by the controller


class CentralController:
    """The central mode's handlers; mixed into ``switch.Switch``, whose flows, runtimes,
    migrations and outgoing batches it uses."""

    def start_central(self, migration, flows: list, given: list) -> None:
        """Steps 1 and 2 for ``flows`` (``given``: what ``get_perflow`` names)."""
        source = self.runtimes[migration.source].address
        self.endpoint.send(source, "enable_events", [flow.id for flow in flows])
        self.endpoint.send(source, "get_perflow", given)

    def on_events(self, sender: str, events: list) -> None:
        """Packets the source raised: buffered while the flow's move is under way (once it
        is over or broken off, the switch has resent them from its un-acked buffer)."""
        for flow_id, seq, packet in events:
            migration = self.migrations.get(flow_id)
            if migration is not None and migration.mode == "central" \
                    and sender == migration.source:
                self.by_id[flow_id].buffer[seq] = packet

    def on_chunk(self, sender: str, chunk: tuple) -> None:
        """Step 3: one flow's state, put at the destination."""
        migration = self.migrations.get(chunk[0])
        if migration is None:
            return
        migration.forwarded.add(chunk[0])
        self.endpoint.send(self.runtimes[migration.destination].address, "put_perflow",
                           (chunk, migration.source))

    def on_put_ack(self, sender: str, flow_id: int) -> None:
        """Step 4 once every put is acknowledged."""
        migration = self.migrations.get(flow_id)
        if migration is None or flow_id not in migration.waiting:
            return
        migration.imported.add(flow_id)
        if len(migration.imported) < len(migration.flows):
            return
        for moved in migration.flows:
            self.by_id[moved].mode = BUFFERED
        self.flush()  # what was routed to the source before goes ahead of the drain
        self.endpoint.send(self.runtimes[migration.source].address, "disable_events",
                           migration.flows)

    def on_events_disabled(self, sender: str, flows: list) -> None:
        """Step 5: the source is drained; release and re-route."""
        migration = self.migrations.get(flows[0]) if flows else None
        if migration is None or sender != migration.source \
                or len(migration.imported) < len(migration.flows):
            return
        for moved in migration.flows:
            flow = self.by_id[moved]
            flow.primary, flow.mode = migration.destination, NORMAL
            self.release(flow)
            self.finish_migration(moved)

    def release(self, flow) -> None:
        """Send the flow's buffered packets (not acknowledged yet) to its primary, in order."""
        self.pending[flow.primary].extend(
            (flow.id, seq, flow.replica, flow.committed, packet)
            for seq, packet in sorted(flow.buffer.items()) if seq in flow.unacked)
        flow.buffer = {}

    def break_central(self, migration, flow, dead: str, holder: str | None) -> None:
        """Settle ``flow``, moving centrally, when ``dead`` (its source or destination)
        died (see the module docstring); marks it for ``declare_dead`` as
        ``Switch.break_migrations`` says."""
        flow.mode, flow.buffer = NORMAL, {}
        if dead == migration.source and flow.id in migration.forwarded:
            # Put at the destination before anything else on that channel. Events the
            # source raised died with it: every packet not acknowledged goes again.
            flow.primary = migration.destination
            self.pending[flow.primary].extend(
                (flow.id, seq, flow.replica, flow.committed, packet)
                for seq, packet in sorted(flow.unacked.items()))
            return
        flow.primary = dead  # taken over where the copy is: the replica, or the source's
        if dead == migration.source:
            flow.replica = holder
        else:  # the source lives: it stops raising the flow's packets
            self.endpoint.send(self.runtimes[migration.source].address, "disable_events",
                               [flow.id])
