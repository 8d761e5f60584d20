// The CPU kernels of the Laplacian kernel op behind one interface, in two implementations: AVX-512
// intrinsics (laplacian_kernel_avx512.cpp) and portable loops (laplacian_kernel_cpu.cpp). The
// driver (laplacian_kernel_cpu.cpp) splits the work into tasks and picks the implementation.
// Plain C++ only: the AVX-512 file compiles everything it includes for AVX-512.
#pragma once

#include <cstdint>

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

// Whether this CPU (and ATEN_CPU_CAPABILITY, if set) allows the AVX-512 kernels.
bool avx512_usable();
Kernels<float> avx512_kernels_float();
Kernels<double> avx512_kernels_double();

}  // namespace mmlinattn::laplacian::cpu
