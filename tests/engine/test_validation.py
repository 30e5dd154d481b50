"""Input is checked where it enters: SamplingParams, prompts, add_request's other arguments,
EngineConfig and LLM/LLMEngine options. Every refusal is an InvalidRequest (a ValueError) whose
message names the value and whose `param` is the field's name as a client sends it."""

import numpy as np
import pytest
import torch

from nanoserve import LLM, EngineConfig, LLMEngine, SamplingParams
from nanoserve.errors import InvalidRequest
from tests.conftest import FakeExecutor, assert_no_leaks

NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize("kwargs, param, match", [
    (dict(max_tokens=0), "max_tokens", "max_tokens=0"),
    (dict(max_tokens=True), "max_tokens", "max_tokens=True must be an integer, not bool"),
    (dict(max_tokens=2.0), "max_tokens", "max_tokens=2.0 must be an integer"),
    (dict(max_tokens="8"), "max_tokens", "max_tokens='8'"),
    (dict(temperature=NAN), "temperature", "temperature=nan must be a finite number"),
    (dict(temperature=INF), "temperature", "temperature=inf"),
    (dict(temperature=-0.5), "temperature", "temperature=-0.5"),
    (dict(temperature=2.5), "temperature", r"temperature=2.5 must be in \[0, 2\]"),
    (dict(temperature="hot"), "temperature", "temperature='hot' must be a number"),
    (dict(temperature=False), "temperature", "temperature=False must be a number, not bool"),
    (dict(top_p=0.0), "top_p", "top_p=0.0"),
    (dict(top_p=1.5), "top_p", "top_p=1.5"),
    (dict(top_p=NAN), "top_p", "top_p=nan"),
    (dict(top_k=-3), "top_k", "top_k=-3"),
    (dict(top_k=2.5), "top_k", "top_k=2.5 must be an integer"),
    (dict(top_k=True), "top_k", "top_k=True"),
    (dict(seed="x"), "seed", "seed='x' must be an integer, not str"),
    (dict(seed=1.5), "seed", "seed=1.5"),
    (dict(seed=True), "seed", "seed=True"),
    (dict(seed=2**64), "seed", "must fit in 64 bits"),
    (dict(ignore_eos="yes"), "ignore_eos", "ignore_eos='yes' must be True or False"),
    (dict(ignore_eos=1), "ignore_eos", "ignore_eos=1"),
    (dict(stop_token_ids=5), "stop_token_ids", "stop_token_ids=5 must be a list of token ids"),
    (dict(stop_token_ids="12"), "stop_token_ids", "stop_token_ids='12'"),
    (dict(stop_token_ids=[1, 2.5]), "stop_token_ids", "stop_token_ids entry 2.5 must be an integer"),
    (dict(stop_token_ids=[True]), "stop_token_ids", "stop_token_ids entry True"),
    (dict(stop_token_ids=[-4]), "stop_token_ids", "stop_token_ids entry -4 is negative"),
])
def test_bad_sampling_params_are_refused_naming_field_and_value(kwargs, param, match):
    with pytest.raises(InvalidRequest, match=match) as err:
        SamplingParams(**kwargs)
    assert err.value.param == param and isinstance(err.value, ValueError)


def test_sampling_params_accept_numpy_and_torch_integers_and_vllm_spellings():
    p = SamplingParams(max_tokens=np.int64(4), top_k=np.int32(3), seed=torch.tensor(7),
                       stop_token_ids=np.array([5, 5, 9]), ignore_eos=np.bool_(True))
    assert (p.max_tokens, p.top_k, p.seed, p.stop_token_ids, p.ignore_eos) == (4, 3, 7, [5, 9], True)
    assert all(type(v) is int for v in (p.max_tokens, p.top_k, p.seed, *p.stop_token_ids))
    assert SamplingParams(seed=-1).seed is None  # vLLM: -1 means no seed
    assert SamplingParams(stop_token_ids=None).stop_token_ids == []
    assert SamplingParams(top_k=0).top_k == 0  # all tokens, as vLLM (tests/engine/test_sampler.py)


@pytest.fixture
def engine():
    return LLMEngine.from_executor(FakeExecutor(vocab_size=100, block_size=4),
                                   EngineConfig(block_size=4, num_kv_blocks=16, max_model_len=32))


