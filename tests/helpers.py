"""Tiny models, packed batches and fake archives shared by the tests (no network)."""
import dataclasses
import io
import tarfile

import numpy as np
from flax import nnx

from cbert_jax.models import FAMILIES
from cbert_jax.models.model_config import MaskConfig, ModelConfig

SPECIAL = (0, 2, 3, 4)   # pad, bos, eos, [MASK] as the SentencePiece tokenizer numbers them
MASK_ID = 4


def model_cfg(**kw) -> ModelConfig:
  base = dict(vocab_size=96, d_model=32, num_layers=2, num_heads=4, predictor_layers=1)
  return ModelConfig(**(base | kw))


def mask_cfg(model_name: str, **kw) -> MaskConfig:
  base = dict(mask_ratio=0.5 if model_name == "crossbert" else 0.2, mask_id=MASK_ID,
              special_ids=SPECIAL)
  return MaskConfig(**(base | kw))


def build(model_name: str, seed: int = 0, cfg: ModelConfig | None = None, **mask_kw):
  """An eagerly built model outside any mesh."""
  with nnx.use_eager_sharding(False):
    return FAMILIES[model_name](cfg or model_cfg(), mask_cfg(model_name, **mask_kw), nnx.Rngs(seed))


def with_mask_cfg(model, **kw):
  """The same parameters with another masking config (e.g. the other CMS form)."""
  model.mask_cfg = dataclasses.replace(model.mask_cfg, **kw)
  return model


def packed_batch(b: int = 3, t: int = 16, vocab: int = 96, seed: int = 0) -> dict:
  """Rows with several packed documents and a padded tail, positions restarting per document."""
  rs = np.random.RandomState(seed)
  tokens = rs.randint(len(SPECIAL) + 1, vocab, (b, t)).astype(np.int32)
  seg = np.ones((b, t), np.int32)
  seg[0, t // 2:] = 2                      # row 0: two documents
  if b > 1:
    seg[1, 3 * t // 4:] = 0                # row 1: one document, padded tail
    tokens[1, 3 * t // 4:] = 0
  if b > 2:
    seg[2, t // 4:] = 2                    # row 2: three documents
    seg[2, 3 * t // 4:] = 3
  pos = np.zeros((b, t), np.int32)
  for i in range(b):
    for j in range(1, t):
      pos[i, j] = 0 if seg[i, j] != seg[i, j - 1] else pos[i, j - 1] + 1
  pos[seg == 0] = 0
  return {"tokens": tokens, "positions": pos, "segment_ids": seg}


class WordTokenizer:
  """A stand-in tokenizer without files: one id per distinct word, in order of first sight.

  Ids start after the special ids and wrap around the tiny model's vocab, so they are always
  valid embedding rows of `model_cfg()`; the first `vocab_size - 5` words get distinct ids.
  """

  def __init__(self, vocab_size: int = 96):
    self.vocab_size = vocab_size
    self.ids: dict[str, int] = {}

  def encode_batch(self, texts):
    first = len(SPECIAL) + 1
    span = self.vocab_size - first
    return [[self.ids.setdefault(w, first + len(self.ids) % span) for w in t.split()]
            for t in texts]


def write_tgz(path, files: dict[str, bytes]) -> str:
  """A gzipped tarball at `path` holding `files` (member name -> bytes), like a registry package."""
  with tarfile.open(path, "w:gz") as tar:
    for name, data in files.items():
      info = tarfile.TarInfo(name)
      info.size = len(data)
      tar.addfile(info, io.BytesIO(data))
  return str(path)
