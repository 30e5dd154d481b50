// Linear layers over 8-bit weight codes on a CPU (kernels/quantization.py defines the formats):
// the GEMV of a few rows reading the codes and scales directly, and the dequantization of a
// layer into a buffer (for batches of more rows, which then run a float matmul on it).
//
// A row's weight is int8 or fp8 e4m3 codes with an fp32 scale per group of input values (one group:
// per-output-channel scales; 32: GGUF's Q8_0 blocks). The GEMV streams the codes as cpu_gemv.cpp
// streams a float weight (a contiguous range of rows per thread, in memory order), widens each code
// to fp32, sums a group's products in fp32 and adds the group's sum times its scale: one byte read
// per weight instead of two (bf16) or four (fp32). The e4m3 -> fp32 widening is exact: an e4m3
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

#include <cstdint>
#include <cstring>
#include <optional>
#include <type_traits>

#include "cpu_common.h"
#include "cpu_few_rows.h"

// Sixteen codes a vector on AVX-512 CPUs that run a 512-bit instruction at full width; on a CPU
// that splits it into two 256-bit halves (cpu_build.py defines NANOSERVE_SPLIT512 there) the wider
// loop was slower (benchmarks/quantization.py, results in benchmarks/results/)
#if defined(__AVX512F__) && defined(__F16C__) && !defined(NANOSERVE_SPLIT512)
#define WIDE16
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

// out = dequantized codes, (out, in) in out's dtype (fp32 or bf16, rounded to nearest even)
template <typename T, typename Code>
void dequantize_impl(const at::Tensor& dst, const at::Tensor& q, const at::Tensor& scale) {
  const int64_t in = q.size(1), groups = scale.size(1), group = in / groups;
  const uint8_t* qp = static_cast<const uint8_t*>(q.const_data_ptr());
  const float* sp = scale.const_data_ptr<float>();
  T* op = static_cast<T*>(dst.data_ptr());
  at::parallel_for(0, q.size(0), 16, [&](int64_t r0, int64_t r1) {
    float buf[8];
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t i = 0; i < in; i += 8) {
        const vf8 v = Code::load(qp + r * in + i) * (sp[r * groups + i / group] * Code::kScale);
        if constexpr (std::is_same_v<T, float>) {
          std::memcpy(op + r * in + i, &v, sizeof v);
        } else {
          std::memcpy(buf, &v, sizeof v);
          for (int k = 0; k < 8; ++k) op[r * in + i + k] = static_cast<T>(buf[k]);
        }
      }
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

}  // namespace

TORCH_LIBRARY_FRAGMENT(nanoserve_cpu, m) {
  m.def("quant_gemv(Tensor(a!) y, Tensor x, Tensor qweight, Tensor weight_scale, Tensor? bias) -> ()",
        &quant_gemv);
  m.def("quant_dequantize(Tensor(a!) out, Tensor qweight, Tensor weight_scale) -> ()", &quant_dequantize);
}
