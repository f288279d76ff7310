r"""The work of `shards.build`: tasks, the split and mixture rules, and the workers that count
a task's documents or tokenise and pack them into its output shards.

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

Workers: `data.preprocess_workers` processes (0 = all cores) from a "spawn" context (no
fork of a JAX-initialised parent); 1 runs in-process. Tokenising dominates the cost.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import multiprocessing
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import sentencepiece as spm

from cbert_jax.data import cache_entry, packing
from cbert_jax.data import sources as sources_lib
from cbert_jax.data import text as text_lib

# Bytes hashed at the start, middle and end of each shard on every run: a pod-scale corpus
# has thousands of shards, so the per-run check reads 192 KiB of each, not 3 MiB.
SHARD_SAMPLE_BYTES = 64 << 10
WRITER_OPTIONS = "group_size:1"
# Packing is flushed every this many pending tokens: bounds a worker's memory to a few
# tens of MB however big its input is.
_FLUSH_TOKENS = 1 << 22
_ENCODE_DOCS = 1024  # documents per sentencepiece call
SPLITS = ("train", "val")


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
class Context:
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


def _task_docs(task: Task, ctx: Context, bad: sources_lib.BadCounts) -> Iterator[tuple[str, str]]:
  """Yields (split, text) for the documents of a task that the mixture keeps."""
  rate = 1.0 if ctx.rates is None else ctx.rates[task.source]
  for info in task.files:
    for text in sources_lib.iter_documents(info, ctx.opts, bad):
      if not _keep(text, ctx.split_seed, task.source, rate):
        bad["_mixture_dropped"] += 1
        continue
      yield ("val" if text_lib.is_val(text, ctx.split_seed, ctx.val_fraction) else "train"), text


def count_task(task: Task, ctx: Context) -> dict[str, Any]:
  """Counting pass: documents and normalised characters of one task (no tokenising)."""
  bad = sources_lib.BadCounts()
  docs = chars = 0
  for info in task.files:
    for text in sources_lib.iter_documents(info, ctx.opts, bad):
      docs += 1
      chars += len(text)
  return dict(docs=docs, chars=chars, bad=bad.as_dict())


def pack_task(task: Task, ctx: Context) -> dict[str, Any]:
  """Main pass: tokenise + pack one task into `train-k`/`val-k` (temp name, then rename)."""
  sp = _processor(ctx.model_proto)
  bad = sources_lib.BadCounts()
  writers = {
    s: _ShardWriter(os.path.join(ctx.out_dir, f".tmp-{os.getpid()}-{s}-{task.name}"), ctx.seq_len)
    for s in SPLITS
  }
  docs = {s: 0 for s in SPLITS}
  chars = {s: 0 for s in SPLITS}
  batch: dict[str, list[str]] = {s: [] for s in SPLITS}

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
    for s in SPLITS:
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


def run_tasks(
  fn: Callable[[Task, Context], dict[str, Any]],
  tasks: Sequence[Task],
  ctx: Context,
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
