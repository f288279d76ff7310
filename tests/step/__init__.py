"""Tests of cbert_jax/step/."""
