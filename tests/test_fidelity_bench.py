"""The fidelity bench's ranking measures, on hand-made predictions and runs."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "fidelity_bench.py"
spec = importlib.util.spec_from_file_location("fidelity_bench", BENCH)
fidelity = importlib.util.module_from_spec(spec)
spec.loader.exec_module(fidelity)


def test_only_pairs_every_run_orders_count():
    runs = [[10, 11, 12], [13, 14, 15], [11.5, 16, 17]]  # 0 < 1 in every run; 2 overlaps both
    assert fidelity.run_separated_pairs([1.0, 2.0, 3.0], runs) == (1, 1)
    assert fidelity.run_separated_pairs([2.0, 1.0, 3.0], runs) == (0, 1)
    # a tie in the prediction agrees with any measured order
    assert fidelity.run_separated_pairs([1.0, 1.0, 3.0], runs) == (1, 1)


def test_pairs_apart_by_more_than_the_noise_and_swapped_pairs():
    pred, meas = [1.0, 2.0, 3.0, 3.0], [100.0, 105.0, 130.0, 90.0]
    # 0-1 within 10%; 0-2, 1-2, 0-3 (11%), 1-3, 2-3 apart; 2-3 predicted equal (right)
    assert fidelity.separable_pairs(pred, meas) == (3, 5)
    # 0-3 and 1-3 measured the other way; 2-3 predicted equal: a tie, not a swap
    assert fidelity.discordant_pairs(pred, meas) == [(0, 3), (1, 3)]


def _row(model, plan, predicted, measured):
    return {"model": model, "plan": plan, "predicted_ms": predicted, "measured_ms": measured,
            "rel_error": (predicted - measured) / measured}


def test_per_model_summary_of_errors_best_plan_and_pairs():
    rows = [_row("a", "x", 11.0, 10.0), _row("a", "y", 18.0, 20.0), _row("a", "z", 30.0, 24.0),
            _row("b", "x", 10.0, 10.0), _row("b", "y", 9.0, 10.5), {"model": "b", "plan": "f",
                                                                      "error": "failed"}]
    a, b = fidelity.model_summary(rows)
    # |errors| 10%, 10%, 25%: median 10%, worst 25%; x leads y by 2x and is predicted best;
    # pairs apart by > 10%: x-y, x-z, y-z (20 vs 24), all ordered right
    assert a == ["a", "3", "10.0%", "25.0%", "yes", "3 / 3"]
    # within 10% of each other: no best plan to name, no pair to order
    assert b == ["b", "2", "7.1%", "14.3%", "- (lead <= 10%)", "0 / 0"]


def test_a_best_plan_predicted_second_is_reported():
    rows = [_row("a", "x", 12.0, 10.0), _row("a", "y", 11.0, 20.0)]
    assert fidelity.model_summary(rows)[0][4:] == ["no", "0 / 1"]


def test_a_run_lasts_the_measured_time_as_predicted_within_its_bounds():
    """At least ``least`` steps; a fast plan gets enough steps for ``MEASURED_S`` of them, up
    to ``MAX_STEPS``; an unknown prediction keeps ``least``."""
    fb = fidelity
    assert fb.steps_for(1000.0, 8) == 8  # 8 s of steps already
    assert fb.steps_for(50.0, 8) == math.ceil(fb.MEASURED_S * 1000 / 50.0)
    assert fb.steps_for(0.01, 8) == fb.MAX_STEPS
    assert fb.steps_for(0.0, 8) == 8
    assert fb.steps_for(fb.MEASURED_S * 1000 / 3, 8) == 8  # 3 steps' worth: the floor


def test_machine_figures_and_their_drift_between_two_profiles(tmp_path):
    """The plain step as recorded, and the one-thread op sum at an eighth of the batch by the
    cost model's scaling (fixed + (t - fixed) / 8), summed over phases and ops; the table
    gives the second profile's figures against the first's."""
    def graph(name, step, ops, co_run=None):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps({"profile": {"step_ms": step, "co_run_slowdown": co_run}, "ops": [
            {"fwd_ms_by_threads": {"1": t}, "fwd_fixed_ms_by_threads": {"1": f},
             "bwd_ms_by_threads": {"1": 2 * t}, "bwd_fixed_ms_by_threads": {"1": 2 * f}}
            for t, f in ops]}))
        return fidelity.machine_figures(path)

    first = graph("a", 10.0, [(8.0, 0.0), (1.0, 1.0)])  # 8/8 + 1, twice that backward
    again = graph("b", 11.0, [(8.0, 0.0), (2.0, 2.0)], co_run=1.335)
    assert first == {"step_ms": 10.0, "small_1t_ms": pytest.approx(6.0), "co_run": None}
    assert again["small_1t_ms"] == pytest.approx(9.0)
    rows = [{"model": "m", "plan": "dp", "first_ms": 5.0, "again_ms": 5.5, "rel_diff": 0.1,
             "machine": [first, again]}]
    lines = [x for x in fidelity.repeatability_table(rows).splitlines() if x.startswith("| m |")]
    assert lines == ["| m | dp | 5.00 | 5.50 | 10.0% |", "| m | +10.0% | +50.0% | - / x1.33 | 10.0% |"]
