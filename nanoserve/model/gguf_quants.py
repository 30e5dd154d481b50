"""GGUF tensor types to torch: the plain float types, and llama.cpp's Q8_0, Q4_0 and Q4_1 blocks.

A quantized GGUF row is a run of 32-value blocks, each a float16 scale `d` (Q4_1 adds a float16
offset `m`) followed by the packed integers (llama.cpp's ggml-common.h, block_q8_0/q4_0/q4_1):

    Q8_0  34 bytes: d, 32 x int8                   x = d * q
    Q4_0  18 bytes: d, 16 bytes of 4-bit pairs     x = d * (q - 8)
    Q4_1  20 bytes: d, m, 16 bytes of 4-bit pairs  x = d * q + m

In a 4-bit block byte j holds value j in its low nibble and value j + 16 in its high one.
Dequantized values are computed in float32 (as llama.cpp does) and then cast. Other types (the
K-quants, IQ types) are refused by name rather than guessed at. `q8_0_codes` hands out a Q8_0
tensor's codes and scales as they are, for the int8 weight path (model/quantization.py).
"""

from __future__ import annotations

import numpy as np
import torch

BLOCK = 32  # values per block in every type here
_BLOCK_BYTES = {"Q8_0": 2 + BLOCK, "Q4_0": 2 + BLOCK // 2, "Q4_1": 4 + BLOCK // 2}
_FLOATS = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
SUPPORTED = tuple(_FLOATS) + tuple(_BLOCK_BYTES)


def dequantize(data: np.ndarray, type_name: str, shape: tuple[int, ...],
               dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The tensor a GGUF stores as `data` (its raw array), in `shape` (rows first) and `dtype`."""
    raw = torch.from_numpy(np.array(data))  # a copy: the reader maps the file read-only
    if type_name in _FLOATS:
        if type_name == "BF16":  # numpy has no bfloat16: the reader hands out the raw 16-bit words
            raw = raw.view(torch.int16).view(torch.bfloat16)
        return raw.view(_FLOATS[type_name]).reshape(shape).to(dtype)
    if type_name not in _BLOCK_BYTES:
        raise ValueError(f"GGUF tensor type {type_name!r} is not supported; supported: {list(SUPPORTED)}")
    if shape[-1] % BLOCK:
        raise ValueError(f"a {type_name} row of {shape[-1]} values is not a whole number of "
                         f"{BLOCK}-value blocks")
    blocks = raw.view(torch.uint8).reshape(-1, _BLOCK_BYTES[type_name])  # (num_blocks, block_bytes)
    d = blocks[:, 0:2].contiguous().view(torch.float16).float()  # (num_blocks, 1)
    if type_name == "Q8_0":
        q = blocks[:, 2:].contiguous().view(torch.int8).float()  # (num_blocks, 32)
        values = d * q
    else:
        start = 2 if type_name == "Q4_0" else 4
        packed = blocks[:, start:]  # (num_blocks, 16)
        q = torch.cat([packed & 0x0F, packed >> 4], dim=1).float()  # (num_blocks, 32)
        if type_name == "Q4_0":
            values = d * (q - 8)
        else:
            m = blocks[:, 2:4].contiguous().view(torch.float16).float()
            values = d * q + m
    return values.reshape(shape).to(dtype)


def q8_0_codes(data: np.ndarray, shape: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """A Q8_0 matrix as (codes (rows, cols) int8, scales (rows, cols / 32) fp32): x = d * q."""
    rows, cols = shape
    if cols % BLOCK:
        raise ValueError(f"a Q8_0 row of {cols} values is not a whole number of {BLOCK}-value blocks")
    blocks = torch.from_numpy(np.array(data)).view(torch.uint8).reshape(rows, cols // BLOCK, 2 + BLOCK)
    scales = blocks[..., 0:2].contiguous().view(torch.float16).float().reshape(rows, cols // BLOCK)
    codes = blocks[..., 2:].contiguous().view(torch.int8).reshape(rows, cols)
    return codes, scales
