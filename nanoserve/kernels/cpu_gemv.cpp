// A linear layer of one or two rows on a CPU (batch-1 and batch-2 decode): y = x W^T + b.
//
// At one row a linear reads every weight once and does one multiply-add per weight, so its speed
// is the rate at which the weight streams in from DRAM. Here each thread takes a contiguous range
// of output rows and walks it in memory order, one weight row at a time: a single sequential stream
// per core, which the hardware prefetcher follows. The weight is the layer's dense (out, in) matrix in
// fp32 or bf16 (bf16 widened to fp32 by a shift); products and sums are fp32, and a bf16 output is
// rounded once at the end, as oneDNN's bf16 kernels round.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <type_traits>
#include <vector>

#include "cpu_common.h"

namespace {

using nanoserve::load8;
using nanoserve::sum8;
using nanoserve::vf8;

// Output rows [r0, r1) for M rows of x (fp32, `in` apart): four chains of multiply-adds per x row,
// so the adds of one chain wait on nothing but the loads; `in` is a multiple of 32.
template <typename T, int M>
void rows(const T* w, const float* x, float* y, int64_t r0, int64_t r1, int64_t in, int64_t out) {
  for (int64_t r = r0; r < r1; ++r) {
    const T* wr = w + r * in;
    vf8 acc[M][4] = {};
    for (int64_t i = 0; i < in; i += 32)
      for (int c = 0; c < 4; ++c) {
        const vf8 wv = load8(wr + i + 8 * c);
        for (int m = 0; m < M; ++m) acc[m][c] += wv * load8(x + m * in + i + 8 * c);
      }
    for (int m = 0; m < M; ++m) y[m * out + r] = sum8((acc[m][0] + acc[m][1]) + (acc[m][2] + acc[m][3]));
  }
}

template <typename T>
void gemv_impl(const at::Tensor& y, const at::Tensor& x, const at::Tensor& weight,
               const std::optional<at::Tensor>& bias) {
  // x: (M, in) contiguous; weight: (out, in) contiguous; y: (M, out) contiguous; bias: (out,)
  const int64_t M = x.size(0), in = x.size(1), out = weight.size(0);
  const T* w = static_cast<const T*>(weight.const_data_ptr());
  // fp32 x and sums in place; a bf16 x widened to fp32 once, its sums kept in fp32 until rounded
  constexpr bool f32 = std::is_same_v<T, float>;
  std::vector<float> xf(f32 ? 0 : M * in), yf(f32 ? 0 : M * out);
  const T* xp = static_cast<const T*>(x.const_data_ptr());
  if constexpr (!f32) nanoserve::to_float(xp, xf.data(), M * in);
  const float* xv = f32 ? reinterpret_cast<const float*>(xp) : xf.data();
  float* yp = f32 ? static_cast<float*>(y.data_ptr()) : yf.data();
  // 64 rows a task at least: fewer cost more to hand to a thread than to compute
  at::parallel_for(0, out, 64, [&](int64_t r0, int64_t r1) {
    (M == 1 ? rows<T, 1> : rows<T, 2>)(w, xv, yp, r0, r1, in, out);
  });
  T* yo = static_cast<T*>(y.data_ptr());
  const T* b = bias ? static_cast<const T*>(bias->const_data_ptr()) : nullptr;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t r = 0; r < out; ++r) {
      const float v = yp[m * out + r];  // the sum, then the bias in fp32, rounded once
      yo[m * out + r] = static_cast<T>(b ? v + static_cast<float>(b[r]) : v);
    }
}

void gemv(const at::Tensor& y, const at::Tensor& x, const at::Tensor& weight,
          const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.device().is_cpu() && weight.device().is_cpu(), "gemv: CPU tensors only");
  TORCH_CHECK(x.dim() == 2 && (x.size(0) == 1 || x.size(0) == 2) && x.is_contiguous(),
              "gemv: x must be (1 or 2, in) contiguous, got ", x.sizes());
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
