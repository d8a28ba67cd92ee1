"""``dl-nfv train``: execute a plan for real on worker processes and measure it."""

from __future__ import annotations

from pathlib import Path

import click

from .options import JSON_SUFFIXES, Number, deliver, json_option, output_option, seed_option


@click.command(name="train")
@click.argument("plan", type=click.Path(dir_okay=False))
@click.option("--steps", type=click.IntRange(min=1), default=10, show_default=True,
              help="Training steps to run.")
@click.option("--warmup", type=click.IntRange(min=0), default=None,
              help="Steps left out of the medians [default: a third of --steps, at most 3].")
@output_option("Write the run-report to this file (.json or .yaml).")
@json_option
@output_option("Write a torch.profiler Chrome trace (.json) of 3 steps after warm-up, one row "
               "per rank.", suffixes=JSON_SUFFIXES, flags=("--trace",), name="trace",
               special=False)
@click.option("--data", default=None, metavar="MODULE:FACTORY",
              help="Batches from factory(batch_size=, seed=) yielding (inputs, target) global "
                   "batches, instead of synthetic ones of the profiled shape.")
@click.option("--graph", type=click.Path(dir_okay=False), default=None,
              help="The op graph [default: the one the plan records].")
@click.option("--topology", type=click.Path(dir_okay=False), default=None,
              help="The topology [default: the one the plan records, if found].")
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help="Threads of every worker [default: its device's cores by the topology; "
                   "a GPU's worker: this host's cores / workers].")
@click.option("--backend", type=click.Choice(["auto", "gloo", "nccl"]), default="auto",
              show_default=True, help="auto: NCCL for GPU devices when CUDA is present, else gloo.")
@click.option("--timeout-s", type=Number(min=1), default=60.0, show_default=True,
              help="Time-out of every collective and transfer.")
@click.option("--lr", type=Number(min=0, min_open=True), default=None,
              help="Learning rate [default: 0.01 for sgd (momentum 0.9), 0.001 for adam].")
@seed_option
def command(plan: str, steps: int, warmup: int | None, output: Path | None, as_json: bool,
            trace: str | None, data: str | None, graph: str | None, topology: str | None,
            threads: int | None, backend: str, timeout_s: float, lr: float | None,
            seed: int) -> None:
    """Execute PLAN with torch.distributed: one worker process per plan device on this
    machine (gloo on CPU, NCCL on CUDA), and measure every step.

    Rank r runs the plan's r-th device. Data parallel (AllReduce buckets or
    parameter servers), pipeline (the plan's per-device schedule) and op
    placement (the plan's per-device order) plans are executed as planned; the
    run-report holds per-rank iteration, compute and wait times, peak memory and
    losses. For many hosts, run the same worker under torchrun:
    `torchrun ... -m dl_nfv.runtime.worker PLAN --steps N -o run.json`.

    \b
    Example:
      dl-nfv train plan.json --steps 30 -o run.json
      dl-nfv train plan.json --steps 30 --trace run-trace.json
      dl-nfv simulate plan.json --compare run.json
    """
    from dl_nfv.runtime.launcher import train
    from dl_nfv.runtime.worker import WorkerOptions

    options = WorkerOptions(plan=plan, graph=graph, topology=topology, steps=steps, warmup=warmup,
                            threads=threads, backend=backend, timeout_s=timeout_s, seed=seed,
                            lr=lr, data=data, trace=None if trace is None else str(trace))
    report = train(options)
    from .render_run import render

    deliver(report, output, as_json, render=render)
