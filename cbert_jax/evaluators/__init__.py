"""Evaluation of frozen encoders (SPEC §6).

`features`: text -> model rows -> mean-pooled features (one compiled step, fixed batches), and the
featurizer every suite builds from an evals config. `probes`: the front of the linear and kNN
probes (`ridge`, `logreg`, `knn`, their shared selection on held-out train in `probe_base`) and
the layer-wise table. `suite`, `glue`, `mteb_encoder`: the suites; `registry`: which exist.
"""
