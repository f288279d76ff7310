"""Tests of cbert_jax/data/."""
