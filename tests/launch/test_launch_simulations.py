"""End-to-end launch simulations on this machine: each backend's real launch path, with stub
cluster commands (tests/stubs/, see simlib.py), trains a tiny member (tests/fixtures/launch_member.py)
planned for 2 devices (slurm: 1 node x 2 GPUs) or 4 (TPU: no slice has 2 chips; 2 hosts x 2).

  slurm   `launch.sweep --backend slurm --execute` writes the sbatch script and submits it to the
          stub sbatch, which runs it with SLURM's batch environment; the stub srun starts 2 tasks
          (1 node x 2 GPUs, one task per GPU) with SLURM's task environment; like Slurm's srun
          it SIGKILLs its tasks on SIGTERM, so only a signal to the tasks themselves lets the
          trainers checkpoint. Near "the time limit" the test sends USR1 to the batch script: its
          trap has (stub) scancel send SIGTERM to the step's tasks, the trainers checkpoint,
          `scontrol requeue` is recorded and the job runs again (SLURM_RESTART_COUNT=1): it
          resumes; a step later the test preempts it (a TERM to the batch script, the job marked
          for requeue as under PreemptMode=REQUEUE): the trap stops the step the same way, the
          job runs again (restart 2), resumes from that checkpoint, finishes and probes.
  tpu-vm  `--execute --setup_workers` first runs the worker setup through the stub gcloud (uv's
          Python in ~/cbert_jax-venv on each worker, its version checked before the install:
          the stub uv records both), then `gcloud compute tpus tpu-vm ssh --worker=all
          --command=...`: 2 workers of 2 fake devices, JAX's own GceTpuCluster detection
          (metadata served by the sitecustomize shim); train then probe, uninterrupted, on the
          setup's Python.
  xpk     `--execute` submits `xpk workload create` to the stub xpk: 2 pods run the command inside
          xpk's container script (with --xpk_storage, first `python -m launch.commit_check` on
          the workdir: a checkpoint can commit there). The test sends SIGTERM to the pods (an
          eviction): it reaches the trainers through xpk's trap and the member wrapper, they
          checkpoint, the wrapper exits 143, and the JobSet (xpk's --max-restarts) restarts the
          pods, which resume from the checkpoint; then the test deletes the workload (finishing
          it would repeat the slurm run's resume and the tpu-vm run's probe through the same
          wrapper).

The three run at once, in one test: apart, the interrupted ones would each need their own
uninterrupted reference run, and pytest-xdist may put separate tests on separate workers. All
three log the same per-step losses: slurm's twice interrupted-and-resumed run equals tpu-vm's
uninterrupted one (to rounding: 2 devices against 4), xpk's steps before its stop equal tpu-vm's
(same 4-device mesh) to float precision. The trainer refuses a member on another device count
than planned, so a run that trains shows it saw its planned devices; config.json's provenance
says so too, and the JAX detection record (sitecustomize.py) shows which cluster JAX found and
which GPUs it gave each process.

The test that JAX gives each of a node's 8 tasks its own GPU under the rendered script (and GPU 0
only under the old one-task-per-node script) calls JAX's detection in this process.
"""

import glob
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from cbert_jax.run import record
from cbert_jax.run import status as status_lib
from cbert_jax.scaling import chips as chips_lib
from launch import sweep
from tests import xla_flags
from tests.helpers import losses
from tests.stubs import simlib

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STUBS = os.path.join(REPO, "tests", "stubs")
EXP = "tests/fixtures/launch_member.py"
CORPUS = os.path.join(REPO, "tests", "fixtures", "tiny_corpus.txt")
MEMBER = "bert_d32L2"
# The member's total_steps: 60 instead of its 30 (tests/fixtures/launch_member.py), for every
# backend (the same schedule, so the same losses). A stop lands some steps after its signal (~7 at
# ~40 ms a step here, more under load); the slurm run stops twice before the end. The extra steps
# cost ~1-3 s a run; a start (processes, JAX, the cached compile) costs 15-50 s here.
STEPS = 60
STOP_AFTER = 3  # signal once this step is logged
TIMEOUT_S = 420


