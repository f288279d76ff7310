"""Restore failures are classified: only a checkpoint whose own files are proven damaged is moved.

Each case writes two real orbax checkpoints of a tiny state through `Checkpointer` (no training,
so the file is fast), damages or breaks step 2 one way, and checks what `restore_latest` does:
falls back to step 1 with step 2 moved to `checkpoints.unreadable/` (damage), or raises and moves
nothing (another model, I/O, an unknown error). The trainer-level replays are in
tests/run/test_workdir_safety.py.
"""

import errno
import json
import os
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cbert_jax.errors import CheckpointError, ConfigError
from cbert_jax.run import checkpoint as ckpt_lib


def _state(step: int, rows: int = 4):
  params = {
    "w": jnp.arange(rows * 3, dtype=jnp.float32).reshape(rows, 3) * step,
    "b": jnp.full((3,), float(step)),
  }
  return params, {"mu": jax.tree.map(jnp.zeros_like, params), "count": jnp.int32(step)}


def _abstract(tree):
  sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding), tree)


@pytest.fixture(autouse=True)
def fast_retries(monkeypatch):
  monkeypatch.setattr(ckpt_lib, "IO_BACKOFF_S", 0.0)


@pytest.fixture()
def ckpt_dir(tmp_path):
  """Checkpoints 1 and 2 of `_state`, sealed (the close after the last save seals it)."""
  directory = str(tmp_path / "checkpoints")
  c = ckpt_lib.Checkpointer(directory, keep=3)
  for step in (1, 2):
    c.save(step, *_state(step), {"next_index": step}, {"step": step})
  c.close()
  return directory


def _restore(directory, rows=4, **kw):
  params, opt = _state(1, rows)
  c = ckpt_lib.Checkpointer(directory, keep=3)
  try:
    return c.restore_latest(_abstract(params), _abstract(opt), **kw)
  finally:
    c.close()


def _listing(directory):
  return sorted(
    os.path.relpath(os.path.join(d, f), directory)
    for d, _, files in os.walk(directory)
    for f in files
  )


def _largest(step_dir):
  files = [os.path.join(d, f) for d, _, fs in os.walk(os.path.join(step_dir, "state")) for f in fs]
  return max(files, key=os.path.getsize)


