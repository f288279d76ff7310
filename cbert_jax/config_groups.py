"""The config's fields, one builder per group, each field with its default and what it means.

`config_lib.base_config()` puts them together: the run's own fields at the top level, then
`evals`, `model`, `masking`, `data`, `faults`, `optim`, `sweep` and the mesh. These are the fields
a user sets (in an experiment file or as `--config.GROUP.FIELD=VALUE`). Fields a run derives are
not here: `model.d_model` & co. are filled from `model.size` by `config_lib.resolve`, and a sweep
member's `SWEEP_DERIVED` record by `cbert_jax.scaling.plan.derive`.

Only ml_collections is imported, so experiment files and the JAX-free launcher stay light.
"""

import ml_collections

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

# What `scaling.plan.derive` records in a sweep member's `sweep` group (config.json). They exist
# only in a resolved member's config; setting one is refused (config_lib.check_fields): set the
# inputs (sweep.tokens_per_param, sweep.laws, sweep.chip, ...) instead.
SWEEP_DERIVED = {
  "n_params": "N, the parameters counted under sweep.n_definition",
  "compute": "training FLOPs of the run: FLOPs per data token x tokens",
  "target_tokens": "sweep.tokens_per_param x N",
  "tokens": "steps x batch_size x seq_len (>= target_tokens)",
  "laws_source": "where the LR and batch laws came from",
  "memory_setting": 'the memory plan\'s setting, "remat=..., ce_chunk=..., microbatches=..."',
  "memory_verdict": "fits | needs microbatches=k | needs more chips (on sweep.chip)",
  "memory_bytes": "predicted peak bytes per device of that setting",
  "memory_budget": "usable bytes per device of sweep.chip",
}


def run() -> ml_collections.ConfigDict:
  """The run itself: what, how long, how often it logs, checkpoints and evaluates."""
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
  # At the end of a run: the training loss on every validation row, masks from a fixed key
  # (cbert_jax/run/validation.py) -> workdir/eval/val_full-step_<N>.json.
  c.final_validation = True
  # Steps between full-split validations during the run (the same metric and file per step;
  # val_full/* rows in metrics.jsonl); 0 = only the final one.
  c.val_full_every = 0
  c.stop_after_step = 0  # > 0: checkpoint and exit after this step, as on preemption
  # Resume a workdir whose config.json differs in fields that change the run (the error lists
  # them; cbert_jax/run/workdir.py).
  c.allow_config_change = False
  # Start at step 0 when checkpoints were moved aside as damaged (checkpoints.unreadable/) and
  # none is left to resume from; without it that run is refused (cbert_jax/run/checkpoint.py).
  c.restart_from_scratch = False
  # Start from trained weights instead of a random init: a cbert_jax workdir ("W", its newest
  # checkpoint, or "W:step"), an export of `python -m cbert_jax.export`, or a Hugging Face folder
  # with a LlamaModel-layout encoder (config.json + model.safetensors, and the SentencePiece
  # tokenizer.model it reads text with). The tokenizer comes from there (data.vocab_size must
  # match it); the optimizer and LR schedule start fresh (step 0, warm-up included); parts the
  # source lacks (CrossBERT's predictor from a BERT) start fresh. Only a run's step 0: a workdir
  # with its own checkpoints resumes from them. model.size=from_init takes the encoder's shape
  # from the source's config.json; total_steps=0 only saves the loaded weights as checkpoint 0
  # ("" = off; cbert_jax/export/init_from.py).
  c.init_from = ""
  c.num_devices = 0  # use only the first N devices (0 = all): debugging, tests
  c.peak_flops = 0.0  # per-device peak FLOP/s for MFU; 0 = table (TPU/GPU) or measured (CPU)
  c.compilation_cache_dir = ""  # JAX persistent compilation cache ("" = off)
  c.plot = True  # write workdir/metrics.png at the end
  # train | eval (the offline probe suite on the workdir's latest checkpoint) | sweep (every
  # member of sweep.experiment).
  c.mode = "train"
  return c


