"""Configs: the defaults, `file.py:arg` parsing, derived fields, and validation with clear errors.

An experiment file (experiments/*.py) defines `get_config(arg: str | None) -> ConfigDict`, built on
`base_config()` and `parse_arg(arg, ...)`. `resolve` fills every derived field in one place (size ->
dims, predictor depth, default mask ratio); `validate` checks everything that can be checked before
any expensive work and raises `ConfigError` naming the field. The resolved config is written to
`workdir/config.json` by the trainer.
"""

import ast
import difflib

import ml_collections

from cbert_jax.errors import ConfigError
from cbert_jax.models import NAMES as MODEL_NAMES
from cbert_jax.models import model_config as model_config_lib
from cbert_jax.models import sizes
from cbert_jax.models.model_config import MaskConfig, ModelConfig

# Default masking ratio per family (SPEC §2: BERT 20%, CrossBERT 50%).
# SPEC §2 (BERT 20%, CrossBERT 50%); ELECTRA's generator masks 15% (Clark et al., 2020).
DEFAULT_MASK_RATIO = {"bert": 0.2, "crossbert": 0.5, "electra": 0.15}

# Logical axis -> mesh axes. Every logical name used on a parameter must appear (None = replicated).
DEFAULT_RULES = (
  ("batch", ("data", "fsdp")),  # the batch is split over both data-parallel axes
  ("embed", "fsdp"),  # FSDP: parameters sharded along their model dimension
  ("mlp", "tensor"),  # tensor parallel: FFN hidden, heads and vocabulary
  ("heads", "tensor"),
  ("vocab", "tensor"),
  ("kv", None),  # per-head width stays whole
  ("seq", None),  # no sequence parallelism
)


def parse_arg(arg: str | None, **defaults):
  """`"model=bert,size=d128L4,runlocal"` -> ConfigDict over `defaults`, with their types.

  Bare names set booleans to True. Unknown keys and values that do not parse as the default's type
  raise ConfigError naming the key.
  """
  out = ml_collections.ConfigDict(defaults)
  for item in filter(None, (arg or "").split(",")):
    key, _, value = item.partition("=")
    key = key.strip()
    if key not in defaults:
      raise ConfigError(f"config argument {key!r} is unknown; known: {', '.join(defaults)}")
    kind = type(defaults[key])
    if kind is bool:
      if value.lower() not in ("", "true", "false", "1", "0"):
        raise ConfigError(f"config argument {key}={value!r}: expected true or false")
      out[key] = value.lower() in ("", "true", "1")
    elif kind in (int, float):
      try:
        out[key] = kind(ast.literal_eval(value))
      except (ValueError, SyntaxError) as e:
        raise ConfigError(f"config argument {key}={value!r}: expected {kind.__name__}") from e
    else:
      out[key] = value
  return out


