"""What a training run writes: only its workdir and the data cache, and nothing lost on resume.

The real CLI runs in a subprocess with a fresh cwd, HOME, TMPDIR and XDG directories (MPLCONFIGDIR
and CBERT_JAX_CACHE unset); every file it creates must lie under --workdir or data.cache_dir.
"""

import json
import os
import subprocess
import sys

from tests import xla_flags
from tests.cli_helpers import tiny_flags

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SKIP_IN_REPO = {".git", ".venv", ".venv-ci", "__pycache__", ".pytest_cache"}
WORKDIR_FILES = {
  "checkpoints",
  "config.json",
  "eval",  # eval/val_full-step_<N>.json: the full-split validation loss (config.final_validation)
  "metrics.jsonl",
  "metrics.png",
  "parameters.txt",
  "tb",
  "tokenizer.model",
}


def _files(top: str, skip=frozenset()) -> set[str]:
  """Every file and directory below `top`, as paths relative to it."""
  out = set()
  for dirpath, dirnames, filenames in os.walk(top):
    dirnames[:] = [d for d in dirnames if d not in skip]
    rel = os.path.relpath(dirpath, top)
    out.update(os.path.normpath(os.path.join(rel, n)) for n in dirnames + filenames)
  return out


def _train(tmp, total_steps: int, plot: bool = True) -> subprocess.CompletedProcess:
  env = {
    k: v
    for k, v in os.environ.items()
    if k not in ("CBERT_JAX_CACHE", "MPLCONFIGDIR") and not k.startswith("XDG_")
  }
  env |= {
    "HOME": str(tmp / "home"),
    "TMPDIR": str(tmp / "tmp"),
    "XDG_CACHE_HOME": str(tmp / "xdg_cache"),
    "XDG_CONFIG_HOME": str(tmp / "xdg_config"),
    "XDG_DATA_HOME": str(tmp / "xdg_data"),
    "PYTHONPATH": ROOT,
    "XLA_FLAGS": xla_flags.flags(2),
  }
  args = [
    sys.executable,
    "-m",
    "cbert_jax.main",
    f"--config={ROOT}/experiments/smoke.py",
    f"--workdir={tmp / 'W'}",
    *tiny_flags(tmp / "C"),
    f"--config.plot={str(plot).lower()}",
    f"--config.total_steps={total_steps}",
    "--config.checkpoint_every=2",
    "--config.log_every=1",
  ]
  return subprocess.run(args, cwd=tmp / "cwd", env=env, capture_output=True, text=True, timeout=300)


def test_a_run_writes_only_its_workdir_and_cache_and_resumes_without_loss(tmp_path):
  for d in ("cwd", "home", "tmp", "xdg_cache", "xdg_config", "xdg_data"):
    (tmp_path / d).mkdir()
  before, repo_before = _files(tmp_path), _files(ROOT, SKIP_IN_REPO)

  r = _train(tmp_path, total_steps=3)
  assert r.returncode == 0, r.stderr[-3000:]
  stray = sorted(p for p in _files(tmp_path) - before if p.split(os.sep)[0] not in ("W", "C"))
  assert not stray, stray  # nothing in cwd, HOME, TMPDIR, XDG dirs
  assert not _files(ROOT, SKIP_IN_REPO) - repo_before  # nor in the repository
  w, c = tmp_path / "W", tmp_path / "C"
  assert set(os.listdir(w)) == WORKDIR_FILES  # no diagnostics/ in a healthy run
  assert sorted(os.listdir(w / "checkpoints")) == ["2", "3"]
  assert os.listdir(w / "tb") and all(
    n.startswith("events.out.tfevents.") for n in os.listdir(w / "tb")
  )
  # The cache: the tokenizer, the packed data, matplotlib's font cache (not ~/.cache/matplotlib)
  # and the build locks of the data preparation (data/build_lock.py; empty files).
  assert set(os.listdir(c)) == {"tokenizers", "packed", "matplotlib", "locks"}
  assert all(os.path.getsize(c / "locks" / n) == 0 for n in os.listdir(c / "locks"))
  assert any(n.endswith(".model") for n in os.listdir(c / "tokenizers"))
  assert any(n.endswith(".npz") for n in os.listdir(c / "packed"))
  leftovers = [
    p for p in _files(tmp_path) if os.path.basename(p).startswith(".tmp") or p.endswith(".tmp")
  ]
  assert not leftovers, leftovers  # no temp files left behind

  r = _train(tmp_path, total_steps=5, plot=False)  # resume the same workdir
  assert r.returncode == 0, r.stderr[-3000:]
  assert "resumed from checkpoint at step 3" in r.stderr
  stray = sorted(p for p in _files(tmp_path) - before if p.split(os.sep)[0] not in ("W", "C"))
  assert not stray, stray
  assert set(os.listdir(w)) == WORKDIR_FILES
  assert sorted(os.listdir(w / "checkpoints")) == ["4", "5"]  # keep_checkpoints=2 pruned 2 and 3
  records = [json.loads(line) for line in (w / "metrics.jsonl").read_text().splitlines()]
  assert [m["step"] for m in records if "train/loss" in m] == [1, 2, 3, 4, 5]
  assert [m["step"] for m in records if "eval/loss" in m] == [3, 5]  # each invocation's final eval
  # each invocation's full-split validation loss, in the final eval row and in eval/
  assert [m["step"] for m in records if "val_full/loss" in m] == [3, 5]
  assert sorted(os.listdir(w / "eval")) == ["val_full-step_3.json", "val_full-step_5.json"]
