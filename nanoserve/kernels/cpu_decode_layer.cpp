// A decode step's decoder layers of a few tokens in one call: the same C++ ops, in the same order
// and on the same shapes, that model/llama.py's DecoderLayer calls one by one from Python.
//
// At batch 1 a layer is some fifteen small op calls (two norms, four linears, rotary, the cache
// write, attention, the activation), and on a CPU the Python between them (module calls, the
// kernels' wrappers, dispatch) costs about as much as a thin layer's weight read
// (benchmarks/batch1_host_work.py). Here the calls go from C++ through torch's dispatcher, every
// layer in turn: the arithmetic is the ops' own, so the output equals the op-by-op path's bit for
// bit (cpu_decode_layer.py says which layers and steps take it). Attention takes every token as a
// row of its own, with its sequence's block table and its causal length, as cpu_attention.py gives
// a speculative verify's rows to the decode op.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <optional>
#include <tuple>
#include <vector>

namespace {

using OptTensor = std::optional<at::Tensor>;

template <typename Sig>
c10::TypedOperatorHandle<Sig> op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Sig>();
}

struct Ops {
  c10::TypedOperatorHandle<void(const at::Tensor&, const at::Tensor&, const at::Tensor&, const OptTensor&)> gemv =
      op<void(const at::Tensor&, const at::Tensor&, const at::Tensor&, const OptTensor&)>("nanoserve_cpu::gemv");
  c10::TypedOperatorHandle<void(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                const OptTensor&)>
      quant_gemv = op<void(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                           const OptTensor&)>("nanoserve_cpu::quant_gemv");
  c10::TypedOperatorHandle<void(const at::Tensor&, const at::Tensor&, const at::Tensor&, double, const OptTensor&,
                                const OptTensor&)>
      rms_norm = op<void(const at::Tensor&, const at::Tensor&, const at::Tensor&, double, const OptTensor&,
                         const OptTensor&)>("nanoserve_cpu::rms_norm");
  c10::TypedOperatorHandle<void(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&)> rope =
      op<void(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&)>(
          "nanoserve_cpu::rotary_embedding");
  c10::TypedOperatorHandle<void(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                const at::Tensor&, double, double)>
      cache = op<void(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                      const at::Tensor&, double, double)>("nanoserve_cpu::reshape_and_cache");
  c10::TypedOperatorHandle<void(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                const at::Tensor&, const at::Tensor&, double, double, double)>
      attention = op<void(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                          const at::Tensor&, const at::Tensor&, double, double, double)>(
          "nanoserve_cpu::decode_attention");
  c10::TypedOperatorHandle<void(const at::Tensor&, const at::Tensor&)> silu_and_mul =
      op<void(const at::Tensor&, const at::Tensor&)>("nanoserve_cpu::silu_and_mul");
};

const Ops& ops() {
  static const Ops handles;  // looked up once, after every op of the library is registered
  return handles;
}

// A linear as cpu_gemm.py / cpu_quant_gemm.py run it for a few rows, into y: [weight] or [weight, bias]
// for the float GEMV; [codes, scales] or [codes, scales, bias] for the GEMV over 8-bit codes
// (scales fp32, a column per group).
void linear(const at::Tensor& y, const at::Tensor& x, const std::vector<at::Tensor>& w) {
  const bool codes = w.at(0).scalar_type() == at::kChar || w[0].scalar_type() == at::kFloat8_e4m3fn;
  const size_t n = codes ? 2 : 1;
  TORCH_CHECK(w.size() == n || w.size() == n + 1, "decode_layers: a linear is [weight(, bias)] or "
              "[codes, scales(, bias)], got ", w.size(), " tensors");
  const OptTensor bias = w.size() > n ? OptTensor(w[n]) : std::nullopt;
  if (codes)
    ops().quant_gemv.call(y, x, w[0], w[1], bias);
  else
    ops().gemv.call(y, x, w[0], bias);
}

// The activations a layer writes, allocated once a call and reused by every layer: at a few rows
// a step's hundreds of allocations cost about as much as its small ops (a model's layers share
// their shapes; `sized` allocates again where one does not). One call's only: it returns two of
// them to the caller, so a Work kept across calls would overwrite what the caller still holds.
struct Work {
  at::Tensor h, streams[2], qkv, o, attn_out, h2, gate_up, act, out;
};

const at::Tensor& sized(at::Tensor& buf, const at::Tensor& like, int64_t cols) {
  if (!buf.defined() || buf.size(0) != like.size(0) || buf.size(1) != cols)
    buf = at::empty({like.size(0), cols}, like.options());
  return buf;
}

