"""Tests of cbert_jax/scaling/."""