def evals() -> ml_collections.ConfigDict:
  """Frozen-feature probes: `--config.mode=eval`, or during training (`evals.every`)."""
  c = ml_collections.ConfigDict()
  # Task-kit tasks (cbert_jax/data/TASKS.md).
  c.tasks = (
    "sentiment,news_topic,tweet_source,genre,graded_sentiment,nli,"
    "question_passage,entailment_retrieval"
  )
  c.every = 0  # during training: run the probes every N steps (0 = off)
  c.probes = "ridge,knn"  # which probes on classification/regression/pair tasks
  c.layers = "final"  # final | all (layer-wise ridge table)
  # The layer every evaluator reads: -1 = final (normalised); l in [0, num_layers] = the residual
  # stream after block l (0 = embeddings).
  c.layer = -1
  c.seq_len = 64  # tokens per text (longer texts are truncated)
  c.batch_size = 128  # texts per feature batch
  c.max_train = 5000  # cap on training examples per task (probe fit cost on CPU)
  c.max_eval = 2000  # cap on dev/test examples (and retrieval queries) per task
  c.init = "checkpoint"  # checkpoint | random (a randomly initialised encoder: the floor)
  # Retrieval with a contrastive pooler trained on dev pairs: none | frozen | unfrozen |
  # frozen,unfrozen.
  c.pooler = "none"
  c.pooler_steps = 200  # pooler training steps (InfoNCE, in-batch negatives)
  c.pooler_lr = 1e-3  # pooler learning rate
  c.pooler_backbone_lr = 2e-5  # backbone learning rate when unfrozen
  c.pooler_temperature = 0.05  # InfoNCE temperature
  # fresh (the same new pooler on every backbone) | predictor (warm start from CrossBERT's
  # predictor cross-attention).
  c.pooler_init = "fresh"
  # Suites of --config.mode=eval, a comma list of offline (the task kit) | glue | mteb; glue and
  # mteb download their data once (internet). Online probing during training uses `offline`.
  c.suites = "offline"
  c.glue_tasks = ""  # GLUE tasks; "" = cola,sst2,mrpc,qqp,stsb,mnli,qnli,rte (+ wnli)
  c.glue_data_dir = ""  # TFDS data dir for GLUE; "" = <data.cache_dir>/tfds
  c.mteb_benchmark = "MTEB(eng, v2)"  # benchmark name as mteb.get_benchmark knows it
  c.mteb_tasks = ""  # subset of the benchmark's task names; "" = all of them
  # mean (mean-pooled final layer) | pooler (a frozen contrastive pooler trained first on the dev
  # pairs of the retrieval tasks in evals.tasks).
  c.mteb_embedding = "mean"
  return c


