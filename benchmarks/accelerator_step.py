r"""Accelerator train-step benchmark: tokens/s and bf16 MFU of a ~300M-parameter BERT and CrossBERT.

  python benchmarks/accelerator_step.py                  # on a GPU/TPU host: ~300M, bf16, seq 512
  python benchmarks/accelerator_step.py --attention cudnn          # NVIDIA: cuDNN fused attention
  python benchmarks/accelerator_step.py --d 64 --layers 2 --heads 2 --vocab 512 --seq 32 \
      --batch 4 --dtype float32 --steps 3                           # a CPU dry run of the script
  bash benchmarks/gpu_window.sh run                      # a short GPU window: docs/performance.md

The default shape is BERT-large's trunk with SwiGLU: d 1024, 24 layers, 16 heads, FFN 2816
(SPEC §2's 8d/3 rounded to 256), vocabulary 32768, sequence 512: 308M non-embedding + 34M
embedding parameters. Parameters and optimizer state stay float32; matmuls and activations run in
`--dtype` (the `model.compute_dtype` switch of training). Contestants (the same cbert_jax train
step as training: forward, loss, backward, AdamW with clipping, buffers donated):
  BERT            20% masking, vocabulary head on the targets only
  CrossBERT       50% masking, no CMS (the encoder sees half the tokens)
  CrossBERT+CMS   two complementary views of T/2, every token a target
  ... fused       BERT and CrossBERT+CMS with `model.fused_projections` (q/k/v and SwiGLU's
                  gate/up as one matmul each; off by default: no gain on CPU, see
                  docs/performance.md), so one run on the accelerator decides it there too
Each is compiled, warmed up, then timed over `--steps` steps (median; the clock stops on the loss
of every step, so no work is left queued).

Memory. Before anything is built, the shape is checked against the device's chip in the memory
plan (`--plan_chip auto`: `cbert_jax.scaling.chips`' record of the device kind; none on a CPU):
`cbert_jax.scaling.memory.plan` with the `--remat` setting fixed, i.e. the estimate times the
policy's calibrated margin within the chip's usable HBM, what the sweep planner fits members with.
`--batch` is shrunk to the largest batch at which every contestant fits with that margin (one shape
for all, so their tokens/s compare); a contestant that fits at no batch gets a row saying so. Run
as a script, the GPU memory JAX may take is the launchers' (`XLA_PYTHON_CLIENT_MEM_FRACTION`, default
`chips.GPU_MEM_FRACTION`). On an accelerator each contestant runs in its own child process
(`--isolate auto`), and so does the device probe (device kind, peak, a measured 8192^2 matmul), so
the parent never holds device memory and the device's peak memory
(`memory_stats()["peak_bytes_in_use"]`) is that contestant's alone; it is printed beside XLA's
compiled figure and the plan's prediction for the same shape and remat policy, and the attention
kernel that ran is read off the compiled HLO's custom calls (cuDNN's fused attention, else XLA's
dot + softmax).

Time. Each isolated contestant has its own hard limit, `--contestant_s` (default 150 s, compile
included; in-process runs cannot be stopped), cut to what is left of `--budget_s` (default 360 s
for all of them): a child past it is killed (its process group) and its row says so. A contestant
that would not finish within `--budget_s` (judged by the longest one so far) is skipped, and its
row says so; the first always runs. SIGTERM (a wrapping `timeout`) kills the running child and
still writes the table. The JSON and Markdown are rewritten after every contestant (`"complete":
false` until the last), so a run cut short keeps what it measured.

Model FLOPs are `models.flops.flops_per_token` (3x forward matmul FLOPs, no recompute), MFU is
against the device's dense spec-sheet peak for `--dtype` (`cbert_jax.run.hardware`, e.g. H100/H200
SXM bf16 989 TFLOP/s); a measured 8192^2 matmul in the same dtype is printed next to it. Writes
<out>/accelerator_step.{json,md}, with the jax/jaxlib/flax/optax versions and the XLA environment
the run saw.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.contestants import JaxStep, Shape, step_configs  # noqa: E402

CONTESTANTS = {  # name -> (family, mask ratio, cms, fused projections)
  "BERT": ("bert", 0.2, False, False),
  "BERT fused": ("bert", 0.2, False, True),
  "CrossBERT": ("crossbert", 0.5, False, False),
  "CrossBERT+CMS": ("crossbert", 0.5, True, False),
  "CrossBERT+CMS fused": ("crossbert", 0.5, True, True),
}
ONE = {"data": 1, "fsdp": 1, "tensor": 1}  # one device: no sharding
# The environment a GPU run's numbers depend on, recorded in the JSON.
ENV_VARS = (
  "XLA_PYTHON_CLIENT_MEM_FRACTION",
  "XLA_PYTHON_CLIENT_PREALLOCATE",
  "XLA_PYTHON_CLIENT_ALLOCATOR",
  "XLA_FLAGS",
  "JAX_OPTIMIZATION_LEVEL",
  "CUDA_DEVICE_MAX_CONNECTIONS",
  "JAX_PLATFORMS",
)
PROBE_S = 180.0  # the device probe's time limit (JAX's start-up and one compiled matmul)
VERSIONED = ("jax", "jaxlib", "flax", "optax", "numpy", "ml_dtypes", "ml_collections")


class Stopped(Exception):
  """SIGTERM reached the parent (the wrapping time box): stop, kill the child, write the table."""


def _without(argv: list[str], flag: str) -> list[str]:
  """argv less `flag VALUE` and `flag=VALUE`."""
  out, skip = [], False
  for a in argv:
    if skip:
      skip = False
    elif a == flag:
      skip = True
    elif not a.startswith(flag + "="):
      out.append(a)
  return out


def versions() -> dict[str, str | None]:
  """The installed versions of what the step runs on (None: not installed)."""
  from importlib import metadata

  out = {"python": platform.python_version()}
  for name in VERSIONED:
    try:
      out[name] = metadata.version(name.replace("_", "-"))
    except metadata.PackageNotFoundError:
      out[name] = None
  return out


def model_kw(args, fused: bool) -> dict:
  """The ModelConfig fields a contestant is built with (JaxStep's and the memory plan's)."""
  return dict(
    compute_dtype=args.dtype,
    attention_impl=args.attention,
    remat=args.remat,
    fused_projections=fused,
  )


def time_steps(step: JaxStep, steps: int, warmup: int) -> list[float]:
  for _ in range(warmup):
    step.step()
  times = []
  for _ in range(steps):
    start = time.perf_counter()
    step.step()  # returns the loss as a float: blocks on the step
    times.append(time.perf_counter() - start)
  return times


def plan_bytes(step: JaxStep, family: str, shape: Shape, remat: str) -> float:
  """The memory plan's bytes for this step on one device (no sharding, one micro-batch)."""
  from cbert_jax.scaling import memory as memory_lib

  s = memory_lib.shape_of(family, step.model_cfg, step.mask_cfg, shape.seq, shape.batch, ONE)
  return float(memory_lib.estimate(s, memory_lib.Setting(remat=remat))["total"])


