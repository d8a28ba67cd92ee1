"""Export a pipeline plan for an existing runtime: torch.distributed.pipelining.

``torch_pipelining(plan, graph)`` returns the files (name -> text) of the
export; ``export_files(plan_path)`` loads a plan and the graph it records and
does the same. The files:

* ``schedule.csv``: the "compute_only" CSV that
  ``_PipelineScheduleRuntime._load_csv`` reads (torchtitan:
  ``--parallelism.pipeline_parallel_schedule_csv``): one row per pipeline
  rank, one action per cell in the notation ``2F0`` (stage 2, forward,
  microbatch 0). A rank is a device running the first replica of a stage; a
  device running several stages gets them all in its row, in its order.
* ``split_points.json``: for every stage its ops, the fully qualified module
  names they come from, the module to split before (the ``split_spec`` of
  ``torch.distributed.pipelining.pipeline`` with ``SplitPoint.BEGINNING``), its
  devices and batch shares; the microbatch count and schedule kind; and what
  torch.distributed.pipelining cannot express of the plan (stages replicated
  unequally, uneven batch shares), stated plainly.
* ``README.md``: how to load both.

Raises ``BadInput`` when the plan has no pipeline or an unknown format is asked.
"""

from __future__ import annotations

import json
from pathlib import Path

from dl_nfv.artifacts import BadInput, OpGraph, Plan, TieSync, load
from dl_nfv.simulator.costs import tied_weights

FORMATS = ("torch-pipelining",)


def export_files(plan_path: str | Path, *, graph: str | Path | None = None,
                 fmt: str = "torch-pipelining") -> dict[str, str]:
    """Load the plan at ``plan_path`` (and its recorded graph) and export it as ``fmt``."""
    from dl_nfv.simulator.files import artifact_path

    if fmt not in FORMATS:
        raise BadInput(f"unknown export format {fmt!r}; valid: {', '.join(FORMATS)}")
    plan = load(plan_path, expect="plan")
    graph_record = load(artifact_path(plan, plan_path, "graph", graph), expect="op-graph")
    return torch_pipelining(plan, graph_record, source=str(plan_path))


def torch_pipelining(plan: Plan, graph: OpGraph, source: str = "plan") -> dict[str, str]:
    """The torch.distributed.pipelining export of ``plan`` (see the module docstring)."""
    pipe = plan.pipeline
    if pipe is None:
        raise BadInput(f"{source}: the plan (planner {plan.planner!r}) has no pipeline; "
                       f"export --format torch-pipelining needs a plan with pipeline stages")
    groups = {g.id: g for g in plan.groups}
    index = graph.index
    missing = [op for g in plan.groups for op in g.ops if op not in index]
    if missing:
        raise BadInput(f"{source}: the plan places op {missing[0]!r}, which graph "
                       f"{graph.model.name!r} does not have")
    position = {op_id: i for i, op_id in enumerate(graph.topological_ids())}
    ranks: list[str] = []
    for sid in pipe.stages:
        first = groups[sid].devices[0]
        if first not in ranks:
            ranks.append(first)
    rows = [pipe.schedule.get(d, "").split() for d in ranks]
    csv_text = "".join(",".join(row) + "\n" for row in rows)
    stages = []
    split_spec: dict[str, str] = {}
    for s, sid in enumerate(pipe.stages):
        g = groups[sid]
        ops = sorted(g.ops, key=position.__getitem__)
        modules = list(dict.fromkeys(index[op].module or index[op].name for op in ops))
        entry = {"stage": s, "group": sid, "rank": ranks.index(g.devices[0]),
                 "devices": list(g.devices), "batch_shares": list(g.shares),
                 "ops": ops, "modules": modules}
        if s > 0:
            entry["split_before"] = modules[0]
            split_spec[modules[0]] = "beginning"
        stages.append(entry)
    caveats = []
    widths = {len(groups[sid].devices) for sid in pipe.stages}
    if widths != {1}:
        if len(widths) == 1:
            caveats.append(f"every stage is replicated on {widths.pop()} devices: run "
                           f"torch.distributed.pipelining on a 2-D mesh (pipeline x data "
                           f"parallel), one pipeline per data-parallel rank, the i-th replica of "
                           f"each stage in the i-th pipeline")
        else:
            caveats.append("stages are replicated on different numbers of devices "
                           f"({[len(groups[sid].devices) for sid in pipe.stages]}); "
                           "torch.distributed.pipelining needs one data-parallel degree for "
                           "all stages, so run this plan with `dl-nfv train` or flatten it")
        uneven = [sid for sid in pipe.stages if len(set(groups[sid].shares)) > 1]
        if uneven:
            caveats.append(f"stages {uneven} give their replicas uneven batch shares "
                           f"(heterogeneous devices); torch's DataParallel split is even")
    stage_of = {op: s for s, sid in enumerate(pipe.stages) for op in groups[sid].ops}
    split_ties = sorted({name for name, owner, sharer, _ in tied_weights(graph)
                         if stage_of.get(sharer) != stage_of.get(owner)})
    if split_ties:
        how = ("by exchange (the head's dense gradient one way, the embedding's non-zero rows "
               "the other)" if plan.tie_sync is TieSync.EXCHANGE else "by AllReduce")
        caveats.append(f"tied weights {split_ties} are used by two stages; the plan sums their "
                       f"gradients {how} after each step's backward, which "
                       f"torch.distributed.pipelining leaves to the caller")
    shared = len(ranks) < len(pipe.stages)
    manifest = {
        "format": "torch-pipelining",
        "planner": plan.planner,
        "model": graph.model.name,
        "batch_size": plan.batch_size,
        "microbatches": pipe.microbatches,
        "schedule_kind": pipe.schedule_kind.value,
        "stages_per_rank": "several" if shared else 1,
        "ranks": ranks,
        "split_spec": split_spec,
        "stages": stages,
        "caveats": caveats,
    }
    readme = _README.format(stages=len(pipe.stages), ranks=len(ranks), m=pipe.microbatches,
                            kind=pipe.schedule_kind.value, split=json.dumps(split_spec),
                            caveats="".join(f"- {c}\n" for c in caveats) or "- none\n")
    return {"schedule.csv": csv_text, "split_points.json": json.dumps(manifest, indent=1) + "\n",
            "README.md": readme}


_README = """# torch.distributed.pipelining export

{stages} stages on {ranks} pipeline ranks, {m} microbatches, schedule `{kind}`.

Split the model where the plan does (`split_points.json` lists every stage's ops and modules):

```python
from torch.distributed.pipelining import SplitPoint, pipeline
split_spec = {{name: SplitPoint.BEGINNING for name in {split}}}
pipe = pipeline(model, mb_args=(example_microbatch,), split_spec=split_spec)
```

Run the planned per-rank order (`schedule.csv`, one row per rank):

```python
from torch.distributed.pipelining.schedules import ScheduleLoopedBFS  # any _PipelineScheduleRuntime
schedule = ScheduleLoopedBFS([stage], n_microbatches={m}, loss_fn=loss_fn)
schedule._load_csv("schedule.csv", format="compute_only")
```

What torch.distributed.pipelining cannot express of this plan:

{caveats}"""
