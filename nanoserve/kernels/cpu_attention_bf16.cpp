// Paged decode attention for bf16 queries on a CPU with AVX512-BF16, over a bf16 cache or an fp8
// (e4m3) one: the work items of cpu_attention.cpp, with vdpbf16ps doing the arithmetic. One
// vdpbf16ps adds the products of 32 bf16 pairs into 16 fp32 lanes, exactly (a bf16 product fits
// fp32), so the scores q.k read K straight from a bf16 cache, with no conversion to fp32 first; an
// fp8 cache's codes are looked up as their bf16 values in registers (every e4m3 value is one), so
// its arithmetic is a bf16 cache's and its bytes read half. The weighted sum of V multiplies pairs
// of tokens' V rows, interleaved in registers as they are read, by their probabilities rounded to
// bf16 (as SDPA's CPU flash kernel rounds them for bf16 inputs), for up to four query heads of a kv
// head at once. Sums are fp32. Measured against the torch path by benchmarks/cpu_attention.py.
// Built only where the compiler targets those instructions (-march=native; fp8 also needs
// AVX512-VBMI's byte permutes); elsewhere the entry point returns false and cpu_attention.cpp's
// generic work items run.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "cpu_common.h"

#if defined(__AVX512BF16__) && defined(__AVX512BW__)
#include <immintrin.h>

