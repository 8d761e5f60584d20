// CPU Laplacian kernel op (fp32, fp64, bf16): schemas and the torch drivers. The row kernels and
// the forward work split are shared with the onnxruntime op (laplacian_kernel_cpu.h); the design
// is in docs/ops/laplacian_kernel.md.
//
// Forward: forward_tasks (laplacian_kernel_cpu.h) on torch's thread pool.
// Backward: tasks of kBackwardRows query rows of one (batch, head) compute their dq rows whole
// and their own partial dk (the sum over their rows); the partials are then added in task order,
// so results do not depend on the number of threads.
// Kernels: AVX-512 intrinsics (laplacian_kernel_avx512.cpp) when the CPU has them and
// ATEN_CPU_CAPABILITY (torch's switch) allows AVX512; otherwise the portable loops
// (laplacian_kernel_portable.cpp).
#include <ATen/Parallel.h>
#include <ATen/Version.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <tuple>
#include <vector>

#include "laplacian_kernel.h"
#include "laplacian_kernel/laplacian_kernel_cpu.h"

namespace mmlinattn::laplacian {
namespace {

using cpu::ceil_div;
using cpu::kForwardRows;
using cpu::kKeyPad;
using cpu::Kernels;

constexpr int64_t kBackwardRows = 256;  // query rows per backward task (fixed: deterministic dk)

bool avx512_usable() {
  return at::get_cpu_capability() == "AVX512" && cpu::cpu_has_avx512();
}

template <typename T>
const Kernels<T>& kernels() {
  static const Kernels<T> chosen = cpu::select_kernels<T>(avx512_usable());
  return chosen;
}

// ---- driver -----------------------------------------------------------------------------------

template <typename T>
void forward_cpu(const at::Tensor& q, const at::Tensor& k, at::Tensor& out, double lam) {
  cpu::forward_tasks(kernels<T>(), q.const_data_ptr<T>(), k.const_data_ptr<T>(),
                     out.mutable_data_ptr<T>(), q.size(0) * q.size(1), q.size(2), k.size(2),
                     q.size(3), T(-1.0 / lam),
                     [](int64_t begin, int64_t end, const auto& fn) {
                       at::parallel_for(begin, end, 1, fn);
                     });
}

template <typename T>
void backward_cpu(const at::Tensor& grad, const at::Tensor& out, const at::Tensor& q,
                  const at::Tensor& k, T* dq_ptr, T* dk_ptr, double lam) {
  const int64_t bh = q.size(0) * q.size(1), n = q.size(2), m = k.size(2), d = q.size(3);
  const T *g_ptr = grad.const_data_ptr<T>(), *o_ptr = out.const_data_ptr<T>();
  const T *q_ptr = q.const_data_ptr<T>(), *k_ptr = k.const_data_ptr<T>();
  const int64_t chunks = ceil_div(n, kBackwardRows);
  const bool need_dq = dq_ptr != nullptr, need_dk = dk_ptr != nullptr;
  // Partial dk per chunk [bh][chunks][m][d]; with one chunk per head the partial is dk itself.
  std::vector<T> partial(need_dk && chunks > 1 ? bh * chunks * m * d : 0);
  const Kernels<T>& kern = kernels<T>();
  const T inv_lam = T(1.0 / lam);
  at::parallel_for(0, bh * chunks, 1, [&](int64_t t0, int64_t t1) {
    std::vector<T> scratch(cpu::kScratchRows * m);
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b = t / chunks, i0 = (t % chunks) * kBackwardRows;
      const int64_t rows = std::min(kBackwardRows, n - i0), first = (b * n + i0);
      T* dk_part = !need_dk ? nullptr : chunks == 1 ? dk_ptr + b * m * d : partial.data() + t * m * d;
      kern.backward_rows(g_ptr + first * m, o_ptr + first * m, q_ptr + first * d,
                         k_ptr + b * m * d, need_dq ? dq_ptr + first * d : nullptr,
                         dk_part, rows, m, d, inv_lam, need_dq, need_dk, scratch.data());
    }
  });
  if (!need_dk || chunks == 1) return;
  const int64_t size = m * d;
  at::parallel_for(0, bh, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      T* dst = dk_ptr + b * size;
      const T* src = partial.data() + b * chunks * size;
      std::copy(src, src + size, dst);
      for (int64_t chunk = 1; chunk < chunks; ++chunk)
        for (int64_t e = 0; e < size; ++e) dst[e] += src[chunk * size + e];
    }
  });
}

