"""Tests of cbert_jax/sweep/."""
