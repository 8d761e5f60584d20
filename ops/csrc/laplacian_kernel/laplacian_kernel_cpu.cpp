// CPU kernels of the Laplacian kernel op (fp32, fp64), parallel over batch*heads and row tiles.
//
// Forward: per (b,h) the keys are transposed once to kt [D][Mp] (Mp = M rounded up to a multiple
// of kTileJ), so the inner loop runs over kTileJ consecutive keys with no horizontal reduction:
// acc[r][w] += |q[i+r][c] - kt[c][j+w]| for a kRowsI x kTileJ register tile, c = 0..D-1.
// Backward: two passes, each parallel over its own output rows, so no atomics are needed:
// dq over query rows (inner loop over D), dk over key-row blocks and fixed query chunks whose
// partial sums are added in a fixed order, so the result does not depend on the thread count.
// The hot loops are compiled for AVX-512, AVX2 and baseline x86-64 and picked at load time.
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <vector>

#include "laplacian_kernel.h"

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define MMLINATTN_CPU_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define MMLINATTN_CPU_CLONES
#endif
#define MMLINATTN_INLINE inline __attribute__((always_inline))

namespace mmlinattn::laplacian {
namespace {

constexpr int64_t kTileJ = 16;     // keys per register tile (one AVX-512 fp32 vector)
constexpr int kRowsI = 4;          // query rows per register tile
constexpr int64_t kRowsPerTask = 64;  // query rows per parallel forward / dq task
constexpr int64_t kKeysPerTask = 4;   // key rows per dk register tile
constexpr int64_t kQueryChunk = 1024; // query rows per dk partial sum (fixed: deterministic)

// exp(x) for x <= 0, branch-free so that it vectorises: x = n ln2 + r, |r| <= ln2/2,
// exp(r) by a Taylor polynomial (error < 1 ulp), 2^n assembled in the exponent bits.
// Below the smallest normal number the result is flushed to zero.
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

// L1 distances of `rows` (<= kRowsI) query rows against kTileJ keys of the transposed key block.
template <typename T, int Rows>
MMLINATTN_INLINE void l1_tile(const T* q, int64_t d, const T* kt, int64_t ldk,
                              T (&acc)[kRowsI][kTileJ]) {
  for (int r = 0; r < Rows; ++r)
    for (int64_t w = 0; w < kTileJ; ++w) acc[r][w] = T(0);
  for (int64_t c = 0; c < d; ++c) {
    const T* kc = kt + c * ldk;
    for (int r = 0; r < Rows; ++r) {
      const T qv = q[r * d + c];
#pragma omp simd
      for (int64_t w = 0; w < kTileJ; ++w) acc[r][w] += std::abs(qv - kc[w]);
    }
  }
}

template <typename T, int Rows>
MMLINATTN_INLINE void store_tile(T* out, int64_t m, int64_t j0, T scale,
                                 T (&acc)[kRowsI][kTileJ]) {
  for (int r = 0; r < Rows; ++r) {
    T* dst = out + r * m + j0;
    if (j0 + kTileJ <= m) {
#pragma omp simd
      for (int64_t w = 0; w < kTileJ; ++w) dst[w] = exp_nonpositive(acc[r][w] * scale);
    } else {
      T vals[kTileJ];
#pragma omp simd
      for (int64_t w = 0; w < kTileJ; ++w) vals[w] = exp_nonpositive(acc[r][w] * scale);
      for (int64_t w = 0; w < m - j0; ++w) dst[w] = vals[w];
    }
  }
}

// Rows [i0, i1) of one (b,h): q [.., D], kt [D][mp], out [.., M].
template <typename T>
MMLINATTN_INLINE void forward_rows_impl(const T* q, const T* kt, T* out, int64_t i0, int64_t i1,
                                        int64_t m, int64_t mp, int64_t d, T scale) {
  T acc[kRowsI][kTileJ];
  int64_t i = i0;
  for (; i + kRowsI <= i1; i += kRowsI) {
    for (int64_t j0 = 0; j0 < m; j0 += kTileJ) {
      l1_tile<T, kRowsI>(q + i * d, d, kt + j0, mp, acc);
      store_tile<T, kRowsI>(out + i * m, m, j0, scale, acc);
    }
  }
  for (; i < i1; ++i) {
    for (int64_t j0 = 0; j0 < m; j0 += kTileJ) {
      l1_tile<T, 1>(q + i * d, d, kt + j0, mp, acc);
      store_tile<T, 1>(out + i * m, m, j0, scale, acc);
    }
  }
}

MMLINATTN_CPU_CLONES void forward_rows(const float* q, const float* kt, float* out, int64_t i0,
                                       int64_t i1, int64_t m, int64_t mp, int64_t d, float s) {
  forward_rows_impl<float>(q, kt, out, i0, i1, m, mp, d, s);
}
MMLINATTN_CPU_CLONES void forward_rows(const double* q, const double* kt, double* out, int64_t i0,
                                       int64_t i1, int64_t m, int64_t mp, int64_t d, double s) {
  forward_rows_impl<double>(q, kt, out, i0, i1, m, mp, d, s);
}

// g * sign(diff) with sign(0) = 0: g with its sign bit flipped by diff's, zero where diff == 0.
template <typename T>
MMLINATTN_INLINE T sign_times(T diff, T g) {
  using Bits = typename ExpTraits<T>::Bits;
  constexpr Bits kSignBit = Bits{1} << (sizeof(T) * 8 - 1);
  const Bits sign = std::bit_cast<Bits>(diff) & kSignBit;
  const T flipped = std::bit_cast<T>(std::bit_cast<Bits>(g) ^ sign);
  return diff != T(0) ? flipped : T(0);
}

// dq for query rows [i0, i1) of one (b,h): dq_ic = -sum_j g_ij sign(q_ic - k_jc).
// Dim is the head dim when known at compile time (then q_i and the sums live in registers);
// 0 means a runtime d, summed in place in dq. g_row holds M values.
template <typename T, int64_t Dim>
MMLINATTN_INLINE void dq_rows_impl(const T* grad, const T* out, const T* q, const T* k, T* dq,
                                   int64_t i0, int64_t i1, int64_t m, int64_t d_runtime,
                                   T inv_lam, T* g_row) {
  const int64_t d = Dim > 0 ? Dim : d_runtime;
  for (int64_t i = i0; i < i1; ++i) {
#pragma omp simd
    for (int64_t j = 0; j < m; ++j) g_row[j] = grad[i * m + j] * out[i * m + j] * inv_lam;
    const T* qi = q + i * d;
    T* dqi = dq + i * d;
    if constexpr (Dim > 0) {
      T qv[Dim], acc[Dim];
      for (int64_t c = 0; c < Dim; ++c) qv[c] = qi[c], acc[c] = T(0);
      for (int64_t j = 0; j < m; ++j) {
        const T g = g_row[j];
        const T* kj = k + j * Dim;
#pragma omp simd
        for (int64_t c = 0; c < Dim; ++c) acc[c] -= sign_times(qv[c] - kj[c], g);
      }
      for (int64_t c = 0; c < Dim; ++c) dqi[c] = acc[c];
    } else {
      for (int64_t c = 0; c < d; ++c) dqi[c] = T(0);
      for (int64_t j = 0; j < m; ++j) {
        const T g = g_row[j];
        const T* kj = k + j * d;
#pragma omp simd
        for (int64_t c = 0; c < d; ++c) dqi[c] -= sign_times(qi[c] - kj[c], g);
      }
    }
  }
}

template <typename T>
MMLINATTN_INLINE void dq_rows_dispatch(const T* grad, const T* out, const T* q, const T* k, T* dq,
                                       int64_t i0, int64_t i1, int64_t m, int64_t d, T inv_lam,
                                       T* g_row) {
  switch (d) {
    case 16: return dq_rows_impl<T, 16>(grad, out, q, k, dq, i0, i1, m, d, inv_lam, g_row);
    case 32: return dq_rows_impl<T, 32>(grad, out, q, k, dq, i0, i1, m, d, inv_lam, g_row);
    case 64: return dq_rows_impl<T, 64>(grad, out, q, k, dq, i0, i1, m, d, inv_lam, g_row);
    default: return dq_rows_impl<T, 0>(grad, out, q, k, dq, i0, i1, m, d, inv_lam, g_row);
  }
}

MMLINATTN_CPU_CLONES void dq_rows(const float* grad, const float* out, const float* q,
                                  const float* k, float* dq, int64_t i0, int64_t i1, int64_t m,
                                  int64_t d, float inv_lam, float* g_row) {
  dq_rows_dispatch<float>(grad, out, q, k, dq, i0, i1, m, d, inv_lam, g_row);
}
MMLINATTN_CPU_CLONES void dq_rows(const double* grad, const double* out, const double* q,
                                  const double* k, double* dq, int64_t i0, int64_t i1, int64_t m,
                                  int64_t d, double inv_lam, double* g_row) {
  dq_rows_dispatch<double>(grad, out, q, k, dq, i0, i1, m, d, inv_lam, g_row);
}

// Partial dk for key rows [j0, j1) over query rows [i0, i1) of one (b,h):
// dk_jc = sum_i g_ij sign(q_ic - k_jc), written (not accumulated) to dk. kKeysPerTask key rows
// at a time share each q_i load; with a compile-time Dim their sums live in registers.
template <typename T, int64_t Dim>
MMLINATTN_INLINE void dk_rows_impl(const T* grad, const T* out, const T* q, const T* k, T* dk,
                                   int64_t j0, int64_t j1, int64_t i0, int64_t i1, int64_t m,
                                   int64_t d_runtime, T inv_lam) {
  const int64_t d = Dim > 0 ? Dim : d_runtime;
  constexpr int64_t kAccSize = Dim > 0 ? kKeysPerTask * Dim : 1;
  for (int64_t jb = j0; jb < j1; jb += kKeysPerTask) {
    const int64_t nj = std::min(kKeysPerTask, j1 - jb);
    T* dkb = dk + jb * d;
    const T* kb = k + jb * d;
    T acc[kAccSize];
    T* sums = Dim > 0 ? acc : dkb;
    for (int64_t t = 0; t < nj * d; ++t) sums[t] = T(0);
    for (int64_t i = i0; i < i1; ++i) {
      const T* qi = q + i * d;
      T gs[kKeysPerTask];
      for (int64_t u = 0; u < kKeysPerTask; ++u)
        gs[u] = u < nj ? grad[i * m + jb + u] * out[i * m + jb + u] * inv_lam : T(0);
      for (int64_t u = 0; u < nj; ++u) {
        const T g = gs[u];
        const T* kj = kb + u * d;
        T* sj = sums + u * d;
#pragma omp simd
        for (int64_t c = 0; c < d; ++c) sj[c] += sign_times(qi[c] - kj[c], g);
      }
    }
    if constexpr (Dim > 0)
      for (int64_t t = 0; t < nj * d; ++t) dkb[t] = acc[t];
  }
}

template <typename T>
MMLINATTN_INLINE void dk_rows_dispatch(const T* grad, const T* out, const T* q, const T* k, T* dk,
                                       int64_t j0, int64_t j1, int64_t i0, int64_t i1, int64_t m,
                                       int64_t d, T inv_lam) {
  switch (d) {
    case 16: return dk_rows_impl<T, 16>(grad, out, q, k, dk, j0, j1, i0, i1, m, d, inv_lam);
    case 32: return dk_rows_impl<T, 32>(grad, out, q, k, dk, j0, j1, i0, i1, m, d, inv_lam);
    case 64: return dk_rows_impl<T, 64>(grad, out, q, k, dk, j0, j1, i0, i1, m, d, inv_lam);
    default: return dk_rows_impl<T, 0>(grad, out, q, k, dk, j0, j1, i0, i1, m, d, inv_lam);
  }
}

MMLINATTN_CPU_CLONES void dk_rows(const float* grad, const float* out, const float* q,
                                  const float* k, float* dk, int64_t j0, int64_t j1, int64_t i0,
                                  int64_t i1, int64_t m, int64_t d, float inv_lam) {
  dk_rows_dispatch<float>(grad, out, q, k, dk, j0, j1, i0, i1, m, d, inv_lam);
}
MMLINATTN_CPU_CLONES void dk_rows(const double* grad, const double* out, const double* q,
                                  const double* k, double* dk, int64_t j0, int64_t j1, int64_t i0,
                                  int64_t i1, int64_t m, int64_t d, double inv_lam) {
  dk_rows_dispatch<double>(grad, out, q, k, dk, j0, j1, i0, i1, m, d, inv_lam);
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Each op runs one parallel region (plus a small ordered sum for dk when N is large): under a
// busy machine every extra fork/join waits for the slowest thread to be scheduled.
template <typename T>
void forward_cpu(const at::Tensor& q, const at::Tensor& k, at::Tensor& out, double lam) {
  const int64_t bh = q.size(0) * q.size(1), n = q.size(2), m = k.size(2), d = q.size(3);
  const int64_t mp = ceil_div(m, kTileJ) * kTileJ;
  // Keys transposed and zero-padded per (b,h): kt[b*h][c][j] (as small as k: done serially).
  std::vector<T> kt(bh * d * mp, T(0));
  const T* k_ptr = k.const_data_ptr<T>();
  for (int64_t b = 0; b < bh; ++b)
    for (int64_t j = 0; j < m; ++j)
      for (int64_t c = 0; c < d; ++c) kt[(b * d + c) * mp + j] = k_ptr[(b * m + j) * d + c];
  const T* q_ptr = q.const_data_ptr<T>();
  T* out_ptr = out.mutable_data_ptr<T>();
  const int64_t tiles = ceil_div(n, kRowsPerTask);
  const T scale = T(-1.0 / lam);
  at::parallel_for(0, bh * tiles, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b = t / tiles, i0 = (t % tiles) * kRowsPerTask;
      const int64_t i1 = std::min(n, i0 + kRowsPerTask);
      forward_rows(q_ptr + b * n * d, kt.data() + b * d * mp, out_ptr + b * n * m, i0, i1, m, mp,
                   d, scale);
    }
  });
}

// dq tasks (query-row tiles) and dk tasks (key blocks x fixed query chunks, each writing its own
// partial sum) in one parallel region; partial dk sums are then added in chunk order.
template <typename T>
void backward_cpu(const at::Tensor& grad, const at::Tensor& out, const at::Tensor& q,
                  const at::Tensor& k, at::Tensor* dq, at::Tensor* dk, double lam) {
  const int64_t bh = q.size(0) * q.size(1), n = q.size(2), m = k.size(2), d = q.size(3);
  const T *g_ptr = grad.const_data_ptr<T>(), *o_ptr = out.const_data_ptr<T>();
  const T *q_ptr = q.const_data_ptr<T>(), *k_ptr = k.const_data_ptr<T>();
  const T inv_lam = T(1.0 / lam);
  const int64_t dq_tiles = ceil_div(n, kRowsPerTask), dq_tasks = dq ? bh * dq_tiles : 0;
  const int64_t key_blocks = ceil_div(m, kKeysPerTask);
  const int64_t chunks = ceil_div(n, kQueryChunk), per_chunk = key_blocks * bh;
  const int64_t dk_tasks = dk ? chunks * per_chunk : 0;
  // One partial dk per query chunk ([chunks][bh][m][d]), or dk itself for a single chunk.
  at::Tensor partial = !dk ? at::Tensor() : chunks == 1 ? *dk : at::empty({chunks, bh, m, d},
                                                                          dk->options());
  T* dq_ptr = dq ? dq->mutable_data_ptr<T>() : nullptr;
  T* p_ptr = dk ? partial.mutable_data_ptr<T>() : nullptr;
  at::parallel_for(0, dq_tasks + dk_tasks, 1, [&](int64_t t0, int64_t t1) {
    std::vector<T> g_row(dq ? m : 0);
    for (int64_t t = t0; t < t1; ++t) {
      if (t < dq_tasks) {
        const int64_t b = t / dq_tiles, i0 = (t % dq_tiles) * kRowsPerTask;
        dq_rows(g_ptr + b * n * m, o_ptr + b * n * m, q_ptr + b * n * d, k_ptr + b * m * d,
                dq_ptr + b * n * d, i0, std::min(n, i0 + kRowsPerTask), m, d, inv_lam,
                g_row.data());
      } else {
        const int64_t u = t - dq_tasks;
        const int64_t chunk = u / per_chunk, b = (u % per_chunk) / key_blocks;
        const int64_t j0 = (u % key_blocks) * kKeysPerTask, i0 = chunk * kQueryChunk;
        dk_rows(g_ptr + b * n * m, o_ptr + b * n * m, q_ptr + b * n * d, k_ptr + b * m * d,
                p_ptr + (chunk * bh + b) * m * d, j0, std::min(m, j0 + kKeysPerTask), i0,
                std::min(n, i0 + kQueryChunk), m, d, inv_lam);
      }
    }
  });
  if (!dk || chunks == 1) return;
  T* dk_ptr = dk->mutable_data_ptr<T>();
  const int64_t size = bh * m * d;
  for (int64_t e = 0; e < size; ++e) dk_ptr[e] = p_ptr[e];
  for (int64_t chunk = 1; chunk < chunks; ++chunk)
#pragma omp simd
    for (int64_t e = 0; e < size; ++e) dk_ptr[e] += p_ptr[chunk * size + e];
}

at::Tensor laplacian_kernel_forward_cpu(const at::Tensor& q_in, const at::Tensor& k_in,
                                        double lam) {
  check_forward_args(q_in, k_in, lam);
  const at::Tensor q = q_in.contiguous(), k = k_in.contiguous();
  at::Tensor out = at::empty({q.size(0), q.size(1), q.size(2), k.size(2)}, q.options());
  if (out.numel() == 0) return out;
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
  const bool empty_sum = grad.numel() == 0;
  const auto make = [&](bool need, const at::Tensor& like) {
    return !need ? at::empty({0}, like.options())
                 : empty_sum ? at::zeros_like(like) : at::empty_like(like);
  };
  at::Tensor dq = make(need_dq, q), dk = make(need_dk, k);
  if (empty_sum || (!need_dq && !need_dk)) return {dq, dk};
  at::Tensor dk_flat = need_dk ? dk.view({k.size(0) * k.size(1), k.size(2), k.size(3)}) : dk;
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "laplacian_kernel_backward_cpu", [&] {
    backward_cpu<scalar_t>(grad, out, q, k, need_dq ? &dq : nullptr, need_dk ? &dk_flat : nullptr,
                           lam);
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
