r"""The BERT-vs-CrossBERT scaling sweep (SPEC §5): every member trains on tokens_per_param x N
tokens with its LR and batch size from the hyperparameter laws, then gets the frozen probe suite.

  python -m cbert_jax.main --config experiments/sweep.py            # the whole sweep, in this
                                                    # process: cpu scale on a CPU-only machine,
                                                    # paper otherwise; then the scaling report
  python -m cbert_jax.main --config experiments/sweep.py:quick      # < 30 min on 2 CPU cores
  python -m cbert_jax.main --config experiments/sweep.py:model=crossbert,size=d96L3
                                                    # one member (the scale follows from the size)
  python -m launch.sweep --config experiments/sweep.py --backend slurm   # fan out (paper scale)

Arguments: a scale name (`paper`, `cpu`, `quick`, `auto`), or `scale=`, `model=` (bert |
crossbert), `size=` (a ladder rung), `cms=` (CrossBERT's complementary masking; default true) and
`seed=` (config.seed: init, data order and masks; default 0; a member of seed k > 0 is named
`<member>_s<k>`). A scale trains every member once per seed in its `seeds` (cpu: 2 seeds).
With model and size the config is one member (mode=train); without, the whole sweep (mode=sweep).
Any `--config.X=V` given for the whole sweep applies to every member.

Scales:
  paper  SPEC §5: 8 BERT sizes (d384L6 ... d2048L32) and 9 CrossBERT+CMS sizes (... d2304L32),
         vocabulary 32768, 512-token rows, bf16 compute, 20 tokens per parameter, on a pod-scale
         corpus you supply (--config.data.sources=...; data/preprocess.py). Each member is planned
         for `target_devices` chips (FSDP over all of them; the batch is a multiple of that).
  cpu    the CPU mini-reproduction: 4 sizes (d32L2 d64L2 d96L3 d128L3, N 57k-1.05M) x {BERT,
         CrossBERT+CMS}, plus CrossBERT without CMS at d96L3 (the CMS sample-efficiency control),
         vocabulary 4096, 128-token rows, 20 tokens per parameter, on offline_small; about 1.5 h
         of training on 2 quiet cores (the largest CrossBERT+CMS alone ~40 min), plus the probes.
  heldout  the cpu sweep's held-out size d160L3 (N 1.6M), both families, 2 seeds, with the cpu
         scale's setup: trained after its loss and probe scores were predicted from the cpu sweep
         (results/heldout_cpu/predictions.md); about 4 h per seed on 2 cores.
  quick  3 sizes (d32L2 d64L2 d96L3) x {BERT, CrossBERT+CMS} at 5 tokens per parameter with the
         probe suite capped at 2000 training texts per task: under 30 minutes.

LR and batch laws (`LAWS`, per scale and family; CrossBERT without CMS reads CrossBERT's), fits
shipped in the package (cbert_jax/scaling/fitted/, with their provenance and plots):
  cpu      `shipped:cpu20-{model}` (cpu20-bert, cpu20-crossbert): each family refitted on a
           batch x LR grid at the sweep's own 20 tokens per parameter (results/lawcheck20_cpu,
           issue 36), where CrossBERT's optimum at d64L2 had moved from what the
           5-tokens-per-parameter laws gave (BERT's had not, within its seeds).
  quick    `shipped:cpu-{model}`: the cpu grid's fits (experiments/hparam_grid.py:cpu), trained at
           5 tokens per parameter, the quick scale's own budget. Their implausible-exponent check
           was overridden by a rule fixed before the final fit (docs/scaling.md).
  heldout  `shipped:cpu-{model}`, pinned: its predictions were made for the LR and batch those give.
  paper    the published defaults (DeepSeek LLM's, fitted on decoders) until the paper grid
           (experiments/hparam_grid.py:paper) is run and fitted: --config.sweep.laws=<laws.json>.
results/sweep_cpu (2026-12-05) was trained with `shipped:cpu-{model}` for both families; to train
it again as it was: --config.sweep.laws='shipped:cpu-{model}'.
"""

from cbert_jax import config_lib
from cbert_jax.errors import ConfigError
from cbert_jax.sweep import experiment

