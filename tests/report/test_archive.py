"""`report.archive`: a grid's results without checkpoints read back as the grid itself (done and
failed members, the same losses), unfinished members are left out, and the archived members count
as done. The runner-level round trip (rerun on an archive trains nothing, the same report) is in
tests/sweep/test_sweep_runner.py."""

import os
import shutil

from cbert_jax.report import archive, grid_read
from cbert_jax.run import record, status
from tests.members import add_checkpoint, grid_member


def _grid(root):
  """Two done members (final checkpoint present), one failed, one cut short mid-run."""
  for name, lr, kw in (
    ("b_lr1", 1e-3, {}),
    ("b_lr2", 2e-3, {}),
    ("b_lr4", 4e-3, {"failed": "NonFiniteLossError: loss nan at step 7"}),
    ("b_lr8", 8e-3, {"final_step": 40}),
  ):
    wd = grid_member(root, name, "bert", "d32L2", 5e4, 3e11, 8, lr, 6.0 + lr, **kw)
    if not kw:
      add_checkpoint(wd, 100)  # the final checkpoint
  with open(os.path.join(root, "sweep.json"), "w") as f:
    f.write('{"scale": "cpu", "members": []}\n')


def test_an_archive_reads_back_as_the_grid_without_its_checkpoints(tmp_path, capsys):
  root, out = tmp_path / "grid", tmp_path / "archive"
  os.makedirs(root)
  _grid(str(root))
  assert archive.main(["--root", str(root), "--out", str(out)]) == 0
  assert "archived 2 done and 1 failed member(s)" in capsys.readouterr().out
  assert sorted(os.listdir(out)) == ["b_lr1", "b_lr2", "b_lr4", "sweep.json"]
  assert not list(out.rglob("checkpoints")) and not list(out.rglob("*.tmp-archive"))

  def key(members):
    return [(m.name, m.state, m.loss, m.lr, m.final_step) for m in members]

  want = [m for m in grid_read.read_grid(str(root)) if m.name != "b_lr8"]
  assert key(grid_read.read_grid(str(out))) == key(want)
  assert [m.state for m in want] == ["done", "done", "diverged"]
  for name, done in (("b_lr1", True), ("b_lr2", True), ("b_lr4", False)):
    assert status.is_done(str(out / name), probe=False) is done
    assert record.archived_step(str(out / name)) == (100 if done else 0)
  assert not status.is_done(str(out / "b_lr1"), probe=True)  # no probe results: not done

  # Archiving again (the grid went on: b_lr8 finished) updates the archive in place.
  shutil.rmtree(root / "b_lr8")
  add_checkpoint(grid_member(str(root), "b_lr8", "bert", "d32L2", 5e4, 3e11, 8, 8e-3, 5.5), 100)
  assert archive.main(["--root", str(root), "--out", str(out)]) == 0
  assert status.is_done(str(out / "b_lr8"), probe=False)
  assert key(grid_read.read_grid(str(out))) == key(grid_read.read_grid(str(root)))
  # A member archived as failed, then retried successfully (its FAILED cleared): the archive
  # drops the stale FAILED too, so it reads back as done, not failed.
  shutil.rmtree(root / "b_lr4")
  add_checkpoint(grid_member(str(root), "b_lr4", "bert", "d32L2", 5e4, 3e11, 8, 4e-3, 5.9), 100)
  assert os.path.exists(out / "b_lr4" / "FAILED")
  assert archive.main(["--root", str(root), "--out", str(out)]) == 0
  assert "archived 4 done and 0 failed member(s)" in capsys.readouterr().out
  assert not os.path.exists(out / "b_lr4" / "FAILED")
  assert status.member_state("b_lr4", str(out / "b_lr4"), probe=False).state == "done"
  assert key(grid_read.read_grid(str(out))) == key(grid_read.read_grid(str(root)))


def test_archive_refuses_a_missing_root_and_an_out_inside_it(tmp_path, capsys):
  for argv, words in (
    (["--root", str(tmp_path / "nope"), "--out", str(tmp_path / "a")], "no such directory"),
    (["--root", str(tmp_path), "--out", str(tmp_path / "a")], "is inside --root"),
  ):
    assert archive.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and words in err, err


