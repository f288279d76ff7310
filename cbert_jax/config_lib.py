"""Configs: the defaults, `file.py:arg` parsing, derived fields, and validation with clear errors.

An experiment file (experiments/*.py) defines `get_config(arg: str | None) -> ConfigDict`, built on
`base_config()` and `parse_arg(arg, ...)`. `resolve` fills every derived field in one place (size ->
dims, predictor depth, default mask ratio); `validate` checks everything that can be checked before
any expensive work and raises `ConfigError` naming the field. The resolved config is written to
`workdir/config.json` by the trainer.
"""

import ast
import difflib
import importlib.util
import io
import json
import math
import os
import tokenize
import traceback

import ml_collections

from cbert_jax import config_groups
from cbert_jax.errors import ConfigError
from cbert_jax.models import NAMES as MODEL_NAMES
from cbert_jax.models import model_config as model_config_lib
from cbert_jax.models import sizes
from cbert_jax.models.model_config import MaskConfig, ModelConfig

# Default masking ratio per family: SPEC §2 (BERT 20%, CrossBERT 50%); ELECTRA's generator masks
# 15% (Clark et al., 2020).
DEFAULT_MASK_RATIO = {"bert": 0.2, "crossbert": 0.5, "electra": 0.15}
# The longest row the position scheme can tell apart: RoPE's angles are float32 position x
# frequency, and float32 holds every integer only up to 2^24 (models/layers.py `apply_rope`).
# Memory runs out far earlier on any device today; cbert_jax/run/memory_fit.py says so.
MAX_SEQ_LEN = 2**24


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
  """Every field a user sets, with its default and what it means (cbert_jax/config_groups.py, one
  builder per group). Experiment files override these."""
  c = config_groups.run()
  c.evals = config_groups.evals()  # frozen-feature probes
  c.model = config_groups.model()  # the encoder's shape, init and numerics
  c.masking = config_groups.masking()  # which tokens are predicted
  c.data = config_groups.data()  # corpus, split, tokenizer, cache
  c.faults = config_groups.faults()  # loss spikes and planted test faults
  c.optim = config_groups.optim()  # AdamW, clipping, schedule, accumulation
  c.wandb = config_groups.wandb()  # optional Weights & Biases logging
  c.sweep = config_groups.sweep()  # a scaling-sweep member's inputs
  c.mesh = config_groups.mesh()  # ICI mesh sizes; one -1 = fill
  c.mesh_dcn = config_groups.mesh_dcn()  # sizes across slices/hosts
  c.sharding_rules = config_groups.DEFAULT_RULES  # logical axis -> mesh axes
  return c


def check_fields(config: ml_collections.ConfigDict) -> None:
  """Raises ConfigError for a field `base_config` lacks or a value of the wrong type.

  ml_collections accepts both inside an experiment file: a new key (`c.batchsize = 64`, a typo)
  and None or a bool for a number. The derived record of a sweep member (`SWEEP_DERIVED`) is
  accepted only on a member (sweep.tokens_per_param > 0), where `resolve` computes it.
  """
  member = float(config.get("sweep", {}).get("tokens_per_param", 0) or 0) > 0
  _check_fields(config, base_config(), "", member)


def _check_fields(node, base, prefix: str, member: bool) -> None:
  for key in node.keys():
    path, value = prefix + key, node[key]
    if path.startswith("sweep.") and key in config_groups.SWEEP_DERIVED:
      if not member:
        raise ConfigError(derived_field(path))
      continue
    if key not in base:
      raise ConfigError(unknown_field(path))
    want = base[key]
    if isinstance(want, ml_collections.ConfigDict):
      if not isinstance(value, (ml_collections.ConfigDict, dict)):
        raise ConfigError(
          f"{path}: expected a group of fields ({', '.join(want.keys())}), got {value!r}"
        )
      _check_fields(value, want, path + ".", member)
    elif not _type_ok(value, want):
      raise ConfigError(f"{path}: expected {_type_name(want)}, got {value!r}")


