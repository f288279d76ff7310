"""Progress and time accounting for a run: steps/s, ETA, a status line, time per named span.

* `Progress` turns step timestamps into steps/s, an ETA and a one-line status string.
* `Timers` adds up wall time spent outside the train step (compile, data wait, checkpoints, eval).
* `format_duration` writes a duration compactly ("10m02s"), for logs and launcher status lines.

Standard library only at import time (NumPy is imported when a status line shows a metric), so
hosts without JAX, e.g. the launcher in `launch/`, can import it. `clu.periodic_actions` is not
used: it imports TensorFlow.
"""

import collections
import contextlib
import math
import operator
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any


def _as_float(value: Any) -> float:
  """A metric value (Python, NumPy or JAX scalar) as a float; a JAX value is fetched."""
  import numpy as np  # pylint: disable=g-import-not-at-top  # Keep importing this module light.

  return float(np.asarray(value))


def _format_si(value: float) -> str:
  """12800 -> "12.8k", 1.5e6 -> "1.5M" (three significant digits)."""
  for factor, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
    if abs(value) >= factor:
      return f"{value / factor:.3g}{suffix}"
  return f"{value:.3g}"


def format_duration(seconds: float) -> str:
  """Formats a duration compactly: "42s", "10m02s", "3h07m", "2d05h"."""
  if not math.isfinite(seconds):
    return "?"
  s = max(0, round(seconds))
  if s < 60:
    return f"{s}s"
  if s < 3600:
    return f"{s // 60}m{s % 60:02d}s"
  if s < 86400:
    return f"{s // 3600}h{s % 3600 // 60:02d}m"
  return f"{s // 86400}d{s % 86400 // 3600:02d}h"


class Progress:
  """Training speed, ETA and a one-line status from step timestamps.

  Call `update(step)` whenever the host learns that `step` steps are done (e.g. when it fetches
  the metrics of that step, which waits for the device). The rate is measured between updates
  over the last `window` of them, never from construction: the first interval contains
  compilation (and, after a resume, restoring), so the first update only starts the clock.
  Steps are absolute, so a resumed run (`start_step > 0`) gets the right percentage and ETA.
  """

  # Metric names shown in the status line, first present one wins.
  LOSS_KEYS = ("train/loss", "loss")
  TOKENS_PER_SEC_KEYS = ("perf/tokens_per_sec", "tokens_per_sec")
  MFU_KEYS = ("perf/mfu", "mfu")

  def __init__(
    self,
    total_steps: int,
    start_step: int = 0,
    *,
    window: int = 20,
    time_fn: Callable[[], float] = time.monotonic,
  ) -> None:
    """Starts tracking.

    Args:
      total_steps: Step at which training ends.
      start_step: Step training starts (or resumes) from.
      window: Number of recent updates the rate is averaged over (at least 2).
      time_fn: Clock in seconds; injectable for tests.
    """
    if window < 2:
      raise ValueError(f"window must be at least 2, got {window}.")
    self.total_steps = int(total_steps)
    self.start_step = int(start_step)
    self._time_fn = time_fn
    self._start_time = time_fn()
    self._points: collections.deque[tuple[int, float]] = collections.deque(maxlen=window)
    self._step = self.start_step

  @property
  def step(self) -> int:
    """The last step passed to `update` (or `start_step`)."""
    return self._step

  def update(self, step: int) -> None:
    """Records that `step` steps are complete now."""
    step = operator.index(step)
    if self._points and step < self._points[-1][0]:
      # Steps went backwards (a restart inside the same process): old timings are meaningless.
      self._points.clear()
    if self._points and step == self._points[-1][0]:
      return
    self._points.append((step, self._time_fn()))
    self._step = step

  def reset_window(self) -> None:
    """Forgets the timings so far, e.g. after a recompilation that should not count."""
    self._points.clear()

  @property
  def elapsed_seconds(self) -> float:
    """Wall time since construction."""
    return self._time_fn() - self._start_time

  @property
  def steps_per_sec(self) -> float | None:
    """Steps per second over the recent window; None until two updates are known."""
    if len(self._points) < 2:
      return None
    (first_step, first_t), (last_step, last_t) = self._points[0], self._points[-1]
    if last_t <= first_t:
      return None
    return (last_step - first_step) / (last_t - first_t)

  @property
  def eta_seconds(self) -> float | None:
    """Seconds left until `total_steps` at the recent rate; None while the rate is unknown."""
    remaining = max(0, self.total_steps - self._step)
    if remaining == 0:
      return 0.0
    rate = self.steps_per_sec
    if not rate:
      return None
    return remaining / rate

  def format(self, step: int | None = None, metrics: Mapping[str, Any] | None = None) -> str:
    """Returns a one-line status for logs.

    For example
    "step 120/2000 (6.0%) | loss 5.214 | 3.12 steps/s | 12.8k tok/s | MFU 31.2% | ETA 10m02s".

    Args:
      step: Step to show; defaults to the last `update`.
      metrics: Metrics of the step; loss, tokens/s and MFU (a fraction) are shown when present
        under one of `LOSS_KEYS`, `TOKENS_PER_SEC_KEYS`, `MFU_KEYS`.

    Returns:
      The line. Parts that are not known yet are left out.
    """
    step = self._step if step is None else int(step)
    metrics = metrics or {}
    percent = 100.0 * step / self.total_steps if self.total_steps > 0 else 100.0
    parts = [f"step {step}/{self.total_steps} ({percent:.1f}%)"]

    def first(keys: Sequence[str]) -> float | None:
      for key in keys:
        if key in metrics:
          return _as_float(metrics[key])
      return None

    if (loss := first(self.LOSS_KEYS)) is not None:
      parts.append(f"loss {loss:.4g}")
    if (rate := self.steps_per_sec) is not None:
      parts.append(f"{rate:.3g} steps/s")
    if (tokens := first(self.TOKENS_PER_SEC_KEYS)) is not None:
      parts.append(f"{_format_si(tokens)} tok/s")
    if (mfu := first(self.MFU_KEYS)) is not None:
      parts.append(f"MFU {100 * mfu:.1f}%")
    if (eta := self.eta_seconds) is not None:
      parts.append(f"ETA {format_duration(eta)}")
    return " | ".join(parts)

  def line(self, metrics: Mapping[str, Any] | None = None, *, step: int | None = None) -> str:
    """Same as `format(step, metrics)`, with the metrics first."""
    return self.format(step, metrics)


