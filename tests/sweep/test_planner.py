"""The compute-optimal planner against answers computed here, independently: the surface's
allocation (closed form, and a numeric minimum two ways), the laws' LR and batch, the steps and
wall time, the loss interval over known bootstrap draws, one-line refusals of bad input before any
config is built, and --json against the table. Synthetic surfaces and laws; no network, no JAX."""

import json
import math

import numpy as np
import pytest
from scipy import optimize

from cbert_jax.models import sizes
from cbert_jax.scaling import chinchilla
from cbert_jax.scaling import chips as chips_lib
from cbert_jax.scaling import laws as laws_lib
from cbert_jax.scaling import memory as memory_lib
from cbert_jax.scaling.fit import PowerLaw
from cbert_jax.sweep import planner

E, A, ALPHA, B, BETA, K = 1.8, 300.0, 0.34, 900.0, 0.30, 6.3
TRUE = chinchilla.LossSurface(E=E, A=A, alpha=ALPHA, B=B, beta=BETA)
# Published peaks per JAX device (bf16, dense): TPU v5p 459 TFLOP/s, H100 SXM 989.4 TFLOP/s.
V5P_PEAK, H100_PEAK = 459e12, 989.4e12


def run(argv: list[str]) -> int:
  """planner.main's exit status (argparse's usage errors exit through SystemExit)."""
  try:
    return planner.main(argv)
  except SystemExit as e:
    return int(e.code)


def plan_json(capsys, *argv: str) -> dict:
  assert run([*argv, "--json"]) == 0, capsys.readouterr().err
  return json.loads(capsys.readouterr().out)


def known_draws(n: int = 40, seed: int = 0) -> np.ndarray:
  """[n, 5] bootstrap-like draws (log A, log B, log E, alpha, beta) around TRUE."""
  rng = np.random.default_rng(seed)
  centre = np.array([math.log(A), math.log(B), math.log(E), ALPHA, BETA])
  return centre + rng.normal(0.0, [0.2, 0.2, 0.02, 0.01, 0.01], (n, 5))


def write_surface(path, law=TRUE, draws=None, level=0.9, problems=(), k=K, **provenance) -> str:
  fit = chinchilla.Fit(
    law=law, objective=0.0, points=15, problems=list(problems), draws=draws, level=level
  )
  provenance = {"n_definition": "non_embedding", "runs": "synthetic"} | provenance
  chinchilla.save(str(path), fit, k, provenance)
  return str(path)


def write_laws(
  path, a=0.05, alpha=-0.08, b=0.5, beta=0.31, overridden=(), reason="", runs=()
) -> str:
  laws = laws_lib.HyperLaws(
    lr=PowerLaw(a=a, alpha=alpha, n_points=4),
    batch_tokens=PowerLaw(a=b, alpha=beta, n_points=4),
    source="synthetic test laws",
    provenance={"override_reason": reason, "runs": list(runs)},
    overridden=tuple(overridden),
  )
  laws_lib.save(str(path), laws)
  return str(path)


