// Newton–Schulz inverse of P = a + eps*I for a batch a [B, M, M] (docs/ops/newton_schulz.md):
//   s = ||P||_inf = max_i sum_j |P_ij|,  V_0 = I / s,  R_0 = I - P / s;
//   product steps, t = 0, 1, ... while t < iters - 1 and not ||R_t||_inf <= u (unit roundoff):
//     V_{t+1} = V_t + V_t R_t,  R_{t+1} = R_t R_t;                       k = the steps taken
//   the Newton–Schulz step on the last: V = 2 V_k - V_k P V_k.
// In exact arithmetic these are the iterates of V_{t+1} = 2 V_t - V_t P V_t (R_t = I - P V_t); a
// matrix that stops at k < iters - 1 differs from the full iteration by a relative O(u^2) in
// exact arithmetic, and the last step corrects the rounding of the product form.
// Forward: (V [B, M, M], residual [B] = ||I - P V||_F / sqrt(M), or [0] without with_residual).
// Backward: the exact gradient of the computed V with respect to a, through every step and
// through s (ties of the row maximum share it equally, |x|' = sign(x) with sign(0) = 0), as
// autograd through the reference gives. With G = dL/dV and D_k = 0:
//   last step:       dP -= V_k^T G V_k^T,  G_k = 2 G - G (P V_k)^T - (V_k P)^T G;
//   t = k-1 .. 0:    D_t = V_t^T G_{t+1} + D_{t+1} R_t^T + R_t^T D_{t+1},
//                    G_t = G_{t+1} + G_{t+1} R_t^T;
//   start:           dP -= D_0 / s,  dL/ds = (<D_0, P> - tr(G_0)) / s^2,
//                    dP_ij += dL/ds * sign(P_ij) * [row i attains s] / #rows attaining s;  da = dP.
// V_k is a polynomial in P, so P V_k = V_k P: the kernels use T_k = V_k P for both.
// Inputs are in the compute dtype (fp32 or fp64); the Python wrapper casts.
#pragma once

#include <ATen/ATen.h>

#include <cmath>
#include <tuple>

namespace mmlinattn::newton_schulz {

inline void check_args(const at::Tensor& a, int64_t iters, double eps) {
  TORCH_CHECK_VALUE(a.dim() == 3 && a.size(1) == a.size(2),
                    "a must be a batch of square matrices [B, M, M], got ", a.sizes());
  TORCH_CHECK_VALUE(a.scalar_type() == at::kFloat || a.scalar_type() == at::kDouble,
                    "a must be float32 or float64 (the compute dtype), got ", a.scalar_type());
  TORCH_CHECK_VALUE(iters >= 1, "iters must be a positive integer, got ", iters);
  TORCH_CHECK_VALUE(eps >= 0 && std::isfinite(eps),
                    "eps must be a non-negative finite number, got ", eps);
}

inline void check_backward_args(const at::Tensor& grad_v, const at::Tensor& a, int64_t iters,
                                double eps) {
  check_args(a, iters, eps);
  TORCH_CHECK_VALUE(grad_v.sizes() == a.sizes() && grad_v.scalar_type() == a.scalar_type() &&
                        grad_v.device() == a.device(),
                    "grad_v must match a (shape ", a.sizes(), ", ", a.scalar_type(), ", ",
                    a.device(), "), got ", grad_v.sizes(), ", ", grad_v.scalar_type(), ", ",
                    grad_v.device());
}

// Device-agnostic forward and backward built on batched matrix products (at::bmm / at::baddbmm):
// used on CUDA for fp64 and for matrices too large for one thread block's shared memory, and on
// the CPU for matrices larger than its tiled kernels take. Any M.
std::tuple<at::Tensor, at::Tensor> newton_schulz_batched_matmul(const at::Tensor& a, int64_t iters,
                                                                double eps, bool with_residual);
at::Tensor newton_schulz_backward_batched_matmul(const at::Tensor& grad_v, const at::Tensor& a,
                                                 int64_t iters, double eps);

}  // namespace mmlinattn::newton_schulz
