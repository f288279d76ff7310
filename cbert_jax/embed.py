r"""Embed a text file, a JSONL file or a directory of them with a trained encoder, in JAX.

  python -m cbert_jax.embed --workdir runs/smoke --input texts.txt --out emb.npy
  python -m cbert_jax.embed --workdir runs/smoke --input docs/ --out emb.parquet --text_field body

One embedding per input record, in input order: a `.txt` line (empty lines included, so row i is
line i) or a `.jsonl` object's `--text_field` (`.gz` variants too); a directory is read file by
file in sorted name order. The embedding is the mean over real tokens of the final normalised
layer (what the probes and the exported `sentence-transformers` model use), or of `--layer l`
(0 = embeddings, l = after block l), or the contrastive pooler the MTEB suite saved
(`--pooler workdir/eval/pooler-<tag>.npz`). Texts longer than `--seq_len` tokens (default: the
run's) are truncated, and counted.

Batches are sharded over every device (data parallel, parameters replicated); one executable
serves the whole job. Progress (texts/s, tokens/s, ETA) is logged every `--log_every_s` seconds.
Output: `.npy` (float32 [N, p]) or `.parquet` (columns source, line, id when `--id_field` is set,
embedding; needs pyarrow), written under a temporary name and renamed when complete, with
`<out>.json` beside it (workdir, step, layer, pooling, counts, tokens/s). An existing output is
kept unless `--overwrite`.

A directory's entries that are not such files (other suffixes, subdirectories: not descended into)
are skipped and named in one line (`--input docs/: skipped 3 entries that are not a ... file:
README.md, notes.csv, old/`, the first 10 then a count). The input is read as UTF-8: a file that
is not is one line naming it, the byte offset (in the uncompressed text for `.gz`) and the line,
found in the counting pass before the model is loaded, and nothing is written.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import os
import sys
import time
import zlib
from collections.abc import Iterator

import numpy as np

from cbert_jax.errors import CheckpointError, ConfigError
from cbert_jax.run.progress import format_duration

SUFFIXES = (".txt", ".jsonl", ".txt.gz", ".jsonl.gz")
OUT_SUFFIXES = (".npy", ".parquet")


@dataclasses.dataclass(frozen=True)
class Record:
  """One input text and where it came from."""

  source: str  # file path
  line: int  # 1-based line number in that file
  id: str  # the JSONL `--id_field` value ("" when unset)
  text: str


def input_files(path: str, log=None) -> list[str]:
  """The input's files: `path` itself, or the readable files of directory `path`, sorted. `log`
  (e.g. print) gets one line naming the directory's entries that are skipped, if any."""
  if os.path.isdir(path):
    names = sorted(os.listdir(path))
    kept = {f for f in names if f.endswith(SUFFIXES) and os.path.isfile(os.path.join(path, f))}
    files = [os.path.join(path, f) for f in names if f in kept]
    skipped = [
      f + ("/" if os.path.isdir(os.path.join(path, f)) else "") for f in names if f not in kept
    ]
    if not files:
      raise ConfigError(f"--input {path}: the directory holds no {'/'.join(SUFFIXES)} file")
    if skipped and log is not None:
      n, shown = len(skipped), ", ".join(skipped[:10])
      more = f" and {n - 10} more" if n > 10 else ""
      log(
        f"--input {path}: skipped {n} {'entry' if n == 1 else 'entries'} that "
        f"{'is' if n == 1 else 'are'} not a {'/'.join(SUFFIXES)} file: {shown}{more}"
      )
    return files
  if not os.path.isfile(path):
    raise ConfigError(f"--input {path}: no such file or directory")
  if not path.endswith(SUFFIXES):
    raise ConfigError(f"--input {path}: expected a {'/'.join(SUFFIXES)} file or a directory")
  return [path]


def _open(path: str):
  return (
    gzip.open(path, "rt", encoding="utf-8")
    if path.endswith(".gz")
    else open(path, encoding="utf-8")
  )


