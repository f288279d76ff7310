r"""Export a trained encoder for use outside cbert_jax: Hugging Face `transformers` and
`sentence-transformers`, with no custom code.

  python -m cbert_jax.export --workdir runs/smoke --out exported/smoke
  python -m cbert_jax.export --workdir runs/smoke --step 300 --out exported/smoke-st \
      --format sentence-transformers [--normalize] [--dtype bfloat16]

then `transformers.AutoModel.from_pretrained(DIR)` (a bidirectional `LlamaModel`: our block is
Llama's, and `"is_causal": false` turns its causal mask off; transformers >= 5.2) and
`AutoTokenizer.from_pretrained(DIR)` (the same ids as our SentencePiece tokenizer, no BOS/EOS), or
`sentence_transformers.SentenceTransformer(DIR)` (mean pooling over real tokens, as the probes).

What is written (`--format hf`):
  model.safetensors        the encoder (ELECTRA: the discriminator's) in Llama's layout
                           (`llama.py`), float32 unless --dtype; written from numpy
  config.json              LlamaModel config, is_causal false
  tokenizer.json, tokenizer_config.json, special_tokens_map.json, tokenizer.model
                           (`hf_tokenizer.py`; tokenizer.model is the SentencePiece original)
  README.md                model card (`card.py`): family and size, what is not exported,
                           training config, data manifest, tokens, FLOPs, probe scores, usage
  cbert_export.json        what this export wrote (read by a later --overwrite)
  mlm_head.safetensors     with --mlm_head (BERT only): the MLM head, not loaded by transformers
`--format sentence-transformers` adds modules.json, sentence_bert_config.json,
config_sentence_transformers.json, 1_Pooling/ and (--normalize) 2_Normalize/ (`sbert.py`).

Not exported: CrossBERT's predictor, the MLM head (unless --mlm_head), ELECTRA's generator and
discriminator head. The suite's contrastive pooler cannot be packaged with stock
sentence-transformers modules (`sbert.py` says why); `--pooler` accepts only `mean`.

The output directory must be new or empty, or hold an earlier export: a directory counts as an
export's own when its cbert_export.json (the manifest every export writes last) is a regular file
that lists the files an export writes. `--overwrite` replaces that earlier export (the files its
manifest lists) and keeps every other file; it refuses to replace a file that an export did not
write. A non-empty directory without such a manifest is refused even with `--overwrite`, so an
export never lands in a folder it did not create (a system directory, a home directory). `--out`
is resolved (os.path.realpath) before these checks, and an `--out` that is itself a symbolic link
is refused outright (it could point anywhere). The export is assembled in a temporary directory
beside `--out` and moved into place at the end, so a failed export leaves no partial model behind.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
import time

import numpy as np

from cbert_jax.errors import ConfigError
from cbert_jax.export import card as card_lib
from cbert_jax.export import hf_tokenizer, llama, sbert

FORMATS = ("hf", "sentence-transformers")
POOLINGS = ("mean",)
MANIFEST = "cbert_export.json"
# --pretraining: the training model's parameters outside the encoder (CrossBERT's predictor and its
# head, BERT's MLM head, ELECTRA's generator and discriminator head), float32, in cbert_jax's own
# names and layout; `--config.init_from` of this export into the same family loads them too, so
# pretraining continues where it stopped (transformers and sentence-transformers ignore the file).
PRETRAINING = "pretraining.safetensors"
HF_FILES = (
  "model.safetensors",
  "config.json",
  "tokenizer.json",
  "tokenizer_config.json",
  "special_tokens_map.json",
  "tokenizer.model",
  "README.md",
)
TOKENIZER_NOTE = (
  "It gives the ids of cbert_jax's tokenizer and adds no BOS/EOS (cbert_jax's rows have none); "
  "`[MASK]` in a text is the mask id, as in SentencePiece, except that SentencePiece also emits "
  "a lone `▁` before a mask that starts the text; a literal `<pad>` or `<unk>` in a text is "
  "read as that special token. Padding id 0 (`<pad>`), right side."
)


@dataclasses.dataclass(frozen=True)
class Result:
  """What `export` wrote."""

  out: str  # absolute path of the export directory
  files: tuple[str, ...]  # relative paths written (the manifest included)
  model_name: str
  step: int
  format: str
  dim: int  # embedding width


def planned_files(
  fmt: str, *, normalize: bool = False, mlm_head: bool = False, pretraining: bool = False
) -> list[str]:
  """The relative paths an export with these options writes."""
  names = list(HF_FILES) + (["mlm_head.safetensors"] if mlm_head else [])
  names += [PRETRAINING] if pretraining else []
  if fmt == "sentence-transformers":
    names += list(sbert.files(dim=1, max_seq_length=1, normalize=normalize))
  return names + [MANIFEST]


def _listdir(path: str) -> list[str]:
  return sorted(os.listdir(path))


def _previous_export(out: str) -> list[str]:
  """The files a previous export listed in `out`'s manifest ([] when there is none)."""
  if os.path.islink(os.path.join(out, MANIFEST)):
    return []  # a manifest an export wrote is a regular file
  try:
    with open(os.path.join(out, MANIFEST)) as f:
      files = json.load(f)["files"]
  except (OSError, ValueError, KeyError, TypeError):
    return []
  # Only names an export writes: a hand-edited manifest cannot make --overwrite delete other files.
  known = set(
    planned_files("sentence-transformers", normalize=True, mlm_head=True, pretraining=True)
  )
  return [f for f in files if isinstance(f, str) and f in known]


