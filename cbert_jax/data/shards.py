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

Work plan (deterministic, independent of the worker count):

  1. Files are taken in config order (sources in the order given, each glob sorted) and
     grouped greedily, never across sources, into *tasks* of about
     `data.shard_input_mb` MiB of input; task k writes output shard k.
  2. Each document gets two 64-bit hashes of its normalised text: the split hash
     (`blake2b(f"{split_seed}\0{text}")`, the same rule as `data.corpus="files"`; it is
     validation when below `val_fraction * 2**64`) and the mixture hash (with a "mix"
     prefix and the source index).
  3. Mixture rule (only with >= 2 sources): a counting pass (parallel, resumable, no
     tokenising) measures C_i, the normalised characters of source i, which stand in for
     its tokens. With p_i = w_i / sum(w), the mixture is the largest one in which no
     document repeats: total M = min_i C_i / p_i, and source i keeps each document with
     probability r_i = p_i * M / C_i (<= 1; 1 for the limiting source) by comparing its
     mixture hash with r_i * 2**64. So source i contributes p_i of the characters, up to
     sampling noise (relative std ~ 1/sqrt(documents kept)), in train and val alike.
     With one source nothing is counted or dropped.
  4. Each task reads its files, splits and samples documents, tokenises them and packs
     train and val separately, streaming (bounded memory), into `train-k`/`val-k`.

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

Workers: `data.preprocess_workers` processes (0 = all cores) from a "spawn" context (no
fork of a JAX-initialised parent); 1 runs in-process. Tokenising dominates the cost.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import json
import multiprocessing
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import sentencepiece as spm
from absl import logging

from cbert_jax.data import cache_entry, packing
from cbert_jax.data import sources as sources_lib
from cbert_jax.data import text as text_lib
from cbert_jax.data import tokenizer as tokenizer_lib
from cbert_jax.errors import ConfigError

# Bump when the bytes written for the same inputs change.
PREPROCESS_VERSION = 1
# Bytes hashed at the start, middle and end of each shard on every run: a pod-scale corpus
# has thousands of shards, so the per-run check reads 192 KiB of each, not 3 MiB.
SHARD_SAMPLE_BYTES = 64 << 10
INDEX_FILE = "index.json"
RECORD_LAYOUT = "little-endian int32 [3, T]: tokens, segment_ids, positions"
WRITER_OPTIONS = "group_size:1"
# Packing is flushed every this many pending tokens: bounds a worker's memory to a few
# tens of MB however big its input is.
_FLUSH_TOKENS = 1 << 22
_ENCODE_DOCS = 1024  # documents per sentencepiece call
_SPLITS = ("train", "val")


@dataclasses.dataclass(frozen=True)
class Task:
  """One unit of work: input files of one source -> output shard `shard`."""

  shard: int
  source: int
  files: tuple[sources_lib.FileInfo, ...]

  @property
  def name(self) -> str:
    return f"{self.shard:05d}"


@dataclasses.dataclass(frozen=True)
class _Context:
  """Everything a worker needs besides its task (picklable, small)."""

  opts: sources_lib.ReadOptions
  split_seed: int
  val_fraction: float
  rates: tuple[float, ...] | None  # per source keep rate; None = keep all
  seq_len: int
  model_proto: bytes | None  # None in the counting pass
  out_dir: str
  spm_threads: int


# --- Planning and hashing ----------------------------------------------------------------


def plan_tasks(srcs: Sequence[sources_lib.Source], shard_bytes: int) -> list[Task]:
  """Groups files into tasks of about `shard_bytes` input bytes, in order, per source."""
  tasks: list[Task] = []
  for s, src in enumerate(srcs):
    group: list[sources_lib.FileInfo] = []
    size = 0
    for info in src.files:
      group.append(info)
      size += info.size
      if size >= shard_bytes:
        tasks.append(Task(len(tasks), s, tuple(group)))
        group, size = [], 0
    if group:
      tasks.append(Task(len(tasks), s, tuple(group)))
  return tasks


def _u64(data: str) -> int:
  return int.from_bytes(hashlib.blake2b(data.encode("utf-8"), digest_size=8).digest(), "big")


def _keep(text: str, seed: int, source: int, rate: float) -> bool:
  return rate >= 1.0 or _u64(f"mix\0{seed}\0{source}\0{text}") < rate * 2.0**64


