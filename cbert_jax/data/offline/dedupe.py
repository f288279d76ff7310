"""Leakage guard and near-duplicate detection of the offline corpus (see offline/build.py).

* probe exclusion: which archive members the probe task kit reads (`member_matches`,
  `normalise_probe_sources`), so the build can drop them before reading them;
* the leakage guard (`leakage_flags`): a paragraph goes if its normalised words equal a
  probe text, or it shares a 13-word sequence with one, or, for texts of 8-12 words, one
  contains the other whole;
* near duplicates (`near_duplicates`): MinHash over word 5-gram shingles with LSH banding,
  candidates confirmed by the exact Jaccard of their shingle sets.

Why numpy MinHash and not `datasketch`: `datasketch.MinHash.update_batch` runs once per
document in Python; the vectorised version here hashes all shingles of the corpus in one
array per permutation (see the timings in the manifest and the module's report).
"""

from __future__ import annotations

import array
import fnmatch
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from cbert_jax.data import text as text_lib
from cbert_jax.errors import ConfigError

# Leakage guard and dedupe parameters (recorded in the manifest).
PROBE_NGRAM = 13  # GPT-3 decontamination used 13-grams
PROBE_MIN_WORDS = 8  # shorter probe texts are matched only exactly
SHINGLE = 5  # word 5-grams for MinHash
NUM_PERM = 96
BANDS, ROWS = 16, 6  # P(candidate | J=0.8) = 1-(1-0.8**6)**16 = 0.992
JACCARD = 0.8


def norm_key(text: str) -> str:
  """The key of exact matching: lower-cased words joined by one space."""
  return " ".join(text_lib.WORD.findall(text.lower()))


# --- Probe exclusion (task kit) -------------------------------------------------------


def member_matches(member: str, pattern: str) -> bool:
  """Whether a probe-source entry names this archive member.

  `tasks.kit.PROBE_SOURCES` entries are member paths or path prefixes ("package/c" names
  every Brown file, ".../disfl_qa/" a task directory). An entry matches when it is an
  fnmatch glob of the member, or when it is a prefix of the member's path starting at a
  path component ("benchmark_tasks/disfl_qa/task.json" also matches the sdist's full
  "bigbench-1.0.0/bigbench/benchmark_tasks/disfl_qa/task.json"). Over-matching only
  excludes more text, which is the safe direction.
  """
  if not pattern:
    return False
  if fnmatch.fnmatchcase(member, pattern) or member.startswith(pattern):
    return True
  return ("/" + pattern.lstrip("/")) in ("/" + member)


def normalise_probe_sources(spec: Any) -> dict[str, tuple[str, ...]]:
  """`tasks.kit.PROBE_SOURCES` -> {package name: member patterns}.

  Accepted forms: a mapping {package: pattern or patterns}, or an iterable of
  (package, pattern) pairs; a package may be given by its `fetch.PACKAGES` name.
  """
  out: dict[str, list[str]] = {}
  items = spec.items() if isinstance(spec, Mapping) else spec
  try:
    for package, patterns in items:
      if isinstance(patterns, str):
        patterns = [patterns]
      out.setdefault(str(package), []).extend(str(p) for p in patterns)
  except (TypeError, ValueError) as e:
    raise ConfigError(
      "tasks.kit.PROBE_SOURCES: expected {package: member patterns} or (package, pattern) "
      f"pairs, got {spec!r:.200}."
    ) from e
  return {k: tuple(sorted(set(v))) for k, v in sorted(out.items())}


# --- Word ids and n-gram hashing (vectorised) -------------------------------------------


def word_ids(texts: Sequence[str], vocab: dict[str, int]) -> tuple[np.ndarray, np.ndarray]:
  """Concatenated word ids of all texts and their offsets (len(texts) + 1)."""
  ids = array.array("q")
  offsets = np.zeros(len(texts) + 1, dtype=np.int64)
  get = vocab.get
  for i, text in enumerate(texts):
    words = text_lib.WORD.findall(text.lower())
    for w in words:
      j = get(w)
      if j is None:
        j = vocab[w] = len(vocab)
      ids.append(j)
    offsets[i + 1] = len(ids)
  return np.frombuffer(ids, dtype=np.int64).copy(), offsets


