"""``planners.compare``: every row is the artifact's ``ComparisonRow`` (with its plan beside
it), figures derived from the plan it holds, and an infeasible planner a row that says why."""

from __future__ import annotations

import pytest

from dl_nfv.artifacts import from_data, from_document
from dl_nfv.artifacts.results import ComparisonRow, PlanComparison
from dl_nfv.planners.compare import compare
from tests.artifacts.fixtures import GRAPH, TOPOLOGY, fresh


def test_rows_are_comparison_rows_whose_figures_come_from_their_plans():
    graph, topology = from_document(fresh(GRAPH)), from_document(fresh(TOPOLOGY))
    rows = compare(graph, topology, ["single", "dp"])
    assert [r.planner for r in rows] == ["single", "dp"]
    assert all(isinstance(r, ComparisonRow) and r.feasible for r in rows)
    single, dp = rows
    for row in rows:
        assert row.iteration_ms == row.plan.prediction.iteration_ms
        assert row.bound_ms == row.plan.bound_ms
        assert row.ratio_to_bound == pytest.approx(row.iteration_ms / row.bound_ms)
        assert row.devices == len(row.plan.devices)
        assert row.peak_memory_bytes == max(row.plan.prediction.peak_memory_bytes.values())
    assert dp.speedup_vs_dp == pytest.approx(1.0)
    assert single.speedup_vs_dp == pytest.approx(dp.iteration_ms / single.iteration_ms)
    data = [r.to_data() for r in rows]
    assert all("plan" not in d for d in data)
    table = from_data(PlanComparison, {"graph": "mlp-tiny", "topology": "two-hosts",
                                       "rows": data})
    assert [r.iteration_ms for r in table.rows] == [r.iteration_ms for r in rows]
    assert table.rows[0] == ComparisonRow(**{k: getattr(single, k) for k in data[0]})


def test_an_infeasible_planner_is_a_row_with_its_reason_and_no_figures():
    graph = from_document(fresh(GRAPH))
    topology = from_document(fresh(TOPOLOGY))
    rows = compare(graph, topology, ["gpipe"], options={"microbatches": 3})
    (row,) = rows
    assert not row.feasible and row.error and row.plan is None
    assert row.to_data() == {"planner": "gpipe", "feasible": False, "error": row.error}
