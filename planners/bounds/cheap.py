"""The cheap stage-balanced DP: every stage may take the fastest devices (a relaxation).

For ``m`` microbatches and a stage of regions ``[i, j)`` on ``k`` devices in share option
``o`` (``shares``), with ``F``, ``B``, ``P`` the forward, backward and passing parts of the
range (``ranges``), ``share`` the slowest replica's share and ``first`` the first replica's
(on the fastest device):

* **busy** ``m F.fixed + ... + whole.scalable x share``, after the chain before it; with
  a stage that may defer weight gradients only the passing part after the chain, and the
  whole busy time after the forward chain (the chain offset less ``drain_most``), plus the
  *tail* after the last backward (zeroing the buckets; on one device, the whole update);
* **chain**: the passing part at the first replica's share, both ways over the boundary;
* **around**: a replica's first backward waits for a microbatch to pass every later stage
  both ways, and the microbatch of its last forward must do the same: ``max(F_first +
  B_busy, F_busy + B_first)`` before the least chain after it;
* **sync** (no chain offset): the AllReduce floor after every forward and all but the last
  backward of the slowest replica, and after a round trip through the stages after it;
  the busy time plus what a replica does outside its ops (zeroing, a ``1/k`` share of the
  update);
* **wait**: a replicated stage's AllReduce also waits for the last gradient to come back,
  after its first forward and everything the stages after it do;
* **tied weights**: a split tie's AllReduce after the stage's chain-offset term.

The DP is then taken twice more where it can only rise: over partitions whose stages are
all at most a limit (``bisect_limit``), over the forward chain and the whole busy time
(plans that split backwards), and along the samples' average way (``average_way``): every
sample passes every stage, held there for its own replica's whole share, so the same DP
with every stage on its ``k`` fastest holders at their balanced fractional shares bounds
too.

Complexity: O(U^2 x D^2 x O) per DP, a few DPs per microbatch count.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from .dp import Shape, StageTerms, bisect_limit, capped_min_max, least_chain_after
from .shares import share_options

if TYPE_CHECKING:
    from .stage_balanced import Inputs


@dataclass(frozen=True, kw_only=True, slots=True)
class AverageWay:
    """A stage's terms along the samples' average way: its chain and work (each across the
    boundary), its round trip term (before the least chain after it), and what its
    AllReduce follows before the round trip of a microbatch through the stages after it."""

    chain: np.ndarray
    work: np.ndarray
    around: np.ndarray
    before_rest: np.ndarray


def average_way(fixed: dict, balanced: dict, fit: np.ndarray, m: int,
                hop: np.ndarray) -> AverageWay:
    """The terms of ``AverageWay`` from each part's fixed time per microbatch
    (``fixed[part]``, ``[i, j]``) and scalable time of the whole batch at the replicas'
    balance (``balanced[part]``, ``[i, j, K]``), where ``fit`` (``[i, j, K, o]``)."""

    def per(part: str, microbatches: int):  # the part's time for that many microbatches
        with np.errstate(invalid="ignore"):
            value = microbatches * fixed[part][:, :, None] + balanced[part] * (microbatches / m)
        return np.where(fit, value[..., None], np.inf)

    return AverageWay(
        chain=per("passing", 1) + hop, work=per("passing", m) + hop,
        around=np.maximum(per("forward", 1) + per("passing_backward", m),
                          per("forward", m) + per("passing_backward", 1)) + hop,
        before_rest=np.maximum(per("forward", 1) + per("backward", m - 1),
                               per("forward", m)))


@dataclass(frozen=True, kw_only=True, slots=True)
class _Compute:
    """A stage's compute per ``[i, j, k, o]`` at ``m`` microbatches (module docstring)."""

    busy: np.ndarray  # whole work of the slowest replica
    passing: np.ndarray  # of that, what the drain of the stages before waits for
    forward_busy: np.ndarray
    passing_backward_busy: np.ndarray
    forward_first: np.ndarray  # the first replica's forward of one microbatch
    passing_backward_first: np.ndarray
    backs: np.ndarray  # all but the last backward of the slowest replica
    with_weights: np.ndarray  # the round trip counted with the W's, from the forward chain
    first: np.ndarray  # [k, o]: the first replica's samples
    first_ms: np.ndarray  # [k, o]: its share over the fastest device


