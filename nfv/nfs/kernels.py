"""Small torch loops shared by the batched NF kernels, compiled with TorchScript when possible.

``step_packed`` steps a transition table over a packed, length-sorted,
time-major batch of streams: at step ``t`` the first ``active[t]`` rows are
still running and their symbols sit at ``data[offs[t]:offs[t]+active[t]]``.
It writes each step's table index (state + symbol) to ``traj`` so that the
caller can look up outputs for all steps at once afterwards. The loop runs
``len(active)`` steps of two tensor ops each; TorchScript keeps the
per-step interpreter overhead low (on CUDA each op is one kernel launch).
"""

from __future__ import annotations

import warnings

import torch


def _step_packed(state: torch.Tensor, data: torch.Tensor, traj: torch.Tensor, table: torch.Tensor,
                 active: list[int], offs: list[int]) -> torch.Tensor:
    for t in range(len(active)):
        n = active[t]
        o = offs[t]
        cur = traj[o:o + n]
        torch.add(state[:n], data[o:o + n], out=cur)
        torch.index_select(table, 0, cur, out=state[:n])
    return state


def _compile():
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return torch.jit.script(_step_packed)
    except Exception:  # TorchScript unavailable: the plain loop gives the same result
        return _step_packed


_compiled = _compile()


def step_packed(state: torch.Tensor, data: torch.Tensor, traj: torch.Tensor, table: torch.Tensor,
                active: list[int], offs: list[int]) -> torch.Tensor:
    """Run the stepping loop (see the module docstring); returns the final states.

    TorchScript runs without its profiling re-optimisation: every batch has new
    shapes, and re-specialising per call costs more than it saves.
    """
    with torch.jit.optimized_execution(False):
        return _compiled(state, data, traj, table, active, offs)
