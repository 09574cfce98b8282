"""Plan: what to checkpoint, decided from predictions and measured profiles.

Imports `measure` and `checkpoint` below it. `formulas` and `parallel_formulas` predict bytes
and FLOPs, `capacity` prices a model on a device, `profile` measures a chain layer by layer,
`planner` places checkpoints on a chain for a budget, `module_planner` and `recorded_step` do
it for the blocks of any model. docs/architecture.md draws every layer.
"""