def derived_field(path: str) -> str:
  """The message for setting a field that a sweep member's `resolve` derives."""
  what = config_groups.SWEEP_DERIVED[path.rsplit(".", 1)[-1]]
  return (
    f"{path} ({what}) is derived for a sweep member, not a setting: set its inputs "
    "(sweep.tokens_per_param, sweep.n_definition, sweep.laws, sweep.chip, ...) instead"
  )


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
  return f"unknown config field {path!r}{hint}; every field is listed in cbert_jax/config_groups.py"


# ------------------------------------------------------------------------- the command line ---
def import_experiment(path: str, *, field: str = "--config", needs=("get_config",)):
  """The experiment file `path` as a module (experiments/ is not a package): the one loader of
  experiment files (the CLI, the sweep runner, launch.sweep, launch.compile_check, the planner,
  hparam_grid.py). ConfigError naming `field` when the file is missing, does not import (with the
  file:line that raised, or of its SyntaxError, and the exception) or lacks a function of
  `needs`."""
  if not path or not os.path.isfile(path):
    raise ConfigError(f"{field}: no such experiment file {path!r}")
  name = "cbert_experiment_" + os.path.splitext(os.path.basename(path))[0]
  spec = importlib.util.spec_from_file_location(name, path)
  if spec is None or spec.loader is None:
    raise ConfigError(f"{field}: {path!r} is not a Python file")
  module = importlib.util.module_from_spec(spec)
  try:
    spec.loader.exec_module(module)
  except ConfigError:
    raise
  # A syntax error, an import that fails, a module body that raises (or calls sys.exit).
  except (Exception, SystemExit) as e:
    detail = _raised_in(e, path)
    named = detail.startswith(f"{path}:")  # `x.py:3 (...)` names the file already
    raise ConfigError(f"{field}: {'' if named else f'{path} '}does not load: {detail}") from e
  for fn in needs:
    if not callable(getattr(module, fn, None)):
      raise ConfigError(f"{field}: {path} has no {fn}()")
  return module


def load_config(spec: str) -> ml_collections.ConfigDict:
  """`experiments/x.py[:arg]` -> that file's `get_config(arg)`, its fields checked
  (`check_fields`). A `get_config` that raises gives a ConfigError naming `spec`, the file:line
  that raised and the exception; a ConfigError from it passes through as it is."""
  path, sep, arg = spec.partition(":")
  where = f"--config={spec}"
  module = import_experiment(path, field=where)
  try:
    config = module.get_config(arg) if sep else module.get_config()
  except ConfigError:
    raise
  except (Exception, SystemExit) as e:
    raise ConfigError(f"{where}: get_config failed: {_raised_in(e, path)}") from e
  if not isinstance(config, ml_collections.ConfigDict):
    raise ConfigError(f"{where}: get_config returned a {type(config).__name__}, not a ConfigDict")
  check_fields(config)
  return config


def _raised_in(e: BaseException, path: str) -> str:
  """`x.py:7 (c.total_steps = "300"): TypeError: ...`: where the experiment file `path` raised
  (its innermost line in the exception's traceback), the exception's type and message. A file
  that does not compile has no such frame: the SyntaxError's own file, line and message then
  (`x.py:3 (def get_config(:): SyntaxError: invalid syntax`), read from its attributes."""
  frames = [
    f
    for f in traceback.extract_tb(e.__traceback__)
    if os.path.abspath(f.filename) == os.path.abspath(path)
  ]
  if frames:
    where, lineno, text, message = path, frames[-1].lineno, frames[-1].line, _text(e)
  elif isinstance(e, SyntaxError) and e.lineno:
    where, lineno, text, message = e.filename or path, e.lineno, e.text, e.msg
  else:
    return f"{type(e).__name__}: {_text(e)}"
  source = _without_comment(text or "")
  return f"{where}:{lineno}{f' ({source})' if source else ''}: {type(e).__name__}: {message}"


