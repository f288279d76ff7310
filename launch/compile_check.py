r"""Compile every sweep member's train step for its target devices and mesh, without the hardware.

  python -m launch.compile_check --config experiments/sweep.py            # the paper sweep
  python -m launch.compile_check --config experiments/sweep.py:quick \
      --override=--config.sweep.target_devices=4 --override=--config.mesh.data=1 \
      --override=--config.mesh.fsdp=-1 --override=--config.sweep.batch_size=16 \
      --members bert_d32L2,crossbert_d32L2 --out check.json

For each member of `get_sweep(scale)` (default scale `paper`; an experiment file without
`get_sweep` is one member, `FILE[:arg]`) this builds the trainer's own train step (the model's
abstract parameters and their shardings from `state.setup` (as `train.run`), the optimizer, the fault
guard, `steps.make_train_step`, jitted with the trainer's in/out shardings and donation) for
`sweep.target_devices` devices (0 = this machine's) on the member's configured mesh, lowers it on
abstract arrays (no parameter is allocated) and compiles it. One row per member: devices, mesh
(data x fsdp x tensor), parameters, compile seconds, memory per device from XLA's
`memory_analysis()` (arguments + outputs - aliased (donated) + temporaries, and the parts), and OK
or the error in one line. Exit status 1 if any member failed, 2 for bad usage.

Which compiler: ahead-of-time for a TPU topology needs libtpu (`jax[tpu]`), which builds the
topology's compile-only devices; without it (a CPU-only jaxlib, as here) the step is compiled for a
fake CPU mesh of the same shape: one child process per distinct device count, started with
`XLA_FLAGS=--xla_force_host_platform_device_count=N` (the flag must be set before jax starts).
The first output line says which path was used. On the fake CPU mesh, arguments, outputs and
aliasing are exact per-device byte counts (parameters, AdamW state, batch: they follow the
shardings), but temporaries are XLA:CPU's buffer assignment, whose fusion, scheduling and layouts
differ from TPU's: a rough figure, not a TPU measurement (on this jaxlib it hardly moves with
model.remat, for instance).
`--tpu_topology v5p:2x2x4` asks for the TPU path; where libtpu is missing it stops with a message
saying so (the path itself is untested here: this repo's environment has no libtpu).

Errors are per member and do not stop the others: everything `config_lib.validate` checks (mesh
against the device count, batch against the data-parallel size, model shape), every parameter
dimension against the mesh axes it is sharded over (heads, vocabulary, FFN width against
`tensor`; model width against `fsdp`), and any error from jax while lowering or compiling.

Data: validation must not need the corpus, so a member's `data.sources` (corpus=sources) or
`data.corpus_files` (corpus=files) is replaced, for the check only, by a placeholder text file:
`config_lib.validate` stays the single source of every other check (rather than a copy of its
mesh, batch and model checks here), and nothing of the corpus is read or listed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from typing import Any

import jax  # the parent never starts a jax backend: each child gets its XLA_FLAGS first
from flax import nnx
from jax.experimental import topologies

from cbert_jax import config_lib
from cbert_jax.errors import ConfigError
from cbert_jax.scaling import memory as memory_lib
from cbert_jax.scaling import plan
from cbert_jax.step import sharding
from cbert_jax.step import state as state_lib
from cbert_jax.sweep import experiment as experiment_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHILD_PREFIX = "compile_check:"  # the child's progress lines on stderr, echoed by the parent
FAKE_PATH = "fake CPU mesh (XLA --xla_force_host_platform_device_count=N, one process per N)"
NEEDS_LIBTPU = (
  "--tpu_topology {topology} needs libtpu (pip install 'jax[tpu]'): this jaxlib "
  "cannot build a TPU topology. Rerun without --tpu_topology to compile on a fake CPU "
  "mesh of the same shape."
)


# ------------------------------------------------------------------------- configs ---


def _load_module(path: str):
  """The experiment file as a module (for get_sweep / workdir_name)."""
  return config_lib.import_experiment(path, field="--config", needs=("get_config",))


def member_args(config_spec: str) -> tuple[Any, list[str]]:
  """(experiment module, the get_config args of its members): get_sweep(scale) where the file
  has one (scale default paper), else the single config `FILE[:arg]`."""
  path, _, arg = config_spec.partition(":")
  module = _load_module(path)
  if callable(getattr(module, "get_sweep", None)):
    return module, list(module.get_sweep(arg or "paper"))
  return module, [arg]


def load_member(config_spec: str, module, arg: str, overrides: list[str]):
  """(member name, its resolved config) with the `--config.X=V` overrides applied as the trainer's
  command line applies them (config_lib.load_config and config_lib.override)."""
  path = config_spec.partition(":")[0]
  config = config_lib.load_config(f"{path}:{arg}" if arg else path)
  for override in overrides:
    field, eq, text = override.removeprefix("--config.").partition("=")
    if not override.startswith("--config.") or not eq:
      raise ConfigError(f"--override={override}: expected --config.FIELD=VALUE")
    config_lib.override(config, field, text, where=override)
  config = config_lib.resolve(config)
  name = (
    module.workdir_name(arg)
    if hasattr(module, "workdir_name")
    else experiment_lib.config_member_name(config)
  )
  return name, config


def without_corpus(config, placeholder: str):
  """A copy of `config` whose corpus paths (if any) point at `placeholder`, for validation."""
  config = config.copy_and_resolve_references()
  with config.unlocked():
    if config.data.corpus == "sources":
      config.data.sources = placeholder
    elif config.data.corpus == "files":
      config.data.corpus_files = placeholder
  return config


# ----------------------------------------------------------------- the compile ---


def check_divisible(abs_params, shardings, mesh) -> None:
  """ConfigError naming the first parameter with a dimension its mesh axes do not divide."""
  flat, _ = jax.tree_util.tree_flatten_with_path(abs_params)
  for (path, leaf), sh in zip(flat, jax.tree.leaves(shardings)):
    for dim, (size, axes) in enumerate(zip(leaf.shape, sh.spec)):
      axes = (axes,) if isinstance(axes, str) else tuple(axes or ())
      ways = math.prod(mesh.shape[a] for a in axes)
      if size % ways:
        raise ConfigError(
          f"parameter {jax.tree_util.keystr(path)} of shape {tuple(leaf.shape)}: dimension {dim} "
          f"({size}) is not divisible by mesh axis {'x'.join(axes)} of size {ways} "
          f"(sharding_rules put it there)"
        )


def compile_member(config, devices, placeholder: str, row: dict[str, Any]) -> None:
  """Compiles `config`'s train step on `devices` (real, fake CPU or compile-only TPU ones).

  The trainer's own `state.setup` and `state.jit_train_step`, lowered on abstract arrays. Fills `row`'s mesh, params, compile_s and memory as they become known
  (a failure keeps what was known); raises ConfigError for a config that cannot fit the devices
  and whatever jax raises while lowering or compiling.
  """
  ici, dcn = sharding.mesh_shape(config.mesh, len(devices), config.mesh_dcn)
  row["mesh"] = {a: i * j for a, i, j in zip(sharding.AXES, ici, dcn)}
  config_lib.validate(without_corpus(config, placeholder), len(devices))
  model_cfg, mask_cfg = plan.model_config(config)  # vocabulary = data.vocab_size
  st = state_lib.setup(config, model_cfg, mask_cfg, devices)  # the trainer's own setup
  row["params"] = int(sum(math.prod(x.shape) for x in jax.tree.leaves(st.abs_params)))
  check_divisible(st.abs_params, st.param_shardings, st.mesh)
  train_step = state_lib.jit_train_step(st, config.optim.microbatches)
  inputs = state_lib.abstract_step_inputs(st, config.batch_size, config.data.seq_len)
  start = time.perf_counter()
  with jax.set_mesh(st.mesh), nnx.logical_axis_rules(st.rules):
    compiled = train_step.lower(st.abs_params, st.abs_opt_state, *inputs).compile()
  row["compile_s"] = round(time.perf_counter() - start, 2)
  row["memory"] = memory(compiled)


def memory_plan(config, num_devices: int) -> dict[str, Any] | None:
  """The member's memory plan on its chip (`sweep.chip`, as `plan.derive` recorded it) with the
  analytic prediction of the setting it compiles with; None without a chip."""
  if not config.sweep.get("memory_verdict"):  # no chip, or not a member (plan.derive)
    return None
  shape = plan.memory_shape(config, num_devices)
  setting = plan.current_setting(config)
  return {
    "chip": config.sweep.chip,
    "setting": setting.describe(),
    "verdict": config.sweep.memory_verdict,
    "predicted": {k: int(v) for k, v in memory_lib.estimate(shape, setting).items()},
    "budget": int(config.sweep.memory_budget),
  }


def memory(compiled) -> dict[str, int] | None:
  """Bytes per device from XLA's memory analysis; total = arguments + outputs - aliased + temps."""
  stats = compiled.memory_analysis()
  if stats is None:  # some backends do not report it
    return None
  out = {
    k: int(getattr(stats, f"{k}_size_in_bytes", 0) or 0)
    for k in ("argument", "output", "alias", "temp", "generated_code")
  }
  out["total"] = out["argument"] + out["output"] - out["alias"] + out["temp"]
  return out


