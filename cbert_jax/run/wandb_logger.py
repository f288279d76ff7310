"""Optional Weights & Biases logging: `--config.wandb.project=NAME` (extra `wandb`).

Every row the trainer writes to metrics.jsonl is also logged to W&B, unchanged (the same names,
`step` included), plus the resolved config and its provenance as the run's config. Nothing
changes when `wandb.project` is empty: wandb is not even imported.

Steps: a resumed or rolled-back run logs a step it has logged before again (metrics.jsonl drops the
rows past the checkpoint and rewrites them). W&B's own step must only grow, so the rows are logged
with `step` as an ordinary key and every chart is drawn against it
(`define_metric("*", step_metric="step")`); W&B keeps both rows, the charts show the rerun.

Resuming: the W&B run id is kept in `<workdir>/wandb_run_id`, so a run resumed from its workdir
(also on another machine, after a preemption) continues the same W&B run (`resume="allow"`).

Mode (`wandb.mode`): online, offline (files under `<workdir>/wandb/`, uploaded later with
`wandb sync <workdir>/wandb/offline-run-*`) or auto (the default): online when the W&B server
answers on its port within 3 s and credentials exist (WANDB_API_KEY, or the netrc entry `wandb
login` writes), offline otherwise, with one line saying why and how to sync. W&B's own console
output is kept out of the training log (WANDB_SILENT unless the user set it).
"""

from __future__ import annotations

import math
import netrc
import os
import secrets
import socket
import urllib.parse

from absl import logging

RUN_ID_FILE = "wandb_run_id"
DEFAULT_HOST = "https://api.wandb.ai"
CONNECT_TIMEOUT_S = 3.0


def host() -> str:
  return os.environ.get("WANDB_BASE_URL", DEFAULT_HOST)


def reachable(url: str, timeout: float = CONNECT_TIMEOUT_S) -> bool:
  """Whether a TCP connection to the URL's host and port opens within `timeout` seconds."""
  parts = urllib.parse.urlparse(url)
  port = parts.port or (443 if parts.scheme == "https" else 80)
  try:
    with socket.create_connection((parts.hostname or "", port), timeout=timeout):
      return True
  except OSError:
    return False


def has_credentials(url: str) -> bool:
  if os.environ.get("WANDB_API_KEY"):
    return True
  try:
    return netrc.netrc().authenticators(urllib.parse.urlparse(url).hostname or "") is not None
  except (OSError, netrc.NetrcParseError):
    return False


def choose_mode(mode: str) -> tuple[str, str]:
  """(online | offline, why) for `wandb.mode`; auto looks at the network and the credentials."""
  if mode != "auto":
    return mode, f"wandb.mode={mode}"
  url = host()
  if not reachable(url):
    return "offline", f"{url} does not answer within {CONNECT_TIMEOUT_S:g} s"
  if not has_credentials(url):
    return "offline", "no W&B credentials (WANDB_API_KEY or `wandb login`)"
  return "online", f"{url} answers and credentials exist"


def _run_id(workdir: str, make_id) -> str:
  """The W&B run id of this workdir: the one recorded, else a new one (recorded now)."""
  path = os.path.join(workdir, RUN_ID_FILE)
  try:
    with open(path) as f:
      got = f.read().strip()
    if got:
      return got
  except OSError:
    pass
  new = make_id()
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    f.write(new + "\n")
  os.replace(tmp, path)
  return new


def _scalar(value):
  """metrics.jsonl's encoding back to numbers ("nan", "inf" strings -> floats)."""
  if isinstance(value, str):
    return {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}.get(value, value)
  return value


class WandbLogger:
  """One W&B run for one workdir; `log(record)` takes metrics.jsonl's rows ({"step": n, ...})."""

  def __init__(self, cfg, *, workdir: str, run_name: str, config: dict):
    """cfg: the config's `wandb` group (project set); config: what W&B shows as the run's config
    (the resolved config and its provenance)."""
    import wandb  # pylint: disable=import-outside-toplevel

    os.environ.setdefault("WANDB_SILENT", "true")
    self.mode, why = choose_mode(cfg.mode)
    run_id = _run_id(workdir, lambda: secrets.token_hex(4))  # 8 of [0-9a-f]: a valid W&B id
    self.run = wandb.init(
      project=cfg.project,
      entity=cfg.entity or None,
      name=cfg.name or run_name,
      group=cfg.group or None,
      tags=[t.strip() for t in cfg.tags.split(",") if t.strip()] or None,
      id=run_id,
      resume="allow",
      dir=workdir,
      config=config,
      mode=self.mode,
    )
    self.run.define_metric("step")
    self.run.define_metric("*", step_metric="step")
    where = self.run.dir if self.mode == "offline" else getattr(self.run, "url", "")
    logging.info("wandb: %s (%s), run %s: %s", self.mode, why, run_id, where)
    if self.mode == "offline":
      logging.info(
        "wandb: upload later with `wandb sync %s`", os.path.dirname(self.run.dir.rstrip("/"))
      )

  def log(self, record: dict) -> None:
    self.run.log({k: _scalar(v) for k, v in record.items()})

  def close(self) -> None:
    self.run.finish()


def open_logger(config, workdir: str, *, is_primary: bool, provenance: dict) -> WandbLogger | None:
  """The run's W&B logger on the primary process when `wandb.project` is set, else None."""
  cfg = config.wandb
  if not cfg.project or not is_primary:
    return None
  name = config.name or os.path.basename(os.path.normpath(workdir))
  return WandbLogger(
    cfg,
    workdir=workdir,
    run_name=name,
    config={"config": config.to_dict(), "provenance": provenance},
  )
