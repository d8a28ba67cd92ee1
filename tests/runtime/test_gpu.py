"""On a CUDA machine the same commands run on NCCL (skipped without a GPU)."""

from __future__ import annotations

import pytest
import torch

from dl_nfv.artifacts import from_data
from dl_nfv.artifacts.topology import Topology
from dl_nfv.runtime.launcher import train
from dl_nfv.runtime.reference import reference_run
from dl_nfv.runtime.worker import WorkerOptions

from .helpers import dp_plan, graph_of, write

pytestmark = pytest.mark.gpu


def _gpu_topology(n: int) -> Topology:
    return from_data(Topology, {
        "kind": "topology", "schema_version": 1, "name": f"test-gpu{n}",
        "hosts": [{"name": "local", "devices": [{"type": "V100-16GB", "count": n}],
                   "interconnect": {"kind": "pcie", "bandwidth_gbps": 126, "latency_us": 1}}]})


@pytest.mark.parametrize("n", [1, 2])
def test_data_parallel_on_nccl_matches_single_process(tmp_path, n):
    if torch.cuda.device_count() < n:
        pytest.skip(f"needs {n} CUDA devices")
    graph, topo = graph_of("mlp-tiny", batch_size=8), _gpu_topology(n)
    plan = dp_plan(graph, topo, tuple(f"local/gpu{i}" for i in range(n)), buckets=2)
    report = train(WorkerOptions(plan=str(write(tmp_path, graph, topo, plan)), steps=3, warmup=0),
                   start_method="forkserver")
    assert report.backend == "nccl"
    ref = reference_run(graph.model, steps=3, batch_size=8)
    torch.testing.assert_close(torch.tensor(report.losses), torch.tensor(ref.losses),
                               rtol=1e-4, atol=1e-5)
