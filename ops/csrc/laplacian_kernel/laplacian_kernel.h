// Laplacian kernel out[b,h,i,j] = exp(-sum_c |q[b,h,i,c] - k[b,h,j,c]| / lam), q [B,H,N,D],
// k [B,H,M,D]. Backward with g_ij = grad_ij * out_ij / lam and sign(0) = 0:
//   dq_ic = -sum_j g_ij sign(q_ic - k_jc),  dk_jc = +sum_i g_ij sign(q_ic - k_jc).
// Shared by the CPU and CUDA implementations: argument checks (ValueError in Python).
#pragma once

#include <ATen/ATen.h>

#include <cmath>

namespace mmlinattn::laplacian {

inline void check_forward_args(const at::Tensor& q, const at::Tensor& k, double lam) {
  TORCH_CHECK_VALUE(q.dim() == 4, "q must have 4 dimensions [B,H,N,D], got ", q.sizes());
  TORCH_CHECK_VALUE(k.dim() == 4, "k must have 4 dimensions [B,H,M,D], got ", k.sizes());
  TORCH_CHECK_VALUE(q.size(0) == k.size(0) && q.size(1) == k.size(1) && q.size(3) == k.size(3),
                    "q and k must have the same batch, heads and head dim, got ", q.sizes(),
                    " and ", k.sizes());
  TORCH_CHECK_VALUE(q.scalar_type() == k.scalar_type(), "q and k must have one dtype, got ",
                    q.scalar_type(), " and ", k.scalar_type());
  TORCH_CHECK_VALUE(q.device() == k.device(), "q and k must be on one device, got ", q.device(),
                    " and ", k.device());
  TORCH_CHECK_VALUE(lam > 0 && std::isfinite(lam), "lam must be a positive finite number, got ",
                    lam);
}

inline void check_backward_args(const at::Tensor& grad_out, const at::Tensor& q,
                                const at::Tensor& k, const at::Tensor& out, double lam) {
  check_forward_args(q, k, lam);
  const std::vector<int64_t> expected{q.size(0), q.size(1), q.size(2), k.size(2)};
  TORCH_CHECK_VALUE(grad_out.sizes() == at::IntArrayRef(expected) &&
                        out.sizes() == at::IntArrayRef(expected),
                    "grad_out and out must have shape ", at::IntArrayRef(expected), ", got ",
                    grad_out.sizes(), " and ", out.sizes());
  TORCH_CHECK_VALUE(grad_out.scalar_type() == q.scalar_type() &&
                        out.scalar_type() == q.scalar_type(),
                    "grad_out and out must have q's dtype ", q.scalar_type());
  TORCH_CHECK_VALUE(grad_out.device() == q.device() && out.device() == q.device(),
                    "grad_out and out must be on q's device ", q.device());
}

}  // namespace mmlinattn::laplacian
