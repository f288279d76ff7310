"""launch.sweep --execute (local members in parallel, slurm submissions), the code snapshot and
the launch manifest, `status`, and bad flags and configs (one error line, nothing written).

Nothing trains: the local run's members are a fake interpreter that writes what a finished member
leaves, and sbatch is a stand-in that prints what sbatch prints.
"""

import json
import os
import pathlib
import sys

import pytest

from cbert_jax.run import status as status_lib
from launch import members, snapshot, sweep
from tests import members as synthetic
from tests.launch_helpers import EXP, FIRST, build, job, run_main

# ------------------------------------------------------------------------- local --execute ---


FAKE = r"""
import json, os, sys
# A stand-in for `python -m cbert_jax.main`: a member's train or probe, in milliseconds.
flags = dict(a.split("=", 1) for a in sys.argv[1:] if a.startswith("--"))
workdir, arg = flags["--workdir"], flags["--config"].split(":", 1)[1]
name = os.path.basename(workdir)
here = os.path.dirname(os.path.abspath(__file__))
mode = flags.get("--config.mode", "train")
with open(os.path.join(here, "calls.txt"), "a") as f:
  f.write(f"{name} {mode}\n")
if os.path.exists(os.path.join(here, "fail_" + name)):
  print("I0101 train.py] some log line", file=sys.stderr)
  print("config error: planted failure", file=sys.stderr)
  print("W0101 a warning after it", file=sys.stderr)
  sys.exit(2)
os.makedirs(workdir, exist_ok=True)
if mode == "eval":
  os.makedirs(os.path.join(workdir, "eval"), exist_ok=True)
  with open(os.path.join(workdir, "eval", "step_4.json"), "w") as f:
    json.dump({"suite": "offline"}, f)
else:
  with open(os.path.join(workdir, "config.json"), "w") as f:
    json.dump({"config": {"total_steps": 4}}, f)
  os.makedirs(os.path.join(workdir, "checkpoints", "4"), exist_ok=True)
  print(f"{name}: step 4/4")
"""


TRIO = "bert_d32L2,crossbert_d32L2,bert_d64L2"


def local_sweep(capsys, tmp_path, root):
  return run_main(
    capsys,
    "--config",
    f"{EXP}:quick",
    "--backend",
    "local",
    "--workdir_root",
    root,
    "--members",
    TRIO,
    "--parallel",
    "2",
    "--execute",
    "--python",
    f"{sys.executable} {tmp_path / 'fake.py'}",
    "--override=--config.log_every=5",
  )


def calls(tmp_path) -> list[str]:
  return sorted((tmp_path / "calls.txt").read_text().splitlines())


