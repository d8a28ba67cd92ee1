"""Corrupt captures through ``dl-nfv nfv inspect``: exit 0 or 2, never a traceback, no packet lost.

Every case starts from an intact capture (the real loopback trace, generated
pcap in both byte orders and timestamp units, generated pcapng) whose records
the test walks itself, then corrupts it with a seeded generator: bit flips in
packet data, timestamps, file headers or anywhere; record lengths made huge or
larger than the original length; pcapng block lengths, captured lengths and
interface ids; cuts at any byte. The number of packets in the corrupted file
is derived from that walk and from what the corruption did, not from the
reader. On exit 0, the packets decoded into flows plus the packets counted
under a malformed reason must equal it; on exit 2, stderr is one line. The
default suite runs at least 130 cases per base capture (over 520 in all);
``--runslow`` runs 8 times as many.
"""

from __future__ import annotations

import json
import random
import struct
from collections import Counter

import numpy as np
import pytest
from click.testing import CliRunner

from dl_nfv.artifacts.errors import BadInput
from dl_nfv.cli.main import cli
from dl_nfv.nfv.traffic import capture
from dl_nfv.nfv.traffic.generate import TraceSpec, generate_trace

from .helpers import REAL_TRACE

MAX_CAPLEN = 262_144  # libpcap's limit, the documented one
EPB = 6


def pcap_records(data: bytes) -> list[tuple[int, int]]:
    """(offset, caplen) of every record of an intact little- or big-endian pcap."""
    order = "<" if data[:4] in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1") else ">"
    out, pos = [], 24
    while pos < len(data):
        caplen = struct.unpack_from(order + "I", data, pos + 8)[0]
        out.append((pos, caplen))
        pos += 16 + caplen
    assert pos == len(data)
    return out


def pcapng_blocks(data: bytes) -> list[tuple[int, int, int]]:
    """(offset, type, length) of every block of an intact little-endian pcapng."""
    out, pos = [], 0
    while pos < len(data):
        kind, length = struct.unpack_from("<II", data, pos)
        out.append((pos, kind, length))
        pos += length
    assert pos == len(data)
    return out


def big_endian_ns(data: bytes) -> bytes:
    """The same little-endian microsecond pcap as a big-endian nanosecond one."""
    fields = struct.unpack_from("<IHHiIII", data, 0)
    out = bytearray(struct.pack(">IHHiIII", 0xA1B23C4D, *fields[1:]))
    for pos, caplen in pcap_records(data):
        sec, usec, cap, orig = struct.unpack_from("<IIII", data, pos)
        out += struct.pack(">IIII", sec, usec * 1000, cap, orig)
        out += data[pos + 16:pos + 16 + caplen]
    return bytes(out)


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    d = tmp_path_factory.mktemp("bases")
    spec = TraceSpec(flows=6, mean_exchanges=2, size_dist="zipf:1.2", attack_rate=0.1, seed=4)
    generate_trace(spec, d / "g.pcap")
    generate_trace(spec, d / "g.pcapng")
    gen = (d / "g.pcap").read_bytes()
    return {"real": REAL_TRACE.read_bytes(), "gen": gen, "gen-be-ns": big_endian_ns(gen),
            "gen-ng": (d / "g.pcapng").read_bytes()}


def _flip(data: bytearray, rng: random.Random, positions: list[int]) -> int:
    """Flip one random bit at each of ``positions``; the first position changed."""
    for p in positions:
        data[p] ^= 1 << rng.randrange(8)
    return min(positions)