def base_config() -> ml_collections.ConfigDict:
  """Every field, with its default and what it means. Experiment files override these."""
  c = ml_collections.ConfigDict()
  c.name = "run"  # run name: the default workdir is runs/<name>
  c.model_name = "crossbert"  # bert | crossbert | electra
  c.seed = 0  # init, data order and masking all derive from it
  c.total_steps = 1000  # optimizer steps
  c.batch_size = 32  # global batch, in rows of data.seq_len tokens
  c.log_every = 10  # steps between metric lines (also the non-finite check)
  c.checkpoint_every = 200  # steps between checkpoints (also saved at the end and on SIGTERM)
  c.keep_checkpoints = 2  # how many recent checkpoints to keep
  c.eval_every = 0  # steps between validation-loss evals; 0 = only at the end
  c.eval_batches = 4  # validation batches per eval (fixed rows, fixed masks)
  c.final_validation = True  # at the end of a run: the training loss on every validation row,
  # masks from a fixed key (cbert_jax/run/validation.py) -> workdir/eval/val_full-step_<N>.json
  c.val_full_every = 0  # steps between full-split validations during the run (the same metric
  # and file per step; val_full/* rows in metrics.jsonl); 0 = only the final one
  c.stop_after_step = 0  # > 0: checkpoint and exit after this step, as on preemption
  c.allow_config_change = False  # resume a workdir whose config.json differs in fields that
  # change the run (the error lists them; cbert_jax/run/workdir.py)
  c.restart_from_scratch = False  # start at step 0 when checkpoints were moved aside as damaged
  # (checkpoints.unreadable/) and none is left to resume from;
  # without it that run is refused (cbert_jax/run/checkpoint.py)
  c.num_devices = 0  # use only the first N devices (0 = all): debugging, tests
  c.peak_flops = 0.0  # per-device peak FLOP/s for MFU; 0 = table (TPU/GPU) or measured (CPU)
  c.compilation_cache_dir = ""  # JAX persistent compilation cache ("" = off)
  c.plot = True  # write workdir/metrics.png at the end

  c.mode = "train"  # train | eval (the offline probe suite on the workdir's latest
  # checkpoint) | sweep (every member of config.sweep.experiment)

  c.evals = (
    ml_collections.ConfigDict()
  )  # frozen-feature probes (--config.mode=eval, or during training)
  c.evals.tasks = (
    "sentiment,news_topic,tweet_source,genre,graded_sentiment,nli,"
    "question_passage,entailment_retrieval"
  )  # task-kit tasks (cbert_jax/data/TASKS.md)
  c.evals.every = 0  # during training: run the probes every N steps (0 = off)
  c.evals.probes = "ridge,knn"  # which probes on classification/regression/pair tasks
  c.evals.layers = "final"  # final | all (layer-wise ridge table)
  c.evals.layer = -1  # the layer every evaluator reads: -1 = final (normalised);
  # l in [0, num_layers] = residual stream after block l (0 = embeddings)
  c.evals.seq_len = 64  # tokens per text (longer texts are truncated)
  c.evals.batch_size = 128  # texts per feature batch
  c.evals.max_train = 5000  # cap on training examples per task (probe fit cost on CPU)
  c.evals.max_eval = 2000  # cap on dev/test examples (and retrieval queries) per task
  c.evals.init = "checkpoint"  # checkpoint | random (a randomly initialised encoder: the floor)
  c.evals.pooler = "none"  # retrieval with a contrastive pooler trained on dev pairs:
  # none | frozen | unfrozen | frozen,unfrozen
  c.evals.pooler_steps = 200  # pooler training steps (InfoNCE, in-batch negatives)
  c.evals.pooler_lr = 1e-3  # pooler learning rate
  c.evals.pooler_backbone_lr = 2e-5  # backbone learning rate when unfrozen
  c.evals.pooler_temperature = 0.05  # InfoNCE temperature
  c.evals.pooler_init = "fresh"  # fresh (the same new pooler on every backbone) | predictor
  # (warm start from CrossBERT's predictor cross-attention)
  # Suites of --config.mode=eval (online probing during training always uses `offline`).
  c.evals.suites = "offline"  # comma list of offline (the task kit) | glue | mteb;
  # glue and mteb download their data once (internet)
  c.evals.glue_tasks = ""  # GLUE tasks; "" = cola,sst2,mrpc,qqp,stsb,mnli,qnli,rte (+ wnli)
  c.evals.glue_data_dir = ""  # TFDS data dir for GLUE; "" = <data.cache_dir>/tfds
  c.evals.mteb_benchmark = "MTEB(eng, v2)"  # benchmark name as mteb.get_benchmark knows it
  c.evals.mteb_tasks = ""  # subset of the benchmark's task names; "" = all of them
  c.evals.mteb_embedding = "mean"  # mean (mean-pooled final layer) | pooler (a frozen contrastive
  # pooler trained first on the dev pairs of the
  # retrieval tasks in evals.tasks)

  c.model = ml_collections.ConfigDict()
  c.model.size = "d128L4"  # a rung of models/sizes.py; "" = use d_model/num_layers/num_heads
  c.model.d_model = 0  # residual width (set from size when 0)
  c.model.num_layers = 0  # encoder depth (set from size when 0)
  c.model.num_heads = 0  # attention heads (set from size when 0)
  c.model.head_dim = 0  # per-head width; 0 = d_model // num_heads
  c.model.ffn_dim = 0  # SwiGLU hidden; 0 = 256 * ceil(8d/3 / 256)
  c.model.vocab_size = 0  # set from the tokenizer
  c.model.norm_eps = 1e-5  # RMSNorm epsilon
  c.model.rope_theta = 10000.0  # RoPE base
  c.model.init_std = 0.0  # input-projection init std; 0 = d_model ** -0.5
  c.model.init_scale = 1.0  # global multiplier on every init std (smaller for very large models)
  c.model.depth_init = "none"  # output-projection std divisor: none | global | current
  c.model.tie_embeddings = False  # output head = embedding table transposed
  c.model.compute_dtype = (
    "float32"  # bfloat16 on TPU/GPU; float32 on CPU (bf16 is not faster there)
  )
  c.model.param_dtype = "float32"  # parameters and optimizer state
  c.model.remat = "none"  # activation recomputation per block: none | full | dots (keep
  # matmul outputs, recompute the rest); trades FLOPs for memory
  c.model.ce_chunk = 0  # vocab projection + cross-entropy over this many target positions
  # at a time, recomputed in backward (0 = all logits at once);
  # saves the [B, K, V] logits' memory (CMS: K = T/2 per view)
  c.model.attention_impl = "auto"  # auto (= xla) | xla | cudnn (fused; GPU with bf16/fp16 only,
  # opt-in: not yet verified with our masks on a GPU)
  c.model.fused_projections = False  # one [d, 3HD] matmul for q, k, v and one [d, 2F] for
  # SwiGLU's gate and up (weights concatenated per step; same parameters, same maths)
  c.model.predictor_layers = -1  # CrossBERT predictor depth; -1 = max(1, num_layers // 4)
  c.model.predictor_d_model = 0  # predictor width; 0 = d_model
  c.model.predictor_heads = 0  # predictor heads; 0 = num_heads (or width // head_dim if narrower)
  c.model.predictor_self_attn = False  # let predictor queries attend to each other (ablation)
  c.model.predictor_positions = "rope"  # rope | learned (absolute position table added to queries
  # and keys, no RoPE in the predictor; an ablation)
  c.model.max_positions = 0  # learned position table size; 0 = data.seq_len
  c.model.generator_width = 0.25  # ELECTRA generator width as a fraction of d_model (whole heads)
  c.model.generator_depth = 1.0  # ELECTRA generator depth as a fraction of num_layers
  c.model.generator_shared_embeddings = (
    True  # ELECTRA: generator and discriminator share embeddings
  )
  c.model.disc_weight = 50.0  # ELECTRA: weight of the replaced-token-detection loss

  c.masking = ml_collections.ConfigDict()
  c.masking.mask_ratio = -1.0  # fraction of tokens predicted; -1 = 0.2 (bert) / 0.5 (crossbert)
  # / 0.15 (electra, the generator's targets)
  c.masking.p_mask = 0.8  # BERT, ELECTRA's generator: share of targets replaced by [MASK]
  c.masking.p_random = 0.1  # ... share replaced by a random token (the rest unchanged)
  c.masking.cms = True  # CrossBERT: complementary masking (needs mask_ratio 0.5)
  c.masking.cms_form = "gather"  # gather (two rows of T/2, efficient) | inplace (masks; reference)

  c.data = ml_collections.ConfigDict()
  c.data.seq_len = 128  # tokens per packed row
  c.data.corpus = "offline_small"  # offline_small (18 MB) | offline_full (79 MB): registry-package English, probe texts removed;
  # gutenberg (18 books) | files (data.corpus_files) | sources (data.sources, pod scale)
  c.data.corpus_files = (
    ""  # comma-separated text files or globs (corpus=files); blank-line paragraphs
  )
  c.data.max_docs = 0  # use only the first N documents (0 = all)
  c.data.val_fraction = 0.02  # documents held out for validation (by hash, deterministic)
  c.data.split_seed = 0  # seed of the train/validation split
  c.data.cache_dir = ""  # "" = $CBERT_JAX_CACHE or ~/.cache/cbert_jax
  c.data.tokenizer_path = ""  # an existing SentencePiece model; "" = train one on the corpus
  c.data.vocab_size = 8192  # vocabulary of a trained tokenizer
  c.data.tokenizer_type = "bpe"  # bpe | unigram
  c.data.tokenizer_sample_chars = 20_000_000  # cap on tokenizer training text
  c.data.verify_cache = (
    "sample"  # cache entries (tokenizer, packed arrays, shards) are checked against their
  )
  # sha256 sidecar on read: sample (size + first/middle/last MiB, cheap) | full
  # (whole-file sha256, seconds per GB); a damaged entry is moved aside and rebuilt
  # corpus=sources: pod-scale corpora, preprocessed into sharded ArrayRecord rows (data/preprocess.py)
  c.data.sources = ""  # "pattern[:weight],...": paths/globs (local or epath URLs) of .txt/.jsonl/.jsonl.zst/.parquet/.array_record
  c.data.text_field = "text"  # JSON key / Parquet column holding the document text
  c.data.text_mode = "paragraphs"  # plain text: paragraphs (blank-line split, as corpus=files) | file (one doc per file)
  c.data.record_format = (
    "text"  # ArrayRecord input records: text (UTF-8 document) | json (object with text_field)
  )
  c.data.on_bad_record = (
    "error"  # error (stop, naming file and line) | skip (skip and count in the manifest)
  )
  c.data.preprocess_workers = (
    0  # tokenize/pack worker processes; 0 = all cores (output is the same for any count)
  )
  c.data.shard_input_mb = 256  # input MiB per task / output shard (part of the cache key)

  c.faults = (
    ml_collections.ConfigDict()
  )  # numerical faults (cbert_jax/step/guard.py); non-finite always stops
  c.faults.spike = "warn"  # on a loss spike: off | warn | skip (do not apply that update) |
  # rollback (last checkpoint, data advanced past the batch);
  # every spike also writes workdir/diagnostics/step_<n>/
  c.faults.threshold = 6.0  # spike: loss above its running mean by > threshold running stds
  c.faults.min_jump = 0.1  # ... and by > this fraction of the running mean
  c.faults.ema = 0.98  # decay of the running mean and variance of the loss
  c.faults.warmup = 50  # steps of statistics before spikes are judged
  c.faults.max_rollbacks = 3  # rollback: stop with an error after this many in one run
  c.faults.plant_nan_step = 0  # tests: update N's loss (and gradients) become NaN; 0 = off
  c.faults.plant_spike_batches = ""  # tests: these 1-based global batches (e.g. "9,12") are
  # corrupted (every token -> the last vocabulary id): a data spike

  c.optim = ml_collections.ConfigDict()
  c.optim.lr = 3e-3  # peak learning rate
  c.optim.b1 = 0.9  # AdamW beta1
  c.optim.b2 = 0.95  # AdamW beta2
  c.optim.eps = 1e-8  # AdamW epsilon
  c.optim.weight_decay = 0.1  # decoupled weight decay, matrices only
  c.optim.clip_norm = 1.0  # global gradient-norm clip; 0 = off
  c.optim.schedule = "wsd"  # wsd (warmup-stable-decay) | cosine | constant
  c.optim.warmup_frac = 0.02  # warmup as a fraction of total_steps (used when warmup_steps = 0)
  c.optim.warmup_steps = 0  # explicit warmup steps (> 0 overrides warmup_frac)
  c.optim.decay_frac = 0.2  # wsd: decay over the last fraction of the run
  c.optim.decay_shape = "linear"  # wsd decay: linear | cosine
  c.optim.final_lr_frac = 0.0  # LR at the end, as a fraction of the peak
  c.optim.microbatches = 1  # gradient accumulation: split each global batch into this many
  # micro-batches inside the step (same batch, LR and data order;
  # less activation memory); 1 = off

  # Scaling sweeps (experiments/sweep.py, cbert_jax/scaling/). A member (tokens_per_param > 0) has
  # total_steps, batch_size, optim.lr, checkpoint_every and eval_every derived in `resolve` from
  # its token budget and the hyperparameter laws; set the sweep.* inputs, not those fields.
  c.sweep = ml_collections.ConfigDict()
  c.sweep.scale = ""  # paper | cpu | quick | auto (auto: cpu on a CPU-only machine,
  # paper otherwise); "" = not part of a sweep
  c.sweep.experiment = ""  # the sweep's experiment file (mode=sweep reads its members)
  c.sweep.arg = ""  # the experiment file's arg this config came from
  c.sweep.models = ""  # mode=sweep: only these members' models, comma list ("" = all)
  c.sweep.sizes = ""  # mode=sweep: only these sizes, comma list ("" = all)
  c.sweep.probe = True  # mode=sweep: the offline probe suite on every final checkpoint
  c.sweep.report = True  # mode=sweep: write the scaling report at the end
  c.sweep.tokens_per_param = 0.0  # > 0: a sweep member trained on tokens_per_param x N tokens
  c.sweep.n_definition = "non_embedding"  # which parameters N counts: non_embedding (blocks +
  # predictor / generator) | total | encoder
  c.sweep.laws = ""  # JSON of fitted lr(C), B(C) laws (cbert_jax.report.grid fit);
  # "shipped:<name>" = a fit shipped in cbert_jax/scaling/fitted/ (cpu-bert, cpu-crossbert);
  # "{model}" in it = the member's family ("shipped:cpu-{model}": each family its own fit);
  # "" = the published defaults (DeepSeek LLM's; cbert_jax/scaling/laws.py says why)
  c.sweep.law_axis = "compute"  # the laws' x: compute (training FLOPs) | params (N)
  c.sweep.batch_size = 0  # rows per step; 0 = from the batch-size law
  c.sweep.lr = 0.0  # peak LR; 0 = from the LR law
  c.sweep.lr_scale = 1.0  # multiplier on the law's LR (grid experiments)
  c.sweep.batch_multiple = 1  # round the law's batch to a multiple of this (data parallelism)
  c.sweep.target_devices = 0  # devices the member is planned for (the compile check's mesh);
  # 0 = whatever this machine has
  c.sweep.chip = ""  # the chip the member is planned for (a key of
  # cbert_jax/scaling/memory.py:CHIPS: v4 v5e v5p v6e a100 h100
  # h200 b200); "" = no memory plan
  c.sweep.memory = "auto"  # with sweep.chip: auto (the memory planner sets model.remat,
  # model.ce_chunk and optim.microbatches to the least costly
  # setting that fits) | check (keep them; record the verdict)
  c.sweep.checkpoints = 10  # checkpoints per run (checkpoint_every = steps / this)
  c.sweep.evals = 20  # validation-loss evals per run (eval_every = steps / this)
  # Derived by `resolve` for a member (recorded in config.json; inputs above):
  c.sweep.n_params = 0  # N under n_definition
  c.sweep.compute = 0.0  # training FLOPs of the run: FLOPs per data token x tokens
  c.sweep.target_tokens = 0  # tokens_per_param x N
  c.sweep.tokens = 0  # steps x batch_size x seq_len (>= target_tokens)
  c.sweep.laws_source = ""  # where the LR and batch laws came from
  c.sweep.memory_setting = (
    ""  # the memory plan's setting: "remat=..., ce_chunk=..., microbatches=..."
  )
  c.sweep.memory_verdict = ""  # fits | needs microbatches=k | needs more chips (on sweep.chip)
  c.sweep.memory_bytes = 0.0  # predicted peak bytes per device of that setting
  c.sweep.memory_budget = 0.0  # usable bytes per device of sweep.chip

  c.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1, tensor=1))  # ICI sizes; one -1 = fill
  c.mesh_dcn = ml_collections.ConfigDict(
    dict(data=1, fsdp=1, tensor=1)
  )  # sizes across slices/hosts
  c.sharding_rules = DEFAULT_RULES  # logical axis -> mesh axes
  return c