def test_the_surface_allocation_is_the_closed_form_and_the_numeric_minimum(tmp_path, capsys):
  surface = write_surface(tmp_path / "surface.json")
  compute = 3e19
  got = plan_json(capsys, "--flops", str(compute), "--model", "crossbert", "--surface", surface)
  n_opt, d_opt = got["allocation"]["n_opt"], got["allocation"]["d_opt"]
  # Closed form: G (C/k)^(beta/(alpha+beta)), G = (alpha A / (beta B))^(1/(alpha+beta)).
  g = (ALPHA * A / (BETA * B)) ** (1 / (ALPHA + BETA))
  assert n_opt == pytest.approx(g * (compute / K) ** (BETA / (ALPHA + BETA)), rel=1e-9)
  assert d_opt == pytest.approx(compute / (K * n_opt), rel=1e-9)
  assert got["allocation"]["k"] == K

  # Numerically, L(N, C/(kN)) at fixed C is lowest at N_opt: on a dense grid ...
  def at_budget(n):
    n = np.asarray(n, float)
    return E + A / n**ALPHA + B / (compute / (K * n)) ** BETA

  grid = np.logspace(5, 13, 400001)
  assert grid[np.argmin(at_budget(grid))] == pytest.approx(n_opt, rel=1e-4)
  # ... and by a bounded scalar minimiser in log N.
  res = optimize.minimize_scalar(
    lambda log_n: float(at_budget(math.exp(log_n))),
    bounds=(math.log(1e5), math.log(1e13)),
    method="bounded",
    options={"xatol": 1e-10},
  )
  assert math.exp(res.x) == pytest.approx(n_opt, rel=1e-4)
  # The rung is the ladder's nearest in log N, and its tokens spend C at its FLOPs per token.
  rungs = {r["size"]: r for r in sizes.table(32768, 512)}
  paper = ("d384L6", "d512L8", "d768L12", "d1024L16", "d1280L20", "d1536L24", "d2048L24")
  paper += ("d2048L32", "d2304L32")  # SPEC §5's ladder: CrossBERT trains all nine
  want = min(paper, key=lambda s: abs(math.log(rungs[s]["N_crossbert"] / n_opt)))
  r = got["rung"]
  assert r["size"] == want
  assert r["n_params"] == rungs[want]["N_crossbert"]
  assert r["flops_per_token"] == pytest.approx(rungs[want]["flops_per_token_crossbert"])
  assert r["tokens"] == pytest.approx(compute / rungs[want]["flops_per_token_crossbert"])


def test_the_rule_allocation_spends_the_budget_at_20_tokens_per_parameter(capsys):
  compute = 2e15
  got = plan_json(capsys, "--flops", str(compute), "--model", "bert", "--ladder", "all")
  a = got["allocation"]
  assert a["d_opt"] == pytest.approx(20 * a["n_opt"])
  assert a["k"] * a["n_opt"] * a["d_opt"] == pytest.approx(compute)
  table = {r["size"]: r for r in sizes.table(32768, 512)}
  ks = {s: r["flops_per_token_bert"] / r["N_bert"] for s, r in table.items()}
  ns = sorted(table, key=lambda s: table[s]["N_bert"])
  lo = [s for s in ns if table[s]["N_bert"] <= a["n_opt"]][-1]
  hi = [s for s in ns if table[s]["N_bert"] > a["n_opt"]][0]
  assert min(ks[lo], ks[hi]) <= a["k"] <= max(ks[lo], ks[hi])  # k interpolated between rungs
  want = min(ns, key=lambda s: abs(math.log(table[s]["N_bert"] / a["n_opt"])))
  assert got["rung"]["size"] == want and got["rung"]["n_params"] == table[want]["N_bert"]
  assert got["loss"] is None and got["chips"] is None and got["wall_time"] is None


