"""The L3/L4 chain of ``nfv/chains`` (firewall, NAT, Maglev LB, monitor, rate limiter)
run in flow actors, through its per-packet reference NFs as they are.

Each reference NF keeps its per-flow state in a dict ``flows`` keyed by the flow key and
processes one packet at a time (``nfv/chains/reference.py``). A flow actor owns its
flow's entries instead: before a packet, ``L4Chain`` puts the actor's entry (a tuple, or
none) into the NF's dict under the flow's key, calls ``process``, and takes the entry
back out as the flow's new state, so every NF object holds nothing between packets and
the state exported, replicated and migrated is exactly the NF's own per-flow record.

What cannot be per flow, and what this runtime does instead:

* **NAT's port pool** is shared by every flow (first come, first served over the whole
  trace), which no per-flow actor can reproduce without a global sequencer. In actors, a
  session takes the binding ``pool[flow_hash(key) % len(pool)]`` (Maglev's flow hash):
  deterministic, so failover and migration never change it, but two live sessions can
  share a binding (more likely as the pool fills), and the bindings differ from
  ``dl-nfv nfv chain``'s. Released bindings return to no pool.
* **Sweeps** (idle flows removed at batch boundaries) do not run: each NF already treats
  an entry idle past its time-out as absent when the flow's next packet comes, so the
  verdicts are those of a run without sweeps; idle entries stay in the actors' state.
* The NFs' cross-flow statistics (NAT translations, flows per LB backend) are not kept.

Only IPv4 packets are chained (as in ``nfv/chains``); others are dropped by ``ipv4``.
"""

from __future__ import annotations

from collections import deque

from dl_nfv.artifacts.errors import InvalidArtifact
from dl_nfv.artifacts.nfconfig import L4NfSpec
from dl_nfv.artifacts.records import from_data
from dl_nfv.nfv.chains.packets import flow_hash, key_pair
from dl_nfv.nfv.chains.reference import REFERENCE, NatRef, Pkt
from dl_nfv.nfv.chains.states import DROP_REASONS, Verdict

from .chain import ActorPacket, Output


class L4Chain:
    """An ``l4_chain`` as a flow actor's chain (same interface as ``chain.Chain``)."""

    def __init__(self, specs: list[dict], where: str = "l4_chain") -> None:
        self.nfs = []
        for index, raw in enumerate(specs):
            try:
                spec = from_data(L4NfSpec, raw, where=f"l4_chain[{index}]")
            except InvalidArtifact as exc:
                raise exc.at(file=where) from None
            self.nfs.append(REFERENCE[spec.nf.value](spec))
        self.names = [type(nf).__name__ for nf in self.nfs]
        self.kinds = [str(raw["nf"]) for raw in specs]

    def initial(self) -> tuple:
        return (None,) * len(self.nfs)

    def process(self, flow: int, states: tuple, packet: ActorPacket
                ) -> tuple[Output, tuple, tuple]:
        """(output, new states, delta) of ``packet``; ``chain.Chain.process`` says more."""
        if len(packet.src) != 4:
            return Output(packet.id, flow, "ipv4", ()), states, ()
        src, dst = int.from_bytes(packet.src, "big"), int.from_bytes(packet.dst, "big")
        k1, k2, direction = key_pair(src, packet.sport, dst, packet.dport, packet.proto)
        key = (k1, k2)
        p = Pkt(packet.ts_us, src, dst, packet.sport, packet.dport, packet.proto, packet.flags,
                packet.wire_bytes, key, direction)
        new, delta = list(states), []
        dropped_by = ""
        for position, (kind, nf) in enumerate(zip(self.kinds, self.nfs)):
            verdict = self._step(nf, states[position], p, key)
            entry = nf.flows.pop(key, None)
            entry = None if entry is None else tuple(entry)
            if entry != states[position]:
                new[position] = entry
                delta.append((position, entry))
            if verdict != Verdict.PASS:
                dropped_by = f"{kind}:{DROP_REASONS[int(verdict)]}"
                break
        headers = () if dropped_by else (p.src.to_bytes(4, "big"), p.sport,
                                         p.dst.to_bytes(4, "big"), p.dport)
        return Output(packet.id, flow, dropped_by, headers), tuple(new), tuple(delta)

    @staticmethod
    def _step(nf, entry, p: Pkt, key: tuple) -> Verdict:
        if entry is not None:
            nf.flows[key] = list(entry)
        if isinstance(nf, NatRef):  # the flow's own binding (module docstring)
            nf.free = deque([flow_hash(*key) % len(nf.bindings)])
            verdict = nf.process(p)
            nf.free.clear()
            nf.pending.clear()
            return verdict
        return nf.process(p)
