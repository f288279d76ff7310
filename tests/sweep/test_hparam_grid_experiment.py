"""experiments/hparam_grid.py: its members, per scale, resolve to the sweep's member with the batch
and LR they name; the whole grid's config; bad member arguments."""

import os

import pytest

from cbert_jax import config_lib
from cbert_jax.scaling import plan as plan_lib
from cbert_jax.sweep import experiment

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# The fields a grid member may differ in from the sweep's member: name, and the plan (B, LR, steps).
PLAN_FIELDS = {"name", "total_steps", "batch_size", "optim.lr", "checkpoint_every", "eval_every"}
# The memory plan (sweep.chip) follows the batch: another B may get another setting.
MEMORY_FIELDS = {"model.remat", "model.ce_chunk", "optim.microbatches"}


def test_hparam_grid_members_resolve_with_the_b_and_lr_they_name():
  path = os.path.join(ROOT, "experiments", "hparam_grid.py")
  exp = experiment.load_experiment(path)
  sweep = exp.SWEEP
  for scale, want, per_size in (("cpu", 180, {25, 28, 14, 10}), ("paper", 105, {15})):
    members = exp.get_sweep(scale)
    assert len(members) == want
    names = [exp.workdir_name(a) for a in members]
    assert len(set(names)) == len(names)
    per = {}
    for arg in members:
      a = config_lib.parse_arg(arg, scale="", model="", size="", batch=0, lr=0.0)
      c = config_lib.resolve(exp.get_config(arg))
      assert c.mode == "train" and c.sweep.scale == scale and not c.sweep.probe
      assert (c.batch_size, c.optim.lr) == (a.batch, a.lr)
      assert c.sweep.laws_source.startswith(
        "sweep.lr and sweep.batch_size set explicitly; laws otherwise: default: DeepSeek"
      )
      assert c.sweep.tokens_per_param == exp.GRIDS[scale]["tokens_per_param"]
      assert c.name == f"hparam_grid_{scale}/{exp.workdir_name(arg)}"
      tokens = c.total_steps * c.batch_size * c.data.seq_len
      assert tokens == c.sweep.tokens >= c.sweep.target_tokens
      assert c.batch_size % c.sweep.batch_multiple == 0
      per.setdefault((a.model, a.size), []).append(arg)
      if scale == "paper":
        assert 50e6 <= c.sweep.n_params <= 700e6
      # Everything but B, LR, budget and bookkeeping is the sweep's member.
      ref = config_lib.resolve(sweep.get_config(sweep.member_arg(scale, a.model, a.size)))
      leaves = config_lib.leaves
      ours, theirs = dict(leaves(c)), dict(leaves(ref))
      differ = {k for k in ours if ours[k] != theirs[k]}
      assert differ <= PLAN_FIELDS | {k for k in differ if k.startswith("sweep.")} | (
        MEMORY_FIELDS if c.sweep.chip else set()
      ), differ
      if c.sweep.chip:  # the grid member trains with the setting its own plan chose
        assert c.sweep.memory_verdict == "fits"
        assert c.sweep.memory_setting == plan_lib.current_setting(c).describe()
    assert set(map(len, per.values())) == per_size
    # The law's own suggestion is the centre of every size's grid (a size gridded at its own
    # pairs only, extra_by_size, is centred elsewhere).
    for (model, size), args in per.items():
      if size not in exp.GRIDS[scale]["sizes"]:
        continue
      lr0, rows0, _, _ = exp.law_point(scale, model, size)
      assert f"batch={rows0},lr={float(f'{lr0:.3g}'):.3g}" in ",".join(args)
  assert {s for _, s in per} == {"d768L12", "d1024L16", "d1280L20", "d1536L24"}  # paper
  assert "d1536L24" in exp.grid_sizes("paper", "bert")
  assert "d1536L24" not in exp.grid_sizes("paper", "crossbert")  # N 849M > 700M
  cpu = exp.get_sweep("cpu")
  assert {exp.workdir_name(a).split("_b")[0] for a in cpu} == {
    f"{m}_{s}" for m in ("bert", "crossbert") for s in ("d32L2", "d64L2", "d96L3")
  } | {"bert_d128L3", "crossbert_d128L3"}
  # The whole grid: mode=sweep, no probes, no scaling report; the runner plans it (1 device).
  for arg, scale in ((None, "auto"), ("cpu", "cpu"), ("paper", "paper")):
    c = exp.get_config(arg)
    assert c.mode == "sweep" and c.sweep.scale == scale and c.sweep.experiment == path
    assert not c.sweep.probe and not c.sweep.report
  c = exp.get_config("cpu")
  with c.unlocked():
    c.num_devices = 1
  scale, planned = experiment.resolve_members(c, "/nonexistent/root")
  assert scale == "cpu" and [n for n, _, _ in planned] == [exp.workdir_name(a) for a in cpu]
  # Bad member args are named.
  from cbert_jax.errors import ConfigError

  for bad, words in (
    ("model=bert,size=d32L2", "needs model=, size=, batch="),
    ("model=bert,size=d256L4,batch=8,lr=0.01", "is in no grid"),
    ("scale=paper,model=crossbert,size=d1536L24,batch=8,lr=0.01", "not in the paper grid"),
    ("scale=quick", "scale must be one of"),
  ):
    with pytest.raises(ConfigError, match=words):
      exp.get_config(bad)
