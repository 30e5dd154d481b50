// A decoder layer's small ops on a CPU: RMSNorm (with the residual add fused), RoPE, the write
// of new K/V into the paged cache, and the MLP's SiLU-and-multiply. In kernels/reference.py each
// is one to six torch ops, and at decode sizes (a row of 768 values) each torch op costs more in
// dispatch than in arithmetic; here each is one call and one pass over its rows. The arithmetic
// and its rounding follow the reference (which follows HF), but the compiler may fuse a multiply
// and an add into one rounding, so fp32 results can differ from the reference's in the last bit.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Float8_e4m3fn.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <type_traits>

#include "cpu_common.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace {

// A second thread only takes 16K values or more: for less, waking it costs more than it saves
// (a batch-1 decode's rows go to one thread). Inside a decode step a batch's rows are cold in
// cache (the attention and the weights stream between two norms), and two threads fetch them
// faster (the norm part of benchmarks/cpu_step_profile.py).
constexpr int64_t kMinValuesPerThread = 1 << 14;

// Sixteen floats as one value: AVX-512 where the CPU has it, two AVX2 (or four SSE/NEON) halves
// elsewhere. RMSNorm and the SiLU go along their rows sixteen values at a time (the SiLU's
// exp and divide are most of its time, and a wider vector halves their count).
typedef float vf16 __attribute__((vector_size(64)));
typedef uint32_t vu16 __attribute__((vector_size(64)));
typedef uint16_t vh16 __attribute__((vector_size(32)));

// bf16 is fp32's top half: sixteen of them widened, exactly. GCC lowers the generic conversions
// to 256-bit halves and a two-source permute, so AVX-512 gets its one-instruction forms.
inline vf16 widen_bf16(vh16 h) {
#if defined(__AVX512F__)
  return (vf16)_mm512_slli_epi32(_mm512_cvtepu16_epi32((__m256i)h), 16);
#else
  return nanoserve::load_bf16<vf16, vh16, vu16>(reinterpret_cast<const c10::BFloat16*>(&h));
#endif
}

// v rounded to bf16 (cpu_common.h's bf16_rounded_bits)
inline vh16 bf16_bits(vf16 v) {
  vu16 u;
  std::memcpy(&u, &v, sizeof u);
  u = nanoserve::bf16_rounded_bits(u);
#if defined(__AVX512F__)
  return (vh16)_mm512_cvtepi32_epi16((__m512i)u);
#else
  return __builtin_convertvector(u, vh16);
#endif
}

// v rounded to bf16 as c10::BFloat16 rounds. AVX512-BF16 has an instruction for it,
// vcvtneps2bf16, with a third of the bit arithmetic's work, but it reads an fp32 denormal as zero:
// a vector holding one (vfpclassps, class 0x20) takes the bits.
inline vh16 to_bf16(vf16 v) {
#if defined(__AVX512BF16__)
  if (__builtin_expect(!_mm512_fpclass_ps_mask((__m512)v, 0x20), 1))
    return (vh16)_mm512_cvtneps_pbh((__m512)v);
#endif
  return bf16_bits(v);
}

// Sixteen values of a T row as fp32, and back rounded to nearest even
template <typename T>
inline vf16 load16(const T* p) {
  vf16 v;
  for (int k = 0; k < 16; ++k) v[k] = static_cast<float>(p[k]);
  return v;
}

template <typename T>
inline void store16(T* p, vf16 v) {
  for (int k = 0; k < 16; ++k) p[k] = static_cast<T>(v[k]);
}

