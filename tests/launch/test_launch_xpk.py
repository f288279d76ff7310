"""xpk: every name xpk checks is refused before rendering when xpk would refuse it; every rendered
command parses with xpk's own argparse; checkpoints on an xpk storage commit.

xpk's parser (xpk 1.16, `xpk/parser/`) is used when the `xpk` package is importable. `pip install
xpk` pulls ~50 packages (kubernetes, google-cloud-aiplatform, grpcio, ...) and pins packaging,
PyYAML, urllib3 and protobuf below this project's, so it is not in the test extra; the parser
modules themselves need only argparse and argcomplete: `pip install --no-deps xpk==1.16.0
argcomplete==3.6.3` is enough, and the modules the parsers import only for their `func=` defaults
(xpk.commands.workload, xpk.commands.storage, xpk.core.docker_image: kubernetes, docker) are
replaced by empty stand-ins when they do not import. The name checks and the commit check need no
xpk.
"""

import argparse
import errno
import os
import re
import shlex
import sys
import types

import pytest

from launch import backends, commit_check
from tests.launch_helpers import EXP, build, run_main

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOCS = os.path.join(REPO, "docs", "launch.md")


# ------------------------------------------------------------------------ xpk's own parser ---


@pytest.fixture(scope="module")
def xpk():
  """xpk's argparse parser for `xpk workload ...` and `xpk storage ...` (module docstring)."""
  try:
    import xpk as _  # noqa: F401  pylint: disable=import-outside-toplevel
  except ImportError:  # a failure, not a skip: the README's test command installs it
    pytest.fail(
      "xpk is not installed: the README's test command installs it with pip install --no-deps "
      "xpk==1.16.0 argcomplete==3.6.3 (its full dependencies would downgrade ours)"
    )
  saved = {k: v for k, v in sys.modules.items() if k.startswith(("xpk", "argcomplete"))}

  def stand_in(name, **attrs):
    try:
      __import__(name)
    except ImportError:  # a module xpk's parsers import for its defaults only
      module = types.ModuleType(name)
      module.__dict__.update(attrs)
      sys.modules[name] = module

  noop = lambda *a, **k: None
  stand_in("argcomplete", ChoicesCompleter=noop)
  stand_in(
    "xpk.commands.workload",
    workload_create=noop,
    workload_create_pathways=noop,
    workload_delete=noop,
    workload_list=noop,
  )
  stand_in(
    "xpk.commands.storage",
    storage_attach=noop,
    storage_create=noop,
    storage_delete=noop,
    storage_detach=noop,
    storage_list=noop,
  )
  stand_in("xpk.core.docker_image", DEFAULT_DOCKER_IMAGE="python:3.10", DEFAULT_SCRIPT_DIR=REPO)
  from xpk.parser.storage import set_storage_parser  # pylint: disable=import-outside-toplevel
  from xpk.parser.workload import set_workload_parsers  # pylint: disable=import-outside-toplevel

  parser = argparse.ArgumentParser(prog="xpk")
  sub = parser.add_subparsers(dest="xpk_subcommands")
  set_workload_parsers(sub.add_parser("workload"))
  set_storage_parser(sub.add_parser("storage"))
  yield parser
  for k in [k for k in sys.modules if k.startswith(("xpk", "argcomplete"))]:
    if k not in saved:
      del sys.modules[k]


def xpk_parses(parser, argv: list[str]) -> argparse.Namespace:
  """argv (starting with `xpk`) as xpk parses it; AssertionError with xpk's message if it does
  not (argparse exits 2)."""
  assert argv[0] == "xpk", argv
  try:
    return parser.parse_args(argv[1:])
  except SystemExit as e:
    raise AssertionError(f"xpk refuses {shlex.join(argv)[:300]}") from e


XPK_ARGS = ("--backend", "xpk", "--docker_image", "gcr.io/p/cbert:1", "--tpu_generation", "v5p")


