"""The encoder's parameters in the Hugging Face Llama layout, and the `config.json` that loads them.

Our encoder block is Llama's decoder layer run without a causal mask: pre-norm RMSNorm (fp32,
`scale` = Llama's `weight`), multi-head attention without biases, RoPE with the half-split
rotation (`rotate_half`, the convention of Hugging Face's Llama code), SwiGLU
`w2(silu(w1 x) * w3 x)` = `down_proj(silu(gate_proj x) * up_proj x)`, then a final RMSNorm. So
the conversion is a renaming plus, for every matrix, torch `nn.Linear`'s `[out, in]` transpose:

  ours                                        Llama (`LlamaModel` state dict)
  encoder/embed/table          [V, d]         embed_tokens.weight                 [V, d]  (as is)
  encoder/blocks/i/attn_norm/scale [d]        layers.i.input_layernorm.weight     [d]
  encoder/blocks/i/attn/wq     [d, H, Dh]     layers.i.self_attn.q_proj.weight    [H*Dh, d]
  encoder/blocks/i/attn/wk, wv [d, H, Dh]     layers.i.self_attn.{k,v}_proj.weight [H*Dh, d]
  encoder/blocks/i/attn/wo     [H, Dh, d]     layers.i.self_attn.o_proj.weight    [d, H*Dh]
  encoder/blocks/i/ffn_norm/scale [d]         layers.i.post_attention_layernorm.weight [d]
  encoder/blocks/i/ffn/w1      [d, F]         layers.i.mlp.gate_proj.weight       [F, d]
  encoder/blocks/i/ffn/w3      [d, F]         layers.i.mlp.up_proj.weight         [F, d]
  encoder/blocks/i/ffn/w2      [F, d]         layers.i.mlp.down_proj.weight       [d, F]
  encoder/norm/scale           [d]            norm.weight                         [d]

No permutation of the q/k rows is needed: `[d, H, Dh] -> [d, H*Dh]` orders the outputs head by
head (row h*Dh + j), which is how Llama's attention views them, and within a head our
`apply_rope` rotates the first half against the second (x1 cos - x2 sin, x2 cos + x1 sin) with
frequencies theta^(-2i/Dh), exactly `apply_rotary_pos_emb` with `rotate_half`. (Meta's original
Llama checkpoints rotate interleaved pairs; that is what the permutation in Hugging Face's
conversion script is for, and it does not apply here.)

BERT, CrossBERT and ELECTRA all keep the encoder (for ELECTRA: the discriminator) under
`encoder/`; nothing else is exported as the model. BERT's MLM head (`head/w` [d, V]) can be
written separately (`mlm_head_tensors`).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from cbert_jax.errors import ConfigError
from cbert_jax.models.model_config import numpy_dtype

DTYPES = ("float32", "bfloat16", "float16")


def flat_params(params) -> dict[str, np.ndarray]:
  """An nnx.State of parameters as {"encoder/blocks/0/attn/wq": host array} (fp as stored)."""
  import jax  # pylint: disable=import-outside-toplevel
  from flax import nnx  # pylint: disable=import-outside-toplevel

  flat = {}
  for path, leaf in nnx.to_flat_state(params):
    value = leaf.get_value() if hasattr(leaf, "get_value") else leaf
    flat["/".join(str(k) for k in path)] = np.asarray(jax.device_get(value))
  return flat


# Inside block i: (our path under encoder/blocks/i/, Llama's name under layers.i.), in the order
# the tensors are written.
_BLOCK = (
  ("attn/wq", "self_attn.q_proj.weight"),
  ("attn/wk", "self_attn.k_proj.weight"),
  ("attn/wv", "self_attn.v_proj.weight"),
  ("attn/wo", "self_attn.o_proj.weight"),
  ("ffn/w1", "mlp.gate_proj.weight"),
  ("ffn/w3", "mlp.up_proj.weight"),
  ("ffn/w2", "mlp.down_proj.weight"),
  ("attn_norm/scale", "input_layernorm.weight"),
  ("ffn_norm/scale", "post_attention_layernorm.weight"),
)
# Llama state-dict entries that are not weights of the encoder: RoPE's cached frequencies (older
# checkpoints) and a causal LM's next-token head (LlamaForCausalLM). Reading one back skips them.
NOT_ENCODER = ("rotary_emb.inv_freq", "lm_head.weight")


def name_table(num_layers: int) -> dict[str, str]:
  """{our name: Llama's name} of every encoder tensor ("encoder/blocks/0/attn/wq" ->
  "layers.0.self_attn.q_proj.weight"), the table in the module docstring."""
  t = {"encoder/embed/table": "embed_tokens.weight", "encoder/norm/scale": "norm.weight"}
  for i in range(num_layers):
    t |= {f"encoder/blocks/{i}/{ours}": f"layers.{i}.{theirs}" for ours, theirs in _BLOCK}
  return t


def our_name(llama_name: str) -> str | None:
  """The inverse of `name_table` for one name (any layer index); None when the name is not an
  encoder tensor of ours (a bias, a tensor of another architecture)."""
  if llama_name == "embed_tokens.weight":
    return "encoder/embed/table"
  if llama_name == "norm.weight":
    return "encoder/norm/scale"
  parts = llama_name.split(".", 2)
  if len(parts) == 3 and parts[0] == "layers" and parts[1].isdigit():
    for ours, theirs in _BLOCK:
      if parts[2] == theirs:
        return f"encoder/blocks/{int(parts[1])}/{ours}"
  return None


def _kind(ours: str) -> str:
  """How a tensor converts: "heads_in" (wq/wk/wv [d, H, Dh] <-> [H*Dh, d]), "heads_out" (wo
  [H, Dh, d] <-> [d, H*Dh]), "linear" (a transpose) or "same"."""
  leaf = ours.rsplit("/", 1)[-1]
  if leaf in ("wq", "wk", "wv"):
    return "heads_in"
  if leaf == "wo":
    return "heads_out"
  return "linear" if leaf in ("w1", "w2", "w3") else "same"


def llama_shape(ours: str, shape) -> tuple[int, ...]:
  """The shape Llama's state dict holds our tensor `ours` of `shape` in."""
  shape, kind = tuple(int(n) for n in shape), _kind(ours)
  if kind == "heads_in":  # [d, H, Dh] -> [H*Dh, d]
    return (shape[1] * shape[2], shape[0])
  if kind == "heads_out":  # [H, Dh, d] -> [d, H*Dh]
    return (shape[2], shape[0] * shape[1])
  return shape[::-1] if kind == "linear" else shape


