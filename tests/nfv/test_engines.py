"""Every engine gives identical NF outputs, and those outputs match independent references."""

from __future__ import annotations

import ipaddress
import mmap
from types import SimpleNamespace

import numpy as np
import pytest

from dl_nfv.nfv.engines import parse_engine
from dl_nfv.nfv.engines.runner import EngineOptions, PayloadRelease, run_engine, usable_cores
from dl_nfv.nfv.nfs.http_lb import P
from dl_nfv.nfv.nfs.snort import load_rules
from dl_nfv.nfv.traffic import load_trace
from dl_nfv.nfv.traffic.generate import TraceSpec, generate_trace

from .helpers import REAL_TRACE, RULES

ENGINES = ("cpu", "gpu", "fixed:0.3", "flowshader")


def _chain(firewall: bool = True):
    acl = (SimpleNamespace(action="deny", proto="tcp", src="10.0.0.0/26", dst="any",
                           src_port="any", dst_port="any"),
           SimpleNamespace(action="allow", proto="any", src="any", dst="any", src_port="any",
                           dst_port="1-1023"))
    specs = [SimpleNamespace(nf="monitor"),
             SimpleNamespace(nf="ids", rules=str(RULES)),
             SimpleNamespace(nf="http-lb", backends=("a", "b", "c"), policy="host")]
    if firewall:
        specs.insert(0, SimpleNamespace(nf="firewall", acl=acl, default="deny"))
    return specs


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    d = tmp_path_factory.mktemp("traces")
    out = {"real": load_trace(REAL_TRACE)}
    for name, dist in (("zipf", "zipf:1.2"), ("uniform", "uniform")):
        generate_trace(TraceSpec(flows=70, size_dist=dist, mean_exchanges=3, attack_rate=0.08,
                                 seed=11), d / f"{name}.pcap")
        out[name] = load_trace(d / f"{name}.pcap")
    return out


def _run(trace, engine, specs, batch=48):
    options = EngineOptions(batch_size=batch, workers=2, calibration_batches=2, reprofile_every=5,
                            batch_step=16)
    return run_engine(trace, specs, parse_engine(engine), options)


@pytest.mark.parametrize("name", ["real", "zipf", "uniform"])
@pytest.mark.parametrize("firewall", [False, True])
def test_engines_agree(traces, name, firewall):
    trace = traces[name]
    results = {e: _run(trace, e, _chain(firewall), batch=16 if name == "real" else 48)
               for e in ENGINES}
    ref = results["cpu"]
    assert len(ref.http) > 0 and len(ref.monitor) > 0
    for engine, r in results.items():
        assert np.array_equal(r.http, ref.http), engine
        assert np.array_equal(r.drops, ref.drops), engine
        assert r.alerts == ref.alerts, engine
        assert np.array_equal(r.monitor, ref.monitor), engine
    assert all(b.gpu_messages == b.messages for b in results["gpu"].batches)
    assert all(b.cpu_messages == b.messages for b in results["cpu"].batches)
    mixed = [b for b in results["fixed:0.3"].batches if b.gpu_messages and b.cpu_messages]
    assert mixed  # both sides ran in the same batches, so flows moved between them
    if firewall:
        assert len(ref.drops) > 0 or name == "real"


def test_flowshader_probes_then_follows_its_model(traces):
    """Calibration probes are a fraction of the batch; every later batch is a policy class
    chosen by the cost model (or a re-profiling probe), and its prediction was learnt from."""
    trace = traces["uniform"]
    options = EngineOptions(batch_size=256, workers=2, calibration_batches=2, reprofile_every=4,
                            adaptive_batch=False)
    r = run_engine(trace, _chain(firewall=False), parse_engine("flowshader"), options)
    modes = [b.mode for b in r.batches]
    # two probes, and two more: with double buffering batch k + 1 is split when batch
    # k - 1 was measured, batch 0 (one-time costs) is not sampled, and the fit needs two
    assert modes[:4] == ["calibrate"] * 4 and "calibrate" not in modes[4:]
    assert [b.messages for b in r.batches[:4]] == [64] * 4  # max(64, 256 // (4 x 2))
    assert all(b.gpu_messages and b.cpu_messages for b in r.batches[:4])
    steady = [b for b in r.batches[4:] if b.mode != "reprofile"]
    assert steady and all(b.mode in ("cpu", "gpu", "model") for b in steady)
    for b in steady:
        assert (b.mode == "cpu") == (b.gpu_messages == 0)
        assert (b.mode == "gpu") == (b.cpu_messages == 0)
    assert sum(r.rates[f"batches_{k}"] for k in ("cpu", "gpu", "model")) == len(steady)
    assert 1.0 <= r.rates["parallel_cores"] <= usable_cores()


