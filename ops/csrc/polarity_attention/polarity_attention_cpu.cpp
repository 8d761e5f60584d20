// Polarity-aware linear attention: op schemas, argument checks and the CPU kernels (fp32, fp64,
// bf16). The algorithm and the saved state are described in polarity_attention.h.
//
// Each kernel reads and writes its tensors in their dtype (scalar_t) and computes in acc_t, the
// accumulation type (at::opmath_type: fp32 for bf16, else scalar_t itself): bf16 values are
// widened as they are read, so no fp32 copy of a whole input is made, and the state, the
// normalisers and dpower are kept in acc_t.
//
// Work is split into fixed chunks of kTokenChunk tokens per (batch, head), run in parallel with
// at::parallel_for (OpenMP). A chunk's features phi(x) go into a [kTokenChunk, 2d] scratch tile
// (zero where the polarity does not match) that meets the states in at::mm (BLAS, single-threaded
// inside the parallel region). Every reduction over tokens sums per-chunk partials in chunk order,
// so the results do not depend on the number of threads.
#include "polarity_attention/polarity_attention.h"
#include "polarity_attention/polarity_features_bf16.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

namespace mmlinattn::polarity {
namespace {

constexpr int64_t kTokenChunk = 256;

int64_t num_chunks(int64_t tokens) { return (tokens + kTokenChunk - 1) / kTokenChunk; }

// Items per thread for at::parallel_for so that a small reduction runs inline, not in a region.
int64_t grain_for(int64_t work_per_item) {
  return std::max<int64_t>(1, at::internal::GRAIN_SIZE / std::max<int64_t>(work_per_item, 1));
}

at::ScalarType accumulate_type(at::ScalarType t) {
  return t == at::kDouble ? at::kDouble : at::kFloat;
}

// The [tokens, cols] scratch tiles of one thread, in the accumulation type.
at::Tensor acc_tile(const at::Tensor& like, int64_t cols) {
  return at::empty({kTokenChunk, cols}, like.options().dtype(accumulate_type(like.scalar_type())));
}

// p[c] in acc_t, once per (batch, head).
template <typename scalar_t, typename acc_t>
void widen(const scalar_t* src, int64_t d, acc_t* dst) {
  for (int64_t c = 0; c < d; ++c) dst[c] = static_cast<acc_t>(src[c]);
}

// One (batch·head, chunk) work item: which tokens of the flattened [B·h·tokens, ...] rows it owns.
struct ChunkTask {
  int64_t bh, chunk, first_row, tokens;
  ChunkTask(int64_t task, int64_t chunks, int64_t seq_len)
      : bh(task / chunks),
        chunk(task % chunks),
        first_row(bh * seq_len + chunk * kTokenChunk),
        tokens(std::min(kTokenChunk, seq_len - chunk * kTokenChunk)) {}
};

// feat[t, row(c, x)] = |x_tc|^p_c, zero elsewhere: the [tokens, 2d] features phi(x) of one chunk.
template <typename scalar_t, typename acc_t>
void fill_features(const scalar_t* x, const acc_t* p, int64_t tokens, int64_t d, acc_t* feat) {
  std::fill(feat, feat + tokens * 2 * d, acc_t(0));
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t c = 0; c < d; ++c) {
      const acc_t xv = static_cast<acc_t>(x[t * d + c]);
      if (xv == acc_t(0)) continue;
      feat[t * 2 * d + (xv > acc_t(0) ? c : c + d)] = std::pow(std::abs(xv), p[c]);
    }
}

// Chain rule through phi for one chunk, given feat_grad = dL/dphi [tokens, 2d]:
// dx_c = sign(x) p_c |x|^(p_c-1) g,  dpower_c += g |x|^p_c log|x|,  g = feat_grad[t, row(c, x)].
// x = 0 contributes nothing (relu(x)^p has a zero gradient there for p > 0).
template <typename scalar_t, typename acc_t>
void feature_backward(const scalar_t* x, const acc_t* p, const acc_t* feat, const acc_t* feat_grad,
                      int64_t tokens, int64_t d, scalar_t* dx, acc_t* dpower) {
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t c = 0; c < d; ++c) {
      const acc_t xv = static_cast<acc_t>(x[t * d + c]);
      if (xv == acc_t(0)) {
        dx[t * d + c] = scalar_t(0);
        continue;
      }
      const int64_t idx = t * 2 * d + (xv > acc_t(0) ? c : c + d);
      const acc_t ax = std::abs(xv), a = feat[idx], g = feat_grad[idx];
      const acc_t grad_x = p[c] * (a / ax) * g;
      dx[t * d + c] = static_cast<scalar_t>(xv > acc_t(0) ? grad_x : -grad_x);
      dpower[c] += g * a * std::log(ax);
    }
}