template <>
inline vf16 load16(const float* p) {
  vf16 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

template <>
inline void store16(float* p, vf16 v) { std::memcpy(p, &v, sizeof v); }

template <>
inline vf16 load16(const c10::BFloat16* p) {
  vh16 h;
  std::memcpy(&h, p, sizeof h);
  return widen_bf16(h);
}

template <>
inline void store16(c10::BFloat16* p, vf16 v) {
  const vh16 h = to_bf16(v);
  std::memcpy(p, &h, sizeof h);
}

// v as a T holds it: rounded to T, back in fp32
template <typename T>
inline vf16 rounded(vf16 v) {
  T t[16];
  store16(t, v);
  return load16(static_cast<const T*>(t));
}

template <>
inline vf16 rounded<float>(vf16 v) { return v; }

template <>
inline vf16 rounded<c10::BFloat16>(vf16 v) { return widen_bf16(to_bf16(v)); }

// RMSNorm in HF's order of rounding: h = x + residual rounded to the dtype; the mean of squares
// and the scaling in fp32; a cast to the dtype; then the weight, rounded again. Sixteen values at
// a time, a row's tail (hidden not a multiple of 16) one at a time.
template <typename T>
void rms_norm_row(const T* x, const T* res, T* h, const T* w, T* o, int64_t hidden, float eps) {
  const int64_t body = hidden / 16 * 16;
  vf16 ss16 = {};
  float ss = 0.f;
  if (res) {  // h = x + residual, in the dtype, as the decoder layer's residual stream
    for (int64_t i = 0; i < body; i += 16) {
      store16(h + i, load16(x + i) + load16(res + i));
      const vf16 s = load16(h + i);  // as rounded, read back
      ss16 += s * s;
    }
    for (int64_t i = body; i < hidden; ++i)
      h[i] = static_cast<T>(static_cast<float>(x[i]) + static_cast<float>(res[i]));
    x = h;
  } else {
    for (int64_t i = 0; i < body; i += 16) {
      const vf16 v = load16(x + i);
      ss16 += v * v;
    }
  }
  for (int64_t i = body; i < hidden; ++i) ss += static_cast<float>(x[i]) * static_cast<float>(x[i]);
  for (int k = 0; k < 16; ++k) ss += ss16[k];
  const float inv = 1.f / std::sqrt(ss / static_cast<float>(hidden) + eps);
  for (int64_t i = 0; i < body; i += 16)  // rounded, then the weight
    store16(o + i, rounded<T>(load16(x + i) * inv) * load16(w + i));
  for (int64_t i = body; i < hidden; ++i) {
    const T normed = static_cast<T>(static_cast<float>(x[i]) * inv);
    o[i] = static_cast<T>(static_cast<float>(normed) * static_cast<float>(w[i]));
  }
}

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
    for (int64_t r = begin; r < end; ++r)
      rms_norm_row(xp + r * hidden, rp ? rp + r * hidden : nullptr, hp ? hp + r * hidden : nullptr,
                   wp, op + r * hidden, hidden, static_cast<float>(eps));
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

// An fp8 cache's row as reference.to_cache stores it: the value over the scale in fp32, clamped
// to +-448 (older c10 conversions give NaN past it; NaN passes the clamp), then e4m3 (c10's
// conversion, torch's cast: round to nearest even)
template <typename T>
void quantize_row(const T* x, c10::Float8_e4m3fn* out, int64_t width, float scale) {
  for (int64_t i = 0; i < width; ++i) {
    const float y = static_cast<float>(x[i]) / scale;
    out[i] = c10::Float8_e4m3fn(std::min(std::max(y, -448.0f), 448.0f));
  }
}

// This step's K/V rows into their cache slots (vLLM's name): a row copy per token and tensor, or
// into an fp8 cache a row quantized with the layer's k_scale / v_scale.
void reshape_and_cache(const at::Tensor& k, const at::Tensor& v, const at::Tensor& k_cache,
                       const at::Tensor& v_cache, const at::Tensor& slot_mapping, double k_scale,
                       double v_scale) {
  TORCH_CHECK(slot_mapping.scalar_type() == at::kLong && slot_mapping.is_contiguous() && slot_mapping.dim() == 1,
              "reshape_and_cache: slot_mapping must be (T,) int64");
  TORCH_CHECK(slot_mapping.device().is_cpu() && k.device().is_cpu() && v.device().is_cpu() &&
              k_cache.device().is_cpu() && v_cache.device().is_cpu(), "reshape_and_cache: CPU tensors only");
  const int64_t tokens = slot_mapping.size(0);
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous() && k_cache.sizes() == v_cache.sizes() &&
              k_cache.dim() == 4 && k_cache.scalar_type() == v_cache.scalar_type(),
              "reshape_and_cache: caches must be contiguous (num_blocks, block_size, kv_heads, head_dim)");
  const bool fp8 = k_cache.scalar_type() == at::kFloat8_e4m3fn;
  const int64_t width = k_cache.size(2) * k_cache.size(3), slots = k_cache.size(0) * k_cache.size(1);
  for (const at::Tensor* x : {&k, &v})
    TORCH_CHECK(x->dim() == 3 && x->size(0) == tokens && x->size(1) * x->size(2) == width &&
                x->stride(2) == 1 && x->stride(1) == x->size(2) && x->scalar_type() == k.scalar_type() &&
                (x->scalar_type() == k_cache.scalar_type() ||
                 (fp8 && (x->scalar_type() == at::kFloat || x->scalar_type() == at::kBFloat16 ||
                          x->scalar_type() == at::kHalf))),
                "reshape_and_cache: k and v must be (T, kv_heads, head_dim) rows in the cache's dtype, "
                "or fp32/bf16/fp16 for an fp8 cache");
  const int64_t* slot = slot_mapping.const_data_ptr<int64_t>();
  for (int64_t t = 0; t < tokens; ++t)
    TORCH_CHECK(slot[t] >= -1 && slot[t] < slots,
                "reshape_and_cache: slot ", slot[t], " outside [-1, ", slots, ")");
  const char* kp = static_cast<const char*>(k.const_data_ptr());
  const char* vp = static_cast<const char*>(v.const_data_ptr());
  char* kc = static_cast<char*>(k_cache.data_ptr());
  char* vc = static_cast<char*>(v_cache.data_ptr());
  const int64_t in_bytes = k.element_size(), row = width * k_cache.element_size();
  auto write = [&](auto tag) {
    using T = decltype(tag);
    for (int64_t t = 0; t < tokens; ++t) {
      if (slot[t] < 0) continue;  // -1: a token whose K/V is not kept (a prefix-cache hit's)
      const char* kt = kp + t * k.stride(0) * in_bytes;
      const char* vt = vp + t * v.stride(0) * in_bytes;
      if constexpr (std::is_same_v<T, void*>) {
        std::memcpy(kc + slot[t] * row, kt, row);
        std::memcpy(vc + slot[t] * row, vt, row);
      } else {
        quantize_row(reinterpret_cast<const T*>(kt), reinterpret_cast<c10::Float8_e4m3fn*>(kc + slot[t] * row),
                     width, static_cast<float>(k_scale));
        quantize_row(reinterpret_cast<const T*>(vt), reinterpret_cast<c10::Float8_e4m3fn*>(vc + slot[t] * row),
                     width, static_cast<float>(v_scale));
      }
    }
  };
  if (!fp8 || k.scalar_type() == k_cache.scalar_type())
    write(static_cast<void*>(nullptr));
  else if (k.scalar_type() == at::kFloat)
    write(float{});
  else if (k.scalar_type() == at::kBFloat16)
    write(c10::BFloat16{});
  else
    write(c10::Half{});
}

