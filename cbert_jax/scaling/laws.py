"""Hyperparameter power laws: the learning rate and batch size a member trains with.

SPEC §5: lr* = a * C^alpha and B* = b * C^beta (C = training FLOPs of the run), fitted on a
grid over batch size x LR on the small rungs (`cbert_jax.scaling.grid`), then extrapolated. Until
a fit exists, the shipped defaults are DeepSeek LLM's laws (Bi et al., 2024, arXiv 2401.02954,
eq. 1: eta_opt = 0.3118 C^-0.1250, B_opt = 0.2920 C^0.3271 tokens, fitted on decoder LMs with C
in FLOPs) -- a published, compute-indexed starting point, not a measurement on encoders; a
member's config.json records which constants it used (`source`, `provenance`).
"""
from __future__ import annotations

import dataclasses
import json
import os

from cbert_jax.errors import ConfigError
from cbert_jax.scaling.fit import PowerLaw


@dataclasses.dataclass(frozen=True)
class HyperLaws:
  """lr(C) and batch size in tokens B(C); where they come from."""
  lr: PowerLaw
  batch_tokens: PowerLaw
  source: str
  provenance: dict = dataclasses.field(default_factory=dict)

  def to_dict(self) -> dict:
    return {"lr": self.lr.to_dict(), "batch_tokens": self.batch_tokens.to_dict(),
            "source": self.source, "provenance": self.provenance}

  @classmethod
  def from_dict(cls, d: dict) -> "HyperLaws":
    def law(x):
      return PowerLaw(a=float(x["a"]), alpha=float(x["alpha"]), n_points=int(x.get("n_points", 0)),
                      a_ci=tuple(x["a_ci"]) if x.get("a_ci") else None,
                      alpha_ci=tuple(x["alpha_ci"]) if x.get("alpha_ci") else None)
    return cls(lr=law(d["lr"]), batch_tokens=law(d["batch_tokens"]), source=str(d["source"]),
               provenance=dict(d.get("provenance", {})))


DEFAULT = HyperLaws(
    lr=PowerLaw(a=0.3118, alpha=-0.1250, n_points=0),
    batch_tokens=PowerLaw(a=0.2920, alpha=0.3271, n_points=0),
    source="default: DeepSeek LLM (arXiv 2401.02954) eq. 1, decoder LMs; no fit of ours yet")


def load(path: str) -> HyperLaws:
  """The constants in `path` (written by the fit command); DEFAULT when path is ""."""
  if not path:
    return DEFAULT
  try:
    with open(path) as f:
      return HyperLaws.from_dict(json.load(f))
  except FileNotFoundError as e:
    raise ConfigError(f"sweep.laws: no such file {path!r} (written by `python -m "
                      "cbert_jax.scaling.grid fit`; leave it empty for the shipped defaults)") from e
  except (ValueError, KeyError, TypeError) as e:
    raise ConfigError(f"sweep.laws: {path!r} is not a laws file ({type(e).__name__}: {e})") from e


def save(path: str, laws: HyperLaws) -> None:
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  tmp = f"{path}.tmp"
  with open(tmp, "w") as f:
    json.dump(laws.to_dict(), f, indent=2)
  os.replace(tmp, path)


def suggest(laws: HyperLaws, compute: float, seq_len: int, multiple: int = 1) -> tuple[float, int]:
  """(learning rate, batch size in rows) for a run of `compute` training FLOPs: rows = B(C) /
  seq_len rounded to the nearest multiple of `multiple` (the data-parallel size), at least one."""
  if not compute > 0:
    raise ValueError(f"compute must be positive, got {compute}")
  rows = laws.batch_tokens(compute) / seq_len
  rows = max(multiple, int(round(rows / multiple)) * multiple)
  return float(laws.lr(compute)), int(rows)