def mixture_rates(chars: Sequence[int], weights: Sequence[float]) -> list[float]:
  """Per-source keep rates for the mixture rule in the module docstring.

  Args:
    chars: C_i, normalised characters per source (> 0).
    weights: w_i > 0.

  Returns:
    r_i in (0, 1]; at least one is exactly 1.
  """
  total_w = float(sum(weights))
  p = [w / total_w for w in weights]
  m = min(c / pi for c, pi in zip(chars, p))
  return [min(1.0, pi * m / c) for c, pi in zip(chars, p)]


class _ShardWriter:
  """Packs documents as they come and writes full rows to an ArrayRecord file.

  Pending documents are packed whenever >= _FLUSH_TOKENS accumulate; only whole rows are
  written and the rest of the stream is carried over. The carried piece starts a row,
  and every row start starts a segment anyway, so the rows equal packing everything at
  once (`packing.pack`).
  """

  def __init__(self, path: str, seq_len: int):
    from array_record.python import array_record_module  # pylint: disable=g-import-not-at-top

    self.path = path
    self._t = seq_len
    self._writer = array_record_module.ArrayRecordWriter(path, WRITER_OPTIONS)
    self._docs: list[np.ndarray] = []
    self._pending = 0
    self.rows = 0
    self.tokens = 0

  def add(self, ids: np.ndarray) -> None:
    if ids.size:
      self._docs.append(ids)
      self._pending += ids.size
      self.tokens += ids.size
      if self._pending >= _FLUSH_TOKENS:
        self._flush(final=False)

  def _flush(self, final: bool) -> None:
    if not self._docs:
      return
    flat = np.concatenate(self._docs)  # [L]
    lengths = np.fromiter((d.size for d in self._docs), np.int64, len(self._docs))
    cut = flat.size if final else flat.size // self._t * self._t
    if cut == 0:
      return
    # Lengths of the documents (or document heads) inside [0, cut).
    ends = np.cumsum(lengths)
    n_in = int(np.searchsorted(ends, cut, side="left")) + 1  # docs touching [0, cut)
    head = lengths[:n_in].copy()
    head[-1] -= ends[n_in - 1] - cut  # the last one may continue past the cut
    packed = packing.pack_stream(flat[:cut], head, self._t)
    rows = np.stack([packed[k] for k in packing.KEYS], axis=1)  # [N, 3, T]
    for row in rows.astype("<i4", copy=False):
      self._writer.write(row.tobytes())
    self.rows += len(rows)
    # Carry the rest of the stream with its document boundaries: the tail of the
    # document cut in two (if any), then the untouched documents.
    tail = flat[cut : int(ends[n_in - 1])]
    self._docs = ([tail] if tail.size else []) + self._docs[n_in:]
    self._pending = flat.size - cut

  def close(self) -> None:
    self._flush(final=True)
    self._writer.close()


# --- Workers -----------------------------------------------------------------------------

_WORKER_SPM: dict[str, spm.SentencePieceProcessor] = {}


def _processor(proto: bytes) -> spm.SentencePieceProcessor:
  """One SentencePiece processor per worker process (the proto is the same every task)."""
  key = hashlib.sha256(proto).hexdigest()
  if key not in _WORKER_SPM:
    _WORKER_SPM[key] = spm.SentencePieceProcessor(model_proto=proto)
  return _WORKER_SPM[key]


def _task_docs(task: Task, ctx: _Context, bad: sources_lib.BadCounts) -> Iterator[tuple[str, str]]:
  """Yields (split, text) for the documents of a task that the mixture keeps."""
  rate = 1.0 if ctx.rates is None else ctx.rates[task.source]
  for info in task.files:
    for text in sources_lib.iter_documents(info, ctx.opts, bad):
      if not _keep(text, ctx.split_seed, task.source, rate):
        bad["_mixture_dropped"] += 1
        continue
      yield ("val" if text_lib.is_val(text, ctx.split_seed, ctx.val_fraction) else "train"), text


def _count_task(task: Task, ctx: _Context) -> dict[str, Any]:
  """Counting pass: documents and normalised characters of one task (no tokenising)."""
  bad = sources_lib.BadCounts()
  docs = chars = 0
  for info in task.files:
    for text in sources_lib.iter_documents(info, ctx.opts, bad):
      docs += 1
      chars += len(text)
  return dict(docs=docs, chars=chars, bad=bad.as_dict())


