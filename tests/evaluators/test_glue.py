"""GLUE through tensorflow-datasets, offline: `tfds.testing.mock_data` stands in for the download.

Two kinds of mock: tfds's own random rows of GLUE's real feature spec (schema, splits, caps, no
TensorFlow), and a planted data source whose labels are decided by marker words, so the probes
must score far above chance on validation (which also proves texts and labels stay aligned).
"""

import json
import os
import re
import subprocess
import sys
import textwrap
import zlib

import numpy as np
import pytest
import tensorflow_datasets as tfds
from flax import nnx

from cbert_jax import config_lib, evaluate
from cbert_jax.errors import ConfigError
from cbert_jax.evaluators import glue
from tests import helpers
from tests.helpers import WORDS, eval_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_every_glue_task_loads_under_mock_data_with_its_fields_and_caps(tmp_path):
  with tfds.testing.mock_data(num_examples=12):
    for name, spec in glue.GLUE_TASKS.items():
      task = glue.load_task(name, data_dir=str(tmp_path), max_train=8, max_eval=5)
      assert task.name == f"glue/{name}" and task.metric == spec.metric
      assert list(task.splits) == ["train", *spec.eval_splits]
      assert task.headline_split == spec.eval_splits[0] and task.extra_metrics == spec.also
      for split, d in task.splits.items():
        n = 8 if split == "train" else 5  # capped subsets of 12 rows
        assert len(d["ids"]) == n == len(set(d["ids"])) == len(d["labels"])
        keys = {"texts"} if len(spec.fields) == 1 else {"texts_a", "texts_b"}
        assert keys <= set(d) and all(isinstance(t, str) for k in keys for t in d[k])
        if spec.kind == "regression":
          assert d["labels"].dtype == np.float32
        else:
          assert d["labels"].dtype == np.int32
          assert d["labels"].min() >= 0 and d["labels"].max() < len(spec.label_names)


