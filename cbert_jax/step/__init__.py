"""What gets compiled: the train state, the train/eval steps, the optimizer, the loss guard, the
device mesh and the sharding rules. Imports nothing above models/ (tests/test_layering.py)."""
