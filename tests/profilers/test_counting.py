"""CostCounter against closed forms: FLOPs, bytes accessed, activation bytes, peak memory."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from dl_nfv.profilers.counting import CostCounter


def _count(fn, *, backward=True, track=()):
    counter = CostCounter()
    counter.track(track)
    counter.current = "op"
    with counter:
        out = fn()
        counter.end_forward()
        if backward:
            counter.phase = "bwd"
            out.float().sum().backward()
    return counter, out


def test_linear_forward_and_backward_flops():
    lin = nn.Linear(16, 8)
    x = torch.randn(4, 16, requires_grad=True)
    c, _ = _count(lambda: lin(x))
    assert c.flops["op"] == 2 * 4 * 16 * 8
    # grad input and grad weight: two matmuls of the same size.
    assert c.bwd_flops["op"] == 2 * (2 * 4 * 16 * 8)
    x = torch.randn(4, 16)  # no grad for the input: only the weight gradient
    c, _ = _count(lambda: lin(x))
    assert c.bwd_flops["op"] == 2 * 4 * 16 * 8


def test_grouped_convolution_backward_is_not_overcounted():
    for groups in (1, 8):
        conv = nn.Conv2d(8, 16, 3, padding=1, groups=groups, bias=False)
        x = torch.randn(2, 8, 6, 6, requires_grad=True)
        c, _ = _count(lambda conv=conv, x=x: conv(x))
        forward = 2 * 2 * 16 * 36 * (8 // groups) * 9
        assert c.flops["op"] == forward
        assert c.bwd_flops["op"] == 2 * forward


def test_lstm_flops_on_the_fused_cpu_kernel():
    batch, steps, inp, hidden = 3, 5, 6, 4
    lstm = nn.LSTM(inp, hidden, batch_first=True, bidirectional=True)
    x = torch.randn(batch, steps, inp)
    c, _ = _count(lambda: lstm(x)[0])
    per_direction = 2 * batch * steps * 4 * hidden * (inp + hidden)
    assert c.flops["op"] == 2 * per_direction
    assert c.bwd_flops["op"] == 2 * 2 * per_direction


def test_attention_flops_on_the_fused_cpu_kernel():
    b, h, s, d = 2, 3, 8, 4
    q = torch.randn(b, h, s, d, requires_grad=True)
    c, _ = _count(lambda: F.scaled_dot_product_attention(q, q, q, is_causal=True))
    assert c.flops["op"] == 4 * b * h * s * s * d  # QK^T and AV, causality not discounted
    assert c.bwd_flops["op"] >= 2 * c.flops["op"]


def test_bytes_accessed_reads_operands_and_writes_results_and_skips_views():
    a = torch.randn(64, 32)
    b = torch.randn(32, 16)
    c, _ = _count(lambda: a @ b, backward=False)
    assert c.bytes_accessed["op"] == 4 * (64 * 32 + 32 * 16 + 64 * 16)
    c, _ = _count(lambda: a.view(32, 64).t(), backward=False)
    assert c.bytes_accessed["op"] == 0


def test_activation_bytes_are_what_survives_the_forward_pass():
    lin = nn.Linear(8, 8)
    x = torch.randn(5, 8)

    def fn():
        hidden = lin(x)  # freed: relu's backward needs only relu's output
        return torch.relu(hidden)

    c, out = _count(fn, backward=False, track=[*lin.parameters(), x])
    assert c.activation_bytes["op"] == out.numel() * 4


def test_peak_memory_counts_parameters_activations_and_gradients():
    lin = nn.Linear(256, 256, bias=False)
    x = torch.randn(4, 256)
    params = list(lin.parameters())
    c, _ = _count(lambda: lin(x), track=[*params, x])
    weight = 256 * 256 * 4
    assert c.peak_bytes >= 2 * weight + x.numel() * 4  # weight + its gradient + input
    assert c.peak_bytes < 4 * weight
