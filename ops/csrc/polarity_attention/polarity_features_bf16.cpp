// The features |x|^p of bf16 inputs and their chain rule with AVX-512 (polarity_features_bf16.h).
//
// |x|^p = 2^(p log2|x|), 16 channels at a time: log2 from getexp/getmant and four odd terms of
// 2 atanh(t) / ln 2 (t = (m - 1) / (m + 1), |t| < 0.172), 2^y as 2^round(y) (scalef) times a
// degree-6 Taylor polynomial of 2^r, |r| <= 1/2. The relative error is about 3e-7, far below
// bf16's 2^-9. Special values as std::pow for p > 0: 0 -> 0, inf -> inf, NaN -> NaN (NaN lands in
// the x- half, as in the exact kernel), with no extra branches: getexp gives -inf, inf and NaN.
//
// Everything in this file is compiled for AVX-512 (the pragma below): it includes no library
// headers whose inline functions could be shared with the rest of the extension, and its
// functions are only called after bf16_features_vectorised().
#include "polarity_attention/polarity_features_bf16.h"

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#include <immintrin.h>

#include <cstdint>

bool mmlinattn::polarity::bf16_features_vectorised() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
}

#pragma GCC push_options
#pragma GCC target("avx512f,avx512dq,avx512bw,avx512vl,fma")
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // false positives in GCC 12's intrinsics

namespace mmlinattn::polarity {
namespace {

#define POLA_INLINE inline __attribute__((always_inline))

constexpr float kLn2 = 0.6931471805599453f;

POLA_INLINE __mmask16 first(int64_t n) { return n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1); }

// 16 bf16 values (masked) -> fp32: the bf16 bits are the top half of the fp32 ones.
POLA_INLINE __m512 load_bf16(const uint16_t* x, __mmask16 m) {
  const __m512i wide = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, x));
  return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}

// fp32 -> bf16, rounded to nearest even, NaN kept a quiet NaN (as c10::BFloat16's constructor).
POLA_INLINE void store_bf16(uint16_t* out, __m512 x, __mmask16 m) {
  const __m512i bits = _mm512_castps_si512(x);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  __m512i rounded = _mm512_srli_epi32(
      _mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF))), 16);
  rounded = _mm512_mask_mov_epi32(rounded, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q),
                                  _mm512_set1_epi32(0x7FC0));
  _mm256_mask_storeu_epi16(out, m, _mm512_cvtepi32_epi16(rounded));
}

// log2(a), a >= 0: -inf at 0, inf at inf, NaN at NaN, subnormals exact through getexp.
POLA_INLINE __m512 log2_abs(__m512 a) {
  __m512 e = _mm512_getexp_ps(a);
  __m512 m = _mm512_getmant_ps(a, _MM_MANT_NORM_1_2, _MM_MANT_SIGN_zero);  // [1, 2)
  const __mmask16 fold = _mm512_cmp_ps_mask(m, _mm512_set1_ps(1.41421356f), _CMP_GT_OQ);
  m = _mm512_mask_mul_ps(m, fold, m, _mm512_set1_ps(0.5f));
  e = _mm512_mask_add_ps(e, fold, e, _mm512_set1_ps(1.f));
  const __m512 one = _mm512_set1_ps(1.f);
  const __m512 t = _mm512_div_ps(_mm512_sub_ps(m, one), _mm512_add_ps(m, one));
  const __m512 t2 = _mm512_mul_ps(t, t);
  __m512 s = _mm512_set1_ps(0.4121985831111324f);
  s = _mm512_fmadd_ps(s, t2, _mm512_set1_ps(0.5770780163555854f));
  s = _mm512_fmadd_ps(s, t2, _mm512_set1_ps(0.9617966939259756f));
  s = _mm512_fmadd_ps(s, t2, _mm512_set1_ps(2.8853900817779268f));
  // at a = 0, inf the mantissa term is finite and e carries the result
  return _mm512_fmadd_ps(s, t, e);
}

