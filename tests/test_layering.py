"""The package's import graph: no circles, and no module imports one above it in the layering.

Read from the source with `ast` (imports inside functions count: they are arrows too), so the
test needs no imports of the package. Layers, bottom to top:
  0  building blocks: models, data, sharding, checkpoint, optim, metrics, masking, scaling (not the
     sweep driver), errors, progress, provenance, plotting, hardware, guard, distributed,
     peer_watch, workdir, workdir_lock, planned_devices
  1  steps, state, evaluators, config_lib, report (with report_fits, report_plots,
     report_chinchilla), scaling.members, scaling.planner
  2  train, evaluate, sweep (the in-process sweep driver)
  3  main
  4  the launcher (launch/, which starts the package's commands): members, compile_check;
     5 backends; 6 snapshot; 7 jobs; 8 sweep (the CLI)
A module may import its own layer or lower ones. A new module must be given a layer here.
"""

import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("cbert_jax", "launch")

LAYER_OF_PREFIX = {  # longest matching prefix wins
  "cbert_jax": 0,
  "cbert_jax.models": 0,
  "cbert_jax.data": 0,
  "cbert_jax.scaling": 0,
  "cbert_jax.steps": 1,
  "cbert_jax.state": 1,
  "cbert_jax.evaluators": 1,
  "cbert_jax.config_lib": 1,
  "cbert_jax.report": 1,
  "cbert_jax.report_fits": 1,  # reads probe results with evaluators.suite
  "cbert_jax.report_plots": 1,
  "cbert_jax.report_chinchilla": 1,
  "cbert_jax.scaling.members": 1,  # a sweep's members, resolved: it sits with config_lib
  "cbert_jax.scaling.planner": 1,  # resolves the sweep's member configs (config_lib, members)
  "cbert_jax.train": 2,
  "cbert_jax.evaluate": 2,
  "cbert_jax.sweep": 2,
  "cbert_jax.trained": 2,  # a run read back from its workdir (beside evaluate)
  "cbert_jax.validation": 2,  # the full-split validation loss (the trainer's end, a CLI)
  "cbert_jax.main": 3,
  "cbert_jax.embed": 3,
  "cbert_jax.export": 3,  # the entry points
  "launch": 4,
  "launch.members": 4,
  "launch.compile_check": 4,
  "launch.backends": 5,
  "launch.snapshot": 6,
  "launch.jobs": 7,
  "launch.sweep": 8,
}
LAYER_ZERO = (
  "sharding",
  "checkpoint",
  "optim",
  "metrics",
  "masking",
  "errors",
  "progress",
  "provenance",
  "plotting",
  "hardware",
  "guard",
  "distributed",
  "peer_watch",
  "workdir",
  "workdir_lock",
  "planned_devices",
  "mesh_shape",
)
for _name in LAYER_ZERO:
  LAYER_OF_PREFIX[f"cbert_jax.{_name}"] = 0


def modules() -> dict[str, str]:
  out = {}
  for package in PACKAGES:
    for directory, _, files in os.walk(os.path.join(ROOT, package)):
      for f in files:
        if f.endswith(".py"):
          path = os.path.join(directory, f)
          name = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
          out[name.removesuffix(".__init__")] = path
  return out


def imports(name: str, path: str, known: dict[str, str]) -> set[str]:
  """The package modules `name` imports (module level or inside functions)."""
  out = set()
  is_package = path.endswith("__init__.py")
  for node in ast.walk(ast.parse(open(path).read())):
    if isinstance(node, ast.Import):
      out |= {a.name for a in node.names}
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        parts = name.split(".")
        parts = parts[: len(parts) - node.level + (1 if is_package else 0)]
        base = ".".join(parts + ([node.module] if node.module else []))
      for a in node.names:
        out.add(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base)
  return {m for m in out if m in known and m != name}


def graph() -> dict[str, set[str]]:
  known = modules()
  return {m: imports(m, p, known) for m, p in known.items()}


def layer(module: str) -> int:
  best = max((p for p in LAYER_OF_PREFIX if module == p or module.startswith(p + ".")), key=len)
  return LAYER_OF_PREFIX[best]


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
  """Strongly connected components with more than one module (Tarjan)."""
  index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

  def visit(v):
    index[v] = low[v] = counter[0]
    counter[0] += 1
    stack.append(v)
    on.add(v)
    for w in g[v]:
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      comp = []
      while True:
        w = stack.pop()
        on.discard(w)
        comp.append(w)
        if w == v:
          break
      if len(comp) > 1:
        out.append(sorted(comp))

  for v in sorted(g):
    if v not in index:
      visit(v)
  return out


def test_the_import_graph_sees_known_arrows():
  """The reader itself: a few arrows that must be there (else the checks below prove nothing)."""
  g = graph()
  assert "cbert_jax.state" in g["cbert_jax.train"]
  assert "cbert_jax.data.text" in g["cbert_jax.data.corpus"]
  assert "cbert_jax.models.model_config" in g["cbert_jax.scaling.plan"]
  assert "cbert_jax.mesh_shape" in g["cbert_jax.scaling.plan"]
  assert "launch.jobs" in g["launch.sweep"] and "launch.members" in g["launch.backends"]
  assert "cbert_jax.config_lib" in g["launch.members"]  # imported inside a function


def test_no_import_circle():
  assert cycles(graph()) == []


def test_no_module_imports_a_higher_layer():
  g = graph()
  upward = [
    f"{m} (layer {layer(m)}) -> {d} (layer {layer(d)})"
    for m in sorted(g)
    for d in sorted(g[m])
    if layer(d) > layer(m)
  ]
  assert upward == []


def test_cycle_finder_finds_a_planted_circle():
  g = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
  assert cycles(g) == [["a", "b", "c"]]
