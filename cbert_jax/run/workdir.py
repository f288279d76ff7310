"""A workdir belongs to one run: resuming it with a different config is refused unless allowed.

`train.run` calls `check_config(workdir, config)` in its setup, before it writes anything to the
workdir and before data preparation or compilation. When `workdir/config.json` exists, its
`config` is compared with the current resolved config. Fields in `RESUMABLE` may change on resume
(how long, how often, on which devices, how it is computed); any other difference raises
ConfigError naming the workdir and the fields (old -> new), unless `allow_config_change` is set:
then the run goes on, logs a warning with the changes, and keeps the old file as
`config.previous-<k>.json` (the trainer then writes the new config.json).
Fields only one side has (added or removed by another version of the code) are not compared.

Only training resumes a workdir: `--config.mode=eval` (evaluate.py) reads checkpoints with any
`evals.*` settings and does not call this.
"""

import dataclasses
import json
import os
from typing import Any

import ml_collections
from absl import logging

from cbert_jax.errors import ConfigError
from cbert_jax.run import provenance as provenance_lib
from cbert_jax.run import record as record_lib

# Fields that may differ between config.json and a resuming run. A name ending in "." covers the
# whole group. Each leaves the model, the data, the optimizer and the masking as they were.
RESUMABLE = (
  "name",  # only the default workdir name
  "total_steps",  # extend (or shorten) a run; the LR schedule follows the new length
  "stop_after_step",  # where this invocation stops
  "log_every",
  "checkpoint_every",
  "keep_checkpoints",  # how often to log / checkpoint
  "eval_every",
  "eval_batches",
  "final_validation",  # the full-split validation loss at the end (cbert_jax/run/validation.py)
  "val_full_every",  # ... and during the run
  "evals.",  # evaluation during and after training
  "plot",  # metrics.png at the end
  "num_devices",
  "mesh.",
  "mesh_dcn.",
  "sharding_rules",  # resume on another machine or layout
  "compilation_cache_dir",
  "peak_flops",  # compile cache; the MFU denominator
  "mode",  # train | eval (only train resumes)
  "allow_config_change",  # this switch itself
  "restart_from_scratch",  # start over when every checkpoint was moved aside as damaged
  "faults.",  # spike policy and its planted test faults (cbert_jax/step/guard.py)
  "wandb.",  # where the metrics are also logged
  "model.remat",
  "model.ce_chunk",
  "model.attention_impl",  # same maths, other memory / kernel
  "model.fused_projections",  # the same parameters, concatenated per step
  "optim.microbatches",  # gradient accumulation: the same batch, masks and update
  "sweep.laws_source",  # the description of where LR and batch came from (not their values)
  "sweep.experiment",  # the file that listed the member, as invoked (absolute or relative path)
  "sweep.chip",
  "sweep.memory",
  "sweep.memory_",  # the memory plan (chip, setting, bytes)
  "data.cache_dir",
  "data.preprocess_workers",  # where the prepared data lives; workers
  "data.verify_cache",  # how thoroughly cache entries are checked on read
)

# Not compared: filled in after this check (the vocabulary from the tokenizer, which the data.*
# fields decide).
IGNORED = ("model.vocab_size",)

# How many changed fields the error message shows (the rest are counted).
MAX_SHOWN = 4


def check_config(
  workdir: str, config: ml_collections.ConfigDict, is_primary: bool = True
) -> list[str]:
  """Compares `config` with `workdir/config.json`; returns the changed non-resumable fields.

  Args:
    workdir: the run's directory; nothing is checked when it has no config.json.
    config: the resolved config of the run about to start.
    is_primary: process 0; only it keeps a copy of the old config.json when changes are allowed.

  Returns:
    The dotted names of the changed fields outside `RESUMABLE` (empty when none; non-empty only
    with `config.allow_config_change`).

  Raises:
    ConfigError: config.json is unreadable or differs outside `RESUMABLE`, and
      `config.allow_config_change` is False. Nothing is written then.
  """
  path = os.path.join(workdir, "config.json")
  if not os.path.exists(path):
    return []
  allowed = bool(config.get("allow_config_change", False))
  override = (
    "use another --workdir for a new run, or set --config.allow_config_change=true to "
    "resume with the new config"
  )
  try:
    saved = record_lib.read_config(workdir)
  except record_lib.ConfigFileError as err:
    e = err.cause  # the error reading it, as the message names it
    if not allowed:
      raise ConfigError(
        f"workdir {workdir}: cannot read its config.json ({type(e).__name__}: "
        f"{e}), so it cannot be checked against this config; {override}"
      ) from e
    logging.warning(
      "allow_config_change: %s is unreadable (%s); resuming without comparing", path, e
    )
    _keep_copy(path, is_primary)
    return []
  old, new = _flatten(saved), _flatten(json.loads(config.to_json_best_effort()))
  # masking.cms: older versions recorded True for BERT and ELECTRA too, which ignore it.
  ignored = IGNORED + (("masking.cms",) if config.model_name != "crossbert" else ())
  changed = [k for k in sorted(old.keys() & new.keys()) if old[k] != new[k] and k not in ignored]
  blocking = [k for k in changed if not _resumable(k)]
  free = [k for k in changed if _resumable(k)]
  if free:
    logging.info("resuming %s with changed %s", workdir, _describe(free, old, new, len(free)))
  if not blocking:
    return []
  if not allowed:
    raise ConfigError(
      f"workdir {workdir} holds a run with a different config (config.json): "
      f"{_describe(blocking, old, new)}; rerun with its config to resume, "
      f"{override}"
    )
  logging.warning(
    "allow_config_change: resuming %s with a changed config: %s",
    workdir,
    _describe(blocking, old, new, len(blocking)),
  )
  _keep_copy(path, is_primary)
  return blocking


