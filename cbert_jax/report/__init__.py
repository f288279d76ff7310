"""Analysis after the runs: the batch x LR grid fit (`grid`), the scaling report of a sweep
(`sweep_report`, with `fits`, `hparam_laws`, `loss_surface`, `plots`), the controlled CMS
experiment (`cms`) and the results archive (`archive`). `python -m cbert_jax.report` writes the
scaling report."""