@pytest.mark.parametrize("prompt, match", [
    ([], "prompt is empty"),
    ([1, 2.5], r"prompt token id 2.5 \(position 1\) must be an integer, not float"),
    ([1, True], r"prompt token id True \(position 1\) must be an integer, not bool"),
    ([1, "2"], "prompt token id '2'"),
    ([1, None], "prompt token id None"),
    (np.array([1.0, 2.0]), "prompt token id 1.0"),
    (torch.tensor([True, False]), "prompt token id True"),
    ([[1, 2], [3]], r"prompt token id \[1, 2\]"),
    ([1, 100], r"prompt token id 100 is outside the vocabulary \[0, 100\)"),
    ([-1, 3], "prompt token id -1 is outside"),
    (list(range(1, 34)), "prompt of 33 tokens is longer than max_model_len=32"),
    ([1] * 32, "prompt of 32 tokens leaves no room for an output token within max_model_len=32"),
    ("hello", "add_request takes token ids"),
    (7, "prompt=7 must be a list of token ids"),
])
def test_bad_prompts_are_refused_and_change_nothing(engine, prompt, match):
    keep = engine.add_request([1, 2, 3], SamplingParams(max_tokens=3))
    with pytest.raises(InvalidRequest, match=match) as err:
        engine.add_request(prompt, SamplingParams(max_tokens=3))
    assert err.value.param == "prompt"
    assert list(engine.requests) == [keep] and len(engine.scheduler.waiting) == 1


@pytest.mark.parametrize("prompt", [np.array([4, 5, 6]), torch.tensor([4, 5, 6]), (4, 5, 6),
                                    [np.int64(4), np.int32(5), torch.tensor(6)]])
def test_numpy_and_torch_integer_prompts_become_python_ints(engine, prompt):
    rid = engine.add_request(prompt, SamplingParams(max_tokens=2))
    ids = engine.requests[rid].prompt_token_ids
    assert ids == [4, 5, 6] and all(type(t) is int for t in ids)


@pytest.mark.parametrize("call, param, match", [
    (lambda e: e.add_request([1], SamplingParams(stop_token_ids=[100])), "stop_token_ids",
     r"stop_token_ids entry 100 is outside the vocabulary \[0, 100\)"),
    (lambda e: e.add_request([1], {"max_tokens": 3}), "sampling_params", "must be a SamplingParams"),
    (lambda e: e.add_request([1], arrival_time=NAN), "arrival_time", "arrival_time=nan"),
    (lambda e: e.add_request([1], arrival_time="now"), "arrival_time", "arrival_time='now'"),
    (lambda e: e.add_request([1], request_id=5), "request_id", "request_id=5 must be a non-empty"),
    (lambda e: e.add_request([1], request_id=""), "request_id", "request_id=''"),
])
def test_bad_request_arguments_name_their_field(engine, call, param, match):
    with pytest.raises(InvalidRequest, match=match) as err:
        call(engine)
    assert err.value.param == param
    assert not engine.requests


def test_kv_blocks_refusal_blames_the_prompt_or_max_tokens():
    engine = LLMEngine.from_executor(FakeExecutor(vocab_size=100),
                                     EngineConfig(block_size=4, num_kv_blocks=4))
    with pytest.raises(InvalidRequest, match="needs 5 KV blocks.*num_kv_blocks=4") as err:
        engine.add_request([1] * 10, SamplingParams(max_tokens=10))
    assert err.value.param == "max_tokens"
    with pytest.raises(InvalidRequest, match="needs 6 KV blocks") as err:
        engine.add_request([1] * 20, SamplingParams(max_tokens=2))
    assert err.value.param == "prompt"


def test_engine_keeps_its_own_checked_copy_of_the_params(engine):
    params = SamplingParams(max_tokens=3)
    rid = engine.add_request([1, 2], params)
    params.seed, params.max_tokens = "x", 0  # the caller's object, changed afterwards
    assert engine.requests[rid].params.max_tokens == 3 and engine.requests[rid].params.seed is None
    with pytest.raises(InvalidRequest, match="max_tokens=0"):
        engine.add_request([1, 2], params)  # checked again on the way in


def test_request_ids_given_and_generated_never_clash(engine):
    assert engine.add_request([1], request_id="0") == "0"
    auto = engine.add_request([2])
    assert auto != "0"
    with pytest.raises(InvalidRequest, match="request_id '0' is already in use") as err:
        engine.add_request([3], request_id="0")
    assert err.value.param == "request_id"