def model() -> ml_collections.ConfigDict:
  """The encoder (and CrossBERT's predictor, ELECTRA's generator): shape, init, numerics."""
  c = ml_collections.ConfigDict()
  # A rung of models/sizes.py; "" = use d_model/num_layers/num_heads; "from_init" = the shape of
  # init_from's encoder (its config.json: width, depth, heads, head and FFN widths, RMSNorm eps,
  # RoPE base).
  c.size = "d128L4"
  c.d_model = 0  # residual width (set from size when 0)
  c.num_layers = 0  # encoder depth (set from size when 0)
  c.num_heads = 0  # attention heads (set from size when 0)
  c.head_dim = 0  # per-head width; 0 = d_model // num_heads
  c.ffn_dim = 0  # SwiGLU hidden; 0 = 256 * ceil(8d/3 / 256)
  c.vocab_size = 0  # set from the tokenizer
  c.norm_eps = 1e-5  # RMSNorm epsilon
  c.rope_theta = 10000.0  # RoPE base
  c.init_std = 0.0  # input-projection init std; 0 = d_model ** -0.5
  c.init_scale = 1.0  # global multiplier on every init std (smaller for very large models)
  c.depth_init = "none"  # output-projection std divisor: none | global | current
  c.tie_embeddings = False  # output head = embedding table transposed
  c.compute_dtype = "float32"  # bfloat16 on TPU/GPU; float32 on CPU (bf16 is not faster there)
  c.param_dtype = "float32"  # parameters and optimizer state
  # Activation recomputation per block: none | full | dots (keep matmul outputs, recompute the
  # rest); trades FLOPs for memory.
  c.remat = "none"
  # Vocabulary projection + cross-entropy over this many target positions at a time, recomputed
  # in backward (0 = all logits at once); saves the [B, K, V] logits' memory (CMS: K = T/2 per
  # view).
  c.ce_chunk = 0
  # auto (= xla) | xla | cudnn (fused; GPU with bf16/fp16 only, opt-in: not yet verified with our
  # masks on a GPU) | splash (Pallas' splash kernel with segment ids; TPU only, opt-in:
  # models/splash.py, docs/performance.md).
  c.attention_impl = "auto"
  # One [d, 3HD] matmul for q, k, v and one [d, 2F] for SwiGLU's gate and up (weights
  # concatenated per step; the same parameters, the same maths).
  c.fused_projections = False
  c.predictor_layers = -1  # CrossBERT predictor depth; -1 = max(1, num_layers // 4)
  c.predictor_d_model = 0  # predictor width; 0 = d_model
  c.predictor_heads = 0  # predictor heads; 0 = num_heads (or width // head_dim if narrower)
  c.predictor_self_attn = False  # let predictor queries attend to each other (ablation)
  # rope | learned (an absolute position table added to queries and keys, no RoPE in the
  # predictor; an ablation).
  c.predictor_positions = "rope"
  c.max_positions = 0  # learned position table size; 0 = data.seq_len
  c.generator_width = 0.25  # ELECTRA generator width as a fraction of d_model (whole heads)
  c.generator_depth = 1.0  # ELECTRA generator depth as a fraction of num_layers
  c.generator_shared_embeddings = True  # ELECTRA: generator and discriminator share embeddings
  c.disc_weight = 50.0  # ELECTRA: weight of the replaced-token-detection loss
  return c


def masking() -> ml_collections.ConfigDict:
  """Which tokens are predicted, and how they are corrupted."""
  c = ml_collections.ConfigDict()
  # Fraction of tokens predicted; -1 = the family's default: 0.2 (bert), 0.5 (crossbert), 0.15
  # (electra, the generator's targets).
  c.mask_ratio = -1.0
  c.p_mask = 0.8  # BERT, ELECTRA's generator: share of targets replaced by [MASK]
  c.p_random = 0.1  # ... share replaced by a random token (the rest unchanged)
  c.cms = True  # CrossBERT: complementary masking (needs mask_ratio 0.5)
  c.cms_form = "gather"  # gather (two rows of T/2, efficient) | inplace (masks; reference)
  return c


