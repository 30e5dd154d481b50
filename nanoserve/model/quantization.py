"""Weight-only quantization (W8A16): the decoder layers' linears hold 8-bit codes and scales.

Decode reads every weight once per step, so a weight in 8 bits instead of 16 halves a linear's
bytes per step. `LLM(model, quantization="int8")` (or "fp8", e4m3) computes the codes at load,
one symmetric scale per output channel (kernels/quantization.py defines the formats), or one per
run of `EngineConfig.quantization_group_size` input values: a scale then spans fewer weights, so
one large weight coarsens fewer others' steps, for a few more bytes per weight; the activations,
the KV cache and everything outside the linears keep the model's dtype.

The shape is vLLM's (vllm/model_executor/layers/quantization): a QuantizationConfig hands each
linear layer a linear method, which creates the layer's weights (`create_weights`), turns them into
codes once the checkpoint is loaded (`process_weights_after_loading`) and computes the layer
(`apply`). `apply` here is the reference, dequantize then F.linear; the kernel backend swaps in its
fast path afterwards (kernels.process_weights_after_loading).

What stays unquantized, and why: the embedding, because a lookup reads one row per token, not the
table, so codes would save no bytes per step; by default the lm_head (the same tensor when embeddings
are tied), because its rounding error lands directly on the logits the sampler ranks, as vLLM's
methods also keep it by default; the norms and biases, a few vectors. `lm_head=True`
(`EngineConfig.quantization_lm_head`, GPTQ's `lm_head` option in vLLM) quantizes the lm_head as well,
as llama.cpp's Q8_0 files do: in a small model with a large vocabulary it is a fifth of the bytes a
decode step reads. Its codes are an extra copy beside the dense weight (`lm_head_quant`), which the
embedding lookup (or an untied model's state_dict) still needs.

A GGUF checkpoint's Q8_0 tensors are already int8 codes with a scale per 32 values: with
quantization="int8" they are loaded as they are (`load_quantized`), never widened to floats.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from nanoserve.config import QUANTIZATION_METHODS
from nanoserve.kernels.quantization import CODE_DTYPES, quantize_weight, quantized_linear


def check_quantization(value) -> str | None:
    """`value` if it names a method (or is None); a ValueError naming it and the allowed ones."""
    if value is None or (isinstance(value, str) and value in QUANTIZATION_METHODS):
        return value
    raise ValueError(f"quantization={value!r} is not supported; allowed: None or one of "
                     f"{list(QUANTIZATION_METHODS)}")


@dataclass(frozen=True)
class QuantizationConfig:
    """Which codes the linears get: method "int8" or "fp8"; group_size None is a scale per output
    channel, else a scale per that many input values (it must divide every linear's input size);
    lm_head: the lm_head gets codes too."""

    method: str
    group_size: int | None = None
    lm_head: bool = False

    def __post_init__(self):
        check_quantization(self.method)
        if self.group_size is not None and (not isinstance(self.group_size, int) or self.group_size < 1):
            raise ValueError(f"group_size={self.group_size!r} must be None or an integer >= 1")
        if not isinstance(self.lm_head, bool):
            raise ValueError(f"lm_head={self.lm_head!r} must be True or False")

    def get_name(self) -> str:
        return self.method

    def get_quant_method(self, layer: nn.Module, prefix: str = "") -> WeightOnlyLinearMethod:
        """The linear method of `layer` (every decoder-layer linear gets one; see the module doc
        for what never becomes a linear here)."""
        return WeightOnlyLinearMethod(self)


class WeightOnlyLinearMethod:
    """vLLM's LinearMethodBase for 8-bit weight-only codes: create, quantize once, apply."""

    def __init__(self, config: QuantizationConfig):
        self.config = config

    def create_weights(self, layer: nn.Module, in_features: int, out_features: int, bias: bool) -> None:
        """A dense `weight` parameter first: the checkpoint loads into it as into an nn.Linear."""
        layer.weight = nn.Parameter(torch.empty(out_features, in_features), requires_grad=False)
        layer.bias = nn.Parameter(torch.zeros(out_features), requires_grad=False) if bias else None

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        """The loaded weight -> codes and scales (kept), the dense weight dropped. A layer whose
        codes were loaded as they are (load_quantized) has no dense weight and is left alone."""
        if "weight" not in layer._parameters:
            return
        qweight, scale = quantize_weight(layer.weight.detach(), self.config.method, self.config.group_size)
        del layer.weight
        self.load_quantized(layer, qweight, scale)

    def load_quantized(self, layer: nn.Module, qweight: torch.Tensor, weight_scale: torch.Tensor) -> None:
        """Codes (out, in) in this method's dtype and fp32 scales (out, groups), as they are."""
        want = (layer.out_features, layer.in_features)
        if tuple(qweight.shape) != want or qweight.dtype != CODE_DTYPES[self.config.method]:
            raise ValueError(f"codes of shape {tuple(qweight.shape)} and dtype {qweight.dtype} do not fit "
                             f"a {self.config.method} layer of weight shape {want}")
        if weight_scale.dim() != 2 or weight_scale.shape[0] != want[0] or want[1] % weight_scale.shape[1]:
            raise ValueError(f"scales of shape {tuple(weight_scale.shape)} do not fit a weight of "
                             f"shape {want}")
        layer._parameters.pop("weight", None)
        layer.register_buffer("qweight", qweight.contiguous())
        layer.register_buffer("weight_scale", weight_scale.float().contiguous())

    def apply(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return quantized_linear(x, layer.qweight, layer.weight_scale, layer.bias)


class QuantizedLinear(nn.Module):
    """A linear layer whose weights its linear method owns (vLLM's LinearBase with a quant_method).
    After loading it holds `qweight` and `weight_scale` (and `bias`, in the model's dtype)."""

    def __init__(self, in_features: int, out_features: int, bias: bool,
                 quant_config: QuantizationConfig, prefix: str = ""):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.quant_method = quant_config.get_quant_method(self, prefix)
        self.quant_method.create_weights(self, in_features, out_features, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.quant_method.apply(self, x)

    def _apply(self, fn, recurse=True):
        # model.to(dtype) converts floating buffers, fp8 codes and fp32 scales too: keep their dtype,
        # follow only the device
        kept = dict(self._buffers)
        super()._apply(fn, recurse)
        for name, t in kept.items():
            if t is not None:
                self._buffers[name] = t.to(self._buffers[name].device)
        return self

    def extra_repr(self) -> str:
        scale = self._buffers.get("weight_scale")
        group = self.quant_method.config.group_size if scale is None else self.in_features // scale.shape[1]
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, quantization={self.quant_method.config.method!r}, "
                f"group_size={group}")


def make_linear(in_features: int, out_features: int, bias: bool,
                quant_config: QuantizationConfig | None, prefix: str = "") -> nn.Module:
    """An nn.Linear without quantization, else a QuantizedLinear."""
    if quant_config is None:
        return nn.Linear(in_features, out_features, bias=bias)
    return QuantizedLinear(in_features, out_features, bias, quant_config, prefix)


def quantize_after_loading(model: nn.Module) -> None:
    """Every QuantizedLinear's loaded weight -> codes (vLLM's loader calls each quant_method's
    process_weights_after_loading the same way, right after loading); with the config's lm_head,
    the model's `lm_head_quant` made from its lm_head weight."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, QuantizedLinear):
                m.quant_method.process_weights_after_loading(m)
        config = getattr(model, "quant_config", None)
        if config is not None and config.lm_head:
            weight = model.lm_head_weight()
            with torch.device("meta"):  # create_weights' dense placeholder: replaced just below
                head = QuantizedLinear(weight.shape[1], weight.shape[0], False, config, "lm_head")
            head.weight = nn.Parameter(weight.detach(), requires_grad=False)
            head.quant_method.process_weights_after_loading(head)
            model.lm_head_quant = head
