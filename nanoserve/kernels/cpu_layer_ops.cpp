// A decoder layer's small ops on a CPU: RMSNorm (with the residual add fused), RoPE, and the
// write of new K/V into the paged cache. In kernels/reference.py each is a handful of torch ops,
// and at decode sizes (a row of 768 values) each torch op costs more in dispatch than in
// arithmetic; here each is one call and one pass over its rows. The arithmetic and its rounding
// follow the reference (which follows HF), but the compiler may fuse a multiply and an add into
// one rounding, so fp32 results can differ from the reference's in the last bit.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>

namespace {

// A second thread only takes 64K values or more: for less, waking it costs more than it saves
// (a decode step's rows go to one thread, a prefill's are split).
constexpr int64_t kMinValuesPerThread = 1 << 16;

// RMSNorm in HF's order of rounding: h = x + residual rounded to the dtype; the mean of squares
// and the scaling in fp32; a cast to the dtype; then the weight, rounded again.
template <typename T>
void rms_norm_impl(const at::Tensor& out, const at::Tensor& x, const at::Tensor& weight, double eps,
                   const std::optional<at::Tensor>& residual, const std::optional<at::Tensor>& h) {
  // x, out, residual, h: (rows, hidden) contiguous; weight: (hidden,)
  const int64_t hidden = x.size(-1), rows = x.numel() / hidden;
  const T* xp = static_cast<const T*>(x.const_data_ptr());
  const T* wp = static_cast<const T*>(weight.const_data_ptr());
  const T* rp = residual ? static_cast<const T*>(residual->const_data_ptr()) : nullptr;
  T* hp = h ? static_cast<T*>(h->data_ptr()) : nullptr;
  T* op = static_cast<T*>(out.data_ptr());
  const int64_t grain = std::max<int64_t>(1, kMinValuesPerThread / hidden);  // rows
  at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* xr = xp + r * hidden;
      if (rp) {  // h = x + residual, in the dtype, as the decoder layer's residual stream
        T* hr = hp + r * hidden;
        const T* rr = rp + r * hidden;
        for (int64_t i = 0; i < hidden; ++i)
          hr[i] = static_cast<T>(static_cast<float>(xr[i]) + static_cast<float>(rr[i]));
        xr = hr;
      }
      float ss = 0.f;
#pragma omp simd reduction(+ : ss)
      for (int64_t i = 0; i < hidden; ++i) ss += static_cast<float>(xr[i]) * static_cast<float>(xr[i]);
      const float inv = 1.f / std::sqrt(ss / static_cast<float>(hidden) + static_cast<float>(eps));
      T* o = op + r * hidden;
      for (int64_t i = 0; i < hidden; ++i) {
        const T normed = static_cast<T>(static_cast<float>(xr[i]) * inv);  // rounded, then the weight
        o[i] = static_cast<T>(static_cast<float>(normed) * static_cast<float>(wp[i]));
      }
    }
  });
}

void rms_norm(const at::Tensor& out, const at::Tensor& x, const at::Tensor& weight, double eps,
              const std::optional<at::Tensor>& residual, const std::optional<at::Tensor>& h) {
  TORCH_CHECK(x.device().is_cpu() && x.is_contiguous() && x.dim() >= 1 && x.numel() > 0,
              "rms_norm: x must be a non-empty contiguous CPU tensor");
  TORCH_CHECK(out.is_contiguous() && out.sizes() == x.sizes() && out.scalar_type() == x.scalar_type(),
              "rms_norm: out must be a contiguous tensor like x");
  TORCH_CHECK(weight.is_contiguous() && weight.dim() == 1 && weight.size(0) == x.size(-1) &&
              weight.scalar_type() == x.scalar_type(), "rms_norm: weight must be (hidden,) in x's dtype");
  TORCH_CHECK(residual.has_value() == h.has_value(), "rms_norm: residual and h come together");
  for (const auto* t : {&residual, &h})
    TORCH_CHECK(!t->has_value() || ((*t)->is_contiguous() && (*t)->sizes() == x.sizes() &&
                                    (*t)->scalar_type() == x.scalar_type()),
                "rms_norm: residual and h must be contiguous tensors like x");
  switch (x.scalar_type()) {
    case at::kFloat: return rms_norm_impl<float>(out, x, weight, eps, residual, h);
    case at::kBFloat16: return rms_norm_impl<c10::BFloat16>(out, x, weight, eps, residual, h);
    case at::kHalf: return rms_norm_impl<c10::Half>(out, x, weight, eps, residual, h);
    default: TORCH_CHECK(false, "rms_norm: unsupported dtype ", x.scalar_type());
  }
}

// RoPE in place, neox/Llama layout (a head's two halves rotate as pairs), in fp32, rounded once.
template <typename T>
void rope_impl(const int64_t* pos, const at::Tensor& x, const float* cos_sin, int64_t tokens) {
  // x: (T, heads, hd) with contiguous heads, rows x.stride(0) apart; cos_sin: (max_pos, hd) [cos | sin]
  const int64_t heads = x.size(1), hd = x.size(2), half = hd / 2, row = x.stride(0);
  T* xp = static_cast<T*>(x.data_ptr());
  const int64_t grain = std::max<int64_t>(1, kMinValuesPerThread / (heads * hd));  // tokens
  at::parallel_for(0, tokens, grain, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float* c = cos_sin + pos[t] * hd;
      const float* s = c + half;
      for (int64_t h = 0; h < heads; ++h) {
        T* x1 = xp + t * row + h * hd;
        T* x2 = x1 + half;
        for (int64_t i = 0; i < half; ++i) {
          const float a = static_cast<float>(x1[i]), b = static_cast<float>(x2[i]);
          x1[i] = static_cast<T>(a * c[i] - b * s[i]);
          x2[i] = static_cast<T>(b * c[i] + a * s[i]);
        }
      }
    }
  });
}

