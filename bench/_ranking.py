"""The fidelity bench's ranking measures: how well predicted times order plans as their
measured times do, given how much a plan's measured time moves from run to run."""

from __future__ import annotations

SEPARABLE = 0.10  # plans closer than this in measured time are within run-to-run noise


def kendall_tau(a: list[float], b: list[float]) -> float:
    """Kendall's tau between two orderings of the same items (1: same order)."""
    n = len(a)
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    if not pairs:
        return 1.0
    score = sum((1 if (a[i] - a[j]) * (b[i] - b[j]) > 0 else -1 if (a[i] - a[j]) * (b[i] - b[j]) < 0
                 else 0) for i, j in pairs)
    return score / len(pairs)


def separable_pairs(pred: list[float], meas: list[float], apart: float = SEPARABLE) -> tuple[int, int]:
    """(pairs ordered as measured, pairs) among plans whose measured times differ by more
    than ``apart`` (relative to the faster): the pairs a ranking must get right, given how
    much a plan's measured time moves from run to run on this machine. Pairs predicted
    equal count as right, as in ``discordant_pairs``."""
    right = total = 0
    for i in range(len(meas)):
        for j in range(i + 1, len(meas)):
            if abs(meas[i] - meas[j]) <= apart * min(meas[i], meas[j]):
                continue
            total += 1
            right += same(pred[i], pred[j]) or (pred[i] - pred[j]) * (meas[i] - meas[j]) > 0
    return right, total


def run_separated_pairs(pred: list[float], runs: list[list[float]]) -> tuple[int, int]:
    """(pairs ordered as measured, pairs) among plans that every run orders the same way:
    each run of one plan was faster than each run of the other (their min-max ranges do
    not overlap). Pairs predicted equal count as right (a tie agrees with any order)."""
    right = total = 0
    for i in range(len(runs)):
        for j in range(i + 1, len(runs)):
            if not runs[i] or not runs[j]:
                continue
            if max(runs[i]) < min(runs[j]):
                faster = -1.0
            elif max(runs[j]) < min(runs[i]):
                faster = 1.0
            else:
                continue
            total += 1
            right += same(pred[i], pred[j]) or (pred[i] - pred[j]) * faster > 0
    return right, total


def same(a: float, b: float) -> bool:
    """Predicted times this close are the same plan or a tie (no order to get right)."""
    return abs(a - b) <= 1e-6 * max(abs(a), abs(b), 1.0)


def discordant_pairs(pred: list[float], meas: list[float]) -> list[tuple[int, int]]:
    """Pairs the prediction orders strictly one way and the measurement the other (pairs
    predicted equal, such as two planners that made the same plan, are ties: any measured
    order agrees with them)."""
    return [(i, j) for i in range(len(pred)) for j in range(i + 1, len(pred))
            if not same(pred[i], pred[j]) and (pred[i] - pred[j]) * (meas[i] - meas[j]) < 0]
