"""The offline probe task kit: types (spec), archive readers, registry and splits (kit), TFDS."""