def test_every_rendered_xpk_command_parses_with_xpks_argparse(tmp_path, xpk):
  launch = build(
    tmp_path,
    "--config",
    EXP,
    *XPK_ARGS,
    "--cluster",
    "my-cluster",
    "--project",
    "my-proj",
    "--zone",
    "us-east5-a",
    "--shared_root",
    str(tmp_path / "shared"),
    "--xpk_storage",
    "sweep-fs",
    "--xpk_storage",
    "data-fs",
    "--workload_prefix",
    "a-very-long-prefix-for-names-",  # truncated names, with their hash suffix
  )
  assert len(launch.jobs) == 17
  names = set()
  for j in launch.jobs:
    ((kind, argv),) = j.steps
    args = xpk_parses(xpk, argv)
    assert kind == "submit" and args.xpk_workload_subcommands == "create"
    assert (args.cluster, args.workload, args.tpu_type) == (
      "my-cluster",
      j.info["workload"],
      j.info["tpu_type"],
    )
    assert (args.project, args.zone, args.storage) == (
      "my-proj",
      "us-east5-a",
      ["sweep-fs", "data-fs"],
    )
    restarts, grace = args.max_restarts, args.termination_grace_period_seconds  # (xpk: strings)
    assert (str(restarts), str(grace)) == ("10", "300")
    assert args.command == argv[-1][len("--command=") :]  # one argv item, as rendered
    names.add(args.workload)
  assert len(names) == 17 and max(map(len, names)) == 40
  # The storage attach commands the dry run shows parse too, with the mount options under which
  # a checkpoint commits on a gcsfuse bucket.
  from launch import sweep  # pylint: disable=import-outside-toplevel

  _, ns = sweep.build(
    ["--workdir_root", str(tmp_path), "--config", EXP, *XPK_ARGS, "--cluster", "my-cluster"]
    + ["--xpk_storage", "sweep-fs", "--xpk_storage", "data-fs", "--shared_root", "/shared"]
  )
  first, second = (xpk_parses(xpk, a) for a in backends.xpk_storage_attach(ns, "/shared"))
  assert (first.name, first.type, first.mount_point, first.auto_mount, first.readonly) == (
    "sweep-fs",
    "gcsfuse",
    "/shared",
    False,
    False,
  )
  assert (
    first.mount_options == "implicit-dirs,rename-dir-limit=200000" == commit_check.MOUNT_OPTIONS
  )
  assert (second.name, second.mount_point) == ("data-fs", "MOUNT_POINT")


def docs_xpk_example() -> list[str]:
  """The xpk line of docs/launch.md's launch.sweep examples, as arguments (its `...` dropped)."""
  text = open(DOCS).read()
  (line,) = [l for l in text.splitlines() if "launch.sweep" in l and "--backend xpk" in l]
  words = shlex.split(line)
  return [w for w in words[words.index("launch.sweep") + 1 :] if w != "..."]


def test_the_docs_xpk_example_is_what_xpk_accepts(tmp_path, xpk):
  argv = docs_xpk_example()
  launch = build(tmp_path, *argv, "--members", "bert_d384L6")
  ((_, rendered),) = launch.jobs[0].steps
  assert xpk_parses(xpk, rendered).cluster == argv[argv.index("--cluster") + 1]
  # What the docs said before: xpk's name_type refuses an uppercase cluster name.
  with pytest.raises(AssertionError, match="xpk refuses"):
    xpk_parses(xpk, [*rendered[:3], "--cluster=C", *rendered[4:]])


NAMES = ["C", "My-cluster", "my_cluster", "-c", "c-", "1c", "c" * 41, "c.d", ""]


@pytest.mark.parametrize("name", NAMES)
def test_a_name_xpk_refuses_is_refused_before_rendering(tmp_path, capsys, name):
  argv = ["--config", EXP, *XPK_ARGS, f"--cluster={name}", "--workdir_root", tmp_path]
  rc, out, err = run_main(capsys, *argv)
  assert rc == 2 and out == "", err
  if name == "":
    assert err == "error: --backend xpk needs --cluster\n"
    return
  assert err == (
    f"error: --cluster={name!r}: xpk refuses this cluster name: it must be lowercase letters, "
    "digits and '-', start with a letter, not end with '-', and be at most 40 characters "
    "(xpk's name_type)\n"
  )


def test_xpk_refuses_the_same_names_and_accepts_the_longest(tmp_path, xpk):
  good = build(tmp_path, "--config", EXP, *XPK_ARGS, "--cluster", "c", "--members", "bert_d384L6")
  ((_, rendered),) = good.jobs[0].steps
  assert rendered[3] == "--cluster=c"
  for name in NAMES[:-1]:
    with pytest.raises(AssertionError, match="xpk refuses"):
      xpk_parses(xpk, [*rendered[:3], f"--cluster={name}", *rendered[4:]])
  longest = "c" + "-a1" * 13  # 40 characters: both accept it
  backends.check_xpk_name("--cluster", longest, "cluster")
  assert xpk_parses(xpk, [*rendered[:3], f"--cluster={longest}", *rendered[4:]]).cluster == longest


