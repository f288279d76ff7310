"""The model ladder: (d_model, num_layers, num_heads) by name. Parameter counts are computed by
`flops.param_counts`, never typed in.

Names are d<width>L<depth>. The nine rungs from d384L6 up are SPEC §5's default ladder (the paper
trains 8 BERT and 9 CrossBERT sizes up to ~2B parameters); the rungs below are for CPUs and tests.
The CrossBERT predictor depth defaults to max(1, L // 4).
"""
from cbert_jax.errors import ConfigError

LADDER: dict[str, tuple[int, int, int]] = {
    # CPU rungs (laptop runs, tests, the CPU mini-sweep).
    "d32L2": (32, 2, 2),
    "d64L2": (64, 2, 2),
    "d128L2": (128, 2, 2),
    "d128L4": (128, 4, 4),
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
