"""`--config.init_from=PATH`: start a run from trained weights (the inverse of `cbert_jax.export`).

PATH is one of
  a cbert_jax workdir      `W` (its newest checkpoint) or `W:step`; read by `run/trained.py`, the
                           one loader of a trained run (embed and export use it too);
  an export                a folder written by `python -m cbert_jax.export` (cbert_export.json,
                           model.safetensors in Llama's layout, tokenizer.model, with
                           --mlm_head BERT's MLM head in mlm_head.safetensors, with
                           --pretraining the rest of the training model in
                           pretraining.safetensors);
  a Hugging Face folder    config.json of a Llama model (model_type "llama") and model.safetensors
                           (or a sharded model.safetensors.index.json) holding a LlamaModel's state
                           dict, a bidirectional encoder; LlamaForCausalLM's "model." prefix is
                           accepted and its lm_head skipped.
The Llama names are mapped back with `llama.py`'s table (`llama.our_tensors`), so an export read
back gives the exported arrays bit for bit.

What is loaded: from a run of the same family, or its export with pretraining.safetensors,
every parameter the new model has (heads, predictor, generator included); from another family,
or from an export without that file or a Hugging Face folder, the encoder (ELECTRA's: the discriminator), plus BERT's MLM head from an export's
mlm_head.safetensors. The rest starts from the run's own random init (CrossBERT's predictor when
starting from BERT, ELECTRA's generator). The optimizer and the LR schedule always start fresh
(step 0, warm-up included). The tokenizer comes with the weights: the folder's tokenizer.model
(SentencePiece; a workdir's own copy), or `data.tokenizer_path` for a Hugging Face folder without
one; `data.vocab_size` must equal it (one line otherwise).

Only a run's step 0: a workdir that already has its own checkpoints resumes from them (a log line
says init_from was not applied), and its data is then read with the run's own tokenizer.model.

`check(config, workdir)` runs in the trainer's setup, before data preparation, and refuses a bad
source with one line naming `init_from` (a missing path, a folder of none of the three kinds, a
missing step, a tokenizer or vocabulary that does not match, the first tensor whose shape
differs). `data_config` is the data settings with that tokenizer. `apply(source, params, ...)` puts
the weights into the freshly initialised parameters, logs what was loaded and what is fresh
(tensors and parameters, counted from the trees) and returns the record config.json keeps under
"init_from".
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import ml_collections
from absl import logging

from cbert_jax import config_lib
from cbert_jax.errors import ConfigError
from cbert_jax.export import MANIFEST, PRETRAINING, llama

KINDS = ("workdir", "export", "hf")
WEIGHTS = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"
MLM_HEAD = "mlm_head.safetensors"  # an export's BERT MLM head ("lm_head.weight", [V, d])
TOKENIZER = "tokenizer.model"
KINDS_TEXT = (
  "a cbert_jax workdir (config.json of a run and checkpoints/), an export of "
  "`python -m cbert_jax.export` (cbert_export.json, model.safetensors) or a Hugging Face folder "
  "(config.json with model_type llama, model.safetensors)"
)


@dataclasses.dataclass(frozen=True)
class Source:
  """A checked `init_from`: where the weights are, what of them goes where."""

  spec: str  # init_from as given
  path: str  # the folder, absolute
  kind: str  # workdir | export | hf
  step: int | None  # workdir: the checkpoint read
  model_name: str  # the family that trained it ("" for a Hugging Face folder)
  tokenizer_path: str  # the SentencePiece model the run reads text with
  tokenizer_sha256: str
  loaded: tuple[str, ...] = ()  # our parameter names taken from the source
  shapes: dict = dataclasses.field(default_factory=dict)  # ... and their shapes (ours)
  unused: tuple[str, ...] = ()  # the source's tensors (our names) the new model does not take
  files: tuple[str, ...] = ()  # export / hf: the safetensors files holding the weights
  gone: bool = False  # the run's workdir has checkpoints and the source is gone (not checked)

  def describe(self) -> str:
    at = f" step {self.step}" if self.step is not None else ""
    family = f"{self.model_name}{at}" if self.model_name else "LlamaModel"
    return f"{self.kind} {self.path} ({family})"


# ------------------------------------------------------------------------------- checking ---
def check(config: ml_collections.ConfigDict, workdir: str) -> Source | None:
  """The checked source of a resolved config's `init_from` (None when it is unset).

  Reads only metadata (config.json, safetensors headers, checkpoint metadata, the tokenizer):
  no array. When `workdir` already has checkpoints the run resumes from them; the source is then
  checked only if it is still there, and the data is read with the workdir's tokenizer.model.

  Raises:
    ConfigError: one line naming `init_from` (or `data.tokenizer_path` / `data.vocab_size`).
  """
  spec = config.get("init_from", "")
  if not spec:
    return None
  path, step = config_lib.split_init_from(spec)
  path = os.path.abspath(path)
  resuming = _has_checkpoints(workdir)
  if resuming and not os.path.exists(path):
    tok = _own_tokenizer(workdir)
    if tok is not None:
      return Source(spec, path, "", step, "", tok.model_path, tok.sha256, gone=True)
  source = _check(config, spec, path, step)
  if resuming:
    tok = _own_tokenizer(workdir)
    if tok is not None:
      source = dataclasses.replace(
        source, tokenizer_path=tok.model_path, tokenizer_sha256=tok.sha256
      )
  return source


def _check(config, spec: str, path: str, step: int | None) -> Source:
  if not os.path.exists(path):
    raise ConfigError(f"init_from: no such file or directory {path!r}")
  if not os.path.isdir(path):
    raise ConfigError(f"init_from: {path} is a file; expected a folder: {KINDS_TEXT}")
  kind = _kind(path)
  if kind != "workdir" and step is not None:
    raise ConfigError(
      f"init_from: {spec}: ':{step}' picks a checkpoint of a cbert_jax workdir; {path} is "
      f"{'an export' if kind == 'export' else 'a Hugging Face folder'} (one set of weights)"
    )
  if kind == "workdir":
    model_name, step, theirs, numerics = _workdir_source(path, step)
    files = ()
  else:
    model_name, theirs, numerics, files = _llama_source(path, kind)
  tok = _tokenizer(config, path, kind)
  _check_vocab(config, path, tok, theirs)
  ours = _target_shapes(config, tok)
  loaded, unused = _plan(
    config.model_name, model_name, kind, ours, theirs, path, pretraining=PRETRAINING in files
  )
  _check_numerics(config, path, numerics)
  return Source(
    spec=spec,
    path=path,
    kind=kind,
    step=step,
    model_name=model_name,
    tokenizer_path=tok.model_path,
    tokenizer_sha256=tok.sha256,
    loaded=loaded,
    shapes={name: ours[name] for name in loaded},
    unused=unused,
    files=files,
  )


def _kind(path: str) -> str:
  """workdir | export | hf, or ConfigError when the folder is none of them."""
  has = lambda name: os.path.isfile(os.path.join(path, name))
  if has(MANIFEST) and has(WEIGHTS):
    return "export"
  body = None
  if has("config.json"):
    body = config_lib.init_config_json(path)
    if isinstance(body.get("config"), dict) and "model_name" in body["config"]:
      return "workdir"
    model_type = body.get("model_type")
    if model_type is not None and model_type != "llama":
      raise ConfigError(
        f"init_from: {path}/config.json describes a {model_type!r} model; only Llama-layout "
        "encoders (model_type llama, a LlamaModel's weights) can be loaded"
      )
    if model_type == "llama" and (has(WEIGHTS) or has(WEIGHTS_INDEX)):
      return "hf"
    if model_type == "llama":
      raise ConfigError(
        f"init_from: {path} has a Llama config.json but no {WEIGHTS} (or {WEIGHTS_INDEX}); "
        "only safetensors weights can be loaded"
      )
  raise ConfigError(f"init_from: {path} is none of: {KINDS_TEXT}")


def _workdir_source(path: str, step: int | None):
  """(model_name, step, {our name: shape}, numerics) of a workdir's checkpoint `step` (default:
  the newest), from its config.json and the checkpoint's metadata."""
  from cbert_jax.run import checkpoint as ckpt_lib  # pylint: disable=import-outside-toplevel
  from cbert_jax.run import trained  # pylint: disable=import-outside-toplevel

  try:
    record = trained.read_config(path)
  except ConfigError as e:
    raise ConfigError(f"init_from: {e}") from e
  cfg = record["config"]
  ckpt_dir = os.path.join(path, "checkpoints")
  steps = []
  if os.path.isdir(ckpt_dir):
    checkpointer = ckpt_lib.Checkpointer(ckpt_dir, int(cfg.get("keep_checkpoints", 2)))
    try:
      steps = sorted(checkpointer.all_steps())
      if step is None and steps:
        step = steps[-1]
      stored = checkpointer.stored_shapes(step, ("params",)) if step in steps else {}
    finally:
      checkpointer.close()
  if not steps:
    raise ConfigError(f"init_from: workdir {path} has no checkpoint; train it first")
  if step not in steps:
    raise ConfigError(
      f"init_from: workdir {path} has no checkpoint at step {step} (its steps: "
      f"{', '.join(map(str, steps))})"
    )
  theirs = {}
  for name, shape in stored.items():  # "params/encoder/.../value"
    name = name.removeprefix("params/").removesuffix("/value")
    theirs[name] = tuple(shape)
  model = cfg.get("model", {})
  numerics = {k: model[k] for k in ("norm_eps", "rope_theta") if k in model}
  return cfg["model_name"], int(step), theirs, numerics