// bf16: the AVX-512 features (polarity_features_bf16.h) where the CPU has it; their error is far
// below bf16's. The bits of c10::BFloat16 are its only member.
const bool kVectorisedBf16 = bf16_features_vectorised();

void fill_features(const c10::BFloat16* x, const float* p, int64_t tokens, int64_t d, float* feat) {
  if (kVectorisedBf16)
    bf16_features(reinterpret_cast<const uint16_t*>(x), p, tokens, d, feat);
  else
    fill_features<c10::BFloat16, float>(x, p, tokens, d, feat);
}

void feature_backward(const c10::BFloat16* x, const float* p, const float* feat,
                      const float* feat_grad, int64_t tokens, int64_t d, c10::BFloat16* dx,
                      float* dpower) {
  if (kVectorisedBf16)
    bf16_feature_backward(reinterpret_cast<const uint16_t*>(x), p, feat, feat_grad, tokens, d,
                          reinterpret_cast<uint16_t*>(dx), dpower);
  else
    feature_backward<c10::BFloat16, float>(x, p, feat, feat_grad, tokens, d, dx, dpower);
}

// Forward key pass: partial[bh·chunks + chunk] = phi(k_chunk)^T [v_chunk, 1]  ([2d, dv+1]).
template <typename scalar_t, typename acc_t>
void reduce_key_state(const at::Tensor& k, const at::Tensor& v, const at::Tensor& power,
                      at::Tensor& partial) {
  const int64_t heads = k.size(1), n = k.size(2), d = k.size(3), dv = v.size(3);
  const int64_t chunks = num_chunks(n);
  const at::Tensor v_rows = v.view({-1, dv});
  const scalar_t* k_ptr = k.data_ptr<scalar_t>();
  const scalar_t* p_ptr = power.data_ptr<scalar_t>();
  const int64_t grain = grain_for(std::min(n, kTokenChunk) * 2 * d * dv);
  at::parallel_for(0, partial.size(0), grain, [&](int64_t begin, int64_t end) {
    at::Tensor feat = acc_tile(k, 2 * d), values = acc_tile(k, key_state_cols(dv));
    values.select(1, dv).fill_(1);
    std::vector<acc_t> p(d);
    for (int64_t index = begin; index < end; ++index) {
      const ChunkTask task(index, chunks, n);
      at::Tensor f = feat.narrow(0, 0, task.tokens), w = values.narrow(0, 0, task.tokens);
      widen(p_ptr + (task.bh % heads) * d, d, p.data());
      fill_features(k_ptr + task.first_row * d, p.data(), task.tokens, d, f.data_ptr<acc_t>());
      w.narrow(1, 0, dv).copy_(v_rows.narrow(0, task.first_row, task.tokens));
      at::Tensor part = partial.select(0, index);
      at::mm_out(part, f.t(), w);
    }
  });
}

// Sum the chunk partials in order and lay them out as the query state M (divided by n).
template <typename acc_t>
void build_query_state(const at::Tensor& partial, int64_t n, int64_t d, int64_t dv,
                       at::Tensor& state) {
  const int64_t bh_count = state.size(0) * state.size(1), chunks = partial.size(0) / bh_count;
  const int64_t key_size = 2 * d * key_state_cols(dv), cols = query_state_cols(dv);
  const acc_t* partial_ptr = partial.data_ptr<acc_t>();
  acc_t* state_ptr = state.data_ptr<acc_t>();
  at::parallel_for(0, bh_count, grain_for(chunks * key_size), [&](int64_t begin, int64_t end) {
    std::vector<acc_t> sum(key_size);
    for (int64_t bh = begin; bh < end; ++bh) {
      std::fill(sum.begin(), sum.end(), acc_t(0));
      for (int64_t chunk = 0; chunk < chunks; ++chunk) {
        const acc_t* part = partial_ptr + (bh * chunks + chunk) * key_size;
        for (int64_t i = 0; i < key_size; ++i) sum[i] += part[i];
      }
      acc_t* m = state_ptr + bh * 2 * d * cols;
      const acc_t inv_n = acc_t(1) / acc_t(n);
      for (int64_t r = 0; r < 2 * d; ++r)
        for (int64_t col = 0; col < cols; ++col)
          m[r * cols + col] = sum[query_state_source(r, col, d, dv)] * inv_n;
    }
  });
}

