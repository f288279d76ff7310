"""SentencePiece tokenizer: trained on the corpus (and cached), or loaded from a file.

Layout of every model this module trains (and the contract a user-supplied model must meet
for pad and `[MASK]`):

  id 0 `<pad>`, 1 `<unk>`, 2 `<s>`, 3 `</s>`, 4 `[MASK]` (user-defined symbol), then the
  256 byte-fallback pieces `<0x00>`..`<0xFF>`, then learned pieces.

Byte fallback means no text ever maps to `<unk>`. `[MASK]` is a *user-defined* symbol, so
a literal "[MASK]" in raw text would encode to `mask_id`; none occurs in the Gutenberg
selection.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import sentencepiece as spm

from cbert_jax.data import cache_entry, fetch
from cbert_jax.data import corpus as corpus_lib
from cbert_jax.errors import ConfigError

MASK_PIECE = "[MASK]"
PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
# 256 byte pieces + 5 special symbols must fit, plus a few dozen merges to be useful.
MIN_VOCAB_SIZE = 300
# Part of the cache key: bump when the trainer options below change.
_TRAINER_VERSION = 1
# Documents longer than this many bytes would be skipped by the trainer (its default is
# 4192); our longest paragraph is ~50k chars. Longer documents (a file that is one line, a
# `text_mode="file"` document) are cut into pieces of at most `_PIECE_CHARS` characters
# for the training sample (`_sample_pieces`): without that the trainer skipped them, and a
# corpus of only such documents ended in SentencePiece's `!sentences_.empty()` check.
_MAX_SENTENCE_BYTES = 1 << 17
_PIECE_CHARS = _MAX_SENTENCE_BYTES // 4  # UTF-8 needs at most 4 bytes per character


class Tokenizer:
  """A SentencePiece model with the ids the MLM code needs.

  Attributes are read-only properties: `vocab_size`, `pad_id`, `unk_id`, `bos_id`,
  `eos_id`, `mask_id`, `special_ids`, `model_path`, `sha256`.
  """

  def __init__(self, model_path: str, *, field: str = "data.tokenizer_path"):
    """Loads and validates `model_path`.

    Args:
      model_path: a SentencePiece `.model` file.
      field: the config field to name in errors.

    Raises:
      ConfigError: if the file is missing, is not a SentencePiece model, lacks `[MASK]`,
        or does not use id 0 for padding.
    """
    if not os.path.isfile(model_path):
      raise ConfigError(f"{field}: no such file {model_path!r}.")
    with open(model_path, "rb") as f:
      proto = f.read()
    try:
      sp = spm.SentencePieceProcessor(model_proto=proto)
    except Exception as e:  # sentencepiece raises RuntimeError/OSError on a bad proto.
      raise ConfigError(f"{field}: {model_path!r} is not a valid SentencePiece model ({e}).") from e
    if sp.pad_id() != PAD_ID:
      raise ConfigError(
        f"{field}: {model_path!r} has pad id {sp.pad_id()}, expected {PAD_ID} (packing "
        "pads with 0); retrain with --pad_id=0."
      )
    mask_id = sp.piece_to_id(MASK_PIECE)
    # piece_to_id answers unk for an unknown piece.
    if mask_id == sp.unk_id() or sp.id_to_piece(mask_id) != MASK_PIECE:
      raise ConfigError(
        f"{field}: {model_path!r} has no {MASK_PIECE} piece; retrain with "
        f"--user_defined_symbols={MASK_PIECE}."
      )
    self._sp = sp
    self._mask_id = mask_id
    self._model_path = os.path.abspath(model_path)
    self._sha256 = hashlib.sha256(proto).hexdigest()

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    """Encodes texts to plain id lists (no BOS/EOS), using sentencepiece's threads."""
    return self._sp.encode(list(texts), out_type=int, add_bos=False, add_eos=False)

  def decode(self, ids: Sequence[int] | np.ndarray) -> str:
    """Decodes ids to text; special ids other than `[MASK]` decode to nothing."""
    return self._sp.decode(np.asarray(ids, dtype=np.int64).reshape(-1).tolist())

  def id_to_piece(self, i: int) -> str:
    """Returns the piece string of id `i` (for debugging and reports)."""
    return self._sp.id_to_piece(int(i))

  @property
  def vocab_size(self) -> int:
    """Number of ids, specials included: the size of the embedding table."""
    return self._sp.get_piece_size()

  @property
  def pad_id(self) -> int:
    """Padding id (always 0)."""
    return self._sp.pad_id()

  @property
  def unk_id(self) -> int:
    """Unknown id (1 in trained models; unused thanks to byte fallback)."""
    return self._sp.unk_id()

  @property
  def bos_id(self) -> int:
    """Begin-of-sequence id (2 in trained models; -1 if a loaded model has none)."""
    return self._sp.bos_id()

  @property
  def eos_id(self) -> int:
    """End-of-sequence id (3 in trained models; -1 if a loaded model has none)."""
    return self._sp.eos_id()

  @property
  def mask_id(self) -> int:
    """Id of the `[MASK]` symbol."""
    return self._mask_id

  @property
  def special_ids(self) -> tuple[int, ...]:
    """Sorted ids that must never be masked or predicted: pad, bos, eos, mask."""
    ids = {self.pad_id, self.bos_id, self.eos_id, self.mask_id}
    return tuple(sorted(i for i in ids if i >= 0))

  @property
  def model_path(self) -> str:
    """Absolute path of the `.model` file."""
    return self._model_path

  @property
  def sha256(self) -> str:
    """sha256 of the model file: identifies the tokenizer in manifests and cache keys."""
    return self._sha256

  def __repr__(self) -> str:
    return (
      f"Tokenizer(vocab_size={self.vocab_size}, mask_id={self.mask_id}, "
      f"sha256={self.sha256[:12]}, path={self.model_path!r})"
    )


