"""cbert_jax: BERT and CrossBERT text encoders in JAX/Flax NNX, and how their frozen features scale."""

__version__ = "0.1.0"
