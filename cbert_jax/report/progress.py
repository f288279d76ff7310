"""The scaling report's progress line on stderr: which stage it is in, how far through it, and the
time since it started, e.g.

  report [4/7] loss surfaces L(N, D): bert, bootstrap resample 120/200 (41 s)

A stage's counter is printed at its first and last step and at most every `every_s` seconds in
between, so a long stage shows it is moving without flooding a log.
"""

from __future__ import annotations

import sys
import time

STAGES = 7  # the stages sweep_report.write goes through with a grid (6 without)


class Progress:
  """Prints progress lines to `stream` (default: sys.stderr when printing); `enabled` False: none."""

  def __init__(self, stream=None, every_s: float = 5.0, stages: int = STAGES, enabled: bool = True):
    self.stream = stream
    self.enabled = enabled
    self.every_s = every_s
    self.stages = stages
    self.start = time.perf_counter()
    self.stage = 0
    self.what = ""
    self._last = -float("inf")

  def elapsed(self) -> float:
    """Seconds since this report started."""
    return time.perf_counter() - self.start

  def begin(self, what: str) -> None:
    """The next stage starts: one line naming it."""
    self.stage += 1
    self.what = what
    self._print(f"{what}")

  def done(self, text: str) -> None:
    """The last line, outside the stages' count."""
    if self.enabled:
      print(f"report {text} ({self.elapsed():.0f} s)", file=self.stream or sys.stderr, flush=True)

  def step(self, done: int, total: int, unit: str = "") -> None:
    """`done` of `total` steps of the current stage (`unit` names them); throttled."""
    now = time.perf_counter()
    if done in (0, total) or now - self._last >= self.every_s:
      self._print(f"{self.what}: {unit + ' ' if unit else ''}{done}/{total}")

  def callback(self, unit: str = ""):
    """`step` as a (done, total) callable, for the fits that report their own progress."""
    return lambda done, total: self.step(done, total, unit)

  def _print(self, text: str) -> None:
    self._last = time.perf_counter()
    if self.enabled:
      print(
        f"report [{self.stage}/{self.stages}] {text} ({self.elapsed():.0f} s)",
        file=self.stream or sys.stderr,
        flush=True,
      )


def silent() -> Progress:
  """A Progress that prints nothing (the default when the report runs inside another command)."""
  return Progress(enabled=False)
