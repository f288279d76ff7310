r"""Embedding benchmark: tokens/s of cbert_jax's frozen features against HF encoders (prints numbers).

  pip install -e '.[bench]'
  python benchmarks/embed.py                     # shapes tiny,small
  python benchmarks/embed.py --shapes tiny --steps 10   # ~3 min on a shared 2-core VM
  python benchmarks/embed.py --contestants ours,hf_bert --shapes small
  python benchmarks/embed.py --dry_run           # a tiny shape, 2 calls, 64 lines: seconds (tests)

Users of frozen features spend their compute embedding text (issue 19 item 5). Contestants, each
a forward pass only (no gradients; torch under `torch.inference_mode()` with `model.eval()`),
float32 on the CPU, on one fixed random batch of full rows (no padding) at each shape's
(batch, seq), same width, heads, layers, FFN width and vocabulary:
  ours           cbert_jax BERT features: `evaluators.features.Featurizer` (the probes' and
                 `cbert_jax.embed`'s path: `steps.make_features_step`, jitted), i.e. the encoder's
                 final normalised layer, mean-pooled over real tokens -> [B, d]. CrossBERT's
                 `features` is the same function (`models.encoder.features` on its `Encoder`; the
                 predictor is not run), so this one contestant stands for both.
  hf_bert        HF `BertModel(add_pooling_layer=False)` with `attn_implementation="sdpa"` (the
                 default of transformers 5), last_hidden_state mean-pooled over the attention mask
  hf_bert_eager  the same with `attn_implementation="eager"` (explicit softmax(QK^T)V)
  hf_modernbert  HF `ModernBertModel` (sdpa, its default), mean-pooled the same way
  e2e            `cbert_jax.embed` end to end on a text file (below)
The HF peers are built from configs (no downloads), dropout 0. The forward contestants alternate
round by round (`--rounds`) so machine noise hits all alike; the first call after each switch is
not timed. Each call returns the pooled [B, d] array on the host, so the clock stops when the
work is done. tokens/s = batch * seq / median call time, over `--steps` timed calls.

Forward FLOPs per token (2 per multiply-add, matmuls only; attention counts QK^T and AV over all
T keys; embedding gathers, norms, RoPE, softmax, activations and the pooling are not counted;
heads x head_dim = d for all three):
  ours (SwiGLU FFN, no biases):          L (8 d^2 + 6 d F + 4 T d)
  HF BertModel (GELU FFN):               L (8 d^2 + 4 d F_gelu + 4 T d)   (F_gelu: the shape's
                                         gelu_ffn, BERT-base's 3072 at the paper shape; else F)
  HF ModernBertModel (GLU FFN, d -> 2F): L (8 d^2 + 6 d F + 4 T d); its local layers (2 in 3)
    attend within +-64 tokens, but the sdpa path computes the full T x T scores and masks them,
    so all T keys are counted (what it executes).
At the same F, HF BERT does fewer FLOPs per token than ours (GELU: two FFN matmuls, SwiGLU three),
so the tokens/s ratio understates ours per FLOP; both ratios are reported. Note also that with an
all-ones attention mask transformers may drop the mask (sdpa's unmasked kernel), while ours
always applies its [B, T, T] mask (packed documents need it). MFU divides model FLOP/s by the
best 2048^2 float32 matmul FLOP/s measured in this run (JAX and torch, before and after the
contestants; 256^2 in a dry run), as train_step.py does.

End to end (`e2e`): `cbert_jax.embed.embed_files` on a `--e2e_lines`-line text file (default
2000 lines: the 321 paragraphs of tests/fixtures/tiny_corpus.txt, Austen's *Persuasion*, cycled; or
`--text FILE`):
read, tokenise (SentencePiece), sort by length, pad each batch to a length bucket, encode, pool,
write the .npy. That is `python -m cbert_jax.embed` after `trained.load`: the run is an in-memory
`trained.Trained` (a randomly initialised BERT at the shape, on a data-parallel mesh of every
local device, as the CLI makes it, and a BPE tokenizer of min(vocab, 4096) pieces trained on the
tiny corpus in well under a second), so checkpoint loading, a one-off, is not timed; random
weights encode at the same speed as trained ones. The first pass (which compiles one executable
per length bucket) is reported as the cold pass; tokens/s and texts/s are over the median of
`--e2e_passes` warm passes, counting real tokens only (after truncation at seq). Tokenising alone
is timed too.

Writes <out>/embed.{json,md,png} (default runs/bench/embed). Numbers on a shared VM are noisy.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The peers run on torch's CPU; JAX on the CPU too, so the comparison is like for like.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from benchmarks import train_step  # noqa: E402
from benchmarks.contestants import MASK_ID, SHAPES, SPECIAL, Shape, hf_config, model_config  # noqa: E402

CONTESTANTS = {  # --contestants key -> the name in the tables
  "ours": "cbert_jax BERT features",
  "hf_bert": "HF BertModel (sdpa)",
  "hf_bert_eager": "HF BertModel (eager)",
  "hf_modernbert": "HF ModernBertModel (sdpa)",
  "e2e": "cbert_jax.embed end to end",
}
OURS, E2E = CONTESTANTS["ours"], CONTESTANTS["e2e"]
TARGET = ("hf_bert", 1.5)  # issue 19: embedding >= 1.5x HF BertModel (reported, not asserted)
DRY = Shape(layers=2, d=64, heads=2, ffn=256, vocab=512, seq=32, batch=8)
CORPUS = os.path.join(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
  "tests",
  "fixtures",
  "tiny_corpus.txt",
)


def forward_flops_per_token(key: str, s: Shape) -> float:
  """Matmul FLOPs of one forward pass per token (see the module docstring)."""
  ffn = 4 * s.d * s.bert_ffn if key in ("hf_bert", "hf_bert_eager") else 6 * s.d * s.ffn
  return s.layers * (8 * s.d * s.d + ffn + 4 * s.seq * s.d)


def random_ids(s: Shape) -> np.ndarray:
  """The fixed batch every forward contestant encodes: int [B, T], no special ids."""
  return np.random.RandomState(0).randint(5, s.vocab, (s.batch, s.seq))


# ----------------------------------------------------------------------------------- cbert_jax --
def encoder_params(model) -> int:
  """Parameters `features` uses: the encoder's (BERT's vocabulary head is not run)."""
  import jax
  from flax import nnx

  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(model.encoder, nnx.Param)))


class JaxFeatures:
  """cbert_jax BERT's frozen features (final layer, mean pooling) via `Featurizer`."""

  def __init__(self, s: Shape):
    from flax import nnx

    from cbert_jax.evaluators import features
    from cbert_jax.models import FAMILIES
    from cbert_jax.models.model_config import MaskConfig

    cfg = model_config(s)
    mask = MaskConfig(mask_ratio=0.2, mask_id=MASK_ID, special_ids=SPECIAL)
    with nnx.use_eager_sharding(False):
      model = FAMILIES["bert"](cfg, mask, nnx.Rngs(0))
    graphdef, params = nnx.split(model, nnx.Param)
    self.params = encoder_params(model)
    self.feat = features.Featurizer(graphdef, params, batch_size=s.batch, seq_len=s.seq)
    self.rows = {
      "tokens": random_ids(s).astype(np.int32),  # [B, T]
      "positions": np.broadcast_to(np.arange(s.seq, dtype=np.int32), (s.batch, s.seq)),  # [B, T]
      "segment_ids": np.ones((s.batch, s.seq), np.int32),  # [B, T]: every token real
    }

  def call(self) -> np.ndarray:
    return self.feat(self.rows)  # [B, d] float32 on the host: blocks


