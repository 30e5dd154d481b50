// Helpers shared by nanoserve's C++ CPU kernels: eight floats as one value (GCC and Clang lower
// arithmetic on it to AVX2, SSE or NEON, as the CPU has), loads that widen bf16, e4m3 codes read as
// fp32 or (the fp8 GEMV's and attention's) as bf16, horizontal sums, e^x, and what both
// decode-attention ops use: the softmax of score rows, their work items, and the prefetches that
// keep memory busy while a work item computes.
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Float8_e4m3fn.h>

#if defined(__FMA__)
#include <immintrin.h>
#endif

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

// e4m3 to fp32. With F16C, arithmetically: an e4m3 code's exponent and mantissa bits, shifted
// into fp16's, are an fp16 of the same value times 2^-8 (its exponent bias is 7 against 15), so
// eight codes take a widening, two masks and shifts, one conversion and one exact multiply by
// 2^8, where a lookup per value is a gather (slow on many cores). Elsewhere, and for the tail, a
// table of the 256 values, built once.
template <>
inline void to_float<c10::Float8_e4m3fn>(const c10::Float8_e4m3fn* src, float* dst, int64_t n) {
  static const auto table = [] {
    std::vector<float> t(256);
    for (int b = 0; b < 256; ++b) t[b] = static_cast<float>(c10::Float8_e4m3fn(b, c10::Float8_e4m3fn::from_bits()));
    return t;
  }();
  const uint8_t* bits = reinterpret_cast<const uint8_t*>(src);
  int64_t i = 0;
#if defined(__F16C__) && defined(__AVX2__) && defined(__FMA__)
  const __m128i low7 = _mm_set1_epi16(0x7F), sign = _mm_set1_epi16(0x80), nan16 = _mm_set1_epi16(0x7E00);
  const __m256 two8 = _mm256_set1_ps(256.f);
  for (; i + 8 <= n; i += 8) {
    int64_t eight;
    std::memcpy(&eight, bits + i, 8);
    const __m128i w = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(eight));
    const __m128i mag = _mm_and_si128(w, low7);
    __m128i h = _mm_or_si128(_mm_slli_epi16(mag, 7), _mm_slli_epi16(_mm_and_si128(w, sign), 8));
    h = _mm_blendv_epi8(h, nan16, _mm_cmpeq_epi16(mag, low7));  // S.1111.111 is e4m3fn's NaN
    _mm256_storeu_ps(dst + i, _mm256_mul_ps(_mm256_cvtph_ps(h), two8));
  }
#endif
  const float* t = table.data();
#pragma omp simd
  for (int64_t j = i; j < n; ++j) dst[j] = t[bits[j]];
}

#if defined(__AVX512VBMI__) && defined(__AVX512BF16__)
// 8-bit weight codes as bf16, 64 at a time: e4m3 codes (kInt8 false) or int8 codes (-127..127).
// Every e4m3 value, subnormals included, is a normal bf16 number (3 mantissa bits, exponents
// 2^-9..2^8), as is every integer up to 127, so a code is looked up as its value's bf16: two byte
// permutes over 128-entry tables give the low and high byte (vpermi2b reads seven index bits: the
// e4m3 code's magnitude bits, or the int8 code's absolute value), the code's sign (bit 7 in both
// formats) goes into the high byte, and two byte unpacks make words of them. The unpacks interleave
// within 128-bit lanes: of 64 codes, w0 holds codes 16k..16k+7 of each lane k, w1 codes
// 16k+8..16k+15 (a dot product with them takes its other side in that order).
template <bool kInt8>
class CodeToBf16 {
 public:
  CodeToBf16()
      : lo0_(_mm512_load_si512(tables().lo)), lo1_(_mm512_load_si512(tables().lo + 64)),
        hi0_(_mm512_load_si512(tables().hi)), hi1_(_mm512_load_si512(tables().hi + 64)),
        sign_(_mm512_set1_epi8(static_cast<char>(0x80))) {}

  void operator()(__m512i codes, __m512bh& w0, __m512bh& w1) const {
    const __m512i index = kInt8 ? _mm512_abs_epi8(codes) : codes;
    const __m512i lo = _mm512_permutex2var_epi8(lo0_, index, lo1_);
    const __m512i hi_bits = _mm512_permutex2var_epi8(hi0_, index, hi1_);
    const __m512i hi = _mm512_ternarylogic_epi32(hi_bits, codes, sign_, 0xF8);  // a | b & c: the sign put in
    w0 = reinterpret_cast<__m512bh>(_mm512_unpacklo_epi8(lo, hi));
    w1 = reinterpret_cast<__m512bh>(_mm512_unpackhi_epi8(lo, hi));
  }

