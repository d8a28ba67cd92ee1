"""The async-flow runtime with the embedded store: same outputs in every style, per-flow
order under random waits, many flows waiting at once, and agreement with ``nfv run``."""

from __future__ import annotations

import random
from collections import defaultdict

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dl_nfv.nfv.netstar.events import Message, dechunk
from dl_nfv.nfv.netstar.run import RunOptions, run_outcome
from dl_nfv.nfv.run import run_config
from dl_nfv.nfv.traffic.generate import TraceSpec, generate_trace
from dl_nfv.nfv.traffic.trace import load_trace
from tests.nfv.helpers import EXAMPLES, REAL_TRACE

from .conftest import ACL, write_config

STYLES = ("async", "callback", "blocking")
def outputs(report: dict) -> dict:
    return {"alerts": report["alerts"], "outputs": report["outputs"],
            "digest": report["outputs_digest"]}


@pytest.mark.parametrize("name", ["netstar-ids.yaml", "netstar-nat.yaml"])
def test_styles_agree_on_the_real_trace(name):
    reports = [run_outcome(EXAMPLES / name, REAL_TRACE, RunOptions(style=s))[0] for s in STYLES]
    assert outputs(reports[0]) == outputs(reports[1]) == outputs(reports[2])
    assert reports[0]["messages"] == 58 and reports[0]["flows"] == 12


def test_styles_agree_on_a_generated_trace(chain_config, generated):
    _, trace = generated
    reports = [run_outcome(chain_config, None, RunOptions(style=s), trace=trace)[0]
               for s in STYLES]
    assert outputs(reports[0]) == outputs(reports[1]) == outputs(reports[2])
    fw, nat, ids = (reports[0]["outputs"][n] for n in ("firewall", "nat", "ids"))
    assert fw["dropped_messages"] > 0 and ids["alerts"] > 0
    # every message the firewall let through reaches the NAT, and the NAT drops none
    assert nat["messages"] == trace.n_messages - fw["dropped_messages"]
    assert ids["messages"] == nat["messages"]


def _five(alert_flow) -> tuple:
    return (alert_flow.proto, alert_flow.src, alert_flow.sport, alert_flow.dst, alert_flow.dport)


def test_ids_alerts_equal_the_batch_engines(generated):
    path, trace = generated
    report, _ = run_outcome(EXAMPLES / "netstar-ids.yaml", None, RunOptions(), trace=trace)
    mine = sorted((tuple(a["flow"].values()), a["message_index"], int(a["code"]))
                  for a in report["alerts"])
    batch = run_config(EXAMPLES / "ids.yaml", path, engine="cpu", trace=trace, workers=1)
    theirs = sorted((_five(a.flow), a.message_index, a.sid) for a in batch.alerts)
    assert mine == theirs and len(mine) > 10


def test_firewall_drops_equal_the_batch_engines(tmp_path, generated):
    path, trace = generated
    cfg = write_config(tmp_path, "fw", f"  - nf: firewall{ACL}")
    report, out = run_outcome(cfg, None, RunOptions(style="callback"), trace=trace)
    batch = run_config(cfg, path, engine="cpu", trace=trace, workers=1)
    per_flow = defaultdict(int)
    for flow, _, _ in out.drops:
        per_flow[tuple(trace.flows[flow].five_tuple().values())] += 1
    assert dict(per_flow) == {_five(d.flow): d.messages for d in batch.outputs.firewall.drops}
    assert report["outputs"]["firewall"]["dropped_messages"] == batch.outputs.firewall.dropped_messages


def test_nat_maps_the_ith_flow_to_the_ith_slot(chain_config, generated):
    _, trace = generated
    _, out = run_outcome(chain_config, None, RunOptions(), trace=trace)
    seen = {flow: value for flow, nf, value in out.notes if nf == 1}
    assert len(seen) == len(trace.flows)  # every flow has messages
    for flow, value in seen.items():  # 2 addresses x 200 ports: 400 slots for 150 flows
        assert value == f"198.51.100.{1 + flow // 200}:{2000 + flow % 200}"


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**16), style=st.sampled_from(["async", "callback"]))
def test_per_flow_order_holds_under_random_latencies(chain_config, generated, seed, style):
    _, trace = generated
    rng = random.Random(seed)
    options = RunOptions(style=style, record_order=True, window=512,
                         store_latency_s=lambda: rng.random() * 0.002)
    report, out = run_outcome(chain_config, None, options, trace=trace)
    last: dict = {}
    for nf, flow, index in out.order:
        assert index > last.get((nf, flow), -1), (nf, flow, index)
        last[(nf, flow)] = index
    # and the outputs are those of the blocking run, which has no overlap at all
    reference, _ = run_outcome(chain_config, None, RunOptions(style="blocking"), trace=trace)
    assert outputs(report) == outputs(reference)


def test_thousands_of_flows_wait_at_once(tmp_path):
    path = tmp_path / "many.pcap"
    generate_trace(TraceSpec(flows=2000, size_dist="uniform", mean_exchanges=1, seed=3), path)
    trace = load_trace(path)
    for style in ("async", "callback"):
        report, _ = run_outcome(EXAMPLES / "netstar-ids.yaml", None,
                                RunOptions(style=style, store_latency_s=0.02), trace=trace)
        # every flow's first request waits on the store while the others are read
        assert report["services"]["store"]["peak_outstanding"] == 2000
        assert report["flows"] == 2000


def test_chunked_bodies_are_decoded():
    body = b"4\r\nWiki\r\n6;ext=1\r\npedia \r\nE\r\nin \r\n\r\nchunks.\r\n0\r\n\r\n"
    assert dechunk(body) == b"Wikipedia in \r\n\r\nchunks."
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    msg = Message(0, 0, 1, 2, head + body, len(head), 0)
    assert msg.body == b"Wikipedia in \r\n\r\nchunks."
    assert msg.header("TRANSFER-encoding") == "chunked"
