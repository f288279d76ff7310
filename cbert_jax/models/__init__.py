"""Model families by name; `config.model_name` picks one."""
from cbert_jax.models.bert import Bert
from cbert_jax.models.crossbert import CrossBert

FAMILIES = {"bert": Bert, "crossbert": CrossBert}
