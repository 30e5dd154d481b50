"""oneDNN-prepacked linear layers: same numbers as F.linear, same state_dict, in the engine."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from nanoserve.kernels import cpu_gemm
from nanoserve.model import load_model

pytestmark = pytest.mark.skipif(not cpu_gemm.supported(torch.float32), reason="no oneDNN")


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("batch", [1, 3, 64])
@pytest.mark.parametrize("bias", [False, True])
def test_packed_linear_matches_f_linear(dtype, tol, batch, bias):
    """bf16 runs on oneDNN's bf16 kernel where the CPU has one, else in fp32 (two or more rows)."""
    torch.manual_seed(0)
    m = nn.Linear(48, 80, bias=bias).to(dtype)
    packed = cpu_gemm.PackedLinear.from_linear(m)
    x = torch.randn(batch, 48).to(dtype)
    torch.testing.assert_close(packed(x).float(), F.linear(x, m.weight, m.bias).float(),
                               rtol=tol, atol=tol)
    assert packed(x).dtype == dtype and packed(x.view(1, batch, 48)).shape == (1, batch, 80)


def test_bf16_without_bf16_kernels_rounds_an_fp32_product():
    """Where oneDNN has no bf16 kernel, rows are multiplied in fp32 and rounded once to bf16:
    what a bf16 gemm accumulating in fp32 returns. Elsewhere the layer is oneDNN's bf16 one."""
    torch.manual_seed(0)
    m = nn.Linear(256, 96, bias=True).bfloat16()
    packed = cpu_gemm.PackedLinear.from_linear(m)
    x = torch.randn(5, 256).bfloat16()
    want = F.linear(x.float(), m.weight.float(), m.bias.float()).bfloat16()
    if cpu_gemm.supported(torch.bfloat16):
        assert packed.compute == torch.bfloat16
        torch.testing.assert_close(packed(x), want, rtol=1e-2, atol=1e-2)
        return
    assert cpu_gemm.compute_dtype(torch.bfloat16) == torch.float32 and packed.dense is not None
    # fp32 sums in a different order can straddle a bf16 rounding boundary: at most one bf16 step
    assert (packed(x).float() - want.float()).abs().le(want.float().abs() * 2**-7 + 1e-6).all()
    assert (packed(x) == want).float().mean() > 0.95
    # one row reads the dense bf16 weight (the GEMV's fp32 sums, or F.linear without the C++ ops)
    torch.testing.assert_close(packed(x[:1]), F.linear(x[:1], m.weight, m.bias), rtol=1e-2, atol=1e-2)


def test_state_dict_keeps_the_dense_weight():
    m = nn.Linear(16, 24)
    state = cpu_gemm.PackedLinear.from_linear(m).state_dict()
    assert set(state) == {"weight", "bias"}
    assert torch.equal(state["weight"], m.weight.detach()) and torch.equal(state["bias"], m.bias)


def test_to_dtype_repacks():
    m = nn.Linear(16, 24)
    packed = cpu_gemm.PackedLinear.from_linear(m).to(torch.bfloat16)
    x = torch.randn(3, 16)
    assert packed(x.bfloat16()).dtype == torch.bfloat16
    torch.testing.assert_close(packed(x.bfloat16()).float(), F.linear(x, m.weight, m.bias),
                               rtol=3e-2, atol=3e-2)
    assert packed.state_dict()["weight"].dtype == torch.bfloat16
    with pytest.raises(ValueError, match="cannot hold a torch.float64"):
        packed.to(torch.float64)


@pytest.mark.parametrize("dtype,tol", [("float32", 1e-5), ("bfloat16", 2e-2)])
def test_model_packs_every_linear_and_keeps_its_outputs(dtype, tol):
    net, cfg, _ = load_model("preset:tiny", "cpu", dtype)
    dense = {k: v.clone() for k, v in net.state_dict().items()}
    linears = {n: m for n, m in net.named_modules() if isinstance(m, nn.Linear)}
    hidden = torch.randn(4, cfg.hidden_size).to(net.norm.dtype)
    want = net.compute_logits(hidden)
    net.process_weights_after_loading()
    assert not any(isinstance(m, nn.Linear) for m in net.modules())
    assert len(linears) == 4 * cfg.num_hidden_layers
    for name, old in linears.items():  # each swapped layer computes what the nn.Linear did
        for rows in (1, 5):
            x = torch.randn(rows, old.in_features).to(old.weight.dtype)
            torch.testing.assert_close(net.get_submodule(name)(x), old(x), rtol=tol, atol=tol)
    torch.testing.assert_close(net.compute_logits(hidden), want, rtol=tol, atol=tol)
    after = net.state_dict()
    assert set(after) == set(dense) and all(torch.equal(after[k], dense[k]) for k in dense)


def test_loading_weights_into_a_packed_model_is_refused(tmp_path):
    from nanoserve.model.loader import load_weights, save_hf_checkpoint
    net, _, _ = load_model("preset:tiny", "cpu", "float32")
    save_hf_checkpoint(net, str(tmp_path))
    net.process_weights_after_loading()
    with pytest.raises(ValueError, match="process_weights_after_loading"):
        load_weights(net, str(tmp_path))


def _gemv_available() -> bool:
    from nanoserve.kernels import kernel_backend
    return kernel_backend("cpu") == "cpu"


