"""Tests of cbert_jax/report/."""
