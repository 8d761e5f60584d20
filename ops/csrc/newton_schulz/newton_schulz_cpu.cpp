// CPU kernels of the Newton–Schulz inverse (fp32, fp64), forward and backward, and the op schemas.
// The formulas are in newton_schulz.h; the choices are explained in docs/ops/newton_schulz.md.
//
// Each matrix lives in a buffer [M][ld] whose rows are padded with zeros to ld (a multiple of
// kCols, one 64-byte vector), so every column tile is full width. A product C = A B is computed
// in register tiles of 8 rows x 1..3 vectors (the rows past the last multiple of 8 one at a time,
// up to 4 vectors wide so that 4 FMA chains run), each entry summed over k in order, so results
// do not depend on how rows are split over threads or on the tile shapes.
//
// Symmetric P (the LaplacianFormer case: a Gram matrix): every V_t and R_t is then symmetric, and
// so are V_t R_t, R_t R_t and V_k P V_k, so those products compute only the tiles on or above the
// diagonal (the rows past the last full column tile whole, instead of the ragged column tile) and
// mirror the rest; V and R stay exactly symmetric. The closing step's T = V P is computed in full
// (symmetrising it would make 2V - T V unstable: the commutator of V and P would no longer
// cancel), its ragged columns as rows of P V. Other matrices get full products. The first product
// step needs no product: V_1 = V_0 + R_0 / s.
//
// Work split: with at least as many matrices as threads each thread runs whole matrices; with
// fewer, every product is split over row blocks (one parallel region per product).
// Matrices larger than kMaxTiledSize use the batched-matmul path (BLAS), which is faster there.
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>
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

// C = AB | 2V - AB | V + AB | C - AB | C + AB
enum class Epilogue { kStore, kTwiceVMinus, kVPlus, kSubtract, kAccumulate };

// One 64-byte vector of T (GCC/Clang vector extension: a zmm, two ymm or four xmm registers).
// Its helpers are inlined internal functions, so the ABI note GCC gives for 64-byte vector
// arguments without AVX-512 concerns no call that exists.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wpsabi"
#endif
template <typename T>
struct Vector {
  typedef T type __attribute__((vector_size(64)));
};
template <typename T>
MMLINATTN_INLINE typename Vector<T>::type load(const T* p) {
  typename Vector<T>::type x;
  std::memcpy(&x, p, sizeof(x));
  return x;
}
template <typename T>
MMLINATTN_INLINE void store(T* p, typename Vector<T>::type x) {
  std::memcpy(p, &x, sizeof(x));
}

// One tile of C (op)= A B: rows r0 .. r0+Rows of A and C, columns j0 .. j0+Vecs*kCols of B, V
// and C; a, c, v point at row r0 (column 0 for a, j0 for c and v), b at column j0; k runs over
// [0, m), m >= 1. Every entry is the same sum in the same order whatever the tile's shape. The
// accumulators are vectors, so they stay in registers (arrays of scalars were zeroed in memory).
template <typename T, int Rows, int Vecs, Epilogue E>
MMLINATTN_INLINE void tile(const T* a, const T* b, const T* v, T* c, int64_t m, int64_t ld) {
  using V = typename Vector<T>::type;
  constexpr int64_t W = kCols<T>;
  V acc[Rows][Vecs];
  for (int r = 0; r < Rows; ++r)
    for (int w = 0; w < Vecs; ++w) acc[r][w] = V{};
  for (int64_t kk = 0; kk < m; ++kk) {
    V bk[Vecs];
    for (int w = 0; w < Vecs; ++w) bk[w] = load(b + kk * ld + w * W);
    for (int r = 0; r < Rows; ++r) {
      const T ar = a[r * ld + kk];
      for (int w = 0; w < Vecs; ++w) acc[r][w] += ar * bk[w];
    }
  }
  for (int r = 0; r < Rows; ++r)
    for (int w = 0; w < Vecs; ++w) {
      T* cr = c + r * ld + w * W;
      if constexpr (E == Epilogue::kStore) store(cr, acc[r][w]);
      if constexpr (E == Epilogue::kTwiceVMinus)
        store(cr, T(2) * load(v + r * ld + w * W) - acc[r][w]);
      if constexpr (E == Epilogue::kVPlus) store(cr, load(v + r * ld + w * W) + acc[r][w]);
      if constexpr (E == Epilogue::kSubtract) store(cr, load(cr) - acc[r][w]);
      if constexpr (E == Epilogue::kAccumulate) store(cr, load(cr) + acc[r][w]);
    }
}

