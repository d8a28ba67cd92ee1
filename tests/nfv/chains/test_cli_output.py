"""`dl-nfv nfv chain` end to end: reports, rewritten pcaps whose checksums verify, bad input."""

from __future__ import annotations

import json
import struct

import dpkt
import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from dl_nfv.artifacts import load
from dl_nfv.cli.main import cli
from dl_nfv.nfv.chains import ops as chain_ops
from dl_nfv.nfv.chains.flowtable import DeviceFlowTable
from dl_nfv.nfv.chains.packets import load_packets, rewrite_checksums
from dl_nfv.nfv.traffic.generate import TraceSpec, generate_trace

from ..helpers import EXAMPLES, REAL_TRACE

CONFIG = EXAMPLES / "fw-nat-lb.yaml"


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def ones_sum(data: bytes) -> int:
    """The 16-bit ones' complement sum of ``data`` (padded), written out independently."""
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return total


def residues(path) -> list[tuple[int, int, tuple]]:
    """Per IPv4 packet: IP header sum, TCP/UDP sum with pseudo-header (0xFFFF: valid), tuple."""
    out = []
    with open(path, "rb") as fh:
        for _, frame in dpkt.pcap.Reader(fh):
            ip = dpkt.ethernet.Ethernet(frame).data
            raw = bytes(ip)
            l4 = raw[ip.hl * 4:ip.len]
            pseudo = ip.src + ip.dst + bytes([0, ip.p]) + struct.pack("!H", len(l4))
            out.append((ones_sum(raw[:ip.hl * 4]), ones_sum(pseudo + l4),
                        (ip.src, ip.data.sport, ip.dst, ip.data.dport)))
    return out


def test_chain_on_generated_trace_checksums_verify(tmp_path):
    pcap = tmp_path / "t.pcap"
    generate_trace(TraceSpec(flows=30, size_dist="uniform", seed=3), pcap)
    assert all(ip == l4 == 0xFFFF for ip, l4, _ in residues(pcap))
    reports = {}
    for engine in ("cpu", "tensor"):
        out, wpcap = tmp_path / f"{engine}.json", tmp_path / f"{engine}.pcap"
        r = invoke("nfv", "chain", "--config", CONFIG, "--trace", pcap, "--engine", engine,
                   "--batch-size", 97, "-o", out, "-w", wpcap)
        assert r.exit_code == 0, r.output
        reports[engine] = load(out, expect="chain-report")
        written = residues(wpcap)
        assert len(written) == reports[engine].packets_out == reports[engine].written
        assert all(ip == l4 == 0xFFFF for ip, l4, _ in written)
    a, b = reports["cpu"], reports["tensor"]
    assert a.packets_out == b.packets_out and a.nat == b.nat and a.lb == b.lb
    assert a.nat.translations == 30 and sum(a.lb.values()) == 30
    assert (tmp_path / "cpu.pcap").read_bytes() == (tmp_path / "tensor.pcap").read_bytes()
    tuples = [t for _, _, t in residues(tmp_path / "cpu.pcap")]
    assert bytes([203, 0, 113, 10]) in {src for src, _, _, _ in tuples}  # NAT's pool
    backends = {bytes([10, 2, 0, k]) for k in range(1, 5)}
    assert {dst for _, _, dst, _ in tuples} & backends  # the LB's backends
    r = invoke("show", tmp_path / "tensor.json")
    assert r.exit_code == 0 and "translations" in r.output and "firewall" in r.output


def test_real_trace_rewrites_keep_the_checksum_residue(tmp_path):
    """Loopback captures carry TCP checksums left to offload (wrong); the incremental
    update must keep each packet's residue, and make the IP header checksums valid."""
    out = tmp_path / "o.pcap"
    r = invoke("nfv", "chain", "--config", CONFIG, "--trace", REAL_TRACE, "--engine", "tensor",
               "-w", out, "--json")
    assert r.exit_code == 0, r.output
    report = json.loads(r.output)
    before, after = residues(REAL_TRACE), residues(out)
    assert len(after) == report["packets_out"] == len(before)
    assert all(ip == 0xFFFF for ip, _, _ in after)
    assert [l4 for _, l4, _ in before] == [l4 for _, l4, _ in after]
    assert any(b[2] != a[2] for b, a in zip(before, after))  # rewritten for real