namespace {

typedef float vf16 __attribute__((vector_size(64)));

// (sum(a[0]), ..., sum(a[15])): sixteen horizontal sums at once, a tree of pairwise lane sums
inline vf16 sum16x16(const vf16* a) {
  auto pairs = [](vf16 x, vf16 y) {  // per 128-bit chunk k: x[4k]+x[4k+1], x[4k+2]+x[4k+3], then y's
    return __builtin_shufflevector(x, y, 0, 2, 16, 18, 4, 6, 20, 22, 8, 10, 24, 26, 12, 14, 28, 30) +
           __builtin_shufflevector(x, y, 1, 3, 17, 19, 5, 7, 21, 23, 9, 11, 25, 27, 13, 15, 29, 31);
  };
  auto chunks = [](vf16 x, vf16 y) {  // 128-bit chunks: x0+x1, x2+x3, y0+y1, y2+y3
    return __builtin_shufflevector(x, y, 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
           __builtin_shufflevector(x, y, 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
  };
  vf16 u[4];  // u[g]'s chunk k, lane v: chunk k of a[4g + v], summed
  for (int g = 0; g < 4; ++g) u[g] = pairs(pairs(a[4 * g], a[4 * g + 1]), pairs(a[4 * g + 2], a[4 * g + 3]));
  return chunks(chunks(u[0], u[1]), chunks(u[2], u[3]));
}

inline __m512bh load_bh(const uint16_t* p) { return (__m512bh)_mm512_loadu_si512(p); }

// How the kernel reads a cache's rows as bf16 vectors, kDims values of a row at a time:
// query (q's values in the order key gives K's), key (one token's), value_pair (two tokens' V
// values (a[d], b[d]) in 32-bit lanes, for vdpbf16ps to weight by two probabilities at once) and
// store (the output rows from the sums of V, in value_pair's order, back in dim order).
//
// A bf16 cache, 32 values at a time, read as they are. value_pair interleaves the two rows in
// registers, which puts each 128-bit chunk k's dims 8k..8k+3 in one vector and 8k+4..8k+7 in the
// next.
struct Bf16Rows {
  using Elem = uint16_t;
  static constexpr int64_t kDims = 32;
  void query(const uint16_t* q, __m512bh* w) const { w[0] = load_bh(q); }
  void key(const uint16_t* k, __m512bh* w) const { w[0] = load_bh(k); }
  void value_pair(const uint16_t* a, const uint16_t* b, __m512bh* w) const {  // b null: a zero row
    const __m512i x = _mm512_loadu_si512(a), y = b ? _mm512_loadu_si512(b) : _mm512_setzero_si512();
    w[0] = (__m512bh)_mm512_unpacklo_epi16(x, y);
    w[1] = (__m512bh)_mm512_unpackhi_epi16(x, y);
  }
  // (vector c = 2i + s, lane l holds dim 32i + 8(l/4) + 4s + l%4): the 128-bit chunks of vectors
  // 2i, 2i+1 in the order a0 b0 a1 b1, and a2 b2 a3 b3
  static void store(const float* sums, __m512 scale, c10::BFloat16* o) {
    const __m512i lo = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
    const __m512i hi = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
    const __m512 a = _mm512_loadu_ps(sums), b = _mm512_loadu_ps(sums + 16);
    store16(_mm512_permutex2var_ps(a, lo, b), scale, o);
    store16(_mm512_permutex2var_ps(a, hi, b), scale, o + 16);
  }
  // vcvtneps2bf16 rounds to nearest even, as c10::BFloat16 does, but flushes values under 1.2e-38
  static void store16(__m512 v, __m512 scale, c10::BFloat16* o) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(o), (__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(v, scale)));
  }
};

#if defined(__AVX512VBMI__)
// An fp8 (e4m3) cache, 64 values at a time, each code looked up as its bf16 (E4m3ToBf16), whose
// words come in the lookup's order; q is put in the same order. value_pair interleaves the two
// rows' codes before the lookup, so vector v (of 4) lane l holds the pair of dim 16(l/4) + 4v + l%4.
struct Fp8Rows {
  using Elem = uint8_t;
  static constexpr int64_t kDims = 64;
  void query(const uint16_t* q, __m512bh* w) const {
    nanoserve::E4m3ToBf16::in_order(_mm512_loadu_si512(q), _mm512_loadu_si512(q + 32), w[0], w[1]);
  }
  void key(const uint8_t* k, __m512bh* w) const { to_bf16(_mm512_loadu_si512(k), w[0], w[1]); }
  void value_pair(const uint8_t* a, const uint8_t* b, __m512bh* w) const {
    const __m512i x = _mm512_loadu_si512(a), y = b ? _mm512_loadu_si512(b) : _mm512_setzero_si512();
    to_bf16(_mm512_unpacklo_epi8(x, y), w[0], w[1]);  // dims 16k..16k+7 of each lane k, in pairs
    to_bf16(_mm512_unpackhi_epi8(x, y), w[2], w[3]);  // 16k+8..16k+15
  }
  // the 128-bit chunk k of the four vectors is dims 16k..16k+15 in order: a 4 x 4 transpose of chunks
  static void store(const float* sums, __m512 scale, c10::BFloat16* o) {
    const __m512 v0 = _mm512_loadu_ps(sums), v1 = _mm512_loadu_ps(sums + 16);
    const __m512 v2 = _mm512_loadu_ps(sums + 32), v3 = _mm512_loadu_ps(sums + 48);
    // t0: v0c0 v0c1 v1c0 v1c1; t1: v0c2 v0c3 v1c2 v1c3
    const __m512 t0 = _mm512_shuffle_f32x4(v0, v1, 0x44), t1 = _mm512_shuffle_f32x4(v0, v1, 0xEE);
    const __m512 t2 = _mm512_shuffle_f32x4(v2, v3, 0x44), t3 = _mm512_shuffle_f32x4(v2, v3, 0xEE);
    Bf16Rows::store16(_mm512_shuffle_f32x4(t0, t2, 0x88), scale, o);  // v0c0 v1c0 v2c0 v3c0
    Bf16Rows::store16(_mm512_shuffle_f32x4(t0, t2, 0xDD), scale, o + 16);
    Bf16Rows::store16(_mm512_shuffle_f32x4(t1, t3, 0x88), scale, o + 32);
    Bf16Rows::store16(_mm512_shuffle_f32x4(t1, t3, 0xDD), scale, o + 48);
  }
  nanoserve::E4m3ToBf16 to_bf16;
};
#endif

// out[g] += the weights of a block's n tokens (probs rows p + g * Lp, bf16) times their V rows (v,
// token_stride apart), for G query heads of one kv head: 2 * nz vectors of sums per head (nz: a row's
// 32-value chunks). vdpbf16ps takes two tokens at once: their values in pairs (Rows::value_pair),
// times (p[t], p[t+1]) in every lane
template <typename Rows, int NZ, int G>
inline void add_pv(const Rows& rows, float* out, int64_t hd, const uint16_t* p, int64_t Lp,
                   const typename Rows::Elem* v, int64_t token_stride, int64_t n, int64_t nz_runtime) {
  constexpr int64_t kVecs = Rows::kDims / 16;  // value_pair's vectors
  const int64_t nz = NZ > 0 ? NZ : nz_runtime;
  __m512 acc[G][NZ > 0 ? 2 * NZ : 16];
  for (int g = 0; g < G; ++g)
    for (int64_t c = 0; c < 2 * nz; ++c) acc[g][c] = _mm512_loadu_ps(out + g * hd + 16 * c);
  auto add_pair = [&](int64_t t, bool last_alone) {  // tokens t, t + 1 (a zero row if last_alone)
    __m512bh w[G];
    for (int g = 0; g < G; ++g) {
      int32_t pp;  // p[t + 1] is finite past the block (the next block's, or 0 at the end)
      std::memcpy(&pp, p + g * Lp + t, sizeof pp);
      w[g] = (__m512bh)_mm512_set1_epi32(pp);
    }
    for (int64_t i = 0; i < 2 * nz / kVecs; ++i) {
      const typename Rows::Elem* row = v + t * token_stride + Rows::kDims * i;
      __m512bh pairs[kVecs];
      rows.value_pair(row, last_alone ? nullptr : row + token_stride, pairs);
      for (int64_t c = 0; c < kVecs; ++c)
        for (int g = 0; g < G; ++g) acc[g][kVecs * i + c] = _mm512_dpbf16_ps(acc[g][kVecs * i + c], pairs[c], w[g]);
    }
  };
  int64_t t = 0;
  for (; t + 2 <= n; t += 2) add_pair(t, false);
  if (t < n) add_pair(t, true);
  for (int g = 0; g < G; ++g)
    for (int64_t c = 0; c < 2 * nz; ++c) _mm512_storeu_ps(out + g * hd + 16 * c, acc[g][c]);
}

// One work item, as cpu_attention.cpp's attend: a sequence's kv heads [h0, h0 + nh) and their
// nh * group query heads (q: their rows, bf16, unscaled). Rows are hd = 32 * NZ values (NZ > 0
// fixes it at compile time). Leaves in out each head's unnormalised sum of V in fp32, in the V
// pass's order (Rows::store puts it back) and, past the nq * hd of those, 1/sum of each head's
// softmax.
template <typename Rows, int NZ>
void attend(const Rows& rows, const uint16_t* q, float scale, const typename Rows::Elem* k_cache,
            const typename Rows::Elem* v_cache, const int32_t* table, int64_t L, int64_t h0, int64_t nh,
            int64_t group, int64_t nz_runtime, int64_t block_size, int64_t block_stride, int64_t token_stride,
            float* scores, uint16_t* probs, float* out, nanoserve::BlockStream& stream) {
  const int64_t nz = NZ > 0 ? NZ : nz_runtime, hd = 32 * nz, nq = nh * group;
  const int64_t blocks = (L + block_size - 1) / block_size, Ls = (L + 7) / 8 * 8, Lp = Ls + 16;
  constexpr int64_t kPer = Rows::kDims / 32;  // vectors a query or key read gives
  // the V pass's query heads at a time: their sums in registers (4 x 4 vectors at hd 64, 2 x 8 at 128)
  constexpr int64_t kMaxG = NZ == 2 ? 4 : NZ == 4 ? 2 : 1;
  // a unit of work: a key's score, or a value row's add, for one query head
  for (int64_t b = 0; b < blocks; ++b) {  // scores (nq, L), 16 keys at a time
    const typename Rows::Elem* kb = k_cache + table[b] * block_stride + h0 * hd;
    const int64_t n = std::min(block_size, L - b * block_size);
    stream.at(b, nq * n);
    for (int64_t j = 0; j < nq; ++j) {
      __m512bh qv[NZ > 0 ? NZ : 8];
      for (int64_t i = 0; i < nz; i += kPer) rows.query(q + j * hd + 32 * i, qv + i);
      const typename Rows::Elem* kj = kb + (j / group) * hd;
      // keys [o, o + cnt), cnt <= 16; `full` (cnt = 16, all but a block's last chunk) a constant
      auto chunk = [&](auto full, int64_t o, int64_t cnt) {
        vf16 acc[16] = {};
        for (int t = 0; t < 16; ++t)
          if (full || t < cnt)
            for (int64_t i = 0; i < nz; i += kPer) {
              __m512bh kv[kPer];
              rows.key(kj + (o + t) * token_stride + 32 * i, kv);
              for (int64_t c = 0; c < kPer; ++c) acc[t] = _mm512_dpbf16_ps(acc[t], qv[i + c], kv[c]);
            }
        const vf16 r = sum16x16(acc) * scale;
        _mm512_mask_storeu_ps(scores + j * Ls + b * block_size + o, (__mmask16)((1u << cnt) - 1), (__m512)r);
      };
      int64_t o = 0;
      for (; o + 16 <= n; o += 16) chunk(std::true_type{}, o, 16);
      if (o < n) chunk(std::false_type{}, o, n - o);
      stream.done(n);
    }
  }
  nanoserve::softmax_rows(scores, nq, L, Ls, out + nq * hd);
  for (int64_t j = 0; j < nq; ++j) {  // the probabilities as bf16, rounded to nearest even
    for (int64_t t = 0; t < L; t += 16) {
      const __m256bh p = _mm512_cvtneps_pbh(_mm512_loadu_ps(scores + j * Ls + t));
      _mm256_mask_storeu_epi16(probs + j * Lp + t, (__mmask16)((1u << std::min<int64_t>(16, L - t)) - 1),
                               (__m256i)p);
    }
    probs[j * Lp + L] = 0;  // the partner of an odd L's last token (its V row is the zero pad)
    std::fill(out + j * hd, out + (j + 1) * hd, 0.f);
  }
  for (int64_t b = 0; b < blocks; ++b) {  // out += p V
    const typename Rows::Elem* vb = v_cache + table[b] * block_stride + h0 * hd;
    const int64_t n = std::min(block_size, L - b * block_size);
    stream.at(blocks + b, nq * n);
    for (int64_t j = 0; j < nq;) {  // a kv head's query heads G at a time: each V pair read once for G
      const int64_t g = std::min({kMaxG, nq - j, group - j % group});
      auto add = [&](auto G) {
        add_pv<Rows, NZ, G()>(rows, out + j * hd, hd, probs + j * Lp + b * block_size, Lp,
                              vb + (j / group) * hd, token_stride, n, nz);
        j += G();
        stream.done(G() * n);
      };
      switch (g) {  // G a constant: its sums stay in registers
        case 4: add(std::integral_constant<int, 4>{}); break;
        case 3: add(std::integral_constant<int, 3>{}); break;
        case 2: add(std::integral_constant<int, 2>{}); break;
        default: add(std::integral_constant<int, 1>{});
      }
    }
  }
}

// A work item's output rows: out's sums of V (in the V pass's order) times 1/sum and o_scale, as
// bf16 in dim order
template <typename Rows>
void store_rows(const float* out, int64_t nq, int64_t hd, float o_scale, c10::BFloat16* o) {
  const float* inv = out + nq * hd;
  for (int64_t j = 0; j < nq; ++j)
    for (int64_t i = 0; i < hd; i += Rows::kDims)
      Rows::store(out + j * hd + i, _mm512_set1_ps(inv[j] * o_scale), o + j * hd + i);
}

template <typename Rows>
void run_items(const at::Tensor& q, const at::Tensor& out, const at::Tensor& k_cache, const at::Tensor& v_cache,
               const at::Tensor& block_tables, const at::Tensor& seq_lens, float scale, float o_scale, int64_t nh) {
  using Elem = typename Rows::Elem;
  const int64_t D = q.size(0), H = q.size(1), hd = q.size(2);
  const int64_t block_size = k_cache.size(1), kvh = k_cache.size(2), group = H / kvh, per_seq = kvh / nh;
  const uint16_t* qp = static_cast<const uint16_t*>(q.const_data_ptr());
  uint16_t* op = static_cast<uint16_t*>(out.data_ptr());
  const Elem* kp = static_cast<const Elem*>(k_cache.const_data_ptr());
  const Elem* vp = static_cast<const Elem*>(v_cache.const_data_ptr());
  const int32_t* tables = static_cast<const int32_t*>(block_tables.const_data_ptr());
  const int32_t* lens = static_cast<const int32_t*>(seq_lens.const_data_ptr());
  const int64_t max_len = *std::max_element(lens, lens + D), Ls = (max_len + 7) / 8 * 8;
  auto run = hd == 64 ? attend<Rows, 2> : hd == 128 ? attend<Rows, 4> : attend<Rows, 0>;
  constexpr int64_t e = sizeof(Elem);
  const nanoserve::PagedItems items{reinterpret_cast<const char*>(kp), reinterpret_cast<const char*>(vp),
                                    e * k_cache.stride(0), e * k_cache.stride(1), e * hd, block_size,
                                    per_seq, nh, tables, block_tables.stride(0), lens};
  at::parallel_for(0, D * per_seq, 1, [&](int64_t begin, int64_t end) {
    const int64_t nq = nh * group;
    const Rows rows;
    nanoserve::BlockStream stream(items, end);
    // score rows padded to whole vectors, and 16 floats more: a 16-lane read of the last row's tail
    std::vector<float> acc(nq * hd + nq), scores(nq * Ls + 16);
    std::vector<uint16_t> probs(nq * (Ls + 16));
    for (int64_t item = begin; item < end; ++item) {
      const int64_t d = item / per_seq, h0 = (item % per_seq) * nh;
      stream.start(item);
      run(rows, qp + d * q.stride(0) + h0 * group * hd, scale, kp, vp, tables + d * block_tables.stride(0),
          lens[d], h0, nh, group, hd / 32, block_size, k_cache.stride(0), k_cache.stride(1), scores.data(),
          probs.data(), acc.data(), stream);
      store_rows<Rows>(acc.data(), nq, hd, o_scale,
                       reinterpret_cast<c10::BFloat16*>(op) + (d * H + h0 * group) * hd);
    }
  });
}

}  // namespace

