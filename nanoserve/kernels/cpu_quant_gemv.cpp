// Linear layers over 8-bit weight codes on a CPU (kernels/quantization.py defines the formats):
// the GEMV of a few rows reading the codes and scales directly, on CPUs with AMX a matmul for up to
// 64 rows on the tile unit (amx below), and the dequantization of a layer into a buffer (for
// batches of more rows, which then run a float matmul on it).
//
// A row's weight is int8 or fp8 e4m3 codes with an fp32 scale per group of input values (one group:
// per-output-channel scales; 32: GGUF's Q8_0 blocks). The GEMV streams the codes as cpu_gemv.cpp
// streams a float weight (a contiguous range of rows per thread, in memory order): one byte read
// per weight instead of two (bf16) or four (fp32). int8 codes times bf16 activations on x86 are
// integer dot products over x held as 16-bit integers (int16_x below); otherwise the GEMV widens
// each code to fp32, sums a group's products in fp32 and adds the group's sum times its scale (on
// some CPUs that widening, not the memory, bounds the loop: benchmarks/quantization.py's GEMV
// table). The e4m3 -> fp32 widening is exact: an e4m3
// code's 7 magnitude bits shifted left by 7 are the fp16 of the same value times 2^-8 (the
// exponent biases differ by 8; e4m3's subnormals land on fp16's), which the CPU's fp16 conversion
// (F16C's vcvtph2ps where the CPU has it) widens; the 2^8 goes into the group's scale. The weight
// stream is prefetched ahead (cpu_common.h's prefetch_ahead), as in cpu_gemv.cpp.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#if defined(__AMX_TILE__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <type_traits>
#include <vector>

#include "cpu_common.h"
#include "cpu_few_rows.h"

// Sixteen codes a vector on AVX-512 CPUs that run a 512-bit instruction at full width; on a CPU
// that splits it into two 256-bit halves (cpu_build.py defines NANOSERVE_SPLIT512 there) the wider
// loop was slower (benchmarks/quantization.py, results in benchmarks/results/)
#if defined(__AVX512F__) && defined(__F16C__) && !defined(NANOSERVE_SPLIT512)
#define WIDE16
#endif

// The AMX matmul over codes (amx below) widens sixteen codes a vector, as WIDE16's GEMV does
#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__) && defined(__AVX512VBMI__) && \
    defined(WIDE16)
#define NANOSERVE_AMX
#endif

namespace {

using nanoserve::fma8;
using nanoserve::load8;
using nanoserve::sum8;
using nanoserve::vf8;
using nanoserve::vi8;

// Eight codes from p, widened to fp32. Intrinsics on x86 with AVX2 and F16C (every AVX-512 CPU has
// both): GCC lowers 8-byte vector types lane by lane. Elsewhere the same arithmetic in portable
// vector code (the fp8 one exact without F16C: normal codes by their bits, subnormals by a multiply).
struct Int8Code {
  static constexpr float kScale = 1.f;
  static vf8 load(const uint8_t* p) {
#if defined(__AVX2__)
    const __m256 f = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
    vf8 v;
    std::memcpy(&v, &f, sizeof v);
    return v;
#else
    int8_t c[8];
    std::memcpy(c, p, sizeof c);
    return vf8{float(c[0]), float(c[1]), float(c[2]), float(c[3]), float(c[4]), float(c[5]), float(c[6]), float(c[7])};
#endif
  }
#if defined(__AVX2__)
  // Thirty-two codes as four vectors: w[0..2] the codes times 2^24 (the group's sum times kWide
  // undoes it, exactly: a power of two), w[3] the codes. The first three convert a code put in a
  // lane's top byte (byte shuffles of sixteen codes loaded once); the fourth puts it in the low
  // byte of 2^23 + 128's bits and subtracts: an add, where the conversion shares its unit with the
  // multiply-adds that bound the loop.
  static constexpr float kWide = 0x1p-24f;
  static void load32(const uint8_t* p, vf8 w[4]) {
    const __m256i a = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    const __m256i b = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16)));
    const __m256i lo = _mm256_setr_epi8(-1, -1, -1, 0, -1, -1, -1, 1, -1, -1, -1, 2, -1, -1, -1, 3,
                                        -1, -1, -1, 4, -1, -1, -1, 5, -1, -1, -1, 6, -1, -1, -1, 7);
    const __m256i hi = _mm256_setr_epi8(-1, -1, -1, 8, -1, -1, -1, 9, -1, -1, -1, 10, -1, -1, -1, 11,
                                        -1, -1, -1, 12, -1, -1, -1, 13, -1, -1, -1, 14, -1, -1, -1, 15);
    const __m256i low_byte = _mm256_setr_epi8(8, -1, -1, -1, 9, -1, -1, -1, 10, -1, -1, -1, 11, -1, -1, -1,
                                              12, -1, -1, -1, 13, -1, -1, -1, 14, -1, -1, -1, 15, -1, -1, -1);
    const __m256 f[4] = {_mm256_cvtepi32_ps(_mm256_shuffle_epi8(a, lo)), _mm256_cvtepi32_ps(_mm256_shuffle_epi8(a, hi)),
                         _mm256_cvtepi32_ps(_mm256_shuffle_epi8(b, lo)),
                         // the code's byte xor 0x80 is code + 128, unsigned: exact in the mantissa
                         _mm256_sub_ps(_mm256_castsi256_ps(_mm256_xor_si256(_mm256_shuffle_epi8(b, low_byte),
                                                                            _mm256_set1_epi32(0x4B000080))),
                                       _mm256_set1_ps(8388736.f))};
    std::memcpy(w, f, sizeof f);
  }
#else
  static constexpr float kWide = 1.f;
  static void load32(const uint8_t* p, vf8 w[4]) {
    for (int c = 0; c < 4; ++c) w[c] = load(p + 8 * c);
  }