def test_lr_rows_steps_and_wall_time_from_known_laws_and_chips(tmp_path, capsys):
  a, alpha, b, beta = 0.05, -0.08, 0.5, 0.31
  laws = write_laws(tmp_path / "laws.json", a, alpha, b, beta)
  compute, seq_len, mfu = 1e20, 256, 0.35
  for chips, devices, peak in (("v5p-64", 32, V5P_PEAK), ("h100x16", 16, H100_PEAK)):
    got = plan_json(
      capsys,
      *("--flops", str(compute), "--model", "crossbert", "--laws", laws, "--chips", chips),
      *("--seq_len", str(seq_len), "--mfu", str(mfu)),
    )
    lw = got["laws"]
    assert lw["source"] == "synthetic test laws"
    assert lw["lr"] == pytest.approx(a * compute**alpha)
    rows = round(b * compute**beta / seq_len / devices) * devices
    assert rows >= devices and lw["rows"] == rows and rows % devices == 0
    tokens = got["rung"]["tokens"]
    assert got["steps"] == math.ceil(tokens / (rows * seq_len))
    assert got["tokens_trained"] == got["steps"] * rows * seq_len
    assert got["chips"]["devices"] == devices
    assert got["wall_time"]["seconds"] == pytest.approx(compute / (devices * peak * mfu))
    mem = got["memory"]
    assert mem["mesh"] == {"data": 1, "fsdp": devices, "tensor": 1}
    assert mem["verdict"] in ("fits", "needs more chips")
  # Without --laws: the published defaults, named as such.
  got = plan_json(capsys, "--flops", str(compute), "--model", "bert")
  assert got["laws"]["source"] == laws_lib.DEFAULT.source
  assert got["laws"]["lr"] == pytest.approx(0.3118 * compute**-0.125)
  assert not any("overridden" in n for n in got["notes"])
  # Laws fitted with a check overridden: the plan's notes name the check and the reason.
  laws = write_laws(tmp_path / "o.json", overridden=("implausible",), reason="interpolation only")
  got = plan_json(capsys, "--flops", str(compute), "--model", "bert", "--laws", laws)
  want = "the laws were fitted with checks overridden: implausible (reason: interpolation only)"
  assert want in got["notes"]
  # Laws whose provenance lists their grid runs: how far the plan's C lies outside them.
  runs = [{"compute": c, "n_params": 1e5} for c in (1e12, 1e13, 2e13)]
  laws = write_laws(tmp_path / "r.json", runs=runs)
  got = plan_json(capsys, "--flops", str(compute), "--model", "bert", "--laws", laws)
  assert got["laws"]["fitted_range"] == [1e12, 2e13]
  assert got["laws"]["extrapolation"] == pytest.approx(compute / 2e13)
  want = (
    "the laws were fitted on C 1e+12-2e+13; C = 1e+20 is 5e+06x above the largest (6.7 decades)"
  )
  assert any(n.startswith(want) for n in got["notes"]), got["notes"]
  got = plan_json(capsys, "--flops", "5e12", "--model", "bert", "--laws", laws)
  assert got["laws"]["extrapolation"] == 1.0 and not any("extrapolation" in n for n in got["notes"])
  got = plan_json(capsys, "--flops", "1e11", "--model", "bert", "--laws", laws)
  assert got["laws"]["extrapolation"] == pytest.approx(10.0)
  assert any("10x below the smallest (1.0 decades)" in n for n in got["notes"])


def test_the_loss_interval_is_the_percentiles_of_the_draws(tmp_path, capsys):
  draws = known_draws()
  surface = write_surface(tmp_path / "surface.json", draws=draws, level=0.8)
  got = plan_json(capsys, "--flops", "1e19", "--model", "crossbert", "--surface", surface)
  n, d = got["rung"]["n_params"], got["tokens_trained"]
  losses = [
    math.exp(e) + math.exp(la) / n**al + math.exp(lb) / d**be for la, lb, e, al, be in draws
  ]
  loss = got["loss"]
  assert loss["point"] == pytest.approx(E + A / n**ALPHA + B / d**BETA)
  assert loss["interval"] == pytest.approx(list(np.percentile(losses, [10, 90])))
  assert loss["level"] == 0.8 and loss["draws"] == len(draws)
  assert loss["interval"][0] <= loss["point"] <= loss["interval"][1]


def test_chips_are_counted_as_the_launcher_counts_them():
  from launch import backends  # pylint: disable=import-outside-toplevel

  # One table (cbert_jax.scaling.chips) for the launcher and the planner; its chips are the
  # memory model's.
  assert backends.TPU_CORES_PER_CHIP is chips_lib.TPU_CORES_PER_CHIP
  assert set(chips_lib.GPU_CHIPS) | set(chips_lib.TPU_CORES_PER_CHIP) == set(memory_lib.CHIPS)
  for name, key, devices in (("v5p-64", "v5p", 32), ("v4-8", "v4", 4), ("v5e-16", "v5e", 16)):
    got = planner.parse_chips(name)
    assert (got.chip, got.devices) == (key, devices)
    # The launcher's name for that slice reads back the same.
    launcher_name = backends.tpu_type(key, devices)
    assert planner.parse_chips(launcher_name).devices == devices
  assert planner.parse_chips("h200x8") == chips_lib.Chips("h200x8", "h200", 8)


