// A linear layer of a few rows on a CPU (decode at small batch, a speculative verify): y = x W^T + b.
//
// At one row a linear reads every weight once and does one multiply-add per weight, so its speed
// is the rate at which the weight streams in from DRAM. Here each thread takes a contiguous range
// of output rows and walks it in memory order, one weight row at a time: a single sequential stream
// per core, prefetched a few KB ahead (cpu_common.h's prefetch_ahead) where the hardware prefetcher
// alone keeps too few lines in flight. The weight is the layer's dense (out, in) matrix in
// fp32 or bf16; products and sums are fp32, and a bf16 output is rounded once at the end, as
// oneDNN's bf16 kernels round. Where the CPU has AVX512-BF16, bf16 goes through vdpbf16ps, which
// adds the products of 32 bf16 pairs into 16 fp32 lanes exactly (a bf16 product fits fp32): a
// third of the instructions per weight of widening each bf16 by a shift, so more of the stream's
// loads are in flight at once. Without it, bf16 is widened and goes the fp32 way.
//
// More rows go in pairs over cache-sized tiles of weight rows (cpu_few_rows.h), each row summed as
// it would be alone: a verify row of speculative decoding equals the one-row decode step it
// replaces, bit for bit, in bf16 too.
#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#if defined(__AVX512BF16__) && defined(__AVX512BW__)
#include <immintrin.h>
#endif

#include <cstdint>
#include <optional>
#include <type_traits>

#include "cpu_common.h"
#include "cpu_few_rows.h"

namespace {

using nanoserve::fma8;
using nanoserve::load8;
using nanoserve::prefetch_ahead;
using nanoserve::sum8;
using nanoserve::vf8;

// Output rows [r0, r1) for M rows of x (fp32, `in` apart): four chains of multiply-adds per x row,
// so the adds of one chain wait on nothing but the loads; `in` is a multiple of 32.
template <typename T, int M>
void rows(const T* w, const float* x, float* y, int64_t r0, int64_t r1, int64_t in, int64_t out) {
  for (int64_t r = r0; r < r1; ++r) {
    const T* wr = w + r * in;
    vf8 acc[M][4] = {};
    for (int64_t i = 0; i < in; i += 32) {
      for (int64_t b = 0; b < 32 * static_cast<int64_t>(sizeof(T)); b += 64)
        prefetch_ahead(reinterpret_cast<const char*>(wr + i) + b);
      for (int c = 0; c < 4; ++c) {
        const vf8 wv = load8(wr + i + 8 * c);
        for (int m = 0; m < M; ++m) acc[m][c] = fma8(wv, load8(x + m * in + i + 8 * c), acc[m][c]);
      }
    }
    for (int m = 0; m < M; ++m) y[m * out + r] = sum8((acc[m][0] + acc[m][1]) + (acc[m][2] + acc[m][3]));
  }
}

#if defined(__AVX512BF16__) && defined(__AVX512BW__)
// The same for bf16 rows of x (bf16, `in` apart, `in` a multiple of 64) with vdpbf16ps: two chains
// of 32 weights per x row
template <int M>
void rows_bf16(const c10::BFloat16* w, const c10::BFloat16* x, float* y, int64_t r0, int64_t r1, int64_t in,
               int64_t out) {
  for (int64_t r = r0; r < r1; ++r) {
    const c10::BFloat16* wr = w + r * in;
    __m512 acc[M][2];
    for (int m = 0; m < M; ++m) acc[m][0] = acc[m][1] = _mm512_setzero_ps();
    for (int64_t i = 0; i < in; i += 64)
      for (int c = 0; c < 2; ++c) {
        prefetch_ahead(wr + i + 32 * c);
        const __m512bh wv = (__m512bh)_mm512_loadu_si512(wr + i + 32 * c);
        for (int m = 0; m < M; ++m)
          acc[m][c] = _mm512_dpbf16_ps(acc[m][c], wv, (__m512bh)_mm512_loadu_si512(x + m * in + i + 32 * c));
      }
    for (int m = 0; m < M; ++m) y[m * out + r] = _mm512_reduce_add_ps(_mm512_add_ps(acc[m][0], acc[m][1]));
  }
}
#endif

template <typename T>
void gemv_impl(const at::Tensor& y, const at::Tensor& x, const at::Tensor& weight,
               const std::optional<at::Tensor>& bias) {
  // x: (M, in) contiguous; weight: (out, in) contiguous; y: (M, out) contiguous; bias: (out,)
  const int64_t in = x.size(1), out = weight.size(0);
  const T* w = static_cast<const T*>(weight.const_data_ptr());
  const T* xt = static_cast<const T*>(x.const_data_ptr());
  nanoserve::few_rows_linear<T>(y, x, out, in * static_cast<int64_t>(sizeof(T)), bias,
                                [&](int64_t m, const float* xm, float* ym, int64_t r0, int64_t r1, int64_t n) {
                                  const bool pair = n == 2;
#if defined(__AVX512BF16__) && defined(__AVX512BW__)
                                  if constexpr (std::is_same_v<T, c10::BFloat16>)
                                    if (in % 64 == 0)
                                      return (pair ? rows_bf16<2> : rows_bf16<1>)(w, xt + m * in, ym, r0, r1, in, out);
#endif
                                  (pair ? rows<T, 2> : rows<T, 1>)(w, xm, ym, r0, r1, in, out);
                                });
}

void gemv(const at::Tensor& y, const at::Tensor& x, const at::Tensor& weight,
          const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.device().is_cpu() && weight.device().is_cpu(), "gemv: CPU tensors only");
  TORCH_CHECK(x.dim() == 2 && x.size(0) >= 1 && x.is_contiguous(),
              "gemv: x must be (rows, in) contiguous with rows >= 1, got ", x.sizes());
  TORCH_CHECK(weight.dim() == 2 && weight.is_contiguous() && weight.size(1) == x.size(1) &&
              x.size(1) % 32 == 0 && weight.scalar_type() == x.scalar_type(),
              "gemv: weight must be a contiguous (out, in) matrix in x's dtype with in % 32 == 0");
  TORCH_CHECK(y.is_contiguous() && y.dim() == 2 && y.size(0) == x.size(0) && y.size(1) == weight.size(0) &&
              y.scalar_type() == x.scalar_type(), "gemv: y must be a contiguous (M, out) tensor in x's dtype");
  TORCH_CHECK(!bias || (bias->is_contiguous() && bias->dim() == 1 && bias->size(0) == weight.size(0) &&
                        bias->scalar_type() == x.scalar_type()), "gemv: bias must be (out,) in x's dtype");
  switch (x.scalar_type()) {
    case at::kFloat: return gemv_impl<float>(y, x, weight, bias);
    case at::kBFloat16: return gemv_impl<c10::BFloat16>(y, x, weight, bias);
    default: TORCH_CHECK(false, "gemv: fp32 or bf16 only, not ", x.scalar_type());
  }
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(nanoserve_cpu, m) {
  m.def("gemv(Tensor(a!) y, Tensor x, Tensor weight, Tensor? bias) -> ()", &gemv);
}
