// CPU kernels of the Newton–Schulz inverse (fp32, fp64), forward and backward, and the op schemas.
// The formulas are in newton_schulz.h; the choices are explained in docs/ops/newton_schulz.md.
//
// Each matrix lives in a buffer [M][ld] whose rows are padded with zeros to ld (a multiple of
// kCols, one 64-byte vector), so every column tile is full width. A product C = A B is computed
// in 8-row x kCols-column register tiles, each entry summed over k in order, so results do not
// depend on how rows are split over threads.
//
// Symmetric P (the LaplacianFormer case: a Gram matrix): every V_t is then symmetric, and so is
// V_t P V_t, so the second product of a step computes only the tiles on or above the diagonal
// (the rows past the last full column tile whole, instead of the ragged column tile) and mirrors
// the rest; V stays exactly symmetric. T = V P is computed in full (symmetrising it would make
// the iteration unstable: the commutator of V and P would no longer cancel), its ragged columns
// as rows of P V. Other matrices get full products. The first step needs no product:
// V_1 = 2 V_0 - s^-2 P.
//
// Work split: with at least as many matrices as threads each thread runs whole matrices; with
// fewer, every product is split over row blocks (one parallel region per product).
// Matrices larger than kMaxTiledSize use the batched-matmul path (BLAS), which is faster there.
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "newton_schulz.h"

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define MMLINATTN_CPU_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define MMLINATTN_CPU_CLONES
#endif
#define MMLINATTN_INLINE inline __attribute__((always_inline))

