"""Bad input gets one clear line naming the field or file, exit status 2, and changes nothing.

Every case is a row of the table in docs/errors.md, and asserts the
fragment that table shows. Command-line cases run the real CLI (flag parsing fails in ~2 s; a
validation error after importing the trainer in ~4 s); the workdir check's edge cases and the
cheap range checks run in-process.
"""

import json
import logging
import os
import re
import time

import pytest

from cbert_jax import config_lib, train
from cbert_jax.errors import ConfigError
from cbert_jax.run import workdir as workdir_lib
from tests.cli_helpers import cli, run_cli
from tests.helpers import tiny_config

# An experiment file with the mistakes ml_collections lets through (or reports as a traceback).
BAD_EXPERIMENT = """
from cbert_jax import config_lib

def get_config(arg=None):
  c = config_lib.base_config()
  if arg == "str":
    c.total_steps = "300"       # ml_collections: TypeError (named with its line)
  if arg == "none":
    c.total_steps = None        # accepted by ml_collections
  if arg == "typo":
    c.totalsteps = 300          # a new field: accepted by ml_collections, silently unused before
  if arg == "syntax":
    exec("def f(:")             # code that does not compile (a traceback before)
  return c
"""


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
  return str(tmp_path_factory.mktemp("bad_input_cache"))


# Experiment files that fail before get_config returns (a traceback before issue 33): "{dir}" in a
# case is their folder.
BROKEN_EXPERIMENTS = {
  "does_not_compile.py": "from cbert_jax import config_lib\n\ndef get_config(arg=None:\n  pass\n",
  "raises_at_import.py": 'import os\n\nROOT = os.environ["CBERT_NO_SUCH_VARIABLE"]\n',
  "raises_in_get_config.py": (
    "from cbert_jax import config_lib\n\n\ndef get_config(arg=None):\n"
    "  c = config_lib.base_config()\n"
    '  raise ValueError("no preset named " + repr(arg))  # a mistake of its own\n'
  ),
}


@pytest.fixture(scope="module")
def bad_experiment(tmp_path_factory):
  folder = tmp_path_factory.mktemp("experiments")
  for name, text in BROKEN_EXPERIMENTS.items():
    (folder / name).write_text(text)
  path = folder / "bad_experiment.py"
  path.write_text(BAD_EXPERIMENT)
  return str(path)


def snapshot(root) -> dict[str, bytes]:
  """Every file under `root` (relative path -> bytes); {} when `root` does not exist."""
  out = {}
  for dirpath, _, files in os.walk(root):
    for name in files:
      path = os.path.join(dirpath, name)
      with open(path, "rb") as f:
        out[os.path.relpath(path, root)] = f.read()
  return out