def _streams(trace):
    """Per (flow, direction): the payload stream and each message's end offset."""
    streams = {}
    for i in range(trace.n_messages):
        key = (int(trace.msg_flow[i]), int(trace.msg_dir[i]))
        data, ends = streams.setdefault(key, [b"", []])
        data += trace.message_bytes(i)
        streams[key] = [data, ends + [(len(data), int(trace.msg_index[i]))]]
    return streams


def reference_alerts(trace):
    """Naive search over each direction's whole stream; first match -> message index.

    A rule fires once per flow, at the earliest message by which all its contents
    were seen in one direction the rule inspects."""
    rules = load_rules(RULES)
    first: dict[tuple[int, int, bytes, bool], int] = {}
    for (flow, direction), (data, ends) in _streams(trace).items():
        low = data.lower()
        for rule in rules:
            for c in rule.contents:
                hay = low if c.nocase else data
                pat = c.pattern.lower() if c.nocase else c.pattern
                at = hay.find(pat)
                if at < 0:
                    continue
                end = at + len(pat)
                index = next(i for e, i in ends if e >= end)
                key = (flow, direction, pat, c.nocase)
                first[key] = min(first.get(key, index), index)
    alerts = []
    for flow, f in enumerate(trace.flows):
        for rule in rules:
            when = []
            for direction in (0, 1):
                if not rule.applies(f.proto, f.client_port, f.server_port, direction,
                                    f.established):
                    continue
                keys = [(flow, direction, c.pattern.lower() if c.nocase else c.pattern,
                         c.nocase) for c in rule.contents]
                if all(k in first for k in keys):
                    when.append(max(first[k] for k in keys))
            if when:
                alerts.append((flow, min(when), rule.sid))
    return sorted(alerts)


@pytest.mark.parametrize("name", ["real", "zipf"])
def test_outputs_match_independent_references(traces, name):
    trace = traces[name]
    r = _run(trace, "flowshader", _chain(firewall=False))
    assert r.alerts == reference_alerts(trace) and r.alerts
    # monitor: sums and extremes straight from the trace's message columns
    for flow, msgs, packets, nbytes, first, last in r.monitor.tolist():
        sel = trace.msg_flow == flow
        assert msgs == sel.sum() and packets == trace.msg_packets[sel].sum()
        assert nbytes == trace.msg_len[sel].sum()
        assert first == trace.msg_ts_us[sel].min() and last == trace.msg_ts_us[sel].max()
    # http: host header by an independent parse, backend = host hash mod 3
    for flow, index, kind, method, status, length, host, url, backend in r.http.tolist():
        i = int(np.flatnonzero((trace.msg_flow == flow) & (trace.msg_index == index))[0])
        head = trace.message_bytes(i)[:int(trace.msg_header_len[i])].decode("latin-1")
        lines = head.split("\r\n")
        fields = {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:] if x)}
        start = lines[0].split(" ")
        if kind == 1:
            assert start[0] == ["GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH",
                                "CONNECT", "TRACE"][method]
            assert url == int.from_bytes(start[1].encode("latin-1"), "big") % P
            assert backend == (host if host >= 0 else url) % 3
        else:
            assert status == int(start[1]) and backend == -1
        want_host = fields.get("host")
        assert host == (-1 if want_host is None else
                        int.from_bytes(want_host.lower().encode("latin-1"), "big") % P)
        assert length == int(fields.get("content-length", -1))


def test_firewall_matches_acl_reference(traces):
    trace = traces["zipf"]
    r = _run(trace, "flowshader", _chain(firewall=True))
    denied = {i for i, f in enumerate(trace.flows)
              if ipaddress.ip_address(f.client) in ipaddress.ip_network("10.0.0.0/26")}
    dropped = set(r.drops[:, 0].tolist())
    assert dropped == denied and denied
    for flow in denied:  # every message of a denied connection is dropped
        assert (r.drops[:, 0] == flow).sum() == (trace.msg_flow == flow).sum()
    assert not set(r.monitor[:, 0].tolist()) & denied


