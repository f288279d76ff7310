"""launch.sweep's rendered scripts, run: #SBATCH values read back as sbatch reads them, the
tpu-vm/xpk member wrapper under SIGTERM, and the sbatch script's USR1 and TERM traps.

Nothing trains: the member steps are fake shell scripts, and the sbatch script runs under bash
with the Slurm-like stub srun and scancel of tests/stubs/ (srun SIGKILLs its tasks on SIGTERM, as
Slurm's does) and a fake scontrol.
"""

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from cbert_jax.run import status as status_lib
from launch import backends
from tests.launch_helpers import EXP, build
from tests.stubs import simlib

# -------------------------------------------------------------------------- sbatch quoting ---


def sbatch_words(line: str) -> list[str]:
  """An #SBATCH line's words as sbatch reads them (src/sbatch/opt.c _get_argument: quotes group,
  a backslash escapes the next character, an unescaped # outside quotes ends the line)."""
  words, i, n = [], len("#SBATCH"), len(line)
  while True:
    while i < n and line[i].isspace():
      i += 1
    if i >= n:
      return words
    word, quote, escape = "", "", False
    while i < n and (quote or not line[i].isspace()):
      c = line[i]
      i += 1
      if escape:
        escape = False
      elif c == "\\":
        escape = True
        continue
      elif quote:
        if c == quote:
          quote = ""
          continue
      elif c in "\"'":
        quote = c
        continue
      elif c == "#":
        return words + ([word] if word else [])
      word += c
    words.append(word)


@pytest.mark.parametrize(
  "flag, value",
  [
    ("--partition", "gpu a100#1"),
    ("--account", 'lab "x" \\y'),
    ("--account", "it's"),
    ("--partition", "gpu,gpu-long"),
  ],
)
def test_sbatch_values_are_read_back_as_given(tmp_path, flag, value):
  root = tmp_path / "my runs #2"  # a space and a # in the path
  launch = build(
    root, "--config", EXP, "--backend", "slurm", "--members", "bert_d384L6", flag, value
  )
  lines = {
    sbatch_words(l)[0].split("=", 1)[0]: sbatch_words(l)[0].split("=", 1)[1]
    for l in launch.jobs[0].script.splitlines()
    if l.startswith("#SBATCH ") and "=" in l
  }
  assert lines[flag] == value
  assert lines["--output"] == f"{root}/logs/bert_d384L6.log"
  assert lines["--job-name"] == "bert_d384L6"
  if value == "gpu,gpu-long":  # plain values stay unquoted
    assert f"#SBATCH {flag}=gpu,gpu-long\n" in launch.jobs[0].script


# ---------------------------------------------------------------------- the member wrapper ---


FAKE_MEMBER = r"""#!/bin/bash
# A trainer stand-in for the member wrapper: probe returns at once; train ends at once (FINISH:
# with its final checkpoint; TRAIN_RC: with that status) or runs until SIGTERM, then "checkpoints"
# and exits 0, as the trainer does.
case "$*" in *--config.mode=eval*) echo probe >> "$EVENTS"; exit 0;; esac
case "$*" in *launch.commit_check*) echo check >> "$EVENTS"; exit "${CHECK_RC:-0}";; esac
echo "train $$" >> "$EVENTS"
if [ -n "${TRAIN_RC:-}" ]; then exit "$TRAIN_RC"; fi
if [ -n "${FINISH:-}" ]; then mkdir -p "$FINAL"; exit 0; fi
ignore=${IGNORE_TERM:-0}   # miss that many SIGTERMs, as the trainer can (start-up, stop vote)
trap 'if [ "$ignore" -gt 0 ]; then ignore=$((ignore - 1)); echo ignored >> "$EVENTS"; else stopping=1; fi' TERM
if [ -n "${RUN_FOR:-}" ]; then      # train on to the end, whatever comes
  for i in $(seq "$RUN_FOR"); do sleep 0.1; done
  mkdir -p "$FINAL"; exit 0
fi
for i in $(seq 300); do
  if [ -n "${stopping:-}" ]; then echo checkpoint >> "$EVENTS"; exit 0; fi
  sleep 0.1
done
"""