def _compute(x: Inputs, m: int) -> _Compute:
    r = x.ranges
    options = share_options(x.holders, r.regions, x.devices, x.batch, m)
    share, first = options.busy, options.first
    first_ms = first / (x.batch * x.fastest)

    def four(a: np.ndarray) -> np.ndarray:
        return a[:, :, None, None]

    fwd, bwd, pb = r.forward, r.backward, r.passing_backward
    with np.errstate(divide="ignore", invalid="ignore"):
        busy = np.where(np.isfinite(share),
                        m * four(r.whole.fixed) + four(r.whole.scalable) * share, np.inf)
        passing = np.where(np.isfinite(share),
                           m * four(r.passing.fixed) + four(r.passing.scalable) * share, np.inf)
        forward_busy = m * four(fwd.fixed) + four(fwd.scalable) * share
        forward_first = four(fwd.fixed) + four(fwd.scalable) * first_ms
        with_weights = np.maximum(
            forward_first + m * four(bwd.fixed) + four(bwd.scalable) * share,
            forward_busy + four(bwd.fixed) + four(bwd.scalable) * first_ms)
        out = _Compute(
            busy=busy, passing=passing, forward_busy=forward_busy,
            passing_backward_busy=m * four(pb.fixed) + four(pb.scalable) * share,
            forward_first=forward_first,
            passing_backward_first=four(pb.fixed) + four(pb.scalable) * first_ms,
            backs=(m - 1) * four(bwd.fixed) + four(bwd.scalable) * share * ((m - 1) / m),
            with_weights=with_weights, first=first, first_ms=first_ms)
    busy[:, :, 0] = np.inf
    passing[:, :, 0] = np.inf
    return out


@dataclass(frozen=True, kw_only=True, slots=True)
class _Crossings:
    """What the boundary before each stage adds (``[i, 1, k, o]``): both ways at the first
    replica's share, the way in only, and the most the chain offset adds beyond the forward
    chain (``[i, 1, 1, 1]``)."""

    both: np.ndarray
    way_in: np.ndarray
    drain: np.ndarray


def _crossings(x: Inputs, c: _Compute, m: int) -> _Crossings:
    r = x.ranges
    with np.errstate(invalid="ignore"):
        drain = x.boundaries.drain_most(r.backward.fixed[0],
                                        r.backward.scalable[0] / (m * x.fastest), x.batch / m)
        return _Crossings(both=x.boundaries.ms(c.first)[:, None],
                          way_in=x.boundaries.ms(c.first, True)[:, None],
                          drain=drain[:, None, None, None])


@dataclass(frozen=True, kw_only=True, slots=True)
class CheapTerms:
    """The cheap DP's terms at ``m`` microbatches, ``[i, j, k, o]`` each (module docstring);
    ``after`` the least chain after each region on each device count (on the grid's
    positions where the cluster takes a grid, ``after_grid``)."""

    busy: np.ndarray
    staged: np.ndarray  # busy with the chain offset (split backwards, ties, from the chain)
    chain: np.ndarray
    around: np.ndarray
    sync: np.ndarray
    wait: np.ndarray
    untied: np.ndarray
    after: np.ndarray
    after_grid: np.ndarray | None
    hop: np.ndarray
    forward_only: StageTerms | None  # the DP over the forward chain and the whole busy time


def cheap_terms(x: Inputs, m: int, shape: Shape) -> CheapTerms:
    """The terms of the cheap DP for ``m`` microbatches (``x``: the bound's ``Inputs``)."""
    r, c = x.ranges, _compute(x, m)
    hops = _crossings(x, c, m)
    replicated = (np.arange(x.devices + 1) > 1)[None, None, :, None]
    allreduce = (x.allreduce + x.outside)[..., None]
    tail = x.tail[..., None]
    with np.errstate(divide="ignore", invalid="ignore"):
        sync = np.where(replicated, c.forward_busy + c.backs + x.allreduce[..., None]
                        + x.outside[..., None], 0.0)
        sync = np.maximum(sync, c.busy + x.outside[..., None])
        chain = np.where(np.isfinite(c.first), r.passing.fixed[:, :, None, None]
                         + r.passing.scalable[:, :, None, None] * c.first_ms + hops.both, np.inf)
        around = np.maximum(c.forward_first + c.passing_backward_busy,
                            c.forward_busy + c.passing_backward_first) + hops.both
        around = np.where(np.isfinite(around), np.maximum(
            around, c.with_weights + hops.way_in - hops.drain + tail), np.inf)
        after_grid = None
        if shape.grid is None:
            after = least_chain_after(c.busy, chain, shape)
        else:  # on the grid; per count, at the grid value at or above it
            after_grid = least_chain_after(shape.grid.reduce(c.busy, 2),
                                           shape.grid.reduce(chain, 2), shape)
            after = after_grid[:, shape.grid.up]
        rest = after[None, :, ::-1, None]
        lead = allreduce + np.maximum(c.forward_first + c.backs + rest, c.forward_busy + rest)
        sync = np.where(replicated & np.isfinite(lead), np.maximum(sync, lead), sync)
        wait = np.where(replicated, c.forward_first + hops.way_in + allreduce, -np.inf)
    from_chain = np.maximum(c.busy + hops.way_in - hops.drain + tail,
                            sync + hops.way_in - hops.drain)
    forward_only = None
    if np.any(r.defers):
        chain_in = np.where(np.isfinite(c.first), c.forward_first + hops.way_in, np.inf)
        forward_only = StageTerms(busy=np.maximum(c.busy + tail, sync) + hops.way_in,
                                  chain=chain_in, sync=sync)
    return CheapTerms(busy=c.busy, staged=np.maximum(c.passing + hops.both
                                                     + x.ties[:, :, None, None], from_chain),
                      chain=chain, around=around, sync=sync, wait=wait,
                      untied=c.passing + hops.both, after=after, after_grid=after_grid,
                      hop=hops.both, forward_only=forward_only)