def _resumable(key: str) -> bool:
  return any(key == r or (r.endswith(".") and key.startswith(r)) for r in RESUMABLE)


def _flatten(tree: dict, prefix: str = "") -> dict[str, Any]:
  out = {}
  for key, value in tree.items():
    if isinstance(value, dict):
      out |= _flatten(value, f"{prefix}{key}.")
    else:
      out[prefix + key] = value
  return out


def _describe(keys: list[str], old: dict, new: dict, limit: int = MAX_SHOWN) -> str:
  shown = ", ".join(f"{k} {old[k]!r} -> {new[k]!r}" for k in keys[:limit])
  return shown + (f" (and {len(keys) - limit} more)" if len(keys) > limit else "")


def _keep_copy(path: str, is_primary: bool) -> None:
  """Copy config.json to config.previous-<k>.json (unless an identical copy exists)."""
  if not is_primary:
    return
  with open(path, "rb") as f:
    data = f.read()
  k = 1
  while os.path.exists(copy := os.path.join(os.path.dirname(path), f"config.previous-{k}.json")):
    with open(copy, "rb") as f:
      if f.read() == data:
        return
    k += 1
  with open(copy, "wb") as f:
    f.write(data)
  logging.warning("the workdir's previous config.json is kept as %s", copy)


# The run's SentencePiece model, copied into the workdir by the trainer so the workdir alone is
# enough to evaluate, embed or export its encoder (no corpus or data cache needed).
TOKENIZER = "tokenizer.model"


def save_tokenizer(workdir: str, model_path: str) -> None:
  """Copies the tokenizer file to `workdir/tokenizer.model` (atomically; a no-op when an identical
  copy is there). A different file already there is kept aside as `tokenizer.previous-<k>.model`
  (a run resumed with `allow_config_change` across a data change), never overwritten in place."""
  from cbert_jax.data import cache_entry  # data helpers; kept out of the light import path

  dest = os.path.join(workdir, TOKENIZER)
  with open(model_path, "rb") as f:
    proto = f.read()
  if os.path.isfile(dest):
    with open(dest, "rb") as f:
      if f.read() == proto:
        return
    k = 1
    while os.path.exists(os.path.join(workdir, f"tokenizer.previous-{k}.model")):
      k += 1
    os.replace(dest, os.path.join(workdir, f"tokenizer.previous-{k}.model"))
    logging.warning("the workdir's previous tokenizer is kept as tokenizer.previous-%d.model", k)
  cache_entry.atomic_write(dest, proto)


def saved_tokenizer(workdir: str):
  """The tokenizer the workdir's run trained with (`data.tokenizer.Tokenizer`), or None when the
  workdir has no `tokenizer.model` (a run from before it was saved there).

  Raises:
    ConfigError: the file is not a usable SentencePiece model, or its sha256 differs from the one
      `config.json` records for the run's data (the file was replaced or damaged).
  """
  from cbert_jax.data import tokenizer as tokenizer_lib

  path = os.path.join(workdir, TOKENIZER)
  if not os.path.isfile(path):
    return None
  tok = tokenizer_lib.Tokenizer(path, field=f"workdir {workdir}: {TOKENIZER}")
  recorded = record_lib.data_manifest(workdir).get("tokenizer")
  recorded = recorded.get("sha256") if isinstance(recorded, dict) else None
  if recorded and recorded != tok.sha256:
    raise ConfigError(
      f"workdir {workdir}: {TOKENIZER} has sha256 {tok.sha256[:12]}..., but config.json records "
      f"the run's tokenizer as {recorded[:12]}...; the file was replaced or damaged. Restore it "
      "from the data cache (<cache_dir>/tokenizers/) or delete it to rebuild from the data config."
    )
  return tok


def write_config_json(
  workdir, config, manifest, counts, flops_per_token, peak, peak_source, init_from=None
):
  """workdir/config.json: the resolved config, provenance (code, versions, devices, data
  manifest, peak FLOP/s), parameter counts, training FLOPs per token and, for a run started with
  `init_from`, what was loaded from where and what started fresh (cbert_jax/export/init_from.py)."""
  provenance = provenance_lib.provenance(
    {
      "data_manifest_hash": manifest["hash"],
      "data_manifest": manifest,
      "peak_flops": peak,
      "peak_source": peak_source,
    }
  )
  with open(os.path.join(workdir, "config.json"), "w") as f:
    json.dump(
      {
        "config": json.loads(config.to_json_best_effort()),
        "provenance": provenance,
        "param_counts": dataclasses.asdict(counts) | {"non_embedding": counts.non_embedding},
        "flops_per_token": flops_per_token,
        **({"init_from": init_from} if init_from else {}),
      },
      f,
      indent=2,
    )
