"""Tests for the run records: the JSONL/TensorBoard writer (metrics), progress and timers
(progress), the parameter overview and provenance (provenance), the plot (plotting)."""

import json
import math
import os
import pathlib
import re
import struct
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from cbert_jax.run import metrics, plotting
from cbert_jax.run import progress as progress_lib
from cbert_jax.run import provenance as provenance_lib

# ---------------------------------------------------------------------------------------------
# Helpers.


class FakeClock:
  """A settable clock to inject as `time_fn`."""

  def __init__(self, t: float = 0.0) -> None:
    self.t = t

  def __call__(self) -> float:
    return self.t


def _strict_json(line: str) -> dict:
  """json.loads that fails on the NaN/Infinity literals that are not valid JSON."""

  def reject(token: str) -> None:
    raise ValueError(f"invalid JSON constant {token}")

  return json.loads(line, parse_constant=reject)


def _masked_crc32c(data: bytes) -> int:
  from tensorboardX.crc32c import crc32c  # pylint: disable=g-import-not-at-top

  crc = crc32c(data) & 0xFFFFFFFF
  # The TFRecord masking: rotate right by 15 and add a constant.
  return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _read_events(path: pathlib.Path) -> list:
  """Parses a TFRecord event file by hand (length, crc, payload, crc) into Event protos."""
  from tensorboardX.proto import event_pb2  # pylint: disable=g-import-not-at-top

  data = path.read_bytes()
  events, pos = [], 0
  while pos < len(data):
    header = data[pos : pos + 8]
    (length,) = struct.unpack("<Q", header)
    (header_crc,) = struct.unpack("<I", data[pos + 8 : pos + 12])
    assert header_crc == _masked_crc32c(header)
    body = data[pos + 12 : pos + 12 + length]
    (body_crc,) = struct.unpack("<I", data[pos + 12 + length : pos + 16 + length])
    assert body_crc == _masked_crc32c(body)
    events.append(event_pb2.Event.FromString(body))
    pos += 16 + length
  return events