def cheap_bound(x: Inputs, m: int, enough: float, t: CheapTerms | None = None) -> float:
    """The cheap DP's bound for ``m`` microbatches, refined only until it reaches
    ``enough`` (``x``: the bound's ``Inputs``; ``t``: its terms, when already built): the
    largest of ``cheap_steps``, taken in turn while below ``enough``."""
    shape = Shape(split=x.ranges.split, devices=x.devices, grid=x.grid)
    if t is None:
        t = cheap_terms(x, m, shape)
    value = 0.0
    for step in _steps(x, t, m, shape, refined_first=True):
        value = max(value, step(enough))
        if value >= enough:
            break
    return value


def cheap_steps(x: Inputs, m: int, t: CheapTerms) -> list:
    """The cheap DP's bound for ``m`` microbatches as independent steps, each a function of
    ``enough`` that returns a bound on every plan of ``m`` (exact below ``enough``, at least
    it otherwise): the bound is their largest. The ones that cost least come first: the DP
    along the average way (often the largest) and over the forward chain (one capped DP
    each), then the DP with the limited chain after (``bisect_limit``: up to four)."""
    shape = Shape(split=x.ranges.split, devices=x.devices, grid=x.grid)
    return _steps(x, t, m, shape, refined_first=False)


def _steps(x: Inputs, t: CheapTerms, m: int, shape: Shape, refined_first: bool) -> list:
    """``cheap_steps`` in the order ``cheap_bound`` takes them (``refined_first``: the capped
    DP and its limited chain first, each later step only where the bound is below
    ``enough``) or cheapest first."""
    if x.grid is not None:
        steps = [lambda enough: _on_grid(t, shape, enough)]
        if t.forward_only is not None:
            steps.append(lambda enough: _forward_on_grid(t, shape, enough))
        return steps
    terms = StageTerms(busy=t.staged, chain=t.chain, sync=t.sync, around=t.around,
                       after=t.after, wait=t.wait, untied=t.untied)

    def limited(limit: float, enough: float) -> float:  # chain after: stages at most ``limit``
        short = np.where((t.busy <= limit) & (t.sync <= limit), t.busy, np.inf)
        after = least_chain_after(short, t.chain, shape)
        return capped_min_max(replace(terms, after=after), shape, enough)

    def capped(enough: float) -> float:
        value = capped_min_max(terms, shape, enough)
        return bisect_limit(value, enough, lambda limit: limited(limit, enough))

    averaged = [lambda enough: _averaged_bound(x, t, m, shape, enough)]
    forward = [] if t.forward_only is None else [
        lambda enough: capped_min_max(t.forward_only, shape, enough)]
    return [capped, *forward, *averaged] if refined_first else [*averaged, *forward, capped]


def _averaged_bound(x: Inputs, t: CheapTerms, m: int, shape: Shape, enough: float) -> float:
    """The cheap DP along the samples' average way: each stage on its ``k`` fastest holders
    at their fractional balance, its AllReduce after that way's forwards and round trip."""
    r = x.ranges
    fixed = {name: r.part(name).fixed for name in ("passing", "forward", "backward",
                                                   "passing_backward")}
    with np.errstate(invalid="ignore"):
        balanced = {name: r.part(name).scalable[:, :, None] * x.balanced_capacity
                    for name in fixed}
    way = average_way(fixed, balanced, np.isfinite(t.busy), m, t.hop)
    after = least_chain_after(t.busy, way.chain, shape)
    lead = (x.allreduce + x.outside)[..., None] + way.before_rest + after[None, :, ::-1, None]
    replicated = (np.arange(x.devices + 1) > 1)[None, None, :, None]
    lead_sync = np.where(replicated & np.isfinite(lead), lead, 0.0)
    return capped_min_max(StageTerms(busy=way.work, chain=way.chain,
                                     sync=np.maximum(t.sync, lead_sync), around=way.around,
                                     after=after, wait=t.wait, untied=way.work), shape, enough)


def _on_grid(t: CheapTerms, shape: Shape, enough: float) -> float:
    """The cheap DP on the device-count grid of a large cluster (``DeviceGrid``)."""
    grid = shape.grid

    def reduce(a: np.ndarray) -> np.ndarray:
        return grid.reduce(a, 2)

    return capped_min_max(StageTerms(
        busy=reduce(t.staged), chain=reduce(t.chain), sync=reduce(t.sync),
        around=reduce(t.around), after=t.after_grid, wait=reduce(t.wait),
        untied=reduce(t.untied)), shape, enough)


def _forward_on_grid(t: CheapTerms, shape: Shape, enough: float) -> float:
    """The DP over the forward chain and the whole busy time on the grid."""
    f, grid = t.forward_only, shape.grid
    return capped_min_max(StageTerms(busy=grid.reduce(f.busy, 2), chain=grid.reduce(f.chain, 2),
                                     sync=grid.reduce(f.sync, 2)), shape, enough)
