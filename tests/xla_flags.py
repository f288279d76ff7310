"""The XLA flags of the test processes and of every run a test starts (no imports: conftest reads
this before JAX is imported anywhere).

Two choices that make the CPU compiles of the tiny test models cheaper without touching what the
tests check:
* LLVM at -O0 without its expensive passes: only the CPU machine code is less optimised, which the
  tiny models do not notice. Compiles take about a fifth less time in-process and about a third
  less in a fresh CLI process.
* XLA's legacy LLVM IR emitters for fused kernels instead of its MLIR fusion emitters
  (`--xla_cpu_use_fusion_emitters=false`): each MLIR kernel pays for its own MLIR context and
  pass pipeline, which dominates the many tiny compiles of a test (every op of an eager
  `jax.grad` is one). Measured quiet, 2026-12-07: the 571 eager compiles of
  test_cms_gather_and_inplace_agree_on_loss_and_grads 15.0 -> 5.7 s, the 22 jitted compiles of
  test_sharded_step_equals_single_device 11.9 -> 8.2 s. The fusion pass then draws a few kernel
  boundaries differently: XLA's FLOP count of a d32L2 BERT train step moves by 0.01%, its bytes
  accessed by 0.7% and its temporary buffer by 320 bytes, all far inside the tolerances of the
  tests that compare against XLA's cost and memory analyses (tests/models/test_flops.py,
  tests/scaling/test_memory_plan.py).
Tests that compare numbers compare runs that were all compiled with these flags."""

FAST = (
  "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
  " --xla_cpu_use_fusion_emitters=false"
)


def flags(devices: int) -> str:
  """XLA_FLAGS of a process with `devices` fake CPU devices, compiled as above."""
  return f"--xla_force_host_platform_device_count={devices} {FAST}"