namespace mmlinattn::newton_schulz {
namespace {

constexpr int kRows = 8;                // output rows per register tile
constexpr int64_t kRowsPerTask = 32;    // output rows per parallel task
constexpr int64_t kMaxTiledSize = 512;  // larger M: batched matmul (BLAS)

template <typename T>
constexpr int64_t kCols = 64 / sizeof(T);  // output columns per register tile

enum class Epilogue { kStore, kTwiceVMinus, kSubtract };  // C = AB | 2V - AB | C - AB

// One tile of C (op)= A B: rows r0 .. r0+Rows of A and C, columns j0 .. j0+kCols of B, V and C;
// a, c, v point at row r0 (column 0 for a, j0 for c and v), b at column j0; k runs over [0, m).
template <typename T, int Rows, Epilogue E>
MMLINATTN_INLINE void tile(const T* a, const T* b, const T* v, T* c, int64_t m, int64_t ld) {
  constexpr int64_t W = kCols<T>;
  T acc[Rows][W];
  for (int r = 0; r < Rows; ++r)
    for (int64_t w = 0; w < W; ++w) acc[r][w] = T(0);
  for (int64_t kk = 0; kk < m; ++kk) {
    const T* bk = b + kk * ld;
    for (int r = 0; r < Rows; ++r) {
      const T ar = a[r * ld + kk];
#pragma omp simd
      for (int64_t w = 0; w < W; ++w) acc[r][w] += ar * bk[w];
    }
  }
  for (int r = 0; r < Rows; ++r) {
    T* cr = c + r * ld;
    const T* vr = v + r * ld;
#pragma omp simd
    for (int64_t w = 0; w < W; ++w) {
      if constexpr (E == Epilogue::kStore) cr[w] = acc[r][w];
      if constexpr (E == Epilogue::kTwiceVMinus) cr[w] = T(2) * vr[w] - acc[r][w];
      if constexpr (E == Epilogue::kSubtract) cr[w] -= acc[r][w];
    }
  }
}

// Which tiles of C a product computes. kFull: all. kLeft: the full column tiles [0, mv) only,
// mv = M rounded down to kCols (the ragged columns come from elsewhere). kUpper: for rows below
// mv the full column tiles that reach the diagonal or beyond, the rows from mv on whole (then
// mirror_upper fills the rest of a symmetric C).
enum class Tiles { kFull, kLeft, kUpper };

// Rows [i0, i1) of C (op)= A B; i0 is a multiple of kRows.
template <typename T, Epilogue E>
MMLINATTN_INLINE void product_rows_impl(const T* a, const T* b, const T* v, T* c, int64_t i0,
                                        int64_t i1, int64_t m, int64_t ld, Tiles tiles) {
  constexpr int64_t W = kCols<T>;
  const int64_t mv = m / W * W;
  const auto columns = [&](int64_t i, int64_t rows, auto tile_fn) {
    int64_t j_begin = 0, j_end = ld;
    if (tiles == Tiles::kLeft) j_end = mv;
    if (tiles == Tiles::kUpper && i + rows <= mv) j_begin = i / W * W, j_end = mv;
    for (int64_t j0 = j_begin; j0 < j_end; j0 += W)
      tile_fn(a + i * ld, b + j0, v + i * ld + j0, c + i * ld + j0);
  };
  int64_t i = i0;
  for (; i + kRows <= i1; i += kRows)  // kRows divides kCols: no tile straddles mv
    columns(i, kRows, [&](const T* ai, const T* bj, const T* vij, T* cij) {
      tile<T, kRows, E>(ai, bj, vij, cij, m, ld);
    });
  for (; i < i1; ++i)
    columns(i, 1, [&](const T* ai, const T* bj, const T* vij, T* cij) {
      tile<T, 1, E>(ai, bj, vij, cij, m, ld);
    });
}

template <typename T>
MMLINATTN_INLINE void product_rows_dispatch(const T* a, const T* b, const T* v, T* c, int64_t i0,
                                            int64_t i1, int64_t m, int64_t ld, Epilogue e,
                                            Tiles tiles) {
  switch (e) {
    case Epilogue::kStore:
      return product_rows_impl<T, Epilogue::kStore>(a, b, v, c, i0, i1, m, ld, tiles);
    case Epilogue::kTwiceVMinus:
      return product_rows_impl<T, Epilogue::kTwiceVMinus>(a, b, v, c, i0, i1, m, ld, tiles);
    case Epilogue::kSubtract:
      return product_rows_impl<T, Epilogue::kSubtract>(a, b, v, c, i0, i1, m, ld, tiles);
  }
}

MMLINATTN_CPU_CLONES void product_rows(const float* a, const float* b, const float* v, float* c,
                                       int64_t i0, int64_t i1, int64_t m, int64_t ld, Epilogue e,
                                       Tiles tiles) {
  product_rows_dispatch<float>(a, b, v, c, i0, i1, m, ld, e, tiles);
}
MMLINATTN_CPU_CLONES void product_rows(const double* a, const double* b, const double* v,
                                       double* c, int64_t i0, int64_t i1, int64_t m, int64_t ld,
                                       Epilogue e, Tiles tiles) {
  product_rows_dispatch<double>(a, b, v, c, i0, i1, m, ld, e, tiles);
}

// After a kUpper product: C_ji = C_ij for i < j, where rows >= mv were computed whole and hold
// the columns >= mv of the rows above them.
template <typename T>
void mirror_upper(T* c, int64_t m, int64_t ld) {
  const int64_t mv = m / kCols<T> * kCols<T>;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = i + 1; j < m; ++j) {
      const T value = (i < mv && j >= mv) ? c[j * ld + i] : c[i * ld + j];
      c[i * ld + j] = value;
      c[j * ld + i] = value;
    }
}

template <typename T>
void transpose(const T* src, T* dst, int64_t m, int64_t ld) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < m; ++j) dst[j * ld + i] = src[i * ld + j];
}

// Runs fn(i0, i1) over the rows of a product: inline when already inside a parallel region
// (one thread per matrix), else split over row blocks.
template <typename F>
void for_row_blocks(int64_t m, const F& fn) {
  if (at::in_parallel_region()) return fn(int64_t{0}, m);
  const int64_t blocks = (m + kRowsPerTask - 1) / kRowsPerTask;
  at::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
    fn(b0 * kRowsPerTask, std::min(m, b1 * kRowsPerTask));
  });
}

