"""The optimizer step, the zeroing of gradients and a backward's adding into them, timed on a
model's parameters
(``profilers.update.update_rates``): what it measures, what it leaves behind."""

from __future__ import annotations

import torch

from dl_nfv.profilers.update import (
    DEFAULT_CACHE_BYTES,
    UpdateRates,
    last_level_cache_bytes,
    update_rates,
)


def _model():
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8))
    return module, sum(p.numel() * 4 for p in module.parameters())


def test_rates_per_byte_for_both_optimizers_and_the_module_left_as_it_was():
    module, nbytes = _model()
    module(torch.randn(4, 64)).sum().backward()
    before = [p.detach().clone() for p in module.parameters()]
    threads = torch.get_num_threads()
    rates, zero, accumulate, note = update_rates(module, None, rounds=2)
    assert set(rates) == {"sgd", "adam"}
    assert all(v > 0 for v in rates.values()) and zero > 0 and accumulate > 0
    assert all(torch.equal(a, b) for a, b in zip(before, module.parameters()))  # lr 0
    assert all(p.grad is None for p in module.parameters())
    assert torch.get_num_threads() == threads
    assert f"over {nbytes / 1e6:.1f} MB of parameters" in note
    assert f"sgd {rates['sgd'] * nbytes / 1e6:.2f} ms" in note
    assert f"adding a backward's gradients into them {accumulate * nbytes / 1e6:.2f} ms" in note
    assert f"each after {2 * last_level_cache_bytes() >> 20} MiB through the caches" in note


def test_the_fastest_round_per_byte():
    module, nbytes = _model()
    ticks = []

    def clock() -> float:  # the k-th reading at k^2 seconds: every interval longer than the last
        ticks.append(1)
        return float(len(ticks) ** 2)

    rates, zero, accumulate, note = update_rates(module, None, rounds=4, clock=clock)
    # per optimizer: the settling round reads the clock 3 times, each timed round 4; then
    # the adding: 1 in its settling round, 2 in each timed one
    assert len(ticks) == 2 * (3 + 4 * 4) + 1 + 2 * 4
    first_sgd_step = 5 ** 2 - 4 ** 2  # the first timed round's step: readings 4 and 5
    first_zero = 7 ** 2 - 6 ** 2  # its zeroing: readings 6 and 7
    first_add = 41 ** 2 - 40 ** 2  # after the steps' 38 readings and the settling one
    assert rates["sgd"] == round(first_sgd_step * 1e9 / nbytes, 5)
    assert zero == round(first_zero * 1e9 / nbytes, 5)
    assert accumulate == round(first_add * 1e9 / nbytes, 5)
    assert "fastest of 4" in note


def test_timed_right_after_the_backward_it_is_given():
    module, nbytes = _model()
    x = torch.randn(4, 64)
    calls = []

    def backward() -> None:
        calls.append(all(p.grad is not None and not p.grad.any() for p in module.parameters()))
        module(x).sum().backward()

    before = [p.detach().clone() for p in module.parameters()]
    rates, zero, accumulate, note = update_rates(module, None, rounds=3, before=backward)
    # once before every step: a settling round and three timed, per optimizer; each time
    # into gradients the last round zeroed (the runtime zeroes them before the forward)
    assert calls == [True] * (2 * 4)
    assert set(rates) == {"sgd", "adam"} and all(v > 0 for v in rates.values()) and zero > 0
    assert all(torch.equal(a, b) for a, b in zip(before, module.parameters()))  # lr 0
    assert all(p.grad is None for p in module.parameters())
    assert "the step and the zeroing right after the model's backward" in note
    assert f"the adding after {2 * last_level_cache_bytes() >> 20} MiB through the caches" in note


def test_state_that_does_not_fit_half_the_free_memory_is_not_timed():
    module, nbytes = _model()
    rates, zero, accumulate, _ = update_rates(module, 3 * nbytes, rounds=1)  # Adam's 2x > 1.5x
    assert set(rates) == {"sgd"} and zero is not None and accumulate is not None
    assert update_rates(module, nbytes, rounds=1) == UpdateRates({}, None, None, "")


def test_a_module_without_parameters_has_no_rates():
    assert update_rates(torch.nn.ReLU(), None) == UpdateRates({}, None, None, "")


def test_the_last_level_cache_is_the_largest_cache_sysfs_lists():
    size = last_level_cache_bytes()
    assert size >= 2**20 or size == DEFAULT_CACHE_BYTES
    assert size % 1024 == 0