def _llama_source(path: str, kind: str):
  """(model_name, {our name: Llama shape}, numerics, safetensors files) of an export or Hugging
  Face folder, from config.json and the safetensors headers (no array read)."""
  from safetensors import safe_open  # pylint: disable=import-outside-toplevel

  body = config_lib.init_config_json(path)
  _check_llama_config(path, body)
  model_name = ""
  if kind == "export":
    try:
      with open(os.path.join(path, MANIFEST), encoding="utf-8") as f:
        model_name = str(json.load(f).get("model_name", ""))
    except (OSError, ValueError, AttributeError) as e:
      raise ConfigError(f"init_from: cannot read {path}/{MANIFEST} ({e})") from e
  files = _weight_files(path)
  theirs: dict[str, tuple] = {}
  for file in files:
    try:
      with safe_open(os.path.join(path, file), "numpy") as f:
        for name in f.keys():
          shape = tuple(f.get_slice(name).get_shape())
          ours = _our_name(name, path, file)
          if ours is not None:
            theirs[ours] = shape
    except ConfigError:
      raise
    except Exception as e:  # pylint: disable=broad-except (safetensors raises its own types)
      raise ConfigError(f"init_from: cannot read {path}/{file} ({type(e).__name__}: {e})") from e
  if kind == "export" and os.path.isfile(os.path.join(path, PRETRAINING)):
    # the rest of the training model, in our names and layout (export --pretraining)
    with safe_open(os.path.join(path, PRETRAINING), "numpy") as f:
      for name in f.keys():
        theirs[name] = tuple(f.get_slice(name).get_shape())
    files = files + (PRETRAINING,)
  elif kind == "export" and os.path.isfile(os.path.join(path, MLM_HEAD)):
    with safe_open(os.path.join(path, MLM_HEAD), "numpy") as f:
      if "lm_head.weight" in f.keys():
        theirs["head/w"] = tuple(f.get_slice("lm_head.weight").get_shape())
    files = files + ((MLM_HEAD,) if "head/w" in theirs else ())
  numerics = {
    "norm_eps": body.get("rms_norm_eps", 1e-6),  # transformers' LlamaConfig defaults
    "rope_theta": config_lib.init_model_fields(body).get("rope_theta", 10000.0),
    "num_heads": body.get("num_attention_heads"),
    "head_dim": body.get("head_dim")
    or body.get("hidden_size", 0) // max(1, body.get("num_attention_heads", 1)),
  }
  return model_name, theirs, numerics, files


