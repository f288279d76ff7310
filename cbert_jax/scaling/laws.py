"""Hyperparameter power laws: the learning rate and batch size a member trains with.

SPEC §5: lr* = a * C^alpha and B* = b * C^beta (C = training FLOPs of the run), fitted on a
grid over batch size x LR on the small rungs (`cbert_jax.report.grid`), then extrapolated. Until
a fit exists, the shipped defaults are DeepSeek LLM's laws (Bi et al., 2024, arXiv 2401.02954,
eq. 1: eta_opt = 0.3118 C^-0.1250, B_opt = 0.2920 C^0.3271 tokens, fitted on decoder LMs with C
in FLOPs) -- a published, compute-indexed starting point, not a measurement on encoders; a
member's config.json records which constants it used (`source`, `provenance`).
"""

from __future__ import annotations

import dataclasses
import json
import os

from absl import logging

from cbert_jax.errors import ConfigError
from cbert_jax.scaling.fit import PowerLaw

# How a fit's `source` records its overridden checks (grid.fit_grid writes it; the report's laws
# section shows the override on a line of its own)
OVERRIDDEN_MARK = "; checks overridden: "


# A member whose budget (tokens per parameter) differs from its laws' grid by more than this factor
# is warned (HyperLaws.budget_mismatch). At 4x the cpu check found CrossBERT+CMS d64L2's optimum
# moved by one grid step (2x batch, 2x LR, 0.024 nats); 1.5x stays below a factor-2 grid step.
BUDGET_TOLERANCE = 1.5


def budgets_apart(fitted: float, used: float) -> bool:
  """Whether two budgets (tokens per parameter) are more than BUDGET_TOLERANCE times apart."""
  return max(fitted, used) / min(fitted, used) > BUDGET_TOLERANCE


@dataclasses.dataclass(frozen=True)
class HyperLaws:
  """lr(C) and batch size in tokens B(C) (and, when fitted, the same against N); their source."""

  lr: PowerLaw
  batch_tokens: PowerLaw
  source: str
  provenance: dict = dataclasses.field(default_factory=dict)
  lr_n: PowerLaw | None = None  # lr(N), N = the sweep's n_definition
  batch_tokens_n: PowerLaw | None = None  # B(N) in tokens
  # The fit's refusal checks that were overridden (grid.CHECKS: few_sizes, edges, implausible)
  overridden: tuple[str, ...] = ()

  def to_dict(self) -> dict:
    out = {
      "lr": self.lr.to_dict(),
      "batch_tokens": self.batch_tokens.to_dict(),
      "source": self.source,
      "provenance": self.provenance,
      "overridden": list(self.overridden),
    }
    if self.lr_n is not None and self.batch_tokens_n is not None:
      out |= {"lr_n": self.lr_n.to_dict(), "batch_tokens_n": self.batch_tokens_n.to_dict()}
    return out

  @property
  def override_reason(self) -> str:
    """Why the overridden checks were overridden (`provenance["override_reason"]`)."""
    return self.provenance.get("override_reason") or "none given"

  @property
  def tokens_per_param(self) -> float | None:
    """The training budget (tokens per parameter) of the grid the laws were fitted on; None when
    the provenance does not record it (the published defaults, grids from before 2026-12-07)."""
    value = self.provenance.get("tokens_per_param")
    return float(value) if value else None

  def budget_mismatch(self, tokens_per_param: float, subject: str = "this member") -> str:
    """A one-line note when `subject` (a member, a plan) training at `tokens_per_param` uses laws
    fitted at a budget more than BUDGET_TOLERANCE times away from it ("" otherwise): the optimal
    batch and LR move with the budget (docs/scaling.md, "Checked at the sweep's 20 tokens per
    parameter")."""
    fitted = self.tokens_per_param
    if fitted is None or not tokens_per_param > 0 or not budgets_apart(fitted, tokens_per_param):
      return ""
    return (
      f"the laws were fitted on a grid trained at {fitted:g} tokens per parameter and {subject} "
      f"trains at {tokens_per_param:g}; the optimal batch and LR move with the budget"
    )

  def axis(self, law_axis: str) -> tuple[PowerLaw, PowerLaw]:
    """(lr law, batch law) against `law_axis` (compute | params); ConfigError when not fitted."""
    if law_axis == "compute":
      return self.lr, self.batch_tokens
    if law_axis == "params":
      if self.lr_n is None or self.batch_tokens_n is None:
        raise ConfigError(
          f"sweep.law_axis=params: the laws ({self.source}) have no fit against N; "
          "fit a grid (python -m cbert_jax.report.grid fit) or use compute"
        )
      return self.lr_n, self.batch_tokens_n
    raise ConfigError(f"sweep.law_axis must be compute|params, got {law_axis!r}")

  @classmethod
  def from_dict(cls, d: dict) -> HyperLaws:
    law = PowerLaw.from_dict
    return cls(
      lr=law(d["lr"]),
      batch_tokens=law(d["batch_tokens"]),
      source=str(d["source"]),
      provenance=dict(d.get("provenance", {})),
      lr_n=law(d["lr_n"]) if d.get("lr_n") else None,
      batch_tokens_n=law(d["batch_tokens_n"]) if d.get("batch_tokens_n") else None,
      overridden=tuple(str(c) for c in d.get("overridden", ())),
    )