def _pack_task(task: Task, ctx: _Context) -> dict[str, Any]:
  """Main pass: tokenise + pack one task into `train-k`/`val-k` (temp name, then rename)."""
  sp = _processor(ctx.model_proto)
  bad = sources_lib.BadCounts()
  writers = {
    s: _ShardWriter(os.path.join(ctx.out_dir, f".tmp-{os.getpid()}-{s}-{task.name}"), ctx.seq_len)
    for s in _SPLITS
  }
  docs = {s: 0 for s in _SPLITS}
  chars = {s: 0 for s in _SPLITS}
  batch: dict[str, list[str]] = {s: [] for s in _SPLITS}

  def encode(split: str) -> None:
    for ids in sp.encode(batch[split], out_type=int, num_threads=ctx.spm_threads):
      writers[split].add(np.asarray(ids, np.int32))
    batch[split] = []

  try:
    for split, text in _task_docs(task, ctx, bad):
      batch[split].append(text)
      docs[split] += 1
      chars[split] += len(text)
      if len(batch[split]) >= _ENCODE_DOCS:
        encode(split)
    out: dict[str, Any] = dict(
      source=task.source, bad=bad.as_dict(), mixture_dropped=int(bad["_mixture_dropped"])
    )
    for s in _SPLITS:
      encode(s)
      writers[s].close()
      final = os.path.join(ctx.out_dir, f"{s}-{task.name}.array_record")
      os.replace(writers[s].path, final)
      out[s] = dict(
        file=os.path.basename(final),
        rows=writers[s].rows,
        tokens=writers[s].tokens,
        docs=docs[s],
        chars=chars[s],
        **cache_entry.digest(final, SHARD_SAMPLE_BYTES),
      )
    return out
  finally:
    for w in writers.values():
      if os.path.exists(w.path):
        os.remove(w.path)


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
    for s in _SPLITS:
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
    elif any("sample_sha256" not in entry[s] for s in _SPLITS):
      for s in _SPLITS:  # an index from before sample digests: add them
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


def _run_tasks(
  fn: Callable[[Task, _Context], dict[str, Any]],
  tasks: Sequence[Task],
  ctx: _Context,
  workers: int,
  on_done: Callable[[Task, dict[str, Any]], None],
) -> None:
  """Runs `fn` on every task (in-process or in a spawn pool); `on_done` in the parent."""
  if not tasks:
    return
  if workers <= 1:
    for task in tasks:
      on_done(task, fn(task, ctx))
    return
  pool = concurrent.futures.ProcessPoolExecutor(
    max_workers=min(workers, len(tasks)), mp_context=multiprocessing.get_context("spawn")
  )
  try:
    futures = {pool.submit(fn, task, ctx): task for task in tasks}
    for future in concurrent.futures.as_completed(futures):
      on_done(futures[future], future.result())
  finally:
    # On an error (or an interruption) do not start queued tasks; running ones finish
    # and are simply redone by the next run (they are not in the index).
    pool.shutdown(wait=True, cancel_futures=True)


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
      for s in _SPLITS
      if not os.path.exists(os.path.join(out_dir, e[s]["file"]))
    ]
    if not missing:
      return index
    logging.warning("%s: %d shard files are missing; rebuilding them.", out_dir, len(missing))
    index["done"] = False
    index.pop("manifest", None)

  threads = (os.cpu_count() or 1) if workers <= 1 else 1
  base = _Context(
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

    _run_tasks(
      _count_task, [t for t in tasks if t.name not in index["count_pass"]], base, workers, counted
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
      os.path.exists(os.path.join(out_dir, index["shards"][t.name][s]["file"])) for s in _SPLITS
    )
  ]
  _run_tasks(_pack_task, todo, ctx, workers, packed)
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
          for s in _SPLITS
        },
      )
    )
  shard_digests = hashlib.sha256()
  for t in tasks:
    for s in _SPLITS:
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
    rows={s: sum(index["shards"][t.name][s]["rows"] for t in tasks) for s in _SPLITS},
    tokens={s: sum(index["shards"][t.name][s]["tokens"] for t in tasks) for s in _SPLITS},
  )
  manifest["hash"] = hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()
  return manifest


def row_sources(out_dir: str, index: dict[str, Any]) -> dict[str, Any]:
  """{split: pipeline.ArrayRecordRows} over the finished shards (empty shards left out)."""
  from cbert_jax.data import pipeline  # pylint: disable=g-import-not-at-top (imports grain)

  out = {}
  for s in _SPLITS:
    entries = [index["shards"][k][s] for k in sorted(index["shards"])]
    entries = [e for e in entries if e["rows"]]
    out[s] = pipeline.ArrayRecordRows(
      [os.path.join(out_dir, e["file"]) for e in entries],
      [e["rows"] for e in entries],
      index["spec"]["seq_len"],
    )
  return out
