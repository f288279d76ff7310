"""A trained encoder read back from its workdir alone: `config.json`, `tokenizer.model`, a checkpoint.

`load(workdir)` is what export (`cbert_jax.export`) and embedding (`cbert_jax.embed`) start from:
no experiment file, no corpus, no data cache. The parameters are restored onto a data-parallel
mesh of the given devices (replicated: an encoder that is exported or embeds text fits on one
device; the training layout, e.g. FSDP over 64 chips, is not needed to read it).

Example:
  run = trained.load("runs/smoke")                       # the latest checkpoint
  rows = features.encode_texts(["a sentence"], run.tokenizer, 128)
  model = nnx.merge(run.graphdef, run.params)
  out = model.features(rows["tokens"], rows["positions"], rows["segment_ids"])  # {"final": [1, 128, d]}
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import jax
import ml_collections
from absl import logging
from flax import nnx

from cbert_jax import config_lib
from cbert_jax.errors import ConfigError
from cbert_jax.models.model_config import MaskConfig, ModelConfig
from cbert_jax.run import checkpoint as ckpt_lib
from cbert_jax.run import record as record_lib
from cbert_jax.run import workdir as workdir_lib
from cbert_jax.step import sharding
from cbert_jax.step.state import abstract_like, abstract_model


@dataclasses.dataclass
class Trained:
  """One trained run's encoder and everything needed to feed it text."""

  workdir: str  # absolute path of the run
  step: int  # the checkpoint's step
  config: ml_collections.ConfigDict  # the resolved config the run trained with (config.json)
  provenance: dict  # config.json's provenance (data manifest, versions, ...)
  record: dict  # the whole of config.json (param_counts, flops_per_token)
  model_cfg: ModelConfig
  mask_cfg: MaskConfig
  graphdef: Any  # nnx.GraphDef of the whole model (BERT/CrossBERT/ELECTRA)
  params: Any  # nnx.State of its parameters, replicated on `mesh`
  mesh: jax.sharding.Mesh
  rules: tuple  # logical-axis rules the params were placed with
  tokenizer: Any  # data.tokenizer.Tokenizer, the run's own

  @property
  def model_name(self) -> str:
    return self.config.model_name


def read_config(workdir: str) -> dict:
  """The workdir's config.json as a dict (`record.read_record`). ConfigError when it is missing or
  unreadable."""
  try:
    body = record_lib.read_record(workdir)
    if "model_name" not in body["config"]:  # not a run's record
      raise record_lib.ConfigFileError(workdir, KeyError("model_name"))
  except record_lib.ConfigFileError as e:
    if isinstance(e.cause, FileNotFoundError):
      raise ConfigError(
        f"workdir {workdir}: no config.json; expected the directory of a cbert_jax "
        "training run (--workdir of `python -m cbert_jax.main`)"
      ) from e
    raise ConfigError(
      f"workdir {workdir}: cannot read config.json ({type(e.cause).__name__}: {e.cause})"
    ) from e
  return body


def load(workdir: str, step: int | None = None, *, devices=None) -> Trained:
  """The encoder of `workdir` at checkpoint `step` (default: the latest readable one).

  Raises:
    ConfigError: no config.json / checkpoint / step `step`, or a tokenizer that is not the run's.
    CheckpointError: the checkpoint cannot be read.
  """
  workdir = os.path.abspath(workdir)
  record = read_config(workdir)
  config = ml_collections.ConfigDict(record["config"])
  tok = workdir_lib.saved_tokenizer(workdir)
  if tok is None:  # a run from before the tokenizer was kept in the workdir: rebuild it
    from cbert_jax.data import prepare, settings  # pylint: disable=import-outside-toplevel

    logging.warning(
      "workdir %s has no tokenizer.model; rebuilding the tokenizer from its data config", workdir
    )
    tok = prepare.prepare(settings.data_config(config), config.data.seq_len).tokenizer
  model_cfg, mask_cfg = config_lib.build_model_configs(
    config, tok.vocab_size, tok.mask_id, tok.special_ids
  )
  devices = list(devices) if devices is not None else jax.devices()
  mesh = sharding.make_mesh(
    ml_collections.ConfigDict({"data": -1, "fsdp": 1, "tensor": 1}), None, devices
  )
  rules = _tuples(config.sharding_rules)  # JSON gave lists; the rules resolver wants tuples
  step, graphdef, params = restore(workdir, step, config, model_cfg, mask_cfg, mesh, rules)
  return Trained(
    workdir=workdir,
    step=int(step),
    config=config,
    provenance=record.get("provenance", {}),
    record=record,
    model_cfg=model_cfg,
    mask_cfg=mask_cfg,
    graphdef=graphdef,
    params=params,
    mesh=mesh,
    rules=rules,
    tokenizer=tok,
  )


def restore(workdir: str, step: int | None, config, model_cfg, mask_cfg, mesh, rules):
  """(step, graphdef, params) of the run's checkpoint `step` (default: the latest), the
  parameters placed on `mesh` under `rules`. The one restore of a trained encoder: `load` (embed,
  export) and `--config.mode=eval` both read the checkpoint here.

  Raises:
    ConfigError: no checkpoints/ directory, no checkpoint, or no checkpoint at `step`.
    CheckpointError: the checkpoint cannot be read.
  """
  ckpt_dir = os.path.join(workdir, "checkpoints")
  if not os.path.isdir(ckpt_dir):
    raise ConfigError(f"workdir {workdir}: no checkpoints/ directory; train first")
  checkpointer = ckpt_lib.Checkpointer(ckpt_dir, int(config.keep_checkpoints))
  try:
    steps = sorted(checkpointer.all_steps())
    if not steps:
      raise ConfigError(f"workdir {workdir}: no checkpoint in checkpoints/; train first")
    if step is None:
      step = steps[-1]
    elif step not in steps:
      raise ConfigError(f"--step {step}: workdir {workdir} has checkpoints at steps {steps}")
    _, graphdef, abs_params, p_sh = abstract_model(
      config.model_name, model_cfg, mask_cfg, mesh, rules
    )
    with jax.set_mesh(mesh), nnx.logical_axis_rules(rules):
      params = checkpointer.restore_params(step, abstract_like(abs_params, p_sh))
  finally:
    checkpointer.close()
  return int(step), graphdef, params


def _tuples(x):
  return tuple(_tuples(v) for v in x) if isinstance(x, (list, tuple)) else x