# (extra flags, fragment of the one stderr line). "{exp}" is the bad experiment file, "{dir}" its
# folder (with BROKEN_EXPERIMENTS).
CLI_CASES = [
  # config field of the wrong type
  pytest.param(
    ["--config.batch_size=abc"],
    "config error: --config.batch_size=abc: expected int, got 'abc'",
    id="type-flag-int",
  ),
  pytest.param(
    ["--config.masking.mask_ratio=high"],
    "config error: --config.masking.mask_ratio=high: expected float, got 'high'",
    id="type-flag-float",
  ),
  pytest.param(
    ["--config.plot=maybe"],
    "config error: --config.plot=maybe: expected true or false, got 'maybe'",
    id="type-flag-bool",
  ),
  pytest.param(
    ["--config={exp}:str"],
    'config error: --config={exp}:str: get_config failed: {exp}:7 (c.total_steps = "300"): '
    "TypeError: ",
    id="type-experiment-str",
  ),
  pytest.param(
    ["--config={exp}:none"],
    "config error: total_steps: expected int, got None",
    id="type-experiment-none",
  ),
  # unknown field
  pytest.param(
    ["--config.model.mask_ratio=0.3"],
    "config error: --config.model.mask_ratio=0.3: "
    "unknown config field 'model.mask_ratio' (did you mean 'masking.mask_ratio'?)",
    id="unknown-flag",
  ),
  pytest.param(  # used to train uphill and exit 0
    ["--config.optim.lr=-0.001"],
    "config error: optim.lr must be positive (the peak learning rate), got -0.001",
    id="negative-lr",
  ),
  pytest.param(  # a top-level field: ml_collections' message carries a suggestion of its own
    ["--config.total_step=10"],
    "config error: --config.total_step=10: "
    "unknown config field 'total_step' (did you mean 'total_steps'?)",
    id="unknown-flag-top-level",
  ),
  pytest.param(
    ["--config={exp}:typo"],
    "config error: unknown config field 'totalsteps' (did you mean 'total_steps'?)",
    id="unknown-experiment",
  ),
  pytest.param(
    ["--config=experiments/nope.py"],
    "config error: --config=experiments/nope.py: no such experiment file 'experiments/nope.py'",
    id="experiment-missing",
  ),
  pytest.param(
    ["--config={exp}:syntax"],
    'config error: --config={exp}:syntax: get_config failed: {exp}:13 (exec("def f(:")): '
    "SyntaxError: invalid syntax",
    id="experiment-syntax",
  ),
  pytest.param(  # the file itself does not compile: the SyntaxError's file:line and message
    ["--config={dir}/does_not_compile.py"],
    "config error: --config={dir}/does_not_compile.py: does not load: "
    "{dir}/does_not_compile.py:3 (def get_config(arg=None:): SyntaxError: invalid syntax",
    id="experiment-does-not-compile",
  ),
  pytest.param(
    ["--config={dir}/raises_at_import.py"],
    "config error: --config={dir}/raises_at_import.py: does not load: "
    '{dir}/raises_at_import.py:3 (ROOT = os.environ["CBERT_NO_SUCH_VARIABLE"]): '
    "KeyError: 'CBERT_NO_SUCH_VARIABLE'",
    id="experiment-raises-at-import",
  ),
  pytest.param(
    ["--config={dir}/raises_in_get_config.py:big"],
    "config error: --config={dir}/raises_in_get_config.py:big: get_config failed: "
    '{dir}/raises_in_get_config.py:6 (raise ValueError("no preset named " + repr(arg))): '
    "ValueError: no preset named 'big'",
    id="experiment-raises-in-get-config",
  ),
  pytest.param(
    ["--config.sweep.n_params=4"],
    "config error: --config.sweep.n_params=4: sweep.n_params (N, the parameters counted under "
    "sweep.n_definition) is derived for a sweep member, not a setting",
    id="derived-field",
  ),
  # corpus or tokenizer missing (with an existing workdir: left as it was)
  pytest.param(
    ["--config.data.corpus_files=/nope/corpus.txt"],
    "config error: data.corpus_files: no such file '/nope/corpus.txt'",
    id="corpus-missing",
  ),
  pytest.param(
    ["--config.data.tokenizer_path=/nope/sp.model"],
    "config error: data.tokenizer_path: no such file '/nope/sp.model'",
    id="tokenizer-missing",
  ),
]


@pytest.mark.parametrize("flags,expected", CLI_CASES)
def test_cli_bad_input(tmp_path, cache, bad_experiment, flags, expected):
  existing = "no such file" in expected
  workdir = tmp_path / "w"
  if existing:  # a workdir that is already there must be left exactly as it was
    workdir.mkdir()
    (workdir / "notes.txt").write_text("mine")
  before = snapshot(workdir)
  folder = os.path.dirname(bad_experiment)
  fill = lambda text: text.replace("{exp}", bad_experiment).replace("{dir}", folder)
  flags = [fill(f) for f in flags]
  spec = [f.split("=", 1)[1] for f in flags if f.startswith("--config=")]  # one --config only
  r = run_cli(
    cli(
      workdir,
      cache,
      *(f for f in flags if not f.startswith("--config=")),
      config=spec[0] if spec else "experiments/smoke.py",
    )
  )
  assert r.returncode == 2, r.stderr[-3000:]
  assert fill(expected) in r.stderr, r.stderr[-3000:]
  assert "Traceback" not in r.stderr
  errors = [l for l in r.stderr.splitlines() if "error" in l.lower()]
  assert len(errors) == 1, errors  # one line
  assert snapshot(workdir) == before and workdir.exists() == existing


