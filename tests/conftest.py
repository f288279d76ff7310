"""Test setup: 8 fake CPU devices (set before jax is imported anywhere) and shared tiny fixtures."""
import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
