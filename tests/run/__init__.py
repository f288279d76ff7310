"""Tests of cbert_jax/run/."""