def check_tokenizer_config(cfg: Any) -> None:
  """Validates the tokenizer fields of the `data` config before any work.

  Raises:
    ConfigError: naming the bad field and what was expected.
  """
  cache_entry.check_mode(getattr(cfg, "verify_cache", "sample"))
  path = getattr(cfg, "tokenizer_path", "") or ""
  if path:
    if not isinstance(path, str) or not os.path.isfile(os.path.expanduser(path)):
      raise ConfigError(
        f"data.tokenizer_path: no such file {path!r} (a SentencePiece .model; leave it "
        "empty to train one on the corpus)."
      )
    return
  vocab = getattr(cfg, "vocab_size", 8192)
  if isinstance(vocab, bool) or not isinstance(vocab, int) or vocab < MIN_VOCAB_SIZE:
    raise ConfigError(
      f"data.vocab_size must be an int >= {MIN_VOCAB_SIZE} (256 byte pieces + 5 "
      f"specials + merges), got {vocab!r}."
    )
  kind = getattr(cfg, "tokenizer_type", "bpe")
  if kind not in ("bpe", "unigram"):
    raise ConfigError(f"data.tokenizer_type must be 'bpe' or 'unigram', got {kind!r}.")
  cap = getattr(cfg, "tokenizer_sample_chars", 20_000_000)
  if isinstance(cap, bool) or not isinstance(cap, int) or cap <= 0:
    raise ConfigError(f"data.tokenizer_sample_chars must be an int > 0, got {cap!r}.")


def _too_long(doc: str) -> bool:
  """True if the trainer would skip `doc` (more than `_MAX_SENTENCE_BYTES` in UTF-8)."""
  return len(doc) > _PIECE_CHARS and len(doc.encode("utf-8")) > _MAX_SENTENCE_BYTES


