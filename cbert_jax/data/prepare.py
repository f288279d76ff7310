"""The data entry point: corpus -> tokenizer -> packed rows, cached (`prepare`).

`prepare(cfg, seq_len)` runs `corpus.load_corpus`, `tokenizer.get_tokenizer` and
`packing.pack` for train and val and caches the packed arrays as one `.npz` under
`<cache>/packed/`; with `data.corpus = "sources"` it hands over to
`preprocess.prepare_sources` (sharded ArrayRecord rows). The packing algorithm itself is in
packing.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import zipfile
import zlib
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np
from absl import logging

from cbert_jax.data import build_lock, cache_entry, fetch, packing, preprocess, settings
from cbert_jax.data import corpus as corpus_lib
from cbert_jax.data import tokenizer as tokenizer_lib
from cbert_jax.errors import ConfigError

MIN_SEQ_LEN = 8
T = TypeVar("T")


def _manifest(
  corpus: corpus_lib.Corpus,
  tok: tokenizer_lib.Tokenizer,
  seq_len: int,
  train: dict[str, np.ndarray],
  val: dict[str, np.ndarray],
) -> dict[str, Any]:
  """The corpus manifest plus tokenizer/packing facts and a hash of the whole."""
  manifest = dict(corpus.manifest)
  manifest.update(
    tokenizer=dict(
      sha256=tok.sha256,
      vocab_size=tok.vocab_size,
      mask_id=tok.mask_id,
      special_ids=list(tok.special_ids),
      file=os.path.basename(tok.model_path),
    ),
    seq_len=seq_len,
    pack_version=packing.PACK_VERSION,
    rows=dict(train=int(train["tokens"].shape[0]), val=int(val["tokens"].shape[0])),
    tokens=dict(
      train=int(np.count_nonzero(train["segment_ids"])),
      val=int(np.count_nonzero(val["segment_ids"])),
    ),
  )
  manifest["hash"] = hashlib.sha256(
    json.dumps(_content_only(manifest), sort_keys=True).encode()
  ).hexdigest()
  return manifest


# Manifest entries that describe a build (how long it took, where the cache lives), not the data:
# left out of the hash, so the same data has the same hash on every machine.
_VOLATILE_KEYS = frozenset({"timings", "dir", "write_s", "documents_s"})


def _content_only(tree: Any) -> Any:
  if isinstance(tree, dict):
    return {k: _content_only(v) for k, v in tree.items() if k not in _VOLATILE_KEYS}
  if isinstance(tree, list):
    return [_content_only(v) for v in tree]
  return tree


def _check_arrays(split: str, arrays: dict[str, np.ndarray], seq_len: int, vocab_size: int) -> None:
  """Checks packed arrays against the shape, dtype and vocabulary they must have.

  Raises:
    cache_entry.Damaged: naming the first violation (e.g. a token id >= vocab_size,
      which would otherwise surface much later as a non-finite loss).
  """
  shape = arrays["tokens"].shape
  for k in packing.KEYS:
    a = arrays[k]
    if a.dtype != np.int32 or a.ndim != 2 or a.shape != shape or a.shape[1] != seq_len:
      raise cache_entry.Damaged(
        f"{split}_{k} is {a.dtype} {a.shape}, expected int32 [N, {seq_len}] like "
        f"{split}_tokens {shape}"
      )
  if not arrays["tokens"].size:
    return
  lo, hi = int(arrays["tokens"].min()), int(arrays["tokens"].max())
  if lo < 0 or hi >= vocab_size:
    raise cache_entry.Damaged(
      f"{split} token ids span [{lo}, {hi}], outside the tokenizer's vocabulary [0, {vocab_size})"
    )
  if int(arrays["segment_ids"].min()) < 0:
    raise cache_entry.Damaged(f"{split} has negative segment ids")
  pos = arrays["positions"]
  if int(pos.min()) < 0 or int(pos.max()) >= seq_len:
    raise cache_entry.Damaged(f"{split} positions fall outside [0, {seq_len})")


def _read_packed(
  path: str, seq_len: int, vocab_size: int
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
  """Reads and checks a packed cache file (`cache_entry.Damaged` if it is unusable)."""
  try:
    with np.load(path) as z:  # reading each array checks its zip CRC-32
      train = {k: z[f"train_{k}"] for k in packing.KEYS}
      val = {k: z[f"val_{k}"] for k in packing.KEYS}
  except (FileNotFoundError, PermissionError):
    raise  # not damage (cache_entry.load_verified decides)
  except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile, zlib.error) as e:
    raise cache_entry.Damaged(f"it does not load ({type(e).__name__}: {e})") from e
  _check_arrays("train", train, seq_len, vocab_size)
  _check_arrays("val", val, seq_len, vocab_size)
  return train, val


def _load_cached(
  path: str, seq_len: int, vocab_size: int, mode: str, cache_root: str
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]] | None:
  """The cached packed arrays; None if absent or damaged (moved aside; then rebuilt)."""
  return cache_entry.load_verified(
    path,
    mode,
    lambda p: _read_packed(p, seq_len, vocab_size),
    cache_root=cache_root,
    what="packed arrays",
  )


def _save_cached(
  path: str, train: dict[str, np.ndarray], val: dict[str, np.ndarray], manifest: dict[str, Any]
) -> None:
  """Writes the packed arrays (uncompressed: loading is I/O-bound and fast) and sidecar."""
  arrays = {f"train_{k}": v for k, v in train.items()}
  arrays.update({f"val_{k}": v for k, v in val.items()})
  # A unicode array, so np.load needs no pickle to read it back.
  arrays["manifest_json"] = np.array(json.dumps(manifest, sort_keys=True))
  cache_entry.write_entry(
    path,
    lambda f: np.savez(f, **arrays),
    kind="packed arrays",
    manifest_hash=manifest["hash"],
    vocab_size=manifest["tokenizer"]["vocab_size"],
  )


def prepare_tasks(names: Sequence[str], cache_dir: str = "", warn: bool = True) -> dict[str, str]:
  """Builds the probe task datasets `names` into the cache (each once per host: build_lock);
  returns {task: why} of those whose source cannot be had (skipped, with one WARNING line each),
  so compute nodes that prepared here need no network for the probe step. `warn=False` leaves
  the warning to the caller."""
  from cbert_jax.data.tasks import kit  # pylint: disable=import-outside-toplevel
  from cbert_jax.data.tasks import tfds as task_tfds  # pylint: disable=import-outside-toplevel

  unavailable = {}
  for name in names:
    if name not in kit.TASKS:  # not a task-kit task (e.g. one a test registers): nothing to build
      continue
    try:
      task_tfds.prepare(name, cache_dir=cache_dir)
    except fetch.SourceUnavailable as e:
      unavailable[name] = str(e)
      if not warn:  # the caller reports it (the probe suite marks the task skipped)
        continue
      logging.warning("%s", e.task_skipped(name))
  return unavailable


def first_on_process_0(fn: Callable[[], T], what: str) -> T:
  """`fn()` on process 0 first, then on the others, so in a multi-process run a cold cache is
  filled by one process while the rest wait and then only read it. Per host, `build_lock` already
  serialises builders; this also covers caches shared between hosts on filesystems where flock is
  host-local. If `fn` raises on process 0, the others learn it (an all-gather, the same pattern as
  the workdir lock) and raise too instead of waiting. One process: just `fn()`."""
  import jax  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel

  if jax.process_count() == 1:
    return fn()
  out, error = None, None
  if jax.process_index() == 0:
    try:
      out = fn()
    except Exception as e:  # re-raised below, after the others have been told
      error = e
  failed = bool(multihost_utils.process_allgather(np.int32(error is not None)).any())
  if error is not None:
    raise error
  if failed:
    raise ConfigError(f"process 0 could not prepare {what} (its output says why)")
  return out if jax.process_index() == 0 else fn()


def prepare_once(cfg: Any, seq_len: int, tasks: Sequence[str] = ()) -> packing.PackedData:
  """`prepare` (and the probe tasks `tasks`), process 0 first (`first_on_process_0`)."""

  def both() -> packing.PackedData:
    data = prepare(cfg, seq_len)
    if tasks:
      prepare_tasks(tasks, getattr(cfg, "cache_dir", ""))
    return data

  return first_on_process_0(both, "data")


def prepare(cfg: Any, seq_len: int) -> packing.PackedData:
  """Loads the corpus, gets the tokenizer, and packs train/val rows (cached).

  Args:
    cfg: the `data` config (see `corpus.load_corpus` and `tokenizer.get_tokenizer` for
      the fields and defaults).
    seq_len: row length T, the model's sequence length.

  With `data.corpus = "sources"` this is `preprocess.prepare_sources` (sharded
  ArrayRecord rows instead of in-memory arrays); the rest of this docstring is about the
  small in-memory corpora.

  Returns:
    The packed data. Packed arrays are cached at
    `<cache_dir>/packed/packed-<key>.npz`, keyed by (corpus content hash, tokenizer
    sha256, seq_len, packing.PACK_VERSION); the corpus is still re-read (~1 s) to compute its
    content hash, but tokenising and packing are skipped on a hit. A hit is checked
    against its sha256 sidecar (`data.verify_cache`), loaded, and its token ids checked
    against the tokenizer's vocabulary; a damaged file is moved to `<cache>/damaged/`
    with a warning and rebuilt.

  Raises:
    ConfigError: for bad `data.*` fields or `seq_len`, before any expensive work.
  """
  if (
    isinstance(seq_len, bool)
    or not isinstance(seq_len, (int, np.integer))
    or (seq_len < MIN_SEQ_LEN)
  ):
    raise ConfigError(f"data.seq_len must be an int >= {MIN_SEQ_LEN}, got {seq_len!r}.")
  settings.check(cfg)
  seq_len = int(seq_len)
  # One preparation per host at a time (build_lock): the first fills the cache, the others wait
  # and then read it (`prepare_once` also lets process 0 go first across hosts).
  with build_lock.held(fetch.resolve_cache_dir(cfg), "prepare", "the training data"):
    return _prepare(cfg, seq_len)


def _prepare(cfg: Any, seq_len: int) -> packing.PackedData:
  """`prepare` under the build lock."""
  if getattr(cfg, "corpus", "gutenberg") == "sources":
    # Corpora too big for memory: parallel, resumable preprocessing into ArrayRecord
    # shards under <cache>/packed/<key>/, read back lazily by the pipeline.
    return preprocess.prepare_sources(cfg, seq_len)
  timings: dict[str, float] = {}

  start = time.perf_counter()
  corpus = corpus_lib.load_corpus(cfg)
  timings["corpus"] = time.perf_counter() - start

  start = time.perf_counter()
  tok = tokenizer_lib.get_tokenizer(cfg, corpus)
  timings["tokenizer"] = time.perf_counter() - start

  key = hashlib.sha256(
    json.dumps(
      dict(
        content_hash=corpus.manifest["content_hash"],
        tokenizer_sha256=tok.sha256,
        seq_len=seq_len,
        pack_version=packing.PACK_VERSION,
      ),
      sort_keys=True,
    ).encode()
  ).hexdigest()
  cache_root = fetch.resolve_cache_dir(cfg)
  path = os.path.join(cache_root, "packed", f"packed-{key[:24]}.npz")
  start = time.perf_counter()
  cached = _load_cached(
    path, seq_len, tok.vocab_size, getattr(cfg, "verify_cache", "sample"), cache_root
  )
  if cached is not None:
    train, val = cached
    timings["cache_load"] = time.perf_counter() - start
  else:
    train = packing.pack(packing.encode_docs(tok, corpus.train_docs), seq_len)
    val = packing.pack(packing.encode_docs(tok, corpus.val_docs), seq_len)
    timings["encode_pack"] = time.perf_counter() - start
  manifest = _manifest(corpus, tok, seq_len, train, val)
  if cached is None:
    start = time.perf_counter()
    _save_cached(path, train, val, manifest)
    timings["cache_save"] = time.perf_counter() - start
  logging.info(
    "Data: %d train rows, %d val rows of %d tokens; vocab %d; manifest %s; timings %s",
    manifest["rows"]["train"],
    manifest["rows"]["val"],
    seq_len,
    tok.vocab_size,
    manifest["hash"][:12],
    {k: round(v, 2) for k, v in timings.items()},
  )
  return packing.PackedData(train=train, val=val, tokenizer=tok, manifest=manifest, timings=timings)


def main(argv: Sequence[str]) -> None:
  """CLI: prepare a config's data once, on a machine with network (e.g. before a pod job): the
  corpus, tokenizer and packed rows of any `data.corpus` (a `sources` corpus with `--workers`
  processes), then the probe task datasets of `evals.tasks` (`--tasks`), so compute nodes that
  share the cache need no network, for training or for the probe step."""
  del argv
  config = _CONFIG.value
  data_cfg = settings.data_config(config)
  if getattr(data_cfg, "corpus", "") == "sources" and _WORKERS.value:
    data = preprocess.prepare_sources(data_cfg, config.data.seq_len, workers=_WORKERS.value)
  else:
    data = prepare(data_cfg, config.data.seq_len)
  tasks = _TASKS.value if _TASKS.value is not None else config.evals.tasks
  names = [t.strip() for t in tasks.split(",") if t.strip()]
  start = time.perf_counter()
  unavailable = prepare_tasks(names, getattr(data_cfg, "cache_dir", ""))
  timings = dict(data.timings, probe_tasks=time.perf_counter() - start)
  print(
    json.dumps(
      dict(
        manifest_hash=data.manifest["hash"],
        rows=data.manifest["rows"],
        probe_tasks=[n for n in names if n not in unavailable],
        probe_tasks_unavailable=unavailable,
        timings={k: round(v, 2) for k, v in timings.items()},
      ),
      indent=1,
    )
  )


if __name__ == "__main__":
  from absl import app, flags  # pylint: disable=g-import-not-at-top
  from ml_collections import config_flags  # pylint: disable=g-import-not-at-top

  _CONFIG = config_flags.DEFINE_config_file("config", None, "experiment file[:arg]")
  _WORKERS = flags.DEFINE_integer("workers", 0, "worker processes of a sources corpus (0 = config)")
  _TASKS = flags.DEFINE_string(
    "tasks", None, "probe tasks to prepare (comma list; default the config's evals.tasks; '' none)"
  )
  app.run(main)
