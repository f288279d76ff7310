"""launch.sweep's rendered scripts, run: #SBATCH values read back as sbatch reads them, the
tpu-vm/xpk member wrapper under SIGTERM, and the sbatch script's USR1 trap.

Nothing trains: the member steps are fake shell scripts, and the sbatch script runs under bash
with fake srun / scontrol.
"""

import os
import shutil
import signal
import subprocess
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


def wrapper_run(tmp_path, shell: list[str], naive: bool = False, **env_extra):
  """The tpu-vm/xpk member command (or the old `cd X && train && probe`) under `shell`, with the
  fake trainer; -> (process, events file, member)."""
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


# ------------------------------------------------------------------------- the sbatch trap ---


FAKE_TRAIN = r"""#!/bin/bash
# A member step under a fake srun: prepare and probe return at once; train waits to be stopped,
# fails (TRAIN_FAILS), or ends at once (TRAIN_ENDS=final: with its final checkpoint; =early: without).
case "$*" in *cbert_jax.data.preprocess*) echo prepare >> "$EVENTS"; exit 0;; esac
case "$*" in *--config.mode=eval*) echo probe >> "$EVENTS"; exit 0;; esac
if [ -n "${TRAIN_FAILS:-}" ]; then echo "config error: planted" >&2; exit 3; fi
if [ -n "${TRAIN_ENDS:-}" ]; then
  echo "train $TRAIN_ENDS" >> "$EVENTS"
  if [ "$TRAIN_ENDS" = final ]; then mkdir -p "$FINAL"; fi
  exit 0
fi
trap 'echo term >> "$EVENTS"; kill $sleeper; exit 0' TERM
echo started >> "$EVENTS"
sleep 30 & sleeper=$!
wait $sleeper
"""


def sbatch_run(tmp_path, **env_extra):
  """The first paper member's sbatch script under bash, with fake srun and scontrol."""
  bindir = tmp_path / "bin"
  bindir.mkdir()
  (bindir / "srun").write_text('#!/bin/bash\nwhile [[ "$1" == --* ]]; do shift; done\nexec "$@"\n')
  (bindir / "scontrol").write_text('#!/bin/bash\necho "scontrol $*" >> "$EVENTS"\n')
  (tmp_path / "train.sh").write_text(FAKE_TRAIN)
  for f in ("srun", "scontrol"):
    os.chmod(bindir / f, 0o755)
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
  script = tmp_path / "job.sbatch"
  script.write_text(launch.jobs[0].script)
  events = tmp_path / "events"
  env = dict(
    os.environ,
    PATH=f"{bindir}:{os.environ['PATH']}",
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


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_sbatch_usr1_stops_the_step_and_requeues(tmp_path):
  proc, events, _ = sbatch_run(tmp_path)
  deadline = time.time() + 20
  while "started" not in read_events(events):
    assert time.time() < deadline and proc.poll() is None, proc.communicate()[0]
    time.sleep(0.05)
  proc.send_signal(signal.SIGUSR1)  # what --signal=B:USR1@600 sends
  out, _ = proc.communicate(timeout=20)
  assert proc.returncode == 0, out
  # the data once (a sources corpus), then train; stopped and requeued; no probe
  assert read_events(events) == ["prepare", "started", "term", "scontrol requeue 42"]
  assert "USR1: time limit near" in out


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
