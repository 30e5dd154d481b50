// Paged decode attention on a CPU: each query token reads its K/V rows where they sit in the
// paged cache, instead of gathering them into a contiguous copy first (see cpu_attention.py).
//
// A work item is a sequence (or, when there are too few sequences to keep every thread busy,
// one kv head of a sequence). Its query heads read each K row and each V row once, from DRAM,
// and nothing is written but the output; while it computes with one cache block, the next 16 KB
// of what the thread reads (its K, its V, then the next item's K) is prefetched, a few lines at a
// time between its arithmetic (BlockStream in cpu_common.h). Scores, softmax and the weighted sum
// of V run in fp32 whatever the cache's dtype (fp32, bf16, fp16 as the model's; or fp8 e4m3 beside
// any model dtype, its k_scale folded into the query and its v_scale into the output, so
// dequantizing costs a few instructions per eight values read: to_float in cpu_common.h). bf16
// queries over a bf16 or fp8 cache on a CPU with AVX512-BF16 go to cpu_attention_bf16.cpp. Work
// items are spread over torch's own OpenMP threads (at::parallel_for), so the process keeps one
// thread team.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "cpu_common.h"

namespace nanoserve {
// The whole op for bf16 queries over a bf16 or fp8 cache on a CPU with AVX512-BF16 dot products
// (cpu_attention_bf16.cpp); false, doing nothing, where the library was built without them (fp8:
// or without AVX512-VBMI) or head_dim is not a multiple of 32 (fp8: 64).
bool decode_attention_bf16_dot(const at::Tensor& q, const at::Tensor& out, const at::Tensor& k_cache,
                               const at::Tensor& v_cache, const at::Tensor& block_tables,
                               const at::Tensor& seq_lens, double scale, double k_scale, double v_scale,
                               int64_t nh);
// Whether decode_attention_bf16_dot takes an fp8 cache (head_dim a multiple of 64) in this build
bool reads_fp8_as_bf16();
}  // namespace nanoserve

namespace {

using nanoserve::load8;
using nanoserve::sum8;
using nanoserve::to_float;
using nanoserve::vf8;

// (sum(a[0]), ..., sum(a[7])): eight horizontal sums at once, a tree of pairwise lane sums
inline vf8 sum8x8(const vf8* a) {
  auto pairs = [](vf8 x, vf8 y) {  // (x0+x1, x2+x3, y0+y1, y2+y3, x4+x5, x6+x7, y4+y5, y6+y7)
    return __builtin_shufflevector(x, y, 0, 2, 8, 10, 4, 6, 12, 14) +
           __builtin_shufflevector(x, y, 1, 3, 9, 11, 5, 7, 13, 15);
  };
  const vf8 u = pairs(pairs(a[0], a[1]), pairs(a[2], a[3]));  // lanes 0-3 and 4-7 of a[0..3]
  const vf8 w = pairs(pairs(a[4], a[5]), pairs(a[6], a[7]));
  return __builtin_shufflevector(u, w, 0, 1, 2, 3, 8, 9, 10, 11) +
         __builtin_shufflevector(u, w, 4, 5, 6, 7, 12, 13, 14, 15);
}

// One work item: a sequence's kv heads [h0, h0 + nh) and the nh * group query heads that read
// them. Scores against the L cached keys, softmax, then the weighted sum of the values, a cache
// block at a time: a block's rows of these heads are read from DRAM once (contiguous when nh is
// every kv head), then each query head runs over them from L1 with its query (or output
// accumulator) in registers. Rows are hd = 8 * NV floats; NV > 0 fixes that at compile time.
template <typename T, int NV>
void attend(const float* qf, const T* k_cache, const T* v_cache, const int32_t* table, int64_t L,
            int64_t h0, int64_t nh, int64_t group, int64_t nv_runtime, int64_t block_size,
            int64_t block_stride, int64_t token_stride, float* scores, float* out, float* buf,
            nanoserve::BlockStream& stream) {
  const int64_t nv = NV > 0 ? NV : nv_runtime, hd = 8 * nv, nq = nh * group;
  const int64_t blocks = (L + block_size - 1) / block_size, Ls = (L + 7) / 8 * 8;  // a score row
  // rows of block b for heads h0.. as fp32, `stride` apart: in place for an fp32 cache, else
  // converted into buf as (n, nh, hd)
  auto block_rows = [&](const T* cache, int64_t b, int64_t n, int64_t& stride) -> const float* {
    const T* base = cache + table[b] * block_stride + h0 * hd;
    if constexpr (std::is_same_v<T, float>) {
      stride = token_stride;
      return base;
    } else {
      for (int64_t o = 0; o < n; ++o) to_float(base + o * token_stride, buf + o * nh * hd, nh * hd);
      stride = nh * hd;
      return buf;
    }
  };
  // visit(b, n, rows, stride) for each block of `cache` in order
  auto each_block = [&](const T* cache, auto&& visit) {
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t n = std::min(block_size, L - b * block_size);
      int64_t stride;
      const float* rows = block_rows(cache, b, n, stride);
      visit(b, n, rows, stride);
    }
  };
  // a unit of work: a key's score, or a value row's add, for one query head
  each_block(k_cache, [&](int64_t b, int64_t n, const float* k, int64_t stride) {  // scores: (nq, L)
    stream.at(b, nq * n);
    for (int64_t j = 0; j < nq; ++j) {
      vf8 q[NV > 0 ? NV : 16];
      for (int64_t i = 0; i < nv; ++i) q[i] = load8(qf + j * hd + 8 * i);
      const float* kj = k + (j / group) * hd;
      float* s = scores + j * Ls + b * block_size;
      int64_t o = 0;
      for (; o + 8 <= n; o += 8) {  // eight keys at a time, their eight sums reduced together
        vf8 acc[8] = {};
        for (int64_t i = 0; i < nv; ++i)
          for (int t = 0; t < 8; ++t) acc[t] += q[i] * load8(kj + (o + t) * stride + 8 * i);
        const vf8 r = sum8x8(acc);
        std::memcpy(s + o, &r, sizeof r);
        stream.done(8);
      }
      for (; o < n; ++o) {
        const float* row = kj + o * stride;
        vf8 a0 = q[0] * load8(row), a1 = {};  // two chains of multiply-adds, not one
        for (int64_t i = 1; i < nv; ++i) (i % 2 ? a1 : a0) += q[i] * load8(row + 8 * i);
        s[o] = sum8(a0 + a1);
        stream.done(1);
      }
    }
  });
  nanoserve::softmax_rows(scores, nq, L, Ls, out + nq * hd);  // out: nq * hd outputs, then 1/sums
  std::fill(out, out + nq * hd, 0.f);
  each_block(v_cache, [&](int64_t b, int64_t n, const float* v, int64_t stride) {
    stream.at(blocks + b, nq * n);
    for (int64_t j = 0; j < nq; ++j) {
      vf8 acc[NV > 0 ? NV : 16];
      for (int64_t i = 0; i < nv; ++i) acc[i] = load8(out + j * hd + 8 * i);
      const float* vj = v + (j / group) * hd;
      const float* p = scores + j * Ls + b * block_size;
      for (int64_t o = 0; o < n; ++o)
        for (int64_t i = 0; i < nv; ++i) acc[i] += p[o] * load8(vj + o * stride + 8 * i);
      stream.done(n);
      for (int64_t i = 0; i < nv; ++i) std::memcpy(out + j * hd + 8 * i, &acc[i], sizeof(vf8));
    }
  });
}