def test_local_execute_runs_members_in_parallel_marks_failures_and_skips_done(tmp_path, capsys):
  (tmp_path / "fake.py").write_text(FAKE)
  (tmp_path / "fail_bert_d64L2").write_text("")
  root = tmp_path / "sweep"
  rc, out, err = local_sweep(capsys, tmp_path, root)
  assert rc == 1 and "1 of 3 members failed: bert_d64L2" in err
  assert calls(tmp_path) == [
    "bert_d32L2 eval",
    "bert_d32L2 train",
    "bert_d64L2 train",
    "crossbert_d32L2 eval",
    "crossbert_d32L2 train",
  ]
  states = {n: status_lib.member_state(n, str(root / n)).state for n in TRIO.split(",")}
  assert states == {"bert_d32L2": "done", "crossbert_d32L2": "done", "bert_d64L2": "failed"}
  assert (root / "bert_d64L2" / "FAILED").read_text() == "train: config error: planted failure\n"
  log = (root / "logs" / "bert_d32L2.log").read_text()
  assert "bert_d32L2: step 4/4" in log and log.count("==== ") == 2  # train and probe, headed
  assert "train: " in log and "--config.log_every=5 --config.mode=eval" in log
  assert "W0101 a warning after it" in (root / "logs" / "bert_d64L2.log").read_text()
  manifest = json.loads((root / "launch_manifest.json").read_text())
  assert manifest["backend"] == "local" and manifest["scale"] == "quick"
  assert manifest["experiment"] == EXP and manifest["overrides"] == ["--config.log_every=5"]
  assert [m["name"] for m in manifest["members"]] == TRIO.split(",")
  first = manifest["members"][0]
  assert first["workdir"] == str(root / "bert_d32L2") and first["target_devices"] == 0
  assert first["commands"]["probe"].endswith("--config.mode=eval")
  assert first["arg"] == "scale=quick,model=bert,size=d32L2" and first["script"] == ""

  rc, out, err = run_main(capsys, "status", "--workdir_root", root)
  assert rc == 0 and "3 members, 2 done, 0 running, 0 pending, 1 failed" in out
  rows = {line.split()[0]: line.split()[1:] for line in out.splitlines()[2:]}
  assert rows["bert_d32L2"][:2] == ["done", "4/4"] and rows["bert_d64L2"][0] == "failed"
  row = next(line for line in out.splitlines() if line.startswith("bert_d64L2 "))
  assert row.endswith("train: config error: planted failure")
  # the FLOPs done: the two finished members' share of the manifest's planned compute
  manifest = json.loads((root / "launch_manifest.json").read_text())
  c = {m["name"]: m["compute"] for m in manifest["members"]}
  share = 100 * (c["bert_d32L2"] + c["crossbert_d32L2"]) / sum(c.values())
  assert (
    out.splitlines()[-1]
    == f"now: {share:.1f}% of the sweep's {sum(c.values()):.3g} training FLOPs done"
  )

  (tmp_path / "calls.txt").unlink()  # a rerun: only the failed member runs
  rc, out, err = local_sweep(capsys, tmp_path, root)
  assert rc == 1 and calls(tmp_path) == ["bert_d64L2 train"]
  assert "bert_d32L2: done, skipped" in out and "crossbert_d32L2: done, skipped" in out

  (tmp_path / "fail_bert_d64L2").unlink()  # fixed: the rerun finishes it
  (tmp_path / "calls.txt").unlink()
  rc, out, err = local_sweep(capsys, tmp_path, root)
  assert rc == 0, err
  assert calls(tmp_path) == ["bert_d64L2 eval", "bert_d64L2 train"]
  assert not (root / "bert_d64L2" / "FAILED").exists()
  rc, out, _ = run_main(capsys, "status", "--workdir_root", root)
  assert "3 members, 3 done" in out


def test_a_member_that_looks_running_is_skipped_unless_asked(tmp_path, capsys):
  (tmp_path / "fake.py").write_text(FAKE)
  root = tmp_path / "sweep"
  (root / "bert_d32L2").mkdir(parents=True)
  (root / "bert_d32L2" / "metrics.jsonl").write_text("{}\n")  # just written: another trainer?
  args = (
    "--config",
    f"{EXP}:quick",
    "--backend",
    "local",
    "--workdir_root",
    root,
    "--members",
    "bert_d32L2",
    "--execute",
    "--python",
    f"{sys.executable} {tmp_path / 'fake.py'}",
  )
  rc, out, _ = run_main(capsys, *args)
  assert rc == 0
  assert "bert_d32L2: running (metrics.jsonl written in the last 10 min), skipped" in out
  assert not (tmp_path / "calls.txt").exists()
  rc, out, _ = run_main(capsys, *args, "--include_running")
  assert rc == 0 and calls(tmp_path) == ["bert_d32L2 eval", "bert_d32L2 train"]


# ----------------------------------------------------- slurm --execute, snapshot, manifest ---


