"""Lessons 03 and 13: the KV-capacity explorer. Model, context, weight and KV dtype and a device's
memory -> the largest batch that fits and the roofline floor of a decode step at that batch
(modelled, course.experiments.capacity). With `memory_gb`, a memory slider replaces the device's
own memory (lesson 13: what fewer bytes per weight and per KV value buy in the same memory)."""

from __future__ import annotations

from nanoserve.course.experiments.capacity import KV_DTYPES, WEIGHT_BYTES, datasheet_capacity
from nanoserve.course.widgets.common import show_figure

MODELS = ("llama-3.2-1b", "llama-3-8b", "llama-2-7b", "llama-3-70b", "qwen2.5-0.5b")
CONTEXTS = (512, 1024, 2048, 4096, 8192, 16384, 32768)


def kv_capacity_explorer(model: str = "llama-3-8b", context_len: int = 4096, device: str = "H100-SXM",
                         weight_dtype: str = "bfloat16", kv_dtype: str = "bfloat16",
                         memory_gb: float | None = None):
    """Dropdowns and a context slider over datasheet_capacity; redraws plot_capacity. memory_gb
    adds a memory slider (GB for weights and cache) starting there."""
    import ipywidgets as W

    from nanoserve.course.figures_capacity import plot_capacity
    from nanoserve.sim.devices import DEVICES
    pick = {"model": W.Dropdown(options=MODELS, value=model, description="model"),
            "context_len": W.SelectionSlider(options=CONTEXTS, value=context_len, description="context"),
            "device": W.Dropdown(options=sorted(DEVICES), value=device, description="device"),
            "weight_dtype": W.Dropdown(options=list(WEIGHT_BYTES), value=weight_dtype,
                                       description="weights"),
            "kv_dtype": W.Dropdown(options=list(KV_DTYPES), value=kv_dtype, description="KV cache")}
    if memory_gb is not None:
        pick["memory"] = W.FloatSlider(value=memory_gb, min=1, max=192, step=1, description="memory GB")
    out, note = W.Output(), W.HTML()

    def draw(_=None):
        chosen = {k: w.value for k, w in pick.items()}
        if "memory" in chosen:
            chosen["memory"] *= 1e9
        cap = datasheet_capacity(**chosen)
        if cap.max_batch == 0:
            note.value = "<b>The weights leave no room for one request at this context.</b>"
        else:
            note.value = (f"max batch <b>{cap.max_batch}</b>, decode floor <b>{1e3 * cap.floor_s:.1f} "
                          f"ms</b> a step, {cap.tokens_per_s:,.0f} tokens/s (modelled from the "
                          f"{DEVICES[pick['device'].value].name} datasheet)")
        show_figure(out, lambda: plot_capacity(cap))

    for w in pick.values():
        w.observe(draw, names="value")
    draw()
    return W.VBox([W.HBox([pick["model"], pick["device"]]), pick["context_len"],
                   W.HBox([pick["weight_dtype"], pick["kv_dtype"]]),
                   *([pick["memory"]] if "memory" in pick else []), note, out])
