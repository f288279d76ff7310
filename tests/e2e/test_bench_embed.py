"""The embedding benchmark runs end to end at a tiny shape: every contestant timed, ratios and FLOPs
derived from the recorded medians and shapes, bad flags rejected by name."""

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from benchmarks import embed as bench_embed  # noqa: E402
from cbert_jax.models import flops as flops_lib  # noqa: E402
from cbert_jax.models.model_config import ModelConfig  # noqa: E402


def test_embed_benchmark_dry_run(tmp_path):
  info = bench_embed.main(["--dry_run", "--out", str(tmp_path)])
  on_disk = json.loads((tmp_path / "embed.json").read_text())
  assert on_disk["dry_run"] and on_disk["shapes"].keys() == {"dry"}
  res, s = on_disk["results"]["dry"], bench_embed.DRY
  assert set(res) == set(bench_embed.CONTESTANTS.values())
  for name, r in res.items():
    assert r["tokens_per_s"] > 0, name
    if name == bench_embed.E2E:
      assert r["tokens_per_s"] == pytest.approx(r["tokens"] / r["pass_s"])
      assert r["texts"] == 64 and 0 < r["tokens"] <= r["encoded_positions"] <= 64 * s.seq
      assert r["texts_per_s"] == pytest.approx(64 / r["pass_s"])
    else:
      assert r["calls_timed"] == 2 and r["batch_s_min"] <= r["batch_s"] <= r["batch_s_max"]
      assert r["tokens_per_s"] == pytest.approx(s.batch * s.seq / r["batch_s"])
      assert r["mfu"] == pytest.approx(r["model_flops_per_s"] / on_disk["peak_flops"])
  # Ratios from the medians: ours / peer in tokens/s is the peer's median call over ours.
  ours, rat = res[bench_embed.OURS], on_disk["ratios"]["dry"]
  for name, r in res.items():
    if name == bench_embed.OURS:
      continue
    if name == bench_embed.E2E:
      want = (r["tokens"] / r["pass_s"]) / (s.batch * s.seq / ours["batch_s"])
      assert rat["tokens_per_s"][f"{name} / {bench_embed.OURS}"] == pytest.approx(want)
    else:
      pair = f"{bench_embed.OURS} / {name}"
      assert rat["tokens_per_s"][pair] == pytest.approx(r["batch_s"] / ours["batch_s"])
      assert rat["flops_per_token"][pair] == pytest.approx(
        ours["flops_per_token"] / r["flops_per_token"]
      )
  # Ours: 2 FLOPs per encoder matmul weight (norm scales excluded) + QK^T and AV over T keys.
  cfg = ModelConfig(
    vocab_size=s.vocab, d_model=s.d, num_layers=s.layers, num_heads=s.heads, ffn_dim=s.ffn
  )
  enc_mm = flops_lib.param_counts("bert", cfg).encoder - (2 * s.layers + 1) * s.d
  assert ours["flops_per_token"] == 2 * enc_mm + 4 * s.layers * s.seq * s.d
  assert res["HF BertModel (sdpa)"]["flops_per_token"] == s.layers * (
    8 * s.d**2 + 4 * s.d * s.ffn + 4 * s.seq * s.d
  )
  assert res["HF BertModel (eager)"]["attn_implementation"] == "eager"
  assert info["ratios"] == on_disk["ratios"]
  md = (tmp_path / "embed.md").read_text()
  assert "| cbert_jax BERT features |" in md and "target (issue 19)" in md
  assert (tmp_path / "embed.png").stat().st_size > 0


@pytest.mark.parametrize(
  "argv, flag",
  [
    (["--shapes", "tiny,huge"], "--shapes: unknown 'huge'"),
    (["--contestants", "ours,gpt"], "--contestants: unknown 'gpt'"),
    (["--steps", "0"], "--steps: expected >= 1"),
  ],
)
def test_embed_benchmark_rejects_bad_flags(argv, flag, capsys, tmp_path):
  with pytest.raises(SystemExit) as e:
    bench_embed.main(argv + ["--out", str(tmp_path)])
  assert e.value.code == 2
  err = capsys.readouterr().err
  assert flag in err and err.count("error:") == 1
  assert not list(tmp_path.iterdir())  # rejected before any work
