"""Tests for cbert_jax.hardware: the peak-FLOP/s table, the matmul benchmark and MFU."""

import jax
import jax.numpy as jnp
import pytest

from cbert_jax import hardware


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
