"""Configuration dataclasses: the model's shape and the engine's knobs.

ModelConfig mirrors the fields of a Hugging Face Llama/Qwen2/Qwen3 `config.json`;
EngineConfig uses vLLM's names for vLLM's knobs so a student can read vLLM next.
Validation raises ValueError (EngineConfig: nanoserve.errors.InvalidRequest, with `param` the
field's name) naming the bad value and the allowed range.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields

from nanoserve.env import get
from nanoserve.errors import InvalidRequest, as_int, as_real


def config_from(cls, value, name: str):
    """A `cls` dataclass from itself, a dict of its fields or their JSON (the command-line flag
    --NAME); an InvalidRequest naming `name` otherwise."""
    if isinstance(value, cls):
        return value
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise InvalidRequest(name, f"--{name.replace('_', '-')} is not JSON: {e}") from None
    if not isinstance(value, dict):
        raise InvalidRequest(name, f"{name}={value!r} must be a {cls.__name__}, a dict or JSON")
    known = sorted(f.name for f in fields(cls))
    unknown = sorted(set(value) - set(known))
    if unknown:
        raise InvalidRequest(name, f"unknown {name} field(s) {unknown}; known: {known}")
    return cls(**value)


SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}


@dataclass
class ModelConfig:
    """Shape of a Llama-family decoder (field names as in HF config.json)."""

    vocab_size: int = 32000
    hidden_size: int = 768
    intermediate_size: int = 2048
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    num_key_value_heads: int | None = None  # None: multi-head attention (= num_attention_heads)
    head_dim: int | None = None  # None: hidden_size // num_attention_heads
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None  # {"rope_type": "llama3", "factor": ..., ...} or None
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # Qwen2: bias on q/k/v projections
    qk_norm: bool = False  # Qwen3: RMSNorm on each head of q and k
    architecture: str = "llama"  # llama | qwen2 | qwen3
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None

    def __post_init__(self):
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "head_dim"):
            if getattr(self, name) < 1:
                raise ValueError(f"ModelConfig.{name}={getattr(self, name)} must be >= 1")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads={self.num_attention_heads} must be a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} must be even for rotary embeddings")

    @property
    def eos_token_ids(self) -> set[int]:
        eos = self.eos_token_id
        if eos is None:
            return set()
        return set(eos) if isinstance(eos, (list, tuple)) else {eos}

    def num_params(self) -> int:
        """Parameter count (embeddings counted once when tied)."""
        h, q, kv = self.hidden_size, self.num_attention_heads * self.head_dim, \
            self.num_key_value_heads * self.head_dim
        attn = h * (q + 2 * kv) + q * h + (q + 2 * kv if self.attention_bias else 0)
        mlp = 3 * h * self.intermediate_size
        norms = 2 * h + (2 * self.head_dim if self.qk_norm else 0)
        emb = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return self.num_hidden_layers * (attn + mlp + norms) + emb + h

    @classmethod
    def from_hf_dict(cls, d: dict) -> "ModelConfig":
        archs = d.get("architectures") or ["LlamaForCausalLM"]
        arch = SUPPORTED_ARCHITECTURES.get(archs[0])
        if arch is None:
            raise ValueError(f"unsupported architecture {archs[0]!r}; nanoserve supports "
                             f"{sorted(SUPPORTED_ARCHITECTURES)}")
        names = {f.name for f in fields(cls)}
        kw = {k: v for k, v in d.items() if k in names and v is not None}
        kw["architecture"] = arch
        kw["attention_bias"] = arch == "qwen2" or bool(d.get("attention_bias", False))
        kw["qk_norm"] = arch == "qwen3"
        if d.get("rope_scaling") is None and isinstance(d.get("rope_parameters"), dict):
            # transformers >= 5 stores rope_theta and scaling under rope_parameters
            rp = dict(d["rope_parameters"])
            kw["rope_theta"] = rp.pop("rope_theta", kw.get("rope_theta", 10000.0))
            if rp.get("rope_type", "default") != "default":
                kw["rope_scaling"] = rp
        return cls(**kw)

    @classmethod
    def from_json(cls, path: str) -> "ModelConfig":
        with open(path) as f:
            return cls.from_hf_dict(json.load(f))


SPECULATIVE_METHODS = ("ngram", "draft_model")
# vLLM's CacheConfig names: "auto" stores K/V in the model's dtype; "fp8" (= "fp8_e4m3") in
# float8 e4m3 with a per-layer scale for K and one for V (engine/kv_cache.py)
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3")
QUANTIZATION_METHODS = ("int8", "fp8")  # weight-only codes (model/quantization.py); None: none


@dataclass
class SpeculativeConfig:
    """Speculative decoding, with vLLM's SpeculativeConfig names and defaults (vllm/config/
    speculative.py, vLLM 0.32): a proposer drafts up to num_speculative_tokens tokens per decode
    and the target model checks them all in the next step.

    method: "ngram" (prompt lookup in the request's own tokens) or "draft_model" (a smaller model
        with the target's vocabulary, `model`); left None, `model` implies "draft_model".
    prompt_lookup_max / prompt_lookup_min: the n-gram lengths ngram matches, longest first; one
        given sets the other, neither given sets both to 5 (vLLM's defaults).
    disable_by_batch_size: no drafts while this many requests or more are running (batching has
        spent the spare compute already); None drafts at any batch size.
    """

    num_speculative_tokens: int | None = None
    method: str | None = None
    prompt_lookup_max: int | None = None
    prompt_lookup_min: int | None = None
    model: str | None = None
    disable_by_batch_size: int | None = None

    def __post_init__(self):
        def bad(name, allowed):
            raise InvalidRequest("speculative_config", f"speculative_config {name}="
                                                       f"{getattr(self, name)!r} is invalid; "
                                                       f"allowed: {allowed}")

        def integer(name, low, optional=True):
            value = getattr(self, name)
            if value is None and optional:
                return
            try:
                value = as_int(name, value)
            except InvalidRequest:
                value = None
            if value is None or value < low:
                bad(name, f"{'None or ' if optional else ''}an integer >= {low}")
            setattr(self, name, value)

        if self.method is None and self.model is not None:
            self.method = "draft_model"
        if self.method not in SPECULATIVE_METHODS:
            bad("method", " or ".join(map(repr, SPECULATIVE_METHODS)))
        integer("num_speculative_tokens", 1, optional=False)
        integer("disable_by_batch_size", 1)
        if self.method == "ngram":
            integer("prompt_lookup_max", 1)
            integer("prompt_lookup_min", 1)
            lo, hi = self.prompt_lookup_min, self.prompt_lookup_max
            self.prompt_lookup_min = lo if lo is not None else (hi if hi is not None else 5)
            self.prompt_lookup_max = hi if hi is not None else self.prompt_lookup_min
            if self.prompt_lookup_min > self.prompt_lookup_max:
                raise InvalidRequest("speculative_config", f"speculative_config prompt_lookup_min="
                                                           f"{self.prompt_lookup_min} must be <= "
                                                           f"prompt_lookup_max={self.prompt_lookup_max}")
            if self.model is not None:
                bad("model", "None with method 'ngram' (a draft model needs method 'draft_model')")
        elif not isinstance(self.model, str) or not self.model:
            bad("model", "a checkpoint folder, a hub id or 'preset:NAME' (method 'draft_model')")

    @classmethod
    def parse(cls, value) -> SpeculativeConfig | None:
        """A SpeculativeConfig, a dict of its fields, their JSON (`--speculative-config`), or None."""
        if value is None or isinstance(value, cls):
            return value
        return config_from(cls, value, "speculative_config")


@dataclass
class EngineConfig:
    """The serving engine's knobs (vLLM names where vLLM has the idea).

    KV cache size: num_kv_blocks if set, else kv_cache_memory bytes if set, else sized from
    memory. On CUDA: gpu_memory_utilization of the device's memory minus what is already in use
    (and headroom for activations). On a CPU, as vLLM 0.32's CPU worker does (vLLM applies
    gpu_memory_utilization to host memory there): gpu_memory_utilization of the machine's
    memory minus what the process holds once the model is loaded; never so much that less than
    (1 - gpu_memory_utilization) of the machine's memory stays available, nor more than 4 GiB or
    half of the memory available at the start (so a notebook fits the next engine), nor more
    blocks than max_num_seqs requests of max_model_len tokens can use (llama-120m, max_model_len
    4096: at most 3 GiB in bf16, 4 GiB in fp32; preset:tiny 512 MiB in fp32).
    """

    block_size: int = 16  # tokens per KV-cache block
    num_kv_blocks: int | None = None  # None: sized from kv_cache_memory or from memory (above)
    kv_cache_memory: int | None = None  # bytes for the KV cache (vLLM: kv_cache_memory_bytes)
    gpu_memory_utilization: float = 0.9  # share of device (CUDA) or host (CPU) memory to use
    max_num_seqs: int = 64  # most requests in the running batch
    # token budget of one step; vLLM 0.32 uses 4096 (LLM) / 2048 (server) on a CPU and 2048 to
    # 16384 on GPUs (EngineArgs defaults, vllm/engine/arg_utils.py). Larger budgets prefill more
    # per step, and stall every decode longer behind a long prompt (lesson 05)
    max_num_batched_tokens: int = 512
    max_model_len: int | None = None  # None: the model's max_position_embeddings
    enable_chunked_prefill: bool = True
    max_num_partial_prefills: int = 0  # cap on prompts mid-prefill at once; 0 = no cap
    enable_prefix_caching: bool = True
    scheduling_policy: str = "continuous"  # "continuous" | "static"
    priority: str = "decode"  # without chunking: "decode" (running first) | "prefill" (admit first)
    record_trace: bool = True  # keep a per-step trace on the engine
    # CUDA: decode batch sizes to capture; None: vLLM's list up to max_num_seqs (cuda_graphs.py)
    cuda_graph_batch_sizes: list[int] | None = None
    # every kernel called one by one from Python: no CUDA-graph capture (CUDA), no fused decode
    # layers (CPU backend, kernels/cpu_decode_layer.py)
    enforce_eager: bool = False
    compile: bool = False  # torch.compile the model over the reference ops (inductor's kernels)
    # speculative decoding: a SpeculativeConfig or a dict of its fields; None drafts nothing
    speculative_config: SpeculativeConfig | None = None
    kv_cache_dtype: str = "auto"  # KV_CACHE_DTYPES: "auto" (the model's dtype) or "fp8"
    # the decoder layers' linear weights as 8-bit codes: "int8" or "fp8" (e4m3); None keeps the dtype
    quantization: str | None = None
    # values sharing a scale of those codes: None, one per output channel; else one per this many input
    # values (GPTQ's group_size), which must divide every linear's input size
    quantization_group_size: int | None = None
    # with quantization: the lm_head as 8-bit codes too (as llama.cpp's Q8_0 files hold it); False keeps
    # it in the model's dtype, vLLM's default (model/quantization.py says why)
    quantization_lm_head: bool = False

    def __post_init__(self):
        def check(name, ok, allowed):
            if not ok:
                raise InvalidRequest(name, f"EngineConfig.{name}={getattr(self, name)!r} is "
                                           f"invalid; allowed: {allowed}")

        def integer(name, low, optional=False):
            value = getattr(self, name)
            allowed = f"{'None or ' if optional else ''}an integer >= {low}"
            if value is None:
                check(name, optional, allowed)
                return
            try:
                value = as_int(name, value)
            except InvalidRequest:
                value = None
            check(name, value is not None and value >= low, allowed)
            setattr(self, name, value)

        def flag(name):
            check(name, isinstance(getattr(self, name), bool), "True or False")

        for name in ("block_size", "max_num_seqs", "max_num_batched_tokens"):
            integer(name, 1)
        integer("num_kv_blocks", 1, optional=True)
        integer("max_model_len", 1, optional=True)
        integer("max_num_partial_prefills", 0)
        if self.kv_cache_memory is not None:
            try:  # bytes; a float such as 2e9 is accepted and rounded down
                memory = as_real("kv_cache_memory", self.kv_cache_memory)
            except InvalidRequest:
                memory = 0
            check("kv_cache_memory", memory >= 1, "None or a positive number of bytes")
            self.kv_cache_memory = int(memory)
        try:
            utilization = as_real("gpu_memory_utilization", self.gpu_memory_utilization)
        except InvalidRequest:
            utilization = 0
        check("gpu_memory_utilization", 0 < utilization <= 1, "a number in (0, 1]")
        self.gpu_memory_utilization = utilization
        for name in ("enable_chunked_prefill", "enable_prefix_caching", "record_trace",
                     "enforce_eager", "compile"):
            flag(name)
        check("scheduling_policy", self.scheduling_policy in ("continuous", "static"),
              "'continuous' or 'static'")
        check("priority", self.priority in ("decode", "prefill"), "'decode' or 'prefill'")
        check("kv_cache_dtype", self.kv_cache_dtype in KV_CACHE_DTYPES,
              " or ".join(map(repr, KV_CACHE_DTYPES)))
        sizes = self.cuda_graph_batch_sizes
        if sizes is not None:
            try:
                sizes = [as_int("cuda_graph_batch_sizes", b) for b in sizes]
            except (InvalidRequest, TypeError):
                sizes = None
            check("cuda_graph_batch_sizes", sizes is not None and all(b >= 1 for b in sizes),
                  "None or a list of integers >= 1")
            self.cuda_graph_batch_sizes = sizes
        self.speculative_config = SpeculativeConfig.parse(self.speculative_config)
        check("quantization", self.quantization is None or (isinstance(self.quantization, str) and
                                                            self.quantization in QUANTIZATION_METHODS),
              f"None or one of {list(QUANTIZATION_METHODS)}")
        integer("quantization_group_size", 1, optional=True)
        check("quantization_lm_head", isinstance(self.quantization_lm_head, bool) and
              (not self.quantization_lm_head or self.quantization is not None),
              "False, or True with a quantization method")

    @property
    def num_speculative_tokens(self) -> int:
        """Drafts per decode at most: 0 without speculative decoding."""
        spec = self.speculative_config
        return 0 if spec is None else spec.num_speculative_tokens

    def max_model_len_for(self, model_config: ModelConfig) -> int:
        """max_model_len, or the model's max_position_embeddings; never beyond the latter."""
        limit = model_config.max_position_embeddings
        if self.max_model_len is not None and self.max_model_len > limit:
            raise InvalidRequest("max_model_len", f"max_model_len={self.max_model_len} exceeds the "
                                                  f"model's max_position_embeddings={limit}")
        return self.max_model_len or limit


def default_device() -> str:
    """'cuda' when a GPU is visible (and not hidden by NANOSERVE_DEVICE), else 'cpu'."""
    env = get("NANOSERVE_DEVICE")
    if env:
        return env
    import torch
    return "cuda" if torch.cuda.is_available() else "cpu"