void rotary_embedding(const at::Tensor& positions, const at::Tensor& q, const at::Tensor& k,
                      const at::Tensor& cos_sin_cache) {
  TORCH_CHECK(positions.scalar_type() == at::kLong && positions.is_contiguous() && positions.dim() == 1,
              "rotary_embedding: positions must be (T,) int64");
  TORCH_CHECK(positions.device().is_cpu() && q.device().is_cpu() && k.device().is_cpu() &&
              cos_sin_cache.device().is_cpu(), "rotary_embedding: CPU tensors only");
  TORCH_CHECK(cos_sin_cache.scalar_type() == at::kFloat && cos_sin_cache.is_contiguous() &&
              cos_sin_cache.dim() == 2 && cos_sin_cache.size(1) == q.size(2),
              "rotary_embedding: cos_sin_cache must be (max_pos, head_dim) fp32");
  const int64_t* pos = positions.const_data_ptr<int64_t>();
  const int64_t tokens = positions.size(0), max_pos = cos_sin_cache.size(0);
  for (int64_t t = 0; t < tokens; ++t)
    TORCH_CHECK(pos[t] >= 0 && pos[t] < max_pos,
                "rotary_embedding: position ", pos[t], " outside [0, ", max_pos, ")");
  for (const at::Tensor* x : {&q, &k}) {
    TORCH_CHECK(x->dim() == 3 && x->size(0) == tokens && x->size(2) == q.size(2) && x->size(2) % 2 == 0 &&
                x->stride(2) == 1 && x->stride(1) == x->size(2) && x->scalar_type() == q.scalar_type(),
                "rotary_embedding: q and k must be (T, heads, head_dim) with contiguous heads, one dtype");
    switch (x->scalar_type()) {
      case at::kFloat: rope_impl<float>(pos, *x, cos_sin_cache.const_data_ptr<float>(), tokens); break;
      case at::kBFloat16: rope_impl<c10::BFloat16>(pos, *x, cos_sin_cache.const_data_ptr<float>(), tokens); break;
      case at::kHalf: rope_impl<c10::Half>(pos, *x, cos_sin_cache.const_data_ptr<float>(), tokens); break;
      default: TORCH_CHECK(false, "rotary_embedding: unsupported dtype ", x->scalar_type());
    }
  }
}

// This step's K/V rows into their cache slots (vLLM's name): a row copy per token and tensor.
void reshape_and_cache(const at::Tensor& k, const at::Tensor& v, const at::Tensor& k_cache,
                       const at::Tensor& v_cache, const at::Tensor& slot_mapping) {
  TORCH_CHECK(slot_mapping.scalar_type() == at::kLong && slot_mapping.is_contiguous() && slot_mapping.dim() == 1,
              "reshape_and_cache: slot_mapping must be (T,) int64");
  TORCH_CHECK(slot_mapping.device().is_cpu() && k.device().is_cpu() && v.device().is_cpu() &&
              k_cache.device().is_cpu() && v_cache.device().is_cpu(), "reshape_and_cache: CPU tensors only");
  const int64_t tokens = slot_mapping.size(0);
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous() && k_cache.sizes() == v_cache.sizes() &&
              k_cache.dim() == 4 && k_cache.scalar_type() == v_cache.scalar_type(),
              "reshape_and_cache: caches must be contiguous (num_blocks, block_size, kv_heads, head_dim)");
  const int64_t width = k_cache.size(2) * k_cache.size(3), slots = k_cache.size(0) * k_cache.size(1);
  for (const at::Tensor* x : {&k, &v})
    TORCH_CHECK(x->dim() == 3 && x->size(0) == tokens && x->size(1) * x->size(2) == width &&
                x->stride(2) == 1 && x->stride(1) == x->size(2) && x->scalar_type() == k_cache.scalar_type(),
                "reshape_and_cache: k and v must be (T, kv_heads, head_dim) rows in the cache's dtype");
  const int64_t* slot = slot_mapping.const_data_ptr<int64_t>();
  for (int64_t t = 0; t < tokens; ++t)
    TORCH_CHECK(slot[t] >= -1 && slot[t] < slots,
                "reshape_and_cache: slot ", slot[t], " outside [-1, ", slots, ")");
  const int64_t bytes = width * k.element_size();
  const char* kp = static_cast<const char*>(k.const_data_ptr());
  const char* vp = static_cast<const char*>(v.const_data_ptr());
  char* kc = static_cast<char*>(k_cache.data_ptr());
  char* vc = static_cast<char*>(v_cache.data_ptr());
  for (int64_t t = 0; t < tokens; ++t) {
    if (slot[t] < 0) continue;  // -1: a token whose K/V is not kept (a prefix-cache hit's)
    std::memcpy(kc + slot[t] * bytes, kp + t * k.stride(0) * k.element_size(), bytes);
    std::memcpy(vc + slot[t] * bytes, vp + t * v.stride(0) * v.element_size(), bytes);
  }
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(nanoserve_cpu, m) {
  m.def("rms_norm(Tensor(a!) out, Tensor x, Tensor weight, float eps, Tensor? residual, "
        "Tensor(b!)? h) -> ()", &rms_norm);
  m.def("rotary_embedding(Tensor positions, Tensor(a!) q, Tensor(b!) k, Tensor cos_sin_cache) -> ()",
        &rotary_embedding);
  m.def("reshape_and_cache(Tensor k, Tensor v, Tensor(a!) k_cache, Tensor(b!) v_cache, "
        "Tensor slot_mapping) -> ()", &reshape_and_cache);
}
