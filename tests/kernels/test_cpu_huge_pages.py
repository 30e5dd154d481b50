"""The GEMV's weights on transparent huge pages: copies equal to the originals, in one mapping
marked MADV_HUGEPAGE (the "hg" flag of /proc/self/smaps), and what pack_model moves there."""

import pytest
import torch

from nanoserve.kernels import cpu_gemm, kernel_backend
from nanoserve.kernels.cpu_huge_pages import ALIGN, huge_pages_available, to_huge_pages
from nanoserve.model import LlamaForCausalLM, preset_config

needs_thp = pytest.mark.skipif(not huge_pages_available(), reason="no transparent huge pages here")


def advised_huge(t: torch.Tensor) -> bool:
    """Does the mapping holding t's first byte carry MADV_HUGEPAGE's flag?"""
    addr, inside = t.data_ptr(), False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and ":" not in head:
                lo, hi = (int(v, 16) for v in head.split("-"))
                inside = lo <= addr < hi
            elif inside and head == "VmFlags:":
                return "hg" in line.split()[1:]
    return False


@needs_thp
def test_copies_equal_the_tensors_and_share_one_advised_mapping():
    ts = [torch.randn(300, 96).bfloat16(), torch.randn(7, 3), torch.arange(-5, 5, dtype=torch.int8),
          torch.randn(64, 64).to(torch.float8_e4m3fn)]
    copies = to_huge_pages(ts)
    for t, c in zip(ts, copies):
        assert c.dtype == t.dtype and c.shape == t.shape and c.is_contiguous()
        assert torch.equal(c.view(torch.uint8), t.view(torch.uint8))
        assert c.data_ptr() % ALIGN == 0 and advised_huge(c)
        assert c.data_ptr() != t.data_ptr()
    assert not advised_huge(ts[0])


@needs_thp
def test_pack_model_moves_the_dense_weights_and_keeps_the_outputs():
    torch.manual_seed(0)
    cfg = preset_config("tiny")
    model = LlamaForCausalLM(cfg)
    model.init_random_weights()
    x = torch.randn(1, cfg.hidden_size)
    want = model.compute_logits(x)
    cpu_gemm.pack_model(model)
    linears = [m for m in model.modules() if isinstance(m, cpu_gemm.PackedLinear)]
    assert linears and all(advised_huge(m.dense) for m in linears if m.dense is not None)
    assert advised_huge(model.lm_head_weight())
    torch.testing.assert_close(model.compute_logits(x), want, rtol=1e-4, atol=1e-4)


@needs_thp
@pytest.mark.skipif(kernel_backend("cpu") != "cpu", reason="the C++ CPU ops are not built here")
def test_int8_codes_of_a_loaded_model_are_on_huge_pages():
    from nanoserve import LLM
    from nanoserve.kernels.cpu_quant_gemm import QuantizedCpuLinear
    llm = LLM("preset:tiny", dtype="bfloat16", quantization="int8")
    layers = [m for m in llm.engine.model.modules() if isinstance(m, QuantizedCpuLinear)]
    assert layers and all(advised_huge(m.qweight) for m in layers)


def test_without_a_mapping_the_tensors_stay(monkeypatch):
    import mmap

    def refuse(*args, **kwargs):
        raise OSError(12, "Cannot allocate memory")
    monkeypatch.setattr(mmap, "mmap", refuse)
    ts = [torch.randn(4, 4)]
    assert to_huge_pages(ts) is ts
