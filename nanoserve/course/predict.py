"""The lessons' "predict, then measure": a learner writes a guess into a cell variable before the
cell that measures it; `compare` prints the guess beside what was measured (or modelled)."""

from __future__ import annotations

import math


def compare(prediction, measured, what: str, unit: str = "") -> str:
    """'you predicted 8x, measured 5.2x: 1.5x too high'. A dict compares key by key (`what`, if
    given, before each key); None or ... (the cell left as it came) just reports the measurement."""
    if isinstance(measured, dict):
        guesses = prediction if isinstance(prediction, dict) else {}
        return "\n".join(compare(guesses.get(k), v, f"{what}, {k}" if what else k, unit)
                         for k, v in measured.items())
    got = f"{measured:.3g}{unit}" if isinstance(measured, float) else f"{measured}{unit}"
    if prediction is None or prediction is Ellipsis:
        return f"{what}: measured {got} (write your guess into the prediction cell first, next time)"
    if not isinstance(prediction, (int, float)) or isinstance(prediction, bool):
        raise ValueError(f"prediction={prediction!r} for {what!r}: write a number")
    said = f"you predicted {prediction:g}{unit}, measured {got}"
    if measured == 0 or prediction <= 0 or not math.isfinite(measured):
        return f"{what}: {said}"
    ratio = prediction / measured
    if 0.8 <= ratio <= 1.25:
        verdict = "close"
    elif ratio > 1:
        verdict = f"{ratio:.1f}x too high"
    else:
        verdict = f"{1 / ratio:.1f}x too low"
    return f"{what}: {said}: {verdict}"