def one_line(e: BaseException) -> str:
  """An exception as one line: ConfigError's message, else the type and first line."""
  text = " ".join(str(e).split("\n", 1)[0].split()) or type(e).__name__
  return f"config error: {text}" if isinstance(e, ConfigError) else f"{type(e).__name__}: {text}"


def child(ns) -> int:
  """The child: compile the given members on this process's devices, one JSON line each."""
  module, _ = member_args(ns.config)
  with (
    tempfile.NamedTemporaryFile("w", suffix=".txt") as placeholder,
    open(ns._results, "a", encoding="utf-8") as results,
  ):  # pylint: disable=protected-access
    placeholder.write("placeholder corpus: the compile check reads no data\n")
    placeholder.flush()
    if ns.tpu_topology:
      available = list(topologies.get_topology_desc(ns.tpu_topology, "tpu").devices)
    else:
      available = jax.devices()
    for arg in json.loads(ns._member_args):  # pylint: disable=protected-access
      row: dict[str, Any] = {
        "arg": arg,
        "member": arg,
        "devices": None,
        "mesh": None,
        "params": None,
        "compile_s": None,
        "memory": None,
        "error": None,
        "plan": None,
      }
      try:
        row["member"], config = load_member(ns.config, module, arg, ns.override)
        # sweep.target_devices; 0 = this process's devices (the first num_devices if set)
        want = config.sweep.target_devices or config.num_devices or len(available)
        row["devices"] = want
        print(
          f"{CHILD_PREFIX} {row['member']}: compiling for {want} devices",
          file=sys.stderr,
          flush=True,
        )
        if want > len(available):
          raise ConfigError(
            f"planned for {want} devices, but the "
            f"{'topology' if ns.tpu_topology else 'process'} has {len(available)}"
          )
        row["plan"] = memory_plan(config, want)
        compile_member(config, available[:want], placeholder.name, row)
      except Exception as e:  # pylint: disable=broad-except (one member's failure is its row)
        row["error"] = one_line(e)
      results.write(json.dumps(row) + "\n")
      results.flush()
      print(f"{CHILD_PREFIX} {row['member']}: {row['error'] or 'OK'}", file=sys.stderr, flush=True)
  return 0