// Forward query pass: y = phi(q_chunk) M, out = [y[:m] / den_0, y[m:dv] / den_1].
template <typename scalar_t, typename acc_t>
void apply_query_state(const at::Tensor& q, const at::Tensor& power, const at::Tensor& state,
                       double eps, at::Tensor& out, at::Tensor& den) {
  const int64_t heads = q.size(1), N = q.size(2), d = q.size(3), dv = out.size(3);
  const int64_t chunks = num_chunks(N), cols = query_state_cols(dv), half = dv / 2;
  const at::Tensor state_rows = state.view({-1, 2 * d, cols});
  const scalar_t* q_ptr = q.data_ptr<scalar_t>();
  const scalar_t* p_ptr = power.data_ptr<scalar_t>();
  scalar_t* out_ptr = out.data_ptr<scalar_t>();
  acc_t* den_ptr = den.data_ptr<acc_t>();
  const int64_t grain = grain_for(std::min(N, kTokenChunk) * 2 * d * dv);
  at::parallel_for(0, state_rows.size(0) * chunks, grain, [&](int64_t begin, int64_t end) {
    at::Tensor feat = acc_tile(q, 2 * d), y = acc_tile(q, cols);
    std::vector<acc_t> p(d);
    for (int64_t index = begin; index < end; ++index) {
      const ChunkTask task(index, chunks, N);
      at::Tensor f = feat.narrow(0, 0, task.tokens), y_chunk = y.narrow(0, 0, task.tokens);
      widen(p_ptr + (task.bh % heads) * d, d, p.data());
      fill_features(q_ptr + task.first_row * d, p.data(), task.tokens, d, f.data_ptr<acc_t>());
      at::mm_out(y_chunk, f, state_rows.select(0, task.bh));
      const acc_t* y_ptr = y_chunk.data_ptr<acc_t>();
      for (int64_t t = 0; t < task.tokens; ++t) {
        const acc_t* yt = y_ptr + t * cols;
        const int64_t row = task.first_row + t;
        const acc_t den_same = yt[dv] + acc_t(eps), den_opp = yt[dv + 1] + acc_t(eps);
        const acc_t inv_same = acc_t(1) / den_same, inv_opp = acc_t(1) / den_opp;
        scalar_t* o = out_ptr + row * dv;
        for (int64_t col = 0; col < half; ++col) o[col] = static_cast<scalar_t>(yt[col] * inv_same);
        for (int64_t col = half; col < dv; ++col) o[col] = static_cast<scalar_t>(yt[col] * inv_opp);
        den_ptr[row * 2] = den_same;
        den_ptr[row * 2 + 1] = den_opp;
      }
    }
  });
}

