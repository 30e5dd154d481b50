// Greedy sampling's argmax over the logits rows, for CPUs. torch.argmax is many times slower than
// its max (amax): its reduction carries (value, index) pairs through a generic loop. Here each row is one pass of vector
// compares, each lane keeping its largest value and where it was. Same result as torch.argmax:
// the first index of the maximum, and a row with a NaN gives its first NaN (torch counts NaN as
// the largest).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>

#include "cpu_common.h"

namespace {

using nanoserve::vf8;
using nanoserve::vi8;

int64_t argmax_row(const float* p, int64_t n) {
  int64_t i = 0, best = 0;
  float m = -INFINITY;
  if (n >= 8) {
    vf8 vmax = nanoserve::load8(p);
    vi8 vidx = {0, 1, 2, 3, 4, 5, 6, 7}, lanes = vidx, nan = vmax != vmax;
    for (i = 8; i + 8 <= n; i += 8) {
      const vf8 v = nanoserve::load8(p + i);
      const vi8 gt = v > vmax;  // strictly: a lane keeps its first maximum
      vmax = gt ? v : vmax;
      vidx = gt ? lanes + static_cast<int32_t>(i) : vidx;
      nan |= v != v;
    }
    for (int k = 0; k < 8; ++k) {
      if (nan[k]) {  // the first NaN, found by a plain scan
        int64_t j = 0;
        while (!std::isnan(p[j])) ++j;
        return j;
      }
    }
    m = vmax[0], best = vidx[0];
    for (int k = 1; k < 8; ++k)  // the largest lane value, at its smallest index
      if (vmax[k] > m || (vmax[k] == m && vidx[k] < best)) m = vmax[k], best = vidx[k];
  }
  for (; i < n; ++i) {  // the tail (or a row under 8 values)
    if (std::isnan(p[i])) {
      int64_t j = 0;
      while (!std::isnan(p[j])) ++j;
      return j;
    }
    if (p[i] > m || (i == 0 && n < 8)) m = p[i], best = i;
  }
  return best;
}

// allocates its (rows,) int64 result here: a Python torch.empty per step costs more, cold, than
// the whole op on a row of logits
at::Tensor argmax(const at::Tensor& x) {
  TORCH_CHECK(x.device().is_cpu() && x.is_contiguous() && x.dim() == 2 && x.size(1) > 0 &&
              x.scalar_type() == at::kFloat, "argmax: x must be a contiguous (rows, n > 0) fp32 CPU tensor");
  TORCH_CHECK(x.size(1) < (int64_t{1} << 31), "argmax: rows of 2^31 values or more");
  const int64_t rows = x.size(0), n = x.size(1);
  at::Tensor out = at::empty({rows}, x.options().dtype(at::kLong));
  const float* xp = x.const_data_ptr<float>();
  int64_t* op = out.data_ptr<int64_t>();
  // a second thread only for 64K values or more: one row of logits (batch 1) stays on one thread
  at::parallel_for(0, rows, std::max<int64_t>(1, (int64_t{1} << 16) / n), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) op[r] = argmax_row(xp + r * n, n);
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(nanoserve_cpu, m) {
  m.def("argmax(Tensor x) -> Tensor", &argmax);
}