def _check_llama_config(path: str, body: dict) -> None:
  """ConfigError for a Llama config.json describing what our encoder block is not."""
  heads, kv = body.get("num_attention_heads"), body.get("num_key_value_heads")
  unsupported = []
  if kv is not None and kv != heads:
    unsupported.append(f"num_key_value_heads={kv} with num_attention_heads={heads} (grouped-query)")
  if body.get("hidden_act", "silu") != "silu":
    unsupported.append(f"hidden_act={body['hidden_act']!r} (SwiGLU needs silu)")
  for flag in ("attention_bias", "mlp_bias"):
    if body.get(flag):
      unsupported.append(f"{flag}=true")
  rope = body.get("rope_parameters") or body.get("rope_scaling") or {}
  rope_type = rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, dict) else None
  if rope_type not in ("default", None):
    unsupported.append(f"rope_type={rope_type!r} (plain RoPE only)")
  if unsupported:
    raise ConfigError(
      f"init_from: {path}/config.json: {unsupported[0]}; cbert_jax's encoder block is Llama's "
      "with one key/value head per query head, SwiGLU, no biases and plain RoPE"
    )
  if body.get("is_causal") is not False:
    logging.warning(
      "init_from: %s/config.json does not say is_causal: false; its weights are read as a "
      "bidirectional encoder (cbert_jax attends both ways)",
      path,
    )


