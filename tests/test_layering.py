"""The package's import graph: no circles, and no module imports one above it in the layering.

Read from the source with `ast` (imports inside functions count: they are arrows too), so the
test needs no imports of the package. Every folder of `cbert_jax/` and every top-level module has
exactly one layer, bottom to top:
  0  errors (and the package's __init__)
  1  models/ (the model families, masking, FLOPs), data/ (corpora, tokenizer, task kit)
  2  step/ (what gets compiled: state, steps, optimizer, guard, mesh and sharding)
  3  scaling/ (JAX-free maths: plans, budgets, laws, memory, fits), evaluators/ (probes)
  4  config_groups (the fields, one builder per group), config_lib (the config: loaded, checked,
     resolved with scaling/'s plan)
  5  run/ (a run's life on hosts and disk, and reading a run back)
  6  train, evaluate, embed, export/, report/ (what a run or a set of runs produces)
  7  sweep/ (experiment, planner, runner: trains, probes and reports members)
  8  main
  9  the launcher (launch/, which starts the package's commands): members, compile_check,
     commit_check;
     10 backends; 11 snapshot; 12 jobs; 13 sweep (the CLI)
A module may import its own layer or lower ones. There is no default: a module whose folder (or
top-level name) is not in `LAYER` fails the test until it is given a layer here.
"""

import ast
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("cbert_jax", "launch")

LAYER = {  # a cbert_jax folder or top-level module, or a launch module -> its layer
  "cbert_jax": 0,
  "cbert_jax.errors": 0,
  "cbert_jax.models": 1,
  "cbert_jax.data": 1,
  "cbert_jax.step": 2,
  "cbert_jax.scaling": 3,
  "cbert_jax.evaluators": 3,
  "cbert_jax.config_groups": 4,
  "cbert_jax.config_lib": 4,
  "cbert_jax.run": 5,
  "cbert_jax.train": 6,
  "cbert_jax.evaluate": 6,
  "cbert_jax.embed": 6,
  "cbert_jax.export": 6,
  "cbert_jax.report": 6,
  "cbert_jax.sweep": 7,
  "cbert_jax.main": 8,
  "launch": 9,
  "launch.members": 9,
  "launch.compile_check": 9,
  "launch.commit_check": 9,
  "launch.backends": 10,
  "launch.snapshot": 11,
  "launch.jobs": 12,
  "launch.sweep": 13,
}
# At most this many modules directly in cbert_jax/ (besides __init__): the rest live in folders.
MAX_TOP_LEVEL = 8


def place(module: str) -> str | None:
  """The `LAYER` key of a module: its cbert_jax folder or top-level name (cbert_jax.run.workdir ->
  cbert_jax.run), the launch module itself; None when it has none."""
  parts = module.split(".")
  key = ".".join(parts[:2]) if parts[0] == "cbert_jax" else module
  return key if key in LAYER else None


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
  key = place(module)
  if key is None:
    raise KeyError(f"{module} has no layer: give its folder or name one in LAYER")
  return LAYER[key]


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
  assert "cbert_jax.step.state" in g["cbert_jax.train"]
  assert "cbert_jax.data.text" in g["cbert_jax.data.corpus"]
  assert "cbert_jax.models.model_config" in g["cbert_jax.scaling.plan"]
  assert "cbert_jax.step.mesh_shape" in g["cbert_jax.scaling.plan"]
  assert "launch.jobs" in g["launch.sweep"] and "launch.members" in g["launch.backends"]
  assert "cbert_jax.config_lib" in g["launch.members"]  # imported inside a function


def test_every_module_has_a_layer_and_the_top_level_is_small():
  known = modules()
  assert [m for m in sorted(known) if place(m) is None] == []
  top = [m for m, p in known.items() if m.count(".") == 1 and m.startswith("cbert_jax.")]
  top = [m for m in top if not known[m].endswith("__init__.py")]
  assert len(top) <= MAX_TOP_LEVEL, sorted(top)


def test_a_new_module_without_a_layer_fails():
  """A module dropped into cbert_jax/ (or launch/) is not placed anywhere by default."""
  assert place("cbert_jax.run.new_reader") == "cbert_jax.run"  # a folder places its modules
  for new in ("cbert_jax.new_module", "cbert_jax.new_folder.thing", "launch.new_cli"):
    assert place(new) is None
    with pytest.raises(KeyError, match=f"{new} has no layer"):
      layer(new)


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
