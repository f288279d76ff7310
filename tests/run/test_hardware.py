"""Tests for cbert_jax.run.hardware: the peak-FLOP/s table, the matmul benchmark, its per-machine
cache and MFU."""

import datetime
import json
import os

import jax
import jax.numpy as jnp
import pytest

from cbert_jax.run import hardware


@pytest.mark.parametrize(
  "device_kind, key, bf16_tflops, fp32_tflops",
  [
    ("TPU v5 lite", "TPU v5 lite", 197, 197),  # v5e, not v5p.
    ("TPU v5", "TPU v5", 459, 459),  # v5p.
    ("TPU v4", "TPU v4", 275, 275),
    ("TPU v6 lite", "TPU v6 lite", 918, 918),
    ("TPU7x", "TPU7x", 1153.5, 1153.5),  # Per TensorCore = per JAX device.
    ("NVIDIA H100 80GB HBM3", "H100", 989.4, 494.7),  # Dense, not the 1979 sparse figure.
    ("NVIDIA H100 PCIe", "H100 PCIe", 756.5, 378),
    ("NVIDIA H200", "H200", 989.4, 494.7),
    ("NVIDIA H200 NVL", "H200 NVL", 835.5, 417.5),
    ("NVIDIA GH200 480GB", "GH200", 989.4, 494.7),
    ("NVIDIA A100-SXM4-80GB", "A100", 312, 156),
    ("NVIDIA A10", "A10", 125, 62.5),
    ("NVIDIA A10G", "A10G", 70, 35),
    ("NVIDIA L4", "L4", 121, 60),
    ("NVIDIA L40S", "L40S", 362, 183),
    ("NVIDIA B200", "B200", 2250, 1100),
    ("NVIDIA GB200", "GB200", 2500, 1250),
  ],
)
def test_lookup_peak_maps_device_kinds(device_kind, key, bf16_tflops, fp32_tflops):
  found = hardware.lookup_peak(device_kind)
  assert found is not None
  found_key, spec = found
  assert found_key == key
  assert spec.bf16 == pytest.approx(bf16_tflops * 1e12)
  assert spec.fp32 == pytest.approx(fp32_tflops * 1e12)
  assert spec.source


@pytest.mark.parametrize("device_kind", ["cpu", "NVIDIA RTX 9999", "NVIDIA A1000", "TPU v9"])
def test_lookup_peak_unknown_devices(device_kind):
  assert hardware.lookup_peak(device_kind) is None


def test_table_is_dense_bf16_at_least_fp32():
  for spec in hardware.PEAK_FLOPS.values():
    # bf16 tensor-core/MXU throughput is never below the float32 path on these devices.
    assert spec.bf16 >= spec.fp32 > 0
    # Sanity bound: no single device reaches 3 PFLOP/s dense bf16 (sparse figures would).
    assert spec.bf16 < 3e15


def test_measure_matmul_peak_on_cpu():
  flops = hardware.measure_matmul_peak(jnp.float32, n=512, seconds=0.2)
  # Any CPU does more than 0.1 GFLOP/s and no CPU reaches 100 TFLOP/s in float32.
  assert 1e8 < flops < 1e14
  with pytest.raises(ValueError):
    hardware.measure_matmul_peak(n=0)


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="CPU-only behaviour")
def test_device_peak_on_cpu_is_measured_once():
  peak, source = hardware.device_peak(jnp.float32)
  assert peak > 0
  assert source.startswith("measured:") and "float32" in source and "cpu" in source
  # Cached: the second call returns the very same measurement.
  assert hardware.device_peak(jnp.float32) == (peak, source)


def test_device_peak_rejects_unsupported_dtype():
  with pytest.raises(ValueError, match="int8"):
    hardware.device_peak(jnp.int8)


def test_mfu():
  assert hardware.mfu(494.7e12, 989.4e12) == pytest.approx(0.5)
  with pytest.raises(ValueError):
    hardware.mfu(1.0, 0.0)


# --- The measured peak: best of repeats, cached per machine ------------------------------------


@pytest.fixture
def peak_cache(tmp_path, monkeypatch):
  """A fresh cache file for one test (conftest already keeps every test off the real ~/.cache)."""
  path = tmp_path / "sub" / "matmul_peak.json"
  monkeypatch.setenv(hardware.PEAK_CACHE_ENV, str(path))
  return path


class FakeMeasure:
  """Stands in for `measure_matmul_peak`: fixed figures for the full and the quick measurement."""

  def __init__(self, full: float, quick: float):
    self.full, self.quick, self.calls = full, quick, []

  def __call__(self, dtype, n, seconds, *, device, repeats, best):
    assert best, "the peak is the best repeat, not the median"
    kind = "full" if repeats == hardware.FULL_REPEATS else "quick"
    self.calls.append(kind)
    return self.full if kind == "full" else self.quick