def plan_chip(choice: str, device_kind: str) -> str | None:
  """The chip the shape is checked against: `--plan_chip` auto (the device kind's record in the
  chip table, if it has memory facts; a CPU has none), none, or a chip key."""
  from cbert_jax.scaling import chips as chips_lib

  if choice == "none":
    return None
  if choice != "auto":
    if choice not in chips_lib.CHIPS or not chips_lib.CHIPS[choice].planned:
      planned = [k for k, c in chips_lib.CHIPS.items() if c.planned]
      raise SystemExit(f"--plan_chip {choice!r}: not a planned chip; known: {', '.join(planned)}")
    return choice
  found = chips_lib.lookup_device_kind(device_kind)
  return found[0] if found and found[1].planned else None


def fit_batch(names: list[str], shape: Shape, args, chip_key: str) -> tuple[int, dict[str, dict]]:
  """(batch, plans): the largest batch <= shape.batch at which the memory plan says every contestant
  that fits at all fits `chip_key` with its margin (`memory.plan` with `--remat` fixed), 0 when
  none does; each contestant's plan at that batch (at batch 1 for one that fits at no batch)."""
  from cbert_jax.scaling import memory as memory_lib

  setting = memory_lib.Setting(remat=args.remat)
  margin = memory_lib.margin(setting, memory_lib.platform_of(chip_key))

  def plan(name: str, batch: int):
    family, ratio, cms, fused = CONTESTANTS[name]
    s = dataclasses.replace(shape, batch=batch)
    cfg, mask = step_configs(s, ratio, cms, **model_kw(args, fused))
    ms = memory_lib.shape_of(family, cfg, mask, s.seq, batch, ONE)
    return memory_lib.plan(ms, chip_key, fixed=setting)

  largest = {}
  for name in names:  # memory grows with the batch: bisect for the largest that fits
    lo, hi = 0, shape.batch
    while lo < hi:
      mid = (lo + hi + 1) // 2
      lo, hi = (mid, hi) if plan(name, mid).verdict == "fits" else (lo, mid - 1)
    largest[name] = lo
  fitting = [b for b in largest.values() if b]
  batch = min(fitting) if fitting else 0
  plans = {}
  for name in names:
    at = batch if largest[name] else 1
    p = plan(name, at)
    plans[name] = {
      "chip": chip_key,
      "batch": at,
      "verdict": p.verdict,
      "predicted_bytes": p.predicted["total"],
      "margin": margin,
      "budget_bytes": p.budget,
      "largest_fitting_batch": largest[name],
    }
  return batch, plans


