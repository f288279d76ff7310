"""Token budgets: total tokens = tokens_per_param x N, steps from tokens, batch and sequence length.

SPEC §5 trains every model on a fixed data-to-model ratio (20 tokens per parameter). Which
parameters count as N is a config choice (`N_DEFINITIONS`); the default is every trained block
without embeddings or vocabulary head, predictor (and ELECTRA generator) included. Steps round up,
so a run sees at least its budget; `tokens` is what it actually sees.
"""

from __future__ import annotations

import dataclasses
import math

from cbert_jax.errors import ConfigError
from cbert_jax.models.flops import ParamCounts

# N as a function of the analytic counts.
N_DEFINITIONS = {
  "non_embedding": lambda c: c.non_embedding,  # [default] blocks + predictor (+ generator)
  "total": lambda c: c.total,  # everything, embeddings and head included
  "encoder": lambda c: c.encoder,  # the encoder blocks only (the part probed)
}


@dataclasses.dataclass(frozen=True)
class Budget:
  """A member's derived training length (written to its config.json)."""

  n_definition: str
  n_params: int
  tokens_per_param: float
  target_tokens: int  # tokens_per_param x N
  batch_size: int  # rows per step
  seq_len: int  # tokens per row
  tokens_per_step: int
  steps: int  # ceil(target_tokens / tokens_per_step)
  tokens: int  # steps x tokens_per_step (>= target_tokens)

  def to_dict(self) -> dict:
    return dataclasses.asdict(self)


def n_params(counts: ParamCounts, definition: str) -> int:
  if definition not in N_DEFINITIONS:
    raise ConfigError(
      f"sweep.n_definition must be one of {', '.join(N_DEFINITIONS)}, got {definition!r}"
    )
  return int(N_DEFINITIONS[definition](counts))


def make_budget(
  counts: ParamCounts, definition: str, tokens_per_param: float, batch_size: int, seq_len: int
) -> Budget:
  """The budget of one member; ConfigError naming the field for a non-positive input."""
  for name, value in (
    ("sweep.tokens_per_param", tokens_per_param),
    ("batch_size", batch_size),
    ("data.seq_len", seq_len),
  ):
    if not value > 0:
      raise ConfigError(f"{name} must be positive, got {value}")
  n = n_params(counts, definition)
  target = int(math.ceil(tokens_per_param * n))
  per_step = int(batch_size) * int(seq_len)
  steps = max(1, -(-target // per_step))
  return Budget(
    n_definition=definition,
    n_params=n,
    tokens_per_param=float(tokens_per_param),
    target_tokens=target,
    batch_size=int(batch_size),
    seq_len=int(seq_len),
    tokens_per_step=per_step,
    steps=steps,
    tokens=steps * per_step,
  )
