"""The Triton attention kernels, the cache write and the quantized linears' GEMV and dequantize
compile for a GPU target (sm_90) on a machine without one, over float and fp8 (e4m3) caches and
int8 and e4m3 codes.

The interpreter runs kernels as Python, so it cannot catch what only the compiler rejects (types
of loop-carried values, tile shapes, shared memory). Triton compiles to PTX and cubin without a
driver, so this runs anywhere triton is installed; in a fresh process, since the interpreter is
chosen at import."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = r'''
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from nanoserve.kernels import triton_attention, triton_ops, triton_prefill, triton_quant_linear

target = GPUTarget("cuda", 90, 32)
ints = ["stride_qt", "stride_qh", "stride_ot", "stride_oh", "stride_cb", "stride_cs", "stride_ch",
        "stride_bt", "block_size"]
# (model dtype, native tiles, dot precision, cache dtype): fp8e4nv is an fp8 KV cache (e4m3)
cases = [("bf16", True, "tf32", "bf16"), ("fp16", True, "tf32", "fp16"), ("fp32", False, "ieee", "fp32"),
         ("bf16", True, "tf32", "fp8e4nv"), ("fp32", False, "ieee", "fp8e4nv")]
for dtype, native, precision, cache in cases:
    fp8 = cache == "fp8e4nv"
    ptrs = {"q_ptr": "*" + dtype, "k_cache_ptr": "*" + cache, "v_cache_ptr": "*" + cache,
            "out_ptr": "*" + dtype}
    for head_dim, group, warps in [(64, 7, 4)] + ([] if fp8 else [(128, 4, 8)]):
        consts = dict(HEAD_DIM=head_dim, GROUP=group, BLOCK_M=64, BLOCK_N=64, BLOCK_D=head_dim,
                      NATIVE=native, FP8=fp8, DOT_PRECISION=precision)
        sig = {**ptrs, "block_tables_ptr": "*i32", "query_start_loc_ptr": "*i32", "seq_lens_ptr": "*i32",
               "num_seqs": "i32", "qk_scale": "fp32", "k_scale": "fp32", "v_scale": "fp32",
               **{n: "i32" for n in ints}, **{k: "constexpr" for k in consts}}
        src = ASTSource(fn=triton_prefill._flash_prefill_kernel, signature=sig, constexprs=consts)
        triton.compile(src, target=target, options=dict(num_warps=warps, num_stages=2))
        consts = dict(HEAD_DIM=head_dim, GROUP=group, GROUP_PAD=8 if group > 4 else 4, BLOCK_Q=2,
                      BLOCK_D=head_dim, BLOCK_N=32, DOT_PRECISION=precision)
        sig = {**ptrs, "block_tables_ptr": "*i32", "query_start_loc_ptr": "*i32", "seq_lens_ptr": "*i32",
               "scale": "fp32", "k_scale": "fp32", "v_scale": "fp32", **{n: "i32" for n in ints},
               **{k: "constexpr" for k in consts}}
        src = ASTSource(fn=triton_attention._paged_attention_kernel, signature=sig, constexprs=consts)
        triton.compile(src, target=target, options=dict(num_warps=4))
    consts = dict(BLOCK_H=4, BLOCK_D=64, FP8=fp8)
    sig = {"k_ptr": "*" + dtype, "v_ptr": "*" + dtype, "k_cache_ptr": "*" + cache,
           "v_cache_ptr": "*" + cache, "slot_mapping_ptr": "*i64",
           **{n: "i32" for n in ["stride_kt", "stride_kh", "stride_vt", "stride_vh", "stride_cb",
                                 "stride_cs", "stride_ch", "block_size", "num_kv_heads", "head_dim"]},
           "k_scale": "fp32", "v_scale": "fp32", "FP8_MAX": "fp32", **{k: "constexpr" for k in consts}}
    src = ASTSource(fn=triton_ops._reshape_and_cache_kernel, signature=sig, constexprs=consts)
    triton.compile(src, target=target, options=dict(num_warps=4))
# the quantized linears' GEMV and dequantize, over int8 and e4m3 codes
for code in ("i8", "fp8e4nv"):
    for rows, one_group in [(1, True), (2, False), (16, True)]:
        consts = dict(BLOCK_M=rows, BLOCK_N=16, BLOCK_K=512 if one_group else 32, ONE_GROUP=one_group)
        sig = {"x_ptr": "*bf16", "q_ptr": "*" + code, "s_ptr": "*fp32", "y_ptr": "*fp32",
               **{n: "i32" for n in ["M", "N", "K", "k_per_split", "groups", "group_size", "stride_xm",
                                     "stride_qn", "stride_yk", "stride_ym"]},
               **{k: "constexpr" for k in consts}}
        src = ASTSource(fn=triton_quant_linear._w8a16_gemv_kernel, signature=sig, constexprs=consts)
        triton.compile(src, target=target, options=dict(num_warps=4))
    consts = dict(BLOCK_N=16, BLOCK_K=256)
    sig = {"q_ptr": "*" + code, "s_ptr": "*fp32", "w_ptr": "*bf16",
           **{n: "i32" for n in ["N", "K", "groups", "group_size"]}, **{k: "constexpr" for k in consts}}
    src = ASTSource(fn=triton_quant_linear._dequantize_kernel, signature=sig, constexprs=consts)
    triton.compile(src, target=target, options=dict(num_warps=4))
print("compiled")
'''


@pytest.mark.slow
def test_attention_kernels_compile_for_sm90():
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed (pip has it for Linux only)")
    import torch
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the other kernel tests compile and run the kernels on it")
    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")])
    run = subprocess.run([sys.executable, "-c", SCRIPT], cwd=root, env=env, capture_output=True,
                         text=True, timeout=300)
    if run.returncode and "ptxas" in run.stderr and "not found" in run.stderr.lower():
        pytest.skip("this triton has no ptxas to compile with")
    assert run.returncode == 0 and "compiled" in run.stdout, run.stderr[-3000:]
