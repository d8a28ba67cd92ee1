"""The ``cpu`` engine over shards (``run_sharded``) equals one process reading the trace
and running the engine over it: flows, messages and every NF output row.

Each shard builds the flows of its 5-tuples and runs the chain over them in its own
process; the merge numbers flows and orders messages by record. The shard threshold is
lowered so that small traces split.
"""

from __future__ import annotations

import random
import re
import struct
from collections import Counter

import numpy as np
import pytest

from dl_nfv.artifacts.errors import BadInput, RuntimeFailure
from dl_nfv.nfv.engines import parse_engine, sharded
from dl_nfv.nfv.engines.runner import EngineOptions, run_engine
from dl_nfv.nfv.run import digests, run_config
from dl_nfv.nfv.traffic import capture, load_trace, shards, shared_decode
from dl_nfv.nfv.traffic.capture import (
    join_walks,
    pcap_layout,
    span_table,
    walk_pcap_part,
    walk_rows,
)
from dl_nfv.nfv.traffic.columnar import decode_records, http_starts
from dl_nfv.nfv.traffic.generate import TraceSpec, generate_trace
from dl_nfv.nfv.traffic.keys import key_table, row_hash
from dl_nfv.nfv.traffic.shared_decode import SharedColumns

from .helpers import DATA, EXAMPLES, write_pcap
from .test_assemble import FIELDS, _connections
from .test_engines import _chain
from .test_pcap_fuzz import pcap_case

CPU = parse_engine("cpu")


@pytest.fixture
def small_shards(monkeypatch):
    monkeypatch.setattr(shards, "MIN_SHARD_PACKETS", 1)


def assert_same_run(path, workers: int, firewall: bool = True) -> int:
    """``run_sharded`` over ``workers`` shards equals ``load_trace`` + ``run_engine`` with
    one worker; the number of messages."""
    specs = _chain(firewall)
    options = EngineOptions(batch_size=64, workers=workers)
    split, result = sharded.run_sharded(path, specs, CPU, options, workers)
    ref = load_trace(path)
    expected = run_engine(ref, specs, CPU, EngineOptions(batch_size=64, workers=1))
    assert split.flows == ref.flows
    for name in FIELDS:
        assert np.array_equal(getattr(split, name), getattr(ref, name)), name
    assert (split.packets, split.wire_bytes, split.malformed, split.tcp) == \
        (ref.packets, ref.wire_bytes, ref.malformed, ref.tcp)
    for name in ("http", "drops", "monitor"):
        assert np.array_equal(getattr(result, name), getattr(expected, name)), name
    assert result.alerts == expected.alerts
    assert len(result.latency_us) == ref.n_messages
    assert sum(b.messages for b in result.batches) == ref.n_messages
    assert set(split.stages_s) == {"read", "decode", "flows", "merge"}
    assert split.malformed == ref.malformed
    return ref.n_messages


@pytest.mark.parametrize("workers", [2, 3])
def test_real_and_generated_traces(tmp_path, small_shards, workers):
    for path in sorted(DATA.glob("*.pcap")):
        assert assert_same_run(path, workers) > 0
    for dist, suffix in (("zipf:1.2", ".pcap"), ("uniform", ".pcapng")):
        path = tmp_path / f"g{suffix}"
        generate_trace(TraceSpec(flows=60, size_dist=dist, attack_rate=0.1, seed=9), path)
        assert assert_same_run(path, workers, firewall=dist == "uniform") > 100


@pytest.mark.parametrize("seed", [0, 1])
def test_every_kind_of_flow_interleaved(tmp_path, small_shards, seed):
    """Clean and table flows (reordering, resets, re-used ports, UDP, ...) in every shard."""
    rng = random.Random(seed)
    queues = [list(c) for c in _connections(rng)]
    frames = []
    while any(queues):
        frames.append(rng.choice([q for q in queues if q]).pop(0))
    assert assert_same_run(write_pcap(tmp_path / "mix.pcap", frames), 3) > 20


def test_nfv_run_reports_equal_across_worker_counts(tmp_path, small_shards):
    path = tmp_path / "t.pcap"
    generate_trace(TraceSpec(flows=40, attack_rate=0.2, seed=3), path)
    reports = [run_config(EXAMPLES / "ids.yaml", path, engine="cpu", workers=w)
               for w in (1, 2, 3)]
    assert reports[0].alerts
    for r in reports[1:]:
        assert digests(r) == digests(reports[0])
        assert (r.alerts, r.outputs, r.packets, r.flows, r.messages, r.malformed, r.tcp) == \
            (reports[0].alerts, reports[0].outputs, reports[0].packets, reports[0].flows,
             reports[0].messages, reports[0].malformed, reports[0].tcp)
    assert reports[1].workers == 2 and reports[0].workers == 1


