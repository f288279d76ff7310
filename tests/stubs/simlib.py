"""The stub cluster commands of the launch simulations (tests/launch/test_launch_simulations.py).

Each stub plays its real command on this one machine, with the environment the real cluster gives
a process, so that the trainer and JAX's own cluster detection run as they would there:

  sbatch    reads the script's #SBATCH lines (nodes, tasks and GPUs per node, --output), prints
            "Submitted batch job <id>" and runs the script in a detached job runner with the batch
            environment (SLURM_JOB_ID, SLURM_JOB_NODELIST=localhost, SLURM_GPUS_ON_NODE, ...,
            SLURM_RESTART_COUNT after a requeue), output appended to --output. The job id is chosen
            so that the coordinator port JAX derives from it (id % 4096 + 61440) is free. The
            script is its own process group (the batch step). When it exits the job ends: what is
            left of it and of its steps is SIGKILLed, as Slurm does. When the script asked
            `scontrol requeue`, or the job was preempted (`preempt`: PreemptMode=REQUEUE), the
            runner runs it again (restart count + 1), as SLURM does. Events (start with the
            script's pid, end, done) go to <CBERT_SIM_DIR>/slurm.jsonl.
  srun      starts the step's tasks here (one node) with the environment SLURM gives each task:
            SLURM_STEP_NODELIST, SLURM_NTASKS, SLURM_PROCID, SLURM_LOCALID, SLURM_STEP_NUM_NODES,
            CUDA_VISIBLE_DEVICES=0..G-1 (every GPU of the node: --gpu-bind=none), and 1 fake CPU
            device per task (XLA_FLAGS). Each task is its own process group, outside the batch
            script's (slurmstepd runs a step's tasks in the step's container, not under srun).
            Signals as Slurm's srun (src/srun/signals.c _forward_signal): SIGTERM, SIGHUP and
            SIGQUIT SIGKILL every task ("srun: forcing job termination"), so no task can handle
            them; SIGINT, SIGUSR1, SIGUSR2 are passed on as they are. Exits with the highest task
            status (a killed task: 128 + its signal). Steps (pids) go to <CBERT_SIM_DIR>/steps.jsonl.
  scancel   `--signal=SIG [--batch | --full] JOB[.STEP]` as scancel(1): by default every step's
            tasks of JOB (or of JOB.STEP) get SIG, and neither the batch script nor its srun;
            --batch: the batch shell only; --full: the batch shell's process group (its srun
            too). Records its arguments in <CBERT_SIM_DIR>/scancel.jsonl.
  scontrol  records its arguments; `requeue <id>` marks the job for a rerun.
  gcloud    `compute tpus tpu-vm create` is recorded; `... ssh NAME --worker=all --command=CMD` runs
            CMD under `bash -c` as CBERT_SIM_TPU_WORKERS (2) local workers, each in its own home
            (<HOME>/tpu-worker<i>, as each TPU VM host has its own), with CBERT_SIM_DEVICES (1)
            fake CPU devices and the TPU VM shim (sitecustomize.py: JAX's GceTpuCluster reads the
            worker number and endpoints from the "metadata server").
  uv        `uv venv --python V DIR` makes DIR/bin/python, which runs CBERT_SIM_PYTHON (the test's); `uv pip install`
            installs nothing (the members run from their code directory). Both (`uv <worker> <args>`,
            --quiet left out), and every run of DIR/bin/python (`python <worker> <first arg>`), append a line to
            <CBERT_SIM_DIR>/tpu_setup.log, in the order they happen.
  xpk       `workload create ... --command=CMD` prints what xpk prints and hands the workload to a
            detached JobSet controller: CBERT_SIM_XPK_PODS (2) pods, each running CMD inside xpk's
            own container script (XPK_CONTAINER, copied from xpk: `(CMD) & PID=$!` under a SIGTERM
            trap) with GKE's TPU_WORKER_ID / TPU_WORKER_HOSTNAMES and the TPU VM shim (JAX's
            GkeTpuCluster). When a pod fails the others get SIGTERM (SIGKILL after
            --termination-grace-period-seconds); an exit status in xpk's restart set (42, 127-255)
            restarts all pods, at most --max-restarts times, any other fails the workload.
            `workload delete --workload=W` stops W's pods the same way, without a restart.
            Events (pods with their pids, attempt, restart, delete, done) go to
            <CBERT_SIM_DIR>/xpk.jsonl.

Every process the stubs start for the trainer gets PYTHONPATH=<this dir>:..., CBERT_SIM_RECORD (JAX's
detection result, see sitecustomize.py) and the XLA_FLAGS of CBERT_SIM_XLA_FLAGS (extra flags for
faster CPU compiles) after the device count. Nothing here reaches the network.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import signal
import socket
import subprocess
import sys
import time

STUBS = os.path.dirname(os.path.abspath(__file__))
SLURM_PORT_BASE = 65535 - 2**12 + 1  # jax's SlurmCluster: job id % 4096 + this
XPK_RESTART_CODES = frozenset([42, *range(127, 256)])  # xpk get_restart_exit_codes (defaults)
# xpk's container command (xpk/core/docker_container.py, get_user_workload_container), with the
# poll interval (xpk: 5 s) a parameter.
XPK_CONTAINER = """echo XPK Start: $(date);
_sigterm() (kill -SIGTERM $! 2>/dev/null;);
trap _sigterm SIGTERM;
({command}) & PID=$!;
while kill -0 $PID 2>/dev/null;
    do sleep {poll};
