r"""Smoke run: a tiny CrossBERT (CMS on) on the offline corpus, minutes on a 2-core CPU.

  python -m cbert_jax.main --config experiments/smoke.py --workdir runs/smoke
  python -m cbert_jax.main --config experiments/smoke.py:model=bert --workdir runs/smoke_bert
  python -m cbert_jax.main --config experiments/smoke.py:model=electra --workdir runs/smoke_electra

Arguments: model (bert | crossbert | electra), size (a rung of models/sizes.py), steps, cms.

Budget: 32 rows x 128 tokens x 300 steps = 1.2M tokens (~0.6 epoch of the corpus's ~2M train
tokens at vocab 8192).
"""

from cbert_jax import config_lib


def get_config(arg=None):
  a = config_lib.parse_arg(arg, model="crossbert", size="d128L4", steps=300, cms=True)
  c = config_lib.base_config()
  c.name = f"smoke_{a.model}"  # default workdir name under runs/
  c.model_name = a.model
  c.model.size = a.size
  c.total_steps = a.steps
  c.batch_size = 32
  c.log_every = 10
  c.checkpoint_every = 100
  c.eval_every = 100
  c.eval_batches = 4
  c.data.seq_len = 128
  c.data.vocab_size = 8192
  c.masking.cms = a.cms
  c.optim.lr = 3e-3
  c.optim.warmup_steps = 30
  return c