@settings(max_examples=200, deadline=None)
@given(hs.lists(hs.integers(0, 0xFFFF), min_size=10, max_size=30),
       hs.tuples(*[hs.integers(0, 0xFFFFFFFF)] * 2, *[hs.integers(0, 0xFFFF)] * 2))
def test_incremental_checksum_equals_full(words, new):
    """RFC 1624 update == recomputing the sum over (addresses, ports, the rest)."""
    old = {"src": words[0] << 16 | words[1], "dst": words[2] << 16 | words[3],
           "sport": words[4], "dport": words[5]}
    rest = [*words[6:], 6]  # the pseudo-header's protocol: a real sum is never +0
    new = dict(zip(("src", "dst", "sport", "dport"), new))

    def full(f):
        data = struct.pack("!IIHH", f["src"], f["dst"], f["sport"], f["dport"])
        return 0xFFFF - ones_sum(data + struct.pack(f"!{len(rest)}H", *rest))

    ip_new, l4_new = rewrite_checksums(old, new, full(old), full(old), 6)
    assert ones_sum(struct.pack("!IIHH", new["src"], new["dst"], new["sport"], new["dport"])
                    + struct.pack(f"!{len(rest)}H", *rest) + struct.pack("!H", l4_new)) == 0xFFFF


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=hs.lists(hs.tuples(hs.sampled_from(["ins", "del", "ups"]),
                              hs.lists(hs.integers(0, 40), max_size=30)), max_size=8))
@pytest.mark.parametrize("host", [True, False], ids=["numpy", "torch"])
def test_flow_table_matches_a_dict(ops, host, monkeypatch):
    """Batched insert/delete/lookup/upsert with heavy collisions (tiny capacity, rehashes,
    tombstones); probes by numpy (a CPU's) and by torch."""
    import torch

    table = DeviceFlowTable(16, "cpu", {"v": -1})
    monkeypatch.setattr(chain_ops, "HOST", host)  # the same for every example
    model: dict[tuple[int, int], int] = {}
    for op, keys in ops:
        keys = sorted(set(keys))
        k1 = torch.tensor([k * 7919 - 100 for k in keys], dtype=torch.int64)
        k2 = torch.tensor([k % 3 for k in keys], dtype=torch.int64)
        slots = table.lookup(k1, k2)
        for k, a, b, s in zip(keys, k1.tolist(), k2.tolist(), slots.tolist()):
            assert (s >= 0) == ((a, b) in model), k
        if op == "ups":  # every key gets a slot of its own, the present keep their values
            got, present = table.upsert(k1, k2)
            new = slots < 0
            assert present.tolist() == (~new).tolist()
            assert bool((got >= 0).all()) and len(set(got.tolist())) == len(keys)
            assert table.lookup(k1, k2).tolist() == got.tolist()
            table.cols["v"][got[new]] = k1[new]
            model.update({(a, b): a for a, b in zip(k1[new].tolist(), k2[new].tolist())})
        elif op == "ins":
            new = slots < 0
            got = table.insert(k1[new], k2[new])
            table.cols["v"][got] = k1[new]
            model.update({(a, b): a for a, b in zip(k1[new].tolist(), k2[new].tolist())})
        else:
            table.delete(slots[slots >= 0])
            for a, b in zip(k1.tolist(), k2.tolist()):
                model.pop((a, b), None)
        assert table.items() == {k: (v,) for k, v in model.items()}


@pytest.mark.parametrize(("edit", "needle"), [
    (("pool: [203.0.113.10, 203.0.113.11]", "pool: []"), "l4_chain[1]: pool:"),
    (("pool: [203.0.113.10, 203.0.113.11]", "pool: [203.0.113.300]"), "l4_chain[1]: pool[0]: '203.0.113.300'"),
    (("src: 10.0.1.0/24}", "src: 10.0.1.0/33}"), "l4_chain[0].acl[0]: src:"),
    (("dst_port: \"8000-8999\"", "dst_port: \"8999-8000\""), "l4_chain[0].acl[1]: dst_port:"),
    (("table_size: 65537", "table_size: 65536"), "not prime"),
    (("ports: \"20000-29999\"", "ports: \"20000-70000\""), "l4_chain[1]: ports:"),
    (("ports: \"20000-29999\"", "ports: \"20000-\""), "l4_chain[1]: ports:"),
    (("dst_port: \"8000-8999\"", "dst_port: \"8000-\""), "l4_chain[0].acl[1]: dst_port:"),
])
def test_bad_config_exit_2(tmp_path, edit, needle):
    bad = tmp_path / "bad.yaml"
    text = CONFIG.read_text()
    assert edit[0] in text
    bad.write_text(text.replace(*edit))
    r = invoke("nfv", "chain", "--config", bad, "--trace", REAL_TRACE)
    assert r.exit_code == 2, r.output
    assert needle in r.output and "Traceback" not in r.output
    assert len(r.output.strip().splitlines()) == 1


