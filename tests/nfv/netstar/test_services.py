"""NetStar against real servers: Redis (redis-server) and DNS (dnsmasq) on loopback.

Outputs equal the embedded store's in every style; the malware detector and
URL filter find what a zone the test writes says they should; a Redis killed
mid-run or a DNS server gone silent holds flows, and the run completes with
the undisturbed run's outputs.
"""

from __future__ import annotations

import hashlib
import re
import threading

import pytest

from dl_nfv.nfv.netstar import servers
from dl_nfv.nfv.netstar.run import RunOptions, run_outcome
from dl_nfv.nfv.netstar.services import ServiceUnavailable
from tests.nfv.helpers import EXAMPLES, REAL_TRACE

from .conftest import need

STYLES = ("async", "callback", "blocking")
_HOST = re.compile(rb"\r\nhost:[ \t]*([^\r\n:]+)", re.I)


def outputs(report: dict) -> dict:
    return {"alerts": report["alerts"], "outputs": report["outputs"],
            "digest": report["outputs_digest"]}


@pytest.mark.parametrize("name", ["netstar-ids.yaml", "netstar-nat.yaml"])
def test_redis_outputs_equal_the_embedded_store(redis_server, generated, name):
    _, trace = generated
    reference, _ = run_outcome(EXAMPLES / name, None, RunOptions(), trace=trace)
    for style in STYLES:
        report, _ = run_outcome(EXAMPLES / name, None,
                                RunOptions(style=style, store=redis_server.url), trace=trace)
        assert outputs(report) == outputs(reference), style
        assert report["services"]["store"]["requests"] > 0


@pytest.mark.parametrize("name", ["netstar-ids.yaml", "netstar-nat.yaml"])
def test_real_trace_on_redis(redis_server, name):
    embedded, _ = run_outcome(EXAMPLES / name, REAL_TRACE, RunOptions())
    for style in STYLES:
        report, _ = run_outcome(EXAMPLES / name, REAL_TRACE,
                                RunOptions(style=style, store=redis_server.url))
        assert outputs(report) == outputs(embedded), style
    assert embedded["alerts"] or name != "netstar-ids.yaml"


def _responses(trace):
    """(flow, index, body) of every Content-Length response with a body."""
    out = []
    for i in range(trace.n_messages):
        if trace.msg_kind[i] != 2:
            continue
        data = trace.message_bytes(i)
        head = data[:int(trace.msg_header_len[i])].lower()
        body = data[int(trace.msg_header_len[i]):]
        if body and b"content-length" in head:
            out.append((int(trace.msg_flow[i]), int(trace.msg_index[i]), body))
    return out


@pytest.fixture(scope="module")
def malware_zone(tmp_path_factory, generated):
    """dnsmasq knowing 5 of the trace's response bodies as malware."""
    need("dnsmasq", "dnsmasq-base")
    _, trace = generated
    bad = [hashlib.sha256(body).hexdigest() for _, _, body in _responses(trace)[::97][:5]]
    server = servers.start_dnsmasq(tmp_path_factory.mktemp("dns"),
                                   txt={f"{sha[:32]}.{sha[32:]}.hash.mhr.example": "1700000000 87"
                                        for sha in bad})
    yield server, set(bad)
    server.stop()


def test_malware_detector_finds_the_registered_hashes(malware_zone, redis_server, generated):
    server, bad = malware_zone
    _, trace = generated
    infected = {}
    for flow, index, body in _responses(trace):
        if hashlib.sha256(body).hexdigest() in bad:
            infected[flow] = min(index, infected.get(flow, index))
    reports = []
    for style, store in (("async", redis_server.url), ("callback", "embedded"),
                         ("blocking", redis_server.url)):
        report, out = run_outcome(EXAMPLES / "netstar-malware.yaml", None,
                                  RunOptions(style=style, store=store, dns=server.address),
                                  trace=trace)
        reports.append(outputs(report))
        assert {(a[0], a[1]) for a in out.alerts} == set(infected.items())
        # the infected response and everything after it in its flow is dropped
        dropped = {(f, i) for f, i, _ in out.drops}
        expected = {(int(f), int(i)) for f, i in zip(trace.msg_flow, trace.msg_index)
                    if int(f) in infected and int(i) >= infected[int(f)]}
        assert dropped == expected
    assert all(r == reports[0] for r in reports)
    assert len(infected) >= 3