def _weight_files(path: str) -> tuple[str, ...]:
  if os.path.isfile(os.path.join(path, WEIGHTS)):
    return (WEIGHTS,)
  name = os.path.join(path, WEIGHTS_INDEX)
  try:
    with open(name, encoding="utf-8") as f:
      files = sorted(set(json.load(f)["weight_map"].values()))
  except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
    raise ConfigError(f"init_from: cannot read {name} ({type(e).__name__}: {e})") from e
  missing = [f for f in files if not os.path.isfile(os.path.join(path, f))]
  if missing:
    raise ConfigError(f"init_from: {WEIGHTS_INDEX} lists {missing[0]}, which {path} lacks")
  return tuple(files)


def _our_name(name: str, path: str, file: str) -> str | None:
  """Our parameter name of the Llama tensor `name` (None: skipped); ConfigError for a tensor our
  encoder has no place for."""
  bare = name.removeprefix("model.")  # LlamaForCausalLM's state dict
  if any(bare == s or bare.endswith("." + s) for s in llama.NOT_ENCODER):
    return None
  ours = llama.our_name(bare)
  if ours is None:
    raise ConfigError(
      f"init_from: {path}/{file} holds {name}, which has no place in cbert_jax's encoder (a "
      "LlamaModel without biases); only a plain Llama-layout encoder can be loaded"
    )
  return ours


def _tokenizer(config, path: str, kind: str):
  """The SentencePiece tokenizer of the source (its tokenizer.model, else data.tokenizer_path);
  ConfigError when there is none or data.tokenizer_path names another one."""
  from cbert_jax.data import tokenizer as tokenizer_lib  # pylint: disable=import-outside-toplevel

  own = os.path.join(path, TOKENIZER)
  given = os.path.expanduser(config.data.tokenizer_path or "")
  if os.path.isfile(own):
    if kind == "workdir":
      from cbert_jax.run import workdir as workdir_lib  # pylint: disable=import-outside-toplevel

      try:  # checked against the sha256 its config.json records
        tok = workdir_lib.saved_tokenizer(path)
      except ConfigError as e:
        raise ConfigError(f"init_from: {e}") from e
    else:
      tok = tokenizer_lib.Tokenizer(own, field=f"init_from: {path}/{TOKENIZER}")
    if given:
      other = tokenizer_lib.Tokenizer(given, field="data.tokenizer_path")
      if other.sha256 != tok.sha256:
        raise ConfigError(
          f"data.tokenizer_path: {given} is not init_from's tokenizer ({own}); leave "
          "data.tokenizer_path empty: the tokenizer comes with the weights"
        )
    return tok
  if given:  # a Hugging Face folder (or an old workdir) without a SentencePiece model
    return tokenizer_lib.Tokenizer(given, field="data.tokenizer_path")
  raise ConfigError(
    f"init_from: {path} has no {TOKENIZER}; cbert_jax reads text with the SentencePiece model "
    "the weights were trained with (pad id 0 and a mask piece, as cbert_jax trains them): copy it there as "
    f"{TOKENIZER} or set --config.data.tokenizer_path"
  )