def _tensorboard_scalars(tb_dir: pathlib.Path) -> dict[str, list[tuple[int, float]]]:
  """tag -> [(step, value)], read with TensorBoard itself if installed, else by hand."""
  try:
    # pylint: disable-next=g-import-not-at-top
    from tensorboard.backend.event_processing import event_accumulator
  except ImportError:
    event_accumulator = None
  if event_accumulator is not None:
    acc = event_accumulator.EventAccumulator(str(tb_dir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
  scalars: dict[str, list[tuple[int, float]]] = {}
  for path in sorted(tb_dir.glob("*tfevents*")):
    for event in _read_events(path):
      for value in event.summary.value:
        if value.HasField("simple_value"):
          scalars.setdefault(value.tag, []).append((event.step, value.simple_value))
  return scalars


# ---------------------------------------------------------------------------------------------
# MetricWriter / read_metrics.


def test_jsonl_round_trip_including_non_finite(tmp_path):
  with metrics.MetricWriter(tmp_path, is_primary=True, tensorboard=False) as writer:
    writer.write(
      1,
      {
        "train/loss": jnp.float32(2.5),
        "train/lr": 1e-4,
        "tokens_seen": np.int64(4096),
        "nan_metric": float("nan"),
        "inf_metric": np.float32(np.inf),
        "neg_inf_metric": -math.inf,
        "finite": True,
      },
    )
    writer.write(2, {"train/loss": jnp.asarray(0.1, jnp.float32)})

  lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
  assert len(lines) == 2
  first = _strict_json(lines[0])  # Valid JSON: no bare NaN/Infinity.
  assert list(first)[0] == "step"
  assert first["nan_metric"] == "nan"
  assert first["inf_metric"] == "inf"
  assert first["neg_inf_metric"] == "-inf"
  # float32 values are written with their shortest round-tripping decimal.
  assert '"train/loss": 0.1' in lines[1]

  records = metrics.read_metrics(tmp_path / "metrics.jsonl")
  assert [r["step"] for r in records] == [1, 2]
  r = records[0]
  assert r["train/loss"] == 2.5 and isinstance(r["train/loss"], float)
  assert r["train/lr"] == 1e-4
  assert r["tokens_seen"] == 4096 and isinstance(r["tokens_seen"], int)
  assert math.isnan(r["nan_metric"])
  assert r["inf_metric"] == math.inf
  assert r["neg_inf_metric"] == -math.inf
  assert r["finite"] is True
  assert np.float32(records[1]["train/loss"]) == np.float32(0.1)
  # A workdir works as well as the file path.
  assert len(metrics.read_metrics(tmp_path)) == 2


def test_write_rejects_bad_input_without_writing(tmp_path):
  with metrics.MetricWriter(tmp_path, is_primary=True, tensorboard=False) as writer:
    writer.write(5, {"a": 1.0})
    with pytest.raises(ValueError, match="decrease"):
      writer.write(4, {"a": 1.0})
    with pytest.raises(ValueError, match="scalar"):
      writer.write(6, {"ok": 1.0, "a": np.ones(3)})
    with pytest.raises(ValueError, match="reserved"):
      writer.write(6, {"step": 6})
    writer.write(5, {"eval/loss": 2.0})  # Same step again is allowed (e.g. eval after train).
  assert [r["step"] for r in metrics.read_metrics(tmp_path)] == [5, 5]
  with pytest.raises(ValueError, match="closed"):
    writer.write(7, {"a": 1.0})


def test_resume_drops_lines_past_resume_step_and_appends(tmp_path):
  with metrics.MetricWriter(tmp_path, is_primary=True, tensorboard=False) as writer:
    for step in range(1, 11):
      writer.write(step, {"train/loss": 10.0 - step})
      if step % 5 == 0:
        writer.write(step, {"eval/loss": 20.0 - step})
  # A crash mid-write leaves a truncated last line.
  with open(tmp_path / "metrics.jsonl", "a") as f:
    f.write('{"step": 11, "train/lo')

  with metrics.MetricWriter(tmp_path, is_primary=True, resume_step=6, tensorboard=False) as writer:
    # Kept lines are all <= 6, so going back to step 5 now is out of order.
    with pytest.raises(ValueError, match="decrease"):
      writer.write(5, {"train/loss": 0.0})
    for step in range(7, 9):
      writer.write(step, {"train/loss": 100.0 + step})

  records = metrics.read_metrics(tmp_path)
  steps = [r["step"] for r in records]
  assert steps == [1, 2, 3, 4, 5, 5, 6, 7, 8]
  # Lines before the resume point are untouched; lines after it come from the resumed run.
  assert records[5] == {"step": 5, "eval/loss": 15.0}
  assert records[6]["train/loss"] == 4.0
  assert records[7]["train/loss"] == 107.0
  for line in (tmp_path / "metrics.jsonl").read_text().splitlines():
    _strict_json(line)
  # No temporary file from the atomic rewrite is left behind.
  assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]


def test_fresh_run_replaces_existing_metrics(tmp_path):
  with metrics.MetricWriter(tmp_path, is_primary=True, tensorboard=False) as writer:
    writer.write(10, {"a": 1.0})
  with metrics.MetricWriter(tmp_path, is_primary=True, tensorboard=False) as writer:
    writer.write(1, {"a": 2.0})
  assert metrics.read_metrics(tmp_path) == [{"step": 1, "a": 2.0}]


def test_non_primary_writer_writes_nothing(tmp_path):
  workdir = tmp_path / "run"
  with metrics.MetricWriter(workdir, is_primary=False, resume_step=3) as writer:
    assert not writer.is_primary
    writer.write(4, {"train/loss": 1.0})
    writer.write_text("parameter_overview", "table")
    writer.flush()
    # Bad calls fail on every process alike, not only on the one that writes.
    with pytest.raises(ValueError, match="decrease"):
      writer.write(2, {"train/loss": 1.0})
    with pytest.raises(ValueError, match="scalar"):
      writer.write(5, {"train/loss": np.zeros(2)})
  writer.close()
  with pytest.raises(ValueError, match="closed"):
    writer.write(6, {"train/loss": 1.0})
  assert list(tmp_path.iterdir()) == []


def test_tensorboard_scalars_and_text_read_back(tmp_path, caplog):
  with metrics.MetricWriter(tmp_path, is_primary=True) as writer:
    writer.write(1, {"train/loss": 3.5, "perf/mfu": np.float32(0.25)})
    writer.write(2, {"train/loss": 3.0, "train/nan": float("nan")})
    writer.write_text("parameter_overview", "+---+\n| a |\n+---+")

  event_files = list((tmp_path / "tb").glob("*tfevents*"))
  assert len(event_files) == 1
  scalars = _tensorboard_scalars(tmp_path / "tb")
  assert scalars["train/loss"] == [(1, 3.5), (2, 3.0)]
  assert scalars["perf/mfu"] == [(1, 0.25)]
  ((nan_step, nan_value),) = scalars["train/nan"]
  assert nan_step == 2 and math.isnan(nan_value)
  # A NaN metric is recorded on purpose; tensorboardX's per-write warning about it is dropped.
  assert "NaN or Inf" not in caplog.text

  texts = [
    v
    for e in _read_events(event_files[0])
    for v in e.summary.value
    if v.tag.startswith("parameter_overview")
  ]
  assert texts and b"| a |" in texts[0].tensor.string_val[0]
  assert (tmp_path / "parameter_overview.txt").read_text() == "+---+\n| a |\n+---+\n"


def test_the_tensorboard_writer_never_imports_torch_and_leaves_it_importable(tmp_path):
  """tensorboardX imports torch when it can (2-3 s of every run's start); the writer keeps it
  out, still writes the events, and a later `import torch` (the export tests') still works."""
  code = (
    "import sys, importlib.util\n"
    "from cbert_jax.run import metrics\n"
    f"with metrics.MetricWriter({str(tmp_path)!r}, is_primary=True) as w:\n"
    "  w.write(1, {'train/loss': 2.5})\n"
    "assert 'torch' not in sys.modules, 'torch was imported'\n"
    "if importlib.util.find_spec('torch') is not None:\n"
    "  import torch\n"
    "  assert torch.zeros(2).sum().item() == 0.0\n"
    "print('ok')\n"
  )
  r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
  assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]
  assert _tensorboard_scalars(tmp_path / "tb")["train/loss"] == [(1, 2.5)]


