"""{model_name: model class}: the families `config.model_name` picks from (`models.NAMES`)."""

from cbert_jax.models.bert import Bert
from cbert_jax.models.crossbert import CrossBert
from cbert_jax.models.electra import Electra

FAMILIES = {"bert": Bert, "crossbert": CrossBert, "electra": Electra}