def _text(e: BaseException) -> str:
  """The exception's message on one line (its `str`, which may itself raise)."""
  try:
    return " ".join(str(e).split())
  except Exception:  # pylint: disable=broad-except (a user's exception class)
    return "(its message cannot be printed)"


def _without_comment(line: str) -> str:
  """A source line without its trailing `# comment` (Python's tokenizer finds where it starts)."""
  try:
    for tok in tokenize.generate_tokens(io.StringIO(line.strip()).readline):
      if tok.type == tokenize.COMMENT:
        return line.strip()[: tok.start[1]].rstrip()
  except (tokenize.TokenError, SyntaxError):
    pass
  return line.strip()


def override(
  config: ml_collections.ConfigDict, path: str, text: str | None, where: str = ""
) -> None:
  """Sets the field at dotted `path` from its command-line text (`--config.PATH=TEXT`; None for a
  bare `--config.PATH`, true for a boolean field), parsed as the type `base_config` gives it.

  Raises ConfigError starting with `where` (default: the flag as typed) for an unknown or derived
  field and for text that does not parse as the field's type.
  """
  where = where or f"--config.{path}" + ("" if text is None else f"={text}")
  if path.startswith("sweep.") and path.split(".", 1)[1] in config_groups.SWEEP_DERIVED:
    raise ConfigError(f"{where}: {derived_field(path)}")
  want = dict(leaves(base_config())).get(path, _MISSING)
  if want is _MISSING:
    raise ConfigError(f"{where}: {unknown_field(path)}")
  value = _parse_value(text, want)
  if value is _MISSING:
    raise ConfigError(f"{where}: expected {_type_name(want)}, got {text!r}")
  *groups, leaf = path.split(".")
  node = config
  with config.unlocked():
    for name in groups:
      if name not in node:
        node[name] = ml_collections.ConfigDict()
      node = node[name]
    node[leaf] = value


_MISSING = object()
_TRUE, _FALSE = ("true", "t", "1"), ("false", "f", "0")  # as absl reads a boolean flag


def _parse_value(text: str | None, want):
  """`text` as the type of the default `want`, or _MISSING when it does not parse as one."""
  if isinstance(want, bool):
    text = "true" if text is None else text.strip().lower()
    return True if text in _TRUE else False if text in _FALSE else _MISSING
  if text is None:
    return _MISSING
  try:
    if isinstance(want, int):
      return int(text.strip(), 0)
    if isinstance(want, float):
      return float(text)
    if isinstance(want, (tuple, list)):
      value = ast.literal_eval(text)
      return tuple(value) if isinstance(value, (tuple, list)) else _MISSING
  except (ValueError, SyntaxError):
    return _MISSING
  return text


def is_bool_field(path: str) -> bool:
  """Whether the field at dotted `path` is a boolean (`--config.PATH` alone sets it)."""
  return isinstance(dict(leaves(base_config())).get(path), bool)


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
    if m.size == FROM_INIT:  # the shape of init_from's encoder, then an explicit shape
      _shape_from_init(config)
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


# model.size=FROM_INIT: the encoder's shape is read from init_from's config.json (`resolve`).
FROM_INIT = "from_init"
# The model fields FROM_INIT sets: (ours, the Llama config.json's name). The shape fields must be
# 0 (unset) or equal; the numerics are taken from the source.
_INIT_SHAPE = (
  ("d_model", "hidden_size"),
  ("num_layers", "num_hidden_layers"),
  ("num_heads", "num_attention_heads"),
  ("head_dim", "head_dim"),
  ("ffn_dim", "intermediate_size"),
)
_INIT_NUMERICS = (("norm_eps", "rms_norm_eps"), ("rope_theta", "rope_theta"))


def split_init_from(spec: str) -> tuple[str, int | None]:
  """`init_from`'s value as (folder, checkpoint step or None): "W:300" -> ("W", 300); a path that
  exists as written is taken whole (even with a colon in it)."""
  spec = os.path.expanduser(spec)
  path, sep, step = spec.rpartition(":")
  if sep and path and step.isdigit() and not os.path.exists(spec):
    return path, int(step)
  return spec, None