# ---------------------------------------------------------------------------------- torch peers --
class TorchFeatures:
  """A Hugging Face encoder's last hidden state, mean-pooled over the attention mask."""

  def __init__(self, key: str, s: Shape):
    import torch
    import transformers

    torch.manual_seed(0)
    if key in ("hf_bert", "hf_bert_eager"):
      attention = "eager" if key == "hf_bert_eager" else "sdpa"
      cfg = hf_config("bert", s, attention)  # BERT-base's GELU 3072 at the paper shape
      self.model = transformers.BertModel(cfg, add_pooling_layer=False)
    else:
      self.model = transformers.ModernBertModel(hf_config("modernbert", s))
    self.attn_implementation = self.model.config._attn_implementation
    self.model.eval()
    self.params = sum(p.numel() for p in self.model.parameters())
    self.ids = torch.from_numpy(random_ids(s))  # [B, T] int64
    self.mask = torch.ones_like(self.ids)  # [B, T]
    self._torch = torch

  def call(self):
    with self._torch.inference_mode():
      h = self.model(input_ids=self.ids, attention_mask=self.mask).last_hidden_state  # [B, T, d]
      w = self.mask.unsqueeze(-1).to(h.dtype)  # [B, T, 1]
      return ((h * w).sum(1) / w.sum(1).clamp(min=1.0)).numpy()  # [B, d]


