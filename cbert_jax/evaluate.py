"""`run(config, workdir)` for `--config.mode=eval`: the suites of `evals.suites` on a workdir's
latest checkpoint (or, with `evals.init=random`, on a randomly initialised encoder: the floor).

Suites (`evaluators.registry.SUITES`): `offline` (the task kit, `evaluators.suite`), `glue`
(`evaluators.glue`, TFDS GLUE with the same probes), `mteb` (`evaluators.mteb_encoder`, the mteb
package's benchmark).
Writes `workdir/eval/<tag>.json` and `<tag>.md` for the offline suite and `<suite>-<tag>.json/.md`
for the others (tag = step_<N> or random_init, plus a short hash of the `evals` settings when they
differ from the defaults), and prints each table. Every suite's settings are checked before the
model is built. The predictor of CrossBERT is never used: the encoder alone reads unmasked input.
"""

import dataclasses
import hashlib
import json
import os

import jax
import ml_collections
from absl import logging
from flax import nnx

from cbert_jax import config_lib
from cbert_jax.data import prepare, settings
from cbert_jax.errors import ConfigError
from cbert_jax.evaluators import registry, suite
from cbert_jax.run import checkpoint as ckpt_lib
from cbert_jax.run import record as record_lib
from cbert_jax.run import trained
from cbert_jax.run import workdir as workdir_lib
from cbert_jax.step import sharding
from cbert_jax.step.state import abstract_model


def run(config: ml_collections.ConfigDict, workdir: str) -> dict:
  workdir = os.path.abspath(workdir)
  config = config_lib.resolve(config)
  devices = jax.devices()[: config.num_devices] if config.num_devices > 0 else jax.devices()
  config_lib.validate(config, len(devices))
  if config.evals.init not in ("checkpoint", "random"):
    raise ConfigError(f"evals.init must be checkpoint|random, got {config.evals.init!r}")
  suites = registry.selected(config.evals)
  suite.check_model(config.evals, config.model_name, config.model.num_layers)
  ckpt_dir = os.path.join(workdir, "checkpoints")
  checkpointer = (
    ckpt_lib.Checkpointer(ckpt_dir, config.keep_checkpoints)
    if config.evals.init == "checkpoint" and os.path.isdir(ckpt_dir)
    else None
  )
  step = checkpointer.latest_step() if checkpointer else None
  if checkpointer:
    checkpointer.close()  # the step is known; trained.restore reads it after data preparation
  if config.evals.init == "checkpoint" and step is None:
    raise ConfigError(
      f"mode=eval: no checkpoint in {workdir}/checkpoints; train first, or set "
      "evals.init=random to probe a randomly initialised encoder"
    )
  if checkpointer:
    check_trained_model(workdir, config)

  # The run's own tokenizer (saved in the workdir by the trainer); else rebuilt from the data config.
  tok = workdir_lib.saved_tokenizer(workdir) if checkpointer else None
  if tok is None:
    tok = prepare.prepare_once(settings.data_config(config), config.data.seq_len).tokenizer
  # The probe tasks the training corpus was not checked against are refused (suite.run).
  unchecked = suite.unchecked_tasks(record_lib.data_manifest(workdir)) if checkpointer else {}
  if "offline" in [s.name for s in suites]:  # the task datasets: process 0 builds, the rest wait
    wanted = [t for t in suite.task_names(config.evals) if t not in unchecked]
    prepare.first_on_process_0(
      lambda: prepare.prepare_tasks(wanted, config.data.cache_dir, warn=False), "probe tasks"
    )
  model_cfg, mask_cfg = config_lib.model_configs(
    config, tok.vocab_size, tok.mask_id, tok.special_ids
  )
  mesh = sharding.make_mesh(config.mesh, config.mesh_dcn, devices)
  rules = tuple(tuple(r) for r in config.sharding_rules)
  make_model, graphdef, abs_params, p_sh = abstract_model(
    config.model_name, model_cfg, mask_cfg, mesh, rules
  )
  with jax.set_mesh(mesh), nnx.logical_axis_rules(rules):
    if config.evals.init == "random":
      params = jax.jit(lambda k: nnx.state(make_model(k), nnx.Param), out_shardings=p_sh)(
        jax.random.key(config.seed)
      )
      tag = "random_init"
    else:
      step, graphdef, params = trained.restore(
        workdir, step, config, model_cfg, mask_cfg, mesh, rules
      )
      tag = f"step_{step}"

  # Non-default evals settings get their own files, so a subset run never overwrites the full suite.
  evals = config.evals.to_dict()
  if evals != config_lib.base_config().evals.to_dict():
    tag += "-" + hashlib.sha256(json.dumps(evals, sort_keys=True).encode()).hexdigest()[:8]
  title = f"{config.model_name} {config.model.size or ''} {tag} ({workdir})"
  out_dir = os.path.join(workdir, "eval")
  ctx = registry.Context(
    cache_dir=config.data.cache_dir,
    out_dir=out_dir,
    model_label=f"cbert_jax/{config.model_name}-{config.model.size or 'custom'}",
    tag=tag,
    mesh=mesh,
    rules=rules,
  )
  all_results, failed = {}, []
  for chosen in suites:
    name, file_tag = chosen.name, chosen.file_prefix + tag
    json_path = os.path.join(out_dir, f"{file_tag}.json")

    def save(results: dict, complete: bool, name=name, json_path=json_path) -> None:
      if jax.process_index() != 0:
        return
      record = {
        "tag": tag,
        "suite": name,
        "step": step,
        "model_name": config.model_name,
        "evals": evals,
        "complete": complete,
        "results": results,
      }
      _atomic_json(json_path, record)

    if name == "offline":  # saved after every task; a rerun reuses what was scored
      done = _scored_before(json_path, step, evals)
      if done:
        logging.info("%s: %d task(s) already scored at %s", json_path, len(done), tag)
      ctx = dataclasses.replace(
        ctx, unchecked=unchecked, done=done, on_task=lambda r, save=save: save(r, False)
      )
    results = chosen.run(graphdef, params, tok, config.evals, ctx)
    table = chosen.markdown(results, chosen.title + title)
    save(results, True)
    if jax.process_index() == 0:
      with open(os.path.join(out_dir, f"{file_tag}.md"), "w") as f:
        f.write(table + "\n")
    print(table, flush=True)
    logging.info("%s results written to %s", name, json_path)
    all_results[name] = results
    failed += [f"{task} ({r['failed']})" for task, r in results.items() if _failed(r)]
  if failed:
    raise EvalFailed(
      f"{len(failed)} task(s) failed: {'; '.join(failed)}. The other results are saved in "
      f"{out_dir}; rerun the same command to retry only the failed tasks"
    )
  # One suite (the usual case): its results, as before; several: {suite: results}.
  return all_results[suites[0].name] if len(suites) == 1 else all_results