def _check_vocab(config, path: str, tok, theirs: dict) -> None:
  rows = theirs.get("encoder/embed/table", (None,))[0]
  if rows is not None and rows != tok.vocab_size:
    raise ConfigError(
      f"init_from: {path}: the embedding has {rows} rows but the tokenizer "
      f"({os.path.basename(tok.model_path)}) has {tok.vocab_size} pieces; the weights and the "
      "tokenizer do not belong together"
    )
  if config.data.vocab_size != tok.vocab_size:
    raise ConfigError(
      f"data.vocab_size={config.data.vocab_size}, but init_from's tokenizer has "
      f"{tok.vocab_size} pieces (its embedding the same rows); set "
      f"--config.data.vocab_size={tok.vocab_size}: the vocabulary comes with the weights"
    )


def _target_shapes(config, tok) -> dict[str, tuple]:
  """{our name: shape} of the model this config builds (abstract: nothing allocated), the encoder
  first in Llama's order (the embedding, the final norm, block by block), then the rest."""
  import jax  # pylint: disable=import-outside-toplevel

  from cbert_jax.step import sharding  # pylint: disable=import-outside-toplevel
  from cbert_jax.step.state import abstract_model  # pylint: disable=import-outside-toplevel

  model_cfg, mask_cfg = config_lib.build_model_configs(
    config, tok.vocab_size, tok.mask_id, tok.special_ids
  )
  mesh = sharding.make_mesh(
    ml_collections.ConfigDict({"data": -1, "fsdp": 1, "tensor": 1}), None, jax.local_devices()[:1]
  )
  rules = tuple(tuple(r) for r in config.sharding_rules)
  _, _, abs_params, _ = abstract_model(config.model_name, model_cfg, mask_cfg, mesh, rules)
  shapes = {name: tuple(leaf.shape) for name, leaf in _flat(abs_params)}
  encoder = [n for n in llama.name_table(model_cfg.num_layers) if n in shapes]
  return {n: shapes[n] for n in encoder} | shapes


def _plan(
  target: str,
  family: str,
  kind: str,
  ours: dict,
  theirs: dict,
  path: str,
  pretraining: bool = False,
):
  """(loaded, unused) our names; ConfigError naming the first tensor whose shape differs.

  The whole encoder must come from the source; from a run of the same family (a workdir, or an
  export with its pretraining.safetensors) everything else of the new model it holds too (anything
  else starts fresh)."""
  same_family = (kind == "workdir" or pretraining) and family == target
  llama_layout = kind != "workdir"
  offered = {k: v for k, v in theirs.items() if same_family or k.startswith("encoder/")}
  if llama_layout and not pretraining and "head/w" in theirs and target == "bert":
    offered["head/w"] = theirs["head/w"][::-1]  # lm_head [V, d] -> head/w [d, V]
  for name, shape in ours.items():  # in the model's order
    if not name.startswith("encoder/") and name not in offered:
      continue  # fresh
    want = llama.llama_shape(name, shape) if llama_layout and name.startswith("encoder/") else shape
    have = offered.get(name)
    if have is None or tuple(have) != tuple(want):
      raise ConfigError(
        f"init_from: {path} does not fit this config: the first tensor that differs is "
        f"{_describe(name, llama_layout)}: ours {list(want)}, theirs "
        f"{list(have) if have is not None else 'absent'}{_AS_STORED * llama_layout}; give the "
        "model the source's shape (--config.model.size=from_init)"
      )
  for name in offered:
    if name.startswith("encoder/") and name not in ours:
      raise ConfigError(
        f"init_from: {path} does not fit this config: the first tensor that differs is "
        f"{_describe(name, llama_layout)}: ours absent, theirs {list(offered[name])}"
        f"{_AS_STORED * llama_layout}; give the model the source's shape "
        "(--config.model.size=from_init)"
      )
  loaded = tuple(name for name in ours if name in offered)
  unused = tuple(name for name in theirs if name not in loaded)
  return loaded, unused