// Backward query pass: dq, and per chunk the partials of dM = phi(q)^T W and of dpower, with
// W = dL/dy = [g[:m]/den_0, g[m:]/den_1, -g[:m].out[:m]/den_0, -g[m:].out[m:]/den_1].
// A narrower out (bf16) is recomputed in acc_t as y / den: W's last columns nearly cancel its
// first ones in dq (exactly for d = 1), so out's rounding would be amplified there.
template <typename scalar_t, typename acc_t>
void query_backward(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& power,
                    const at::Tensor& out, const at::Tensor& state, const at::Tensor& den,
                    at::Tensor& dq, at::Tensor& state_grad_partial,
                    at::Tensor& power_grad_partial) {
  const int64_t heads = q.size(1), N = q.size(2), d = q.size(3), dv = out.size(3);
  const int64_t chunks = num_chunks(N), cols = query_state_cols(dv), half = dv / 2;
  const at::Tensor state_rows = state.view({-1, 2 * d, cols});
  const scalar_t* g_ptr = grad_out.data_ptr<scalar_t>();
  const scalar_t* q_ptr = q.data_ptr<scalar_t>();
  const scalar_t* p_ptr = power.data_ptr<scalar_t>();
  const scalar_t* out_ptr = out.data_ptr<scalar_t>();
  const acc_t* den_ptr = den.data_ptr<acc_t>();
  scalar_t* dq_ptr = dq.data_ptr<scalar_t>();
  acc_t* dp_ptr = power_grad_partial.data_ptr<acc_t>();
  const int64_t grain = grain_for(std::min(N, kTokenChunk) * 4 * d * dv);
  constexpr bool widened = !std::is_same_v<scalar_t, acc_t>;
  at::parallel_for(0, state_grad_partial.size(0), grain, [&](int64_t begin, int64_t end) {
    at::Tensor feat = acc_tile(q, 2 * d), feat_grad = acc_tile(q, 2 * d), w = acc_tile(q, cols);
    at::Tensor y = widened ? acc_tile(q, cols) : at::Tensor();
    std::vector<acc_t> p(d);
    for (int64_t index = begin; index < end; ++index) {
      const ChunkTask task(index, chunks, N);
      at::Tensor f = feat.narrow(0, 0, task.tokens), fg = feat_grad.narrow(0, 0, task.tokens);
      at::Tensor w_chunk = w.narrow(0, 0, task.tokens);
      widen(p_ptr + (task.bh % heads) * d, d, p.data());
      fill_features(q_ptr + task.first_row * d, p.data(), task.tokens, d, f.data_ptr<acc_t>());
      acc_t* w_ptr = w_chunk.data_ptr<acc_t>();
      const acc_t* y_ptr = nullptr;
      if constexpr (widened) {
        at::Tensor y_chunk = y.narrow(0, 0, task.tokens);
        at::mm_out(y_chunk, f, state_rows.select(0, task.bh));
        y_ptr = y_chunk.data_ptr<acc_t>();
      }
      for (int64_t t = 0; t < task.tokens; ++t) {
        const int64_t row = task.first_row + t;
        const scalar_t* g = g_ptr + row * dv;
        const scalar_t* o = out_ptr + row * dv;
        const acc_t inv_same = acc_t(1) / den_ptr[row * 2];
        const acc_t inv_opp = acc_t(1) / den_ptr[row * 2 + 1];
        // out[col] in acc_t: the saved value, or y[col] / den as the forward pass computed it
        const auto out_at = [&](int64_t col, acc_t inv) {
          if constexpr (widened) return y_ptr[t * cols + col] * inv;
          else return static_cast<acc_t>(o[col]);
        };
        acc_t* wt = w_ptr + t * cols;
        acc_t dot_same = 0, dot_opp = 0;
        for (int64_t col = 0; col < half; ++col) {
          const acc_t gc = static_cast<acc_t>(g[col]);
          wt[col] = gc * inv_same;
          dot_same += gc * out_at(col, inv_same);
        }
        for (int64_t col = half; col < dv; ++col) {
          const acc_t gc = static_cast<acc_t>(g[col]);
          wt[col] = gc * inv_opp;
          dot_opp += gc * out_at(col, inv_opp);
        }
        wt[dv] = -dot_same * inv_same;
        wt[dv + 1] = -dot_opp * inv_opp;
      }
      at::Tensor part = state_grad_partial.select(0, index);
      at::mm_out(part, f.t(), w_chunk);
      at::mm_out(fg, w_chunk, state_rows.select(0, task.bh).t());
      feature_backward(q_ptr + task.first_row * d, p.data(), f.data_ptr<acc_t>(),
                       fg.data_ptr<acc_t>(), task.tokens, d, dq_ptr + task.first_row * d,
                       dp_ptr + index * d);
    }
  });
}

// Sum the dM partials in chunk order and map them to dS (the key state's gradient), / n.
template <typename acc_t>
void build_key_state_grad(const at::Tensor& state_grad_partial, int64_t n, int64_t d, int64_t dv,
                          at::Tensor& key_grad) {
  const int64_t bh_count = key_grad.size(0), chunks = state_grad_partial.size(0) / bh_count;
  const int64_t size = 2 * d * query_state_cols(dv), cols = key_state_cols(dv);
  const acc_t* partial_ptr = state_grad_partial.data_ptr<acc_t>();
  acc_t* key_grad_ptr = key_grad.data_ptr<acc_t>();
  at::parallel_for(0, bh_count, grain_for(chunks * size), [&](int64_t begin, int64_t end) {
    std::vector<acc_t> sum(size);
    for (int64_t bh = begin; bh < end; ++bh) {
      std::fill(sum.begin(), sum.end(), acc_t(0));
      for (int64_t chunk = 0; chunk < chunks; ++chunk) {
        const acc_t* part = partial_ptr + (bh * chunks + chunk) * size;
        for (int64_t i = 0; i < size; ++i) sum[i] += part[i];
      }
      acc_t* ds = key_grad_ptr + bh * 2 * d * cols;
      const acc_t inv_n = acc_t(1) / acc_t(n);
      for (int64_t r = 0; r < 2 * d; ++r)
        for (int64_t col = 0; col < cols; ++col)
          ds[r * cols + col] = key_state_grad(sum.data(), r, col, d, dv) * inv_n;
    }
  });
}