def wrapper_run(
  tmp_path, shell: list[str], naive: bool = False, storage: bool = False, **env_extra
):
  """The tpu-vm/xpk member command (or the old `cd X && train && probe`) under `shell`, with the
  fake trainer (storage: the xpk workload mounts one, so the commit check runs first);
  -> (process, events file, member)."""
  (tmp_path / "fake.sh").write_text(FAKE_MEMBER)
  launch = build(
    tmp_path / "sweep",
    "--config",
    EXP,
    "--backend",
    "xpk",
    "--cluster",
    "c",
    "--docker_image",
    "i",
    "--members",
    "bert_d384L6",
    "--code_dir",
    str(tmp_path),
    "--python",
    f"bash {tmp_path / 'fake.sh'}",
    *(["--xpk_storage", "fs"] if storage else []),
  )
  j = launch.jobs[0]
  command = j.steps[0][1][-1][len("--command=") :]
  if naive:  # what the launcher rendered before
    command = f"cd {tmp_path} && {backends.shell_join(j.train)} && {backends.shell_join(j.probe)}"
  events = tmp_path / "events"
  env = dict(
    os.environ,
    EVENTS=str(events),
    FINAL=f"{j.member.workdir}/checkpoints/{j.member.total_steps}",
    **env_extra,
  )
  script = shell[-1].format(command=command, poll=0.1) if "{command}" in shell[-1] else command
  proc = subprocess.Popen(
    [*shell[:-1], script],
    env=env,
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
    text=True,
    start_new_session=True,
  )
  return proc, events, j.member


SHELLS = {
  "bash": ["bash", "-c", "{command}"],
  "sh": ["sh", "-c", "{command}"],
  "xpk pod": ["bash", "-c", simlib.XPK_CONTAINER],
}


def read_events(events) -> list[str]:
  return events.read_text().splitlines() if events.exists() else []


