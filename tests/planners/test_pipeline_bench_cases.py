"""Two cases of ``bench/plan_bench.py``, planned from the profiles the recorded table was made
from (``bench/profiles/``), held to the table's figures.

The planners are deterministic and the GPU times come from the profiles, so a plan that
gets slower than the recorded one, or a baseline it no longer beats by as much, is a
regression of the search, not noise. A faster plan passes (and the bench records it).
Inception-v3 on the HeteroG testbed is the case closest to the issue's 1.5x goal (1.519x);
VGG-19 on the ring is the one where links bind most.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dl_nfv.artifacts import load
from dl_nfv.planners.compare import compare
from dl_nfv.simulator import simulate
from tests.conftest import EXAMPLES

PROFILES = Path(__file__).resolve().parents[2] / "bench" / "profiles"
BASELINES = ("gpipe", "1f1b", "pipedream", "dp")

# (profile, cluster): the recorded pipeline iteration ms and its speed-up over the best of
# gpipe / 1f1b / pipedream (docs/benchmarks.md, plan_bench, as measured)
RECORDED = {
    ("inception-v3-b32-r3", "heterog-testbed8"): (18.809, 1.519),
    ("vgg19-b32-r3", "ring8-mixed"): (43.852, 2.332),
}


@pytest.mark.parametrize("profile,cluster", sorted(RECORDED), ids=lambda v: v)
def test_the_bench_case_is_no_slower_than_recorded(profile, cluster):
    graph = load(PROFILES / f"{profile}.json", expect="op-graph")
    topology = load(EXAMPLES / "topologies" / f"{cluster}.yaml", expect="topology")
    rows = {row.planner: row for row in compare(graph, topology, ["pipeline", *BASELINES])}
    pipe = rows["pipeline"]
    recorded_ms, recorded_speedup = RECORDED[(profile, cluster)]

    assert pipe.feasible
    assert pipe.iteration_ms <= recorded_ms
    # the plan's prediction is the shared simulator's time of the plan it wrote (to the six
    # decimals of a millisecond that the plan file keeps)
    assert simulate(pipe.plan, graph, topology).iteration_ms == pytest.approx(pipe.iteration_ms,
                                                                               abs=1e-6)
    assert pipe.bound_ms <= pipe.iteration_ms
    assert all(pipe.iteration_ms <= rows[b].iteration_ms for b in BASELINES if rows[b].feasible)
    best_pipe = min(rows[b].iteration_ms for b in ("gpipe", "1f1b", "pipedream"))
    assert best_pipe / pipe.iteration_ms >= recorded_speedup