def test_slurm_execute_writes_snapshot_scripts_configs_and_submits(tmp_path, capsys):
  root = tmp_path / "sweep"
  fake_sbatch = (
    f"{sys.executable} -c "  # prints what sbatch prints
    "'import sys; print(\"Submitted batch job 7 for\", sys.argv[1])'"
  )
  args = (
    "--config",
    EXP,
    "--backend",
    "slurm",
    "--workdir_root",
    root,
    "--members",
    "bert_d384L6,crossbert_d384L6",
    "--sbatch",
    fake_sbatch,
    "--execute",
  )
  rc, out, err = run_main(capsys, *args)  # no corpus given: refused
  assert rc == 2 and "data.sources is empty for 2 member(s)" in err and not root.exists()
  rc, out, err = run_main(capsys, *args, "--override=--config.data.sources=/data/dclm/*.jsonl.zst")
  assert rc == 0, err
  script = root / "slurm" / "bert_d384L6.sbatch"
  assert f"bert_d384L6: Submitted batch job 7 for {script}" in out
  assert os.access(script, os.X_OK) and (root / "logs").is_dir()
  config = json.loads((root / "slurm" / "bert_d384L6.config.json").read_text())
  assert config["arg"] == FIRST and config["config"]["sweep"]["target_devices"] == 8
  code = root / "code" / snapshot.snapshot_id()
  for rel in ("cbert_jax/main.py", "experiments/sweep.py", "launch/sweep.py", "pyproject.toml"):
    assert (code / rel).read_bytes() == (pathlib.Path(members.REPO) / rel).read_bytes()
  assert not list(code.rglob("__pycache__"))
  manifest = json.loads((root / "launch_manifest.json").read_text())
  assert manifest["code_dir"] == str(code) and manifest["members"][0]["script"] == str(script)
  assert manifest["members"][0]["launch"][0].endswith(f" {script}")  # the sbatch command
  # A later launch of other members keeps these in the manifest; another scale is refused.
  rc, out, err = run_main(
    capsys,
    "--config",
    EXP,
    "--backend",
    "slurm",
    "--workdir_root",
    root,
    "--members",
    "bert_d512L8",
    "--sbatch",
    fake_sbatch,
    "--execute",
    "--override=--config.data.sources=/data/dclm/*.jsonl.zst",
  )
  assert rc == 0 and "(exists: same code)" in out
  names = [m["name"] for m in json.loads((root / "launch_manifest.json").read_text())["members"]]
  assert names == ["bert_d384L6", "crossbert_d384L6", "bert_d512L8"]
  rc, out, err = run_main(
    capsys, "--config", f"{EXP}:cpu", "--backend", "local", "--workdir_root", root
  )
  assert rc == 2 and err == (
    f"error: --workdir_root={root} holds a paper sweep "
    "(launch_manifest.json); this is the cpu sweep: use another "
    "--workdir_root\n"
  )


def test_snapshot_holds_an_experiment_file_outside_experiments(tmp_path):
  launch = build(
    tmp_path / "r",
    "--config",
    "tests/fixtures/launch_member.py:sim2",
    "--backend",
    "slurm",
    "--gpus_per_node",
    "2",
  )
  assert launch.snapshot_extra == ("tests/fixtures/launch_member.py",)
  assert "tests/fixtures/launch_member.py" in snapshot.snapshot_files(
    members.REPO, launch.snapshot_extra
  )
  assert launch.code_dir.endswith(snapshot.snapshot_id(members.REPO, launch.snapshot_extra))
  assert snapshot.snapshot_id(members.REPO, launch.snapshot_extra) != snapshot.snapshot_id()
  snapshot.write_snapshot(str(tmp_path / "snap"), members.REPO, launch.snapshot_extra)
  assert (tmp_path / "snap" / "tests" / "fixtures" / "launch_member.py").is_file()
  assert not (tmp_path / "snap" / "tests" / "data" / "tiny_corpus.txt").exists()


# ---------------------------------------------------------------------------- status input ---


def test_status_reads_the_runner_manifest_or_member_directories(tmp_path, capsys):
  root = tmp_path / "sweep"
  for name in ("bert_d32L2", "crossbert_d32L2"):
    synthetic.write_member(root / name, synthetic.member_config(total_steps=4), checkpoints=[2])
  rc, out, _ = run_main(capsys, "status", "--workdir_root", root)
  assert rc == 0 and "(member directories): 2 members, 0 done, 0 running, 2 pending" in out
  assert "bert_d32L2       pending  2/4" in out
  (root / "sweep.json").write_text(
    json.dumps({"scale": "cpu", "members": [{"name": "bert_d32L2"}, {"name": "bert_d64L2"}]})
  )
  rc, out, _ = run_main(capsys, "status", "--workdir_root", root, "--no-probe")
  assert rc == 0 and "(sweep.json): 2 members" in out and "bert_d64L2  pending  0/?" in out
  rc, _, err = run_main(capsys, "status", "--workdir_root", tmp_path / "nope")
  assert rc == 2 and err.startswith("error: --workdir_root=")


