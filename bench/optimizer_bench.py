"""What an optimizer step costs on this machine's CPU, in passes over the parameters.

The cost model charges an optimizer step ``passes x parameter bytes / memory bandwidth``
with the passes of the fused step the runtime runs (``fused=True``: SGD with momentum 5,
Adam 7; docs/cost-model.md). This bench times, on one thread, the fused steps and the
default ones (a kernel per operation: 8 and 18 passes), and the kernels an unfused
Adam step is made of, into a buffer kept from step to step and into a fresh tensor, and
reports each as passes' time at the memory bandwidth of the topology given (by default
``examples/topologies/local-cpu.yaml``, as ``dl-nfv profile network`` measured it). The
process keeps freed memory in its heap, as every training worker does
(``keep_freed_memory``); ``DL_NFV_ALLOCATOR=system`` times it under the C library's own
policy, where a fresh tensor's pages are faulted in on every step.

Usage:
    python bench/optimizer_bench.py                  # records its section of docs/benchmarks.md
    python bench/optimizer_bench.py --params 5000000 --no-record
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import torch  # noqa: E402
from _record import markdown_table, record_section  # noqa: E402

from dl_nfv.artifacts import Optimizer, load  # noqa: E402
from dl_nfv.profilers.allocator import keep_freed_memory  # noqa: E402
from dl_nfv.simulator.costs import UPDATE_PASSES  # noqa: E402

REPEATS = 7
# the unfused steps' kernels, each reading its operands and writing its result (docs/cost-model.md)
UNFUSED_PASSES = {Optimizer.SGD: 8, Optimizer.ADAM: 18}


def _median_s(step, repeats: int = REPEATS) -> float:
    step()
    step()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _steps(n: int) -> list[tuple[str, str, object]]:
    """(what, model passes or "", a zero-argument step) for every case timed."""
    out = []
    for name, kind, make in (
            ("SGD with momentum", Optimizer.SGD,
             lambda p, fused: torch.optim.SGD(p, lr=0.01, momentum=0.9, fused=fused)),
            ("Adam", Optimizer.ADAM, lambda p, fused: torch.optim.Adam(p, lr=1e-3, fused=fused))):
        for fused in (False, True):
            param = torch.nn.Parameter(torch.randn(n))
            param.grad = torch.randn(n)
            opt = make([param], fused)
            model = UPDATE_PASSES[kind] if fused else UNFUSED_PASSES[kind]
            out.append((f"step: {name}{', fused' if fused else ''}", f"{model:g}", opt.step))
    x, y, z = torch.rand(n) + 0.1, torch.empty(n), torch.rand(n) + 0.1
    out += [("kernel: sqrt into a kept buffer", "2", lambda: torch.sqrt(x, out=y)),
            ("kernel: sqrt into a fresh tensor", "2", lambda: torch.sqrt(x)),
            ("kernel: divide by a scalar into a kept buffer", "2", lambda: torch.div(x, 1.5, out=y)),
            ("kernel: divide by a scalar into a fresh tensor", "2", lambda: x / 1.5),
            ("kernel: add into a kept buffer", "3", lambda: torch.add(x, z, out=y)),
            ("kernel: addcdiv_ in place", "4", lambda: y.addcdiv_(x, z, value=0.1))]
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=int, default=20_000_000,
                        help="float32 parameters per step (default 20M: 80 MB)")
    parser.add_argument("--topology", type=Path,
                        default=ROOT / "examples" / "topologies" / "local-cpu.yaml")
    parser.add_argument("--no-record", action="store_true", help="print only")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    policy = keep_freed_memory()
    topo = load(args.topology, expect="topology")
    device = topo.hosts[0].devices[0]
    bandwidth = device.memory_bandwidth_gb_per_s
    if not bandwidth:
        parser.error(f"{args.topology}: its first device has no memory_bandwidth_gb_per_s")
    nbytes = 4 * args.params
    rows = []
    for what, model, step in _steps(args.params):
        seconds = _median_s(step)
        rows.append([what, model, f"{seconds * 1e3:.1f}", f"{seconds * bandwidth * 1e9 / nbytes:.1f}"])
        print(" | ".join(rows[-1]), flush=True)
    body = "\n".join([
        f"{args.params / 1e6:g}M float32 parameters ({nbytes / 1e6:.0f} MB), one thread; passes' "
        f"time at {bandwidth:g} GB/s ({args.topology.name}'s measured memory bandwidth); the "
        f"median of {REPEATS} steps after two untimed ones; freed memory: {policy} "
        f"(`DL_NFV_ALLOCATOR`; the workers keep it). `model passes`: the bytes read and "
        "written per parameter byte as the cost model counts them (for a fused step, what it "
        "charges; docs/cost-model.md); the runtime runs the fused steps.",
        "",
        markdown_table(["what", "model passes", "ms", "passes' time"], rows)])
    if not args.no_record:
        record_section("optimizer", "Optimizer steps on this CPU (bench/optimizer_bench.py)",
                       body, command="python bench/optimizer_bench.py")
    return 0


if __name__ == "__main__":
    sys.exit(main())