def test_seq_len_beyond_memory_fails_fast_before_data_preparation(tmp_path):
  """`data.seq_len=1000000` prepared the data, then died out of memory with a traceback; now the
  memory plan's verdict on this host's 2 CPU devices (cbert_jax/run/memory_fit.py) is one line,
  in seconds, before the data cache or the workdir is touched."""
  cache, workdir = tmp_path / "cache", tmp_path / "w"
  start = time.monotonic()
  r = run_cli(cli(workdir, cache, "--config.data.seq_len=1000000"))
  elapsed = time.monotonic() - start
  assert r.returncode == 2, r.stderr[-3000:]
  assert (
    "config error: data.seq_len=1000000 with batch_size=8 does not fit in memory: the memory "
    "plan (cbert_jax/scaling/memory.py; remat=none, ce_chunk=0, microbatches=1) needs "
  ) in r.stderr, r.stderr[-3000:]
  assert re.search(
    r"needs [\d.]+ [TPE]iB per device plus a 25% margin, but the budget is [\d.]+ [MGT]iB per "
    r"device \(80% of this host's [\d.]+ [MGT]iB (available memory|cgroup memory limit|physical "
    r"memory), shared by its 2 cpu devices\); lower data\.seq_len \(attention's memory grows "
    r"with its square\) or batch_size$",
    r.stderr,
    re.M,
  ), r.stderr[-3000:]
  assert "Traceback" not in r.stderr
  assert len([l for l in r.stderr.splitlines() if "error" in l.lower()]) == 1
  assert not cache.exists() and not workdir.exists()  # no data prepared, nothing written
  assert elapsed < 30, elapsed  # ~4 s: the CLI's imports and the check, no data preparation


# The same through `train.run` in-process (8 fake devices, conftest.py); main.py prints each as
# "config error: <message>" with exit status 2, as the CLI cases above show.
RUN_CASES = [
  pytest.param({"batch_size": 0}, "batch_size must be positive, got 0", id="zero-batch"),
  pytest.param(
    {"mesh.data": 3, "num_devices": 0},
    "mesh {'data': 3, 'fsdp': 1, 'tensor': 1} needs 3 devices, but 8 are available",
    id="mesh-vs-devices",
  ),
  pytest.param(
    {"num_devices": 16}, "num_devices=16, but only 8 devices are available", id="num-devices"
  ),
  pytest.param(
    {"batch_size": 12, "num_devices": 0},
    "batch_size=12 is not divisible by the data-parallel size 8",
    id="batch-vs-data-axes",
  ),
  pytest.param(
    {"model.predictor_positions": "learned", "model.max_positions": 16},
    "model.max_positions=16 is smaller than data.seq_len=32",
    id="seq-len-vs-max-positions",
  ),
  pytest.param(
    {"stop_after_step": 20}, "stop_after_step=20 is beyond total_steps=8", id="stop-after-total"
  ),
  pytest.param(
    {"data.corpus_files": "/nope/*.txt"},
    "data.corpus_files: the pattern '/nope/*.txt' matches no file",
    id="corpus-glob-empty",
  ),
  pytest.param(
    {"data.corpus": "wiki"},
    "data.corpus must be one of 'gutenberg', 'files', "
    "'offline_small', 'offline_full', 'sources', got 'wiki'",
    id="corpus-unknown",
  ),
  pytest.param(
    {"sweep.target_devices": 16, "num_devices": 0},
    "sweep.target_devices=16: this member is planned for 16 devices (its batch, "
    "learning rate and memory plan assume them), but the run sees 8 (1 process x 8 "
    "local cpu devices); likely cause: a single process sees only this host's devices",
    id="planned-vs-actual-devices",
  ),
  pytest.param(
    {"sweep.target_devices": 8, "num_devices": 4},
    "but the run sees 4 (1 process x 8 local cpu devices); config.num_devices=4 "
    "restricts the run to the first 4 devices",
    id="planned-vs-num-devices",
  ),
]