def test_a_failing_shard_is_a_runtime_failure(tmp_path, small_shards, monkeypatch):
    path = tmp_path / "t.pcap"
    generate_trace(TraceSpec(flows=20, seed=4), path)
    run = sharded._Job.run

    def failing(self, k):
        if k == 1:
            raise ValueError("broken shard")
        return run(self, k)

    monkeypatch.setattr(sharded._Job, "run", failing)
    with pytest.raises(RuntimeFailure, match="shard 1 failed: ValueError: broken shard"):
        sharded.run_sharded(path, _chain(False), CPU, EngineOptions(workers=2), 2)


def test_few_packets_run_in_one_process(tmp_path):
    """Under ``MIN_SHARD_PACKETS`` packets per shard: one trace, and the chain run over it
    in this process (no worker forked), with the outputs of a one-worker run."""
    path = tmp_path / "t.pcap"
    generate_trace(TraceSpec(flows=10, seed=4), path)
    trace, result = sharded.run_sharded(path, _chain(False), CPU, EngineOptions(workers=2), 2)
    assert len(trace.blob) == int(trace.msg_len.sum()) > 0  # the bytes are here
    assert result.workers == 1 and "merge" not in trace.stages_s
    ref = load_trace(path)
    expected = run_engine(ref, _chain(False), CPU, EngineOptions(workers=1))
    assert np.array_equal(result.monitor, expected.monitor) and result.alerts == expected.alerts


@pytest.mark.parametrize("seed", range(3))
def test_balanced_shards_keep_5_tuples_whole_and_loads_even(seed):
    rng = np.random.default_rng(seed)
    keys = rng.integers(0, 3000, size=20_000).astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    keys[:4000] = 7  # one heavy 5-tuple
    payload = rng.integers(0, 1500, size=len(keys))
    for n in (2, 3, 5):
        which = sharded.balanced_shards(keys, payload, n)
        for key in np.unique(keys)[:200]:
            assert len(np.unique(which[keys == key])) == 1
        weight = payload + sharded.PACKET_COST
        loads = np.bincount(which, weights=weight, minlength=n)
        heaviest = max(weight[keys == k].sum() for k in np.unique(keys))
        assert loads.sum() == weight.sum()
        assert loads.max() - loads.min() <= max(heaviest, loads.sum() / n) + 1e-6
        if heaviest < loads.sum() / (2 * n):
            assert loads.max() - loads.min() <= heaviest + 1e-6


def _frames(path) -> list[bytes]:
    data = path.read_bytes()
    return [data[at:at + n] for _, at, n, _ in span_table(path, data, Counter()).tolist()]


ARP = b"\xff" * 6 + b"\x02" * 6 + b"\x08\x06" + bytes(28)  # a non-IP frame: dpkt decodes it


@pytest.mark.parametrize("odd,step", [(False, None), (True, None), (False, 7), (True, 7)])
def test_shared_columns_equal_one_decoding(tmp_path, monkeypatch, odd, step):
    """Parts decoded apart and read back as one equal ``decode_records`` over every record,
    field by field; with frames only the reference decoder reads (``odd``), every process
    decodes the whole capture. ``step``: each part decoded a few records at a time."""
    if step is not None:
        monkeypatch.setattr(shared_decode, "DECODE_STEP", step)
    path = tmp_path / "g.pcap"
    generate_trace(TraceSpec(flows=30, seed=2), path)
    if odd:
        frames = _frames(path)
        path = write_pcap(tmp_path / "odd.pcap", frames[:50] + [ARP] + frames[50:])
    data = path.read_bytes()
    records = span_table(path, data, Counter())
    shared = SharedColumns(records, 3)
    for part in range(3):
        shared.decode_part(data, part)
    assert shared.arrays["fallback"].any() == odd
    cols, rows, keys = shared.columns(data)
    ref = decode_records(data, records, copy=False)
    for name in ("ts_us", "wire_bytes", "reason", "proto", "addr_len", "src_off", "dst_off",
                 "sport", "dport", "flags", "seq", "payload_off", "payload_len"):
        assert np.array_equal(getattr(cols, name), getattr(ref, name)), name
    assert cols.reasons[:len(ref.reasons)] == ref.reasons
    ref_rows = np.flatnonzero(ref.reason == 0)
    ref_keys = key_table(ref, ref_rows)
    assert np.array_equal(rows, ref_rows)
    assert np.array_equal(keys[0], ref_keys[0]) and np.array_equal(keys[1], ref_keys[1])
    assert np.array_equal(keys[2], row_hash(ref_keys[0]))
    if not odd:  # read with the headers (the whole capture's decoding leaves it to flows)
        assert np.array_equal(cols.http_start[rows], http_starts(ref, ref_rows))