def test_glue_reading_needs_no_tensorflow(tmp_path):
  # A fresh interpreter where `import tensorflow` fails: the whole GLUE path must still work.
  code = textwrap.dedent(f"""
      import sys

      class WithoutTensorFlow:                  # Python now sees no TensorFlow, even if installed
        def __init__(self, finders):
          self.finders = finders
        def find_spec(self, name, path=None, target=None):
          if name.split(".")[0] == "tensorflow":
            return None
          for finder in self.finders:
            spec = finder.find_spec(name, path, target) if hasattr(finder, "find_spec") else None
            if spec is not None:
              return spec
          return None
      sys.meta_path[:] = [WithoutTensorFlow(list(sys.meta_path))]
      import tensorflow_datasets as tfds
      from cbert_jax.evaluators import glue
      with tfds.testing.mock_data(num_examples=6):
        task = glue.load_task("mnli", data_dir={str(tmp_path)!r})
      assert "tensorflow" not in sys.modules
      print(sorted(task.splits), len(task.splits["validation_mismatched"]["ids"]))
  """)
  out = subprocess.run(
    [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300
  )
  assert out.returncode == 0, out.stderr[-2000:]
  assert out.stdout.strip().splitlines()[-1] == (
    "['train', 'validation_matched', 'validation_mismatched'] 6"
  )


def _planted_rows(config: str, split: str, n: int) -> list[dict]:
  """GLUE-shaped rows whose label is decided by marker words; every split draws fresh rows."""
  rs = np.random.RandomState(zlib.crc32(f"{config}/{split}".encode()))
  rows = []
  for i in range(n):
    filler = lambda: " ".join(rs.choice(WORDS, 5))
    if config == "sst2":
      y = i % 2
      rows.append({"idx": i, "label": y, "sentence": f"{['bad ', 'good '][y] * 3}{filler()}"})
    elif config == "mnli":
      y = i % 3
      rows.append(
        {
          "idx": i,
          "label": y,
          "premise": filler(),
          "hypothesis": f"{['yes ', 'maybe ', 'no '][y] * 3}{filler()}",
        }
      )
    elif config == "mrpc":
      y = i % 2
      rows.append(
        {
          "idx": i,
          "label": y,
          "sentence1": f"{['cat ', 'dog '][y] * 3}{filler()}",
          "sentence2": filler(),
        }
      )
    elif config == "stsb":
      k = int(rs.randint(0, 4))  # how many "same" markers
      rows.append(
        {
          "idx": i,
          "label": np.float32(k * 5 / 3),
          "sentence1": " ".join(["same"] * (3 * k) + [filler()]),
          "sentence2": filler(),
        }
      )
  rs.shuffle(rows)
  return rows


def _planted_source(self, split, **kwargs):
  return _planted_rows(self.builder_config.name, split, 120 if split == "train" else 60)


@pytest.fixture(scope="module")
def backbone():
  return nnx.split(helpers.build("bert", seed=0), nnx.Param)


def test_glue_probes_find_a_planted_signal_on_validation(tmp_path, backbone):
  graphdef, params = backbone
  ecfg = config_lib.base_config().evals
  ecfg.seq_len, ecfg.batch_size, ecfg.max_train, ecfg.max_eval = 16, 32, 100, 50
  with tfds.testing.mock_data(as_data_source_fn=_planted_source):
    results = glue.run(
      graphdef,
      params,
      helpers.WordTokenizer(),
      ecfg,
      cache_dir=str(tmp_path),
      tasks=["sst2", "mnli", "mrpc", "stsb"],
    )
  assert set(results) == {"glue/sst2", "glue/mnli", "glue/mrpc", "glue/stsb", "average"}
  assert results["glue/sst2"]["sizes"] == {"train": 100, "validation": 50}  # the caps
  assert results["glue/sst2"]["ridge"]["validation"] > 0.9  # chance: 0.5
  for split in ("validation_matched", "validation_mismatched"):
    assert results["glue/mnli"]["ridge"][split] > 0.9  # chance: 0.33
    assert results["glue/mnli"]["knn"][split] > 0.6
  mrpc = results["glue/mrpc"]
  assert mrpc["metric"] == "f1" and mrpc["ridge"]["validation"] > 0.9
  assert mrpc["extra"]["ridge"]["validation"]["accuracy"] > 0.9  # GLUE's second number
  assert results["glue/stsb"]["ridge"]["validation"] > 0.8  # Spearman; chance: 0
  # The average is over each task's headline split (MNLI: matched).
  heads = [
    results["glue/sst2"]["ridge"]["validation"],
    results["glue/mnli"]["ridge"]["validation_matched"],
    mrpc["ridge"]["validation"],
    results["glue/stsb"]["ridge"]["validation"],
  ]
  assert results["average"]["ridge"] == pytest.approx(np.mean(heads))
  table = glue.markdown(results)
  assert "| glue/mnli | validation_mismatched | accuracy |" in table
  assert re.search(r"\| glue/mrpc \| validation \| f1 \| .* \| accuracy \d\.\d{4} \|", table)


def test_glue_task_names_and_download_failures_are_one_line_errors(tmp_path, monkeypatch):
  assert glue.task_names("") == list(glue.DEFAULT_TASKS)
  assert glue.task_names(" rte, wnli ") == ["rte", "wnli"]
  with pytest.raises(ConfigError, match="evals.glue_tasks: unknown GLUE task 'sst'"):
    glue.task_names("sst")

  def offline(self, **kwargs):
    raise ConnectionError("network unreachable")

  monkeypatch.setattr(tfds.core.DatasetBuilder, "download_and_prepare", offline)
  with pytest.raises(
    ConfigError,
    match=r"could not prepare glue/cola in .*needs internet.*"
    r"ConnectionError: network unreachable",
  ):
    glue.load_task("cola", data_dir=str(tmp_path))

  def no_tf(self, **kwargs):  # what TFDS's extractor raises without TF
    raise ModuleNotFoundError("No module named 'tensorflow'")

  monkeypatch.setattr(tfds.core.DatasetBuilder, "download_and_prepare", no_tf)
  with pytest.raises(
    ConfigError,
    match=r"preparing glue/rte .* needs TensorFlow: "
    r"pip install -e '\.\[tf\]'",
  ):
    glue.load_task("rte", data_dir=str(tmp_path))


def test_mode_eval_runs_the_glue_suite_and_writes_its_files(tmp_path, cache, toy_tasks, capsys):
  cfg = eval_config(cache, mode="eval")
  cfg.evals.init = "random"
  cfg.evals.suites = "glue"
  cfg.evals.glue_tasks = "sst2"
  cfg.evals.max_train, cfg.evals.max_eval = 100, 50
  with tfds.testing.mock_data(as_data_source_fn=_planted_source):
    results = evaluate.run(cfg, str(tmp_path))
  [path] = (tmp_path / "eval").glob("glue-random_init-*.json")
  saved = json.loads(path.read_text())
  assert saved["suite"] == "glue" and saved["results"] == json.loads(json.dumps(results))
  assert (tmp_path / "eval" / path.name.replace(".json", ".md")).exists()
  assert "| glue/sst2 | validation | accuracy |" in capsys.readouterr().out
  assert not list((tmp_path / "eval").glob("random_init*.json"))  # offline suite not run
  cfg.evals.suites = "offline,gleu"
  with pytest.raises(ConfigError, match="evals.suites: unknown suite 'gleu'"):
    evaluate.run(cfg, str(tmp_path))
