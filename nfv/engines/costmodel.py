"""FlowShader's split: which flows of a batch go to the tensor path, by a calibrated cost model.

Following FlowShader (Yi et al., ICNP 2019; ``batch::get_partition``): the
flows of a batch are sorted by load (bytes in the batch), ascending; the
tensor ("GPU") path takes the first ``i`` and the CPU pool the rest, with

* ``T_gpu(i) = waves(i) * steps(i) * r_step + bytes_gpu(i) * r_gpu_byte
  + msgs_gpu(i) * r_gpu_msg + c_gpu`` where ``r_step`` is at least the step time measured once at start-up (a
  kernel step on one row), ``steps(i)`` is the kernel steps of the
  longest stream among the ``i`` flows (the padded length every row waits
  for) and ``waves(i) = floor(i / threads) + 1`` (``threads`` = SMs x 256 on
  CUDA, one wave on the CPU);
* ``T_cpu(i) = msgs_cpu(i) * r_cpu_msg + bytes_cpu(i) * r_cpu_byte + c_cpu``
  (the pool's time: its workers run in parallel; each side's constant counts
  only when the side has work);
* ``T_enq(i) = msgs_cpu(i) * r_enq_msg + bytes_cpu(i) * r_enq_byte`` the
  main process's own work per batch besides the kernels (building the batch,
  handing the CPU share over, merging its results; the paper's ``B * r_enq``),
  serial with the GPU path, so the batch takes ``max(T_enq + T_gpu, T_cpu)``.

The model balances busy time on both sides; what it does not see (the latency
of handing batches between processes, other load on the machine) can make an
extreme better than any split. So the engine also keeps the measured wall time
per message of up to three policies: the model's split, everything on the GPU
path, everything on the CPU pool (an extreme only when the model predicts it
within 4x of the best split, so a skewed batch is never sent whole to the
GPU path just to measure it), uses the fastest, and re-measures the others
right after each re-profiling batch.

Where the paper scans ``i`` downwards and stops at the first increase (it
assumes a unimodal curve), this evaluates every ``i`` at once with prefix
sums and takes the minimum. Rates are fitted by non-negative least squares
over a sliding window of measured batches: the first ``calibration_batches``
use preset splits of the flows (the smallest 50% on the GPU path as in the
paper, plus 25% and 75% so the fit sees different mixes); afterwards every batch adds a sample and the model
is refitted after every batch (a few small least-squares problems), and one
batch every ``reprofile_every`` is run at a 50/50 split (re-profiling) so both
sides keep being measured even when the model favours one.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

CALIBRATION_SPLITS = (0.5, 0.25, 0.75)
VIABLE = 4.0  # all-GPU is tried unless its padded steps alone cost this factor of the best split
POLICIES = ("split", "gpu", "cpu")


def nnls(features: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Least squares with coefficients >= 0 (active-set by dropping negative ones)."""
    cols = list(range(features.shape[1]))
    coef = np.zeros(features.shape[1])
    scale = np.maximum(np.abs(features).max(axis=0), 1e-12)
    x = features / scale
    while cols:
        sol, *_ = np.linalg.lstsq(x[:, cols], target, rcond=None)
        if (sol >= 0).all():
            coef[cols] = sol
            break
        cols = [c for c, v in zip(cols, sol) if v >= 0] if (sol >= 0).any() else []
    return coef / scale


@dataclass(slots=True)
class Candidates:
    """Per ``i`` (0..n flows on the GPU path) the features of both sides."""

    steps: np.ndarray
    waves: np.ndarray
    gpu_bytes: np.ndarray
    gpu_msgs: np.ndarray
    cpu_bytes: np.ndarray
    cpu_msgs: np.ndarray