def sim_env(tmp, jax_cache, devices: int = 1) -> dict:
  """The environment of a launch: the stub commands first on PATH, their record dir, the toy
  probe task, a shared persistent compile cache and faster (unoptimised) XLA CPU compiles."""
  env = dict(os.environ)
  env.update(
    PATH=f"{STUBS}{os.pathsep}{env['PATH']}",
    CBERT_SIM_DIR=str(tmp / "sim"),
    CBERT_SIM_TOY_TASKS="1",
    JAX_COMPILATION_CACHE_DIR=str(jax_cache),
    JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
    JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
    CBERT_SIM_XLA_FLAGS=xla_flags.FAST,
    CBERT_SIM_DEVICES=str(devices),
    CBERT_SIM_PYTHON=sys.executable,
    HOME=str(tmp),
  )
  return env


def launch_cmd(backend: str, shared, *extra, scale: str = "sim2", python=True) -> list[str]:
  """python=False: the backend's default interpreter (tpu-vm: the setup's environment)."""
  return [
    sys.executable,
    "-m",
    "launch.sweep",
    "--config",
    f"{EXP}:{scale}",
    "--backend",
    backend,
    "--shared_root",
    str(shared),
    *(["--python", sys.executable] if python else []),
    "--execute",
    f"--override=--config.data.corpus_files={CORPUS}",
    f"--override=--config.total_steps={STEPS}",
    *extra,
  ]


def workdir(shared, scale: str = "sim2") -> str:
  return os.path.join(str(shared), f"launch_member_{scale}", MEMBER)


def logged_step(wd: str) -> int:
  try:
    return max(losses(wd), default=0)
  except (OSError, ValueError):
    return 0


def wait_for(what: str, check, deadline: float, diagnose=lambda: ""):
  while True:
    got = check()
    if got:
      return got
    if time.time() > deadline:
      raise AssertionError(f"timed out waiting for {what}\n{diagnose()}")
    time.sleep(0.05)


def tail(path, n=4000) -> str:
  try:
    with open(path, errors="replace") as f:
      return f"---- {path}\n" + f.read()[-n:]
  except OSError:
    return f"---- {path}: none"


def detections(sim) -> list[dict]:
  return simlib.read_records(str(sim), "jax_detect")


def first_event(sim, kind: str, event: str) -> dict | None:
  """The first record of `kind` (slurm, xpk) whose event is `event`, or None yet."""
  return next((e for e in simlib.read_records(str(sim), kind) if e["event"] == event), None)


def launch_ok(backend: str, shared, env, out: dict, *flags, **kw) -> None:
  """Runs `launch.sweep --execute` for `backend` (it submits and returns) and asserts it did."""
  r = subprocess.run(
    launch_cmd(backend, shared, *flags, **kw),
    cwd=REPO,
    env=env,
    capture_output=True,
    text=True,
    timeout=120,
  )
  out["launch"] = r
  assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]


# ------------------------------------------------------------- the backends ---