def wait_events(proc, events, what: str) -> list[str]:
  deadline = time.time() + 20
  while not any(e.startswith(what) for e in read_events(events)):
    assert time.time() < deadline and proc.poll() is None, proc.communicate()[0]
    time.sleep(0.05)
  return read_events(events)


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("shell", list(SHELLS))
def test_member_wrapper_forwards_sigterm_and_does_not_probe_an_unfinished_run(tmp_path, shell):
  proc, events, member = wrapper_run(tmp_path, SHELLS[shell])
  wait_events(proc, events, "train")
  proc.send_signal(signal.SIGTERM)  # Kubernetes / a preemption: the pod's PID 1
  out, _ = proc.communicate(timeout=20)
  assert proc.returncode == backends.STOPPED_EXIT == 143, out  # xpk restarts on 42 and 127-255
  assert [e.split()[0] for e in read_events(events)] == ["train", "checkpoint"]  # no probe
  assert (
    f"bert_d384L6: train stopped before its final step {member.total_steps} (SIGTERM); "
    "exit 143: the next attempt resumes from its checkpoint"
  ) in out


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("shell", ["xpk pod", "sh"])
def test_a_missed_sigterm_is_sent_again(tmp_path, shell):
  proc, events, _ = wrapper_run(tmp_path, SHELLS[shell], IGNORE_TERM="2")
  wait_events(proc, events, "train")
  proc.send_signal(signal.SIGTERM)  # once, as Kubernetes does
  out, _ = proc.communicate(timeout=20)
  assert proc.returncode == 143, out  # missed twice, caught the third: stopped
  assert [e.split()[0] for e in read_events(events)] == [
    "train",
    "ignored",
    "ignored",
    "checkpoint",
  ]


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_a_sigterm_the_trainer_never_heeds_still_skips_the_probe(tmp_path):
  proc, events, _ = wrapper_run(tmp_path, SHELLS["xpk pod"], IGNORE_TERM="1000", RUN_FOR="15")
  wait_events(proc, events, "train")
  proc.send_signal(signal.SIGTERM)
  out, _ = proc.communicate(timeout=20)  # the train finished all the same:
  assert proc.returncode == 143, out  # no probe in a pod being stopped
  assert [e.split()[0] for e in read_events(events)][:2] == ["train", "ignored"]
  assert "probe" not in read_events(events)
  assert "bert_d384L6: SIGTERM; exit 143 before the probe: the next attempt runs it" in out
  events.unlink()
  proc, events, _ = wrapper_run(tmp_path, SHELLS["xpk pod"], RUN_FOR="15")  # the restart
  assert proc.wait(timeout=20) == 0 and read_events(events) == ["probe"]


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_the_old_pod_command_never_told_the_trainer(tmp_path):
  proc, events, _ = wrapper_run(tmp_path, SHELLS["xpk pod"], naive=True)
  pid = int(wait_events(proc, events, "train")[0].split()[1])
  proc.send_signal(signal.SIGTERM)
  try:
    assert proc.wait(timeout=20) == 143  # the pod ends (its output pipe stays
    # open: the trainer still holds it) ...
    time.sleep(0.5)
    assert read_events(events) == [f"train {pid}"]  # ... but the trainer never got SIGTERM:
    os.kill(pid, 0)  # still running, to be SIGKILLed unsaved
  finally:
    os.killpg(proc.pid, signal.SIGKILL)


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize(
  "env, rc, expected",
  [
    ({"FINISH": "1"}, 0, ["train", "probe"]),  # finished: probed
    ({"TRAIN_RC": "2"}, 2, ["train"]),  # a config error: its status, no restart
  ],
)
def test_member_wrapper_outcomes(tmp_path, env, rc, expected):
  proc, events, member = wrapper_run(tmp_path, SHELLS["sh"], **env)
  out, _ = proc.communicate(timeout=20)
  assert proc.returncode == rc, out
  assert [e.split()[0] for e in read_events(events)] == expected
  if rc == 0:  # run again (a restart during the probe):
    events.unlink()  # the finished train is not run again
    proc, events, _ = wrapper_run(tmp_path, SHELLS["sh"], **env)
    assert proc.wait(timeout=20) == 0 and read_events(events) == ["probe"]


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize(
  "check_rc, rc, expected", [(0, 0, ["check", "train", "probe"]), (5, 5, ["check"])]
)
def test_an_xpk_storage_where_checkpoints_cannot_commit_stops_before_training(
  tmp_path, check_rc, rc, expected
):
  proc, events, _ = wrapper_run(
    tmp_path, SHELLS["xpk pod"], storage=True, CHECK_RC=str(check_rc), FINISH="1"
  )
  out, _ = proc.communicate(timeout=20)
  assert proc.returncode == rc, out  # 5: not in xpk's restart set, the workload fails at once
  assert [e.split()[0] for e in read_events(events)] == expected


# ------------------------------------------------------------------------- the sbatch trap ---


FAKE_TRAIN = r"""#!/bin/bash
# A member step under the stub srun (every task runs this; task 0 writes the events): prepare and
# probe return at once; train waits to be stopped, fails (TRAIN_FAILS), or ends at once
# (TRAIN_ENDS=final: with its final checkpoint; =early: without).
ev() { if [ "${SLURM_PROCID:-0}" = 0 ]; then echo "$1" >> "$EVENTS"; fi; }
case "$*" in *cbert_jax.data.preprocess*) ev prepare; exit 0;; esac
case "$*" in *--config.mode=eval*) ev probe; exit 0;; esac
if [ -n "${TRAIN_FAILS:-}" ]; then echo "config error: planted" >&2; exit 3; fi
if [ -n "${TRAIN_ENDS:-}" ]; then
  ev "train $TRAIN_ENDS"
  if [ "$TRAIN_ENDS" = final ]; then mkdir -p "$FINAL"; fi
  exit 0
fi
trap 'ev term; kill $sleeper; exit 0' TERM
ev started
sleep 30 & sleeper=$!
wait $sleeper
"""