// T: q's and out's dtype; C: the cache's (T, or c10::Float8_e4m3fn)
template <typename T, typename C>
void decode_attention_impl(const at::Tensor& q, const at::Tensor& out, const at::Tensor& k_cache,
                           const at::Tensor& v_cache, const at::Tensor& block_tables,
                           const at::Tensor& seq_lens, double scale, double k_scale, double v_scale) {
  TORCH_CHECK(q.dim() == 3 && q.size(0) > 0 && q.stride(2) == 1 && q.stride(1) == q.size(2),
              "decode_attention: q must be (D > 0, num_heads, head_dim) with contiguous rows");
  TORCH_CHECK(out.is_contiguous() && out.sizes() == q.sizes() && out.scalar_type() == q.scalar_type(),
              "decode_attention: out must be a contiguous tensor like q");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous() && k_cache.sizes() == v_cache.sizes() &&
              k_cache.scalar_type() == v_cache.scalar_type() &&
              (k_cache.scalar_type() == q.scalar_type() || k_cache.scalar_type() == at::kFloat8_e4m3fn),
              "decode_attention: caches must be contiguous (num_blocks, block_size, kvh, head_dim) in q's "
              "dtype or float8_e4m3fn");
  TORCH_CHECK(k_cache.size(3) == q.size(2) && q.size(2) % 8 == 0 && q.size(1) % k_cache.size(2) == 0,
              "decode_attention: head_dim must match the cache's and be a multiple of 8; "
              "num_heads a multiple of kv heads");
  TORCH_CHECK(block_tables.scalar_type() == at::kInt && seq_lens.scalar_type() == at::kInt &&
              block_tables.stride(1) == 1 && seq_lens.is_contiguous() && seq_lens.size(0) == q.size(0),
              "decode_attention: block_tables (D, max_blocks) and seq_lens (D,) must be int32");
  TORCH_CHECK(q.device().is_cpu() && k_cache.device().is_cpu(), "decode_attention: CPU tensors only");
  // q: (D, num_heads, hd), rows q.stride(0) apart; out: (D, num_heads, hd) contiguous;
  // caches: (num_blocks, block_size, kvh, hd), rows k_cache.stride(1) apart
  const int64_t D = q.size(0), H = q.size(1), hd = q.size(2);
  const int64_t block_size = k_cache.size(1), kvh = k_cache.size(2), group = H / kvh;
  const T* qp = static_cast<const T*>(q.const_data_ptr());
  T* op = static_cast<T*>(out.data_ptr());
  const C* kp = static_cast<const C*>(k_cache.const_data_ptr());
  const C* vp = static_cast<const C*>(v_cache.const_data_ptr());
  const int32_t* tables = static_cast<const int32_t*>(block_tables.const_data_ptr());
  const int32_t* lens = static_cast<const int32_t*>(seq_lens.const_data_ptr());
  const int64_t max_len = *std::max_element(lens, lens + D);
  // a work item per sequence (its blocks read whole, in order) when there are enough of them
  // to keep every thread busy; else per (sequence, kv head)
  const int64_t nh = D >= 4 * at::get_num_threads() ? kvh : 1, per_seq = kvh / nh;
  if constexpr (std::is_same_v<T, c10::BFloat16>)
    if (nanoserve::decode_attention_bf16_dot(q, out, k_cache, v_cache, block_tables, seq_lens, scale, k_scale,
                                             v_scale, nh))
      return;
  auto run = hd == 64 ? attend<C, 8> : hd == 128 ? attend<C, 16> : attend<C, 0>;
  const float q_scale = static_cast<float>(scale * k_scale), o_scale = static_cast<float>(v_scale);

  const nanoserve::PagedItems items{
      static_cast<const char*>(k_cache.const_data_ptr()), static_cast<const char*>(v_cache.const_data_ptr()),
      k_cache.stride(0) * k_cache.element_size(), k_cache.stride(1) * k_cache.element_size(),
      hd * k_cache.element_size(), block_size, per_seq, nh, tables, block_tables.stride(0), lens};
  at::parallel_for(0, D * per_seq, 1, [&](int64_t begin, int64_t end) {
    const int64_t nq = nh * group;
    std::vector<float> qf(nq * hd), acc(nq * hd + nq), buf(block_size * nh * hd);
    std::vector<float> scores(nq * ((max_len + 7) / 8 * 8));  // rows padded to whole vectors
    nanoserve::BlockStream stream(items, end);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t d = item / per_seq, h0 = (item % per_seq) * nh;
      to_float(qp + d * q.stride(0) + h0 * group * hd, qf.data(), nq * hd);
      for (float& x : qf) x *= q_scale;  // q . (k_scale * k) = (k_scale * q) . k
      stream.start(item);
      run(qf.data(), kp, vp, tables + d * block_tables.stride(0), lens[d], h0, nh, group, hd / 8,
          block_size, k_cache.stride(0), k_cache.stride(1), scores.data(), acc.data(), buf.data(), stream);
      T* o = op + (d * H + h0 * group) * hd;
      for (int64_t j = 0; j < nq; ++j)
        for (int64_t x = 0; x < hd; ++x)
          o[j * hd + x] = static_cast<T>(acc[j * hd + x] * (acc[nq * hd + j] * o_scale));
    }
  });
}