def check_fields(config: ml_collections.ConfigDict) -> None:
  """Raises ConfigError for a field `base_config` lacks or a value of the wrong type.

  ml_collections accepts both inside an experiment file: a new key (`c.batchsize = 64`, a typo)
  and None or a bool for a number. Command-line overrides are checked by the flag parser.
  """
  _check_fields(config, base_config(), "")


def _check_fields(node, base, prefix: str) -> None:
  for key in node.keys():
    path, value = prefix + key, node[key]
    if key not in base:
      raise ConfigError(unknown_field(path))
    want = base[key]
    if isinstance(want, ml_collections.ConfigDict):
      if not isinstance(value, (ml_collections.ConfigDict, dict)):
        raise ConfigError(
          f"{path}: expected a group of fields ({', '.join(want.keys())}), got {value!r}"
        )
      _check_fields(value, want, path + ".")
    elif not _type_ok(value, want):
      raise ConfigError(f"{path}: expected {_type_name(want)}, got {value!r}")


def _type_ok(value, want) -> bool:
  if isinstance(want, bool) or isinstance(value, bool):
    return isinstance(want, bool) and isinstance(value, bool)
  if isinstance(want, float):
    return isinstance(value, (int, float))
  if isinstance(want, (tuple, list)):
    return isinstance(value, (tuple, list))
  return isinstance(value, type(want))