// ---- bf16: the fp32 kernels on widened rows ---------------------------------------------------
// bf16 tensors are read and written as they are (no fp32 copy of a whole input or output): each
// task widens its own rows into fp32 scratch, runs the fp32 kernels and narrows its results as it
// stores them. The work split is the fp32 one, so the results do not depend on the thread count.

void widen(const at::BFloat16* src, int64_t count, float* dst) {
  for (int64_t e = 0; e < count; ++e) dst[e] = static_cast<float>(src[e]);
}

void narrow(const float* src, int64_t count, at::BFloat16* dst) {
  for (int64_t e = 0; e < count; ++e) dst[e] = static_cast<at::BFloat16>(src[e]);
}

void forward_cpu_bf16(const at::Tensor& q, const at::Tensor& k, at::Tensor& out, double lam) {
  const int64_t bh = q.size(0) * q.size(1), n = q.size(2), m = k.size(2), d = q.size(3);
  const int64_t mp = ceil_div(m, kKeyPad) * kKeyPad, tiles = ceil_div(n, kForwardRows);
  const at::BFloat16* q_ptr = q.const_data_ptr<at::BFloat16>();
  const at::BFloat16* k_ptr = k.const_data_ptr<at::BFloat16>();
  at::BFloat16* out_ptr = out.mutable_data_ptr<at::BFloat16>();
  const float scale = static_cast<float>(-1.0 / lam);
  const Kernels<float>& kern = kernels<float>();
  at::parallel_for(0, bh * tiles, 1, [&](int64_t t0, int64_t t1) {
    std::vector<float> kt(d * mp, 0.0f), q_rows(kForwardRows * d), out_rows(kForwardRows * m);
    int64_t kt_head = -1;
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b = t / tiles, i0 = (t % tiles) * kForwardRows;
      const int64_t rows = std::min(kForwardRows, n - i0);
      if (b != kt_head) {
        for (int64_t j = 0; j < m; ++j)
          for (int64_t c = 0; c < d; ++c)
            kt[c * mp + j] = static_cast<float>(k_ptr[(b * m + j) * d + c]);
        kt_head = b;
      }
      widen(q_ptr + (b * n + i0) * d, rows * d, q_rows.data());
      kern.forward_rows(q_rows.data(), kt.data(), out_rows.data(), rows, m, mp, d, scale);
      narrow(out_rows.data(), rows * m, out_ptr + (b * n + i0) * m);
    }
  });
}

void backward_cpu_bf16(const at::Tensor& grad, const at::Tensor& out, const at::Tensor& q,
                       const at::Tensor& k, at::BFloat16* dq_ptr, at::BFloat16* dk_ptr,
                       double lam) {
  const int64_t bh = q.size(0) * q.size(1), n = q.size(2), m = k.size(2), d = q.size(3);
  const at::BFloat16 *g_ptr = grad.const_data_ptr<at::BFloat16>();
  const at::BFloat16 *o_ptr = out.const_data_ptr<at::BFloat16>();
  const at::BFloat16 *q_ptr = q.const_data_ptr<at::BFloat16>();
  const at::BFloat16 *k_ptr = k.const_data_ptr<at::BFloat16>();
  const int64_t chunks = ceil_div(n, kBackwardRows);
  const bool need_dq = dq_ptr != nullptr, need_dk = dk_ptr != nullptr;
  // fp32 partial dk per chunk [bh][chunks][m][d], summed in chunk order below.
  std::vector<float> partial(need_dk ? bh * chunks * m * d : 0);
  const Kernels<float>& kern = kernels<float>();
  const float inv_lam = static_cast<float>(1.0 / lam);
  at::parallel_for(0, bh * chunks, 1, [&](int64_t t0, int64_t t1) {
    std::vector<float> scratch(cpu::kScratchRows * m), k_head(m * d);
    std::vector<float> g_rows(kBackwardRows * m), o_rows(kBackwardRows * m);
    std::vector<float> q_rows(kBackwardRows * d), dq_rows(need_dq ? kBackwardRows * d : 0);
    int64_t head = -1;
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b = t / chunks, i0 = (t % chunks) * kBackwardRows;
      const int64_t rows = std::min(kBackwardRows, n - i0), first = (b * n + i0);
      if (b != head) {
        widen(k_ptr + b * m * d, m * d, k_head.data());
        head = b;
      }
      widen(g_ptr + first * m, rows * m, g_rows.data());
      widen(o_ptr + first * m, rows * m, o_rows.data());
      widen(q_ptr + first * d, rows * d, q_rows.data());
      kern.backward_rows(g_rows.data(), o_rows.data(), q_rows.data(), k_head.data(),
                         need_dq ? dq_rows.data() : nullptr,
                         need_dk ? partial.data() + t * m * d : nullptr, rows, m, d, inv_lam,
                         need_dq, need_dk, scratch.data());
      if (need_dq) narrow(dq_rows.data(), rows * d, dq_ptr + first * d);
    }
  });
  if (!need_dk) return;
  const int64_t size = m * d;
  at::parallel_for(0, bh, 1, [&](int64_t b0, int64_t b1) {
    std::vector<float> sum(size);
    for (int64_t b = b0; b < b1; ++b) {
      const float* src = partial.data() + b * chunks * size;
      std::copy(src, src + size, sum.begin());
      for (int64_t chunk = 1; chunk < chunks; ++chunk)
        for (int64_t e = 0; e < size; ++e) sum[e] += src[chunk * size + e];
      narrow(sum.data(), size, dk_ptr + b * size);
    }
  });
}

