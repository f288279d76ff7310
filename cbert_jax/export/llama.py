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

  def get(name: str) -> np.ndarray:
    try:
      return np.asarray(flat[f"encoder/{name}"], np.float32)
    except KeyError:
      raise ConfigError(
        f"the checkpoint has no encoder/{name}; expected a cbert_jax BERT/CrossBERT/ELECTRA encoder"
      ) from None

  def linear(w: np.ndarray) -> np.ndarray:  # ours [in, out] -> torch Linear [out, in]
    return w.T

  t = {"embed_tokens.weight": get("embed/table"), "norm.weight": get("norm/scale")}
  for i in range(num_layers):
    b, p = f"blocks/{i}", f"layers.{i}"
    for ours, theirs in (("wq", "q_proj"), ("wk", "k_proj"), ("wv", "v_proj")):
      w = get(f"{b}/attn/{ours}")  # [d, H, Dh]
      t[f"{p}.self_attn.{theirs}.weight"] = linear(w.reshape(w.shape[0], -1))  # [H*Dh, d]
    wo = get(f"{b}/attn/wo")  # [H, Dh, d]
    t[f"{p}.self_attn.o_proj.weight"] = linear(wo.reshape(-1, wo.shape[-1]))  # [d, H*Dh]
    t[f"{p}.mlp.gate_proj.weight"] = linear(get(f"{b}/ffn/w1"))  # [F, d]
    t[f"{p}.mlp.up_proj.weight"] = linear(get(f"{b}/ffn/w3"))  # [F, d]
    t[f"{p}.mlp.down_proj.weight"] = linear(get(f"{b}/ffn/w2"))  # [d, F]
    t[f"{p}.input_layernorm.weight"] = get(f"{b}/attn_norm/scale")
    t[f"{p}.post_attention_layernorm.weight"] = get(f"{b}/ffn_norm/scale")
  extra = sorted(
    k for k in flat if k.startswith("encoder/blocks/") and int(k.split("/")[2]) >= num_layers
  )
  if extra:
    raise ConfigError(
      f"the checkpoint has more encoder blocks than config.json's {num_layers} layers ({extra[0]})"
    )
  return {k: np.ascontiguousarray(v.astype(out_dtype)) for k, v in t.items()}


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
  """`tensors` as a safetensors file (no torch needed); `metadata` values must be strings."""
  from safetensors.numpy import save_file  # pylint: disable=import-outside-toplevel

  save_file(tensors, path, metadata={"format": "pt", **metadata})
