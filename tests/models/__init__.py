"""Tests of cbert_jax/models/."""