// Which tiles of C a product computes. kFull: all. kLeft: the full column tiles [0, mv) only,
// mv = M rounded down to kCols (the ragged columns come from elsewhere). kUpper: for rows below
// mv the full column tiles that reach the diagonal or beyond, the rows from mv on whole (then
// mirror_upper fills the rest of a symmetric C).
enum class Tiles { kFull, kLeft, kUpper };

// Rows i .. i+Rows of C (op)= A B, the columns that `tiles` asks for, in tiles of up to MaxVecs
// vectors, widest first.
template <typename T, int Rows, int MaxVecs, Epilogue E>
MMLINATTN_INLINE void row_tiles(const T* a, const T* b, const T* v, T* c, int64_t i, int64_t m,
                                int64_t ld, Tiles tiles) {
  constexpr int64_t W = kCols<T>;
  const int64_t mv = m / W * W;
  int64_t j0 = 0, j_end = ld;
  if (tiles == Tiles::kLeft) j_end = mv;
  if (tiles == Tiles::kUpper && i + Rows <= mv) j0 = i / W * W, j_end = mv;
  a += i * ld, v += i * ld, c += i * ld;
  if constexpr (MaxVecs >= 4)
    for (; j0 + 4 * W <= j_end; j0 += 4 * W) tile<T, Rows, 4, E>(a, b + j0, v + j0, c + j0, m, ld);
  if constexpr (MaxVecs >= 3)
    for (; j0 + 3 * W <= j_end; j0 += 3 * W) tile<T, Rows, 3, E>(a, b + j0, v + j0, c + j0, m, ld);
  if constexpr (MaxVecs >= 2)
    for (; j0 + 2 * W <= j_end; j0 += 2 * W) tile<T, Rows, 2, E>(a, b + j0, v + j0, c + j0, m, ld);
  for (; j0 < j_end; j0 += W) tile<T, Rows, 1, E>(a, b + j0, v + j0, c + j0, m, ld);
}

// Rows [i0, i1) of C (op)= A B; i0 is a multiple of kRows.
template <typename T, int MaxVecs, Epilogue E>
MMLINATTN_INLINE void product_rows_impl(const T* a, const T* b, const T* v, T* c, int64_t i0,
                                        int64_t i1, int64_t m, int64_t ld, Tiles tiles) {
  int64_t i = i0;
  for (; i + kRows <= i1; i += kRows)  // kRows divides kCols: no tile straddles mv
    row_tiles<T, kRows, MaxVecs, E>(a, b, v, c, i, m, ld, tiles);
  for (; i < i1; ++i) row_tiles<T, 1, 4, E>(a, b, v, c, i, m, ld, tiles);
}

template <typename T, int MaxVecs>
MMLINATTN_INLINE void product_rows_dispatch(const T* a, const T* b, const T* v, T* c, int64_t i0,
                                            int64_t i1, int64_t m, int64_t ld, Epilogue e,
                                            Tiles tiles) {
  switch (e) {
    case Epilogue::kStore:
      return product_rows_impl<T, MaxVecs, Epilogue::kStore>(a, b, v, c, i0, i1, m, ld, tiles);
    case Epilogue::kTwiceVMinus:
      return product_rows_impl<T, MaxVecs, Epilogue::kTwiceVMinus>(a, b, v, c, i0, i1, m, ld,
                                                                   tiles);
    case Epilogue::kVPlus:
      return product_rows_impl<T, MaxVecs, Epilogue::kVPlus>(a, b, v, c, i0, i1, m, ld, tiles);
    case Epilogue::kSubtract:
      return product_rows_impl<T, MaxVecs, Epilogue::kSubtract>(a, b, v, c, i0, i1, m, ld, tiles);
    case Epilogue::kAccumulate:
      return product_rows_impl<T, MaxVecs, Epilogue::kAccumulate>(a, b, v, c, i0, i1, m, ld,
                                                                  tiles);
  }
}

