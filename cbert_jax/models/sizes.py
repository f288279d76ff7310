"""The model ladder: (d_model, num_layers, num_heads) by name. Parameter counts are computed by
`flops.param_counts`, never typed in.

Names are d<width>L<depth>. The nine rungs from d384L6 up are SPEC §5's default ladder (the paper
trains 8 BERT and 9 CrossBERT sizes up to ~2B parameters); the rungs below are for CPUs and tests.
Every rung serves every family: the CrossBERT predictor depth defaults to max(1, L // 4), the
ELECTRA generator to 1/4 of the width at full depth (model.generator_*).

  python -m cbert_jax.models.sizes [--vocab 32768] [--seq_len 512]

prints the ladder with parameter counts and training FLOPs per token computed for each family.
"""

from cbert_jax.errors import ConfigError

LADDER: dict[str, tuple[int, int, int]] = {
  # CPU rungs (laptop runs, tests, the CPU mini-sweep).
  "d32L2": (32, 2, 2),
  "d64L2": (64, 2, 2),
  "d96L3": (96, 3, 3),
  "d128L2": (128, 2, 2),
  "d128L3": (128, 3, 4),
  "d128L4": (128, 4, 4),
  "d160L3": (160, 3, 5),  # the CPU sweep's pre-registered held-out size (results/heldout_cpu)
  "d192L4": (192, 4, 3),
  "d256L4": (256, 4, 4),
  "d256L6": (256, 6, 4),
  # SPEC §5 default ladder [default; the paper's exact shapes are not available to us].
  "d384L6": (384, 6, 6),
  "d512L8": (512, 8, 8),
  "d768L12": (768, 12, 12),
  "d1024L16": (1024, 16, 16),
  "d1280L20": (1280, 20, 20),
  "d1536L24": (1536, 24, 24),
  "d2048L24": (2048, 24, 16),
  "d2048L32": (2048, 32, 16),
  "d2304L32": (2304, 32, 18),
}


def lookup(name: str) -> tuple[int, int, int]:
  """(d_model, num_layers, num_heads) of a ladder rung; ConfigError naming `model.size` if unknown."""
  if name not in LADDER:
    raise ConfigError(f"model.size: unknown size {name!r}; known sizes: {', '.join(LADDER)}")
  return LADDER[name]


def default_predictor_layers(num_layers: int) -> int:
  """SPEC §2: about a quarter of the encoder's depth, at least 1."""
  return max(1, num_layers // 4)


def table(vocab_size: int = 32768, seq_len: int = 512) -> list[dict]:
  """Every rung with its computed sizes: non-embedding N and training FLOPs per data token for
  BERT, CrossBERT (+CMS) and ELECTRA at the families' default settings."""
  from cbert_jax.models import flops  # pylint: disable=import-outside-toplevel  (imports the models)
  from cbert_jax.models.model_config import MaskConfig, ModelConfig  # pylint: disable=import-outside-toplevel

  ratios = {"bert": 0.2, "crossbert": 0.5, "electra": 0.15}
  rows = []
  for name, (d, layers, heads) in LADDER.items():
    cfg = ModelConfig(
      vocab_size=vocab_size,
      d_model=d,
      num_layers=layers,
      num_heads=heads,
      predictor_layers=default_predictor_layers(layers),
    )
    row = {
      "size": name,
      "d_model": d,
      "layers": layers,
      "heads": heads,
      "predictor_layers": cfg.predictor_layers,
    }
    for family, ratio in ratios.items():
      mask = MaskConfig(
        mask_ratio=ratio, mask_id=4, special_ids=(0, 2, 3, 4), cms=family == "crossbert"
      )
      row[f"N_{family}"] = flops.param_counts(family, cfg).non_embedding
      row[f"flops_per_token_{family}"] = flops.flops_per_token(family, cfg, mask, seq_len)
    rows.append(row)
  return rows


def main(argv=None) -> None:
  import argparse  # pylint: disable=import-outside-toplevel

  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--vocab", type=int, default=32768)
  parser.add_argument("--seq_len", type=int, default=512)
  args = parser.parse_args(argv)
  fams = ("bert", "crossbert", "electra")
  print(
    f"vocab {args.vocab}, seq_len {args.seq_len}; N = non-embedding parameters; "
    "FLOPs = training FLOPs per data token (crossbert: with CMS)"
  )
  print(
    "| size | d | L | heads | pred L | "
    + " | ".join(f"N {f}" for f in fams)
    + " | "
    + " | ".join(f"FLOPs/tok {f}" for f in fams)
    + " |"
  )
  print("|" + "---|" * (5 + 2 * len(fams)))
  for r in table(args.vocab, args.seq_len):
    print(
      f"| {r['size']} | {r['d_model']} | {r['layers']} | {r['heads']} | {r['predictor_layers']} | "
      + " | ".join(f"{r['N_' + f] / 1e6:.2f}M" for f in fams)
      + " | "
      + " | ".join(f"{r['flops_per_token_' + f]:.3g}" for f in fams)
      + " |"
    )


if __name__ == "__main__":
  main()
