"""A run's life on hosts and disk: the workdir and its lock, checkpoints, metrics and progress,
provenance, full-split validation, multi-process start-up and peer watching, hardware figures,
and reading a run back (`record`: its workdir's files; `status`: a sweep member's state;
`trained`: its encoder)."""