  // 64 bf16 values (a: the first 32, b: the rest) in the order above: the other side of a dot
  // product with w0 and w1 (word 8k + j of x0 is value 16k + j, of x1 value 16k + 8 + j)
  static void in_order(__m512i a, __m512i b, __m512bh& x0, __m512bh& x1) {
    const __m512i first = _mm512_set_epi16(55, 54, 53, 52, 51, 50, 49, 48, 39, 38, 37, 36, 35, 34, 33, 32,
                                           23, 22, 21, 20, 19, 18, 17, 16, 7, 6, 5, 4, 3, 2, 1, 0);
    x0 = reinterpret_cast<__m512bh>(_mm512_permutex2var_epi16(a, first, b));
    x1 = reinterpret_cast<__m512bh>(_mm512_permutex2var_epi16(a, _mm512_add_epi16(first, _mm512_set1_epi16(8)), b));
  }

 private:
  struct Tables {
    alignas(64) uint8_t lo[128];
    alignas(64) uint8_t hi[128];
  };

  static const Tables& tables() {
    static const Tables t = [] {
      Tables t;
      for (int k = 0; k < 128; ++k) {  // bf16 is fp32's top half, exactly here; e4m3's 0x7f is NaN
        const float v = kInt8 ? static_cast<float>(k) : static_cast<float>(c10::Float8_e4m3fn(k, c10::Float8_e4m3fn::from_bits()));
        uint32_t bits;
        std::memcpy(&bits, &v, sizeof bits);
        t.lo[k] = static_cast<uint8_t>(bits >> 16);
        t.hi[k] = static_cast<uint8_t>(bits >> 24);
      }
      return t;
    }();
    return t;
  }

  __m512i lo0_, lo1_, hi0_, hi1_, sign_;
};
using E4m3ToBf16 = CodeToBf16<false>;
using Int8ToBf16 = CodeToBf16<true>;
#endif

// A GEMV's weight stream, kStreamAhead bytes ahead of the row under way, into L1: some cores'
// hardware prefetchers keep too few lines in flight for DRAM's latency (benchmarks/cpu_linear.py
// measures the GEMVs against torch's own); once per 64 bytes of weight read
constexpr int64_t kStreamAhead = 4096;
inline void prefetch_ahead(const void* p) { __builtin_prefetch(static_cast<const char*>(p) + kStreamAhead, 0, 3); }

inline vf8 load8(const float* p) {
  vf8 v;
  std::memcpy(&v, p, sizeof v);  // an unaligned vector load
  return v;
}

// bf16 values widened to fp32, exactly (bf16 is fp32's top half): V a vector of floats (vf8, or
// wider), VH and VU vectors of as many uint16 and uint32
template <typename V, typename VH, typename VU>
inline V load_bf16(const c10::BFloat16* p) {
  VH h;
  std::memcpy(&h, p, sizeof h);
  const VU u = __builtin_convertvector(h, VU) << 16;
  V v;
  std::memcpy(&v, &u, sizeof v);
  return v;
}

inline vf8 load8(const c10::BFloat16* p) {
  typedef uint16_t vh8 __attribute__((vector_size(16)));
  typedef uint32_t vu8 __attribute__((vector_size(32)));
  return load_bf16<vf8, vh8, vu8>(p);
}

// fp32 values' bits (VU: a vector of uint32) rounded to bf16's, in each lane's low half: to nearest
// even on the bits, as c10::BFloat16 rounds (NaN stays NaN)
template <typename VU>
inline VU bf16_rounded_bits(VU u) {
  const VU nan = (u & 0x7fffffffu) > 0x7f800000u;  // all ones where the value is NaN
  return ((nan & 0x7fc00000u) | (~nan & (u + (((u >> 16) & 1) + 0x7fffu)))) >> 16;
}

// Eight fp32 values stored as bf16, rounded as c10::BFloat16 rounds: a vector's worth of integer
// ops where the scalar cast costs a branch per value
inline void store8(c10::BFloat16* p, vf8 v) {
  typedef uint16_t vh8 __attribute__((vector_size(16)));
  typedef uint32_t vu8 __attribute__((vector_size(32)));
  vu8 u;
  std::memcpy(&u, &v, sizeof u);
  const vh8 h = __builtin_convertvector(bf16_rounded_bits(u), vh8);
  std::memcpy(p, &h, sizeof h);
}

inline void store8(float* p, vf8 v) { std::memcpy(p, &v, sizeof v); }

