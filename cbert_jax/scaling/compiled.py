"""What a compiler said about a member's train step: the rows `launch.compile_check` archives, and
their readers.

One row (a JSON object) per member and compile: the member, the compiler (`path`: "tpu" = libtpu
ahead of time for a TPU topology, "cpu" = XLA:CPU on a fake mesh of the same device count), the
topology, the chip the verdict is judged against, the mesh, XLA's `memory_analysis()` per device
(arguments, outputs, aliased, temporaries, their total), the compile seconds, the compiler's
`cost_analysis()` (FLOPs, bytes accessed and, on TPU, `optimal_seconds`) beside the analytic FLOPs
of `models/flops.py`, the analytic memory plan, and `key`: everything the compiled program depends
on (model, batch, sequence, dtype, memory setting, mesh, devices, chip). A row answers for a config
only while its key is the config's (`key_of`): a new batch law or memory setting makes it stale,
and its readers say so instead of using it.

Readers: the planner (`python -m cbert_jax.sweep.planner`) and `launch.sweep`'s dry run show a
member's compiled HBM and the compiler's step-time estimate beside the analytic plan;
`launch.sweep --execute` refuses a member whose latest TPU compile does not fit its chip
(`refusal`); the memory calibration (`margins`) sets the TPU margins from these rows.

The compiler's `optimal_seconds` is its own cost model's estimate of the step on one chip, not a
measurement: every figure derived from it (step time, chip-hours, MFU) is labelled "compiler's
estimate" wherever it is shown.

JAX-free (the launcher's dry runs import it; tests/test_light_imports.py).
"""

from __future__ import annotations

import datetime
import json
import math
import os
import tempfile
from typing import Any

from cbert_jax.scaling import chips as chips_lib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The committed TPU compiles: <ARCHIVE>/<chip>/<member>.json, one directory per generation.
ARCHIVE = os.path.join(ROOT, "results", "tpu_aot")
# The committed deviceless GPU compiles (XLA:GPU, `launch.compile_check --gpu`): <chip>/<member>.json.
GPU_ARCHIVE = os.path.join(ROOT, "results", "gpu_aot")
GiB = chips_lib.GiB
# The MFU an analytic wall time assumes (the planner's --mfu default): an assumption, stated.
ASSUMED_MFU = 0.4


def key_of(config, devices: int, chip: str, topology: str | None) -> dict[str, Any]:
  """What the compiled step depends on, from a resolved member config: the row's `key`."""
  return {
    "model_name": config.model_name,
    "size": config.model.size,
    "cms": bool(config.masking.cms),
    "batch_size": int(config.batch_size),
    "seq_len": int(config.data.seq_len),
    "vocab_size": int(config.model.vocab_size or config.data.vocab_size),
    "compute_dtype": str(config.model.compute_dtype),
    "remat": str(config.model.remat),
    "ce_chunk": int(config.model.ce_chunk),
    "microbatches": int(config.optim.microbatches),
    "attention_impl": str(config.model.get("attention_impl", "xla")),
    "mesh": {a: int(config.mesh[a]) for a in ("data", "fsdp", "tensor")},
    "devices": int(devices),
    "chip": chip,
    "topology": topology,
  }


