"""Building the model and its batches on every rank, identically.

A *workload* is what the profiler's zoo hands out for a ``ModelRef``: the
``module``, ``make_batch(batch_size, seed) -> (inputs tuple, target)`` and
``loss(output, target)``. Every rank builds it from the same seed, so every
rank starts from the same parameters without a broadcast; the runtime checks
that (a checksum of the parameters is compared across ranks at start-up).

Batches are *global*: every rank makes (or loads) the same global batch of a
step and keeps its own rows. ``split_rows`` is the one integer split of a batch
by shares that the whole runtime uses.

The loss of a workload must be a mean over the samples of the batch (as
``cross_entropy`` is): the runtime weights each slice's loss by its sample
count over the global batch, so that summed gradients equal the full-batch one.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

import torch

from dl_nfv.artifacts import BadInput, ModelRef


class Workload(Protocol):
    module: torch.nn.Module

    def make_batch(self, batch_size: int, seed: int) -> tuple[tuple[torch.Tensor, ...], Any]: ...

    def loss(self, output: Any, target: Any) -> torch.Tensor: ...


def build_workload(model: ModelRef, seed: int) -> Workload:
    """The workload of ``model`` (zoo name or ``module:callable``), built from ``seed``.

    Raises ``UnknownName``/``BadInput`` (from the zoo) for a model it cannot build.
    """
    from dl_nfv.profilers.zoo import instantiate

    torch.manual_seed(seed)
    return instantiate(model, seed=seed)


def data_seed(seed: int, step: int) -> int:
    """The seed of the synthetic batch of ``step`` (the same on every rank)."""
    return seed * 1_000_003 + step


def synthetic_batches(workload: Workload, batch_size: int, seed: int) -> Iterator:
    """Endless global batches of the profiled shape, one seed per step."""
    step = 0
    while True:
        yield workload.make_batch(batch_size, data_seed(seed, step))
        step += 1


def load_data_factory(spec: str) -> Callable[..., Any]:
    """Import ``module:factory`` for ``--data``; ``BadInput`` naming what is missing."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise BadInput(f"--data: expected 'module:factory', got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise BadInput(f"--data: cannot import module {module_name!r}: {exc}") from None
    try:
        return getattr(module, attr)
    except AttributeError:
        raise BadInput(f"--data: module {module_name!r} has no {attr!r}") from None


def user_batches(spec: str, batch_size: int, seed: int) -> Iterator:
    """Global batches from a user factory ``factory(batch_size=..., seed=...) -> iterable``.

    Each item must be ``(inputs, target)`` with ``inputs`` a tensor or a tuple of
    tensors of ``batch_size`` rows; the iterable is restarted when exhausted.
    """
    factory = load_data_factory(spec)
    epoch = 0
    while True:
        produced = False
        for item in factory(batch_size=batch_size, seed=seed + epoch):
            produced = True
            inputs, target = item
            if isinstance(inputs, torch.Tensor):
                inputs = (inputs,)
            rows = inputs[0].shape[0]
            if rows != batch_size:
                raise BadInput(f"--data {spec}: a batch has {rows} rows, the plan's batch size "
                               f"is {batch_size}")
            yield tuple(inputs), target
        if not produced:
            raise BadInput(f"--data {spec}: the factory yielded no batch")
        epoch += 1


def split_rows(total: int, shares: Sequence[float]) -> list[tuple[int, int]]:
    """Contiguous ``[lo, hi)`` row ranges of ``total`` rows split by ``shares`` (largest remainder).

    The counts sum to ``total``; shares that are exact fractions of ``total``
    give exactly those counts. O(len(shares) log len(shares)).
    """
    weight = sum(shares)
    exact = [total * s / weight for s in shares]
    counts = [math.floor(x + 1e-9) for x in exact]
    rest = total - sum(counts)
    for i in sorted(range(len(shares)), key=lambda i: (-(exact[i] - counts[i]), i))[:max(rest, 0)]:
        counts[i] += 1
    bounds, lo = [], 0
    for c in counts:
        bounds.append((lo, lo + c))
        lo += c
    return bounds


def take_rows(value: Any, lo: int, hi: int) -> Any:
    """Rows ``lo:hi`` of a tensor, or of every tensor in a tuple/list/dict."""
    if isinstance(value, torch.Tensor):
        return value[lo:hi]
    if isinstance(value, (tuple, list)):
        return type(value)(take_rows(v, lo, hi) for v in value)
    if isinstance(value, dict):
        return {k: take_rows(v, lo, hi) for k, v in value.items()}
    return value


def to_device(value: Any, device: torch.device) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, (tuple, list)):
        return type(value)(to_device(v, device) for v in value)
    if isinstance(value, dict):
        return {k: to_device(v, device) for k, v in value.items()}
    return value


def parameter_checksum(module: torch.nn.Module) -> float:
    """A float64 checksum of every parameter (equal on ranks built from the same seed)."""
    total = 0.0
    with torch.no_grad():
        for i, p in enumerate(module.parameters()):
            total += float(p.detach().double().sum()) * (1 + (i % 7) * 1e-3)
    return total
