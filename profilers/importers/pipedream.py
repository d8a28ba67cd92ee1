"""Import PipeDream's profiler ``graph.txt`` (msr-fiddle/pipedream) as an op graph.

Format (one node per line, then edges on lines starting with a tab)::

    node1 -- Input -- forward_compute_time=0.000, backward_compute_time=0.000, activation_size=9633792.0, parameter_size=0.000
    node2 -- Conv2d(3, 64, kernel_size=(3, 3)) -- forward_compute_time=3.297, backward_compute_time=7.016, activation_size=205520896.0, parameter_size=7168.000 -- stage_id=0
    \tnode1 -- node2

Times are milliseconds for the profiled batch, sizes bytes; ``activation_size``
may be a list ``[a; b]`` (summed, as PipeDream does). A trailing
``stage_id=N`` (a partitioned graph) is checked and ignored; any other field
is an error naming the line and the node. Each node becomes an op (id = node
id, name = its description, ``fwd_ms``/``bwd_ms`` under ``device_type``,
``output_bytes`` = activation size, ``param_bytes`` = parameter size); each
edge carries the source node's activation size. Ops are written in a
topological order (ties by node number).

The time of an ``Input`` node (a source whose description starts with
``Input``) is data loading, not model work: PipeDream's optimizer zeroes it
(``optimizer_graph_hierarchical.py``), and so does this importer unless
``keep_input_time``. Its activation size stays: the batch still has to reach
the ops that read it (PipeDream drops it too, because it pins the input to the
first stage).
"""

from __future__ import annotations

import re
from pathlib import Path

import networkx as nx

from dl_nfv.artifacts import (
    BadInput,
    Edge,
    InvalidArtifact,
    ModelRef,
    Op,
    OpGraph,
    OpKind,
    ProfileInfo,
    lookup,
)

_FIELDS = ("forward_compute_time", "backward_compute_time", "activation_size", "parameter_size")


def _number(text: str, field: str, where: str) -> float:
    text = text.strip()
    try:
        if text.startswith("["):
            return sum(float(x) for x in text.strip("[]").replace(",", ";").split(";") if x.strip())
        value = float(text)
    except ValueError:
        raise InvalidArtifact(f"{field} is not a number: {text!r}", field=where) from None
    if value != value or value < 0:
        raise InvalidArtifact(f"{field} must be a number >= 0, got {text!r}", field=where)
    return value


def _parse_node(line: str, lineno: int) -> tuple[str, str, dict[str, float]]:
    where = f"line {lineno}"
    parts = line.strip().split(" -- ")
    meta_at = next((i for i, p in enumerate(parts) if p.startswith("forward_compute_time=")), None)
    if len(parts) < 3 or meta_at is None or meta_at < 2:
        raise InvalidArtifact("expected 'nodeN -- description -- forward_compute_time=..., "
                              "backward_compute_time=..., activation_size=..., parameter_size=...'",
                              field=where)
    node_id, description = parts[0].strip(), " -- ".join(parts[1:meta_at]).strip()
    if not node_id or " " in node_id:
        raise InvalidArtifact(f"bad node id {node_id!r}", field=where)
    values: dict[str, float] = {}
    for item in re.split(r",\s*(?=[a-z_]+=)", parts[meta_at]):
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep:
            raise InvalidArtifact(f"node {node_id}: expected key=value, got {item!r}", field=where)
        if key not in _FIELDS:
            raise InvalidArtifact(f"node {node_id}: unknown field {key!r} (valid: "
                                  f"{', '.join(_FIELDS)})", field=where)
        values[key] = _number(value, key, where)
    for extra in parts[meta_at + 1:]:
        if not re.fullmatch(r"\s*stage_id=\d+\s*", extra):
            raise InvalidArtifact(f"node {node_id}: unexpected {extra.strip()!r} after the "
                                  f"sizes (only 'stage_id=N' may follow)", field=where)
    missing = [f for f in _FIELDS if f not in values]
    if missing:
        raise InvalidArtifact(f"node {node_id}: missing {missing[0]}", field=where)
    return node_id, description, values