def probe(dtype: str) -> dict:
  """The device: its kind, platform, dense peak for `dtype`, a measured matmul, memory limit."""
  import jax

  from cbert_jax.run import hardware

  device = jax.local_devices()[0]
  peak, peak_source = hardware.device_peak(dtype)
  measured = hardware.measure_matmul_peak(
    dtype, n=2048 if device.platform == "cpu" else 8192, seconds=1.0
  )
  stats = device.memory_stats() or {}
  return {
    "device_kind": device.device_kind,
    "platform": device.platform,
    "local_devices": jax.local_device_count(),
    "peak_flops": peak,
    "peak_source": peak_source,
    "measured_matmul_flops": measured,
    "bytes_limit": stats.get("bytes_limit"),
  }


def measure(name: str, shape: Shape, args, peak: float) -> dict:
  """One contestant: build and compile, warm up, time; its numbers."""
  import jax

  family, ratio, cms, fused = CONTESTANTS[name]
  t0 = time.perf_counter()
  step = JaxStep(family, shape, ratio, cms, **model_kw(args, fused))
  compile_s = time.perf_counter() - t0
  times = time_steps(step, args.steps, args.warmup)
  med = statistics.median(times)
  flops_s = step.flops_per_step / med
  stats = jax.local_devices()[0].memory_stats() or {}
  measured = stats.get("peak_bytes_in_use")
  planned = plan_bytes(step, family, shape, args.remat)
  return {
    "params": step.params,
    "compile_s": compile_s,
    "step_s": med,
    "step_s_min": min(times),
    "step_s_max": max(times),
    "tokens_per_s": shape.batch * shape.seq / med,
    "model_flops_per_s": flops_s,
    "mfu": flops_s / peak,
    "memory_mb": step.memory_bytes / 2**20,  # XLA's compiled figure
    "plan_memory_mb": planned / 2**20,  # the memory plan's prediction
    "peak_memory_mb": measured / 2**20 if measured else None,  # the device's, None on CPU
    "attention_kernel": step.attention_kernel,
  }