def run_slurm(tmp, jax_cache, out: dict) -> None:
  shared, sim, env = tmp / "shared", tmp / "sim", sim_env(tmp, jax_cache)
  wd, log = workdir(shared), os.path.join(workdir(shared), "..", "logs", f"{MEMBER}.log")
  deadline = time.time() + TIMEOUT_S
  diagnose = lambda: (
    tail(log)
    + "\n"
    + "".join(tail(p) for p in glob.glob(f"{sim}/*.err") + glob.glob(f"{sim}/*.jsonl"))
  )
  read_log = lambda: open(log, errors="replace").read() if os.path.exists(log) else ""
  launch_ok("slurm", shared, env, out, "--gpus_per_node", "2")
  start = wait_for(
    "the batch script", lambda: first_event(sim, "slurm", "start"), deadline, diagnose
  )
  wait_for(f"step {STOP_AFTER}", lambda: logged_step(wd) >= STOP_AFTER, deadline, diagnose)
  os.kill(start["pid"], signal.SIGUSR1)  # SLURM's --signal=B:USR1@<s>: time limit near
  # The requeued job resumes; once it has trained a step past its checkpoint, it is preempted: a
  # TERM to its batch shell, requeued by Slurm (PreemptMode=REQUEUE) whatever the script does.
  resumed = wait_for(
    "the resume after USR1",
    lambda: re.search(r"resumed from checkpoint at step (\d+)", read_log()),
    deadline,
    diagnose,
  )
  k = int(resumed.group(1))
  wait_for(f"step {k + 1}", lambda: logged_step(wd) > k, deadline, diagnose)
  second = next(e for e in simlib.read_records(str(sim), "slurm") if e.get("restart") == 1)
  simlib.preempt(second["job"], str(sim))
  os.kill(second["pid"], signal.SIGTERM)
  out["done"] = wait_for(
    "the requeued job to end", lambda: first_event(sim, "slurm", "done"), deadline, diagnose
  )
  out["log"] = read_log()
  out["checkpoints"] = record.checkpoint_steps(wd)


def run_tpu_vm(tmp, jax_cache, out: dict) -> None:
  shared, env = tmp / "shared", sim_env(tmp, jax_cache, devices=2)
  out["launch"] = subprocess.run(
    launch_cmd(
      "tpu-vm",
      shared,
      "--zone",
      "sim-zone",
      "--project",
      "sim-project",
      "--tpu_prefix",
      "sim-",
      "--tpu_generation",
      "v5e",
      "--setup_workers",  # each worker: uv's Python 3.11 in ~/cbert_jax-venv, checked, installed
      scale="sim4",
      python=False,
    ),
    cwd=REPO,
    env=env,
    capture_output=True,
    text=True,
    timeout=TIMEOUT_S,
  )
  out["log"] = open(os.path.join(str(shared), "launch_member_sim4", "logs", f"{MEMBER}.log")).read()
  setup = os.path.join(str(tmp / "sim"), "tpu_setup.log")
  out["setup"] = open(setup).read().splitlines() if os.path.exists(setup) else []


def run_xpk(tmp, jax_cache, out: dict) -> None:
  shared, sim, env = tmp / "shared", tmp / "sim", sim_env(tmp, jax_cache, devices=2)
  wd = workdir(shared, "sim4")
  deadline = time.time() + TIMEOUT_S
  diagnose = lambda: "".join(
    tail(p) for p in sorted(glob.glob(f"{sim}/xpk/*/*.log")) + glob.glob(f"{sim}/*.err")
  )
  launch_ok(
    "xpk",
    shared,
    env,
    out,
    "--cluster",
    "sim",
    "--docker_image",
    "sim-image",
    "--code_dir",
    REPO,
    "--xpk_storage",
    "simfs",
    "--termination_grace_seconds",
    "120",
    "--tpu_generation",
    "v5e",
    scale="sim4",
  )
  pods = wait_for("the pods", lambda: first_event(sim, "xpk", "pods"), deadline, diagnose)
  wait_for(f"step {STOP_AFTER}", lambda: logged_step(wd) >= STOP_AFTER, deadline, diagnose)
  for pid in pods["pids"]:  # Kubernetes evicts the pods: SIGTERM to each
    os.kill(pid, signal.SIGTERM)
  wait_for(
    "the restart",
    lambda: any(e["event"] == "restart" for e in simlib.read_records(str(sim), "xpk")),
    deadline,
    diagnose,
  )
  # The restarted pods resume from the checkpoint and train on; then the test deletes the
  # workload (finishing it would repeat what the slurm run shows, at the cost of two launches).
  # Deleted once the resumed train loop runs, so the resumed losses can be compared.
  attempt1 = lambda: "".join(
    open(p, errors="replace").read() for p in glob.glob(f"{sim}/xpk/*/attempt1-pod*.log")
  )
  resumed = wait_for(
    "the resume",
    lambda: re.search(r"resumed from checkpoint at step (\d+)", attempt1()),
    deadline,
    diagnose,
  )
  k = int(resumed.group(1))
  wait_for(
    f"step {k + 1} after the resume",
    lambda: f"step {k + 1}/{STEPS}" in attempt1(),
    deadline,
    diagnose,
  )
  out["delete"] = subprocess.run(
    ["xpk", "workload", "delete", "--workload=cbert-bert-d32l2", "--cluster=sim"],
    env=env,
    capture_output=True,
    text=True,
    timeout=60,
  )
  out["done"] = wait_for(
    "the workload to end",
    lambda: next((e for e in simlib.read_records(str(sim), "xpk") if e["event"] == "done"), None),
    deadline,
    diagnose,
  )
  out["pod_logs"] = {
    os.path.basename(p): open(p, errors="replace").read()
    for p in sorted(glob.glob(f"{sim}/xpk/*/*.log"))
  }