def test_frames_for_the_reference_decoder_in_a_shard(tmp_path, small_shards):
    path = tmp_path / "g.pcap"
    generate_trace(TraceSpec(flows=30, attack_rate=0.2, seed=6), path)
    frames = _frames(path)
    odd = write_pcap(tmp_path / "odd.pcap", frames[:len(frames) // 2] + [ARP] * 3
                     + frames[len(frames) // 2:])
    assert assert_same_run(odd, 2) > 50


@pytest.mark.parametrize("kind", ["payload", "huge_caplen", "caplen_over_original", "cut",
                                  "anywhere"])
def test_corrupt_captures_over_shards(tmp_path, small_shards, kind):
    """Seeded corruptions of a generated capture: the shards count the same malformed
    records and packets and give the same outputs as one process, or the same BadInput."""
    base = tmp_path / "g.pcap"
    generate_trace(TraceSpec(flows=12, mean_exchanges=2, attack_rate=0.2, seed=4), base)
    damaged = 0
    for seed in range(6):
        data, _ = pcap_case(base.read_bytes(), random.Random(f"{kind}/{seed}"), kind)
        path = tmp_path / "f.pcap"
        path.write_bytes(data)
        try:
            damaged += bool(load_trace(path).malformed)
        except BadInput as exc:
            with pytest.raises(BadInput, match=re.escape(str(exc))):
                sharded.run_sharded(path, _chain(False), CPU, EngineOptions(workers=3), 3)
            damaged += 1
            continue
        assert_same_run(path, 3)
    assert damaged


def _split_walk(path, data: bytes, edges: list[int]) -> tuple[np.ndarray, Counter]:
    """The records and counts of the walk split at ``edges`` and joined."""
    layout = pcap_layout(path, data)
    counts: Counter = Counter()
    walk = walk_pcap_part(data, layout, edges, 0, counts)[1]
    later = []
    for k in range(1, len(edges) - 1):
        own: Counter = Counter()
        later.append((*walk_pcap_part(data, layout, edges, k, own), own))
    return walk_rows(data, layout, join_walks(data, layout, walk, later, counts)), counts


@pytest.mark.parametrize("kind", ["payload", "huge_caplen", "caplen_over_original", "cut",
                                  "anywhere"])
def test_split_walks_equal_one_walk(tmp_path, kind):
    """The record walk split at random byte offsets (inside records, inside damage the
    resynchronisation jumps over) and joined finds the records and counts one walk does."""
    base = tmp_path / "g.pcap"
    generate_trace(TraceSpec(flows=12, mean_exchanges=2, attack_rate=0.2, seed=4), base)
    path = tmp_path / "f.pcap"
    for seed in range(6):
        rng = random.Random(f"walk/{kind}/{seed}")
        data, _ = pcap_case(base.read_bytes(), rng, kind)
        path.write_bytes(data)
        ref_counts: Counter = Counter()
        try:
            ref = span_table(path, data, ref_counts)
        except BadInput:
            continue
        for parts in (2, 3, 8):
            cuts = sorted(rng.randrange(24, len(data)) for _ in range(parts - 1))
            records, counts = _split_walk(path, data, [24, *cuts, len(data)])
            assert np.array_equal(records, ref) and counts == ref_counts


def test_split_walk_that_starts_on_fake_headers(tmp_path):
    """A part that starts in a payload holding plausible record headers (a pcap inside a
    packet) walks records that are not the file's: its walk does not meet the one before,
    which goes on alone."""
    fake = b"".join(struct.pack("<IIII", 1_000_000, 0, 20, 20) + bytes(20) for _ in range(6))
    frames = _frames(DATA / "loopback-http.pcap")
    path = write_pcap(tmp_path / "nested.pcap", frames[:40] + [frames[40] + fake]
                      + frames[41:])
    data = path.read_bytes()
    ref_counts: Counter = Counter()
    ref = span_table(path, data, ref_counts)
    at = data.index(fake)
    layout = pcap_layout(path, data)
    assert walk_pcap_part(data, layout, [24, at - 3, len(data)], 1, Counter())[0] == at
    records, counts = _split_walk(path, data, [24, at - 3, len(data)])
    assert np.array_equal(records, ref) and counts == ref_counts


def test_sharded_run_forks_before_the_walk(tmp_path, small_shards, monkeypatch):
    """Over a pcap the shards are forked before the record walk, and the run equals one
    process's, also when the walks of the parts do not meet."""
    path = tmp_path / "g.pcap"
    generate_trace(TraceSpec(flows=40, attack_rate=0.1, seed=5), path)
    walked = []
    original = sharded._walk_parts
    monkeypatch.setattr(sharded, "_walk_parts",
                        lambda *a: walked.append(1) or original(*a))
    assert assert_same_run(path, 3) > 100 and walked
    never = [None, capture.PcapWalk(np.zeros(0, dtype=np.int64), None, None)]
    monkeypatch.setattr(sharded, "walk_pcap_part", lambda data, layout, edges, k, counts:
                        capture.walk_pcap_part(data, layout, edges, k, counts) if k == 0
                        else tuple(never))
    assert assert_same_run(path, 3) > 100
