// CUDA kernels of the Laplacian kernel op: fp32, fp16 and bf16 inputs, fp32 accumulation.
//
// Forward: one 64 x 64 output tile per block (16 x 16 threads, 4 x 4 outputs each); the query and
// key tiles are staged in shared memory 32 channels at a time, so [B,H,N,M,D] never exists.
// Backward: dq and dk are separate kernels, each thread owning one output entry (row, channel) and
// summing over the other side's rows in a fixed order from shared-memory tiles: deterministic,
// no atomics.
#include <ATen/ATen.h>
#include <ATen/Dispatch_v2.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <tuple>

#include "laplacian_kernel.h"

namespace mmlinattn::laplacian {
namespace {

constexpr int kTile = 64;     // forward output tile (rows and columns)
constexpr int kThreads = 16;  // forward block is kThreads x kThreads
constexpr int kPerThread = kTile / kThreads;
constexpr int kChunk = 32;    // channels staged per step; backward block width
constexpr int kRowsPerBlock = 8;  // backward: output rows per block (block is kChunk x 8)
constexpr int kInner = 64;        // backward: rows of the other side staged per step

template <typename scalar_t>
__global__ void forward_kernel(const scalar_t* __restrict__ q, const scalar_t* __restrict__ k,
                               scalar_t* __restrict__ out, int64_t n, int64_t m, int64_t d,
                               int64_t tiles_n, int64_t tiles_m, float neg_inv_lam) {
  __shared__ float qs[kTile][kChunk + 1];
  __shared__ float ks[kTile][kChunk + 1];
  const int64_t tiles = tiles_n * tiles_m;
  const int64_t bh = blockIdx.x / tiles, tile = blockIdx.x % tiles;
  const int64_t i0 = (tile / tiles_m) * kTile, j0 = (tile % tiles_m) * kTile;
  q += bh * n * d;
  k += bh * m * d;
  out += bh * n * m;
  const int tx = threadIdx.x, ty = threadIdx.y, tid = ty * kThreads + tx;
  float acc[kPerThread][kPerThread] = {};
  for (int64_t c0 = 0; c0 < d; c0 += kChunk) {
    for (int e = tid; e < kTile * kChunk; e += kThreads * kThreads) {
      const int r = e / kChunk, c = e % kChunk;
      const bool in_c = c0 + c < d;
      qs[r][c] = (in_c && i0 + r < n) ? static_cast<float>(q[(i0 + r) * d + c0 + c]) : 0.f;
      ks[r][c] = (in_c && j0 + r < m) ? static_cast<float>(k[(j0 + r) * d + c0 + c]) : 0.f;
    }
    __syncthreads();
#pragma unroll 4
    for (int c = 0; c < kChunk; ++c) {
      float qv[kPerThread], kv[kPerThread];
#pragma unroll
      for (int r = 0; r < kPerThread; ++r) qv[r] = qs[ty + r * kThreads][c];
#pragma unroll
      for (int s = 0; s < kPerThread; ++s) kv[s] = ks[tx + s * kThreads][c];
#pragma unroll
      for (int r = 0; r < kPerThread; ++r)
#pragma unroll
        for (int s = 0; s < kPerThread; ++s) acc[r][s] += fabsf(qv[r] - kv[s]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int r = 0; r < kPerThread; ++r) {
    const int64_t i = i0 + ty + r * kThreads;
#pragma unroll
    for (int s = 0; s < kPerThread; ++s) {
      const int64_t j = j0 + tx + s * kThreads;
      if (i < n && j < m) out[i * m + j] = static_cast<scalar_t>(__expf(acc[r][s] * neg_inv_lam));
    }
  }
}

__device__ __forceinline__ float sign_times(float diff, float g) {
  return diff > 0.f ? g : (diff < 0.f ? -g : 0.f);
}

// result[r][c] = direction * sum_o g(r, o) * sign(q_c - k_c) for every own row r, with
// (q, k) = (own row r, other row o) for dq (OwnIsQuery) and (other row o, own row r) for dk;
// g = grad * out / lam from the [N, M] matrices. Each thread owns one (r, c), sums o in order.
template <typename scalar_t, bool OwnIsQuery>
__global__ void backward_kernel(const scalar_t* __restrict__ grad,
                                const scalar_t* __restrict__ out,
                                const scalar_t* __restrict__ own,
                                const scalar_t* __restrict__ other,
                                scalar_t* __restrict__ result, int64_t n_own, int64_t n_other,
                                int64_t d, int64_t chunks, int64_t row_blocks, float inv_lam,
                                float direction) {
  __shared__ float other_s[kInner][kChunk];
  __shared__ float g_s[kRowsPerBlock][kInner + 1];
  const int64_t per_bh = chunks * row_blocks;
  const int64_t bh = blockIdx.x / per_bh, rest = blockIdx.x % per_bh;
  const int64_t c0 = (rest % chunks) * kChunk, r0 = (rest / chunks) * kRowsPerBlock;
  const int64_t n = OwnIsQuery ? n_own : n_other, m = OwnIsQuery ? n_other : n_own;
  grad += bh * n * m;
  out += bh * n * m;
  own += bh * n_own * d;
  other += bh * n_other * d;
  result += bh * n_own * d;
  const int tx = threadIdx.x, ty = threadIdx.y, tid = ty * kChunk + tx;
  const int64_t row = r0 + ty, c = c0 + tx;
  const float own_v = (row < n_own && c < d) ? static_cast<float>(own[row * d + c]) : 0.f;
  float acc = 0.f;
  for (int64_t o0 = 0; o0 < n_other; o0 += kInner) {
    for (int e = tid; e < kInner * kChunk; e += kChunk * kRowsPerBlock) {
      const int r = e / kChunk, cc = e % kChunk;
      other_s[r][cc] = (o0 + r < n_other && c0 + cc < d)
                           ? static_cast<float>(other[(o0 + r) * d + c0 + cc])
                           : 0.f;
    }
    for (int e = tid; e < kRowsPerBlock * kInner; e += kChunk * kRowsPerBlock) {
      // dq: g_s[own row][other] read along M (contiguous); dk: consecutive e walk own rows (M).
      const int r = OwnIsQuery ? e / kInner : e % kRowsPerBlock;
      const int o = OwnIsQuery ? e % kInner : e / kRowsPerBlock;
      float g = 0.f;
      if (r0 + r < n_own && o0 + o < n_other) {
        const int64_t idx = OwnIsQuery ? (r0 + r) * m + (o0 + o) : (o0 + o) * m + (r0 + r);
        g = static_cast<float>(grad[idx]) * static_cast<float>(out[idx]) * inv_lam;
      }
      g_s[r][o] = g;
    }
    __syncthreads();
    const int64_t count = n_other - o0 < kInner ? n_other - o0 : kInner;
    for (int o = 0; o < count; ++o) {
      // sign(q - k): own - other for dq, other - own for dk.
      const float diff = OwnIsQuery ? own_v - other_s[o][tx] : other_s[o][tx] - own_v;
      acc += sign_times(diff, g_s[ty][o]);
    }
    __syncthreads();
  }
  if (row < n_own && c < d) result[row * d + c] = static_cast<scalar_t>(direction * acc);
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

#define MMLINATTN_CUDA_FLOAT_TYPES at::kFloat, at::kHalf, at::kBFloat16

void check_cuda_dtype(const at::Tensor& q) {
  TORCH_CHECK_VALUE(q.scalar_type() == at::kFloat || q.scalar_type() == at::kHalf ||
                        q.scalar_type() == at::kBFloat16,
                    "laplacian_kernel on CUDA supports float32, float16 and bfloat16, got ",
                    q.scalar_type());
}

at::Tensor laplacian_kernel_forward_cuda(const at::Tensor& q_in, const at::Tensor& k_in,
                                         double lam) {
  check_forward_args(q_in, k_in, lam);
  check_cuda_dtype(q_in);
  const c10::cuda::CUDAGuard guard(q_in.device());
  const at::Tensor q = q_in.contiguous(), k = k_in.contiguous();
  const int64_t bh = q.size(0) * q.size(1), n = q.size(2), m = k.size(2), d = q.size(3);
  at::Tensor out = at::empty({q.size(0), q.size(1), n, m}, q.options());
  if (out.numel() == 0) return out;
  const int64_t tiles_n = ceil_div(n, kTile), tiles_m = ceil_div(m, kTile);
  const int64_t blocks = bh * tiles_n * tiles_m;
  TORCH_CHECK(blocks < (int64_t{1} << 31), "laplacian_kernel: input too large for one launch");
  const auto stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_V2(q.scalar_type(), "laplacian_kernel_forward_cuda", AT_WRAP([&] {
    const dim3 block(kThreads, kThreads);
    forward_kernel<scalar_t><<<static_cast<unsigned int>(blocks), block, 0, stream>>>(
        q.const_data_ptr<scalar_t>(), k.const_data_ptr<scalar_t>(),
        out.mutable_data_ptr<scalar_t>(), n, m, d, tiles_n, tiles_m,
        static_cast<float>(-1.0 / lam));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }), MMLINATTN_CUDA_FLOAT_TYPES);
  return out;
}

std::tuple<at::Tensor, at::Tensor> laplacian_kernel_backward_cuda(
    const at::Tensor& grad_in, const at::Tensor& q_in, const at::Tensor& k_in,
    const at::Tensor& out_in, double lam, bool need_dq, bool need_dk) {
  check_backward_args(grad_in, q_in, k_in, out_in, lam);
  check_cuda_dtype(q_in);
  const c10::cuda::CUDAGuard guard(q_in.device());
  const at::Tensor grad = grad_in.contiguous(), q = q_in.contiguous(), k = k_in.contiguous();
  const at::Tensor out = out_in.contiguous();
  at::Tensor dq = need_dq ? at::zeros_like(q) : at::empty({0}, q.options());
  at::Tensor dk = need_dk ? at::zeros_like(k) : at::empty({0}, k.options());
  const int64_t bh = q.size(0) * q.size(1), n = q.size(2), m = k.size(2), d = q.size(3);
  if (grad.numel() == 0 || d == 0) return {dq, dk};
  const int64_t chunks = ceil_div(d, kChunk);
  const auto stream = at::cuda::getCurrentCUDAStream();
  const float inv_lam = static_cast<float>(1.0 / lam);
  const dim3 block(kChunk, kRowsPerBlock);
  const auto grid = [&](int64_t rows) {
    const int64_t blocks = bh * chunks * ceil_div(rows, kRowsPerBlock);
    TORCH_CHECK(blocks < (int64_t{1} << 31), "laplacian_kernel: input too large for one launch");
    return static_cast<unsigned int>(blocks);
  };
  AT_DISPATCH_V2(q.scalar_type(), "laplacian_kernel_backward_cuda", AT_WRAP([&] {
    const scalar_t* g_ptr = grad.const_data_ptr<scalar_t>();
    const scalar_t* o_ptr = out.const_data_ptr<scalar_t>();
    const scalar_t* q_ptr = q.const_data_ptr<scalar_t>();
    const scalar_t* k_ptr = k.const_data_ptr<scalar_t>();
    if (need_dq) {  // dq_ic = -sum_j g_ij sign(q_ic - k_jc)
      backward_kernel<scalar_t, true><<<grid(n), block, 0, stream>>>(
          g_ptr, o_ptr, q_ptr, k_ptr, dq.mutable_data_ptr<scalar_t>(), n, m, d, chunks,
          ceil_div(n, kRowsPerBlock), inv_lam, -1.f);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
    if (need_dk) {  // dk_jc = +sum_i g_ij sign(q_ic - k_jc)
      backward_kernel<scalar_t, false><<<grid(m), block, 0, stream>>>(
          g_ptr, o_ptr, k_ptr, q_ptr, dk.mutable_data_ptr<scalar_t>(), m, n, d, chunks,
          ceil_div(m, kRowsPerBlock), inv_lam, 1.f);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
  }), MMLINATTN_CUDA_FLOAT_TYPES);
  return {dq, dk};
}

}  // namespace

TORCH_LIBRARY_IMPL(mmlinattn, CUDA, m) {
  m.impl("laplacian_kernel_forward", &laplacian_kernel_forward_cuda);
  m.impl("laplacian_kernel_backward", &laplacian_kernel_backward_cuda);
}

}  // namespace mmlinattn::laplacian