def run_child(cmd: list[str], limit_s: float) -> int | None:
  """Runs `cmd` in its own process group; its exit status, or None when it ran past `limit_s` and
  was killed. The group is killed whenever the parent stops waiting (a limit, SIGTERM, Ctrl-C), so
  no child outlives its row and holds the device's memory into the next contestant's."""
  proc = subprocess.Popen(cmd, start_new_session=True)
  try:
    return proc.wait(timeout=max(limit_s, 0.0))
  except subprocess.TimeoutExpired:
    return None
  finally:
    if proc.poll() is None:
      try:
        os.killpg(proc.pid, signal.SIGKILL)
      except ProcessLookupError:
        pass
      proc.wait()


def in_child(
  argv: list[str], extra: list[str], tmp: str, limit_s: float, json_flag: str = "--child_json"
) -> dict:
  """This script with `argv + extra` in a child that writes its JSON to `json_flag` (a contestant's
  numbers, or the device probe's with --probe_json); the JSON, or why there is none."""
  out = os.path.join(tmp, f"{len(os.listdir(tmp))}.json")
  cmd = [sys.executable, os.path.abspath(__file__), *argv, *extra, "--isolate", "no"]
  t0 = time.perf_counter()
  rc = run_child([*cmd, json_flag, out], limit_s)
  if rc is None:
    took = time.perf_counter() - t0
    return {"error": f"killed after {took:.0f} s (time limit {limit_s:g} s)", "killed_s": took}
  if rc != 0 or not os.path.exists(out):
    return {"error": f"child exited {rc}"}
  with open(out) as f:
    return json.load(f)


def render(info: dict) -> str:
  """The Markdown table (and its heading and ratio lines) of `info`."""
  shape, results, dev = info["shape"], info["results"], info["device"]
  timed = {n: r for n, r in results.items() if "step_s" in r}
  v = info["versions"]
  lines = [
    f"{dev['device_kind']}, {info['dtype']} compute / float32 parameters, attention "
    f"{info['attention']}, remat {info['remat']}; d {shape['d']}, {shape['layers']} layers, "
    f"{shape['heads']} heads, FFN {shape['ffn']}, vocab {shape['vocab']}, seq {shape['seq']}, "
    f"batch {shape['batch']}; peak {dev['peak_flops'] / 1e12:.1f} TFLOP/s "
    f"({dev['peak_source']}); measured matmul {dev['measured_matmul_flops'] / 1e12:.1f} TFLOP/s; "
    f"median of {info['steps']} steps",
    "",
    f"jax {v['jax']}, jaxlib {v['jaxlib']}, flax {v['flax']}, optax {v['optax']}, Python "
    f"{v['python']}; XLA_PYTHON_CLIENT_MEM_FRACTION "
    f"{info['env'].get('XLA_PYTHON_CLIENT_MEM_FRACTION') or 'unset'}",
  ]
  plan = info["plan"]
  if plan["chip"]:
    margins = {p["margin"] for p in plan["contestants"].values()}
    budgets = {p["budget_bytes"] for p in plan["contestants"].values()}
    lines.append(
      f"memory plan ({plan['chip']}, remat {info['remat']}: estimate x "
      f"{'/'.join(f'{m:g}' for m in sorted(margins))} within "
      f"{'/'.join(f'{b / 1e9:.1f}' for b in sorted(budgets))} GB): batch {shape['batch']} of the "
      f"requested {plan['requested_batch']}"
    )
  if not info["complete"]:
    lines.append("**incomplete**: the run was stopped before its last contestant")
  lines += [
    "",
    "| model | params | step (ms) | data tokens/s | model TFLOP/s | MFU | memory: compiled / "
    "plan / measured peak (MB) | plan / compiled | attention kernel |",
    "|---|---|---|---|---|---|---|---|---|",
  ]
  for name, r in results.items():
    if name not in timed:
      lines.append(f"| {name} | {r.get('skipped') or r.get('error')} |||||||| ")
      continue
    peak_mem = f"{r['peak_memory_mb']:,.0f}" if r["peak_memory_mb"] else "-"
    lines.append(
      f"| {name} | {r['params'] / 1e6:.0f}M | {r['step_s'] * 1e3:.1f} | "
      f"{r['tokens_per_s']:,.0f} | {r['model_flops_per_s'] / 1e12:.1f} | "
      f"{100 * r['mfu']:.1f}% | {r['memory_mb']:,.0f} / {r['plan_memory_mb']:,.0f} / {peak_mem} | "
      f"{r['plan_memory_mb'] / r['memory_mb']:.2f} | {r['attention_kernel']} |"
    )
  if "BERT" in timed:
    lines += [""] + [
      f"- {n} / BERT data tokens/s: **{r['tokens_per_s'] / timed['BERT']['tokens_per_s']:.2f}x**"
      for n, r in timed.items()
      if n != "BERT"
    ]
  if {"CrossBERT+CMS", "CrossBERT+CMS fused"} <= timed.keys():
    ratio = timed["CrossBERT+CMS fused"]["tokens_per_s"] / timed["CrossBERT+CMS"]["tokens_per_s"]
    lines.append(f"- CrossBERT+CMS fused / CrossBERT+CMS data tokens/s: **{ratio:.2f}x**")
  return "\n".join(lines)


