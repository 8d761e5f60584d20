// Newton–Schulz inverse of P = a + eps*I for a batch a [B, M, M] (docs/ops/newton_schulz.md):
//   V0 = I / s, s = ||P||_inf = max_i sum_j |P_ij|;   V_{t+1} = 2 V_t - V_t P V_t,  t < iters.
// Forward: (V [B, M, M], residual [B] = ||I - P V||_F / sqrt(M), or [0] without with_residual).
// Backward: the exact gradient of the computed V_iters with respect to a, through every step
// and through s (ties of the row maximum share it equally, |x|' = sign(x) with sign(0) = 0), as
// autograd through the reference gives:
//   G_n = dL/dV_n;  for t = n-1 .. 0:  dP -= V_t^T G_{t+1} V_t^T,
//                                      G_t = 2 G_{t+1} - G_{t+1} (P V_t)^T - (V_t P)^T G_{t+1};
//   dP_ij += (-tr(G_0) / s^2) * sign(P_ij) * [row i attains s] / #rows attaining s;  da = dP.
// V_t is a polynomial in P, so P V_t = V_t P: the kernels use T_t = V_t P for both.
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
