// CPU Laplacian kernel op (fp32, fp64, bf16): schemas, work split, and the portable kernels.
// The design is in docs/ops/laplacian_kernel.md; the kernel interface in laplacian_kernel_cpu.h.
//
// Forward: tasks of kForwardRows query rows of one (batch, head); each task transposes that
// head's keys to kt [D][Mp] and runs the row kernel (vectorised across keys, exp fused).
// Backward: tasks of kBackwardRows query rows of one (batch, head) compute their dq rows whole
// and their own partial dk (the sum over their rows); the partials are then added in task order,
// so results do not depend on the number of threads.
// Kernels: AVX-512 intrinsics (laplacian_kernel_avx512.cpp) when the CPU has them and
// ATEN_CPU_CAPABILITY (torch's switch) allows AVX512; otherwise the portable loops below,
// compiled for AVX2 and baseline x86-64 (picked at load time) or the build target.
#include <ATen/Parallel.h>
#include <ATen/Version.h>
#include <c10/util/bit_cast.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <vector>

#include "laplacian_kernel.h"
#include "laplacian_kernel/laplacian_kernel_cpu.h"

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define MMLINATTN_CPU_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#define MMLINATTN_HAS_AVX512_KERNELS 1
#else
#define MMLINATTN_CPU_CLONES
#define MMLINATTN_HAS_AVX512_KERNELS 0
#endif
#define MMLINATTN_INLINE inline __attribute__((always_inline))

namespace mmlinattn::laplacian {
namespace cpu {

bool avx512_usable() {
#if MMLINATTN_HAS_AVX512_KERNELS
  return at::get_cpu_capability() == "AVX512" && __builtin_cpu_supports("avx512f") &&
         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl");
#else
  return false;
#endif
}

}  // namespace cpu

namespace {

using cpu::kKeyPad;
using cpu::Kernels;

constexpr int64_t kForwardRows = 128;   // query rows per forward task
constexpr int64_t kBackwardRows = 256;  // query rows per backward task (fixed: deterministic dk)
constexpr int64_t kTileJ = 16;          // portable forward: keys per tile
constexpr int kRowsI = 4;               // portable forward: query rows per tile

// ---- portable kernels -------------------------------------------------------------------------

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
  const Bits sign = c10::bit_cast<Bits>(diff) & kSignBit;
  const T flipped = c10::bit_cast<T>(c10::bit_cast<Bits>(g) ^ sign);
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

template <typename T>
const Kernels<T>& kernels() {
  static const Kernels<T> chosen = [] {
    const Kernels<T> portable{
        static_cast<void (*)(const T*, const T*, T*, int64_t, int64_t, int64_t, int64_t, T)>(
            &portable_forward),
        static_cast<void (*)(const T*, const T*, const T*, const T*, T*, T*, int64_t, int64_t,
                             int64_t, T, bool, bool, T*)>(&portable_backward)};
#if MMLINATTN_HAS_AVX512_KERNELS
    if (cpu::avx512_usable()) {
      if constexpr (std::is_same_v<T, float>) return cpu::avx512_kernels_float();
      else return cpu::avx512_kernels_double();
    }
#endif
    return portable;
  }();
  return chosen;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// ---- driver -----------------------------------------------------------------------------------

template <typename T>
void forward_cpu(const at::Tensor& q, const at::Tensor& k, at::Tensor& out, double lam) {
  const int64_t bh = q.size(0) * q.size(1), n = q.size(2), m = k.size(2), d = q.size(3);
  const int64_t mp = ceil_div(m, kKeyPad) * kKeyPad, tiles = ceil_div(n, kForwardRows);
  const T* q_ptr = q.const_data_ptr<T>();
  const T* k_ptr = k.const_data_ptr<T>();
  T* out_ptr = out.mutable_data_ptr<T>();
  const T scale = T(-1.0 / lam);
  const Kernels<T>& kern = kernels<T>();
  at::parallel_for(0, bh * tiles, 1, [&](int64_t t0, int64_t t1) {
    std::vector<T> kt(d * mp, T(0));  // this head's keys, transposed: kt[c][j]
    int64_t kt_head = -1;
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b = t / tiles, i0 = (t % tiles) * kForwardRows;
      if (b != kt_head) {
        for (int64_t j = 0; j < m; ++j)
          for (int64_t c = 0; c < d; ++c) kt[c * mp + j] = k_ptr[(b * m + j) * d + c];
        kt_head = b;
      }
      kern.forward_rows(q_ptr + (b * n + i0) * d, kt.data(), out_ptr + (b * n + i0) * m,
                        std::min(kForwardRows, n - i0), m, mp, d, scale);
    }
  });
}

template <typename T>
void backward_cpu(const at::Tensor& grad, const at::Tensor& out, const at::Tensor& q,
                  const at::Tensor& k, T* dq_ptr, T* dk_ptr, double lam) {
  const int64_t bh = q.size(0) * q.size(1), n = q.size(2), m = k.size(2), d = q.size(3);
  const T *g_ptr = grad.const_data_ptr<T>(), *o_ptr = out.const_data_ptr<T>();
  const T *q_ptr = q.const_data_ptr<T>(), *k_ptr = k.const_data_ptr<T>();
  const int64_t chunks = ceil_div(n, kBackwardRows);
  const bool need_dq = dq_ptr != nullptr, need_dk = dk_ptr != nullptr;
  // Partial dk per chunk [bh][chunks][m][d]; with one chunk per head the partial is dk itself.
  std::vector<T> partial(need_dk && chunks > 1 ? bh * chunks * m * d : 0);
  const Kernels<T>& kern = kernels<T>();
  const T inv_lam = T(1.0 / lam);
  at::parallel_for(0, bh * chunks, 1, [&](int64_t t0, int64_t t1) {
    std::vector<T> scratch(cpu::kScratchRows * m);
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b = t / chunks, i0 = (t % chunks) * kBackwardRows;
      const int64_t rows = std::min(kBackwardRows, n - i0), first = (b * n + i0);
      T* dk_part = !need_dk ? nullptr : chunks == 1 ? dk_ptr + b * m * d : partial.data() + t * m * d;
      kern.backward_rows(g_ptr + first * m, o_ptr + first * m, q_ptr + first * d,
                         k_ptr + b * m * d, need_dq ? dq_ptr + first * d : nullptr,
                         dk_part, rows, m, d, inv_lam, need_dq, need_dk, scratch.data());
    }
  });
  if (!need_dk || chunks == 1) return;
  const int64_t size = m * d;
  at::parallel_for(0, bh, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      T* dst = dk_ptr + b * size;
      const T* src = partial.data() + b * chunks * size;
      std::copy(src, src + size, dst);
      for (int64_t chunk = 1; chunk < chunks; ++chunk)
        for (int64_t e = 0; e < size; ++e) dst[e] += src[chunk * size + e];
    }
  });
}