def write(out: str, info: dict) -> str:
  """Writes <out>/accelerator_step.{json,md}; the table."""
  table = render(info)
  os.makedirs(out, exist_ok=True)
  for name, text in (
    ("accelerator_step.json", json.dumps(info, indent=2)),
    ("accelerator_step.md", table + "\n"),
  ):
    path = os.path.join(out, name)
    with open(path + ".tmp", "w") as f:
      f.write(text)
    os.replace(path + ".tmp", path)  # a kill mid-write leaves the last whole file
  return table


def _row(name: str, r: dict) -> str:
  if "step_s" not in r:
    return f"  {name}: {r.get('skipped') or r.get('error')}"
  peak_mem = f"{r['peak_memory_mb']:,.0f}" if r["peak_memory_mb"] else "-"
  return (
    f"  {name}: {r['params'] / 1e6:.0f}M params, step {r['step_s'] * 1e3:.1f} ms, "
    f"{r['tokens_per_s']:,.0f} tokens/s, {r['model_flops_per_s'] / 1e12:.1f} TFLOP/s, "
    f"MFU {100 * r['mfu']:.1f}%, memory: compiled {r['memory_mb']:,.0f} MB, plan "
    f"{r['plan_memory_mb']:,.0f} MB, measured peak {peak_mem} MB; attention "
    f"{r['attention_kernel']} (built and compiled in {r['compile_s']:.0f} s)"
  )


def threading_main() -> bool:
  """Whether this is the main thread (only it may set a signal handler)."""
  import threading

  return threading.current_thread() is threading.main_thread()