def build(key: str, s: Shape):
  return JaxFeatures(s) if key == "ours" else TorchFeatures(key, s)


# ---------------------------------------------------------------------------------- end to end --
def corpus_lines(n: int) -> list[str]:
  """n lines of real text: tiny_corpus.txt's paragraphs, whitespace-joined, cycled."""
  with open(CORPUS, encoding="utf-8") as f:
    paras = [" ".join(p.split()) for p in f.read().split("\n\n")]
  paras = [p for p in paras if p]
  return [paras[i % len(paras)] for i in range(n)]


class EndToEnd:
  """`cbert_jax.embed` on a text file, with an in-memory run (no checkpoint to load)."""

  def __init__(self, s: Shape, text_path: str, tmp: str):
    import jax
    import ml_collections
    from flax import nnx

    from cbert_jax import config_groups, embed
    from cbert_jax.data import tokenizer as tokenizer_lib
    from cbert_jax.models.model_config import MaskConfig
    from cbert_jax.run import trained
    from cbert_jax.step import sharding
    from cbert_jax.step.state import abstract_model

    with open(CORPUS, encoding="utf-8") as f:
      docs = [p for p in f.read().split("\n\n") if p.strip()]
    self.tokenizer_vocab = min(s.vocab, 4096)
    tok_path = os.path.join(tmp, "tokenizer.model")
    with open(tok_path, "wb") as f:  # what the trainer would train on this corpus, uncached
      f.write(tokenizer_lib._train(docs, vocab_size=self.tokenizer_vocab, model_type="bpe"))
    tok = tokenizer_lib.Tokenizer(tok_path)
    # The encoder keeps the shape's vocabulary (ids past the tokenizer's are never looked up).
    model_cfg = model_config(s)
    mask_cfg = MaskConfig(mask_ratio=0.2, mask_id=tok.mask_id, special_ids=tok.special_ids)
    # As trained.load: a data-parallel mesh of every device, parameters replicated on it.
    mesh = sharding.make_mesh(ml_collections.ConfigDict({"data": -1, "fsdp": 1, "tensor": 1}))
    rules = tuple(tuple(r) for r in config_groups.DEFAULT_RULES)
    make_model = abstract_model("bert", model_cfg, mask_cfg, mesh, rules)[0]
    with jax.set_mesh(mesh), nnx.logical_axis_rules(rules):  # placed as the rules say
      model = make_model(jax.random.key(0))
      graphdef, params = nnx.split(model, nnx.Param)
    self.params = encoder_params(model)
    run = trained.Trained(
      workdir=tmp,
      step=0,
      config=ml_collections.ConfigDict(
        {"model_name": "bert", "model": {"size": "bench"}, "data": {"seq_len": s.seq}}
      ),
      provenance={},
      record={},
      model_cfg=model_cfg,
      mask_cfg=mask_cfg,
      graphdef=graphdef,
      params=params,
      mesh=mesh,
      rules=rules,
      tokenizer=tok,
    )
    self.devices = int(mesh.devices.size)
    self.embedder = embed.Embedder(run, seq_len=s.seq, batch_size=s.batch)
    self.files, self.out = [text_path], os.path.join(tmp, "emb.npy")
    with open(text_path, encoding="utf-8") as f:
      self.texts = [line.rstrip("\n") for line in f]
    self._embed, self._tok = embed, tok

  def run(self) -> dict:
    """One pass over the file: embed.embed_files' summary (texts, tokens, seconds, ...)."""
    start = time.perf_counter()
    summary = self._embed.embed_files(
      self.embedder, self.files, self.out, log=lambda _: None, log_every_s=1e9
    )
    summary["seconds"] = time.perf_counter() - start  # unrounded
    return summary

  def tokenize_s(self) -> float:
    start = time.perf_counter()
    self._tok.encode_batch(self.texts)
    return time.perf_counter() - start

  def encoded_positions(self) -> int:
    """Row positions the encoder runs over, padding included, as `Embedder.embed_ids` batches
    them: length-sorted batches of batch_size rows (the last one padded with empty rows), each
    padded to the smallest length bucket that holds its longest text."""
    e = self.embedder
    lengths = sorted(min(len(x), e.seq_len) for x in self._tok.encode_batch(self.texts))
    sizes = self._embed.buckets(e.seq_len)
    return sum(
      e.batch_size * next(b for b in sizes if b >= max(lengths[i : i + e.batch_size]))
      for i in range(0, len(lengths), e.batch_size)
    )


