"""The entry point and CLI of `data.corpus = "sources"`: tokenizer, cache key, shards.

This is the data preparation for `data.corpus = "sources"` (see `sources.py`): corpora too
big for memory. `prepare_sources(cfg, seq_len)` (called by `prepare.prepare`) trains (or
loads) the tokenizer on a sample of the sources, keys the output by everything that
determines its bytes, and has `shards.build` write

  <cache_dir>/packed/<key>/  (index.json, train-*.array_record, val-*.array_record)

and returns a `PackedData` whose `train`/`val` are `pipeline.ArrayRecordRows`. `<key>`
hashes everything that determines the bytes (file list with sizes and mtimes, weights,
read options, split, tokenizer sha256, seq_len, versions), so a changed input gets a new
directory and an unchanged one is reused. Record layout, work plan, resumability and
workers: shards.py.

CLI (run it once before a pod job, so training hosts only read):

  python -m cbert_jax.data.preprocess --config experiments/x.py [--workers 64]
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

from absl import logging

from cbert_jax.data import corpus as corpus_lib
from cbert_jax.data import fetch, packing, settings, shards
from cbert_jax.data import sources as sources_lib
from cbert_jax.data import text as text_lib
from cbert_jax.data import tokenizer as tokenizer_lib
from cbert_jax.errors import ConfigError

# --- Tokenizer sample and the prepare.prepare entry point ---------------------------------


def tokenizer_sample(
  srcs: Sequence[sources_lib.Source],
  opts: sources_lib.ReadOptions,
  *,
  max_chars: int,
  split_seed: int,
  val_fraction: float,
) -> list[str]:
  """Training documents for the tokenizer: about `p_i * max_chars` chars from source i.

  Files are visited spread over each source (every k-th file first, k = n // 8) so one
  glob's first shard does not decide the vocabulary; documents are taken in file order,
  validation documents excluded. Deterministic; reads only what it needs.
  """
  total_w = sum(s.weight for s in srcs)
  sample: list[str] = []
  for src in srcs:
    budget = int(max_chars * src.weight / total_w)
    stride = max(1, len(src.files) // 8)
    order = list(src.files[::stride]) + [f for i, f in enumerate(src.files) if i % stride]
    chars = 0
    for info in order:
      if chars >= budget:
        break
      for text in sources_lib.iter_documents(info, opts):
        if text_lib.is_val(text, split_seed, val_fraction):
          continue
        sample.append(text)
        chars += len(text)
        if chars >= budget:
          break
  return sample


def _check_int(cfg: Any, name: str, default: int, minimum: int) -> int:
  value = getattr(cfg, name, default)
  if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
    raise ConfigError(f"data.{name} must be an int >= {minimum}, got {value!r}.")
  return value


def packed_dir(cfg: Any, key: str) -> str:
  """`<cache_dir>/packed/<key[:24]>`; the cache must be a filesystem path."""
  cache = getattr(cfg, "cache_dir", "") or ""
  if isinstance(cache, str) and "://" in cache:
    raise ConfigError(
      f"data.cache_dir={cache!r}: packed ArrayRecord shards need a filesystem path "
      "(the ArrayRecord reader opens files itself); mount the bucket (e.g. gcsfuse)."
    )
  return os.path.join(fetch.resolve_cache_dir(cfg), "packed", key[:24])


def prepare_sources(
  cfg: Any,
  seq_len: int,
  *,
  workers: int | None = None,
  on_shard_done: Callable[[int], None] | None = None,
) -> packing.PackedData:
  """`prepare.prepare` for `data.corpus = "sources"`: tokenizer, shards, row sources.

  Args:
    cfg: the `data` config: `sources`, `text_field`, `text_mode`, `record_format`,
      `on_bad_record`, `preprocess_workers`, `shard_input_mb`, `val_fraction`,
      `split_seed`, `cache_dir` and the tokenizer fields (`tokenizer.get_tokenizer`).
    seq_len: row length T (validated by the caller).
    workers: overrides `data.preprocess_workers`.
    on_shard_done: see `build`.

  Returns:
    `PackedData` with `train`/`val` as `pipeline.ArrayRecordRows`.

  Raises:
    ConfigError: for bad fields or paths (before any file is read), and for bad input
      records when `data.on_bad_record == "error"`.
  """
  srcs = sources_lib.check_sources_config(cfg)
  opts = sources_lib.read_options(cfg)
  tokenizer_lib.check_tokenizer_config(cfg)
  n_workers = _check_int(cfg, "preprocess_workers", 0, 0) if workers is None else workers
  n_workers = n_workers or (os.cpu_count() or 1)
  shard_bytes = _check_int(cfg, "shard_input_mb", 256, 1) << 20
  split_seed = int(getattr(cfg, "split_seed", 0))
  val_fraction = float(getattr(cfg, "val_fraction", 0.02))
  packed_dir(cfg, "")  # validates cache_dir before the tokenizer work
  timings: dict[str, float] = {}

  start = time.perf_counter()
  if getattr(cfg, "tokenizer_path", ""):
    tok = tokenizer_lib.get_tokenizer(cfg, None)
  else:
    sample = tokenizer_sample(
      srcs,
      opts,
      max_chars=int(getattr(cfg, "tokenizer_sample_chars", 20_000_000)),
      split_seed=split_seed,
      val_fraction=val_fraction,
    )
    if not sample:
      raise ConfigError(
        f"data.sources={getattr(cfg, 'sources', '')!r}: no training "
        "document to train the tokenizer on."
      )
    corpus = corpus_lib.Corpus(
      train_docs=sample, val_docs=[], manifest=dict(content_hash=text_lib.content_hash([sample]))
    )
    tok = tokenizer_lib.get_tokenizer(cfg, corpus)
  timings["tokenizer"] = time.perf_counter() - start

  key = hashlib.sha256(
    json.dumps(
      dict(
        sources=[[s.pattern, s.weight, [[f.path, f.size, f.mtime] for f in s.files]] for s in srcs],
        opts=dataclasses.asdict(opts),
        split=[split_seed, val_fraction],
        shard_bytes=shard_bytes,
        tokenizer=tok.sha256,
        seq_len=seq_len,
        versions=[shards.PREPROCESS_VERSION, packing.PACK_VERSION],
      ),
      sort_keys=True,
    ).encode()
  ).hexdigest()
  out_dir = packed_dir(cfg, key)
  start = time.perf_counter()
  was_done = bool((shards.read_index(out_dir) or {}).get("done"))
  index = shards.build(
    srcs,
    opts,
    tokenizer=tok,
    seq_len=seq_len,
    out_dir=out_dir,
    split_seed=split_seed,
    val_fraction=val_fraction,
    shard_bytes=shard_bytes,
    workers=n_workers,
    on_shard_done=on_shard_done,
    verify_mode=getattr(cfg, "verify_cache", "sample"),
    cache_root=fetch.resolve_cache_dir(cfg),
  )
  timings["cache_load" if was_done else "preprocess"] = time.perf_counter() - start
  rows = shards.row_sources(out_dir, index)
  manifest = index["manifest"]
  if not len(rows["train"]):
    raise ConfigError(
      f"data.sources={getattr(cfg, 'sources', '')!r} gave no training "
      "rows; check the files and data.val_fraction."
    )
  logging.info(
    "Data (sources): %d train rows, %d val rows of %d tokens in %d shards at "
    "%s; vocab %d; bad records %s; timings %s",
    manifest["rows"]["train"],
    manifest["rows"]["val"],
    seq_len,
    manifest["shards"],
    out_dir,
    tok.vocab_size,
    [s["bad_records"] for s in manifest["sources"]],
    {k: round(v, 2) for k, v in timings.items()},
  )
  return packing.PackedData(
    train=rows["train"], val=rows["val"], tokenizer=tok, manifest=manifest, timings=timings
  )


def main(argv: Sequence[str]) -> None:
  """CLI: prepare the packed shards of a `data.corpus=sources` config once, with `--workers`
  processes (`python -m cbert_jax.data.prepare` prepares any corpus and the probe tasks too)."""
  del argv
  config = _CONFIG.value
  data = prepare_sources(
    settings.data_config(config), config.data.seq_len, workers=_WORKERS.value or None
  )
  print(
    json.dumps(
      dict(manifest_hash=data.manifest["hash"], rows=data.manifest["rows"], timings=data.timings),
      indent=1,
    )
  )


if __name__ == "__main__":
  from absl import (
    app,  # pylint: disable=g-import-not-at-top
    flags,  # pylint: disable=g-import-not-at-top
  )
  from ml_collections import config_flags  # pylint: disable=g-import-not-at-top

  _CONFIG = config_flags.DEFINE_config_file("config", None, "experiment config file")
  _WORKERS = flags.DEFINE_integer("workers", 0, "worker processes (0 = data config)")
  app.run(main)
