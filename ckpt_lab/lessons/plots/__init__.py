"""The course's figures: memory timelines, side-by-side bars, stacked budgets, measured vs predicted.

Every function draws measured numbers handed to it (nothing is typed in), titles its axes with
units (MiB, ms), draws measurements as points or bars and predictions as lines, and returns the
matplotlib Figure. Pass ``ax`` to draw into an existing axes (the widgets redraw in place).

One module per kind of figure, every name re-exported here (``plots.timeline(...)``):

* `style`: the palette (`PHASE_COLORS` and the colours that are no phase's), `MIB`, `GIB`.
* `timelines`: memory after each operation (per phase, tensor against allocator bytes).
* `bar_charts`: bars side by side; `stacked_bars`: stacked bars and bands.
* `layers`: what each layer or block keeps, and a plan over a chain's profile.
* `curves`: measured points on predicted lines against one quantity.
* `tradeoffs`: peak against recompute or throughput, the budget drawn.
* `grids`: the verdict grid, pipeline schedules, segment plans, the out-of-memory ladder.
* `diagrams`: a model's structure (the six matmuls of a transformer block).
"""
from .bar_charts import bars, band_bars, grouped_bars, ratio_panels, side_by_side, technique_bars
from .curves import (attention_kinds, chunk_peaks, depth_panels, loss_share,
                     measured_vs_predicted, model_parity, ratio_points, segment_curve, u_curves)
from .diagrams import ELEMENTWISE_COLOR, MATMUL_COLOR, block_matmuls, block_sizes
from .grids import (VERDICT_COLORS, VERDICTS, ladder_paths, pipeline_grid, pipeline_times,
                    segment_plans, verdict_grid, verdict_of)
from .layers import (LAYER_PARTS, block_terms, layer_bars, layer_parts, layer_profile,
                     plan_profile)
from .stacked_bars import (capacity_bars, reserved_vs_allocated, segment_units, stacked,
                           stacked_bands)
from .style import (GIB, MEASURED, MIB, NEUTRAL_COLORS, PART_COLORS, PHASE_COLORS, POLICY_COLORS,
                    PREDICTED, RUN_COLORS, SERIES_COLORS, STATE_BANDS, STATE_HATCHES)
from .timelines import (allocation_timeline, allocator_timeline, live_per_op, phase_spans,
                        scaled_timeline, timeline)
from .tradeoffs import (budget_scatter, capacity_scatter, combination_grid, plan_scatter,
                        throughput_panels, tradeoff_points)
