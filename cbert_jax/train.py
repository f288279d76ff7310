"""`run(config, workdir)`: one linear training function, readable top to bottom.

Sections: setup -> data -> mesh & abstract state -> init or restore -> compile -> loop (log,
checkpoint, eval) -> finish. Only process 0 writes files; every process runs the same code.
"""

import dataclasses
import math
import os
import signal
import threading
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import logging
from flax import nnx
from jax.experimental import multihost_utils

from cbert_jax import config_lib
from cbert_jax.data import fetch, pipeline, prepare
from cbert_jax.export import init_from
from cbert_jax.models import flops as flops_lib
from cbert_jax.run import checkpoint as ckpt_lib
from cbert_jax.run import (
  distributed,
  hardware,
  memory_fit,
  planned_devices,
  plotting,
  validation,
  wandb_logger,
  workdir_lock,
)
from cbert_jax.run import metrics as metrics_lib
from cbert_jax.run import progress as progress_lib
from cbert_jax.run import provenance as provenance_lib
from cbert_jax.run import workdir as workdir_lib
from cbert_jax.step import guard, sharding, steps
from cbert_jax.step import state as state_lib


class NonFiniteError(RuntimeError):
  """The loss or gradients became NaN/inf; the run stopped and kept its last good checkpoint."""


@dataclasses.dataclass
class Summary:
  """What `run` returns (tests and the sweep read it)."""

  final_step: int
  first_loss: float
  last_loss: float
  eval: dict
  num_traces: int
  stopped_early: bool
  workdir: str
  signal: str | None = None  # "SIGTERM" / "SIGINT" when a signal stopped the run (main: exit 130
  # for SIGINT)
  already_finished: bool = False  # the workdir's run had reached total_steps; nothing was done
  val_full: dict | None = None  # the end-of-run full-split validation record (validation.record)


def run(config: ml_collections.ConfigDict, workdir: str) -> Summary:
  """Train `config.model_name` as configured, in (or resuming from) `workdir`.

  SIGTERM (preemption) and SIGINT (Ctrl-C) are caught from the first line on, not only once the
  loop starts: one that arrives during data preparation or compilation still stops the run at its
  first step with a checkpoint. (jax.distributed installs its own preemption notifier, which would
  otherwise swallow SIGTERM.) A second Ctrl-C interrupts at once (KeyboardInterrupt).
  The workdir's lock (`workdir_lock`) is held from the setup checks to the end.
  """
  stop = {"signal": False, "name": None, "lock": None}

  def on_signal(signum, frame):  # preemption / Ctrl-C: finish the step, checkpoint, exit cleanly
    del frame
    stop["signal"], stop["name"] = True, signal.Signals(signum).name
    if signum == signal.SIGINT:  # the next Ctrl-C is not caught: a way out of a hung step
      signal.signal(signal.SIGINT, signal.default_int_handler)

  handled = (signal.SIGTERM, signal.SIGINT)
  previous = {s: signal.signal(s, on_signal) for s in handled} if _main_thread() else {}
  try:
    return _run(config, workdir, stop)
  finally:
    if stop["lock"] is not None:
      stop["lock"].release()
    for s, handler in previous.items():
      signal.signal(s, handler)


