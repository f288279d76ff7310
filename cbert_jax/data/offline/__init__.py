"""The offline pretraining corpus: archive readers, dedupe and leakage guard, build, TFDS storage."""