// 8-row x 3-vector tiles (24 accumulators, 11 loads per 24 FMAs against 9 per 8 for one vector)
// fit AVX-512's 32 vector registers; with AVX2's 16 they would spill, so they run only there.
bool wide_tiles() {
#if defined(__GNUC__) && defined(__x86_64__)
  static const bool avx512 = __builtin_cpu_supports("avx512f");
  return avx512;
#else
  return false;
#endif
}

template <typename T>
MMLINATTN_INLINE void product_rows_any(const T* a, const T* b, const T* v, T* c, int64_t i0,
                                       int64_t i1, int64_t m, int64_t ld, Epilogue e, Tiles tiles) {
  if (wide_tiles()) return product_rows_dispatch<T, 3>(a, b, v, c, i0, i1, m, ld, e, tiles);
  product_rows_dispatch<T, 1>(a, b, v, c, i0, i1, m, ld, e, tiles);
}

MMLINATTN_CPU_CLONES void product_rows(const float* a, const float* b, const float* v, float* c,
                                       int64_t i0, int64_t i1, int64_t m, int64_t ld, Epilogue e,
                                       Tiles tiles) {
  product_rows_any<float>(a, b, v, c, i0, i1, m, ld, e, tiles);
}
MMLINATTN_CPU_CLONES void product_rows(const double* a, const double* b, const double* v,
                                       double* c, int64_t i0, int64_t i1, int64_t m, int64_t ld,
                                       Epilogue e, Tiles tiles) {
  product_rows_any<double>(a, b, v, c, i0, i1, m, ld, e, tiles);
}

// Lane indices of a two-vector shuffle (x's lanes 0 .. W-1, y's W .. 2W-1), as GCC's
// __builtin_shuffle takes them: an integer vector of T's width.
template <typename T>
struct LaneIndices {
  typedef std::conditional_t<sizeof(T) == 4, int32_t, int64_t> lane;
  typedef lane type __attribute__((vector_size(64)));
};

// One stage of a block transpose held in registers: for rows x and y = x + B (x's index with bit
// B clear) swap x's lanes with bit B set against y's lanes with it clear.
template <typename T, int B, std::size_t... E>
MMLINATTN_INLINE void swap_half_blocks(typename Vector<T>::type& x, typename Vector<T>::type& y,
                                       std::index_sequence<E...>) {
  constexpr int W = kCols<T>;
#if defined(__clang__)
  const auto lo = __builtin_shufflevector(x, y, ((E & B) ? int(W + E - B) : int(E))...);
  const auto hi = __builtin_shufflevector(x, y, ((E & B) ? int(W + E) : int(E + B))...);
#else
  using Lanes = typename LaneIndices<T>::type;
  const auto lo = __builtin_shuffle(x, y, Lanes{((E & B) ? int(W + E - B) : int(E))...});
  const auto hi = __builtin_shuffle(x, y, Lanes{((E & B) ? int(W + E) : int(E + B))...});
#endif
  x = lo, y = hi;
}

template <typename T, int B>
MMLINATTN_INLINE void transpose_stage(typename Vector<T>::type* rows) {
  for (int i = 0; i < kCols<T>; ++i)
    if (!(i & B))
      swap_half_blocks<T, B>(rows[i], rows[i + B], std::make_index_sequence<kCols<T>>{});
}

