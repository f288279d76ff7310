"""Evaluation of frozen encoders (SPEC §6).

`features`: text -> model rows -> mean-pooled features (one compiled step, fixed batches).
`probes`: ridge and kNN probes on those features, with hyper-parameters chosen on a held-out
part of train only, and the layer-wise table.
"""