// silu(gate) * up in the reference's rounding: silu's result rounded to the dtype, then the
// product. silu(g) = g / (1 + e^-g), with e^-g = 1 / e^g for g < 0 (exp_nonpositive takes x <= 0
// only). Below g = -87, where exp_nonpositive stops, the result is -0 (torch's reaches -0 at
// -88.7, and is under 1e-36 between); elsewhere the fp32 quotient may differ from torch's in its
// last bit.
template <typename T>
void silu_and_mul_impl(const at::Tensor& out, const at::Tensor& x) {
  // x: (rows, 2 * d) contiguous, each row [gate | up]; out: (rows, d) contiguous
  const int64_t d = out.size(-1), rows = out.numel() / d;
  const T* xp = static_cast<const T*>(x.const_data_ptr());
  T* op = static_cast<T*>(out.data_ptr());
  const int64_t grain = std::max<int64_t>(1, kMinValuesPerThread / d);  // rows
  at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    const int64_t n = d;  // a local: the stores (memcpy) may alias anything reached by reference
    for (int64_t r = begin; r < end; ++r) {
      const T* gate = xp + r * 2 * n;
      const T* up = gate + n;
      T* o = op + r * n;
      auto sixteen = [](const T* g16, const T* u16, T* o16) {
        const vf16 g = load16(g16);
        const vf16 e = nanoserve::exp_nonpositive(g < 0 ? g : -g);  // e^-|g|
        vf16 silu = (g < 0 ? g * e : g) / (1.0f + e);  // g / (1 + 1/e) = g e / (1 + e) for g < 0
        silu = g < -87.0f ? g * 0.0f : silu;  // -0 where e^-|g| stops at e^-87
        store16(o16, rounded<T>(silu) * load16(u16));
      };
      int64_t i = 0;
      for (; i + 16 <= n; i += 16) sixteen(gate + i, up + i, o + i);
      if (i < n) {  // the tail through zero-padded copies: whole vectors, of a size known at compile time
        T g16[16] = {}, u16[16] = {}, o16[16];
        std::copy(gate + i, gate + n, g16);
        std::copy(up + i, up + n, u16);
        sixteen(g16, u16, o16);
        std::copy(o16, o16 + (n - i), o + i);
      }
    }
  });
}

void silu_and_mul(const at::Tensor& out, const at::Tensor& x) {
  TORCH_CHECK(x.device().is_cpu() && x.is_contiguous() && x.dim() >= 1 && x.size(-1) % 2 == 0,
              "silu_and_mul: x must be a contiguous CPU tensor (..., 2 * d)");
  TORCH_CHECK(out.is_contiguous() && out.dim() == x.dim() && out.scalar_type() == x.scalar_type() &&
              out.size(-1) * 2 == x.size(-1) && out.numel() * 2 == x.numel(),
              "silu_and_mul: out must be a contiguous (..., d) tensor in x's dtype");
  if (out.numel() == 0) return;
  switch (x.scalar_type()) {
    case at::kFloat: return silu_and_mul_impl<float>(out, x);
    case at::kBFloat16: return silu_and_mul_impl<c10::BFloat16>(out, x);
    case at::kHalf: return silu_and_mul_impl<c10::Half>(out, x);
    default: TORCH_CHECK(false, "silu_and_mul: unsupported dtype ", x.scalar_type());
  }
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(nanoserve_cpu, m) {
  m.def("rms_norm(Tensor(a!) out, Tensor x, Tensor weight, float eps, Tensor? residual, "
        "Tensor(b!)? h) -> ()", &rms_norm);
  m.def("rotary_embedding(Tensor positions, Tensor(a!) q, Tensor(b!) k, Tensor cos_sin_cache) -> ()",
        &rotary_embedding);
  m.def("reshape_and_cache(Tensor k, Tensor v, Tensor(a!) k_cache, Tensor(b!) v_cache, "
        "Tensor slot_mapping, float k_scale=1.0, float v_scale=1.0) -> ()", &reshape_and_cache);
  m.def("silu_and_mul(Tensor(a!) out, Tensor x) -> ()", &silu_and_mul);
}