def to_llama(ours: str, w: np.ndarray) -> np.ndarray:
  """Our tensor `ours` in Llama's layout (torch `nn.Linear` is [out, in]; ours is [in, out])."""
  kind = _kind(ours)
  if kind == "heads_in":
    return w.reshape(w.shape[0], -1).T  # [d, H, Dh] -> [d, H*Dh] -> [H*Dh, d]
  if kind == "heads_out":
    return w.reshape(-1, w.shape[-1]).T  # [H, Dh, d] -> [H*Dh, d] -> [d, H*Dh]
  return w.T if kind == "linear" else w


def from_llama(ours: str, w: np.ndarray, shape) -> np.ndarray:
  """The inverse of `to_llama`: Llama's tensor for our `ours`, back in our layout of `shape`
  (whose `llama_shape` must be `w.shape`)."""
  kind = _kind(ours)
  if kind in ("heads_in", "heads_out"):
    return w.T.reshape(tuple(shape))  # [H*Dh, d] -> [d, H, Dh];  [d, H*Dh] -> [H, Dh, d]
  return w.T if kind == "linear" else w


def llama_tensors(
  flat: dict[str, np.ndarray], num_layers: int, dtype: str = "float32"
) -> dict[str, np.ndarray]:
  """The encoder's tensors under `LlamaModel`'s state-dict names, cast to `dtype`, C-contiguous.

  Raises:
    ConfigError: a parameter of the encoder is missing (not a cbert_jax encoder checkpoint).
  """
  if dtype not in DTYPES:
    raise ConfigError(f"--dtype {dtype}: expected one of {', '.join(DTYPES)}")
  out_dtype = numpy_dtype(dtype)
  t = {}
  for ours, theirs in name_table(num_layers).items():
    if ours not in flat:
      raise ConfigError(
        f"the checkpoint has no {ours}; expected a cbert_jax BERT/CrossBERT/ELECTRA encoder"
      )
    t[theirs] = to_llama(ours, np.asarray(flat[ours], np.float32))
  extra = sorted(
    k for k in flat if k.startswith("encoder/blocks/") and int(k.split("/")[2]) >= num_layers
  )
  if extra:
    raise ConfigError(
      f"the checkpoint has more encoder blocks than config.json's {num_layers} layers ({extra[0]})"
    )
  return {k: np.ascontiguousarray(v.astype(out_dtype)) for k, v in t.items()}