def resolve_out(out: str) -> str:
  """`out` as an absolute path with every link in it resolved. Raises ConfigError when `out`
  itself is a symbolic link (to a directory, a file or nowhere)."""
  out = os.path.abspath(out)
  if os.path.islink(out):
    raise ConfigError(
      f"--out {out}: is a symbolic link (to {os.readlink(out)}); pass the directory itself, "
      "so that the export cannot land somewhere unexpected"
    )
  return os.path.realpath(out)


def check_out(out: str, planned: list[str], overwrite: bool) -> list[str]:
  """Checks that `out` (resolved: `resolve_out`) can take the export; returns the previous
  export's files to replace.

  Raises:
    ConfigError: `out` is a file; a non-empty directory that holds no earlier export (no
      cbert_export.json listing its files), with or without `overwrite`; one that holds one,
      without `overwrite`; or, with it, a directory holding a file of the same name as one the
      export writes that no export wrote.
  """
  if os.path.exists(out) and not os.path.isdir(out):
    raise ConfigError(f"--out {out}: exists and is not a directory")
  if not os.path.isdir(out) or not _listdir(out):
    return []
  entries = _listdir(out)
  shown = ", ".join(entries[:4]) + (f", ... ({len(entries)} entries)" if len(entries) > 4 else "")
  previous = _previous_export(out)
  if not previous:
    raise ConfigError(
      f"--out {out}: the directory is not empty ({shown}) and holds no earlier export (no readable "
      f"{MANIFEST}); an export goes only into a new or empty directory or over an earlier "
      "export, even with --overwrite: choose a new directory"
    )
  if not overwrite:
    raise ConfigError(
      f"--out {out}: the directory is not empty ({shown}); pass --overwrite to "
      "replace a previous export there (other files are kept), or choose a new "
      "directory"
    )
  clash = [f for f in planned if f not in previous and os.path.lexists(os.path.join(out, f))]
  if clash:
    raise ConfigError(
      f"--out {out}: {', '.join(clash[:4])} "
      f"{'was' if len(clash) == 1 else 'were'} not written by cbert_jax.export "
      "(no cbert_export.json lists it); not replacing user files: move them away "
      "or choose another directory"
    )
  return previous


def check_options(
  *,
  fmt: str,
  dtype: str,
  pooler: str,
  normalize: bool,
  max_seq_length: int,
  st_padding: str = "max_length",
) -> None:
  """ConfigError naming the first bad option (checked before anything is read)."""
  if fmt not in FORMATS:
    raise ConfigError(f"--format {fmt}: expected one of {', '.join(FORMATS)}")
  if dtype not in llama.DTYPES:
    raise ConfigError(f"--dtype {dtype}: expected one of {', '.join(llama.DTYPES)}")
  if pooler not in POOLINGS:
    raise ConfigError(f"--pooler {pooler}: {sbert.POOLER_REFUSAL}")
  if normalize and fmt != "sentence-transformers":
    raise ConfigError(
      "--normalize adds a sentence-transformers Normalize module; it needs "
      "--format sentence-transformers"
    )
  if max_seq_length < 0:
    raise ConfigError(
      f"--max_seq_length {max_seq_length}: expected a positive length (0 = the run's data.seq_len)"
    )
  if st_padding not in sbert.PADDINGS:
    raise ConfigError(f"--st_padding {st_padding}: expected one of {', '.join(sbert.PADDINGS)}")