def run_e2e(s: Shape, lines: int, passes: int, text: str | None, label: str) -> dict:
  generated = not text
  with tempfile.TemporaryDirectory(prefix="bench_embed_") as tmp:
    if generated:
      text = os.path.join(tmp, "texts.txt")
      with open(text, "w", encoding="utf-8") as f:
        f.write("\n".join(corpus_lines(lines)) + "\n")
    t0 = time.perf_counter()
    e2e = EndToEnd(s, text, tmp)
    build_s = time.perf_counter() - t0
    cold = e2e.run()  # compiles one executable per length bucket
    print(f"  [{label}] {E2E}: built in {build_s:.1f} s, cold pass {cold['seconds']:.1f} s")
    runs = [e2e.run() for _ in range(passes)]
    tok_s = statistics.median(e2e.tokenize_s() for _ in range(passes))
    positions = e2e.encoded_positions()
  med = statistics.median(r["seconds"] for r in runs)
  texts, tokens = runs[0]["texts"], runs[0]["tokens"]
  return {
    "pass_s": med,
    "passes_timed": len(runs),
    "pass_s_min": min(r["seconds"] for r in runs),
    "pass_s_max": max(r["seconds"] for r in runs),
    "cold_pass_s": cold["seconds"],
    "tokenize_s": tok_s,
    "texts": texts,
    "tokens": tokens,
    "truncated_texts": runs[0]["truncated_texts"],
    "encoded_positions": positions,  # padding included
    "texts_per_s": texts / med,
    "tokens_per_s": tokens / med,
    "params": e2e.params,
    "devices": e2e.devices,
    "tokenizer_vocab": e2e.tokenizer_vocab,
    "text_file": f"{lines} corpus lines" if generated else text,
  }


# ------------------------------------------------------------------------------------ peaks -----
def matmul_peaks(torch_too: bool, n: int, seconds: float) -> dict[str, float]:
  """FLOP/s of an n x n float32 matmul in JAX (and torch): `train_step.matmul_peaks`."""
  if torch_too:
    return train_step.matmul_peaks(n, seconds)
  from cbert_jax.run import hardware

  return {"jax": hardware.measure_matmul_peak(np.float32, n=n, seconds=seconds)}