def init_config_json(spec: str, field: str = "init_from") -> dict:
  """The config.json of init_from's folder (a run's record or a Llama config) as a dict.
  ConfigError naming `field` when the folder or its config.json is missing or unreadable."""
  path, _ = split_init_from(spec)
  if not os.path.exists(path):
    raise ConfigError(f"init_from: no such file or directory {path!r}")
  name = os.path.join(path, "config.json")
  try:
    with open(name, encoding="utf-8") as f:
      body = json.load(f)
  except FileNotFoundError:
    raise ConfigError(f"{field}: {path} has no config.json to read the model from") from None
  except (OSError, ValueError) as e:
    raise ConfigError(f"{field}: cannot read {name} ({type(e).__name__}: {e})") from e
  if not isinstance(body, dict):
    raise ConfigError(f"{field}: {name} is not a JSON object")
  return body


def init_model_fields(body: dict) -> dict:
  """{d_model, num_layers, num_heads, head_dim, ffn_dim, norm_eps, rope_theta} of the encoder a
  config.json describes: a cbert_jax run's (its resolved `model` group) or a Llama config
  (head_dim and ffn_dim 0 where they are this codebase's defaults for that width). Missing
  entries are left out."""
  if isinstance(body.get("config"), dict):  # a cbert_jax run's config.json
    model = body["config"].get("model", {})
    return {k: model[k] for k, _ in _INIT_SHAPE + _INIT_NUMERICS if k in model}
  out = {ours: body[theirs] for ours, theirs in _INIT_SHAPE + _INIT_NUMERICS if theirs in body}
  rope = body.get("rope_parameters")
  if isinstance(rope, dict) and "rope_theta" in rope:  # transformers >= 5
    out["rope_theta"] = rope["rope_theta"]
  d, heads = out.get("d_model"), out.get("num_heads")
  if d and heads and out.get("head_dim") == d // heads:
    out["head_dim"] = 0
  if d and out.get("ffn_dim") == model_config_lib.ffn_size_for(d):
    out["ffn_dim"] = 0
  return out


def _shape_from_init(config: ml_collections.ConfigDict) -> None:
  """model.size=from_init: the encoder's shape and numerics from init_from's config.json, then
  model.size "" (config.json records the explicit shape). ConfigError when init_from is unset,
  unreadable, or a shape field set by hand differs from the source's."""
  m = config.model
  if not config.get("init_from"):
    raise ConfigError(
      f"model.size={FROM_INIT} needs init_from (the folder whose config.json gives the size)"
    )
  found = init_model_fields(init_config_json(config.init_from, field=f"model.size={FROM_INIT}"))
  missing = [k for k, _ in _INIT_SHAPE[:3] if not found.get(k)]
  if missing:
    raise ConfigError(
      f"model.size={FROM_INIT}: init_from {config.init_from}'s config.json does not give "
      f"{', '.join(missing)} (hidden_size, num_hidden_layers, num_attention_heads)"
    )
  for name, _ in _INIT_SHAPE:
    value = int(found.get(name) or 0)
    if m[name] and m[name] != value:
      raise ConfigError(
        f"model.{name}={m[name]} conflicts with model.size={FROM_INIT} (init_from's encoder "
        f"has {value}); leave model.{name} at 0"
      )
    m[name] = value
  for name, _ in _INIT_NUMERICS:
    if name in found:
      m[name] = float(found[name])
  m.size = ""