def _pieces(doc: str, max_chars: int = _PIECE_CHARS) -> list[str]:
  """Cuts `doc` into pieces of at most `max_chars` characters.

  Cuts after the last sentence end (". ") in the second half of the window, else at the
  last space, else (no space at all) hard at `max_chars`; the space at a cut is dropped.
  Linear in len(doc).
  """
  out, start, n = [], 0, len(doc)
  while n - start > max_chars:
    end = start + max_chars
    cut = doc.rfind(". ", start + max_chars // 2, end)
    if cut >= 0:
      cut += 1  # keep the full stop
    else:
      cut = doc.rfind(" ", start + 1, end)
      cut = cut if cut > start else end
    out.append(doc[start:cut])
    start = cut + 1 if cut < n and doc[cut] == " " else cut
  if start < n:
    out.append(doc[start:])
  return out


def _sample_pieces(docs: Sequence[str]) -> list[str]:
  """`docs` with every document the trainer would skip cut into `_pieces`."""
  if not any(map(_too_long, docs)):
    return list(docs)
  return [p for doc in docs for p in (_pieces(doc) if _too_long(doc) else [doc])]


def _training_sample(docs: Sequence[str], max_chars: int) -> list[str]:
  """Picks at most `max_chars` of text, spread evenly over the corpus, deterministically.

  A prefix would see only the first books (sources are sorted by name); a fixed stride
  keeps every source represented without any randomness. Documents too long for the
  trainer are first cut into pieces (`_sample_pieces`); other documents are taken whole.
  """
  docs = _sample_pieces(docs)
  total = sum(map(len, docs))
  stride = max(1, -(-total // max_chars))  # ceil
  sample, chars = [], 0
  for doc in docs[::stride]:
    if chars + len(doc) > max_chars:
      break
    sample.append(doc)
    chars += len(doc)
  return sample


def _train(docs: Sequence[str], *, vocab_size: int, model_type: str) -> bytes:
  """Trains a SentencePiece model in memory and returns the serialized proto."""
  model = io.BytesIO()
  # Fixed seed: unigram seeding and any sampling inside the trainer become reproducible,
  # so independent hosts without a shared cache train identical models.
  spm.set_random_generator_seed(0)
  try:
    spm.SentencePieceTrainer.train(
      sentence_iterator=iter(docs),
      model_writer=model,
      model_type=model_type,
      vocab_size=vocab_size,
      pad_id=PAD_ID,
      unk_id=UNK_ID,
      bos_id=BOS_ID,
      eos_id=EOS_ID,
      user_defined_symbols=[MASK_PIECE],
      byte_fallback=True,
      # We sample ourselves (_training_sample); the trainer must not drop or reorder.
      input_sentence_size=0,
      shuffle_input_sentence=False,
      max_sentence_length=_MAX_SENTENCE_BYTES,
      num_threads=os.cpu_count() or 1,
      minloglevel=2,
    )
  except RuntimeError as e:
    if "Vocabulary size too high" in str(e):
      # The message says the largest size this text supports ("<= N").
      raise ConfigError(f"data.vocab_size={vocab_size} is too large for this corpus: {e}") from e
    if "Vocabulary size is smaller than required_chars" in str(e):
      # Every distinct character of the sample needs a piece ("320 vs 325").
      raise ConfigError(
        f"data.vocab_size={vocab_size} is too small for the characters of this corpus: "
        f"{str(e).split('] ', 1)[-1]}"
      ) from e
    raise
  return model.getvalue()


def _cache_key(
  corpus: corpus_lib.Corpus, vocab_size: int, model_type: str, sample_chars: int
) -> str:
  """Hash of everything that determines the trained model."""
  key = dict(
    content_hash=corpus.manifest["content_hash"],
    vocab_size=vocab_size,
    model_type=model_type,
    sample_chars=sample_chars,
    trainer_version=_TRAINER_VERSION,
  )
  if any(map(_too_long, corpus.train_docs)):
    # Such corpora used to train without their long documents (or not at all): a model
    # cached then is not the one `_training_sample` gives now. Other keys are unchanged.
    key["long_documents"] = f"pieces of {_PIECE_CHARS} chars"
  return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


def _load_cached(path: str) -> Tokenizer:
  """A cached model, structurally checked (`cache_entry.Damaged` if it is not usable)."""
  try:
    return Tokenizer(path, field="data.tokenizer_path (cached model)")
  except ConfigError as e:
    raise cache_entry.Damaged(str(e)) from e


def get_tokenizer(cfg: Any, corpus: corpus_lib.Corpus) -> Tokenizer:
  """Loads `data.tokenizer_path`, or trains (once, then cached) a model on the corpus.

  Args:
    cfg: the `data` config; reads `tokenizer_path` ("" = train), `vocab_size` (8192),
      `tokenizer_type` ("bpe" or "unigram"), `tokenizer_sample_chars` (20_000_000) and
      `cache_dir`.
    corpus: the loaded corpus; only `train_docs` are used, so validation text never
      shapes the vocabulary.

  Returns:
    The tokenizer. A trained model is stored as
    `<cache_dir>/tokenizers/spm-<type>-<vocab>-<key>.model` with a sha256 sidecar
    (cache_entry.py), where the key hashes the corpus content hash, vocab size, type and
    sample cap; a later call with the same inputs loads it instead of training. A cached
    model that fails its sidecar check or does not load is moved to `<cache>/damaged/`
    with a warning and trained again.

  Raises:
    ConfigError: for bad fields, an unusable `data.tokenizer_path` file, or a vocab too
      large for the corpus.
  """
  check_tokenizer_config(cfg)
  path = getattr(cfg, "tokenizer_path", "") or ""
  if path:
    path = os.path.expanduser(path)
    # A model copied out of the cache keeps its sidecar: check it (a user's own model
    # has none and is only checked by loading it).
    try:
      reason = cache_entry.verify(path, getattr(cfg, "verify_cache", "sample"))
    except OSError as e:
      raise ConfigError(f"data.tokenizer_path: {path!r} cannot be read ({e.strerror}).") from e
    if reason is not None:
      raise ConfigError(
        f"data.tokenizer_path: {path!r} is damaged ({reason}; recorded in "
        f"{cache_entry.sidecar_path(path)}); set data.tokenizer_path='' to train the "
        "tokenizer again from the corpus, or point it at a good copy."
      )
    return Tokenizer(path, field="data.tokenizer_path")

  vocab_size = int(getattr(cfg, "vocab_size", 8192))
  model_type = getattr(cfg, "tokenizer_type", "bpe")
  sample_chars = int(getattr(cfg, "tokenizer_sample_chars", 20_000_000))
  key = _cache_key(corpus, vocab_size, model_type, sample_chars)
  cache_root = fetch.resolve_cache_dir(cfg)
  model_path = os.path.join(
    cache_root, "tokenizers", f"spm-{model_type}-{vocab_size}-{key[:16]}.model"
  )
  tok = cache_entry.load_verified(
    model_path,
    getattr(cfg, "verify_cache", "sample"),
    _load_cached,
    cache_root=cache_root,
    what="tokenizer",
  )
  if tok is not None:
    return tok
  sample = _training_sample(corpus.train_docs, sample_chars)
  if not sample:
    raise ConfigError(
      f"data.tokenizer_sample_chars={sample_chars}: no training document fits in the "
      "tokenizer sample; raise it."
    )
  proto = _train(sample, vocab_size=vocab_size, model_type=model_type)
  cache_entry.write_entry(
    model_path, proto, kind="tokenizer", vocab_size=vocab_size, model_type=model_type, key=key
  )
  return Tokenizer(model_path, field="data.tokenizer_path (cached model)")
