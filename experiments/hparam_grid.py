r"""The hyperparameter-law grid (SPEC §5): batch size x peak LR on the small rungs of the sweep.

  python -m cbert_jax.main --config experiments/hparam_grid.py:cpu --workdir runs/hparam_grid_cpu
                                                    # the whole grid, in this process (no probes,
                                                    # no scaling report: the members differ only
                                                    # in B and LR)
  python -m cbert_jax.report.grid fit --grid runs/hparam_grid_cpu
                                                    # best (B, lr) per size -> lr* = a C^alpha,
                                                    # B* = b C^beta -> <grid>/laws.json, laws.png
  python -m cbert_jax.main --config experiments/sweep.py:cpu \
      --config.sweep.laws=runs/hparam_grid_cpu/laws.json --workdir runs/sweep_cpu_fitted
                                                    # the sweep on the fitted laws
  python -m cbert_jax.main --config \
      experiments/hparam_grid.py:scale=cpu,model=bert,size=d32L2,batch=16,lr=0.004 \
      --workdir runs/hparam_grid_cpu/bert_d32L2_b16_lr0.004   # one member (any B and LR: extend a
                                                    # grid by hand; the fit reads every member)

Arguments: a scale name (`cpu`, `paper`, `auto`), or `scale=`, `model=` (bert | crossbert),
`size=` (a rung of the scale), `batch=` (rows per step) and `lr=` (peak LR). With model, size,
batch and lr the config is one member (mode=train); with none of them, the whole grid
(mode=sweep, run by `cbert_jax.scaling.runner`). A member is experiments/sweep.py's member of the
same model and size (data, tokenizer, model, masking, schedule, evals: imported from that file, not
copied) with `sweep.batch_size` and `sweep.lr` set explicitly and the grid's tokens per parameter;
its workdir is `<model>_<size>_b<rows>_lr<lr>`. Any `--config.X=V` given for the whole grid applies
to every member (e.g. `--config.sweep.tokens_per_param=20` for the sweep's own budget on cpu).

Each size's grid is centred on what the shipped laws (`cbert_jax.scaling.laws.DEFAULT`, DeepSeek
LLM's) suggest for that member: rows = B(C) / seq_len times `batch_factors` (rounded to the
member's batch multiple, duplicates dropped) and lr(C) times `lr_factors`, C being the member's
training FLOPs at the grid's budget. If the fit reports a best point on the edge of a grid, widen
the factors and rerun: members already done are skipped.

Scales:
  cpu    BERT and CrossBERT+CMS at d32L2, d64L2, d96L3 (N 57k-443k), batch x {0.5, 1, 2} and
         LR x {0.25, 0.5, 1, 2, 4} (a first 3 x 3 grid put optima on its LR edges), extended by
         batch x 1/4 at LR x {1/8, 1/4, 1/2, 1, 2} and batch x 1/2 at LR x 1/8 (the 3 x 5 grid
         put every optimum at its lowest batch), then batch x 1/8 at LR x {1/16, 1/8, 1/4, 1/2}
         (5 of 6 optima were still at batch x 1/4): 25 members per size, then 1 row at LR x
         1/8..1/2 for CrossBERT d32L2 (its best was at 2 rows), and d128L3 (BERT N 787k,
         CrossBERT 1.05M) at batch x {1/8, 1/4, 1/2} x LR x {1/4, 1/2, 1} (both families' d32L2
         best is at 1 row, the smallest batch there is, so it is left out of the fits), and 2
         rows at LR x 1/8..1/2 for CrossBERT d64L2 (its best was at 3 rows), and LR x 1/8 at
         the d128L3 eighth batch (both families' best was at its lowest LR there), and at BERT
         d128L3's quarter batch (its best moved there, at that row's lowest LR), and the whole
         batch at LR x 1/4..1 for BERT d128L3 (its best moved to its half batch): 180 in all, on
         experiments/sweep.py's cpu data
         (offline_small, vocabulary 4096, 128-token rows) at 5 tokens per parameter (the sweep
         trains on 20). Cost on 2 quiet cores, from measured throughput (BERT 45k / 43k / 27k
         tokens/s, CrossBERT+CMS 30k / 25k / 16k at d32L2 / d64L2 / d96L3): 15 x (6 + 15 + 61 s
         BERT + 14 + 40 + 139 s CrossBERT) = ~69 min of training, plus an assumed ~10 s of
         compile, data and eval per member (~15 min): about 85 min; the 0.5x-batch members run
         below the measured throughput (fixed per-step overhead), so plan 1.5-2 hours. At the
         sweep's 20 tokens per parameter (--config.sweep.tokens_per_param=20): ~2.8 h of
         training. Fitting the laws against C at 5 tokens per parameter and using them at 20
         assumes, as DeepSeek LLM's compute-indexed laws do, that the optimum depends on C; the
         fits against N hold only at the grid's own budget.
  paper  the paper ladder's rungs with 50M-700M non-embedding parameters (BERT d768L12 d1024L16
         d1280L20 d1536L24, N 85M-680M; CrossBERT+CMS d768L12 d1024L16 d1280L20, N 106M-508M;
         computed, not typed in: `N_RANGE`), batch x {0.5, 1, 2} and LR x {0.25, 0.5, 1, 2, 4}:
         15 members per size, 105 in all, at the sweep's 20 tokens per parameter, vocabulary
         32768, 512-token rows, bf16, FSDP on the sweep's device count per rung. About 2.0e21
         training FLOPs in all (15 x the 7 sizes' 1.33e20; BERT d1536L24 alone is 45% of it),
         ~0.8x the paper sweep's 2.4e21.
"""