// 2^y: 0 below about -150, inf above 128, NaN stays NaN (max/min return their second operand).
POLA_INLINE __m512 exp2(__m512 y) {
  y = _mm512_min_ps(_mm512_set1_ps(150.f), _mm512_max_ps(_mm512_set1_ps(-150.f), y));
  const __m512 n = _mm512_roundscale_ps(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 u = _mm512_mul_ps(_mm512_sub_ps(y, n), _mm512_set1_ps(kLn2));
  __m512 poly = _mm512_fmadd_ps(_mm512_set1_ps(1.f / 720), u, _mm512_set1_ps(1.f / 120));
  poly = _mm512_fmadd_ps(poly, u, _mm512_set1_ps(1.f / 24));
  poly = _mm512_fmadd_ps(poly, u, _mm512_set1_ps(1.f / 6));
  poly = _mm512_fmadd_ps(poly, u, _mm512_set1_ps(0.5f));
  poly = _mm512_fmadd_ps(poly, u, _mm512_set1_ps(1.f));
  poly = _mm512_fmadd_ps(poly, u, _mm512_set1_ps(1.f));
  return _mm512_scalef_ps(poly, n);
}

}  // namespace

void bf16_features(const uint16_t* x, const float* p, int64_t tokens, int64_t d, float* feat) {
  const __m512 zero = _mm512_setzero_ps();
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t c = 0; c < d; c += 16) {
      const __mmask16 m = first(d - c);
      const __m512 xv = load_bf16(x + t * d + c, m);
      const __m512 f = exp2(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, p + c), log2_abs(_mm512_abs_ps(xv))));
      const __mmask16 positive = _mm512_cmp_ps_mask(xv, zero, _CMP_GT_OQ);
      const __mmask16 negative = _mm512_cmp_ps_mask(xv, zero, _CMP_NGE_UQ);  // x < 0 or NaN
      _mm512_mask_storeu_ps(feat + t * 2 * d + c, m, _mm512_maskz_mov_ps(positive, f));
      _mm512_mask_storeu_ps(feat + t * 2 * d + d + c, m, _mm512_maskz_mov_ps(negative, f));
    }
}

void bf16_feature_backward(const uint16_t* x, const float* p, const float* feat,
                           const float* feat_grad, int64_t tokens, int64_t d, uint16_t* dx,
                           float* dpower) {
  const __m512 zero = _mm512_setzero_ps();
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t c = 0; c < d; c += 16) {
      const __mmask16 m = first(d - c);
      const __m512 xv = load_bf16(x + t * d + c, m);
      const __mmask16 positive = _mm512_cmp_ps_mask(xv, zero, _CMP_GT_OQ);
      const __mmask16 nonzero = _mm512_cmp_ps_mask(xv, zero, _CMP_NEQ_UQ);
      const float* f_row = feat + t * 2 * d + c;
      const float* g_row = feat_grad + t * 2 * d + c;
      const __m512 a = _mm512_mask_blend_ps(positive, _mm512_maskz_loadu_ps(m, f_row + d),
                                            _mm512_maskz_loadu_ps(m, f_row));
      const __m512 g = _mm512_mask_blend_ps(positive, _mm512_maskz_loadu_ps(m, g_row + d),
                                            _mm512_maskz_loadu_ps(m, g_row));
      const __m512 ax = _mm512_abs_ps(xv);
      // dx = sign(x) p (a / |x|) g, 0 at x = 0
      const __m512 grad = _mm512_mul_ps(
          _mm512_mul_ps(_mm512_maskz_loadu_ps(m, p + c), _mm512_div_ps(a, ax)), g);
      const __m512 signed_grad = _mm512_mask_blend_ps(positive, _mm512_sub_ps(zero, grad), grad);
      store_bf16(dx + t * d + c, _mm512_maskz_mov_ps(nonzero, signed_grad), m);
      // dpower += g a ln|x|
      const __m512 log_x = _mm512_mul_ps(log2_abs(ax), _mm512_set1_ps(kLn2));
      const __m512 term = _mm512_maskz_mul_ps(nonzero, _mm512_mul_ps(g, a), log_x);
      _mm512_mask_storeu_ps(dpower + c, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, dpower + c), term));
    }
}

}  // namespace mmlinattn::polarity

#pragma GCC pop_options

#else  // no AVX-512 build: the exact kernel runs

bool mmlinattn::polarity::bf16_features_vectorised() { return false; }

void mmlinattn::polarity::bf16_features(const uint16_t*, const float*, int64_t, int64_t, float*) {}

void mmlinattn::polarity::bf16_feature_backward(const uint16_t*, const float*, const float*,
                                                const float*, int64_t, int64_t, uint16_t*, float*) {}

#endif