def check_member(shared, sim, cluster: str, devices: int = 2, chip: str = "") -> dict:
  """What every backend's run must show; returns the member's {step: loss}. `chip`: the chip the
  launcher exported the XLA flags and variables of, which config.json records."""
  wd = workdir(shared, f"sim{devices}")
  assert status_lib.member_state(MEMBER, wd).state == "done"  # final checkpoint + probe
  saved = json.load(open(os.path.join(wd, "config.json")))
  assert saved["config"]["sweep"]["target_devices"] == devices
  prov = saved["provenance"]  # 2 processes, each with its share of the devices
  assert (prov["device_count"], prov["process_count"], prov["local_device_count"]) == (
    devices,
    2,
    devices // 2,
  )
  # The trainer ran with (and recorded) what the launcher exported for the chip. On slurm the
  # stub srun gives each task the fake-device XLA_FLAGS of a CPU simulation instead of the GPU's.
  exported = dict(chips_lib.chip_env(chips_lib.CHIPS[chip])) if chip else {}
  if cluster == "SlurmCluster":
    exported.pop("XLA_FLAGS", None)
  assert exported and prov["environment"].items() >= exported.items(), prov["environment"]
  probe = json.load(open(record.probe_results(wd, STEPS)))
  assert set(probe["results"]) >= {"toy_cls", "average"}
  found = detections(sim)  # JAX's own cluster detection, in every process it ran
  assert found and {d["cluster"] for d in found} == {cluster}, found
  assert {d["num_processes"] for d in found} == {2} and {d["process_id"] for d in found} == {0, 1}
  # Several processes prepared the data into one cache at once: one tokenizer, one packed file,
  # no temp file left (atomic renames of content-addressed files).
  cache = os.path.join(str(shared), "cache")
  assert len(glob.glob(f"{cache}/tokenizers/*.model")) == 1
  assert len(glob.glob(f"{cache}/packed/*.npz")) == 1
  assert not [p for p in glob.glob(f"{cache}/**/*", recursive=True) if ".tmp" in p]
  got = losses(wd)
  assert sorted(got) == list(range(1, STEPS + 1))
  return got


def stopped_steps(text: str) -> list[int]:
  """The steps at which the trainers stopped on SIGTERM (every process logs its stop)."""
  found = re.findall(r"stopping at step (\d+) \(SIGTERM\); saving a checkpoint", text)
  assert found, text[-3000:]
  return sorted({int(k) for k in found})


def stopped_step(text: str) -> int:
  return stopped_steps(text)[0]


