"""Table-driven: malformed artifacts give exit 2 and one line naming the problem."""

from __future__ import annotations

import json

import pytest
import yaml
from click.testing import CliRunner

from dl_nfv.cli.main import cli

from .fixtures import GRAPH, TOPOLOGY, fresh, plan_doc


def _set(doc, path, value):
    *head, last = path
    for key in head:
        doc = doc[key]
    if value is _DELETE:
        del doc[last]
    else:
        doc[last] = value


_DELETE = object()


def _mutated(base, path, value):
    doc = fresh(base)
    _set(doc, path, value)
    return doc


def _cyclic_graph():
    doc = fresh(GRAPH)
    doc["edges"].append({"src": "fc2", "dst": "fc1", "bytes": 4})
    return doc


CASES = [
    # (name, file suffix, content (str or dict), expected words in the message)
    ("bad yaml", ".yaml", "kind: topology\nschema_version: 1\nhosts: [\n", "invalid YAML at line"),
    ("bad json", ".json", '{"kind": "plan",', "invalid JSON at line"),
    ("not a mapping", ".yaml", "- 1\n- 2\n", "expected a mapping"),
    ("no kind", ".yaml", {"schema_version": 1}, "missing required key 'kind'"),
    ("unknown kind", ".yaml", {"kind": "not-a-kind", "schema_version": 1}, "unknown kind 'not-a-kind'"),
    ("future version", ".yaml", _mutated(TOPOLOGY, ["schema_version"], 999), "schema_version 999 is newer"),
    ("version is text", ".yaml", _mutated(TOPOLOGY, ["schema_version"], "one"), "schema_version must be"),
    ("unknown key", ".yaml", _mutated(TOPOLOGY, ["colour"], "red"), "unknown key 'colour'"),
    ("missing hosts", ".yaml", _mutated(TOPOLOGY, ["hosts"], _DELETE), "missing required key 'hosts'"),
    ("unknown device type", ".yaml",
     _mutated(TOPOLOGY, ["hosts", 0, "devices", 0, "type"], "NOPE-9000"),
     "hosts[0].devices[0].type: unknown device type 'NOPE-9000'"),
    ("negative bandwidth", ".yaml",
     _mutated(TOPOLOGY, ["hosts", 0, "nics", 0, "bandwidth_gbps"], -5),
     "bandwidth_gbps must be > 0, got -5"),
    ("zero bandwidth link", ".yaml",
     _mutated(TOPOLOGY, ["links"], [{"endpoints": ["a/gpu0", "b/gpu0"], "bandwidth_gbps": 0}]),
     "bandwidth_gbps must be > 0, got 0"),
    ("negative latency", ".yaml",
     _mutated(TOPOLOGY, ["hosts", 0, "interconnect", "latency_us"], -1), "latency_us must be >= 0"),
    ("zero collective bandwidth", ".yaml",
     _mutated(TOPOLOGY, ["hosts", 0, "interconnect", "collective_bandwidth_gbps"], 0),
     "collective_bandwidth_gbps must be > 0, got 0"),
    ("bandwidth is text", ".yaml",
     _mutated(TOPOLOGY, ["hosts", 0, "nics", 0, "bandwidth_gbps"], "fast"),
     "hosts[0].nics[0].bandwidth_gbps: expected a number, got 'fast'"),
    ("disconnected device", ".yaml", _mutated(TOPOLOGY, ["hosts", 1, "nics"], []),
     "device 'b/gpu0' is not connected"),
    ("link to unknown endpoint", ".yaml",
     _mutated(TOPOLOGY, ["links"], [{"endpoints": ["a/gpu0", "zz/gpu9"], "bandwidth_gbps": 10}]),
     "unknown endpoint 'zz/gpu9'"),
    ("nic to unknown switch", ".yaml",
     _mutated(TOPOLOGY, ["hosts", 0, "nics", 0, "switch"], "spine"), "unknown switch 'spine'"),
    ("duplicate host", ".yaml",
     _mutated(TOPOLOGY, ["hosts", 1, "name"], "a"), "duplicate host name 'a'"),
    ("zero device count", ".yaml",
     _mutated(TOPOLOGY, ["hosts", 0, "devices", 0, "count"], 0), "count must be >= 1, got 0"),
    ("graph duplicate op id", ".json", _mutated(GRAPH, ["ops", 2, "id"], "fc1"), "duplicate op id 'fc1'"),
    ("graph dangling edge", ".json",
     _mutated(GRAPH, ["edges", 0, "src"], "ghost"), "names unknown op 'ghost'"),
    ("graph cycle", ".json", _cyclic_graph(), "cycle: fc1 -> relu -> fc2 -> fc1"),
    ("graph negative flops", ".json",
     _mutated(GRAPH, ["ops", 1, "flops"], -1), "op 'fc1': flops must be >= 0, got -1"),
    ("graph negative tied bytes", ".json",
     _mutated(GRAPH, ["ops", 3, "shared_params"], {"fc1.weight": -1}),
     "op 'fc2': shared_params['fc1.weight'] must be >= 0, got -1"),
    ("graph tie nobody owns", ".json",
     _mutated(GRAPH, ["ops", 3, "shared_params"], {"ghost.weight": 64}),
     "op 'fc2': shared_params names 'ghost.weight', which no op owns"),
    ("graph tie to its own weight", ".json",
     _mutated(GRAPH, ["ops", 3, "shared_params"], {"fc2.weight": 64}),
     "op 'fc2': shared_params names 'fc2.weight', which the op owns"),
    ("graph tie sum above its backward", ".json",
     _mutated(GRAPH, ["ops", 1, "tie_sum_ms"], {"cpu": 0.05}),
     "op 'fc1': tie_sum_ms['cpu'] = 0.05 must not exceed bwd_ms['cpu'] = 0.04"),
    ("graph input-gradient FLOPs above the backward's", ".json",
     _mutated(GRAPH, ["ops", 1, "bwd_input_flops"], 20000),
     "op 'fc1': bwd_input_flops must be in [0, bwd_flops = 16384.0], got 20000.0"),
    ("graph tie sum of an unmeasured type", ".json",
     _mutated(GRAPH, ["ops", 1, "tie_sum_ms"], {"T4": 0.01}),
     "op 'fc1': tie_sum_ms['T4'] is part of a backward time, but bwd_ms has no 'T4'"),
    ("graph bad op kind", ".json", _mutated(GRAPH, ["ops", 1, "kind"], "magic"), "unknown value 'magic'"),
    ("graph zero batch", ".json",
     _mutated(GRAPH, ["model", "batch_size"], 0), "batch_size must be >= 1, got 0"),
    ("plan op placed twice", ".json",
     _mutated(plan_doc(), ["groups", 1, "ops"], ["fc1", "fc2", "relu"]), "op placed twice: op 'fc1'"),
    ("plan shares do not sum to 1", ".json",
     _mutated(plan_doc(), ["groups", 0, "batch_shares"], [0.5, 0.25]), "batch_shares sum to 0.75"),
    ("plan bad sync", ".json", _mutated(plan_doc(), ["groups", 0, "sync"], "gossip"),
     "unknown value 'gossip'; valid: allreduce, ps, none"),
    ("plan ps without servers", ".json", _mutated(plan_doc(), ["groups", 0, "sync"], "ps"),
     "sync 'ps' needs ps_servers"),
    ("plan bad fingerprint", ".json", _mutated(plan_doc(), ["graph_sha256"], "abc"),
     "graph_sha256 must be 64 hex digits"),
    ("plan schedule B before F", ".json",
     _mutated(plan_doc(), ["pipeline", "schedule", "b/gpu0"], "1B0 1F0 1F1 1B1"),
     "1B0 comes before 1F0"),
    ("plan schedule missing action", ".json",
     _mutated(plan_doc(), ["pipeline", "schedule", "b/gpu0"], "1F0 1F1 1B0"), "lacks action 1B1"),
    ("plan bad action text", ".json",
     _mutated(plan_doc(), ["pipeline", "schedule", "b/gpu0"], "1F0 oops"), "bad pipeline action 'oops'"),
    ("plan microbatches do not divide batch", ".json",
     _mutated(plan_doc(), ["pipeline", "microbatches"], 3), "not divisible by 3 microbatches"),
]


@pytest.mark.parametrize("name,suffix,content,expected", CASES, ids=[c[0] for c in CASES])
def test_bad_artifact_exits_2_with_one_line(tmp_path, name, suffix, content, expected):
    path = tmp_path / f"bad{suffix}"
    if isinstance(content, str):
        path.write_text(content)
    elif suffix == ".json":
        path.write_text(json.dumps(content))
    else:
        path.write_text(yaml.safe_dump(content))
    result = CliRunner().invoke(cli, ["show", str(path)])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert "Traceback" not in result.output
    assert lines[0].startswith(f"error: {path}")
    assert expected in lines[0]


def test_there_are_at_least_15_cases():
    assert len(CASES) >= 15


def test_missing_file_and_directory(tmp_path):
    for target, words in ((tmp_path / "nope.yaml", "no such file"), (tmp_path, "is a directory")):
        result = CliRunner().invoke(cli, ["show", str(target)])
        assert result.exit_code == 2 and words in result.output


def test_debug_shows_the_traceback(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"kind": "nope", "schema_version": 1}))
    result = CliRunner().invoke(cli, ["--debug", "show", str(path)])
    assert result.exit_code != 0 and result.exception is not None