// One layer, x (T, hidden) -> its output in work.out, and the residual stream in work.streams[0]
// (read from `residual`, which is work.streams[0] or, in the first layer, nothing).
void decode_layer(
    Work& work, const at::Tensor& x, const OptTensor& residual, const at::Tensor& input_norm,
    const at::Tensor& post_norm, double eps, const std::vector<at::Tensor>& qkv_proj,
    const std::vector<at::Tensor>& o_proj, const std::vector<at::Tensor>& gate_up_proj,
    const std::vector<at::Tensor>& down_proj, int64_t num_heads, int64_t num_kv_heads, const at::Tensor& positions,
    const at::Tensor& cos_sin_cache, const at::Tensor& k_cache, const at::Tensor& v_cache,
    const at::Tensor& slot_mapping, const at::Tensor& row_tables, const at::Tensor& row_lens, double scale,
    double k_scale, double v_scale) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), "decode_layers: x must be (T, hidden) contiguous");
  const int64_t T = x.size(0), hidden = x.size(1), hd = k_cache.size(3);
  const int64_t q_size = num_heads * hd, kv_size = num_kv_heads * hd;
  // the input norm: the first layer keeps x as the residual stream, later ones add it in
  const at::Tensor& h = sized(work.h, x, hidden);
  at::Tensor stream = x;
  if (residual) {
    stream = sized(work.streams[1], x, hidden);
    ops().rms_norm.call(h, x, input_norm, eps, residual, stream);
  } else {
    ops().rms_norm.call(h, x, input_norm, eps, std::nullopt, std::nullopt);
  }
  // attention: views into the fused qkv output, rotated and cached in place
  const at::Tensor& qkv = sized(work.qkv, x, qkv_proj.at(0).size(0));
  linear(qkv, h, qkv_proj);
  const at::Tensor q = qkv.narrow(1, 0, q_size).view({T, num_heads, hd});
  const at::Tensor k = qkv.narrow(1, q_size, kv_size).view({T, num_kv_heads, hd});
  const at::Tensor v = qkv.narrow(1, q_size + kv_size, kv_size).view({T, num_kv_heads, hd});
  ops().rope.call(positions, q, k, cos_sin_cache);
  ops().cache.call(k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale);
  const at::Tensor& o = sized(work.o, x, q_size);
  ops().attention.call(q, o.view({T, num_heads, hd}), k_cache, v_cache, row_tables, row_lens, scale, k_scale,
                       v_scale);
  const at::Tensor& attn_out = sized(work.attn_out, x, hidden);
  linear(attn_out, o, o_proj);
  // the post-attention norm adds the residual stream into the other stream buffer (the one the
  // input norm read, spent by now); then the MLP
  const at::Tensor& h2 = sized(work.h2, x, hidden);
  ops().rms_norm.call(h2, attn_out, post_norm, eps, stream, sized(work.streams[0], x, hidden));
  const at::Tensor& gate_up = sized(work.gate_up, x, gate_up_proj.at(0).size(0));
  linear(gate_up, h2, gate_up_proj);
  const at::Tensor& act = sized(work.act, x, gate_up.size(1) / 2);
  ops().silu_and_mul.call(act, gate_up);
  linear(sized(work.out, x, hidden), act, down_proj);  // x, the last layer's out, is spent by now
}

// Every layer in turn, the first with no residual stream yet: `norms` holds each layer's two norms,
// `linears` each layer's four linears' tensors one after another, `arity[i]` how many the i-th has.
// eps, the head counts and the attention scale are one for all: a model's layers share one config.
std::tuple<at::Tensor, at::Tensor> decode_layers(
    const at::Tensor& x, const std::vector<at::Tensor>& norms, double eps, const std::vector<at::Tensor>& linears,
    const std::vector<int64_t>& arity, int64_t num_heads, int64_t num_kv_heads, const at::Tensor& positions,
    const at::Tensor& cos_sin_cache, const std::vector<at::Tensor>& k_caches, const std::vector<at::Tensor>& v_caches,
    const at::Tensor& slot_mapping, const at::Tensor& row_tables, const at::Tensor& row_lens, double scale,
    const std::vector<double>& k_scales, const std::vector<double>& v_scales) {
  const size_t L = k_caches.size();
  TORCH_CHECK(L > 0 && norms.size() == 2 * L && arity.size() == 4 * L && v_caches.size() == L &&
                  k_scales.size() == L && v_scales.size() == L,
              "decode_layers: each layer needs two norms, four linears, a K and a V cache and their scales");
  Work work;
  size_t next = 0;
  std::vector<at::Tensor> w[4];
  for (size_t l = 0; l < L; ++l) {
    for (int j = 0; j < 4; ++j) {
      const int64_t n = arity[4 * l + j];
      TORCH_CHECK(n >= 1 && n <= 3 && next + n <= linears.size(), "decode_layers: linear ", 4 * l + j,
                  " has arity ", n, " (1 to 3 tensors) with ", linears.size() - next, " tensors left");
      w[j].assign(linears.begin() + next, linears.begin() + next + n);
      next += n;
    }
    decode_layer(work, l == 0 ? x : work.out, l == 0 ? OptTensor() : OptTensor(work.streams[0]), norms[2 * l],
                 norms[2 * l + 1], eps, w[0], w[1], w[2], w[3], num_heads, num_kv_heads, positions, cos_sin_cache,
                 k_caches[l], v_caches[l], slot_mapping, row_tables, row_lens, scale, k_scales[l], v_scales[l]);
  }
  TORCH_CHECK(next == linears.size(), "decode_layers: more linear tensors than arity says");
  return {work.out, work.streams[0]};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(nanoserve_cpu, m) {
  m.def("decode_layers(Tensor x, Tensor[] norms, float eps, Tensor[] linears, int[] arity, int num_heads, "
        "int num_kv_heads, Tensor positions, Tensor cos_sin_cache, Tensor(a!)[] k_caches, Tensor(b!)[] v_caches, "
        "Tensor slot_mapping, Tensor row_tables, Tensor row_lens, float scale, float[] k_scales, float[] v_scales) "
        "-> (Tensor, Tensor)",
        &decode_layers);
}
