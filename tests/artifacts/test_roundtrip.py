"""Hypothesis: load -> save -> load is the identity for every artifact kind, in JSON and YAML,
and the fingerprint does not depend on the format."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dl_nfv.artifacts import CATALOG, fingerprint, from_document, load, save, to_data

NAMES = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_-", min_size=1, max_size=8)
POS = st.floats(min_value=0.001, max_value=1e6, allow_nan=False, allow_infinity=False)
NONNEG = st.floats(min_value=0.0, max_value=1e9, allow_nan=False, allow_infinity=False)


@st.composite
def topologies(draw):
    n_hosts = draw(st.integers(1, 3))
    hosts = []
    for h in range(n_hosts):
        specs = draw(st.lists(st.fixed_dictionaries(
            {"type": st.sampled_from(sorted(CATALOG)), "count": st.integers(1, 3)},
            optional={"memory_gib": POS, "fp32_tflops": POS}), min_size=1, max_size=2))
        host = {"name": f"h{h}", "devices": specs}
        if draw(st.booleans()):
            host["interconnect"] = {"kind": draw(st.sampled_from(["nvlink", "pcie", "loopback", "none"])),
                                    "bandwidth_gbps": draw(POS), "latency_us": draw(NONNEG)}
        if n_hosts > 1:
            host["nics"] = [{"switch": "s0", "bandwidth_gbps": draw(POS), "latency_us": draw(NONNEG)}]
        hosts.append(host)
    doc = {"kind": "topology", "schema_version": 1, "name": draw(NAMES), "hosts": hosts,
           "description": draw(st.text(max_size=20))}
    if n_hosts > 1:
        doc["switches"] = [{"name": "s0"}]
    if draw(st.booleans()):
        doc["device_types"] = [{"name": "Custom", "memory_gib": draw(POS), "fp32_tflops": draw(POS),
                                "fp16_tflops": draw(POS), "memory_bandwidth_gb_per_s": draw(POS)}]
        hosts[0]["devices"].append({"type": "Custom"})
    if draw(st.booleans()):
        doc["links"] = [{"endpoints": ["h0", "h0/gpu0" if CATALOG[hosts[0]["devices"][0]["type"]].kind == "gpu"
                                       else "h0/cpu0"], "bandwidth_gbps": draw(POS)}]
    return doc


@st.composite
def graphs(draw):
    n = draw(st.integers(1, 8))
    ops = []
    for i in range(n):
        ops.append({"id": f"op{i}", "name": draw(NAMES), "kind": draw(st.sampled_from(
            ["input", "conv", "matmul", "norm", "activation", "block", "other"])),
            "flops": draw(NONNEG), "bwd_flops": (bwd := draw(NONNEG)),
            "bwd_input_flops": draw(st.none() | st.floats(0, 1).map(lambda share: bwd * share)),
            "bytes_accessed": draw(NONNEG),
            "param_bytes": draw(st.integers(0, 10**9)), "output_bytes": draw(st.integers(0, 10**9)),
            "params": draw(st.lists(NAMES, max_size=2, unique=True)),
            "fwd_ms": draw(st.dictionaries(st.sampled_from(["cpu", "V100-16GB"]), NONNEG)),
            "bwd_ms": draw(st.dictionaries(st.sampled_from(["cpu", "T4"]), NONNEG)),
            "splittable_dims": draw(st.lists(st.integers(0, 3), max_size=2, unique=True))})
    pairs = draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=12))
    edges = sorted({(a, b) for a, b in pairs if a < b})
    return {"kind": "op-graph", "schema_version": 1,
            "model": {"name": draw(NAMES), "batch_size": draw(st.integers(1, 512)),
                      "inputs": [{"shape": [4, 3]}], "options": {"seq_len": draw(st.integers(1, 9))}},
            "granularity": draw(st.sampled_from(["op", "layer"])),
            "profile": {"device_type": "cpu", "threads": draw(st.integers(1, 8)),
                        "step_ms": draw(NONNEG)},
            "ops": ops,
            "edges": [{"src": f"op{a}", "dst": f"op{b}", "bytes": draw(st.integers(0, 10**8))}
                      for a, b in edges]}


@st.composite
def plans(draw):
    n_ops = draw(st.integers(1, 6))
    ops = [f"op{i}" for i in range(n_ops)]
    devices = ["h/gpu0", "h/gpu1", "h/gpu2"]
    cut = draw(st.integers(1, n_ops))
    parts = [ops[:cut], ops[cut:]] if cut < n_ops else [ops]
    groups = []
    for i, part in enumerate(parts):
        devs = draw(st.lists(st.sampled_from(devices), min_size=1, max_size=3, unique=True))
        group = {"id": f"g{i}", "ops": part, "devices": devs}
        if len(devs) > 1 and draw(st.booleans()):
            weights = draw(st.lists(st.integers(1, 5), min_size=len(devs), max_size=len(devs)))
            shares = [w / sum(weights) for w in weights]
            shares[-1] = 1.0 - sum(shares[:-1])
            group["batch_shares"] = shares
        group["sync"] = draw(st.sampled_from(["allreduce", "none"]))
        groups.append(group)
    doc = {"kind": "plan", "schema_version": 1, "planner": draw(NAMES), "seed": draw(st.integers(0, 99)),
           "graph_sha256": "a" * 64, "topology_sha256": "b" * 64, "batch_size": 8,
           "groups": groups, "options": {"x": draw(st.integers(0, 5))},
           "wall_time_s": draw(NONNEG), "bound_ms": draw(NONNEG),
           "prediction": {"iteration_ms": draw(NONNEG), "peak_memory_bytes": {"h/gpu0": 5}}}
    if len(groups) == 1 and draw(st.booleans()):
        g = groups[0]
        doc["order"] = {d: list(reversed(g["ops"])) for d in g["devices"]}
    if draw(st.booleans()):
        doc["pipeline"] = {"microbatches": 2, "stages": [g["id"] for g in groups],
                           "schedule": {d: " ".join(f"{s}{k}{m}" for s, g in enumerate(groups)
                                                    if d in g["devices"] for k in "FB" for m in (0, 1))
                                        for d in {d for g in groups for d in g["devices"]}}}
    return doc


def _roundtrip(doc, suffix):
    record = from_document(doc)
    assert from_document(to_data(record)) == record
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"a{suffix}"
        save(record, path)
        again = load(path)
        assert again == record
        save(again, path)
        assert load(path) == record
    return record


SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(topologies(), st.sampled_from([".yaml", ".json"]))
def test_topology_roundtrip(doc, suffix):
    _roundtrip(doc, suffix)


@SETTINGS
@given(graphs(), st.sampled_from([".yaml", ".json"]))
def test_opgraph_roundtrip(doc, suffix):
    _roundtrip(doc, suffix)


@SETTINGS
@given(plans(), st.sampled_from([".yaml", ".json"]))
def test_plan_roundtrip(doc, suffix):
    _roundtrip(doc, suffix)


@SETTINGS
@given(graphs())
def test_fingerprint_is_format_independent(doc):
    record = from_document(doc)
    with tempfile.TemporaryDirectory() as tmp:
        a, b = Path(tmp) / "g.json", Path(tmp) / "g.yaml"
        save(record, a)
        save(record, b)
        assert fingerprint(load(a)) == fingerprint(load(b)) == fingerprint(record)
        assert len(fingerprint(record)) == 64


def test_fingerprint_changes_with_content():
    from .fixtures import GRAPH, fresh

    doc = fresh(GRAPH)
    a = fingerprint(from_document(doc))
    doc["ops"][1]["flops"] += 1
    assert fingerprint(from_document(doc)) != a


def test_numpy_scalars_in_a_record_are_written_as_plain_numbers_in_json_and_yaml(tmp_path):
    """A planner's figure may come out of numpy (a bound, a share): every artifact writes it
    as the number it is (YAML refused the numpy object), and loads back equal."""
    import dataclasses

    import numpy as np

    from dl_nfv.artifacts import Group
    from tests.simulator.helpers import chain, mesh, plan

    g, t = chain(2), mesh(2)
    base = plan(g, t, [Group(id="all", ops=("op0", "op1"), devices=t.device_names)])
    record = dataclasses.replace(base, bound_ms=np.float64(0.194986), batch_size=np.int64(8))
    for suffix in (".json", ".yaml"):
        path = save(record, tmp_path / f"plan{suffix}")
        again = load(path)
        assert again.bound_ms == 0.194986 and type(again.bound_ms) is float
        assert again.batch_size == 8 and type(again.batch_size) is int
        assert "numpy" not in path.read_text()