def fake(monkeypatch, full, quick):
  """Installs a FakeMeasure and returns it."""
  measure = FakeMeasure(full, quick)
  monkeypatch.setattr(hardware, "measure_matmul_peak", measure)
  return measure


def cached_figures(path):
  """The FLOP/s figures in a cache file."""
  return [e["flops"] for e in json.loads(path.read_text())["entries"]]


def test_measure_matmul_peak_median_or_best(monkeypatch):
  monkeypatch.setattr(hardware, "_matmul_rates", lambda *a: [1.0, 5.0, 2.0, 3.0, 4.0])
  assert hardware.measure_matmul_peak(n=8) == 3.0
  assert hardware.measure_matmul_peak(n=8, best=True) == 5.0


def test_matmul_rates_are_one_per_repeat():
  rates = hardware._matmul_rates(jnp.float32, 32, 0.05, 4, None)
  assert len(rates) == 4 and all(r > 0 for r in rates)
  with pytest.raises(ValueError, match="repeats"):
    hardware.measure_matmul_peak(n=32, repeats=0)


def test_cache_miss_measures_in_full_and_writes_the_file(peak_cache, monkeypatch):
  measure = fake(monkeypatch, full=3e11, quick=1e11)
  peak, source = hardware.cached_matmul_peak(jnp.float32, n=64)
  assert (peak, measure.calls) == (3e11, ["full"])
  assert source.startswith(f"measured: best of {hardware.FULL_REPEATS} x 64^2 float32 matmuls")
  assert "now; saved to" in source and str(peak_cache) in source
  [entry] = json.loads(peak_cache.read_text())["entries"]
  assert entry["flops"] == 3e11 and entry["repeats"] == hardware.FULL_REPEATS
  assert entry["key"]["dtype"] == "float32" and entry["key"]["n"] == 64
  assert entry["key"]["jax"] == jax.__version__ and entry["key"]["cpu_count"] == os.cpu_count()
  assert entry["key"]["local_devices"] == jax.local_device_count()
  assert not list(peak_cache.parent.glob(".matmul_peak.*"))  # no temp file left behind


def test_cache_hit_reuses_the_figure_with_only_a_quick_check(peak_cache, monkeypatch):
  fake(monkeypatch, full=3e11, quick=1e11)
  hardware.cached_matmul_peak(jnp.float32, n=64)
  measure = fake(monkeypatch, full=9e11, quick=2.9e11)  # a full measurement would change it
  peak, source = hardware.cached_matmul_peak(jnp.float32, n=64)
  assert (peak, measure.calls) == (3e11, ["quick"])
  today = datetime.datetime.now(datetime.UTC).date().isoformat()
  assert f"cached {today} in {peak_cache}" in source and "start-up check 0.97x" in source
  assert cached_figures(peak_cache) == [3e11]


@pytest.mark.parametrize(
  "attr, value",
  [("os.cpu_count", lambda: 12345), ("jax.__version__", "0.0.0"), ("_cpu_model", lambda: "Z80")],
)
def test_another_machine_or_jax_does_not_reuse_the_figure(peak_cache, monkeypatch, attr, value):
  fake(monkeypatch, full=3e11, quick=1e11)
  hardware.cached_matmul_peak(jnp.float32, n=64)
  target, name = attr.rsplit(".", 1) if "." in attr else ("", attr)
  monkeypatch.setattr({"": hardware, "os": os, "jax": jax}[target], name, value)
  measure = fake(monkeypatch, full=2e11, quick=1e11)
  assert hardware.cached_matmul_peak(jnp.float32, n=64)[0] == 2e11
  assert measure.calls == ["full"]
  assert sorted(cached_figures(peak_cache)) == [2e11, 3e11]  # both machines kept


def test_another_dtype_or_size_does_not_reuse_the_figure(peak_cache, monkeypatch):
  fake(monkeypatch, full=3e11, quick=1e11)
  hardware.cached_matmul_peak(jnp.float32, n=64)
  measure = fake(monkeypatch, full=2e11, quick=1e11)
  hardware.cached_matmul_peak(jnp.bfloat16, n=64)
  hardware.cached_matmul_peak(jnp.float32, n=32)
  assert measure.calls == ["full", "full"] and len(cached_figures(peak_cache)) == 3


def test_a_faster_check_raises_the_cache_a_slower_one_does_not(peak_cache, monkeypatch):
  fake(monkeypatch, full=3e11, quick=1e11)
  hardware.cached_matmul_peak(jnp.float32, n=64)
  fake(monkeypatch, full=0, quick=3.3e11)
  peak, source = hardware.cached_matmul_peak(jnp.float32, n=64)
  assert peak == 3.3e11 and "now (1.10x the cached)" in source
  assert cached_figures(peak_cache) == [3.3e11]
  fake(monkeypatch, full=0, quick=3.2e11)
  assert hardware.cached_matmul_peak(jnp.float32, n=64)[0] == 3.3e11
  assert cached_figures(peak_cache) == [3.3e11]


