"""Flows and messages assembled by several processes, the packets sharded by 5-tuple.

``assemble_sharded(cols, stats, shards)`` gives what ``assemble.assemble`` gives
(flows, their ids and counters, messages, their order, bytes, timestamps and
packet counts, TCP and HTTP statistics) with the per-flow work split over
``shards`` processes, as receive-side scaling splits a NIC's queues:

1. This process hashes each decoded packet's 5-tuple (``keys.key_table``,
   the same for both directions; vectorised) and gives the packet to shard
   ``hash % shards``. Every packet of a 5-tuple lands in one shard, in capture
   order, and the flow table's work on a 5-tuple depends on that 5-tuple's
   packets alone, so each shard's flows and messages are exactly the whole
   trace's flows and messages of those 5-tuples.
2. Shards 1.. run ``assemble.assemble_parts`` in forked processes (the decoded
   columns and the mapped file are inherited, not copied); this process runs
   shard 0 meanwhile. Each shard copies its message bytes into its region of
   one shared anonymous mapping (region ``k`` as large as shard ``k``'s packet
   payload, which bounds its streams) and sends back its flows (their fields,
   without reassembly state) and message columns; the mapping becomes the
   trace's buffer, so no message byte crosses a pipe.
3. Each part's packet positions are mapped back to record numbers of the
   whole capture (a message completed by the flow's end sorts after every
   packet, by its flow's first packet, as in one process), and
   ``assemble.merge_parts`` numbers the flows by the packet that created them
   and orders the messages by the packet that completed them: the same ids and
   order as one process gives.

Limits: the record walk, decoding, hashing and the merge stay in this process;
fork is needed (elsewhere one process does all). Bytes that would overflow a
region (not expected: the bound holds for both the clean streams and the flow
table's messages) are sent through the pipe and joined instead. A shard that
fails raises ``RuntimeFailure``.
"""

from __future__ import annotations

import mmap
import multiprocessing as mp
import os
import traceback
from collections import Counter

import numpy as np

from dl_nfv.artifacts.errors import RuntimeFailure

from .assemble import Assembled, Part, assemble, assemble_parts, merge_parts
from .columnar import OK, PacketColumns
from .flows import FlowState
from .keys import key_table, row_hash

MIN_SHARD_PACKETS = 4096  # fewer packets per shard do not pay for a fork
_SENT = ("id", "proto", "client", "server", "first_ts_us", "last_ts_us", "packets", "wire_bytes",
         "app", "handshake", "closed")  # the FlowState fields a Trace reads


