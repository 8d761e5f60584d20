// Newton–Schulz inverse of P = a + eps*I for a batch a [B, M, M]:
//   V0 = I / ||P||_inf (max absolute row sum), V <- 2V - (V P) V for `iters` steps,
// in fp32 (fp64 for fp64 input). Returns (V [B, M, M] in that precision, residual [B] =
// ||I - P V||_F / sqrt(M), or an empty tensor when with_residual is false).
#pragma once

#include <ATen/ATen.h>

#include <cmath>
#include <tuple>

namespace mmlinattn::newton_schulz {

inline void check_args(const at::Tensor& a, int64_t iters, double eps) {
  TORCH_CHECK_VALUE(a.dim() == 3 && a.size(1) == a.size(2),
                    "a must be a batch of square matrices [B, M, M], got ", a.sizes());
  TORCH_CHECK_VALUE(at::isFloatingType(a.scalar_type()), "a must be floating point, got ",
                    a.scalar_type());
  TORCH_CHECK_VALUE(iters >= 1, "iters must be a positive integer, got ", iters);
  TORCH_CHECK_VALUE(eps >= 0 && std::isfinite(eps),
                    "eps must be a non-negative finite number, got ", eps);
}

inline at::ScalarType compute_type(const at::Tensor& a) {
  return a.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

// Device-agnostic path built on batched matrix products (at::bmm / at::baddbmm): used on CUDA for
// matrices too large for one thread block's shared memory; any M.
std::tuple<at::Tensor, at::Tensor> newton_schulz_batched_matmul(const at::Tensor& a, int64_t iters,
                                                                double eps, bool with_residual);

}  // namespace mmlinattn::newton_schulz
