"""launch.sweep in the test process: renders of the sweep experiment (nothing runs), `main` with
its output, and the arguments each backend needs."""

from launch import sweep

EXP = "experiments/sweep.py"


FIRST = "scale=paper,model=bert,size=d384L6"  # the first paper member, bert_d384L6


def build(root, *argv):
  """Renders a launch (nothing runs) -> the Launch."""
  launch, _ = sweep.build(["--workdir_root", str(root), *argv])
  return launch


def job(launch, name):
  return next(j for j in launch.jobs if j.member.name == name)


def run_main(capsys, *argv):
  """sweep.main in this process -> (exit status, stdout, stderr)."""
  rc = sweep.main([str(a) for a in argv])
  out = capsys.readouterr()
  return rc, out.out, out.err


BACKEND_ARGS = {
  "local": [],
  "slurm": [],
  "tpu-vm": ["--zone", "z", "--project", "p"],
  "xpk": ["--cluster", "c", "--docker_image", "img"],
}