#endif
#if defined(WIDE16)
  static __m512 load16(const uint8_t* p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
#endif
};

struct Fp8Code {
  static constexpr float kWide = 1.f;
  static void load32(const uint8_t* p, vf8 w[4]) {
    for (int c = 0; c < 4; ++c) w[c] = load(p + 8 * c);
  }
#if defined(__AVX2__) && defined(__F16C__)
  static constexpr float kScale = 256.f;  // the fp16 read below is the value times 2^-8
  static vf8 load(const uint8_t* p) {
    // each code in the high byte of a 16-bit lane, shifted right one bit with its sign: the sign
    // stays in bit 15, a copy of it lands in bit 14 (cleared), the magnitude in bits 7..13
    const __m128i hi = _mm_unpacklo_epi8(_mm_setzero_si128(), _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    const __m256 f = _mm256_cvtph_ps(_mm_and_si128(_mm_srai_epi16(hi, 1), _mm_set1_epi16(static_cast<short>(0xBFFF))));
    vf8 v;
    std::memcpy(&v, &f, sizeof v);
    return v;
  }
#if defined(WIDE16)
  static __m512 load16(const uint8_t* p) {  // as load, sixteen codes
    const __m256i hi = _mm256_slli_epi16(_mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 8);
    return _mm512_cvtph_ps(_mm256_and_si256(_mm256_srai_epi16(hi, 1), _mm256_set1_epi16(static_cast<short>(0xBFFF))));
  }
#endif
#else
  static constexpr float kScale = 1.f;
  static vf8 load(const uint8_t* p) {
    uint8_t b[8];
    std::memcpy(b, p, sizeof b);
    const vi8 u = {b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]};
    const vi8 mag = u & 0x7F;
    const vi8 normal = (mag << 20) + (120 << 23);  // exponent rebiased from 7 to 127
    vf8 vn;
    std::memcpy(&vn, &normal, sizeof vn);
    const vf8 sub = __builtin_convertvector(mag, vf8) * 0x1p-9f;  // 2^-6 * mantissa / 8
    vi8 bits;
    const vf8 v = mag < 8 ? sub : vn;
    std::memcpy(&bits, &v, sizeof bits);
    bits |= (u & 0x80) << 24;
    vf8 out;
    std::memcpy(&out, &bits, sizeof out);
    return out;
  }
#endif
};

// The vector a GEMV loop works in: eight fp32 lanes (AVX2, or portable vector code), or sixteen on
// the CPUs of WIDE16, where a 512-bit instruction costs one 256-bit one's time
struct Lanes8 {
  static constexpr int kWidth = 8;
  using V = vf8;
  static V zero() { return V{}; }
  static V splat(float s) { return V{} + s; }
  template <typename Code>
  static V codes(const uint8_t* p) { return Code::load(p); }
  // four vectors of codes, the first three times 1 / kWide (Int8Code::load32)
  template <typename Code>
  static constexpr float kWide = Code::kWide;
  template <typename Code>
  static void codes4(const uint8_t* p, V w[4]) { Code::load32(p, w); }
  static V load(const float* p) { return load8(p); }
  static V fma(V a, V b, V c) { return fma8(a, b, c); }
  static V add(V a, V b) { return a + b; }
  static float sum(V v) { return sum8(v); }
};

#if defined(WIDE16)
struct Lanes16 {
  static constexpr int kWidth = 16;
  using V = __m512;
  static V zero() { return _mm512_setzero_ps(); }
  static V splat(float s) { return _mm512_set1_ps(s); }
  template <typename Code>
  static V codes(const uint8_t* p) { return Code::load16(p); }
  template <typename Code>
  static constexpr float kWide = 1.f;
  template <typename Code>
  static void codes4(const uint8_t* p, V w[4]) {
    for (int c = 0; c < 4; ++c) w[c] = Code::load16(p + 16 * c);
  }
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static float sum(V v) { return _mm512_reduce_add_ps(v); }
};
#endif

// Groups of 32 (Q8_0): a group's four vectors in one chain, then its sum times the scale into the
// row's sum; the chains of successive groups overlap. The loop of rows below, run per group, would
// spend more on starting and closing a group than on its 32 codes.
template <typename Code, int M>
void rows32(const uint8_t* q, const float* scale, const float* x, float* y, int64_t r0, int64_t r1,
            int64_t in, int64_t out) {
  using L = Lanes8;
  const int64_t groups = in / 32;
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* qr = q + r * in;
    const float* sr = scale + r * groups;
    L::V acc[M];
    for (int m = 0; m < M; ++m) acc[m] = L::zero();
    for (int64_t g = 0, i = 0; g < groups; ++g, i += 32) {
      if ((g & 1) == 0) nanoserve::prefetch_ahead(qr + i);  // once a line
      L::V wv[4];
      for (int c = 0; c < 4; ++c) wv[c] = L::codes<Code>(qr + i + 8 * c);
      const L::V s = L::splat(sr[g] * Code::kScale);
      for (int m = 0; m < M; ++m) {
        const float* xm = x + m * in + i;
        L::V t = wv[0] * L::load(xm);
        for (int c = 1; c < 4; ++c) t = L::fma(wv[c], L::load(xm + 8 * c), t);
        acc[m] = L::fma(s, t, acc[m]);
      }
    }
    for (int m = 0; m < M; ++m) y[m * out + r] = L::sum(acc[m]);
  }
}