OLD_FORWARD = '( while kill -TERM "$step" 2>/dev/null; do sleep 1; done ) &'  # SIGTERM to srun
NEW_FORWARD = (
  '( while kill -0 "$step" 2>/dev/null; do scancel --signal=TERM "$SLURM_JOB_ID"; sleep 1; done ) &'
)


def sbatch_run(tmp_path, old_trap: bool = False, **env_extra):
  """The first paper member's sbatch script under bash, with Slurm-like srun and scancel (the
  stubs: srun SIGKILLs its tasks on SIGTERM, scancel --signal reaches the tasks) and a fake
  scontrol. old_trap: the script as rendered before, which sent SIGTERM to srun and had no TERM
  trap."""
  bindir = tmp_path / "bin"
  bindir.mkdir()
  (bindir / "scontrol").write_text('#!/bin/bash\necho "scontrol $*" >> "$EVENTS"\n')
  (tmp_path / "train.sh").write_text(FAKE_TRAIN)
  os.chmod(bindir / "scontrol", 0o755)
  launch = build(
    tmp_path / "sweep",
    "--config",
    EXP,
    "--backend",
    "slurm",
    "--members",
    "bert_d384L6",
    "--code_dir",
    str(tmp_path),
    "--python",
    f"bash {tmp_path / 'train.sh'}",
  )
  member = launch.jobs[0].member
  text = launch.jobs[0].script
  assert NEW_FORWARD in text
  if old_trap:
    text = text.replace(NEW_FORWARD, OLD_FORWARD).replace("trap on_term TERM\n", "")
  script = tmp_path / "job.sbatch"
  script.write_text(text)
  events = tmp_path / "events"
  env = dict(
    os.environ,
    PATH=f"{bindir}:{simlib.STUBS}:{os.environ['PATH']}",
    CBERT_SIM_DIR=str(tmp_path / "sim"),
    EVENTS=str(events),
    SLURM_JOB_ID="42",
    SLURM_JOB_NODELIST="node1",
    FINAL=f"{member.workdir}/checkpoints/{member.total_steps}",
    **env_extra,
  )
  proc = subprocess.Popen(
    ["bash", str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
  )
  return proc, events, member.workdir


def wait_started(proc, events) -> None:
  deadline = time.time() + 20
  while "started" not in read_events(events):
    assert time.time() < deadline and proc.poll() is None, proc.communicate()[0]
    time.sleep(0.05)


def kill_tasks(tmp_path) -> None:
  """SIGKILL the stub srun's tasks still running (Slurm's end of the job)."""
  for r in simlib.read_records(str(tmp_path / "sim"), "sessions"):
    try:
      os.killpg(r["pid"], signal.SIGKILL)
    except ProcessLookupError:
      pass


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_sbatch_usr1_stops_the_step_and_requeues(tmp_path):
  proc, events, _ = sbatch_run(tmp_path)
  wait_started(proc, events)
  proc.send_signal(signal.SIGUSR1)  # what --signal=B:USR1@600 sends: the batch shell only
  out, _ = proc.communicate(timeout=20)
  assert proc.returncode == 0, out
  # the data once (a sources corpus), then train; stopped and requeued; no probe
  assert read_events(events) == ["prepare", "started", "term", "scontrol requeue 42"]
  assert "USR1: time limit near" in out and "forcing job termination" not in out
  sent = simlib.read_records(str(tmp_path / "sim"), "scancel")
  assert sent and {tuple(e["argv"]) for e in sent} == {("--signal=TERM", "42")}, sent
  assert any(e["to"] for e in sent)  # (again each second until srun ends)
  assert not simlib.read_records(str(tmp_path / "sim"), "signals")  # srun was never signalled


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_the_old_usr1_trap_killed_the_trainer_unsaved(tmp_path):
  # Before: the trap sent SIGTERM to srun, which Slurm's srun answers with SIGKILL to its tasks.
  proc, events, _ = sbatch_run(tmp_path, old_trap=True)
  try:
    wait_started(proc, events)
    proc.send_signal(signal.SIGUSR1)
    out, _ = proc.communicate(timeout=20)
  finally:
    kill_tasks(tmp_path)
  assert proc.returncode == 0, out  # requeued all the same ...
  assert read_events(events) == ["prepare", "started", "scontrol requeue 42"]  # ... no "term"
  assert "srun: forcing job termination" in out
  killed = simlib.read_records(str(tmp_path / "sim"), "signals")  # (again each second)
  assert {(k["signal"], k["sent"]) for k in killed} == {(signal.SIGTERM, signal.SIGKILL)}
  assert killed[0]["to"]  # the step's tasks (those started by then)


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("old_trap", [False, True])
def test_sbatch_term_stops_the_step_without_a_requeue_of_its_own(tmp_path, old_trap):
  # A TERM to the batch shell (a preemption, `scancel --batch --signal=TERM`): the step's tasks
  # get SIGTERM, the script waits for them and exits 143; Slurm requeues a preempted job.
  proc, events, _ = sbatch_run(tmp_path, old_trap=old_trap)
  try:
    wait_started(proc, events)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=20)  # (the output pipe stays open while a task holds it)
    time.sleep(0.3 if old_trap else 0)  # a task that was told would have written "term"
  finally:
    kill_tasks(tmp_path)  # what Slurm does to what is left when the batch script exits
  out = proc.stdout.read()
  if old_trap:  # before: no TERM trap; the shell died at once and nobody told the trainer
    assert proc.returncode == -signal.SIGTERM, out
    assert read_events(events) == ["prepare", "started"]
    return
  assert proc.returncode == 143, out
  assert read_events(events) == ["prepare", "started", "term"]  # checkpointed; no requeue here
  assert "TERM: checkpointing before job 42 ends" in out


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_sbatch_failing_step_writes_the_failed_marker(tmp_path):
  proc, events, workdir = sbatch_run(tmp_path, TRAIN_FAILS="1")
  out, _ = proc.communicate(timeout=20)
  assert proc.returncode == 3, out
  assert read_events(events) == ["prepare"]  # no probe, no requeue
  marker = open(os.path.join(workdir, "FAILED")).read()
  assert marker.startswith("slurm job 42: train exited with status 3; log: ")
  assert status_lib.member_state("bert_d384L6", workdir).state == "failed"


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize(
  "ends, expected",
  [
    ("final", ["prepare", "train final", "probe"]),  # finished: probed
    ("early", ["prepare", "train early"]),  # stopped by someone else's SIGTERM
  ],
)
def test_sbatch_probes_only_a_finished_train(tmp_path, ends, expected):
  proc, events, workdir = sbatch_run(tmp_path, TRAIN_ENDS=ends)
  out, _ = proc.communicate(timeout=20)
  assert proc.returncode == 0, out
  assert read_events(events) == expected
  assert ("not probing; launch again to resume" in out) == (ends == "early")
  assert not os.path.exists(os.path.join(workdir, "FAILED"))