// Backward key pass: dphi(k) = [v, 1] dS^T -> dk and the dpower partials; dv = phi(k) dS[:, :dv].
template <typename scalar_t, typename acc_t>
void key_backward(const at::Tensor& k, const at::Tensor& v, const at::Tensor& power,
                  const at::Tensor& key_grad, at::Tensor& dk, at::Tensor& dv_out,
                  at::Tensor& power_grad_partial) {
  constexpr bool widened = !std::is_same_v<scalar_t, acc_t>;
  const int64_t heads = k.size(1), n = k.size(2), d = k.size(3), dv = v.size(3);
  const int64_t chunks = num_chunks(n);
  const at::Tensor v_rows = v.view({-1, dv});
  at::Tensor dv_rows = dv_out.view({-1, dv});
  const scalar_t* k_ptr = k.data_ptr<scalar_t>();
  const scalar_t* p_ptr = power.data_ptr<scalar_t>();
  scalar_t* dk_ptr = dk.data_ptr<scalar_t>();
  acc_t* dp_ptr = power_grad_partial.data_ptr<acc_t>();
  const int64_t grain = grain_for(std::min(n, kTokenChunk) * 4 * d * dv);
  at::parallel_for(0, key_grad.size(0) * chunks, grain, [&](int64_t begin, int64_t end) {
    at::Tensor feat = acc_tile(k, 2 * d), feat_grad = acc_tile(k, 2 * d);
    at::Tensor values = acc_tile(k, key_state_cols(dv));
    values.select(1, dv).fill_(1);
    // dv in acc_t before it is rounded to a narrower dtype (mm_out writes its operands' dtype)
    at::Tensor value_grad = widened ? acc_tile(k, dv) : at::Tensor();
    std::vector<acc_t> p(d);
    for (int64_t index = begin; index < end; ++index) {
      const ChunkTask task(index, chunks, n);
      at::Tensor f = feat.narrow(0, 0, task.tokens), fg = feat_grad.narrow(0, 0, task.tokens);
      at::Tensor w = values.narrow(0, 0, task.tokens);
      widen(p_ptr + (task.bh % heads) * d, d, p.data());
      const at::Tensor ds = key_grad.select(0, task.bh);
      fill_features(k_ptr + task.first_row * d, p.data(), task.tokens, d, f.data_ptr<acc_t>());
      w.narrow(1, 0, dv).copy_(v_rows.narrow(0, task.first_row, task.tokens));
      at::mm_out(fg, w, ds.t());
      at::Tensor dv_chunk = dv_rows.narrow(0, task.first_row, task.tokens);
      if constexpr (widened) {
        at::Tensor dv_acc = value_grad.narrow(0, 0, task.tokens);
        at::mm_out(dv_acc, f, ds.narrow(1, 0, dv));
        dv_chunk.copy_(dv_acc);
      } else {
        at::mm_out(dv_chunk, f, ds.narrow(1, 0, dv));
      }
      feature_backward(k_ptr + task.first_row * d, p.data(), f.data_ptr<acc_t>(),
                       fg.data_ptr<acc_t>(), task.tokens, d, dk_ptr + task.first_row * d,
                       dp_ptr + index * d);
    }
  });
}