# ------------------------------------------------------------------------------- bad input ---


@pytest.mark.parametrize(
  "argv, message",
  [
    (
      ["--backend", "slurm", "--gpus_per_node", "3"],
      "error: --gpus_per_node=3 does not divide target_devices=8 of member bert_d384L6",
    ),
    (
      ["--backend", "slurm", "--time", "2 days"],
      "error: --time=2 days: expected a SLURM time (e.g. 48:00:00 or 2-00:00:00)",
    ),
    (
      ["--backend", "slurm", "--time", "5:00"],
      "error: --signal_seconds=300 must be in 1..65535 and below --time=5:00 (300 s)",
    ),
    (["--backend", "tpu-vm", "--project", "p"], "error: --backend tpu-vm needs --zone"),
    (["--backend", "tpu-vm"], "error: --backend tpu-vm needs --zone and --project"),
    (
      ["--backend", "tpu-vm", "--zone", "z", "--project", "p", "--tpu_prefix", "Big_"],
      "error: --tpu_prefix='Big_': must start with a lowercase letter and hold only [a-z0-9-]",
    ),
    (["--backend", "xpk", "--docker_image", "i"], "error: --backend xpk needs --cluster"),
    (["--backend", "xpk", "--cluster", "c"], "error: --backend xpk needs --docker_image"),
    (
      ["--backend", "local", "--members", "bert_d384L6,gpt_d1"],
      "error: --members: gpt_d1 not in the paper sweep; its members: bert_d384L6, ",
    ),
    (["--backend", "local", "--parallel", "0"], "error: --parallel=0 must be >= 1"),
    (
      ["--backend", "local", "--override=--config.batchsize=3"],
      "error: --override=--config.batchsize=3: unknown config field 'batchsize'",
    ),
    (
      ["--backend", "local", "--override=--config.total_steps=many"],
      "error: --override=--config.total_steps=many: expected int, got 'many'",
    ),
    (
      ["--backend", "local", "--override=--workdir=/x"],
      "error: --override=--workdir=/x: the launcher sets --config, --workdir",
    ),
    (
      ["--backend", "local", "--override=config.seed=1"],
      "error: --override=config.seed=1: expected a trainer flag",
    ),
    # A line break would end the #SBATCH line, the script comment or the pod's one-line command.
    (
      ["--backend", "slurm", "--partition", "gpu\n#SBATCH --qos=high"],
      "error: --partition='gpu\\n#SBATCH --qos=high': holds a line break or control character;",
    ),
    (["--backend", "slurm", "--account", "lab\r"], "error: --account='lab\\r': holds a line break"),
    (
      ["--backend", "slurm", "--setup", "module load cuda\nrm -rf /"],
      "error: --setup='module load cuda\\nrm -rf /': holds a line break",
    ),
    (["--backend", "slurm", "--shared_root", "/shared\nx"], "error: --shared_root='/shared\\nx'"),
    (
      ["--backend", "xpk", "--cluster", "c", "--docker_image", "i\n"],
      "error: --docker_image='i\\n': holds a line break",
    ),
    (
      ["--backend", "tpu-vm", "--zone", "z", "--project", "p", "--python", "python3\nid"],
      "error: --python='python3\\nid': holds a line break",
    ),
    (
      ["--backend", "local", "--override=--config.name=a\nb"],
      "error: --override='--config.name=a\\nb': holds a line break",
    ),
    (
      ["--backend", "xpk", "--cluster", "c", "--docker_image", "i", "--xpk_storage", "My_Fs"],
      "error: --xpk_storage='My_Fs': expected an xpk storage name",
    ),
    (
      ["--backend", "xpk", "--cluster", "c", "--docker_image", "i", "--max_restarts", "-1"],
      "error: --max_restarts=-1 must be >= 0",
    ),
    (
      [
        "--backend",
        "xpk",
        "--cluster",
        "c",
        "--docker_image",
        "i",
        "--termination_grace_seconds",
        "0",
      ],
      "error: --termination_grace_seconds=0 must be >= 1",
    ),
  ],
)
def test_bad_flags_are_one_error_line(tmp_path, capsys, argv, message):
  rc, out, err = run_main(capsys, "--config", EXP, "--workdir_root", tmp_path / "r", *argv)
  assert rc == 2 and err.startswith(message) and err.count("\n") == 1, err
  assert out == "" and not (tmp_path / "r").exists()  # nothing rendered, nothing written


