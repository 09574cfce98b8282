"""Training: something to checkpoint, train and measure end to end.

The top layer of the library. `models`, `data` and `losses` build a step, `loop` trains it,
`fallback` climbs the out-of-memory ladder, `throughput` compares policies at equal global
batch and `distributed` launches local multi-process jobs. (Named `training`, since
``ckpt_lab.train`` is the function that trains.) docs/architecture.md draws every layer.
"""