_AS_STORED = " (shapes as Llama stores them)"


def _describe(name: str, llama_layout: bool) -> str:
  """Our name, and Llama's where the source is in Llama's layout."""
  table_name = llama.name_table(_layers(name)).get(name) if name.startswith("encoder/") else None
  if llama_layout and name == "head/w":
    table_name = f"{MLM_HEAD} lm_head.weight"
  return f"{name} ({table_name})" if llama_layout and table_name else name


def _layers(name: str) -> int:
  parts = name.split("/")
  return int(parts[2]) + 1 if len(parts) > 2 and parts[1] == "blocks" else 0


def _check_numerics(config, path: str, numerics: dict) -> None:
  """The encoder's numbers that are not shapes: RMSNorm eps, RoPE base, heads (a Llama source:
  its q/k/v shapes do not show how they split into heads)."""
  m = config.model
  ours = {
    "norm_eps": float(m.norm_eps),
    "rope_theta": float(m.rope_theta),
    "num_heads": int(m.num_heads),
    "head_dim": int(m.head_dim or m.d_model // m.num_heads),
  }
  for name, theirs in numerics.items():
    if theirs is None:
      continue
    if (float if name in ("norm_eps", "rope_theta") else int)(theirs) != ours[name]:
      raise ConfigError(
        f"init_from: {path} has {name} {theirs}, this config model.{name}={ours[name]}; set "
        f"--config.model.{name}={theirs} or --config.model.size=from_init"
      )


def _has_checkpoints(workdir: str) -> bool:
  """Whether the run's workdir holds a checkpoint of its own (a step directory)."""
  try:
    names = os.listdir(os.path.join(workdir, "checkpoints"))
  except OSError:
    return False
  return any(n.isdigit() for n in names)


def _own_tokenizer(workdir: str):
  from cbert_jax.run import workdir as workdir_lib  # pylint: disable=import-outside-toplevel

  return workdir_lib.saved_tokenizer(workdir)


def data_config(config: ml_collections.ConfigDict, source: Source | None):
  """The run's data settings (`settings.data_config`), reading text with the source's tokenizer.
  (config.json keeps data.tokenizer_path as set; its "init_from" record names the tokenizer.)"""
  from cbert_jax.data import settings  # pylint: disable=import-outside-toplevel

  cfg = settings.data_config(config)
  if source is not None:
    cfg.tokenizer_path = source.tokenizer_path
  return cfg


# ------------------------------------------------------------------------------- loading ---
def apply(
  source: Source | None, params, *, workdir: str = "", resumed_step: int | None = None
) -> tuple[Any, dict | None]:
  """`params` (freshly initialised) with the source's weights in place; (params, the record for
  config.json). With `resumed_step` (the run resumed from its own checkpoint) nothing is loaded:
  a log line says so and the record is the one the run's config.json already holds."""
  if source is None:
    return params, None
  if resumed_step is not None:
    logging.info(
      "init_from %s not applied: the run resumed from its own checkpoint at step %d (init_from "
      "applies only to a run's step 0)",
      source.spec,
      resumed_step,
    )
    return params, _previous_record(workdir)
  if source.gone:
    raise ConfigError(
      f"init_from: no such file or directory {source.path!r}, and the run has no checkpoint "
      "left to resume from"
    )
  import jax  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel

  arrays = read_weights(source)
  loaded = set(source.loaded)

  def place(path, leaf):
    name = _name(path)
    if name not in loaded:
      return leaf
    value = np.asarray(arrays[name]).astype(leaf.dtype)
    assert value.shape == leaf.shape, (name, value.shape, leaf.shape)  # checked in `check`
    return jax.make_array_from_callback(leaf.shape, leaf.sharding, lambda index: value[index])

  params = jax.tree_util.tree_map_with_path(place, params)
  sizes = {name: int(np.prod(leaf.shape)) for name, leaf in _flat(params)}
  fresh = [n for n in sizes if n not in loaded]
  unused = {n: int(np.prod(np.shape(arrays[n]))) for n in source.unused if n in arrays}
  record = {
    "source": source.spec,
    "path": source.path,
    "kind": source.kind,
    "step": source.step,
    "model_name": source.model_name,
    "tokenizer": {"path": source.tokenizer_path, "sha256": source.tokenizer_sha256},
    "loaded": _summary(source.loaded, sizes),
    "fresh": _summary(fresh, sizes),
    "unused": _summary(list(unused), unused),
    "optimizer": "fresh: step 0, the LR schedule from its start (warm-up included)",
  }
  logging.info(
    "init_from: loaded %s from %s; the optimizer and LR schedule start fresh (step 0)",
    _counted(record["loaded"]),
    source.describe(),
  )
  logging.info("init_from: fresh (random init) %s", _counted(record["fresh"]))
  if unused:
    logging.info("init_from: not used from the source: %s", _counted(record["unused"]))
  return params, record


def read_weights(source: Source) -> dict:
  """{our name: host array, our layout} of the source's tensors."""
  import jax  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  from safetensors.numpy import load_file  # pylint: disable=import-outside-toplevel

  if source.kind == "workdir":
    from cbert_jax.run import trained  # pylint: disable=import-outside-toplevel

    run = trained.load(source.path, source.step, devices=jax.local_devices()[:1])
    return llama.flat_params(run.params)
  tensors, head, own = {}, None, {}
  for file in source.files:
    for name, value in load_file(os.path.join(source.path, file)).items():
      if file == PRETRAINING:
        own[name] = value  # already our names and layout
      elif file == MLM_HEAD:
        head = value.T if name == "lm_head.weight" else head  # [V, d] -> head/w [d, V]
      elif _our_name(name, source.path, file) is not None:
        tensors[name.removeprefix("model.")] = value
  encoder = {n: s for n, s in source.shapes.items() if n.startswith("encoder/")}
  out = llama.our_tensors(tensors, encoder)
  if head is not None:
    out["head/w"] = np.ascontiguousarray(head)
  return out | own


def _flat(tree):
  """(our name, leaf) of every array of a parameter tree ("encoder/blocks/0/attn/wq")."""
  import jax  # pylint: disable=import-outside-toplevel

  return [(_name(p), leaf) for p, leaf in jax.tree_util.tree_leaves_with_path(tree)]


def _name(path) -> str:
  keys = []
  for k in path:
    for attr in ("key", "idx", "name"):
      if hasattr(k, attr):
        keys.append(str(getattr(k, attr)))
        break
  if keys and keys[-1] == "value":  # an nnx.Param's value
    keys.pop()
  return "/".join(keys)


def _summary(names, sizes: dict) -> dict:
  """{"tensors", "parameters", "groups"} of the named tensors (`sizes`: name -> element count)."""
  names = list(names)
  groups = sorted({n.split("/")[0] for n in names})
  return {"tensors": len(names), "parameters": int(sum(sizes[n] for n in names)), "groups": groups}


def _counted(summary: dict) -> str:
  n = summary["tensors"]
  if not n:
    return "nothing"
  groups = ", ".join(summary["groups"])
  return f"{n} tensor{'s' * (n != 1)}, {summary['parameters']:,} parameters ({groups})"


def _previous_record(workdir: str) -> dict | None:
  """The "init_from" record of the run's config.json (kept when the run resumes)."""
  try:
    with open(os.path.join(workdir, "config.json"), encoding="utf-8") as f:
      return json.load(f).get("init_from")
  except (OSError, ValueError, AttributeError):
    return None