def _run(config: ml_collections.ConfigDict, workdir: str, stop: dict) -> Summary:
  """`run`'s body; `stop["signal"]` is set by the SIGTERM handler."""
  # ---------------------------------------------------------------- setup ---
  workdir = os.path.abspath(workdir)  # orbax needs absolute paths
  config, devices, source = _checked_setup(config, workdir, stop)  # source: init_from, checked
  is_primary = jax.process_index() == 0
  timers = progress_lib.Timers()

  if config.evals.every > 0:  # online probing (its modules are imported only then)
    from cbert_jax.evaluators import online
    from cbert_jax.evaluators import suite as eval_suite

  # ----------------------------------------------------------------- data ---
  with timers.span("data_prep"):
    # Process 0 first (and one builder per host), then the others read the cache; the online
    # probes' task datasets are prepared here too, so the probe step finds them built.
    probe_tasks = eval_suite.task_names(config.evals) if config.evals.every > 0 else ()
    data_cfg = init_from.data_config(config, source)  # init_from's tokenizer when it is set
    data = prepare.prepare_once(data_cfg, config.data.seq_len, probe_tasks)
  tok = data.tokenizer
  model_cfg, mask_cfg = config_lib.model_configs(
    config, tok.vocab_size, tok.mask_id, tok.special_ids
  )
  seq_len, batch_size = config.data.seq_len, config.batch_size
  logging.info(
    "data: %d train rows, %d val rows of %d tokens; vocab %d; manifest %s",
    pipeline.num_rows(data.train),
    pipeline.num_rows(data.val),
    seq_len,
    tok.vocab_size,
    data.manifest["hash"],
  )

  # ------------------------------------------------ mesh & abstract state ---
  st = state_lib.setup(config, model_cfg, mask_cfg, devices)  # allocates nothing
  mesh, rules, graphdef, guard_cfg = st.mesh, st.rules, st.graphdef, st.guard_cfg
  p_sh, rep, batch_sh = st.param_shardings, st.replicated, st.batch_sharding
  total_steps = config.total_steps
  counts = flops_lib.param_counts(config.model_name, model_cfg)
  flops_per_token = flops_lib.flops_per_token(config.model_name, model_cfg, mask_cfg, seq_len)
  tokens_per_step = batch_size * seq_len

  # -------------------------------------------------- init or restore -----
  checkpointer = ckpt_lib.Checkpointer(
    os.path.join(workdir, "checkpoints"), config.keep_checkpoints
  )
  rng = jax.random.key(config.seed)
  init_key, mask_key, eval_key = jax.random.split(rng, 3)
  train_iter = pipeline.train_iterator(
    data.train,
    global_batch=batch_size,
    seed=config.seed,
    process_index=jax.process_index(),
    process_count=jax.process_count(),
  )
  with jax.set_mesh(mesh), nnx.logical_axis_rules(rules):
    with timers.span("checkpoint"):  # the newest readable one (an unreadable one is moved aside)
      restored = checkpointer.restore_latest(
        st.abs_params, st.abs_opt_state, restart_from_scratch=config.restart_from_scratch
      )
    start_step = restored[0] if restored else 0
    if restored and start_step >= total_steps:  # a finished run, rerun: say so, change nothing
      return _finished(workdir, start_step, total_steps, checkpointer)
    if restored:
      _, params, opt_state, data_state, meta = restored
      train_iter.set_state(data_state)
      guard_state = guard.state_from_json(meta.get("guard"))
      logging.info("resumed from checkpoint at step %d", start_step)
    else:
      params, opt_state = state_lib.init(st, init_key)
      guard_state = guard.init_state()
    # init_from's weights in place of the random ones (step 0 only; a resumed run keeps its own)
    params, init_record = init_from.apply(
      source, params, workdir=workdir, resumed_step=start_step if restored else None
    )

  # W&B (config.wandb.project; None when off): the same rows as metrics.jsonl
  wandb_log = wandb_logger.open_logger(
    config,
    workdir,
    is_primary=is_primary,
    provenance={
      "non_embedding_params": counts.non_embedding,
      "flops_per_token": flops_per_token,
      "data_manifest_hash": data.manifest.get("hash"),
      "init_from": init_record,
    },
  )
  sinks = (wandb_log,) if wandb_log else ()
  writer = metrics_lib.MetricWriter(
    workdir, is_primary=is_primary, resume_step=start_step if restored else None, sinks=sinks
  )
  overview = provenance_lib.parameter_overview(params, include_stats=counts.total < 100_000_000)
  logging.info("parameters:\n%s", overview)
  logging.info(
    "analytic counts: %s; non-embedding N = %d; training FLOPs per data token = %.4g",
    counts,
    counts.non_embedding,
    flops_per_token,
  )
  peak, peak_source = hardware.run_peak(config.peak_flops, devices, model_cfg.compute_dtype)
  if is_primary:
    writer.write_text("parameters", overview)
    workdir_lib.save_tokenizer(workdir, tok.model_path)  # the workdir alone can be evaluated
    workdir_lib.write_config_json(
      workdir, config, data.manifest, counts, flops_per_token, peak, peak_source, init_record
    )

  # --------------------------------------------------------------- compile ---
  traces = []
  train_step = state_lib.jit_train_step(st, config.optim.microbatches, traces)
  eval_step = jax.jit(
    steps.make_eval_step(graphdef), in_shardings=(p_sh, batch_sh, rep), out_shardings=rep
  )
  abstract_batch = {
    k: jax.ShapeDtypeStruct((batch_size, seq_len), jnp.int32, sharding=batch_sh)
    for k in ("tokens", "positions", "segment_ids")
  }
  compiled, xla_flops = None, float("nan")
  if start_step < total_steps:  # none for total_steps=0 (init_from's weights saved as step 0)
    with jax.set_mesh(mesh), nnx.logical_axis_rules(rules), timers.span("compile"):
      compiled = train_step.lower(
        params, opt_state, guard_state, abstract_batch, jnp.int32(0), mask_key
      ).compile()
    xla_flops = _log_compiled(compiled, timers, flops_per_token * tokens_per_step)
  eval_rows = pipeline.eval_batches(
    data.val,
    global_batch=batch_size,
    num_batches=config.eval_batches,
    process_index=jax.process_index(),
    process_count=jax.process_count(),
  )

  def evaluate() -> dict:
    with timers.span("eval"), jax.set_mesh(mesh), nnx.logical_axis_rules(rules):
      return _eval_loss(eval_step, params, eval_rows, batch_sh, eval_key)

  def probe() -> dict:
    """The frozen-feature probe suite on the current parameters (config.evals), as metrics."""
    with timers.span("eval"), jax.set_mesh(mesh), nnx.logical_axis_rules(rules):
      res = eval_suite.run(
        graphdef,
        params,
        tok,
        config.evals,
        cache_dir=config.data.cache_dir,
        mesh=mesh,
        rules=rules,
        unchecked=eval_suite.unchecked_tasks(data.manifest),
      )
    return online.flatten(res)

  def full_validation(step: int) -> tuple[dict, dict]:
    """The full-split validation of the current parameters (`validation.in_run`): its record and
    the metrics of its row."""
    with timers.span("full_validation"):
      return validation.in_run(
        graphdef,
        params,
        data.val,
        mesh=mesh,
        rules=rules,
        batch_size=batch_size,
        model_name=config.model_name,
        workdir=workdir if is_primary else None,
        step=step,
        eval_loss=(config.eval_batches * batch_size, last_eval.get("eval/loss")),
        log=logging.info,
      )

  # ------------------------------------------------------------------ loop ---
  def save(step: int) -> None:
    """Checkpoint `step` (call `sync` first: only steps known to be finite are saved)."""
    with timers.span("checkpoint"):
      checkpointer.save(
        step,
        params,
        opt_state,
        {"next_index": data_index},
        {
          "step": step,
          "tokens_seen": step * tokens_per_step,
          "guard": guard.state_to_json(guard_state),
        },
      )

  # Per-step metrics stay on the device until the next sync (a log step, a checkpoint, the end):
  # one transfer then, not one per step. pending = [(step, device metrics, local batch, data index)].
  pending: list[tuple[int, dict, dict, int]] = []

  def sync() -> tuple[list[tuple[int, dict]], list[int]]:
    """Fetch the pending steps' metrics; stop on a non-finite step, report spikes.

    Returns ([(step, host metrics)], spike steps). Raises NonFiniteError naming the first
    non-finite step (its batch and gradient norms are saved to workdir/diagnostics/)."""
    fetched = jax.device_get([m for _, m, _, _ in pending])
    window = [(s, m) for (s, _, _, _), m in zip(pending, fetched)]
    batches = {s: b for s, _, b, _ in pending}
    pending.clear()
    found = guard.scan(window)
    _report_faults(
      found, dict(window), batches, workdir, is_primary, guard_cfg, writer, checkpointer
    )
    return window, found.spike_steps

  def rollback(bad_step: int, bad_index: int) -> int:
    """Restore the last checkpoint (or the initial state), with the data iterator moved past
    global batch `bad_index`; returns the step to continue from."""
    nonlocal params, opt_state, guard_state, writer, rollbacks
    rollbacks += 1
    if rollbacks > config.faults.max_rollbacks:
      raise NonFiniteError(
        f"loss spike at step {bad_step}: already rolled back "
        f"{config.faults.max_rollbacks} times (faults.max_rollbacks); stopped. "
        f"Diagnostics in {os.path.join(workdir, 'diagnostics')}"
      )
    back = checkpointer.latest_step()
    with timers.span("checkpoint"), jax.set_mesh(mesh), nnx.logical_axis_rules(rules):
      params, opt_state, guard_state = _last_good_state(checkpointer, back, st, init_key, source)
    train_iter.set_state({"next_index": bad_index + 1})
    writer.close()
    writer = metrics_lib.MetricWriter(workdir, is_primary=is_primary, resume_step=back, sinks=sinks)
    logging.warning(
      "rolled back from step %d to step %d; the data continues after the spike's "
      "batch (global batch %d)",
      bad_step,
      back or 0,
      bad_index,
    )
    return back or 0

  progress = progress_lib.Progress(total_steps, start_step)
  first_loss = last_loss = float("nan")
  last_eval: dict = {}
  val_full = None
  step = start_step
  data_index = int(train_iter.get_state()["next_index"])  # global batches consumed so far
  rollbacks = 0
  planted = guard.planted_batches(config.faults.plant_spike_batches)
  last_log_time, last_log_step = time.perf_counter(), start_step
  lost_at_last_log = _lost(timers)
  stopped_early = False
  try:
    while step < total_steps:
      with timers.span("data_wait"):
        local = next(train_iter)
        if data_index + 1 in planted:  # tests: a bad batch
          local = guard.corrupt(local, tok.vocab_size - 1)
        batch = sharding.global_batch(local, batch_sh)
      with jax.set_mesh(mesh):
        params, opt_state, guard_state, metrics = compiled(
          params, opt_state, guard_state, batch, jnp.int32(step), mask_key
        )
      step += 1
      data_index += 1
      pending.append((step, metrics, local, data_index - 1))

      is_log = step % config.log_every == 0 or step == total_steps or step == start_step + 1
      # One process acts on its own SIGTERM at once; several stop together at the next log step,
      # where they vote (a process that stopped alone would strand the others in a collective).
      stopping = (stop["signal"] and jax.process_count() == 1) or bool(
        config.stop_after_step and step == config.stop_after_step
      )
      saving = step % config.checkpoint_every == 0 and step < total_steps
      probing = config.evals.every and step % config.evals.every == 0
      evaluating = config.eval_every and step % config.eval_every == 0 and step < total_steps
      validating = (
        config.val_full_every and step % config.val_full_every == 0 and step < total_steps
      )
      if not (
        is_log or stopping or saving or probing or evaluating or validating or step == total_steps
      ):
        continue
      index_of = {s: i for s, _, _, i in pending}
      window, spikes = sync()  # the only host sync; raises on NaN/inf
      if spikes and guard_cfg.spike == "rollback":
        step = rollback(spikes[0], index_of[spikes[0]])
        data_index = index_of[spikes[0]] + 1
        progress = progress_lib.Progress(total_steps, step)
        last_log_time, last_log_step, lost_at_last_log = time.perf_counter(), step, _lost(timers)
        continue

      if is_log:
        step_time = time.perf_counter() - last_log_time - (_lost(timers) - lost_at_last_log)
        out = _log_row(
          window,
          len(spikes),
          step,
          steps_since_log=step - last_log_step,
          step_time=max(step_time, 1e-9),
          tokens_per_step=tokens_per_step,
          flops_per_token=flops_per_token,
          num_devices=len(devices),
          peak=peak,
          xla_flops=xla_flops,
        )
        out |= timers.as_metrics()  # time/<name>_s and _frac: compile, data_wait, checkpoint, eval
        if step == start_step + 1:  # the first step's time includes dispatch warm-up, not the rate
          for k in ("perf/tokens_per_sec", "perf/mfu", "perf/steps_per_sec"):
            out.pop(k)
        hardware.warn_implausible_mfu(out.get("perf/mfu", 0.0), peak_source)  # once per process
        if evaluating:
          last_eval = evaluate()
          out |= last_eval
        writer.write(step, out)
        progress.update(step)
        logging.info("%s", progress.format(step, out))
        if math.isnan(first_loss):
          first_loss = out["train/loss"]
        last_loss = out["train/loss"]
        last_log_time, last_log_step, lost_at_last_log = time.perf_counter(), step, _lost(timers)
        if jax.process_count() > 1:  # every process must agree to stop at the same step
          # The vote is read into its own variable: a SIGTERM that lands while the all-gather is
          # in flight stays in stop["signal"] for the next vote instead of being overwritten.
          voted = bool(multihost_utils.process_allgather(np.array(stop["signal"])).any())
          stop["voted"] = stop.get("voted", False) or voted
          stopping = stopping or voted

      elif evaluating:  # an eval step between log steps
        last_eval = evaluate()
        writer.write(step, last_eval | {"tokens_seen": step * tokens_per_step})

      if probing:
        writer.write(step, probe())
      if validating:  # the full-split loss during the run (the final one comes after the loop)
        _, extra = full_validation(step)
        writer.write(step, extra | {"tokens_seen": step * tokens_per_step})

      if stopping and step == total_steps:  # the last step: finish normally (final eval)
        stopping = False
      if stopping:
        why = (
          stop["name"] or "a signal on another process"
          if stop["signal"] or stop.get("voted")
          else "stop_after_step"
        )
        logging.warning("stopping at step %d (%s); saving a checkpoint", step, why)
        save(step)
        stopped_early = True
        break
      if saving:
        save(step)

    # ------------------------------------------------------------- finish ---
    if not stopped_early:
      last_eval = evaluate()
      logging.info("final eval at step %d: %s", step, last_eval)
      if checkpointer.latest_step() != step:
        save(step)
      final_row = dict(last_eval)
      try:
        if config.final_validation:  # after the last checkpoint: a failure here loses no training
          val_full, extra = full_validation(step)
          final_row |= extra
      finally:
        writer.write(step, final_row)  # the final eval row (with val_full/*): the last row
  finally:
    checkpointer.close()
    writer.close()
    if wandb_log:
      wandb_log.close()
  if is_primary and config.plot:
    _plot(workdir, config)
  logging.info("time outside the step: %s", {k: round(v, 2) for k, v in timers.totals().items()})
  return Summary(
    final_step=step,
    first_loss=first_loss,
    last_loss=last_loss,
    eval=last_eval,
    num_traces=len(traces),
    stopped_early=stopped_early,
    workdir=workdir,
    signal=stop["name"] if stopped_early and stop["signal"] else None,
    val_full=val_full,
  )


