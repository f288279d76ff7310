"""The sentence-transformers packaging of an exported encoder: Transformer -> mean Pooling
[-> Normalize], written as plain JSON (no torch or sentence-transformers needed to export).

The files use the long-standing layout (`sentence_transformers.models.*` module types,
`sentence_bert_config.json`, `pooling_mode_mean_tokens`), which sentence-transformers 2.x to 6.x
load (6.x maps the old names onto its new modules), except for the padding key below: the default
`--st_padding max_length` writes `processing_kwargs`, which only 6.x knows (5.x passes every key
of sentence_bert_config.json to its Transformer module and fails on an unknown one). Mean pooling averages the final normalised
layer over the real tokens (the attention mask), as the probes' `Featurizer` does.

The contrastive pooler of the MTEB suite (`evaluators/pooler.py`, saved as
`eval/pooler-<tag>.npz`) is not packaged: it is learned-query cross-attention over the token
states (softmax over tokens per query, an RMSNorm, a concatenation and a projection), and no stock
sentence-transformers module computes attention pooling (Pooling's modes are cls, mean, max,
mean_sqrt_len_tokens, weightedmean (fixed position weights) and lasttoken; Dense acts on one vector,
not across tokens). Shipping it would need custom code, which this export avoids; embed with it
through `python -m cbert_jax.embed --pooler FILE` instead.
"""

from __future__ import annotations

import json

# How sentence-transformers pads a batch (`--st_padding`): "max_length" pads every batch to
# max_seq_length, so a batch of only empty texts (no token at all) still has positions and embeds
# to zeros; "longest" (sentence-transformers' own default) pads to the batch's longest text, which
# is faster on short texts but makes transformers raise on a batch whose texts are all empty (a
# [B, 0] input). sentence-transformers sorts texts by length, so 32 or more empty texts in one
# encode call fill such a batch.
PADDINGS = ("max_length", "longest")

POOLER_REFUSAL = (
  "the contrastive pooler (learned-query cross-attention over the token states) has no stock "
  "sentence-transformers module, so it cannot be packaged without custom code; this export "
  "uses mean pooling (--pooler mean, the probes' pooling). Embed with the pooler through "
  "`python -m cbert_jax.embed --workdir W --pooler FILE`"
)


def files(
  *, dim: int, max_seq_length: int, normalize: bool, padding: str = "max_length"
) -> dict[str, str]:
  """{relative path: text} of the sentence-transformers files (added to the Hugging Face ones).
  `padding`: one of PADDINGS, written as the Transformer module's `processing_kwargs`
  (sentence-transformers >= 6) when it is not the library's default."""
  modules = [
    {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
    {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
  ]
  out = {}
  if normalize:
    modules.append(
      {
        "idx": 2,
        "name": "2",
        "path": "2_Normalize",
        "type": "sentence_transformers.models.Normalize",
      }
    )
    out["2_Normalize/config.json"] = "{}\n"
  pooling = {
    "word_embedding_dimension": int(dim),
    "pooling_mode_cls_token": False,
    "pooling_mode_mean_tokens": True,
    "pooling_mode_max_tokens": False,
    "pooling_mode_mean_sqrt_len_tokens": False,
    "pooling_mode_weightedmean_tokens": False,
    "pooling_mode_lasttoken": False,
    "include_prompt": True,
  }
  st_config = {"prompts": {}, "default_prompt_name": None, "similarity_fn_name": "cosine"}
  dump = lambda x: json.dumps(x, indent=2) + "\n"
  out |= {
    "modules.json": dump(modules),
    "sentence_bert_config.json": dump(
      {"max_seq_length": int(max_seq_length), "do_lower_case": False}
      | ({"processing_kwargs": {"text": {"padding": padding}}} if padding != "longest" else {})
    ),
    "1_Pooling/config.json": dump(pooling),
    "config_sentence_transformers.json": dump(st_config),
  }
  return out