# ------------------------------------------------------------------ the parent ---


def child_env(num_devices: int, tpu: bool) -> dict[str, str]:
  """The environment of a child: N fake CPU devices (N > 0), else this machine's devices."""
  env = dict(os.environ)
  env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, env.get("PYTHONPATH", "")]))
  if num_devices > 0 and not tpu:
    flags_ = re.sub(r"--xla_force_host_platform_device_count=\S+", "", env.get("XLA_FLAGS", ""))
    flags_ = flags_.replace(memory_lib.REMAT_XLA_FLAGS, "")
    env["XLA_FLAGS"] = (
      f"{flags_.strip()} --xla_force_host_platform_device_count={num_devices} "
      f"{memory_lib.REMAT_XLA_FLAGS}"
    ).strip()
    env["JAX_PLATFORMS"] = "cpu"
  return env


def run_child(ns, num_devices: int, args: list[str]) -> list[dict]:
  """Runs one child for the members `args` sharing `num_devices`; their rows, in order. A member
  the child did not reach (it crashed) gets the child's last stderr line as its error."""
  with tempfile.NamedTemporaryFile("r", suffix=".jsonl", encoding="utf-8") as results:
    cmd = [
      sys.executable,
      "-m",
      "launch.compile_check",
      "--_child",
      "--config",
      ns.config,
      "--_results",
      results.name,
      "--_member_args",
      json.dumps(args),
      *(f"--override={o}" for o in ns.override),
    ]
    if ns.tpu_topology:
      cmd.append(f"--tpu_topology={ns.tpu_topology}")
    proc = subprocess.Popen(
      cmd,
      env=child_env(num_devices, bool(ns.tpu_topology)),
      stderr=subprocess.PIPE,
      stdout=subprocess.DEVNULL,
      text=True,
      errors="replace",
    )
    last = ""
    for line in proc.stderr:  # progress lines shown, the rest kept for errors
      if line.startswith(CHILD_PREFIX):
        sys.stderr.write(
          f"{CHILD_PREFIX} [{num_devices or 'local'} devices]{line[len(CHILD_PREFIX) :]}"
        )
      elif line.strip():
        last = line.strip()
    code = proc.wait()
    rows = {r["arg"]: r for r in map(json.loads, filter(None, results.read().splitlines()))}
  lost = f"the compile process exited with status {code} before this member ({last or 'no stderr'})"
  return [
    rows.get(a)
    or {
      "arg": a,
      "member": a,
      "devices": num_devices or None,
      "mesh": None,
      "params": None,
      "compile_s": None,
      "memory": None,
      "error": lost,
    }
    for a in args
  ]


