"""The model card (README.md) of an exported encoder: what it is, what was left out, how it was
trained and on what data, its probe scores at the exported step, and how to load it."""

from __future__ import annotations

import json
import os
from typing import Any

from cbert_jax.export import model_index
from cbert_jax.run import record as record_lib

FAMILY = {
  "bert": "BERT (masked-language-model encoder)",
  "crossbert": "CrossBERT (encoder trained through a cross-attention predictor)",
  "electra": "ELECTRA (replaced-token detection; the discriminator)",
}

NOT_EXPORTED = {
  "bert": ["the MLM head (`head/w`, d x V)"],
  "crossbert": [
    "the predictor (its cross-attention blocks, mask vector, norm and MLM head): it "
    "only reads the encoder's output during pre-training"
  ],
  "electra": [
    "the generator (a small MLM encoder sharing the token embeddings)",
    "the discriminator head (replaced-token classifier)",
  ],
}


# The transformers example of the card and of the README (MODEL_DIR: the export's path, quoted):
# mean pooling over real tokens, as the probes and `cbert_jax.embed`; texts cut at the tokenizer's
# model_max_length; an empty text (no tokens) gives zeros, also in a batch of only empty texts,
# which transformers cannot run (a [B, 0] input).
HF_SNIPPET = """import torch
from transformers import AutoModel, AutoTokenizer

tok = AutoTokenizer.from_pretrained(MODEL_DIR)  # no BOS/EOS are added
model = AutoModel.from_pretrained(MODEL_DIR).eval()  # LlamaModel, is_causal false


def embed(texts):  # the mean over real tokens: the probes' features; "" gives zeros
  batch = tok(texts, padding=True, truncation=True, return_tensors="pt")
  m = batch["attention_mask"].unsqueeze(-1)  # [B, T, 1]
  if m.shape[1] == 0:  # only empty texts: no token to run the model on
    return torch.zeros(len(texts), model.config.hidden_size)
  with torch.no_grad():
    h = model(**batch).last_hidden_state.masked_fill(m == 0, 0.0)  # [B, T, d]
  return h.sum(1) / m.sum(1).clamp(min=1)  # [B, d]


emb = embed(["a sentence", "another one"])
"""


def _fmt_int(x: float) -> str:
  return f"{int(x):,}"


def _fmt_sci(x: float) -> str:
  return f"{x:.3e}"


def _eval_section(workdir: str, step: int) -> list[str]:
  files = record_lib.suite_results(workdir, step)
  if not files:
    return [
      f"No probe suite was run on step {step} (no `eval/step_{step}*.json` in the run's "
      "workdir). Run one with `--config.mode=eval` on the same workdir and export again to "
      "include its scores here."
    ]
  lines = []
  for path in files:
    name = os.path.basename(path)
    try:
      with open(path) as f:
        rec = json.load(f)
    except (OSError, ValueError) as e:
      lines += [f"* `eval/{name}`: unreadable ({type(e).__name__})", ""]
      continue
    results = rec.get("results", {}) if isinstance(rec, dict) else {}
    suite = rec.get("suite", "?") if isinstance(rec, dict) else "?"
    lines += [f"#### `{suite}` suite (`eval/{name}`)", ""]
    table = path[: -len(".json")] + ".md"
    if os.path.isfile(table):
      with open(table) as f:
        text = f.read().strip()
      # The suite's own table; its title line (with the workdir path) is dropped.
      lines += [ln for ln in text.splitlines() if not ln.startswith("### ")] + [""]
    elif isinstance(results.get("average"), dict):
      avg = results["average"]
      lines += [
        "average: "
        + ", ".join(f"{k} {v:.4f}" for k, v in avg.items() if isinstance(v, (int, float))),
        "",
      ]
    else:
      lines += ["(no table)", ""]
  return lines


def _data_section(prov: dict) -> list[str]:
  man = prov.get("data_manifest") or {}
  if not man:
    return ["No data manifest in the run's provenance."]
  lines = [
    f"* corpus: `{man.get('corpus', '?')}`; manifest hash "
    f"`{prov.get('data_manifest_hash', man.get('hash', '?'))}`; content hash "
    f"`{man.get('content_hash', '?')}`"
  ]
  counts = man.get("counts") or {}
  for split, c in counts.items():
    if isinstance(c, dict):
      lines.append(
        f"* {split}: {_fmt_int(c.get('docs', 0))} documents, "
        f"{_fmt_int(c.get('chars', 0))} characters"
      )
  tokens = man.get("tokens") or {}
  if tokens:
    lines.append("* packed tokens: " + ", ".join(f"{k} {_fmt_int(v)}" for k, v in tokens.items()))
  sources = man.get("sources") or []
  if sources:
    lines += [
      "",
      "| source | package | version | licence | sha256 | url |",
      "|---|---|---|---|---|---|",
    ]
    for s in sources:
      cell = lambda k, s=s: str(s.get(k)).replace("|", "\\|") if s.get(k) not in (None, "") else "-"
      lines.append(
        f"| {cell('name')} | {cell('package')} | {cell('version')} | "
        f"{cell('license')} | `{cell('sha256')}` | {cell('url')} |"
      )
  return lines