def differences(a: dict, b: dict) -> list[str]:
  """The fields in which two keys differ, as 'field: compiled a != now b' (empty when the same)."""
  return [f"{k}: {a.get(k)} != {b.get(k)}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]


def estimate(row: dict) -> dict[str, float] | None:
  """The compiler's estimate of the step (None without one): `step_s` = `optimal_seconds` (per
  step, every chip in parallel), the analytic model FLOPs per device over it (`flops_per_s`) and
  the MFU that implies against the chip's bf16 peak."""
  cost, analytic = row.get("cost") or {}, row.get("analytic") or {}
  step = cost.get("optimal_seconds")
  if not step or not analytic.get("model_flops"):
    return None
  chip = chips_lib.TABLE[row["chip"]]
  rate = analytic["model_flops"] / step
  return {"step_s": step, "flops_per_s": rate, "mfu": rate / chip.bf16}


def flops_ratio(row: dict) -> float | None:
  """The compiler's FLOPs per device over the analytic ones (the model's + the remat recompute);
  None without both."""
  flops, analytic = (row.get("cost") or {}).get("flops"), row.get("analytic") or {}
  hw = analytic.get("model_flops", 0) + analytic.get("recompute_flops", 0)
  return flops / hw if flops and hw else None


def compiled_verdict(row: dict) -> str | None:
  """The compiled bytes per device against the chip's usable HBM (`hbm x usable`, the budget the
  plan fills): "fits" or "does not fit"; None without a compile."""
  total = ((row.get("memory") or {}).get("total")) if not row.get("error") else None
  if total is None:
    return None
  return "fits" if total <= usable_bytes(row["chip"]) else "does not fit"


def usable_bytes(chip: str) -> float:
  c = chips_lib.CHIPS[chip]
  return c.hbm * c.usable


# ------------------------------------------------------------------------------- archive ---


def row_path(directory: str, member: str) -> str:
  return os.path.join(directory, f"{member}.json")


def write_row(directory: str, row: dict) -> str:
  """Writes `row` to `<directory>/<member>.json` atomically (a rename: never half a row)."""
  os.makedirs(directory, exist_ok=True)
  path = row_path(directory, row["member"])
  fd, tmp = tempfile.mkstemp(dir=directory, prefix=".row-", suffix=".json")
  with os.fdopen(fd, "w", encoding="utf-8") as f:
    json.dump(row, f, indent=1, sort_keys=True)
    f.write("\n")
  os.replace(tmp, path)
  return path


def load(directory: str) -> dict[str, dict]:
  """{member: row} of an archive directory ({} if there is none). A file that is not a row is an
  error naming it."""
  rows = {}
  if not os.path.isdir(directory):
    return rows
  for name in sorted(os.listdir(directory)):
    if not name.endswith(".json") or name.startswith("."):
      continue
    path = os.path.join(directory, name)
    try:
      with open(path, encoding="utf-8") as f:
        row = json.load(f)
      rows[row["member"]] = row
    except (OSError, ValueError, KeyError, TypeError) as e:
      raise ValueError(f"{path}: not a compile row ({type(e).__name__}: {e})") from e
  return rows


def now() -> str:
  return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# ------------------------------------------------------------------------------- lookups ---


class Lookup:
  """A member's latest TPU compile as its readers see it: `row` (None: never compiled for this
  chip) and `stale` (the key fields in which the row's compile differs from the config now)."""

  def __init__(self, row: dict | None, stale: list[str]):
    self.row, self.stale = row, stale

  @property
  def current(self) -> bool:
    return self.row is not None and not self.stale and not self.row.get("error")

  def describe(self) -> str:
    """One line for the plan: the compiled HBM and the compiler's step-time estimate."""
    if self.row is None:
      return "no TPU compile"
    if self.row.get("error"):
      return f"TPU compile failed ({self.row['error']})"
    mem, est = self.row["memory"], estimate(self.row)
    text = (
      f"TPU compile {self.row['topology']}: {mem['total'] / GiB:.2f} GiB per chip "
      f"({compiled_verdict(self.row)})"
    )
    if est:
      text += f", step {est['step_s'] * 1e3:.1f} ms and MFU {est['mfu']:.0%} (compiler's estimate)"
    if self.stale:
      text += f"; STALE, compiled for another config ({'; '.join(self.stale)})"
    return text


def lookup(member: str, key: dict, archive: str = ARCHIVE) -> Lookup:
  """The archived TPU compile of `member` on `key["chip"]` (`<archive>/<chip>/<member>.json`),
  compared with `key` on the fields `key` has (`key_of` a member's config now, or the fields the
  planner knows of its plan)."""
  row = load_one(os.path.join(archive, key["chip"]), member)
  if row is None:
    return Lookup(None, [])
  old = row.get("key") or {}
  return Lookup(row, differences({k: old.get(k) for k in key}, key))


def member_lookup(name: str, config, archive: str = ARCHIVE) -> Lookup | None:
  """`lookup` of a resolved sweep member planned for a TPU (`sweep.chip`, `sweep.target_devices`)
  on its standard topology; None for a member planned for no TPU."""
  s = config.sweep
  chip = chips_lib.CHIPS.get(s.get("chip", ""))
  if chip is None or not chip.accelerator or not s.get("target_devices"):
    return None
  try:
    topology = chips_lib.topology(s.chip, s.target_devices // chip.devices_per_chip)
  except ValueError:
    topology = None
  return lookup(name, key_of(config, s.target_devices, s.chip, topology), archive)


def load_one(directory: str, member: str) -> dict | None:
  path = row_path(directory, member)
  if not os.path.isfile(path):
    return None
  with open(path, encoding="utf-8") as f:
    return json.load(f)


def refusal(member: str, found: Lookup | None) -> str:
  """Why `launch.sweep --execute` refuses to start `member` ("" if it does not): its latest TPU
  compile, for its config as it is now, needs more HBM per chip than the chip's usable memory."""
  if found is None or not found.current or compiled_verdict(found.row) != "does not fit":
    return ""
  mem = found.row["memory"]["total"]
  return (
    f"{member}: its TPU compile ({found.row['topology']}, {found.row['date']}) needs "
    f"{mem / GiB:.2f} GiB per chip, over {found.row['chip']}'s usable "
    f"{usable_bytes(found.row['chip']) / GiB:.2f} GiB"
  )


def chip_hours(
  compute: float, steps: int, devices: int, chip: str, mfu: float, found: Lookup | None
) -> tuple[float, float | None]:
  """(analytic, compiler's estimate) chip-hours of a run of `compute` training FLOPs in `steps`
  steps on `devices` devices of `chip`: the analytic one at the stated `mfu` of the chip's bf16
  peak, the compiler's one at its `optimal_seconds` per step (None without a current compile)."""
  c = chips_lib.TABLE[chip]
  chips = devices / c.devices_per_chip
  analytic = compute / (devices * c.bf16 * mfu) * chips / 3600
  est = estimate(found.row) if found is not None and found.current else None
  return analytic, (est["step_s"] * steps * chips / 3600 if est else None)


def fmt_bytes(n: float | None) -> str:
  return "-" if n is None else f"{n / GiB:.2f}"


def markdown(rows: list[dict], cpu: dict[str, dict] | None = None) -> str:
  """A Markdown table of compile rows: per member its topology, mesh, HBM per device by part, the
  verdict against the chip's usable HBM, compile seconds, the compiler's FLOPs against the
  analytic count, and the compiler's step-time and MFU estimates; `cpu`: rows of the fake-CPU
  compile of the same members, whose total goes beside the TPU one."""
  head = [
    "member",
    "topology",
    "mesh d x f x t",
    "setting",
    "args GiB",
    "out GiB",
    "alias GiB",
    "temp GiB",
    "total GiB",
    *(["CPU total GiB"] if cpu is not None else []),
    "planned GiB",
    "usable GiB",
    "verdict",
    "compile s",
    "compiler / analytic FLOPs",
    "windowed-einsum loops",
    "est. step ms",
    "est. MFU",
  ]
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for r in rows:
    mem, key = r.get("memory") or {}, r.get("key") or {}
    plan = r.get("plan") or {}
    est = estimate(r)
    mesh = "x".join(str(r["mesh"][a]) for a in ("data", "fsdp", "tensor")) if r.get("mesh") else "-"
    flops = flops_ratio(r)
    cpu_total = ((cpu or {}).get(r["member"]) or {}).get("memory") or {}
    cells = [
      r["member"],
      r.get("topology") or "-",
      mesh,
      f"{key.get('remat', '-')} ce{key.get('ce_chunk', '-')} k{key.get('microbatches', '-')}",
      fmt_bytes(mem.get("argument")),
      fmt_bytes(mem.get("output")),
      fmt_bytes(mem.get("alias")),
      fmt_bytes(mem.get("temp")),
      fmt_bytes(mem.get("total")),
      *([fmt_bytes(cpu_total.get("total"))] if cpu is not None else []),
      fmt_bytes((plan.get("predicted") or {}).get("total")),
      fmt_bytes(usable_bytes(r["chip"])) if r.get("chip") in chips_lib.CHIPS else "-",
      (compiled_verdict(r) or f"FAILED: {r.get('error')}"),
      f"{r['compile_s']:.0f}" if r.get("compile_s") is not None else "-",
      f"{flops:.3f}" if flops else "-",
      str((r.get("loops") or {}).get("windowed_einsum", "-")),
      f"{est['step_s'] * 1e3:.1f}" if est else "-",
      f"{est['mfu']:.1%}" if est else "-",
    ]
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n" + MARKDOWN_NOTE


# What the table's compiler columns are (docs/performance.md, "What the TPU compiler says").
MARKDOWN_NOTE = (
  "\nGiB per device from XLA's memory_analysis(); total = args + out - alias + temp. Verdict: the "
  "compiled total against the chip's usable HBM (hbm x usable, what the plan fills). Compiler / "
  "analytic FLOPs: cost_analysis() flops over models/flops.py's (+ the remat recompute); a "
  "compile with windowed-einsum loops (XLA's collective matmul for FSDP) reads low, as the cost "
  "analysis counts a loop's body once (- = not recorded). est. step and MFU: the compiler's "
  "optimal_seconds and the analytic model FLOPs over it: the compiler's estimate, not a "
  "measurement.\n"
)


def ratio(row: dict) -> float | None:
  """compiled / predicted bytes per device of a row (None without both)."""
  mem, plan = row.get("memory") or {}, row.get("plan") or {}
  total, pred = mem.get("total"), (plan.get("predicted") or {}).get("total")
  return total / pred if total and pred and not row.get("error") else None


def margin_from(ratios: list[float], floor: float, step: float = 0.05) -> float:
  """The margin a set of compiled/predicted ratios calls for: the largest, rounded up to the next
  `step`, never below `floor` (how memory.MARGINS were set from the CPU data)."""
  return round(max(floor, math.ceil(max(ratios) / step - 1e-9) * step), 4) if ratios else floor


# ---------------------------------------------------------------------------- calibration ---
CPU_CALIBRATION = os.path.join(ROOT, "results", "memory_calibration")  # the XLA:CPU compiles


def cpu_rows(directory: str = CPU_CALIBRATION, only: str = "") -> list[dict]:
  """The fake-CPU-mesh compile rows (`launch.compile_check --out` files) with a plan; `only`: of
  that one file."""
  rows = []
  for name in sorted(os.listdir(directory)) if os.path.isdir(directory) else []:
    if name.endswith(".json") and name == (only or name):
      with open(os.path.join(directory, name), encoding="utf-8") as f:
        rows += [r for r in json.load(f)["members"] if not r["error"] and r.get("plan")]
  return rows


def archived_rows(archive: str = ARCHIVE) -> list[dict]:
  """Every archived compile row with a plan and no error, from every directory of `archive`
  (results/tpu_aot: v5p/, v6e/, calibration/<remat>/, design/<variant>/; results/gpu_aot: h100/)."""
  rows = []
  for parent, _, files in sorted(os.walk(archive)):
    if any(f.endswith(".json") for f in files):
      rows += [r for r in load(parent).values() if not r.get("error") and r.get("plan")]
  return rows


def remat_of(row: dict) -> str:
  return dict(p.split("=") for p in row["plan"]["setting"].split(", "))["remat"]


def ratios_by_remat(rows: list[dict]) -> dict[str, list[float]]:
  """compiled / predicted bytes per device, per remat policy of the compiled setting."""
  out: dict[str, list[float]] = {}
  for r in rows:
    value = ratio(r)
    if value is not None:
      out.setdefault(remat_of(r), []).append(value)
  return out


def calibration_markdown(
  tpu: list[dict], cpu: list[dict], floor: float, margins: dict, name: str = "TPU"
) -> str:
  """Per remat policy: the compiled / predicted ratios on TPU (libtpu) or GPU (XLA:GPU, `name`)
  beside XLA:CPU's (fake mesh), their range, the margin each calls for (`margin_from`) and the
  margin in force."""
  t, c = ratios_by_remat(tpu), ratios_by_remat(cpu)
  lines = [
    f"| remat | {name} compiles | {name} ratio min / median / max | {name} margin | CPU compiles | "
    f"CPU ratio min / median / max | CPU margin | {name} margin in force |",
    "|---|---|---|---|---|---|---|---|",
  ]

  def span(xs: list[float]) -> str:
    if not xs:
      return "-"
    xs = sorted(xs)
    mid = xs[len(xs) // 2] if len(xs) % 2 else (xs[len(xs) // 2 - 1] + xs[len(xs) // 2]) / 2
    return f"{xs[0]:.3f} / {mid:.3f} / {xs[-1]:.3f}"

  for remat in ("none", "dots", "full"):
    lines.append(
      f"| {remat} | {len(t.get(remat, []))} | {span(t.get(remat, []))} | "
      f"{margin_from(t.get(remat, []), floor):.2f} | {len(c.get(remat, []))} | "
      f"{span(c.get(remat, []))} | {margin_from(c.get(remat, []), floor):.2f} | "
      f"{margins[remat]:.2f} |"
    )
  return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
  """`python -m cbert_jax.scaling.compiled [--archive DIR]`: the memory plan's TPU calibration
  (compiled / predicted per remat policy on TPU beside XLA:CPU's, the margins they call for and
  those in force) and each archive directory's table, as Markdown."""
  import argparse  # pylint: disable=import-outside-toplevel

  from cbert_jax.scaling import memory  # pylint: disable=import-outside-toplevel

  p = argparse.ArgumentParser(description=main.__doc__)
  p.add_argument(
    "--archive", default=ARCHIVE, help="the TPU compile rows (default results/tpu_aot)"
  )
  p.add_argument(
    "--gpu_archive", default=GPU_ARCHIVE, help="the GPU compile rows (default results/gpu_aot)"
  )
  ns = p.parse_args(argv)
  floor = memory.MARGIN_FLOOR
  print(calibration_markdown(archived_rows(ns.archive), cpu_rows(), floor, memory.TPU_MARGINS))
  gpu = archived_rows(ns.gpu_archive)
  if gpu:
    print(calibration_markdown(gpu, cpu_rows(), floor, memory.GPU_MARGINS, name="GPU"))
  for parent, _, files in [*sorted(os.walk(ns.archive)), *sorted(os.walk(ns.gpu_archive))]:
    if any(f.endswith(".json") for f in files):
      rows = sorted(load(parent).values(), key=lambda r: r.get("params") or 0)
      where = os.path.relpath(parent, os.path.dirname(os.path.normpath(ns.archive)))
      cpu = CPU_TWIN.get(where)
      cpu = {r["member"]: r for r in cpu_rows(only=cpu)} if cpu else None
      print(f"### {where}\n\n{markdown(rows, cpu)}")
  return 0


# The XLA:CPU compiles of the same members and settings as an archive directory (the CPU column).
CPU_TWIN = {
  "tpu_aot/v5p": "paper_v5p.json",
  "tpu_aot/calibration/dots": "compile_dots.json",
  "tpu_aot/calibration/full": "compile_full.json",
  "gpu_aot/h100": "replan_h100.json",
}


if __name__ == "__main__":
  raise SystemExit(main())
