"""Multi-process runs: join the other processes within a deadline, check they fit together, and
stop with one line when one of them dies.

`initialize` wraps `jax.distributed.initialize`. When a process never joins, JAX (0.10.2) neither
raises nor returns: after `initialization_timeout` its C++ client aborts the process with a
misleading "another task died" check failure. So a watchdog thread prints one line naming this
process and what it waited for, and exits with `EXIT_CODE` before JAX's own deadline. The
watchdog also covers the first device-topology exchange, the other start-up step that waits for
every process.

`check_same_run` then compares hashes of the code (the cbert_jax package's .py files) and of the
config over all processes. Every process gathers the same hashes and raises the same
`DistributedError`, so none is left waiting in a collective for a process that stopped.

A process that dies later is `peer_watch.py`'s: `initialize` installs its watch, so the others
print one line and exit with `EXIT_CODE` too.
"""

import hashlib
import json
import math
import os
import threading
import time

import jax
import ml_collections
import numpy as np
from absl import logging
from jax._src import distributed as _jax_distributed  # the coordinator's address once joined
from jax.experimental import multihost_utils

from cbert_jax.run import peer_watch
from cbert_jax.run.peer_watch import DEFAULT_PEER_TIMEOUT_S, PEER_TIMEOUT_ENV

EXIT_CODE = peer_watch.EXIT_CODE  # exit status of every failure here and in peer_watch.py
PER_PROCESS_FIELDS = ()  # config fields that may differ between processes (none today)
_JAX_TIMEOUT_GRACE_S = 30  # JAX's own init deadline is later than ours: our message comes first
_WORDS = 4  # 128-bit hashes, as int32 words


class DistributedError(RuntimeError):
  """The processes of a multi-process run do not fit together; the message names the process."""


def initialize(
  coordinator_address: str | None = None,
  num_processes: int | None = None,
  process_id: int | None = None,
  timeout_s: float = 300,
  peer_timeout_s: float | None = None,
) -> None:
  """`jax.distributed.initialize` + device discovery, or one line on stderr and exit after timeout_s.

  With all three of coordinator_address, num_processes and process_id None, JAX detects them
  (TPU pods, SLURM, Open MPI). Raises DistributedError for arguments JAX rejects and when
  not every expected process is present once connected. From here to the end of the process, a
  process that dies or stops responding for peer_timeout_s (None: `peer_timeout()`) makes every
  other process print one "distributed error:" line and exit with EXIT_CODE (module docstring).
  """
  start = time.monotonic()
  peer_timeout_s = peer_timeout(peer_timeout_s)
  who = (
    f"process {process_id} of {num_processes}"
    if num_processes is not None
    else "this process (auto-detected cluster)"
  )
  where = coordinator_address or "the auto-detected coordinator"
  stage = {"name": "connect"}

  def timeout_message() -> str:
    waited = f"waited {time.monotonic() - start:.0f} s"
    hint = (
      (
        f"check that every process was started with the same --num_processes={num_processes} "
        f"and --coordinator_address={where}, and --process_id 0..{(num_processes or 1) - 1} "
        "once each"
      )
      if num_processes is not None
      else "check the cluster environment"
    )
    if stage["name"] == "devices":
      return (
        f"{who} joined the coordinator at {where} but {waited} for every process to "
        f"report its devices: a process stopped during start-up (see its log); {hint}"
      )
    if process_id == 0:
      missing = (
        "process 1" if num_processes == 2 else f"one or more of processes 1..{num_processes - 1}"
      )
      return (
        f"{who} {waited} at the coordinator {where} (hosted by this process) for the "
        f"others to join; missing: {missing}; {hint}"
      )
    if process_id is None:
      return f"{who} {waited} for the other processes to join at {where}; {hint}"
    missing = "process 0" if num_processes == 2 else "process 0 or one of the others"
    return (
      f"{who} {waited} for the coordinator at {where} (process 0) and the other "
      f"processes; missing: {missing} (or {where} is not reachable from here); {hint}"
    )

  watchdog = _Watchdog(timeout_s, timeout_message)
  peer_watch.PEERS.watch(process_id, num_processes, coordinator_address, peer_timeout_s)
  try:
    try:
      with peer_watch.heartbeat_callback(peer_watch.PEERS.on_missed_heartbeat):
        jax.distributed.initialize(
          coordinator_address,
          num_processes,
          process_id,
          initialization_timeout=int(math.ceil(timeout_s)) + _JAX_TIMEOUT_GRACE_S,
          heartbeat_timeout_seconds=int(math.ceil(peer_timeout_s)),
        )
    except (ValueError, RuntimeError) as e:
      hint = (
        ""
        if num_processes is not None
        else " (no TPU pod, SLURM or Open MPI environment found? "
        "pass --coordinator_address, --num_processes and --process_id)"
      )
      detail = peer_watch.one_line(e)
      if "bad_cast" in detail:  # from JAX's error callback (module docstring); logged above
        detail = "the coordination service refused this process (its error is logged above)"
      raise DistributedError(f"{who}: jax.distributed.initialize failed: {detail}{hint}") from e
    stage["name"] = "devices"
    try:
      jax.devices()  # the first backend use exchanges device topologies with every process
    except RuntimeError as e:
      raise DistributedError(f"{who}: device discovery failed: {peer_watch.one_line(e)}") from e
  finally:
    watchdog.cancel()
  peer_watch.PEERS.joined(
    jax.process_index(), jax.process_count(), _jax_distributed.global_state.coordinator_address
  )
  check_all_present(num_processes)
  logging.info(
    "distributed: process %d of %d, %d local of %d devices, coordinator %s, %.1f s",
    jax.process_index(),
    jax.process_count(),
    jax.local_device_count(),
    jax.device_count(),
    where,
    time.monotonic() - start,
  )