class EvalFailed(RuntimeError):
  """Some tasks of an evaluation raised; the others' results are saved (main: exit status 1)."""


def _failed(result) -> bool:
  return isinstance(result, dict) and "failed" in result


def _scored_before(path: str, step, evals: dict) -> dict:
  """{task: result} of the tasks an earlier run of this same evaluation (same checkpoint step and
  `evals` settings) scored, read from its results file; {} when there is none."""
  try:
    with open(path) as f:
      record = json.load(f)
  except (OSError, ValueError):
    return {}
  same = json.loads(json.dumps(evals))  # as the file holds it (tuples are lists there)
  if not isinstance(record, dict) or record.get("step") != step or record.get("evals") != same:
    return {}
  results = record.get("results") or {}
  return {
    k: v
    for k, v in results.items()
    if k != "average" and isinstance(v, dict) and not suite.not_scored(v)
  }


def _atomic_json(path: str, record: dict) -> None:
  """Writes `record` as JSON to `path` via a temporary file and a rename (never half a file)."""
  os.makedirs(os.path.dirname(path), exist_ok=True)
  tmp = f"{path}.tmp-{os.getpid()}"
  with open(tmp, "w") as f:
    json.dump(record, f, indent=2)
  os.replace(tmp, path)


# Fields that decide the encoder's family and shapes, compared with the workdir's config.json.
MODEL_FIELDS = (
  "model_name",
  "model.d_model",
  "model.num_layers",
  "model.num_heads",
  "model.head_dim",
  "model.ffn_dim",
  "data.vocab_size",
)


def check_trained_model(workdir: str, config: ml_collections.ConfigDict) -> None:
  """ConfigError (before data preparation or any restore) when the workdir's run trained another
  model family or shape than `config` describes; silent when it has no readable config.json (the
  checkpoint's stored shapes are then checked before its arrays are read)."""
  trained = record_lib.config_or_none(workdir)
  if trained is None:
    return

  def get(tree, dotted):
    for part in dotted.split("."):
      tree = tree.get(part) if isinstance(tree, dict) else None
    return tree

  current = json.loads(config.to_json_best_effort())
  diffs = [
    f"{k} {get(trained, k)!r} (trained) vs {get(current, k)!r} (this config)"
    for k in MODEL_FIELDS
    if get(trained, k) is not None
    and get(current, k) is not None
    and get(trained, k) != get(current, k)
  ]
  if diffs:
    raise ConfigError(
      f"mode=eval: {workdir} holds a {trained.get('model_name')} "
      f"{get(trained, 'model.size') or ''} run (its config.json), not the model this config "
      f"describes: {'; '.join(diffs)}. Evaluate it with the config it was trained with (the same "
      "--config and --config.model_name / model.size)"
    )