def _read(text: str) -> tuple[dict[str, tuple[str, dict[str, float], int]],
                              list[tuple[str, str, int]], nx.DiGraph]:
    """Nodes (id -> description, values, line), edges (src, dst, line) and their DiGraph,
    checked: well-formed lines, known and distinct nodes, no self-loop, no cycle."""
    nodes: dict[str, tuple[str, dict[str, float], int]] = {}
    edges: list[tuple[str, str, int]] = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        if line.startswith("\t") or line.startswith("    "):
            ends = [e.strip() for e in line.strip().split(" -- ")]
            if len(ends) != 2 or not all(ends):
                raise InvalidArtifact(f"expected an edge 'nodeA -- nodeB', got {line.strip()!r}",
                                      field=f"line {lineno}")
            edges.append((ends[0], ends[1], lineno))
            continue
        node_id, description, values = _parse_node(line, lineno)
        if node_id in nodes:
            raise InvalidArtifact(f"node {node_id} appears twice (first on line "
                                  f"{nodes[node_id][2]})", field=f"line {lineno}")
        nodes[node_id] = (description, values, lineno)
    if not nodes:
        raise InvalidArtifact("no nodes found; is this a PipeDream graph.txt?")
    graph = nx.DiGraph()
    graph.add_nodes_from(nodes)
    for src, dst, lineno in edges:
        for end in (src, dst):
            if end not in nodes:
                raise InvalidArtifact(f"edge {src} -- {dst} names unknown node {end!r}",
                                      field=f"line {lineno}")
        if src == dst:
            raise InvalidArtifact(f"edge {src} -- {dst} is a self-loop", field=f"line {lineno}")
        graph.add_edge(src, dst)
    if not nx.is_directed_acyclic_graph(graph):
        cycle = nx.find_cycle(graph)
        raise InvalidArtifact("the graph has a cycle: " + " -> ".join(
            [cycle[0][0], *(v for _, v in cycle)]))
    return nodes, edges, graph


def import_pipedream(path: str | Path, *, device_type: str = "V100-16GB", batch_size: int = 1,
                     name: str | None = None, keep_input_time: bool = False) -> OpGraph:
    """Read a PipeDream ``graph.txt`` into an ``OpGraph`` (see the module docstring).

    ``keep_input_time`` keeps the measured time of ``Input`` source nodes, which
    are otherwise zeroed as PipeDream's optimizer does.

    Raises ``InvalidArtifact`` naming the file and line of a malformed node or
    edge, an unknown node, a duplicate node, or a cycle; ``UnknownName`` for a
    device type not in the catalog. O(nodes + edges).
    """
    from . import kind_of_description

    path = Path(path)
    lookup(device_type)
    if batch_size < 1:
        raise BadInput(f"--batch-size must be >= 1, got {batch_size}")
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise BadInput(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInput(f"{path}: cannot read it as text: {exc}") from None
    try:
        nodes, edges, graph = _read(text)
    except InvalidArtifact as exc:
        raise exc.at(file=str(path)) from None

    def order_key(node_id: str):
        digits = re.findall(r"\d+", node_id)
        return (int(digits[-1]) if digits else -1, node_id)

    order = list(nx.lexicographical_topological_sort(graph, key=order_key))
    inputs = {n for n in order if graph.in_degree(n) == 0 and nodes[n][0].startswith("Input")}
    zeroed = set() if keep_input_time else inputs
    ops = []
    for node_id in order:
        description, v, _ = nodes[node_id]
        kind = kind_of_description(description)
        scale = 0.0 if node_id in zeroed else 1.0
        ops.append(Op(id=node_id, name=description, kind=kind,
                      param_bytes=int(round(v["parameter_size"])),
                      output_bytes=int(round(v["activation_size"])),
                      fwd_ms={device_type: v["forward_compute_time"] * scale},
                      bwd_ms={device_type: v["backward_compute_time"] * scale},
                      splittable_dims=(0,) if kind is not OpKind.SHAPE else ()))
    position = {node_id: k for k, node_id in enumerate(order)}
    seen = set()
    out_edges = []
    for src, dst, _ in sorted(edges, key=lambda e: (position[e[1]], position[e[0]])):
        if (src, dst) in seen:
            continue
        seen.add((src, dst))
        out_edges.append(Edge(src=src, dst=dst, bytes=int(round(nodes[src][1]["activation_size"]))))
    ref = ModelRef(name=name or path.stem, source="pipedream", batch_size=batch_size,
                   options={"file": path.name})
    note = f"imported from PipeDream graph.txt {path.name}; times as recorded there"
    if inputs:
        note += ", Input nodes' times " + ("kept" if keep_input_time
                                           else "zeroed, as PipeDream's optimizer does")
    info = ProfileInfo(device_type=device_type, note=note)
    try:
        return OpGraph(model=ref, granularity="layer", profile=info, ops=tuple(ops),
                       edges=tuple(out_edges))
    except ValueError as exc:
        raise InvalidArtifact(str(exc), file=str(path)) from None
