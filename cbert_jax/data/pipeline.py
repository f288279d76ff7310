"""Grain input pipeline over packed rows: infinite, shuffled, checkpointable, sharded.

The training stream is defined once, globally: an infinite sequence of row indices, each
epoch a fresh permutation (grain's index shuffle, reseeded per epoch). Global batch `s` is
stream elements `[s*GB, (s+1)*GB)`; process `p` of `P` reads only its contiguous slice
`[s*GB + p*LB, s*GB + (p+1)*LB)` with `LB = GB // P`. Hence the global batch at any step
is the same rows in the same order for every process count, and resuming on a different
topology continues the same stream.

Rows come either from memory (a dict of [N, T] arrays, the small corpora) or from packed
ArrayRecord shards (`ArrayRecordRows`, written by `shards.py` for
`data.corpus = "sources"`). The stream is built over row *indices* and rows are gathered
per local batch, so both give the same batches for the same rows, and a process reads
only its own rows from disk.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import grain
import numpy as np

from cbert_jax.errors import ConfigError

# A few threads fetch and stack batches ahead of the train step; the work is tiny (a
# gather of LB rows), so 2 threads keep up on the 2-core machine and on big hosts alike.
_NUM_THREADS = 2
_PREFETCH = 8


KEYS = ("tokens", "segment_ids", "positions")  # record order of ArrayRecordRows


class ArrayRecordRows:
  """Random-access packed rows in ArrayRecord shards (see `shards.RECORD_LAYOUT`).

  Each record is the little-endian int32 bytes of one row [3, T] (tokens, segment_ids,
  positions). Row i of the whole is row i of the concatenated shards, in the order given.
  Readers open lazily (one per shard touched), so building one over thousands of shards
  costs nothing, and it pickles without them.

  Why not grain's `ArrayRecordDataSource`: its batched read (`__getitems__`) starts a
  thread pool per call; for a batch of 16-32 rows that is 6x slower (3.1 vs 0.5 ms per
  batch, measured) than grouping the batch by shard and calling each reader's `read`
  once, which is what `read` does. The readers and options are the same
  (`readahead_buffer_size:0`, files written with `group_size:1`).
  """

  _READER_OPTIONS = "readahead_buffer_size:0"  # random access: no read-ahead

  def __init__(self, paths: Sequence[str], rows_per_file: Sequence[int], seq_len: int):
    """Args: shard paths, their row counts (from the index), and the row length T."""
    if len(paths) != len(rows_per_file):
      raise ConfigError(f"ArrayRecordRows: {len(paths)} paths but {len(rows_per_file)} row counts.")
    self._paths = [str(p) for p in paths]
    self._counts = [int(n) for n in rows_per_file]
    self._offsets = np.cumsum([0] + self._counts)  # [F+1]: first row of each shard
    self._t = int(seq_len)
    self._n = int(self._offsets[-1])
    self._readers: list[Any] = [None] * len(self._paths)
    self._lock = threading.Lock()

  def __getstate__(self) -> dict[str, Any]:
    state = dict(self.__dict__)
    state["_readers"] = [None] * len(self._paths)
    del state["_lock"]
    return state

  def __setstate__(self, state: dict[str, Any]) -> None:
    self.__dict__.update(state)
    self._lock = threading.Lock()

  @property
  def paths(self) -> list[str]:
    return list(self._paths)

  @property
  def seq_len(self) -> int:
    return self._t

  def __len__(self) -> int:
    return self._n

  def _reader(self, f: int) -> Any:
    if self._readers[f] is None:
      with self._lock:  # grain's reader threads may race to open the same shard
        if self._readers[f] is None:
          from array_record.python import array_record_module  # pylint: disable=g-import-not-at-top

          try:
            reader = array_record_module.ArrayRecordReader(self._paths[f], self._READER_OPTIONS)
          except Exception as e:  # the C++ reader raises RuntimeError/ValueError.
            raise ConfigError(
              f"ArrayRecordRows: cannot open {self._paths[f]} ({e}); "
              "was the packed cache deleted or moved?"
            ) from e
          if reader.num_records() != self._counts[f]:
            raise ConfigError(
              f"ArrayRecordRows: {self._paths[f]} has {reader.num_records()} rows, "
              f"the index says {self._counts[f]}; delete the packed directory."
            )
          self._readers[f] = reader
    return self._readers[f]

  def read(self, indices: Sequence[int] | np.ndarray) -> dict[str, np.ndarray]:
    """Rows at `indices` as {key: int32 [len(indices), T]}."""
    idx = np.asarray(indices, np.int64).reshape(-1)  # [B]
    if idx.size and (idx.min() < 0 or idx.max() >= self._n):
      raise IndexError(f"row index out of range [0, {self._n}).")
    shard = np.searchsorted(self._offsets, idx, side="right") - 1  # [B]
    records: list[bytes] = [b""] * idx.size
    for f in np.unique(shard):
      sel = np.flatnonzero(shard == f)
      got = self._reader(int(f)).read((idx[sel] - self._offsets[f]).tolist())
      for j, rec in zip(sel, got):
        records[j] = rec
    buf = b"".join(records)
    if len(buf) != idx.size * 3 * self._t * 4:
      raise ConfigError(
        f"ArrayRecordRows: records of {self._paths[0]}... are not int32 [3, {self._t}] "
        f"rows ({len(buf)} bytes for {idx.size} rows); was it built for another "
        "seq_len or layout?"
      )
    arr = np.frombuffer(buf, "<i4").reshape(idx.size, 3, self._t)  # [B, 3, T]
    return {k: np.ascontiguousarray(arr[:, j], dtype=np.int32) for j, k in enumerate(KEYS)}

  def __getitem__(self, i: int) -> dict[str, np.ndarray]:
    return {k: v[0] for k, v in self.read([i]).items()}

  def __repr__(self) -> str:
    return f"ArrayRecordRows({self._n} rows x {self._t} in {len(self._paths)} shards)"


Rows = dict[str, np.ndarray] | ArrayRecordRows


def num_rows(rows: Rows) -> int:
  """Number of packed rows in a dict of arrays or a row source."""
  if isinstance(rows, dict):
    return len(next(iter(rows.values()))) if rows else 0
  return len(rows)


def _gather(rows: Rows, idx: np.ndarray) -> dict[str, np.ndarray]:
  """Rows at `idx` ([B] int) as {key: [B, T]}."""
  if isinstance(rows, dict):
    return {k: v[idx] for k, v in rows.items()}
  return rows.read(idx)


class _Gather:
  """grain map: a batch of row indices -> the rows (a class so it has a readable name)."""

  def __init__(self, rows: Rows):
    self._rows = rows

  def __call__(self, idx: np.ndarray) -> dict[str, np.ndarray]:
    return _gather(self._rows, np.asarray(idx, np.int64))


def _check(rows: Rows, global_batch: int, process_index: int, process_count: int) -> int:
  """Validates the arguments and returns the local batch size."""
  if isinstance(rows, ArrayRecordRows):
    if not len(rows):
      raise ConfigError(
        "data pipeline: there are no rows (an empty split; is data.val_fraction 0?)."
      )
    rows = {"tokens": np.zeros((1, 1))}  # the remaining checks are on the batch args
  if not rows:
    raise ConfigError("data pipeline: no arrays given (expected tokens/segment_ids/...).")
  lengths = {k: len(v) for k, v in rows.items()}
  if len(set(lengths.values())) != 1:
    raise ConfigError(f"data pipeline: arrays have different row counts {lengths}.")
  if next(iter(lengths.values())) == 0:
    raise ConfigError(
      "data pipeline: there are no rows (an empty split; is data.val_fraction 0 or "
      "data.max_docs too small?)."
    )
  if process_count < 1 or not 0 <= process_index < process_count:
    raise ConfigError(
      f"data pipeline: process_index {process_index} is not in [0, {process_count})."
    )
  if (
    isinstance(global_batch, bool)
    or not isinstance(global_batch, (int, np.integer))
    or (global_batch < 1)
  ):
    raise ConfigError(f"batch_size must be a positive int, got {global_batch!r}.")
  if global_batch % process_count:
    raise ConfigError(
      f"batch_size={global_batch} is not divisible by the process count "
      f"{process_count}; each process loads batch_size // process_count rows."
    )
  return int(global_batch) // process_count


def train_iterator(
  rows: Rows, *, global_batch: int, seed: int, process_index: int, process_count: int
) -> grain.DatasetIterator:
  """Infinite shuffled iterator of this process's slice of each global batch.

  Args:
    rows: packed arrays, each [N, T], or an `ArrayRecordRows` (e.g. `PackedData.train`).
    global_batch: rows per step over all processes (config `batch_size`).
    seed: shuffle seed, in [0, 2**32). Epoch e uses grain's per-epoch seed `seed + e`.
    process_index: this process (`jax.process_index()`).
    process_count: number of processes (`jax.process_count()`).

  Returns:
    A grain `DatasetIterator` yielding {key: [global_batch // process_count, T]} with the
    keys of `rows`. Local batch s of process p holds rows `s*GB + p*LB + i` of the
    shuffled stream, so concatenating all processes' batch s in process order gives the
    global batch s, identical for any process_count.

    Checkpointing: `it.get_state()` is a small JSON-serialisable dict
    (`{"next_index": s}`, the number of global batches consumed). It is the same on
    every process, so process 0 can save it and any process count can restore it: build
    a fresh iterator with the same rows/global_batch/seed (and its own process_index /
    process_count) and call `it.set_state(state)`; the next batch is global batch s.

  Raises:
    ConfigError: if `global_batch` is not divisible by `process_count`, or rows are
      empty or inconsistent.
  """
  local_batch = _check(rows, global_batch, process_index, process_count)
  if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not (0 <= seed < 2**32):
    raise ConfigError(f"data seed must be an int in [0, 2**32) (grain's shuffle), got {seed!r}.")
  # The stream holds row *indices*; shuffling a range permutes exactly as shuffling the
  # rows would (grain's permutation depends only on length, seed and epoch).
  stream = (
    grain.MapDataset.range(num_rows(rows))
    .seed(int(seed))
    .shuffle()  # a new permutation per epoch (seed + epoch) ...
    .repeat(None)
  )  # ... because repeat passes the global index to shuffle.
  # Local batch b of the stream is rows [b*LB, (b+1)*LB); this process owns every P-th
  # one starting at p. Slicing is lazy index arithmetic, and the gather runs after it,
  # so only our own rows are read (one vectorised gather / batched read per batch).
  local = stream.batch(local_batch, drop_remainder=True)[process_index::process_count].map(
    _Gather(rows)
  )
  return iter(
    local.to_iter_dataset(
      grain.ReadOptions(num_threads=_NUM_THREADS, prefetch_buffer_size=_PREFETCH)
    )
  )


def eval_batches(
  rows: Rows, *, global_batch: int, num_batches: int, process_index: int, process_count: int
) -> list[dict[str, np.ndarray]]:
  """The first `num_batches * global_batch` rows, unshuffled, as local batches.

  Rows are reused cyclically if there are fewer, so every eval has static shapes and the
  same rows each time. Batch s of process p holds rows `(s*GB + p*LB + i) % N`, the same
  layout as `train_iterator`.

  Args:
    rows: packed arrays, each [N, T], or an `ArrayRecordRows` (e.g. `PackedData.val`).
    global_batch: rows per eval step over all processes.
    num_batches: number of eval steps.
    process_index: this process.
    process_count: number of processes.

  Returns:
    `num_batches` dicts of {key: [global_batch // process_count, T]}.

  Raises:
    ConfigError: as for `train_iterator`, or if `num_batches` < 1.
  """
  local_batch = _check(rows, global_batch, process_index, process_count)
  if num_batches < 1:
    raise ConfigError(f"eval num_batches must be >= 1, got {num_batches}.")
  n = num_rows(rows)
  steps = np.arange(num_batches)[:, None] * global_batch  # [S, 1]
  idx = (steps + process_index * local_batch + np.arange(local_batch)) % n  # [S, LB]
  return [_gather(rows, idx_s) for idx_s in idx]