// ---- bf16: the fp32 kernels on widened rows ---------------------------------------------------
// bf16 tensors are read and written as they are (no fp32 copy of a whole input or output): each
// task widens its own rows into fp32 scratch, runs the fp32 kernels and narrows its results as it
// stores them. The work split is the fp32 one, so the results do not depend on the thread count.

void widen(const at::BFloat16* src, int64_t count, float* dst) {
  for (int64_t e = 0; e < count; ++e) dst[e] = static_cast<float>(src[e]);
}

void narrow(const float* src, int64_t count, at::BFloat16* dst) {
  for (int64_t e = 0; e < count; ++e) dst[e] = static_cast<at::BFloat16>(src[e]);
}

void forward_cpu_bf16(const at::Tensor& q, const at::Tensor& k, at::Tensor& out, double lam) {
  const int64_t bh = q.size(0) * q.size(1), n = q.size(2), m = k.size(2), d = q.size(3);
  const int64_t mp = ceil_div(m, kKeyPad) * kKeyPad, tiles = ceil_div(n, kForwardRows);
  const at::BFloat16* q_ptr = q.const_data_ptr<at::BFloat16>();
  const at::BFloat16* k_ptr = k.const_data_ptr<at::BFloat16>();
  at::BFloat16* out_ptr = out.mutable_data_ptr<at::BFloat16>();
  const float scale = static_cast<float>(-1.0 / lam);
  const Kernels<float>& kern = kernels<float>();
  at::parallel_for(0, bh * tiles, 1, [&](int64_t t0, int64_t t1) {
    std::vector<float> kt(d * mp, 0.0f), q_rows(kForwardRows * d), out_rows(kForwardRows * m);
    int64_t kt_head = -1;
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b = t / tiles, i0 = (t % tiles) * kForwardRows;
      const int64_t rows = std::min(kForwardRows, n - i0);
      if (b != kt_head) {
        for (int64_t j = 0; j < m; ++j)
          for (int64_t c = 0; c < d; ++c)
            kt[c * mp + j] = static_cast<float>(k_ptr[(b * m + j) * d + c]);
        kt_head = b;
      }
      widen(q_ptr + (b * n + i0) * d, rows * d, q_rows.data());
      kern.forward_rows(q_rows.data(), kt.data(), out_rows.data(), rows, m, mp, d, scale);
      narrow(out_rows.data(), rows * m, out_ptr + (b * n + i0) * m);
    }
  });
}