@pytest.mark.parametrize(
  "config, message",
  [
    (f"{EXP}:cpu", "error: member bert_d32L2 has target_devices=0 (planned for this machine)"),
    (
      f"{EXP}:model=bert,size=d384L6",
      "error: --config=experiments/sweep.py:model=bert,size=d384L6:"
      " 'model=bert,size=d384L6' is one member",
    ),
    (f"{EXP}:auto", "error: --config=experiments/sweep.py:auto: the launcher needs a scale"),
    ("experiments/nope.py", "error: --config=experiments/nope.py: no such experiment file"),
    (f"{EXP}:scale=huge", "config error: experiments/sweep.py: scale must be one of"),
  ],
)
def test_bad_configs(tmp_path, capsys, config, message):
  rc, out, err = run_main(
    capsys, "--config", config, "--backend", "slurm", "--workdir_root", tmp_path / "r"
  )
  assert rc == 2 and err.startswith(message) and err.count("\n") == 1, err


def test_a_workdir_root_or_shared_root_is_required(capsys):
  rc, out, err = run_main(capsys, "--config", EXP, "--backend", "slurm")
  assert (
    rc == 2
    and out == ""
    and err
    == (
      "error: --workdir_root: required, or --shared_root (the workdirs then go to "
      "<shared_root>/<experiment>_<scale>)\n"
    )
  )


def test_a_url_root_is_refused_not_turned_into_a_local_path(capsys):
  for flag in ("--workdir_root", "--shared_root"):
    rc, out, err = run_main(capsys, "--config", EXP, "--backend", "xpk", flag, "gs://b/run")
    assert rc == 2 and out == "" and err.count("\n") == 1, err
    assert err.startswith(f"error: {flag}=gs://b/run: a URL;") and "mounted" in err


def test_argparse_rejects_an_unknown_backend(tmp_path, capsys):
  with pytest.raises(SystemExit) as e:
    sweep.main(["--config", EXP, "--backend", "k8s", "--workdir_root", str(tmp_path)])
  assert e.value.code == 2 and "invalid choice: 'k8s'" in capsys.readouterr().err


def test_members_are_planned_for_the_backends_chip_and_too_big_ones_are_refused(
  tmp_path, capsys, monkeypatch
):
  # slurm plans for --gpu_type, tpu-vm / xpk for --tpu_generation; the summary shows the plan.
  launch = build(
    tmp_path / "a",
    "--config",
    EXP,
    "--backend",
    "slurm",
    "--gpu_type",
    "h200",
    "--override=--config.data.sources=/data/c.jsonl",
  )
  c = job(launch, "crossbert_d2304L32").member.config
  assert c.sweep.chip == "h200" and c.sweep.memory_verdict == "fits"
  assert "memory on h200: remat=" in job(launch, "crossbert_d2304L32").member.summary()
  assert "--config.sweep.chip=h200" in job(launch, "bert_d384L6").train
  # A chip too small for any setting: a warning in the dry run, --execute refuses (exit 2).
  import dataclasses  # pylint: disable=import-outside-toplevel

  from cbert_jax.scaling import memory  # pylint: disable=import-outside-toplevel

  monkeypatch.setitem(memory.CHIPS, "v5e", dataclasses.replace(memory.CHIPS["v5e"], hbm=2**30))
  args = (
    "--config",
    EXP,
    "--backend",
    "xpk",
    "--cluster",
    "c",
    "--docker_image",
    "i",
    "--tpu_generation",
    "v5e",
    "--workdir_root",
    tmp_path / "b",
    "--override=--config.data.sources=/data/c.jsonl",
  )
  rc, out, err = run_main(capsys, *args)
  assert (
    rc == 0
    and "do not fit their chips at any memory setting (" in err
    and "crossbert_d2304L32" in err
  )
  rc, out, err = run_main(capsys, *args, "--execute")
  assert rc == 2 and err.startswith("error: ") and "give them more chips" in err
  assert not (tmp_path / "b").exists()  # nothing written