def _stop(signum, frame):
  raise Stopped(f"signal {signum}")


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--d", type=int, default=1024)
  p.add_argument("--layers", type=int, default=24)
  p.add_argument("--heads", type=int, default=16)
  p.add_argument("--ffn", type=int, default=0, help="SwiGLU width; 0 = 8d/3 rounded up to 256")
  p.add_argument("--vocab", type=int, default=32768)
  p.add_argument("--seq", type=int, default=512)
  p.add_argument(
    "--batch",
    type=int,
    default=32,
    help="sequences per step (one device); shrunk to what the memory plan fits (--plan_chip)",
  )
  p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
  p.add_argument("--attention", default="auto", choices=("auto", "xla", "cudnn"))
  p.add_argument("--remat", default="none", choices=("none", "full", "dots"))
  p.add_argument("--contestants", default=",".join(CONTESTANTS))
  p.add_argument("--steps", type=int, default=10)
  p.add_argument("--warmup", type=int, default=3)
  p.add_argument("--out", default="runs/bench/accelerator_step")
  p.add_argument(
    "--isolate",
    default="auto",
    choices=("auto", "yes", "no"),
    help="each contestant in its own process (auto: on an accelerator, for its peak memory)",
  )
  p.add_argument(
    "--plan_chip",
    default="auto",
    help="check the shape against this chip's memory plan and shrink --batch to fit: auto (the "
    "device's chip; none on a CPU), none, or a chip key (h100, h200, ...)",
  )
  p.add_argument(
    "--budget_s",
    type=float,
    default=360.0,
    help="skip contestants that would end past this many seconds, and cut the last one's limit",
  )
  p.add_argument(
    "--contestant_s",
    type=float,
    default=150.0,
    help="kill an isolated contestant (its child process) after this many seconds",
  )
  p.add_argument("--child_json", default="", help=argparse.SUPPRESS)  # --isolate's child
  p.add_argument("--probe_json", default="", help=argparse.SUPPRESS)  # the device probe's child
  p.add_argument("--peak_flops", type=float, default=0.0, help=argparse.SUPPRESS)  # for a child
  argv = list(sys.argv[1:] if argv is None else argv)
  args = p.parse_args(argv)
  names = [n.strip() for n in args.contestants.split(",") if n.strip()]
  for n in names:
    if n not in CONTESTANTS:
      p.error(f"--contestants: unknown {n!r}; known: {', '.join(CONTESTANTS)}")

  from cbert_jax.models.model_config import ffn_size_for

  ffn = args.ffn or ffn_size_for(args.d)
  shape = Shape(
    layers=args.layers,
    d=args.d,
    heads=args.heads,
    ffn=ffn,
    vocab=args.vocab,
    seq=args.seq,
    batch=args.batch,
  )
  if args.probe_json:  # the device probe, for a parent that keeps off the device
    with open(args.probe_json, "w") as f:
      json.dump(probe(args.dtype), f)
    return {}
  if args.child_json:  # one contestant, for the parent's --isolate
    peak = args.peak_flops
    if not peak:
      from cbert_jax.run import hardware

      peak = hardware.device_peak(args.dtype)[0]
    with open(args.child_json, "w") as f:
      json.dump(measure(names[0], shape, args, peak), f)
    return {}

  # The parent. Where the contestants may run in children on an accelerator, the device is probed
  # in a child too: a parent that initialised the GPU would hold its memory (JAX preallocates
  # XLA_PYTHON_CLIENT_MEM_FRACTION of it) while the children run.
  cpu_only = os.environ.get("JAX_PLATFORMS", "").strip().lower() == "cpu"
  previous = signal.signal(signal.SIGTERM, _stop) if threading_main() else None
  try:
    with tempfile.TemporaryDirectory() as tmp:
      return _parent(argv, args, names, shape, cpu_only, tmp)
  finally:
    if previous is not None:
      signal.signal(signal.SIGTERM, previous)