def _checked_setup(config: ml_collections.ConfigDict, workdir: str, stop: dict):
  """Everything checkable before data work: the same run on every process, the resolved config,
  the devices (a member planned for N chips trains on exactly N), the workdir's lock (one run per
  workdir; held in `stop["lock"]`) and its config.json, the online probes' task list, init_from's
  source (its path, kind, step, tokenizer and shapes). Returns (resolved config, devices, the
  checked init_from source or None)."""
  if jax.process_count() > 1:  # first, so a config bad on one process cannot strand the others
    distributed.check_same_run(config)
  config = config_lib.resolve(config)
  devices = jax.devices()[: config.num_devices] if config.num_devices > 0 else jax.devices()
  planned_devices.check(
    config.sweep.target_devices,
    len(devices),
    process_count=jax.process_count(),
    local_devices=jax.local_device_count(),
    platform=devices[0].platform,
    num_devices_flag=config.num_devices,
  )
  config_lib.validate(config, len(devices))
  # The memory plan's verdict on these devices (data.seq_len, batch_size vs memory), on every
  # backend: one line now rather than out of memory after data preparation.
  memory_fit.check(config, devices, jax.process_index())
  is_primary = jax.process_index() == 0
  # One run per workdir (a lock file; an unusable workdir is reported here, before data work).
  stop["lock"] = workdir_lock.lock_for_run(workdir, is_primary)
  # A workdir of a run with another config is refused here, before anything is written.
  workdir_lib.check_config(workdir, config, is_primary=is_primary)
  source = init_from.check(config, workdir)  # reads metadata only; None when unset
  if config.compilation_cache_dir:
    jax.config.update("jax_compilation_cache_dir", config.compilation_cache_dir)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
  if config.evals.every > 0:  # online probing: check the task list now, not after hours of training
    from cbert_jax.evaluators import suite as eval_suite

    eval_suite.task_names(config.evals)
    eval_suite.check_model(config.evals, config.model_name, config.model.num_layers)
  return config, devices, source