// dst block (kCols x kCols) = src block transposed; log2(kCols) stages of shuffles.
template <typename T>
MMLINATTN_INLINE void transpose_block(const T* src, T* dst, int64_t ld) {
  typename Vector<T>::type rows[kCols<T>];
  for (int i = 0; i < kCols<T>; ++i) rows[i] = load(src + i * ld);
  if constexpr (kCols<T> >= 16) transpose_stage<T, 8>(rows);
  transpose_stage<T, 4>(rows);
  transpose_stage<T, 2>(rows);
  transpose_stage<T, 1>(rows);
  for (int i = 0; i < kCols<T>; ++i) store(dst + i * ld, rows[i]);
}

// After a kUpper product: C_ji = C_ij for i < j, where rows >= mv were computed whole and hold
// the columns >= mv of the rows above them. Below mv the blocks right of the diagonal are
// transposed in registers: element-by-element strided stores would touch one cache line per element
// and cost more than the transposes.
template <typename T>
MMLINATTN_INLINE void mirror_upper_impl(T* c, int64_t m, int64_t ld) {
  constexpr int64_t W = kCols<T>;
  const int64_t mv = m / W * W;
  for (int64_t i0 = 0; i0 < mv; i0 += W) {
    for (int64_t i = i0; i < i0 + W; ++i)  // the diagonal block
      for (int64_t j = i + 1; j < i0 + W; ++j) c[j * ld + i] = c[i * ld + j];
    for (int64_t j0 = i0 + W; j0 < mv; j0 += W)
      transpose_block(c + i0 * ld + j0, c + j0 * ld + i0, ld);
  }
  for (int64_t i = 0; i < mv; ++i)
    for (int64_t j = mv; j < m; ++j) c[i * ld + j] = c[j * ld + i];
  for (int64_t i = mv; i < m; ++i)
    for (int64_t j = i + 1; j < m; ++j) c[j * ld + i] = c[i * ld + j];
}