def _sha256(path: str) -> str:
  h = hashlib.sha256()
  with open(path, "rb") as f:
    for chunk in iter(lambda: f.read(1 << 20), b""):
      h.update(chunk)
  return h.hexdigest()


def _write_text(root: str, rel: str, text: str) -> None:
  path = os.path.join(root, rel)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w", encoding="utf-8") as f:
    f.write(text)


def _default_permissions(root: str) -> None:
  """The modes of ordinary new files and directories (mkdtemp makes its directory private, and
  safetensors writes 0600 files)."""
  umask = os.umask(0)
  os.umask(umask)
  os.chmod(root, 0o777 & ~umask)
  for directory, dirs, files in os.walk(root):
    for name in dirs:
      os.chmod(os.path.join(directory, name), 0o777 & ~umask)
    for name in files:
      os.chmod(os.path.join(directory, name), 0o666 & ~umask)


def _install(stage: str, out: str, files: list[str], previous: list[str]) -> None:
  """Moves the staged export into `out`: a rename when `out` does not exist; otherwise the
  previous export's files are removed and the new ones moved in, file by file."""
  if not os.path.exists(out):
    os.rename(stage, out)
    return
  for rel in previous:
    path = os.path.join(out, rel)
    if rel not in files and os.path.isfile(path):
      os.remove(path)
      parent = os.path.dirname(path)
      if parent != os.path.abspath(out) and os.path.isdir(parent) and not os.listdir(parent):
        os.rmdir(parent)
  for rel in files:
    dst = os.path.join(out, rel)
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    os.replace(os.path.join(stage, rel), dst)
  shutil.rmtree(stage)


