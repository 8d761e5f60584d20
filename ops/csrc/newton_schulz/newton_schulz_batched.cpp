// Newton–Schulz forward and backward from batched matrix products, on any device and for any M
// (the formulas are in newton_schulz.h). Every product is an at::bmm / at::baddbmm, whose
// reductions run in a fixed order on a given device and library. A matrix that stops early keeps
// its V through the remaining product steps (at::where on a per-matrix mask). On the CPU the steps
// also end once every matrix of the batch has stopped (reading the mask costs nothing there); on
// other devices that read would be a host sync, so the masked steps run to the end.
#include <limits>
#include <utility>
#include <vector>

#include "newton_schulz.h"

namespace mmlinattn::newton_schulz {
namespace {

struct Start {
  at::Tensor p, row_sums, norm, inv, v0, r0;  // P = a + eps I, sum_j |P_ij|, s = max_i, 1/s,
                                              // V0 = I / s, R0 = I - P / s
};

Start start(const at::Tensor& a, double eps) {
  const at::Tensor eye = at::eye(a.size(1), a.options());
  Start s;
  s.p = a + eps * eye;
  s.row_sums = s.p.abs().sum(-1);
  s.norm = s.row_sums.amax(-1);  // propagates NaN, as the reference does
  s.inv = s.norm.reciprocal().view({-1, 1, 1});
  s.v0 = eye * s.inv;
  s.r0 = eye - s.p * s.inv;
  return s;
}

// The product steps: V_0 .. V_n, R_0 .. R_{n-1} and the masks running_0 .. running_{n-1}, where
// running_t = running_{t-1} and not ||R_t||_inf <= u; n = iters - 1, or fewer on the CPU. Without
// keep_history (the forward) only the last V is kept.
struct Products {
  std::vector<at::Tensor> v, r, running;
};

Products product_steps(const Start& s, int64_t iters, bool keep_history) {
  const double unit_roundoff =
      s.p.scalar_type() == at::kDouble ? std::numeric_limits<double>::epsilon() / 2
                                       : std::numeric_limits<float>::epsilon() / 2;
  const bool host_reads_mask = s.p.device().is_cpu();
  Products out{{s.v0}, {}, {}};
  at::Tensor r = s.r0, running = at::ones_like(s.inv, s.inv.options().dtype(at::kBool));
  for (int64_t t = 0; t + 1 < iters; ++t) {
    const at::Tensor norm = r.abs().sum(-1).amax(-1).view({-1, 1, 1});
    running = running.logical_and(norm.le(unit_roundoff).logical_not());
    if (host_reads_mask && !running.any().item<bool>()) break;  // every matrix has stopped
    const at::Tensor& v = out.v.back();
    at::Tensor v_next = at::where(running, at::baddbmm(v, v, r), v);  // V + V R
    if (keep_history) {
      out.r.push_back(r);
      out.running.push_back(running);
      out.v.push_back(std::move(v_next));
    } else {
      out.v.back() = std::move(v_next);
    }
    if (t + 2 < iters) r = at::bmm(r, r);
  }
  return out;
}

// V' = 2 V - (V P) V
at::Tensor newton_schulz_step(const at::Tensor& v, const at::Tensor& p) {
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
  const at::Tensor v_last = product_steps(s, iters, /*keep_history=*/false).v.back();
  const at::Tensor v = newton_schulz_step(v_last, s.p).contiguous();
  const at::Tensor eye = at::eye(m, a.options());
  at::Tensor residual = with_residual ? at::linalg_matrix_norm(eye - at::bmm(s.p, v), "fro",
                                                               {-2, -1}) /
                                            std::sqrt(static_cast<double>(m))
                                      : at::empty({0}, a.options());
  return {v, residual};
}

at::Tensor newton_schulz_backward_batched_matmul(const at::Tensor& grad_in, const at::Tensor& a_in,
                                                 int64_t iters, double eps) {
  check_backward_args(grad_in, a_in, iters, eps);
  const at::Tensor a = a_in.contiguous();
  if (a.numel() == 0) return at::zeros_like(a);
  const Start s = start(a, eps);
  const Products steps = product_steps(s, iters, /*keep_history=*/true);
  // V_n = 2 V - V P V with V = V_{n-1}
  const at::Tensor v_last = steps.v.back().transpose(1, 2);
  const at::Tensor vt_g = at::bmm(v_last, grad_in.contiguous());           // V^T G
  at::Tensor dp = -at::bmm(vt_g, v_last);                                   // dP = -V^T G V^T
  const at::Tensor t_t = at::bmm(steps.v.back(), s.p).transpose(1, 2);      // (V P)^T = (P V)^T
  // 2G - G T^T - P^T V^T G
  at::Tensor g = at::baddbmm(at::baddbmm(grad_in, grad_in, t_t, 2, -1), s.p.transpose(1, 2),
                             vt_g, 1, -1);
  at::Tensor d = at::zeros_like(a);  // dL/dR_{t+1}
  const at::Tensor zero = at::zeros({}, a.options());
  const int64_t n = static_cast<int64_t>(steps.r.size());
  for (int64_t t = n - 1; t >= 0; --t) {  // V_{t+1} = V_t + V_t R_t where running_t
    const at::Tensor v_t = steps.v[t].transpose(1, 2), r_t = steps.r[t].transpose(1, 2);
    const at::Tensor& running = steps.running[t];
    at::Tensor d_t = at::where(running, at::bmm(v_t, g), zero);  // V^T G
    if (t + 1 < n)                                                // R_{t+1} = R_t R_t
      d_t = at::baddbmm(at::baddbmm(d_t, d, r_t), r_t, d);        // + D R^T + R^T D
    g = g + at::where(running, at::bmm(g, r_t), zero);            // G + G R^T
    d = d_t;
  }
  // R_0 = I - P / s: dP -= dR_0 / s. V_0 = I / s: dL/d(1/s) = tr(G_0) - <dR_0, P>; dL/ds is
  // -dL/d(1/s) / s^2, shared by the rows attaining the maximum.
  dp = dp - d * s.inv;
  const at::Tensor d_inv = g.diagonal(0, 1, 2).sum(-1) - (d * s.p).sum({1, 2});
  const at::Tensor ds = -d_inv / (s.norm * s.norm);
  const at::Tensor at_max = (s.row_sums == s.norm.unsqueeze(1)).to(a.scalar_type());
  const at::Tensor share = ds.unsqueeze(1) * at_max / at_max.sum(-1, true);
  return dp + share.unsqueeze(2) * s.p.sign();
}

}  // namespace mmlinattn::newton_schulz