done;
wait $PID;
EXIT_CODE=$?;
echo XPK End: $(date);
echo EXIT_CODE=$EXIT_CODE;
exit $EXIT_CODE"""


def sim_dir() -> str:
  path = os.environ.get("CBERT_SIM_DIR") or os.path.join(os.getcwd(), "cbert_sim")
  os.makedirs(path, exist_ok=True)
  return path


def record(stream: str, /, **fields) -> None:
  """Appends one JSON line to <CBERT_SIM_DIR>/<stream>.jsonl."""
  with open(os.path.join(sim_dir(), f"{stream}.jsonl"), "a") as f:
    f.write(json.dumps({"time": time.time(), **fields}) + "\n")


def read_records(directory: str, name: str) -> list[dict]:
  try:
    with open(os.path.join(directory, f"{name}.jsonl")) as f:
      return [json.loads(line) for line in f if line.strip()]
  except FileNotFoundError:
    return []


def port_is_free(port: int) -> bool:
  with socket.socket() as s:
    try:
      s.bind(("", port))
      return True
    except OSError:
      return False


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def trainer_env(base: dict, devices: int) -> dict:
  """The environment of a simulated trainer process: `devices` fake CPU devices, the shim dir on
  PYTHONPATH, JAX's detection recorded."""
  env = dict(base)
  extra = env.get("CBERT_SIM_XLA_FLAGS", "")
  env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices} {extra}".strip()
  env["JAX_PLATFORMS"] = "cpu"
  env["PYTHONPATH"] = os.pathsep.join([STUBS, *filter(None, [base.get("PYTHONPATH", "")])])
  env["CBERT_SIM_RECORD"] = os.path.join(sim_dir(), "jax_detect.jsonl")
  return env


FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def forward_signals(procs: list[subprocess.Popen]) -> None:
  """From now on, SIGTERM/SIGINT/SIGHUP to this process go to every live process of `procs` (a
  list that may still grow), as srun and ssh pass them on."""

  def on_signal(signum, frame):
    del frame
    sent = []
    for p in procs:
      if p.poll() is None:
        p.send_signal(signum)
        sent.append(p.pid)
    record("signals", stub=os.path.basename(sys.argv[0]), signal=signum, to=sent)

  for s in FORWARDED:
    signal.signal(s, on_signal)


def wait_all(procs: list[subprocess.Popen]) -> list[int]:
  """Every process's exit status (a signal death as 128 + signal, as a shell reports it)."""
  codes = []
  for p in procs:
    rc = p.wait()
    codes.append(128 - rc if rc < 0 else rc)
  return codes


# -------------------------------------------------------------------- SLURM ---