def test_resumed_tensorboard_purges_steps_past_resume(tmp_path):
  from tensorboardX.proto import event_pb2  # pylint: disable=g-import-not-at-top

  with metrics.MetricWriter(tmp_path, is_primary=True) as writer:
    for step in range(1, 6):
      writer.write(step, {"train/loss": float(step)})
  with metrics.MetricWriter(tmp_path, is_primary=True, resume_step=3) as writer:
    writer.write(4, {"train/loss": 40.0})

  files = sorted((tmp_path / "tb").glob("*tfevents*"))
  assert len(files) == 2  # A restart in the same second must not overwrite the old file.
  new_file = [
    f
    for f in files
    if any(e.summary.value and e.summary.value[0].simple_value == 40.0 for e in _read_events(f))
  ]
  assert len(new_file) == 1
  # TensorBoard purges events with step >= the step of a SessionLog.START event.
  starts = [
    e.step
    for e in _read_events(new_file[0])
    if e.HasField("session_log") and e.session_log.status == event_pb2.SessionLog.START
  ]
  assert starts == [4]


# ---------------------------------------------------------------------------------------------
# Progress and Timers.


def test_progress_rate_and_eta_exclude_compile_and_handle_resume():
  clock = FakeClock(1000.0)
  progress = progress_lib.Progress(total_steps=1100, start_step=100, window=5, time_fn=clock)
  assert progress.steps_per_sec is None and progress.eta_seconds is None

  clock.t += 60.0  # The first step includes a minute of compilation...
  progress.update(101)
  assert progress.steps_per_sec is None  # ...and only starts the clock.
  for step in range(102, 111):
    clock.t += 0.5
    progress.update(step)
  assert progress.steps_per_sec == pytest.approx(2.0)
  assert progress.eta_seconds == pytest.approx((1100 - 110) / 2.0)

  # The rate follows recent steps only: after a slowdown the 5-point window is all slow.
  for step in range(111, 116):
    clock.t += 2.0
    progress.update(step)
  assert progress.steps_per_sec == pytest.approx(0.5)
  assert progress.eta_seconds == pytest.approx((1100 - 115) / 0.5)
  assert progress.elapsed_seconds == pytest.approx(60 + 9 * 0.5 + 5 * 2.0)

  line = progress.line(
    {"train/loss": jnp.float32(5.21376), "perf/tokens_per_sec": 12800.0, "perf/mfu": 0.312}
  )
  assert line == (
    "step 115/1100 (10.5%) | loss 5.214 | 0.5 steps/s | 12.8k tok/s | MFU 31.2% | ETA 32m50s"
  )