def validate(config: ml_collections.ConfigDict, num_devices: int) -> None:
  """Everything checkable before data preparation or compilation; raises ConfigError."""
  from cbert_jax.step import (  # local: imports jax, and config files should stay light
    guard,
    sharding,
  )

  check_fields(config)
  _check_wandb(config.wandb)
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
  if m.attention_impl not in ("auto", "xla", "cudnn", "splash"):
    raise ConfigError(
      f"model.attention_impl must be auto|xla|cudnn|splash, got {m.attention_impl!r}"
    )
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
    if name == "total_steps" and config[name] == 0 and config.init_from:
      continue  # only saves the loaded weights as checkpoint 0
    if config[name] <= 0:
      raise ConfigError(
        f"{name} must be positive, got {config[name]}"
        + (
          " (0 only with init_from: the loaded weights saved as step 0)"
          if name == "total_steps"
          else ""
        )
      )
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
  if d.seq_len > MAX_SEQ_LEN:
    raise ConfigError(
      f"data.seq_len must be at most {MAX_SEQ_LEN} (2^24: RoPE computes its angles from float32 "
      f"positions, which are exact only up to there), got {d.seq_len}"
    )
  guard.GuardConfig.from_config(config.faults)  # faults.* ranges and names
  guard.planted_batches(config.faults.plant_spike_batches)
  if config.faults.max_rollbacks < 0:
    raise ConfigError(f"faults.max_rollbacks must be >= 0, got {config.faults.max_rollbacks}")
  _check_optim(config.optim)
  from cbert_jax.data import settings  # pylint: disable=g-import-not-at-top (config files stay light)

  settings.check(settings.data_config(config))
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


def _check_wandb(w: ml_collections.ConfigDict) -> None:
  """The `wandb` group (cbert_jax/run/wandb_logger.py): its mode, W&B's rule for project names, and
  the package when a project is set (found, not imported: wandb is slow to import)."""
  if w.mode not in config_groups.WANDB_MODES:
    raise ConfigError(
      f"wandb.mode: {w.mode!r}; expected one of {', '.join(config_groups.WANDB_MODES)}"
    )
  if not w.project:
    return
  bad = [c for c in "/\\#?%:" if c in w.project]
  if bad:
    raise ConfigError(
      f"wandb.project: {w.project!r} contains {' '.join(bad)}; W&B project names may not "
      "contain / \\ # ? % :"
    )
  if importlib.util.find_spec("wandb") is None:
    raise ConfigError(
      f"wandb.project={w.project!r} needs the wandb package, which is not installed: "
      "pip install 'cbert_jax[wandb]'"
    )


def _check_optim(o: ml_collections.ConfigDict) -> None:
  """The optimiser's values that cannot train: a learning rate that is not a positive finite
  number (a negative one trains uphill with exit 0; NaN used to be caught only at step 2), betas
  outside [0, 1), negative warmup or weight decay, fractions outside [0, 1]."""

  def real(name: str) -> float:
    value = o[name]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
      raise ConfigError(f"optim.{name} must be a finite number, got {value!r}")
    return float(value)

  if real("lr") <= 0:
    raise ConfigError(f"optim.lr must be positive (the peak learning rate), got {o.lr}")
  if real("eps") <= 0:
    raise ConfigError(f"optim.eps must be positive, got {o.eps}")
  for name in ("b1", "b2"):
    if not 0 <= real(name) < 1:
      raise ConfigError(f"optim.{name} must be in [0, 1), got {o[name]}")
  for name, zero in (
    ("weight_decay", "off"),
    ("clip_norm", "off"),
    ("warmup_steps", "warmup_frac"),
  ):
    if real(name) < 0:
      raise ConfigError(f"optim.{name} must be >= 0 (0 = {zero}), got {o[name]}")
  for name in ("warmup_frac", "decay_frac", "final_lr_frac"):
    if not 0 <= real(name) <= 1:
      raise ConfigError(f"optim.{name} must be in [0, 1], got {o[name]}")
  if o.schedule not in ("wsd", "cosine", "constant"):
    raise ConfigError(f"optim.schedule must be wsd|cosine|constant, got {o.schedule!r}")
  if o.schedule == "wsd" and o.decay_shape not in ("linear", "cosine"):
    raise ConfigError(f"optim.decay_shape must be linear|cosine, got {o.decay_shape!r}")


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
  missing = [n for n, _ in config_groups.DEFAULT_RULES if n not in {r[0] for r in rules}]
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
