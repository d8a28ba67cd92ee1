"""Small valid artifacts built in code, for tests that mutate or round-trip them."""

from __future__ import annotations

import copy

from dl_nfv.artifacts import fingerprint, from_document

TOPOLOGY = {
    "kind": "topology", "schema_version": 1, "name": "two-hosts",
    "hosts": [
        {"name": "a", "devices": [{"type": "V100-16GB", "count": 2}],
         "interconnect": {"kind": "nvlink", "bandwidth_gbps": 200, "latency_us": 1},
         "nics": [{"switch": "tor", "bandwidth_gbps": 25, "latency_us": 5}]},
        {"name": "b", "devices": [{"type": "T4", "count": 1}],
         "nics": [{"switch": "tor", "bandwidth_gbps": 25, "latency_us": 5}]},
    ],
    "switches": [{"name": "tor"}],
}

GRAPH = {
    "kind": "op-graph", "schema_version": 1,
    "model": {"name": "mlp-tiny", "batch_size": 8, "inputs": [{"shape": [8, 16]}]},
    "ops": [
        {"id": "x", "name": "x", "kind": "input", "output_bytes": 512},
        {"id": "fc1", "name": "fc1", "kind": "matmul", "flops": 8192, "bwd_flops": 16384,
         "param_bytes": 1088, "output_bytes": 512, "params": ["fc1.weight", "fc1.bias"],
         "fwd_ms": {"cpu": 0.02}, "bwd_ms": {"cpu": 0.04}, "splittable_dims": [0]},
        {"id": "relu", "name": "relu", "kind": "activation", "output_bytes": 512,
         "fwd_ms": {"cpu": 0.005}, "bwd_ms": {"cpu": 0.005}},
        {"id": "fc2", "name": "fc2", "kind": "matmul", "flops": 2048, "param_bytes": 264,
         "output_bytes": 128, "params": ["fc2.weight", "fc2.bias"], "fwd_ms": {"cpu": 0.01}},
    ],
    "edges": [{"src": "x", "dst": "fc1", "bytes": 512}, {"src": "fc1", "dst": "relu", "bytes": 512},
              {"src": "relu", "dst": "fc2", "bytes": 512}],
}


def plan_doc() -> dict:
    graph = from_document(copy.deepcopy(GRAPH))
    topo = from_document(copy.deepcopy(TOPOLOGY))
    return {
        "kind": "plan", "schema_version": 1, "planner": "hand",
        "graph_sha256": fingerprint(graph), "topology_sha256": fingerprint(topo),
        "batch_size": 8,
        "groups": [
            {"id": "s0", "ops": ["x", "fc1"], "devices": ["a/gpu0", "a/gpu1"],
             "batch_shares": [0.75, 0.25]},
            {"id": "s1", "ops": ["relu", "fc2"], "devices": ["b/gpu0"], "sync": "none"},
        ],
        "pipeline": {"microbatches": 2, "stages": ["s0", "s1"], "schedule_kind": "gpipe",
                     "schedule": {"a/gpu0": "0F0 0F1 0B0 0B1", "a/gpu1": "0F0 0F1 0B0 0B1",
                                  "b/gpu0": "1F0 1F1 1B0 1B1"}},
        "prediction": {"iteration_ms": 1.5, "peak_memory_bytes": {"a/gpu0": 1000}},
        "bound_ms": 1.0,
    }


def fresh(doc: dict) -> dict:
    return copy.deepcopy(doc)