DEFAULT = HyperLaws(
  lr=PowerLaw(a=0.3118, alpha=-0.1250, n_points=0),
  batch_tokens=PowerLaw(a=0.2920, alpha=0.3271, n_points=0),
  source="default: DeepSeek LLM (arXiv 2401.02954) eq. 1, fitted on decoder LMs, not on encoders "
  "(an encoder fit: experiments/hparam_grid.py, then report.grid fit)",
)


# Laws fitted by this project and shipped with the package: `sweep.laws = "shipped:<name>"` reads
# cbert_jax/scaling/fitted/<name>.json (its provenance names the grid, the runs and the command).
SHIPPED_PREFIX = "shipped:"
SHIPPED_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fitted")


def shipped_names() -> list[str]:
  """The names of the shipped laws files (cpu-bert, cpu-crossbert, ...)."""
  try:
    return sorted(f[: -len(".json")] for f in os.listdir(SHIPPED_DIR) if f.endswith(".json"))
  except FileNotFoundError:
    return []


MODEL_FIELD = "{model}"


def for_model(path: str, model_name: str) -> str:
  """`path` with "{model}" replaced by the member's family (bert | crossbert | electra): one
  `sweep.laws` for a whole sweep whose families have laws of their own ("shipped:cpu-{model}",
  "laws/paper-{model}.json"). CrossBERT without CMS reads CrossBERT's."""
  return path.replace(MODEL_FIELD, model_name)


def resolve_path(path: str) -> str:
  """The file `path` names: "shipped:<name>" -> the shipped file (ConfigError listing the shipped
  names if there is none), anything else unchanged."""
  if not path.startswith(SHIPPED_PREFIX):
    return path
  name = path[len(SHIPPED_PREFIX) :]
  if name not in shipped_names():
    raise ConfigError(
      f"sweep.laws={path!r}: no shipped laws named {name!r}; shipped: "
      f"{', '.join(shipped_names()) or 'none'}"
    )
  return os.path.join(SHIPPED_DIR, f"{name}.json")


_WARNED: set[str] = set()  # laws files whose overridden checks were warned about


def load(path: str) -> HyperLaws:
  """The constants in `path` (written by the fit command, or "shipped:<name>"); DEFAULT when path
  is "". Laws fitted with a refusal check overridden (`overridden`) load, with a warning naming
  the checks and the reason (once per file and process)."""
  if not path:
    return DEFAULT
  path = resolve_path(path)
  try:
    with open(path) as f:
      laws = HyperLaws.from_dict(json.load(f))
  except FileNotFoundError as e:
    raise ConfigError(
      f"sweep.laws: no such file {path!r} (written by `python -m "
      "cbert_jax.report.grid fit`; leave it empty for the shipped defaults)"
    ) from e
  except (ValueError, KeyError, TypeError) as e:
    raise ConfigError(f"sweep.laws: {path!r} is not a laws file ({type(e).__name__}: {e})") from e
  if laws.overridden and path not in _WARNED:  # once per file and process (a sweep loads it often)
    _WARNED.add(path)
    logging.warning(
      "sweep.laws: %s was fitted with its checks overridden (%s; reason: %s); see its "
      "provenance['checks'] before trusting the LR and batch it gives",
      path,
      ", ".join(laws.overridden),
      laws.override_reason,
    )
  return laws


def fitted_range(laws: HyperLaws, law_axis: str = "compute") -> tuple[float, float] | None:
  """(lowest, highest) x the laws were fitted on -- training FLOPs (law_axis "compute") or N
  ("params") of the grid runs in their provenance; None when the provenance lists no runs (the
  published defaults)."""
  key = "compute" if law_axis == "compute" else "n_params"
  xs = [float(r[key]) for r in laws.provenance.get("runs", ()) if r.get(key)]
  return (min(xs), max(xs)) if xs else None


def save(path: str, laws: HyperLaws) -> None:
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  tmp = f"{path}.tmp"
  with open(tmp, "w") as f:
    json.dump(laws.to_dict(), f, indent=2)
  os.replace(tmp, path)


def suggest(
  laws: HyperLaws, x: float, seq_len: int, multiple: int = 1, law_axis: str = "compute"
) -> tuple[float, int]:
  """(learning rate, batch size in rows) for a run at `x` (training FLOPs, or N for law_axis=params):
  rows = B(x) / seq_len rounded to the nearest multiple of `multiple` (the data-parallel size), at
  least one multiple."""
  if not x > 0:
    raise ValueError(f"{law_axis} must be positive, got {x}")
  lr_law, batch_law = laws.axis(law_axis)
  rows = batch_law(x) / seq_len
  rows = max(multiple, int(round(rows / multiple)) * multiple)
  return float(lr_law(x)), int(rows)