import functools
import os

import ml_collections

from cbert_jax import config_lib
from cbert_jax.errors import ConfigError
from cbert_jax.sweep import experiment as experiment_lib


def _load_sweep():
  """experiments/sweep.py, loaded by path (experiments/ is not a package)."""
  path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sweep.py")
  return experiment_lib.load_experiment(path, field="experiments/hparam_grid.py")


SWEEP = _load_sweep()

# Non-embedding N of the paper grid's rungs (SPEC §5: the small rungs, 50M-700M).
N_RANGE = (50e6, 700e6)

GRIDS = {
  # scale: candidate sizes (smallest first), models, multipliers on the laws' batch and LR
  # around each member's suggestion, tokens per parameter, N range (None = every candidate)
  "cpu": dict(
    sizes=SWEEP.CPU_SIZES[:3],
    models=("bert", "crossbert"),
    batch_factors=(0.5, 1.0, 2.0),
    lr_factors=(0.25, 0.5, 1.0, 2.0, 4.0),
    # (batch, lr) factor pairs beyond the product: the 3 x 5 grid put every size's best at its
    # lowest batch (and BERT d64L2's at its lowest LR too), so a quarter batch at LR x 1/8..2
    # and a half batch at LR x 1/8 were added; that grid still put 5 of 6 optima at the quarter
    # batch (at LR x 1/4-1/2), so an eighth batch at LR x 1/16..1/2 was added (members already
    # run keep their names)
    extra=tuple((0.25, f) for f in (0.125, 0.25, 0.5, 1.0, 2.0))
    + ((0.5, 0.125),)
    + tuple((0.125, f) for f in (0.0625, 0.125, 0.25, 0.5)),
    # (batch, lr) pairs for one (model, size) only, where its best point was still on an edge:
    # CrossBERT d32L2's at the eighth batch (2 rows, LR x 1/4), so 1 row at LR x 1/8..1/2 (BERT
    # d32L2's best is at 1 row too: the smallest batch there is, an edge no grid can widen)
    # A (model, size) outside `sizes` is gridded at its own pairs only: d128L3, a fourth size
    # for each family's fit (BERT d32L2's and then CrossBERT d32L2's best sit at 1 row, an edge
    # no grid can widen, so d32L2 is left out of both fits), 3 x 3 around BERT d64L2's best
    # (batch x 1/4, LR x 1/2), the same factors for both families
    # CrossBERT d64L2's best then landed on its eighth batch (3 rows, LR x 1/4: 5.975, against
    # 6.067 at 7 rows), so a sixteenth batch (2 rows) at LR x 1/8..1/2 (174 members).
    # Both d128L3 optima then sat at their lowest LR, in their eighth-batch rows (BERT 7 rows,
    # lr 1.66e-3: 4.899 against 5.003 at 3.32e-3; CrossBERT 9 rows, lr 1.51e-3: 4.9905 against
    # 4.9958), so that row gets LR x 1/8 (176 members). BERT d128L3's best then moved to its
    # quarter batch at that row's lowest LR (14 rows, lr 1.66e-3: 4.7736, against 4.7780 at
    # 3.32e-3), so that row gets LR x 1/8 too (177 members). The last half-batch member then
    # moved BERT d128L3's best to its highest batch (27 rows, lr 3.32e-3: 4.6667, against 4.7736
    # at 14 rows and 4.8190 at 27 rows and lr 1.66e-3), so it gets the whole batch (54 rows) at
    # LR x 1/4..1 (180 members)
    extra_by_size={
      ("crossbert", "d32L2"): tuple((0.0625, f) for f in (0.125, 0.25, 0.5)),
      ("crossbert", "d64L2"): tuple((0.0625, f) for f in (0.125, 0.25, 0.5)),
      **{
        (m, "d128L3"): tuple((b, f) for b in (0.125, 0.25, 0.5) for f in (0.25, 0.5, 1.0))
        + ((0.125, 0.125),)
        + (((0.25, 0.125),) + tuple((1.0, f) for f in (0.25, 0.5, 1.0)) if m == "bert" else ())
        for m in ("bert", "crossbert")
      },
    },
    tokens_per_param=5.0,
    n_range=None,
  ),
  "paper": dict(
    sizes=SWEEP.PAPER_SIZES,
    models=("bert", "crossbert"),
    batch_factors=(0.5, 1.0, 2.0),
    lr_factors=(0.25, 0.5, 1.0, 2.0, 4.0),
    extra=(),
    extra_by_size={},
    tokens_per_param=20.0,
    n_range=N_RANGE,
  ),
}
SCALE_NAMES = (*GRIDS, "auto")


