"""MTEB (the `mteb` package, v2 API) around our frozen encoder: `CbertEncoder` and `run`.

`CbertEncoder` implements mteb's `EncoderProtocol`: `encode(inputs: DataLoader, *, task_metadata,
hf_split, hf_subset, prompt_type)` returns one embedding per text, computed by the same code as
the offline suite: `features.encode_texts` (truncated to `evals.seq_len`), then either the
mean-pooled final layer (`Featurizer`, embedding "mean") or a trained contrastive pooler on the
frozen backbone (`pooler.embed`, embedding "pooler"); `similarity` / `similarity_pairwise` are
cosine. The encoder is symmetric: queries and passages are embedded alike, without prompts.
mteb then runs its own protocol per task type (logistic regression for classification, cosine
for STS / retrieval / clustering), so the scores are comparable with the MTEB leaderboard.

`run` evaluates a benchmark (default "MTEB(eng, v2)", 41 tasks) with mteb's result cache in
`<workdir>/eval/mteb`, so an interrupted run redoes only the missing tasks. The task data comes
from the Hugging Face hub on first use (internet once); on CPU the full benchmark takes many
hours for even a small model, so it is meant for accelerator hosts. `mteb` (and the torch it
imports) is an optional extra: `pip install -e '.[mteb]'`.

Tests run `run` offline on tiny local mteb tasks (tests/evaluators/test_mteb.py).
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from absl import logging

from cbert_jax.data.tasks import tfds as task_tfds
from cbert_jax.errors import ConfigError
from cbert_jax.evaluators import features as features_lib
from cbert_jax.evaluators import pooler as pooler_lib
from cbert_jax.evaluators import suite

EMBEDDINGS = ("mean", "pooler")


def import_mteb():
  """`mteb`, or a ConfigError that says how to install it (before any model work)."""
  try:
    import mteb  # pylint: disable=import-outside-toplevel
  except ImportError as e:
    raise ConfigError(
      f"evals.suites=mteb needs the `mteb` package: pip install -e '.[mteb]' ({e})"
    ) from e
  return mteb


def _unit(x: np.ndarray) -> np.ndarray:
  x = np.asarray(x, np.float32)
  return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


class CbertEncoder:
  """mteb's EncoderProtocol over a frozen cbert_jax encoder (+ an optional trained pooler).

  Attributes:
    mteb_model_meta: the `mteb.ModelMeta` mteb names results by (set by `model_meta`).
    num_texts: texts encoded so far (for logs and tests).
  """

  mteb_model_meta = None

  def __init__(
    self,
    graphdef,
    params,
    tokenizer,
    *,
    seq_len: int,
    batch_size: int,
    pooler_params=None,
    mesh=None,
    rules=None,
    layer: int = -1,
  ):
    """Args:
    graphdef, params: the backbone, as `nnx.split(model, nnx.Param)` (only read).
    tokenizer: anything with `encode_batch(texts) -> list[list[int]]`.
    seq_len: tokens per text (longer texts are truncated).
    batch_size: texts per compiled feature step.
    pooler_params: a trained `AttentionPooler`'s params; None = mean-pooled final layer.
    mesh, rules: as `Featurizer` (mean embedding only).
    layer: the backbone layer read (-1 = final; see steps.select_layer).
    """
    self.graphdef, self.params, self.tokenizer = graphdef, params, tokenizer
    self.seq_len, self.batch_size, self.pooler_params = int(seq_len), int(batch_size), pooler_params
    self.layer = int(layer)
    self._featurizer = (
      None
      if pooler_params is not None
      else features_lib.Featurizer(
        graphdef,
        params,
        batch_size=batch_size,
        seq_len=seq_len,
        layers="final",
        mesh=mesh,
        rules=rules,
        layer=layer,
      )
    )
    self.num_texts = 0

  def embed_texts(self, texts: Sequence[str]) -> np.ndarray:
    """[N, p] float32 embeddings of N texts (the pooler's are unit length)."""
    rows = features_lib.encode_texts(list(texts), self.tokenizer, self.seq_len)
    self.num_texts += len(texts)
    if self._featurizer is not None:
      return self._featurizer(rows)  # [N, d]
    return pooler_lib.embed(
      self.graphdef, self.params, self.pooler_params, rows, self.batch_size, self.layer
    )  # [N, p]

  def encode(
    self,
    inputs,
    *,
    task_metadata=None,
    hf_split: str = "",
    hf_subset: str = "",
    prompt_type=None,
    **kwargs: Any,
  ) -> np.ndarray:
    """Embeddings of every text the DataLoader yields, in order: float32 [N, p].

    Documents arrive as "title text" already joined by mteb; no prompt is added (symmetric).
    """
    del task_metadata, hf_split, hf_subset, prompt_type, kwargs
    texts: list[str] = []
    for batch in inputs:
      if "text" not in batch:
        raise ConfigError(f"mteb: this encoder reads text only; got a batch with {sorted(batch)}")
      texts.extend(str(t) for t in batch["text"])
    return self.embed_texts(texts)

  def similarity(self, embeddings1, embeddings2) -> np.ndarray:
    """Cosine similarity matrix [N1, N2]."""
    return _unit(embeddings1) @ _unit(embeddings2).T

  def similarity_pairwise(self, embeddings1, embeddings2) -> np.ndarray:
    """Cosine similarity of row i with row i: [N]."""
    return np.sum(_unit(embeddings1) * _unit(embeddings2), axis=-1)


def model_meta(encoder: CbertEncoder, *, name: str, revision: str, max_tokens: int):
  """The mteb ModelMeta of an encoder: parameter count and embedding width are computed."""
  import_mteb()
  n_params = int(sum(np.size(x) for x in jax.tree.leaves(encoder.params)))
  probe = encoder.embed_texts(["a"])  # [1, p]
  encoder.num_texts -= 1
  from mteb.models.model_meta import ModelMeta  # pylint: disable=import-outside-toplevel

  return ModelMeta(
    loader=None,
    name=name,
    revision=revision,
    model_type=["dense"],
    embed_dim=int(probe.shape[-1]),
    similarity_fn_name="cosine",
    languages=["eng-Latn"],
    open_weights=True,
    release_date=None,
    n_parameters=n_params,
    n_embedding_parameters=None,
    memory_usage_mb=None,
    license=None,
    max_tokens=max_tokens,
    reference=None,
    framework=["JAX"],
    use_instructions=False,
    public_training_code=None,
    public_training_data=None,
    training_datasets=set(),
    modalities=["text"],
  )


def kit_retrieval_pooler(graphdef, params, tokenizer, ecfg, *, cache_dir: str = ""):
  """A frozen contrastive pooler trained on the dev pairs of the retrieval tasks in `evals.tasks`.

  MTEB has no training split for most tasks, so the pooler learns from our own retrieval pairs
  (by default question_passage and entailment_retrieval) with the suite's pooler settings.
  Returns (pooler_params, loss history).
  """
  qa, db, names = [], [], []
  for name in suite.task_names(ecfg):
    task = task_tfds.load_task(name, cache_dir=cache_dir)
    if task.kind == "retrieval":
      a, b = suite.dev_pairs(task, ecfg)
      qa, db, names = qa + a, db + b, names + [name]
  if len(qa) < 2:
    raise ConfigError(
      f"evals.mteb_embedding=pooler: the retrieval tasks of evals.tasks ({names}) "
      f"gave {len(qa)} training pairs; need >= 2"
    )
  enc = lambda texts: features_lib.encode_texts(texts, tokenizer, ecfg.seq_len)
  pooler_params, _, history = pooler_lib.train_pooler(
    graphdef,
    params,
    enc(qa),
    enc(db),
    frozen=True,
    steps=int(ecfg.get("pooler_steps", 200)),
    batch_size=ecfg.batch_size,
    lr_pooler=float(ecfg.get("pooler_lr", 1e-3)),
    temperature=float(ecfg.get("pooler_temperature", 0.05)),
    seed=0,
    layer=suite.layer_of(ecfg),
    init=ecfg.get("pooler_init", "fresh"),
  )
  return pooler_params, history


def select_tasks(ecfg) -> list:
  """The mteb task objects of `evals.mteb_benchmark`, narrowed by `evals.mteb_tasks`."""
  mteb = import_mteb()
  try:
    benchmark = mteb.get_benchmark(ecfg.get("mteb_benchmark", "MTEB(eng, v2)"))
  except Exception as e:  # mteb raises KeyError/ValueError with suggestions; keep one line
    raise ConfigError(f"evals.mteb_benchmark: {e}") from e
  tasks = list(benchmark.tasks)
  wanted = [t.strip() for t in str(ecfg.get("mteb_tasks", "")).split(",") if t.strip()]
  if wanted:
    by_name = {t.metadata.name: t for t in tasks}
    missing = [w for w in wanted if w not in by_name]
    if missing:
      raise ConfigError(
        f"evals.mteb_tasks: {missing} are not in {benchmark.name}; it has "
        f"{', '.join(sorted(by_name))}"
      )
    tasks = [by_name[w] for w in wanted]
  return tasks


def check(ecfg) -> None:
  """Config checks for the mteb suite, run before any model is built."""
  embedding = ecfg.get("mteb_embedding", "mean")
  if embedding not in EMBEDDINGS:
    raise ConfigError(f"evals.mteb_embedding: expected one of {EMBEDDINGS}, got {embedding!r}")
  select_tasks(ecfg)


def run(
  graphdef,
  params,
  tokenizer,
  ecfg,
  *,
  out_dir: str,
  name: str,
  revision: str,
  cache_dir: str = "",
  mesh=None,
  rules=None,
  tasks: Sequence | None = None,
) -> dict:
  """An mteb benchmark on the frozen encoder; results cached under `out_dir`.

  Args:
    tasks: mteb task objects (tests pass tiny local ones); default `select_tasks(ecfg)`.
    name, revision: how mteb names the model in its results (e.g. "cbert_jax/crossbert-d128L4",
      "step_300").
  Returns:
    {task name: {"type", "main_score" (name), "score", "dataset", "dataset_revision", "splits",
     "mteb_file" (mteb's TaskResult file, relative to out_dir)}, "average": {"all", per type},
     "failed": {task: error}} (failures are recorded, the other tasks go on).
  """
  mteb = import_mteb()
  tasks = list(tasks) if tasks is not None else select_tasks(ecfg)
  pooler_params = None
  if ecfg.get("mteb_embedding", "mean") == "pooler":
    pooler_params, history = kit_retrieval_pooler(
      graphdef, params, tokenizer, ecfg, cache_dir=cache_dir
    )
    logging.info(
      "mteb: pooler trained, InfoNCE %.3f -> %.3f", history[0]["loss"], history[-1]["loss"]
    )
    if jax.process_index() == 0:  # kept, so `cbert_jax.embed --pooler` embeds with it
      os.makedirs(out_dir, exist_ok=True)
      pooler_path = os.path.join(out_dir, f"pooler-{revision}.npz")
      pooler_lib.save(pooler_path, pooler_params, layer=suite.layer_of(ecfg))
      logging.info("mteb: pooler saved to %s", pooler_path)
  encoder = CbertEncoder(
    graphdef,
    params,
    tokenizer,
    seq_len=ecfg.seq_len,
    batch_size=ecfg.batch_size,
    pooler_params=pooler_params,
    mesh=mesh,
    rules=rules,
    layer=suite.layer_of(ecfg),
  )
  encoder.mteb_model_meta = model_meta(
    encoder, name=name, revision=revision, max_tokens=int(ecfg.seq_len)
  )
  start = time.perf_counter()
  model_result = mteb.evaluate(
    encoder,
    tasks,
    cache=mteb.ResultCache(out_dir),
    overwrite_strategy="only-missing",
    raise_error=False,
    show_progress_bar=False,
    encode_kwargs={"batch_size": int(ecfg.batch_size)},
  )
  cache = mteb.ResultCache(out_dir)
  results: dict = {}
  for tr in model_result.task_results:
    task = next(t for t in tasks if t.metadata.name == tr.task_name)
    dataset = dict(task.metadata.dataset or {})
    # mteb's own result file (a TaskResult: mteb.TaskResult.from_disk, the leaderboard's format),
    # relative to out_dir; the model card's metadata (cbert_jax.export) is built from these fields
    mteb_file = cache.get_task_result_path(tr.task_name, encoder.mteb_model_meta)
    results[tr.task_name] = {
      "type": task.metadata.type,
      "main_score": task.metadata.main_score,
      "score": float(tr.get_score()),
      "dataset": dataset.get("path"),
      "dataset_revision": dataset.get("revision"),
      "splits": list(task.metadata.eval_splits),
      "mteb_file": os.path.relpath(mteb_file, out_dir),
    }
  failed = {
    str(getattr(e, "task_name", i)): f"{type(e).__name__}: {e}"
    for i, e in enumerate(model_result.exceptions or [])
  }
  by_type: dict[str, list[float]] = {}
  for r in results.values():
    by_type.setdefault(r["type"], []).append(r["score"])
  results["average"] = {
    "all": float(np.mean([r["score"] for r in results.values()])) if results else float("nan"),
    **{t: float(np.mean(v)) for t, v in sorted(by_type.items())},
  }
  results["failed"] = failed
  logging.info(
    "mteb: %d tasks in %.0f s, %d texts encoded, %d failed",
    sum(len(v) for v in by_type.values()),
    time.perf_counter() - start,
    encoder.num_texts,
    len(failed),
  )
  return results


def markdown(results: dict, title: str = "") -> str:
  """One row per task (type, main score), the averages, and any failures."""
  lines = [f"### {title}", ""] if title else []
  lines += ["| task | type | main score | value |", "|---|---|---|---|"]
  for name, r in results.items():
    if name not in ("average", "failed"):
      lines.append(f"| {name} | {r['type']} | {r['main_score']} | {r['score']:.4f} |")
  avg = results.get("average", {})
  lines += ["", "average: " + ", ".join(f"{k} {v:.4f}" for k, v in avg.items())]
  for name, err in results.get("failed", {}).items():
    lines.append(f"failed: {name}: {err}")
  return "\n".join(lines)