@pytest.mark.parametrize(
  "flag, value, message",
  [
    ("--xpk_storage", "My_Fs", "error: --xpk_storage='My_Fs': expected an xpk storage name"),
    ("--workload_prefix", "Run-", "error: --workload_prefix='Run-': must start with a lowercase"),
  ],
)
def test_storage_and_workload_names_are_checked_too(tmp_path, capsys, flag, value, message):
  rc, out, err = run_main(
    capsys, "--config", EXP, *XPK_ARGS, "--cluster", "c", flag, value, "--workdir_root", tmp_path
  )
  assert rc == 2 and out == "" and err.startswith(message) and err.count("\n") == 1, err


def test_rendered_workload_names_follow_xpks_rule():
  for name in backends.xpk_names("x-", ["M" * 60, "m" * 60, "a_b", "A-B", "b-"]).values():
    assert backends.XPK_NAME.fullmatch(name) and len(name) <= backends.XPK_NAME_MAX, name


# ------------------------------------------------------------- checkpoints on an xpk storage ---


def test_a_workload_with_a_storage_checks_that_checkpoints_commit_first(tmp_path):
  args = ("--config", EXP, *XPK_ARGS, "--cluster", "c", "--members", "bert_d384L6")
  plain = build(tmp_path, *args).jobs[0]
  mounted = build(tmp_path, *args, "--xpk_storage", "sweep-fs").jobs[0]
  assert "launch.commit_check" not in plain.steps[0][1][-1]  # no storage, no check
  command = mounted.steps[0][1][-1]
  check = f"python -m launch.commit_check {mounted.member.workdir} || exit $?;"
  assert f'if [ ! -d "$final" ]; then {check} step python -m cbert_jax.main ' in command
  assert command.index(check) < command.index("step python -m cbert_jax.main")


def test_commit_check_passes_where_a_directory_renames(tmp_path):
  assert commit_check.check(str(tmp_path / "run")) is None
  assert os.listdir(tmp_path / "run") == []  # nothing left behind
  assert commit_check.main([str(tmp_path / "run")]) == 0


def test_commit_check_without_directory_rename_is_one_line_and_exit_5(
  tmp_path, monkeypatch, capsys
):
  # gcsfuse on a flat bucket with rename-dir-limit=0 (xpk's default mount options): rename(2) of a
  # directory fails with EMFILE, "too many objects to be renamed" (internal/fs/fs.go).
  def no_dir_rename(src, dst):
    raise OSError(errno.EMFILE, "too many objects to be renamed")

  monkeypatch.setattr(commit_check.os, "rename", no_dir_rename)
  assert commit_check.main([str(tmp_path)]) == commit_check.EXIT_CHECKPOINT == 5
  err = capsys.readouterr().err
  assert err == (
    f"checkpoint error: {tmp_path} cannot rename a directory (too many objects to be renamed), "
    "and orbax commits each checkpoint by renaming its directory: on a gcsfuse mount (xpk "
    "storage) attach it with `--mount-options=implicit-dirs,rename-dir-limit=200000` (or use a "
    "bucket with hierarchical namespace)\n"
  )
  assert os.listdir(tmp_path) == []  # the probe is removed


def test_commit_check_where_nothing_can_be_written_is_one_line(tmp_path, capsys):
  (tmp_path / "file").write_text("")
  assert commit_check.main([str(tmp_path / "file" / "run")]) == 5
  err = capsys.readouterr().err
  assert re.fullmatch(
    rf"checkpoint error: cannot write in {tmp_path}/file/run \(Not a directory\): checkpoints "
    r"could not be saved\n",
    err,
  ), err


def test_the_dry_run_shows_the_storage_attach_command(tmp_path, capsys):
  rc, out, err = run_main(
    capsys,
    "--config",
    EXP,
    *XPK_ARGS,
    "--cluster",
    "my-cluster",
    "--shared_root",
    "/shared",
    "--xpk_storage",
    "sweep-fs",
    "--members",
    "bert_d384L6",
  )
  assert rc == 0, err
  assert (
    "\n  xpk storage attach sweep-fs --cluster=my-cluster --type=gcsfuse --mount-point=/shared "
    "--auto-mount=false --readonly=false --mount-options=implicit-dirs,rename-dir-limit=200000\n"
  ) in out
  assert "a gcsfuse bucket needs --mount-options=implicit-dirs,rename-dir-limit=200000" in out