def check_all_present(num_processes: int | None) -> None:
  """Raise DistributedError (on every process alike) unless every process and device joined.

  The coordinator (process 0) fixes the process count, so a process started with another
  --num_processes may still connect: each one's expectation is gathered and compared.
  """
  count = jax.process_count()
  mine = np.array([num_processes or count, jax.local_device_count()], np.int32)
  table = np.asarray(multihost_utils.process_allgather(mine)).reshape(count, 2)
  problems = [
    f"process {p} was started with --num_processes={n}, but {count} processes joined"
    for p, n in enumerate(table[:, 0])
    if n != count
  ]
  local = table[:, 1]
  if int(local.sum()) != jax.device_count():
    per_process = ", ".join(f"process {p}: {n}" for p, n in enumerate(local))
    problems.append(
      f"the processes' local devices ({per_process}) sum to {int(local.sum())}, but "
      f"the global device count is {jax.device_count()}"
    )
  if problems:
    raise DistributedError("; ".join(problems))


def check_same_run(config: ml_collections.ConfigDict) -> None:
  """Raise DistributedError (on every process alike) unless all run the same code and config.

  Collective: every process must call it. The error names each process that differs from
  process 0 and whether its code or config differs; for the config, also the fields.
  """
  code, conf, fields = code_hash(), *config_hashes(config)
  names = sorted(fields)
  head = np.concatenate([_words(code), _words(conf), _words(_sha("\n".join(names)))])
  heads = np.asarray(multihost_utils.process_allgather(head)).reshape(jax.process_count(), -1)
  field_hashes = None
  w = _WORDS
  code_same = (heads[:, :w] == heads[0, :w]).all(axis=1)
  conf_same = (heads[:, w : 2 * w] == heads[0, w : 2 * w]).all(axis=1)
  names_same = (heads[:, 2 * w :] == heads[0, 2 * w :]).all(axis=1)
  if not conf_same.all() and code_same.all() and names_same.all():  # same decision on every process
    mine = np.array([_words(fields[n])[0] for n in names], np.int32)
    field_hashes = np.asarray(multihost_utils.process_allgather(mine)).reshape(len(heads), -1)
  message = mismatch_message(code_same, conf_same, names_same, field_hashes, names)
  if message:
    raise DistributedError(message)
  logging.info(
    "distributed: all %d processes run the same code (%s) and config (%s)",
    len(heads),
    code[:12],
    conf[:12],
  )