// Output rows [r0, r1) for M rows of x (fp32, `in` apart); `group` (a multiple of the vector width)
// values share a scale, `groups` scales a row. Four chains of multiply-adds per x row within a
// group, as in cpu_gemv.cpp; chains 0-2 sum codes times 1 / kWide (codes4), chain 3 codes as they
// are, and the rest of a group not a multiple of four vectors.
template <typename Code, typename L, int M>
void rows(const uint8_t* q, const float* scale, const float* x, float* y, int64_t r0, int64_t r1,
          int64_t in, int64_t out, int64_t group) {
  constexpr int W = L::kWidth;
  using V = typename L::V;
  if constexpr (W == 8)
    if (group == 32) return rows32<Code, M>(q, scale, x, y, r0, r1, in, out);
  const int64_t groups = in / group;
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* qr = q + r * in;
    V acc[M];
    for (int m = 0; m < M; ++m) acc[m] = L::zero();
    for (int64_t g = 0; g < groups; ++g) {
      V part[M][4];
      for (int m = 0; m < M; ++m)
        for (int c = 0; c < 4; ++c) part[m][c] = L::zero();
      const int64_t end = (g + 1) * group;
      int64_t i = g * group;
      for (; i + 4 * W <= end; i += 4 * W) {
        nanoserve::prefetch_ahead(qr + i);  // eight lanes: twice a line, cheaper than a test
        V wv[4];
        L::template codes4<Code>(qr + i, wv);
        for (int c = 0; c < 4; ++c)
          for (int m = 0; m < M; ++m) part[m][c] = L::fma(wv[c], L::load(x + m * in + i + W * c), part[m][c]);
      }
      for (; i < end; i += W) {  // a group of W * k values, k not a multiple of 4: the rest
        const V wv = L::template codes<Code>(qr + i);
        for (int m = 0; m < M; ++m) part[m][3] = L::fma(wv, L::load(x + m * in + i), part[m][3]);
      }
      const float sg = scale[r * groups + g] * Code::kScale;
      const V s = L::splat(sg), sw = L::splat(sg * L::template kWide<Code>);
      for (int m = 0; m < M; ++m)
        acc[m] = L::fma(s, part[m][3], L::fma(sw, L::add(L::add(part[m][0], part[m][1]), part[m][2]), acc[m]));
    }
    for (int m = 0; m < M; ++m) y[m * out + r] = L::sum(acc[m]);
  }
}

#if defined(__AVX2__)
// int8 codes times bf16 activations as integer dot products. Each x row goes as 16-bit integers in
// blocks of 32 values sharing a power-of-two scale: a block's values times 2^(15 - e), where its
// largest magnitude is below 2^e, rounded to nearest. That holds a bf16 value (8 significant bits)
// exactly unless it is more than 2^7 below its block's largest; any value's error is at most 2^-16
// times 2^e, under 2^-15 of its block's largest. A code times a 16-bit value is exact, and so are
// the sums of four of them a 32-bit lane holds per block (below 2^24): one conversion to fp32 per
// block, times the block's scale and the code's, into the row's fp32 sum. Per 16 codes: a sign
// extension, then one dot-product instruction per x row (two without VNNI); widening to fp32 took
// six (an extension, a conversion and a multiply-add per 8 codes).
namespace int16_x {

constexpr int64_t kBlock = 32;

// AVX512-VNNI (or AVX-VNNI) adds the pairs' sums in the same instruction; the integers are the same
inline __m256i dot_add(__m256i acc, __m256i a, __m256i b) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpwssd_epi32(acc, a, b);
#elif defined(__AVXVNNI__)
  return _mm256_dpwssd_avx_epi32(acc, a, b);
#else
  return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b));
#endif
}

inline float bits_to_float(uint32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
}

// M rows of fp32 x (`in` apart, in a multiple of kBlock) as blocks: q (rows `in` apart) and a scale
// per block (rows in / kBlock apart): x ~= q * scale. A block holding inf or NaN gets a NaN scale.
void stage(const float* x, int64_t n, int16_t* q, float* scale) {
  const __m256i magnitude = _mm256_set1_epi32(0x7FFFFFFF);
  for (int64_t j = 0, b = 0; j < n; j += kBlock, ++b) {
    // the largest magnitude by its bits, which order as the values do (inf and NaN above all)
    __m256 v[4];
    __m256i m = _mm256_setzero_si256();
    for (int c = 0; c < 4; ++c) {
      v[c] = _mm256_loadu_ps(x + j + 8 * c);
      m = _mm256_max_epu32(m, _mm256_and_si256(_mm256_castps_si256(v[c]), magnitude));
    }
    __m128i h = _mm_max_epu32(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
    h = _mm_max_epu32(h, _mm_shuffle_epi32(h, 0x4E));
    h = _mm_max_epu32(h, _mm_shuffle_epi32(h, 0xB1));
    const uint32_t bits = static_cast<uint32_t>(_mm_cvtsi128_si32(h));
    const int e = static_cast<int>(bits >> 23);  // largest in [2^(e-127), 2^(e-126)): times 2^(141-e) < 2^15
    if (bits == 0 || e == 255) {  // all zeros; or inf or NaN, which the NaN scale carries to the sum
      scale[b] = bits == 0 ? 0.f : std::numeric_limits<float>::quiet_NaN();
      std::memset(q + j, 0, kBlock * sizeof(int16_t));
      continue;
    }
    // powers of two, built from their bits: 2^(e-141) a subnormal below e = 15; 2^(141-e) past the
    // largest float below e = 14, so two factors
    scale[b] = bits_to_float(e >= 15 ? static_cast<uint32_t>(e - 14) << 23 : 1u << (e + 8));
    const __m256 f1 = _mm256_set1_ps(bits_to_float(static_cast<uint32_t>(e >= 14 ? 268 - e : 254) << 23));
    const __m256 f2 = _mm256_set1_ps(bits_to_float(static_cast<uint32_t>(e >= 14 ? 127 : 141 - e) << 23));
    __m256i r[4];
    for (int c = 0; c < 4; ++c) r[c] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_mul_ps(v[c], f1), f2));
    // packs_epi32 saturates and works per 128-bit half: a0-3 b0-3 a4-7 b4-7, put back in order
    for (int c = 0; c < 4; c += 2)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + j + 8 * c),
                          _mm256_permute4x64_epi64(_mm256_packs_epi32(r[c], r[c + 1]), 0xD8));
  }
}

