// AVX-512 kernels of the Laplacian kernel op (fp32: 16 lanes, fp64: 8 lanes); the interface and
// the formulas are in laplacian_kernel_cpu.h, the design in docs/ops/laplacian_kernel.md.
//
// Forward, vectorised across keys: kt [D][Mp] holds the keys transposed, so for a register tile
// of 4 query rows x 2 vectors of keys each channel adds |q_ic - kt[c, j..j+L)| to 8 accumulators
// (one broadcast per row, one load per vector, no horizontal sums); the exp is applied to the
// tile before it is stored, so every output is written once.
// Backward, vectorised across channels, dq and dk in one pass: for a tile of R query rows x K keys
// each pair gives s = g_ij sign(q_i - k_j) once (one vfixupimm: sign(0) = 0, NaN stays NaN) and
// it is subtracted from dq_i and added to dk_j, both held in registers.
//
// Everything in this file is compiled for AVX-512 (the pragma below): it includes no library
// headers whose inline functions could be shared with the rest of the extension, and its kernels
// are only called where cpu_has_avx512() holds.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)  // as the driver's check
#include <immintrin.h>

#include <cstdint>

#include "laplacian_kernel/laplacian_kernel_cpu.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512dq,avx512bw,avx512vl,fma")
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // false positives in GCC 12's intrinsics

namespace mmlinattn::laplacian::cpu {
namespace {

#define MMLINATTN_INLINE inline __attribute__((always_inline))

// vfixupimm table: QNaN, SNaN -> QNaN(src); zero -> +0; +1, +inf, positive -> +1; -inf, negative -> -1.
constexpr int kSignTable = (2 << 0) | (2 << 4) | (8 << 8) | (10 << 12) | (9 << 16) | (10 << 20) |
                           (9 << 24) | (10 << 28);

struct F32 {
  using T = float;
  using V = __m512;
  using M = __mmask16;
  static constexpr int64_t L = 16;
  static MMLINATTN_INLINE V zero() { return _mm512_setzero_ps(); }
  static MMLINATTN_INLINE V set1(T x) { return _mm512_set1_ps(x); }
  static MMLINATTN_INLINE V load(const T* p) { return _mm512_loadu_ps(p); }
  static MMLINATTN_INLINE V load(const T* p, M m) { return _mm512_maskz_loadu_ps(m, p); }
  static MMLINATTN_INLINE void store(T* p, V v, M m) { _mm512_mask_storeu_ps(p, m, v); }
  static MMLINATTN_INLINE V add(V a, V b) { return _mm512_add_ps(a, b); }
  static MMLINATTN_INLINE V sub(V a, V b) { return _mm512_sub_ps(a, b); }
  static MMLINATTN_INLINE V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static MMLINATTN_INLINE V fmadd(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static MMLINATTN_INLINE V fnmadd(V a, V b, V c) { return _mm512_fnmadd_ps(a, b, c); }
  static MMLINATTN_INLINE V abs(V a) { return _mm512_abs_ps(a); }
  static MMLINATTN_INLINE V sign(V a) {
    return _mm512_fixupimm_ps(a, a, _mm512_set1_epi32(kSignTable), 0);
  }
  static MMLINATTN_INLINE M first(int64_t n) {
    return n >= L ? M(0xFFFF) : M((1u << n) - 1);
  }
  // exp(x) for x <= 0: x = n ln2 + r, exp(r) by a degree-7 polynomial (< 1 ulp), 2^n in the
  // exponent bits; x < -87 gives 0 and NaN stays NaN (max(lo, x) returns x when x is NaN).
  static MMLINATTN_INLINE V exp_nonpositive(V x) {
    const V lo = _mm512_set1_ps(-87.f), magic = _mm512_set1_ps(12582912.f);  // 1.5 * 2^23
    const V xc = _mm512_max_ps(lo, x);
    const V shifted = _mm512_fmadd_ps(xc, _mm512_set1_ps(1.4426950408889634f), magic);
    const V n = _mm512_sub_ps(shifted, magic);
    V r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), xc);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.4286068203094173e-06f), r);
    V p = _mm512_set1_ps(1.f / 5040);
    const float coeffs[] = {1.f / 720, 1.f / 120, 1.f / 24, 1.f / 6, 0.5f, 1.f, 1.f};
    for (const float c : coeffs) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
    const __m512i bits = _mm512_slli_epi32(
        _mm512_add_epi32(_mm512_castps_si512(shifted), _mm512_set1_epi32(127)), 23);
    const V e = _mm512_mul_ps(p, _mm512_castsi512_ps(bits));
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ), e, zero());
  }
};