def _unreadable(path: str, e: Exception) -> ConfigError:
  """The one-line error for an input file that cannot be read: not UTF-8 (the first bad byte's
  offset and line, found by a second, binary pass) or not a readable (gzip) file."""
  if not isinstance(e, UnicodeDecodeError):
    return ConfigError(f"--input {path}: cannot read it ({type(e).__name__}: {e})")
  where = ""
  offset = 0
  try:
    with gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb") as f:
      for i, line in enumerate(f, start=1):  # a UTF-8 sequence never holds a newline byte
        try:
          line.decode("utf-8")
        except UnicodeDecodeError as bad:
          where = f"byte 0x{line[bad.start]:02x} at offset {offset + bad.start} (line {i}) "
          e = bad
          break
        offset += len(line)
  except (OSError, EOFError, zlib.error):
    pass
  return ConfigError(
    f"--input {path}: not UTF-8 text: {where}({e.reason}); convert the file to UTF-8 "
    "(e.g. iconv -f latin1 -t utf-8)"
  )


def read_records(
  files: list[str], text_field: str = "text", id_field: str = ""
) -> Iterator[Record]:
  """Every record of `files`, in order. ConfigError naming file:line on a malformed JSONL line."""
  for path in files:
    is_jsonl = path.endswith((".jsonl", ".jsonl.gz"))
    with _open(path) as f:
      for i, line in _lines(f, path):
        line = line.rstrip("\n")
        if not is_jsonl:
          yield Record(path, i, "", line.rstrip("\r"))
          continue
        try:
          obj = json.loads(line)
          text = obj[text_field]
        except (ValueError, KeyError, TypeError) as e:
          what = (
            f"no field {text_field!r} (--text_field)"
            if isinstance(e, (KeyError, TypeError))
            else f"not JSON ({e})"
          )
          raise ConfigError(f"--input {path}:{i}: {what}") from e
        if not isinstance(text, str):
          raise ConfigError(
            f"--input {path}:{i}: field {text_field!r} is {type(text).__name__}, expected a string"
          )
        yield Record(path, i, str(obj.get(id_field, "")) if id_field else "", text)


def _lines(f, path: str) -> Iterator[tuple[int, str]]:
  """(1-based line number, line) of open text file `f`; ConfigError (`_unreadable`) when `path`
  is not UTF-8 or not a readable gzip file."""
  try:
    yield from enumerate(f, start=1)
  except (UnicodeDecodeError, OSError, EOFError, zlib.error) as e:
    raise _unreadable(path, e) from e


def count_records(files: list[str]) -> int:
  """Number of records (lines) in `files`: one cheap pass, so the output can be preallocated.
  ConfigError naming the file (and the offset) when one is not UTF-8 text or cannot be read."""
  n = 0
  for path in files:
    try:
      with _open(path) as f:
        n += sum(1 for _ in _lines(f, path))
    except OSError as e:
      raise _unreadable(path, e) from e
  return n


def _chunks(records: Iterator[Record], size: int) -> Iterator[list[Record]]:
  chunk = []
  for r in records:
    chunk.append(r)
    if len(chunk) == size:
      yield chunk
      chunk = []
  if chunk:
    yield chunk


def buckets(seq_len: int, smallest: int = 16) -> tuple[int, ...]:
  """Row lengths a batch is padded to: powers of two from `smallest`, then `seq_len` itself."""
  out, t = [], smallest
  while t < seq_len:
    out.append(t)
    t *= 2
  return tuple(out) + (seq_len,)


