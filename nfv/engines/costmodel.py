"""FlowShader's split: which flows of a batch go to the tensor path, by a calibrated cost model.

Following FlowShader (Yi et al., ICNP 2019; ``batch::get_partition``): the
flows of a batch are sorted by load (bytes in the batch), ascending; the
tensor ("GPU") path takes the first ``i`` and the CPU pool the rest, with

* ``T_gpu(i) = waves(i) * steps(i) * r_step + bytes_gpu(i) * r_gpu_byte
  + msgs_gpu(i) * r_gpu_msg + c_gpu`` where ``r_step`` is at least the step
  time measured once at start-up (a kernel step on one row), ``steps(i)`` is
  the kernel steps of the longest stream among the ``i`` flows (the padded
  length every row waits for) and ``waves(i) = floor(i / threads) + 1``
  (``threads`` = SMs x 256 on CUDA, one wave on the CPU);
* ``T_cpu(i) = msgs_cpu(i) * r_cpu_msg + bytes_cpu(i) * r_cpu_byte + c_cpu``
  the CPU time of all workers together on the CPU share (including receiving
  it and sending results back; each side's constant counts only when the side
  has work);
* ``T_enq(i) = msgs_cpu(i) * r_enq_msg + bytes_cpu(i) * r_enq_byte`` the main
  process's own work per batch besides the kernels (building the batch,
  handing the CPU share over, merging its results; the paper's ``B * r_enq``),
  serial with the tensor path.

The batch takes the longest of three bounds:

    T(i) = max(T_enq + T_gpu,  T_cpu / workers,  (T_enq + s * T_gpu + T_cpu) / P)

the main thread, the pool (its workers in parallel), and all CPU work of the
batch spread over the ``P`` cores the machine actually gives the engine. ``s``
is 1 when the tensor path runs on the CPU (it then takes its cores from the
same budget as the workers) and 0 on CUDA (separate hardware). ``P`` is
calibrated: the most CPU seconds per wall second seen in a batch that ran
both paths (window of recent batches), between 1 and the cores the process
may use; so on a machine where the two paths do not really run in parallel,
splitting is predicted to gain nothing and an extreme (all flows on one path)
wins by its own rates.

Every ``i`` is evaluated at once with prefix sums; ``i = 0`` (all on the CPU
pool) and ``i = n`` (all on the tensor path) are candidates like any other
(the paper scans ``i`` downwards and stops at the first increase). What the
busy-time model does not see (the latency of handing batches between
processes, other load) is learnt as a *correction* per policy class (cpu:
``i = 0``, gpu: ``i = n``, model: a real split): the median, over the class's
last ``CORRECTION_WINDOW`` batches, of the measured wall time over the cost the
*current* fit predicts for that batch's features (so a refit does not leave
ratios to predictions made by an outdated fit, and one batch that paid a
one-time cost does not decide alone). The choice minimises the corrected
cost; a class measured on fewer than ``TRY_TIMES`` batches is taken at its
(corrected) model cost and tried if that is within 1.5x of the least (a model
fitted on other mixes may be pessimistic about it, and a class's first batch
may pay one-time costs), and at each re-profiling batch the
corrections of the classes not in use are forgotten, so they are re-tried
when the model predicts them faster.

Rates are fitted by non-negative least squares over a sliding window of
measured batches: the first ``calibration_batches`` (at least until two
samples were fitted; with double buffering a batch is split before the one
ahead of it is measured, and the run's first batch, which pays one-time costs,
is not sampled) put the smallest flows holding 50%, 25% and 75% of the messages
on the GPU path (the paper's 50/50 plus two other mixes so the fit sees
different mixes; with a stepped kernel, such as the IDS automaton, no more
flows than keep the padded matrix within 4x the real steps); the engine runs
them, and the re-profiling batch every ``reprofile_every`` (50% of the
messages), on a fraction of the batch size so measuring costs little on short
traces. The model is refitted after each of the first 8 batches and then
every 4.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

CALIBRATION_SPLITS = (0.5, 0.25, 0.75)
CLASSES = ("cpu", "model", "gpu")  # i = 0, 0 < i < n, i = n
PROBE_MODES = ("calibrate", "reprofile")
PROBE_PADDING = 4.0  # a probe's padded tensor matrix: at most this many times its real steps
WARM_BATCHES = 1  # the first batches pay one-time costs: measured, not fitted
REFIT_EAGER = 8  # refit after each of the first batches, then every REFIT_EVERY batches
REFIT_EVERY = 4
CORRECTION_WINDOW = 3  # a class's wall-time correction: median over its last batches
TRY_WITHIN = 1.5  # a class measured fewer than TRY_TIMES batches is tried when this close
TRY_TIMES = 2


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


def policy_class(i: int, n: int) -> str:
    """``cpu`` (no flow on the tensor path), ``gpu`` (every flow) or ``model`` (a split)."""
    return "cpu" if i == 0 else ("gpu" if i == n else "model")


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
    """Calibrated rates, the machine's concurrency and the split decision.

    ``threads`` is the tensor path's parallel width (rows per wave), ``workers``
    the CPU pool's processes (0: no pool, everything on the tensor path),
    ``cores`` the CPU cores this process may use, ``shares_cores`` whether the
    tensor path runs on those cores (torch on the CPU) rather than on a device,
    ``stepped`` whether the tensor path has a kernel stepped over the padded
    streams (the IDS automaton); without one ``r_step`` is 0, not fitted (a
    free fit turns the longest stream into a cost that no kernel pays).
    """

    def __init__(self, *, threads: int, calibration_batches: int = 3, reprofile_every: int = 32,
                 window: int = 64, workers: int = 1, cores: int = 1, shares_cores: bool = True,
                 stepped: bool = True):
        self.threads = threads
        self.stepped = stepped  # the tensor path steps over the padded streams (the IDS)
        self.calibration_batches = calibration_batches
        self.reprofile_every = reprofile_every
        self.workers = workers
        self.cores = max(1, cores)
        self.shares_cores = shares_cores
        self.gpu_samples: deque = deque(maxlen=window)
        self.cpu_samples: deque = deque(maxlen=window)
        self.enq_samples: deque = deque(maxlen=window)
        self.parallel_samples: deque = deque(maxlen=window)
        self.gpu_coef = np.zeros(4)
        self.cpu_coef = np.zeros(3)
        self.enq_coef = np.zeros(2)
        self.batches = 0
        self.fits = 0
        # per class, its last steady batches: (features as ``Candidates`` fields, wall s)
        self.walls: dict[str, deque] = {k: deque(maxlen=CORRECTION_WINDOW) for k in CLASSES}
        self.chosen: dict[str, int] = {k: 0 for k in CLASSES}
        self.last_class = ""
        self.pending: set[str] = set()  # classes chosen untried, their batch not yet measured
        self.step_floor_s = 0.0  # measured cost of one kernel step (set by the engine)

    def mode(self, batch_number: int) -> str:
        """``calibrate``, ``reprofile`` (both: a preset split, measured) or ``model``."""
        if batch_number < self.calibration_batches or self.fits == 0:
            return "calibrate"
        if self.reprofile_every and batch_number % self.reprofile_every == 0:
            return "reprofile"
        return "model"

    def parallel(self) -> float:
        """Cores the two paths actually get together: the most CPU seconds per wall second
        of a recent batch that ran both, within [1, cores]; ``cores`` before any."""
        if not self.parallel_samples:
            return float(self.cores)
        return float(min(self.cores, max(1.0, max(self.parallel_samples))))

    def split(self, batch_number: int, load: np.ndarray, msgs: np.ndarray,
              steps: np.ndarray | None = None, cands: Candidates | None = None
              ) -> tuple[int, str, float]:
        """Number of smallest flows (of ``load`` sorted ascending) for the GPU path, the
        mode that chose it (calibrate, reprofile, model, gpu or cpu) and its predicted
        cost in seconds (0 for calibrate and reprofile). ``cands``: the batch's
        ``candidates`` if already computed.

        O(n) after the sort, for n flows in the batch.
        """
        n = len(load)
        mode = self.mode(batch_number)
        if mode in PROBE_MODES:
            if mode == "reprofile":  # forget what the classes not in use cost
                for k in CLASSES:
                    if k != self.last_class:
                        self.walls[k].clear()
            frac = 0.5 if mode == "reprofile" else CALIBRATION_SPLITS[
                batch_number % len(CALIBRATION_SPLITS)]
            return (self.probe_split(frac, load, msgs, steps) if self.workers else n), mode, 0.0
        cost = self.predict(cands or candidates(load, msgs, self.threads, steps))
        i = self.choose(cost)
        self.last_class = policy_class(i, n)
        self.chosen[self.last_class] += 1
        return i, self.last_class, float(cost[i])

    def probe_split(self, frac: float, load: np.ndarray, msgs: np.ndarray,
                    steps: np.ndarray | None = None) -> int:
        """The ``i`` of a measuring batch: the smallest flows holding the fraction ``frac``
        of the messages (so both sides are measured on a fair share even when most flows
        are tiny), but, for a stepped kernel, no more flows than keep the padded matrix at
        most ``PROBE_PADDING`` times the steps really needed (a probe never waits for an
        elephant flow on the tensor path)."""
        n = len(load)
        if n == 0:
            return 0
        cum = np.cumsum(msgs)
        i = int(np.searchsorted(cum, frac * cum[-1], side="left")) + 1
        if self.step_floor_s > 0:
            per_flow = load if steps is None else steps
            k = np.arange(1, n + 1)
            fits = k * np.maximum.accumulate(per_flow) <= PROBE_PADDING * np.cumsum(per_flow)
            i = min(i, int(np.flatnonzero(fits)[-1]) + 1 if fits.any() else 1)
        return max(1, min(n - 1, i)) if n > 1 else i

    def choose(self, cost: np.ndarray) -> int:
        """The ``i`` of least corrected cost: per class (cpu, model, gpu) its cheapest ``i``
        times the class's measured wall-time correction (1 if not measured); a class not
        measured yet (nor chosen for a batch still running: with double buffering the
        next batch is split before this one is measured) whose cost is within
        ``TRY_WITHIN`` of the least is run first, once."""
        n = len(cost) - 1
        if self.workers == 0 or n == 0:
            return n
        best = {"cpu": 0, "gpu": n}
        if n > 1:
            best["model"] = 1 + int(np.argmin(cost[1:n]))
        correction = self.corrections()
        adjusted = {k: cost[i] * correction.get(k, 1.0) for k, i in best.items()}
        least = min(adjusted.values())
        untried = [k for k in best if len(self.walls[k]) < TRY_TIMES and k not in self.pending
                   and adjusted[k] <= TRY_WITHIN * least]
        # measure an untried class: the model alone may be pessimistic about it, and its
        # first batch may have paid a one-time cost (growing buffers, moving flow state)
        pick = min(untried or adjusted, key=adjusted.get)
        if len(self.walls[pick]) < TRY_TIMES:
            self.pending.add(pick)
        return best[pick]

    def observe_wall(self, policy: str, features: dict[str, float], wall_s: float) -> None:
        """A batch run under ``policy`` (a class) with ``features`` (one value per
        ``Candidates`` field: the split it ran) took ``wall_s``."""
        self.pending.discard(policy)
        if policy in self.walls and wall_s > 0:
            self.walls[policy].append((features, wall_s))

    def corrections(self) -> dict[str, float]:
        """Per class measured: the median of its recent batches' wall time over what the
        current fit predicts for them (classes without a batch are absent)."""
        out = {}
        for k, batches in self.walls.items():
            if not batches:
                continue
            c = Candidates(**{f: np.array([b[0][f] for b in batches], dtype=float)
                              for f in Candidates.__slots__})
            predicted = self.predict(c)
            walls = np.array([b[1] for b in batches])
            ratios = walls[predicted > 0] / predicted[predicted > 0]
            if len(ratios):
                out[k] = float(np.median(ratios))
        return out

    def predict(self, c: Candidates) -> np.ndarray:
        """Predicted seconds of the batch for every ``i`` (see the module docstring)."""
        g = self.gpu_coef
        r_step = max(g[0], self.step_floor_s)
        t_gpu = np.where(c.gpu_msgs > 0, r_step * c.waves * c.steps + g[1] * c.gpu_bytes
                         + g[2] * c.gpu_msgs + g[3], 0.0)
        p = self.cpu_coef
        t_cpu = np.where(c.cpu_msgs > 0, p[0] * c.cpu_msgs + p[1] * c.cpu_bytes + p[2], 0.0)
        e = self.enq_coef
        t_enq = e[0] * c.cpu_msgs + e[1] * c.cpu_bytes
        busy = t_enq + t_cpu + (t_gpu if self.shares_cores else 0.0)
        return np.maximum.reduce([t_enq + t_gpu, t_cpu / max(self.workers, 1),
                                  busy / self.parallel()])

    def observe(self, *, steps: float, waves: float, gpu_bytes: float, gpu_msgs: float,
                cpu_bytes: float, cpu_msgs: float, gpu_s: float, cpu_s: float,
                enqueue_s: float, wall_s: float = 0.0) -> None:
        """Add one batch's measurements (``cpu_s``: all workers' CPU time; ``enqueue_s``:
        the main process's CPU time besides the kernels; ``wall_s``: the batch's wall
        time) and refit: after every batch up to ``REFIT_EAGER``, then every
        ``REFIT_EVERY`` (a fit costs about 0.3 ms, which a short batch notices). The
        first ``WARM_BATCHES`` are not sampled: they pay the first calls of the
        kernels and the pipes, several times a later batch's cost per message."""
        self.batches += 1
        if self.batches <= WARM_BATCHES:  # one-time costs (first calls, allocations, pipes)
            return
        if gpu_msgs > 0:
            self.gpu_samples.append((waves * steps, gpu_bytes, gpu_msgs, 1.0, gpu_s))
        if cpu_msgs > 0:
            self.cpu_samples.append((cpu_msgs, cpu_bytes, 1.0, cpu_s))
            self.enq_samples.append((cpu_msgs, cpu_bytes, enqueue_s))
        if gpu_msgs > 0 and cpu_msgs > 0 and wall_s > 0:
            busy = cpu_s + enqueue_s + (gpu_s if self.shares_cores else 0.0)
            self.parallel_samples.append(busy / wall_s)
        if self.batches <= REFIT_EAGER or self.batches % REFIT_EVERY == 0:
            self.fit()

    def fit(self) -> None:
        """Refit the rates of each side with two samples or more (the model counts as
        fitted once a side was)."""
        if len(self.gpu_samples) < 2 and len(self.cpu_samples) < 2:
            return
        if len(self.gpu_samples) >= 2:
            a = np.array(self.gpu_samples)
            if self.stepped:
                self.gpu_coef = nnls(a[:, :4], a[:, 4])
            else:  # no kernel waits for the longest stream: no step rate to fit
                self.gpu_coef = np.concatenate([[0.0], nnls(a[:, 1:4], a[:, 4])])
        if len(self.cpu_samples) >= 2:
            a = np.array(self.cpu_samples)
            self.cpu_coef = nnls(a[:, :3], a[:, 3])
            e = np.array(self.enq_samples)
            self.enq_coef = nnls(e[:, :2], e[:, 2])
        self.fits += 1

    def rates(self) -> dict[str, float]:
        g, p, e = self.gpu_coef, self.cpu_coef, self.enq_coef
        corrections = {f"correction_{k}": v for k, v in self.corrections().items()}
        chosen = {f"batches_{k}": float(v) for k, v in self.chosen.items()}
        return {**corrections, **chosen, "parallel_cores": self.parallel(),
                "gpu_step_us": g[0] * 1e6, "gpu_byte_ns": g[1] * 1e9,
                "gpu_message_us": g[2] * 1e6, "gpu_batch_us": g[3] * 1e6,
                "cpu_message_us": p[0] * 1e6, "cpu_byte_ns": p[1] * 1e9,
                "cpu_batch_us": p[2] * 1e6, "enqueue_message_us": e[0] * 1e6,
                "enqueue_byte_ns": e[1] * 1e9, "fits": float(self.fits)}


class BatchSizer:
    """Hill-climbing batch size (FlowShader): every ``every`` batches compare messages/s
    with the previous window; keep direction while it improves, reverse after two drops.
    The engine feeds it only batches run under one policy and resets it when the
    policy changes, so a window never compares two policies."""

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

    def reset(self) -> None:
        """Start a new comparison window (the policy changed: rates are not comparable)."""
        self.window_msgs, self.window_s, self.count = 0, 0.0, 0
        self.previous, self.drops = 0.0, 0

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
