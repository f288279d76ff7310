"""scaling/compiled.py, the TPU compile rows' readers: a row answers for a member's config only while
its key is the config's; the launcher refuses a current compile that does not fit; chip-hours from
the stated MFU and from the compiler's estimate; the Markdown table. The rows here are written for
the test (their numbers chosen to sit either side of a chip's usable HBM); the rows a real compile
writes are checked in tests/launch/test_compile_check_tpu.py."""

import math
import os

import pytest

from cbert_jax.scaling import chips as chips_lib
from cbert_jax.scaling import compiled as compiled_lib
from launch import compile_check
from tests.launch_helpers import BACKEND_ARGS, EXP, run_main

GiB = 2**30
USABLE_V5P = chips_lib.CHIPS["v5p"].hbm * chips_lib.CHIPS["v5p"].usable


def member(name="bert_d384L6", overrides=()):
  module, _ = compile_check.member_args(EXP)
  model, size = name.split("_")
  return compile_check.load_member(
    EXP, module, f"scale=paper,model={model},size={size}", list(overrides)
  )[1]


def write(archive, name, config, total, step_s=0.01):
  """An archived v5p row of `name` for `config` (its key), `total` bytes per device."""
  row = compile_check.empty_row(name, name)
  row |= {
    "path": "tpu",
    "topology": "v5p:2x2x2",
    "chip": "v5p",
    "devices": 8,
    "mesh": {"data": 1, "fsdp": 8, "tensor": 1},
    "key": compiled_lib.key_of(config, 8, "v5p", "v5p:2x2x2"),
    "memory": {"argument": 1, "output": 1, "alias": 1, "temp": total - 1, "total": total},
    "cost": {"flops": 1e12, "optimal_seconds": step_s},
    "analytic": {"model_flops": 1e12, "recompute_flops": 0.0},
    "date": "2026-12-08T00:00:00Z",
  }
  compiled_lib.write_row(os.path.join(archive, "v5p"), row)
  return row


def test_a_row_answers_only_for_the_config_it_was_compiled_for(tmp_path):
  config = member()
  write(str(tmp_path), "bert_d384L6", config, 2 * GiB)
  found = compiled_lib.member_lookup("bert_d384L6", config, str(tmp_path))
  assert found.current and found.stale == []
  assert found.describe().startswith(
    "TPU compile v5p:2x2x2: 2.00 GiB per chip (fits), step 10.0 ms"
  )
  assert "(compiler's estimate)" in found.describe()
  # Another batch (a new batch law, say): the row is stale, and says in what.
  other = member(overrides=["--config.sweep.batch_size=128"])
  stale = compiled_lib.member_lookup("bert_d384L6", other, str(tmp_path))
  assert not stale.current and stale.stale == ["batch_size: 120 != 128"]
  assert "STALE, compiled for another config (batch_size: 120 != 128)" in stale.describe()
  # No row; a member planned for a GPU has no TPU compile to look up.
  assert compiled_lib.member_lookup("bert_d512L8", member("bert_d512L8"), str(tmp_path)).row is None
  gpu = member(overrides=["--config.sweep.chip=h100"])
  assert compiled_lib.member_lookup("bert_d384L6", gpu, str(tmp_path)) is None


def test_refusal_only_for_a_current_compile_over_the_usable_hbm(tmp_path):
  config = member()
  write(str(tmp_path), "bert_d384L6", config, int(USABLE_V5P) + GiB)
  found = compiled_lib.member_lookup("bert_d384L6", config, str(tmp_path))
  assert compiled_lib.compiled_verdict(found.row) == "does not fit"
  assert compiled_lib.refusal("bert_d384L6", found) == (
    "bert_d384L6: its TPU compile (v5p:2x2x2, 2026-12-08T00:00:00Z) needs 86.50 GiB per chip, "
    "over v5p's usable 85.50 GiB"
  )
  other = member(overrides=["--config.sweep.batch_size=128"])  # stale: not the member's config
  assert (
    compiled_lib.refusal(
      "bert_d384L6", compiled_lib.member_lookup("bert_d384L6", other, str(tmp_path))
    )
    == ""
  )
  write(str(tmp_path), "bert_d384L6", config, int(USABLE_V5P))  # at the budget: fits
  assert (
    compiled_lib.refusal(
      "bert_d384L6", compiled_lib.member_lookup("bert_d384L6", config, str(tmp_path))
    )
    == ""
  )


def test_chip_hours_from_the_stated_mfu_and_from_the_compilers_estimate(tmp_path):
  config = member()
  write(str(tmp_path), "bert_d384L6", config, 2 * GiB, step_s=0.02)
  found = compiled_lib.member_lookup("bert_d384L6", config, str(tmp_path))
  c = config.sweep
  analytic, compiler = compiled_lib.chip_hours(c.compute, config.total_steps, 8, "v5p", 0.4, found)
  # v5p: one device per chip, so chip-seconds = FLOPs / (chip peak x MFU)
  assert analytic == pytest.approx(c.compute / (459e12 * 0.4) / 3600)
  assert compiler == pytest.approx(0.02 * config.total_steps * 8 / 3600)
  assert compiled_lib.chip_hours(c.compute, 1, 8, "v5p", 0.4, None)[1] is None


def test_markdown_and_margins(tmp_path):
  config = member()
  row = write(str(tmp_path), "bert_d384L6", config, 2 * GiB)
  row["plan"] = {"predicted": {"total": 4 * GiB}}
  text = compiled_lib.markdown([row], cpu={"bert_d384L6": {"memory": {"total": 3 * GiB}}})
  header, _, line = text.splitlines()[:3]
  assert header.count("|") == line.count("|")
  cells = [c.strip() for c in line.strip("|").split("|")]
  assert cells[:3] == ["bert_d384L6", "v5p:2x2x2", "1x8x1"]
  assert "2.00" in cells and "3.00" in cells and "4.00" in cells and "fits" in cells
  assert compiled_lib.ratio(row) == 0.5
  assert compiled_lib.margin_from([0.93, 1.02], floor=1.10) == 1.10
  assert compiled_lib.margin_from([0.93, 1.16], floor=1.10) == 1.20
  assert compiled_lib.margin_from([1.15], floor=1.10) == 1.15
  assert math.isclose(compiled_lib.margin_from([], floor=1.1), 1.1)


def test_launch_dry_run_shows_the_compile_and_execute_refuses_a_compile_that_does_not_fit(
  tmp_path, capsys
):
  config = member()
  write(str(tmp_path / "aot"), "bert_d384L6", config, int(USABLE_V5P) + GiB)
  argv = [
    "--config",
    EXP,
    "--backend",
    "xpk",
    *BACKEND_ARGS["xpk"],
    "--members",
    "bert_d384L6",
    "--workdir_root",
    tmp_path / "root",
    f"--aot={tmp_path / 'aot'}",
    "--override=--config.data.sources=/data/*.jsonl.zst",
  ]
  rc, out, err = run_main(capsys, *argv)
  assert rc == 0, err
  assert "TPU compile v5p:2x2x2: 86.50 GiB per chip (does not fit)" in out
  assert out.count("chip-hours: ") == 1 and "the TPU compiler's estimate for the 1" in out
  assert "warning: 1 member(s) do not fit their chips by their latest TPU compile" in err
  rc, out, err = run_main(capsys, *argv, "--execute")
  assert rc == 2
  (line,) = [l for l in err.splitlines() if l.startswith("error:")]
  assert "bert_d384L6: its TPU compile (v5p:2x2x2" in line and line.endswith("--ignore_tpu_compile")
