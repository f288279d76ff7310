"""Tokenise the corpus and pack it into static-shape rows that carry document ids.

`pack` concatenates documents and cuts the stream into rows of exactly `seq_len` tokens.
A document that does not fit in the rest of a row continues in the next row as a new
segment. Per token it records:

  tokens       int32 [N, T]  token ids, 0 = padding (only at the end of the last row)
  segment_ids  int32 [N, T]  1, 2, 3, ... per document piece within a row; 0 = padding
  positions    int32 [N, T]  0-based position inside the segment; 0 on padding

so attention can be masked to `segment_ids[q] == segment_ids[k]` and RoPE uses
`positions`. `pack_stream` is the same on a concatenated id array (the streaming
preprocessor's shard writer, preprocess.py). The entry point that runs corpus -> tokenizer ->
pack and caches the result is prepare.py.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np

from cbert_jax.data import tokenizer as tokenizer_lib

KEYS = ("tokens", "segment_ids", "positions")
# Part of the cache key: bump when `pack`'s output for the same input changes.
PACK_VERSION = 1
# Docs per sentencepiece call: big enough for its thread pool, small enough that the
# Python lists of one chunk stay modest.
_ENCODE_CHUNK = 8192


@dataclasses.dataclass
class PackedData:
  """Packed train/val rows plus what produced them.

  Attributes:
    train: {"tokens", "segment_ids", "positions"}, each int32 [N_train, T]; for
      `data.corpus="sources"` a `pipeline.ArrayRecordRows` over packed shards, which
      `pipeline.train_iterator`/`eval_batches` accept alike (`pipeline.num_rows` counts
      either).
    val: the same for validation, [N_val, T] (N_val may be 0 if val_fraction is 0).
    tokenizer: the tokenizer used; the model's vocab size is `tokenizer.vocab_size`.
    manifest: the corpus manifest plus `tokenizer`, `seq_len`, `rows`, `tokens`,
      `pack_version`, and `hash` (sha256 of everything else in the manifest).
    timings: seconds per stage ({"corpus", "tokenizer", "encode_pack" or "cache_load"});
      not part of the manifest because it is not reproducible.
  """

  train: dict[str, np.ndarray] | Any  # or pipeline.ArrayRecordRows (corpus="sources")
  val: dict[str, np.ndarray] | Any
  tokenizer: tokenizer_lib.Tokenizer
  manifest: dict[str, Any]
  timings: dict[str, float] = dataclasses.field(default_factory=dict)

  @property
  def vocab_size(self) -> int:
    """Size of the embedding table the model needs."""
    return self.tokenizer.vocab_size


def pack(token_lists: Sequence[Sequence[int]], seq_len: int) -> dict[str, np.ndarray]:
  """Greedily packs documents, in order, into rows of exactly `seq_len` tokens.

  Args:
    token_lists: one id sequence per document; empty documents are skipped.
    seq_len: row length T.

  Returns:
    {"tokens", "segment_ids", "positions"}, each int32 [N, T] with N = ceil(total / T);
    see the module docstring. Only the last row has padding.
  """
  lengths = np.fromiter(
    (len(x) for x in token_lists), dtype=np.int64, count=len(token_lists)
  )  # [D]
  total = int(lengths.sum())
  # One C-level pass over all ids: much faster than concatenating 100k small arrays.
  flat = np.fromiter(itertools.chain.from_iterable(token_lists), dtype=np.int32, count=total)  # [L]
  return pack_stream(flat, lengths, seq_len)


def pack_stream(flat: np.ndarray, lengths: np.ndarray, seq_len: int) -> dict[str, np.ndarray]:
  """`pack` on documents already concatenated into one id array.

  The streaming preprocessor (preprocess.py) packs its buffered documents with this, so both
  paths share one packing rule.

  Args:
    flat: int32 [L], the documents' ids back to back.
    lengths: int [D], each document's length (zeros are skipped), summing to L.
    seq_len: row length T.

  Returns:
    {"tokens", "segment_ids", "positions"}, each int32 [N, T] with N = ceil(L / T).
  """
  if seq_len < 1:
    raise ValueError(f"seq_len must be >= 1, got {seq_len}.")
  t = int(seq_len)
  total = int(flat.size)
  n_rows = -(-total // t)
  size = n_rows * t

  tokens = np.zeros(size, np.int32)  # [N*T], pad id 0
  tokens[:total] = flat
  # A segment starts at every document start and at every row start (the continuation
  # of a split document, or a document that happens to begin the row).
  doc_starts = np.cumsum(lengths[lengths > 0]) - lengths[lengths > 0]  # [D']
  is_start = np.zeros(size, bool)  # [N*T]
  is_start[doc_starts] = True
  is_start[::t] = True  # every row start is < total because N = ceil(total / T)
  valid = np.arange(size) < total  # [N*T]; False only in the last row's tail

  segment_ids = np.cumsum(is_start.reshape(n_rows, t), axis=1, dtype=np.int32)  # [N, T]
  segment_ids[~valid.reshape(n_rows, t)] = 0
  idx = np.arange(size, dtype=np.int64)  # [N*T]
  # Index of the latest segment start at or before each token.
  seg_start = np.maximum.accumulate(np.where(is_start, idx, 0))  # [N*T]
  positions = (idx - seg_start).astype(np.int32)  # [N*T]
  positions[~valid] = 0
  return dict(
    tokens=tokens.reshape(n_rows, t),
    segment_ids=segment_ids,
    positions=positions.reshape(n_rows, t),
  )


def encode_docs(tokenizer: tokenizer_lib.Tokenizer, docs: Sequence[str]) -> list[list[int]]:
  """Tokenises documents in chunks (plain ids, no BOS/EOS)."""
  ids: list[list[int]] = []
  for start in range(0, len(docs), _ENCODE_CHUNK):
    ids.extend(tokenizer.encode_batch(docs[start : start + _ENCODE_CHUNK]))
  return ids
