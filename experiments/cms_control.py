r"""The controlled CMS experiment: CrossBERT with and without complementary masking, everything else
equal (issue 18, SPEC §6 claim 3: CMS's sample efficiency).

  python -m cbert_jax.main --config experiments/cms_control.py --workdir runs/cms_control
                                                    # the 8 members, in this process (~1 h on 2
                                                    # quiet cores), each with its probe suite
  python -m cbert_jax.report.cms --runs runs/cms_control   # the analysis below -> report/
  python -m cbert_jax.main --config experiments/cms_control.py:size=d64L2,cms=false,seed=1 \
      --workdir runs/cms_control/crossbert-nocms_d64L2_s1   # one member

Arguments: `size=` (d64L2 | d96L3), `cms=` (true | false) and `seed=` (0 | 1) for one member;
none (or `cpu`, its only scale) for the whole experiment (mode=sweep). Two members at a time:
  python -m launch.sweep --config experiments/cms_control.py:cpu --backend local --parallel 2 \
      --workdir_root runs/cms_control --execute

Design, fixed before any member ran (commit history: this file precedes its runs):
  * Arms: CrossBERT+CMS (every token a target, half at a time) and CrossBERT without CMS (mask
    ratio 0.5: half the tokens are targets, predicted from the other half). Same architecture,
    so the same N.
  * Sizes: d64L2 and d96L3 of the cpu ladder (N 197k and 443k non-embedding parameters); seeds
    0 and 1 (`config.seed`: initialisation, data order and masks). 2 x 2 x 2 = 8 members.
  * Identical batch, peak LR, schedule and steps in both arms: those experiments/sweep.py's cpu
    scale plans for the CrossBERT+CMS member of the size (its laws at the CMS member's compute;
    the laws it used then, `LAWS`, pinned since the cpu scale's CrossBERT moved to its refit),
    set explicitly (`sweep.batch_size`, `sweep.lr`) in both; the budget is the sweep's 20 tokens
    per parameter, so both arms see the same data tokens in the same number of steps (the no-CMS
    arm spends fewer FLOPs on them: its predictor decodes half the tokens once, CMS's all).
  * Metric: `half` of the full-split validation (`cbert_jax/run/validation.py`): the no-CMS form at
    mask ratio 0.5 -- cross-entropy at the K = T/2 lowest-u maskable positions of every
    validation row, predicted from the other T/2 positions, masks from a fixed key -- computed by
    the same code for both arms: the same targets and the same visible tokens in every row.
    Measured `VAL_POINTS` times during training (`val_full_every`) and at the end.
  * Loss levels (declared here, before running): for each (size, seed) pair of runs, the shared
    range is [L_lo, L_hi) with L_hi = the lower of the two runs' first measured `half` losses
    and L_lo = the higher of their final ones (the range both curves cross); `LEVELS` levels
    L_lo + (L_hi - L_lo) k / LEVELS, k = 0 .. LEVELS - 1 (L_hi itself is left out: a level at
    or above an arm's first measurement would be "reached" there, an upper bound biasing the
    ratio towards 1 -- amended before any run; the first draft took the higher first loss and
    included it). Tokens to a level: the first measurement at or
    below it, linearly interpolated in log tokens from the measurement before. Reported per
    level, pair and size: tokens ratio no-CMS / CMS (> 1: CMS needs fewer tokens) and FLOPs
    ratio (the tokens ratio times the arms' FLOPs-per-token ratio); summarised by the median
    over levels and its range, then the mean over seeds with both seeds' values -- whichever
    way they come out.
  * Frozen probes against tokens seen: the offline probe suite (ridge, logistic regression,
    kNN; 2000 training texts, 1000 test texts per task) at `PROBE_POINTS` - 1 points during
    training (`evals.every`) and on the final checkpoint.
"""

import functools
import os

from cbert_jax import config_lib
from cbert_jax.errors import ConfigError
from cbert_jax.sweep import experiment as experiment_lib