def _log_compiled(compiled, timers, analytic_flops_per_step: float) -> float:
  """Logs the compiled train step's time, XLA FLOPs and memory; returns XLA's FLOPs per step."""
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  xla_flops = float((cost or {}).get("flops", float("nan")))
  logging.info(
    "compiled train step in %.1fs; XLA FLOPs/step %.4g (analytic %.4g); memory: %s",
    timers.totals()["compile"],
    xla_flops,
    analytic_flops_per_step,
    compiled.memory_analysis(),
  )
  return xla_flops


def _report_faults(found, by_step, batches, workdir, is_primary, guard_cfg, writer, checkpointer):
  """Acts on `guard.scan`'s findings in one synced window: a WARNING (and diagnostics) per loss
  spike; NonFiniteError, after writing that step's row and diagnostics, on a non-finite step."""
  for k in found.spike_steps:
    where = (
      guard.save_diagnostics(workdir, k, f"loss spike ({guard_cfg.spike})", by_step[k], batches[k])
      if is_primary
      else "process 0's workdir"
    )
    logging.warning(
      "loss spike at step %d: loss %.4f, %.1f running stds above its mean (%s); "
      "batch and per-layer gradient norms in %s",
      k,
      by_step[k]["loss"],
      by_step[k]["loss_z"],
      {"warn": "kept the update", "skip": "update skipped", "rollback": "rolling back"}.get(
        guard_cfg.spike, "off"
      ),
      where,
    )
  if found.nonfinite_step is not None:
    k = found.nonfinite_step
    where = (
      guard.save_diagnostics(workdir, k, "non-finite", by_step[k], batches[k])
      if is_primary
      else "process 0's workdir"
    )
    writer.write(k, {f"train/{n}": float(v) for n, v in by_step[k].items() if n != "grad_sq"})
    writer.flush()
    last_good = checkpointer.latest_step()
    raise NonFiniteError(
      f"non-finite training metrics at step {k} (loss={by_step[k]['loss']}, grad_norm="
      f"{by_step[k]['grad_norm']}); stopped. The last good checkpoint is step {last_good} in "
      f"{os.path.join(workdir, 'checkpoints')}; the batch and per-layer gradient norms are in "
      f"{where}; lower optim.lr or model.init_scale and rerun"
    )


