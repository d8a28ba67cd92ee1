"""The single-process run a distributed run must match: same model, seed, batches, optimizer.

``reference_run`` trains the plan's model in this process on the full global
batch of every step, with plain autograd and the plan's optimizer. A correct
execution of any plan (data parallel, parameter server, pipeline, placement)
gives the same losses and parameters up to floating-point reassociation:
gradients summed over replicas and microbatches instead of computed at once.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dl_nfv.artifacts import ModelRef, Optimizer

from .executor import make_optimizer
from .model import build_workload, synthetic_batches


@dataclass(frozen=True)
class ReferenceResult:
    losses: tuple[float, ...]
    parameters: dict[str, torch.Tensor]


def reference_run(model: ModelRef, *, steps: int, batch_size: int, seed: int = 0,
                  optimizer: Optimizer = Optimizer.SGD, lr: float | None = None) -> ReferenceResult:
    """Train ``model`` for ``steps`` steps on one process; losses and final parameters.

    Cost: ``steps`` full-batch forward/backward passes of the model.
    """
    workload = build_workload(model, seed)
    module = workload.module
    opt = make_optimizer([p for p in module.parameters() if p.requires_grad], optimizer, lr)
    batches = synthetic_batches(workload, batch_size, seed)
    losses = []
    for _ in range(steps):
        inputs, target = next(batches)
        for p in module.parameters():
            p.grad = None
        loss = workload.loss(module(*inputs), target)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return ReferenceResult(losses=tuple(losses),
                           parameters={n: p.detach().clone() for n, p in module.named_parameters()})