def _parse(arg):
  arg = (arg or "").strip()
  if arg in SCALE_NAMES:
    arg = f"scale={arg}"
  return config_lib.parse_arg(arg, scale="", model="", size="", batch=0, lr=0.0)


def _lr_text(lr: float) -> str:
  """The LR as it appears in member args and workdir names (3 significant digits)."""
  return f"{lr:.3g}"


def member_arg(scale: str, model: str, size: str, batch: int, lr: float) -> str:
  return f"scale={scale},model={model},size={size},batch={batch},lr={_lr_text(lr)}"


def workdir_name(arg) -> str:
  """A member's sub-workdir: bert_d32L2_b16_lr0.004 (distinct for every B and LR)."""
  a = _parse(arg)
  if not (a.model and a.size and a.batch > 0 and a.lr > 0):
    raise ConfigError(
      f"experiments/hparam_grid.py: {arg!r} is not a grid member (model=, size=, batch=, lr=)"
    )
  return f"{a.model}_{a.size}_b{a.batch}_lr{_lr_text(a.lr)}"


def _member_base(scale: str, model: str, size: str) -> ml_collections.ConfigDict:
  """experiments/sweep.py's member of this model and size, on the grid's budget, B and LR from
  the laws (the grid sets them)."""
  c = SWEEP.get_config(SWEEP.member_arg(scale, model, size))
  c.sweep.laws = ""  # centred on the shipped defaults (DeepSeek LLM's), whatever the sweep uses
  c.sweep.experiment = __file__
  c.sweep.tokens_per_param = GRIDS[scale]["tokens_per_param"]
  c.sweep.probe = False  # the grid needs validation losses only
  c.sweep.report = False
  return c


@functools.cache
def law_point(scale: str, model: str, size: str) -> tuple[float, int, int, int]:
  """(lr, rows, N, batch multiple) the shipped laws give this member: the grid's centre."""
  c = config_lib.resolve(_member_base(scale, model, size))
  return float(c.optim.lr), int(c.batch_size), int(c.sweep.n_params), int(c.sweep.batch_multiple)


def grid_sizes(scale: str, model: str) -> tuple[str, ...]:
  """The sizes `model` is gridded at on `scale`: the candidates experiments/sweep.py trains for
  the model, those with N in the scale's range."""
  g = GRIDS[scale]
  swept = SWEEP.SCALES[scale][model]
  own = [s for m, s in g["extra_by_size"] if m == model and s not in g["sizes"]]
  sizes = [s for s in (*g["sizes"], *own) if s in swept]
  if g["n_range"] is not None:
    lo, hi = g["n_range"]
    sizes = [s for s in sizes if lo <= law_point(scale, model, s)[2] <= hi]
  return tuple(sizes)


