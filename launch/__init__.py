"""Fan-out of training runs: `python -m launch.sweep` runs an experiment's members on this machine
or launches them on SLURM, Cloud TPU VMs or xpk; `launch.compile_check` compiles them without the
hardware."""