template <typename T>
void decode_attention_for(const at::Tensor& q, const at::Tensor& out, const at::Tensor& k_cache,
                          const at::Tensor& v_cache, const at::Tensor& block_tables,
                          const at::Tensor& seq_lens, double scale, double k_scale, double v_scale) {
  if (k_cache.scalar_type() == at::kFloat8_e4m3fn)
    return decode_attention_impl<T, c10::Float8_e4m3fn>(q, out, k_cache, v_cache, block_tables, seq_lens,
                                                        scale, k_scale, v_scale);
  decode_attention_impl<T, T>(q, out, k_cache, v_cache, block_tables, seq_lens, scale, 1.0, 1.0);
}

void decode_attention(const at::Tensor& q, const at::Tensor& out, const at::Tensor& k_cache,
                      const at::Tensor& v_cache, const at::Tensor& block_tables,
                      const at::Tensor& seq_lens, double scale, double k_scale, double v_scale) {
  switch (q.scalar_type()) {
    case at::kFloat:
      return decode_attention_for<float>(q, out, k_cache, v_cache, block_tables, seq_lens, scale, k_scale, v_scale);
    case at::kBFloat16:
      return decode_attention_for<c10::BFloat16>(q, out, k_cache, v_cache, block_tables, seq_lens, scale,
                                                 k_scale, v_scale);
    case at::kHalf:
      return decode_attention_for<c10::Half>(q, out, k_cache, v_cache, block_tables, seq_lens, scale,
                                             k_scale, v_scale);
    default: TORCH_CHECK(false, "decode_attention: unsupported dtype ", q.scalar_type());
  }
}

}  // namespace

TORCH_LIBRARY(nanoserve_cpu, m) {
  m.def("decode_attention(Tensor q, Tensor(a!) out, Tensor k_cache, Tensor v_cache, "
        "Tensor block_tables, Tensor seq_lens, float scale, float k_scale=1.0, float v_scale=1.0) -> ()",
        &decode_attention);
  m.def("reads_fp8_as_bf16() -> bool", &nanoserve::reads_fp8_as_bf16);
}