def libtpu_available() -> bool:
  """Whether jax could load a TPU plugin (as jax looks for it: TPU_LIBRARY_PATH or libtpu)."""
  path = os.environ.get("TPU_LIBRARY_PATH")
  return bool(path and os.path.isfile(path)) or importlib.util.find_spec("libtpu") is not None


def _size(n: int | None) -> str:
  if n is None:
    return "-"
  for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
    if abs(n) >= scale:
      return f"{n / scale:.2f} {unit}"
  return f"{n} B"


def _count(n: int | None) -> str:
  if n is None:
    return "-"
  for unit, scale in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
    if n >= scale:
      return f"{n / scale:.2f}{unit}"
  return str(n)


def _short(setting: str) -> str:
  """'remat=dots, ce_chunk=0, microbatches=2' -> 'dots ce0 k2'."""
  v = dict(part.split("=") for part in setting.split(", "))
  return f"{v['remat']} ce{v['ce_chunk']} k{v['microbatches']}"


def _margin(setting: str) -> float:
  """The plan's margin for a setting string ('remat=dots, ce_chunk=0, microbatches=2')."""
  remat = dict(part.split("=") for part in setting.split(", "))["remat"]
  return memory_lib.margin(memory_lib.Setting(remat=remat))


def table(rows: list[dict]) -> str:
  """One line per member: devices, mesh, parameters, chip, the memory setting, the analytic
  prediction next to XLA's compiled bytes per device, their ratio and the margin the plan adds
  for that setting (memory.margin: the plan fits when predicted x margin <= usable), the chip's
  usable bytes, compile time, the verdict and OK or the error."""
  head = (
    "member",
    "devices",
    "mesh d x f x t",
    "params",
    "chip",
    "setting",
    "predicted",
    "compiled",
    "compiled/pred",
    "margin",
    "usable",
    "compile",
    "verdict",
    "status",
  )
  lines = [head]
  for r in rows:
    mem, p = r["memory"] or {}, r.get("plan") or {}
    mesh = "x".join(str(r["mesh"][a]) for a in ("data", "fsdp", "tensor")) if r["mesh"] else "-"
    lines.append(
      (
        r["member"],
        str(r["devices"] or "-"),
        mesh,
        _count(r["params"]),
        p.get("chip", "-"),
        _short(p["setting"]) if p else "-",
        _size(p["predicted"]["total"]) if p else "-",
        _size(mem.get("total")),
        f"{mem['total'] / p['predicted']['total']:.3f}" if p and mem.get("total") else "-",
        f"{_margin(p['setting']):.2f}" if p else "-",
        _size(p.get("budget")) if p else "-",
        f"{r['compile_s']:.1f}s" if r["compile_s"] is not None else "-",
        p.get("verdict") or "-",
        "OK" if not r["error"] else f"FAILED {r['error']}",
      )
    )
  widths = [max(len(l[i]) for l in lines) for i in range(len(head) - 1)]
  return "\n".join("  ".join(c.ljust(w) for c, w in zip(l, widths)) + "  " + l[-1] for l in lines)