@pytest.mark.parametrize(
  "argv,names",
  [
    (["--flops", "-1", "--model", "bert"], "--flops"),
    (["--flops", "nan", "--model", "bert"], "--flops"),
    (["--flops", "1e20", "--model", "nope"], "--model"),
    (["--flops", "1e20", "--model", "bert", "--chips", "v5p-63"], "--chips"),
    (["--flops", "1e20", "--model", "bert", "--chips", "foo-8"], "--chips"),
    (["--flops", "1e20", "--model", "bert", "--chips", "h100-16"], "--chips"),
    (["--flops", "1e20", "--model", "bert", "--mfu", "0"], "--mfu"),
    (["--flops", "1e20", "--model", "bert", "--laws", "{tmp}/missing.json"], "missing.json"),
    (["--flops", "1e20", "--model", "bert", "--laws", "{tmp}/garbage.json"], "garbage.json"),
    (["--flops", "1e20", "--model", "bert", "--surface", "{tmp}/missing.json"], "missing.json"),
    (["--flops", "1e20", "--model", "bert", "--surface", "{tmp}/bad.json"], "bad.json"),
  ],
)
def test_bad_input_is_one_line_before_any_config_is_built(
  argv, names, tmp_path, capsys, monkeypatch
):
  (tmp_path / "garbage.json").write_text("{not json")
  write_surface(tmp_path / "bad.json", problems=["E = 5 is not below the smallest loss 4"])
  monkeypatch.setattr(planner, "build_ladder", lambda *a: pytest.fail("built the ladder"))
  assert run([a.format(tmp=tmp_path) for a in argv]) == 2
  err = capsys.readouterr().err.strip()
  assert len(err.splitlines()) == 1, err
  assert err.startswith("planner error: ") and names in err
  if "bad.json" in names:
    assert "not below the smallest loss" in err and "--allow_unusable" in err
  if names == "--chips":
    assert "<tpu>-<N>" in err and "<gpu>x<N>" in err


def test_a_surface_says_how_far_the_optimum_lies_outside_what_it_was_fitted_on(tmp_path, capsys):
  """The surface file records the N and D/N of its points (as `python -m cbert_jax.report` writes
  them); the plan notes N_opt's and D_opt/N_opt's distance outside them, in decades."""
  compute = 1e21
  n_opt, d_opt = TRUE.optimal(compute, K)
  n_range, dn_range = [n_opt / 1e4, n_opt / 1e3], [d_opt / n_opt / 3, d_opt / n_opt * 2]
  surface = write_surface(tmp_path / "s.json", n_range=n_range, d_per_n=dn_range)
  notes = plan_json(capsys, "--flops", "1e21", "--model", "crossbert", "--surface", surface)[
    "notes"
  ]
  want = (
    f"the surface was fitted on N {n_range[0]:.3g}-{n_range[1]:.3g}; N_opt = {n_opt:.3g} is "
    "1e+03x above the largest (3.0 decades): an extrapolation"
  )
  assert want in notes
  assert not any("fitted on D/N" in n for n in notes)  # inside its D/N range: no note
  dn_range = [d_opt / n_opt * 10, d_opt / n_opt * 100]
  surface = write_surface(tmp_path / "s.json", n_range=n_range, d_per_n=dn_range)
  notes = plan_json(capsys, "--flops", "1e21", "--model", "crossbert", "--surface", surface)[
    "notes"
  ]
  assert any(
    n.endswith(
      "D/N_opt = %.3g is 10x below the smallest (1.0 decades): an extrapolation" % (d_opt / n_opt)
    )
    for n in notes
  ), notes
  surface = write_surface(tmp_path / "s.json")  # no ranges recorded: no such note
  notes = plan_json(capsys, "--flops", "1e21", "--model", "crossbert", "--surface", surface)[
    "notes"
  ]
  assert not any("the surface was fitted on" in n for n in notes)


def test_an_unusable_surface_plans_with_allow_unusable(tmp_path, capsys):
  surface = write_surface(tmp_path / "bad.json", problems=["alpha = 2.5 is outside"])
  got = plan_json(
    capsys, "--flops", "1e19", "--model", "bert", "--surface", surface, "--allow_unusable"
  )
  assert got["loss"]["problems"] == ["alpha = 2.5 is outside"]
  assert got["loss"]["interval"] is None  # no draws: no interval, and a note says so
  assert any("NOT usable" in n for n in got["notes"])


