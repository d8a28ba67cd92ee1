"""Importers of PipeDream graph.txt and NeurIPS'20 placement JSON, on small fixtures."""

from __future__ import annotations

import json

import pytest

from dl_nfv.artifacts import InvalidArtifact, OpKind, UnknownName, from_document, to_data
from dl_nfv.profilers.importers import import_pipedream, import_placement_json, kind_of_description
from tests.conftest import ROOT

DATA = ROOT / "tests" / "data"
PIPEDREAM = DATA / "profile_pipedream_graph.txt"
PLACEMENT = DATA / "profile_placement.json"


def test_pipedream_graph():
    graph = import_pipedream(PIPEDREAM, batch_size=32)
    ids = [op.id for op in graph.ops]
    assert ids == [f"node{i}" for i in range(1, 10)]  # topological, by node number
    conv = graph.index["node2"]
    assert conv.kind is OpKind.CONV and conv.name.startswith("Conv2d(3, 64")
    assert conv.fwd_ms == {"V100-16GB": 1.278} and conv.bwd_ms == {"V100-16GB": 2.655}
    assert conv.param_bytes == 7168 and conv.output_bytes == 102760448
    assert graph.index["node7"].output_bytes == 25690112  # a list activation size is summed
    assert graph.index["node1"].kind is OpKind.INPUT
    assert graph.index["node8"].kind is OpKind.SHAPE
    edges = {(e.src, e.dst): e.bytes for e in graph.edges}
    assert len(edges) == 9 and edges[("node4", "node6")] == 25690112  # source activation size
    assert graph.model.batch_size == 32 and graph.model.source == "pipedream"
    assert sum(op.fwd_ms["V100-16GB"] for op in graph.ops) == pytest.approx(5.474)
    assert from_document(to_data(graph)) == graph


def test_placement_json_pairs_forward_and_backward_nodes():
    graph = import_placement_json(PLACEMENT, device_type="P100")
    assert [op.id for op in graph.ops] == ["input", "embedding", "lstm1", "lstm2", "add", "linear"]
    lstm = graph.index["lstm1"]
    assert lstm.fwd_ms == {"P100": 6.89} and lstm.bwd_ms == {"P100": 13.55}
    assert lstm.param_bytes == 47742976 and lstm.kind is OpKind.RNN
    # Only forward-forward edges; an edge without `size` converts its cost at 126 Gbps.
    edges = {(e.src, e.dst): e.bytes for e in graph.edges}
    assert set(edges) == {("input", "embedding"), ("embedding", "lstm1"), ("lstm1", "lstm2"),
                          ("lstm1", "add"), ("lstm2", "add"), ("add", "linear")}
    assert edges[("lstm2", "add")] == round(0.0061 / 1e3 * 126e9 / 8)
    assert graph.model.options["maxFPGAs"] == 3
    assert sum(op.bwd_ms["P100"] for op in graph.ops) == pytest.approx(0.25 + 13.55 + 13.61 + 0.02 + 4.6)


def test_placement_json_shares_backward_time_within_a_colour_class(tmp_path):
    doc = {"nodes": [
        {"id": 0, "fpgaLatency": 1.0, "size": 0, "isBackwardNode": 0, "colorClass": 7},
        {"id": 1, "fpgaLatency": 3.0, "size": 0, "isBackwardNode": 0, "colorClass": 7},
        {"id": 2, "fpgaLatency": 8.0, "size": 0, "isBackwardNode": 1, "colorClass": 7}],
        "edges": [{"sourceId": 0, "destId": 1, "cost": 0.5}]}
    path = tmp_path / "w.json"
    path.write_text(json.dumps(doc))
    graph = import_placement_json(path)
    assert [op.bwd_ms["V100-16GB"] for op in graph.ops] == [2.0, 6.0]


@pytest.mark.parametrize("mutate,message", [
    (lambda d: d["nodes"][3].pop("fpgaLatency"), r"nodes\[3\]: missing required key 'fpgaLatency'"),
    (lambda d: d["nodes"][2].update(fpgaLatency="fast"), r"nodes\[2\].fpgaLatency: expected a number"),
    (lambda d: d["nodes"][8].pop("colorClass"), r"nodes\[8\]: backward node 13 has no colorClass"),
    (lambda d: d["nodes"][8].update(colorClass=99), "colorClass 99, which no forward node has"),
    (lambda d: d["edges"].append({"sourceId": 6, "destId": 42, "cost": 0}), r"edges\[13\].destId: unknown node id 42"),
    (lambda d: d["edges"].append({"sourceId": 6, "destId": 2, "cost": 0}), "form a cycle"),
    (lambda d: d.pop("edges"), "missing required list 'edges'"),
    (lambda d: d["nodes"][1].update(isBackwardNode="no"), r"isBackwardNode: expected true/false"),
])
def test_malformed_placement_json(tmp_path, mutate, message):
    doc = json.loads(PLACEMENT.read_text())
    mutate(doc)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(InvalidArtifact, match=message) as info:
        import_placement_json(path)
    assert str(info.value).startswith(str(path))


@pytest.mark.parametrize("line,message", [
    ("node99 -- Conv2d(1, 1) -- forward_compute_time=1.0, backward_compute_time=1.0", "missing activation_size"),
    ("node99 -- ReLU -- forward_compute_time=abc, backward_compute_time=1, activation_size=1, parameter_size=0", "forward_compute_time is not a number"),
    ("this is not a node line", "expected 'nodeN -- description"),
    ("\tnode1 -- node42", "unknown node 'node42'"),
    ("\tnode9 -- node1", "cycle"),
    ("node2 -- ReLU -- forward_compute_time=1, backward_compute_time=1, activation_size=1, parameter_size=0", "node node2 appears twice"),
])
def test_malformed_pipedream_graph(tmp_path, line, message):
    path = tmp_path / "graph.txt"
    path.write_text(PIPEDREAM.read_text() + line + "\n")
    with pytest.raises(InvalidArtifact, match=message) as info:
        import_pipedream(path)
    lineno = len(PIPEDREAM.read_text().splitlines()) + 1
    if "cycle" not in message:
        assert f"{path}: line {lineno}:" in str(info.value)


def test_unknown_device_type_is_named():
    with pytest.raises(UnknownName, match="unknown device type 'V200'"):
        import_pipedream(PIPEDREAM, device_type="V200")


def test_kind_of_description():
    assert kind_of_description("Conv2d(3, 64, kernel_size=(3, 3))") is OpKind.CONV
    assert kind_of_description("Linear(in_features=4096)") is OpKind.MATMUL
    assert kind_of_description("LSTM(1024, 1024)") is OpKind.RNN
    assert kind_of_description("BatchNorm2d(64)") is OpKind.NORM
    assert kind_of_description("Something") is OpKind.OTHER
