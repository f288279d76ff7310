r"""Tokenise and pack a sources corpus into sharded ArrayRecord files, in parallel, resumably.

`build` does the work for `preprocess.prepare_sources` (`data.corpus = "sources"`, corpora too
big for memory): it writes

  <cache_dir>/packed/<key>/
    index.json                         what was built and how far (see below)
    train-00000.array_record, ...      packed training rows, one output shard per task
    val-00000.array_record, ...        packed validation rows

and `row_sources` reads them back as `pipeline.ArrayRecordRows`. `<key>`
hashes everything that determines the bytes (file list with sizes and mtimes, weights,
read options, split, tokenizer sha256, seq_len, versions), so a changed input gets a new
directory and an unchanged one is reused.

Record layout (`RECORD_LAYOUT`): one record = one packed row, the raw bytes of a
little-endian int32 array [3, T]: row 0 tokens, row 1 segment_ids, row 2 positions, with
exactly `packing.pack`'s semantics (segments restart at every document start and every
row start; 0 = padding, only at the end of a split's last row in each shard). Files are
written with `group_size:1` so grain reads any row without decoding its neighbours.

The work plan (tasks, the split and mixture rules) and the workers are in `shard_tasks.py`; the
plan is deterministic, independent of the worker count.

Resumability: each shard is written under a temporary name and renamed when complete;
the main process then records it in `index.json` (rewritten atomically), with its size,
sha256 and the sha256 of three `SHARD_SAMPLE_BYTES` samples (cache_entry.py). Every later
run checks each recorded shard's size and samples (its full sha256 with
`data.verify_cache="full"`); a damaged shard is moved to `<cache>/damaged/` with a
warning and rebuilt like an unfinished one (an index from before these records gets them
after its shards open with the right row counts). A rerun after an
interruption skips recorded shards whose files exist and does the rest; since every
shard's bytes depend only on its task, the result equals a one-shot run byte for byte
(index included: it holds no timings or completion order).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Callable, Sequence
from typing import Any

from absl import logging

from cbert_jax.data import cache_entry, packing, shard_tasks
from cbert_jax.data import sources as sources_lib
from cbert_jax.data import tokenizer as tokenizer_lib
from cbert_jax.data.shard_tasks import (
  SHARD_SAMPLE_BYTES,
  SPLITS,
  WRITER_OPTIONS,
  Task,
  mixture_rates,
  plan_tasks,
)
from cbert_jax.errors import ConfigError

# Bump when the bytes written for the same inputs change.
PREPROCESS_VERSION = 1
INDEX_FILE = "index.json"
RECORD_LAYOUT = "little-endian int32 [3, T]: tokens, segment_ids, positions"


# --- Index -------------------------------------------------------------------------------


def read_index(out_dir: str) -> dict[str, Any] | None:
  path = os.path.join(out_dir, INDEX_FILE)
  if not os.path.exists(path):
    return None
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, ValueError) as e:
    logging.warning("Ignoring unreadable %s (%s); starting over.", path, e)
    return None


def _write_index(out_dir: str, index: dict[str, Any]) -> None:
  cache_entry.atomic_write(
    os.path.join(out_dir, INDEX_FILE), json.dumps(index, sort_keys=True, indent=1).encode()
  )


def _shard_problem(path: str, entry: dict[str, Any], mode: str) -> str | None:
  """Why a recorded shard file is unusable, or None.

  Entries with a sample digest are checked against it (`mode`); older ones, which only
  record the full sha256, are opened and their row count compared (structural), and in
  "full" mode hashed.
  """
  if not os.path.exists(path):
    return None  # missing shards are simply rebuilt (see build)
  if "sample_sha256" in entry:
    return cache_entry.check(path, entry, mode)
  if mode == "full" and cache_entry.full_sha256(path) != entry["sha256"]:
    return "sha256 does not match its index record"
  from array_record.python import array_record_module  # pylint: disable=g-import-not-at-top

  try:
    reader = array_record_module.ArrayRecordReader(path)
    try:
      n = reader.num_records()
    finally:
      reader.close()
  except Exception as e:  # the C++ reader raises RuntimeError/ValueError on bad files.
    return f"it does not open as ArrayRecord ({type(e).__name__}: {e})"
  if n != entry["rows"]:
    return f"it holds {n} rows, its index records {entry['rows']}"
  return None


def _drop_damaged(out_dir: str, index: dict[str, Any], mode: str, cache_root: str) -> bool:
  """Checks every recorded shard; moves damaged ones aside and forgets their tasks.

  Returns True if the index changed (a task dropped, or digests added to old entries).
  """
  changed = False
  for name in sorted(index["shards"]):
    entry = index["shards"][name]
    problems = {}
    for s in SPLITS:
      path = os.path.join(out_dir, entry[s]["file"])
      try:
        reason = _shard_problem(path, entry[s], mode)
      except PermissionError as e:
        raise ConfigError(
          f"data.cache_dir: the packed shard {path} cannot be read ({e.strerror}); fix its "
          "permissions, or set data.cache_dir to a directory of your own."
        ) from e
      except OSError as e:
        reason = f"cannot be read ({e})"
      if reason is not None:
        problems[path] = reason
    if problems:
      for path, reason in problems.items():
        cache_entry.move_aside(
          path,
          cache_root,
          reason,
          what="packed shard",
          name=f"{os.path.basename(out_dir)}-{os.path.basename(path)}",
        )
      del index["shards"][name]
      changed = True
    elif any("sample_sha256" not in entry[s] for s in SPLITS):
      for s in SPLITS:  # an index from before sample digests: add them
        path = os.path.join(out_dir, entry[s]["file"])
        if os.path.exists(path) and "sample_sha256" not in entry[s]:
          size = os.path.getsize(path)
          entry[s].update(
            size=size,
            sample_bytes=SHARD_SAMPLE_BYTES,
            sample_sha256=cache_entry.sample_sha256(path, size, SHARD_SAMPLE_BYTES),
          )
          changed = True
  return changed


def build(
  srcs: Sequence[sources_lib.Source],
  opts: sources_lib.ReadOptions,
  *,
  tokenizer: tokenizer_lib.Tokenizer,
  seq_len: int,
  out_dir: str,
  split_seed: int,
  val_fraction: float,
  shard_bytes: int,
  workers: int,
  on_shard_done: Callable[[int], None] | None = None,
  verify_mode: str = "sample",
  cache_root: str | None = None,
) -> dict[str, Any]:
  """Builds (or finishes) the packed shards in `out_dir` and returns the final index.

  Args:
    srcs: the expanded sources (`sources.expand_sources`).
    opts: read options.
    tokenizer: the tokenizer; its model bytes are sent to the workers.
    seq_len: row length T.
    out_dir: a local (or mounted) directory; created if needed.
    split_seed: seed of the train/val split and of the mixture sampling.
    val_fraction: fraction of documents (by hash) held out.
    shard_bytes: target input bytes per task/output shard.
    workers: worker processes (1 = in-process).
    on_shard_done: called in this process with the shard number after each output
      shard is recorded (tests use it to simulate an interruption).
    verify_mode: how recorded shards are checked ("sample" | "full",
      `data.verify_cache`); damaged ones are moved aside and rebuilt.
    cache_root: where `damaged/` is; default two levels above `out_dir`
      (`<cache>/packed/<key>`).

  Returns:
    The index dict (also in `out_dir/index.json`), with `done: True` and `manifest`.
  """
  os.makedirs(out_dir, exist_ok=True)
  tasks = plan_tasks(srcs, shard_bytes)
  with open(tokenizer.model_path, "rb") as f:
    proto = f.read()
  spec = dict(
    version=PREPROCESS_VERSION,
    pack_version=packing.PACK_VERSION,
    record_layout=RECORD_LAYOUT,
    writer_options=WRITER_OPTIONS,
    seq_len=seq_len,
    read_options=dataclasses.asdict(opts),
    split_seed=split_seed,
    val_fraction=val_fraction,
    shard_bytes=shard_bytes,
    tokenizer=dict(
      sha256=tokenizer.sha256,
      vocab_size=tokenizer.vocab_size,
      mask_id=tokenizer.mask_id,
      special_ids=list(tokenizer.special_ids),
      file=os.path.basename(tokenizer.model_path),
    ),
    sources=[
      dict(pattern=s.pattern, weight=s.weight, files=[[f.path, f.size, f.mtime] for f in s.files])
      for s in srcs
    ],
  )
  spec_hash = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()
  index = read_index(out_dir)
  if index is None or index.get("spec_hash") != spec_hash:
    if index is not None:
      logging.warning("%s was built from other inputs; rebuilding it.", out_dir)
    index = dict(spec=spec, spec_hash=spec_hash, count_pass={}, rates=None, shards={}, done=False)
  cache_root = cache_root or os.path.dirname(os.path.dirname(os.path.abspath(out_dir)))
  if _drop_damaged(out_dir, index, verify_mode, cache_root):
    if len(index["shards"]) < len(tasks):
      index["done"] = False
      index.pop("manifest", None)
    _write_index(out_dir, index)
  if index.get("done"):
    missing = [
      e[s]["file"]
      for e in index["shards"].values()
      for s in SPLITS
      if not os.path.exists(os.path.join(out_dir, e[s]["file"]))
    ]
    if not missing:
      return index
    logging.warning("%s: %d shard files are missing; rebuilding them.", out_dir, len(missing))
    index["done"] = False
    index.pop("manifest", None)

  threads = (os.cpu_count() or 1) if workers <= 1 else 1
  base = shard_tasks.Context(
    opts=opts,
    split_seed=split_seed,
    val_fraction=val_fraction,
    rates=None,
    seq_len=seq_len,
    model_proto=None,
    out_dir=out_dir,
    spm_threads=threads,
  )

  # Pass 1 (mixtures only): characters per source -> keep rates.
  if len(srcs) > 1 and index["rates"] is None:

    def counted(task: Task, out: dict[str, Any]) -> None:
      index["count_pass"][task.name] = out
      _write_index(out_dir, index)

    shard_tasks.run_tasks(
      shard_tasks.count_task,
      [t for t in tasks if t.name not in index["count_pass"]],
      base,
      workers,
      counted,
    )
    chars = [0] * len(srcs)
    for task in tasks:
      chars[task.source] += index["count_pass"][task.name]["chars"]
    if not all(chars):
      empty = [srcs[i].pattern for i, c in enumerate(chars) if not c]
      raise ConfigError(
        f"data.sources: {empty} yielded no documents (all input was "
        "skipped as bad); a mixture needs text from every source."
      )
    index["rates"] = mixture_rates(chars, [s.weight for s in srcs])
    _write_index(out_dir, index)

  # Pass 2: tokenise + pack every shard not yet recorded.
  ctx = dataclasses.replace(
    base, model_proto=proto, rates=(None if index["rates"] is None else tuple(index["rates"]))
  )

  def packed(task: Task, out: dict[str, Any]) -> None:
    index["shards"][task.name] = out
    _write_index(out_dir, index)
    if on_shard_done is not None:
      on_shard_done(task.shard)

  todo = [
    t
    for t in tasks
    if t.name not in index["shards"]
    or not all(
      os.path.exists(os.path.join(out_dir, index["shards"][t.name][s]["file"])) for s in SPLITS
    )
  ]
  shard_tasks.run_tasks(shard_tasks.pack_task, todo, ctx, workers, packed)
  index["manifest"] = _manifest(index, srcs, tasks)
  index["done"] = True
  _write_index(out_dir, index)
  return index


def _manifest(
  index: dict[str, Any], srcs: Sequence[sources_lib.Source], tasks: Sequence[Task]
) -> dict[str, Any]:
  """Provenance of the packed data (what `PackedData.manifest` holds)."""
  spec = index["spec"]
  per_source = []
  for i, src in enumerate(srcs):
    entries = [index["shards"][t.name] for t in tasks if t.source == i]
    bad = sources_lib.BadCounts()
    for e in entries:
      bad.update(e["bad"])
    per_source.append(
      dict(
        pattern=src.pattern,
        weight=src.weight,
        files=len(src.files),
        bytes=sum(f.size for f in src.files),
        keep_rate=1.0 if index["rates"] is None else index["rates"][i],
        mixture_dropped_docs=sum(e["mixture_dropped"] for e in entries),
        bad_records=bad.as_dict(),
        **{
          s: dict(
            docs=sum(e[s]["docs"] for e in entries),
            chars=sum(e[s]["chars"] for e in entries),
            tokens=sum(e[s]["tokens"] for e in entries),
          )
          for s in SPLITS
        },
      )
    )
  shard_digests = hashlib.sha256()
  for t in tasks:
    for s in SPLITS:
      shard_digests.update(index["shards"][t.name][s]["sha256"].encode())
  manifest = dict(
    corpus="sources",
    sources=per_source,
    mixture_rule=(
      "keep rate r_i = p_i * min_j(C_j / p_j) / C_i over normalised "
      "characters C_i, by document hash"
      if len(srcs) > 1
      else "single source"
    ),
    split=dict(val_fraction=spec["val_fraction"], split_seed=spec["split_seed"]),
    read_options=spec["read_options"],
    tokenizer=spec["tokenizer"],
    seq_len=spec["seq_len"],
    pack_version=spec["pack_version"],
    preprocess_version=spec["version"],
    record_layout=RECORD_LAYOUT,
    shards=len(tasks),
    content_hash=shard_digests.hexdigest(),
    rows={s: sum(index["shards"][t.name][s]["rows"] for t in tasks) for s in SPLITS},
    tokens={s: sum(index["shards"][t.name][s]["tokens"] for t in tasks) for s in SPLITS},
  )
  manifest["hash"] = hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()
  return manifest


def row_sources(out_dir: str, index: dict[str, Any]) -> dict[str, Any]:
  """{split: pipeline.ArrayRecordRows} over the finished shards (empty shards left out)."""
  from cbert_jax.data import pipeline  # pylint: disable=g-import-not-at-top (imports grain)

  out = {}
  for s in SPLITS:
    entries = [index["shards"][k][s] for k in sorted(index["shards"])]
    entries = [e for e in entries if e["rows"]]
    out[s] = pipeline.ArrayRecordRows(
      [os.path.join(out_dir, e["file"]) for e in entries],
      [e["rows"] for e in entries],
      index["spec"]["seq_len"],
    )
  return out