def render(
  *,
  run,
  fmt: str,
  dtype: str,
  normalize: bool,
  max_seq_length: int,
  mlm_head: bool,
  exported_params: int,
  tokenizer_note: str,
  st_padding: str = "max_length",
  pretraining: bool = False,
) -> str:
  """README.md text for the export of `run` (a `trained.Trained`)."""
  cfg, rec, mc = run.config, run.record, run.model_cfg
  name = run.model_name
  size = cfg.model.get("size", "") or f"d{mc.d_model}L{mc.num_layers}"
  counts = rec.get("param_counts", {}) or {}
  tokens_per_step = int(cfg.batch_size) * int(cfg.data.seq_len)
  tokens = run.step * tokens_per_step
  fpt = rec.get("flops_per_token")
  prov = run.provenance
  o, mk = cfg.get("optim", {}), cfg.get("masking", {})
  is_st = fmt == "sentence-transformers"
  tags = ["cbert_jax", name, "feature-extraction", "text-embeddings"] + (
    ["sentence-transformers", "sentence-similarity"] if is_st else []
  )

  lines = (
    [
      "---",
      f"library_name: {'sentence-transformers' if is_st else 'transformers'}",
      "pipeline_tag: " + ("sentence-similarity" if is_st else "feature-extraction"),
      "tags:",
    ]
    + [f"- {t}" for t in tags]
    # the exported step's scores, as Hugging Face reads evaluation results (model_index.py)
    + model_index.yaml_lines(
      model_index.card_name(run.workdir, name, size), model_index.entries(run.workdir, run.step)
    )
    + ["---", ""]
  )
  lines += [
    f"# {name} {size} (cbert_jax), step {run.step}",
    "",
    f"A bidirectional text encoder trained with cbert_jax: {FAMILY.get(name, name)}, "
    f"width {mc.d_model}, {mc.num_layers} layers, {mc.num_heads} heads of "
    f"{mc.head_size}, SwiGLU {mc.ffn_size}, vocabulary {mc.vocab_size} "
    f"({_fmt_int(exported_params)} parameters exported).",
    "",
    "## What is exported",
    "",
    f"* the encoder{' (the discriminator)' if name == 'electra' else ''} as a Hugging "
    "Face `LlamaModel` (`model.safetensors`, " + dtype + "): pre-norm RMSNorm, RoPE "
    f'(theta {mc.rope_theta:g}), SwiGLU, no biases, with `"is_causal": false` in '
    "`config.json`, i.e. every token attends to every real token (the padding mask "
    "only). The output is the final normalised layer (`last_hidden_state`).",
    f"* the tokenizer: `tokenizer.json` (a fast tokenizer built from the SentencePiece "
    f"model, which is copied as `tokenizer.model`). {tokenizer_note}",
  ]
  if is_st:
    lines.append(
      f"* sentence-transformers modules: mean pooling over the real tokens of the "
      f"final layer (what cbert_jax's probes use){', then L2 normalisation' if normalize else ''}; "
      f"max_seq_length {max_seq_length}. The contrastive pooler of the MTEB suite is "
      "not packaged (no stock module computes attention pooling; see "
      "`python -m cbert_jax.embed --pooler`)."
    )
  if mlm_head:
    lines.append(
      "* BERT's MLM head, separately, in `mlm_head.safetensors` (`lm_head.weight`, "
      "[V, d]): logits = last_hidden_state @ lm_head.weight.T. transformers does "
      "not load it with the model."
    )
  if pretraining:
    lines.append(
      "* the rest of the training model ("
      + "; ".join(NOT_EXPORTED.get(name, []))
      + "), float32, in cbert_jax's own names, in `pretraining.safetensors`: "
      "`--config.init_from=<this folder>` in cbert_jax loads it with the encoder, so "
      "pretraining continues where it stopped (the optimizer state is not kept: AdamW and "
      "the LR schedule start again). transformers and sentence-transformers ignore it."
    )
  left_out = [x for x in NOT_EXPORTED.get(name, []) if not (mlm_head and "MLM head" in x)]
  lines += [
    "",
    "Not exported: " + ("; ".join(left_out) if left_out and not pretraining else "-") + ".",
    "",
    "## Use",
    "",
    "Needs transformers >= 5.2 (earlier versions ignore `is_causal: false` and would "
    "silently run the encoder with causal attention). No custom code is loaded.",
    "",
    "```python",
    *HF_SNIPPET.replace("MODEL_DIR", '"path/to/this/directory"').splitlines(),
    "```",
    "",
  ]
  if is_st:
    lines += [
      "```python",
      "from sentence_transformers import SentenceTransformer",
      "",
      'model = SentenceTransformer("path/to/this/directory")',
      f'emb = model.encode(["a sentence", "another one"])   # numpy [2, {mc.d_model}]',
      "```",
      "",
    ]
  evals_len = cfg.get("evals", {}).get("seq_len")
  lines += [
    f"**Long texts** are cut to their first {max_seq_length} tokens: the tokenizer's "
    "`model_max_length`, applied when it is called with `truncation=True` as above"
    + (" and by sentence-transformers' `max_seq_length`" if is_st else "")
    + f" (the run trained on rows of {cfg.data.seq_len}"
    + (f", its probes read {evals_len} tokens per text" if evals_len else "")
    + "). **An empty or whitespace-only text** has no tokens (no BOS/EOS are added); its "
    "embedding is defined as the zero vector, the mean over no tokens, as `cbert_jax.embed` "
    "gives"
    + (
      (
        "; sentence-transformers pads every batch to max_seq_length (`processing_kwargs` in "
        "sentence_bert_config.json), so even a batch of only empty texts embeds to zeros. That "
        "key needs sentence-transformers >= 6.0 (5.x refuses it at load: export with "
        "`--st_padding longest` for 5.x, and drop empty texts)"
      )
      if is_st and st_padding == "max_length"
      else (
        "; sentence-transformers pads to the batch's longest text (exported with "
        "`--st_padding longest`), so a batch whose texts are all empty raises in transformers: "
        "drop empty texts first"
      )
      if is_st
      else ""
    )
    + ". Hidden states at padding positions are not meaningful (a padding position attends "
    "to the real tokens, but none attends to it); pool with the attention mask as above.",
    "",
    "## Training",
    "",
    f"* family `{name}`, size `{size}`, seed {cfg.get('seed', '?')}, compute dtype "
    f"{cfg.model.get('compute_dtype', '?')}, params {cfg.model.get('param_dtype', '?')}",
    f"* step {run.step} of {cfg.get('total_steps', '?')}; batch {cfg.batch_size} rows x "
    f"{cfg.data.seq_len} tokens = {_fmt_int(tokens_per_step)} tokens per step",
    f"* tokens seen: {_fmt_int(tokens)}",
  ]
  if fpt:
    lines.append(
      f"* training FLOPs: {_fmt_sci(float(fpt) * tokens)} "
      f"({_fmt_sci(float(fpt))} per token x {_fmt_int(tokens)} tokens; the whole "
      "training model, predictor/generator included)"
    )
  if counts:
    lines.append(
      "* parameter counts (training model): "
      + ", ".join(f"{k} {_fmt_int(v)}" for k, v in counts.items() if v)
    )
  if o:
    lines.append(
      f"* optimiser: AdamW lr {o.get('lr')}, betas ({o.get('b1')}, {o.get('b2')}), "
      f"weight decay {o.get('weight_decay')}, schedule {o.get('schedule')}, clip "
      f"{o.get('clip_norm')}"
    )
  if mk:
    lines.append(
      f"* masking: ratio {mk.get('mask_ratio')}, [MASK]/random "
      f"{mk.get('p_mask')}/{mk.get('p_random')}"
      + (f", complementary masking ({mk.get('cms_form')})" if mk.get("cms") else "")
    )
  lines.append(
    f"* code: cbert_jax git `{prov.get('git_commit', '?')}`"
    f"{' (dirty)' if prov.get('git_dirty') else ''}, trained "
    f"{prov.get('time_utc', '?')} on {prov.get('device_count', '?')} "
    f"{prov.get('device_kind', '?')} device(s)"
  )
  lines += ["", "## Data", ""] + _data_section(prov)
  lines += ["", f"## Probe scores at step {run.step}", ""] + _eval_section(run.workdir, run.step)
  lines += [
    "",
    "## Export",
    "",
    f"Exported by `python -m cbert_jax.export` from checkpoint step {run.step} of the run "
    f"`{os.path.basename(os.path.normpath(run.workdir))}`. cbert_jax's tests check that `transformers` gives the JAX "
    "encoder's final states, and sentence-transformers the probes' mean-pooled features, "
    "within 1e-4 in float32.",
    "",
  ]
  return "\n".join(lines)


def summary(run) -> dict[str, Any]:
  """A few facts of the card, for the export manifest."""
  return {
    "model_name": run.model_name,
    "step": run.step,
    "tokens_seen": run.step * int(run.config.batch_size) * int(run.config.data.seq_len),
  }