class Embedder:
  """texts -> [N, p] float32 with a trained run's encoder (mean pooling or the saved pooler).

  Texts are sorted by length and each batch is padded only to the smallest of `buckets(seq_len)`
  that holds its longest text (one executable per bucket, at most ~6), so short texts do not pay
  for `seq_len` positions; the outputs are put back in input order. Masked attention and pooling
  over real tokens make an embedding independent of how much padding its row has.
  """

  def __init__(
    self,
    run,
    *,
    seq_len: int,
    batch_size: int,
    layer: int = -1,
    pooler_path: str = "",
    normalize: bool = False,
  ):
    """run: a `trained.Trained`; the other arguments as the CLI flags of the same names."""
    from cbert_jax.evaluators import features, pooler  # pylint: disable=import-outside-toplevel
    from cbert_jax.step import sharding  # pylint: disable=import-outside-toplevel

    self.run, self.seq_len, self.normalize = run, int(seq_len), normalize
    self.batch_size = int(batch_size)
    num_layers = run.model_cfg.num_layers
    if not -1 <= layer <= num_layers:
      raise ConfigError(
        f"--layer {layer}: expected -1 (final) or 0..{num_layers} for this "
        f"{num_layers}-layer encoder"
      )
    dp = sharding.data_parallel_size(run.mesh, run.rules)
    if self.batch_size < 1 or self.batch_size % dp:
      raise ConfigError(
        f"--batch_size {batch_size}: expected a positive multiple of the "
        f"{dp} devices the batch is sharded over"
      )
    self._features, self._pooler = features, pooler
    self.pooler_params = None
    self.pooling = "mean"
    if pooler_path:
      self.pooler_params, pooled_layer = pooler.load(pooler_path)
      if layer != -1 and layer != pooled_layer:
        raise ConfigError(
          f"--layer {layer}: the pooler {pooler_path} was trained on layer "
          f"{pooled_layer}; leave --layer unset"
        )
      layer = pooled_layer
      self.pooling = f"pooler {os.path.basename(pooler_path)}"
    self.layer = layer
    self.dim = (
      int(self.pooler_params["proj"].shape[-1])
      if self.pooler_params is not None
      else run.model_cfg.d_model
    )
    self._featurizers: dict[int, object] = {}  # bucket length -> Featurizer

  def _pool(self, rows: dict) -> np.ndarray:
    t = rows["tokens"].shape[1]
    run = self.run
    if self.pooler_params is not None:
      return self._pooler.embed(
        run.graphdef,
        run.params,
        self.pooler_params,
        rows,
        batch_size=self.batch_size,
        layer=self.layer,
      )
    if t not in self._featurizers:
      self._featurizers[t] = self._features.Featurizer(
        run.graphdef,
        run.params,
        batch_size=self.batch_size,
        seq_len=t,
        mesh=run.mesh,
        rules=run.rules,
        layer=self.layer,
      )
    return self._featurizers[t](rows)

  def embed_ids(self, ids: list[list[int]]) -> tuple[np.ndarray, int, int]:
    """(embeddings [N, p] in input order, tokens embedded, texts truncated at seq_len)."""
    n = len(ids)
    lengths = np.array([min(len(x), self.seq_len) for x in ids], np.int64)  # [N]
    order = np.argsort(lengths, kind="stable")  # short first
    out = np.zeros((n, self.dim), np.float32)
    sizes = buckets(self.seq_len)
    for start in range(0, n, self.batch_size):
      idx = order[start : start + self.batch_size]
      longest = int(lengths[idx].max()) if len(idx) else 1
      t = next(b for b in sizes if b >= longest)
      rows = self._features.rows_from_ids([ids[i] for i in idx], t)  # [<=B, t]
      out[idx] = np.asarray(self._pool(rows), np.float32)
    if self.normalize:
      out = out / np.maximum(np.linalg.norm(out, axis=-1, keepdims=True), 1e-12)
    truncated = int(sum(len(x) > self.seq_len for x in ids))
    return out, int(lengths.sum()), truncated

  def __call__(self, texts: list[str]) -> np.ndarray:
    """Embeddings [N, p] of `texts`, in order."""
    return self.embed_ids(self.run.tokenizer.encode_batch(list(texts)) if texts else [])[0]


