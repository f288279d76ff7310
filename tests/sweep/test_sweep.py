"""experiments/sweep.py and the member plan: every member resolves and validates, budgets and
hyperparameters follow the laws (the scaling report's tests: tests/report/test_report.py)."""

import json
import math
import os

import pytest

from cbert_jax import config_lib
from cbert_jax.errors import ConfigError
from cbert_jax.models import flops
from cbert_jax.scaling import laws as laws_lib
from cbert_jax.scaling import plan
from cbert_jax.sweep import experiment as experiment_lib
from tests.helpers import TINY

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def experiment():
  return experiment_lib.load_experiment(os.path.join(ROOT, "experiments", "sweep.py"))


def test_every_member_of_every_scale_resolves_and_validates_on_its_target_devices():
  exp = experiment()
  counts = {}
  for scale in ("paper", "cpu", "heldout", "quick"):
    members = exp.get_sweep(scale)
    counts[scale] = members
    for arg in members:
      c = exp.get_config(arg)
      if scale == "paper":
        c.data.sources = TINY  # the pod corpus a user supplies
      c = config_lib.resolve(c)
      config_lib.validate(c, c.sweep.target_devices or 1)
      assert c.mode == "train" and c.sweep.scale == scale
      assert (
        c.total_steps * c.batch_size * c.data.seq_len == c.sweep.tokens >= c.sweep.target_tokens
      )
      assert c.batch_size % max(c.sweep.batch_multiple, 1) == 0
  paper = counts["paper"]
  assert len(paper) == 17
  assert (
    sum("model=bert" in a for a in paper) == 8 and sum("model=crossbert" in a for a in paper) == 9
  )
  assert "scale=paper,model=crossbert,size=d2304L32" in paper
  assert "scale=paper,model=bert,size=d2304L32" not in paper
  cpu = counts["cpu"]
  assert len({a.split("size=")[1].split(",")[0] for a in cpu}) >= 4  # >= 4 sizes x 2 models
  assert "scale=cpu,model=crossbert,size=d96L3,cms=false" in cpu  # the CMS control
  # Two seeds on cpu: the same 9 members again with seed=1, named _s1, nothing else changed.
  assert len(cpu) == 18 and cpu[9:] == [f"{a},seed=1" for a in cpu[:9]]
  for a0, a1 in ((cpu[0], cpu[9]), (cpu[8], cpu[17])):
    c0, c1 = (config_lib.resolve(exp.get_config(a)) for a in (a0, a1))
    assert (c0.seed, c1.seed) == (0, 1)
    assert c1.name == c0.name + "_s1" and experiment_lib.config_member_name(c1).endswith("_s1")
    d0, d1 = c0.to_dict(), c1.to_dict()
    assert {k for k in d0 if d0[k] != d1[k]} == {"seed", "name", "sweep"}
    assert {k for k in d0["sweep"] if d0["sweep"][k] != d1["sweep"][k]} == {"arg"}
  assert len(counts["quick"]) == 6 and not any("seed=" in a for a in counts["quick"])
  assert len(counts["heldout"]) == 4  # d160L3 x {BERT, CrossBERT+CMS} x 2 seeds

  # predictor depth = layers / 4 (at least 1) on every CrossBERT rung
  for arg in paper:
    c = config_lib.resolve(exp.get_config(arg))
    assert c.model.predictor_layers == max(1, c.model.num_layers // 4)


def test_the_heldout_members_are_the_cpu_sweep_at_another_size():
  """The pre-registered held-out size trains exactly as the cpu sweep's members do: the same
  data, tokenizer, schedule shape, laws and probes; only the size and what follows from it."""
  exp = experiment()
  for model in ("bert", "crossbert"):
    cpu = config_lib.resolve(exp.get_config(f"scale=cpu,model={model},size=d128L3")).to_dict()
    held = config_lib.resolve(exp.get_config(f"model={model},size=d160L3")).to_dict()
    assert held["sweep"]["scale"] == "heldout" and held["model"]["size"] == "d160L3"
    differ = {k for k in cpu if cpu[k] != held[k]}
    # the size, its budget's steps and batch (and the periods that follow the steps), its LR
    follows = {"checkpoint_every", "eval_every"}
    assert differ - follows == {"name", "model", "sweep", "total_steps", "batch_size", "optim"}
    assert {k for k in cpu["optim"] if cpu["optim"][k] != held["optim"][k]} == {"lr"}
    assert held["data"] == cpu["data"]
    # the laws the predictions were made for, pinned; the cpu scale's CrossBERT reads its refit
    assert held["sweep"]["laws"] == exp.CPU_LAWS == "shipped:cpu-{model}"
    assert cpu["sweep"]["laws"] == exp.LAWS["cpu"][model]


def test_cms_control_arms_differ_only_in_cms_and_seed():
  """experiments/cms_control.py: 8 members; within a size both arms train with the CMS member's
  batch, LR and steps of the cpu sweep, on the same tokens; only masking.cms (and the FLOPs that
  follow) differ; seeds change config.seed only."""
  cc = experiment_lib.load_experiment(os.path.join(ROOT, "experiments", "cms_control.py"))
  args = cc.get_sweep()
  names = [cc.workdir_name(a) for a in args]
  assert len(set(names)) == 8 and "crossbert-nocms_d96L3_s1" in names
  cfgs = {n: config_lib.resolve(cc.get_config(a)) for n, a in zip(names, args)}
  sweep_cms = experiment().get_config("scale=cpu,model=crossbert,size=d64L2")
  sweep_cms.sweep.laws = cc.LAWS  # pinned: what the cpu sweep planned with when this ran
  sweep_cms = config_lib.resolve(sweep_cms)
  for size in cc.SIZES:
    cms, nocms = cfgs[f"crossbert_{size}_s0"], cfgs[f"crossbert-nocms_{size}_s0"]
    for c in (cms, nocms, cfgs[f"crossbert_{size}_s1"]):
      assert (c.batch_size, c.optim.lr, c.total_steps) == cc.cms_plan(size)
      assert c.sweep.tokens == cms.sweep.tokens and c.masking.mask_ratio == 0.5
      assert c.val_full_every > 0 and c.evals.every > 0 and c.evals.probes == "ridge,logreg,knn"
    assert cms.masking.cms and not nocms.masking.cms
    assert cms.sweep.compute > nocms.sweep.compute  # the same tokens cost CMS more FLOPs
    assert cfgs[f"crossbert_{size}_s1"].seed == 1
  assert cc.cms_plan("d64L2") == (sweep_cms.batch_size, sweep_cms.optim.lr, sweep_cms.total_steps)
  # ... which is what the archived experiment trained (results/cms_control), config and all
  for name, c in cfgs.items():
    with open(os.path.join(ROOT, "results", "cms_control", name, "config.json")) as f:
      archived = json.load(f)["config"]
    assert (c.batch_size, c.optim.lr, c.total_steps) == (
      archived["batch_size"],
      archived["optim"]["lr"],
      archived["total_steps"],
    ), name
    assert c.sweep.laws == archived["sweep"]["laws"] == "shipped:cpu-{model}", name
  whole = cc.get_config()
  assert whole.mode == "sweep" and not whole.sweep.report
  # `:cpu` (the scale launch.sweep needs named) is the whole experiment too
  by_scale = cc.get_config("cpu")
  assert by_scale.mode == "sweep" and by_scale.sweep.scale == whole.sweep.scale == "cpu"
  assert cc.get_sweep("cpu") == args
  with pytest.raises(ConfigError, match=r"cpu scale only .*use experiments/cms_control.py:cpu"):
    cc.get_config("paper")
  with pytest.raises(ConfigError, match="size must be one of d64L2, d96L3"):
    cc.get_config("size=d32L2")


def test_cms_fair_members_are_cms_controls_at_their_own_batch_lr_seed_and_budget():
  """experiments/cms_fair.py: the no-CMS grid is the 3 x 3 the 20-tokens-per-parameter check ran
  for CMS; a member is cms_control's member of its arm with only rows, LR, seed, the budget (for
  cms_flops) and the validation/probe cadence changed; cms_flops spends no-CMS's training FLOPs."""
  cf = experiment_lib.load_experiment(os.path.join(ROOT, "experiments", "cms_fair.py"))
  grid = cf.get_sweep("grid")
  seed3 = [] if cf.GRID_BEST is None else list(dict.fromkeys([cf.GRID_BEST, cf.CENTRE]))
  assert len(grid) == 9 + len(cf.EDGE_POINTS) + len(seed3)
  assert grid[len(grid) - len(seed3) :] == [cf.member_arg("nocms", r, lr, 3) for r, lr in seed3]
  assert cf.workdir_name(grid[0]) == "nocms_d64L2_b4_lr0.00134_s2"
  control = {
    cms: dict(config_lib.leaves(config_lib.resolve(cf.CONTROL.get_config(f"size=d64L2,cms={cms}"))))
    for cms in ("true", "false")
  }
  allowed = {"seed", "batch_size", "optim.lr", "total_steps", "val_full_every", "evals.every"}
  allowed |= {"name", "sweep.arg", "sweep.experiment", "sweep.batch_size", "sweep.lr"}
  allowed |= {"eval_every", "checkpoint_every"}  # derived from the steps
  budget = {"sweep.tokens_per_param", "sweep.tokens", "sweep.target_tokens", "sweep.compute"}
  budget |= {"optim.warmup_steps", "optim.decay_steps"}
  cfgs = {}
  for arm, rows, lr in (("nocms", 14, 2.68e-3), ("cms", 14, 5.36e-3), ("cms_flops", 14, 5.36e-3)):
    c = config_lib.resolve(cf.get_config(cf.member_arg(arm, rows, lr, 3)))
    cfgs[arm] = c
    base = control["false" if arm == "nocms" else "true"]
    changed = {k for k, v in config_lib.leaves(c) if base.get(k) != v}
    assert changed <= allowed | (budget if arm == "cms_flops" else set()), (arm, changed)
    assert (c.batch_size, c.optim.lr, c.seed, c.evals.every) == (rows, lr, 3, 0)
    assert c.val_full_every == math.ceil(c.total_steps / cf.VAL_POINTS)
  assert cfgs["cms"].sweep.tokens == cfgs["nocms"].sweep.tokens
  # matched FLOPs: the same training FLOPs to within one step's, on fewer tokens
  step_flops = cfgs["cms"].sweep.compute / cfgs["cms"].total_steps
  assert abs(cfgs["cms_flops"].sweep.compute - cfgs["nocms"].sweep.compute) <= step_flops
  assert cfgs["cms_flops"].sweep.tokens < cfgs["cms"].sweep.tokens
  compare = [cf.workdir_name(a) for a in cf.get_sweep("compare")]
  assert compare == [
    f"{arm}_d64L2_b14_lr0.00536_s{s}" for s in (2, 3) for arm in ("cms", "cms-flops")
  ]
  with pytest.raises(ConfigError, match=r"seed must be one of 2, 3"):
    cf.get_config("arm=cms,rows=14,lr=0.00536,seed=0")
  with pytest.raises(ConfigError, match=r"arm must be one of cms, nocms, cms_flops"):
    cf.get_config("arm=bert,rows=14,lr=0.00536,seed=2")
  stage = cf.get_config("grid")
  assert stage.mode == "sweep" and stage.sweep.scale == "grid"  # the runner lists the stage's


def test_member_plan_arithmetic_follows_budget_and_laws():
  exp = experiment()
  c = config_lib.resolve(exp.get_config("model=crossbert,size=d96L3"))  # scale from the size
  assert c.sweep.scale == "cpu" and c.masking.cms
  model_cfg, mask_cfg = plan.model_config(c)
  n = flops.param_counts("crossbert", model_cfg).non_embedding
  assert c.sweep.n_params == n and c.sweep.target_tokens == math.ceil(20 * n)
  per_token = flops.flops_per_token("crossbert", model_cfg, mask_cfg, 128)
  # the cpu scale's laws: each family's refit at its own 20 tokens per parameter, shipped
  assert c.sweep.laws == exp.CPU20_LAWS == "shipped:cpu20-{model}"
  shipped = laws_lib.load("shipped:cpu20-crossbert")
  assert c.sweep.laws_source == shipped.source != laws_lib.DEFAULT.source
  bert = config_lib.resolve(exp.get_config("model=bert,size=d96L3"))
  assert bert.sweep.laws_source == laws_lib.load("shipped:cpu20-bert").source != shipped.source
  lr, rows = laws_lib.suggest(shipped, per_token * c.sweep.target_tokens, 128)
  assert c.batch_size == rows and c.optim.lr == pytest.approx(lr)
  assert c.total_steps == math.ceil(c.sweep.target_tokens / (rows * 128))
  assert c.sweep.compute == pytest.approx(per_token * c.total_steps * rows * 128)
  assert c.checkpoint_every == math.ceil(c.total_steps / 10)
  # explicit batch and LR win over the laws; the budget follows the batch
  c2 = exp.get_config("model=crossbert,size=d96L3")
  c2.sweep.batch_size, c2.sweep.lr = 10, 1e-3
  c2 = config_lib.resolve(c2)
  assert (c2.batch_size, c2.optim.lr) == (10, 1e-3)
  assert c2.total_steps == math.ceil(c.sweep.target_tokens / (10 * 128))
  # N definitions: total > non_embedding > encoder for CrossBERT (predictor, embeddings)
  ns = {}
  for d in ("total", "non_embedding", "encoder"):
    c3 = exp.get_config("model=crossbert,size=d96L3")
    c3.sweep.n_definition = d
    ns[d] = config_lib.resolve(c3).sweep.n_params
  assert ns["total"] > ns["non_embedding"] > ns["encoder"]


def test_bad_sweep_arguments_fail_with_one_clear_message():
  exp = experiment()
  with pytest.raises(ConfigError, match="needs both model= and size="):
    exp.get_config("model=bert")
  with pytest.raises(ConfigError, match="size 'd999L1' is in no sweep"):
    exp.get_config("model=bert,size=d999L1")
  with pytest.raises(ConfigError, match="bert_d2304L32 is not a member of the paper sweep"):
    exp.get_config("model=bert,size=d2304L32")
  with pytest.raises(ConfigError, match="model must be bert|crossbert"):
    exp.get_config("model=electra,size=d32L2")
  with pytest.raises(ConfigError, match="scale must be one of"):
    exp.get_config("scale=huge")
  whole = exp.get_config(None)
  assert whole.mode == "sweep" and whole.sweep.scale == "auto"
  assert exp.get_config("quick").sweep.scale == "quick"
  c = exp.get_config("model=bert,size=d32L2")
  c.sweep.n_definition = "everything"
  with pytest.raises(ConfigError, match="sweep.n_definition must be one of"):
    config_lib.resolve(c)
  c = exp.get_config("model=bert,size=d32L2")
  c.sweep.law_axis, c.sweep.laws = "params", ""  # the published defaults: fitted against C only
  with pytest.raises(ConfigError, match="law_axis=params: the laws .* have no fit against N"):
    config_lib.resolve(c)