# The paper's ladder (SPEC §5 default shapes): CrossBERT gets all 9 rungs, BERT the first 8.
PAPER_SIZES = (
  "d384L6",
  "d512L8",
  "d768L12",
  "d1024L16",
  "d1280L20",
  "d1536L24",
  "d2048L24",
  "d2048L32",
  "d2304L32",
)
# Chips each paper member is planned for (FSDP over all of them): the compile check's mesh.
PAPER_DEVICES = {
  "d384L6": 8,
  "d512L8": 8,
  "d768L12": 8,
  "d1024L16": 16,
  "d1280L20": 16,
  "d1536L24": 32,
  "d2048L24": 64,
  "d2048L32": 64,
  "d2304L32": 64,
}
# The chip the paper members are planned for (cbert_jax/scaling/chips.py:CHIPS); another with
# --config.sweep.chip=h100 (launch.sweep sets it from --tpu_generation / --gpu_type).
PAPER_CHIP = "v5p"
CPU_SIZES = ("d32L2", "d64L2", "d96L3", "d128L3")
# The cpu sweep's held-out size: predicted from the cpu sweep before it was trained (issue 36;
# results/heldout_cpu/predictions.md), then trained with the cpu scale's setup.
HELDOUT_SIZES = ("d160L3",)
# The cpu grid's fits at 5 tokens per parameter, per family ({model}): what results/sweep_cpu and
# the held-out size were trained with
CPU_LAWS = "shipped:cpu-{model}"
# Their refits at the cpu sweep's own 20 tokens per parameter (results/lawcheck20_cpu, issue 36)
CPU20_LAWS = "shipped:cpu20-{model}"
# Each scale's LR and batch laws per family (docstring); paper: none (the published defaults)
LAWS = {
  "cpu": {"bert": CPU20_LAWS, "crossbert": CPU20_LAWS},
  "heldout": {"bert": CPU_LAWS, "crossbert": CPU_LAWS},
  "quick": {"bert": CPU_LAWS, "crossbert": CPU_LAWS},
}

SCALES = {
  # scale: BERT sizes, CrossBERT+CMS sizes, controls (model, size, cms), tokens per parameter
  "paper": dict(
    bert=PAPER_SIZES[:8], crossbert=PAPER_SIZES, controls=(), tokens_per_param=20.0, seeds=(0,)
  ),
  "cpu": dict(
    bert=CPU_SIZES,
    crossbert=CPU_SIZES,
    controls=(("crossbert", "d96L3", False),),
    tokens_per_param=20.0,
    seeds=(0, 1),
  ),
  "heldout": dict(
    bert=HELDOUT_SIZES, crossbert=HELDOUT_SIZES, controls=(), tokens_per_param=20.0, seeds=(0, 1)
  ),
  "quick": dict(
    bert=CPU_SIZES[:3], crossbert=CPU_SIZES[:3], controls=(), tokens_per_param=5.0, seeds=(0,)
  ),
}
SCALE_NAMES = (*SCALES, "auto")


def _parse(arg):
  arg = (arg or "").strip()
  if arg in SCALE_NAMES:
    arg = f"scale={arg}"
  return config_lib.parse_arg(arg, scale="", model="", size="", cms=True, seed=0)


def _scale_of(size: str) -> str:
  if size in PAPER_SIZES:
    return "paper"
  if size in CPU_SIZES:
    return "cpu"
  if size in HELDOUT_SIZES:
    return "heldout"
  raise ConfigError(
    f"experiments/sweep.py: size {size!r} is in no sweep; paper: "
    f"{', '.join(PAPER_SIZES)}; cpu/quick: {', '.join(CPU_SIZES)}; heldout: "
    f"{', '.join(HELDOUT_SIZES)}"
  )


def member_arg(scale: str, model: str, size: str, cms: bool = True, seed: int = 0) -> str:
  return (
    f"scale={scale},model={model},size={size}"
    + ("" if cms else ",cms=false")
    + (f",seed={seed}" if seed else "")
  )


