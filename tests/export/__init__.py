"""Tests of cbert_jax/export/."""