// C (op)= A B for one matrix.
template <typename T>
void product(const T* a, const T* b, const T* v, T* c, int64_t m, int64_t ld, Epilogue e,
             Tiles tiles = Tiles::kFull) {
  for_row_blocks(m, [&](int64_t i0, int64_t i1) {
    product_rows(a, b, v, c, i0, i1, m, ld, e, tiles);
  });
  if (tiles == Tiles::kUpper) mirror_upper(c, m, ld);
}

// T = V P for symmetric V and P (T itself is not symmetric in floating point): the full column
// tiles by tiles, the ragged columns j >= mv as rows of P V (row j of P times V gives
// sum_k P_jk V_ki = sum_k V_ik P_kj, the same products in the same order), transposed in.
template <typename T>
void product_symmetric_factors(const T* v, const T* p, T* t, T* scratch, int64_t m, int64_t ld) {
  const int64_t mv = m / kCols<T> * kCols<T>;
  product(v, p, v, t, m, ld, Epilogue::kStore, Tiles::kLeft);
  if (mv == m) return;
  product_rows(p, v, v, scratch, mv, m, m, ld, Epilogue::kStore, Tiles::kFull);
  for (int64_t j = mv; j < m; ++j)
    for (int64_t i = 0; i < m; ++i) t[i * ld + j] = scratch[j * ld + i];
}

// One matrix: P = a + eps I in a padded buffer, its row sums and s = max (NaN propagates).
template <typename T>
struct Shifted {
  std::vector<T> p, row_sums;
  T norm = -std::numeric_limits<T>::infinity();
  bool symmetric = true;

  Shifted(const T* a, int64_t m, int64_t ld, double eps) : p(m * ld, T(0)), row_sums(m) {
    for (int64_t i = 0; i < m; ++i) {
      T row = T(0);
      for (int64_t j = 0; j < m; ++j) {
        const T value = a[i * m + j] + (i == j ? T(eps) : T(0));
        p[i * ld + j] = value;
        row += std::abs(value);
        symmetric = symmetric && value == a[j * m + i] + (i == j ? T(eps) : T(0));
      }
      row_sums[i] = row;
      if (!(row <= norm) && !std::isnan(norm)) norm = row;  // a NaN row makes s NaN
    }
  }
};

// V_1 = 2 V_0 - V_0 P V_0 with V_0 = I / s, as the products would give it: 2/s I - (P/s)/s.
template <typename T>
void first_step(const Shifted<T>& s, T* v, int64_t m, int64_t ld) {
  const T inv = T(1) / s.norm;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < m; ++j)
      v[i * ld + j] = (i == j ? T(2) * inv : T(0)) - (s.p[i * ld + j] * inv) * inv;
}

// The iteration for one matrix: V_t for t = 1 .. iters into v (scratch t, w); with `history`,
// V_0 .. V_{iters-1} and T_t = V_t P (t < iters) are kept for the backward.
template <typename T>
void iterate(const Shifted<T>& s, int64_t iters, int64_t m, int64_t ld, T* v, T* scratch_t,
             T* scratch_w, std::vector<T>* history_v = nullptr,
             std::vector<T>* history_t = nullptr) {
  const int64_t size = m * ld;
  const bool sym = s.symmetric;
  if (history_v) {
    std::fill(history_v->begin(), history_v->begin() + size, T(0));
    for (int64_t i = 0; i < m; ++i) (*history_v)[i * ld + i] = T(1) / s.norm;
    // T_0 = V_0 P = P / s, what the product gives for a diagonal V_0
    for (int64_t e = 0; e < size; ++e) (*history_t)[e] = s.p[e] * (T(1) / s.norm);
  }
  first_step(s, v, m, ld);
  T* cur = v;
  T* next = scratch_w;
  for (int64_t step = 1; step < iters; ++step) {
    if (history_v) std::copy(cur, cur + size, history_v->begin() + step * size);
    T* t = history_t ? history_t->data() + step * size : scratch_t;
    if (sym) {  // T = V P; next = 2V - T V, symmetric: upper half
      product_symmetric_factors(cur, s.p.data(), t, next, m, ld);
      product(t, cur, cur, next, m, ld, Epilogue::kTwiceVMinus, Tiles::kUpper);
    } else {
      product(cur, s.p.data(), cur, t, m, ld, Epilogue::kStore);
      product(t, cur, cur, next, m, ld, Epilogue::kTwiceVMinus);
    }
    std::swap(cur, next);
  }
  if (cur != v) std::copy(cur, cur + size, v);
}

