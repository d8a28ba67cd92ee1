"""The fidelity bench's ranking measures, on hand-made predictions and runs."""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
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
    assert lines == ["| m | dp | 5.00 | 5.50 | 10.0% |",
                     "| m | - | +10.0% | +50.0% | - / x1.33 | 10.0% |"]
    # with the step alone timed after each profile, its drift leads the row
    rows[0]["machine"] = [first | {"reference_ms": 2.0}, again | {"reference_ms": 2.5}]
    lines = [x for x in fidelity.repeatability_table(rows).splitlines() if x.startswith("| m |")]
    assert lines[1] == "| m | +25.0% | +10.0% | +50.0% | - / x1.33 | 10.0% |"


def _timed(model, plan, predicted, measured, at_profile, rounds, median_run):
    return _row(model, plan, predicted, measured) | {
        "reference_ms": {"profile": at_profile, "rounds": rounds, "median_run": median_run}}


def test_each_prediction_is_set_beside_the_drift_to_its_kept_runs_round():
    """The drift is the step alone at the kept run's round over the one after the profile;
    the prediction scaled by it gives the error left: 10 ms predicted, the machine 20% slower
    at the run's round, 12 ms measured: -16.7% raw, 0 with the drift taken out."""
    a = _timed("m", "x", 10.0, 12.0, 2.0, [2.2, 2.4, 2.1], 1)
    b = _timed("m", "y", 10.0, 9.0, 2.0, [2.2, 2.4, 2.1], 2)  # 5% slower: +16.7% left
    c = _row("m", "z", 5.0, 5.0)  # no reference (an older result): left out of the table
    assert fidelity.drift_of(a) == pytest.approx(1.2)
    assert fidelity.drift_of(c) is None
    assert fidelity.drift_of(_timed("m", "w", 1.0, 1.0, None, [2.0], 0)) is None  # a kept profile
    text = fidelity.drift_table([a, b, c])
    lines = [x for x in text.splitlines() if x.startswith("| m |")]
    assert lines == ["| m | x | -16.7% | 2.00 / 2.40 | +20.0% | +0.0% |",
                     "| m | y | +11.1% | 2.00 / 2.10 | +5.0% | +16.7% |"]
    assert "median |error| 8.3%, worst 16.7% over 2 plans" in text
    assert "m 2.00 ms at the profile, 2.10-2.40 ms at the rounds" in text
    assert fidelity.drift_table([c]) == ""


def test_the_reference_step_follows_the_models_size(tmp_path):
    """The step alone, timed in a process of its own, grows with the batch (the zoo's MLP at
    2 and at 256 rows); a graph that cannot be read gives no figure instead of an error."""
    from dl_nfv.artifacts import to_data
    from dl_nfv.profilers.zoo import model_ref

    spec_ = importlib.util.spec_from_file_location("_reference", BENCH.parent / "_reference.py")
    reference = importlib.util.module_from_spec(spec_)
    spec_.loader.exec_module(reference)
    times = []
    for batch in (2, 256):
        path = tmp_path / f"mlp{batch}.json"
        path.write_text(json.dumps({"model": to_data(model_ref("mlp", batch_size=batch))}))
        times.append(reference.reference_ms(path, 0.2))
    assert 0 < times[0] < times[1] / 4
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    assert reference.reference_ms(broken, 0.2) is None
    # run by hand, the same file gives one line naming it, and exit 2
    done = subprocess.run([sys.executable, str(BENCH.parent / "_reference.py"), str(broken)],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith(f"error: {broken}: no model to step (JSONDecodeError")
    assert len(done.stderr.strip().splitlines()) == 1


def test_an_unknown_model_is_refused_before_any_work(tmp_path):
    """``--models`` naming a model the bench does not know: exit 2 naming it and the known
    ones, and no work folder written."""
    work = tmp_path / "work"
    done = subprocess.run([sys.executable, str(BENCH), "--models", "mlp,nosuch", "--no-record",
                           "--work", str(work)], capture_output=True, text=True, check=False)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == (
        "fidelity_bench.py: error: --models: unknown model 'nosuch' (known: "
        + ", ".join(fidelity.MODELS) + ")")
    assert not work.exists()


def test_a_summary_describes_the_options_its_results_were_made_with():
    """``--summarise`` records the section with the flags of the run that made the results
    (stored in results.json), not its own: a budget, the repeats, ``--quick``'s steps."""
    parser = fidelity.make_parser()
    args = parser.parse_args(["--summarise", "--work", "w"])
    made = ["--repeatability", "--budget-min", "25", "--repeats", "2"]
    args, argv = fidelity.ran_with(args, {"argv": made}, parser, ["--summarise"])
    assert argv == made
    assert (args.repeatability, args.budget_min, args.repeats, args.steps) == (
        True, 25.0, 2, fidelity.LEAST_STEPS)
    args, _ = fidelity.ran_with(parser.parse_args(["--summarise"]), {"argv": ["--quick"]},
                                parser, ["--summarise"])
    assert (args.steps, args.repeats) == (4, 1)
    # older results that do not store them: this command line's own, less where files go
    own = ["--summarise", "--work", "w", "--repeats", "5", "--revision", "abc", "--no-record"]
    args, argv = fidelity.ran_with(parser.parse_args(own), {}, parser, own)
    assert argv == ["--repeats", "5"] and args.repeats == 5