def mismatch_message(
  code_same: np.ndarray,
  conf_same: np.ndarray,
  names_same: np.ndarray,
  field_hashes: np.ndarray | None,
  names: list[str],
) -> str:
  """The error for the processes' comparison with process 0 ("" when all agree).

  Args: per process, whether its code hash, config hash and config field names equal process
  0's ([P] bool each); the per-field hashes [P, F] (None when not comparable); the F field names.
  """
  parts = []
  for p in range(1, len(code_same)):
    what = []
    if not code_same[p]:
      what.append(
        "its code (the cbert_jax/*.py files) differs from process 0's; run the same "
        "checkout everywhere"
      )
    if not conf_same[p]:
      if field_hashes is not None:
        diff = [n for n, a, b in zip(names, field_hashes[p], field_hashes[0]) if a != b]
        what.append(f"its config differs from process 0's in: {', '.join(diff)}")
      elif not names_same[p]:
        what.append("its config has different fields from process 0's")
      else:
        what.append("its config differs from process 0's")
    if what:
      parts.append(f"process {p}: " + "; ".join(what))
  if not parts:
    return ""
  return (
    f"{len(code_same)} processes do not run the same thing: "
    + ". ".join(parts)
    + ". Start every process with the same code, --config and --config.* flags"
  )


def code_hash() -> str:
  """sha256 over the cbert_jax package's .py files (relative path and bytes), sorted by path."""
  root = os.path.dirname(os.path.abspath(__file__))
  paths = sorted(
    os.path.relpath(os.path.join(d, f), root)
    for d, _, files in os.walk(root)
    for f in files
    if f.endswith(".py")
  )
  h = hashlib.sha256()
  for rel in paths:
    with open(os.path.join(root, rel), "rb") as f:
      h.update(rel.encode() + b"\0" + f.read() + b"\0")
  return h.hexdigest()


def config_hashes(config: ml_collections.ConfigDict) -> tuple[str, dict[str, str]]:
  """(sha256 of the config's JSON, {dotted field: sha256 of its value}), PER_PROCESS_FIELDS left out."""
  flat = {
    k: v
    for k, v in _flatten(json.loads(config.to_json_best_effort())).items()
    if k not in PER_PROCESS_FIELDS
  }
  fields = {k: _sha(json.dumps(v, sort_keys=True)) for k, v in flat.items()}
  return _sha(json.dumps(flat, sort_keys=True)), fields


def _flatten(tree: dict, prefix: str = "") -> dict:
  out = {}
  for k, v in tree.items():
    if isinstance(v, dict) and v:
      out |= _flatten(v, f"{prefix}{k}.")
    else:
      out[f"{prefix}{k}"] = v
  return out


def _sha(text: str) -> str:
  return hashlib.sha256(text.encode()).hexdigest()


def _words(hex_digest: str) -> np.ndarray:
  """The first 128 bits of a hex digest as _WORDS int32s (all-gathered without jax x64)."""
  return np.frombuffer(bytes.fromhex(hex_digest)[: 4 * _WORDS], np.int32).copy()


class _Watchdog:
  """After `seconds`, print "distributed error: <message()>" to stderr and os._exit(EXIT_CODE).

  A thread, not a signal: the main thread is inside JAX's C++ connect call (which releases the
  GIL), where Python signal handlers would not run.
  """

  def __init__(self, seconds: float, message):
    self._lock = threading.Lock()
    self._done = False
    self._message = message
    self._timer = threading.Timer(seconds, self._fire)
    self._timer.daemon = True
    self._timer.start()

  def _fire(self) -> None:
    with self._lock:
      if self._done:
        return
      peer_watch.exit_with(self._message())

  def cancel(self) -> None:
    with self._lock:
      self._done = True
    self._timer.cancel()


def peer_timeout(seconds: float | None = None) -> float:
  """The heartbeat timeout: `seconds`, else $CBERT_PEER_TIMEOUT_S, else DEFAULT_PEER_TIMEOUT_S.

  Raises DistributedError for a value that is not a number >= 2 (JAX sends a heartbeat every
  timeout / 2 seconds and counts in whole seconds).
  """
  where = "peer_timeout_s"
  if seconds is None:
    seconds = os.environ.get(PEER_TIMEOUT_ENV, DEFAULT_PEER_TIMEOUT_S)
    where = f"${PEER_TIMEOUT_ENV}"
  try:
    value = float(seconds)
  except ValueError:
    value = math.nan
  if not 2 <= value < math.inf:
    raise DistributedError(f"{where}={seconds!r}: expected a number of seconds >= 2")
  return value