SIZES = ("d64L2", "d96L3")
SEEDS = (0, 1)
ARMS = (True, False)  # cms
LEVELS = 10  # loss levels over each pair's shared range (see above)
VAL_POINTS = 20  # full-split validations per run (val_full_every = steps / this)
PROBE_POINTS = 4  # probe suites per run (evals.every = steps / this; the last on the final step)
SCALE = "cpu"  # experiments/sweep.py's scale whose CrossBERT+CMS plan both arms use


def _load_sweep():
  """experiments/sweep.py, loaded by path (experiments/ is not a package)."""
  path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sweep.py")
  return experiment_lib.load_experiment(path, field="experiments/cms_control.py")


SWEEP = _load_sweep()


def _parse(arg):
  arg = (arg or "").strip()
  if arg == SCALE:  # `:cpu`, the scale launch.sweep needs named: the whole experiment
    arg = ""
  elif arg in SWEEP.SCALE_NAMES:  # the sweep's other scales
    raise ConfigError(
      f"experiments/cms_control.py: runs at the {SCALE} scale only (its arms use the {SCALE} "
      f"sweep's CrossBERT+CMS plan); got {arg!r}: use experiments/cms_control.py:{SCALE}"
    )
  return config_lib.parse_arg(arg, size="", cms=True, seed=0)


def member_arg(size: str, cms: bool, seed: int) -> str:
  return f"size={size},cms={str(cms).lower()},seed={seed}"


def workdir_name(arg) -> str:
  """crossbert_d64L2_s0, crossbert-nocms_d96L3_s1."""
  a = _parse(arg)
  return f"{experiment_lib.member_name('crossbert', a.size, a.cms)}_s{a.seed}"


def get_sweep(arg=None) -> list[str]:
  """The 8 members, seed by seed, smallest size first, CMS before no-CMS."""
  del arg
  return [member_arg(size, cms, seed) for seed in SEEDS for size in SIZES for cms in ARMS]


# The laws the cpu sweep planned with when this experiment ran (2026-12-05; results/cms_control),
# pinned: the cpu scale's CrossBERT reads the laws refitted at 20 tokens per parameter since.
LAWS = SWEEP.CPU_LAWS


def _sweep_member(size: str):
  c = SWEEP.get_config(SWEEP.member_arg(SCALE, "crossbert", size))
  c.sweep.laws = LAWS
  return c


@functools.cache
def cms_plan(size: str) -> tuple[int, float, int]:
  """(rows, peak lr, total steps) the cpu sweep planned for its CrossBERT+CMS member of `size`
  under `LAWS`."""
  c = config_lib.resolve(_sweep_member(size))
  return int(c.batch_size), float(c.optim.lr), int(c.total_steps)


def get_config(arg=None):
  a = _parse(arg)
  if not a.size:  # the whole experiment
    c = config_lib.base_config()
    c.mode = "sweep"
    c.name = "cms_control"
    c.sweep.experiment = __file__
    c.sweep.arg = arg or ""
    c.sweep.scale = SCALE
    c.sweep.report = False  # the analysis is python -m cbert_jax.report.cms
    return c
  if a.size not in SIZES:
    raise ConfigError(
      f"experiments/cms_control.py: size must be one of {', '.join(SIZES)}, got {a.size!r}"
    )
  if a.seed not in SEEDS:
    raise ConfigError(
      f"experiments/cms_control.py: seed must be one of {', '.join(map(str, SEEDS))}, got {a.seed}"
    )
  rows, lr, steps = cms_plan(a.size)
  c = _sweep_member(a.size)
  c.name = f"cms_control/{workdir_name(arg)}"
  c.sweep.experiment = __file__
  c.sweep.arg = arg
  c.seed = a.seed
  c.masking.cms = a.cms
  c.masking.mask_ratio = 0.5  # both arms: half the row is the target set (CMS: each half once)
  c.sweep.batch_size = rows  # the CMS member's plan, in both arms
  c.sweep.lr = lr
  c.val_full_every = -(-steps // VAL_POINTS)  # ceil: VAL_POINTS - 1 during the run + the final
  c.evals.every = -(-steps // PROBE_POINTS)  # PROBE_POINTS - 1 during the run + the final suite
  c.evals.probes = "ridge,logreg,knn"
  c.evals.max_train = 2000
  c.evals.max_eval = 1000
  return c