MMLINATTN_CPU_CLONES void mirror_upper(float* c, int64_t m, int64_t ld) {
  mirror_upper_impl(c, m, ld);
}
MMLINATTN_CPU_CLONES void mirror_upper(double* c, int64_t m, int64_t ld) {
  mirror_upper_impl(c, m, ld);
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

// max_i sum_j |R_ij| (the zero padding adds nothing); a NaN row makes it NaN. Each row is summed
// in 64-byte vectors, then across the lanes in order: a scalar chain of M dependent additions per
// row is latency-bound and would cost more than the two half products of a step at M = 49.
template <typename T>
MMLINATTN_INLINE T norm_inf_impl(const T* r, int64_t m, int64_t ld) {
  using V = typename Vector<T>::type;
  T norm = T(0);
  for (int64_t i = 0; i < m; ++i) {
    V sum = V{};
    for (int64_t j = 0; j < ld; j += kCols<T>) {
      const V x = load(r + i * ld + j);
      sum += x < T(0) ? -x : x;
    }
    T row = T(0);
    for (int l = 0; l < kCols<T>; ++l) row += sum[l];
    if (!(row <= norm) && !std::isnan(norm)) norm = row;
  }
  return norm;
}

MMLINATTN_CPU_CLONES float norm_inf(const float* r, int64_t m, int64_t ld) {
  return norm_inf_impl(r, m, ld);
}
MMLINATTN_CPU_CLONES double norm_inf(const double* r, int64_t m, int64_t ld) {
  return norm_inf_impl(r, m, ld);
}

// The iterates one matrix's backward needs: V_0 .. V_k, R_0 .. R_{k-1} and T_k = V_k P, with k
// the product steps taken (the buffers grow with k, not with iters).
template <typename T>
struct History {
  std::vector<T> v, r, t;
  explicit History(int64_t size) : t(size) {}
  static void append(std::vector<T>& to, const T* x, int64_t size) {
    to.insert(to.end(), x, x + size);
  }
};

// Work matrices of the iteration: the iterate, the residual, T = V P and room for the next.
template <typename T>
struct Work {
  std::vector<T> data;
  T *v, *v_next, *r, *r_next, *t;
  explicit Work(int64_t size) : data(5 * size, T(0)) {
    v = data.data(), v_next = v + size, r = v_next + size, r_next = r + size, t = r_next + size;
  }
};

// The iteration for one matrix (newton_schulz.h): product steps V_{t+1} = V_t + V_t R_t,
// R_{t+1} = R_t R_t while t < iters - 1 and ||R_t||_inf > u, then the Newton–Schulz step
// V_{k+1} = 2 V_k - (V_k P) V_k. The result is left in w.v; returns k. Symmetric P: every V_t
// and R_t is symmetric, so the products compute the upper tiles and mirror them.
template <typename T>
int64_t iterate(const Shifted<T>& s, int64_t iters, int64_t m, int64_t ld, Work<T>& w,
                History<T>* history = nullptr) {
  const int64_t size = m * ld;
  const Tiles half = s.symmetric ? Tiles::kUpper : Tiles::kFull;
  const T inv = T(1) / s.norm, unit_roundoff = std::numeric_limits<T>::epsilon() / 2;
  for (int64_t i = 0; i < m; ++i)  // V_0 = I / s; R_0 = I - V_0 P, as the product gives it
    for (int64_t j = 0; j < m; ++j) {
      w.v[i * ld + j] = i == j ? inv : T(0);
      w.r[i * ld + j] = (i == j ? T(1) : T(0)) - s.p[i * ld + j] * inv;
    }
  int64_t k = 0;
  for (; k + 1 < iters && !(norm_inf(w.r, m, ld) <= unit_roundoff); ++k) {
    if (history) {
      History<T>::append(history->v, w.v, size);
      History<T>::append(history->r, w.r, size);
    }
    if (k == 0) {  // V_1 = V_0 + V_0 R_0 for the diagonal V_0: no product
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < m; ++j) w.v[i * ld + j] += inv * w.r[i * ld + j];
    } else {
      product(w.v, w.r, w.v, w.v_next, m, ld, Epilogue::kVPlus, half);
      std::swap(w.v, w.v_next);
    }
    if (k + 2 < iters) {  // R_{k+1}, needed by the next product step
      product(w.r, w.r, w.r, w.r_next, m, ld, Epilogue::kStore, half);
      std::swap(w.r, w.r_next);
    }
  }
  T* t = history ? history->t.data() : w.t;
  if (history) History<T>::append(history->v, w.v, size);
  if (s.symmetric) {  // T = V P; V' = 2V - T V, symmetric: upper half
    product_symmetric_factors(w.v, s.p.data(), t, w.v_next, m, ld);
    product(t, w.v, w.v, w.v_next, m, ld, Epilogue::kTwiceVMinus, Tiles::kUpper);
  } else {
    product(w.v, s.p.data(), w.v, t, m, ld, Epilogue::kStore);
    product(t, w.v, w.v, w.v_next, m, ld, Epilogue::kTwiceVMinus);
  }
  std::swap(w.v, w.v_next);
  return k;
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
  const int64_t batch = a.size(0), m = a.size(1), ld = padded(m, kCols<T>), size = m * ld;
  const T* a_ptr = a.const_data_ptr<T>();
  T* v_ptr = v_out.mutable_data_ptr<T>();
  T* res = residual.numel() ? residual.mutable_data_ptr<T>() : nullptr;
  for_each_matrix(batch, [&](int64_t n) {
    const Shifted<T> s(a_ptr + n * m * m, m, ld, eps);
    Work<T> w(size);
    iterate(s, iters, m, ld, w);
    for (int64_t i = 0; i < m; ++i)
      std::copy(w.v + i * ld, w.v + i * ld + m, v_ptr + (n * m + i) * m);
    if (res) res[n] = residual_of(s, w.v, w.t, m, ld);
  });
}