class Timers:
  """Adds up named wall-clock spans, e.g. time lost outside the train step.

  Example:
    timers = Timers()
    with timers.span("data_wait"):
      batch = next(batches)
    ...
    writer.write(step, timers.as_metrics())  # time/data_wait_s, time/data_wait_frac, ...

  JAX dispatches asynchronously: a span around a jitted call measures only the dispatch unless
  the result is waited for (`jax.block_until_ready`) inside the span. Nested spans each count
  their full duration, so fractions of nested names can add up to more than 1.
  """

  def __init__(self, time_fn: Callable[[], float] = time.perf_counter) -> None:
    """Starts the wall clock that `fractions()` divides by by default.

    Args:
      time_fn: Clock in seconds; injectable for tests.
    """
    self._time_fn = time_fn
    self._start = time_fn()
    self._totals: dict[str, float] = {}
    self._counts: dict[str, int] = {}

  @contextlib.contextmanager
  def span(self, name: str) -> Iterator[None]:
    """Times the body of a `with` block under `name` (also if it raises)."""
    start = self._time_fn()
    try:
      yield
    finally:
      self.add(name, self._time_fn() - start)

  def add(self, name: str, seconds: float) -> None:
    """Adds a duration measured elsewhere (e.g. compile time reported by the trainer)."""
    self._totals[name] = self._totals.get(name, 0.0) + float(seconds)
    self._counts[name] = self._counts.get(name, 0) + 1

  def elapsed(self) -> float:
    """Wall time since construction or the last `reset()`."""
    return self._time_fn() - self._start

  def totals(self) -> dict[str, float]:
    """Seconds per name."""
    return dict(self._totals)

  def counts(self) -> dict[str, int]:
    """Number of spans per name."""
    return dict(self._counts)

  def fractions(self, of_total: float | None = None) -> dict[str, float]:
    """Each total divided by `of_total` seconds (default: `elapsed()`)."""
    total = self.elapsed() if of_total is None else float(of_total)
    if not total > 0:
      raise ValueError(f"of_total must be positive, got {total}.")
    return {name: seconds / total for name, seconds in self._totals.items()}

  def as_metrics(self, of_total: float | None = None) -> dict[str, float]:
    """`{"time/<name>_s": seconds, "time/<name>_frac": fraction}` for every name."""
    fractions = self.fractions(of_total)
    metrics = {}
    for name, seconds in self._totals.items():
      metrics[f"time/{name}_s"] = seconds
      metrics[f"time/{name}_frac"] = fractions[name]
    return metrics

  def reset(self) -> None:
    """Clears all totals and restarts the wall clock."""
    self._start = self._time_fn()
    self._totals.clear()
    self._counts.clear()
