r"""A one-member "sweep" planned for 2 (or 4) devices: the member the launch simulations run.

  python -m launch.sweep --config tests/data/launch_member.py:sim2 --backend slurm ...

Scales: `sim2` (the member is planned for 2 devices) and `sim4` (4). The member is BERT d32L2 on
tests/data/tiny_corpus.txt (`data.corpus=files`), 30 steps of 8 rows x 32 tokens (enough for a
test to stop it mid-run), every step logged, no checkpoint before the last step unless stopped
(SIGTERM, stop_after_step). Its probe
(`--config.mode=eval`) runs on one synthetic classification task, registered in the process
only when CBERT_SIM_TOY_TASKS=1 (the stub commands in tests/stubs/ set it), so nothing is
downloaded; elsewhere this file changes nothing.

The file is self-contained (it imports only cbert_jax), so a code snapshot that holds it (the
launcher copies the experiment file into its snapshot) runs it as is; from a snapshot, point the
corpus at this checkout (--override=--config.data.corpus_files=<repo>/tests/data/tiny_corpus.txt):
the snapshot holds this file, not its neighbours.
"""

import os

from cbert_jax import config_lib
from cbert_jax.errors import ConfigError

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "tiny_corpus.txt")
SCALES = {"sim2": 2, "sim4": 4}  # scale -> the devices its member is planned for
STEPS = 30
TOY_TASK = "toy_cls"


def get_sweep(arg=None) -> list[str]:
  scale = _scale(arg)
  return [f"scale={scale},model=bert,size=d32L2"]


def workdir_name(arg) -> str:
  del arg
  return "bert_d32L2"


def _scale(arg) -> str:
  arg = (arg or "sim2").strip()
  scale = dict(p.split("=", 1) for p in arg.split(",") if "=" in p).get("scale", arg)
  if scale not in SCALES:
    raise ConfigError(
      f"tests/data/launch_member.py: scale must be one of {', '.join(SCALES)}, got {scale!r}"
    )
  return scale


def get_config(arg=None):
  c = config_lib.base_config()
  scale = _scale(arg)
  c.sweep.scale = scale
  c.sweep.arg = arg or ""
  if "model=" not in (arg or ""):  # the whole (one-member) sweep
    c.mode = "sweep"
    c.name = f"launch_sim_{scale}"
    return c
  c.name = f"launch_sim_{scale}/bert_d32L2"
  c.model_name = "bert"
  c.model.size = "d32L2"
  c.total_steps = STEPS
  c.batch_size = 8
  c.log_every = 1  # every step logged: all processes agree on a stop each step
  c.checkpoint_every = 1000  # no periodic checkpoint: only the final one or a stop's
  c.eval_batches = 1
  c.data.seq_len = 32
  c.data.corpus = "files"
  c.data.corpus_files = CORPUS
  c.data.vocab_size = 400
  c.optim.warmup_steps = 2
  c.peak_flops = 1e11  # skip the start-up matmul measurement
  c.final_validation = False  # not what the launch simulations test
  c.plot = False
  c.sweep.target_devices = SCALES[scale]
  c.evals.tasks = TOY_TASK
  c.evals.probes = "ridge"
  c.evals.seq_len = 16
  c.evals.batch_size = 16
  return c


def _toy_tasks():
  """One synthetic classification task decided by a marker word (as tests/test_eval_suite.py)."""
  import numpy as np  # pylint: disable=import-outside-toplevel

  from cbert_jax.data.tasks import tfds as task_tfds  # pylint: disable=import-outside-toplevel

  words = "the a of and to in that it was for on with as his at by from had not be".split()
  rs = np.random.RandomState(0)

  def split(n):
    texts = [
      " ".join([m] * 3 + list(rs.choice(words, 6))) for m in ("good", "bad") for _ in range(n // 2)
    ]
    return {
      "ids": [str(i) for i in range(n)],
      "texts": texts,
      "labels": np.array([1] * (n // 2) + [0] * (n // 2), np.int32),
    }

  task = task_tfds.Task(
    TOY_TASK,
    "classification",
    "accuracy",
    ("bad", "good"),
    splits={"train": split(64), "dev": split(32), "test": split(32)},
  )
  task_tfds.list_tasks = lambda: [TOY_TASK]
  task_tfds.load_task = lambda name, **kw: task


if os.environ.get("CBERT_SIM_TOY_TASKS") == "1":
  _toy_tasks()