def test_progress_format_before_rate_is_known():
  progress = progress_lib.Progress(total_steps=2000, time_fn=FakeClock())
  assert progress.format() == "step 0/2000 (0.0%)"
  assert progress.format(20, {"loss": 7.0}) == "step 20/2000 (1.0%) | loss 7"
  assert progress.line({"loss": 7.0}, step=20) == progress.format(20, {"loss": 7.0})


def test_format_duration():
  assert progress_lib.format_duration(42.4) == "42s"
  assert progress_lib.format_duration(602) == "10m02s"
  assert progress_lib.format_duration(3 * 3600 + 7 * 60 + 5) == "3h07m"
  assert progress_lib.format_duration(2 * 86400 + 5 * 3600) == "2d05h"
  assert progress_lib.format_duration(math.inf) == "?"


def test_timers_sum_spans_and_fractions():
  clock = FakeClock()
  timers = progress_lib.Timers(time_fn=clock)
  with timers.span("data_wait"):
    clock.t += 1.5
  with timers.span("checkpoint"):
    clock.t += 4.0
  with timers.span("data_wait"):
    clock.t += 0.5
  with pytest.raises(RuntimeError):
    with timers.span("eval"):
      clock.t += 2.0
      raise RuntimeError("eval failed")  # The time spent still counts.
  timers.add("compile", 12.0)
  clock.t += 12.0

  assert timers.totals() == {"data_wait": 2.0, "checkpoint": 4.0, "eval": 2.0, "compile": 12.0}
  assert timers.counts() == {"data_wait": 2, "checkpoint": 1, "eval": 1, "compile": 1}
  assert timers.elapsed() == pytest.approx(20.0)
  assert timers.fractions() == pytest.approx(
    {"data_wait": 0.1, "checkpoint": 0.2, "eval": 0.1, "compile": 0.6}
  )
  assert timers.fractions(of_total=40.0)["checkpoint"] == pytest.approx(0.1)
  m = timers.as_metrics(of_total=40.0)
  assert m["time/data_wait_s"] == 2.0 and m["time/data_wait_frac"] == pytest.approx(0.05)
  assert set(m) == {
    f"time/{n}_{k}" for n in ("data_wait", "checkpoint", "eval", "compile") for k in ("s", "frac")
  }
  with pytest.raises(ValueError):
    timers.fractions(of_total=0.0)
  timers.reset()
  assert timers.totals() == {} and timers.elapsed() == 0.0


# ---------------------------------------------------------------------------------------------
# parameter_overview, provenance, plot_metrics.


class _TinyModel(nnx.Module):
  def __init__(self, rngs: nnx.Rngs) -> None:
    self.encoder = nnx.Linear(3, 4, rngs=rngs)  # 12 + 4
    self.layers = nnx.List([nnx.Linear(4, 4, rngs=rngs) for _ in range(2)])  # 2 * (16 + 4)
    self.norm = nnx.LayerNorm(4, rngs=rngs)  # 4 + 4
    self.dropout = nnx.Dropout(0.1, rngs=rngs)  # RNG state, not parameters.


def test_parameter_overview_counts_parameters():
  model = _TinyModel(nnx.Rngs(0))
  expected_total = 16 + 2 * 20 + 8
  state = nnx.state(model, nnx.Param)
  for params in (state, nnx.to_pure_dict(state), model):
    overview = provenance_lib.parameter_overview(params)
    assert re.search(rf"Total: {expected_total:,} ", overview), overview
    assert "layers/1/kernel" in overview and "(4, 4)" in overview
  assert "Mean" not in provenance_lib.parameter_overview(state, include_stats=False)


def _git(repo: pathlib.Path, *args: str) -> str:
  return subprocess.run(
    [
      "git",
      "-c",
      "user.name=t",
      "-c",
      "user.email=t@example.com",
      "-c",
      "commit.gpgsign=false",
      *args,
    ],
    cwd=repo,
    check=True,
    capture_output=True,
    text=True,
  ).stdout.strip()