// The gradient through the Newton–Schulz step on V_k, the k product steps (newton_schulz.h)
// and the start V_0 = I / s, R_0 = I - P / s.
template <typename T>
void backward_impl(const at::Tensor& grad, const at::Tensor& a, int64_t iters, double eps,
                   at::Tensor& grad_a) {
  const int64_t batch = a.size(0), m = a.size(1), ld = padded(m, kCols<T>), size = m * ld;
  const T* a_ptr = a.const_data_ptr<T>();
  const T* g_ptr = grad.const_data_ptr<T>();
  T* out_ptr = grad_a.mutable_data_ptr<T>();
  for_each_matrix(batch, [&](int64_t n) {
    const Shifted<T> s(a_ptr + n * m * m, m, ld, eps);
    History<T> history(size);
    int64_t k;
    {
      Work<T> w(size);
      k = iterate(s, iters, m, ld, w, &history);
    }
    // g = dL/dV_t, d = dL/dR_t (and their next values), V^T G, dP, and for non-symmetric P the
    // transposes V^T, R^T (or T^T), P^T
    std::vector<T> work(9 * size, T(0));
    T *g = work.data(), *g_next = g + size, *d = g_next + size, *d_next = d + size;
    T *vt_g = d_next + size, *dp = vt_g + size, *v_tr = dp + size, *r_tr = v_tr + size;
    T* p_tr = r_tr + size;
    for (int64_t i = 0; i < m; ++i)
      std::copy(g_ptr + (n * m + i) * m, g_ptr + (n * m + i + 1) * m, g + i * ld);
    const T* p_t = s.p.data();
    if (!s.symmetric) {
      transpose(s.p.data(), p_tr, m, ld);
      p_t = p_tr;
    }
    // Symmetric P: V^T = V, R^T = R, P^T = P and (P V)^T = V P = T. Otherwise the transposes
    // (P V = V P, so (P V)^T = T^T).
    const auto transposed = [&](const T* x, T* x_tr) {
      if (s.symmetric) return x;
      transpose(x, x_tr, m, ld);
      return static_cast<const T*>(x_tr);
    };
    {  // V_{k+1} = 2 V_k - V_k P V_k
      const T* v = transposed(history.v.data() + k * size, v_tr);
      const T* tt = transposed(history.t.data(), r_tr);
      product(v, g, g, vt_g, m, ld, Epilogue::kStore);               // V^T G
      product(vt_g, v, v, dp, m, ld, Epilogue::kSubtract);            // dP -= V^T G V^T
      product(g, tt, g, g_next, m, ld, Epilogue::kTwiceVMinus);      // 2G - G T^T
      product(p_t, vt_g, vt_g, g_next, m, ld, Epilogue::kSubtract);  // - P^T V^T G
      std::swap(g, g_next);
    }
    for (int64_t t = k - 1; t >= 0; --t) {  // V_{t+1} = V_t + V_t R_t, R_{t+1} = R_t R_t
      const T* v = transposed(history.v.data() + t * size, v_tr);
      const T* r = transposed(history.r.data() + t * size, r_tr);
      product(v, g, g, d_next, m, ld, Epilogue::kStore);  // dR_t = V^T G
      if (t + 1 < k) {                                    // + dR_{t+1} R^T + R^T dR_{t+1}
        product(d, r, d, d_next, m, ld, Epilogue::kAccumulate);
        product(r, d, d, d_next, m, ld, Epilogue::kAccumulate);
      }
      product(g, r, g, g_next, m, ld, Epilogue::kVPlus);  // G + G R^T
      std::swap(g, g_next);
      std::swap(d, d_next);
    }
    // R_0 = I - P / s: dP -= dR_0 / s; with V_0 = I / s, dL/d(1/s) = tr(G_0) - <dR_0, P>, and
    // dL/ds = -dL/d(1/s) / s^2, shared by the rows attaining s.
    const T inv = T(1) / s.norm;
    T d_inv = T(0);
    int64_t at_max = 0;
    for (int64_t i = 0; i < m; ++i) {
      d_inv += g[i * ld + i];
      at_max += s.row_sums[i] == s.norm;
      if (k > 0)
        for (int64_t j = 0; j < m; ++j) {
          d_inv -= d[i * ld + j] * s.p[i * ld + j];
          dp[i * ld + j] -= inv * d[i * ld + j];
        }
    }
    const T share = -d_inv / (s.norm * s.norm) / static_cast<T>(at_max);
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
