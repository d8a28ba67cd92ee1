"""List scheduling of one training step at op granularity: HEFT, CPOP and ETF.

The scheduled graph is the *training step* of an op graph: every op has a
forward task and a backward task. Forward tasks follow the graph's edges,
backward tasks follow them reversed (the gradient of a tensor has its size),
and an op's backward waits for its own forward. An op's backward runs on the
device of its forward (its parameters and stashed activations live there), so
only forward tasks choose a device; backward tasks inherit it.

A *unit* is one op on one device: an op that is not split is one unit; an op
split k ways over the batch is k units, each pinned to its device and holding
the batch interval ``[lo, hi)``. Data moves between two units in proportion to
the overlap of their batch intervals, so a split op receives its input
scattered and its consumers gather (concatenate) its output; those transfers
are costed like any other.

Costs come from the shared ``CostModel`` only: op times per device type
(scaled by batch share, launch overhead unscaled) and point-to-point transfer
times on the topology's real routes. A lone transfer is affine in the byte
count on a route, so its two coefficients per ordered device pair are read
once from the cost model (``transfer_affine``) and kept in small tables.

Algorithms (each returns a ``OpSchedule``):

* ``list_schedule`` - HEFT-style list scheduling (Topcuoglu et al., 2002):
  tasks in decreasing priority from a ready queue, each forward task to the
  device giving its earliest finish time (insertion into idle gaps), with
  per-device memory respected. With ``upward_ranks`` as the priority this is
  HEFT; with ``upward + downward`` ranks and the critical path pinned
  (``cpop_pins``) it is CPOP.
* ``etf_schedule`` - earliest task first (Hwang et al., 1989), Baechi's m-ETF:
  among all ready tasks, the (task, device) pair that can start earliest,
  with memory checks; optional favourite children (Baechi's m-SCT).

Transfers book every link of their route for their whole duration (the
simulator's whole-route reservation), so the schedulers see contention and
their own estimate of the iteration tracks the simulator's closely.

Colocation: the ops of one group of ``OpGraph.colocation`` that are not split
go to one device, the one the group's first placed op went to (which must
have room for the whole group); a group whose ops are split is split alike
by the caller (``fastt``), each replica pinned.

Modules: ``stepgraph`` (units, tasks and costs), ``priorities`` (upward and
downward ranks, CPOP's critical path), ``resources`` (device timelines,
memory and colocation ledger, links), ``heft`` (``list_schedule``), ``etf``
(``etf_schedule``), ``backward`` (``backward_pass``), ``schedule`` (the
``OpSchedule`` record and ``plan_groups``).

Complexity: building a ``StepGraph`` is O(ops x devices + edges). HEFT and
CPOP are O((U + E) x D x L) for U units, E unit edges, D devices and L links
per route, plus the gap search of insertion (bounded by ``MAX_GAP_SCAN``
intervals per query); ETF is O(U x R x D) with R the largest ready set, done
with numpy per step.
"""

from __future__ import annotations

from .backward import backward_pass
from .etf import etf_schedule
from .heft import list_schedule
from .priorities import cpop_pins, downward_ranks, upward_ranks
from .schedule import OpSchedule, plan_groups
from .stepgraph import MemoryShortfall, Split, StepGraph

__all__ = [
    "MemoryShortfall", "OpSchedule", "Split", "StepGraph", "backward_pass", "cpop_pins",
    "downward_ranks", "etf_schedule", "list_schedule", "plan_groups", "upward_ranks",
]