def _name_without_overrides(config_spec: str, module, arg: str) -> str:
  """A member's name when it does not load with the overrides (for --members and the table)."""
  try:
    return load_member(config_spec, module, arg, [])[0]
  except Exception:  # pylint: disable=broad-except (then its get_config arg names it)
    return arg


def parent(ns) -> int:
  """Loads the members, compiles them in one child per device count, prints the table."""
  if ns.tpu_topology and not libtpu_available():
    print(f"compile check: {NEEDS_LIBTPU.format(topology=ns.tpu_topology)}", file=sys.stderr)
    return 2
  try:
    module, args = member_args(ns.config)
  except ConfigError as e:
    print(f"compile check: config error: {e}", file=sys.stderr)
    return 2
  rows, groups = {}, {}  # arg -> row (members that failed to load); devices -> [arg]
  names = {}
  for arg in args:
    try:
      name, config = load_member(ns.config, module, arg, ns.override)
      names[arg] = name
      groups.setdefault(0 if ns.tpu_topology else config.sweep.target_devices, []).append(arg)
    except Exception as e:  # pylint: disable=broad-except (a member that does not load is its row)
      names[arg] = _name_without_overrides(ns.config, module, arg)
      rows[arg] = {
        "arg": arg,
        "member": arg,
        "devices": None,
        "mesh": None,
        "params": None,
        "compile_s": None,
        "memory": None,
        "error": one_line(e),
      }
  if ns.members:
    want = [m.strip() for m in ns.members.split(",") if m.strip()]
    unknown = [m for m in want if m not in names.values()]
    if unknown:
      print(
        f"compile check: --members {', '.join(unknown)}: not members of {ns.config} (members: "
        f"{', '.join(names.values())})",
        file=sys.stderr,
      )
      return 2
    keep = {a for a, n in names.items() if n in want}
    args = [a for a in args if a in keep]
    groups = {n: [a for a in g if a in keep] for n, g in groups.items()}
  if ns.tpu_topology:
    path = f"TPU ahead-of-time for topology {ns.tpu_topology} (compile-only devices from libtpu)"
  else:
    path = FAKE_PATH + (
      "; TPU ahead-of-time: pass --tpu_topology"
      if libtpu_available()
      else "; TPU ahead-of-time unavailable: libtpu is not installed"
    )
  print(f"compile check of {ns.config}: {len(args)} members; path: {path}", flush=True)
  for num_devices, group in sorted(groups.items()):
    if group:
      rows |= {r["arg"]: r for r in run_child(ns, num_devices, group)}
  ordered = [rows[a] | {"member": names[a]} for a in args]
  print(table(ordered), flush=True)
  failed = [r["member"] for r in ordered if r["error"]]
  too_big = [
    r["member"] for r in ordered if (r.get("plan") or {}).get("verdict") == "needs more chips"
  ]
  print(
    f"{len(ordered) - len(failed)} OK, {len(failed)} failed"
    + (f": {', '.join(failed)}" if failed else "")
    + (
      f"; {len(too_big)} do not fit their chips at any setting (needs more chips): "
      f"{', '.join(too_big)}"
      if too_big
      else ""
    ),
    flush=True,
  )
  if ns.out:
    with open(ns.out, "w", encoding="utf-8") as f:
      json.dump(
        {"config": ns.config, "overrides": ns.override, "path": path, "members": ordered},
        f,
        indent=2,
      )
  return 1 if failed or too_big else 0


def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  p.add_argument(
    "--config", required=True, help="experiment file[:scale], e.g. experiments/sweep.py"
  )
  p.add_argument("--members", default="", help="only these members, comma list (e.g. bert_d384L6)")
  p.add_argument(
    "--override",
    action="append",
    default=[],
    help="for every member, e.g. --override=--config.sweep.target_devices=16",
  )
  p.add_argument("--out", default="", help="also write the rows (bytes, seconds) to this JSON file")
  p.add_argument(
    "--tpu_topology",
    default="",
    help="compile ahead-of-time for this TPU topology (e.g. v5p:2x2x4); needs libtpu",
  )
  p.add_argument("--_child", action="store_true", help=argparse.SUPPRESS)
  p.add_argument("--_results", default="", help=argparse.SUPPRESS)
  p.add_argument("--_member_args", default="[]", help=argparse.SUPPRESS)
  ns = p.parse_args(argv)
  return child(ns) if ns._child else parent(ns)  # pylint: disable=protected-access


if __name__ == "__main__":
  sys.exit(main())
