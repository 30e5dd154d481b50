"""nanoserve: a compact LLM serving engine and the tools to measure it.

    from nanoserve import LLM, SamplingParams
    outs = LLM("preset:tiny").generate([[1, 2, 3]], SamplingParams(max_tokens=8, temperature=0))

The package is layered, top to bottom (an import goes down or stays inside its layer):
course -> sim, serve -> measure -> engine -> model -> kernels -> config, sampling_params, outputs.
"""

from nanoserve.config import EngineConfig, ModelConfig, SpeculativeConfig
from nanoserve.engine import LLM, LLMEngine, StepRecord
from nanoserve.outputs import RequestMetrics, RequestOutput
from nanoserve.sampling_params import SamplingParams

__version__ = "0.1.0"
__all__ = ["LLM", "LLMEngine", "EngineConfig", "ModelConfig", "SamplingParams", "RequestOutput",
           "RequestMetrics", "SpeculativeConfig", "StepRecord"]
