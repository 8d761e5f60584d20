// CUDA Newton–Schulz inverse (fp32, fp64; the formulas are in newton_schulz.h).
//
// Forward, fp32 matrices whose R (then P), V and one work matrix fit in a block's opt-in shared
// memory (3 M^2 floats, M <= ~117 on A100, ~139 on H100/H200): one thread block per matrix runs
// all steps in shared memory, a warp per matrix row, every entry summed in a fixed order. Larger
// M and fp64: the device-agnostic batched-matmul path (cuBLAS through at::bmm / at::baddbmm), so M
// has no cap. Backward: the batched-matmul backward (the exact gradient of the computed iterate).
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <tuple>

#include "newton_schulz.h"

namespace mmlinattn::newton_schulz {
namespace {

constexpr int kMaxThreads = 1024;
constexpr int kMaxEntriesPerLane = 8;  // one warp holds a row of up to 32 * 8 entries

// Row-major m x m matrices in shared memory: (X Y)_ij.
__device__ __forceinline__ float product_entry(const float* x, const float* y, int m, int i,
                                               int j) {
  float sum = 0.f;
  for (int kk = 0; kk < m; ++kk) sum += x[i * m + kk] * y[kk * m + j];
  return sum;
}

// Deterministic block sum (fixed shuffle tree, then warps in order); valid in thread 0.
__device__ float block_sum(float value, float* warp_sums) {
  for (int offset = 16; offset > 0; offset /= 2)
    value += __shfl_down_sync(0xffffffffu, value, offset);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warp_sums[warp] = value;
  __syncthreads();
  float total = 0.f;
  if (threadIdx.x == 0)
    for (int w = 0; w < static_cast<int>(blockDim.x) / 32; ++w) total += warp_sums[w];
  return total;
}

// max_i sum_j |X_ij| of a row-major m x m matrix in shared memory: row sums into sums[0..m),
// then the maximum in row order by thread 0 into *out (a NaN row sum makes it NaN; fmaxf would
// drop it). Every thread calls it; *out is valid after it returns.
__device__ void norm_inf(const float* x, float* sums, float* out, int m) {
  for (int i = threadIdx.x; i < m; i += blockDim.x) {
    float row = 0.f;
    for (int j = 0; j < m; ++j) row += fabsf(x[i * m + j]);
    sums[i] = row;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float norm = sums[0];
    for (int i = 1; i < m; ++i)
      norm = (sums[i] > norm || isnan(sums[i])) && !isnan(norm) ? sums[i] : norm;
    *out = norm;
  }
  __syncthreads();
}

// P = a + eps I into dst (all threads; the caller synchronises).
__device__ void load_shifted(const float* a, float* dst, int mm, int m, float eps) {
  for (int e = threadIdx.x; e < mm; e += blockDim.x) dst[e] = a[e] + (e / m == e % m ? eps : 0.f);
}

// x <- f(i, j, (X Y)_ij) row by row, in place: row i of X Y reads only row i of X, so the warp
// that owns row i reads it whole into registers, then overwrites it.
template <typename F>
__device__ void update_rows_in_place(float* x, const float* y, int m, F f) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  for (int i = warp; i < m; i += warps) {
    float row[kMaxEntriesPerLane];
#pragma unroll
    for (int s = 0; s < kMaxEntriesPerLane; ++s) {
      const int j = lane + 32 * s;
      if (j < m) row[s] = f(i, j, product_entry(x, y, m, i, j));
    }
    __syncwarp();  // the whole row of X is read before any lane overwrites it
#pragma unroll
    for (int s = 0; s < kMaxEntriesPerLane; ++s) {
      const int j = lane + 32 * s;
      if (j < m) x[i * m + j] = row[s];
    }
  }
}

// One block per matrix; blockDim.x is a multiple of 32. Products are computed a row per warp
// (lanes over columns), so V + V R and 2V - T V overwrite their left factor in place
// (update_rows_in_place).
__global__ void __launch_bounds__(kMaxThreads)
    newton_schulz_shared_kernel(const float* __restrict__ a, float* __restrict__ v_out,
                                float* __restrict__ residual, int m, int iters, float eps) {
  extern __shared__ float smem[];
  __shared__ float warp_sums[kMaxThreads / 32];
  __shared__ float norm;
  const int mm = m * m, tid = threadIdx.x, threads = blockDim.x;
  const int lane = tid % 32, warp = tid / 32, warps = threads / 32;
  constexpr float kUnitRoundoff = 5.9604645e-8f;  // 2^-24
  float* r = smem;    // R_t; P for the last step
  float* v = r + mm;  // V_t
  float* w = v + mm;  // work matrix
  a += static_cast<int64_t>(blockIdx.x) * mm;
  load_shifted(a, w, mm, m, eps);
  __syncthreads();
  norm_inf(w, v, &norm, m);  // s = ||P||_inf (row sums in v, overwritten below)
  const float inv = 1.f / norm;
  for (int e = tid; e < mm; e += threads) {  // V_0 = I / s, R_0 = I - P / s
    const bool diagonal = e / m == e % m;
    r[e] = (diagonal ? 1.f : 0.f) - w[e] * inv;
    v[e] = diagonal ? inv : 0.f;
  }
  __syncthreads();
  for (int k = 0; k + 1 < iters; ++k) {
    norm_inf(r, w, &norm, m);
    if (norm <= kUnitRoundoff) break;  // the same value in every thread
    if (k == 0) {  // V_1 = V_0 + V_0 R_0 for the diagonal V_0: no product
      for (int e = tid; e < mm; e += threads) v[e] += inv * r[e];
    } else {  // V <- V + V R
      update_rows_in_place(v, r, m, [&](int i, int j, float vr) { return v[i * m + j] + vr; });
    }
    if (k + 2 < iters)  // W = R R
      for (int i = warp; i < m; i += warps)
        for (int j = lane; j < m; j += 32) w[i * m + j] = product_entry(r, r, m, i, j);
    __syncthreads();
    if (k + 2 < iters) {
      float* next = w;
      w = r;
      r = next;
    }
  }
  float* p = r;  // R is done with: P for the Newton–Schulz step and the residual
  load_shifted(a, p, mm, m, eps);
  __syncthreads();
  for (int i = warp; i < m; i += warps)  // T = V P
    for (int j = lane; j < m; j += 32) w[i * m + j] = product_entry(v, p, m, i, j);
  __syncthreads();
  // T <- 2V - T V
  update_rows_in_place(w, v, m, [&](int i, int j, float tv) { return 2.f * v[i * m + j] - tv; });
  __syncthreads();
  v = w;
  float* v_dst = v_out + static_cast<int64_t>(blockIdx.x) * mm;
  for (int e = tid; e < mm; e += threads) v_dst[e] = v[e];
  if (residual == nullptr) return;
  float sq = 0.f;  // ||I - P V||_F^2, each thread over its entries in a fixed order
  for (int i = warp; i < m; i += warps)
    for (int j = lane; j < m; j += 32) {
      const float diff = (i == j ? 1.f : 0.f) - product_entry(p, v, m, i, j);
      sq += diff * diff;
    }
  const float total = block_sum(sq, warp_sums);
  if (tid == 0) residual[blockIdx.x] = sqrtf(total / static_cast<float>(m));
}

int shared_memory_limit() {
  return static_cast<int>(at::cuda::getCurrentDeviceProperties()->sharedMemPerBlockOptin);
}

std::tuple<at::Tensor, at::Tensor> newton_schulz_inverse_cuda(const at::Tensor& a_in,
                                                              int64_t iters, double eps,
                                                              bool with_residual) {
  check_args(a_in, iters, eps);
  const c10::cuda::CUDAGuard guard(a_in.device());
  const at::Tensor a = a_in.contiguous();
  const int64_t batch = a.size(0), m = a.size(1);
  if (a.numel() == 0)
    return {at::empty(a.sizes(), a.options()), at::zeros({with_residual ? batch : 0}, a.options())};
  const int64_t smem_bytes = 3 * m * m * static_cast<int64_t>(sizeof(float));
  const int64_t static_bytes = (kMaxThreads / 32 + 1) * static_cast<int64_t>(sizeof(float));
  const bool fits = a.scalar_type() == at::kFloat && m <= 32 * kMaxEntriesPerLane &&
                    smem_bytes + static_bytes <= shared_memory_limit();
  if (!fits) return newton_schulz_batched_matmul(a, iters, eps, with_residual);
  TORCH_CHECK(batch < (int64_t{1} << 31), "newton_schulz_inverse: batch too large");
  at::Tensor v = at::empty(a.sizes(), a.options());
  at::Tensor residual = at::empty({with_residual ? batch : 0}, a.options());
  const int threads = static_cast<int>(std::min<int64_t>(kMaxThreads, 32 * m));  // a warp per row
  const auto stream = at::cuda::getCurrentCUDAStream();
  C10_CUDA_CHECK(cudaFuncSetAttribute(newton_schulz_shared_kernel,
                                      cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(smem_bytes)));
  newton_schulz_shared_kernel<<<static_cast<unsigned int>(batch), threads, smem_bytes, stream>>>(
      a.const_data_ptr<float>(), v.mutable_data_ptr<float>(),
      with_residual ? residual.mutable_data_ptr<float>() : nullptr, static_cast<int>(m),
      static_cast<int>(iters), static_cast<float>(eps));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {v, residual};
}

at::Tensor newton_schulz_inverse_backward_cuda(const at::Tensor& grad_v, const at::Tensor& a,
                                               int64_t iters, double eps) {
  const c10::cuda::CUDAGuard guard(a.device());
  return newton_schulz_backward_batched_matmul(grad_v, a, iters, eps);
}

}  // namespace

TORCH_LIBRARY_IMPL(mmlinattn, CUDA, m) {
  m.impl("newton_schulz_inverse", &newton_schulz_inverse_cuda);
  m.impl("newton_schulz_inverse_backward", &newton_schulz_inverse_backward_cuda);
}

}  // namespace mmlinattn::newton_schulz