// dpower[h, c] = sum over batches, then query chunks, then key chunks, in that fixed order.
template <typename acc_t>
void sum_power_partials(const at::Tensor& query_partial, const at::Tensor& key_partial,
                        at::Tensor& dpower) {
  const int64_t B = query_partial.size(0), heads = query_partial.size(1);
  const int64_t d = query_partial.size(3);
  acc_t* dp = dpower.data_ptr<acc_t>();
  for (const at::Tensor& partial : {query_partial, key_partial}) {
    const int64_t chunks = partial.size(2);
    const acc_t* src = partial.data_ptr<acc_t>();
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t chunk = 0; chunk < chunks; ++chunk)
          for (int64_t c = 0; c < d; ++c)
            dp[h * d + c] += src[((b * heads + h) * chunks + chunk) * d + c];
  }
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> forward_cpu(const at::Tensor& q_in,
                                                           const at::Tensor& k_in,
                                                           const at::Tensor& v_in,
                                                           const at::Tensor& power_in, double eps) {
  check_forward_args(q_in, k_in, v_in, power_in);
  // The ATen calls below (views, copies, GEMMs) work on plain buffers: no autograd recording.
  const at::AutoDispatchBelowADInplaceOrView no_autograd;
  const at::Tensor q = q_in.contiguous(), k = k_in.contiguous(), v = v_in.contiguous();
  const at::Tensor power = power_in.contiguous();
  const int64_t B = q.size(0), heads = q.size(1), N = q.size(2), d = q.size(3);
  const int64_t n = k.size(2), dv = v.size(3), bh_count = B * heads;
  const at::TensorOptions acc = q.options().dtype(accumulate_type(q.scalar_type()));
  at::Tensor out = at::empty({B, heads, N, dv}, q.options());
  at::Tensor state = at::empty({B, heads, 2 * d, query_state_cols(dv)}, acc);
  at::Tensor den = at::empty({B, heads, N, 2}, acc);
  if (bh_count == 0) return {out, state, den};
  at::Tensor partial = at::empty({bh_count * num_chunks(n), 2 * d, key_state_cols(dv)}, acc);
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, q.scalar_type(),
                                 "polarity_linear_attention_forward_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    reduce_key_state<scalar_t, acc_t>(k, v, power, partial);
    build_query_state<acc_t>(partial, n, d, dv, state);
    apply_query_state<scalar_t, acc_t>(q, power, state, eps, out, den);
  });
  return {out, state, den};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> backward_cpu(
    const at::Tensor& grad_out_in, const at::Tensor& q_in, const at::Tensor& k_in,
    const at::Tensor& v_in, const at::Tensor& power_in, const at::Tensor& out_in,
    const at::Tensor& state_in, const at::Tensor& den_in) {
  check_backward_args(grad_out_in, q_in, k_in, v_in, power_in, out_in, state_in, den_in);
  const at::AutoDispatchBelowADInplaceOrView no_autograd;
  const at::Tensor grad_out = grad_out_in.contiguous(), q = q_in.contiguous();
  const at::Tensor k = k_in.contiguous(), v = v_in.contiguous(), power = power_in.contiguous();
  const at::Tensor out = out_in.contiguous(), state = state_in.contiguous();
  const at::Tensor den = den_in.contiguous();
  const int64_t B = q.size(0), heads = q.size(1), N = q.size(2), d = q.size(3);
  const int64_t n = k.size(2), dv = v.size(3), bh_count = B * heads;
  const at::TensorOptions acc = q.options().dtype(accumulate_type(q.scalar_type()));
  at::Tensor dq = at::empty_like(q), dk = at::empty_like(k), dv_out = at::empty_like(v);
  at::Tensor dpower = at::zeros({heads, d}, acc);
  if (bh_count == 0) return {dq, dk, dv_out, dpower};
  const int64_t query_chunks = num_chunks(N), key_chunks = num_chunks(n);
  at::Tensor state_grad_partial =
      at::empty({bh_count * query_chunks, 2 * d, query_state_cols(dv)}, acc);
  at::Tensor key_grad = at::empty({bh_count, 2 * d, key_state_cols(dv)}, acc);
  at::Tensor query_power_partial = at::zeros({B, heads, query_chunks, d}, acc);
  at::Tensor key_power_partial = at::zeros({B, heads, key_chunks, d}, acc);
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, q.scalar_type(),
                                 "polarity_linear_attention_backward_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    query_backward<scalar_t, acc_t>(grad_out, q, power, out, state, den, dq, state_grad_partial,
                                    query_power_partial);
    build_key_state_grad<acc_t>(state_grad_partial, n, d, dv, key_grad);
    key_backward<scalar_t, acc_t>(k, v, power, key_grad, dk, dv_out, key_power_partial);
    sum_power_partials<acc_t>(query_power_partial, key_power_partial, dpower);
  });
  return {dq, dk, dv_out, dpower};
}

void check_rank4(const char* name, const at::Tensor& t) {
  TORCH_CHECK(t.dim() == 4, name, " must have 4 dimensions, got ", t.sizes());
}