def test_json_has_the_numbers_of_the_table(tmp_path, capsys):
  surface = write_surface(tmp_path / "surface.json", draws=known_draws())
  argv = ["--flops", "1e21", "--model", "crossbert", "--chips", "v5p-64", "--surface", surface]
  got = plan_json(capsys, *argv)
  assert run(argv) == 0
  text = capsys.readouterr().out
  g = lambda x: f"{x:.4g}"
  r, lw, loss = got["rung"], got["laws"], got["loss"]
  for value in (
    g(got["allocation"]["n_opt"]),
    g(got["allocation"]["d_opt"]),
    r["size"],
    str(r["n_params"]),
    g(r["tokens"]),
    g(lw["lr"]),
    f"{lw['rows']} rows",
    f"| steps | {got['steps']} |",
    str(got["tokens_trained"]),
    f"{g(loss['point'])} [{g(loss['interval'][0])}, {g(loss['interval'][1])}]",
    f"({g(got['wall_time']['hours'])} h)",
    "at a stated MFU of 40%",
    lw["source"],
  ):
    assert value in text, (value, text)


def test_the_planner_runs_without_jax():
  """Configs, counts, FLOPs and memory are arithmetic: a launcher host without JAX can plan."""
  from tests.cli_helpers import run_without_jax  # pylint: disable=import-outside-toplevel

  r = run_without_jax(
    "from cbert_jax.sweep import planner\n"
    "assert planner.main(['--flops', '1e20', '--model', 'bert', '--chips', 'h100x8']) == 0\n"
  )
  assert r.returncode == 0, r.stderr
  assert "| wall time |" in r.stdout and r.stdout.splitlines()[-1] == "heavy: []"


def test_a_tpu_plan_shows_its_rungs_compile_and_chip_hours_from_both(tmp_path, capsys):
  """The planned rung's TPU compile (a row written here for the plan's own batch, devices and
  setting) beside the plan: its bytes and step estimate, and the plan's chip-hours from the stated
  MFU and from the compiler's optimal_seconds x steps x chips; a compile of another batch is
  shown as stale and gives no compiler's chip-hours."""
  from cbert_jax.scaling import compiled as compiled_lib

  argv = ["--flops", "3e19", "--model", "bert", "--chips", "v5p-16", f"--aot={tmp_path}"]
  got = plan_json(capsys, *argv)
  assert got["compiled"]["row"] is None and got["compiled"]["line"] == "no TPU compile"
  assert got["compiled"]["chip_hours"] == pytest.approx(3e19 / (V5P_PEAK * 0.4) / 3600, rel=1e-3)
  assert got["compiled"]["chip_hours_compiler"] is None
  size, rows, setting = got["rung"]["size"], got["laws"]["rows"], got["memory"]["setting"]
  key = {
    "model_name": "bert",
    "size": size,
    "batch_size": rows,
    "seq_len": 512,
    "vocab_size": 32768,
    "devices": 8,
    "chip": "v5p",
    **setting,
  }
  row = {
    "member": f"bert_{size}",
    "chip": "v5p",
    "topology": "v5p:2x2x2",
    "key": key,
    "memory": {"total": 40 * 2**30},
    "cost": {"optimal_seconds": 0.25},
    "analytic": {"model_flops": 1e14},
    "error": None,
  }
  compiled_lib.write_row(str(tmp_path / "v5p"), row)
  got = plan_json(capsys, *argv)
  assert got["compiled"]["stale"] == []
  assert got["compiled"]["line"].startswith("TPU compile v5p:2x2x2: 40.00 GiB per chip (fits)")
  assert got["compiled"]["chip_hours_compiler"] == pytest.approx(0.25 * got["steps"] * 8 / 3600)
  compiled_lib.write_row(str(tmp_path / "v5p"), row | {"key": key | {"batch_size": rows + 8}})
  got = plan_json(capsys, *argv)
  assert got["compiled"]["stale"] == [f"batch_size: {rows + 8} != {rows}"]
  assert got["compiled"]["chip_hours_compiler"] is None
  assert run([*argv]) == 0 and "| chip-hours |" in capsys.readouterr().out
