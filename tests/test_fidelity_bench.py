"""The fidelity bench's ranking measures, on hand-made predictions and runs."""

from __future__ import annotations

import importlib.util
from pathlib import Path

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