def slurm_task_env(
  base: dict,
  *,
  procid: int,
  ntasks: int,
  tasks_per_node: int,
  nodes: int,
  gpus_on_node: int,
  step_id: int,
) -> dict:
  """What SLURM gives task `procid` of a step on one node (only the variables JAX and the
  trainer read, plus a few for the log)."""
  env = dict(base)
  env.update(
    {
      "SLURM_STEP_NODELIST": base.get("SLURM_JOB_NODELIST", "localhost"),
      "SLURM_STEP_NUM_NODES": str(nodes),
      "SLURM_STEP_NUM_TASKS": str(ntasks),
      "SLURM_NTASKS": str(ntasks),
      "SLURM_NTASKS_PER_NODE": str(tasks_per_node),
      "SLURM_PROCID": str(procid),
      "SLURM_LOCALID": str(procid % tasks_per_node),
      "SLURM_NODEID": str(procid // tasks_per_node),
      "SLURM_STEP_ID": str(step_id),
      # --gpu-bind=none: every task of the node sees all of the node's GPUs.
      "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in range(gpus_on_node)),
    }
  )
  return env


def parse_srun(argv: list[str]) -> tuple[dict, list[str]]:
  """srun's options (--name=value, up to the command) and the command."""
  opts, i = {}, 0
  while i < len(argv) and argv[i].startswith("--"):
    name, _, value = argv[i][2:].partition("=")
    opts[name] = value
    i += 1
  return opts, argv[i:]


def srun_main(argv: list[str]) -> int:
  opts, command = parse_srun(argv)
  nodes = int(opts.get("nodes", os.environ.get("SLURM_JOB_NUM_NODES", "1")))
  if nodes != 1:
    print(f"stub srun: --nodes={nodes}: this simulation runs one node", file=sys.stderr)
    return 1
  per_node = int(opts.get("ntasks-per-node") or opts.get("ntasks") or 1)
  ntasks = int(opts.get("ntasks") or nodes * per_node)
  gpus = int(os.environ.get("SLURM_GPUS_ON_NODE", per_node))
  job = os.environ.get("SLURM_JOB_ID", "")
  step_id = len(read_records(sim_dir(), "srun"))
  record("srun", argv=argv, ntasks=ntasks, job=job)
  procs: list[subprocess.Popen] = []
  srun_signals(procs)
  for i in range(ntasks):
    env = slurm_task_env(
      os.environ,
      procid=i,
      ntasks=ntasks,
      tasks_per_node=per_node,
      nodes=nodes,
      gpus_on_node=gpus,
      step_id=step_id,
    )
    # The step's container, not srun's child in Slurm: its own process group.
    procs.append(subprocess.Popen(command, env=trainer_env(env, 1), start_new_session=True))
    record("sessions", pid=procs[-1].pid)
  record("steps", job=job, step=step_id, srun=os.getpid(), tasks=[p.pid for p in procs])
  return max(wait_all(procs))


SRUN_KILLS = (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)  # srun: SIGKILL to the tasks
SRUN_PASSES = (signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2)  # srun: passed on as they are


def srun_signals(procs: list[subprocess.Popen]) -> None:
  """srun's signal handling (src/srun/signals.c _forward_signal): SIGTERM/SIGHUP/SIGQUIT ->
  "forcing job termination", SIGKILL to every task; SIGINT/SIGUSR1/SIGUSR2 passed on."""

  def on_signal(signum, frame):
    del frame
    live = [p for p in procs if p.poll() is None]
    sent = signal.SIGKILL if signum in SRUN_KILLS else signum
    if sent == signal.SIGKILL:
      print("srun: forcing job termination", file=sys.stderr, flush=True)
    for p in live:  # to the task's container (slurmstepd signals every process of the step)
      try:
        os.killpg(p.pid, sent)
      except ProcessLookupError:
        pass
    record("signals", stub="srun", signal=signum, sent=sent, to=[p.pid for p in live])

  for s in SRUN_KILLS + SRUN_PASSES:
    signal.signal(s, on_signal)


def sbatch_options(script: str) -> dict:
  """The #SBATCH options of a script ({name: value}), read as sbatch reads them (quotes)."""
  opts = {}
  with open(script) as f:
    for line in f:
      if not line.startswith("#SBATCH"):
        continue
      for word in shlex.split(line[len("#SBATCH") :], comments=True):
        name, _, value = word.lstrip("-").partition("=")
        opts[name] = value
  return opts


def slurm_job_id() -> int:
  """A job id whose JAX coordinator port (id % 4096 + 61440) is free here."""
  for _ in range(200):
    offset = random.randrange(2**12)
    if port_is_free(SLURM_PORT_BASE + offset):
      return 2**12 * random.randrange(10, 200) + offset
  raise RuntimeError("stub sbatch: no free port for the job")


def sbatch_main(argv: list[str]) -> int:
  if argv[:1] == ["--run-job"]:  # the detached job runner
    return run_job(*argv[1:])
  script = os.path.abspath(argv[-1])
  opts = sbatch_options(script)
  job = slurm_job_id()
  record("slurm", event="submit", job=job, script=script, options=opts)
  with open(os.path.join(sim_dir(), f"sbatch-{job}.err"), "w") as err:
    runner = subprocess.Popen(
      [sys.executable, os.path.abspath(__file__), "sbatch", "--run-job", str(job), script],
      start_new_session=True,
      stdin=subprocess.DEVNULL,
      stdout=err,
      stderr=subprocess.STDOUT,
    )
  record("sessions", pid=runner.pid)  # its process group: the job and its steps
  print(f"Submitted batch job {job}")
  return 0


def run_job(job: str, script: str) -> int:
  """Runs a batch script as SLURM would, again after each `scontrol requeue`."""
  opts = sbatch_options(script)
  nodes = int(opts.get("nodes", "1"))
  gpus = int(opts.get("gpus-per-node", opts.get("ntasks-per-node", "1")))
  marker = os.path.join(sim_dir(), f"requeue-{job}")
  restart = 0
  while True:
    env = dict(
      os.environ,
      SLURM_JOB_ID=job,
      SLURM_JOBID=job,
      SLURM_JOB_NAME=opts.get("job-name", ""),
      SLURM_JOB_NODELIST="localhost",
      SLURM_NODELIST="localhost",
      SLURM_JOB_NUM_NODES=str(nodes),
      SLURM_NNODES=str(nodes),
      SLURM_GPUS_ON_NODE=str(gpus),
      SLURM_CPUS_ON_NODE=os.environ.get("CBERT_SIM_CPUS_ON_NODE", str(gpus)),
      SLURM_SUBMIT_DIR=os.getcwd(),
    )
    if restart:
      env["SLURM_RESTART_COUNT"] = str(restart)
    output = opts.get("output", os.path.join(os.getcwd(), f"slurm-{job}.out"))
    os.makedirs(os.path.dirname(output), exist_ok=True)
    with open(output, "a" if opts.get("open-mode") == "append" or restart else "w") as log:
      proc = subprocess.Popen(  # the batch step: its own process group
        ["bash", script],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        process_group=0,
      )
      started = time.time()
      record("slurm", event="start", job=int(job), restart=restart, pid=proc.pid)
      rc = proc.wait()
    end_job(job, proc.pid, started)
    record("slurm", event="end", job=int(job), restart=restart, rc=rc)
    requeue = [m for m in (marker, preempted_marker(job)) if os.path.exists(m)]
    if requeue:  # `scontrol requeue` or a preemption: back in the queue, run again
      for m in requeue:
        os.unlink(m)
      restart += 1
      continue
    record("slurm", event="done", job=int(job), restarts=restart, rc=rc)
    return rc


def end_job(job: str, batch_pgid: int, since: float) -> None:
  """The batch script has exited: the job ends, and Slurm SIGKILLs whatever is left in it (the
  batch step's process group and the tasks of every step it started since `since`)."""
  steps = [st for st in job_steps(job) if st["time"] >= since]
  groups = [batch_pgid] + [t for st in steps for t in st["tasks"]]
  for pgid in groups:
    try:
      os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
      pass


def job_steps(job: str, step: int | None = None) -> list[dict]:
  return [
    r
    for r in read_records(sim_dir(), "steps")
    if r["job"] == str(job) and (step is None or r["step"] == step)
  ]


def batch_pid(job: str) -> int | None:
  """The running batch shell of `job` (its latest start)."""
  starts = [
    r["pid"]
    for r in read_records(sim_dir(), "slurm")
    if r["event"] == "start" and str(r["job"]) == str(job)
  ]
  return starts[-1] if starts else None


def preempted_marker(job, directory: str | None = None) -> str:
  return os.path.join(directory or sim_dir(), f"preempted-{job}")


def preempt(job, directory: str | None = None) -> None:
  """Marks `job` preempted under PreemptMode=REQUEUE: when its batch script exits, for whatever
  reason, the job is requeued (preempt.shtml: a job selected for preemption that exits "will be
  handled according to PreemptMode regardless of why it exited"). The caller sends the signal."""
  open(preempted_marker(job, directory), "w").close()


def scancel_main(argv: list[str]) -> int:
  """`scancel --signal=SIG [--batch | --full] JOB[.STEP]` (scancel(1)); a cancel without
  --signal is not simulated."""
  p = argparse.ArgumentParser(prog="scancel")
  p.add_argument("-s", "--signal", required=True)
  p.add_argument("-b", "--batch", action="store_true")
  p.add_argument("-f", "--full", action="store_true")
  p.add_argument("ids", nargs="+")
  args = p.parse_args(argv)
  name = args.signal.upper()
  sig = (
    int(name)
    if name.isdigit()
    else signal.Signals[name if name.startswith("SIG") else "SIG" + name]
  )
  sent = []
  for spec in args.ids:
    job, _, step = spec.partition(".")
    if args.full or args.batch:  # the batch step only (--full: with its children, srun too)
      pid = batch_pid(job)
      if pid is not None and not step:
        try:
          (os.killpg if args.full else os.kill)(pid, sig)
          sent.append(pid)
        except ProcessLookupError:
          pass
      continue
    for st in job_steps(job, int(step) if step else None):  # every step's tasks
      for task in st["tasks"]:
        try:
          os.killpg(task, sig)  # the task's container: it and its children
          sent.append(task)
        except ProcessLookupError:
          pass
  record("scancel", argv=argv, signal=int(sig), to=sent)
  return 0


def scontrol_main(argv: list[str]) -> int:
  record("scontrol", argv=argv)
  if argv[:1] == ["requeue"] and len(argv) > 1:
    open(os.path.join(sim_dir(), f"requeue-{argv[1]}"), "w").close()
  return 0


# ------------------------------------------------------------------ TPU VMs ---


def gcloud_main(argv: list[str]) -> int:
  words = [a for a in argv if not a.startswith("--")]
  flags = dict(a[2:].partition("=")[::2] for a in argv if a.startswith("--"))
  if words[:3] != ["compute", "tpus", "tpu-vm"] or len(words) < 5:
    print(f"stub gcloud: unsupported: {shlex.join(argv)}", file=sys.stderr)
    return 2
  verb, name = words[3], words[4]
  record("gcloud", verb=verb, name=name, flags=flags)
  if verb == "create":
    print(f"Create request issued for: [{name}]")
    return 0
  if verb != "ssh" or flags.get("worker") != "all" or "command" not in flags:
    print(f"stub gcloud: unsupported: {shlex.join(argv)}", file=sys.stderr)
    return 2
  workers = int(os.environ.get("CBERT_SIM_TPU_WORKERS", "2"))
  devices = int(os.environ.get("CBERT_SIM_DEVICES", "1"))
  port = free_port()  # GceTpuCluster's 8482, moved for parallel tests
  procs: list[subprocess.Popen] = []
  forward_signals(procs)
  for i in range(workers):
    env = trainer_env(os.environ, devices)
    home = os.path.join(os.environ.get("HOME", "/tmp"), f"tpu-worker{i}")  # each host's own
    os.makedirs(home, exist_ok=True)
    env.update(
      CBERT_SIMULATE_TPU_VM="1",
      CBERT_SIM_TPU_WORKER_ID=str(i),
      CBERT_SIM_TPU_ENDPOINTS=",".join(["localhost"] * workers),
      JAX_COORDINATOR_PORT=str(port),
      HOME=home,
    )
    procs.append(subprocess.Popen(["bash", "-c", flags["command"]], env=env, cwd=home))
  return max(wait_all(procs))


def setup_log(line: str) -> None:
  with open(os.path.join(sim_dir(), "tpu_setup.log"), "a") as f:
    f.write(line + "\n")


def uv_main(argv: list[str]) -> int:
  """`uv venv [--quiet] --python V DIR` and `uv pip install [--quiet] --python PY SPEC` (a TPU
  worker's setup): see the module docstring."""
  worker = os.environ.get("CBERT_SIM_TPU_WORKER_ID", "-")
  words = [a for a in argv if a != "--quiet"]
  if words[:1] == ["venv"] and len(words) == 4 and words[1] == "--python":
    venv = words[3]
    os.makedirs(os.path.join(venv, "bin"), exist_ok=True)
    python = os.path.join(venv, "bin", "python")
    log = shlex.quote(os.path.join(sim_dir(), "tpu_setup.log"))
    with open(python, "w") as f:  # this interpreter, each run logged
      f.write(
        f'#!/bin/sh\necho "python $CBERT_SIM_TPU_WORKER_ID $1" >> {log}\n'
        f'exec {shlex.quote(os.environ.get("CBERT_SIM_PYTHON", sys.executable))} "$@"\n'
      )
    os.chmod(python, 0o755)
    setup_log(f"uv {worker} {shlex.join(words)}")
    return 0
  if words[:2] == ["pip", "install"] and len(words) == 5 and words[2] == "--python":
    setup_log(f"uv {worker} {shlex.join(words)}")
    return 0
  print(f"stub uv: unsupported: {shlex.join(argv)}", file=sys.stderr)
  return 2


# ---------------------------------------------------------------------- xpk ---


def xpk_parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(prog="xpk workload create")
  for flag in ("--cluster", "--workload", "--command"):
    p.add_argument(flag, required=True)
  p.add_argument("--tpu-type", required=True)
  p.add_argument("--num-slices", type=int, default=1)
  p.add_argument("--docker-image", default="")
  p.add_argument("--max-restarts", type=int, default=0)
  p.add_argument("--termination-grace-period-seconds", type=int, default=30)
  p.add_argument("--storage", action="append", default=[])
  p.add_argument("--project", default="")
  p.add_argument("--zone", default="")
  return p


def xpk_main(argv: list[str]) -> int:
  if argv[:1] == ["--run-workload"]:  # the detached JobSet controller
    return run_workload(json.loads(argv[1]))
  if argv[:2] == ["workload", "delete"]:  # the JobSet goes: its pods get SIGTERM
    flags = dict(a[2:].partition("=")[::2] for a in argv[2:] if a.startswith("--"))
    record("xpk", event="delete", workload=flags.get("workload"))
    open(os.path.join(sim_dir(), f"xpk-delete-{flags.get('workload')}"), "w").close()
    print(f"[XPK] Starting Workload delete\n[XPK] workload {flags.get('workload')} deleted")
    return 0
  if argv[:2] != ["workload", "create"]:
    print(f"stub xpk: unsupported: {shlex.join(argv)}", file=sys.stderr)
    return 2
  args = xpk_parser().parse_args(argv[2:])
  spec = vars(args)
  record("xpk", event="create", **spec)
  with open(os.path.join(sim_dir(), f"xpk-{args.workload}.err"), "w") as err:
    controller = subprocess.Popen(
      [sys.executable, os.path.abspath(__file__), "xpk", "--run-workload", json.dumps(spec)],
      start_new_session=True,
      stdin=subprocess.DEVNULL,
      stdout=err,
      stderr=subprocess.STDOUT,
    )
  record("sessions", pid=controller.pid)
  print(
    f"[XPK] Starting workload create\n[XPK] Task: `Creating Workload` is implemented by "
    f"stub xpk; workload {args.workload} created"
  )
  return 0


def run_workload(spec: dict) -> int:
  """JobSet semantics for one slice: all pods run; any failure stops the others; restart on
  xpk's restart exit codes up to max_restarts."""
  name, pods = spec["workload"], int(os.environ.get("CBERT_SIM_XPK_PODS", "2"))
  devices = int(os.environ.get("CBERT_SIM_DEVICES", "1"))
  poll = os.environ.get("CBERT_SIM_XPK_POLL", "0.2")
  logs = os.path.join(sim_dir(), "xpk", name)
  os.makedirs(logs, exist_ok=True)
  attempt = 0
  while True:
    script = XPK_CONTAINER.format(command=spec["command"], poll=poll)
    port = str(free_port())  # GkeTpuCluster's 8482, moved for parallel tests
    started = []
    for i in range(pods):
      env = trainer_env(os.environ, devices)
      env.update(
        CBERT_SIMULATE_TPU_VM="1",
        TPU_WORKER_ID=str(i),
        TPU_WORKER_HOSTNAMES=",".join(["localhost"] * pods),
        JAX_COORDINATOR_PORT=port,
      )
      with open(os.path.join(logs, f"attempt{attempt}-pod{i}.log"), "w") as log:
        started.append(
          subprocess.Popen(
            ["bash", "-c", script],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
          )
        )
    record("xpk", event="pods", workload=name, attempt=attempt, pids=[p.pid for p in started])
    for p in started:
      record("sessions", pid=p.pid)  # each pod: its own process group
    deleted = os.path.join(sim_dir(), f"xpk-delete-{name}")
    rc = watch_pods(
      started, spec["termination_grace_period_seconds"], lambda d=deleted: os.path.exists(d)
    )
    record(
      "xpk",
      event="attempt",
      workload=name,
      attempt=attempt,
      rc=rc,
      codes=[p.returncode for p in started],
    )
    if os.path.exists(deleted):
      record("xpk", event="done", workload=name, rc=rc, restarts=attempt, deleted=True)
      return rc
    if rc == 0:
      record("xpk", event="done", workload=name, rc=0, restarts=attempt)
      return 0
    if rc in XPK_RESTART_CODES and attempt < spec["max_restarts"]:
      attempt += 1
      record("xpk", event="restart", workload=name, attempt=attempt, after_rc=rc)
      continue
    record("xpk", event="done", workload=name, rc=rc, restarts=attempt, failed=True)
    return rc


def watch_pods(procs: list[subprocess.Popen], grace: int, deleted=lambda: False) -> int:
  """0 when every pod succeeds; else the first failure's status (or, once `deleted()`, the
  first pod's), after the other pods got SIGTERM (and SIGKILL for their whole process group
  after `grace` seconds)."""
  while True:
    codes = [p.poll() for p in procs]
    if all(c == 0 for c in codes):
      return 0
    failed = [c for c in codes if c not in (None, 0)]
    if failed or deleted():
      break
    time.sleep(0.1)
  for p in procs:
    if p.poll() is None:
      p.send_signal(signal.SIGTERM)
  deadline = time.time() + grace
  for p in procs:
    while p.poll() is None and time.time() < deadline:
      time.sleep(0.1)
  for p in procs:  # the container's processes go with it
    try:
      os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
      pass
    p.wait()
  first = failed[0] if failed else procs[0].returncode
  return 128 - first if first < 0 else first


def kill_all(directory: str) -> None:
  """SIGKILL every process group a stub left running (detached job runners, JobSet controllers,
  pods): a test's cleanup."""
  for r in read_records(directory, "sessions"):
    try:
      os.killpg(r["pid"], signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
      pass


MAINS = {
  "sbatch": sbatch_main,
  "srun": srun_main,
  "scancel": scancel_main,
  "scontrol": scontrol_main,
  "gcloud": gcloud_main,
  "uv": uv_main,
  "xpk": xpk_main,
}


def main(name: str, argv: list[str]) -> int:
  return MAINS[name](argv)


if __name__ == "__main__":  # python simlib.py <stub> args...
  sys.exit(main(sys.argv[1], sys.argv[2:]))