def get_sweep(arg=None) -> list[str]:
  """Every member of the scale named by `arg` (default cpu), as get_config args: the whole sweep
  once per seed of the scale (seed 0 first, so a cut-short run has whole seeds), each smallest
  first (BERT before CrossBERT at each size, controls last)."""
  scale = _parse(arg).scale or "cpu"
  if scale not in SCALES:
    raise ConfigError(
      f"experiments/sweep.py: scale must be one of {', '.join(SCALES)}, got "
      f"{scale!r} (auto is resolved by the sweep runner)"
    )
  s = SCALES[scale]
  order = list(dict.fromkeys((*s["bert"], *s["crossbert"])))
  members = []
  for seed in s["seeds"]:
    for size in order:
      members += [
        member_arg(scale, m, size, seed=seed) for m in ("bert", "crossbert") if size in s[m]
      ]
    members += [member_arg(scale, m, size, cms, seed) for m, size, cms in s["controls"]]
  return members


member_name = experiment.member_name  # bert_d64L2, crossbert_d96L3, crossbert-nocms_d96L3_s1


def get_config(arg=None):
  a = _parse(arg)
  c = config_lib.base_config()
  c.sweep.experiment = __file__
  c.sweep.arg = arg or ""
  if not (a.model or a.size):  # the whole sweep
    scale = a.scale or "auto"
    if scale not in SCALE_NAMES:
      raise ConfigError(
        f"experiments/sweep.py: scale must be one of {', '.join(SCALE_NAMES)}, got {scale!r}"
      )
    c.mode = "sweep"
    c.name = f"sweep_{scale}" if scale != "auto" else "sweep"
    c.sweep.scale = scale
    return c
  if not (a.model and a.size):
    raise ConfigError(
      "experiments/sweep.py: a member needs both model= and size= "
      f"(got {arg!r}); give neither for the whole sweep"
    )
  if a.model not in ("bert", "crossbert"):
    raise ConfigError(f"experiments/sweep.py: model must be bert|crossbert, got {a.model!r}")
  scale = a.scale or _scale_of(a.size)
  if scale not in SCALES:
    raise ConfigError(
      f"experiments/sweep.py: scale must be one of {', '.join(SCALES)} for a member, got {scale!r}"
    )
  s = SCALES[scale]
  cms = a.cms or a.model == "bert"  # cms only concerns CrossBERT
  listed = (a.size in s[a.model]) if cms else ((a.model, a.size, False) in s["controls"])
  if not listed:
    raise ConfigError(
      f"experiments/sweep.py: {member_name(a.model, a.size, cms)} is not a "
      f"member of the {scale} sweep (members: {', '.join(get_sweep(scale))})"
    )
  if a.seed < 0:
    raise ConfigError(f"experiments/sweep.py: seed must be >= 0, got {a.seed}")
  c.mode = "train"
  c.name = f"sweep_{scale}/{member_name(a.model, a.size, cms, a.seed)}"
  c.seed = a.seed  # init, data order and masks
  c.model_name = a.model
  c.model.size = a.size
  c.masking.cms = cms
  c.sweep.scale = scale
  c.sweep.tokens_per_param = s["tokens_per_param"]
  c.log_every = 20
  c.eval_batches = 8
  c.faults.spike = "warn"
  # both linear probes in the report (ridge least squares understates separability on the
  # many-class tasks; logistic regression is what a reviewer expects) and kNN
  c.evals.probes = "ridge,logreg,knn"
  if scale == "paper":
    c.data.corpus = "sources"  # your pod-scale corpus: --config.data.sources=...
    c.data.vocab_size = 32768
    c.data.seq_len = 512
    c.model.compute_dtype = "bfloat16"
    c.mesh.data, c.mesh.fsdp = 1, -1  # FSDP over every chip
    c.sweep.target_devices = PAPER_DEVICES[a.size]
    c.sweep.chip = PAPER_CHIP  # the memory planner fits remat / ce_chunk / micro-batches
    c.sweep.batch_multiple = PAPER_DEVICES[a.size]
    c.log_every = 50
    c.eval_batches = 16
  else:
    c.sweep.laws = LAWS[scale][a.model]  # this scale's fit for this family (docstring)
    c.data.corpus = "offline_small"
    c.data.vocab_size = 4096
    c.data.seq_len = 128
    c.log_every = 25
    if scale == "quick":
      c.evals.max_train = 2000
      c.evals.max_eval = 1000
  return c