def data() -> ml_collections.ConfigDict:
  """The pretraining corpus, its split, the tokenizer and the cache (cbert_jax/data/)."""
  c = ml_collections.ConfigDict()
  c.seq_len = 128  # tokens per packed row
  # offline_small (18 MB) | offline_full (79 MB): registry-package English, probe texts removed;
  # gutenberg (18 books) | files (data.corpus_files) | sources (data.sources, pod scale).
  c.corpus = "offline_small"
  c.corpus_files = ""  # comma-separated text files or globs (corpus=files); blank-line paragraphs
  c.max_docs = 0  # use only the first N documents (0 = all)
  c.val_fraction = 0.02  # documents held out for validation (by hash, deterministic)
  c.split_seed = 0  # seed of the train/validation split
  c.cache_dir = ""  # "" = $CBERT_JAX_CACHE or ~/.cache/cbert_jax
  c.tokenizer_path = ""  # an existing SentencePiece model; "" = train one on the corpus
  c.vocab_size = 8192  # vocabulary of a trained tokenizer
  c.tokenizer_type = "bpe"  # bpe | unigram
  c.tokenizer_sample_chars = 20_000_000  # cap on tokenizer training text
  # Cache entries (tokenizer, packed arrays, shards) are checked against their sha256 sidecar on
  # read: sample (size + first/middle/last MiB, cheap) | full (whole-file sha256, seconds per
  # GB); a damaged entry is moved aside and rebuilt.
  c.verify_cache = "sample"
  # corpus=sources: pod-scale corpora, preprocessed into sharded ArrayRecord rows
  # (cbert_jax/data/preprocess.py). "pattern[:weight],...": paths or globs (local or epath URLs)
  # of .txt/.jsonl/.jsonl.zst/.parquet/.array_record files.
  c.sources = ""
  c.text_field = "text"  # JSON key / Parquet column holding the document text
  # Plain text: paragraphs (blank-line split, as corpus=files) | file (one document per file).
  c.text_mode = "paragraphs"
  c.record_format = "text"  # ArrayRecord records: text (a UTF-8 document) | json (text_field)
  c.on_bad_record = "error"  # error (stop, naming file and line) | skip (counted in the manifest)
  # Tokenize/pack worker processes; 0 = all cores (the output is the same for any count).
  c.preprocess_workers = 0
  c.shard_input_mb = 256  # input MiB per task / output shard (part of the cache key)
  return c


def faults() -> ml_collections.ConfigDict:
  """Numerical faults (cbert_jax/step/guard.py); a non-finite loss always stops the run."""
  c = ml_collections.ConfigDict()
  # On a loss spike: off | warn | skip (do not apply that update) | rollback (last checkpoint,
  # data advanced past the batch); every spike also writes workdir/diagnostics/step_<n>/.
  c.spike = "warn"
  c.threshold = 6.0  # spike: loss above its running mean by > threshold running stds
  c.min_jump = 0.1  # ... and by > this fraction of the running mean
  c.ema = 0.98  # decay of the running mean and variance of the loss
  c.warmup = 50  # steps of statistics before spikes are judged
  c.max_rollbacks = 3  # rollback: stop with an error after this many in one run
  c.plant_nan_step = 0  # tests: update N's loss (and gradients) become NaN; 0 = off
  # Tests: these 1-based global batches (e.g. "9,12") are corrupted (every token -> the last
  # vocabulary id): a data spike.
  c.plant_spike_batches = ""
  return c


WANDB_MODES = ("auto", "online", "offline")  # wandb.mode's values


def wandb() -> ml_collections.ConfigDict:
  """Optional Weights & Biases logging (cbert_jax/run/wandb_logger.py; extra `wandb`)."""
  c = ml_collections.ConfigDict()
  c.project = ""  # W&B project; "" = off (wandb is not imported)
  c.entity = ""  # W&B user or team; "" = your default entity
  c.name = ""  # the run's name; "" = config.name, else the workdir's name
  c.group = ""  # W&B group (e.g. a sweep's name); "" = none
  c.tags = ""  # comma-separated W&B tags
  # online | offline (files in <workdir>/wandb, `wandb sync` later) | auto: online when the W&B
  # server answers within 3 s and credentials exist, else offline
  c.mode = "auto"
  return c


def optim() -> ml_collections.ConfigDict:
  """AdamW, gradient clipping, the LR schedule and gradient accumulation (cbert_jax/step/optim)."""
  c = ml_collections.ConfigDict()
  c.lr = 3e-3  # peak learning rate
  c.b1 = 0.9  # AdamW beta1
  c.b2 = 0.95  # AdamW beta2
  c.eps = 1e-8  # AdamW epsilon
  c.weight_decay = 0.1  # decoupled weight decay, matrices only
  c.clip_norm = 1.0  # global gradient-norm clip; 0 = off
  c.schedule = "wsd"  # wsd (warmup-stable-decay) | cosine | constant
  c.warmup_frac = 0.02  # warmup as a fraction of total_steps (used when warmup_steps = 0)
  c.warmup_steps = 0  # explicit warmup steps (> 0 overrides warmup_frac)
  c.decay_frac = 0.2  # wsd: decay over the last fraction of the run
  c.decay_shape = "linear"  # wsd decay: linear | cosine
  c.final_lr_frac = 0.0  # LR at the end, as a fraction of the peak
  # Gradient accumulation: each global batch is split into this many micro-batches inside the
  # step (the same batch, LR and data order; less activation memory); 1 = off.
  c.microbatches = 1
  return c