def grid_points(scale: str, model: str, size: str) -> list[tuple[int, float]]:
  """(rows, LR) of every member of one size's grid: the laws' suggestion times the scale's
  factors (the product of batch_factors and lr_factors, then the `extra` pairs and the size's
  `extra_by_size` pairs), rows rounded to
  the member's batch multiple, duplicates dropped."""
  g = GRIDS[scale]
  lr, rows, _, multiple = law_point(scale, model, size)
  pairs = []
  if size in g["sizes"]:
    pairs = [(b, f) for b in g["batch_factors"] for f in g["lr_factors"]] + list(g["extra"])
  pairs += list(g["extra_by_size"].get((model, size), ()))
  points = [
    (max(multiple, int(round(rows * b / multiple)) * multiple), float(_lr_text(lr * f)))
    for b, f in pairs
  ]
  return list(dict.fromkeys(points))


def _check_scale(scale: str, allowed) -> None:
  if scale not in allowed:
    raise ConfigError(
      f"experiments/hparam_grid.py: scale must be one of {', '.join(allowed)}, got {scale!r}"
    )


def get_sweep(arg=None) -> list[str]:
  """Every member of the grid named by `arg` (default cpu), as get_config args: size by size,
  smallest first (BERT before CrossBERT), so a partly run grid already has whole sizes to fit."""
  scale = _parse(arg).scale or "cpu"
  _check_scale(scale, tuple(GRIDS))
  members = []
  g = GRIDS[scale]
  for size in dict.fromkeys([*g["sizes"], *(s for _, s in g["extra_by_size"])]):
    for model in g["models"]:
      if size not in grid_sizes(scale, model):
        continue
      members += [
        member_arg(scale, model, size, b, lr) for b, lr in grid_points(scale, model, size)
      ]
  return members


def _scale_of(size: str) -> str:
  for scale, g in GRIDS.items():
    if size in g["sizes"] or any(s == size for _, s in g["extra_by_size"]):
      return scale
  raise ConfigError(
    f"experiments/hparam_grid.py: size {size!r} is in no grid; "
    + "; ".join(f"{s}: {', '.join(g['sizes'])}" for s, g in GRIDS.items())
  )


def get_config(arg=None):
  a = _parse(arg)
  if not (a.model or a.size or a.batch or a.lr):  # the whole grid
    scale = a.scale or "auto"
    _check_scale(scale, SCALE_NAMES)
    c = config_lib.base_config()
    c.mode = "sweep"
    c.name = f"hparam_grid_{scale}" if scale != "auto" else "hparam_grid"
    c.sweep.experiment = __file__
    c.sweep.arg = arg or ""
    c.sweep.scale = scale
    c.sweep.probe = False  # no probes in a grid: only the final validation loss counts
    c.sweep.report = False  # the scaling report is for sweeps; fit with report.grid
    return c
  if not (a.model and a.size and a.batch > 0 and a.lr > 0):
    raise ConfigError(
      "experiments/hparam_grid.py: a member needs model=, size=, batch= (rows > 0) "
      f"and lr= (> 0), got {arg!r}; give none of them for the whole grid"
    )
  if a.model not in GRIDS["cpu"]["models"]:
    raise ConfigError(f"experiments/hparam_grid.py: model must be bert|crossbert, got {a.model!r}")
  scale = a.scale or _scale_of(a.size)
  _check_scale(scale, tuple(GRIDS))
  if a.size not in grid_sizes(scale, a.model):
    raise ConfigError(
      f"experiments/hparam_grid.py: {a.model} {a.size} is not in the {scale} grid "
      f"({a.model} sizes: {', '.join(grid_sizes(scale, a.model))})"
    )
  c = _member_base(scale, a.model, a.size)
  c.name = f"hparam_grid_{scale}/{workdir_name(arg)}"
  c.sweep.arg = arg
  c.sweep.batch_size = a.batch  # explicit: the grid's point, not the law's
  c.sweep.lr = a.lr
  return c
