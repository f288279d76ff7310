"""Grain input pipeline over packed rows: infinite, shuffled, checkpointable, sharded.

The training stream is defined once, globally: an infinite sequence of row indices, each
epoch a fresh permutation (grain's index shuffle, reseeded per epoch). Global batch `s` is
stream elements `[s*GB, (s+1)*GB)`; process `p` of `P` reads only its contiguous slice
`[s*GB + p*LB, s*GB + (p+1)*LB)` with `LB = GB // P`. Hence the global batch at any step
is the same rows in the same order for every process count, and resuming on a different
topology continues the same stream.
"""

from __future__ import annotations


import grain
import numpy as np

from cbert_jax.errors import ConfigError

# A few threads fetch and stack batches ahead of the train step; the work is tiny (a
# gather of LB rows), so 2 threads keep up on the 2-core machine and on big hosts alike.
_NUM_THREADS = 2
_PREFETCH = 8


class _Rows:
  """Random-access source over a dict of equally long arrays: row i -> {key: [T]}."""

  def __init__(self, rows: dict[str, np.ndarray]):
    self._rows = rows
    self._n = len(next(iter(rows.values())))

  def __len__(self) -> int:
    return self._n

  def __getitem__(self, i: int) -> dict[str, np.ndarray]:
    return {k: v[i] for k, v in self._rows.items()}


def _check(rows: dict[str, np.ndarray], global_batch: int, process_index: int,
           process_count: int) -> int:
  """Validates the arguments and returns the local batch size."""
  if not rows:
    raise ConfigError("data pipeline: no arrays given (expected tokens/segment_ids/...).")
  lengths = {k: len(v) for k, v in rows.items()}
  if len(set(lengths.values())) != 1:
    raise ConfigError(f"data pipeline: arrays have different row counts {lengths}.")
  if next(iter(lengths.values())) == 0:
    raise ConfigError(
        "data pipeline: there are no rows (an empty split; is data.val_fraction 0 or "
        "data.max_docs too small?).")
  if process_count < 1 or not 0 <= process_index < process_count:
    raise ConfigError(
        f"data pipeline: process_index {process_index} is not in [0, {process_count}).")
  if isinstance(global_batch, bool) or not isinstance(global_batch, (int, np.integer)) or (
      global_batch < 1):
    raise ConfigError(f"batch_size must be a positive int, got {global_batch!r}.")
  if global_batch % process_count:
    raise ConfigError(
        f"batch_size={global_batch} is not divisible by the process count "
        f"{process_count}; each process loads batch_size // process_count rows.")
  return int(global_batch) // process_count


def train_iterator(rows: dict[str, np.ndarray], *, global_batch: int, seed: int,
                   process_index: int, process_count: int) -> grain.DatasetIterator:
  """Infinite shuffled iterator of this process's slice of each global batch.

  Args:
    rows: packed arrays, each [N, T] (e.g. `PackedData.train`).
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
  if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not (
      0 <= seed < 2**32):
    raise ConfigError(f"data seed must be an int in [0, 2**32) (grain's shuffle), got {seed!r}.")
  stream = (grain.MapDataset.source(_Rows(rows))
            .seed(int(seed))
            .shuffle()        # a new permutation per epoch (seed + epoch) ...
            .repeat(None))    # ... because repeat passes the global index to shuffle.
  # Local batch b of the stream is rows [b*LB, (b+1)*LB); this process owns every P-th
  # one starting at p. Slicing is lazy index arithmetic, so only our own rows are read.
  local = stream.batch(local_batch, drop_remainder=True)[process_index::process_count]
  return iter(local.to_iter_dataset(
      grain.ReadOptions(num_threads=_NUM_THREADS, prefetch_buffer_size=_PREFETCH)))


def eval_batches(rows: dict[str, np.ndarray], *, global_batch: int, num_batches: int,
                 process_index: int, process_count: int) -> list[dict[str, np.ndarray]]:
  """The first `num_batches * global_batch` rows, unshuffled, as local batches.

  Rows are reused cyclically if there are fewer, so every eval has static shapes and the
  same rows each time. Batch s of process p holds rows `(s*GB + p*LB + i) % N`, the same
  layout as `train_iterator`.

  Args:
    rows: packed arrays, each [N, T] (e.g. `PackedData.val`).
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
  n = len(next(iter(rows.values())))
  steps = np.arange(num_batches)[:, None] * global_batch  # [S, 1]
  idx = (steps + process_index * local_batch + np.arange(local_batch)) % n  # [S, LB]
  return [{k: v[idx_s] for k, v in rows.items()} for idx_s in idx]
