"""The XLA flags of the test processes and of every run a test starts (no imports: conftest reads
this before JAX is imported anywhere).

LLVM at -O0 without its expensive passes: XLA's HLO passes, and so the compiled programs' HLO,
buffer assignment and cost analysis, are those of a default run; only the CPU machine code is
less optimised, which the tiny test models do not notice. Compiles take about a fifth less time
in-process and about a third less in a fresh CLI process. Tests that compare numbers compare runs
that were all compiled with these flags."""

FAST = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"


def flags(devices: int) -> str:
  """XLA_FLAGS of a process with `devices` fake CPU devices, compiled as above."""
  return f"--xla_force_host_platform_device_count={devices} {FAST}"