template <typename T>
T residual_of(const Shifted<T>& s, const T* v, T* scratch, int64_t m, int64_t ld) {
  product(s.p.data(), v, v, scratch, m, ld, Epilogue::kStore);
  double sum = 0;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < m; ++j) {
      const double e = (i == j ? 1.0 : 0.0) - static_cast<double>(scratch[i * ld + j]);
      sum += e * e;
    }
  return static_cast<T>(std::sqrt(sum / static_cast<double>(m)));
}

int64_t padded(int64_t m, int64_t cols) { return (m + cols - 1) / cols * cols; }

// Calls fn(n) for every matrix: one thread per matrix when there are enough of them, else in
// order (and the products inside split their rows over the threads).
template <typename F>
void for_each_matrix(int64_t batch, const F& fn) {
  if (batch >= at::get_num_threads()) {
    at::parallel_for(0, batch, 1, [&](int64_t n0, int64_t n1) {
      for (int64_t n = n0; n < n1; ++n) fn(n);
    });
  } else {
    for (int64_t n = 0; n < batch; ++n) fn(n);
  }
}

template <typename T>
void forward_impl(const at::Tensor& a, int64_t iters, double eps, at::Tensor& v_out,
                  at::Tensor& residual) {
  const int64_t batch = a.size(0), m = a.size(1), ld = padded(m, kCols<T>);
  const T* a_ptr = a.const_data_ptr<T>();
  T* v_ptr = v_out.mutable_data_ptr<T>();
  T* res = residual.numel() ? residual.mutable_data_ptr<T>() : nullptr;
  for_each_matrix(batch, [&](int64_t n) {
    const Shifted<T> s(a_ptr + n * m * m, m, ld, eps);
    std::vector<T> work(3 * m * ld, T(0));
    T* v = work.data();
    iterate(s, iters, m, ld, v, v + m * ld, v + 2 * m * ld);
    for (int64_t i = 0; i < m; ++i) std::copy(v + i * ld, v + i * ld + m, v_ptr + (n * m + i) * m);
    if (res) res[n] = residual_of(s, v, v + m * ld, m, ld);
  });
}