def test_url_filter_blocks_hosts_resolving_into_blocked_networks(tmp_path, generated):
    need("dnsmasq", "dnsmasq-base")
    _, trace = generated
    hosts = {f"www.site{i}.example": [f"10.66.0.{i}"] for i in range(5)}  # blocked network
    hosts.update({f"www.site{i}.example": [f"203.0.113.{i}"] for i in range(5, 30)})
    server = servers.start_dnsmasq(tmp_path / "dns", hosts=hosts)
    try:
        expected = set()
        for i in range(trace.n_messages):
            m = _HOST.search(trace.message_bytes(i)) if trace.msg_kind[i] == 1 else None
            if m and m.group(1).decode().lower() in {f"www.site{k}.example" for k in range(5)}:
                expected.add((int(trace.msg_flow[i]), int(trace.msg_index[i])))
        reports = []
        for style in STYLES:
            report, out = run_outcome(EXAMPLES / "netstar-urlfilter.yaml", None,
                                      RunOptions(style=style, dns=server.address), trace=trace)
            assert {(f, i) for f, i, _ in out.drops} == expected
            reports.append(outputs(report))
        assert reports[0] == reports[1] == reports[2] and expected
    finally:
        server.stop()


class _Outage:
    """At the ``at``-th finished message, take a server down; bring it back ``for_s`` later."""

    def __init__(self, at: int, down, up, for_s: float):
        self.at, self.down, self.up, self.for_s = at, down, up, for_s
        self.thread: threading.Thread | None = None

    def __call__(self, finished: int) -> None:
        if finished == self.at and self.thread is None:
            self.down()
            self.thread = threading.Timer(self.for_s, self.up)
            self.thread.start()


@pytest.mark.parametrize("style", ["async", "callback"])
def test_redis_killed_mid_run(durable_redis, generated, chain_config, style):
    _, trace = generated
    cfg = chain_config  # firewall, nat (slot claims), ids
    reference, _ = run_outcome(cfg, None, RunOptions(), trace=trace)
    outage = _Outage(trace.n_messages // 3, durable_redis.kill, durable_redis.restart, 0.5)
    report, _ = run_outcome(cfg, None, RunOptions(style=style, store=durable_redis.url,
                                                  progress=outage), trace=trace)
    outage.thread.join()
    assert outputs(report) == outputs(reference)
    store = report["services"]["store"]
    assert store["retries"] > 0 and store["held_flows"] > 0


@pytest.mark.parametrize("style", ["async", "blocking"])
def test_redis_gone_for_good_fails_the_run_after_the_budget(durable_redis, style):
    outage = _Outage(20, durable_redis.kill, lambda: None, 0.0)
    with pytest.raises(ServiceUnavailable, match=f"Redis at 127.0.0.1:{durable_redis.port}"):
        run_outcome(EXAMPLES / "netstar-ids.yaml", REAL_TRACE,
                    RunOptions(style=style, store=durable_redis.url, retry_budget_s=0.3,
                               progress=outage))


def test_redis_killed_mid_run_blocking(durable_redis):
    """The blocking clients retry too (on the loopback capture: every write is fsynced)."""
    cfg = EXAMPLES / "netstar-ids.yaml"
    reference, _ = run_outcome(cfg, REAL_TRACE, RunOptions())
    outage = _Outage(20, durable_redis.kill, durable_redis.restart, 0.5)
    report, _ = run_outcome(cfg, REAL_TRACE, RunOptions(style="blocking", store=durable_redis.url,
                                                        progress=outage))
    outage.thread.join()
    assert outputs(report) == outputs(reference)
    assert report["services"]["store"]["retries"] > 0


def test_dns_silent_mid_run(malware_zone, generated):
    server, _ = malware_zone
    _, trace = generated
    cfg = EXAMPLES / "netstar-malware.yaml"
    reference, _ = run_outcome(cfg, None, RunOptions(dns=server.address), trace=trace)
    outage = _Outage(trace.n_messages // 4, server.pause, server.resume, 1.5)
    report, _ = run_outcome(cfg, None, RunOptions(dns=server.address, progress=outage),
                            trace=trace)
    outage.thread.join()
    assert outputs(report) == outputs(reference)
    assert report["services"]["dns"]["retries"] > 0 and report["services"]["dns"]["held_flows"] > 0