# Each mutation returns (bytes, expectation): ("exact", n) exit 0 with n packets;
# ("exact_or_2", n, text) that or exit 2 with text in the line; ("at_least", n)
# exit 0 with at least n packets, or exit 2.
def pcap_case(base: bytes, rng: random.Random, kind: str):
    recs = pcap_records(base)
    n = len(recs)
    order = "<" if base[:4] in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1") else ">"
    data = bytearray(base)
    pos, caplen = recs[rng.randrange(n)]
    if kind == "payload":
        spots = [p for p, c in recs if c]
        picks = [rng.choice(spots) for _ in range(rng.randint(1, 8))]
        _flip(data, rng, [p + 16 + rng.randrange(recs[[q for q, _ in recs].index(p)][1])
                          for p in picks])
        return bytes(data), ("exact", n)
    if kind == "timestamp":
        _flip(data, rng, [pos + rng.randrange(8)])
        return bytes(data), ("exact", n)
    if kind == "huge_caplen":
        value = rng.choice([0x7FFFFFFF, 0xFFFFFFFF, MAX_CAPLEN + 1,
                            rng.randrange(MAX_CAPLEN + 1, 1 << 32)])
        struct.pack_into(order + "I", data, pos + 8, value)
        return bytes(data), ("exact", n)
    if kind == "caplen_over_original":
        if rng.random() < 0.5:
            struct.pack_into(order + "I", data, pos + 8, caplen + rng.randint(1, 3000))
        else:
            struct.pack_into(order + "I", data, pos + 12, rng.randrange(caplen))
        return bytes(data), ("exact", n)
    if kind == "cut":
        cut = rng.randrange(len(base)) if rng.random() < 0.9 else rng.randrange(24)
        if cut < 24:
            return bytes(data[:cut]), ("exit_2",)
        return bytes(data[:cut]), ("exact", sum(1 for p, _ in recs if p < cut))
    if kind == "file_header":
        _flip(data, rng, [rng.randrange(24)])
        return bytes(data), ("exact_or_2", n, "")
    first = _flip(data, rng, [rng.randrange(24, len(data)) for _ in range(rng.randint(1, 16))])
    return bytes(data), ("at_least", sum(1 for p, c in recs if p + 16 + c <= first))


def pcapng_case(base: bytes, rng: random.Random, kind: str):
    blocks = pcapng_blocks(base)
    packets = [(p, length) for p, k, length in blocks if k == EPB]
    n = len(packets)
    data = bytearray(base)
    pos, length = packets[rng.randrange(n)]
    caplen = struct.unpack_from("<I", base, pos + 20)[0]
    if kind == "payload":
        _flip(data, rng, [pos + 28 + rng.randrange(caplen) for _ in range(rng.randint(1, 8))])
        return bytes(data), ("exact", n)
    if kind == "huge_caplen":
        struct.pack_into("<I", data, pos + 20, rng.choice([0x7FFFFFFF, length, caplen + 4 * 1024]))
        return bytes(data), ("exact", n)
    if kind == "interface":
        struct.pack_into("<I", data, pos + 8, rng.randint(1, 1 << 31))
        return bytes(data), ("exact", n)
    if kind == "block_length":
        at, _, size = blocks[rng.randrange(len(blocks))]
        value = rng.choice([0, 7, size + 4, size - 4, rng.randrange(1 << 32), 0x7FFFFFFF])
        struct.pack_into("<I", data, at + 4, value)
        return bytes(data), ("exact_or_2", n, f"pcapng block at offset {at}:")
    if kind == "cut":
        cut = rng.randrange(len(base))
        shb = blocks[0][2]
        if cut < shb:
            return bytes(data[:cut]), ("exit_2",)
        # a packet is in the file when its block's type field is
        return bytes(data[:cut]), ("exact", sum(1 for p, _ in packets if p + 4 <= cut))
    first = _flip(data, rng, [rng.randrange(len(data)) for _ in range(rng.randint(1, 16))])
    return bytes(data), ("at_least", sum(1 for p, length in packets if p + length <= first))


PCAP_KINDS = ("payload", "timestamp", "huge_caplen", "caplen_over_original", "cut", "file_header",
              "anywhere")
PCAPNG_KINDS = ("payload", "huge_caplen", "interface", "block_length", "cut", "anywhere")


