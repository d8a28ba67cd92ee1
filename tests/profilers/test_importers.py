"""Importers of PipeDream graph.txt and NeurIPS'20 placement JSON, on small fixtures."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dl_nfv.artifacts import InvalidArtifact, OpKind, UnknownName, from_document, load, to_data
from dl_nfv.profilers.importers import import_pipedream, import_placement_json, kind_of_description
from tests.conftest import ROOT

DATA = ROOT / "tests" / "data"
PIPEDREAM = DATA / "profile_pipedream_graph.txt"
PLACEMENT = DATA / "profile_placement.json"
ORPHANS = DATA / "placement_orphans.json"
INPUT_TIME = DATA / "pipedream_input_time.txt"


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


BYTES_PER_MS = 2**31 / 1e3  # the default --transfer-gbps, 2^31 bytes/s


def test_placement_json_pairs_forward_and_backward_nodes():
    graph = import_placement_json(PLACEMENT, device_type="P100")
    assert [op.id for op in graph.ops] == ["input", "embedding", "lstm1", "lstm2", "add", "linear"]
    lstm = graph.index["lstm1"]
    assert lstm.fwd_ms == {"P100": 6.89} and lstm.bwd_ms == {"P100": 13.55}
    assert lstm.kind is OpKind.RNN and lstm.runs_backward
    # size is memory, not parameters: the forward and backward nodes' sizes, held by the device
    assert lstm.param_bytes == 0 and lstm.output_bytes == 0
    assert lstm.resident_bytes == 2 * 47742976
    assert graph.total_param_bytes == 0
    # Only forward-forward edges; cost (ms) at 2^31 bytes/s, the edges' debug size ignored.
    edges = {(e.src, e.dst): e.bytes for e in graph.edges}
    assert set(edges) == {("input", "embedding"), ("embedding", "lstm1"), ("lstm1", "lstm2"),
                          ("lstm1", "add"), ("lstm2", "add"), ("add", "linear")}
    assert edges[("lstm2", "add")] == round(0.0061 * BYTES_PER_MS) == 13100
    assert edges[("input", "embedding")] == round(0.0001 * BYTES_PER_MS) == 215
    assert graph.colocation == ()  # every colour class has one forward node
    assert graph.model.options["maxFPGAs"] == 3
    assert sum(op.bwd_ms["P100"] for op in graph.ops) == pytest.approx(0.25 + 13.55 + 13.61 + 0.02 + 4.6)
    at_126 = import_placement_json(PLACEMENT, transfer_gbps=126.0)
    assert {(e.src, e.dst): e.bytes for e in at_126.edges}[("lstm2", "add")] == round(
        0.0061e-3 * 126e9 / 8)


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
    assert graph.colocation == (("0", "1"),)


def test_placement_json_orphaned_and_colourless_nodes():
    """tests/data/placement_orphans.json, by hand: classes 10 {x}, 20 {w, mm | mm_grad},
    30 {out | out_grad}, 99 {| sum_grad} (no forward node), and two nodes without a class:
    forward 'shape' and backward 'acc' (each a class of its own; 'acc' orphaned)."""
    graph = import_placement_json(ORPHANS)
    ops = graph.index
    assert set(ops) == {"x", "w", "mm", "shape", "out", "fwd:acc", "fwd:sum_grad"}
    v = "V100-16GB"
    # the artificial forward ops: zero forward time, the orphans' backward time and size
    assert ops["fwd:acc"].fwd_ms == {v: 0.0} and ops["fwd:acc"].bwd_ms == {v: 0.75}
    assert ops["fwd:sum_grad"].bwd_ms == {v: 0.25} and ops["fwd:sum_grad"].resident_bytes == 32
    assert ops["fwd:acc"].resident_bytes == 64 and ops["fwd:acc"].runs_backward
    # class 20: mm_grad's 4.0 ms shared by forward time (w 0 ms, mm 2 ms); its 2000 bytes
    # go to the class's first forward op
    assert ops["w"].bwd_ms == {v: 0.0} and ops["mm"].bwd_ms == {v: 4.0}
    assert ops["w"].resident_bytes == 4096 + 2000 and ops["mm"].resident_bytes == 1000
    assert ops["out"].resident_bytes == 500 + 500 and ops["out"].bwd_ms == {v: 2.0}
    # classes without backward nodes in a training file: backward 0, not marked
    assert ops["shape"].bwd_ms == {v: 0.0} and not ops["shape"].runs_backward
    assert ops["x"].resident_bytes == 100
    assert all(op.param_bytes == 0 and op.output_bytes == 0 for op in graph.ops)
    assert graph.colocation == (("w", "mm"),)
    edges = {(e.src, e.dst): e.bytes for e in graph.edges}
    assert edges == {
        ("x", "mm"): round(0.5 * BYTES_PER_MS), ("w", "mm"): round(0.25 * BYTES_PER_MS),
        ("mm", "shape"): round(0.125 * BYTES_PER_MS), ("mm", "out"): round(0.125 * BYTES_PER_MS),
        ("shape", "out"): round(0.0625 * BYTES_PER_MS),
        # mirrors of the orphans' backward edges out_grad -> sum_grad -> mm_grad -> acc, each
        # carrying its backward source's cost; class 20's mirror lands on its first op, w
        ("fwd:sum_grad", "out"): round(0.5 * BYTES_PER_MS),
        ("w", "fwd:sum_grad"): round(0.375 * BYTES_PER_MS),
        ("fwd:acc", "w"): round(0.1 * BYTES_PER_MS)}
    # the edge's debug size is the cost at 2^31 bytes/s, as in the published files
    assert edges[("x", "mm")] == round(1073741.824)
    assert [op.id for op in graph.ops] == ["x", "fwd:acc", "w", "mm", "shape", "fwd:sum_grad", "out"]
    assert from_document(to_data(graph)) == graph


def _two_gpus():
    return from_document({"kind": "topology", "schema_version": 1, "name": "two",
                          "hosts": [{"name": "h", "devices": [{"type": "V100-16GB", "count": 2}],
                                     "interconnect": {"kind": "nvlink", "bandwidth_gbps": 200,
                                                      "latency_us": 1}}]})


def test_placement_json_sizes_are_memory_and_backward_nodes_run():
    from dl_nfv.planners import run
    from dl_nfv.planners.validate import validate_plan

    graph = import_placement_json(ORPHANS, batch_size=2)
    topology = _two_gpus()
    total_size = 100 + 4096 + 1000 + 16 + 500 + 2000 + 500 + 64 + 32
    single = run("single", graph, topology)
    # one device runs every node: the file's forward and backward latencies, nothing else
    # (no parameters: no optimizer step), and holds every node's size
    assert single.prediction.iteration_ms == pytest.approx(0 + 0 + 2.0 + 0.5 + 1.0
                                                          + 4.0 + 2.0 + 0.75 + 0.25)
    assert single.prediction.peak_memory_bytes == {single.groups[0].devices[0]: total_size}
    dp = run("dp", graph, topology)
    assert dp.prediction.peak_memory_bytes == {"h/gpu0": total_size, "h/gpu1": total_size}
    for planner in ("gpipe", "pipedream", "dp", "single"):
        plan = run(planner, graph, topology)
        validate_plan(plan, graph, topology)
        where = plan.devices_of_op
        assert where["w"] == where["mm"]


@pytest.mark.parametrize("mutate,message", [
    (lambda d: d["nodes"][3].pop("fpgaLatency"), r"nodes\[3\]: node 4: missing required key 'fpgaLatency'"),
    (lambda d: d["nodes"][2].update(fpgaLatency="fast"), r"nodes\[2\].fpgaLatency: expected a number"),
    (lambda d: d["nodes"][2].update(speed=3), r"nodes\[2\]: node 3: unknown key 'speed' \(valid keys: id,"),
    (lambda d: d["edges"][1].update(weight=3), r"edges\[1\]: edge 2 -> 3: unknown key 'weight'"),
    (lambda d: d.update(maxGPUs=3), r"unknown key 'maxGPUs'"),
    (lambda d: d["nodes"][5].update(id=4), r"nodes\[5\].id: duplicate node id 4 \(first at nodes\[3\]\)"),
    (lambda d: d["edges"].append({"sourceId": 6, "destId": 42, "cost": 0.0061}),
     r"edges\[13\].destId: edge 6 -> 42 names node 42, which no node has"),
    (lambda d: d["edges"].append({"sourceId": 6, "destId": 2, "cost": 0.0002}), "the nodes form a cycle"),
    (lambda d: d["edges"].append({"sourceId": 16, "destId": 2, "cost": 0.0061}),
     "runs from backward node 16 to forward node 2"),
    (lambda d: d["edges"].append({"sourceId": 3, "destId": 6, "cost": 0.5}),
     r"edges\[13\].cost: node 3 has two outgoing costs, 0.0061 \(edges\[2\]\) and 0.5"),
    (lambda d: d["edges"].append({"sourceId": 3, "destId": 3, "cost": 0.0061}), "self-loop on node 3"),
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


def test_pipedream_zeroes_the_input_nodes_unless_kept():
    v = "V100-16GB"
    graph = import_pipedream(INPUT_TIME)
    ops = graph.index
    # sources described as Input: data loading, zeroed as PipeDream's optimizer does
    assert ops["node1"].fwd_ms == {v: 0.0} and ops["node1"].bwd_ms == {v: 0.0}
    assert ops["node3"].fwd_ms == {v: 0.0}
    # their activation stays (the batch still travels); other nodes keep their times,
    # even one described as Input that is not a source
    assert ops["node1"].output_bytes == 6422528
    assert ops["node2"].fwd_ms == {v: 1.25} and ops["node5"].fwd_ms == {v: 3.0}
    assert ops["node5"].bwd_ms == {v: 1.0}
    kept = import_pipedream(INPUT_TIME, keep_input_time=True).index
    assert kept["node1"].fwd_ms == {v: 250.0} and kept["node1"].bwd_ms == {v: 12.5}
    assert kept["node3"].fwd_ms == {v: 4.0}
    assert sum(op.fwd_ms[v] for op in graph.ops) == pytest.approx(1.25 + 0.5 + 3.0)
    assert sum(op.fwd_ms[v] for op in kept.values()) == pytest.approx(250 + 1.25 + 4 + 0.5 + 3)


@pytest.mark.parametrize("line,message", [
    ("node99 -- Conv2d(1, 1) -- forward_compute_time=1.0, backward_compute_time=1.0", "missing activation_size"),
    ("node99 -- ReLU -- forward_compute_time=abc, backward_compute_time=1, activation_size=1, parameter_size=0", "forward_compute_time is not a number"),
    ("this is not a node line", "expected 'nodeN -- description"),
    ("\tnode1 -- node42", "unknown node 'node42'"),
    ("\tnode9 -- node1", "cycle"),
    ("node2 -- ReLU -- forward_compute_time=1, backward_compute_time=1, activation_size=1, parameter_size=0", "node node2 appears twice"),
    ("node99 -- ReLU -- forward_compute_time=1, backward_compute_time=1, activation_size=1, parameter_size=0, flops=3", "node node99: unknown field 'flops'"),
    ("node99 -- ReLU -- forward_compute_time=1, backward_compute_time=1, activation_size=1, parameter_size=0 -- rank=2", "node node99: unexpected 'rank=2'"),
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


# ----------------------------------------------------------------- through the CLI

def _cli(*args):
    from click.testing import CliRunner

    from dl_nfv.cli.main import cli

    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


@pytest.mark.parametrize("kind,edit,named", [
    ("placement-json", lambda d: d["nodes"][2].update(speed=3), "node 3: unknown key 'speed'"),
    ("placement-json", lambda d: d["edges"].append({"sourceId": 6, "destId": 42, "cost": 0.0002}),
     "edge 6 -> 42 names node 42, which no node has"),
    ("pipedream", "\tnode4 -- node42\n", "names unknown node 'node42'"),
    ("pipedream", "node10 -- ReLU -- forward_compute_time=1, backward_compute_time=1, "
                  "activation_size=1, parameter_size=0, speed=2\n", "node node10: unknown field 'speed'"),
])
def test_bad_import_files_exit_2_with_one_line_and_leave_the_output_alone(tmp_path, kind, edit,
                                                                          named):
    if kind == "placement-json":
        doc = json.loads(PLACEMENT.read_text())
        edit(doc)
        bad = tmp_path / "bad.json"
        bad.write_text(json.dumps(doc))
    else:
        bad = tmp_path / "graph.txt"
        bad.write_text(PIPEDREAM.read_text() + edit)
    out = tmp_path / "out.json"
    out.write_text("keep me")
    result = _cli("profile", "import", kind, str(bad), "-o", str(out))
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and str(bad) in lines[0] and named in lines[0]
    assert "Traceback" not in result.output
    assert out.read_text() == "keep me"


def test_cli_keep_input_time(tmp_path):
    zeroed, kept = tmp_path / "z.json", tmp_path / "k.json"
    assert _cli("profile", "import", "pipedream", str(INPUT_TIME), "-o", str(zeroed)).exit_code == 0
    assert _cli("profile", "import", "pipedream", str(INPUT_TIME), "--keep-input-time",
                "-o", str(kept)).exit_code == 0
    assert load(zeroed).index["node1"].fwd_ms == {"V100-16GB": 0.0}
    assert load(kept).index["node1"].fwd_ms == {"V100-16GB": 250.0}


def test_cli_placement_json_colocation_reaches_the_file(tmp_path):
    out = tmp_path / "g.json"
    assert _cli("profile", "import", "placement-json", str(ORPHANS), "-o", str(out)).exit_code == 0
    assert json.loads(out.read_text())["colocation"] == [["w", "mm"]]
    shown = _cli("show", str(out))
    assert shown.exit_code == 0
    assert "colocation groups" in shown.output and "1 (2 ops, largest 2)" in shown.output
    assert "resident memory" in shown.output and "8.1 KiB" in shown.output  # 8308 bytes


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_placement_json_keeps_every_time_and_size(tmp_path_factory, data):
    """Random training workloads: forward nodes in a DAG, each with or without a backward
    mirror, colour classes shared, missing or backward-only. Whatever the quirks, the import
    keeps the total forward time, backward time and size, makes one op per forward node and
    per orphaned class, and one colocation group per class with two or more forward nodes."""
    n = data.draw(st.integers(1, 8), label="forward nodes")
    classes = data.draw(st.lists(st.one_of(st.none(), st.integers(0, 3)), min_size=n, max_size=n))
    mirrored = data.draw(st.lists(st.booleans(), min_size=n, max_size=n))
    extra = data.draw(st.lists(st.one_of(st.none(), st.integers(0, 5)), max_size=3), label="orphans")
    times = st.sampled_from([0.0, 0.25, 0.5, 1.0, 2.0])
    nodes, edges = [], []
    for i in range(n):
        node = {"id": i, "fpgaLatency": data.draw(times), "isBackwardNode": 0, "size": 8.0 * i}
        if classes[i] is not None:
            node["colorClass"] = classes[i]
        nodes.append(node)
    cost = {i: 0.125 * (i + 1) for i in range(n + 20 + len(extra))}
    for i in range(1, n):
        src = data.draw(st.integers(0, i - 1))
        edges.append({"sourceId": src, "destId": i, "cost": cost[src]})
    for i in range(n):  # a backward node in the class of its forward node (a fresh one if none)
        if mirrored[i]:
            color = classes[i] if classes[i] is not None else 100 + i
            nodes[i]["colorClass"] = color
            nodes.append({"id": 20 + i, "fpgaLatency": data.draw(times), "isBackwardNode": 1,
                          "colorClass": color, "size": 4.0})
    for k, color in enumerate(extra):  # backward nodes of classes with no forward node
        node = {"id": 50 + k, "fpgaLatency": 0.75, "isBackwardNode": 1, "size": 2.0}
        if color is not None:
            node["colorClass"] = 10 + color
        nodes.append(node)
        backs = [b["id"] for b in nodes if b["isBackwardNode"] and b["id"] < 50]
        if backs:
            src = data.draw(st.sampled_from(backs))
            edges.append({"sourceId": src, "destId": 50 + k, "cost": cost.get(src, 0.0)})
    for e in edges:  # one cost per source node
        e["cost"] = cost[e["sourceId"]]
    path = tmp_path_factory.mktemp("w") / "w.json"
    path.write_text(json.dumps({"nodes": nodes, "edges": edges}))
    graph = import_placement_json(path)
    v = "V100-16GB"
    fwd = [x for x in nodes if not x["isBackwardNode"]]
    bwd = [x for x in nodes if x["isBackwardNode"]]
    forward_classes = {x.get("colorClass", ("own", x["id"])) for x in fwd}
    orphan_classes = {x.get("colorClass", ("own", x["id"])) for x in bwd} - forward_classes
    assert len(graph.ops) == len(fwd) + len(orphan_classes)
    assert sum(op.fwd_ms[v] for op in graph.ops) == pytest.approx(sum(x["fpgaLatency"] for x in fwd))
    if bwd:
        assert sum(op.bwd_ms[v] for op in graph.ops) == pytest.approx(
            sum(x["fpgaLatency"] for x in bwd))
    assert sum(op.resident_bytes for op in graph.ops) == sum(x["size"] for x in nodes)
    assert all(op.param_bytes == 0 for op in graph.ops)
    members: dict = {}
    for x in fwd:
        members.setdefault(x.get("colorClass", ("own", x["id"])), []).append(str(x["id"]))
    assert sorted(graph.colocation) == sorted(tuple(m) for m in members.values() if len(m) >= 2)
    assert from_document(to_data(graph)) == graph


def test_placement_json_fuses_a_cycle_closed_by_mirror_edges(tmp_path):
    # forward a -> b; an orphaned backward node o between a's and b's backward nodes in the
    # unnatural direction (a_grad -> o -> b_grad): its mirrors b -> fwd:o -> a close a cycle
    # with a -> b. The reference implementation fuses the cycle's classes into one; here its
    # ops become one colocation group and the mirror edges inside it go
    doc = {"nodes": [
        {"name": "a", "id": 1, "fpgaLatency": 1.0, "isBackwardNode": 0, "colorClass": 1},
        {"name": "b", "id": 2, "fpgaLatency": 1.0, "isBackwardNode": 0, "colorClass": 2},
        {"name": "c", "id": 6, "fpgaLatency": 1.0, "isBackwardNode": 0, "colorClass": 3},
        {"name": "a_grad", "id": 3, "fpgaLatency": 1.0, "isBackwardNode": 1, "colorClass": 1},
        {"name": "b_grad", "id": 4, "fpgaLatency": 1.0, "isBackwardNode": 1, "colorClass": 2},
        {"name": "o", "id": 5, "fpgaLatency": 1.0, "isBackwardNode": 1}],
        "edges": [{"sourceId": 1, "destId": 2, "cost": 0.5}, {"sourceId": 2, "destId": 6, "cost": 0.25},
                  {"sourceId": 3, "destId": 5, "cost": 0.5}, {"sourceId": 5, "destId": 4, "cost": 0.5}]}
    path = tmp_path / "w.json"
    path.write_text(json.dumps(doc))
    graph = import_placement_json(path)
    assert graph.colocation == (("a", "b", "fwd:o"),)
    assert {(e.src, e.dst) for e in graph.edges} == {("a", "b"), ("b", "c")}
    assert sum(op.bwd_ms["V100-16GB"] for op in graph.ops) == 3.0


@pytest.mark.parametrize("planner", ["exact", "pipeline", "pipedream"])
def test_planners_that_check_memory_count_the_imported_sizes(tmp_path, planner):
    """Four layers of 6 GiB each (forward and backward node sizes) on two 16 GiB V100s:
    three layers on one device (18 GiB) do not fit, so the time-balanced split
    {l0} | {l1, l2, l3} (90 | 90 ms) is out and {l0, l1} | {l2, l3} (120 | 60 ms) is the
    only contiguous one that fits, by enumeration of the three cuts."""
    from dl_nfv.planners import run
    from dl_nfv.planners.validate import validate_plan

    gib = 2**30
    fwd = [30.0, 10.0, 10.0, 10.0]
    nodes = [n for i in range(4) for n in (
        {"id": i, "name": f"l{i}", "fpgaLatency": fwd[i], "isBackwardNode": 0, "colorClass": i,
         "size": 3.0 * gib},
        {"id": 10 + i, "name": f"l{i}_grad", "fpgaLatency": 2 * fwd[i], "isBackwardNode": 1,
         "colorClass": i, "size": 3.0 * gib})]
    path = tmp_path / "w.json"
    path.write_text(json.dumps({"nodes": nodes, "edges": [
        {"sourceId": i, "destId": i + 1, "cost": 0.5} for i in range(3)]}))
    graph = import_placement_json(path, batch_size=4)
    fits = [cut for cut in (1, 2, 3) if max(cut, 4 - cut) * 6 * gib <= 16 * gib]
    assert fits == [2]
    plan = run(planner, graph, _two_gpus())
    validate_plan(plan, graph, _two_gpus())
    assert sorted(g.ops for g in plan.groups) == [("l0", "l1"), ("l2", "l3")]
