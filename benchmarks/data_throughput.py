r"""Data-path throughput next to the train step's consumption (prints numbers; not a test).

  python benchmarks/data_throughput.py [--out runs/bench/data_throughput.json] [--mb 8]

Measures, on this machine:
  * preprocessing (read JSONL -> normalise -> split -> tokenise -> pack -> ArrayRecord)
    in tokens/s with 1 worker and with all cores;
  * the training loader (`pipeline.train_iterator`) in tokens/s at global batch 32 and 16
    x seq 128, over in-memory arrays and over the ArrayRecord shards;
  * jitted train steps of the smoke model (d128L4) and a small one (d256L4), BERT and
    CrossBERT, batch 32 x seq 128 (median of a few steps after compiling);
and prints loader tokens/s / step tokens/s, which should be >= 20x so the input pipeline
never limits training. Input: tests/fixtures/tiny_corpus.txt repeated into --mb MB of JSONL.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

TINY = os.path.join(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
  "tests",
  "fixtures",
  "tiny_corpus.txt",
)
SEQ = 128


def _corpus(directory: str, mb: int, files: int = 8) -> None:
  """Writes ~`mb` MB of JSONL in `files` files (paragraphs of the tiny corpus, numbered)."""
  paras = [p for p in open(TINY, encoding="utf-8").read().split("\n\n") if len(p) > 60]
  per_file = mb * (1 << 20) // files
  i = 0
  for f in range(files):
    size = 0
    with open(os.path.join(directory, f"part-{f:03d}.jsonl"), "w") as out:
      while size < per_file:
        line = json.dumps({"text": f"{i} " + paras[i % len(paras)]}) + "\n"
        out.write(line)
        size += len(line)
        i += 1


def _preprocess(work: str, tok, workers: int) -> tuple[float, dict]:
  import ml_collections  # pylint: disable=g-import-not-at-top

  from cbert_jax.data import shards, sources  # pylint: disable=g-import-not-at-top

  out = os.path.join(work, f"packed-{workers}")
  shutil.rmtree(out, ignore_errors=True)
  cfg = ml_collections.ConfigDict(dict(sources=os.path.join(work, "in", "*.jsonl")))
  srcs = sources.expand_sources(cfg)
  start = time.perf_counter()
  index = shards.build(
    srcs,
    sources.ReadOptions(),
    tokenizer=tok,
    seq_len=SEQ,
    out_dir=out,
    split_seed=0,
    val_fraction=0.01,
    shard_bytes=1,
    workers=workers,
  )
  seconds = time.perf_counter() - start
  tokens = sum(index["manifest"]["tokens"].values())
  return tokens / seconds, index


def _loader(rows, global_batch: int, batches: int = 300) -> float:
  from cbert_jax.data import pipeline  # pylint: disable=g-import-not-at-top

  it = pipeline.train_iterator(
    rows, global_batch=global_batch, seed=0, process_index=0, process_count=1
  )
  for _ in range(20):  # warm up threads, readers and prefetch
    next(it)
  start = time.perf_counter()
  for _ in range(batches):
    next(it)
  return batches * global_batch * SEQ / (time.perf_counter() - start)


def _train_step(
  model: str,
  size: str,
  vocab: int,
  mask_id: int,
  special: tuple[int, ...],
  batch: dict,
  steps: int = 5,
) -> float:
  """Median seconds per jitted train step (after compile)."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from flax import nnx  # pylint: disable=g-import-not-at-top

  from cbert_jax import config_lib  # pylint: disable=g-import-not-at-top
  from cbert_jax.models import FAMILIES  # pylint: disable=g-import-not-at-top
  from cbert_jax.step import optim, sharding
  from cbert_jax.step import steps as steps_lib  # pylint: disable=g-import-not-at-top

  sys.path.insert(0, os.path.join(os.path.dirname(TINY), "..", ".."))
  from experiments import smoke  # pylint: disable=g-import-not-at-top

  config = smoke.get_config(f"model={model},size={size}")
  config = config_lib.resolve(config)
  model_cfg, mask_cfg = config_lib.model_configs(config, vocab, mask_id, special)
  tx, lr = optim.make_optimizer(config.optim, config.total_steps)
  # One device, as the trainer sets it up (mesh + logical rules for the param annotations).
  mesh = sharding.make_mesh(config.mesh, config.mesh_dcn, jax.devices()[:1])
  rules = tuple(tuple(r) for r in config.sharding_rules)
  with jax.set_mesh(mesh), nnx.logical_axis_rules(rules):
    m = FAMILIES[model](model_cfg, mask_cfg, nnx.Rngs(params=jax.random.key(0)))
    graphdef, params = nnx.split(m, nnx.Param)
    opt_state = tx.init(params)
    step_fn = jax.jit(steps_lib.make_train_step(graphdef, tx, lr), donate_argnums=(0, 1))
    batch = {k: jnp.asarray(v) for k, v in batch.items()}
    key = jax.random.key(1)
    params, opt_state, metrics = step_fn(params, opt_state, batch, jnp.int32(0), key)
    jax.block_until_ready(metrics)
    times = []
    for s in range(1, steps + 1):
      start = time.perf_counter()
      params, opt_state, metrics = step_fn(params, opt_state, batch, jnp.int32(s), key)
      jax.block_until_ready(metrics)
      times.append(time.perf_counter() - start)
  return float(np.median(times))


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--out", default="runs/bench/data_throughput.json")
  parser.add_argument("--mb", type=int, default=8, help="MB of JSONL to preprocess")
  parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
  parser.add_argument("--skip_steps", action="store_true", help="data only")
  args = parser.parse_args()

  import ml_collections  # pylint: disable=g-import-not-at-top

  from cbert_jax.data import corpus as corpus_lib  # pylint: disable=g-import-not-at-top
  from cbert_jax.data import shards  # pylint: disable=g-import-not-at-top
  from cbert_jax.data import text as text_lib  # pylint: disable=g-import-not-at-top
  from cbert_jax.data import tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top

  work = tempfile.mkdtemp(prefix="cbert_bench_")
  os.makedirs(os.path.join(work, "in"))
  _corpus(os.path.join(work, "in"), args.mb)
  docs = [
    " ".join(p.split()) for p in open(TINY, encoding="utf-8").read().split("\n\n") if len(p) > 60
  ]
  tok = tokenizer_lib.get_tokenizer(
    ml_collections.ConfigDict(
      dict(
        tokenizer_path="",
        vocab_size=4096,
        tokenizer_type="bpe",
        tokenizer_sample_chars=20_000_000,
        cache_dir=os.path.join(work, "cache"),
      )
    ),
    corpus_lib.Corpus(docs, [], dict(content_hash=text_lib.content_hash([docs]))),
  )

  results: dict = dict(
    machine=dict(cpus=os.cpu_count()),
    input_mb=args.mb,
    seq_len=SEQ,
    vocab=tok.vocab_size,
    preprocess={},
    loader={},
    step={},
  )
  for w in sorted({1, args.workers}):
    tps, index = _preprocess(work, tok, w)
    results["preprocess"][f"workers={w}"] = tps
  rows_ar = shards.row_sources(os.path.join(work, f"packed-{args.workers}"), index)["train"]
  rows_mem = rows_ar.read(np.arange(len(rows_ar)))
  results["rows"] = len(rows_ar)
  for gb in (32, 16):
    results["loader"][f"memory gb={gb}"] = _loader(rows_mem, gb)
    results["loader"][f"array_record gb={gb}"] = _loader(rows_ar, gb)

  if not args.skip_steps:
    import jax  # pylint: disable=g-import-not-at-top

    results["machine"]["device"] = str(jax.devices()[0].device_kind)
    batch = {k: v[:32] for k, v in rows_mem.items()}
    for model in ("bert", "crossbert"):
      for size in ("d128L4", "d256L4"):
        sec = _train_step(model, size, tok.vocab_size, tok.mask_id, tok.special_ids, batch)
        results["step"][f"{model} {size} b32"] = 32 * SEQ / sec

  slowest_loader = min(v for k, v in results["loader"].items() if "gb=32" in k)
  lines = ["| measurement | tokens/s | loader / step |", "|---|---:|---:|"]
  for k, v in results["preprocess"].items():
    lines.append(f"| preprocess {k} | {v:,.0f} | |")
  for k, v in results["loader"].items():
    lines.append(f"| loader {k} | {v:,.0f} | |")
  results["ratio"] = {}
  for k, v in results["step"].items():
    ratio = slowest_loader / v
    results["ratio"][k] = ratio
    lines.append(
      f"| train step {k} | {v:,.0f} | {ratio:,.1f}x{'' if ratio >= 20 else ' (< 20x!)'} |"
    )
  table = "\n".join(lines)
  print(table)
  results["table"] = table
  os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
  with open(args.out, "w") as f:
    json.dump(results, f, indent=1)
  print(f"wrote {args.out}")
  shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
  main()