def _mix(x: np.ndarray) -> np.ndarray:
  """splitmix64 finaliser: word ids -> well-spread 64-bit values."""
  x = x.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
  x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
  x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
  return x ^ (x >> np.uint64(31))


_MULTS = _mix(np.arange(1, 64, dtype=np.uint64)) | np.uint64(1)


def _ngram_hashes(mixed: np.ndarray, offsets: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
  """Hashes of every word n-gram that lies inside one text, and the text of each.

  h(i) = sum_k mixed[i+k] * M_k (mod 2^64): the same words give the same hash wherever
  they occur, so probe and corpus n-grams compare directly.
  """
  total = len(mixed)
  if total < n:
    return np.zeros(0, np.uint64), np.zeros(0, np.int64)
  m = total - n + 1
  h = np.zeros(m, dtype=np.uint64)
  with np.errstate(over="ignore"):
    for k in range(n):
      h += mixed[k : k + m] * _MULTS[k]
  doc = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))[:m]
  valid = np.arange(m) + n <= offsets[doc + 1]
  return h[valid], doc[valid]


def _sorted_unique(x: np.ndarray) -> np.ndarray:
  """np.unique by sorting (numpy 2's hash-based np.unique is ~20x slower on uint64 here)."""
  x = np.sort(x)
  return x[np.concatenate([[True], x[1:] != x[:-1]])] if len(x) else x


# --- Leakage guard ----------------------------------------------------------------------


