"""Figures and ipywidgets dashboards for lessons 03, 05-09 and 12, one module per lesson, re-exported here.

Every dashboard is a thin shell: a pure `compute_...(..., params) -> data` (numbers only) and a
`plot_...(data, axes)` (matplotlib only); the widget wires sliders to the two, so tests call
exactly what a widget calls. Every figure names the device it was measured on, or says
"modelled: ..." when the simulator produced it, and every axis has a unit. matplotlib and
ipywidgets are imported inside functions, so importing nanoserve needs neither.

  capacity.py        03: the KV-capacity explorer (modelled)
  interference.py    05: decoders' ITL over time, the budget trade-off, the budget slider
  prefix.py          06: TTFT and prompt tokens with prefix caching off/on; eviction
  serving.py         07: a request's anatomy, percentiles, stratification, goodput, dashboard
  pricing.py         08: the step-time fit, the price box, cost at an SLO
  disaggregation.py  09: colocated vs disaggregated, the P:D / link / SLO explorer
  speculation.py     12: speedup and acceptance over k, batch and task

Deliberately left out: measuring (course.scenarios) and figures of single runs (measure.figures).
"""

from nanoserve.course.figures import plot_goodput  # lessons 03 and 07 share it
from nanoserve.course.widgets.capacity import kv_capacity_explorer
from nanoserve.course.widgets.disaggregation import (
    LINK_CHOICES,
    compute_disagg_view,
    disagg_explorer,
    plot_disagg_view,
    plot_layout_itl,
)
from nanoserve.course.widgets.interference import (
    compute_interference_view,
    interference_explorer,
    plot_budget_tradeoff,
    plot_interference_view,
    plot_itl_timeline,
)
from nanoserve.course.widgets.prefix import plot_eviction, plot_prefix_compare
from nanoserve.course.widgets.pricing import (
    compute_cost_view,
    cost_explorer,
    plot_cost_at_slo,
    plot_cost_view,
    plot_step_time_fit,
)
from nanoserve.course.widgets.serving import (
    compute_dashboard,
    measure_dashboard_point,
    plot_dashboard,
    plot_metric_distributions,
    plot_request_anatomy,
    plot_stratified,
    plot_ttft_vs_input,
    serving_dashboard,
)
from nanoserve.course.widgets.speculation import (
    compute_speculation_view,
    plot_speculation_view,
    speculation_explorer,
)

__all__ = [
    "LINK_CHOICES", "compute_cost_view", "compute_dashboard", "compute_disagg_view",
    "compute_interference_view", "compute_speculation_view", "cost_explorer", "disagg_explorer",
    "interference_explorer", "kv_capacity_explorer",
    "measure_dashboard_point", "plot_budget_tradeoff", "plot_cost_at_slo", "plot_cost_view",
    "plot_dashboard", "plot_disagg_view", "plot_eviction", "plot_goodput", "plot_interference_view",
    "plot_itl_timeline", "plot_layout_itl", "plot_metric_distributions", "plot_prefix_compare",
    "plot_request_anatomy", "plot_speculation_view", "plot_step_time_fit", "plot_stratified",
    "plot_ttft_vs_input", "serving_dashboard", "speculation_explorer",
]