def export(
  workdir: str,
  out: str,
  *,
  step: int | None = None,
  fmt: str = "hf",
  dtype: str = "float32",
  normalize: bool = False,
  pooler: str = "mean",
  max_seq_length: int = 0,
  mlm_head: bool = False,
  overwrite: bool = False,
  st_padding: str = "max_length",
  pretraining: bool = False,
  devices=None,
) -> Result:
  """Exports the encoder of `workdir` at checkpoint `step` (default: the latest) to `out`.

  Args:
    workdir: a training run's directory (config.json, checkpoints/, tokenizer.model).
    out: the export directory: new, empty or an earlier export's (see `overwrite`); not a
      symbolic link.
    fmt: "hf" or "sentence-transformers" (hf plus the sentence-transformers modules).
    dtype: float32 (default), bfloat16 or float16 for model.safetensors.
    normalize: sentence-transformers: add a Normalize module (unit-length embeddings).
    pooler: "mean" (the only pooling a stock sentence-transformers model can run).
    max_seq_length: tokens per text for the tokenizer and sentence-transformers (0 = the run's
      data.seq_len).
    mlm_head: BERT only: also write the MLM head as mlm_head.safetensors.
    pretraining: also write PRETRAINING (the rest of the training model, for init_from).
    st_padding: sentence-transformers' padding, one of `sbert.PADDINGS` (max_length: every batch
      to max_seq_length, so a batch of only empty texts embeds to zeros; longest: faster on short
      texts, but such a batch raises in transformers).
    overwrite: replace an earlier export in `out` (its cbert_export.json), keeping other files;
      a non-empty `out` without one is refused all the same.
    devices: where to restore the checkpoint (default: the first JAX device).

  Raises:
    ConfigError: a bad option, workdir, step or output directory; one line, nothing written.
    CheckpointError: the checkpoint cannot be read.
  """
  check_options(
    fmt=fmt,
    dtype=dtype,
    pooler=pooler,
    normalize=normalize,
    max_seq_length=max_seq_length,
    st_padding=st_padding,
  )
  out = resolve_out(out)
  planned = planned_files(fmt, normalize=normalize, mlm_head=mlm_head, pretraining=pretraining)
  previous = check_out(out, planned, overwrite)
  _require_packages()
  from cbert_jax.run import trained  # pylint: disable=import-outside-toplevel (JAX only past the checks)

  record = trained.read_config(os.path.abspath(workdir))
  model_name = record["config"]["model_name"]
  if mlm_head and model_name != "bert":
    raise ConfigError(
      f"--mlm_head: a {model_name} run has no MLM head over the encoder's output "
      "(only BERT has one; CrossBERT's reads the predictor, ELECTRA's "
      "discriminator head is a binary classifier)"
    )
  if devices is None:
    import jax  # pylint: disable=import-outside-toplevel

    devices = jax.devices()[:1]
  run = trained.load(workdir, step, devices=devices)
  mc, cfg, tok = run.model_cfg, run.config, run.tokenizer
  seq_len = int(cfg.data.seq_len)
  max_len = int(max_seq_length) or seq_len
  tok_files = hf_tokenizer.files(tok, max_len)

  flat = llama.flat_params(run.params)
  tensors = llama.llama_tensors(flat, mc.num_layers, dtype)
  head = llama.mlm_head_tensors(flat, model_name, dtype) if mlm_head else None
  # The weights files carry only what describes the weights: where and when they were exported is
  # in cbert_export.json, so that the same weights export to the same bytes (an export read back
  # with init_from and exported again gives a byte-identical model.safetensors).
  meta = {"cbert_jax_model": model_name}
  config = llama.llama_config(
    mc,
    max_positions=max(seq_len, max_len, int(cfg.model.get("max_positions", 0) or 0)),
    dtype=dtype,
    pad_id=tok.pad_id,
    bos_id=tok.bos_id,
    eos_id=tok.eos_id,
  )
  readme = card_lib.render(
    run=run,
    fmt=fmt,
    dtype=dtype,
    normalize=normalize,
    max_seq_length=max_len,
    mlm_head=mlm_head,
    st_padding=st_padding,
    pretraining=pretraining,
    exported_params=int(sum(v.size for v in tensors.values())),
    tokenizer_note=TOKENIZER_NOTE,
  )

  parent = os.path.dirname(out)
  os.makedirs(parent, exist_ok=True)
  stage = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.export-", dir=parent)
  try:
    llama.write_safetensors(os.path.join(stage, "model.safetensors"), tensors, meta)
    if head is not None:
      llama.write_safetensors(os.path.join(stage, "mlm_head.safetensors"), head, meta)
    if pretraining:
      rest = {n: np.asarray(v, np.float32) for n, v in flat.items() if not n.startswith("encoder/")}
      llama.write_safetensors(os.path.join(stage, PRETRAINING), rest, meta)
    _write_text(stage, "config.json", json.dumps(config, indent=2) + "\n")
    for rel, text in tok_files.items():
      _write_text(stage, rel, text)
    shutil.copyfile(tok.model_path, os.path.join(stage, "tokenizer.model"))
    if fmt == "sentence-transformers":
      for rel, text in sbert.files(
        dim=mc.d_model, max_seq_length=max_len, normalize=normalize, padding=st_padding
      ).items():
        _write_text(stage, rel, text)
    _write_text(stage, "README.md", readme)
    written = [rel for rel in planned if rel != MANIFEST]
    missing = [rel for rel in written if not os.path.isfile(os.path.join(stage, rel))]
    assert not missing, missing  # planned_files and the writers above must agree
    manifest = {
      "files": planned,
      "workdir": os.path.basename(os.path.normpath(run.workdir)),  # its name: no local path
      "step": run.step,
      "model_name": model_name,
      "size": cfg.model.get("size", ""),
      "format": fmt,
      "dtype": dtype,
      "normalize": normalize,
      "max_seq_length": max_len,
      "st_padding": st_padding if fmt == "sentence-transformers" else None,
      "mlm_head": mlm_head,
      "pretraining": pretraining,
      "exported_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
      "sha256": {
        rel: _sha256(os.path.join(stage, rel)) for rel in ("model.safetensors", "tokenizer.model")
      },
      **card_lib.summary(run),
    }
    _write_text(stage, MANIFEST, json.dumps(manifest, indent=2) + "\n")
    _default_permissions(stage)
    _install(stage, out, planned, previous)
  except BaseException:
    shutil.rmtree(stage, ignore_errors=True)
    raise
  return Result(
    out=out,
    files=tuple(planned),
    model_name=model_name,
    step=run.step,
    format=fmt,
    dim=int(mc.d_model),
  )


def _require_packages() -> None:
  """ConfigError when a package the export writes with is missing (torch is not needed)."""
  try:
    import safetensors.numpy  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
    import tokenizers  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
  except ImportError as e:
    raise ConfigError(
      f"the export needs the `tokenizers` and `safetensors` packages ({e}); "
      "install the export extra: pip install 'cbert_jax[export]'"
    ) from e