// Output rows [r0, r1) for M rows of staged x; `group` (a multiple of kBlock) codes share a scale.
// A block's sum goes into the row's times the group's scale, then the x block's (the product of the
// two scales could fall below fp32's normal range where the block's sum times either does not); one
// group a row, times the x block's scale alone, the row's applied once at the end: so there a row
// whose |x| sums past about 2^120 overflows fp32 before its scale, where the reference would not
// (activations come nowhere near). Blocks alternate between two chains of multiply-adds, so one
// need not wait for the last.
template <int M, bool kOneGroup>
void rows(const int8_t* q, const float* wscale, const int16_t* xq, const float* xscale, float* y, int64_t r0,
          int64_t r1, int64_t in, int64_t out, int64_t group) {
  const int64_t groups = in / group, blocks = in / kBlock, per_group = group / kBlock;
  for (int64_t r = r0; r < r1; ++r) {
    const int8_t* qr = q + r * in;
    const float* ws = wscale + r * groups;
    __m256 even[M], odd[M];
    for (int m = 0; m < M; ++m) even[m] = odd[m] = _mm256_setzero_ps();
    int64_t g = 0, left = per_group;  // the block's group, and its blocks from this one on
    const auto block = [&](int64_t b, __m256* acc) {
      const int64_t i = b * kBlock;
      const __m256i w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qr + i)));
      const __m256i w1 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qr + i + 16)));
      for (int m = 0; m < M; ++m) {
        const int16_t* xm = xq + m * in + i;
        const __m256i s = dot_add(_mm256_madd_epi16(w0, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xm))),
                                  w1, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xm + 16)));
        const __m256 sum = _mm256_cvtepi32_ps(s);
        acc[m] = _mm256_fmadd_ps(kOneGroup ? sum : _mm256_mul_ps(sum, _mm256_broadcast_ss(ws + g)),
                                 _mm256_broadcast_ss(xscale + m * blocks + b), acc[m]);
      }
      if (!kOneGroup && --left == 0) ++g, left = per_group;
    };
    int64_t b = 0;
    for (; b + 1 < blocks; b += 2) {
      nanoserve::prefetch_ahead(qr + b * kBlock);  // once a line
      block(b, even);
      block(b + 1, odd);
    }
    if (b < blocks) block(b, even);
    for (int m = 0; m < M; ++m) {
      vf8 v;
      const __m256 t = _mm256_add_ps(even[m], odd[m]);
      std::memcpy(&v, &t, sizeof v);
      y[m * out + r] = kOneGroup ? nanoserve::sum8(v) * ws[0] : nanoserve::sum8(v);
    }
  }
}

}  // namespace int16_x
#endif

#if defined(__AVX512VBMI__) && defined(__AVX512BF16__)
// fp8 codes times bf16 activations as bf16 dot products: each code looked up as its value's bf16
// (cpu_common.h's E4m3ToBf16), then vdpbf16ps multiplies each pair by x's pair (products exact in
// fp32) into fp32 sums. Five instructions per 64 codes and two per x row, where widening to fp32
// takes five per 8 codes. The lookup's words come in its interleaved order, so x is staged in it.
// vdpbf16ps reads subnormal bf16 as zero: an x below 2^-126 counts as zero.
namespace bf16_x {

constexpr int64_t kBlock = 64;

// n fp32 values of bf16 x (a multiple of kBlock) as bf16 (their top halves, exactly) in the lookup's
// order (E4m3ToBf16::in_order)
void stage(const float* x, int64_t n, uint16_t* xs) {
  const auto bf16_32 = [](const float* p) {  // 32 values' top halves
    const auto top = [](const float* q) { return _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_loadu_si512(q), 16)); };
    return _mm512_inserti64x4(_mm512_castsi256_si512(top(p)), top(p + 16), 1);
  };
  for (int64_t b = 0; b < n; b += kBlock) {
    __m512bh x0, x1;
    nanoserve::E4m3ToBf16::in_order(bf16_32(x + b), bf16_32(x + b + 32), x0, x1);
    _mm512_storeu_si512(xs + b, reinterpret_cast<__m512i>(x0));
    _mm512_storeu_si512(xs + b + 32, reinterpret_cast<__m512i>(x1));
  }
}

// Output rows [r0, r1) for M rows of staged x; `group` (a multiple of kBlock) codes share a scale:
// a group's two chains summed, times its scale, into the row's sum
template <int M>
void rows(const uint8_t* q, const float* wscale, const uint16_t* xs, float* y, int64_t r0, int64_t r1, int64_t in,
          int64_t out, int64_t group) {
  const nanoserve::E4m3ToBf16 to_bf16;
  const int64_t groups = in / group;
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* qr = q + r * in;
    __m512 acc[M];
    for (int m = 0; m < M; ++m) acc[m] = _mm512_setzero_ps();
    for (int64_t g = 0; g < groups; ++g) {
      __m512 part[M][2];
      for (int m = 0; m < M; ++m) part[m][0] = part[m][1] = _mm512_setzero_ps();
      for (int64_t i = g * group; i < (g + 1) * group; i += kBlock) {
        nanoserve::prefetch_ahead(qr + i);  // once a line
        __m512bh w0, w1;
        to_bf16(_mm512_loadu_si512(qr + i), w0, w1);
        for (int m = 0; m < M; ++m) {
          const uint16_t* xm = xs + m * in + i;
          part[m][0] = _mm512_dpbf16_ps(part[m][0], w0, reinterpret_cast<__m512bh>(_mm512_loadu_si512(xm)));
          part[m][1] = _mm512_dpbf16_ps(part[m][1], w1, reinterpret_cast<__m512bh>(_mm512_loadu_si512(xm + 32)));
        }
      }
      const __m512 s = _mm512_set1_ps(wscale[r * groups + g]);
      for (int m = 0; m < M; ++m) acc[m] = _mm512_fmadd_ps(_mm512_add_ps(part[m][0], part[m][1]), s, acc[m]);
    }
    for (int m = 0; m < M; ++m) y[m * out + r] = _mm512_reduce_add_ps(acc[m]);
  }
}

}  // namespace bf16_x
#endif