def _flip(path):
  data = bytearray(open(path, "rb").read())
  data[len(data) // 2] ^= 0xFF
  open(path, "wb").write(bytes(data))


def _truncate(path):
  data = open(path, "rb").read()
  open(path, "wb").write(data[: len(data) // 2])


def test_every_complete_checkpoint_is_sealed_with_sizes_and_crcs(ckpt_dir):
  for step in ("1", "2"):
    seal = json.load(open(os.path.join(ckpt_dir, step, ckpt_lib.SEAL)))["files"]
    on_disk = {
      rel: os.path.getsize(os.path.join(ckpt_dir, step, rel))
      for rel in _listing(os.path.join(ckpt_dir, step))
      if rel != ckpt_lib.SEAL
    }
    assert {rel: size for rel, (size, _) in seal.items()} == on_disk
    assert all(crc is not None for _, crc in seal.values())


def test_an_intact_checkpoint_restores_the_newest_state(ckpt_dir):
  step, params, opt, data, meta = _restore(ckpt_dir)
  assert (step, data, meta) == (2, {"next_index": 2}, {"step": 2})
  np.testing.assert_array_equal(params["w"], _state(2)[0]["w"])
  assert not os.path.exists(ckpt_dir + ".unreadable")


DAMAGE = {
  # orbax's zarr chunks carry no checksum: without the seal this restores wrong numbers silently
  "bit-flip": (lambda s: _flip(_largest(s)), "does not match its CRC-32"),
  "truncated": (lambda s: _truncate(_largest(s)), "bytes, "),
  "files-missing": (lambda s: shutil.rmtree(os.path.join(s, "state")), "is missing"),
  "commit-marker-missing": (
    lambda s: os.remove(os.path.join(s, "commit_success.txt")),
    "commit marker commit_success.txt is missing",
  ),
  "seal-unreadable": (
    lambda s: open(os.path.join(s, ckpt_lib.SEAL), "w").write("{"),
    "seal.json is unreadable",
  ),
}


@pytest.mark.parametrize("damage", DAMAGE)
def test_damaged_checkpoint_is_moved_aside_and_the_previous_restored(ckpt_dir, damage, caplog):
  mutate, reason = DAMAGE[damage]
  mutate(os.path.join(ckpt_dir, "2"))
  step, params, _, data, _ = _restore(ckpt_dir)
  assert step == 1 and data == {"next_index": 1}
  np.testing.assert_array_equal(params["w"], _state(1)[0]["w"])
  moved = os.listdir(ckpt_dir + ".unreadable")
  assert len(moved) == 1 and moved[0].startswith("2-")  # kept for inspection
  assert any(reason in r.getMessage() and "is damaged" in r.getMessage() for r in caplog.records)


def test_unsealed_checkpoint_with_short_data_is_damage_found_by_the_reader(ckpt_dir):
  """The newest checkpoint of a killed run has no seal yet: the reader's error decides."""
  os.remove(os.path.join(ckpt_dir, "2", ckpt_lib.SEAL))
  _truncate(_largest(os.path.join(ckpt_dir, "2")))
  assert _restore(ckpt_dir)[0] == 1
  assert os.listdir(ckpt_dir + ".unreadable")[0].startswith("2-")


def test_another_models_checkpoint_is_a_config_error_and_nothing_moves(ckpt_dir):
  before = _listing(ckpt_dir)
  with pytest.raises(
    ConfigError,
    match=r"checkpoint step 2 in .* was written by another model "
    r"than this config builds: params/w: stored \(4, 3\), this config \(8, 3\)",
  ):
    _restore(ckpt_dir, rows=8)
  assert _listing(ckpt_dir) == before and not os.path.exists(ckpt_dir + ".unreadable")


def test_io_errors_are_retried_then_reported_and_nothing_moves(ckpt_dir, monkeypatch):
  calls = []

  def failing(*a, **k):
    calls.append(1)
    raise OSError(errno.EIO, "Input/output error", "state/d/0")

  monkeypatch.setattr(ckpt_lib.Checkpointer, "_restore_raw", failing)
  before = _listing(ckpt_dir)
  with pytest.raises(
    CheckpointError,
    match=r"checkpoint step 2 in .* could not be read after 4 "
    r"attempts \(OSError.*not damage, so nothing was moved",
  ):
    _restore(ckpt_dir)
  assert len(calls) == ckpt_lib.IO_ATTEMPTS
  assert _listing(ckpt_dir) == before and not os.path.exists(ckpt_dir + ".unreadable")


def test_a_transient_io_error_is_retried_and_the_newest_restored(ckpt_dir, monkeypatch):
  real, calls = ckpt_lib.Checkpointer._restore_raw, []

  def flaky(self, *a, **k):
    calls.append(1)
    if len(calls) < 3:
      raise OSError(errno.EIO, "Input/output error")
    return real(self, *a, **k)

  monkeypatch.setattr(ckpt_lib.Checkpointer, "_restore_raw", flaky)
  assert _restore(ckpt_dir)[0] == 2 and len(calls) == 3


def test_io_error_while_checking_the_seal_is_not_damage(ckpt_dir, monkeypatch):
  def denied(path, block=0):
    raise PermissionError(errno.EACCES, "Permission denied", path)

  monkeypatch.setattr(ckpt_lib, "_crc32", denied)
  with pytest.raises(CheckpointError, match="not damage, so nothing was moved"):
    _restore(ckpt_dir)
  assert sorted(os.listdir(ckpt_dir)) == ["1", "2"]


def test_a_permission_error_from_the_reader_is_named_not_retried_and_nothing_moves(
  ckpt_dir, monkeypatch
):
  calls = []

  def denied(*a, **k):
    calls.append(1)
    raise PermissionError(errno.EACCES, "Permission denied", os.path.join(ckpt_dir, "2", "state"))

  monkeypatch.setattr(ckpt_lib.Checkpointer, "_restore_raw", denied)
  before = _listing(ckpt_dir)
  with pytest.raises(
    CheckpointError,
    match=rf"checkpoint step 2 in {ckpt_dir} cannot be read: permission denied on "
    rf"{ckpt_dir}/2/state \(mode 7\d\d, .*not damage, so nothing was moved.*chmod -R u\+rwX "
    rf"{ckpt_dir}/2\) and rerun the same command to resume from it",
  ):
    _restore(ckpt_dir)
  assert len(calls) == 1  # waiting does not give permissions back
  assert _listing(ckpt_dir) == before and not os.path.exists(ckpt_dir + ".unreadable")


def test_chmod_000_at_every_level_is_never_damage_and_resumes_once_fixed(ckpt_dir):
  """The fault script, for real: file modes bind it (as root it drops the override), each level
  of the newest checkpoint in turn. Before the fix, os.walk/os.path.exists called an unreadable
  directory missing: the checkpoint was moved aside as damaged, or a PermissionError escaped."""
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  done = subprocess.run(
    [sys.executable, "-m", "tests.faults.checkpoint_permissions", "--checkpoints", ckpt_dir],
    cwd=root,
    capture_output=True,
    text=True,
    timeout=300,
    env={**os.environ, "JAX_PLATFORMS": "cpu"},
  )
  report = [ln for ln in done.stdout.splitlines() if ln.startswith(("ok", "FAIL"))]
  assert done.returncode == 0, done.stdout + done.stderr[-3000:]
  levels = [ln for ln in report if "chmod 000" in ln]
  assert len(levels) >= 10 and all(ln.startswith("ok") for ln in report), report
  assert any(ln.endswith("/2/state/d: exit 5") or "/2/state/d:" in ln for ln in levels)
  assert report[-1].startswith(
    "ok   permissions back: exit 0; moved aside: False; resumed from step 2: True"
  )


def _unseal(ckpt_dir, step="2"):
  os.remove(os.path.join(ckpt_dir, step, ckpt_lib.SEAL))


def test_an_unsealed_intact_checkpoint_is_verified_restored_and_sealed(ckpt_dir, caplog):
  _unseal(ckpt_dir)
  step, params, *_ = _restore(ckpt_dir)
  assert step == 2
  np.testing.assert_array_equal(params["w"], _state(2)[0]["w"])
  assert os.path.exists(os.path.join(ckpt_dir, "2", ckpt_lib.SEAL))  # trusted from now on
  assert any(
    "was not sealed" in r.getMessage() and "sealed it now" in r.getMessage() for r in caplog.records
  )


@pytest.mark.parametrize("seal", ["unsealed", "sealed-sizes-only"])
def test_a_checkpoint_whose_arrays_changed_is_damage(ckpt_dir, caplog, seal):
  """A killed run's newest checkpoint has no seal, and a seal of a checkpoint over CRC_MAX_BYTES
  holds sizes only; its array files then hold other values (here: step 1's, which read back
  cleanly, are finite and have the same sizes) than it was written with. The checksums recorded
  at save time catch it: before, it was restored as if intact."""
  _unseal(ckpt_dir)
  shutil.rmtree(os.path.join(ckpt_dir, "2", "state"))
  shutil.copytree(os.path.join(ckpt_dir, "1", "state"), os.path.join(ckpt_dir, "2", "state"))
  if seal == "sealed-sizes-only":  # the seal lists the changed files' names and sizes, no CRCs
    files = ckpt_lib._list_files(os.path.join(ckpt_dir, "2"))
    with open(os.path.join(ckpt_dir, "2", ckpt_lib.SEAL), "w") as f:
      json.dump({"files": {rel: [size, None] for rel, size in files.items()}}, f)
  step, params, _, data, _ = _restore(ckpt_dir)
  assert step == 1 and data == {"next_index": 1}
  np.testing.assert_array_equal(params["w"], _state(1)[0]["w"])
  assert os.listdir(ckpt_dir + ".unreadable")[0].startswith("2-")
  assert any(
    "differ from the checksums recorded" in r.getMessage() and "params/w" in r.getMessage()
    for r in caplog.records
  )


def test_an_unsealed_checkpoint_without_checksums_must_be_finite(ckpt_dir, caplog):
  """A checkpoint written before checksums were recorded is checked finite instead."""
  c = ckpt_lib.Checkpointer(ckpt_dir, keep=3)
  params, opt = _state(3)
  c.save(3, {**params, "w": params["w"].at[1, 1].set(jnp.nan)}, opt, {"next_index": 3}, {"step": 3})
  c.wait()
  c._mngr.close()  # no close(): that would seal it
  _unseal(ckpt_dir, "3")
  meta_file = os.path.join(ckpt_dir, "3", "meta", "metadata")
  meta = json.load(open(meta_file))
  del meta[ckpt_lib.CHECKSUMS]
  json.dump(meta, open(meta_file, "w"))
  assert _restore(ckpt_dir)[0] == 2
  assert any("non-finite values in params/w" in r.getMessage() for r in caplog.records)


def test_array_checksums_are_exact_whatever_the_layout_and_see_one_flipped_bit():
  x = jnp.arange(64, dtype=jnp.float32).reshape(8, 8) / 7
  devices = np.array(jax.devices())
  mesh = jax.sharding.Mesh(devices.reshape(-1), ("d",))
  sharded = jax.device_put(x, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("d")))
  tree = {"a": x, "b": jnp.ones((3,), jnp.bfloat16), "n": jnp.int32(7), "m": jnp.array([True])}
  one = ckpt_lib.array_checksums(tree)
  assert ckpt_lib.array_checksums({**tree, "a": sharded}) == one  # any mesh, same sums
  bits = np.asarray(x).view(np.uint32).copy()
  assert one["a"] == int(bits.astype(np.uint64).sum() % 2**32)  # the definition, on the host
  bits[3, 5] ^= 1 << 4  # one low mantissa bit
  flipped = jnp.asarray(bits.view(np.float32))
  assert ckpt_lib.array_checksums({**tree, "a": flipped})["a"] != one["a"]


def test_an_unknown_error_is_reported_and_nothing_moves(ckpt_dir, monkeypatch):
  def weird(*a, **k):
    raise RuntimeError("something orbax has never said")

  monkeypatch.setattr(ckpt_lib.Checkpointer, "_restore_raw", weird)
  with pytest.raises(CheckpointError, match="something orbax has never said.*neither damage"):
    _restore(ckpt_dir)
  assert sorted(os.listdir(ckpt_dir)) == ["1", "2"]


def test_no_checkpoint_left_after_moving_damage_is_refused_until_restart_from_scratch(ckpt_dir):
  for step in ("1", "2"):
    _flip(_largest(os.path.join(ckpt_dir, step)))
  with pytest.raises(
    CheckpointError,
    match=r"no checkpoint in .* can be resumed from: damaged "
    r"checkpoints were moved aside .*mv .*checkpoints.unreadable/2-\d+ "
    r".*checkpoints/2\).*--config.restart_from_scratch=true",
  ):
    _restore(ckpt_dir)
  # A later run (nothing left to move) is refused the same way: never a silent step 0.
  with pytest.raises(CheckpointError, match="by an earlier run, now in .*checkpoints.unreadable"):
    _restore(ckpt_dir)
  assert _restore(ckpt_dir, restart_from_scratch=True) is None
  assert len(os.listdir(ckpt_dir + ".unreadable")) == 2  # still kept


def test_restore_params_of_another_model_names_the_shapes(ckpt_dir):
  c = ckpt_lib.Checkpointer(ckpt_dir, keep=3)
  with pytest.raises(ConfigError, match=r"params/w: stored \(4, 3\), this config \(8, 3\)"):
    c.restore_params(2, _abstract(_state(1, rows=8)[0]))
  only_w = _abstract({"w": _state(1)[0]["w"]})  # a subset is fine
  np.testing.assert_array_equal(c.restore_params(2, only_w)["w"], _state(2)[0]["w"])
  c.close()