# ------------------------------------------------------------------------------------- run ------
def run_shape(
  label: str, s: Shape, keys, steps: int, warmup: int, rounds: int, e2e_args: dict
) -> dict:
  fwd = [k for k in keys if k != "e2e"]
  contestants = {}
  for k in fwd:
    t0 = time.perf_counter()
    contestants[k] = build(k, s)
    for _ in range(warmup):  # the first call compiles (JAX)
      contestants[k].call()
    print(
      f"  [{label}] {CONTESTANTS[k]}: built and warmed up in {time.perf_counter() - t0:.1f} s",
      flush=True,
    )
  times = {k: [] for k in fwd}
  per_round = max(1, -(-steps // rounds))
  for r in range(rounds if fwd else 0):
    for k in fwd:
      contestants[k].call()  # untimed: the first call after switching pays for caches
      for _ in range(per_round):
        start = time.perf_counter()
        contestants[k].call()
        times[k].append(time.perf_counter() - start)
    print(
      f"  [{label}] round {r + 1}/{rounds}: "
      + ", ".join(f"{CONTESTANTS[k]} {statistics.median(t):.4f} s" for k, t in times.items()),
      flush=True,
    )
  out = {}
  for k in fwd:
    med, flops = statistics.median(times[k]), forward_flops_per_token(k, s)
    out[CONTESTANTS[k]] = {
      "key": k,
      "batch_s": med,
      "calls_timed": len(times[k]),
      "batch_s_min": min(times[k]),
      "batch_s_max": max(times[k]),
      "tokens_per_s": s.batch * s.seq / med,
      "flops_per_token": flops,
      "model_flops_per_s": flops * s.batch * s.seq / med,
      "params": contestants[k].params,
    }
    if isinstance(contestants[k], TorchFeatures):
      out[CONTESTANTS[k]]["attn_implementation"] = contestants[k].attn_implementation
  del contestants
  if "e2e" in keys:
    out[E2E] = {"key": "e2e", **run_e2e(s, label=label, **e2e_args)}
  return out


def ratios(res: dict) -> dict:
  """Per shape: ours / each peer in tokens/s and in forward FLOPs per token; e2e / ours."""
  out = {}
  for shape, r in res.items():
    rat, flops = {}, {}
    if OURS in r:
      for name, v in r.items():
        if name == OURS:
          continue
        pair = f"{OURS} / {name}" if name != E2E else f"{E2E} / {OURS}"
        a, b = (r[OURS], v) if name != E2E else (v, r[OURS])
        rat[pair] = a["tokens_per_s"] / b["tokens_per_s"]
        if name != E2E:
          flops[pair] = r[OURS]["flops_per_token"] / v["flops_per_token"]
    out[shape] = {"tokens_per_s": rat, "flops_per_token": flops}
  return out


def markdown(res: dict, rat: dict, shapes: dict, peak: float, peaks: dict, n: int) -> str:
  target_name, target = CONTESTANTS[TARGET[0]], TARGET[1]
  lines = [
    f"matmul peak ({n}^2 float32, best of this run): {peak / 1e9:.1f} GFLOP/s ("
    + "; ".join(f"{k} {', '.join(f'{v / 1e9:.0f}' for v in vs)}" for k, vs in peaks.items())
    + "; before, after)",
    "",
  ]
  for shape, r in res.items():
    s = shapes[shape]
    lines += [
      f"### {shape}: {s.describe()}",
      "",
      "| contestant | params | median call (s) | tokens/s | fwd MFLOP/token | GFLOP/s | MFU |",
      "|---|---|---|---|---|---|---|",
    ]
    for name, v in r.items():
      if name == E2E:
        lines.append(
          f"| {name} | {v['params'] / 1e6:.1f}M | {v['pass_s']:.3f} (one pass) | "
          f"{v['tokens_per_s']:,.0f} | - | - | - |"
        )
      else:
        lines.append(
          f"| {name} | {v['params'] / 1e6:.1f}M | {v['batch_s']:.4f} | {v['tokens_per_s']:,.0f} | "
          f"{v['flops_per_token'] / 1e6:.1f} | {v['model_flops_per_s'] / 1e9:.1f} | "
          f"{100 * v['model_flops_per_s'] / peak:.0f}% |"
        )
    lines.append("")
    fl = rat[shape]["flops_per_token"]
    for pair, x in rat[shape]["tokens_per_s"].items():
      extra = f" (FLOPs/token ratio {fl[pair]:.2f})" if pair in fl else ""
      lines.append(f"- {pair}: **{x:.2f}x** tokens/s{extra}")
    pair = f"{OURS} / {target_name}"
    if pair in rat[shape]["tokens_per_s"]:
      x = rat[shape]["tokens_per_s"][pair]
      lines.append(
        f"- target (issue 19): >= {target}x {target_name}: "
        f"{'met' if x >= target else 'not met'} ({x:.2f}x)"
      )
    if E2E in r:
      v = r[E2E]
      lines.append(
        f"- end to end: {v['texts']} texts ({v['text_file']}), {v['tokens']:,} tokens "
        f"({v['tokens'] / max(v['texts'], 1):.0f}/text, {v['truncated_texts']} truncated at "
        f"{s.seq}; {1 - v['tokens'] / v['encoded_positions']:.0%} of the encoded positions are "
        f"padding): **{v['texts_per_s']:,.0f} texts/s**, {v['tokens_per_s']:,.0f} tokens/s; "
        f"tokenising alone {v['tokenize_s']:.3f} s of the {v['pass_s']:.3f} s pass; cold pass "
        f"(compiling the length buckets) {v['cold_pass_s']:.1f} s; {v['devices']} device(s), "
        f"BPE tokenizer of {v['tokenizer_vocab']} pieces"
      )
    lines.append("")
  return "\n".join(lines)


def plot(res: dict, path: str, mpl_dir: str) -> None:
  from cbert_jax.run import plotting

  Figure, Canvas = plotting.matplotlib_classes(mpl_dir)  # noqa: N806
  fig = Figure(figsize=(6.5 * len(res), 1.2 + 0.55 * max(len(r) for r in res.values())))
  Canvas(fig)
  axes = fig.subplots(1, len(res), squeeze=False)[0]
  for ax, (shape, r) in zip(axes, res.items()):
    names = list(r)
    vals = [r[n]["tokens_per_s"] for n in names]
    colors = ["C2" if n == E2E else "C0" if n.startswith("cbert") else "C1" for n in names]
    ax.barh(names, vals, color=colors)
    for i, x in enumerate(vals):
      ax.text(x, i, f" {x:,.0f}", va="center", fontsize=8)
    ax.set_title(f"{shape}: tokens/s (median; end to end: real tokens)")
    ax.set_xlim(0, 1.2 * max(vals))
    ax.invert_yaxis()
  fig.tight_layout()
  fig.savefig(path, dpi=120)


def parse_list(p: argparse.ArgumentParser, flag: str, value: str, known: dict) -> list[str]:
  """Comma-separated keys (or full names) of `known`; one argparse error naming `flag` otherwise."""
  by_name = {v: k for k, v in known.items() if isinstance(v, str)}
  out = []
  for item in (x.strip() for x in value.split(",")):
    if not item:
      continue
    if item not in known and item not in by_name:
      p.error(f"{flag}: unknown {item!r}; known: {', '.join(known)}")
    out.append(by_name.get(item, item))
  if not out:
    p.error(f"{flag}: empty; known: {', '.join(known)}")
  return list(dict.fromkeys(out))


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--shapes", default="tiny,small", help=f"comma-separated, of {', '.join(SHAPES)}")
  p.add_argument(
    "--contestants",
    default=",".join(CONTESTANTS),
    help="comma-separated, of " + ", ".join(f"{k} ({v})" for k, v in CONTESTANTS.items()),
  )
  p.add_argument("--steps", type=int, default=10, help="timed forward calls per contestant")
  p.add_argument("--warmup", type=int, default=2, help="untimed calls after building")
  p.add_argument("--rounds", type=int, default=2, help="alternation rounds")
  p.add_argument("--e2e_lines", type=int, default=2000, help="lines of the generated text file")
  p.add_argument("--e2e_passes", type=int, default=3, help="timed end-to-end passes (median)")
  p.add_argument("--text", default="", help="embed this .txt file end to end instead")
  p.add_argument(
    "--e2e_shapes",
    default="tiny,small",
    help="shapes the end-to-end contestant runs at (the paper shape's pass takes ~6 min here)",
  )
  p.add_argument("--out", default="runs/bench/embed")
  p.add_argument(
    "--dry_run",
    action="store_true",
    help=f"a tiny shape ({DRY}), 2 calls, 64 lines: seconds, for tests",
  )
  args = p.parse_args(argv)
  shape_names = parse_list(p, "--shapes", args.shapes, SHAPES)
  keys = parse_list(p, "--contestants", args.contestants, CONTESTANTS)
  for flag in ("steps", "warmup", "rounds", "e2e_lines", "e2e_passes"):
    least = 0 if flag == "warmup" else 1
    if getattr(args, flag) < least:
      p.error(f"--{flag}: expected >= {least}, got {getattr(args, flag)}")
  if args.text and not os.path.isfile(args.text):
    p.error(f"--text: no such file {args.text!r}")
  torch_too = any(k != "ours" and k != "e2e" for k in keys)
  if torch_too:
    try:
      import torch
      import transformers  # noqa: F401
    except ImportError as e:
      p.error(f"the HF peers need the bench extra: pip install -e '.[bench]' ({e})")
    torch.set_num_threads(os.cpu_count() or 1)
  shapes = {name: SHAPES[name] for name in shape_names}
  steps, warmup, rounds = args.steps, args.warmup, args.rounds
  e2e_args = {"lines": args.e2e_lines, "passes": args.e2e_passes, "text": args.text or None}
  if args.dry_run:
    shapes, steps, warmup, rounds = {"dry": DRY}, 2, 1, 1
    e2e_args.update(lines=64, passes=1)
  start, load_before = time.perf_counter(), os.getloadavg()
  n, secs = (256, 0.2) if args.dry_run else (2048, 2.0)
  peaks = {k: [v] for k, v in matmul_peaks(torch_too, n, secs).items()}
  print(
    "matmul peak: " + ", ".join(f"{k} {v[0] / 1e9:.1f}" for k, v in peaks.items()) + " GFLOP/s",
    flush=True,
  )
  os.makedirs(args.out, exist_ok=True)
  e2e_at = {x.strip() for x in args.e2e_shapes.split(",") if x.strip()}
  res = {}
  for name, s in shapes.items():  # each finished shape is kept on disk (embed.partial.json)
    here = [k for k in keys if k != "e2e" or name in e2e_at or args.dry_run]
    res[name] = run_shape(name, s, here, steps, warmup, rounds, e2e_args)
    with open(os.path.join(args.out, "embed.partial.json"), "w") as f:
      json.dump({"peaks": peaks, "results": res}, f, indent=2)
  for k, v in matmul_peaks(torch_too, n, secs).items():
    peaks[k].append(v)
  peak = max(max(v) for v in peaks.values())
  for r in res.values():
    for v in r.values():
      if "model_flops_per_s" in v:
        v["mfu"] = v["model_flops_per_s"] / peak
  rat = ratios(res)
  table = markdown(res, rat, shapes, peak, peaks, n)
  print("\n" + table)
  versions = {"jax": __import__("jax").__version__}
  for mod in ("torch", "transformers"):
    if mod in sys.modules:
      versions[mod] = sys.modules[mod].__version__
  info = {
    "results": res,
    "ratios": rat,
    "peak_flops": peak,
    "peaks": peaks,
    "target": {"contestant": CONTESTANTS[TARGET[0]], "min_ratio": TARGET[1]},
    "shapes": {name: dataclasses.asdict(s) for name, s in shapes.items()},
    "steps": steps,
    "rounds": rounds,
    "dry_run": args.dry_run,
    "versions": versions,
    "cpu_count": os.cpu_count(),
    "loadavg_before_after": [load_before, os.getloadavg()],
    "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    "wall_s": time.perf_counter() - start,
  }
  with open(os.path.join(args.out, "embed.json"), "w") as f:
    json.dump(info, f, indent=2)
  with open(os.path.join(args.out, "embed.md"), "w") as f:
    f.write(table + "\n")
  plot(res, os.path.join(args.out, "embed.png"), os.path.join(args.out, ".matplotlib"))
  os.remove(os.path.join(args.out, "embed.partial.json"))
  print(
    f"\npeak RSS {info['peak_rss_mb']:.0f} MB; wall {info['wall_s']:.0f} s; load average "
    f"{load_before[0]:.1f} -> {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; "
    f"written to {args.out}/embed.{{json,md,png}}"
  )
  return info


if __name__ == "__main__":
  main()
