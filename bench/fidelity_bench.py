"""Simulator fidelity on this machine: predicted vs measured iteration time of real plans.

For each model (zoo: MLP, ResNet-50 at a small batch, GPT-2 small at a short
sequence; user models from ``bench/models/`` that nothing was tuned on: a U-Net, a
top-2 Mixture-of-Experts MLP, token pruning by ``masked_select``) the benchmark

1. profiles the model as the README does, with the defaults (``dl-nfv profile
   model``: torch's threads, and every op again at 1 thread), and the links
   between two one-thread workers (``dl-nfv profile network --nprocs 2 --threads
   1``: devices of one core), right before the model's plans run, so that both
   calibrations see the machine as the runs do (a shared machine's speed drifts
   over minutes);
2. plans it for that 2-process topology (or ``--topology FILE``) with data
   parallelism (``dp``: AllReduce; ``dp-ps``: parameter server), 2-stage
   pipelines (``gpipe`` and ``1f1b``), FastT's plan (``fastt``: whatever it
   finds fastest, often data parallelism on two CPUs), an op placement over
   both devices (``m-topo``: Baechi's topological fill) and one device (``single``);
3. simulates every plan (``dl-nfv simulate``) and runs it for real (``dl-nfv train``,
   each worker with its device's cores, ``--steps`` steps or more: enough for
   ``MEASURED_S`` of steps as predicted, so a tiny model is timed in its steady state)
   ``--repeats`` times, in rounds over the model's
   plans so that a slow spell of the shared machine touches every plan alike, keeping
   the median run, of two the faster (with ``--budget-min M``, each model gets an equal
   share of the minutes left, and a round after its second runs only where one as long
   fits there: a plan run once cannot be told from a slow spell of the machine, which
   took GPT-2 small's first three plans 17-30% over their runs of other hours);
4. writes predicted vs measured iteration times, the relative errors, per model the
   median and worst |error|, whether the measured best plan is predicted best (where
   it leads the next by more than ``SEPARABLE``) and how many pairs of plans further
   apart than that are ordered right, and the machine's load average before and after,
   to ``docs/benchmarks.md`` (section ``fidelity``).

The machine's own drift is timed beside: the model's one-thread step alone
(``_reference.py``) right after its profile and at the start of every round of runs; a
table sets each plan's error beside the drift between the profile and its kept run's round,
and the error left with the prediction scaled by it (a diagnostic: the goals are the errors).

With ``--repeatability`` every model is profiled a second time, minutes after the first,
and every plan predicted from both profiles on the same topology: the issue's goal is
predictions within ``REPEATABLE`` (5%) of each other (a table after the fidelity tables).
Beside it, per model, how far the machine's own figures moved between the two profiles
(``machine_figures``: the plain step, the ops' one-thread sum at a microbatch's size, the
co-run slowdown).

Everything goes through the command line a user types, so the numbers are
those a user would get. Work files stay in ``--work`` (default: a temporary
folder) for inspection; the profiles and link measurements there are made anew on every
run unless ``--reuse-profiles`` keeps them (a profile from another hour of a shared
machine moves every error).

Shared machines: a measurement (profile or run) is only kept when other jobs
used less than ``--max-others`` cores while it ran (the machine's busy time
from ``/proc/stat`` minus the CPU time of the measured process tree); before
each try the benchmark waits (up to 2 min) until other jobs use fewer than that
many cores, sampled over a second at a time. The table shows the other jobs'
share of each kept run.

Usage: python bench/fidelity_bench.py [--models mlp,resnet50,gpt2-small,unet,moe,prune]
       [--steps 8] [--repeats 3] [--topology FILE (default: measured per model)] [--work DIR]
       [--no-record] [--quick (a smoke run: 4 steps, 1 run, every run kept)] [--repeatability]
       [--budget-min M]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _ranking import (  # noqa: E402
    SEPARABLE,
    discordant_pairs,
    kendall_tau,
    run_separated_pairs,
    same,
    separable_pairs,
)
from _record import git_revision, markdown_table, record_section  # noqa: E402
from _reference import reference_ms  # noqa: E402

from dl_nfv.profilers.model import SCALING_DIVISOR  # noqa: E402
from dl_nfv.simulator.costs import scale_by_batch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
REPEATABLE = 0.05  # two profiles of one model on one machine: predictions this close (goal)
REFERENCE_S = 2.0  # the machine's speed for the model (``_reference``): seconds of steps
# A run's steps: at least ``--steps`` and enough for MEASURED_S of predicted steps, up to
# MAX_STEPS. A process's steps get faster over its first tens (caches, the allocator, the
# interpreter's specialisation): a 2 ms model's single-device plan measured 2.2-2.5 ms
# over 8 steps and 1.85 ms over 400, which is the time a real training run spends.
MEASURED_S = 1.0
MAX_STEPS = 400
# At least this many steps, so that the runtime's default warm-up (a third of the run, at
# most 3) is 3 steps: in nine GPT-2 small runs the second step took 1.2-2.6x the steady
# one and the third up to 1.7x (1.2-1.4x in five), in their compute; a median over 8 steps,
# two of them warm-up, kept the third.
LEAST_STEPS = 9
# Rounds a model runs whatever the time budget says (module doc, step 3)
LEAST_ROUNDS = 2

# model -> what `dl-nfv profile model` is given (small batches / short sequences: a 2-core
# CPU runs them): user models that no planner or cost figure was tuned on, and zoo models;
# run in this order, a round's cost rising (seconds for the first four, minutes for the
# last two), so that under a time budget the equal shares pass what a cheap model leaves
# on to the costly ones, and the cheap ones are not held to the fewest rounds by a costly
# one's overrun
MODELS: dict[str, list[str]] = {
    "prune": ["bench/models/prune.py:build", "--input-shape", "16,32,64"],
    "moe": ["bench/models/moe.py:build", "--input-shape", "32,256"],
    "unet": ["bench/models/unet.py:build", "--input-shape", "8,3,64,64"],
    "mlp": ["mlp", "--batch-size", "64"],
    "resnet50": ["resnet50", "--batch-size", "4"],
    "gpt2-small": ["gpt2-small", "--batch-size", "4", "--seq-len", "32"],
}
# label -> planner and options
PLANS: dict[str, list[str]] = {
    "dp (allreduce)": ["dp"],
    "dp-ps": ["dp-ps"],
    "gpipe 2 stages": ["gpipe", "--stages", "2"],
    "1f1b 2 stages": ["1f1b", "--stages", "2"],
    "fastt": ["fastt"],
    "m-topo placement": ["m-topo"],
    "single device": ["single"],
}


def dl_nfv(*args: str, timeout: float = 3600) -> str:
    """Run ``dl-nfv`` and return its stdout; raise with its stderr on failure."""
    cmd = [sys.executable, "-m", "dl_nfv", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args[:3])} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


def plan_and_simulate(planner: tuple[str, ...], graph: Path, topology: Path, plan: Path,
                      sim: Path) -> None:
    """``plan`` then ``simulate`` one planner's plan of ``graph`` (``RuntimeError`` on failure)."""
    dl_nfv("plan", *planner, "--graph", str(graph), "--topology", str(topology), "-o", str(plan))
    dl_nfv("simulate", str(plan), "-o", str(sim))


