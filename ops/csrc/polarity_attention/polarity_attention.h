// Polarity-aware linear attention (PolaFormer), fused: shared layout of the CPU and CUDA kernels.
//
// Per batch b and head h (q [N,d], k [n,d], v [n,dv], p [d], m = dv/2), with a(x) = |x|^p and
//   row(c, x) = c      when x > 0  (the x+ half of the feature),
//             = c + d  when x < 0  (the x- half),   and nothing when x == 0,
// the features phi(x) = [x+, x-] have at most one non-zero entry per channel. No pass builds an
// [N, 2d] feature tensor: the CUDA kernels compute |x|^p on the fly and touch one row per channel;
// the CPU kernels build one [256, 2d] tile per chunk of tokens and hand it to BLAS.
//
// Forward
//   key pass:    S[r, :] = sum_j phi_r(k_j) [v_j, 1]                                  S: [2d, dv+1]
//                (chunks of keys reduced into partial states, summed in chunk order)
//   state:       M = [[A1 B2 zp zm], [B1 A2 zm zp]] / n                             M: [2d, dv+2]
//                i.e. M[r, col] = S[r, col]       (col < m)      M[r, dv]   = S[r, dv]
//                     M[r, col] = S[swap r, col]  (m <= col < dv) M[r, dv+1] = S[swap r, dv]
//                with swap r = (r + d) mod 2d, so phi(q) M gives [phi_s(q) kv_1, phi_o(q) kv_2,
//                phi_s(q).z, phi_o(q).z] at once.
//   query pass:  y = phi(q_i) M;  den = (y[dv] + eps, y[dv+1] + eps);
//                out_i = [y[:m] / den_0, y[m:dv] / den_1]
//   saved:       M [B,h,2d,dv+2] and den [B,h,N,2] (accumulation type), plus out.
//
// Backward (g = dL/dout)
//   query pass:  W = dL/dy = [g[:m]/den_0, g[m:]/den_1, -g[:m].out[:m]/den_0, -g[m:].out[m:]/den_1]
//                da_c = W . M[row_c]  ->  dq_c = sign(q_c) p_c |q_c|^(p_c-1) da_c,
//                dpower_c += da_c a_c log|q_c|;  dM[row_c] += a_c W  (chunk partials, ordered sum)
//   state:       dS = transpose of the M mapping above, / n
//   key pass:    da_c = [v_j, 1] . dS[row_c] -> dk_c, dpower_c;  dv_j += a_c dS[row_c, :dv]
//   dpower:      [h, d], the per (batch, chunk) partials summed in a fixed order.
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>

#if defined(__CUDACC__)
#define POLA_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define POLA_HOST_DEVICE inline
#endif

namespace mmlinattn::polarity {

// Width of the key-side state S (values and the normaliser column) and the query-side state M.
POLA_HOST_DEVICE int64_t key_state_cols(int64_t dv) { return dv + 1; }
POLA_HOST_DEVICE int64_t query_state_cols(int64_t dv) { return dv + 2; }

// Row of the other polarity: r <-> r + d.
POLA_HOST_DEVICE int64_t swap_row(int64_t r, int64_t d) { return r < d ? r + d : r - d; }

// M[r, col] = S[source row, source col] / n; returns the flat index into S ([2d, dv+1]).
POLA_HOST_DEVICE int64_t query_state_source(int64_t r, int64_t col, int64_t d, int64_t dv) {
  const int64_t m = dv / 2;
  const int64_t src_row = (col < m || col == dv) ? r : swap_row(r, d);
  const int64_t src_col = col < dv ? col : dv;
  return src_row * key_state_cols(dv) + src_col;
}

// dS[r, col] from dM ([2d, dv+2]), the adjoint of query_state_source (before the 1/n factor).
template <typename T>
POLA_HOST_DEVICE T key_state_grad(const T* dM, int64_t r, int64_t col, int64_t d, int64_t dv) {
  const int64_t cols = query_state_cols(dv), m = dv / 2;
  if (col < m) return dM[r * cols + col];
  if (col < dv) return dM[swap_row(r, d) * cols + col];
  return dM[r * cols + dv] + dM[swap_row(r, d) * cols + dv + 1];
}

// Shape/dtype/device checks of the raw ops (the Python wrapper checks first, with friendlier
// messages); both backends call them so that no kernel can read out of bounds. Defined in the .cpp.
void check_forward_args(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                        const at::Tensor& power);
void check_backward_args(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
                         const at::Tensor& v, const at::Tensor& power, const at::Tensor& out,
                         const at::Tensor& state, const at::Tensor& den);

}  // namespace mmlinattn::polarity