def test_pattern_split_across_messages_and_batches(tmp_path):
    """A non-HTTP flow on port 80: '/etc/pa' + 'sswd' in two client turns, one batch each."""
    from .helpers import http_connection, write_pcap

    c, s = bytes([10, 0, 0, 9]), bytes([10, 1, 0, 9])
    frames = http_connection(c, s, 4444, [(0, b"xx/etc/pa"), (1, b"ok"), (0, b"sswd yy"),
                                          (1, b"ROOT:x:0:"), (1, b"0:abc")])
    trace = load_trace(write_pcap(tmp_path / "split.pcap", frames))
    assert trace.flows[0].app == "tcp" and trace.n_messages == 4
    for engine in ENGINES:
        r = run_engine(trace, _chain(firewall=False), parse_engine(engine),
                       EngineOptions(batch_size=1, workers=1, calibration_batches=1))
        assert r.alerts == [(0, 2, 1000001)], engine  # 'root:x:0:0:' is case-sensitive


@pytest.mark.gpu
def test_cuda_tensor_path_matches_cpu(traces):
    """On a CUDA device the tensor path must give the CPU path's outputs."""
    trace = traces["zipf"]
    specs = _chain(firewall=True)
    ref = _run(trace, "cpu", specs)
    for engine in ("gpu", "flowshader"):
        r = run_engine(trace, specs, parse_engine(engine),
                       EngineOptions(batch_size=48, workers=2, device="cuda"))
        assert r.device.startswith("cuda")
        assert np.array_equal(r.http, ref.http) and np.array_equal(r.drops, ref.drops)
        assert r.alerts == ref.alerts and np.array_equal(r.monitor, ref.monitor)


@pytest.mark.parametrize("shared", [True, False])
def test_payload_release_removes_only_pages_of_done_messages(shared):
    """``PayloadRelease``: after ``done(stop)`` a page of the payload mapping (shared or
    private) reads zeros exactly when no message from ``stop`` on has a byte on it (messages
    in no order of the buffer, some over several pages, bytes of no message between them);
    the messages not done read their bytes."""
    page = mmap.PAGESIZE
    rng = np.random.default_rng(3)
    n = 300
    lengths = rng.integers(0, 3 * page, n)
    lengths[rng.random(n) < 0.1] = 0
    gaps = rng.integers(0, 200, n)
    offsets = np.cumsum(lengths + gaps) - lengths
    size = int(offsets[-1] + lengths[-1] + 100)
    perm = rng.permutation(n)  # trace order is not buffer order
    off, ln = offsets[perm], lengths[perm]
    blob = mmap.mmap(-1, size, flags=mmap.MAP_SHARED if shared else mmap.MAP_PRIVATE)
    blob[:] = b"\x01" * size
    release = PayloadRelease(SimpleNamespace(blob=blob, msg_offset=off, msg_len=ln))
    pages = -(-size // page)
    for stop in (1, 40, 41, 150, 299, 300):
        release.done(stop)
        touched = np.zeros(pages, dtype=bool)
        for a, k in zip(off[stop:].tolist(), ln[stop:].tolist()):
            if k:
                touched[a // page:(a + k - 1) // page + 1] = True
                assert blob[a:a + k] == b"\x01" * k
        zero = np.array([blob[p * page] == 0 for p in range(pages)])
        assert np.array_equal(zero, ~touched), stop
    assert zero.all()


def test_released_payload_changes_no_output(tmp_path):
    """A run that hands its trace's message bytes back as batches are done (one and two
    workers) gives the outputs of one that keeps them."""
    path = tmp_path / "z.pcap"
    generate_trace(TraceSpec(flows=60, size_dist="zipf:1.2", mean_exchanges=4,
                             attack_rate=0.1, seed=5), path)
    for workers in (1, 2):
        options = EngineOptions(batch_size=32, workers=workers)
        kept = run_engine(load_trace(path), _chain(False), parse_engine("cpu"), options)
        trace = load_trace(path)
        assert isinstance(trace.blob, mmap.mmap)
        released = run_engine(trace, _chain(False), parse_engine("cpu"), options,
                              release_payload=True)
        for name in ("http", "drops", "monitor"):
            assert np.array_equal(getattr(released, name), getattr(kept, name)), name
        assert released.alerts == kept.alerts and len(kept.alerts) > 0
        assert not trace.payload.any()  # every page handed back: zeros
