"""NFV engines benchmark: cpu, gpu and flowshader across flow-size skew and batch size.

For each size distribution (uniform, Zipf 0.8, 1.2, 1.6) it generates one HTTP
trace (same flows, seed and mean size), parses it once, and runs the IDS chain
(monitor + ids) and the HTTP chain (monitor + http-lb) with each engine and
batch size, best of ``--repeats`` runs (the engines take turns, so a burst of
other load on a shared machine does not hit one engine's runs only). Every
engine's NF outputs are checked
identical (digests) before a figure is recorded. Prints a table and writes
the ``nfv`` section of docs/benchmarks.md, with the machine and whether the
tensor ("GPU") path ran on CUDA or on the CPU.

    python bench/nfv_bench.py                  # full sweep (about 15 minutes on 2 cores)
    python bench/nfv_bench.py --quick --no-record
    python bench/nfv_bench.py --e2e            # end to end against Suricata (see e2e_main)
    python bench/nfv_bench.py --match          # the IDS's literal matchers (see match_main)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _record import markdown_table, record_section  # noqa: E402

from dl_nfv.nfv.run import digests, run_config  # noqa: E402
from dl_nfv.nfv.traffic import load_trace  # noqa: E402
from dl_nfv.nfv.traffic.generate import TraceSpec, generate_trace  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CHAINS = {"IDS": ROOT / "examples/nf/ids.yaml", "HTTP": ROOT / "examples/nf/http-lb.yaml"}
DISTS = ("uniform", "zipf:0.8", "zipf:1.2", "zipf:1.6")
ENGINES = ("cpu", "gpu", "flowshader")


def run_cell(chain: Path, pcap: Path, trace, batch: int, repeats: int) -> dict:
    """Best report (least elapsed time) per engine; the engines take turns."""
    best: dict = {}
    for _ in range(repeats):
        for engine in ENGINES:
            report = run_config(chain, pcap, engine=engine, trace=trace, batch_size=batch)
            if engine not in best or report.elapsed_s < best[engine].elapsed_s:
                best[engine] = report
    return best


def policies(report) -> str:
    """How flowshader's batches were split: probes, then per policy class."""
    counts: dict[str, int] = {}
    for b in report.batches:
        counts[b.mode] = counts.get(b.mode, 0) + 1
    names = {"calibrate": "probe", "reprofile": "probe", "model": "split"}
    merged: dict[str, int] = {}
    for mode, n in counts.items():
        merged[names.get(mode, mode)] = merged.get(names.get(mode, mode), 0) + n
    return " ".join(f"{k} {v}" for k, v in sorted(merged.items()))