def _type_name(want) -> str:
  if isinstance(want, bool):
    return "true or false"
  return "a tuple" if isinstance(want, (tuple, list)) else type(want).__name__


def leaves(node, prefix: str = ""):
  """(dotted path, value) of every non-group field of a ConfigDict, depth first."""
  for key in node.keys():
    if isinstance(node[key], ml_collections.ConfigDict):
      yield from leaves(node[key], prefix + key + ".")
    else:
      yield prefix + key, node[key]


def expected_type(path: str) -> str | None:
  """What the field at dotted `path` holds ("int", "float", "true or false", ...); None if none."""
  return next((_type_name(v) for k, v in leaves(base_config()) if k == path), None)


def unknown_field(path: str) -> str:
  """The message for a dotted field path that `base_config` lacks, with the closest known one."""
  known = [k for k, _ in leaves(base_config())]
  leaf = path.rsplit(".", 1)[-1]
  same_leaf = [k for k in known if k.rsplit(".", 1)[-1] == leaf]
  guess = difflib.get_close_matches(
    path, same_leaf or known, n=1, cutoff=0.0 if same_leaf else 0.75
  )
  hint = f" (did you mean {guess[0]!r}?)" if guess else ""
  return (
    f"unknown config field {path!r}{hint}; every field is listed in "
    "cbert_jax/config_lib.py:base_config"
  )