def leakage_flags(
  texts: Sequence[str],
  probe_texts: Sequence[str],
  vocab: dict[str, int] | None = None,
  words: tuple[np.ndarray, np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
  """Which texts leak a probe: (exact normalised match, shared long n-gram), bool arrays.

  A text leaks if its normalised words equal a probe text's; or it shares a
  `PROBE_NGRAM`-word sequence with one; or a text/probe of `PROBE_MIN_WORDS`..12 words
  is contained whole in the other.
  """
  n_docs = len(texts)
  exact = np.zeros(n_docs, bool)
  ngram = np.zeros(n_docs, bool)
  if not probe_texts:
    return exact, ngram
  probe_keys = {norm_key(t) for t in probe_texts}
  probe_keys.discard("")
  exact[:] = [norm_key(t) in probe_keys for t in texts]
  vocab = {} if vocab is None else vocab
  ids, offsets = words if words is not None else word_ids(texts, vocab)
  p_ids, p_offsets = word_ids(list(probe_keys), vocab)
  mixed, p_mixed = _mix(ids), _mix(p_ids)
  lengths, p_lengths = np.diff(offsets), np.diff(p_offsets)

  def hits(probe_hashes: np.ndarray, corpus_hashes: np.ndarray, docs: np.ndarray) -> None:
    probe_hashes = _sorted_unique(probe_hashes)
    if len(probe_hashes) and len(corpus_hashes):
      pos = np.searchsorted(probe_hashes, corpus_hashes).clip(0, len(probe_hashes) - 1)
      ngram[docs[probe_hashes[pos] == corpus_hashes]] = True

  # Long n-grams both sides.
  h, d = _ngram_hashes(mixed, offsets, PROBE_NGRAM)
  ph, _ = _ngram_hashes(p_mixed, p_offsets, PROBE_NGRAM)
  hits(ph, h, d)
  del h, d
  # Short texts: a whole probe of L words inside a corpus text, and a whole corpus text
  # of L words inside a probe.
  for length in range(PROBE_MIN_WORDS, PROBE_NGRAM):
    short_p = np.flatnonzero(p_lengths == length)
    short_c = np.flatnonzero(lengths == length)
    if not len(short_p) and not len(short_c):
      continue
    h, d = _ngram_hashes(mixed, offsets, length)
    ph, pd = _ngram_hashes(p_mixed, p_offsets, length)
    if len(short_p):
      hits(ph[np.isin(pd, short_p)], h, d)
    if len(short_c):
      keep = np.isin(d, short_c)
      hits(ph, h[keep], d[keep])
  return exact, ngram & ~exact


# --- Near-duplicate detection -----------------------------------------------------------


def near_duplicates(
  words: tuple[np.ndarray, np.ndarray],
  alive: np.ndarray | None = None,
  num_perm: int = NUM_PERM,
  bands: int = BANDS,
  rows: int = ROWS,
  threshold: float = JACCARD,
  seed: int = 0,
) -> np.ndarray:
  """Marks documents that are near copies of an earlier one (bool array).

  MinHash signatures over word `SHINGLE`-grams, LSH with `bands` x `rows`; each
  candidate pair is confirmed by the exact Jaccard similarity of the two shingle sets.
  Clusters are connected components of confirmed pairs; the lowest index is kept.

  Args:
    words: (word ids, offsets) of all documents, from `word_ids`.
    alive: documents to consider (others are ignored); default all.
  """
  if bands * rows != num_perm:
    raise ConfigError(
      f"near_duplicates: bands*rows must equal num_perm, got {bands}x{rows} != {num_perm}."
    )
  ids, offsets = words
  n_docs = len(offsets) - 1
  alive = np.ones(n_docs, bool) if alive is None else alive
  dup = np.zeros(n_docs, bool)
  h, d = _ngram_hashes(_mix(ids), offsets, SHINGLE)
  keep = alive[d]
  h, d = h[keep], d[keep]
  if not len(h):
    return dup
  # Docs with at least one shingle, as segments of h (d is sorted).
  starts = np.flatnonzero(np.concatenate([[True], d[1:] != d[:-1]]))
  docs = d[starts]
  rng = np.random.default_rng(seed)
  a = rng.integers(1, 2**63, size=num_perm, dtype=np.uint64) | np.uint64(1)
  b = rng.integers(0, 2**63, size=num_perm, dtype=np.uint64)
  sig = np.empty((len(docs), num_perm), dtype=np.uint32)
  with np.errstate(over="ignore"):
    for j in range(num_perm):
      # Multiply-shift hashing: the top 32 bits of a*h+b are a good universal hash.
      sig[:, j] = np.minimum.reduceat(
        ((h * a[j] + b[j]) >> np.uint64(32)).astype(np.uint32), starts
      )
  # LSH: documents whose band slices agree are candidates.
  pairs = set()
  for band in range(bands):
    key = (
      np.ascontiguousarray(sig[:, band * rows : (band + 1) * rows])
      .view(np.dtype((np.void, 4 * rows)))
      .ravel()
    )
    order = np.argsort(key, kind="stable")
    sorted_key = key[order]
    same = sorted_key[1:] == sorted_key[:-1]
    if not same.any():
      continue
    # Each member of a bucket pairs with the bucket's first (lowest-index) member.
    group_start = np.concatenate([[True], ~same])
    first = order[np.maximum.accumulate(np.where(group_start, np.arange(len(order)), 0))]
    for i, f in zip(order[1:][same], first[1:][same]):
      pairs.add((int(min(f, i)), int(max(f, i))))
  if not pairs:
    return dup
  ends = np.append(starts[1:], len(h))
  cache: dict[int, np.ndarray] = {}

  def shingles(k: int) -> np.ndarray:
    if k not in cache:
      cache[k] = _sorted_unique(h[starts[k] : ends[k]])
    return cache[k]

  parent = list(range(len(docs)))

  def find(x: int) -> int:
    while parent[x] != x:
      parent[x] = parent[parent[x]]
      x = parent[x]
    return x

  for i, j in sorted(pairs):
    si, sj = shingles(i), shingles(j)
    inter = len(np.intersect1d(si, sj, assume_unique=True))
    if inter / (len(si) + len(sj) - inter) >= threshold:
      ri, rj = find(i), find(j)
      if ri != rj:
        parent[max(ri, rj)] = min(ri, rj)  # the root stays the lowest index
  for k in range(len(docs)):
    if find(k) != k:
      dup[docs[k]] = True
  return dup