def _last_good_state(checkpointer, step: int | None, st, init_key, source):
  """(params, opt_state, guard_state) of checkpoint `step`, or the initial state (with init_from's
  weights when `source` is set) when None."""
  if step is not None:
    params, opt_state, _, meta = checkpointer.restore(step, st.abs_params, st.abs_opt_state)
    return params, opt_state, guard.state_from_json(meta.get("guard"))
  params, opt_state = state_lib.init(st, init_key)
  params, _ = init_from.apply(source, params)
  return params, opt_state, guard.init_state()


def _log_row(
  window,
  num_spikes: int,
  step: int,
  *,
  steps_since_log: int,
  step_time: float,
  tokens_per_step: int,
  flops_per_token: float,
  num_devices: int,
  peak: float,
  xla_flops: float,
) -> dict:
  """One log step's metrics row: the last step's train/* metrics, the window's spikes and skipped
  updates, tokens and FLOPs seen, throughput and MFU over `step_time` (the loop's time since the
  previous log step, eval and checkpoint time taken out)."""
  host = window[-1][1]
  tok_s = steps_since_log * tokens_per_step / step_time
  out = {
    f"train/{k}": float(v) for k, v in host.items() if k not in ("grad_sq", "spike", "skipped")
  }
  return out | {
    "train/spikes": float(num_spikes),  # since the previous log line
    "train/skipped": float(sum(m["skipped"] for _, m in window)),
    "tokens_seen": step * tokens_per_step,
    "flops_seen": step * tokens_per_step * flops_per_token,
    "perf/tokens_per_sec": tok_s,
    "perf/steps_per_sec": steps_since_log / step_time,
    "perf/mfu": hardware.mfu(tok_s * flops_per_token / num_devices, peak),
    "perf/peak_flops_per_device": peak,
    "perf/num_devices": num_devices,
    "perf/xla_flops_per_step": xla_flops,
  }