void backward_cpu_bf16(const at::Tensor& grad, const at::Tensor& out, const at::Tensor& q,
                       const at::Tensor& k, at::BFloat16* dq_ptr, at::BFloat16* dk_ptr,
                       double lam) {
  const int64_t bh = q.size(0) * q.size(1), n = q.size(2), m = k.size(2), d = q.size(3);
  const at::BFloat16 *g_ptr = grad.const_data_ptr<at::BFloat16>();
  const at::BFloat16 *o_ptr = out.const_data_ptr<at::BFloat16>();
  const at::BFloat16 *q_ptr = q.const_data_ptr<at::BFloat16>();
  const at::BFloat16 *k_ptr = k.const_data_ptr<at::BFloat16>();
  const int64_t chunks = ceil_div(n, kBackwardRows);
  const bool need_dq = dq_ptr != nullptr, need_dk = dk_ptr != nullptr;
  // fp32 partial dk per chunk [bh][chunks][m][d], summed in chunk order below.
  std::vector<float> partial(need_dk ? bh * chunks * m * d : 0);
  const Kernels<float>& kern = kernels<float>();
  const float inv_lam = static_cast<float>(1.0 / lam);
  at::parallel_for(0, bh * chunks, 1, [&](int64_t t0, int64_t t1) {
    std::vector<float> scratch(cpu::kScratchRows * m), k_head(m * d);
    std::vector<float> g_rows(kBackwardRows * m), o_rows(kBackwardRows * m);
    std::vector<float> q_rows(kBackwardRows * d), dq_rows(need_dq ? kBackwardRows * d : 0);
    int64_t head = -1;
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b = t / chunks, i0 = (t % chunks) * kBackwardRows;
      const int64_t rows = std::min(kBackwardRows, n - i0), first = (b * n + i0);
      if (b != head) {
        widen(k_ptr + b * m * d, m * d, k_head.data());
        head = b;
      }
      widen(g_ptr + first * m, rows * m, g_rows.data());
      widen(o_ptr + first * m, rows * m, o_rows.data());
      widen(q_ptr + first * d, rows * d, q_rows.data());
      kern.backward_rows(g_rows.data(), o_rows.data(), q_rows.data(), k_head.data(),
                         need_dq ? dq_rows.data() : nullptr,
                         need_dk ? partial.data() + t * m * d : nullptr, rows, m, d, inv_lam,
                         need_dq, need_dk, scratch.data());
      if (need_dq) narrow(dq_rows.data(), rows * d, dq_ptr + first * d);
    }
  });
  if (!need_dk) return;
  const int64_t size = m * d;
  at::parallel_for(0, bh, 1, [&](int64_t b0, int64_t b1) {
    std::vector<float> sum(size);
    for (int64_t b = b0; b < b1; ++b) {
      const float* src = partial.data() + b * chunks * size;
      std::copy(src, src + size, sum.begin());
      for (int64_t chunk = 1; chunk < chunks; ++chunk)
        for (int64_t e = 0; e < size; ++e) sum[e] += src[chunk * size + e];
      narrow(sum.data(), size, dk_ptr + b * size);
    }
  });
}

at::Tensor laplacian_kernel_forward_cpu(const at::Tensor& q_in, const at::Tensor& k_in,
                                        double lam) {
  check_forward_args(q_in, k_in, lam);
  const at::Tensor q = q_in.contiguous(), k = k_in.contiguous();
  at::Tensor out = at::empty({q.size(0), q.size(1), q.size(2), k.size(2)}, q.options());
  if (out.numel() == 0) return out;
  if (q.scalar_type() == at::kBFloat16) {
    forward_cpu_bf16(q, k, out, lam);
    return out;
  }
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "laplacian_kernel_forward_cpu",
                             [&] { forward_cpu<scalar_t>(q, k, out, lam); });
  return out;
}

std::tuple<at::Tensor, at::Tensor> laplacian_kernel_backward_cpu(
    const at::Tensor& grad_in, const at::Tensor& q_in, const at::Tensor& k_in,
    const at::Tensor& out_in, double lam, bool need_dq, bool need_dk) {
  check_backward_args(grad_in, q_in, k_in, out_in, lam);
  const at::Tensor grad = grad_in.contiguous(), q = q_in.contiguous(), k = k_in.contiguous();
  const at::Tensor out = out_in.contiguous();
  // Every entry of dq and dk is written by the kernels unless there is nothing to sum over.
  const bool empty_sum = grad.numel() == 0 || q.size(3) == 0;
  const auto make = [&](bool need, const at::Tensor& like) {
    return !need ? at::empty({0}, like.options())
                 : empty_sum ? at::zeros_like(like) : at::empty_like(like);
  };
  at::Tensor dq = make(need_dq, q), dk = make(need_dk, k);
  if (empty_sum || (!need_dq && !need_dk)) return {dq, dk};
  if (q.scalar_type() == at::kBFloat16) {
    backward_cpu_bf16(grad, out, q, k,
                      need_dq ? dq.mutable_data_ptr<at::BFloat16>() : nullptr,
                      need_dk ? dk.mutable_data_ptr<at::BFloat16>() : nullptr, lam);
    return {dq, dk};
  }
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "laplacian_kernel_backward_cpu", [&] {
    backward_cpu<scalar_t>(grad, out, q, k, need_dq ? dq.mutable_data_ptr<scalar_t>() : nullptr,
                           need_dk ? dk.mutable_data_ptr<scalar_t>() : nullptr, lam);
  });
  return {dq, dk};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(mmlinattn, m) {
  m.def("laplacian_kernel_forward(Tensor q, Tensor k, float lam) -> Tensor");
  m.def(
      "laplacian_kernel_backward(Tensor grad_out, Tensor q, Tensor k, Tensor out, float lam, "
      "bool need_dq, bool need_dk) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(mmlinattn, CPU, m) {
  m.impl("laplacian_kernel_forward", &laplacian_kernel_forward_cpu);
  m.impl("laplacian_kernel_backward", &laplacian_kernel_backward_cpu);
}

}  // namespace mmlinattn::laplacian
