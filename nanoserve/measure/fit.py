"""Least squares with coefficients kept >= 0: the one fitting routine behind every model the
course fits to measurements. A time cannot have a negative part, so each fit keeps its
coefficients >= 0; with the handful of unknowns these models have, the exact answer is cheap.

Used by measure.cost (step time against prefill and decode tokens), the lesson-01 prefill fit
(time against prompt length, linear and quadratic parts) and sim.calibrate (a cost model).
"""

from __future__ import annotations

import itertools

import numpy as np


def nonneg_lstsq(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """argmin ||a @ x - b||^2 subject to x >= 0, exactly: every support set is tried
    (2^n - 1 small solves for n unknowns; meant for n <= 6). Columns are rescaled before solving
    (here they span 1 to 1e12) and the answer scaled back."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    scale = np.abs(a).max(axis=0)
    scale[scale == 0] = 1.0
    a = a / scale
    best, best_res = np.zeros(a.shape[1]), float(b @ b)
    for k in range(1, a.shape[1] + 1):
        for cols in itertools.combinations(range(a.shape[1]), k):
            x, *_ = np.linalg.lstsq(a[:, cols], b, rcond=None)
            if (x >= 0).all():
                res = float(((a[:, cols] @ x - b) ** 2).sum())
                if res < best_res:
                    best, best_res = np.zeros(a.shape[1]), res
                    best[list(cols)] = x
    return best / scale


def fit_relative(x: np.ndarray, t: np.ndarray, robust_iterations: int = 0) -> np.ndarray:
    """Coefficients c >= 0 with x @ c ~ t in *relative* error: each row counts alike whether it
    is a 1 ms decode step or a 1 s prefill. robust_iterations > 0 reweights the rows (weights
    1/sqrt|residual|) towards least absolute relative error, which follows the typical row
    rather than a few slow outliers."""
    x, t = np.asarray(x, float), np.asarray(t, float)
    a, w = x / t[:, None], np.ones(len(t))  # a @ c = predicted / measured
    coef = nonneg_lstsq(a, w)
    for _ in range(robust_iterations):
        w = 1 / np.sqrt(np.maximum(np.abs(a @ coef - 1), 1e-3))
        coef = nonneg_lstsq(a * w[:, None], w)
    return coef
