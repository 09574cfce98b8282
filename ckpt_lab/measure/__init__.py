"""Measure: what memory a step uses, and how long it takes.

The bottom layer; it imports nothing else of ckpt_lab. `memory` counts tensor bytes exactly
(`track_memory`), `allocator` reads what the allocator itself saw, `timing` times steps and
`snapshot` writes memory-visualizer timelines. docs/architecture.md draws every layer.
"""