namespace nanoserve {

bool reads_fp8_as_bf16() {
#if defined(__AVX512VBMI__)
  return true;
#else
  return false;
#endif
}

bool decode_attention_bf16_dot(const at::Tensor& q, const at::Tensor& out, const at::Tensor& k_cache,
                               const at::Tensor& v_cache, const at::Tensor& block_tables,
                               const at::Tensor& seq_lens, double scale, double k_scale, double v_scale,
                               int64_t nh) {
  // checked by the caller: shapes, dtypes (q bf16, the caches bf16 or fp8), contiguity; q (D, H, hd),
  // caches (blocks, bs, kvh, hd)
  const int64_t hd = q.size(2);
  const float qk_scale = static_cast<float>(scale * k_scale), o_scale = static_cast<float>(v_scale);
  if (k_cache.scalar_type() == at::kFloat8_e4m3fn) {
#if defined(__AVX512VBMI__)
    if (hd % Fp8Rows::kDims || hd > 256) return false;
    run_items<Fp8Rows>(q, out, k_cache, v_cache, block_tables, seq_lens, qk_scale, o_scale, nh);
    return true;
#else
    return false;
#endif
  }
  if (hd % Bf16Rows::kDims || hd > 256) return false;
  run_items<Bf16Rows>(q, out, k_cache, v_cache, block_tables, seq_lens, qk_scale, o_scale, nh);
  return true;
}

}  // namespace nanoserve

#else  // no AVX512-BF16 in this build: cpu_attention.cpp's work items run

namespace nanoserve {
bool reads_fp8_as_bf16() { return false; }
bool decode_attention_bf16_dot(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                               const at::Tensor&, const at::Tensor&, double, double, double, int64_t) {
  return false;
}
}  // namespace nanoserve

#endif