bool is_fp8(const at::Tensor& q) { return q.scalar_type() == at::kFloat8_e4m3fn; }

void check_codes(const at::Tensor& q, const at::Tensor& scale, const char* op) {
  TORCH_CHECK(q.device().is_cpu() && scale.device().is_cpu(), op, ": CPU tensors only");
  TORCH_CHECK(q.dim() == 2 && q.is_contiguous() && (q.scalar_type() == at::kChar || is_fp8(q)), op,
              ": codes must be a contiguous (out, in) int8 or float8_e4m3fn matrix");
  TORCH_CHECK(scale.dim() == 2 && scale.is_contiguous() && scale.scalar_type() == at::kFloat &&
              scale.size(0) == q.size(0) && scale.size(1) >= 1 && q.size(1) % scale.size(1) == 0 &&
              (q.size(1) / scale.size(1)) % 8 == 0, op,
              ": scales must be contiguous fp32 (out, groups), groups of a multiple of 8 values");
}

template <typename T, typename Code>
void gemv_impl(const at::Tensor& y, const at::Tensor& x, const at::Tensor& q, const at::Tensor& scale,
               const std::optional<at::Tensor>& bias) {
  const int64_t in = x.size(1), out = q.size(0), group = in / scale.size(1);
  const uint8_t* qp = static_cast<const uint8_t*>(q.const_data_ptr());
  const float* sp = scale.const_data_ptr<float>();
#if defined(__AVX2__)
  // bf16 activations of int8 codes: integer dot products (int16_x), four x rows a pass
  if (std::is_same_v<T, c10::BFloat16> && std::is_same_v<Code, Int8Code> && group % int16_x::kBlock == 0) {
    const int64_t M = x.size(0);
    std::vector<int16_t> xq(M * in);
    std::vector<float> xs(M * in / int16_x::kBlock);
    using int16_x::rows;
    constexpr decltype(&rows<1, true>) by_rows[2][4] = {{rows<1, false>, rows<2, false>, rows<3, false>, rows<4, false>},
                                                        {rows<1, true>, rows<2, true>, rows<3, true>, rows<4, true>}};
    const int8_t* codes = reinterpret_cast<const int8_t*>(qp);
    return nanoserve::few_rows_linear<T>(
        y, x, out, in, bias,
        [&](int64_t m, const float*, float* ym, int64_t r0, int64_t r1, int64_t n) {
          by_rows[group == in][n - 1](codes, sp, xq.data() + m * in, xs.data() + m * (in / int16_x::kBlock), ym, r0,
                                      r1, in, out, group);
        },
        4, [&](const float* xv, int64_t rows, int64_t n) { int16_x::stage(xv, rows * n, xq.data(), xs.data()); });
  }
#endif
#if defined(__AVX512VBMI__) && defined(__AVX512BF16__)
  // bf16 activations of fp8 codes: bf16 dot products (bf16_x), four x rows a pass
  if (std::is_same_v<T, c10::BFloat16> && std::is_same_v<Code, Fp8Code> && group % bf16_x::kBlock == 0) {
    std::vector<uint16_t> xs(x.size(0) * in);
    constexpr decltype(&bf16_x::rows<1>) by_rows[] = {bf16_x::rows<1>, bf16_x::rows<2>, bf16_x::rows<3>,
                                                      bf16_x::rows<4>};
    return nanoserve::few_rows_linear<T>(
        y, x, out, in, bias,
        [&](int64_t m, const float*, float* ym, int64_t r0, int64_t r1, int64_t n) {
          by_rows[n - 1](qp, sp, xs.data() + m * in, ym, r0, r1, in, out, group);
        },
        4, [&](const float* xv, int64_t rows, int64_t n) { bf16_x::stage(xv, rows * n, xs.data()); });
  }
#endif
#if defined(WIDE16)
  // four sixteen-wide chains a step, no rest. fp8 codes go four x rows a pass (16 chains, 4 sums
  // and 4 code vectors of the 32 registers), so each code's five-instruction widening serves four
  // rows; int8's two-instruction widening ran no faster four a pass, so it keeps pairs
  if (group % 64 == 0) {
    constexpr int64_t per_pass = std::is_same_v<Code, Fp8Code> ? 4 : 2;
    constexpr decltype(&rows<Code, Lanes16, 1>) by_rows[] = {rows<Code, Lanes16, 1>, rows<Code, Lanes16, 2>,
                                                             rows<Code, Lanes16, 3>, rows<Code, Lanes16, 4>};
    return nanoserve::few_rows_linear<T>(
        y, x, out, in, bias,
        [&](int64_t m, const float* xm, float* ym, int64_t r0, int64_t r1, int64_t n) {
          by_rows[n - 1](qp, sp, xm, ym, r0, r1, in, out, group);
        },
        per_pass);
  }
#endif
  nanoserve::few_rows_linear<T>(y, x, out, in, bias,
                                [&](int64_t m, const float* xm, float* ym, int64_t r0, int64_t r1, int64_t n) {
                                  (n == 2 ? rows<Code, Lanes8, 2> : rows<Code, Lanes8, 1>)(qp, sp, xm, ym, r0, r1, in,
                                                                                           out, group);
                                });
}