@pytest.mark.parametrize("overrides,expected", RUN_CASES)
def test_run_bad_input(tmp_path, cache, overrides, expected, monkeypatch):
  import cbert_jax.data.prepare as prepare_lib  # pylint: disable=g-import-not-at-top

  prepared = []
  monkeypatch.setattr(prepare_lib, "prepare", lambda *a, **k: prepared.append(1))
  workdir = tmp_path / "w"
  workdir.mkdir()
  (workdir / "notes.txt").write_text("mine")
  with pytest.raises(ConfigError) as e:
    train.run(tiny_config(cache, **overrides), str(workdir))
  assert expected in str(e.value)
  assert not prepared  # nothing expensive
  assert snapshot(workdir) == {"notes.txt": b"mine"}  # nothing written


def test_workdir_of_another_config_is_refused_unless_allowed(tmp_path, cache, cli_jax_cache):
  workdir = tmp_path / "w"
  base = ["--config.total_steps=4", "--config.log_every=1"]
  r = run_cli(cli(workdir, cache, *base, "--config.stop_after_step=2"), jax_cache=cli_jax_cache)
  assert r.returncode == 0, r.stderr[-3000:]
  before = snapshot(workdir)
  assert {"config.json", "metrics.jsonl"} <= set(before) and any(
    p.startswith("checkpoints/2/") for p in before
  )

  # Another lr and seed: refused, naming the workdir and the fields; nothing written.
  changed = [*base, "--config.optim.lr=0.001", "--config.seed=1"]
  r = run_cli(cli(workdir, cache, *changed), jax_cache=cli_jax_cache)
  assert r.returncode == 2, r.stderr[-3000:]
  assert (
    f"config error: workdir {workdir} holds a run with a different config (config.json): "
    "optim.lr 0.003 -> 0.001, seed 0 -> 1; rerun with its config to resume, use another "
    "--workdir for a new run, or set --config.allow_config_change=true"
  ) in r.stderr
  assert "Traceback" not in r.stderr
  assert snapshot(workdir) == before  # byte-identical

  # Allowed: resumes from the checkpoint, says what changed, keeps the old config.json.
  r = run_cli(
    cli(workdir, cache, *changed, "--config.allow_config_change=true"), jax_cache=cli_jax_cache
  )
  assert r.returncode == 0, r.stderr[-3000:]
  assert "allow_config_change: resuming" in r.stderr and "optim.lr 0.003 -> 0.001" in r.stderr
  assert "resumed from checkpoint at step 2" in r.stderr
  assert (workdir / "config.previous-1.json").read_bytes() == before["config.json"]
  saved = json.loads((workdir / "config.json").read_text())["config"]
  assert saved["optim"]["lr"] == 0.001 and saved["seed"] == 1
  assert (workdir / "metrics.jsonl").read_bytes().startswith(before["metrics.jsonl"])


def _saved(workdir, config) -> None:
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, "config.json"), "w") as f:
    json.dump({"config": json.loads(config.to_json_best_effort())}, f)


