// Helpers shared by nanoserve's C++ CPU kernels: eight floats as one value (GCC and Clang lower
// arithmetic on it to AVX2, SSE or NEON, as the CPU has), loads that widen bf16, horizontal sums,
// e^x, and what both decode-attention ops use: the softmax of score rows, their work items, and the
// prefetches that keep memory busy while a work item computes.
#pragma once

#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

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

// Cache lines a work item needs later, prefetched a few at a time between its arithmetic. A work
// item alone leaves memory idle while it computes, and the hardware prefetcher cannot know which
// cache blocks come next; but a block's prefetches issued at once (128-256 lines) fill the core's
// miss buffers, and the arithmetic behind them stalls until they drain: compute and memory then
// take turns. Spread evenly over the item's arithmetic, the same prefetches overlap it. On a
// 2-core AVX-512 EPYC, llama-120m's 12 layers of fp32 decode attention at 64 x 320 took 20-22 ms
// instead of 29-33 with a block's prefetches in one burst (read-only, the same K/V bytes take
// 17-23 ms); benchmarks/cpu_attention.py prints the rate per layer.
class PrefetchQueue {
 public:
  void clear() { runs_.clear(), run_ = 0, line_ = 0, lines_ = 0, credit_ = 0.f; }

  // rows rows of row_bytes each, stride_bytes apart, from base
  void add(const char* base, int64_t rows, int64_t row_bytes, int64_t stride_bytes) {
    if (row_bytes == stride_bytes) return span(base, rows * row_bytes);
    for (int64_t o = 0; o < rows; ++o) span(base + o * stride_bytes, row_bytes);
  }

  // the queue's lines spread evenly over the next `units` units of work
  void spread_over(int64_t units) { rate_ = units > 0 ? static_cast<float>(lines_) / units : 0.f; }

  // `units` units of work done: prefetch the lines now due (into L2, prefetcht2: L1 holds the
  // rows under way)
  void done(int64_t units) {
    for (credit_ += rate_ * units; credit_ >= 1.f && run_ < runs_.size(); credit_ -= 1.f) {
      __builtin_prefetch(runs_[run_].first + 64 * line_, 0, 1);
      if (++line_ == runs_[run_].second) line_ = 0, ++run_;
    }
  }

 private:
  void span(const char* p, int64_t bytes) {  // the lines [p, p + bytes) touches
    const char* first = p - (reinterpret_cast<uintptr_t>(p) & 63);
    const int64_t n = (p + bytes - first + 63) / 64;
    runs_.emplace_back(first, n);
    lines_ += n;
  }

  std::vector<std::pair<const char*, int64_t>> runs_;  // (first line, lines)
  size_t run_ = 0;
  int64_t line_ = 0, lines_ = 0;
  float credit_ = 0.f, rate_ = 0.f;
};

// The decode-attention ops' work items over the paged cache: item i is sequence i / per_seq's kv
// heads [h0, h0 + nh), h0 = (i % per_seq) * nh. Caches are (blocks, block_size, kvh, hd); sizes in
// bytes.
struct PagedItems {
  const char *k, *v;
  int64_t block_bytes, token_bytes, head_bytes, block_size, per_seq, nh;
  const int32_t* tables;  // (D, table_stride) block tables
  int64_t table_stride;
  const int32_t* lens;  // (D,) context lengths

  // What item `item` reads after its scores, in the order it reads it: its V rows, then (when
  // the thread's range [.., end) has one) the next item's K rows
  void queue(PrefetchQueue& pq, int64_t item, int64_t end) const {
    pq.clear();
    rows(pq, v, item);
    if (item + 1 < end) rows(pq, k, item + 1);
  }

 private:
  void rows(PrefetchQueue& pq, const char* cache, int64_t item) const {
    const int64_t d = item / per_seq, h0 = (item % per_seq) * nh, L = lens[d];
    for (int64_t b = 0; b * block_size < L; ++b)
      pq.add(cache + tables[d * table_stride + b] * block_bytes + h0 * head_bytes,
             std::min(block_size, L - b * block_size), nh * head_bytes, token_bytes);
  }
};

}  // namespace nanoserve