def _eval_loss(eval_step, params, eval_rows, batch_sh, eval_key) -> dict:
  """eval/loss and eval/masked_acc over the fixed validation batches (fixed mask keys), weighted
  by each batch's number of targets."""
  outs = [
    eval_step(params, sharding.global_batch(b, batch_sh), jax.random.fold_in(eval_key, i))
    for i, b in enumerate(eval_rows)
  ]
  outs = jax.device_get(outs)
  n = sum(o["num_targets"] for o in outs)
  return {
    f"eval/{k}": float(sum(o[k] * o["num_targets"] for o in outs) / max(n, 1))
    for k in ("loss", "masked_acc")
  }


def _plot(workdir: str, config: ml_collections.ConfigDict) -> None:
  """workdir/metrics.png. matplotlib's font cache goes to the data cache (not ~/.cache,
  ~/.config): a run writes only to its workdir and the cache."""
  plotting.plot_metrics(
    os.path.join(workdir, "metrics.jsonl"),
    os.path.join(workdir, "metrics.png"),
    mpl_cache_dir=os.path.join(fetch.resolve_cache_dir(config.data), "matplotlib"),
  )


def _finished(workdir: str, step: int, total_steps: int, checkpointer) -> Summary:
  """The Summary of a run whose checkpoint is at (or past) total_steps; nothing is written."""
  checkpointer.close()
  rows = metrics_lib.read_metrics(os.path.join(workdir, "metrics.jsonl"), missing_ok=True)
  losses = [r["train/loss"] for r in rows if "train/loss" in r]
  evals = [r for r in rows if "eval/loss" in r]
  last_eval = {k: v for k, v in evals[-1].items() if k.startswith("eval/")} if evals else {}
  logging.warning(
    "%s: this run already finished (checkpoint at step %d, total_steps=%d); nothing "
    "to do. Raise --config.total_steps to train further",
    workdir,
    step,
    total_steps,
  )
  return Summary(
    final_step=step,
    first_loss=losses[0] if losses else float("nan"),
    last_loss=losses[-1] if losses else float("nan"),
    eval=last_eval,
    num_traces=0,
    stopped_early=False,
    workdir=workdir,
    already_finished=True,
  )


def _lost(timers) -> float:
  """Seconds spent outside the train step in the loop (eval, checkpointing)."""
  t = timers.totals()
  return t.get("eval", 0.0) + t.get("checkpoint", 0.0)


def _main_thread() -> bool:
  return threading.current_thread() is threading.main_thread()
