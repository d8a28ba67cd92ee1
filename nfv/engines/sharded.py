"""The ``cpu`` engine end to end over shards: each process builds the flows of its
5-tuples and runs the whole chain over them.

``run_sharded(path, specs, choice, options, shards)`` gives the ``Trace`` and
``EngineResult`` that reading the capture in one process and running the
engine over it give (flows, their ids, messages, their order and every NF
output row), with everything after the record walk split over ``shards``
processes, as receive-side scaling splits a NIC's queues:

1. This process maps the capture and, for a pcap, forks one process per further
   shard right away: each walks the records of one byte range of the file
   (``capture.walk_pcap_part``: from the first plausible record header in it;
   ``capture.join_walks`` keeps a range's walk only where the walk before it
   stopped exactly there, and otherwise walks on alone, so the records are one
   walk's). The room for the decoded columns is a file (``memfd``) sized and
   mapped once the records are known. For a pcapng this process walks the
   blocks and then forks. The mapping and the records are inherited or shared,
   not copied. Each shard decodes a part of the records into
   one shared mapping (``shared_decode.SharedColumns``: headers as columns,
   each packet's 5-tuple key, the same in both directions); after a barrier
   each reads the whole capture's columns back and places the 5-tuples on the
   shards so that their loads are even (``balanced_shards``, the same answer
   in every process).
2. Each shard (this process is shard 0) copies the columns of the packets placed
   on it out of the shared mapping and unmaps it, then builds their flows and
   messages (``assemble.assemble_parts``: the in-order
   checks, the streams, HTTP framing, the flow table for the rest), numbers
   them by the records that created and completed them, and runs the chain
   over its messages in process (``run_engine`` with one in-process worker).
   A 5-tuple's flows depend on its packets alone and an NF's output for a flow
   on that flow's messages alone, so each shard's flows, messages and output
   rows are the whole trace's for its 5-tuples.
3. A shard sends back only what is per flow or per message (flow fields,
   message columns without bytes, output rows, latencies); this process
   numbers the flows by the record that created each and orders the messages
   by the record that completed each (no two shards share a record), so ids,
   order and sorted output rows are the one-process ones.

The message bytes stay in the shard that framed them: the merged ``Trace`` has
no payload (``blob`` empty, ``msg_offset`` -1), only what a report reads.
Fewer than ``shards.MIN_SHARD_PACKETS`` packets per shard: one process builds
the trace (the shards forked for the walk told to stop) and runs the chain over
it itself (one in-process worker: forking would cost more than such a trace's
NFs); no ``fork``: one process builds the trace and the engine runs with the
worker pool as usual. A shard that fails raises ``RuntimeFailure``.
"""

from __future__ import annotations

import dataclasses
import mmap
import multiprocessing as mp
import os
import threading
import time
import traceback
from collections import Counter

import numpy as np

from dl_nfv.artifacts.errors import RuntimeFailure

from ..traffic import shards as flow_shards
from ..traffic.assemble import assemble, assemble_parts, merge_parts
from ..traffic.capture import (
    PCAP_MAGICS,
    join_walks,
    open_mapped,
    pcap_layout,
    pcap_rows,
    release_freed,
    release_pages,
    span_table,
    walk_pcap_part,
    walk_rows,
)
from ..traffic.columnar import PacketColumns, decode_records
from ..traffic.pcap import MalformedCounts
from ..traffic.shared_decode import SharedColumns
from ..traffic.trace import Capture, FlowInfo, Trace, capture_of, trace_of
from . import EngineChoice
from .pool import die_with_parent
from .runner import EngineOptions, EngineResult, run_engine, sorted_rows

WINDOW_BYTES = 1 << 20  # the flow table's out-of-order window, as ``load_trace``'s
PACKET_COST = 500  # a packet's own cost (arrays, framing, flow records) in payload bytes
GREEDY_KEYS = 256  # the heaviest buckets of 5-tuples placed one by one
BUCKET_BITS = 16  # 5-tuples grouped into 2**16 buckets by their hash for placement
MIN_RECORD_BYTES = 64  # a capture of this many bytes per record at least is forked early
_FLOW_FIELDS = tuple(f.name for f in dataclasses.fields(FlowInfo))
_MESSAGE = ("msg_flow", "msg_dir", "msg_index", "msg_len", "msg_header_len", "msg_kind",
            "msg_ts_us", "msg_packets")