def test_a_loaded_machine_is_warned_about_and_the_cached_peak_used(peak_cache, monkeypatch, caplog):
  fake(monkeypatch, full=4e11, quick=1e11)
  hardware.cached_matmul_peak(jnp.float32, n=64)
  assert "loaded" not in caplog.text
  fake(monkeypatch, full=0, quick=0.92e11)  # 0.23x, as in issue 19
  peak, source = hardware.cached_matmul_peak(jnp.float32, n=64)
  assert peak == 4e11 and "start-up check 0.23x (machine loaded now)" in source
  assert "machine looks loaded now" in caplog.text
  assert cached_figures(peak_cache) == [4e11]
  caplog.clear()
  fake(monkeypatch, full=0, quick=hardware.LOADED_RATIO * 4e11 * 1.01)  # just above the ratio
  assert hardware.cached_matmul_peak(jnp.float32, n=64)[0] == 4e11
  assert "loaded" not in caplog.text


@pytest.mark.parametrize(
  "content",
  [
    b"{not json",
    b"\xff\xfe",
    b"[]",
    b'{"version": 99, "entries": []}',
    b'{"version": 1, "entries": [{"key": {}, "flops": "fast"}]}',
    b'{"version": 1, "entries": [{"key": {}, "flops": NaN, "repeats": 5, "measured_at": ""}]}',
  ],
)
def test_a_corrupt_cache_is_ignored_with_a_warning(peak_cache, monkeypatch, caplog, content):
  peak_cache.parent.mkdir()
  peak_cache.write_bytes(content)
  measure = fake(monkeypatch, full=3e11, quick=1e11)
  assert hardware.cached_matmul_peak(jnp.float32, n=64)[0] == 3e11
  assert measure.calls == ["full"] and "Ignoring the matmul peak cache" in caplog.text
  assert cached_figures(peak_cache) == [3e11]  # rewritten as a valid cache


def test_an_unwritable_cache_does_not_crash(tmp_path, monkeypatch, caplog):
  (tmp_path / "a_file").write_text("")
  monkeypatch.setenv(hardware.PEAK_CACHE_ENV, str(tmp_path / "a_file" / "matmul_peak.json"))
  fake(monkeypatch, full=3e11, quick=1e11)
  peak, source = hardware.cached_matmul_peak(jnp.float32, n=64)
  assert peak == 3e11 and "not cached (" in source
  assert "Could not write the matmul peak cache" in caplog.text


def test_an_empty_env_var_turns_the_cache_off(monkeypatch):
  monkeypatch.setenv(hardware.PEAK_CACHE_ENV, "")
  assert hardware.peak_cache_path() is None
  measure = fake(monkeypatch, full=3e11, quick=1e11)
  hardware.cached_matmul_peak(jnp.float32, n=64)
  _, source = hardware.cached_matmul_peak(jnp.float32, n=64)
  assert measure.calls == ["full", "full"] and source.endswith("now; not cached")


def test_default_cache_path(monkeypatch):
  monkeypatch.delenv(hardware.PEAK_CACHE_ENV)
  monkeypatch.setenv("HOME", "/home/someone")
  assert hardware.peak_cache_path() == "/home/someone/.cache/cbert_jax/matmul_peak.json"
  assert hardware._shown(hardware.peak_cache_path()) == "~/.cache/cbert_jax/matmul_peak.json"


def test_real_tiny_measurement_is_cached_and_never_lowered(peak_cache):
  first, _ = hardware.cached_matmul_peak(jnp.float32, n=32)
  second, _ = hardware.cached_matmul_peak(jnp.float32, n=32)
  assert 0 < first <= second  # the best figure seen so far
  assert cached_figures(peak_cache) == [second]


def test_mfu_flag():
  measured = "measured: best of 5 x 2048^2 float32 matmuls on cpu (cpu), now; saved to x"
  assert hardware.mfu_flag(0.55, measured) == ""
  assert hardware.mfu_flag(0.917, measured).startswith("implausible: MFU 91.7%")
  assert "probably measured under load" in hardware.mfu_flag(0.917, measured)
  assert hardware.mfu_flag(0.917, measured + " / 8 fake devices")
  # Spec-sheet and configured peaks are not a benchmark that load can spoil.
  assert hardware.mfu_flag(0.95, "table: NVIDIA H100 bf16 dense (datasheet)") == ""
  assert hardware.mfu_flag(0.95, "config.peak_flops") == ""


def test_warn_implausible_mfu_logs_once(monkeypatch, caplog):
  monkeypatch.setattr(hardware, "_flagged_sources", set())
  source = "measured: best of 5 x 2048^2 float32 matmuls on cpu (cpu), cached 2026-12-04 in x"
  assert not hardware.warn_implausible_mfu(0.5, source)
  assert hardware.warn_implausible_mfu(0.95, source)
  assert hardware.warn_implausible_mfu(0.97, source)
  assert caplog.text.count("implausible: MFU") == 1