def candidates(load_sorted: np.ndarray, msgs_sorted: np.ndarray, threads: int,
               steps_sorted: np.ndarray | None = None) -> Candidates:
    """Features for every ``i``; ``steps_sorted`` is each flow's kernel steps (its longest
    stream over the stride), default its load."""
    n = len(load_sorted)
    gb = np.concatenate([[0], np.cumsum(load_sorted)])
    gm = np.concatenate([[0], np.cumsum(msgs_sorted)])
    per_flow = load_sorted if steps_sorted is None else steps_sorted
    steps = np.concatenate([[0], np.maximum.accumulate(per_flow)]).astype(np.float64)
    i = np.arange(n + 1)
    waves = np.where(i > 0, i // max(threads, 1) + 1, 0)
    return Candidates(steps=steps, waves=waves.astype(np.float64), gpu_bytes=gb.astype(float),
                      gpu_msgs=gm.astype(float), cpu_bytes=(gb[-1] - gb).astype(float),
                      cpu_msgs=(gm[-1] - gm).astype(float))


class CostModel:
    """Calibrated rates and the split decision. ``threads`` is the parallel width."""

    def __init__(self, *, threads: int, calibration_batches: int = 3, reprofile_every: int = 32,
                 window: int = 64, workers: int = 1):
        self.threads = threads
        self.calibration_batches = calibration_batches
        self.reprofile_every = reprofile_every
        self.workers = workers
        self.gpu_samples: deque = deque(maxlen=window)
        self.cpu_samples: deque = deque(maxlen=window)
        self.enq_samples: deque = deque(maxlen=window)
        self.gpu_coef = np.zeros(4)
        self.cpu_coef = np.zeros(3)
        self.enq_coef = np.zeros(2)
        self.batches = 0
        self.fits = 0
        self.wall_per_msg: dict[str, float | None] = {p: None for p in POLICIES}
        self.step_floor_s = 0.0  # measured cost of one kernel step (set by the engine)

    def mode(self, batch_number: int) -> str:
        if batch_number < self.calibration_batches or self.fits == 0:
            return "calibrate"
        if self.reprofile_every and batch_number % self.reprofile_every == 0:
            return "reprofile"
        if self.reprofile_every and batch_number % self.reprofile_every in (1, 2):
            return "explore"
        return "model"

    def best_policy(self, viable: list[str]) -> str:
        """The viable policy with the lowest measured wall time per message; an untried
        one first (the model's split, then all-GPU, then all-CPU)."""
        for p in viable:
            if self.wall_per_msg[p] is None:
                return p
        return min(viable, key=lambda p: self.wall_per_msg[p])

    def split(self, batch_number: int, load: np.ndarray, msgs: np.ndarray,
              steps: np.ndarray | None = None) -> tuple[int, str]:
        """Number of smallest flows (of ``load`` sorted ascending) for the GPU path, and
        the mode that chose it (calibrate, reprofile, model, gpu or cpu)."""
        n = len(load)
        mode = self.mode(batch_number)
        if mode in ("calibrate", "reprofile"):
            frac = 0.5 if mode == "reprofile" else CALIBRATION_SPLITS[
                batch_number % len(CALIBRATION_SPLITS)]
            return int(round(n * frac)), mode  # that fraction of the flows, smallest first
        c = candidates(load, msgs, self.threads, steps)
        cost = self.predict(c)
        best = int(np.argmin(cost))
        # All-CPU is always worth measuring; all-GPU unless the padded steps alone (the
        # longest flow on the GPU path) would already cost VIABLE times the best split.
        step_cost = max(self.gpu_coef[0], self.step_floor_s) * c.waves[n] * c.steps[n]
        viable = ["split"] + (["gpu"] if step_cost <= VIABLE * cost[best] else []) + ["cpu"]
        policy = self.best_policy(viable)
        if mode == "explore":  # re-measure another viable policy
            others = [p for p in viable if p != policy]
            if others:
                policy = others[(batch_number % self.reprofile_every - 1) % len(others)]
        if policy == "gpu":
            return n, "gpu"
        if policy == "cpu":
            return 0, "cpu"
        return best, "model"

    def observe_wall(self, mode: str, messages: int, wall_s: float) -> None:
        """Wall time per message of a batch run under ``mode`` (EMA per policy)."""
        policy = {"gpu": "gpu", "cpu": "cpu", "model": "split"}.get(mode)
        if policy is None or messages == 0:
            return
        value = wall_s / messages
        old = self.wall_per_msg[policy]
        self.wall_per_msg[policy] = value if old is None else 0.7 * old + 0.3 * value

    def predict(self, c: Candidates) -> np.ndarray:
        g = self.gpu_coef
        r_step = max(g[0], self.step_floor_s)
        t_gpu = np.where(c.gpu_msgs > 0, r_step * c.waves * c.steps + g[1] * c.gpu_bytes
                         + g[2] * c.gpu_msgs + g[3], 0.0)
        p = self.cpu_coef
        t_cpu = np.where(c.cpu_msgs > 0, p[0] * c.cpu_msgs + p[1] * c.cpu_bytes + p[2], 0.0)
        e = self.enq_coef
        t_enq = e[0] * c.cpu_msgs + e[1] * c.cpu_bytes
        return np.maximum(t_enq + t_gpu, t_cpu)

    def observe(self, *, steps: float, waves: float, gpu_bytes: float, gpu_msgs: float,
                cpu_bytes: float, cpu_msgs: float, gpu_s: float, cpu_s: float,
                enqueue_s: float) -> None:
        """Add one batch's measurements; refit at the end of calibration and periodically."""
        if gpu_msgs > 0:
            self.gpu_samples.append((waves * steps, gpu_bytes, gpu_msgs, 1.0, gpu_s))
        if cpu_msgs > 0:
            self.cpu_samples.append((cpu_msgs, cpu_bytes, 1.0, cpu_s))
            self.enq_samples.append((cpu_msgs, cpu_bytes, enqueue_s))
        self.batches += 1
        if self.batches >= self.calibration_batches:
            self.fit()

    def fit(self) -> None:
        if len(self.gpu_samples) >= 2:
            a = np.array(self.gpu_samples)
            self.gpu_coef = nnls(a[:, :4], a[:, 4])
        if len(self.cpu_samples) >= 2:
            a = np.array(self.cpu_samples)
            self.cpu_coef = nnls(a[:, :3], a[:, 3])
            e = np.array(self.enq_samples)
            self.enq_coef = nnls(e[:, :2], e[:, 2])
        self.fits += 1

    def rates(self) -> dict[str, float]:
        g, p, e = self.gpu_coef, self.cpu_coef, self.enq_coef
        walls = {f"wall_{p}_message_us": w * 1e6 for p, w in self.wall_per_msg.items()
                 if w is not None}
        return {**walls, "gpu_step_us": g[0] * 1e6, "gpu_byte_ns": g[1] * 1e9, "gpu_message_us": g[2] * 1e6,
                "gpu_batch_us": g[3] * 1e6, "cpu_message_us": p[0] * 1e6,
                "cpu_byte_ns": p[1] * 1e9, "cpu_batch_us": p[2] * 1e6,
                "enqueue_message_us": e[0] * 1e6, "enqueue_byte_ns": e[1] * 1e9,
                "fits": float(self.fits)}


class BatchSizer:
    """Hill-climbing batch size (FlowShader): every ``every`` batches compare messages/s
    with the previous window; keep direction while it improves, reverse after two drops."""

    def __init__(self, start: int, *, step: int = 256, minimum: int = 256, maximum: int = 65536,
                 every: int = 4, enabled: bool = True):
        self.size = start
        self.step = step
        self.minimum = minimum
        self.maximum = maximum
        self.every = every
        self.enabled = enabled
        self.direction = 1
        self.drops = 0
        self.previous = 0.0
        self.window_msgs = 0
        self.window_s = 0.0
        self.count = 0

    def observe(self, messages: int, seconds: float) -> int:
        if not self.enabled:
            return self.size
        self.window_msgs += messages
        self.window_s += seconds
        self.count += 1
        if self.count % self.every:
            return self.size
        rate = self.window_msgs / max(self.window_s, 1e-9)
        self.window_msgs, self.window_s = 0, 0.0
        if self.previous and rate < self.previous:
            self.drops += 1
            if self.drops >= 2:
                self.direction = -self.direction
                self.drops = 0
        else:
            self.drops = 0
        self.previous = rate
        self.size = int(min(self.maximum, max(self.minimum, self.size + self.direction * self.step)))
        return self.size
