// CPU kernel of the Newton–Schulz inverse (fp32, fp64), and the device-agnostic batched-matmul
// path that the CUDA code uses for large matrices.
//
// CPU: P, V, and two work matrices per batch entry live in buffers [B][M][Mp] whose rows are
// padded with zeros to Mp (a multiple of kCols), so every column tile is full width. A step is
// T = V P, then V' = 2V - T V, each output tile an 8 x 16 register block accumulated over k
// (vectorised over the 16 columns). With at least as many matrices as threads, each thread runs
// whole matrices through every step (one parallel region); otherwise each half step is split over
// (matrix, row block). Every entry is reduced in a fixed order either way, so the result does not
// depend on the thread count.
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

// The iteration on buffers [batch][m][ld] (P, V, T, W; padding columns zero). Every entry is a
// product over k in a fixed order, whatever the partition into tasks, so the result does not
// depend on the thread count.
template <typename T>
class Iteration {
 public:
  Iteration(T* p, T* v, T* t, T* w, int64_t m, int64_t ld)
      : p_(p), v_(v), t_(t), w_(w), m_(m), ld_(ld) {}

  // P = a + eps*I for matrix n and V0 = I / ||P||_inf.
  void init(int64_t n, const T* a, double eps) {
    T* pn = p_ + n * stride();
    T norm = T(0);
    for (int64_t i = 0; i < m_; ++i) {
      T row = T(0);
      for (int64_t j = 0; j < m_; ++j) {
        pn[i * ld_ + j] = a[(n * m_ + i) * m_ + j] + (i == j ? T(eps) : T(0));
        row += std::abs(pn[i * ld_ + j]);
      }
      norm = std::max(norm, row);
    }
    for (int64_t i = 0; i < m_; ++i) v_[n * stride() + i * ld_ + i] = T(1) / norm;
  }

  // Rows [i0, i1) of one half step of matrix n: T = V P (first) or W = 2V - T V (second).
  void half_step(int64_t n, bool second, int64_t i0, int64_t i1) {
    const int64_t off = n * stride();
    if (second)
      matmul_rows(t_ + off, v_ + off, v_ + off, w_ + off, i0, i1, m_, ld_, /*update=*/true);
    else
      matmul_rows(v_ + off, p_ + off, v_ + off, t_ + off, i0, i1, m_, ld_, /*update=*/false);
  }

  void swap() { std::swap(v_, w_); }  // after both half steps of every matrix

  // ||I - P V||_F / sqrt(M) of matrix n, with T as scratch.
  T residual(int64_t n) {
    const int64_t off = n * stride();
    matmul_rows(p_ + off, v_ + off, v_ + off, t_ + off, 0, m_, m_, ld_, /*update=*/false);
    double sum = 0;
    for (int64_t i = 0; i < m_; ++i)
      for (int64_t j = 0; j < m_; ++j) {
        const double e = (i == j ? 1.0 : 0.0) - static_cast<double>(t_[off + i * ld_ + j]);
        sum += e * e;
      }
    return static_cast<T>(std::sqrt(sum / static_cast<double>(m_)));
  }

  const T* v() const { return v_; }
  int64_t stride() const { return m_ * ld_; }

 private:
  T *p_, *v_, *t_, *w_;
  int64_t m_, ld_;
};

template <typename T>
void newton_schulz_cpu_impl(const at::Tensor& a_in, int64_t iters, double eps, at::Tensor& v_out,
                            at::Tensor& residual) {
  const int64_t batch = a_in.size(0), m = a_in.size(1);
  const int64_t ld = (m + kCols - 1) / kCols * kCols;
  const auto options = a_in.options().dtype(c10::CppTypeToScalarType<T>::value);
  at::Tensor buffers = at::zeros({4, batch, m, ld}, options);
  Iteration<T> it(buffers[0].mutable_data_ptr<T>(), buffers[1].mutable_data_ptr<T>(),
                  buffers[2].mutable_data_ptr<T>(), buffers[3].mutable_data_ptr<T>(), m, ld);
  const at::Tensor a = a_in.to(options.dtype()).contiguous();
  const T* a_ptr = a.const_data_ptr<T>();
  T* res = residual.numel() ? residual.mutable_data_ptr<T>() : nullptr;
  if (batch >= at::get_num_threads()) {
    // Enough matrices for every thread: one parallel region, each matrix run to the end alone.
    at::parallel_for(0, batch, 1, [&](int64_t n0, int64_t n1) {
      for (int64_t n = n0; n < n1; ++n) {
        Iteration<T> local = it;
        local.init(n, a_ptr, eps);
        for (int64_t step = 0; step < iters; ++step) {
          local.half_step(n, false, 0, m);
          local.half_step(n, true, 0, m);
          local.swap();
        }
        if (res) res[n] = local.residual(n);
      }
    });
    if (iters % 2) it.swap();  // where the local copies left V
  } else {
    // Few large matrices: split every half step over (matrix, row block).
    const int64_t blocks = (m + kRowsPerTask - 1) / kRowsPerTask;
    at::parallel_for(0, batch, 1, [&](int64_t n0, int64_t n1) {
      for (int64_t n = n0; n < n1; ++n) it.init(n, a_ptr, eps);
    });
    for (int64_t step = 0; step < iters; ++step) {
      for (const bool second : {false, true})
        at::parallel_for(0, batch * blocks, 1, [&](int64_t t0, int64_t t1) {
          for (int64_t t = t0; t < t1; ++t) {
            const int64_t i0 = (t % blocks) * kRowsPerTask;
            it.half_step(t / blocks, second, i0, std::min(m, i0 + kRowsPerTask));
          }
        });
      it.swap();
    }
    if (res)
      at::parallel_for(0, batch, 1, [&](int64_t n0, int64_t n1) {
        for (int64_t n = n0; n < n1; ++n) res[n] = it.residual(n);
      });
  }
  const int64_t which = it.v() == buffers[1].const_data_ptr<T>() ? 1 : 3;
  v_out.copy_(buffers[which].narrow(2, 0, m));
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
