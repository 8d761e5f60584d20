// Newton–Schulz forward and backward from batched matrix products, on any device and for any M
// (the formulas are in newton_schulz.h). Every product is an at::bmm / at::baddbmm, whose
// reductions run in a fixed order on a given device and library.
#include <vector>

#include "newton_schulz.h"

namespace mmlinattn::newton_schulz {
namespace {

struct Start {
  at::Tensor p, row_sums, norm, v0;  // P = a + eps I, sum_j |P_ij|, s = max_i, V0 = I / s
};

Start start(const at::Tensor& a, double eps) {
  const at::Tensor eye = at::eye(a.size(1), a.options());
  Start s;
  s.p = a + eps * eye;
  s.row_sums = s.p.abs().sum(-1);
  s.norm = s.row_sums.amax(-1);  // propagates NaN, as the reference does
  s.v0 = eye.expand_as(s.p) / s.norm.view({-1, 1, 1});
  return s;
}

// V_{t+1} = 2 V_t - (V_t P) V_t
at::Tensor step(const at::Tensor& v, const at::Tensor& p) {
  return at::baddbmm(v, at::bmm(v, p), v, /*beta=*/2, /*alpha=*/-1);
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> newton_schulz_batched_matmul(const at::Tensor& a_in,
                                                                int64_t iters, double eps,
                                                                bool with_residual) {
  check_args(a_in, iters, eps);
  const at::Tensor a = a_in.contiguous();
  const int64_t batch = a.size(0), m = a.size(1);
  if (a.numel() == 0)
    return {at::empty_like(a), at::zeros({with_residual ? batch : 0}, a.options())};
  const Start s = start(a, eps);
  at::Tensor v = s.v0;
  for (int64_t t = 0; t < iters; ++t) v = step(v, s.p);
  const at::Tensor eye = at::eye(m, a.options());
  at::Tensor residual = with_residual ? at::linalg_matrix_norm(eye - at::bmm(s.p, v), "fro",
                                                               {-2, -1}) /
                                            std::sqrt(static_cast<double>(m))
                                      : at::empty({0}, a.options());
  return {v.contiguous(), residual};
}

at::Tensor newton_schulz_backward_batched_matmul(const at::Tensor& grad_in, const at::Tensor& a_in,
                                                 int64_t iters, double eps) {
  check_backward_args(grad_in, a_in, iters, eps);
  const at::Tensor a = a_in.contiguous();
  if (a.numel() == 0) return at::zeros_like(a);
  const Start s = start(a, eps);
  std::vector<at::Tensor> iterates{s.v0};  // V_0 .. V_{n-1}
  for (int64_t t = 0; t + 1 < iters; ++t) iterates.push_back(step(iterates.back(), s.p));
  const at::Tensor p_t = s.p.transpose(1, 2);
  at::Tensor g = grad_in.contiguous(), dp = at::zeros_like(a);
  for (int64_t t = iters - 1; t >= 0; --t) {
    const at::Tensor v_t = iterates[t].transpose(1, 2);
    const at::Tensor vt_g = at::bmm(v_t, g);                            // V^T G
    dp = at::baddbmm(dp, vt_g, v_t, /*beta=*/1, /*alpha=*/-1);            // dP -= V^T G V^T
    const at::Tensor t_t = at::bmm(iterates[t], s.p).transpose(1, 2);     // (V P)^T = (P V)^T
    g = at::baddbmm(at::baddbmm(g, g, t_t, 2, -1), p_t, vt_g, 1, -1);  // 2G - G T^T - P^T V^T G
  }
  // V0 = I / s: dL/ds = -tr(G_0) / s^2, shared by the rows attaining the maximum.
  const at::Tensor ds = -g.diagonal(0, 1, 2).sum(-1) / (s.norm * s.norm);
  const at::Tensor at_max = (s.row_sums == s.norm.unsqueeze(1)).to(a.scalar_type());
  const at::Tensor share = ds.unsqueeze(1) * at_max / at_max.sum(-1, true);
  return dp + share.unsqueeze(2) * s.p.sign();
}

}  // namespace mmlinattn::newton_schulz
