"""Many flows' states as one message: the payload of an actor-mode migration.

An actor-mode migration moves N flows' ``(flow, seq, states, log, replica)`` from one
runtime to another in one message, laid out by column rather than as N records:

* the flow ids, the sequence numbers and the states: one list each;
* the output logs: only the non-empty ones, by position in the batch (an idle flow's
  log is empty once the switch has let its outputs out);
* the replicas: the most common one once, and the flows whose replica differs.

Pickled (``wire.py``), the columns cost one opcode per value and nothing per record:
no tuple per flow, no empty log per idle flow, no replica name per flow. A flow's
states are pickled as they are (tuples of the NFs' entries); packing the integer
entries into flat int64 arrays measured slower in Python than pickle's own loop.
"""

from __future__ import annotations

from collections import Counter


def pack(flows: list[int], seqs: list[int], states: list[tuple], logs: dict[int, dict],
         replicas: list) -> tuple:
    """The batch of ``len(flows)`` flows (``logs``: the non-empty logs by position)."""
    names = set(replicas)
    if len(names) <= 1:
        return (flows, seqs, states, logs, next(iter(names), None), {})
    common = Counter(replicas).most_common(1)[0][0]
    other = {i: r for i, r in enumerate(replicas) if r != common}
    return (flows, seqs, states, logs, common, other)


def unpack(batch: tuple) -> tuple[list[int], list[int], list[tuple], dict[int, dict], list]:
    """``(flows, seqs, states, logs, replicas)`` of a packed batch."""
    flows, seqs, states, logs, common, other = batch
    replicas = [common] * len(flows)
    for i, replica in other.items():
        replicas[i] = replica
    return flows, seqs, states, logs, replicas
