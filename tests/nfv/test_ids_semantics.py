"""What a Snort rule means, on hand-written connections, on every engine.

Each connection below is built for one question; the alerts expected are read
off the rules (``->`` from the rule's source to its destination, ``<>`` either
way, all contents in one direction's data, ``flow`` options), not taken from
the IDS. Flows are numbered in the order they appear in the capture; message
indices count a flow's messages in order (HTTP: request 0, response 1, ...).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from dl_nfv.nfv.engines import parse_engine
from dl_nfv.nfv.engines.runner import EngineOptions, run_engine
from dl_nfv.nfv.traffic import load_trace

from .helpers import http_connection, write_pcap

RULES = """\
alert tcp any any -> any 18080 (msg:"request"; content:"attack"; sid:1;)
alert tcp any 18080 -> any any (msg:"response"; content:"secret"; sid:2;)
alert tcp any any -> any 18080 (msg:"two contents"; content:"alpha"; content:"beta"; sid:3;)
alert tcp any any <> any 18080 (msg:"either way"; content:"gamma"; sid:4;)
alert tcp any any -> any 18080 (msg:"sqli"; content:"union select"; nocase; sid:5;)
alert tcp any any -> any any (msg:"established"; content:"omega"; flow:established; sid:6;)
alert tcp any any <> any any (msg:"to client"; content:"delta"; flow:to_client; sid:7;)
alert tcp any 1024: -> any [18080,18443] (msg:"both ports"; content:"kappa"; sid:8;)
"""

SERVER = bytes([10, 9, 0, 1])


def _get(target: str) -> bytes:
    return f"GET {target} HTTP/1.1\r\nHost: h\r\n\r\n".encode()


def _ok(body: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)


# (name, messages, options, expected alerts as (message index, sid))
CONNECTIONS = [
    # request only: 'attack' in what the client sends to 18080
    ("request", [(0, _get("/attack")), (1, _ok(b"fine"))], {}, [(0, 1)]),
    # response only: 'attack' from the server is not the request rule's; 'secret' is sid 2's
    ("response", [(0, _get("/x")), (1, _ok(b"attack secret"))], {}, [(1, 2)]),
    # split across directions: 'alpha' in the request, 'beta' in the response: no sid 3
    ("split directions", [(0, _get("/alpha")), (1, _ok(b"beta"))], {}, []),
    # both contents in the client's data, in two requests: sid 3 when the second arrives
    ("same direction", [(0, _get("/alpha")), (1, _ok(b"ok")), (0, _get("/beta"))], {}, [(2, 3)]),
    # a pattern cut across 3-byte segments is still found
    ("segments", [(0, _get("/xxattackxx")), (1, _ok(b"ok"))], {"mss": 3}, [(0, 1)]),
    # '<>': in the response as well as in a request
    ("either way, response", [(0, _get("/x")), (1, _ok(b"gamma"))], {}, [(1, 4)]),
    ("either way, request", [(0, _get("/gamma")), (1, _ok(b"ok"))], {}, [(0, 4)]),
    # evasion: a literal space in the request line; HTTP framing fails, the bytes are
    # still inspected as raw stream data
    ("evasion", [(0, b"GET /q?id=1%20UNION SELECT%20user HTTP/1.1\r\nHost: h\r\n\r\n"),
                 (1, _ok(b"ok"))], {}, [(0, 5)]),
    # flow:established: not on a connection picked up without its handshake
    ("established", [(0, _get("/omega")), (1, _ok(b"ok"))], {}, [(0, 6)]),
    ("no handshake", [(0, _get("/omega")), (1, _ok(b"ok"))], {"drop_handshake": True}, []),
    # flow:to_client with '<>': only the server's data
    ("to client, request", [(0, _get("/delta")), (1, _ok(b"ok"))], {}, []),
    ("to client, response", [(0, _get("/x")), (1, _ok(b"delta"))], {}, [(1, 7)]),
    # ports on both sides: client port 1024 or above, server 18080 or 18443
    ("both ports", [(0, _get("/kappa")), (1, _ok(b"ok"))], {"sport": 18443}, [(0, 8)]),
    ("low client port", [(0, _get("/kappa")), (1, _ok(b"ok"))], {"cport": 999}, []),
    # another server port: none of the 18080 rules look at it
    ("other port", [(0, _get("/attack")), (1, _ok(b"secret gamma"))], {"sport": 9999}, []),
]


@pytest.fixture(scope="module")
def capture(tmp_path_factory):
    d = tmp_path_factory.mktemp("ids")
    (d / "r.rules").write_text(RULES)
    frames, expected = [], []
    for flow, (_, messages, options, alerts) in enumerate(CONNECTIONS):
        opts = dict(options)
        drop = opts.pop("drop_handshake", False)
        cport = opts.pop("cport", 40000 + flow)
        conn = http_connection(bytes([10, 0, 0, 1 + flow]), SERVER, cport, messages,
                               sport=opts.pop("sport", 18080), **opts)
        frames += conn[3:] if drop else conn
        expected += [(flow, index, sid) for index, sid in alerts]
    return load_trace(write_pcap(d / "c.pcap", frames)), str(d / "r.rules"), sorted(expected)


def test_the_capture_is_what_the_cases_say(capture):
    trace, _, _ = capture
    assert len(trace.flows) == len(CONNECTIONS)
    names = [c[0] for c in CONNECTIONS]
    assert [f.established for f in trace.flows] == [n != "no handshake" for n in names]
    assert trace.malformed.get("http_bad_start_line") == 1  # the evasion request


@pytest.mark.parametrize("engine", ["cpu", "gpu", "fixed:0.5", "flowshader"])
@pytest.mark.parametrize("batch", [1, 4, 64])
def test_alerts_follow_the_rules(capture, engine, batch):
    trace, rules, expected = capture
    r = run_engine(trace, [SimpleNamespace(nf="ids", rules=rules)], parse_engine(engine),
                   EngineOptions(batch_size=batch, workers=1, calibration_batches=1))
    assert r.alerts == expected