def run_sharded(path, specs, choice: EngineChoice, options: EngineOptions, shards: int, *,
                idle_timeout_us: int = 60_000_000) -> tuple[Trace, EngineResult]:
    """Read ``path`` and run the chain ``specs`` over it in ``shards`` processes (see the
    module docstring). The trace's ``stages_s``: ``read`` (the record walk, this process's
    part and the joining of the parts), ``decode`` and ``flows`` (the slowest shard's: its
    part of the decoding and the wait for the others', then placing the 5-tuples and
    building its flows) and ``merge`` (what the shards' section took beyond its slowest
    decoding, flows, start-up and NFs: building the chain, waiting for the slowest shard,
    the transfer and the merge); the result's ``startup_s`` and ``elapsed_s`` are the
    slowest shard's."""
    t0 = time.perf_counter()
    malformed = MalformedCounts()
    data = open_mapped(path)
    job = _Job(data, None, None, shards, specs, choice, dataclasses.replace(options, workers=1),
               idle_timeout_us, str(path), os.getpid())
    children: list = []
    if _early(data, shards):  # forked before the walk, each process walking a part
        records, children = _walk_parts(path, job, malformed)
    else:
        records = span_table(path, data, malformed)
    read_s = time.perf_counter() - t0
    small = len(records) // flow_shards.MIN_SHARD_PACKETS < shards
    if small or not hasattr(os, "fork"):
        for _, conn, proc in children:
            conn.send(("stop",))
            conn.close()
            proc.join()
        if job.fd is not None:
            os.close(job.fd)
        # too few packets to pay for a fork: the NFs too run in this process
        return _one_process(job, records, malformed, read_s, job.options if small else options)
    release_pages(data)  # the walk touched every page; each shard decodes only its part
    context = mp.get_context("fork")
    t1 = time.perf_counter()
    if children:
        job.shared = SharedColumns(records, shards, job.fd)
        os.close(job.fd)  # the mapping stays; the children have their copy of the file
        for _, conn, _ in children:
            conn.send(("go", len(records)))
    else:
        job.shared, job.barrier = SharedColumns(records, shards), context.Barrier(shards)
        for k in range(1, shards):
            read, write = context.Pipe(duplex=False)
            proc = context.Process(target=_child, args=(write, job, k), daemon=True)
            proc.start()
            write.close()
            children.append((k, read, proc))
    job.malformed = malformed
    try:
        parts = [job.run(0)]
    except threading.BrokenBarrierError:  # a shard failed before the columns were shared
        raise _first_failure(children) from None
    parts += [_receive(k, conn) for k, conn, _ in children]
    trace, result = _merge(parts, job.capture, str(path))
    for _, _, proc in children:  # their exits overlap the merge
        proc.join()
    decode_s = max(p["decode_s"] for p in parts)
    flows_s = max(p["flows_s"] for p in parts)
    merge_s = (time.perf_counter() - t1 - decode_s - flows_s - result.startup_s
               - result.elapsed_s)
    trace.stages_s = {"read": read_s, "decode": decode_s, "flows": flows_s,
                      "merge": max(0.0, merge_s)}
    return trace, result


def _early(data, shards: int) -> bool:
    """Whether to fork before the record walk: a pcap (whose records a walk can start
    within, after finding plausible headers), large enough for every shard's
    ``MIN_SHARD_PACKETS``, where ``fork`` and ``memfd_create`` (room for the columns,
    sized once the walk is done) exist."""
    return (shards > 1 and hasattr(os, "fork") and hasattr(os, "memfd_create")
            and bytes(data[:4]) in PCAP_MAGICS
            and len(data) >= shards * flow_shards.MIN_SHARD_PACKETS * MIN_RECORD_BYTES)