at::Tensor laplacian_kernel_forward_cpu(const at::Tensor& q_in, const at::Tensor& k_in,
                                        double lam) {
  check_forward_args(q_in, k_in, lam);
  const at::Tensor q = q_in.contiguous(), k = k_in.contiguous();
  at::Tensor out = at::empty({q.size(0), q.size(1), q.size(2), k.size(2)}, q.options());
  if (out.numel() == 0) return out;
  if (q.scalar_type() == at::kBFloat16) {
    forward_cpu_bf16(q, k, out, lam);
    return out;
  }
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "laplacian_kernel_forward_cpu",
                             [&] { forward_cpu<scalar_t>(q, k, out, lam); });
  return out;
}

std::tuple<at::Tensor, at::Tensor> laplacian_kernel_backward_cpu(
    const at::Tensor& grad_in, const at::Tensor& q_in, const at::Tensor& k_in,
    const at::Tensor& out_in, double lam, bool need_dq, bool need_dk) {
  check_backward_args(grad_in, q_in, k_in, out_in, lam);
  const at::Tensor grad = grad_in.contiguous(), q = q_in.contiguous(), k = k_in.contiguous();
  const at::Tensor out = out_in.contiguous();
  // Every entry of dq and dk is written by the kernels unless there is nothing to sum over.
  const bool empty_sum = grad.numel() == 0 || q.size(3) == 0;
  const auto make = [&](bool need, const at::Tensor& like) {
    return !need ? at::empty({0}, like.options())
                 : empty_sum ? at::zeros_like(like) : at::empty_like(like);
  };
  at::Tensor dq = make(need_dq, q), dk = make(need_dk, k);
  if (empty_sum || (!need_dq && !need_dk)) return {dq, dk};
  if (q.scalar_type() == at::kBFloat16) {
    backward_cpu_bf16(grad, out, q, k,
                      need_dq ? dq.mutable_data_ptr<at::BFloat16>() : nullptr,
                      need_dk ? dk.mutable_data_ptr<at::BFloat16>() : nullptr, lam);
    return {dq, dk};
  }
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "laplacian_kernel_backward_cpu", [&] {
    backward_cpu<scalar_t>(grad, out, q, k, need_dq ? dq.mutable_data_ptr<scalar_t>() : nullptr,
                           need_dk ? dk.mutable_data_ptr<scalar_t>() : nullptr, lam);
  });
  return {dq, dk};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(mmlinattn, m) {
  m.def("laplacian_kernel_forward(Tensor q, Tensor k, float lam) -> Tensor");
  m.def(
      "laplacian_kernel_backward(Tensor grad_out, Tensor q, Tensor k, Tensor out, float lam, "
      "bool need_dq, bool need_dk) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(mmlinattn, CPU, m) {
  m.impl("laplacian_kernel_forward", &laplacian_kernel_forward_cpu);
  m.impl("laplacian_kernel_backward", &laplacian_kernel_backward_cpu);
}

}  // namespace mmlinattn::laplacian