def resolve(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Fill derived fields in place (size -> dims, predictor depth, mask ratio) and return config.

  Unknown fields and values of the wrong type (see `check_fields`) raise ConfigError first.
  """
  check_fields(config)
  if config.model_name not in MODEL_NAMES:
    raise ConfigError(
      f"model_name: unknown model {config.model_name!r}; expected one of {', '.join(MODEL_NAMES)}"
    )
  with config.unlocked():
    m = config.model
    if m.size:
      d, layers, heads = sizes.lookup(m.size)
      m.d_model, m.num_layers, m.num_heads = (
        m.d_model or d,
        m.num_layers or layers,
        m.num_heads or heads,
      )
    if m.predictor_layers < 0:
      m.predictor_layers = sizes.default_predictor_layers(m.num_layers)
    if config.masking.mask_ratio < 0:
      config.masking.mask_ratio = DEFAULT_MASK_RATIO[config.model_name]
    if m.max_positions <= 0:
      m.max_positions = config.data.seq_len
    if config.model_name != "crossbert":  # only CrossBERT reads it; config.json says what ran
      config.masking.cms = False
  if config.sweep.tokens_per_param > 0:
    from cbert_jax.scaling import plan  # pylint: disable=import-outside-toplevel (imports the models)

    plan.derive(config)
  return config


def validate(config: ml_collections.ConfigDict, num_devices: int) -> None:
  """Everything checkable before data preparation or compilation; raises ConfigError."""
  from cbert_jax.step import (  # local: imports jax, and config files should stay light
    guard,
    sharding,
  )

  check_fields(config)
  m, mk, d = config.model, config.masking, config.data
  if config.model_name not in MODEL_NAMES:
    raise ConfigError(
      f"model_name: unknown model {config.model_name!r}; expected one of {', '.join(MODEL_NAMES)}"
    )
  if not 0.0 < mk.mask_ratio < 1.0:
    raise ConfigError(f"masking.mask_ratio must be in (0, 1), got {mk.mask_ratio}")
  for name in ("d_model", "num_layers", "num_heads"):
    if m[name] <= 0:
      raise ConfigError(f"model.{name} must be positive (or set model.size), got {m[name]}")
  if m.d_model % m.num_heads and not m.head_dim:
    raise ConfigError(
      f"model.d_model={m.d_model} is not divisible by model.num_heads={m.num_heads}"
    )
  if (m.head_dim or m.d_model // m.num_heads) % 2:
    raise ConfigError("model.head_dim must be even (RoPE rotates pairs)")
  if m.ce_chunk < 0:
    raise ConfigError(f"model.ce_chunk must be >= 0 (0 = off), got {m.ce_chunk}")
  if m.remat not in ("none", "full", "dots"):
    raise ConfigError(f"model.remat must be none|full|dots, got {m.remat!r}")
  if m.attention_impl not in ("auto", "xla", "cudnn"):
    raise ConfigError(f"model.attention_impl must be auto|xla|cudnn, got {m.attention_impl!r}")
  if m.depth_init not in ("none", "global", "current"):
    raise ConfigError(f"model.depth_init must be none|global|current, got {m.depth_init!r}")
  if config.model_name == "crossbert":
    if m.predictor_layers < 1:
      raise ConfigError(f"model.predictor_layers must be >= 1, got {m.predictor_layers}")
    if m.tie_embeddings and m.predictor_d_model not in (0, m.d_model):
      raise ConfigError("model.tie_embeddings needs model.predictor_d_model == d_model")
    if mk.cms and abs(mk.mask_ratio - 0.5) > 1e-9:
      raise ConfigError(
        f"masking.cms splits every row in halves, so masking.mask_ratio must be 0.5 "
        f"(got {mk.mask_ratio}); set masking.cms=False for other ratios"
      )
    if m.predictor_positions not in ("rope", "learned"):
      raise ConfigError(
        f"model.predictor_positions must be rope|learned, got {m.predictor_positions!r}"
      )
    if m.predictor_positions == "learned" and m.max_positions < d.seq_len:
      raise ConfigError(
        f"model.max_positions={m.max_positions} is smaller than "
        f"data.seq_len={d.seq_len} (the learned position table needs a row per "
        "position)"
      )
    if mk.cms and mk.cms_form not in ("gather", "inplace"):
      raise ConfigError(f"masking.cms_form must be gather|inplace, got {mk.cms_form!r}")
    if mk.cms and d.seq_len % 2:
      raise ConfigError(f"data.seq_len must be even with masking.cms, got {d.seq_len}")
  if config.model_name == "electra":
    if not 0 < m.generator_width <= 1 or not 0 < m.generator_depth <= 1:
      raise ConfigError(
        f"model.generator_width and model.generator_depth must be in (0, 1], got "
        f"{m.generator_width} and {m.generator_depth}"
      )
    if m.disc_weight < 0:
      raise ConfigError(f"model.disc_weight must be >= 0, got {m.disc_weight}")
  if not (0 <= mk.p_mask and 0 <= mk.p_random and mk.p_mask + mk.p_random <= 1):
    raise ConfigError("masking.p_mask + masking.p_random must be within [0, 1]")
  for name in ("total_steps", "batch_size", "log_every", "checkpoint_every"):
    if config[name] <= 0:
      raise ConfigError(f"{name} must be positive, got {config[name]}")
  for name, value in (
    ("keep_checkpoints", config.keep_checkpoints),
    ("eval_batches", config.eval_batches),
  ):
    if value < 1:
      raise ConfigError(f"{name} must be >= 1, got {value}")
  for name, value, zero in (
    ("eval_every", config.eval_every, "only at the end"),
    ("val_full_every", config.val_full_every, "only at the end"),
    ("evals.every", config.evals.every, "off"),
    ("stop_after_step", config.stop_after_step, "off"),
    ("num_devices", config.num_devices, "all"),
  ):
    if value < 0:
      raise ConfigError(f"{name} must be >= 0 (0 = {zero}), got {value}")
  if config.stop_after_step > config.total_steps:
    raise ConfigError(
      f"stop_after_step={config.stop_after_step} is beyond total_steps="
      f"{config.total_steps}, so it would never stop the run (0 = off)"
    )
  if config.num_devices > num_devices:
    raise ConfigError(
      f"num_devices={config.num_devices}, but only {num_devices} devices are available (0 = all)"
    )
  if d.seq_len < 8:
    raise ConfigError(f"data.seq_len must be >= 8, got {d.seq_len}")
  guard.GuardConfig.from_config(config.faults)  # faults.* ranges and names
  guard.planted_batches(config.faults.plant_spike_batches)
  if config.faults.max_rollbacks < 0:
    raise ConfigError(f"faults.max_rollbacks must be >= 0, got {config.faults.max_rollbacks}")
  if config.optim.schedule not in ("wsd", "cosine", "constant"):
    raise ConfigError(f"optim.schedule must be wsd|cosine|constant, got {config.optim.schedule!r}")
  # pylint: disable-next=g-import-not-at-top  (sentencepiece, numpy: config files stay light)
  from cbert_jax.data import corpus as corpus_lib
  from cbert_jax.data import settings  # pylint: disable=g-import-not-at-top
  from cbert_jax.data import sources as sources_lib
  from cbert_jax.data import tokenizer as tokenizer_lib

  data_cfg = settings.data_config(config)
  if data_cfg.corpus not in (*corpus_lib.CORPUS_KINDS, "sources"):
    raise ConfigError(
      f"data.corpus must be one of "
      f"{', '.join(repr(k) for k in (*corpus_lib.CORPUS_KINDS, 'sources'))}, "
      f"got {data_cfg.corpus!r}"
    )
  if data_cfg.corpus == "sources":  # the data package validates its own fields
    sources_lib.check_sources_config(data_cfg)
  else:
    corpus_lib.check_corpus_config(data_cfg)
  tokenizer_lib.check_tokenizer_config(data_cfg)
  _check_rules(config.sharding_rules, sharding.AXES)
  # Mesh against the devices, and the batch against the data-parallel part of the mesh.
  ici, dcn = sharding.mesh_shape(config.mesh, num_devices, config.mesh_dcn)
  dp = 1
  shape = {a: i * j for a, i, j in zip(sharding.AXES, ici, dcn)}
  for axis in _batch_axes(config.sharding_rules):
    dp *= shape[axis]
  if config.batch_size % dp:
    raise ConfigError(
      f"batch_size={config.batch_size} is not divisible by the data-parallel size {dp} "
      f"(mesh {shape})"
    )
  k = config.optim.microbatches
  if k < 1:
    raise ConfigError(f"optim.microbatches must be >= 1 (1 = no accumulation), got {k}")
  if config.batch_size % (k * dp):
    raise ConfigError(
      f"batch_size={config.batch_size} is not divisible by optim.microbatches={k} "
      f"x the data-parallel size {dp} (= {k * dp})"
    )


def _check_rules(rules, mesh_axes: tuple[str, ...]) -> None:
  """sharding_rules: (logical name, mesh axes) pairs, one for every logical name the models use."""
  for rule in rules:
    ok = isinstance(rule, (tuple, list)) and len(rule) == 2 and isinstance(rule[0], str)
    axes = rule[1] if ok else None
    axes = (axes,) if isinstance(axes, str) else axes or ()
    if not ok or not isinstance(axes, (tuple, list)) or any(a not in mesh_axes for a in axes):
      raise ConfigError(
        f"sharding_rules: expected (logical name, mesh axes) pairs, the mesh axes "
        f"None or among {', '.join(mesh_axes)}; got {rule!r}"
      )
  missing = [n for n, _ in DEFAULT_RULES if n not in {r[0] for r in rules}]
  if missing:
    raise ConfigError(
      f"sharding_rules: no rule for {', '.join(missing)} (every logical axis "
      "needs one; None = replicated)"
    )


def _batch_axes(rules) -> tuple[str, ...]:
  for name, axes in rules:
    if name == "batch":
      return (axes,) if isinstance(axes, str) else tuple(axes or ())
  return ()


def model_configs(
  config, vocab_size: int, mask_id: int, special_ids: tuple[int, ...]
) -> tuple[ModelConfig, MaskConfig]:
  """The frozen dataclasses the models are built from; records vocab_size in the config."""
  with config.unlocked():
    config.model.vocab_size = int(vocab_size)
  return build_model_configs(config, vocab_size, mask_id, special_ids)


def build_model_configs(
  config, vocab_size: int, mask_id: int, special_ids: tuple[int, ...]
) -> tuple[ModelConfig, MaskConfig]:
  """`model_configs` without recording anything in `config` (e.g. planning before a tokenizer)."""
  return model_config_lib.from_config(config, vocab_size, mask_id, special_ids)
