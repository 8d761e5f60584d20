// Polarity-aware linear attention: CUDA kernels (fp32, fp16, bf16 inputs; fp32 accumulation).
// The algorithm and the saved state are described in polarity_attention.h. Three kernel shapes
// cover both passes:
//   outer_reduce    partial[bh, chunk] = sum_{t in chunk} phi(x_t)^T w_t        ([2d, C] tiles)
//   feature_matmul  y_t = phi(x_t) Mat                                           (query out, dv)
//   feature_grad    dphi(x_t)[row_c] = w_t . Mat[row_c]  ->  dx, dpower partials (dq, dk)
// Reductions over tokens go through per-chunk / per-block partials summed in index order by a
// separate kernel: no atomics, so results are bitwise reproducible on a given device.
#include "polarity_attention/polarity_attention.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <algorithm>

namespace mmlinattn::polarity {
namespace {

constexpr int kThreads = 256;
constexpr int kTileTokens = 64;   // tokens staged in shared memory per step of outer_reduce
constexpr int kTileRows = 32;     // feature channels per outer_reduce block (x 2 polarities)
constexpr int kTileCols = 32;     // state columns per outer_reduce block
constexpr int kMaxChunks = 128;   // partial states per (batch, head) in outer_reduce
constexpr int kSmemFloats = 4096; // shared-memory budget (floats) of the per-token kernels

__host__ __device__ inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Tokens per outer_reduce block: a multiple of kTileTokens, at most kMaxChunks chunks.
int64_t chunk_tokens(int64_t tokens) {
  return std::max<int64_t>(256, ceil_div(ceil_div(tokens, kMaxChunks), kTileTokens) * kTileTokens);
}

// Tokens per block of the per-token kernels, so that their staged rows fit kSmemFloats.
int token_tile(int64_t width) {
  return static_cast<int>(std::clamp<int64_t>(kSmemFloats / std::max<int64_t>(width, 1), 1, 32));
}

// Signed feature: +|x|^p for x > 0 (row c), -|x|^p for x < 0 (row c + d), 0 for x == 0.
__device__ __forceinline__ float signed_feature(float x, float p) {
  if (x == 0.f) return 0.f;
  const float a = powf(fabsf(x), p);
  return x > 0.f ? a : -a;
}

// Weights w_t of the key side: [v_t, 1] (C = dv + 1).
template <typename scalar_t>
struct ValueWeights {
  const scalar_t* v;
  int64_t dv;
  __device__ float operator()(int64_t row, int64_t col) const {
    return col < dv ? static_cast<float>(v[row * dv + col]) : 1.f;
  }
};

// Weights w_t of the query side in backward: dL/dy = [g[:m]/den_0, g[m:]/den_1, gden_0, gden_1].
template <typename scalar_t>
struct QueryGradWeights {
  const scalar_t* grad_out;
  const float* den;
  const float* den_grad;
  int64_t dv;
  __device__ float operator()(int64_t row, int64_t col) const {
    if (col < dv)
      return static_cast<float>(grad_out[row * dv + col]) / den[row * 2 + (col >= dv / 2 ? 1 : 0)];
    return den_grad[row * 2 + (col - dv)];
  }
};

// partial[bh, chunk, r, col] = sum over the chunk's tokens of phi_r(x_t) w_t[col].
// grid (bh, chunk, row tile x col tile); each thread owns 4 channels x 1 column, both polarities.
template <typename scalar_t, typename Weights>
__global__ void outer_reduce_kernel(const scalar_t* __restrict__ x,
                                    const scalar_t* __restrict__ power, Weights weights,
                                    float* __restrict__ partial, int64_t heads, int64_t tokens,
                                    int64_t d, int64_t cols, int64_t chunk_len) {
  __shared__ float s_feat[kTileTokens][kTileRows];
  __shared__ float s_w[kTileTokens][kTileCols];
  const int64_t bh = blockIdx.x, chunk = blockIdx.y, chunks = gridDim.y;
  const int64_t col_tiles = ceil_div(cols, kTileCols);
  const int64_t c0 = (blockIdx.z / col_tiles) * kTileRows;
  const int64_t col0 = (blockIdx.z % col_tiles) * kTileCols;
  const int lane_col = threadIdx.x % kTileCols, group = threadIdx.x / kTileCols;  // 8 groups
  constexpr int kPerThread = kTileRows / (kThreads / kTileCols);                  // 4 channels
  const scalar_t* p = power + (bh % heads) * d;
  float pos[kPerThread] = {}, neg[kPerThread] = {};
  const int64_t first = chunk * chunk_len, last = std::min(tokens, first + chunk_len);
  for (int64_t t0 = first; t0 < last; t0 += kTileTokens) {
    for (int i = threadIdx.x; i < kTileTokens * kTileRows; i += kThreads) {
      const int t = i / kTileRows, c = i % kTileRows;
      const bool valid = t0 + t < last && c0 + c < d;
      const int64_t index = (bh * tokens + t0 + t) * d + c0 + c;
      s_feat[t][c] = valid ? signed_feature(static_cast<float>(x[index]),
                                            static_cast<float>(p[c0 + c]))
                           : 0.f;
    }
    for (int i = threadIdx.x; i < kTileTokens * kTileCols; i += kThreads) {
      const int t = i / kTileCols, col = i % kTileCols;
      const bool valid = t0 + t < last && col0 + col < cols;
      s_w[t][col] = valid ? weights(bh * tokens + t0 + t, col0 + col) : 0.f;
    }
    __syncthreads();
    const int steps = static_cast<int>(std::min<int64_t>(kTileTokens, last - t0));
    for (int t = 0; t < steps; ++t) {
      const float w = s_w[t][lane_col];
#pragma unroll
      for (int i = 0; i < kPerThread; ++i) {
        const float f = s_feat[t][group + i * (kThreads / kTileCols)];
        if (f > 0.f) pos[i] += f * w;
        else neg[i] -= f * w;
      }
    }
    __syncthreads();
  }
  const int64_t col = col0 + lane_col;
  if (col >= cols) return;
  float* out = partial + (bh * chunks + chunk) * 2 * d * cols;
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const int64_t c = c0 + group + i * (kThreads / kTileCols);
    if (c >= d) continue;
    out[c * cols + col] = pos[i];
    out[(c + d) * cols + col] = neg[i];
  }
}

// M[bh] = query-state layout of sum_chunk partial[bh, chunk] / n (see query_state_source).
__global__ void build_query_state_kernel(const float* __restrict__ partial,
                                         float* __restrict__ state, int64_t bh_count,
                                         int64_t chunks, int64_t n, int64_t d, int64_t dv) {
  const int64_t cols = query_state_cols(dv), size = 2 * d * cols;
  const int64_t key_size = 2 * d * key_state_cols(dv);
  const int64_t index = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (index >= bh_count * size) return;
  const int64_t bh = index / size, r = (index % size) / cols, col = index % cols;
  const int64_t src = query_state_source(r, col, d, dv);
  float sum = 0.f;
  for (int64_t chunk = 0; chunk < chunks; ++chunk)
    sum += partial[(bh * chunks + chunk) * key_size + src];
  state[index] = sum / static_cast<float>(n);
}

// dS[bh] = adjoint layout of sum_chunk dM partials, / n (see key_state_grad).
__global__ void build_key_state_grad_kernel(const float* __restrict__ partial,
                                            float* __restrict__ key_grad, int64_t bh_count,
                                            int64_t chunks, int64_t n, int64_t d, int64_t dv) {
  const int64_t cols = key_state_cols(dv), size = 2 * d * cols;
  const int64_t query_size = 2 * d * query_state_cols(dv);
  const int64_t index = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (index >= bh_count * size) return;
  const int64_t bh = index / size, r = (index % size) / cols, col = index % cols;
  float sum = 0.f;
  for (int64_t chunk = 0; chunk < chunks; ++chunk)
    sum += key_state_grad(partial + (bh * chunks + chunk) * query_size, r, col, d, dv);
  key_grad[index] = sum / static_cast<float>(n);
}

// y_t = phi(x_t) Mat[:, :cols] for a tile of tokens (Mat rows have mat_stride floats).
// Normalise: out = [y[:m] / den_0, y[m:dv] / den_1], den = y[dv:dv+2] + eps (query forward).
// Otherwise: out = y (dv of the key backward).
template <typename scalar_t, bool Normalise>
__global__ void feature_matmul_kernel(const scalar_t* __restrict__ x,
                                      const scalar_t* __restrict__ power,
                                      const float* __restrict__ mat, scalar_t* __restrict__ out,
                                      float* __restrict__ den, int64_t heads, int64_t tokens,
                                      int64_t d, int64_t cols, int64_t mat_stride, int64_t dv,
                                      float eps, int tile) {
  extern __shared__ float smem[];
  float* s_feat = smem;             // [tile, d]
  float* s_y = smem + tile * d;     // [tile, cols]
  const int64_t tiles_per_bh = ceil_div(tokens, tile);
  const int64_t bh = blockIdx.x / tiles_per_bh, t0 = (blockIdx.x % tiles_per_bh) * tile;
  const int64_t count = std::min<int64_t>(tile, tokens - t0);
  const scalar_t* p = power + (bh % heads) * d;
  const float* m = mat + bh * 2 * d * mat_stride;
  for (int64_t i = threadIdx.x; i < count * d; i += blockDim.x)
    s_feat[i] = signed_feature(static_cast<float>(x[(bh * tokens + t0) * d + i]),
                               static_cast<float>(p[i % d]));
  __syncthreads();
  for (int64_t i = threadIdx.x; i < count * cols; i += blockDim.x) {
    const int64_t t = i / cols, col = i % cols;
    float acc = 0.f;
    for (int64_t c = 0; c < d; ++c) {
      const float f = s_feat[t * d + c];
      if (f > 0.f) acc += f * m[c * mat_stride + col];
      else if (f < 0.f) acc -= f * m[(c + d) * mat_stride + col];
    }
    if (Normalise) s_y[i] = acc;
    else out[(bh * tokens + t0) * cols + i] = static_cast<scalar_t>(acc);
  }
  if (!Normalise) return;
  __syncthreads();
  const int64_t ycols = cols;  // dv + 2
  for (int64_t i = threadIdx.x; i < count * dv; i += blockDim.x) {
    const int64_t t = i / dv, col = i % dv;
    const float* yt = s_y + t * ycols;
    const float den_same = yt[dv] + eps, den_opp = yt[dv + 1] + eps;
    const float inv = 1.f / (col < dv / 2 ? den_same : den_opp);
    out[(bh * tokens + t0) * dv + i] = static_cast<scalar_t>(yt[col] * inv);
    if (col == 0) {
      den[(bh * tokens + t0 + t) * 2] = den_same;
      den[(bh * tokens + t0 + t) * 2 + 1] = den_opp;
    }
  }
}

// gden_t = (-g[:m].out[:m] / den_0, -g[m:].out[m:] / den_1): one warp per token.
template <typename scalar_t>
__global__ void query_den_grad_kernel(const scalar_t* __restrict__ grad_out,
                                      const scalar_t* __restrict__ out,
                                      const float* __restrict__ den, float* __restrict__ den_grad,
                                      int64_t rows, int64_t dv) {
  const int64_t row = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  float same = 0.f, opp = 0.f;
  for (int64_t col = lane; col < dv; col += 32) {
    const float prod =
        static_cast<float>(grad_out[row * dv + col]) * static_cast<float>(out[row * dv + col]);
    if (col < dv / 2) same += prod;
    else opp += prod;
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    same += __shfl_down_sync(0xffffffffu, same, offset);
    opp += __shfl_down_sync(0xffffffffu, opp, offset);
  }
  if (lane == 0) {
    den_grad[row * 2] = -same / den[row * 2];
    den_grad[row * 2 + 1] = -opp / den[row * 2 + 1];
  }
}

// For a tile of tokens: g = w_t . Mat[row(c, x_tc)] -> dx_tc = sign(x) p |x|^(p-1) g, and the
// block's dpower partial sum_t g |x|^p log|x| (tokens summed in order).
template <typename scalar_t, typename Weights>
__global__ void feature_grad_kernel(const scalar_t* __restrict__ x,
                                    const scalar_t* __restrict__ power, Weights weights,
                                    const float* __restrict__ mat, scalar_t* __restrict__ dx,
                                    float* __restrict__ power_partial, int64_t heads,
                                    int64_t tokens, int64_t d, int64_t cols, int tile) {
  extern __shared__ float smem[];
  float* s_w = smem;                // [tile, cols]
  float* s_dp = smem + tile * cols; // [tile, d]
  const int64_t tiles_per_bh = ceil_div(tokens, tile);
  const int64_t bh = blockIdx.x / tiles_per_bh, t0 = (blockIdx.x % tiles_per_bh) * tile;
  const int64_t count = std::min<int64_t>(tile, tokens - t0);
  const scalar_t* p = power + (bh % heads) * d;
  const float* m = mat + bh * 2 * d * cols;
  for (int64_t i = threadIdx.x; i < count * cols; i += blockDim.x)
    s_w[i] = weights(bh * tokens + t0 + i / cols, i % cols);
  __syncthreads();
  for (int64_t i = threadIdx.x; i < count * d; i += blockDim.x) {
    const int64_t t = i / d, c = i % d, row = (bh * tokens + t0) * d + i;
    const float xv = static_cast<float>(x[row]);
    if (xv == 0.f) {
      dx[row] = static_cast<scalar_t>(0.f);
      s_dp[i] = 0.f;
      continue;
    }
    const float pc = static_cast<float>(p[c]), ax = fabsf(xv), a = powf(ax, pc);
    const float* mrow = m + (xv > 0.f ? c : c + d) * cols;
    const float* wt = s_w + t * cols;
    float g = 0.f;
    for (int64_t col = 0; col < cols; ++col) g += wt[col] * mrow[col];
    const float grad_x = pc * (a / ax) * g;
    dx[row] = static_cast<scalar_t>(xv > 0.f ? grad_x : -grad_x);
    s_dp[i] = g * a * logf(ax);
  }
  __syncthreads();
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
    float sum = 0.f;
    for (int64_t t = 0; t < count; ++t) sum += s_dp[t * d + c];
    power_partial[blockIdx.x * d + c] = sum;
  }
}