def our_tensors(tensors: dict[str, np.ndarray], shapes: dict[str, tuple]) -> dict[str, np.ndarray]:
  """The inverse of `llama_tensors`: {our name: array in our layout} of the Llama tensors whose
  our-name `shapes` lists (their dtype kept; the shapes already checked to correspond)."""
  out = {}
  for theirs, w in tensors.items():
    ours = our_name(theirs)
    if ours is not None and ours in shapes:
      out[ours] = np.ascontiguousarray(from_llama(ours, np.asarray(w), shapes[ours]))
  return out


def mlm_head_tensors(
  flat: dict[str, np.ndarray], model_name: str, dtype: str = "float32"
) -> dict[str, np.ndarray] | None:
  """BERT's MLM head as {"lm_head.weight": [V, d]} (logits = final_hidden @ W.T), or None when the
  model has no MLM head over the encoder's output (CrossBERT's head reads the predictor, which is
  not exported; ELECTRA's discriminator head is a per-token binary classifier)."""
  if model_name != "bert":
    return None
  w = flat.get("head/w")
  if w is None:  # tied: the head is the embedding table
    w = flat["encoder/embed/table"].T
  return {
    "lm_head.weight": np.ascontiguousarray(np.asarray(w, np.float32).T.astype(numpy_dtype(dtype)))
  }


def llama_config(
  model_cfg, *, max_positions: int, dtype: str, pad_id: int, bos_id: int, eos_id: int
) -> dict[str, Any]:
  """`config.json` for `LlamaModel` with bidirectional attention (`is_causal: false`).

  RoPE is written both ways: `rope_parameters` (transformers >= 5) and the legacy `rope_theta`
  (read by older versions); `dtype` and the legacy `torch_dtype` likewise. transformers 5.24 reads
  this without warnings.
  """
  c = model_cfg
  return {
    "architectures": ["LlamaModel"],
    "model_type": "llama",
    "is_causal": False,
    "hidden_size": int(c.d_model),
    "intermediate_size": int(c.ffn_size),
    "num_hidden_layers": int(c.num_layers),
    "num_attention_heads": int(c.num_heads),
    "num_key_value_heads": int(c.num_heads),
    "head_dim": int(c.head_size),
    "hidden_act": "silu",
    "rms_norm_eps": float(c.norm_eps),
    "rope_parameters": {"rope_type": "default", "rope_theta": float(c.rope_theta)},
    "rope_theta": float(c.rope_theta),
    "vocab_size": int(c.vocab_size),
    "max_position_embeddings": int(max_positions),
    "attention_bias": False,
    "attention_dropout": 0.0,
    "mlp_bias": False,
    "tie_word_embeddings": False,
    "pad_token_id": int(pad_id),
    "bos_token_id": int(bos_id) if bos_id >= 0 else None,
    "eos_token_id": int(eos_id) if eos_id >= 0 else None,
    "use_cache": False,
    "initializer_range": 0.02,
    "dtype": dtype,
    "torch_dtype": dtype,
  }


def write_safetensors(path: str, tensors: dict[str, np.ndarray], metadata: dict[str, str]) -> None:
  """`tensors` as a safetensors file (no torch needed); `metadata` values must be strings.

  safetensors lays out the arrays; its header's metadata comes out in the order of a Rust HashMap,
  which differs from process to process, so the header is written again with the metadata keys
  sorted (same JSON, same length rule: padded with spaces to a multiple of 8 bytes). The same
  arrays then give the same bytes in every process (an export read back with init_from and
  exported again is byte-identical)."""
  from safetensors.numpy import save  # pylint: disable=import-outside-toplevel

  raw = save(tensors, metadata={"format": "pt", **metadata})
  n = int.from_bytes(raw[:8], "little")
  header = json.loads(raw[8 : 8 + n])
  header["__metadata__"] = dict(sorted(header["__metadata__"].items()))
  text = json.dumps(header, separators=(",", ":")).encode()
  text += b" " * (-len(text) % 8)
  with open(path, "wb") as f:
    f.write(len(text).to_bytes(8, "little"))
    f.write(text)
    f.write(raw[8 + n :])