// a * b + c rounded once where the CPU has FMA, else twice: the same instruction wherever it is
// written, where the compiler's own contraction of `c += a * b` may differ between two
// instantiations of one loop (kernels whose rows must not depend on their neighbours use this)
inline vf8 fma8(vf8 a, vf8 b, vf8 c) {
#if defined(__FMA__)
  return (vf8)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
#else
  return a * b + c;
#endif
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

// Cache lines a work item needs soon, prefetched a few at a time between its arithmetic. A block's
// prefetches issued at once (128-256 lines) fill the core's miss buffers, and the arithmetic behind
// them stalls until they drain: compute and memory then take turns. Spread over the arithmetic, the
// same prefetches overlap it. Callers report work a query head and block at a time: reported for
// every key, the queue's state would become a chain of loads and stores through memory.
class PrefetchQueue {
 public:
  // rows rows of row_bytes each, stride_bytes apart, from base
  void add(const char* base, int64_t rows, int64_t row_bytes, int64_t stride_bytes) {
    if (row_bytes == stride_bytes) row_bytes *= rows, rows = 1;  // one contiguous span
    const char* first = base - (reinterpret_cast<uintptr_t>(base) & 63);  // its first line
    const int64_t row_lines = (base + row_bytes - first + 63) / 64;
    runs_.push_back({first, rows, row_lines, stride_bytes});
    pending_ += rows * row_lines;
  }

  // the lines not yet prefetched, spread evenly over the next `units` units of work
  void spread_over(int64_t units) { rate_ = units > 0 ? static_cast<float>(pending_) / units : 0.f; }

  // `units` units of work done: prefetch the lines now due (into L2, prefetcht2: L1 holds the
  // rows under way)
  void done(int64_t units) {
    credit_ += rate_ * units;
    if (credit_ < 1.f || pending_ == 0) return;
    // the loop on locals: its loads of runs_ could alias the members, and would store them each line
    int64_t due = std::min<int64_t>(pending_, static_cast<int64_t>(credit_)), row = row_, line = line_;
    size_t run = run_;
    credit_ -= due, pending_ -= due;
    while (due > 0) {  // the due lines of the row under way, then of the next row
      const Run& r = runs_[run];
      const int64_t k = std::min(due, r.row_lines - line);
      const char* p = r.first + row * r.stride + 64 * line;
      for (int64_t i = 0; i < k; ++i) __builtin_prefetch(p + 64 * i, 0, 1);
      due -= k;
      if ((line += k) == r.row_lines && (line = 0, ++row == r.rows)) row = 0, ++run;
    }
    row_ = row, line_ = line, run_ = run;
    if (pending_ == 0) runs_.clear(), run_ = 0, credit_ = 0.f;
  }

 private:
  struct Run {
    const char* first;  // the first row's first line
    int64_t rows, row_lines, stride;
  };
  std::vector<Run> runs_;
  size_t run_ = 0;
  int64_t row_ = 0, line_ = 0, pending_ = 0;
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

  int64_t blocks(int64_t item) const { return (lens[item / per_seq] + block_size - 1) / block_size; }

  // block b of item's rows in `cache` into pq
  void queue(PrefetchQueue& pq, const char* cache, int64_t item, int64_t b) const {
    const int64_t d = item / per_seq, h0 = (item % per_seq) * nh;
    pq.add(cache + tables[d * table_stride + b] * block_bytes + h0 * head_bytes,
           std::min(block_size, lens[d] - b * block_size), nh * head_bytes, token_bytes);
  }
};

// One thread's work items [.., end) read as one stream of cache blocks: an item's K blocks (its
// scores), its V blocks (the weighted sum), then the next item's K blocks. While a work item
// computes with the block at stream position s, the blocks up to s + ahead are prefetched, spread
// over that block's arithmetic; ahead is about 16 KB of rows (one fp32 block of four kv heads):
// far enough to hide the memory latency, near enough to stay in L2 (a whole item ahead would not
// at long contexts). benchmarks/cpu_attention.py measures it against the bytes read alone.
class BlockStream {
 public:
  BlockStream(const PagedItems& items, int64_t end)
      : items_(items), end_(end),
        ahead_(std::max<int64_t>(1, (16 << 10) / (items.block_size * items.nh * items.head_bytes))) {}

  // Work item `item` starts: what the previous item queued past its own blocks was this one's
  void start(int64_t item) {
    next_ = item_ >= 0 && item == item_ + 1 ? std::max<int64_t>(0, next_ - 2 * items_.blocks(item_)) : 0;
    item_ = item;
  }

  // The block at stream position s (K block s, or V block s - blocks) starts, with `units` units
  // of work
  void at(int64_t s, int64_t units) {
    const int64_t B = items_.blocks(item_), last = 2 * B + (item_ + 1 < end_ ? items_.blocks(item_ + 1) : 0);
    for (next_ = std::max(next_, s + 1); next_ <= s + ahead_ && next_ < last; ++next_) {
      if (next_ < B) items_.queue(pq_, items_.k, item_, next_);
      else if (next_ < 2 * B) items_.queue(pq_, items_.v, item_, next_ - B);
      else items_.queue(pq_, items_.k, item_ + 1, next_ - 2 * B);
    }
    pq_.spread_over(units);
  }

  void done(int64_t units) { pq_.done(units); }

 private:
  const PagedItems& items_;
  const int64_t end_, ahead_;
  int64_t item_ = -1, next_ = 0;  // the item under way; the first stream position not yet queued
  PrefetchQueue pq_;
};

}  // namespace nanoserve
