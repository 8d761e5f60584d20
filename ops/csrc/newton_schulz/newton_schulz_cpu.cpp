// CPU kernel of the Newton–Schulz inverse (fp32, fp64), and the device-agnostic batched-matmul
// path that the CUDA code uses for large matrices.
//
// CPU: P, V, and two work matrices per batch entry live in buffers [B][M][Mp] whose rows are
// padded with zeros to Mp (a multiple of kCols), so every column tile is full width. Each step is
// two parallel passes over (matrix, row block): T = V P, then V' = 2V - T V, each output tile an
// 8 x 16 register block accumulated over k (vectorised over the 16 columns). Every entry is
// reduced in a fixed order, so the result does not depend on the thread count.
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>

#include "newton_schulz.h"

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define MMLINATTN_CPU_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define MMLINATTN_CPU_CLONES
#endif
#define MMLINATTN_INLINE inline __attribute__((always_inline))

namespace mmlinattn::newton_schulz {

std::tuple<at::Tensor, at::Tensor> newton_schulz_batched_matmul(const at::Tensor& a, int64_t iters,
                                                                double eps, bool with_residual) {
  const int64_t m = a.size(1);
  const at::Tensor eye = at::eye(m, a.options().dtype(compute_type(a)));
  const at::Tensor p = a.to(compute_type(a)) + eps * eye;
  const at::Tensor norm = p.abs().sum(-1).amax(-1);  // ||P||_inf per matrix
  at::Tensor v = eye.expand_as(p) / norm.view({-1, 1, 1});
  for (int64_t it = 0; it < iters; ++it) {
    const at::Tensor t = at::bmm(v, p);
    v = at::baddbmm(v, t, v, /*beta=*/2, /*alpha=*/-1);
  }
  at::Tensor residual = with_residual
                            ? at::linalg_matrix_norm(eye - at::bmm(p, v), "fro", {-2, -1}) /
                                  std::sqrt(static_cast<double>(m))
                            : at::empty({0}, v.options());
  return {v, residual};
}

namespace {

constexpr int64_t kCols = 16;          // output columns per register tile
constexpr int kRows = 8;               // output rows per register tile
constexpr int64_t kRowsPerTask = 32;   // output rows per parallel task

// Rows [i0, i1) of C = A B for one matrix (all [m][ld], ld >= m, padded columns zero);
// with Update, C = 2 V - A B instead.
template <typename T, int Rows, bool Update>
MMLINATTN_INLINE void matmul_tile(const T* a, const T* b, const T* v, T* c, int64_t m, int64_t ld,
                                  int64_t j0) {
  T acc[kRows][kCols];
  for (int r = 0; r < Rows; ++r)
    for (int64_t w = 0; w < kCols; ++w) acc[r][w] = T(0);
  for (int64_t kk = 0; kk < m; ++kk) {
    const T* bk = b + kk * ld + j0;
    for (int r = 0; r < Rows; ++r) {
      const T ar = a[r * ld + kk];
#pragma omp simd
      for (int64_t w = 0; w < kCols; ++w) acc[r][w] += ar * bk[w];
    }
  }
  for (int r = 0; r < Rows; ++r) {
    T* cr = c + r * ld + j0;
    const T* vr = v + r * ld + j0;
#pragma omp simd
    for (int64_t w = 0; w < kCols; ++w) cr[w] = Update ? T(2) * vr[w] - acc[r][w] : acc[r][w];
  }
}

template <typename T, bool Update>
MMLINATTN_INLINE void matmul_rows_impl(const T* a, const T* b, const T* v, T* c, int64_t i0,
                                       int64_t i1, int64_t m, int64_t ld) {
  int64_t i = i0;
  for (; i + kRows <= i1; i += kRows)
    for (int64_t j0 = 0; j0 < ld; j0 += kCols)
      matmul_tile<T, kRows, Update>(a + i * ld, b, v + i * ld, c + i * ld, m, ld, j0);
  for (; i < i1; ++i)
    for (int64_t j0 = 0; j0 < ld; j0 += kCols)
      matmul_tile<T, 1, Update>(a + i * ld, b, v + i * ld, c + i * ld, m, ld, j0);
}

MMLINATTN_CPU_CLONES void matmul_rows(const float* a, const float* b, const float* v, float* c,
                                      int64_t i0, int64_t i1, int64_t m, int64_t ld, bool update) {
  if (update) return matmul_rows_impl<float, true>(a, b, v, c, i0, i1, m, ld);
  matmul_rows_impl<float, false>(a, b, v, c, i0, i1, m, ld);
}
MMLINATTN_CPU_CLONES void matmul_rows(const double* a, const double* b, const double* v, double* c,
                                      int64_t i0, int64_t i1, int64_t m, int64_t ld, bool update) {
  if (update) return matmul_rows_impl<double, true>(a, b, v, c, i0, i1, m, ld);
  matmul_rows_impl<double, false>(a, b, v, c, i0, i1, m, ld);
}

// C = A B (or 2V - A B) for every matrix of the batch, parallel over (matrix, row block).
template <typename T>
void batched_matmul(const T* a, const T* b, const T* v, T* c, int64_t batch, int64_t m,
                    int64_t ld, bool update) {
  const int64_t blocks = (m + kRowsPerTask - 1) / kRowsPerTask, stride = m * ld;
  at::parallel_for(0, batch * blocks, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t n = t / blocks, i0 = (t % blocks) * kRowsPerTask;
      const int64_t off = n * stride;
      matmul_rows(a + off, b + off, v + off, c + off, i0, std::min(m, i0 + kRowsPerTask), m, ld,
                  update);
    }
  });
}

