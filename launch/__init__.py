"""Fan-out of training runs. `launch.local` runs members as subprocesses on this machine."""
