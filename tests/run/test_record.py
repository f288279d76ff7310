"""`cbert_jax.run.record`, the one reader of a run's workdir: real runs (the archived sweep and CMS
control in results/, a tiny run trained here) and synthetic members (tests/members.py) that are
finished, unfinished, failed, archived, torn mid-write or without a readable config.json; each
also as `status.member_state` sees it."""

import json
import os

import pytest

from cbert_jax.run import record, status
from tests import members

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = [os.path.join(ROOT, "results", d) for d in ("sweep_cpu", "cms_control")]
STEPS = 100
PROBES = {"task": {"kind": "classification", "ridge": {"test": 0.5}}, "average": {"ridge": 0.5}}


def _rows(last: int) -> list[dict]:
  """Training rows every 10 steps up to `last`, eval/loss at `last`."""
  rows = [{"step": s, "train/loss": 9.0 - s / 100} for s in range(10, last + 1, 10)]
  return rows + [{"step": last, "eval/loss": 8.5, "val_full/loss": 8.4}]


def _member(root, name, last=STEPS, **kw) -> str:
  """A member of STEPS steps logged (and checkpointed) up to `last`; finished: the final step's
  val_full record and probe results."""
  finished = last == STEPS
  kw.setdefault("checkpoints", (last // 2, last))
  kw.setdefault("val_full", {STEPS: {"loss": 8.4, "masked_acc": 0.1}} if finished else None)
  kw.setdefault("probes", {STEPS: PROBES} if finished else None)
  config = members.member_config(total_steps=STEPS, sweep={"probe": True})
  return members.write_member(os.path.join(root, name), config, rows=_rows(last), **kw)


# ------------------------------------------------------------------------------ real runs ---
@pytest.mark.parametrize("root", RESULTS, ids=os.path.basename)
def test_the_archived_runs_in_results_read_back_as_done(root):
  names = record.run_names(root)
  assert len(names) >= 8 and "report" not in names
  for name in names:
    wd = os.path.join(root, name)
    body = record.read_record(wd)
    assert {"config", "provenance", "param_counts", "flops_per_token"} <= set(body)
    total = record.total_steps(wd)
    assert total == body["config"]["total_steps"] > 0 and record.archived_step(wd) == total
    assert record.checkpoint_steps(wd) == []  # archived: checkpoints left out
    rows = record.metrics_rows(wd)
    assert rows[-1]["step"] == record.last_logged_step(wd) == total
    rec = record.read_val_full(wd, total)
    assert rec["step"] == total and rec["loss"] == pytest.approx(rows[-1]["val_full/loss"])
    assert record.val_full_steps(wd)[-1] == total
    path, results = record.offline_results(wd, total)
    assert path == record.probe_results(wd, total) and results["suite"] == "offline"
    assert os.path.basename(path).startswith(f"step_{total}-")  # non-default evals: a hash
    assert results["step"] == total and "average" in results["results"]
    assert record.failed(wd) is None
    assert status.member_state(name, wd, probe=True).state == "done"


def test_a_trained_run_reads_back(trained_run):
  """The tiny run the tests train (2 steps, checkpoints and val_full records at steps 1 and 2):
  what the trainer wrote, read back."""
  wd = trained_run("bert")
  body = record.read_record(wd)
  assert body["config"]["model_name"] == "bert" and body["config"]["total_steps"] == 2
  assert record.total_steps(wd) == 2 and record.checkpoint_steps(wd) == [1, 2]
  assert record.last_logged_step(wd) == 2 == record.metrics_rows(wd)[-1]["step"]
  assert record.val_full_steps(wd) == [1, 2]
  assert record.read_val_full(wd, 2)["step"] == 2 and record.read_val_full(wd, 3) is None
  assert record.probe_results(wd, 2) is None  # no probe suite ran
  assert record.failed(wd) is None and record.archived_step(wd) == 0
  assert record.modified(wd, record.METRICS_FILE) is not None
  assert record.modified(wd, record.FAILED_FILE) is None
  assert status.is_done(wd, probe=False) and not status.is_done(wd, probe=True)


# ----------------------------------------------------------------------- synthetic members ---
def test_a_finished_member(tmp_path):
  wd = _member(tmp_path, "done")
  assert record.read_config(wd) == members.member_config(total_steps=STEPS, sweep={"probe": True})
  assert record.total_steps(wd) == STEPS and record.checkpoint_steps(wd) == [50, 100]
  assert [r["step"] for r in record.metrics_rows(wd)] == [*range(10, 101, 10), 100]
  assert record.last_logged_step(wd) == STEPS
  assert record.read_val_full(wd, STEPS) == {"step": STEPS, "loss": 8.4, "masked_acc": 0.1}
  assert record.val_full_steps(wd) == [STEPS]
  path, body = record.offline_results(wd, STEPS)
  assert path == os.path.join(wd, "eval", f"step_{STEPS}.json") == record.probe_results(wd, STEPS)
  assert body["suite"] == "offline" and body["results"] == PROBES
  assert record.failed(wd) is None and record.archived_step(wd) == 0
  assert status.member_state("done", wd).state == "done"


def test_an_unfinished_member(tmp_path):
  wd = _member(tmp_path, "half", last=40)
  assert record.total_steps(wd) == STEPS and record.checkpoint_steps(wd) == [20, 40]
  assert record.last_logged_step(wd) == 40
  assert record.read_val_full(wd, STEPS) is None and record.val_full_steps(wd) == []
  assert record.offline_results(wd, STEPS) is None and record.probe_results(wd, STEPS) is None
  st = status.member_state("half", wd)  # metrics.jsonl written just now: running
  assert (st.state, st.step, st.total_steps) == ("running", 40, STEPS)
  later = record.modified(wd, record.METRICS_FILE) + status.RUNNING_WINDOW_S + 1
  st = status.member_state("half", wd, now=later)
  assert (st.state, st.step) == ("pending", 40)  # resumes from its last checkpoint


def test_a_failed_member(tmp_path):
  wd = _member(tmp_path, "nan", last=30, failed="NonFiniteError: loss is nan at step 30\n")
  assert record.failed(wd) == "NonFiniteError: loss is nan at step 30"
  assert record.modified(wd, record.FAILED_FILE) >= record.modified(wd, record.METRICS_FILE)
  st = status.member_state("nan", wd)
  assert (st.state, st.error) == ("failed", "NonFiniteError: loss is nan at step 30")
  # A later log line (a retry running) outdates the marker.
  os.utime(os.path.join(wd, record.FAILED_FILE), (0, 0))
  assert status.member_state("nan", wd).state == "running"


def test_an_archived_member(tmp_path):
  wd = _member(tmp_path, "kept", checkpoints=(), archived=STEPS)
  assert record.checkpoint_steps(wd) == [] and record.archived_step(wd) == STEPS
  with open(os.path.join(wd, record.ARCHIVE_FILE)) as f:
    assert json.load(f)["checkpoints_left_out"] is True
  st = status.member_state("kept", wd)
  assert (st.state, st.step) == ("done", STEPS)
  # Without its probe results it is done only for a sweep that does not probe.
  os.unlink(record.probe_results(wd, STEPS))
  assert status.is_done(wd, probe=False) and not status.is_done(wd, probe=True)


def test_a_cut_last_line_in_metrics_jsonl(tmp_path, caplog):
  wd = _member(tmp_path, "torn", last=40)
  members.append_rows(wd, [{"step": 50, "train/loss": 8.5}], torn='{"step": 60, "train/lo')
  assert record.last_logged_step(wd) == 50  # the last complete line
  assert [r["step"] for r in record.metrics_rows(wd)][-2:] == [40, 50]
  assert "Skipped 1 unreadable line(s)" in caplog.text


def test_the_checkpoint_steps_skip_what_is_not_a_finished_checkpoint(tmp_path):
  wd = _member(tmp_path, "ckpt", last=40)
  ckpts = os.path.join(wd, record.CHECKPOINTS_DIR)
  os.makedirs(os.path.join(ckpts, "60.orbax-checkpoint-tmp-1700000000"))
  open(os.path.join(ckpts, "70"), "w").close()  # a file, not a checkpoint
  assert record.checkpoint_steps(wd) == [20, 40]


def test_the_offline_results_skip_other_suites_and_unreadable_files(tmp_path):
  wd = _member(tmp_path, "probed", probes={})
  members.write_probes(wd, f"step_{STEPS}", {"x": 1}, suite="glue")  # not the offline suite
  assert record.offline_results(wd, STEPS) is None
  with open(os.path.join(wd, "eval", f"step_{STEPS}-0a.json"), "w") as f:
    f.write("{not json")
  assert record.offline_results(wd, STEPS) is None
  path = members.write_probes(wd, f"step_{STEPS}-1b", PROBES)  # non-default evals settings
  assert record.offline_results(wd, STEPS) == (path, json.load(open(path)))


def test_the_results_of_a_step_are_not_those_of_a_longer_step_number(tmp_path):
  # step 1's files are not step 12's or step 1x's: the step number is matched whole.
  wd = _member(tmp_path, "prefix", probes={})
  twelve = members.write_probes(wd, 12, PROBES)
  members.write_probes(wd, "step_1x", PROBES)
  assert record.offline_results(wd, 1) is None and record.probe_results(wd, 1) is None
  assert record.suite_results(wd, 1) == [] and record.suite_results(wd, 12) == [twelve]
  one = members.write_probes(wd, 1, PROBES)
  assert record.offline_results(wd, 1) == (one, json.load(open(one)))
  assert record.offline_results(wd, 12)[0] == twelve


def test_an_unreadable_val_full_record_names_its_file(tmp_path):
  wd = _member(tmp_path, "bad", val_full={STEPS: 8.4})
  with open(record.val_full_path(wd, STEPS), "w") as f:
    f.write("{")
  with pytest.raises(ValueError, match=r"val_full-step_100\.json: not a validation record"):
    record.read_val_full(wd, STEPS)


@pytest.mark.parametrize(
  "text, cause",
  [
    (None, FileNotFoundError),
    ("{not json", ValueError),
    ('{"provenance": {}}', KeyError),
    ('{"config": [1, 2]}', TypeError),
    ("[1, 2]", TypeError),
  ],
  ids=["absent", "not_json", "no_config", "config_not_an_object", "not_an_object"],
)
def test_an_absent_or_unreadable_config_json(tmp_path, text, cause):
  wd = _member(tmp_path, "member")
  path = os.path.join(wd, record.CONFIG_FILE)
  os.unlink(path)
  if text is not None:
    with open(path, "w") as f:
      f.write(text)
  with pytest.raises(record.ConfigFileError) as e:
    record.read_config(wd)
  assert isinstance(e.value.cause, cause) and e.value.missing is (text is None)
  assert str(e.value) == f"{path}: not a run's config.json ({e.value.cause})"
  assert record.config_or_none(wd) is None and record.total_steps(wd) == 0
  # Its other files still read; it is no sweep member (no total_steps): never done.
  assert record.checkpoint_steps(wd) == [50, 100] and record.last_logged_step(wd) == STEPS
  assert not status.is_done(wd, probe=False)
  assert record.run_names(str(tmp_path)) == ([] if text is None else ["member"])


def test_a_workdir_that_does_not_exist_reads_as_nothing(tmp_path):
  wd = str(tmp_path / "nope")
  with pytest.raises(record.ConfigFileError) as e:
    record.read_record(wd)
  assert e.value.missing
  assert record.total_steps(wd) == 0 and record.checkpoint_steps(wd) == []
  assert record.metrics_rows(wd) == [] and record.last_logged_step(wd) == 0
  assert record.read_val_full(wd, 1) is None and record.val_full_steps(wd) == []
  assert record.offline_results(wd, 1) is None and record.failed(wd) is None
  assert record.archived_step(wd) == 0 and record.modified(wd, record.METRICS_FILE) is None
  assert status.member_state("nope", wd).state == "pending"


def test_run_names_are_the_subdirectories_with_a_config_json(tmp_path):
  for name in ("b", "a"):
    _member(tmp_path, name)
  (tmp_path / "report").mkdir()  # a sweep's outputs, no member
  (tmp_path / "sweep.json").write_text("{}")
  (tmp_path / "odd" / record.CONFIG_FILE).mkdir(parents=True)  # not a file
  assert record.run_names(str(tmp_path)) == ["a", "b"]
