"""Flows built by forked shards (packets split by 5-tuple hash) equal the flow table's.

``load_trace(path, workers=N)`` hashes each packet's 5-tuple, assembles each
shard in its own process and merges; every field of the trace must equal the
per-packet reference's (``FlowTable`` fed every packet in one process): flow
ids and counters, message order, bytes, timestamps, packet counts, TCP and
HTTP statistics. The shard threshold is lowered so that small traces split.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from dl_nfv.nfv.traffic import keys, load_trace, shards
from dl_nfv.nfv.traffic.columnar import OK, decode_frames
from dl_nfv.nfv.traffic.generate import TraceSpec, generate_trace
from dl_nfv.nfv.traffic.keys import key_table

from .helpers import DATA, write_pcap
from .test_assemble import FIELDS, _connections


def assert_sharded_same(path, workers: int) -> int:
    split, ref = load_trace(path, workers=workers), load_trace(path, per_packet=True)
    assert split.flows == ref.flows
    for name in FIELDS:
        assert np.array_equal(getattr(split, name), getattr(ref, name)), name
    assert [split.message_bytes(i) for i in range(split.n_messages)] == \
        [ref.message_bytes(i) for i in range(ref.n_messages)]
    assert (split.packets, split.wire_bytes, split.malformed, split.tcp) == \
        (ref.packets, ref.wire_bytes, ref.malformed, ref.tcp)
    return ref.n_messages


@pytest.fixture
def small_shards(monkeypatch):
    monkeypatch.setattr(shards, "MIN_SHARD_PACKETS", 1)


@pytest.mark.parametrize("workers", [2, 3])
def test_real_and_generated_traces(tmp_path, small_shards, workers):
    for path in sorted(DATA.glob("*.pcap")):
        assert assert_sharded_same(path, workers) > 0
    for dist, suffix in (("zipf:1.2", ".pcap"), ("uniform", ".pcapng")):
        path = tmp_path / f"g{suffix}"
        generate_trace(TraceSpec(flows=60, size_dist=dist, attack_rate=0.1, seed=9), path)
        assert assert_sharded_same(path, workers) > 100


@pytest.mark.parametrize("seed", [0, 1])
def test_every_kind_of_flow_interleaved(tmp_path, small_shards, seed):
    """Clean and table flows (reordering, resets, re-used ports, UDP, ...) in every shard."""
    rng = random.Random(seed)
    queues = [list(c) for c in _connections(rng)]
    frames = []
    while any(queues):
        frames.append(rng.choice([q for q in queues if q]).pop(0))
    assert assert_sharded_same(write_pcap(tmp_path / "mix.pcap", frames), 3) > 20


def test_shards_split_the_flows(tmp_path, small_shards):
    """Every shard gets flows: the hash spreads 5-tuples, both directions of one together."""
    from collections import Counter

    from dl_nfv.nfv.traffic.columnar import OK, read_columns
    from dl_nfv.nfv.traffic.keys import key_table, row_hash
    from dl_nfv.nfv.traffic.pcap import MalformedCounts

    path = tmp_path / "g.pcap"
    generate_trace(TraceSpec(flows=60, seed=3), path)
    cols = read_columns(path, MalformedCounts())
    rows = np.flatnonzero(cols.reason == OK)
    table, _ = key_table(cols, rows)
    which = row_hash(table) % np.uint64(3)
    per_key = Counter()
    for key, shard in zip(map(tuple, table.tolist()), which.tolist()):
        per_key[key, shard] += 1
    assert len({k for k, _ in per_key}) == len(per_key) == 60  # one shard per 5-tuple
    assert set(which.tolist()) == {0, 1, 2}


def test_bytes_that_do_not_fit_their_region_go_through_the_pipe(tmp_path, small_shards,
                                                                  monkeypatch):
    """The fallback when a shard's message bytes exceed its region of the shared buffer."""
    monkeypatch.setattr(shards, "_place", lambda parts, shared, lo, hi: [None] * len(parts))
    path = tmp_path / "g.pcap"
    generate_trace(TraceSpec(flows=40, size_dist="zipf:1.2", seed=4), path)
    assert assert_sharded_same(path, 3) > 50


@pytest.mark.parametrize("seed,step", [(0, 1 << 15), (1, 5)])
def test_key_table_is_the_5_tuple_of_the_reference_packets(seed, step, monkeypatch):
    """Each row of ``key_table``: protocol, address length and the two endpoints (address
    zero-padded to 16 bytes, port) in ascending order, whether the source is the lower
    one, from the reference decoder's packets; IPv4 and IPv6, and addresses that lie
    apart from each other in the buffer (as the reference decoder's fields may); ``step``:
    the packets whose addresses are gathered at once."""
    monkeypatch.setattr(keys, "GATHER_ROWS", step)
    rng = random.Random(seed)
    frames = [f for conn in _connections(rng) for f in conn]
    cols = decode_frames(range(len(frames)), frames, [1] * len(frames))
    rows = np.flatnonzero(cols.reason == OK)
    moved = rows[::3]  # their destination address copied past the frames, as dpkt's fields
    extra = b"".join(cols.blob[d:d + n] for d, n in zip(cols.dst_off[moved].tolist(),
                                                         cols.addr_len[moved].tolist()))
    cols.dst_off[moved] = len(cols.blob) + np.cumsum(cols.addr_len[moved]) - cols.addr_len[moved]
    cols.blob = cols.blob + extra
    cols.buf = np.frombuffer(cols.blob, dtype=np.uint8)
    table, src_low = key_table(cols, rows)
    assert {int(n) for n in table[:, 1]} == {4, 16}
    for k, pkt in enumerate(cols.packets(rows)):
        src = (pkt.src.ljust(16, b"\0"), pkt.sport)
        dst = (pkt.dst.ljust(16, b"\0"), pkt.dport)
        lo, hi = sorted((src, dst))
        expected = [pkt.proto, len(pkt.src),
                    int.from_bytes(lo[0][:8], "big"), int.from_bytes(lo[0][8:], "big"), lo[1],
                    int.from_bytes(hi[0][:8], "big"), int.from_bytes(hi[0][8:], "big"), hi[1]]
        assert table[k].tolist() == expected
        assert bool(src_low[k]) == (src <= dst)