struct F64 {
  using T = double;
  using V = __m512d;
  using M = __mmask8;
  static constexpr int64_t L = 8;
  static MMLINATTN_INLINE V zero() { return _mm512_setzero_pd(); }
  static MMLINATTN_INLINE V set1(T x) { return _mm512_set1_pd(x); }
  static MMLINATTN_INLINE V load(const T* p) { return _mm512_loadu_pd(p); }
  static MMLINATTN_INLINE V load(const T* p, M m) { return _mm512_maskz_loadu_pd(m, p); }
  static MMLINATTN_INLINE void store(T* p, V v, M m) { _mm512_mask_storeu_pd(p, m, v); }
  static MMLINATTN_INLINE V add(V a, V b) { return _mm512_add_pd(a, b); }
  static MMLINATTN_INLINE V sub(V a, V b) { return _mm512_sub_pd(a, b); }
  static MMLINATTN_INLINE V mul(V a, V b) { return _mm512_mul_pd(a, b); }
  static MMLINATTN_INLINE V fmadd(V a, V b, V c) { return _mm512_fmadd_pd(a, b, c); }
  static MMLINATTN_INLINE V fnmadd(V a, V b, V c) { return _mm512_fnmadd_pd(a, b, c); }
  static MMLINATTN_INLINE V abs(V a) { return _mm512_abs_pd(a); }
  static MMLINATTN_INLINE V sign(V a) {
    return _mm512_fixupimm_pd(a, a, _mm512_set1_epi64(kSignTable), 0);
  }
  static MMLINATTN_INLINE M first(int64_t n) { return n >= L ? M(0xFF) : M((1u << n) - 1); }
  // As F32, degree 13 (< 1 ulp in fp64); x < -708 gives 0.
  static MMLINATTN_INLINE V exp_nonpositive(V x) {
    const V lo = _mm512_set1_pd(-708.0), magic = _mm512_set1_pd(6755399441055744.0);  // 1.5*2^52
    const V xc = _mm512_max_pd(lo, x);
    const V shifted = _mm512_fmadd_pd(xc, _mm512_set1_pd(1.4426950408889634), magic);
    const V n = _mm512_sub_pd(shifted, magic);
    V r = _mm512_fnmadd_pd(n, _mm512_set1_pd(0.6931471803691238), xc);
    r = _mm512_fnmadd_pd(n, _mm512_set1_pd(1.9082149292705877e-10), r);
    V p = _mm512_set1_pd(1.0 / 6227020800.0);  // 1/13!
    double factorial = 6227020800.0;
    for (int k = 12; k >= 1; --k) {
      factorial /= (k + 1);
      p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(1.0 / factorial));
    }
    p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(1.0));
    const __m512i bits = _mm512_slli_epi64(
        _mm512_add_epi64(_mm512_castpd_si512(shifted), _mm512_set1_epi64(1023)), 52);
    const V e = _mm512_mul_pd(p, _mm512_castsi512_pd(bits));
    return _mm512_mask_blend_pd(_mm512_cmp_pd_mask(x, lo, _CMP_LT_OQ), e, zero());
  }
};

MMLINATTN_INLINE int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

// ---- forward ----------------------------------------------------------------------------------

// Rows [0, R) of q against key vectors [j0, j0 + V*L) of kt; exp fused into the store.
template <class S, int R, int V>
MMLINATTN_INLINE void forward_tile(const typename S::T* q, const typename S::T* kt,
                                   typename S::T* out, int64_t j0, int64_t m, int64_t mp,
                                   int64_t d, typename S::T scale) {
  using Vec = typename S::V;
  Vec acc[R][V];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) acc[r][v] = S::zero();
  const Vec one = S::set1(1);
  for (int64_t c = 0; c < d; ++c) {
    Vec kv[V];
    for (int v = 0; v < V; ++v) kv[v] = S::load(kt + c * mp + j0 + v * S::L);
    for (int r = 0; r < R; ++r) {
      const Vec qb = S::set1(q[r * d + c]);
      // acc += |q - k| on the FMA pipes, leaving the add pipes to the subtraction
      for (int v = 0; v < V; ++v) acc[r][v] = S::fmadd(S::abs(S::sub(qb, kv[v])), one, acc[r][v]);
    }
  }
  const Vec s = S::set1(scale);
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) {
      const int64_t j = j0 + v * S::L;
      if (j < m) S::store(out + r * m + j, S::exp_nonpositive(S::mul(acc[r][v], s)), S::first(m - j));
    }
}