def test_workdir_check_ignores_resumable_fields(tmp_path, caplog):
  old = config_lib.resolve(config_lib.base_config())
  _saved(tmp_path, old)
  new = config_lib.resolve(config_lib.base_config())
  new.total_steps, new.stop_after_step, new.evals.tasks, new.mesh.fsdp = 5000, 10, "sentiment", 2
  new.model.remat, new.data.cache_dir, new.model.vocab_size = "full", "/elsewhere", 0
  new.sweep.laws_source = "sweep.lr and sweep.batch_size set explicitly"  # reworded provenance
  # launch.sweep names the experiment file relative to the repo, the in-process runner absolute
  new.sweep.experiment = "experiments/hparam_grid.py"
  with caplog.at_level(logging.INFO):
    assert workdir_lib.check_config(str(tmp_path), new) == []
  assert f"resuming {tmp_path} with changed data.cache_dir '' -> '/elsewhere'" in caplog.text
  assert "total_steps 1000 -> 5000" in caplog.text and "vocab_size" not in caplog.text
  assert workdir_lib.check_config(str(tmp_path / "fresh"), new) == []  # no config.json: nothing
  new.model.size, new.model.d_model = "d64L2", 64
  with pytest.raises(
    ConfigError, match=r"model\.d_model 128 -> 64, model\.size 'd128L4' -> 'd64L2'"
  ):
    workdir_lib.check_config(str(tmp_path), new)
  # A field the old config.json lacks (added by a newer version) is not compared.
  with open(tmp_path / "config.json") as f:
    saved = json.load(f)
  del saved["config"]["faults"]
  (tmp_path / "config.json").write_text(json.dumps(saved))
  assert workdir_lib.check_config(str(tmp_path), config_lib.resolve(config_lib.base_config())) == []


def test_workdir_with_an_unreadable_config_json_is_refused_unless_allowed(tmp_path):
  (tmp_path / "config.json").write_text('{"config": {"seed"')  # cut off mid-write
  c = config_lib.resolve(config_lib.base_config())
  with pytest.raises(
    ConfigError, match=r"workdir .*: cannot read its config\.json \(JSONDecodeError"
  ):
    workdir_lib.check_config(str(tmp_path), c)
  assert os.listdir(tmp_path) == ["config.json"]
  c.allow_config_change = True
  assert workdir_lib.check_config(str(tmp_path), c) == []
  assert (tmp_path / "config.previous-1.json").read_text() == '{"config": {"seed"'


@pytest.mark.parametrize(
  "field,value,expected",
  [
    ("eval_every", -5, "eval_every must be >= 0 (0 = only at the end), got -5"),
    ("evals.every", -1, "evals.every must be >= 0 (0 = off), got -1"),
    ("keep_checkpoints", 0, "keep_checkpoints must be >= 1, got 0"),
    ("eval_batches", 0, "eval_batches must be >= 1, got 0"),
    (
      "sharding_rules",
      (("batch", "data"),),
      "sharding_rules: no rule for embed, mlp, heads, vocab",
    ),
    ("sharding_rules", (("batch", "pipe"),), "sharding_rules: expected (logical name, mesh axes)"),
    ("optim.lr", 0.0, "optim.lr must be positive (the peak learning rate), got 0.0"),
    ("optim.lr", float("nan"), "optim.lr must be a finite number, got nan"),
    ("optim.lr", float("inf"), "optim.lr must be a finite number, got inf"),
    ("optim.warmup_steps", -3, "optim.warmup_steps must be >= 0 (0 = warmup_frac), got -3"),
    ("optim.b2", 1.0, "optim.b2 must be in [0, 1), got 1.0"),
    ("optim.eps", 0.0, "optim.eps must be positive, got 0.0"),
    ("optim.weight_decay", -0.1, "optim.weight_decay must be >= 0 (0 = off), got -0.1"),
    ("optim.decay_frac", 1.5, "optim.decay_frac must be in [0, 1], got 1.5"),
    ("optim.decay_shape", "step", "optim.decay_shape must be linear|cosine, got 'step'"),
  ],
)
def test_counts_and_rules_out_of_range(field, value, expected):
  c = config_lib.resolve(config_lib.base_config())
  *parents, leaf = field.split(".")
  node = c
  for p in parents:
    node = node[p]
  node[leaf] = value
  with pytest.raises(ConfigError) as e:
    config_lib.validate(c, 1)
  assert expected in str(e.value)