def _busy_s() -> float:
    """CPU seconds the whole machine has been busy (all cores), from /proc/stat."""
    fields = [float(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


QUIET_WINDOW_S = 1.0  # how long other jobs' core use is sampled before a try


def others_now(window_s: float = QUIET_WINDOW_S) -> float:
    """Cores other jobs use right now: the machine's busy time over ``window_s`` while
    this bench sleeps (its runs are over: their CPU time is not in the window)."""
    busy0, t0 = _busy_s(), time.perf_counter()
    time.sleep(window_s)
    return max(0.0, _busy_s() - busy0) / (time.perf_counter() - t0)


def wait_for_quiet(max_others: float, patience_s: float) -> None:
    """Wait (up to ``patience_s``) until other jobs use fewer than ``max_others`` cores,
    sampled over ``QUIET_WINDOW_S`` at a time. (The 1-minute load average, used before,
    still counted the bench's own runs of the last minute: the two workers of each run
    held it near 1-2 for a minute after they ended, so that most tries slept first.)"""
    if math.isinf(max_others):
        return
    deadline = time.monotonic() + patience_s
    while others_now() >= max_others and time.monotonic() < deadline:
        time.sleep(1.0)


def quietly(args: list[str], *, max_others: float, tries: int, patience_s: float = 120
            ) -> float:
    """Run ``dl-nfv *args`` until other jobs used < ``max_others`` cores meanwhile.

    Returns the other jobs' mean core use during the kept try (the last one
    when none was quiet enough).
    """
    others = float("inf")
    for _ in range(tries):
        wait_for_quiet(max_others, patience_s)
        busy0, mine0, t0 = _busy_s(), _children_cpu_s(), time.perf_counter()
        dl_nfv(*args)
        wall = time.perf_counter() - t0
        others = max(0.0, (_busy_s() - busy0) - (_children_cpu_s() - mine0)) / wall
        if others < max_others:
            break
        print(f"    other jobs used {others:.2f} cores during {args[0]}; again", flush=True)
    return others


def devices_used(plan_path: Path) -> int:
    plan = json.loads(plan_path.read_text())
    used = {d for g in plan["groups"] for d in g["devices"]}
    used |= {d for g in plan["groups"] for d in g.get("ps_servers", ())}
    return len(used)


def steps_for(predicted_ms: float, least: int) -> int:
    """A run's steps: ``least``, or more where they last under ``MEASURED_S`` as predicted
    (``MAX_STEPS`` at most)."""
    if predicted_ms <= 0:
        return least
    return max(least, min(MAX_STEPS, math.ceil(MEASURED_S * 1000 / predicted_ms)))


def run_model(model: str, topology: Path | None, work: Path, steps: int, *, max_others: float,
              tries: int, repeats: int = 1, reuse: bool = False,
              deadline: float | None = None) -> list[dict]:
    """Plan and simulate every plan of ``model``, then run them all ``repeats`` times, in
    rounds (each round runs every plan once, so drift on the machine touches all plans
    alike); a plan's measured time is the median run's. Without ``topology`` the links
    are measured (``profile network``) right after the model is profiled. With ``reuse``,
    a profile and links already in ``work`` are kept (their measurements are as old as
    the files). With ``deadline`` (a ``time.perf_counter`` time), a round after the
    ``LEAST_ROUNDS``-th starts only if one as long as the last ends before it."""
    graph = work / f"{model}.json"
    at_profile = None  # the model's step alone right after its profile (a kept one: none)
    if not (reuse and graph.exists()):
        t0 = time.perf_counter()
        others = quietly(["profile", "model", *MODELS[model], "-o", str(graph)],
                         max_others=max_others, tries=tries)
        print(f"  profiled {model} in {time.perf_counter() - t0:.0f} s (other jobs: "
              f"{others:.2f} cores)", flush=True)
        at_profile = reference_ms(graph, REFERENCE_S)
    if topology is None:
        topology = work / f"{model}-network.yaml"
        if not (reuse and topology.exists()):
            others = quietly(["profile", "network", "--nprocs", "2", "--threads", "1", "-o",
                              str(topology), "--report", str(work / f"{model}-network.json")],
                             max_others=max_others, tries=tries)
            print(f"  measured the links of 2 workers (other jobs: {others:.2f} cores)",
                  flush=True)
    rows: dict[str, dict] = {}
    runs: dict[str, list[tuple[float, dict, float, float]]] = {}
    plan_steps: dict[str, int] = {}
    for label, planner in PLANS.items():
        stem = work / f"{model}-{planner[0]}"
        plan, sim = stem.with_suffix(".plan.json"), stem.with_suffix(".sim.json")
        try:
            plan_and_simulate(planner, graph, topology, plan, sim)
        except RuntimeError as exc:
            print(f"  {model} / {label}: {exc}", flush=True)
            rows[label] = {"model": model, "plan": label, "error": str(exc).splitlines()[0]}
            continue
        runs[label] = []
        predicted_ms = json.loads(sim.read_text())["iteration_ms"]
        plan_steps[label] = steps_for(predicted_ms, steps)
    round_s = 0.0
    at_round: list[float | None] = []  # the model's step alone at the start of each round
    for r in range(repeats):
        if (r >= LEAST_ROUNDS and deadline is not None
                and time.perf_counter() + round_s > deadline):
            print(f"  {model}: {r} round(s) of {repeats}: the time budget leaves no room for "
                  f"another", flush=True)
            break
        round_s = -time.perf_counter()
        at_round.append(reference_ms(graph, REFERENCE_S))
        for label in runs:
            stem = work / f"{model}-{PLANS[label][0]}"
            run = stem.with_suffix(f".run{r}.json" if repeats > 1 else ".run.json")
            t0 = time.perf_counter()
            try:
                others = quietly(["train", str(stem.with_suffix(".plan.json")), "--steps",
                                  str(plan_steps[label]), "-o", str(run)],
                                 max_others=max_others, tries=tries)
            except RuntimeError as exc:
                print(f"  {model} / {label}: {exc}", flush=True)
                rows[label] = {"model": model, "plan": label, "error": str(exc).splitlines()[0]}
                continue
            report = json.loads(run.read_text())
            runs[label].append((report["iteration_ms"], report, time.perf_counter() - t0, others,
                                r))
        round_s += time.perf_counter()
    for label, done in runs.items():
        if label in rows or not done:
            continue
        stem = work / f"{model}-{PLANS[label][0]}"
        rounds = [x[0] for x in done]  # in round order
        done.sort(key=lambda x: x[0])
        measured, report, wall, others, median_round = done[(len(done) - 1) // 2]
        simulated = json.loads(stem.with_suffix(".sim.json").read_text())
        predicted = simulated["iteration_ms"]
        busy, host = _device_times(simulated)
        row = {"model": model, "plan": label, "mode": report["mode"],
               "devices": devices_used(stem.with_suffix(".plan.json")), "predicted_ms": predicted,
               "measured_ms": measured, "measured_runs": rounds,
               "rel_error": (predicted - measured) / measured,
               "wait_ms": [r["wait_ms"] for r in report["per_rank"]],
               "compute_ms": [r["compute_ms"] for r in report["per_rank"]],
               "cpu_ms": [r.get("cpu_ms") or 0.0 for r in report["per_rank"]],
               "busy_ms": [busy.get(r["device"], 0.0) for r in report["per_rank"]],
               "host_comm_ms": [host.get(r["device"], 0.0) for r in report["per_rank"]],
               "wall_s": wall, "others_cores": others, **_updates(stem, report),
               "reference_ms": {"profile": at_profile, "rounds": at_round,
                                "median_run": median_round}}
        rows[label] = row
        print(f"  {model:10s} {label:16s} predicted {predicted:9.1f} ms  measured {measured:9.1f} ms"
              f" (runs {', '.join(f'{x[0]:.0f}' for x in done)})  error {row['rel_error']:+.1%}",
              flush=True)
    return [rows[label] for label in PLANS if label in rows]


def repeatability(model: str, work: Path, topology: Path, *, max_others: float, tries: int,
                  first_reference: float | None = None) -> list[dict]:
    """Profile ``model`` once more (``{model}-again.json``, minutes after the first) and
    predict every plan from it on the same topology: per plan the two predictions and their
    relative difference (the goal: within ``REPEATABLE``). A planner may plan differently
    from the second profile; that is part of what a user would see."""
    again = work / f"{model}-again.json"
    quietly(["profile", "model", *MODELS[model], "-o", str(again)], max_others=max_others,
            tries=tries)
    out = []
    machine = [machine_figures(work / f"{model}.json") | {"reference_ms": first_reference},
               machine_figures(again) | {"reference_ms": reference_ms(again, REFERENCE_S)}]
    for label, planner in PLANS.items():
        first = work / f"{model}-{planner[0]}.sim.json"
        plan, sim = (work / f"{model}-{planner[0]}-again.plan.json",
                     work / f"{model}-{planner[0]}-again.sim.json")
        if not first.exists():
            continue
        try:
            plan_and_simulate(planner, again, topology, plan, sim)
        except RuntimeError as exc:
            print(f"  {model} / {label} (second profile): {exc}", flush=True)
            continue
        a = json.loads(first.read_text())["iteration_ms"]
        b = json.loads(sim.read_text())["iteration_ms"]
        out.append({"model": model, "plan": label, "first_ms": a, "again_ms": b,
                    "rel_diff": abs(b - a) / a,
                    "machine": machine})
        print(f"  {model:10s} {label:16s} predicted {a:9.2f} ms, from a second profile "
              f"{b:9.2f} ms ({abs(b - a) / a:.1%})", flush=True)
    return out


def machine_figures(graph: Path) -> dict[str, float]:
    """Figures of a profile that two profiles of one model differ in only as the machine
    does: its plain step (``step_ms``, at the profile's threads), its ops' one-thread sum at
    the profile's smaller batch (``SCALING_DIVISOR``: a pipeline microbatch's size, the
    small, memory-bound shapes whose speed moves most with the moment of a shared machine;
    scaled as the cost model scales), and its co-run slowdown."""
    doc = json.loads(graph.read_text())
    small = sum(scale_by_batch(op.get(f"{phase}_ms_by_threads", {}).get("1", 0.0),
                               op.get(f"{phase}_fixed_ms_by_threads", {}).get("1", 0.0),
                               1 / SCALING_DIVISOR)
                for op in doc["ops"] for phase in ("fwd", "bwd"))
    return {"step_ms": doc["profile"]["step_ms"], "small_1t_ms": small,
            "co_run": doc["profile"].get("co_run_slowdown")}


def _co_runs(pair: list[dict]) -> str:
    """Two profiles' co-run slowdowns, as ``x1.00 / x1.34`` (``-`` where not measured)."""
    return " / ".join("-" if m.get("co_run") is None else f"x{m['co_run']:.2f}" for m in pair)


def _drift(pair: list[dict], key: str) -> str:
    first, again = pair
    if not first.get(key) or again.get(key) is None:
        return "-"
    return f"{(again[key] - first[key]) / first[key]:+.1%}"


def repeatability_table(rows: list[dict]) -> str:
    """Markdown: every plan's predictions from two profiles, and the worst per model; per
    model, how much the machine's own figures moved between the two profiles."""
    if not rows:
        return ""
    table = markdown_table(["model", "plan", "predicted ms (profile 1)", "predicted ms (profile 2)",
                            "difference"],
                           [[r["model"], r["plan"], f"{r['first_ms']:.2f}", f"{r['again_ms']:.2f}",
                             f"{r['rel_diff']:.1%}"] for r in rows])
    worst = {}
    for r in rows:
        worst[r["model"]] = max(worst.get(r["model"], 0.0), r["rel_diff"])
    lines = ", ".join(f"{m} {w:.1%}" for m, w in worst.items())
    machine = {r["model"]: r["machine"] for r in rows if "machine" in r}  # per model: 2 profiles
    moved = [[m, _drift(machine[m], "reference_ms"), _drift(machine[m], "step_ms"),
              _drift(machine[m], "small_1t_ms"), _co_runs(machine[m]), f"{w:.1%}"]
             for m, w in worst.items() if m in machine]
    drift = "" if not moved else (
        "\n\nWhat the machine's own speed did between the two profiles of each model: the "
        "model's one-thread step timed alone right after each profile (`bench/_reference.py`), "
        "the second profile's plain step (at the profile's threads) and its ops' one-thread sum "
        "at an eighth of the batch (a microbatch's size), against the first's, and the co-run "
        "slowdown each measured (two CPUs of a virtual machine interfere in some minutes and "
        "not in others: docs/profile.md): where these moved by more than the goal, the two "
        "profiles measured a different machine.\n\n" + markdown_table(
            ["model", "step alone (reference)", "plain step", "1-thread op sum at 1/8 batch",
             "co-run slowdown", "worst prediction difference"], moved))
    return (f"\n\nRepeatability: every plan predicted from two profiles of the same model on "
            f"this machine, minutes apart (goal: within {REPEATABLE:.0%}).\n\n{table}\n\n"
            f"Worst difference per model: {lines}.\n{drift}\n")


def _references(row: dict) -> tuple[float, float] | None:
    """The model's step alone (``_reference``) right after the profile and at the start of
    the round of the plan's kept run, in ms; None where either was not timed."""
    ref = row.get("reference_ms") or {}
    rounds, at, first = ref.get("rounds") or [], ref.get("median_run"), ref.get("profile")
    then = rounds[at] if at is not None and at < len(rounds) else None
    return (first, then) if first and then else None


def drift_of(row: dict) -> float | None:
    """The machine's drift between a plan's prediction and its kept run: the step alone at
    that run's round over the same right after the profile (``_references``); None where
    either was not timed."""
    pair = _references(row)
    return None if pair is None else pair[1] / pair[0]


def drift_table(rows: list[dict]) -> str:
    """Markdown: per plan, its error beside the machine's drift between the profile and its
    kept run, and the error left with the prediction scaled by that drift (a diagnostic:
    how much of an error the machine's own speed accounts for; the goals are the errors)."""
    ok = [(r, pair) for r in rows if "error" not in r and (pair := _references(r))]
    if not ok:
        return ""
    table, left = [], []
    for r, (first, then) in ok:
        d = then / first
        adjusted = r["predicted_ms"] * d / r["measured_ms"] - 1
        left.append(abs(adjusted))
        table.append([r["model"], r["plan"], f"{r['rel_error']:+.1%}", f"{first:.2f} / {then:.2f}",
                      f"{d - 1:+.1%}", f"{adjusted:+.1%}"])
    per_model = {}
    for r, _ in ok:
        ref = r["reference_ms"]
        per_model.setdefault(r["model"], (ref["profile"], [x for x in ref["rounds"] if x]))
    spans = "; ".join(f"{m} {p:.2f} ms at the profile, {min(xs):.2f}-{max(xs):.2f} ms at the "
                      f"rounds" for m, (p, xs) in per_model.items() if xs)
    return "\n".join([
        "",
        "The machine's drift: each model's one-thread step timed alone (`bench/_reference.py`: "
        f"pinned to one core, thread CPU time, {REFERENCE_S:g} s of steps) right after its "
        "profile and at the start of every round of runs, and per plan the drift between the "
        "profile and the round "
        "of its kept run. A shared machine's speed for a model whose data fill the caches moves "
        "by tens of percent within minutes, whatever the load average says; the last column "
        "scales the prediction by that drift, to show how much of each error is the machine's "
        "moment rather than the cost model (a diagnostic beside the goals, which are the "
        f"errors). Step alone: {spans}.",
        "",
        markdown_table(["model", "plan", "error", "step alone ms: at the profile / at the run's "
                        "round", "drift", "error with the drift taken out"], table),
        "",
        f"With the drift taken out: median |error| {statistics.median(left):.1%}, worst "
        f"{max(left):.1%} over {len(left)} plans.",
    ])


def _device_times(simulated: dict) -> tuple[dict[str, float], dict[str, float]]:
    """Per device of a simulation report: its compute (busy) time, and the time its
    transfers and collectives hold it where the device's own cores move and sum the bytes
    (a CPU: the simulator lets it compute nothing meanwhile), 0 elsewhere."""
    devices = simulated.get("devices", [])
    return ({d["device"]: d["busy_ms"] for d in devices},
            {d["device"]: d.get("comm_ms", 0.0)
             if d.get("host_driven", d.get("type") == "cpu") else 0.0  # (older reports: type)
             for d in devices})


def _updates(stem: Path, report: dict) -> dict[str, list[float]]:
    """Per rank, the optimizer update (the gradients' zeroing and the step) as the run measured
    it (``report``: the median step after the warm-up) and as simulated (``simulate
    --compare``'s breakdown), in ms; nothing where the comparison fails."""
    run = next(iter(sorted(stem.parent.glob(f"{stem.name}.run*.json"))), None)
    try:
        compared = json.loads(dl_nfv("simulate", str(stem.with_suffix(".plan.json")), "--compare",
                                     str(run), "--json"))["comparison"]
    except (RuntimeError, KeyError, TypeError, json.JSONDecodeError):
        return {}
    predicted = compared.get("predicted_breakdown_ms_by_device", {})
    warm = report.get("warmup", 0)
    return {"update_ms": [statistics.median(r.get("breakdown_ms", {}).get("update", [])[warm:]
                                            or [0.0]) for r in report["per_rank"]],
            "update_predicted_ms": [predicted.get(r["device"], {}).get("update", 0.0)
                                    for r in report["per_rank"]]}


def _order(rows: list[dict], key: str) -> str:
    """Plans fastest first by ``key``, ties (equal values) joined by ``=``."""
    ranked = sorted(rows, key=lambda r: r[key])
    out = ranked[0]["plan"] if ranked else ""
    for a, b in zip(ranked, ranked[1:]):
        out += (" = " if same(a[key], b[key]) else " < ") + b["plan"]
    return out


def _between_rounds(rows: list[dict]) -> str:
    """Mean Kendall tau of the plans' measured order in one round against another: how
    well the measurements agree with themselves, the most a prediction can agree with them."""
    rounds = [r.get("measured_runs", []) for r in rows]
    n = min((len(x) for x in rounds), default=0)
    if n < 2:
        return "-"
    taus = [kendall_tau([x[i] for x in rounds], [x[j] for x in rounds])
            for i in range(n) for j in range(i + 1, n)]
    return f"{statistics.mean(taus):+.2f} ({min(taus):+.2f} to {max(taus):+.2f})"


def model_summary(rows: list[dict], apart: float = SEPARABLE) -> list[list[str]]:
    """Per model: plans, median and worst |error|, whether the measured best plan is
    predicted best where it leads the next measured plan by more than ``apart`` (else
    ``-``: within run-to-run noise), and pairs more than ``apart`` apart ordered right."""
    out = []
    ok = [r for r in rows if "error" not in r]
    for model in dict.fromkeys(r["model"] for r in ok):
        mine = [r for r in ok if r["model"] == model]
        errors = [abs(r["rel_error"]) for r in mine]
        pred = [r["predicted_ms"] for r in mine]
        meas = [r["measured_ms"] for r in mine]
        ranked = sorted(meas)
        leads = len(ranked) > 1 and ranked[1] > (1 + apart) * ranked[0]
        best = meas.index(ranked[0])
        predicted_best = all(pred[best] < p or same(pred[best], p)
                             for i, p in enumerate(pred) if i != best)
        right, total = separable_pairs(pred, meas, apart)
        out.append([model, str(len(mine)), f"{statistics.median(errors):.1%}",
                    f"{max(errors):.1%}",
                    ("yes" if predicted_best else "no") if leads else "- (lead <= 10%)",
                    f"{right} / {total}"])
    return out


def summarise(rows: list[dict]) -> tuple[str, dict]:
    ok = [r for r in rows if "error" not in r]
    table = []
    for r in rows:
        if "error" in r:
            table.append([r["model"], r["plan"], "-", "-", "-", "-", "-", "-", "-", "-",
                          f"failed: {r['error'][:80]}"])
            continue
        spread = r.get("measured_runs", [r["measured_ms"]])
        table.append([r["model"], r["plan"], r["mode"], r["devices"], f"{r['predicted_ms']:.1f}",
                      f"{r['measured_ms']:.1f}",
                      f"{min(spread):.0f}-{max(spread):.0f}" if len(spread) > 1 else "-",
                      f"{r['rel_error']:+.1%}",
                      " / ".join(f"{w:.0f}" for w in r["wait_ms"]),
                      " / ".join(f"{c:.0f}" for c in r["cpu_ms"]),
                      f"{r.get('others_cores', float('nan')):.2f}"])
    ranking = []
    taus = {}
    for model in dict.fromkeys(r["model"] for r in ok):
        mine = [r for r in ok if r["model"] == model]
        pred = [r["predicted_ms"] for r in mine]
        meas = [r["measured_ms"] for r in mine]
        tau = kendall_tau(pred, meas)
        taus[model] = tau
        right, total = separable_pairs(pred, meas)
        run_right, run_total = run_separated_pairs(
            pred, [r.get("measured_runs", [r["measured_ms"]]) for r in mine])
        order_p = _order(mine, "predicted_ms")
        order_m = _order(mine, "measured_ms")
        swapped = discordant_pairs(pred, meas)
        fastest, best_predicted = min(meas), min(pred)
        best_same = any(m == fastest for p, m in zip(pred, meas) if same(p, best_predicted))
        ranking.append([model, f"{tau:+.2f}", _between_rounds(mine),
                        "yes" if not swapped else f"no ({len(swapped)} pair(s) swapped)",
                        "yes" if best_same else "no", f"{right} / {total}",
                        f"{run_right} / {run_total}", order_m, order_p])
    cpu_rows = []
    for r in ok:
        busy = r.get("busy_ms", [])
        host = r.get("host_comm_ms", [0.0] * len(busy))
        held = [b + h for b, h in zip(busy, host)]
        cpu_rows.append([r["model"], r["plan"],
                         " / ".join(f"{b:.0f}" for b in busy),
                         " / ".join(f"{h:.0f}" for h in host),
                         " / ".join(f"{c:.0f}" for c in r["cpu_ms"]),
                         " / ".join(f"{c / x:.2f}" for c, x in zip(r["cpu_ms"], held) if x > 0),
                         " / ".join(f"{m:.2f} ({u:.2f})" for m, u in
                                    zip(r.get("update_ms", []), r.get("update_predicted_ms", [])))
                         or "-"])
    errors = [abs(r["rel_error"]) for r in ok]
    median = statistics.median(errors) if errors else float("nan")
    worst = max(errors) if errors else float("nan")
    body = [
        markdown_table(["model", "plan", "mode", "devices", "predicted ms", "measured ms (median run)",
                        "runs (min-max)", "error", "wait ms per rank", "CPU ms per rank",
                        "other jobs (cores)"], table),
        "",
        f"Median |relative error| over {len(ok)} plans: **{median:.1%}** (goal: <= 10%); "
        f"worst **{worst:.1%}** (goal: <= 25%).",
        "",
        markdown_table(["model", "plans", "median |error|", "worst |error|",
                        f"measured best predicted best (where it leads by > {SEPARABLE:.0%})",
                        f"pairs > {SEPARABLE:.0%} apart ordered right"], model_summary(ok)),
        drift_table(rows),
        "",
        markdown_table(["model", "Kendall tau (predicted vs measured order)",
                        "Kendall tau between runs (measured vs measured)", "same order",
                        "same best plan",
                        f"pairs > {SEPARABLE:.0%} apart ordered right",
                        "pairs every run orders, ordered right",
                        "measured order (fastest first)", "predicted order"], ranking),
        "",
        "Same order: no pair of plans that the simulator predicts strictly one way was "
        "measured the other way (plans predicted equal, `=` in the predicted order, are ties: "
        "different planners sometimes make the same plan).",
        "",
        f"Plans whose measured times lie within {SEPARABLE:.0%} of each other swap places from "
        "run to run on this shared machine (see each plan's runs, min-max, and the Kendall tau "
        "of one round's measured order against another's: the measurements rank the plans no "
        "more consistently than that among themselves), so the pairs further apart are the "
        "ones a ranking must get right. Stricter still, a pair every run orders (each run of "
        "one plan faster than each run of the other) is one the measurements rank beyond doubt.",
        "",
        "Per rank, the time the simulator has the device's core occupied (the compute it "
        "schedules there, and the transfers and collectives it holds the core for: gloo copies "
        "and sums with the worker's own CPU) beside the CPU time the worker process used per "
        "step (all its threads, so gloo's too). CPU time does not grow when other jobs share "
        "the cores, so this ratio isolates the cost model's compute and host-communication "
        "terms from contention. The last column sets each rank's update (the zeroing of the "
        "gradients at the step's start and the optimizer step, both of which the simulator's "
        "update task holds) as the run timed it (wall clock, median step) beside the "
        "simulated one.",
        "",
        markdown_table(["model", "plan", "simulated compute ms per device",
                        "simulated transfers and collectives ms", "measured CPU ms per rank",
                        "CPU / simulated (both)", "update ms per rank: measured (simulated)"],
                       cpu_rows),
    ]
    return "\n".join(body), {"median_abs_error": median, "worst_abs_error": worst,
                             "kendall_tau": taus}


# flags that say where files went or what to do with them, no part of the method a section
# records: flag -> the values it takes
PLACE_FLAGS = {"--summarise": 0, "--revision": 1, "--work": 1, "--no-record": 0}


def method_argv(argv: list[str]) -> list[str]:
    """``argv`` less ``PLACE_FLAGS`` (and their values): the flags a run was made with."""
    out = list(argv)
    for flag, takes in PLACE_FLAGS.items():
        if flag in out:
            i = out.index(flag)
            del out[i:i + 1 + takes]
    return out


def ran_with(args: argparse.Namespace, saved: dict, parser: argparse.ArgumentParser,
             own: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """With ``--summarise``: the options the saved results were made with (``saved["argv"]``,
    which a run stores) and their flags, for the section's method and command line; results
    that do not store them are described by this command line's own flags (``own``)."""
    if "argv" not in saved:
        return args, method_argv(own)
    made = quick(parser.parse_args(saved["argv"]))
    for name in ("models", "steps", "topology", "repeats", "repeatability", "budget_min"):
        setattr(args, name, getattr(made, name))
    return args, list(saved["argv"])


def quick(args: argparse.Namespace) -> argparse.Namespace:
    """``args`` with ``--quick``'s settings where it is given (a smoke run)."""
    if args.quick:
        args.steps, args.repeats, args.tries, args.max_others = 4, 1, 1, float("inf")
    return args


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--steps", type=int, default=LEAST_STEPS)
    parser.add_argument("--topology", type=Path, default=None,
                        help="topology of the 2 workers (default: measured before each model)")
    parser.add_argument("--work", type=Path, default=None)
    parser.add_argument("--no-record", action="store_true")
    parser.add_argument("--reuse-profiles", action="store_true",
                        help="keep the model profiles and link measurements already in --work "
                             "(default: measure them anew, right before each model's runs)")
    parser.add_argument("--max-others", type=float, default=0.25,
                        help="keep a measurement only if other jobs used fewer cores meanwhile")
    parser.add_argument("--tries", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3,
                        help="runs of every plan (in rounds); the median run is kept")
    parser.add_argument("--summarise", action="store_true",
                        help="only re-summarise (and record) the results.json in --work")
    parser.add_argument("--revision", default=None,
                        help="with --summarise: the revision the runs were made at, for results "
                             "that do not record it")
    parser.add_argument("--repeatability", action="store_true",
                        help="profile every model a second time and predict every plan from "
                             "both profiles (goal: within 5%%)")
    parser.add_argument("--budget-min", type=float, default=None,
                        help="a time budget (minutes): each model gets an equal share of what "
                             "is left, and runs a round after its second only if it fits there")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run: 4 steps, 1 run per plan, keep runs whatever the load")
    return parser


def main() -> None:
    parser = make_parser()
    args = quick(parser.parse_args())
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    unknown = [m for m in args.models.split(",") if m not in MODELS]
    if unknown and not args.summarise:
        parser.error(f"--models: unknown model {unknown[0]!r} (known: {', '.join(MODELS)})")
    work = args.work or Path(tempfile.mkdtemp(prefix="dl-nfv-fidelity-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"work files in {work}", flush=True)
    if args.summarise:
        saved = json.loads((work / "results.json").read_text())
        if isinstance(saved, list):  # results of an older version: no load figures
            saved = {"rows": saved, "load": [float("nan"), float("nan")]}
        rows, (load_before, load_after) = saved["rows"], saved["load"]
        repeated = saved.get("repeatability", [])
        revision = args.revision or saved.get("revision")
        wall_s = saved.get("wall_s")
        args, argv = ran_with(args, saved, parser, sys.argv[1:])
        for r in rows:  # fill in what older results lack from the work files
            stem = work / f"{r['model']}-{PLANS[r['plan']][0]}"
            if "error" in r or ("busy_ms" in r and "host_comm_ms" in r):
                continue
            sim = json.loads(stem.with_suffix(".sim.json").read_text())
            run_file = next(f for f in (stem.with_suffix(".run.json"),
                                        stem.with_suffix(".run0.json")) if f.exists())
            ranks = json.loads(run_file.read_text())["per_rank"]
            busy, host = _device_times(sim)
            r["busy_ms"] = [busy.get(x["device"], 0.0) for x in ranks]
            r["host_comm_ms"] = [host.get(x["device"], 0.0) for x in ranks]
    else:
        rows, repeated = [], []
        revision = git_revision()
        argv = method_argv(sys.argv[1:])
        load_before = os.getloadavg()[0]
        started = time.perf_counter()
        models = args.models.split(",")

        def save(load_now: float, **more) -> None:  # after every model, and at the end
            (work / "results.json").write_text(json.dumps(
                {"rows": rows, "load": [load_before, load_now], "revision": revision,
                 "repeatability": repeated, "argv": argv, **more}, indent=1))

        for k, model in enumerate(models):
            topology = args.topology.resolve() if args.topology else None
            now = time.perf_counter()  # each model gets an equal share of the time left
            deadline = (now + (started + args.budget_min * 60 - now) / (len(models) - k)
                        if args.budget_min else None)
            rows += run_model(model, topology, work, args.steps,
                              max_others=args.max_others, tries=args.tries,
                              repeats=args.repeats,
                              reuse=args.reuse_profiles, deadline=deadline)
            if args.repeatability:
                mine = [r for r in rows if r["model"] == model and "reference_ms" in r]
                repeated += repeatability(
                    model, work, topology or work / f"{model}-network.yaml",
                    max_others=args.max_others, tries=args.tries,
                    first_reference=mine[0]["reference_ms"]["profile"] if mine else None)
            save(os.getloadavg()[0])
        load_after, wall_s = os.getloadavg()[0], time.perf_counter() - started
        save(load_after, wall_s=wall_s)
    body, summary = summarise(rows)
    body += repeatability_table(repeated)
    print(body)
    print(f"\nload average (1 min) before / after: {load_before:.1f} / {load_after:.1f}"
          + (f"; the bench took {wall_s / 60:.1f} min" if wall_s else ""))
    if not args.no_record:
        ran = {r["model"]: len(r["measured_runs"]) for r in rows if "measured_runs" in r}
        times = (f"{args.repeats} time(s)" if set(ran.values()) <= {args.repeats} else
                 "; ".join(f"{m}: {n} time(s)" for m, n in ran.items())
                 + f" (of {args.repeats}"
                 + (f", within a budget of {args.budget_min:g} min)" if args.budget_min else ")"))
        note = (f"Each plan ran {times}, in rounds over the model's plans, "
                f"{args.steps} steps each or more, enough for {MEASURED_S:g} s of steps as "
                f"predicted (at most {MAX_STEPS}; medians after the warm-up); the median run "
                f"(of two, the faster) is kept; with a budget, rounds after the first "
                f"{LEAST_ROUNDS} run only where they fit. "
                f"Workers: 2 processes of 1 core each (gloo), profiled with the defaults (torch's "
                f"threads and 1 thread); topology "
                + (f"`{os.path.relpath(args.topology, ROOT)}`" if args.topology else
                   "measured right after each model's profile (`dl-nfv profile network "
                   "--nprocs 2 --threads 1`)")
                + ". Predicted: `dl-nfv simulate`; measured: `dl-nfv train`. "
                f"Load average of the machine (2 cores) at start / end: {load_before:.1f} / "
                f"{load_after:.1f}: above 2, other jobs shared the cores with the workers."
                + (f" The bench took {wall_s / 60:.1f} min." if wall_s else "") + "\n\n")
        record_section("fidelity", "Simulator fidelity: predicted vs measured (local-cpu)",
                       note + body, command=" ".join(["python", "bench/fidelity_bench.py", *argv]),
                       revision=revision)


if __name__ == "__main__":
    main()
