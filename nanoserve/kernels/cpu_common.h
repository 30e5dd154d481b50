// Helpers shared by nanoserve's C++ CPU kernels: eight floats as one value (GCC and Clang lower
// arithmetic on it to AVX2, SSE or NEON, as the CPU has), loads that widen bf16, horizontal sums,
// e^x, and what both decode-attention work items use: the softmax of score rows and the prefetches
// that keep memory busy while a work item computes.
#pragma once

#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>

namespace nanoserve {

typedef float vf8 __attribute__((vector_size(32)));
typedef int32_t vi8 __attribute__((vector_size(32)));

// src[0:n] as fp32 into dst
template <typename T>
inline void to_float(const T* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}

template <>
inline void to_float<c10::BFloat16>(const c10::BFloat16* src, float* dst, int64_t n) {
  const uint16_t* bits = reinterpret_cast<const uint16_t*>(src);  // bf16 is fp32's top half
  uint32_t* out = reinterpret_cast<uint32_t*>(dst);
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<uint32_t>(bits[i]) << 16;
}

inline vf8 load8(const float* p) {
  vf8 v;
  std::memcpy(&v, p, sizeof v);  // an unaligned vector load
  return v;
}

inline vf8 load8(const c10::BFloat16* p) {  // eight bf16 widened to fp32 (exact)
  typedef uint16_t vh8 __attribute__((vector_size(16)));
  typedef uint32_t vu8 __attribute__((vector_size(32)));
  vh8 h;
  std::memcpy(&h, p, sizeof h);
  const vu8 u = __builtin_convertvector(h, vu8) << 16;
  vf8 v;
  std::memcpy(&v, &u, sizeof v);
  return v;
}

inline float sum8(vf8 v) { return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7])); }

// e^x for x <= 0, a vector of floats at a time (vf8, or wider): the Cephes library's expf
// (S. Moshier), 2^n * e^r with |r| <= ln2/2 and a degree-6 polynomial, about 1 ulp; std::exp would
// be a call per element
template <typename V>
inline V exp_nonpositive(V x) {
  typedef int32_t VI __attribute__((vector_size(sizeof(V))));
  x = x < -87.0f ? -87.0f : x;  // below this e^x is 0 to a softmax; 2^n stays a normal float
  const VI ni = __builtin_convertvector(x * 1.44269504f - 0.5f, VI);  // round(x / ln2), x <= 0
  const V n = __builtin_convertvector(ni, V);
  const V r = x - n * 0.693359375f + n * 2.12194440e-4f;
  V p = r * 1.9875691500e-4f + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  return (p * r * r + r + 1.0f) * (V)((ni + 127) << 23);  // * 2^n, built in the exponent bits
}

// Softmax numerators of nq score rows in place (L scores each, rows Ls >= L apart, Ls a multiple
// of 8), and inv[j] = 1 / the sum of row j
inline void softmax_rows(float* scores, int64_t nq, int64_t L, int64_t Ls, float* inv) {
  for (int64_t j = 0; j < nq; ++j) {
    float* s = scores + j * Ls;
    // pad to whole vectors: a padding score's e^x is e^-87, below an ulp of the sum (>= 1)
    std::fill(s + L, s + Ls, -INFINITY);
    vf8 mv = load8(s);
    for (int64_t t = 8; t < L; t += 8) mv = mv > load8(s + t) ? mv : load8(s + t);
    const float m = std::max(std::max(std::max(mv[0], mv[1]), std::max(mv[2], mv[3])),
                             std::max(std::max(mv[4], mv[5]), std::max(mv[6], mv[7])));
    vf8 z = {};
    for (int64_t t = 0; t < L; t += 8) {
      const vf8 e = exp_nonpositive(load8(s + t) - m);
      std::memcpy(s + t, &e, sizeof e);
      z += e;
    }
    inv[j] = 1.f / sum8(z);
  }
}

// Rows [0, n) of a cache block (row_bytes each, stride_bytes apart) on their way into L2
// (prefetcht2: not into L1, which the pass under way is using)
inline void prefetch_l2(const void* base, int64_t n, int64_t row_bytes, int64_t stride_bytes) {
  const char* p = static_cast<const char*>(base);
  for (int64_t o = 0; o < n; ++o)
    for (int64_t x = 0; x < row_bytes; x += 64) __builtin_prefetch(p + o * stride_bytes + x, 0, 1);
}

// The work item a thread takes after this one, whose keys the V pass of this one prefetches: a
// work item alone leaves memory idle while it computes (the softmax, the V pass out of L2), and
// the hardware prefetcher cannot know which cache blocks come next. With this and the V rows
// prefetched during the scores, the op took 4-25% less time on a 2-core AVX-512 EPYC (fp32 and
// bf16, the four shapes of benchmarks/cpu_attention.py, old and new op alternating call by call).
struct NextItem {
  const int32_t* table = nullptr;  // its block table; nullptr: this thread has no next item
  int64_t L = 0, h0 = 0;           // its context length and first kv head

  // Work item `item` of a thread's range [.., end): sequence item / per_seq, kv heads from
  // (item % per_seq) * nh; tables (D, table_stride) and lens (D,) are the op's
  static NextItem at(int64_t item, int64_t end, int64_t per_seq, int64_t nh, const int32_t* tables,
                     int64_t table_stride, const int32_t* lens) {
    if (item >= end) return {};
    const int64_t d = item / per_seq;
    return {tables + d * table_stride, lens[d], (item % per_seq) * nh};
  }

  // The blocks [first, last) of its K to prefetch during block `part` of `parts` of this item's V
  // pass: an even share each, so the prefetches are spread over the pass
  std::pair<int64_t, int64_t> key_blocks(int64_t part, int64_t parts, int64_t block_size) const {
    const int64_t blocks = table ? (L + block_size - 1) / block_size : 0;
    return {part * blocks / parts, (part + 1) * blocks / parts};
  }
};

}  // namespace nanoserve