void check_same(const char* name, const at::Tensor& t, const at::Tensor& q) {
  TORCH_CHECK(t.device() == q.device(), name, " is on ", t.device(), " but q is on ", q.device());
  TORCH_CHECK(t.scalar_type() == q.scalar_type(), name, " has dtype ", t.scalar_type(),
              " but q has ", q.scalar_type());
}

}  // namespace

void check_forward_args(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                        const at::Tensor& power) {
  check_rank4("q", q);
  check_rank4("k", k);
  check_rank4("v", v);
  TORCH_CHECK(at::isFloatingType(q.scalar_type()), "q must be floating point, got ",
              q.scalar_type());
  check_same("k", k, q);
  check_same("v", v, q);
  check_same("power", power, q);
  TORCH_CHECK(k.size(0) == q.size(0) && v.size(0) == q.size(0) && k.size(1) == q.size(1) &&
                  v.size(1) == q.size(1),
              "q, k, v must share batch and heads, got ", q.sizes(), ", ", k.sizes(), ", ",
              v.sizes());
  TORCH_CHECK(k.size(3) == q.size(3), "q and k must have the same head dim, got ", q.sizes(),
              " and ", k.sizes());
  TORCH_CHECK(k.size(2) == v.size(2), "k and v must have the same number of tokens, got ",
              k.sizes(), " and ", v.sizes());
  TORCH_CHECK(k.size(2) >= 1, "k must have at least one token, got ", k.sizes());
  TORCH_CHECK(v.size(3) >= 2 && v.size(3) % 2 == 0, "v must have an even last dim, got ",
              v.sizes());
  TORCH_CHECK(power.dim() == 2 && power.size(0) == q.size(1) && power.size(1) == q.size(3),
              "power must have shape [heads, head dim] = [", q.size(1), ", ", q.size(3), "], got ",
              power.sizes());
}

void check_backward_args(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
                         const at::Tensor& v, const at::Tensor& power, const at::Tensor& out,
                         const at::Tensor& state, const at::Tensor& den) {
  check_forward_args(q, k, v, power);
  const int64_t B = q.size(0), heads = q.size(1), N = q.size(2), d = q.size(3), dv = v.size(3);
  check_same("grad_out", grad_out, q);
  check_same("out", out, q);
  TORCH_CHECK(grad_out.sizes() == out.sizes() && out.sizes() == at::IntArrayRef({B, heads, N, dv}),
              "grad_out and out must have shape [", B, ", ", heads, ", ", N, ", ", dv, "], got ",
              grad_out.sizes(), " and ", out.sizes());
  const auto acc = accumulate_type(q.scalar_type());
  const auto check_saved = [&](const char* name, const at::Tensor& t) {
    TORCH_CHECK(t.device() == q.device() && t.scalar_type() == acc, name, " must be ", acc,
                " on ", q.device(), ", got ", t.scalar_type(), " on ", t.device());
  };
  check_saved("state", state);
  check_saved("den", den);
  TORCH_CHECK(state.sizes() == at::IntArrayRef({B, heads, 2 * d, query_state_cols(dv)}),
              "state must have shape [", B, ", ", heads, ", ", 2 * d, ", ", query_state_cols(dv),
              "], got ", state.sizes());
  TORCH_CHECK(den.sizes() == at::IntArrayRef({B, heads, N, 2}), "den must have shape [", B, ", ",
              heads, ", ", N, ", 2], got ", den.sizes());
}

}  // namespace mmlinattn::polarity

TORCH_LIBRARY_FRAGMENT(mmlinattn, m) {
  m.def(
      "polarity_linear_attention_forward(Tensor q, Tensor k, Tensor v, Tensor power, float eps)"
      " -> (Tensor out, Tensor state, Tensor den)");
  m.def(
      "polarity_linear_attention_backward(Tensor grad_out, Tensor q, Tensor k, Tensor v, "
      "Tensor power, Tensor out, Tensor state, Tensor den)"
      " -> (Tensor grad_q, Tensor grad_k, Tensor grad_v, Tensor grad_power)");
}

TORCH_LIBRARY_IMPL(mmlinattn, CPU, m) {
  m.impl("polarity_linear_attention_forward", &mmlinattn::polarity::forward_cpu);
  m.impl("polarity_linear_attention_backward", &mmlinattn::polarity::backward_cpu);
}