@pytest.mark.skipif(sys.platform != "linux", reason="process groups and signals as on Linux")
def test_slurm_tpu_vm_and_xpk_launches_train_the_same_member(tmp_path):
  jax_cache = tmp_path / "jax_cache"
  results = {b: {} for b in ("slurm", "tpu-vm", "xpk")}
  runners = {"slurm": run_slurm, "tpu-vm": run_tpu_vm, "xpk": run_xpk}
  errors = {}

  def run(backend):
    try:
      runners[backend](tmp_path / backend, jax_cache, results[backend])
    except BaseException as e:  # pylint: disable=broad-except
      errors[backend] = e

  for b in runners:
    (tmp_path / b).mkdir()
  threads = [threading.Thread(target=run, args=(b,)) for b in runners]
  try:
    for t in threads:
      t.start()
    for t in threads:
      t.join(TIMEOUT_S + 60)
  finally:  # nothing a stub detached outlives the test
    for b in runners:
      simlib.kill_all(str(tmp_path / b / "sim"))
  for b, e in errors.items():
    raise AssertionError(f"{b}: {e}") from e

  # tpu-vm: the uninterrupted reference.
  r = results["tpu-vm"]["launch"]
  assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
  assert f"{MEMBER}: done" in r.stdout
  reference = check_member(
    tmp_path / "tpu-vm" / "shared", tmp_path / "tpu-vm" / "sim", "GceTpuCluster", 4, "v5e"
  )
  tpu = detections(tmp_path / "tpu-vm" / "sim")
  assert {d["local_device_ids"] is None for d in tpu} == {True}  # JAX never restricts a TPU VM
  assert {d["coordinator"].split(":")[0] for d in tpu} == {"localhost"}  # worker 0's endpoint
  assert "resumed from checkpoint" not in results["tpu-vm"]["log"]
  # --setup_workers on each worker: uv made the environment, its Python passed the version check
  # before anything was installed, and the members ran on that Python.
  setup = results["tpu-vm"]["setup"]
  for w in ("0", "1"):
    home = f"{tmp_path}/tpu-vm/tpu-worker{w}"  # the worker's own ~
    mine = [line.split(" ", 2)[::2] for line in setup if line.split(" ")[1] == w]
    assert mine == [
      ["uv", f"venv --python 3.11 {home}/cbert_jax-venv"],
      ["python", "-c"],  # the version check, before the install
      ["uv", f"pip install --python {home}/cbert_jax-venv/bin/python '{home}/cbert_jax-src[tpu]'"],
      ["python", "-m"],  # train, then probe, on the setup's Python
      ["python", "-m"],
    ], setup
  assert "tpu-vm setup: Python 3." in r.stdout + results["tpu-vm"]["log"]

  # slurm: one task per GPU, each with its own GPU. USR1 -> the tasks get SIGTERM from scancel
  # (never srun: it would SIGKILL them) -> checkpoint -> requeue -> resume; then a preemption (TERM
  # to the batch shell) -> the same, requeued by Slurm -> resume -> finish and probe.
  sim = tmp_path / "slurm" / "sim"
  done = results["slurm"]["done"]
  assert done["rc"] == 0 and done["restarts"] == 2, done
  assert [e["argv"] for e in simlib.read_records(str(sim), "scontrol")] == [
    ["requeue", str(done["job"])]
  ]  # the USR1 trap's; a preempted job is requeued by Slurm, not by the script
  log = results["slurm"]["log"]
  assert "USR1: time limit near; checkpointing, then requeueing job" in log
  assert f"TERM: checkpointing before job {done['job']} ends" in log
  sent = simlib.read_records(str(sim), "scancel")  # again each second until the step ends
  assert sent and {tuple(e["argv"]) for e in sent} == {("--signal=TERM", str(done["job"]))}
  assert any(len(e["to"]) == 2 for e in sent)  # both tasks of the step
  assert not simlib.read_records(str(sim), "signals")  # srun itself was never signalled
  assert "forcing job termination" not in log
  assert f"job {done['job']} (restart 1) on localhost" in log
  assert f"job {done['job']} (restart 2) on localhost" in log
  stops = stopped_steps(log)  # the USR1 stop, then the preemption's
  assert len(stops) == 2 and STOP_AFTER <= stops[0] < stops[1] < STEPS, stops
  for k in stops:  # each stop's checkpoint, at the step it stopped, is where the rerun resumed
    assert f"resumed from checkpoint at step {k}" in log
  assert results["slurm"]["checkpoints"] == [stops[1], STEPS]  # (keep_checkpoints=2)
  slurm = check_member(tmp_path / "slurm" / "shared", sim, "SlurmCluster", chip="h100")
  for d in detections(sim):  # task i sees GPUs 0,1 and JAX gives it GPU i (SLURM_LOCALID)
    assert d["env"]["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert d["local_device_ids"] == [int(d["env"]["SLURM_LOCALID"])] == [d["process_id"]]
  steps = [e["argv"][:4] for e in simlib.read_records(str(sim), "srun")]  # train x 3, probe
  assert steps == [["--nodes=1", "--ntasks-per-node=2", "--cpus-per-task=1", "--gpu-bind=none"]] * 4

  # xpk: SIGTERM to the pods reaches the trainers through xpk's trap and the member wrapper;
  # they checkpoint; the wrapper exits 143; the JobSet restarts the pods, which resume.
  sim = tmp_path / "xpk" / "sim"
  events = simlib.read_records(str(sim), "xpk")
  assert [e["event"] for e in events] == [
    "create",
    "pods",
    "attempt",
    "restart",
    "pods",
    "delete",
    "attempt",
    "done",
  ], events
  attempt0 = next(e for e in events if e["event"] == "attempt")
  assert (attempt0["rc"], attempt0["codes"]) == (143, [143, 143])  # in xpk's restart set
  assert results["xpk"]["done"]["deleted"] and results["xpk"]["done"]["restarts"] == 1
  logs = results["xpk"]["pod_logs"]
  first = "".join(v for n, v in logs.items() if n.startswith("attempt0"))
  second = "".join(v for n, v in logs.items() if n.startswith("attempt1"))
  k = stopped_step(first)
  assert (
    first.count(f"{MEMBER}: train stopped before its final step {STEPS} (SIGTERM); exit 143") == 2
  )  # each pod's wrapper: no probe
  assert first.count("EXIT_CODE=143") == 2 and "offline results written" not in first
  assert f"resumed from checkpoint at step {k}" in second  # and stopped again on delete
  # The delete's SIGTERM reaches each pod's wrapper while it trains or, when the remaining steps
  # finish first (a loaded machine), before its probe: exit 143 either way, no probe result.
  stopped = second.count(f"{MEMBER}: train stopped before its final step {STEPS} (SIGTERM)")
  assert stopped + second.count(f"{MEMBER}: SIGTERM; exit 143 before the probe") == 2, second
  assert second.count("EXIT_CODE=143") == 2 and "offline results written" not in second
  wd = workdir(tmp_path / "xpk" / "shared", "sim4")
  assert record.checkpoint_steps(wd)[-1] >= k
  prov = json.load(open(os.path.join(wd, "config.json")))["provenance"]
  assert (prov["device_count"], prov["process_count"], prov["local_device_count"]) == (4, 2, 2)
  v5e = dict(chips_lib.chip_env(chips_lib.CHIPS["v5e"]))  # exported by the pod's command
  assert prov["environment"]["LIBTPU_INIT_ARGS"] == v5e["LIBTPU_INIT_ARGS"]
  found = detections(sim)
  assert {d["cluster"] for d in found} == {"GkeTpuCluster"}
  assert {d["local_device_ids"] is None for d in found} == {True}
  assert {d["env"]["TPU_WORKER_ID"] for d in found} == {"0", "1"}
  create = events[0]
  assert (
    create["max_restarts"],
    create["termination_grace_period_seconds"],
    create["storage"],
  ) == (10, 120, ["simfs"])
  assert f"{sys.executable} -m launch.commit_check {wd} || exit $?; step " in create["command"]
  xpk = losses(wd)
  assert sorted(xpk)[:k] == list(range(1, k + 1))

  # Interrupted and resumed (slurm) or not (tpu-vm): the same losses at every step (another
  # mesh: 2 devices against 4, so to rounding); xpk's steps before its stop: the same exactly.
  steps = range(1, STEPS + 1)
  np.testing.assert_allclose([slurm[s] for s in steps], [reference[s] for s in steps], rtol=1e-4)
  np.testing.assert_allclose(
    [xpk[s] for s in range(1, k + 1)], [reference[s] for s in range(1, k + 1)], rtol=1e-6
  )


# ------------------------------------------------ one GPU per task, from JAX ---


def task_envs(srun_options: list[str], gpus_on_node: int, job_id: int = 4242) -> list[dict]:
  """The environment SLURM gives each task of a step with these srun options (one node)."""
  opts, _ = simlib.parse_srun([*srun_options, "true"])
  per_node = int(opts.get("ntasks-per-node") or 1)
  base = {"SLURM_JOB_ID": str(job_id), "SLURM_JOB_NODELIST": "gpu-node-1"}
  return [
    simlib.slurm_task_env(
      base,
      procid=i,
      ntasks=per_node,
      tasks_per_node=per_node,
      nodes=1,
      gpus_on_node=gpus_on_node,
      step_id=0,
    )
    for i in range(per_node)
  ]


def jax_detects(monkeypatch, env: dict):
  """JAX's own auto-detection (jax.distributed.initialize() with nothing given) in `env`."""
  from jax._src import clusters  # pylint: disable=import-outside-toplevel

  for k in list(os.environ):
    if k.startswith(("SLURM_", "OMPI_", "TPU_", "MEGASCALE_", "JAX_COORDINATOR")) or k in (
      "CUDA_VISIBLE_DEVICES",
      "KUBERNETES_SERVICE_HOST",
      "PMI_RANK",
    ):
      monkeypatch.delenv(k)
  for k, v in env.items():
    monkeypatch.setenv(k, v)
  return clusters.ClusterEnv.auto_detect_unset_distributed_params(None, None, None, None, None, 60)


def test_every_process_of_an_8_gpu_node_gets_its_own_gpu(tmp_path, monkeypatch):
  launch, _ = sweep.build(
    [
      "--config",
      "experiments/sweep.py",
      "--backend",
      "slurm",
      "--workdir_root",
      str(tmp_path),
      "--members",
      "bert_d384L6",
    ]
  )
  script = launch.jobs[0].script  # planned for 8 GPUs: 1 node x 8
  assert "#SBATCH --ntasks-per-node=8\n#SBATCH --gpus-per-node=8\n" in script
  tasks = shlex.split(re.search(r"^tasks=\((.*)\)$", script, re.M).group(1))
  got = []
  for env in task_envs(tasks, gpus_on_node=8):
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7"
    coordinator, n, pid, local = jax_detects(monkeypatch, env)
    assert (coordinator, n, pid) == (
      f"gpu-node-1:{4242 % 4096 + 61440}",
      8,
      int(env["SLURM_PROCID"]),
    )
    assert local == [pid]  # jax_cuda_visible_devices = GPU SLURM_LOCALID
    got += local
  assert sorted(got) == list(range(8))  # the 8 processes cover the node's 8 GPUs
  # What launch/sweep.py rendered before: `srun --nodes=1 --ntasks-per-node=1`, one process per
  # node, which JAX restricts to the GPU numbered SLURM_LOCALID = 0: 1 GPU of 8.
  old = [
    jax_detects(monkeypatch, env)[3]
    for env in task_envs(["--nodes=1", "--ntasks-per-node=1"], gpus_on_node=8)
  ]
  assert old == [[0]]
