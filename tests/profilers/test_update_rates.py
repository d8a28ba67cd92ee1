"""The optimizer step and the zeroing of gradients timed on a model's parameters
(``profilers.update.update_rates``): what it measures, what it leaves behind."""

from __future__ import annotations

import torch

from dl_nfv.profilers.update import update_rates


def _model_and_step():
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8))
    x = torch.randn(16, 64)
    calls = []

    def backward():
        calls.append(1)
        module.zero_grad(set_to_none=True)
        module(x).square().mean().backward()

    return module, backward, calls


def test_rates_per_byte_for_both_optimizers_and_the_module_left_as_it_was():
    module, backward, calls = _model_and_step()
    before = [p.detach().clone() for p in module.parameters()]
    threads = torch.get_num_threads()
    rates, zero, note = update_rates(module, backward, None, rounds=2)
    assert set(rates) == {"sgd", "adam"}
    assert all(v > 0 for v in rates.values()) and zero > 0
    assert len(calls) == 2 * (2 + 1)  # a plain step before every step, one settling per optimizer
    assert all(torch.equal(a, b) for a, b in zip(before, module.parameters()))  # lr 0
    assert all(p.grad is None for p in module.parameters())
    assert torch.get_num_threads() == threads
    nbytes = sum(p.numel() * 4 for p in module.parameters())
    assert f"over {nbytes / 1e6:.1f} MB of parameters" in note
    assert f"sgd {rates['sgd'] * nbytes / 1e6:.2f} ms" in note


def test_state_that_does_not_fit_half_the_free_memory_is_not_timed():
    module, backward, _ = _model_and_step()
    nbytes = sum(p.numel() * 4 for p in module.parameters())
    rates, zero, _ = update_rates(module, backward, 3 * nbytes, rounds=1)  # Adam's 2x > 1.5x
    assert set(rates) == {"sgd"} and zero is not None
    assert update_rates(module, backward, nbytes, rounds=1) == ({}, None, "")


def test_a_module_without_parameters_has_no_rates():
    assert update_rates(torch.nn.ReLU(), lambda: None, None) == ({}, None, "")


def test_rounds_stop_once_the_two_fastest_agree():
    module, backward, calls = _model_and_step()
    ticks = iter(range(10_000))
    rates, zero, note = update_rates(module, backward, None, rounds=5,
                                     clock=lambda: float(next(ticks)))
    nbytes = sum(p.numel() * 4 for p in module.parameters())
    assert len(calls) == 2 * 3  # settling + two rounds that agree, per optimizer
    assert rates == {"sgd": round(1e9 / nbytes, 5), "adam": round(1e9 / nbytes, 5)}
    assert zero == round(1e9 / nbytes, 5)
    assert "fastest of up to 2 rounds" in note
