"""`python -m cbert_jax.export`: the command line of `cbert_jax.export.export` (see its docstring)."""

from __future__ import annotations

import argparse
import sys

from cbert_jax import export as export_lib
from cbert_jax.errors import CheckpointError, ConfigError


def parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(
    prog="python -m cbert_jax.export",
    description="Export a trained encoder to Hugging Face transformers / sentence-transformers "
    "format (Llama layout, bidirectional; tokenizer and model card included).",
  )
  p.add_argument("--workdir", required=True, help="a training run's directory")
  p.add_argument(
    "--out",
    required=True,
    help="the export directory (new, empty or an earlier export's; not a symlink)",
  )
  p.add_argument("--step", type=int, default=None, help="checkpoint step (default: the latest)")
  p.add_argument(
    "--format",
    default="hf",
    help="hf (transformers, default) or sentence-transformers (hf + its modules)",
  )
  p.add_argument("--dtype", default="float32", help="float32 (default), bfloat16 or float16")
  p.add_argument(
    "--normalize",
    action="store_true",
    help="sentence-transformers: add a Normalize module (unit-length embeddings)",
  )
  p.add_argument(
    "--pooler",
    default="mean",
    help="sentence-transformers pooling: mean (the probes'); the suite's contrastive "
    "pooler cannot be packaged with stock modules",
  )
  p.add_argument(
    "--max_seq_length",
    type=int,
    default=0,
    help="tokens per text for the tokenizer and sentence-transformers "
    "(default: the run's data.seq_len)",
  )
  p.add_argument(
    "--st_padding",
    default="max_length",
    help="sentence-transformers' padding: max_length (default: every batch padded to "
    "max_seq_length, so a batch of only empty texts embeds to zeros) or longest (faster on short "
    "texts; a batch whose texts are all empty then raises in transformers)",
  )
  p.add_argument(
    "--mlm_head", action="store_true", help="BERT: also write the MLM head as mlm_head.safetensors"
  )
  p.add_argument(
    "--pretraining",
    action="store_true",
    help="also write pretraining.safetensors: the rest of the training model (CrossBERT's "
    "predictor, BERT's MLM head, ELECTRA's generator), so --config.init_from of this export "
    "continues pretraining where it stopped",
  )
  p.add_argument(
    "--overwrite",
    action="store_true",
    help="replace an earlier export in --out (recognised by its cbert_export.json; other files "
    "are kept); a non-empty --out without one is refused even so, and a symlinked --out always",
  )
  return p


def main(argv: list[str] | None = None) -> int:
  ns = parser().parse_args(argv)
  try:
    result = export_lib.export(
      ns.workdir,
      ns.out,
      step=ns.step,
      fmt=ns.format,
      dtype=ns.dtype,
      normalize=ns.normalize,
      pooler=ns.pooler,
      max_seq_length=ns.max_seq_length,
      mlm_head=ns.mlm_head,
      overwrite=ns.overwrite,
      st_padding=ns.st_padding,
      pretraining=ns.pretraining,
    )
  except (ConfigError, CheckpointError) as e:
    kind = "checkpoint error" if isinstance(e, CheckpointError) else "config error"
    print(f"{kind}: {e}", file=sys.stderr)
    return 2 if isinstance(e, ConfigError) else 5
  print(
    f"exported {result.model_name} step {result.step} ({result.format}, {result.dim} dims) "
    f"to {result.out}: {', '.join(result.files)}",
    flush=True,
  )
  return 0


if __name__ == "__main__":
  sys.exit(main())
