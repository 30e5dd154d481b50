"""Errors that are part of the interface: a bad request is refused with the field it got wrong.

InvalidRequest is a ValueError whose message names the field and the bad value; `param` is the
field's name as a client sent it ("temperature", "prompt", "max_tokens", ...), so the HTTP server
can fill OpenAI's error body (`{"error": {"message", "type", "param", "code"}}`) without parsing
the message. The checks below are the ones every boundary shares (SamplingParams, EngineConfig,
LLMEngine.add_request): Python and NumPy/torch integer scalars count as integers, bools and
floats do not.
"""

from __future__ import annotations

import math
import numbers
import operator


class InvalidRequest(ValueError):
    def __init__(self, param: str, message: str):
        super().__init__(message)
        self.param = param


def as_int(param: str, value, label: str | None = None) -> int:
    """`value` as a Python int: an int or a NumPy/torch integer scalar, never a bool or a float.
    `label` is what the message calls it (default: "param=value")."""
    dtype = str(getattr(value, "dtype", ""))
    if not (isinstance(value, bool) or dtype in ("bool", "torch.bool")
            or getattr(value, "ndim", 0) != 0):
        try:
            return operator.index(value)
        except TypeError:
            pass
    raise InvalidRequest(param, f"{label or f'{param}={value!r}'} must be an integer, "
                                f"not {type(value).__name__}")


def as_real(param: str, value, label: str | None = None) -> float:
    """`value` as a finite float: an int or float (NumPy's too), never a bool, NaN or infinity."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool) \
            and str(getattr(value, "dtype", "")) != "bool":
        value = float(value)
        if math.isfinite(value):
            return value
        raise InvalidRequest(param, f"{label or f'{param}={value!r}'} must be a finite number")
    raise InvalidRequest(param, f"{label or f'{param}={value!r}'} must be a number, "
                                f"not {type(value).__name__}")


def as_bool(param: str, value, label: str | None = None) -> bool:
    if isinstance(value, bool) or str(getattr(value, "dtype", "")) == "bool":
        return bool(value)
    raise InvalidRequest(param, f"{label or f'{param}={value!r}'} must be True or False, "
                                f"not {type(value).__name__}")
