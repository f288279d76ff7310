"""The evaluation suites by name (`evals.suites`), each with the same three entry points.

`SUITES[name]` is a `Suite`: `check(ecfg)` validates its `evals.*` settings (ConfigError naming
the field) before any model is built; `run(graphdef, params, tokenizer, ecfg, ctx)` returns its
results dict; `markdown(results, title)` renders them. `evaluate.py` loops over the suites a run
asks for; adding a suite is one entry here. The suite modules keep their own richer signatures
(tests and the trainer's online probes call them directly); the adapters below only unify them.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any

from cbert_jax.errors import ConfigError
from cbert_jax.evaluators import glue, mteb_encoder, suite


@dataclasses.dataclass(frozen=True)
class Context:
  """What a suite run needs besides the model: where data and outputs go, the mesh, its name."""

  cache_dir: str = ""  # the data cache (task kit, TFDS GLUE, downloads)
  out_dir: str = ""  # workdir/eval: files a suite writes itself (MTEB's result tree)
  model_label: str = ""  # e.g. "cbert_jax/crossbert-d128L4" (MTEB's model name)
  tag: str = ""  # e.g. "step_300" (MTEB's revision)
  mesh: Any = None
  rules: Any = None
  # The offline suite only: tasks to refuse ({task: why}: the training corpus was not checked
  # against them), tasks already scored by an earlier run of the same evaluation, and a callback
  # that saves the results after each task.
  unchecked: Any = None
  done: Any = None
  on_task: Any = None


@dataclasses.dataclass(frozen=True)
class Suite:
  name: str
  title: str  # prefix of the markdown title
  file_prefix: str  # eval/<prefix><tag>.json / .md
  check: Callable[[Any], None]
  run: Callable[[Any, Any, Any, Any, Context], dict]
  markdown: Callable[[dict, str], str]


def _offline_run(graphdef, params, tokenizer, ecfg, ctx: Context) -> dict:
  return suite.run(
    graphdef,
    params,
    tokenizer,
    ecfg,
    cache_dir=ctx.cache_dir,
    mesh=ctx.mesh,
    rules=ctx.rules,
    unchecked=ctx.unchecked,
    done=ctx.done,
    on_task=ctx.on_task,
  )


def _glue_run(graphdef, params, tokenizer, ecfg, ctx: Context) -> dict:
  return glue.run(
    graphdef, params, tokenizer, ecfg, cache_dir=ctx.cache_dir, mesh=ctx.mesh, rules=ctx.rules
  )


def _mteb_run(graphdef, params, tokenizer, ecfg, ctx: Context) -> dict:
  return mteb_encoder.run(
    graphdef,
    params,
    tokenizer,
    ecfg,
    out_dir=os.path.join(ctx.out_dir, "mteb"),
    name=ctx.model_label,
    revision=ctx.tag,
    cache_dir=ctx.cache_dir,
    mesh=ctx.mesh,
    rules=ctx.rules,
  )


SUITES: dict[str, Suite] = {
  "offline": Suite("offline", "", "", suite.task_names, _offline_run, suite.markdown),
  "glue": Suite(
    "glue",
    "GLUE: ",
    "glue-",
    lambda ecfg: glue.task_names(ecfg.get("glue_tasks", "")),
    _glue_run,
    glue.markdown,
  ),
  "mteb": Suite("mteb", "MTEB: ", "mteb-", mteb_encoder.check, _mteb_run, mteb_encoder.markdown),
}


def selected(ecfg) -> list[Suite]:
  """The suites `evals.suites` names, in order, each one's settings checked; the offline kit's
  task list is checked in any case (online probes and pooler settings read it)."""
  names = [s.strip() for s in str(ecfg.get("suites", "offline")).split(",") if s.strip()]
  if not names:
    raise ConfigError(f"evals.suites: empty; expected a comma list of {', '.join(SUITES)}")
  for name in names:
    if name not in SUITES:
      raise ConfigError(
        f"evals.suites: unknown suite {name!r}; expected a comma list of {', '.join(SUITES)}"
      )
  chosen = [SUITES[n] for n in dict.fromkeys(names)]
  suite.task_names(ecfg)
  for s in chosen:
    s.check(ecfg)
  return chosen
