"""The model: a Llama-family decoder, its loader, and random-weight presets."""

from nanoserve.model.llama import LlamaForCausalLM
from nanoserve.model.loader import (
    DEMO_MODEL_DIR,
    DEMO_MODEL_NAME,
    hf_config_dict,
    load_model,
    save_hf_checkpoint,
)
from nanoserve.presets import PRESETS, preset_config

__all__ = ["LlamaForCausalLM", "DEMO_MODEL_DIR", "DEMO_MODEL_NAME", "hf_config_dict", "load_model",
           "save_hf_checkpoint", "PRESETS", "preset_config"]