def sweep() -> ml_collections.ConfigDict:
  """Scaling sweeps (experiments/sweep.py, cbert_jax/scaling/). A member (tokens_per_param > 0)
  has total_steps, batch_size, optim.lr, checkpoint_every and eval_every derived from its token
  budget and the hyperparameter laws (`scaling.plan.derive`, which also records `SWEEP_DERIVED`):
  set these inputs, not those fields."""
  c = ml_collections.ConfigDict()
  # paper | cpu | quick | auto (auto: cpu on a CPU-only machine, paper otherwise); "" = not part
  # of a sweep.
  c.scale = ""
  c.experiment = ""  # the sweep's experiment file (mode=sweep reads its members)
  c.arg = ""  # the experiment file's arg this config came from
  c.models = ""  # mode=sweep: only these members' models, comma list ("" = all)
  c.sizes = ""  # mode=sweep: only these sizes, comma list ("" = all)
  c.probe = True  # mode=sweep: the offline probe suite on every final checkpoint
  c.report = True  # mode=sweep: write the scaling report at the end
  c.tokens_per_param = 0.0  # > 0: a sweep member trained on tokens_per_param x N tokens
  # Which parameters N counts: non_embedding (blocks + predictor / generator) | total | encoder.
  c.n_definition = "non_embedding"
  # JSON of fitted lr(C), B(C) laws (cbert_jax.report.grid fit); "shipped:<name>" = a fit shipped
  # in cbert_jax/scaling/fitted/ (cpu-bert, cpu-crossbert); "{model}" in it = the member's family
  # ("shipped:cpu-{model}": each family its own fit); "" = the published defaults (DeepSeek LLM's;
  # cbert_jax/scaling/laws.py says why).
  c.laws = ""
  c.law_axis = "compute"  # the laws' x: compute (training FLOPs) | params (N)
  c.batch_size = 0  # rows per step; 0 = from the batch-size law
  c.lr = 0.0  # peak LR; 0 = from the LR law
  c.lr_scale = 1.0  # multiplier on the law's LR (grid experiments)
  c.batch_multiple = 1  # round the law's batch to a multiple of this (data parallelism)
  # Devices the member is planned for (the compile check's mesh); 0 = what this machine has.
  c.target_devices = 0
  # The chip the member is planned for (a key of cbert_jax/scaling/chips.py:CHIPS: v4 v5e v5p
  # v6e a100 h100 h200 b200); "" = no memory plan.
  c.chip = ""
  # With sweep.chip: auto (the memory planner sets model.remat, model.ce_chunk and
  # optim.microbatches to the least costly setting that fits) | check (keep them; record the
  # verdict).
  c.memory = "auto"
  c.checkpoints = 10  # checkpoints per run (checkpoint_every = steps / this)
  c.evals = 20  # validation-loss evals per run (eval_every = steps / this)
  return c


def mesh() -> ml_collections.ConfigDict:
  """Device mesh sizes within a slice (ICI): one -1 fills the remaining devices."""
  return ml_collections.ConfigDict(dict(data=-1, fsdp=1, tensor=1))


def mesh_dcn() -> ml_collections.ConfigDict:
  """Device mesh sizes across slices or hosts (DCN)."""
  return ml_collections.ConfigDict(dict(data=1, fsdp=1, tensor=1))