void quant_gemv(const at::Tensor& y, const at::Tensor& x, const at::Tensor& q, const at::Tensor& scale,
                const std::optional<at::Tensor>& bias) {
  check_codes(q, scale, "quant_gemv");
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 2 && x.size(0) >= 1 &&
              x.is_contiguous() && x.size(1) == q.size(1) &&
              (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16),
              "quant_gemv: x must be (rows, in) contiguous fp32 or bf16 with rows >= 1, got ", x.sizes());
  TORCH_CHECK(y.is_contiguous() && y.dim() == 2 && y.size(0) == x.size(0) && y.size(1) == q.size(0) &&
              y.scalar_type() == x.scalar_type(), "quant_gemv: y must be a contiguous (M, out) tensor in x's dtype");
  TORCH_CHECK(!bias || (bias->is_contiguous() && bias->dim() == 1 && bias->size(0) == q.size(0) &&
                        bias->scalar_type() == x.scalar_type()), "quant_gemv: bias must be (out,) in x's dtype");
  const bool fp8 = is_fp8(q);
  if (x.scalar_type() == at::kFloat)
    return fp8 ? gemv_impl<float, Fp8Code>(y, x, q, scale, bias) : gemv_impl<float, Int8Code>(y, x, q, scale, bias);
  return fp8 ? gemv_impl<c10::BFloat16, Fp8Code>(y, x, q, scale, bias)
             : gemv_impl<c10::BFloat16, Int8Code>(y, x, q, scale, bias);
}

// One row of `in` codes times their groups' scales into dst (fp32, or bf16 rounded to nearest even
// as torch rounds), sixteen at a time into bf16 on WIDE16's CPUs
template <typename Code, typename T>
void dequantize_row(T* dst, const uint8_t* q, const float* scale, int64_t in, int64_t group) {
  int64_t i = 0;
#if defined(WIDE16)
  if constexpr (std::is_same_v<T, c10::BFloat16>)
    for (; group % 16 == 0 && i < in; i += 16) {
      typedef uint32_t vu16 __attribute__((vector_size(64)));
      const __m512 v = _mm512_mul_ps(Code::load16(q + i), _mm512_set1_ps(scale[i / group] * Code::kScale));
      const vu16 bits = nanoserve::bf16_rounded_bits(reinterpret_cast<vu16>(v));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), _mm512_cvtepi32_epi16(reinterpret_cast<__m512i>(bits)));
    }
#endif
  for (; i < in; i += 8) nanoserve::store8(dst + i, Code::load(q + i) * (scale[i / group] * Code::kScale));
}

// out = dequantized codes, (out, in) in out's dtype (fp32 or bf16, rounded to nearest even)
template <typename T, typename Code>
void dequantize_impl(const at::Tensor& dst, const at::Tensor& q, const at::Tensor& scale) {
  const int64_t in = q.size(1), groups = scale.size(1), group = in / groups;
  const uint8_t* qp = static_cast<const uint8_t*>(q.const_data_ptr());
  const float* sp = scale.const_data_ptr<float>();
  T* op = static_cast<T*>(dst.data_ptr());
  at::parallel_for(0, q.size(0), 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) dequantize_row<Code>(op + r * in, qp + r * in, sp + r * groups, in, group);
  });
}

void quant_dequantize(const at::Tensor& dst, const at::Tensor& q, const at::Tensor& scale) {
  check_codes(q, scale, "quant_dequantize");
  TORCH_CHECK(dst.is_contiguous() && dst.sizes() == q.sizes() &&
              (dst.scalar_type() == at::kFloat || dst.scalar_type() == at::kBFloat16),
              "quant_dequantize: out must be a contiguous fp32 or bf16 tensor of the codes' shape");
  const bool fp8 = is_fp8(q);
  if (dst.scalar_type() == at::kFloat)
    return fp8 ? dequantize_impl<float, Fp8Code>(dst, q, scale) : dequantize_impl<float, Int8Code>(dst, q, scale);
  return fp8 ? dequantize_impl<c10::BFloat16, Fp8Code>(dst, q, scale)
             : dequantize_impl<c10::BFloat16, Int8Code>(dst, q, scale);
}