def _parent(
  argv: list[str], args, names: list[str], shape: Shape, cpu_only: bool, tmp: str
) -> dict:
  """The parent's run: the device probe, the memory plan, each contestant in turn, the table."""
  try:
    dev = _device(argv, args, cpu_only, tmp)
    isolate = args.isolate == "yes" or (args.isolate == "auto" and dev["platform"] != "cpu")
    chip_key = plan_chip(args.plan_chip, dev["device_kind"])
    plans, requested = {}, shape.batch
    if chip_key:
      batch, plans = fit_batch(names, shape, args, chip_key)
      if batch:
        shape = dataclasses.replace(shape, batch=batch)
      print(
        f"memory plan on {chip_key}: batch {batch or '-'} of the requested {requested} fits "
        + ", ".join(
          f"{n} ({p['predicted_bytes'] / 1e9:.1f} GB x {p['margin']:g} <= "
          f"{p['budget_bytes'] / 1e9:.1f} GB)"
          if p["largest_fitting_batch"]
          else f"not {n} ({p['verdict']} at batch 1)"
          for n, p in plans.items()
        ),
        flush=True,
      )
  except Stopped as e:  # before the first contestant: nothing to write
    raise SystemExit(f"stopped by SIGTERM before the first contestant ({e})") from None
  info = {
    "device_kind": dev["device_kind"],
    "platform": dev["platform"],
    "peak_flops": dev["peak_flops"],
    "peak_source": dev["peak_source"],
    "measured_matmul_flops": dev["measured_matmul_flops"],
    "device": dev,
    "dtype": args.dtype,
    "attention": args.attention,
    "remat": args.remat,
    "steps": args.steps,
    "shape": dataclasses.asdict(shape),
    "plan": {"chip": chip_key, "requested_batch": requested, "contestants": plans},
    "budget_s": args.budget_s,
    "contestant_s": args.contestant_s,
    "isolate": isolate,
    "results": {},
    "complete": False,
    "jax": versions()["jax"],
    "versions": versions(),
    "env": {k: os.environ.get(k) for k in ENV_VARS},
  }
  results = info["results"]
  child_argv = [*_without(_without(argv, "--contestants"), "--batch"), "--batch"]
  child_argv += [str(shape.batch), "--peak_flops", repr(dev["peak_flops"])]
  start, longest, name, stopped = time.perf_counter(), 0.0, names[0], False
  try:
    write(args.out, info)  # the run's settings before the first contestant
    for name in names:
      elapsed = time.perf_counter() - start
      if plans and not plans[name]["largest_fitting_batch"]:
        pl = plans[name]
        results[name] = {
          "skipped": f"memory plan: {pl['verdict']} on {chip_key} at batch 1 "
          f"({pl['predicted_bytes'] / 1e9:.1f} GB x {pl['margin']:g} > "
          f"{pl['budget_bytes'] / 1e9:.1f} GB)"
        }
      elif results and longest and elapsed + longest > args.budget_s:  # the first always runs
        results[name] = {"skipped": f"--budget_s {args.budget_s:g}: {elapsed:.0f} s used"}
      else:
        # the first has its own limit; a later one at most what is left of the budget
        limit = (
          args.contestant_s if not longest else min(args.contestant_s, args.budget_s - elapsed)
        )
        t0 = time.perf_counter()
        if isolate:
          r = in_child(child_argv, ["--contestants", name], tmp, limit)
        else:
          r = measure(name, shape, args, dev["peak_flops"])
        longest = max(longest, time.perf_counter() - t0)
        if plans:
          r["plan"] = plans[name]
        results[name] = r
      print(_row(name, results[name]), flush=True)
      write(args.out, info)
  except Stopped:
    stopped = True
    for n in names[names.index(name) :]:
      if n not in results:
        results[n] = (
          {"error": "stopped by SIGTERM (the run's time box) while it ran"}
          if n == name
          else {"skipped": "stopped by SIGTERM (the run's time box)"}
        )
  info["complete"] = not stopped
  table = write(args.out, info)
  print("\n" + table, flush=True)
  return info


def _device(argv: list[str], args, cpu_only: bool, tmp: str) -> dict:
  """The device probe: here, or in a child where the parent must keep off the device."""
  if args.isolate == "no" or cpu_only:
    dev = probe(args.dtype)
  else:
    dev = in_child(argv, [], tmp, PROBE_S, "--probe_json")
    if "device_kind" not in dev:
      raise SystemExit(f"the device probe failed: {dev.get('error')}")
  print(
    f"device: {dev['device_kind']} ({dev['platform']}); peak {dev['peak_flops'] / 1e12:.1f} "
    f"TFLOP/s [{dev['peak_source']}]; measured {args.dtype} matmul "
    f"{dev['measured_matmul_flops'] / 1e12:.1f} TFLOP/s",
    flush=True,
  )
  return dev


if __name__ == "__main__":
  from cbert_jax.scaling.chips import GPU_MEM_FRACTION

  # The launchers' share of GPU memory for JAX (a TPU or a CPU ignores it); before JAX starts.
  os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", str(GPU_MEM_FRACTION))
  sys.exit(0 if main().get("complete", True) else 1)