def _walk_parts(path, job: _Job, malformed: MalformedCounts) -> tuple[np.ndarray, list]:
    """Fork the shards and walk the capture's records in ``job.shards`` byte ranges, one
    per process; the records and the children (shard, pipe, process). A range's walk
    starts at the first plausible record header in it (``capture.walk_pcap_part``) and
    counts only when the previous range's walk stopped exactly there; otherwise this process
    walks on from where that one stopped, as one walk would, and the later ranges'
    walks go unused."""
    data = job.data
    layout = pcap_layout(path, data)  # a bad file header: BadInput before any fork
    context = mp.get_context("fork")
    job.fd = os.memfd_create("dl-nfv-columns")
    job.barrier = context.Barrier(job.shards)
    edges = [24 + (len(data) - 24) * k // job.shards for k in range(job.shards + 1)]
    children = []
    for k in range(1, job.shards):
        mine, theirs = context.Pipe()
        proc = context.Process(target=_child, args=(theirs, job, k, (layout, edges)),
                               daemon=True)
        proc.start()
        theirs.close()
        children.append((k, mine, proc))
    try:
        walk = walk_pcap_part(data, layout, edges, 0, malformed)[1]
        walks = join_walks(data, layout, walk, (_receive(k, conn, last=False)
                                                for k, conn, _ in children), malformed)
    except BaseException:
        for _, conn, proc in children:  # none of them waits for an order that never comes
            proc.kill()
            proc.join()
            conn.close()
        os.close(job.fd)
        raise
    return walk_rows(data, layout, walks), children


def _one_process(job: _Job, records: np.ndarray, malformed: MalformedCounts, read_s: float,
                 options: EngineOptions) -> tuple[Trace, EngineResult]:
    """The trace read in this process and the engine run with its worker pool."""
    t1 = time.perf_counter()
    cols = decode_records(job.data, records, copy=False)
    capture = capture_of(cols, malformed, {"read": read_s, "decode": time.perf_counter() - t1})
    t2 = time.perf_counter()
    stats: Counter = Counter()
    table = assemble(cols, stats, idle_timeout_us=job.idle_timeout_us)
    trace = trace_of(job.source, table, capture.packets, capture.wire_bytes, capture.malformed,
                     stats)
    trace.stages_s = {**capture.stages_s, "flows": time.perf_counter() - t2}
    return trace, run_engine(trace, job.specs, job.choice, options, release_payload=True)


def balanced_shards(key_hash: np.ndarray, payload: np.ndarray, shards: int) -> np.ndarray:
    """The shard of each packet: every packet of a 5-tuple (one ``key_hash``) in one shard,
    the shards' loads (payload bytes plus ``PACKET_COST`` per packet, a rough cost of a
    packet in bytes) as even as greedy placement makes them. As a NIC's receive-side
    scaling does with its indirection table, the 5-tuples are grouped by ``BUCKETS``
    buckets of their hash (its top bits) and buckets are placed: O(packets) with no
    sort of the packets, and a bucket holds two of a trace's heaviest 5-tuples only by a
    rare collision. A hash modulo the shards leaves the largest flows where they fall:
    on Zipf-sized traffic one of two shards got about 60% of the bytes. The
    ``GREEDY_KEYS`` heaviest buckets go, heaviest first, each to the least loaded shard;
    the rest, ordered by load, are dealt back and forth across the shards."""
    bucket = (key_hash >> np.uint64(64 - BUCKET_BITS)).astype(np.int64)
    load = np.bincount(bucket, weights=payload + PACKET_COST, minlength=1 << BUCKET_BITS)
    used = np.flatnonzero(load)
    order = used[np.argsort(-load[used], kind="stable")]
    assign = np.zeros(1 << BUCKET_BITS, dtype=np.int64)
    totals = [0.0] * shards
    head = order[:GREEDY_KEYS]
    for key, weight in zip(head.tolist(), load[head].tolist()):
        least = min(range(shards), key=totals.__getitem__)
        assign[key] = least
        totals[least] += weight
    rest = np.arange(len(order) - len(head))
    lap, pos = np.divmod(rest, shards)
    by_load = np.argsort(totals, kind="stable")  # the tail dealt from the lightest shard
    assign[order[len(head):]] = by_load[np.where(lap % 2 == 0, pos, shards - 1 - pos)]
    return assign[bucket]


@dataclasses.dataclass(slots=True)
class _Job:
    """What every shard shares: the mapped capture, room for its decoded columns, the
    barrier after the decoding, the chain and its options."""

    data: mmap.mmap
    shared: SharedColumns | None  # None in a shard forked before the walk, until it attaches
    barrier: threading.Barrier | None
    shards: int
    specs: tuple
    choice: EngineChoice
    options: EngineOptions
    idle_timeout_us: int
    source: str
    parent: int  # pid of the process that forks the shards
    cols: PacketColumns | None = None  # the whole capture's, once decoded
    fd: int | None = None  # the file of ``shared`` when the shards were forked before the walk
    malformed: MalformedCounts | None = None  # shard 0's: the record walk's counts
    capture: Capture | None = None  # shard 0's: the capture's counts (no columns)

    def run(self, k: int) -> dict:
        """Shard ``k``: its part of the decoding, then its flows and messages, and the
        chain run over them."""
        t0 = time.perf_counter()
        try:
            self.shared.decode_part(self.data, k)
        except BaseException:
            self.barrier.abort()  # the others' wait fails instead of hanging
            raise
        self.barrier.wait()
        self.cols, rows, keys = self.shared.columns(self.data)
        t1 = time.perf_counter()
        mask = balanced_shards(keys[2], self.cols.payload_len[rows], self.shards) == k
        mine = rows[mask]
        if k == 0:  # its counts; the columns themselves are let go below
            self.capture = dataclasses.replace(capture_of(self.cols, self.malformed, {}),
                                               cols=None)
        # this shard's packets out of the shared columns, and the mapping handed back
        cols, records = self.cols.take(mine), len(self.cols)
        mine_keys = tuple(column[mask] for column in keys)
        del rows, keys, mask
        self.cols = None
        self.shared.close()
        stats: Counter = Counter()
        parts, clean = assemble_parts(cols, np.arange(len(mine)), stats, self.idle_timeout_us,
                                      WINDOW_BYTES, mine_keys)
        parts = [flow_shards.to_records(part, mine, records) for part in parts]
        # merge_parts numbers flows by creating record and orders messages by completing one
        created = np.sort(np.concatenate([np.zeros(0, dtype=np.int64)] + [
            np.asarray(part.flow_at, dtype=np.int64) for part in parts]))
        when = np.sort(np.concatenate([np.zeros(0, dtype=np.int64)]
                                      + [part.msg_at for part in parts]))
        trace = trace_of(self.source, merge_parts(parts, stats, clean), 0, 0, Counter(), stats)
        flows_s = time.perf_counter() - t1
        # the NFs read only the streams: flow building's freed temporaries are handed
        # back before the NFs' buffers take their room
        del cols, mine, mine_keys
        release_freed()
        result = run_engine(trace, self.specs, self.choice, self.options, release_payload=True)
        flows = trace.flows if k == 0 else [  # sent as tuples: unpickled fast
            tuple(getattr(f, n) for n in _FLOW_FIELDS) for f in trace.flows]
        return {"flows": flows,
                "addresses": trace.addresses, "created": created, "when": when,
                "messages": [getattr(trace, name) for name in _MESSAGE],
                "stats": stats, "decode_s": t1 - t0, "flows_s": flows_s, "result": result}


def _merge(parts: list[dict], capture, source: str) -> tuple[Trace, EngineResult]:
    """One trace and one result from the shards' (flow ids by creating record, messages
    by completing record)."""
    created = np.concatenate([p["created"] for p in parts])
    order = np.argsort(created, kind="stable")
    new_id = np.empty(len(created), dtype=np.int64)
    new_id[order] = np.arange(len(created))
    renamed, first = [], 0
    for p in parts:
        renamed.append(new_id[first:first + len(p["created"])])
        first += len(p["created"])
    infos = [f for p in parts for f in p["flows"]]
    flows = [f if isinstance(f, FlowInfo) else FlowInfo(*f) for f in map(infos.__getitem__,
                                                                            order.tolist())]
    addresses = np.concatenate([p["addresses"] for p in parts])[order]
    when = np.concatenate([p["when"] for p in parts])
    m_order = np.argsort(when, kind="stable")
    columns = [np.concatenate([p["messages"][j] for p in parts]) for j in range(len(_MESSAGE))]
    columns[0] = np.concatenate([renamed[k][p["messages"][0]] for k, p in enumerate(parts)])
    columns = [c[m_order] for c in columns]
    stats: Counter = Counter()
    for p in parts:
        stats.update(p["stats"])
    malformed = dict(capture.malformed)
    malformed.update({k: v for k, v in stats.items() if k.startswith("http_")})
    n = len(m_order)
    trace = Trace(source=source, flows=flows, payload=np.zeros(0, dtype=np.uint8), blob=b"",
                  **dict(zip(_MESSAGE, columns)), msg_offset=np.full(n, -1, dtype=np.int64),
                  packets=capture.packets, wire_bytes=capture.wire_bytes,
                  malformed=dict(sorted(malformed.items())),
                  tcp=dict(sorted((k, v) for k, v in stats.items() if k.startswith("tcp_"))),
                  addresses=addresses)
    results = [p["result"] for p in parts]

    def table(name: str) -> np.ndarray:
        tables = [getattr(r, name).copy() for r in results]
        for k, t in enumerate(tables):
            if len(t):
                t[:, 0] = renamed[k][t[:, 0]]
        return sorted_rows(np.concatenate(tables))

    alerts = sorted((int(renamed[k][f]), i, s) for k, r in enumerate(results)
                    for f, i, s in r.alerts)
    batches = [dataclasses.replace(b, index=j) for j, b in
               enumerate(b for r in results for b in r.batches)]
    latency = np.concatenate([r.latency_us for r in results])[m_order]
    result = EngineResult(
        http=table("http"), drops=table("drops"), alerts=alerts,
        monitor=table("monitor"), batches=batches,
        elapsed_s=max(r.elapsed_s for r in results), startup_s=max(r.startup_s for r in results),
        latency_us=latency, device=results[0].device, workers=len(parts),
        stride=results[0].stride)
    return trace, result


def _child(conn, job: _Job, k: int, walk: tuple | None = None) -> None:
    """Shard ``k`` in a forked process. ``walk`` (the pcap's layout and the byte ranges):
    forked before the record walk, it first walks its range and sends what it read (the
    first record header it found, the walk, its counts), then waits to be told to go on
    (with the number of records) or to stop."""
    die_with_parent(job.parent)
    try:
        if walk is not None:
            counts = MalformedCounts()
            first, part = walk_pcap_part(job.data, *walk, k, counts)
            part.rows = pcap_rows(job.data, walk[0], part.heads)  # read here, in parallel
            release_pages(job.data)
            conn.send(("ok", (first, part, counts)))
            order = conn.recv()
            if order[0] != "go":
                return
            job.shared = SharedColumns.attach(job.fd, order[1], job.shards)
            os.close(job.fd)
        conn.send(("ok", job.run(k)))
    except Exception as exc:  # reported to the parent, which raises RuntimeFailure
        job.barrier.abort()
        conn.send(("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))
    finally:
        conn.close()


def _first_failure(children: list) -> RuntimeFailure:
    """The failure of the shard that broke the barrier (the others report the broken
    barrier itself)."""
    failures = []
    for k, read, _ in children:
        try:
            _receive(k, read)
        except RuntimeFailure as exc:
            failures.append(exc)
    failures.sort(key=lambda exc: "BrokenBarrierError" in str(exc))
    return failures[0] if failures else RuntimeFailure("a shard failed while decoding")


def _receive(k: int, conn, last: bool = True):
    """Shard ``k``'s next reply (``RuntimeFailure`` if it failed or exited); the pipe closed
    after the ``last`` one."""
    try:
        status, value = conn.recv()
    except EOFError:
        raise RuntimeFailure(f"shard {k} exited unexpectedly") from None
    finally:
        if last:
            conn.close()
    if status == "error":
        raise RuntimeFailure(f"shard {k} failed: {value.splitlines()[0]}")
    return value