template <typename T>
void newton_schulz_cpu_impl(const at::Tensor& a_in, int64_t iters, double eps, at::Tensor& v_out,
                            at::Tensor& residual) {
  const int64_t batch = a_in.size(0), m = a_in.size(1);
  const int64_t ld = (m + kCols - 1) / kCols * kCols;
  const auto options = a_in.options().dtype(c10::CppTypeToScalarType<T>::value);
  // P and the iterate V, then two work matrices; all [batch][m][ld], padding columns zero.
  at::Tensor buffers = at::zeros({4, batch, m, ld}, options);
  T* p = buffers[0].mutable_data_ptr<T>();
  T* v = buffers[1].mutable_data_ptr<T>();
  T* t = buffers[2].mutable_data_ptr<T>();
  T* w = buffers[3].mutable_data_ptr<T>();
  const at::Tensor a = a_in.to(options.dtype()).contiguous();
  const T* a_ptr = a.const_data_ptr<T>();
  const int64_t stride = m * ld;
  at::parallel_for(0, batch, 1, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      T* pn = p + n * stride;
      T norm = T(0);
      for (int64_t i = 0; i < m; ++i) {
        T row = T(0);
        for (int64_t j = 0; j < m; ++j) {
          pn[i * ld + j] = a_ptr[(n * m + i) * m + j] + (i == j ? T(eps) : T(0));
          row += std::abs(pn[i * ld + j]);
        }
        norm = std::max(norm, row);
      }
      for (int64_t i = 0; i < m; ++i) v[n * stride + i * ld + i] = T(1) / norm;
    }
  });
  for (int64_t it = 0; it < iters; ++it) {
    batched_matmul<T>(v, p, v, t, batch, m, ld, /*update=*/false);  // T = V P
    batched_matmul<T>(t, v, v, w, batch, m, ld, /*update=*/true);   // W = 2V - T V
    std::swap(v, w);
  }
  v_out.copy_(buffers[v == buffers[1].const_data_ptr<T>() ? 1 : 3].narrow(2, 0, m));
  if (!residual.numel()) return;
  batched_matmul<T>(p, v, v, t, batch, m, ld, /*update=*/false);  // T = P V
  T* res = residual.mutable_data_ptr<T>();
  at::parallel_for(0, batch, 1, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      double sum = 0;
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < m; ++j) {
          const double e = (i == j ? 1.0 : 0.0) - static_cast<double>(t[n * stride + i * ld + j]);
          sum += e * e;
        }
      res[n] = static_cast<T>(std::sqrt(sum / static_cast<double>(m)));
    }
  });
}

std::tuple<at::Tensor, at::Tensor> newton_schulz_inverse_cpu(const at::Tensor& a, int64_t iters,
                                                             double eps, bool with_residual) {
  check_args(a, iters, eps);
  const auto options = a.options().dtype(compute_type(a));
  at::Tensor v = at::empty(a.sizes(), options);
  at::Tensor residual = at::zeros({with_residual ? a.size(0) : 0}, options);
  if (a.numel() == 0) return {v, residual};
  AT_DISPATCH_FLOATING_TYPES(options.dtype().toScalarType(), "newton_schulz_inverse_cpu",
                             [&] { newton_schulz_cpu_impl<scalar_t>(a, iters, eps, v, residual); });
  return {v, residual};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(mmlinattn, m) {
  m.def(
      "newton_schulz_inverse(Tensor a, int iters, float eps, bool with_residual) -> "
      "(Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(mmlinattn, CPU, m) {
  m.impl("newton_schulz_inverse", &newton_schulz_inverse_cpu);
}

}  // namespace mmlinattn::newton_schulz
