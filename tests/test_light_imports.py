"""A launcher host needs no JAX: `launch/` imports and runs its JAX-free commands without it.

Each check runs in a fresh interpreter where `import jax` raises ImportError
(`sys.modules["jax"] = None`), so a module-level JAX import anywhere on the import chain fails the
test instead of going unnoticed in a process where JAX is already loaded.
"""

import pytest

from tests import members as synthetic
from tests.cli_helpers import run_without_jax
from tests.launch_helpers import BACKEND_ARGS


def test_jax_is_blocked_in_the_subprocess():
  r = run_without_jax("try:\n  import jax\nexcept ImportError:\n  print('blocked')\n")
  assert r.returncode == 0, r.stderr
  assert r.stdout.splitlines()[0] == "blocked"


def test_launch_modules_import_without_jax():
  r = run_without_jax(
    "import launch.sweep, launch.members, launch.backends, launch.snapshot, "
    "launch.jobs\n"
    "from cbert_jax.run.progress import Progress, Timers, format_duration\n"
    "print(format_duration(602))\n"
  )
  assert r.returncode == 0, r.stderr
  assert r.stdout.splitlines() == ["10m02s", "heavy: []"]


def test_args_dry_run_without_jax(tmp_path):
  root = tmp_path / "pair"
  r = run_without_jax(
    "from launch import sweep\nrc = sweep.main(sys.argv[1:])\nassert rc == 0, rc\n",
    "--config",
    "experiments/smoke.py",
    "--backend",
    "local",
    "--args",
    "model=bert",
    "model=crossbert",
    "--workdir_root",
    str(root),
  )
  assert r.returncode == 0, r.stderr
  lines = r.stdout.splitlines()
  first = lines.index("[1/2] model-bert (pending; config arg 'model=bert')")
  assert f"--workdir={root}/model-bert" in lines[first + 1]
  assert lines[first + 2] == "[2/2] model-crossbert (pending; config arg 'model=crossbert')"
  assert f"--workdir={root}/model-crossbert" in lines[first + 3]
  assert "dry run: nothing is started or written" in r.stdout and not root.exists()
  assert lines[-1] == "heavy: []"


@pytest.mark.parametrize("backend", list(BACKEND_ARGS))
def test_sweep_dry_run_without_jax(tmp_path, backend):
  """The paper sweep's members are planned (configs resolved, memory plans on the backend's chip)
  and rendered for every backend without JAX."""
  root = tmp_path / "sweep"
  r = run_without_jax(
    "from launch import sweep\nrc = sweep.main(sys.argv[1:])\nassert rc == 0, rc\n",
    "--config",
    "experiments/sweep.py",
    "--backend",
    backend,
    "--workdir_root",
    str(root),
    *BACKEND_ARGS[backend],
  )
  assert r.returncode == 0, r.stderr
  assert "dry run: nothing is started or written" in r.stdout
  assert "[17/17] crossbert_d2304L32 (pending; " in r.stdout
  assert not root.exists()  # nothing written
  assert r.stdout.splitlines()[-1] == "heavy: []"


def test_sweep_status_without_jax(tmp_path):
  root = tmp_path / "sweep"
  synthetic.write_member(
    root / "bert_d32L2", synthetic.member_config(total_steps=4), checkpoints=[2]
  )
  r = run_without_jax(
    "from launch import sweep\n"
    "rc = sweep.main(['status', '--workdir_root', sys.argv[1], '--no-probe'])\n"
    "assert rc == 0, rc\n",
    str(root),
  )
  assert r.returncode == 0, r.stderr
  assert "(member directories): 1 members, 0 done, 0 running, 1 pending" in r.stdout
  assert r.stdout.splitlines()[-1] == "heavy: []"