template <class S, int R>
MMLINATTN_INLINE void forward_row_block(const typename S::T* q, const typename S::T* kt,
                                        typename S::T* out, int64_t m, int64_t mp, int64_t d,
                                        typename S::T scale) {
  int64_t j0 = 0;
  for (; j0 + 2 * S::L <= mp; j0 += 2 * S::L)
    forward_tile<S, R, 2>(q, kt, out, j0, m, mp, d, scale);
  for (; j0 < mp; j0 += S::L) forward_tile<S, R, 1>(q, kt, out, j0, m, mp, d, scale);
}

template <class S>
void forward_rows(const typename S::T* q, const typename S::T* kt, typename S::T* out,
                  int64_t rows, int64_t m, int64_t mp, int64_t d, typename S::T scale) {
  constexpr int R = 4;
  int64_t i = 0;
  for (; i + R <= rows; i += R) forward_row_block<S, R>(q + i * d, kt, out + i * m, m, mp, d, scale);
  for (; i < rows; ++i) forward_row_block<S, 1>(q + i * d, kt, out + i * m, m, mp, d, scale);
}

// ---- backward ---------------------------------------------------------------------------------

// Channels [c0, c0 + DV*L) (masked beyond d) of rows [0, R) x keys [j, j + K):
// dq_acc -= s, dk[j..] += s with s = g sign(q - k); g [R][m] (already times out / lam).
template <class S, int DV, int R, int K, bool NeedDq, bool NeedDk>
MMLINATTN_INLINE void backward_tile(const typename S::T* g, const typename S::V (&qv)[R][DV],
                                    const typename S::T* k, typename S::T* dk,
                                    typename S::V (&dq_acc)[R][DV], int64_t j, int64_t m,
                                    int64_t d, int64_t c0, const typename S::M (&masks)[DV]) {
  using Vec = typename S::V;
  Vec kv[K][DV], dk_acc[K][DV];
  for (int u = 0; u < K; ++u)
    for (int v = 0; v < DV; ++v) {
      kv[u][v] = S::load(k + (j + u) * d + c0 + v * S::L, masks[v]);
      dk_acc[u][v] = S::zero();
    }
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < K; ++u) {
      const Vec gb = S::set1(g[r * m + j + u]);
      for (int v = 0; v < DV; ++v) {
        const Vec sign = S::sign(S::sub(qv[r][v], kv[u][v]));
        if constexpr (NeedDq) dq_acc[r][v] = S::fnmadd(sign, gb, dq_acc[r][v]);
        if constexpr (NeedDk) dk_acc[u][v] = S::fmadd(sign, gb, dk_acc[u][v]);
      }
    }
  if constexpr (NeedDk)
    for (int u = 0; u < K; ++u)
      for (int v = 0; v < DV; ++v) {
        typename S::T* p = dk + (j + u) * d + c0 + v * S::L;
        S::store(p, S::add(S::load(p, masks[v]), dk_acc[u][v]), masks[v]);
      }
}

template <class S, int DV, int R, int K, bool NeedDq, bool NeedDk>
MMLINATTN_INLINE void backward_row_block(const typename S::T* g, const typename S::T* q,
                                         const typename S::T* k, typename S::T* dq,
                                         typename S::T* dk, int64_t m, int64_t d, int64_t c0) {
  using Vec = typename S::V;
  typename S::M masks[DV];
  for (int v = 0; v < DV; ++v) masks[v] = S::first(d - c0 - v * S::L);
  Vec qv[R][DV], dq_acc[R][DV];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < DV; ++v) {
      qv[r][v] = S::load(q + r * d + c0 + v * S::L, masks[v]);
      dq_acc[r][v] = S::zero();
    }
  int64_t j = 0;
  for (; j + K <= m; j += K)
    backward_tile<S, DV, R, K, NeedDq, NeedDk>(g, qv, k, dk, dq_acc, j, m, d, c0, masks);
  for (; j < m; ++j)
    backward_tile<S, DV, R, 1, NeedDq, NeedDk>(g, qv, k, dk, dq_acc, j, m, d, c0, masks);
  if constexpr (NeedDq)
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < DV; ++v) S::store(dq + r * d + c0 + v * S::L, dq_acc[r][v], masks[v]);
}