template <typename T>
void backward_impl(const at::Tensor& grad, const at::Tensor& a, int64_t iters, double eps,
                   at::Tensor& grad_a) {
  const int64_t batch = a.size(0), m = a.size(1), ld = padded(m, kCols<T>), size = m * ld;
  const T* a_ptr = a.const_data_ptr<T>();
  const T* g_ptr = grad.const_data_ptr<T>();
  T* out_ptr = grad_a.mutable_data_ptr<T>();
  for_each_matrix(batch, [&](int64_t n) {
    const Shifted<T> s(a_ptr + n * m * m, m, ld, eps);
    std::vector<T> history_v(iters * size), history_t(iters * size);
    // g, g_next, vt_g, dp, and the transposes V^T, T^T, P^T for non-symmetric P
    std::vector<T> work(7 * size, T(0));
    T *g = work.data(), *g_next = g + size, *vt_g = g_next + size, *dp = vt_g + size;
    T *v_tr = dp + size, *t_tr = v_tr + size, *p_tr = t_tr + size;
    iterate(s, iters, m, ld, g_next, g, vt_g, &history_v, &history_t);
    std::fill(work.begin(), work.begin() + 2 * size, T(0));
    for (int64_t i = 0; i < m; ++i)
      std::copy(g_ptr + (n * m + i) * m, g_ptr + (n * m + i + 1) * m, g + i * ld);
    const T* p_t = s.p.data();
    if (!s.symmetric) {
      transpose(s.p.data(), p_tr, m, ld);
      p_t = p_tr;
    }
    for (int64_t t = iters - 1; t >= 0; --t) {
      const T* v = history_v.data() + t * size;
      const T* tt = history_t.data() + t * size;
      // Symmetric P: V^T = V, P^T = P and (P V)^T = V P = T. Otherwise V^T and, as P V = V P,
      // (P V)^T = T^T.
      if (!s.symmetric) {
        transpose(v, v_tr, m, ld);
        transpose(tt, t_tr, m, ld);
        v = v_tr;
        tt = t_tr;
      }
      product(v, g, g, vt_g, m, ld, Epilogue::kStore);          // V^T G
      product(vt_g, v, v, dp, m, ld, Epilogue::kSubtract);       // dP -= V^T G V^T
      product(g, tt, g, g_next, m, ld, Epilogue::kTwiceVMinus);  // 2G - G T^T
      product(p_t, vt_g, vt_g, g_next, m, ld, Epilogue::kSubtract);  // - P^T V^T G
      std::swap(g, g_next);
    }
    // V_0 = I / s: dL/ds = -tr(G_0) / s^2, shared by the rows attaining s.
    T trace = T(0);
    int64_t at_max = 0;
    for (int64_t i = 0; i < m; ++i) {
      trace += g[i * ld + i];
      at_max += s.row_sums[i] == s.norm;
    }
    const T share = -trace / (s.norm * s.norm) / static_cast<T>(at_max);
    for (int64_t i = 0; i < m; ++i) {
      const bool is_max = s.row_sums[i] == s.norm;
      T* out_row = out_ptr + (n * m + i) * m;
      for (int64_t j = 0; j < m; ++j) {
        const T pij = s.p[i * ld + j];
        const T sign = pij > T(0) ? T(1) : pij < T(0) ? T(-1) : T(0);
        out_row[j] = dp[i * ld + j] + (is_max ? share * sign : T(0));
      }
    }
  });
}

std::tuple<at::Tensor, at::Tensor> newton_schulz_inverse_cpu(const at::Tensor& a_in, int64_t iters,
                                                             double eps, bool with_residual) {
  check_args(a_in, iters, eps);
  if (a_in.size(1) > kMaxTiledSize)
    return newton_schulz_batched_matmul(a_in, iters, eps, with_residual);
  const at::Tensor a = a_in.contiguous();
  at::Tensor v = at::empty(a.sizes(), a.options());
  at::Tensor residual = at::zeros({with_residual ? a.size(0) : 0}, a.options());
  if (a.numel() == 0) return {v, residual};
  AT_DISPATCH_FLOATING_TYPES(a.scalar_type(), "newton_schulz_inverse_cpu",
                             [&] { forward_impl<scalar_t>(a, iters, eps, v, residual); });
  return {v, residual};
}

at::Tensor newton_schulz_inverse_backward_cpu(const at::Tensor& grad_in, const at::Tensor& a_in,
                                              int64_t iters, double eps) {
  check_backward_args(grad_in, a_in, iters, eps);
  if (a_in.size(1) > kMaxTiledSize)
    return newton_schulz_backward_batched_matmul(grad_in, a_in, iters, eps);
  const at::Tensor a = a_in.contiguous(), grad = grad_in.contiguous();
  at::Tensor grad_a = at::empty(a.sizes(), a.options());
  if (a.numel() == 0) return grad_a;
  AT_DISPATCH_FLOATING_TYPES(a.scalar_type(), "newton_schulz_inverse_backward_cpu",
                             [&] { backward_impl<scalar_t>(grad, a, iters, eps, grad_a); });
  return grad_a;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(mmlinattn, m) {
  m.def(
      "newton_schulz_inverse(Tensor a, int iters, float eps, bool with_residual) -> "
      "(Tensor, Tensor)");
  m.def("newton_schulz_inverse_backward(Tensor grad_v, Tensor a, int iters, float eps) -> Tensor");
}

TORCH_LIBRARY_IMPL(mmlinattn, CPU, m) {
  m.impl("newton_schulz_inverse", &newton_schulz_inverse_cpu);
  m.impl("newton_schulz_inverse_backward", &newton_schulz_inverse_backward_cpu);
}

}  // namespace mmlinattn::newton_schulz