def test_bench_chain_path(tmp_path):
    out = tmp_path / "b.json"
    r = invoke("nfv", "bench", "--config", CONFIG, "--trace", REAL_TRACE, "--engines",
               "cpu,tensor", "--batch-sizes", "16,1000", "-o", out)
    assert r.exit_code == 0, r.output
    bench = load(out, expect="chain-bench")
    assert [(row.engine, row.batch_size) for row in bench.rows] == [
        ("cpu", 16), ("tensor", 16), ("cpu", 1000), ("tensor", 1000)]
    assert len({row.packets_out for row in bench.rows}) == 1
    assert np.all([row.mpps > 0 for row in bench.rows])


def test_bench_chain_repeats_keep_each_rows_fastest_run(monkeypatch):
    """``--repeats``: every engine runs that many times from fresh state (the same packets
    out each time, or the bench fails) and its row is the run with the most Mpps."""
    from dl_nfv.nfv.chains import run as chain_run

    real, speeds = chain_run.chain_report, iter([1.0, 3.0, 2.0, 5.0, 4.0, 6.0])

    def timed(*args):  # the real report, its Mpps set to the next figure
        report = real(*args)
        return {**report, "mpps": next(speeds)}

    monkeypatch.setattr(chain_run, "chain_report", timed)
    result = chain_run.bench_chain(CONFIG, REAL_TRACE, ["cpu", "tensor"], [64], repeats=3)
    assert [(row["engine"], row["mpps"]) for row in result["rows"]] == [("cpu", 3.0),
                                                                        ("tensor", 6.0)]
    assert len({row["packets_out"] for row in result["rows"]}) == 1


def test_bench_chain_warms_up_untimed_then_runs_three_times_by_default(monkeypatch):
    """``nfv bench`` on a chain: per engine and batch size, ``WARM_UP_BATCHES`` batches on a
    chain of their own that no row reports, then ``BENCH_REPEATS`` timed runs of the whole
    trace, each on a fresh chain."""
    from dl_nfv.nfv.chains import run as chain_run

    real, calls = chain_run.drive, []

    def recorded(chain, packets, size):
        calls.append((chain, len(packets), size))  # held: ids stay distinct
        return real(chain, packets, size)

    monkeypatch.setattr(chain_run, "drive", recorded)
    r = invoke("nfv", "bench", "--config", CONFIG, "--trace", REAL_TRACE, "--engines", "tensor",
               "--batch-sizes", "8", "--json")
    assert r.exit_code == 0, r.output
    total = len(load_packets(REAL_TRACE).packets)
    assert chain_run.WARM_UP_BATCHES * 8 < total
    assert [(n, size) for _, n, size in calls] == \
        [(chain_run.WARM_UP_BATCHES * 8, 8)] + [(total, 8)] * chain_run.BENCH_REPEATS
    assert len({id(chain) for chain, _, _ in calls}) == 1 + chain_run.BENCH_REPEATS


def test_show_renders_the_l4_chain():
    r = invoke("show", CONFIG, "--width", "200")
    assert r.exit_code == 0, r.output
    config = load(CONFIG)
    for i, spec in enumerate(config.l4_chain):
        assert f"│ {i} │ {spec.nf.value}" in r.output
    nat = next(s for s in config.l4_chain if s.nf.value == "nat")
    lb = next(s for s in config.l4_chain if s.nf.value == "lb")
    assert f"pool {','.join(nat.pool)} ports {nat.ports}" in r.output
    assert f"Maglev table {lb.table_size}" in r.output


@pytest.mark.parametrize(("name", "needle"), [
    ("out.txt", "the extension must be .pcap or .pcapng"),
    ("missing/out.pcap", "does not exist"),
])
def test_bad_write_path_exit_2(tmp_path, name, needle):
    out = tmp_path / name
    r = invoke("nfv", "chain", "--config", CONFIG, "--trace", REAL_TRACE, "-w", out)
    assert r.exit_code == 2, r.output
    assert needle in r.output and "-w" in r.output and "Traceback" not in r.output
    assert len(r.output.strip().splitlines()) == 1 and not out.exists()
