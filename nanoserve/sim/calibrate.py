"""Calibration: fit the simulator's cost model to a real run's step trace on this device.

The fitted model is sum-form (bytes, FLOPs and attention FLOPs each cost time, plus a per-step
and a per-sequence overhead) and keeps the fit's residuals, so a calibrated simulation carries
this machine's step-to-step noise too. Everything a calibrated simulation prints is modelled.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from nanoserve.config import ModelConfig
from nanoserve.engine import StepRecord
from nanoserve.measure.fit import fit_relative
from nanoserve.measure.roofline import dtype_bytes, step_cost
from nanoserve.sim.simulator import CostModel, step_kind


@dataclass
class Calibration:
    cost_model: CostModel
    median_abs_rel_error: float  # of per-step times, fitted vs measured
    mape: float  # mean absolute percentage error, in percent
    host_gap: float  # median seconds between one step's end and the next one's start
    measured: np.ndarray = field(repr=False)  # seconds per step (duration + host_gap)
    predicted: np.ndarray = field(repr=False)

    def describe(self) -> str:
        return (f"calibrated on {len(self.measured)} steps: {self.cost_model.describe()}\n"
                f"fit error: median |rel| {100 * self.median_abs_rel_error:.1f}%, "
                f"MAPE {self.mape:.1f}%")


def calibrate(trace: Sequence[StepRecord], model_config: ModelConfig, dtype: str = "float32",
              label: str = "calibrated") -> Calibration:
    """Fit a sum-form CostModel to a real run's trace. -> Calibration with the fit error.

    Each step's time is its duration plus the median gap between steps (host work the engine
    does outside a step: updating requests, building outputs; the simulator charges it per
    step). The fit minimises the absolute *relative* error (least squares reweighted towards
    least absolute deviation, coefficients kept >= 0): short decode steps count as much as
    long prefills, and the fit follows the typical step rather than the noise, which on a
    shared machine only ever slows steps down. The residuals (measured minus fitted seconds,
    kept apart by step_kind (steps with prefill, decode steps of a few sequences, the other
    decode steps), whose noise and fit error differ, each with
    its fitted time) stay with the model: the simulator adds to each step the residual of a
    measured step of about its size, so its tails carry this machine's noise
    (replace(cost_model, residuals={}) for a noiseless model).
    """
    if len(trace) < 5:
        raise ValueError(f"calibrating needs at least 5 steps of trace, got {len(trace)}")
    db = dtype_bytes(dtype)
    gaps = [b.start - a.end for a, b in zip(trace, trace[1:])]
    host_gap = float(np.median(gaps)) if gaps else 0.0
    rows = []
    for rec in trace:
        batch = rec.batch()
        c = step_cost(model_config, batch, db)
        rows.append([1.0, len(batch), c.total_bytes, c.flops["linear"] + c.flops["lm_head"],
                     c.flops["attention"]])
    x = np.asarray(rows)
    t = np.asarray([s.duration for s in trace]) + host_gap
    coef = fit_relative(x, t, robust_iterations=20)
    pred = x @ coef
    res = t - pred
    kinds = np.asarray([step_kind(s.num_prefill_tokens, len(s.batch())) for s in trace])

    def by_fitted_time(m):  # (fitted, residual) seconds of the steps m selects
        # by fitted time only: tied steps keep run order, not the order of their residuals
        return tuple(sorted(zip(pred[m].tolist(), res[m].tolist()), key=lambda s: s[0]))

    # a kind the run never had borrows the others' residuals
    residuals = {k: by_fitted_time(m if m.any() else ~m)
                 for k, m in ((k, kinds == k) for k in ("prefill", "few", "decode"))}
    cm = CostModel(*coef, combine="sum", dtype=dtype, label=label, residuals=residuals,
                   min_ratio=float((t / pred).min()))
    rel = np.abs(res) / t
    return Calibration(cm, float(np.median(rel)), float(100 * rel.mean()), host_gap, t, pred)
