"""The optional W&B logger (cbert_jax/run/wandb_logger.py), with wandb itself in its offline mode.

A tiny run with `wandb.project` set and no W&B server to reach (WANDB_BASE_URL points at a closed
local port) chooses offline mode; the rows W&B recorded, read back from its `.wandb` file (a
LevelDB-style log of wandb's protobuf records), are metrics.jsonl's rows, value for value; the
config is the run's. Resuming the workdir continues the same W&B run id. Without a project nothing
of W&B is written. Bad settings are one line before any work.
"""

import json
import math
import socket
import struct

import pytest
from wandb.proto import wandb_internal_pb2

from cbert_jax import config_lib, train
from cbert_jax.errors import ConfigError
from cbert_jax.run import metrics as metrics_lib
from cbert_jax.run import wandb_logger
from tests.helpers import tiny_config


def wandb_records(path):
  """The protobuf records of a .wandb file: a ':W&B' header (7 bytes), then 32 KiB blocks of
  chunks (crc32 u32, length u16, type u8: 1 full, 2 first, 3 middle, 4 last)."""
  data = path.read_bytes()
  assert data[:4] == b":W&B", data[:8]
  pos, block, buf = 7, 32768, b""
  while pos < len(data):
    left = block - pos % block
    if left < 7:  # a block's tail too short for a chunk header is padding
      pos += left
      continue
    _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
    pos += 7
    if length == 0 and kind == 0:  # zero padding to the block's end
      pos += left - 7
      continue
    buf += data[pos : pos + length]
    pos += length
    if kind in (1, 4):
      record = wandb_internal_pb2.Record()
      record.ParseFromString(buf)
      buf = b""
      yield record


def history_rows(run_file) -> list[dict]:
  """Each logged row ({key: value}), W&B's own keys (_step, _runtime, _timestamp) left out."""
  rows = []
  for r in wandb_records(run_file):
    if r.WhichOneof("record_type") == "history":
      row = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
      rows.append({k: v for k, v in row.items() if not k.startswith("_")})
  return rows


def run_config(run_file) -> dict:
  for r in wandb_records(run_file):
    if r.WhichOneof("record_type") == "run":
      return {u.key: json.loads(u.value_json) for u in r.run.config.update}
  raise AssertionError("no run record")


@pytest.fixture
def no_server(monkeypatch, tmp_path):
  """WANDB_BASE_URL at a local port nothing listens on; no credentials; W&B's files in tmp."""
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]  # closed again when the block ends: connections are refused
  monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{port}")
  monkeypatch.delenv("WANDB_API_KEY", raising=False)
  monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/.netrc, no ~/.config/wandb
  monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb_config"))
  monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "wandb_cache"))
  return port


def _same(a, b) -> bool:
  if isinstance(a, float) and isinstance(b, float):
    return a == b or (math.isnan(a) and math.isnan(b))
  return a == b


def test_a_run_without_a_server_logs_metrics_rows_offline_and_resumes_the_same_wandb_run(
  cache, tmp_path, no_server
):
  workdir = tmp_path / "run"
  config = tiny_config(cache, "bert", total_steps=4, checkpoint_every=2)
  config.wandb.project = "cbert-test"
  config.wandb.tags = "tiny,test"
  train.run(config, str(workdir))
  run_id = (workdir / wandb_logger.RUN_ID_FILE).read_text().strip()
  [first] = sorted((workdir / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb"))
  want = metrics_lib.read_metrics(workdir / "metrics.jsonl")
  got = history_rows(first)
  assert len(got) == len(want) >= 5  # 4 train rows + evals
  for g, w in zip(got, want, strict=True):
    decoded = {k: wandb_logger._scalar(v) for k, v in w.items()}  # pylint: disable=protected-access
    assert g.keys() == decoded.keys() and all(_same(g[k], decoded[k]) for k in g), (g, w)
  logged = run_config(first)
  assert logged["config"]["model_name"] == "bert" and logged["config"]["total_steps"] == 4
  assert logged["provenance"]["non_embedding_params"] > 0

  # Resumed with more steps: the same W&B run id, rows from the checkpoint on.
  config.total_steps = 6
  train.run(config, str(workdir))
  assert (workdir / wandb_logger.RUN_ID_FILE).read_text().strip() == run_id
  runs = sorted((workdir / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb"))
  assert len(runs) == 2
  again = history_rows(runs[-1])
  assert [r["step"] for r in again if "train/loss" in r] == [5, 6]


def test_auto_mode_goes_online_only_with_a_server_and_credentials(no_server, monkeypatch):
  mode, why = wandb_logger.choose_mode("auto")
  assert mode == "offline" and "does not answer within 3 s" in why
  with socket.socket() as server:
    server.bind(("127.0.0.1", 0))
    server.listen()
    monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{server.getsockname()[1]}")
    mode, why = wandb_logger.choose_mode("auto")
    assert mode == "offline" and why.startswith("no W&B credentials")
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    assert wandb_logger.choose_mode("auto")[0] == "online"
  assert wandb_logger.choose_mode("offline") == ("offline", "wandb.mode=offline")


def test_without_a_project_nothing_of_wandb_is_written(cache, tmp_path):
  workdir = tmp_path / "run"
  train.run(tiny_config(cache, "bert", total_steps=2), str(workdir))
  assert not (workdir / wandb_logger.RUN_ID_FILE).exists() and not (workdir / "wandb").exists()


@pytest.mark.parametrize(
  "field,value,message",
  [
    ("mode", "sometimes", "wandb.mode: 'sometimes'; expected one of auto, online, offline"),
    ("project", "team/proj", "wandb.project: 'team/proj' contains /"),
  ],
)
def test_bad_wandb_settings_are_one_line(field, value, message):
  c = config_lib.resolve(config_lib.base_config())
  c.wandb[field] = value
  with pytest.raises(ConfigError) as e:
    config_lib.validate(c, 1)
  assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_a_project_without_wandb_installed_names_the_extra(monkeypatch):
  real = config_lib.importlib.util.find_spec
  monkeypatch.setattr(
    config_lib.importlib.util, "find_spec", lambda n, *a: None if n == "wandb" else real(n, *a)
  )
  c = config_lib.resolve(config_lib.base_config())
  c.wandb.project = "p"
  with pytest.raises(ConfigError, match=r"pip install 'cbert_jax\[wandb\]'"):
    config_lib.validate(c, 1)
