// Portable loops of the Laplacian kernel's CPU row kernels, the AVX-512 check and the choice
// between them. Plain C++ (no ATen): the torch operators (laplacian_kernel_cpu.cpp) and the
// onnxruntime custom op (ops/onnxruntime) both use it. The interface is laplacian_kernel_cpu.h.
// The portable loops are compiled for AVX2 and baseline x86-64 (picked at load time) or the build
// target.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "laplacian_kernel/laplacian_kernel_cpu.h"

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define MMLINATTN_CPU_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#define MMLINATTN_HAS_AVX512_KERNELS 1
#else
#define MMLINATTN_CPU_CLONES
#define MMLINATTN_HAS_AVX512_KERNELS 0
#endif
#define MMLINATTN_INLINE inline __attribute__((always_inline))

namespace mmlinattn::laplacian::cpu {

bool cpu_has_avx512() {
#if MMLINATTN_HAS_AVX512_KERNELS
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
#else
  return false;
#endif
}

namespace {

constexpr int64_t kTileJ = 16;  // portable forward: keys per tile
constexpr int kRowsI = 4;       // portable forward: query rows per tile

template <typename To, typename From>
MMLINATTN_INLINE To bits_of(From x) {
  static_assert(sizeof(To) == sizeof(From));
  To out;
  std::memcpy(&out, &x, sizeof(To));
  return out;
}
template <typename To, typename From>
MMLINATTN_INLINE To value_of(From x) {
  return bits_of<To>(x);
}

// exp(x) for x <= 0, branch-free so that it vectorises: x = n ln2 + r, |r| <= ln2/2, exp(r) by
// a Taylor polynomial (error < 1 ulp), 2^n assembled in the exponent bits; x < kMin gives 0, NaN
// stays NaN.
template <typename T>
struct ExpTraits;
template <>
struct ExpTraits<float> {
  using Bits = uint32_t;
  static constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  static constexpr float kMin = -87.0f;
  static constexpr int kMantissa = 23;
  static constexpr Bits kBias = 127;
  static constexpr int kDegree = 7;
};
template <>
struct ExpTraits<double> {
  using Bits = uint64_t;
  static constexpr double kMagic = 6755399441055744.0;  // 1.5 * 2^52
  static constexpr double kMin = -708.0;
  static constexpr int kMantissa = 52;
  static constexpr Bits kBias = 1023;
  static constexpr int kDegree = 13;
};

template <typename T>
MMLINATTN_INLINE T exp_nonpositive(T x) {
  using E = ExpTraits<T>;
  using Bits = typename E::Bits;
  const T xc = x < E::kMin ? E::kMin : x;
  const T shifted = xc * T(1.4426950408889634) + E::kMagic;
  const T n = shifted - E::kMagic;
  const T r = (xc - n * T(0.693145751953125)) - n * T(1.4286068203094173e-06);
  T poly = T(1);
  for (int d = E::kDegree; d >= 1; --d) poly = T(1) + poly * (r * (T(1) / T(d)));
  Bits bits;
  std::memcpy(&bits, &shifted, sizeof(T));
  bits = (bits + E::kBias) << E::kMantissa;  // low bits of `shifted` hold 2^(mantissa-1) + n
  T scale;
  std::memcpy(&scale, &bits, sizeof(T));
  return x < E::kMin ? T(0) : poly * scale;
}

// L1 distances of `Rows` query rows against kTileJ keys of kt, then exp, stored.
template <typename T, int Rows>
MMLINATTN_INLINE void portable_forward_tile(const T* q, const T* kt, T* out, int64_t j0,
                                            int64_t m, int64_t mp, int64_t d, T scale) {
  T acc[Rows][kTileJ];
  for (int r = 0; r < Rows; ++r)
    for (int64_t w = 0; w < kTileJ; ++w) acc[r][w] = T(0);
  for (int64_t c = 0; c < d; ++c) {
    const T* kc = kt + c * mp + j0;
    for (int r = 0; r < Rows; ++r) {
      const T qv = q[r * d + c];
#pragma omp simd
      for (int64_t w = 0; w < kTileJ; ++w) acc[r][w] += std::abs(qv - kc[w]);
    }
  }
  for (int r = 0; r < Rows; ++r) {
    T vals[kTileJ];
#pragma omp simd
    for (int64_t w = 0; w < kTileJ; ++w) vals[w] = exp_nonpositive(acc[r][w] * scale);
    const int64_t count = std::min(kTileJ, m - j0);
    for (int64_t w = 0; w < count; ++w) out[r * m + j0 + w] = vals[w];
  }
}

template <typename T>
MMLINATTN_INLINE void portable_forward_impl(const T* q, const T* kt, T* out, int64_t rows,
                                            int64_t m, int64_t mp, int64_t d, T scale) {
  int64_t i = 0;
  for (; i + kRowsI <= rows; i += kRowsI)
    for (int64_t j0 = 0; j0 < m; j0 += kTileJ)
      portable_forward_tile<T, kRowsI>(q + i * d, kt, out + i * m, j0, m, mp, d, scale);
  for (; i < rows; ++i)
    for (int64_t j0 = 0; j0 < m; j0 += kTileJ)
      portable_forward_tile<T, 1>(q + i * d, kt, out + i * m, j0, m, mp, d, scale);
}

// g * sign(diff) with sign(0) = 0: g with its sign bit flipped by diff's, zero where diff == 0.
template <typename T>
MMLINATTN_INLINE T sign_times(T diff, T g) {
  using Bits = typename ExpTraits<T>::Bits;
  constexpr Bits kSignBit = Bits{1} << (sizeof(T) * 8 - 1);
  const Bits sign = bits_of<Bits>(diff) & kSignBit;
  const T flipped = value_of<T>(bits_of<Bits>(g) ^ sign);
  return diff != T(0) ? flipped : T(0);
}

// The fused backward of the interface, one query row at a time, vectorised across channels.
template <typename T>
MMLINATTN_INLINE void portable_backward_impl(const T* grad, const T* out, const T* q, const T* k,
                                             T* dq, T* dk, int64_t rows, int64_t m, int64_t d,
                                             T inv_lam, bool need_dq, bool need_dk, T* g) {
  if (need_dk) std::fill(dk, dk + m * d, T(0));
  for (int64_t i = 0; i < rows; ++i) {
#pragma omp simd
    for (int64_t j = 0; j < m; ++j) g[j] = grad[i * m + j] * out[i * m + j] * inv_lam;
    const T* qi = q + i * d;
    T* dqi = need_dq ? dq + i * d : nullptr;
    if (need_dq) std::fill(dqi, dqi + d, T(0));
    for (int64_t j = 0; j < m; ++j) {
      const T gj = g[j];
      const T* kj = k + j * d;
      if (need_dq && need_dk) {
        T* dkj = dk + j * d;
#pragma omp simd
        for (int64_t c = 0; c < d; ++c) {
          const T s = sign_times(qi[c] - kj[c], gj);
          dqi[c] -= s;
          dkj[c] += s;
        }
      } else if (need_dq) {
#pragma omp simd
        for (int64_t c = 0; c < d; ++c) dqi[c] -= sign_times(qi[c] - kj[c], gj);
      } else {
        T* dkj = dk + j * d;
#pragma omp simd
        for (int64_t c = 0; c < d; ++c) dkj[c] += sign_times(qi[c] - kj[c], gj);
      }
    }
  }
}

MMLINATTN_CPU_CLONES void portable_forward(const float* q, const float* kt, float* out,
                                           int64_t rows, int64_t m, int64_t mp, int64_t d,
                                           float scale) {
  portable_forward_impl<float>(q, kt, out, rows, m, mp, d, scale);
}
MMLINATTN_CPU_CLONES void portable_forward(const double* q, const double* kt, double* out,
                                           int64_t rows, int64_t m, int64_t mp, int64_t d,
                                           double scale) {
  portable_forward_impl<double>(q, kt, out, rows, m, mp, d, scale);
}
MMLINATTN_CPU_CLONES void portable_backward(const float* grad, const float* out, const float* q,
                                            const float* k, float* dq, float* dk, int64_t rows,
                                            int64_t m, int64_t d, float inv_lam, bool need_dq,
                                            bool need_dk, float* g) {
  portable_backward_impl<float>(grad, out, q, k, dq, dk, rows, m, d, inv_lam, need_dq, need_dk, g);
}
MMLINATTN_CPU_CLONES void portable_backward(const double* grad, const double* out,
                                            const double* q, const double* k, double* dq,
                                            double* dk, int64_t rows, int64_t m, int64_t d,
                                            double inv_lam, bool need_dq, bool need_dk,
                                            double* g) {
  portable_backward_impl<double>(grad, out, q, k, dq, dk, rows, m, d, inv_lam, need_dq, need_dk,
                                 g);
}

}  // namespace

template <typename T>
Kernels<T> select_kernels(bool use_avx512) {
#if MMLINATTN_HAS_AVX512_KERNELS
  if (use_avx512) {
    if constexpr (std::is_same_v<T, float>) return avx512_kernels_float();
    else return avx512_kernels_double();
  }
#endif
  (void)use_avx512;
  return {static_cast<void (*)(const T*, const T*, T*, int64_t, int64_t, int64_t, int64_t, T)>(
              &portable_forward),
          static_cast<void (*)(const T*, const T*, const T*, const T*, T*, T*, int64_t, int64_t,
                               int64_t, T, bool, bool, T*)>(&portable_backward)};
}

template Kernels<float> select_kernels<float>(bool);
template Kernels<double> select_kernels<double>(bool);

}  // namespace mmlinattn::laplacian::cpu