// All rows for one channel block of DV vectors; R x K tiles sized to keep q, dq and dk in the
// 32 vector registers.
template <class S, int DV, bool NeedDq, bool NeedDk>
void backward_channel_block(const typename S::T* grad, const typename S::T* out,
                            const typename S::T* q, const typename S::T* k, typename S::T* dq,
                            typename S::T* dk, int64_t rows, int64_t m, int64_t d, int64_t c0,
                            typename S::T inv_lam, typename S::T* g) {
  constexpr int R = DV <= 2 ? 4 : DV == 3 ? 4 : 2;
  constexpr int K = DV <= 2 ? 4 : 2;
  static_assert(R <= kScratchRows, "g scratch too small");
  const typename S::V scale = S::set1(inv_lam);
  for (int64_t i = 0; i < rows; i += R) {
    const int64_t n = min64(R, rows - i);
    for (int64_t r = 0; r < n; ++r)  // g = grad * out / lam for the rows of this block
      for (int64_t j = 0; j < m; j += S::L) {
        const typename S::M mask = S::first(m - j);
        const int64_t e = (i + r) * m + j;
        S::store(g + r * m + j, S::mul(S::mul(S::load(grad + e, mask), S::load(out + e, mask)),
                                       scale), mask);
      }
    const auto dq_rows = [&](int64_t row) { return NeedDq ? dq + row * d : dq; };  // dq may be null
    if (n == R)
      backward_row_block<S, DV, R, K, NeedDq, NeedDk>(g, q + i * d, k, dq_rows(i), dk, m, d, c0);
    else
      for (int64_t r = 0; r < n; ++r)
        backward_row_block<S, DV, 1, K, NeedDq, NeedDk>(g + r * m, q + (i + r) * d, k,
                                                        dq_rows(i + r), dk, m, d, c0);
  }
}

template <class S, bool NeedDq, bool NeedDk>
void backward_flags(const typename S::T* grad, const typename S::T* out, const typename S::T* q,
                    const typename S::T* k, typename S::T* dq, typename S::T* dk, int64_t rows,
                    int64_t m, int64_t d, typename S::T inv_lam, typename S::T* g) {
  constexpr int64_t kBlock = 4 * S::L;  // channels per pass (dq and dk are separable in c)
  for (int64_t c0 = 0; c0 < d; c0 += kBlock) {
    const int64_t vectors = (min64(kBlock, d - c0) + S::L - 1) / S::L;
    switch (vectors) {
      case 1: backward_channel_block<S, 1, NeedDq, NeedDk>(grad, out, q, k, dq, dk, rows, m, d, c0, inv_lam, g); break;
      case 2: backward_channel_block<S, 2, NeedDq, NeedDk>(grad, out, q, k, dq, dk, rows, m, d, c0, inv_lam, g); break;
      case 3: backward_channel_block<S, 3, NeedDq, NeedDk>(grad, out, q, k, dq, dk, rows, m, d, c0, inv_lam, g); break;
      default: backward_channel_block<S, 4, NeedDq, NeedDk>(grad, out, q, k, dq, dk, rows, m, d, c0, inv_lam, g); break;
    }
  }
}

template <class S>
void backward_rows(const typename S::T* grad, const typename S::T* out, const typename S::T* q,
                   const typename S::T* k, typename S::T* dq, typename S::T* dk, int64_t rows,
                   int64_t m, int64_t d, typename S::T inv_lam, bool need_dq, bool need_dk,
                   typename S::T* scratch) {
  if (need_dk)
    for (int64_t e = 0; e < m * d; ++e) dk[e] = 0;
  if (need_dq && need_dk)
    backward_flags<S, true, true>(grad, out, q, k, dq, dk, rows, m, d, inv_lam, scratch);
  else if (need_dq)
    backward_flags<S, true, false>(grad, out, q, k, dq, dk, rows, m, d, inv_lam, scratch);
  else if (need_dk)
    backward_flags<S, false, true>(grad, out, q, k, dq, dk, rows, m, d, inv_lam, scratch);
}

}  // namespace

Kernels<float> avx512_kernels_float() { return {&forward_rows<F32>, &backward_rows<F32>}; }
Kernels<double> avx512_kernels_double() { return {&forward_rows<F64>, &backward_rows<F64>}; }

}  // namespace mmlinattn::laplacian::cpu

#pragma GCC pop_options
#endif