def test_provenance_in_a_git_repo(tmp_path):
  repo = tmp_path / "repo"
  repo.mkdir()
  _git(repo, "init", "-q")
  (repo / "train.py").write_text("print('hi')\n")
  _git(repo, "add", "train.py")
  _git(repo, "commit", "-q", "-m", "init")
  head = _git(repo, "rev-parse", "HEAD")

  info = provenance_lib.provenance({"data_manifest_hash": "abc123"}, repo_dir=repo)
  assert re.fullmatch(r"[0-9a-f]{40}", info["git_commit"])
  assert info["git_commit"] == head
  assert info["git_dirty"] is False
  assert info["data_manifest_hash"] == "abc123"
  assert {
    "python",
    "jax",
    "jaxlib",
    "flax",
    "optax",
    "orbax-checkpoint",
    "grain",
    "numpy",
    "sentencepiece",
  } <= set(info["versions"])
  assert info["versions"]["jax"] == __import__("jax").__version__
  for key in (
    "jax_backend",
    "device_kind",
    "process_count",
    "device_count",
    "local_device_count",
    "hostname",
    "time_utc",
    "command",
  ):
    assert key in info, key
  assert info["device_count"] >= info["local_device_count"] >= 1
  assert info["time_utc"].endswith("+00:00")
  json.dumps(info)  # Serialisable as is.

  (repo / "train.py").write_text("print('changed')\n")
  assert provenance_lib.provenance(repo_dir=repo)["git_dirty"] is True
  with pytest.raises(ValueError, match="clashes"):
    provenance_lib.provenance({"git_commit": "x"}, repo_dir=repo)


def test_provenance_outside_git(tmp_path):
  info = provenance_lib.provenance(repo_dir=tmp_path)
  assert info["git_commit"] == "unknown"
  assert info["git_dirty"] is None


def test_plot_metrics_writes_png(tmp_path):
  with metrics.MetricWriter(tmp_path, is_primary=True, tensorboard=False) as writer:
    for step in range(1, 21):
      writer.write(
        step,
        {
          "train/loss": 5.0 / step,
          "train/lr": 1e-3 * min(1, step / 5),
          "perf/mfu": 0.3,
          "tokens_seen": 512 * step,
        },
      )
      if step % 10 == 0:
        writer.write(step, {"eval/loss": 6.0 / step, "tokens_seen": 512 * step})

  out = tmp_path / "plots" / "metrics.png"
  panels = plotting.plot_metrics(tmp_path / "metrics.jsonl", out)
  assert panels == ["loss", "learning rate", "MFU (%)"]
  data = out.read_bytes()
  assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 5000

  panels = plotting.plot_metrics(tmp_path, tmp_path / "by_tokens.png", x="tokens_seen")
  assert panels == ["loss", "learning rate", "MFU (%)"]
  assert plotting.plot_metrics(tmp_path, tmp_path / "none.png", x="missing") == []
  assert (tmp_path / "none.png").read_bytes().startswith(b"\x89PNG")


def test_matplotlib_classes_set_mplconfigdir_only_around_the_first_import(tmp_path):
  # A fresh interpreter: matplotlib must not be imported yet for MPLCONFIGDIR to matter.
  code = (
    "import os, sys\n"
    "from cbert_jax.run import plotting\n"
    "Figure, Canvas = plotting.matplotlib_classes(sys.argv[1])\n"
    "import matplotlib\n"
    "assert Figure.__name__ == 'Figure' and Canvas.__name__ == 'FigureCanvasAgg'\n"
    "assert 'MPLCONFIGDIR' not in os.environ\n"
    "print(matplotlib.get_configdir())\n"
  )
  env = {k: v for k, v in os.environ.items() if k != "MPLCONFIGDIR"}
  out = subprocess.run(
    [sys.executable, "-c", code, str(tmp_path / "mpl")],
    env=env,
    check=True,
    capture_output=True,
    text=True,
  ).stdout
  assert out.strip() == str(tmp_path / "mpl")


def test_plain_log_ticks_label_a_decade_of_losses_as_plain_numbers(tmp_path):
  Figure, Canvas = plotting.matplotlib_classes(str(tmp_path / "mpl"))
  fig = Figure()
  ax = fig.add_subplot(1, 1, 1)
  ax.plot([1, 10], [3.5, 6.2])
  ax.set_yscale("log")
  plotting.plain_log_ticks(ax.yaxis)
  Canvas(fig).draw()
  shown = [t.get_text() for t in ax.yaxis.get_ticklabels() if 3.5 <= t.get_position()[1] <= 6.2]
  assert shown == ["4", "5", "6"]  # matplotlib's default labels these "4 x 10^0" or not at all
  assert all(t.get_text() == "" for t in ax.yaxis.get_ticklabels(minor=True))