def main() -> None:
    if "--e2e" in sys.argv:
        sys.argv.remove("--e2e")
        e2e_main()
        return
    if "--match" in sys.argv:
        sys.argv.remove("--match")
        match_main()
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--flows", type=int, default=8000)
    ap.add_argument("--batches", default="1024,4096", help="batch sizes (messages)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="1000 flows, one batch size, 1 run")
    ap.add_argument("--no-record", action="store_true", help="print only")
    args = ap.parse_args()
    if args.quick:
        args.flows, args.batches, args.repeats = 1000, "2048", 1
    batches = [int(b) for b in args.batches.split(",")]
    rows = []
    ratios: list[tuple[str, float]] = []
    device = None
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        for dist in DISTS:
            pcap = Path(tmp) / f"{dist.replace(':', '')}.pcap"
            generate_trace(TraceSpec(flows=args.flows, size_dist=dist, seed=1), pcap)
            trace = load_trace(pcap)
            mb = trace.msg_len.sum() / 1e6
            for chain_name, chain in CHAINS.items():
                for batch in batches:
                    results = run_cell(chain, pcap, trace, batch, args.repeats)
                    device = results["gpu"].device
                    ref = digests(results["cpu"])
                    for engine, r in results.items():
                        if digests(r) != ref:
                            raise SystemExit(f"{engine} outputs differ from cpu on {dist} "
                                             f"{chain_name} batch {batch}")
                    best_base = max(_engine_rate(results["cpu"]), _engine_rate(results["gpu"]))
                    fs = results["flowshader"]
                    share = sum(b.gpu_messages for b in fs.batches) / max(fs.messages, 1)
                    ratio = _engine_rate(fs) / best_base
                    goal = 1.3 if dist in ("zipf:1.2", "zipf:1.6") else (
                        0.95 if dist == "uniform" else None)
                    row = [dist, chain_name, batch, trace.n_messages, f"{mb:.0f}"]
                    for engine in ENGINES:
                        r = results[engine]
                        elapsed = max(r.elapsed_s, 1e-9)
                        row.append(f"{r.payload_bytes * 8 / elapsed / 1e9:.3f} / "
                                   f"{_engine_rate(r) / 1e3:.1f}k")
                    row += [f"{share:.0%}", policies(fs),
                            f"{fs.calibration.get('parallel_cores', 0):.2f}", f"{ratio:.2f}",
                            "-" if goal is None else ("met" if ratio >= goal else
                                                      f"not met (>= {goal})")]
                    rows.append(row)
                    ratios.append((dist, ratio))
                    print(" | ".join(str(c) for c in row), flush=True)
    headers = ["sizes", "chain", "batch", "messages", "MB",
               "cpu Gbps / msg/s", "gpu Gbps / msg/s", "flowshader Gbps / msg/s",
               "flowshader GPU share", "flowshader batches", "cores measured",
               "flowshader / best(cpu, gpu)", "goal"]
    table = markdown_table(headers, rows)
    summary = _summary(ratios)
    print(table)
    print(summary)
    if args.no_record:
        return
    on = "CUDA" if device and device.startswith("cuda") else "the CPU (torch CPU tensors; no GPU)"
    body = (f"The tensor (\"GPU\") path ran on **{on}**. Each cell is the best of {args.repeats} "
            f"runs (the three engines take turns); throughput is payload Gbps and messages/s over the engine's processing time "
            f"(trace parsing excluded). {args.flows} flows per trace, HTTP/1.1, mean 4 "
            f"exchanges per flow; all engines' NF outputs were checked identical. Load average "
            f"when the sweep started: {load_before:.1f} on {os.cpu_count()} cores (the machine is "
            f"shared, so absolute figures are noisy; compare within a row). `flowshader "
            f"batches`: probes (calibration and re-profiling batches, a fraction of the batch "
            f"size) and the batches the cost model put all on the CPU pool (cpu), all on the "
            f"tensor path (gpu) or split; `cores measured`: the parallelism the cost model "
            f"measured for the two paths together.\n\n{table}\n\n{summary}\n\n"
            f"Goals (FlowShader): flowshader >= 1.3x the better of cpu and gpu at Zipf >= 1.2, "
            f">= 0.95x at uniform sizes. Without a GPU the tensor path runs on the same CPU "
            f"cores as the workers, so the paper's premise (a GPU as extra, massively parallel "
            f"hardware) does not hold here; see docs/nfv.md for the analysis.")
    record_section("nfv", "NFV engines: cpu, gpu, flowshader", body,
                   command="python bench/nfv_bench.py")


def _engine_rate(report) -> float:
    """Messages per second of the engine's processing time (``elapsed_s``)."""
    return report.messages / max(report.elapsed_s, 1e-9)


def _summary(ratios: list[tuple[str, float]]) -> str:
    values = [r for _, r in ratios]
    if not values:
        return ""
    skewed = [r for d, r in ratios if d in ("zipf:1.2", "zipf:1.6")]
    return (f"flowshader / best(cpu, gpu): {min(values):.2f}x-{max(values):.2f}x; >= 0.95x in "
            f"{sum(r >= 0.95 for r in values)} of {len(values)} cells; >= 1.3x in "
            f"{sum(r >= 1.3 for r in skewed)} of {len(skewed)} cells at Zipf >= 1.2.")


# end to end -------------------------------------------------------------------------
E2E_ENGINES = ("cpu", "gpu", "flowshader")
E2E_TRACES = (("zipf:1.2", 5000, 7), ("uniform", 5000, 7))  # (sizes, flows, seed): ~50 MB each
# a trace where the per-packet work outweighs the start-up the workers cannot share:
# the cpu engine's 1-vs-2-worker scaling on the IDS chain, and Suricata, only
LARGE_TRACE = ("zipf:1.2", 20000, 7)  # ~208 MB
MEASURED = ("nfv/traffic", "nfv/engines", "nfv/nfs", "nfv/run.py", "artifacts/nfvreport.py",
            "bench/nfv_bench.py")


def timed(cmd: list[str], cwd: Path) -> tuple[float, float | None, float | None, int]:
    """(wall seconds, peak RSS in MB of the largest process of the run, CPU seconds of the
    run (user + system, its child processes included), exit code).

    The peak and the CPU time come from GNU time (``/usr/bin/time -f '%M %U %S'``), which
    starts the command from a small process: this one's own memory, copied into a child
    before it execs, does not count. None when GNU time is not installed."""
    gnu_time = Path("/usr/bin/time")
    stats_file = cwd / "time.txt"
    prefix = [str(gnu_time), "-f", "%M %U %S", "-o", str(stats_file)] if gnu_time.exists() else []
    t0 = time.perf_counter()
    code = subprocess.run(prefix + cmd, cwd=cwd, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL).returncode
    wall = time.perf_counter() - t0
    peak = cpu = None
    if prefix and stats_file.exists():
        text = stats_file.read_text().split()
        if len(text) >= 3:
            peak, cpu = int(text[-3]) / 1024, float(text[-2]) + float(text[-1])
    return wall, peak, cpu, code


def e2e_cells(cmds: dict, cwd: Path, repeats: int) -> dict:
    """Per key of ``cmds`` (key -> (command, the report file it writes or None)): the best
    wall time of ``repeats`` runs with its peak memory, the least CPU time of the runs and
    the best run's report. The commands take turns (one run of each per round), so load
    that comes and goes on a shared machine falls on all of them alike; raises if a run
    fails."""
    best: dict = {}
    for _ in range(repeats):
        for key, (cmd, report) in cmds.items():
            wall, peak_mb, cpu_s, code = timed(cmd, cwd)
            if code != 0:
                raise SystemExit(f"exit {code}: {' '.join(cmd)}")
            cell = best.get(key)
            least_cpu = cpu_s if cell is None or cell["cpu_s"] is None else min(cell["cpu_s"],
                                                                                 cpu_s)
            if cell is None or wall < cell["wall_s"]:
                cell = best[key] = {"wall_s": wall, "peak_mb": peak_mb,
                                    "report": json.loads(report.read_text()) if report else None}
            cell["cpu_s"] = least_cpu
    return best


def _chain_configs(work: Path) -> dict[str, Path]:
    """The chains the end-to-end table runs: the IDS chain (monitor + ids, the one compared
    with Suricata), and a firewall-only and a monitor-only chain written next to it."""
    firewall = (ROOT / "examples/nf/firewall.yaml").read_text().split("  - nf: monitor")[0]
    configs = {"ids": CHAINS["IDS"], "firewall": work / "firewall-only.yaml",
               "monitor": work / "monitor-only.yaml"}
    configs["firewall"].write_text(firewall.replace("name: firewall", "name: firewall-only"))
    configs["monitor"].write_text("kind: nf-config\nschema_version: 1\nname: monitor-only\n"
                                  "chain:\n  - nf: monitor\n")
    return configs


def e2e_main() -> None:
    """End to end, process start to exit: ``dl-nfv nfv run`` on the IDS chain (monitor + ids,
    examples/nf/ids.yaml and its rules) per engine with 1 and 2 workers, the ``cpu`` engine
    on a firewall-only and a monitor-only chain, and Suricata 7 single-threaded
    (``--runmode single``) on the same pcap and rules when it is installed
    (bench/install_suricata.sh), on generated Zipf-1.2 and uniform traces of about 50 MB, a
    Zipf-1.2 trace of about 200 MB (the cpu engine on the IDS chain only: how it scales with
    workers once the per-packet work outweighs the start-up) and the real trace in
    tests/data. Best wall time of ``--repeats`` runs, the runs of a trace
    taking turns;
    the least CPU time (user + system) of the runs beside it, the figure that other load on
    a shared machine disturbs least."""
    ap = argparse.ArgumentParser(description=e2e_main.__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--engines", default=",".join(E2E_ENGINES))
    ap.add_argument("--quick", action="store_true",
                    help="1000-flow traces (2000 for the large one), the cpu engine, 1 run "
                         "each (a smoke run)")
    ap.add_argument("--no-large", action="store_true",
                    help="leave out the ~200 MB trace (its generation takes about a minute)")
    ap.add_argument("--cache-bytecode", action="store_true",
                    help="dl-nfv's runs read its modules' bytecode from a cache of the bench's "
                         "own, written by a first run (as an installed package has it), even "
                         "where PYTHONDONTWRITEBYTECODE is set")
    ap.add_argument("--no-record", action="store_true", help="print only")
    args = ap.parse_args()
    engines = args.engines.split(",")
    specs = [(*spec, False) for spec in E2E_TRACES]
    if not args.no_large:
        specs.append((*LARGE_TRACE, True))
    if args.quick:
        engines, args.repeats = ["cpu"], 1
        specs = [(dist, 2000 if large else 1000, seed, large)
                 for dist, _, seed, large in specs]
    dirty = subprocess.run(["git", "status", "--porcelain", "--", *MEASURED], cwd=ROOT,
                           capture_output=True, text=True).stdout.strip()
    if dirty and not args.no_record:
        raise SystemExit(f"uncommitted changes in the code measured; commit them or pass "
                         f"--no-record:\n{dirty}")
    suricata = shutil.which("suricata")
    load_before = os.getloadavg()[0]
    rows, goals = [], []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        configs = _chain_configs(work)
        if args.cache_bytecode:  # the runs' environment; this process has its imports
            os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
            os.environ["PYTHONPYCACHEPREFIX"] = str(work / "bytecode")
            _warm_up(configs["ids"], work)
        traces = []
        for dist, flows, seed, large in specs:
            pcap = work / f"{dist.replace(':', '')}-{flows}.pcap"
            generate_trace(TraceSpec(flows=flows, size_dist=dist, seed=seed), pcap)
            traces.append((f"{dist}, {flows} flows", pcap, large))
        traces.append(("real (loopback-http)", ROOT / "tests/data/loopback-http.pcap", False))
        for name, pcap, large in traces:
            got, goal = _e2e_trace(name, pcap, work, configs, ["cpu"] if large else engines,
                                   suricata, args.repeats, other_chains=not large)
            rows += got
            goals.append(goal)
            if large:  # its columns and streams are not kept for the next trace's runs
                pcap.unlink()
    load_after = os.getloadavg()[0]
    headers = ["trace", "MB", "packets", "tool", "chain", "wall s", "CPU s", "Gbps",
               "packets/s", "peak MB (x pcap)", "speed vs Suricata (wall / CPU)",
               "vs 1 worker (wall / CPU)", "dl-nfv stages (s, from its report)"]
    table = markdown_table(headers, rows)
    goals_text = "\n".join(g for g in goals if g)
    print(table)
    print(goals_text)
    print(f"load average {load_before:.1f} before, {load_after:.1f} after, on "
          f"{os.cpu_count()} cores; {_bytecode()}")
    if args.no_record:
        return
    note = ("" if suricata else "**Suricata was not installed on this machine** "
            "(bench/install_suricata.sh installs it), so the ratio column is empty. ")
    body = (f"{note}Wall time from process start to exit (interpreter start, imports, reading "
            f"the pcap, the NFs, writing the report; Suricata's rule loading likewise), best of "
            f"{args.repeats} runs, the runs of a trace taking turns (one of each per round); `CPU s` is the least user + system time "
            f"of those runs, the process's children included (what a run costs on one core, "
            f"and what other load disturbs least); Gbps and packets/s are the pcap's bytes and "
            f"packets over the wall time; peak MB is the largest resident size of one process "
            f"of the run (GNU time's %M; dl-nfv's workers are separate processes, and pages of "
            f"the mapped capture count), and in brackets over the pcap's size: the goal for "
            f"memory is at most 2x. `vs 1 worker` is the wall time with one worker over "
            f"this row's (goal: 1.8x with two), and the same for the CPU time (below 1.00x: "
            f"what splitting the work over processes costs in all; the two-worker runs of a "
            f"trace take turns with its one-worker runs, so both meet the same load). The "
            f"{LARGE_TRACE[1]}-flow trace (about 200 MB) has the cpu engine on the IDS chain "
            f"only: the per-packet work there outweighs the start-up (interpreter, imports) "
            f"that no worker count shares. `speed vs Suricata` is Suricata's time over dl-nfv's, by wall time "
            f"and by CPU time: 1.00x or more meets the goal (the IDS chain at least as fast as "
            f"Suricata with one thread); the firewall-only and monitor-only rows are compared "
            f"with Suricata's IDS run. The stage times come from dl-nfv's own report of the "
            f"best run (its `wall_s` starts when the capture is opened, so interpreter start "
            f"and imports are the difference to the wall column). The `gpu` engine runs no "
            f"workers whatever `--workers` says (its tensor path is in the main process). Load "
            f"average: {load_before:.1f} when it started, {load_after:.1f} when it ended, on "
            f"{os.cpu_count()} cores (shared machine: compare within a trace). Bytecode: "
            f"{_bytecode()}.\n\n{table}\n\nThe goals, per trace (the cpu engine; a 0.1 MB "
            f"capture's memory is the interpreter's):\n\n{goals_text}")
    record_section("nfv-e2e", "NFV end to end: dl-nfv against Suricata", body,
                   command=" ".join(["python bench/nfv_bench.py --e2e", *sys.argv[1:]]))


def _warm_up(config: Path, work: Path) -> None:
    """One run of each engine on the real trace, which writes the bytecode cache."""
    dl_nfv = str(Path(sys.executable).with_name("dl-nfv"))
    for engine in E2E_ENGINES:
        subprocess.run([dl_nfv, "nfv", "run", "--config", str(config), "--trace",
                        str(ROOT / "tests/data/loopback-http.pcap"), "--engine", engine,
                        "-o", str(work / "warm-up.json")], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _bytecode() -> str:
    """Whether the runs measured read cached bytecode or compile the project's modules at
    every start (part of their imports' time)."""
    if os.environ.get("PYTHONPYCACHEPREFIX") and not os.environ.get("PYTHONDONTWRITEBYTECODE"):
        return "cached (the bench's own bytecode cache, written by a first run: --cache-bytecode)"
    if os.environ.get("PYTHONDONTWRITEBYTECODE") and not any(ROOT.glob("*/__pycache__")):
        return ("compiled at every run (PYTHONDONTWRITEBYTECODE is set and the project, an "
                "editable install, has no cached bytecode)")
    return "cached"


def _e2e_trace(name: str, pcap: Path, work: Path, configs: dict[str, Path],
               engines: list[str], suricata: str | None, repeats: int, *,
               other_chains: bool = True) -> list[list[str]]:
    """The table's rows for one trace (Suricata, then dl-nfv per engine and workers on the
    IDS chain, then, ``other_chains``, the cpu engine on the other chains) and its line of
    goals (``_goals``)."""
    size = pcap.stat().st_size
    dl_nfv = str(Path(sys.executable).with_name("dl-nfv"))
    cmds: dict = {}
    if suricata:
        (work / "suricata").mkdir(exist_ok=True)
        cmds[("suricata", 1, "ids")] = (
            [suricata, "-r", str(pcap), "-S", str(ROOT / "examples/nf/ids.rules"), "-l",
             str(work / "suricata"), "-k", "none", "--runmode", "single"], None)
    runs = [(engine, workers, "ids") for engine in engines for workers in (1, 2)]
    if other_chains:
        runs += [("cpu", workers, chain) for chain in ("firewall", "monitor")
                 for workers in (1, 2)]
    for engine, workers, chain in runs:
        out = work / f"r-{engine}-{workers}-{chain}.json"
        cmds[(engine, workers, chain)] = (
            [dl_nfv, "nfv", "run", "--config", str(configs[chain]), "--trace", str(pcap),
             "--engine", engine, "--workers", str(workers), "-o", str(out)], out)
    cells = e2e_cells(cmds, work, repeats)
    packets = next(cell["report"]["packets"] for cell in cells.values() if cell["report"])
    base = cells.get(("suricata", 1, "ids"))
    rows = []
    for (who, workers, chain), cell in cells.items():
        label = "Suricata 7, 1 thread" if who == "suricata" else \
            f"dl-nfv {who}, --workers {workers}"
        wall, cpu = cell["wall_s"], cell["cpu_s"]
        report = cell.get("report")
        stages = "" if report is None else " ".join(
            f"{k} {v:.2f}" for k, v in report["stages_s"].items())
        ratio = "-" if base is None else f"{base['wall_s'] / wall:.2f}x / " + (
            "-" if cpu is None or base["cpu_s"] is None else f"{base['cpu_s'] / cpu:.2f}x")
        one = cells.get((who, 1, chain))
        scaling = "-"
        if workers > 1 and one:
            scaling = f"{one['wall_s'] / wall:.2f}x / " + (
                "-" if cpu is None or one["cpu_s"] is None else f"{one['cpu_s'] / cpu:.2f}x")
        peak = "-" if cell["peak_mb"] is None else \
            f"{cell['peak_mb']:.0f} ({cell['peak_mb'] * 2**20 / size:.1f}x)"
        rows.append([name, f"{size / 1e6:.1f}", f"{packets:,}", label, chain,
                     f"{wall:.2f}", "-" if cpu is None else f"{cpu:.2f}",
                     f"{size * 8 / wall / 1e9:.3f}", f"{packets / wall / 1e3:.1f}k",
                     peak, ratio, scaling, stages])
        print(" | ".join(rows[-1]), flush=True)
    return rows, _goals(name, size, cells)


def _goals(name: str, size: int, cells: dict) -> str:
    """One line of the issue's goals for a trace, from the cpu engine's cells: met, or by
    how much not (and, for two workers, the most that the start-up no worker count shares
    leaves: ``wall / (startup + (wall - startup) / 2)``)."""
    one, two = cells.get(("cpu", 1, "ids")), cells.get(("cpu", 2, "ids"))
    if one is None:
        return ""
    parts = []
    suricata = cells.get(("suricata", 1, "ids"))
    if suricata:
        r = suricata["wall_s"] / one["wall_s"]
        parts.append(f"IDS with one worker {r:.2f}x Suricata's speed "
                     f"({'met' if r >= 1 else f'not met, short by {1 - r:.2f}x'})")
    if two:
        r = one["wall_s"] / two["wall_s"]
        startup = max(0.0, one["wall_s"] - one["report"]["wall_s"])
        most = one["wall_s"] / (startup + (one["wall_s"] - startup) / 2)
        parts.append(f"two workers {r:.2f}x one ({'met' if r >= 1.8 else f'goal 1.8x not met, short by {1.8 - r:.2f}x'}; "
                     f"its {startup:.2f} s before the capture is opened (interpreter, imports) "
                     f"leave at most {most:.2f}x)")
    others = [cells[("cpu", 1, c)]["wall_s"] for c in ("firewall", "monitor")
              if ("cpu", 1, c) in cells]
    if others:
        faster = max(others) < one["wall_s"]
        parts.append(f"firewall and monitor chains {'faster' if faster else 'not faster'} "
                     f"than the IDS ({'met' if faster else 'not met'})")
    peaks = [cell["peak_mb"] * 2**20 / size for (who, _, _), cell in cells.items()
             if who == "cpu" and cell["peak_mb"] is not None]
    if peaks:
        worst = max(peaks)
        parts.append(f"peak memory of the cpu engine at most {worst:.2f}x the pcap "
                     f"({'met' if worst <= 2 else f'goal 2x not met, over by {worst - 2:.2f}x'})")
    return f"- {name}: " + "; ".join(parts) + "."


# literal matchers ---------------------------------------------------------------------
def match_main() -> None:
    """The IDS's CPU matching over the reassembled messages of a generated Zipf-1.2 trace
    (example rules): ahocorasick-rs and Hyperscan block mode over ``tail + message`` (the
    IDS's way, its state portable to the tensor path), and Hyperscan streaming mode (one
    stream per flow direction). Every method must count the same matches; median of 5."""
    import statistics

    import ahocorasick_rs
    import hyperscan

    from dl_nfv.nfv.nfs.snort import load_rules

    ap = argparse.ArgumentParser(description=match_main.__doc__.splitlines()[0])
    ap.add_argument("--flows", type=int, default=5000)
    ap.add_argument("--no-record", action="store_true", help="print only")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        pcap = Path(tmp) / "t.pcap"
        generate_trace(TraceSpec(flows=args.flows, size_dist="zipf:1.2", seed=7), pcap)
        trace = load_trace(pcap)
    keys = {}
    for rule in load_rules(ROOT / "examples/nf/ids.rules"):
        for c in rule.contents:
            keys.setdefault((c.pattern.lower() if c.nocase else c.pattern, c.nocase), len(keys))
    sides = [[k[0] for k in keys if not k[1]], [k[0] for k in keys if k[1]]]
    longest = max(len(p) for side in sides for p in side)
    msgs = [trace.message_bytes(i) for i in range(trace.n_messages)]
    owners = list(zip(trace.msg_flow.tolist(), trace.msg_dir.tolist()))

    def database(patterns, mode):
        db = hyperscan.Database(mode=mode)
        db.compile(expressions=[b"".join(b"\\x%02x" % b for b in p) for p in patterns],
                   ids=list(range(len(patterns))), elements=len(patterns),
                   flags=[0] * len(patterns))
        return db

    def with_tail(scan_side) -> int:
        tails: dict = {}
        hits = 0
        for owner, payload in zip(owners, msgs):
            tail = tails.get(owner, (b"", b""))
            new = []
            for s, data in enumerate((payload, payload.lower())):
                hay = tail[s] + data
                hits += scan_side(s, hay, len(tail[s]))
                new.append(hay[-longest:])
            tails[owner] = tuple(new)
        return hits

    def aho() -> int:
        matchers = [ahocorasick_rs.BytesAhoCorasick(side) for side in sides]
        return with_tail(lambda s, hay, skip: sum(
            1 for _, _, end in matchers[s].find_matches_as_indexes(hay, overlapping=True)
            if end > skip))

    def block() -> int:
        dbs = [database(side, hyperscan.HS_MODE_BLOCK) for side in sides]

        def scan(s, hay, skip):
            found = [0]

            def on(_pid, _start, end, _flags, _ctx):
                found[0] += end > skip
            dbs[s].scan(hay, match_event_handler=on)
            return found[0]
        return with_tail(scan)

    def stream() -> int:
        dbs = [database(side, hyperscan.HS_MODE_STREAM) for side in sides]
        hits = [0]

        def on(*_):
            hits[0] += 1
        open_streams: dict = {}
        for owner, payload in zip(owners, msgs):
            pair = open_streams.get(owner)
            if pair is None:
                pair = open_streams[owner] = [db.stream(match_event_handler=on) for db in dbs]
                for st in pair:
                    st.__enter__()
            pair[0].scan(payload)
            pair[1].scan(payload.lower())
        for pair in open_streams.values():
            for st in pair:
                st.__exit__(None, None, None)
        return hits[0]

    rows, counts = [], set()
    for name, run in (("ahocorasick-rs, tail + message", aho),
                      ("Hyperscan block mode, tail + message (the IDS)", block),
                      ("Hyperscan streaming mode", stream)):
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            counts.add(run())
            times.append(time.perf_counter() - t0)
        rows.append([name, f"{statistics.median(times):.3f}"])
        print(" | ".join(rows[-1]), flush=True)
    if len(counts) != 1:
        raise SystemExit(f"the matchers disagree: {sorted(counts)} matches")
    mb = sum(map(len, msgs)) / 1e6
    table = markdown_table(["matcher", "seconds (median of 5)"], rows)
    print(table)
    if args.no_record:
        return
    body = (f"{trace.n_messages:,} reassembled messages ({mb:.1f} MB) of a generated Zipf-1.2 "
            f"trace ({args.flows} flows), the example rules' {sum(map(len, sides))} contents "
            f"(case-sensitive, and nocase over lower-cased bytes), {counts.pop():,} matches "
            f"found by each. Python's per-message loop included, as in the IDS.\n\n{table}")
    record_section("nfv-match", "NFV: the IDS's literal matchers", body,
                   command="python bench/nfv_bench.py --match")


if __name__ == "__main__":
    t0 = time.time()
    main()
    print(f"done in {time.time() - t0:.0f} s")