def test_archive_refuses_an_out_that_is_a_file_or_a_symlink(tmp_path, capsys):
  """--out a regular file was a traceback; --out a symlink (into --root, or anywhere) passed the
  inside-the-root check and wrote into the link's target. Each is one line, exit 2, and nothing
  is written under --root or through the link."""
  root = tmp_path / "grid"
  os.makedirs(root)
  _grid(str(root))
  before = sorted(str(p.relative_to(root)) for p in root.rglob("*"))
  (tmp_path / "file").write_text("mine")
  os.symlink(root / "b_lr1", tmp_path / "into_root")
  os.symlink(root, tmp_path / "root_link")
  elsewhere = tmp_path / "elsewhere"
  os.makedirs(elsewhere)
  os.symlink(elsewhere, tmp_path / "out_link")
  for out, words in (
    (tmp_path / "file", "--out: '{}' is a file, not a directory"),
    (tmp_path / "file" / "sub", "--out: cannot create the directory '{}'"),
    (tmp_path / "into_root", "--out: '{}' is a symbolic link"),
    (tmp_path / "out_link", "--out: '{}' is a symbolic link"),
    (tmp_path / "root_link" / "arch", "is inside --root"),
  ):
    assert archive.main(["--root", str(root), "--out", str(out)]) == 2, out
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: "), err
    assert words.format(out) in err, err
  assert (tmp_path / "file").read_text() == "mine"
  assert os.listdir(elsewhere) == []
  assert sorted(str(p.relative_to(root)) for p in root.rglob("*")) == before


def test_archive_names_the_members_it_skipped_or_repaired(tmp_path, capsys):
  """A member whose config.json was cut mid-write was dropped silently, and a metrics.jsonl whose
  last line was cut mid-write was archived as it was. Now the cut line is dropped from the
  archived copy (the member is 'repaired', exit 0 if nothing else is wrong), a member whose
  config.json is not valid JSON is skipped, and both are named with the reason; a skipped member
  makes the exit status 1."""
  root, out = tmp_path / "grid", tmp_path / "archive"
  os.makedirs(root)
  _grid(str(root))
  metrics = root / "b_lr4" / "metrics.jsonl"
  whole = metrics.read_bytes()
  metrics.write_bytes(whole + b'{"step": 7, "train/lo')  # killed mid-write
  assert archive.main(["--root", str(root), "--out", str(out)]) == 0
  stdout = capsys.readouterr().out
  assert "archived 2 done and 1 failed member(s)" in stdout
  assert (
    "repaired 1 member: b_lr4 (metrics.jsonl: dropped its last line 5, cut mid-write: "
    "21 bytes without a newline, not a JSON row)" in stdout
  ), stdout
  assert (out / "b_lr4" / "metrics.jsonl").read_bytes() == whole
  assert record.metrics_rows(str(out / "b_lr4")) == record.metrics_rows(str(root / "b_lr4"))

  config = root / "b_lr2" / "config.json"
  config.write_bytes(config.read_bytes()[:40])  # cut mid-write
  kept = (out / "b_lr2" / "config.json").read_bytes()
  assert archive.main(["--root", str(root), "--out", str(out)]) == 1
  captured = capsys.readouterr()
  assert "archived 1 done and 1 failed member(s)" in captured.out
  assert "repaired 1 member: b_lr4" in captured.out
  err = captured.err.strip()
  assert len(err.splitlines()) == 1, err
  assert err.startswith("skipped 1 member: b_lr2 (config.json is not valid JSON: "), err
  assert err.endswith("(char 40); its earlier archive is kept)"), err
  assert (out / "b_lr2" / "config.json").read_bytes() == kept
  shutil.rmtree(out)
  assert archive.main(["--root", str(root), "--out", str(out)]) == 1
  assert capsys.readouterr().err.strip().endswith("(char 40))")
  assert sorted(os.listdir(out)) == ["b_lr1", "b_lr4", "sweep.json"]