@pytest.mark.parametrize("kwargs, match", [
    (dict(block_size=0), "EngineConfig.block_size=0 is invalid"),
    (dict(block_size=True), "block_size=True"),
    (dict(block_size=16.0), "block_size=16.0"),
    (dict(max_num_seqs="64"), "max_num_seqs='64'"),
    (dict(max_num_batched_tokens=0), "max_num_batched_tokens=0"),
    (dict(num_kv_blocks=0), "num_kv_blocks=0"),
    (dict(num_kv_blocks=2.5), "num_kv_blocks=2.5"),
    (dict(max_model_len=-1), "max_model_len=-1"),
    (dict(max_num_partial_prefills=-1), "max_num_partial_prefills=-1"),
    (dict(kv_cache_memory=0), "kv_cache_memory=0"),
    (dict(kv_cache_memory=NAN), "kv_cache_memory=nan"),
    (dict(gpu_memory_utilization=0), "gpu_memory_utilization=0"),
    (dict(gpu_memory_utilization=1.5), "gpu_memory_utilization=1.5"),
    (dict(gpu_memory_utilization=NAN), "gpu_memory_utilization=nan"),
    (dict(enable_chunked_prefill="no"), "enable_chunked_prefill='no'"),
    (dict(enable_prefix_caching=0), "enable_prefix_caching=0"),
    (dict(record_trace=None), "record_trace=None"),
    (dict(compile=1), "compile=1"),
    (dict(scheduling_policy="fifo"), "scheduling_policy='fifo'"),
    (dict(priority="urgent"), "priority='urgent'"),
    (dict(cuda_graph_batch_sizes=[1, 0]), r"cuda_graph_batch_sizes=\[1, 0\]"),
    (dict(cuda_graph_batch_sizes=8), "cuda_graph_batch_sizes=8"),
])
def test_bad_engine_config_names_field_and_value(kwargs, match):
    with pytest.raises(InvalidRequest, match=match) as err:
        EngineConfig(**kwargs)
    assert err.value.param == next(iter(kwargs))


def test_engine_config_accepts_numpy_integers_and_float_bytes():
    cfg = EngineConfig(num_kv_blocks=np.int64(8), kv_cache_memory=2e9, max_model_len=np.int32(64))
    assert (cfg.num_kv_blocks, cfg.kv_cache_memory, cfg.max_model_len) == (8, 2_000_000_000, 64)
    assert type(cfg.num_kv_blocks) is int


@pytest.mark.parametrize("kwargs, param, match", [
    (dict(device="mps"), "device", "device='mps': nanoserve runs on 'cpu' or 'cuda'"),
    (dict(device="not a device"), "device", "device='not a device' is not a torch device"),
    (dict(device=3.5), "device", "device=3.5"),
    (dict(dtype="float8"), "dtype", "dtype='float8'"),
    (dict(dtype=["float32"]), "dtype", r"dtype=\['float32'\]"),
    (dict(seed="0"), "seed", "seed='0' must be an integer"),
    (dict(seed=0.5), "seed", "seed=0.5"),
    (dict(model=42), "model", "model=42 must be a checkpoint folder"),
    (dict(config=dict(block_size=4)), "config", "must be an EngineConfig"),
    (dict(scheduler="fifo"), "scheduler", "scheduler='fifo' must be a Scheduler class"),
    (dict(clock=5), "clock", "clock=5 must be a function"),
])
def test_bad_llm_options_name_the_argument(kwargs, param, match):
    with pytest.raises(InvalidRequest, match=match) as err:
        LLM(**(dict(model="preset:tiny") | kwargs))
    assert err.value.param == param


def test_cuda_without_a_gpu_is_refused_clearly():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(InvalidRequest, match="device='cuda' but torch sees 0 CUDA device"):
        LLM("preset:tiny", device="cuda")


def test_generate_adds_every_prompt_or_none():
    llm = LLM("preset:tiny", config=EngineConfig(block_size=4, num_kv_blocks=32))
    with pytest.raises(InvalidRequest, match="prompt token id 2.5"):
        llm.generate([[1, 2], [3, 4], [5, 2.5]])
    assert not llm.engine.has_unfinished() and not llm.engine.requests
    with pytest.raises(InvalidRequest, match=r"got 2 SamplingParams for 3 prompts"):
        llm.generate([[1], [2], [3]], [SamplingParams(), SamplingParams()])
    outs = llm.generate(np.array([[1, 2, 3], [4, 5, 6]]), SamplingParams(max_tokens=2))
    assert [o.prompt_token_ids for o in outs] == [[1, 2, 3], [4, 5, 6]]
    assert len(llm.generate(np.array([7, 8, 9]), SamplingParams(max_tokens=2))) == 1  # one prompt
    assert_no_leaks(llm.engine)
