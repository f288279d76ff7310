"""Tests of cbert_jax/evaluators/."""