#if defined(NANOSERVE_AMX)
// More rows than the GEMV's, bf16 activations, on a CPU with AMX: a matmul on the tile unit that
// widens the weight a panel of 16 output rows at a time into a buffer that stays in cache, where
// quant_dequantize writes the whole layer to memory and oneDNN then repacks it every call. One
// scale a row: the codes looked up as their bf16 values (CodeToBf16, exact), each row's sums times
// its scale at the end; grouped scales: each weight dequantized as the reference does. The panel
// is tile A (16 output rows x 32 inputs), x is tile B (VNNI order: row j holds inputs 2j and 2j + 1
// of 16 x rows, in the panel's input order), so tile C is 16 output rows x 16 x rows of fp32 sums:
// y transposed, put back as it is written. The tile loads and products, and the widening, bound it
// (benchmarks/quantization.py's rows table measures it against the paths it replaces).
namespace amx {

constexpr int64_t kTile = 16;    // rows of a tile; also the x rows of one B tile
constexpr int64_t kK = 32;       // bf16 inputs in a tile row (64 bytes)
constexpr int64_t kMaxRows = 64; // x rows a call takes: four C tiles

// Linux gives a process the tile registers only once it asks (arch_prctl ARCH_REQ_XCOMP_PERM for
// XFEATURE_XTILEDATA); asked once
bool permitted() {
  static const bool ok = syscall(SYS_arch_prctl, 0x1023, 18) == 0;
  return ok;
}

// Every tile 16 rows of 64 bytes: C tiles 0-3, A tile 4, B tiles 5 and 6
void configure() {
  struct alignas(64) {
    uint8_t palette = 1, start_row = 0, reserved[14] = {};
    uint16_t colsb[16] = {};
    uint8_t rows[16] = {};
  } cfg;
  for (int t = 0; t < 7; ++t) cfg.colsb[t] = 64, cfg.rows[t] = kTile;
  _tile_loadconfig(&cfg);
}

// A 16 x 16 matrix of 32-bit values (v[i]: row i) transposed in place
void transpose16(__m512 v[16]) {
  __m512 t[16];
  for (int i = 0; i < 16; i += 2) {  // pairs of rows interleaved within each 128-bit lane
    t[i] = _mm512_unpacklo_ps(v[i], v[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(v[i], v[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {  // v[i + k], lane L: column 4L + k of rows i..i+3
    v[i] = _mm512_shuffle_ps(t[i], t[i + 2], 0x44);
    v[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], 0xEE);
    v[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    v[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
  }
  for (int k = 0; k < 4; ++k) {  // column 4L + k: lane L of v[k], v[4 + k], v[8 + k], v[12 + k]
    const __m512 u0 = _mm512_shuffle_f32x4(v[k], v[4 + k], 0x44), u1 = _mm512_shuffle_f32x4(v[k], v[4 + k], 0xEE);
    const __m512 u2 = _mm512_shuffle_f32x4(v[8 + k], v[12 + k], 0x44), u3 = _mm512_shuffle_f32x4(v[8 + k], v[12 + k], 0xEE);
    t[k] = _mm512_shuffle_f32x4(u0, u2, 0x88);
    t[4 + k] = _mm512_shuffle_f32x4(u0, u2, 0xDD);
    t[8 + k] = _mm512_shuffle_f32x4(u1, u3, 0x88);
    t[12 + k] = _mm512_shuffle_f32x4(u1, u3, 0xDD);
  }
  for (int i = 0; i < 16; ++i) v[i] = t[i];
}

// x (M rows of `in` bf16 values) as B tiles: for x-row tile t and input step s, 16 rows (j) of
// 16 x rows' pairs (inputs 2j and 2j + 1 of the step's 32): the transpose of the x rows' pairs;
// rows past M zeros. A step's 32 inputs are s * 32.. in order, or, for weights widened by
// CodeToBf16 (`lookup`), that conversion's order: steps 2b and 2b + 1 hold its w0 and w1 of
// inputs 64b..64b + 63
template <typename Lookup>
void stage(const uint16_t* x, int64_t M, int64_t in, uint16_t* xv, bool lookup) {
  const int64_t steps = in / kK;
  for (int64_t t = 0; t * kTile < M; ++t)
    for (int64_t s = 0; s < steps; s += 2) {
      __m512 v[2][kTile];
      for (int64_t m = 0; m < kTile; ++m) {
        const uint16_t* row = x + (t * kTile + m) * in + s * kK;
        if (t * kTile + m >= M) {
          v[0][m] = v[1][m] = _mm512_setzero_ps();
        } else if (lookup) {
          __m512bh x0, x1;
          Lookup::in_order(_mm512_loadu_si512(row), _mm512_loadu_si512(row + kK), x0, x1);
          v[0][m] = reinterpret_cast<__m512>(x0), v[1][m] = reinterpret_cast<__m512>(x1);
        } else {
          v[0][m] = _mm512_loadu_ps(row);
          v[1][m] = s + 1 < steps ? _mm512_loadu_ps(row + kK) : _mm512_setzero_ps();
        }
      }
      for (int64_t h = 0; h < 2 && s + h < steps; ++h) {
        transpose16(v[h]);
        for (int64_t j = 0; j < kTile; ++j) _mm512_storeu_ps(xv + ((t * steps + s + h) * kTile + j) * kK, v[h][j]);
      }
    }
}

// C tiles 0..T-1 = the panel (16 rows of `in` bf16, `in` apart) times the staged x, stored at c
template <int T>
void panel(const uint16_t* a, const uint16_t* xv, int64_t in, float* c) {
  const int64_t steps = in / kK;
  _tile_zero(0);
  if constexpr (T > 1) _tile_zero(1);
  if constexpr (T > 2) _tile_zero(2);
  if constexpr (T > 3) _tile_zero(3);
  const auto b = [&](int64_t t, int64_t s) { return xv + (t * steps + s) * kTile * kK; };
  for (int64_t s = 0; s < steps; ++s) {
    _tile_loadd(4, a + s * kK, in * 2);
    _tile_loadd(5, b(0, s), 64);
    _tile_dpbf16ps(0, 4, 5);
    if constexpr (T > 1) { _tile_loadd(6, b(1, s), 64); _tile_dpbf16ps(1, 4, 6); }
    if constexpr (T > 2) { _tile_loadd(5, b(2, s), 64); _tile_dpbf16ps(2, 4, 5); }
    if constexpr (T > 3) { _tile_loadd(6, b(3, s), 64); _tile_dpbf16ps(3, 4, 6); }
  }
  _tile_stored(0, c, 64);
  if constexpr (T > 1) _tile_stored(1, c + kTile * kTile, 64);
  if constexpr (T > 2) _tile_stored(2, c + 2 * kTile * kTile, 64);
  if constexpr (T > 3) _tile_stored(3, c + 3 * kTile * kTile, 64);
}

// One row of `in` codes (a multiple of 64) as their values in bf16, in CodeToBf16's order
template <typename Lookup>
void lookup_row(const Lookup& to_bf16, uint16_t* dst, const uint8_t* q, int64_t in) {
  for (int64_t i = 0; i < in; i += 64) {
    __m512bh w0, w1;
    to_bf16(_mm512_loadu_si512(q + i), w0, w1);
    _mm512_storeu_si512(dst + i, reinterpret_cast<__m512i>(w0));
    _mm512_storeu_si512(dst + i + kK, reinterpret_cast<__m512i>(w1));
  }
}

template <typename Code, typename Lookup>
void linear(const at::Tensor& y, const at::Tensor& x, const at::Tensor& q, const at::Tensor& scale,
            const std::optional<at::Tensor>& bias) {
  const int64_t M = x.size(0), in = x.size(1), out = q.size(0), groups = scale.size(1), group = in / groups;
  const int64_t tiles = (M + kTile - 1) / kTile;
  // one scale a row: the codes looked up as bf16 (exact) and each row's sums times its scale, as
  // the GEMV does; else each weight dequantized as the reference does (a multiply, rounded)
  const bool lookup = groups == 1 && in % 64 == 0;
  // kept from call to call, as few_rows_linear keeps its staging: a fresh one this size would be a
  // fresh mapping to fault in every call (the threads below read it by pointer: a thread_local
  // named inside their lambda would be their own)
  thread_local std::vector<uint16_t> staged;
  if (static_cast<int64_t>(staged.size()) < tiles * kTile * in) staged.resize(tiles * kTile * in);
  const uint16_t* xv = staged.data();
  stage<Lookup>(static_cast<const uint16_t*>(x.const_data_ptr()), M, in, staged.data(), lookup);
  const uint8_t* qp = static_cast<const uint8_t*>(q.const_data_ptr());
  const float* sp = scale.const_data_ptr<float>();
  auto* yp = static_cast<c10::BFloat16*>(y.data_ptr());
  const c10::BFloat16* bp = bias ? bias->const_data_ptr<c10::BFloat16>() : nullptr;
  constexpr decltype(&panel<1>) by_tiles[] = {panel<1>, panel<2>, panel<3>, panel<4>};
  at::parallel_for(0, (out + kTile - 1) / kTile, 1, [&](int64_t p0, int64_t p1) {
    const Lookup to_bf16;
    thread_local std::vector<uint16_t> a;
    if (static_cast<int64_t>(a.size()) < kTile * in) a.resize(kTile * in);
    alignas(64) float c[kMaxRows / kTile][kTile][kTile];
    alignas(64) float sums[kTile];
    configure();
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t r0 = p * kTile, rows = std::min(kTile, out - r0);
      for (int64_t r = 0; r < rows; ++r) {
        if (lookup)
          lookup_row(to_bf16, a.data() + r * in, qp + (r0 + r) * in, in);
        else
          dequantize_row<Code>(reinterpret_cast<c10::BFloat16*>(a.data()) + r * in, qp + (r0 + r) * in,
                               sp + (r0 + r) * groups, in, group);
      }
      if (rows < kTile) std::fill(a.begin() + rows * in, a.begin() + kTile * in, 0);
      by_tiles[tiles - 1](a.data(), xv, in, &c[0][0][0]);
      const __m512 row_scale = lookup ? _mm512_maskz_loadu_ps((1u << rows) - 1, sp + r0) : _mm512_set1_ps(1.f);
      for (int64_t t = 0; t < tiles; ++t) {  // tile t's column m: x row 16t + m's 16 outputs
        __m512 v[kTile];
        for (int64_t r = 0; r < kTile; ++r) v[r] = _mm512_load_ps(c[t][r]);
        transpose16(v);
        for (int64_t m = 0; m < kTile && t * kTile + m < M; ++m) {
          _mm512_store_ps(sums, _mm512_mul_ps(v[m], row_scale));
          nanoserve::finish_rows(yp + (t * kTile + m) * out + r0, sums, bp ? bp + r0 : nullptr, 0, rows);
        }
      }
    }
    _tile_release();
  });
}

}  // namespace amx
#endif

// Can quant_amx_linear run here (built with AMX, and the OS hands out the tiles)?
bool quant_amx_available() {
#if defined(NANOSERVE_AMX)
  return amx::permitted();
#else
  return false;
#endif
}

// y = x W^T (+ bias) for 1..64 rows of bf16 x on the tile unit: with one scale a row (and inputs a
// multiple of 64) each row's fp32 sum over its codes times its scale, as the GEMV (int8 codes
// -127..127: the lookup reads -128 as -0); else W the codes times their scales rounded to bf16 as
// quant_dequantize rounds them; then the bias, rounded once
void quant_amx_linear(const at::Tensor& y, const at::Tensor& x, const at::Tensor& q, const at::Tensor& scale,
                      const std::optional<at::Tensor>& bias) {
  check_codes(q, scale, "quant_amx_linear");
  TORCH_CHECK(quant_amx_available(), "quant_amx_linear: this CPU or build has no AMX tiles");
  TORCH_CHECK((q.size(1) / scale.size(1)) % 16 == 0, "quant_amx_linear: scale groups must be a multiple of 16 values");
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 2 && x.is_contiguous() && x.scalar_type() == at::kBFloat16 &&
              x.size(0) >= 1 && x.size(0) <= 64 && x.size(1) == q.size(1) && x.size(1) % 32 == 0,
              "quant_amx_linear: x must be (rows, in) contiguous bf16, 1 <= rows <= 64, in a multiple of 32, got ",
              x.sizes());
  TORCH_CHECK(y.is_contiguous() && y.dim() == 2 && y.size(0) == x.size(0) && y.size(1) == q.size(0) &&
              y.scalar_type() == at::kBFloat16, "quant_amx_linear: y must be a contiguous (rows, out) bf16 tensor");
  TORCH_CHECK(!bias || (bias->is_contiguous() && bias->dim() == 1 && bias->size(0) == q.size(0) &&
                        bias->scalar_type() == at::kBFloat16), "quant_amx_linear: bias must be (out,) bf16");
#if defined(NANOSERVE_AMX)
  return is_fp8(q) ? amx::linear<Fp8Code, nanoserve::E4m3ToBf16>(y, x, q, scale, bias)
                   : amx::linear<Int8Code, nanoserve::Int8ToBf16>(y, x, q, scale, bias);
#endif
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(nanoserve_cpu, m) {
  m.def("quant_gemv(Tensor(a!) y, Tensor x, Tensor qweight, Tensor weight_scale, Tensor? bias) -> ()",
        &quant_gemv);
  m.def("quant_dequantize(Tensor(a!) out, Tensor qweight, Tensor weight_scale) -> ()", &quant_dequantize);
  m.def("quant_amx_linear(Tensor(a!) y, Tensor x, Tensor qweight, Tensor weight_scale, Tensor? bias) -> ()",
        &quant_amx_linear);
  m.def("quant_amx_available() -> bool", &quant_amx_available);
}