# ----------------------------------------------------------------- the TPU VM worker setup ---


FAKE_UV = r"""#!/bin/bash
# uv for the setup line: `venv` makes DIR/bin/python from VENV_PYTHON (a body for /bin/sh), or fails
# (UV_VENV_FAILS); `pip install` succeeds. Every call and every run of the venv's python is logged.
echo "uv $*" >> "$EVENTS"
if [ "$1" = venv ]; then
  if [ -n "${UV_VENV_FAILS:-}" ]; then
    echo "error: No interpreter found for Python 3.11 in managed installations" >&2; exit 2
  fi
  dir="${@: -1}"; mkdir -p "$dir/bin"
  printf '#!/bin/sh\necho "python $1" >> "$EVENTS"\n%s\n' "$VENV_PYTHON" > "$dir/bin/python"
  chmod +x "$dir/bin/python"
fi
"""


def setup_run(tmp_path, uv: bool = True, **env_extra):
  """The --setup_workers line of a tpu-vm launch under bash, in a worker home of its own, with a
  fake uv (or none, and a python3 whose pip fails); -> (process, events file, stdout+stderr)."""
  bindir, home, code = tmp_path / "bin", tmp_path / "home", tmp_path / "code"
  for d in (bindir, home, code):
    d.mkdir()
  (code / "pyproject.toml").write_text("")
  if uv:
    (bindir / "uv").write_text(FAKE_UV)
  else:  # the image's python3, whose `pip install --user uv` fails here
    (bindir / "python3").write_text('#!/bin/sh\necho "python3 $*" >> "$EVENTS"; exit 1\n')
  for f in bindir.iterdir():
    os.chmod(f, 0o755)
  launch = build(
    tmp_path / "sweep",
    "--config",
    EXP,
    "--backend",
    "tpu-vm",
    "--zone",
    "z",
    "--project",
    "p",
    "--members",
    "bert_d384L6",
    "--code_dir",
    str(code),
    "--setup_workers",
  )
  (kind, argv), _ = launch.jobs[0].steps
  assert kind == "setup" and argv[-1].startswith("--command=")
  events = tmp_path / "events"
  env = dict(EVENTS=str(events), HOME=str(home), PATH=f"{bindir}:/usr/bin:/bin", **env_extra)
  proc = subprocess.run(
    ["bash", "-c", argv[-1][len("--command=") :]],
    env=env,
    capture_output=True,
    text=True,
    timeout=30,
  )
  return proc, read_events(events), home


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_tpu_vm_setup_checks_python_before_it_installs(tmp_path):
  proc, events, home = setup_run(tmp_path, VENV_PYTHON=f'exec {sys.executable} "$@"')
  assert proc.returncode == 0, proc.stdout + proc.stderr
  venv = f"{home}/cbert_jax-venv"
  assert events == [
    f"uv venv --quiet --python 3.11 {venv}",  # uv's own Python 3.11, not the image's python3
    "python -c",  # the version check, before anything is installed
    f"uv pip install --quiet --python {venv}/bin/python {home}/cbert_jax-src[tpu]",
  ]
  assert proc.stdout.startswith("tpu-vm setup: Python 3.") and not proc.stderr
  assert os.path.isfile(f"{home}/cbert_jax-src/pyproject.toml")  # the private copy


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize(
  "case, env",
  [
    ("too old", {"VENV_PYTHON": "exit 1"}),  # a python whose version check fails (3.10)
    ("no python", {"UV_VENV_FAILS": "1"}),  # uv could not get a 3.11
  ],
)
def test_tpu_vm_setup_without_python_3_11_is_one_line_and_installs_nothing(tmp_path, case, env):
  proc, events, home = setup_run(tmp_path, **env)
  assert proc.returncode == 1, proc.stdout + proc.stderr
  assert not [e for e in events if e.startswith("uv pip")]  # nothing installed
  assert proc.stderr.splitlines()[-1] == (
    f"tpu-vm setup: {backends.TPU_VENV}/bin/python is not Python >= 3.11 "
    "(`uv venv --python 3.11` failed, see above): nothing installed"
  )
  if case == "no python":  # uv's own error first, then ours
    assert proc.stderr.startswith("error: No interpreter found for Python 3.11")


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_tpu_vm_setup_without_uv_or_pip_is_one_line(tmp_path):
  proc, events, _ = setup_run(tmp_path, uv=False)
  assert proc.returncode == 1, proc.stdout + proc.stderr
  assert events == ["python3 -m pip install --quiet --user uv"]
  assert proc.stderr == (
    "tpu-vm setup: no uv on this worker, and `python3 -m pip install --user uv` failed\n"
  )