// dpower[h, c] = sum over batches, then query blocks, then key blocks, in that order.
__global__ void sum_power_partials_kernel(const float* __restrict__ query_partial,
                                          const float* __restrict__ key_partial,
                                          float* __restrict__ dpower,
                                          int64_t batch, int64_t heads, int64_t d,
                                          int64_t query_blocks, int64_t key_blocks) {
  const int64_t index = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (index >= heads * d) return;
  const int64_t h = index / d, c = index % d;
  float sum = 0.f;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t bh = b * heads + h;
    for (int64_t blk = 0; blk < query_blocks; ++blk)
      sum += query_partial[(bh * query_blocks + blk) * d + c];
    for (int64_t blk = 0; blk < key_blocks; ++blk)
      sum += key_partial[(bh * key_blocks + blk) * d + c];
  }
  dpower[index] = sum;
}

template <typename scalar_t, typename Weights>
void launch_outer_reduce(const at::Tensor& x, const at::Tensor& power, Weights weights,
                         at::Tensor& partial, int64_t cols, int64_t chunk_len,
                         cudaStream_t stream) {
  const int64_t bh_count = x.size(0) * x.size(1), tokens = x.size(2), d = x.size(3);
  const dim3 grid(bh_count, partial.size(1), ceil_div(d, kTileRows) * ceil_div(cols, kTileCols));
  outer_reduce_kernel<scalar_t><<<grid, kThreads, 0, stream>>>(
      x.data_ptr<scalar_t>(), power.data_ptr<scalar_t>(), weights, partial.data_ptr<float>(),
      x.size(1), tokens, d, cols, chunk_len);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename scalar_t, typename Weights>
void launch_feature_grad(const at::Tensor& x, const at::Tensor& power, Weights weights,
                         const at::Tensor& mat, at::Tensor& dx, at::Tensor& power_partial,
                         int64_t cols, int tile, cudaStream_t stream) {
  const int64_t tokens = x.size(2), d = x.size(3);
  const size_t smem = sizeof(float) * tile * (cols + d);
  feature_grad_kernel<scalar_t><<<power_partial.size(0), kThreads, smem, stream>>>(
      x.data_ptr<scalar_t>(), power.data_ptr<scalar_t>(), weights, mat.data_ptr<float>(),
      dx.data_ptr<scalar_t>(), power_partial.data_ptr<float>(), x.size(1), tokens, d, cols, tile);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void check_cuda_support(const at::Tensor& q, const at::Tensor& v) {
  TORCH_CHECK(q.scalar_type() != at::kDouble,
              "polarity_linear_attention (CUDA) supports float32, float16 and bfloat16, got ",
              q.scalar_type());
  // Shared memory of the per-token kernels holds at least one token's [d] and [dv + 2] rows.
  TORCH_CHECK(q.size(3) + v.size(3) + 2 <= 3 * kSmemFloats,
              "polarity_linear_attention (CUDA) supports head dim + value dim up to ",
              3 * kSmemFloats - 2, ", got ", q.size(3), " + ", v.size(3));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> forward_cuda(const at::Tensor& q_in,
                                                            const at::Tensor& k_in,
                                                            const at::Tensor& v_in,
                                                            const at::Tensor& power_in,
                                                            double eps) {
  check_forward_args(q_in, k_in, v_in, power_in);
  check_cuda_support(q_in, v_in);
  const c10::cuda::CUDAGuard guard(q_in.device());
  const at::AutoDispatchBelowADInplaceOrView no_autograd;
  const at::Tensor q = q_in.contiguous(), k = k_in.contiguous(), v = v_in.contiguous();
  const at::Tensor power = power_in.contiguous();
  const int64_t B = q.size(0), heads = q.size(1), N = q.size(2), d = q.size(3);
  const int64_t n = k.size(2), dv = v.size(3), bh_count = B * heads;
  const auto f32 = q.options().dtype(at::kFloat);
  at::Tensor out = at::empty({B, heads, N, dv}, q.options());
  at::Tensor state = at::empty({B, heads, 2 * d, query_state_cols(dv)}, f32);
  at::Tensor den = at::empty({B, heads, N, 2}, f32);
  if (bh_count == 0) return {out, state, den};
  const int64_t chunk_len = chunk_tokens(n), chunks = ceil_div(n, chunk_len);
  at::Tensor partial = at::empty({bh_count, chunks, 2 * d, key_state_cols(dv)}, f32);
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, q.scalar_type(),
                                  "polarity_linear_attention_forward_cuda", [&] {
    launch_outer_reduce<scalar_t>(k, power, ValueWeights<scalar_t>{v.data_ptr<scalar_t>(), dv},
                                  partial, key_state_cols(dv), chunk_len, stream);
    const int64_t state_size = bh_count * 2 * d * query_state_cols(dv);
    build_query_state_kernel<<<ceil_div(state_size, kThreads), kThreads, 0, stream>>>(
        partial.data_ptr<float>(), state.data_ptr<float>(), bh_count, chunks, n, d, dv);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    if (N == 0) return;
    const int64_t cols = query_state_cols(dv);
    const int tile = token_tile(d + cols);
    feature_matmul_kernel<scalar_t, true>
        <<<bh_count * ceil_div(N, tile), kThreads, sizeof(float) * tile * (d + cols), stream>>>(
            q.data_ptr<scalar_t>(), power.data_ptr<scalar_t>(), state.data_ptr<float>(),
            out.data_ptr<scalar_t>(), den.data_ptr<float>(), heads, N, d, cols, cols, dv,
            static_cast<float>(eps), tile);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return {out, state, den};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> backward_cuda(
    const at::Tensor& grad_out_in, const at::Tensor& q_in, const at::Tensor& k_in,
    const at::Tensor& v_in, const at::Tensor& power_in, const at::Tensor& out_in,
    const at::Tensor& state_in, const at::Tensor& den_in) {
  check_backward_args(grad_out_in, q_in, k_in, v_in, power_in, out_in, state_in, den_in);
  check_cuda_support(q_in, v_in);
  const c10::cuda::CUDAGuard guard(q_in.device());
  const at::AutoDispatchBelowADInplaceOrView no_autograd;
  const at::Tensor grad_out = grad_out_in.contiguous(), q = q_in.contiguous();
  const at::Tensor k = k_in.contiguous(), v = v_in.contiguous(), power = power_in.contiguous();
  const at::Tensor out = out_in.contiguous(), state = state_in.contiguous();
  const at::Tensor den = den_in.contiguous();
  const int64_t B = q.size(0), heads = q.size(1), N = q.size(2), d = q.size(3);
  const int64_t n = k.size(2), dv = v.size(3), bh_count = B * heads;
  const auto f32 = q.options().dtype(at::kFloat);
  at::Tensor dq = at::empty_like(q), dk = at::empty_like(k), dv_out = at::empty_like(v);
  if (bh_count == 0) return {dq, dk, dv_out, at::zeros({heads, d}, f32)};
  const int64_t query_cols = query_state_cols(dv), key_cols = key_state_cols(dv);
  const int64_t chunk_len = chunk_tokens(N), chunks = N == 0 ? 0 : ceil_div(N, chunk_len);
  const int query_tile = token_tile(d + query_cols), key_tile = token_tile(d + key_cols);
  const int64_t query_blocks = ceil_div(N, query_tile), key_blocks = ceil_div(n, key_tile);
  at::Tensor den_grad = at::empty({bh_count, N, 2}, f32);
  // With N == 0 one zero chunk stands for the (empty) query side.
  at::Tensor state_grad_partial =
      at::zeros({bh_count, std::max<int64_t>(chunks, 1), 2 * d, query_cols}, f32);
  at::Tensor key_grad = at::empty({bh_count, 2 * d, key_cols}, f32);
  at::Tensor query_power_partial = at::empty({bh_count * query_blocks, d}, f32);
  at::Tensor key_power_partial = at::empty({bh_count * key_blocks, d}, f32);
  at::Tensor dpower = at::empty({heads, d}, f32);
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, q.scalar_type(),
                                  "polarity_linear_attention_backward_cuda", [&] {
    if (N > 0) {
      const int64_t warps_blocks = ceil_div(bh_count * N * 32, kThreads);
      query_den_grad_kernel<scalar_t><<<warps_blocks, kThreads, 0, stream>>>(
          grad_out.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), den.data_ptr<float>(),
          den_grad.data_ptr<float>(), bh_count * N, dv);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      const QueryGradWeights<scalar_t> weights{grad_out.data_ptr<scalar_t>(), den.data_ptr<float>(),
                                               den_grad.data_ptr<float>(), dv};
      launch_outer_reduce<scalar_t>(q, power, weights, state_grad_partial, query_cols, chunk_len,
                                    stream);
      launch_feature_grad<scalar_t>(q, power, weights, state, dq, query_power_partial, query_cols,
                                    query_tile, stream);
    }
    const int64_t key_grad_size = bh_count * 2 * d * key_cols;
    build_key_state_grad_kernel<<<ceil_div(key_grad_size, kThreads), kThreads, 0, stream>>>(
        state_grad_partial.data_ptr<float>(), key_grad.data_ptr<float>(), bh_count,
        state_grad_partial.size(1), n, d, dv);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    launch_feature_grad<scalar_t>(k, power, ValueWeights<scalar_t>{v.data_ptr<scalar_t>(), dv},
                                  key_grad, dk, key_power_partial, key_cols, key_tile, stream);
    const int dv_tile = token_tile(d + dv);
    feature_matmul_kernel<scalar_t, false>
        <<<bh_count * ceil_div(n, dv_tile), kThreads, sizeof(float) * dv_tile * (d + dv), stream>>>(
            k.data_ptr<scalar_t>(), power.data_ptr<scalar_t>(), key_grad.data_ptr<float>(),
            dv_out.data_ptr<scalar_t>(), nullptr, heads, n, d, dv, key_cols, dv, 0.f, dv_tile);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    sum_power_partials_kernel<<<ceil_div(heads * d, kThreads), kThreads, 0, stream>>>(
        query_power_partial.data_ptr<float>(), key_power_partial.data_ptr<float>(),
        dpower.data_ptr<float>(), B, heads, d, query_blocks, key_blocks);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  // dpower stays fp32, the compute dtype, as the operator's fake kernel declares.
  return {dq, dk, dv_out, dpower};
}

}  // namespace
}  // namespace mmlinattn::polarity

TORCH_LIBRARY_IMPL(mmlinattn, CUDA, m) {
  m.impl("polarity_linear_attention_forward", &mmlinattn::polarity::forward_cuda);
  m.impl("polarity_linear_attention_backward", &mmlinattn::polarity::backward_cuda);
}