def _inspect(path) -> tuple[int, int | None, str]:
    """(exit code, packets in = decoded + counted on exit 0, the error line on exit 2)."""
    r = CliRunner().invoke(cli, ["nfv", "inspect", str(path), "--json"])
    assert "Traceback" not in r.output and r.exit_code in (0, 2), (r.exit_code, r.output[-500:])
    if r.exit_code == 2:
        lines = [x for x in r.stderr.splitlines() if x.strip()]
        assert len(lines) == 1, r.stderr
        return 2, None, lines[0]
    summary = json.loads(r.stdout)
    counted = sum(v for k, v in summary["malformed"].items()
                  if not k.startswith("http_") and not k.endswith("_bytes"))
    assert summary["packets"] == summary["decoded_packets"] + counted
    return 0, summary["decoded_packets"] + counted, ""


def _check(expect, code: int, packets: int | None, line: str) -> str | None:
    """What is wrong with the outcome, or None."""
    rule = expect[0]
    if rule == "exit_2":
        return None if code == 2 else f"exit {code}, expected 2"
    if rule == "exact":
        return None if (code, packets) == (0, expect[1]) else \
            f"exit {code} with {packets} packets ({line}), expected exit 0 with {expect[1]}"
    if rule == "exact_or_2":
        if code == 2:
            return None if expect[2] in line else f"exit 2 with {line!r}, expected {expect[2]!r}"
        return None if packets == expect[1] else f"{packets} packets, expected {expect[1]}"
    return None if code == 2 or packets >= expect[1] else \
        f"{packets} packets, expected at least {expect[1]}"


@pytest.mark.parametrize("name", ["real", "gen", "gen-be-ns", "gen-ng"])
def test_corrupt_captures(bases, name, tmp_path, request):
    base = bases[name]
    kinds = PCAPNG_KINDS if name == "gen-ng" else PCAP_KINDS
    make = pcapng_case if name == "gen-ng" else pcap_case
    per_kind = 130 // len(kinds) + 1  # at least 130 cases per base
    if request.config.getoption("--runslow"):
        per_kind *= 8
    path = tmp_path / ("f.pcapng" if name == "gen-ng" else "f.pcap")
    failures = []
    cases = 0
    for kind in kinds:
        for seed in range(per_kind):
            rng = random.Random(f"{name}/{kind}/{seed}")
            data, expect = make(base, rng, kind)
            path.write_bytes(data)
            problem = _check(expect, *_inspect(path))
            cases += 1
            if problem:
                failures.append(f"{kind} seed {seed}: {problem}")
    assert cases >= 130
    assert not failures, f"{len(failures)} of {cases} cases: " + "; ".join(failures[:5])


@pytest.mark.parametrize("name", ["gen", "gen-be-ns", "gen-ng"])
def test_walk_by_steps_equals_one_walk(bases, name, tmp_path, monkeypatch):
    """The record walk releases the capture's pages a ``WALK_STEP`` of bytes at a time:
    steps of a few bytes to a few records (inside records, inside damage that the
    resynchronisation jumps over) give the records and counts of one walk over the whole
    file, on damaged files of every kind."""
    kinds = PCAPNG_KINDS if name == "gen-ng" else PCAP_KINDS
    make = pcapng_case if name == "gen-ng" else pcap_case
    path = tmp_path / ("f.pcapng" if name == "gen-ng" else "f.pcap")
    walked = 0
    for kind in kinds:
        for seed in range(3):
            data, _ = make(bases[name], random.Random(f"steps/{name}/{kind}/{seed}"), kind)
            path.write_bytes(data)
            monkeypatch.setattr(capture, "WALK_STEP", 1 << 40)
            one: Counter = Counter()
            try:
                ref = capture.span_table(path, data, one)
            except BadInput:
                continue
            for step in (1, 97, 1500):
                monkeypatch.setattr(capture, "WALK_STEP", step)
                counts: Counter = Counter()
                assert np.array_equal(capture.span_table(path, data, counts), ref), (kind, step)
                assert counts == one, (kind, seed, step)
            walked += 1
    assert walked >= 2 * len(kinds)