needs_gemv = pytest.mark.skipif(not _gemv_available(), reason="the C++ CPU ops are not built here")


@needs_gemv
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("rows", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("out_features", [1, 80, 1000])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("in_features", [96, 192])
def test_gemv_matches_an_fp32_product(dtype, tol, rows, out_features, bias, in_features):
    """y = x W^T + b summed in fp32 and rounded once; output rows split over threads (1000 rows).
    bf16 rows of a multiple of 64 values take vdpbf16ps where the CPU has it, others the widening."""
    torch.manual_seed(rows)
    w = torch.randn(out_features, in_features).to(dtype)
    b = torch.randn(out_features).to(dtype) if bias else None
    x = torch.randn(rows, in_features).to(dtype)
    y = torch.full((rows, out_features), float("nan"), dtype=dtype)
    torch.ops.nanoserve_cpu.gemv(y, x, w, b)
    want = F.linear(x.float(), w.float(), None if b is None else b.float())
    torch.testing.assert_close(y, want.to(dtype), rtol=tol, atol=tol)


@needs_gemv
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_gemv_row_does_not_depend_on_the_rows_beside_it(dtype):
    """Row i of an M-row call equals the same row run alone, bit for bit, for every M up to
    GEMV_ROWS and with tiles of weight rows (2048 inputs: 8 weight rows a tile in fp32, so 1000
    rows are many tiles): what makes a speculative verify row equal a one-row decode step."""
    torch.manual_seed(0)
    w = torch.randn(1000, 2048).to(dtype)
    b = torch.randn(1000).to(dtype)
    x = torch.randn(cpu_gemm.GEMV_ROWS, 2048).to(dtype)
    alone = torch.empty(cpu_gemm.GEMV_ROWS, 1000, dtype=dtype)
    for i in range(cpu_gemm.GEMV_ROWS):
        torch.ops.nanoserve_cpu.gemv(alone[i:i + 1], x[i:i + 1].contiguous(), w, b)
    for m in range(2, cpu_gemm.GEMV_ROWS + 1):
        y = torch.empty(m, 1000, dtype=dtype)
        torch.ops.nanoserve_cpu.gemv(y, x[:m].contiguous(), w, b)
        assert torch.equal(y, alone[:m]), f"{m} rows: row {(y != alone[:m]).any(1).nonzero()[0].item()}"


@needs_gemv
def test_packed_linear_runs_up_to_gemv_rows_in_the_gemv(monkeypatch):
    m = nn.Linear(64, 40)
    packed = cpu_gemm.PackedLinear.from_linear(m)
    assert packed.gemv and packed.dense is not None
    calls = []
    real = torch.ops.nanoserve_cpu.gemv
    monkeypatch.setattr(torch.ops.nanoserve_cpu, "gemv", lambda *a: calls.append(a[1].shape) or real(*a))
    for rows in (1, 2, 5, cpu_gemm.GEMV_ROWS, cpu_gemm.GEMV_ROWS + 1):
        x = torch.randn(rows, 64)
        torch.testing.assert_close(packed(x), F.linear(x, m.weight, m.bias), rtol=1e-5, atol=1e-5)
    assert calls == [(1, 64), (2, 64), (5, 64), (cpu_gemm.GEMV_ROWS, 64)]  # one more: oneDNN
    assert packed(torch.randn(1, 1, 64)).shape == (1, 1, 40)


@needs_gemv
def test_without_room_for_dense_copies_rows_go_to_onednn():
    m = nn.Linear(64, 40)
    packed = cpu_gemm.PackedLinear.from_linear(m, keep_dense=False)
    assert not packed.gemv and packed.dense is None
    x = torch.randn(1, 64)
    torch.testing.assert_close(packed(x), F.linear(x, m.weight, m.bias), rtol=1e-5, atol=1e-5)
    assert cpu_gemm.room_for_dense(2**20) and not cpu_gemm.room_for_dense(2**50)


def test_gemv_needs_whole_32_value_rows_and_the_cpu_backend(monkeypatch):
    assert not cpu_gemm.PackedLinear(torch.randn(8, 48), None).gemv  # 48 inputs: oneDNN only
    monkeypatch.setenv("NANOSERVE_KERNELS", "reference")
    assert not cpu_gemm.PackedLinear(torch.randn(8, 64), None).gemv


@needs_gemv
def test_the_gemv_refuses_what_it_cannot_take():
    w, y = torch.randn(8, 64), torch.empty(3, 8)
    with pytest.raises(RuntimeError, match="rows >= 1"):
        torch.ops.nanoserve_cpu.gemv(y[:0], torch.randn(0, 64), w, None)
    with pytest.raises(RuntimeError, match="y must be"):
        torch.ops.nanoserve_cpu.gemv(y[:2], torch.randn(3, 64), w, None)
    with pytest.raises(RuntimeError, match="in % 32"):  # 48 inputs
        torch.ops.nanoserve_cpu.gemv(y[:1], torch.randn(1, 48), torch.randn(8, 48), None)
    with pytest.raises(RuntimeError, match="in x's dtype"):
        torch.ops.nanoserve_cpu.gemv(y[:1], torch.randn(1, 64), w.bfloat16(), None)
    with pytest.raises(RuntimeError, match="bias"):
        torch.ops.nanoserve_cpu.gemv(y[:1], torch.randn(1, 64), w, torch.randn(9))
