// The CPU kernels of the Laplacian kernel op behind one interface, in two implementations: AVX-512
// intrinsics (laplacian_kernel_avx512.cpp) and portable loops (laplacian_kernel_portable.cpp),
// and the forward's work split. Used by the torch operators (laplacian_kernel_cpu.cpp, which also
// splits the backward) and by the onnxruntime op (ops/onnxruntime), each with its thread pool.
// Plain C++ only: the AVX-512 file compiles everything it includes for AVX-512.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace mmlinattn::laplacian::cpu {

// Keys are padded to kKeyPad entries (a multiple of every vector width) in the transposed layout.
constexpr int64_t kKeyPad = 16;

template <typename T>
struct Kernels {
  // out[i, j] = exp(scale * sum_c |q[i, c] - kt[c, j]|) for rows i < rows, keys j < m.
  // q [rows][d], kt [d][mp] (keys transposed, zero beyond m), out [rows][m]; scale = -1 / lam.
  void (*forward_rows)(const T* q, const T* kt, T* out, int64_t rows, int64_t m, int64_t mp,
                       int64_t d, T scale);
  // For rows i < rows and all keys j < m, with g_ij = grad_ij * out_ij * inv_lam and
  // s = g_ij * sign(q_ic - k_jc) (sign(0) = 0):
  //   dq[i, c] = -sum_j s   (need_dq; complete rows)
  //   dk[j, c] = +sum_i s   (need_dk; the sum over these rows only, written, not accumulated)
  // grad, out [rows][m]; q, dq [rows][d]; k, dk [m][d]; scratch holds kScratchRows * m values.
  void (*backward_rows)(const T* grad, const T* out, const T* q, const T* k, T* dq, T* dk,
                        int64_t rows, int64_t m, int64_t d, T inv_lam, bool need_dq,
                        bool need_dk, T* scratch);
};

constexpr int64_t kScratchRows = 8;

// Whether this CPU has the AVX-512 subsets the AVX-512 kernels use.
bool cpu_has_avx512();
Kernels<float> avx512_kernels_float();
Kernels<double> avx512_kernels_double();
// The AVX-512 kernels where use_avx512 (callers pass cpu_has_avx512() and their own switches),
// else the portable ones. T: float or double.
template <typename T>
Kernels<T> select_kernels(bool use_avx512);

constexpr int64_t kForwardRows = 128;  // query rows per forward task

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// out[b, i, j] = exp(scale * sum_c |q[b, i, c] - k[b, j, c]|) for bh heads b: q [bh][n][d],
// k [bh][m][d], out [bh][n][m], contiguous. Tasks of kForwardRows query rows of one head; each
// task transposes its head's keys to kt [d][mp] (once per head it meets) and runs the row kernel.
// parallel_for(begin, end, fn) runs fn(t0, t1) over disjoint ranges covering [begin, end).
template <typename T, typename ParallelFor>
void forward_tasks(const Kernels<T>& kern, const T* q, const T* k, T* out, int64_t bh, int64_t n,
                   int64_t m, int64_t d, T scale, ParallelFor&& parallel_for) {
  const int64_t mp = ceil_div(m, kKeyPad) * kKeyPad, tiles = ceil_div(n, kForwardRows);
  parallel_for(int64_t(0), bh * tiles, [&](int64_t t0, int64_t t1) {
    std::vector<T> kt(d * mp, T(0));  // this head's keys, transposed: kt[c][j]
    int64_t kt_head = -1;
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b = t / tiles, i0 = (t % tiles) * kForwardRows;
      if (b != kt_head) {
        for (int64_t j = 0; j < m; ++j)
          for (int64_t c = 0; c < d; ++c) kt[c * mp + j] = k[(b * m + j) * d + c];
        kt_head = b;
      }
      kern.forward_rows(q + (b * n + i0) * d, kt.data(), out + (b * n + i0) * m,
                        std::min(kForwardRows, n - i0), m, mp, d, scale);
    }
  });
}

}  // namespace mmlinattn::laplacian::cpu