class _Writer:
  """Rows into `<out>` via a temporary file; `commit` renames it, `abort` removes it."""

  def __init__(self, out: str, n: int, dim: int, id_field: str):
    self.out, self.n, self.dim = out, n, dim
    self.tmp = os.path.join(
      os.path.dirname(out) or ".", f".tmp-{os.getpid()}-{os.path.basename(out)}"
    )
    self.parquet = out.endswith(".parquet")
    self.id_field = id_field
    if self.parquet:
      self.columns = {"source": [], "line": [], "id": [], "embedding": []}
    else:
      self.array = np.lib.format.open_memmap(self.tmp, mode="w+", dtype=np.float32, shape=(n, dim))
    self.filled = 0

  def write(self, records: list[Record], emb: np.ndarray) -> None:
    k = len(records)
    if self.filled + k > self.n:
      raise ConfigError("--input changed while it was being embedded (more records than counted)")
    if self.parquet:
      self.columns["source"] += [r.source for r in records]
      self.columns["line"] += [r.line for r in records]
      self.columns["id"] += [r.id for r in records]
      self.columns["embedding"].append(emb)
    else:
      self.array[self.filled : self.filled + k] = emb
    self.filled += k

  def commit(self) -> None:
    if self.filled != self.n:
      raise ConfigError(
        f"--input changed while it was being embedded ({self.filled} records "
        f"read, {self.n} counted)"
      )
    if self.parquet:
      import pyarrow as pa  # pylint: disable=import-outside-toplevel
      import pyarrow.parquet as pq  # pylint: disable=import-outside-toplevel

      emb = (
        np.concatenate(self.columns["embedding"])
        if self.columns["embedding"]
        else np.zeros((0, self.dim), np.float32)
      )
      cols = {
        "source": pa.array(self.columns["source"], pa.string()),
        "line": pa.array(self.columns["line"], pa.int64()),
      }
      if self.id_field:
        cols["id"] = pa.array(self.columns["id"], pa.string())
      cols["embedding"] = pa.FixedSizeListArray.from_arrays(
        pa.array(emb.reshape(-1), pa.float32()), self.dim
      )
      pq.write_table(pa.table(cols), self.tmp)
    else:
      self.array.flush()
      del self.array
    os.replace(self.tmp, self.out)

  def abort(self) -> None:
    if hasattr(self, "array"):
      del self.array
    if os.path.exists(self.tmp):
      os.remove(self.tmp)


def check_out(out: str, overwrite: bool) -> None:
  """ConfigError for an output path that cannot be written (before any model work)."""
  if not out.endswith(OUT_SUFFIXES):
    raise ConfigError(f"--out {out}: expected a {' or '.join(OUT_SUFFIXES)} file name")
  if os.path.exists(out) and not overwrite:
    raise ConfigError(f"--out {out} exists; pass --overwrite to replace it")
  parent = os.path.dirname(os.path.abspath(out))
  if not os.path.isdir(parent):
    raise ConfigError(f"--out {out}: directory {parent} does not exist")
  if out.endswith(".parquet"):
    try:
      import pyarrow.parquet  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
    except ImportError as e:
      raise ConfigError(
        f"--out {out}: parquet output needs pyarrow (pip install pyarrow); or write .npy"
      ) from e


def embed_files(
  embedder: Embedder,
  files: list[str],
  out: str,
  *,
  text_field: str = "text",
  id_field: str = "",
  chunk_texts: int = 8192,
  log_every_s: float = 30.0,
  log=print,
  count: int | None = None,
) -> dict:
  """Embeds every record of `files` into `out`; returns the summary written to `<out>.json`.
  `count`: `count_records(files)` when the caller has it already."""
  n = count_records(files) if count is None else count
  writer = _Writer(out, n, embedder.dim, id_field)
  tokens = truncated = 0
  start = last_log = time.perf_counter()
  try:
    for chunk in _chunks(read_records(files, text_field, id_field), chunk_texts):
      emb, kept, cut = embedder.embed_ids(
        embedder.run.tokenizer.encode_batch([r.text for r in chunk])
      )
      tokens, truncated = tokens + kept, truncated + cut
      writer.write(chunk, emb)
      now = time.perf_counter()
      if now - last_log >= log_every_s or writer.filled == n:
        rate, elapsed = writer.filled / max(now - start, 1e-9), now - start
        log(
          f"embedded {writer.filled}/{n} texts ({100 * writer.filled / max(n, 1):.1f}%) | "
          f"{rate:.1f} texts/s | {tokens / max(elapsed, 1e-9):.0f} tokens/s | "
          f"ETA {format_duration((n - writer.filled) / max(rate, 1e-9))}"
        )
        last_log = now
    writer.commit()
  except BaseException:
    writer.abort()
    raise
  seconds = time.perf_counter() - start
  run = embedder.run
  summary = {
    "out": os.path.abspath(out),
    "workdir": run.workdir,
    "step": run.step,
    "model_name": run.model_name,
    "model_size": run.config.model.get("size", ""),
    "pooling": embedder.pooling,
    "layer": embedder.layer,
    "normalized": embedder.normalize,
    "dim": embedder.dim,
    "seq_len": embedder.seq_len,
    "texts": n,
    "tokens": tokens,
    "truncated_texts": truncated,
    "inputs": [os.path.abspath(f) for f in files],
    "text_field": text_field,
    "seconds": round(seconds, 3),
    "tokens_per_sec": round(tokens / max(seconds, 1e-9), 1),
    "devices": int(run.mesh.devices.size),
  }
  with open(out + ".json", "w") as f:
    json.dump(summary, f, indent=2)
  return summary


def parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(prog="python -m cbert_jax.embed", description=__doc__.splitlines()[0])
  p.add_argument("--workdir", required=True, help="a training run's directory")
  p.add_argument("--input", required=True, help=f"a {'/'.join(SUFFIXES)} file or a directory")
  p.add_argument("--out", required=True, help="emb.npy or emb.parquet")
  p.add_argument("--step", type=int, default=None, help="checkpoint step (default: the latest)")
  p.add_argument(
    "--layer",
    type=int,
    default=-1,
    help="-1 = final normalised layer (default); l = after block l, 0 = embeddings",
  )
  p.add_argument("--pooler", default="", help="a pooler saved by the MTEB suite (.npz)")
  p.add_argument("--seq_len", type=int, default=0, help="tokens per text (default: the run's)")
  p.add_argument(
    "--batch_size", type=int, default=256, help="texts per step, a multiple of the device count"
  )
  p.add_argument("--text_field", default="text", help="the JSONL field holding the text")
  p.add_argument("--id_field", default="", help="a JSONL field copied to the parquet `id` column")
  p.add_argument("--normalize", action="store_true", help="L2-normalise the embeddings")
  p.add_argument("--overwrite", action="store_true", help="replace an existing --out")
  p.add_argument("--log_every_s", type=float, default=30.0, help="seconds between progress lines")
  return p


def main(argv: list[str] | None = None) -> int:
  ns = parser().parse_args(argv)
  try:
    check_out(ns.out, ns.overwrite)  # the cheap checks first, before any JAX work
    files = input_files(ns.input, log=lambda s: print(s, flush=True))
    if ns.seq_len < 0:
      raise ConfigError(f"--seq_len {ns.seq_len}: expected a positive length (0 = the run's)")
    if ns.pooler and not os.path.isfile(ns.pooler):
      raise ConfigError(f"--pooler {ns.pooler}: no such file")
    count = count_records(files)  # the input is UTF-8 text (one cheap pass), before JAX work
    from cbert_jax.run import trained  # pylint: disable=import-outside-toplevel

    run = trained.load(ns.workdir, ns.step)
    embedder = Embedder(
      run,
      seq_len=ns.seq_len or int(run.config.data.seq_len),
      batch_size=ns.batch_size,
      layer=ns.layer,
      pooler_path=ns.pooler,
      normalize=ns.normalize,
    )
    print(
      f"embedding with {run.model_name} {run.config.model.get('size', '')} step {run.step} "
      f"({embedder.pooling} pooling, layer {embedder.layer}, {embedder.dim} dims, "
      f"T={embedder.seq_len}) on {run.mesh.devices.size} device(s)",
      flush=True,
    )
    summary = embed_files(
      embedder,
      files,
      ns.out,
      text_field=ns.text_field,
      id_field=ns.id_field,
      log_every_s=ns.log_every_s,
      log=lambda s: print(s, flush=True),
      count=count,
    )
  except (ConfigError, CheckpointError) as e:
    kind = "checkpoint error" if isinstance(e, CheckpointError) else "config error"
    print(f"{kind}: {e}", file=sys.stderr)
    return 2 if isinstance(e, ConfigError) else 5
  print(
    f"wrote {summary['texts']} x {summary['dim']} to {ns.out} in "
    f"{format_duration(summary['seconds'])} ({summary['tokens_per_sec']:.0f} tokens/s; "
    f"{summary['truncated_texts']} texts truncated at {summary['seq_len']} tokens)",
    flush=True,
  )
  return 0


if __name__ == "__main__":
  sys.exit(main())
