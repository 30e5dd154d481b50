// What both GEMVs share (cpu_gemv.cpp over a float weight, cpu_quant_gemv.cpp over 8-bit codes):
// y = x W^T + b for a few rows of x, each thread a contiguous range of output rows.
//
// x is staged in fp32 once (a bf16 x widened), sums stay fp32 until y is written (the sum, then the
// bias, rounded once). A pass takes up to `per_pass` x rows (two, or four where a kernel's
// accumulators fit the registers); past one pass, a thread's range goes in tiles of weight rows
// small enough to stay in cache while each pass walks the tile, so DRAM still reads each weight
// once; each x row is summed as it would be alone, so an output row does not depend on its
// neighbours.
#pragma once

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <type_traits>
#include <vector>

#include "cpu_common.h"

namespace nanoserve {

constexpr int64_t kTileBytes = 64 << 10;  // of weight rows: fits the L2 of any x86 core

struct NoStage {
  void operator()(const float*, int64_t, int64_t) const {}
};

// Output rows [r0, r1) of y (T): their fp32 sums plus the bias, rounded once (sums may be y itself)
template <typename T>
inline void finish_rows(T* y, const float* sums, const T* bias, int64_t r0, int64_t r1) {
  int64_t r = r0;
  if constexpr (std::is_same_v<T, c10::BFloat16>)
    for (; r + 8 <= r1; r += 8) store8(y + r, bias ? load8(sums + r) + load8(bias + r) : load8(sums + r));
  for (; r < r1; ++r) y[r] = static_cast<T>(bias ? sums[r] + static_cast<float>(bias[r]) : sums[r]);
}

// run(m, x, y, r0, r1, n): output rows [r0, r1) of rows m..m+n-1 of x (n <= per_pass), staged in
// fp32 at x (`in` apart), into y (rows `out` apart); weight_row_bytes: one weight row as stored;
// stage(x, M, in), once before the rows run: a kernel's own copy of x in another form
template <typename T, typename Run, typename Stage = NoStage>
void few_rows_linear(const at::Tensor& y, const at::Tensor& x, int64_t out, int64_t weight_row_bytes,
                     const std::optional<at::Tensor>& bias, Run run, int64_t per_pass = 2, Stage stage = {}) {
  const int64_t M = x.size(0), in = x.size(1);
  constexpr bool f32 = std::is_same_v<T, float>;
  // the fp32 staging of a bf16 x and y, kept from call to call: a fresh allocation the size of a
  // large layer's output (the lm_head's) is a fresh mapping to fault in, every step
  thread_local std::vector<float> xf, yf;
  if constexpr (!f32) {
    if (static_cast<int64_t>(xf.size()) < M * in) xf.resize(M * in);
    if (static_cast<int64_t>(yf.size()) < M * out) yf.resize(M * out);
  }
  const T* xp = static_cast<const T*>(x.const_data_ptr());
  if constexpr (!f32) to_float(xp, xf.data(), M * in);
  const float* xv = f32 ? reinterpret_cast<const float*>(xp) : xf.data();
  T* yo = static_cast<T*>(y.data_ptr());
  const T* b = bias ? static_cast<const T*>(bias->const_data_ptr()) : nullptr;
  float* yp = f32 ? reinterpret_cast<float*>(yo) : yf.data();  // an fp32 y takes its sums in place
  stage(xv, M, in);
  const int64_t tile = M <= per_pass ? out : std::max<int64_t>(1, kTileBytes / weight_row_bytes);
  // 64 rows a task at least: fewer cost more to hand to a thread than to compute
  at::parallel_for(0, out, 64, [&](int64_t r0, int64_t r1) {
    for (int64_t t0 = r0; t0 < r1; t0 += tile)
      for (int64_t m = 0; m < M; m += per_pass)
        run(m, xv + m * in, yp + m * out, t0, std::min(r1, t0 + tile), std::min(per_pass, M - m));
    if (!f32 || b)  // each thread rounds and biases its own rows, still in cache
      for (int64_t m = 0; m < M; ++m) finish_rows(yo + m * out, yp + m * out, b, r0, r1);
  });
}

}  // namespace nanoserve