def assemble_sharded(cols: PacketColumns, stats: Counter, shards: int, *,
                     idle_timeout_us: int = 60_000_000, window_bytes: int = 1 << 20) -> Assembled:
    """``assemble(cols, stats, ...)`` computed by ``shards`` processes (see the module
    docstring); fewer when the capture has under ``MIN_SHARD_PACKETS`` packets per shard."""
    rows = np.flatnonzero(cols.reason == OK)
    shards = min(shards, len(rows) // MIN_SHARD_PACKETS)
    if shards < 2 or not hasattr(os, "fork"):
        return assemble(cols, stats, idle_timeout_us=idle_timeout_us, window_bytes=window_bytes)
    keys = key_table(cols, rows)
    which = (row_hash(keys[0]) % np.uint64(shards)).astype(np.int64)
    # shard k's message bytes go to region k of one shared buffer: at most its payload
    region = np.zeros(shards + 1, dtype=np.int64)
    np.cumsum(np.bincount(which, weights=cols.payload_len[rows], minlength=shards), out=region[1:])
    shared = mmap.mmap(-1, max(int(region[-1]), 1))
    context = mp.get_context("fork")
    children = []
    for k in range(1, shards):
        read, write = context.Pipe(duplex=False)
        proc = context.Process(target=_shard, daemon=True, args=(
            write, cols, rows, keys, which == k, shared, region[k:k + 2].tolist(),
            idle_timeout_us, window_bytes))
        proc.start()
        write.close()
        children.append((k, read, proc))
    mine = which == 0
    parts, clean = _parts(cols, rows, keys, mine, stats, idle_timeout_us, window_bytes)
    where = _place(parts, shared, *region[:2].tolist())
    parts = [to_records(part, rows[mine], len(cols)) for part in parts]
    for k, read, proc in children:
        shard_parts, shard_clean, shard_stats, shard_where = _receive(k, read)
        proc.join()
        parts.extend(to_records(part, rows[which == k], len(cols)) for part in shard_parts)
        where.extend(shard_where)
        clean += shard_clean
        stats.update(shard_stats)
    if all(at is not None for at in where):
        return merge_parts(parts, stats, clean, (shared, np.asarray(where, dtype=np.int64)))
    for part, at in zip(parts, where):  # a shard's bytes overflowed its region: joined
        if at is not None:
            part.messages.buffer = shared[at:at + part.messages.buffer]
    return merge_parts(parts, stats, clean)


def _place(parts: list[Part], shared: mmap.mmap, lo: int, hi: int) -> list[int | None]:
    """Copy the parts' message bytes to ``shared[lo:hi]``, each part's buffer replaced by
    its length; the offset of each (all None, buffers kept, if they do not fit)."""
    if lo + sum(len(part.messages.buffer) for part in parts) > hi:
        return [None] * len(parts)
    where = []
    for part in parts:
        buffer = part.messages.buffer
        shared[lo:lo + len(buffer)] = buffer
        where.append(lo)
        part.messages.buffer = len(buffer)
        lo += len(buffer)
    return where


def _parts(cols: PacketColumns, rows: np.ndarray, keys: tuple[np.ndarray, np.ndarray],
           mask: np.ndarray, stats: Counter, idle_timeout_us: int, window_bytes: int
           ) -> tuple[list[Part], int]:
    """The parts of the packets ``rows[mask]``."""
    if not mask.any():
        return [], 0
    return assemble_parts(cols, rows[mask], stats, idle_timeout_us, window_bytes,
                          (keys[0][mask], keys[1][mask]))


def to_records(part: Part, rows: np.ndarray, records: int) -> Part:
    """``part`` of the packets ``rows`` (increasing) of a capture of ``records`` decoded
    rows, with its packet positions (indices into ``rows``) as row numbers of the whole
    capture; a position past the shard's packets (a message the flow's end completed)
    maps past every row, kept in the order of the row it names."""
    n = len(rows)
    at = part.msg_at
    late = at >= n
    msg_at = np.where(late, records + rows[np.where(late, at - n, 0)], rows[np.minimum(at, n - 1)])
    flow_at = rows[np.asarray(part.flow_at, dtype=np.int64)].tolist()
    return Part(part.flows, flow_at, part.messages, msg_at.astype(np.int64))


def _shard(conn, cols: PacketColumns, rows: np.ndarray, keys: tuple[np.ndarray, np.ndarray],
           mask: np.ndarray, shared: mmap.mmap, region: list[int], idle_timeout_us: int,
           window_bytes: int) -> None:
    """A forked shard: assemble ``rows[mask]``, place its message bytes in its region of
    ``shared`` (or send them, bytes apart, where they do not fit), send the parts, exit."""
    try:
        stats: Counter = Counter()
        parts, clean = _parts(cols, rows, keys, mask, stats, idle_timeout_us, window_bytes)
        where = _place(parts, shared, *region)
        buffers = [part.messages.buffer for part, at in zip(parts, where) if at is None]
        for part in parts:  # flows as their fields (reassembly state is done with): unpickled fast
            part.flows = [tuple(getattr(flow, name) for name in _SENT) for flow in part.flows]
            if not isinstance(part.messages.buffer, int):
                part.messages.buffer = b""
        conn.send(("ok", parts, clean, stats, where))
        for buffer in buffers:
            conn.send_bytes(buffer)
    except Exception as exc:  # reported to the parent, which raises RuntimeFailure
        conn.send(("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))
    finally:
        conn.close()


def _receive(k: int, conn) -> tuple[list[Part], int, Counter, list[int | None]]:
    try:
        reply = conn.recv()
        if reply[0] == "error":
            raise RuntimeFailure(f"flow shard {k} failed: {reply[1].splitlines()[0]}")
        _, parts, clean, stats, where = reply
        for part, at in zip(parts, where):
            if at is None:
                part.messages.buffer = conn.recv_bytes()
            part.flows = [FlowState(**dict(zip(_SENT, fields))) for fields in part.flows]
    except EOFError:
        raise RuntimeFailure(f"flow shard {k} exited unexpectedly") from None
    finally:
        conn.close()
    return parts, clean, stats, where
