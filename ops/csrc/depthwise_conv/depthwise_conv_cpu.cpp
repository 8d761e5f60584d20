// Depthwise "same" convolution (stride 1, odd square kernel k, zero padding k/2): the CPU operators
// (fp32, fp64, bf16). The design is in docs/ops/depthwise_conv2d.md.
//
// The forward and the input gradient are depthwise convolutions themselves (the input gradient
// with the kernel flipped), which oneDNN runs fast in every dtype. oneDNN's weight gradient of a
// depthwise convolution is not (0.6 s for a 9x9 kernel on a 200x336x64 map in bf16, 50x its
// forward): here it is one pass over channels-last rows,
//   dw[c, ky, kx] = sum_{b, y, x} x[b, y + ky - k/2, x + kx - k/2, c] * g[b, y, x, c],
// vectorised across the contiguous channels and accumulated in fp32 (fp64 stays fp64). The work
// is split into fixed blocks of kRowsPerTask output rows; each block sums into its own partial
// [k, k, C] and the partials are added in block order, so the result does not depend on the
// number of threads.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <tuple>
#include <vector>

namespace mmlinattn::depthwise {
namespace {

constexpr int64_t kRowsPerTask = 8;

void check_args(const at::Tensor& x, const at::Tensor& weight) {
  TORCH_CHECK_VALUE(x.dim() == 4, "x must have 4 dimensions [B, C, H, W], got ", x.sizes());
  TORCH_CHECK_VALUE(weight.dim() == 4 && weight.size(0) == x.size(1) && weight.size(1) == 1 &&
                        weight.size(2) == weight.size(3) && weight.size(2) % 2 == 1,
                    "weight must be [C, 1, k, k] with C = x.size(1) = ", x.size(1),
                    " and k odd, got ", weight.sizes());
  TORCH_CHECK_VALUE(weight.scalar_type() == x.scalar_type(), "weight must have x's dtype ",
                    x.scalar_type(), ", got ", weight.scalar_type());
  TORCH_CHECK_VALUE(weight.device() == x.device(), "weight must be on x's device ", x.device(),
                    ", got ", weight.device());
}

// The layout of an output that follows `t` (the fake kernels in compiled.py state the same rule):
// channels-last when t is channels-last and not also plainly contiguous.
at::MemoryFormat layout_of(const at::Tensor& t) {
  return t.is_contiguous(at::MemoryFormat::ChannelsLast) && !t.is_contiguous()
             ? at::MemoryFormat::ChannelsLast
             : at::MemoryFormat::Contiguous;
}

at::Tensor conv_same(const at::Tensor& x, const at::Tensor& weight,
                     const c10::optional<at::Tensor>& bias) {
  const int64_t pad = weight.size(2) / 2;
  return at::conv2d(x, weight, bias, {1, 1}, {pad, pad}, {1, 1}, x.size(1))
      .contiguous(layout_of(x));
}

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define MMLINATTN_DW_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define MMLINATTN_DW_CLONES
#endif

constexpr int64_t kLanes = 16;  // channels per register block (one AVX-512 fp32 vector)

// sum over the columns [first, last) of x[col + shift, c] * g[col, c] for the kLanes channels
// (or `lanes` < kLanes at the end of a row) at x and g, added to acc: the sum stays in registers.
template <typename scalar_t, typename acc_t, int64_t Lanes>
inline __attribute__((always_inline)) void tap_sum(const scalar_t* x, const scalar_t* g,
                                                   acc_t* acc, int64_t first, int64_t last,
                                                   int64_t shift, int64_t channels,
                                                   int64_t lanes) {
  acc_t sum[Lanes] = {};
  for (int64_t col = first; col < last; ++col) {
    const scalar_t* xv = x + (col + shift) * channels;
    const scalar_t* gv = g + col * channels;
#pragma omp simd
    for (int64_t c = 0; c < Lanes; ++c)
      if (Lanes == kLanes || c < lanes)
        sum[c] += static_cast<acc_t>(xv[c]) * static_cast<acc_t>(gv[c]);
  }
  for (int64_t c = 0; c < (Lanes == kLanes ? Lanes : lanes); ++c) acc[c] += sum[c];
}

// The output rows [y0, y1) of image b summed into acc: the taps [k, k, C], then the bias
// gradient [C] (the sum of g). Channels-last x and g.
template <typename scalar_t, typename acc_t>
inline __attribute__((always_inline)) void weight_grad_rows_impl(
    const scalar_t* x_ptr, const scalar_t* g_ptr, acc_t* acc, int64_t b, int64_t y0, int64_t y1,
    int64_t height, int64_t width, int64_t channels, int64_t k) {
  const int64_t pad = k / 2;
  acc_t* bias_acc = acc + k * k * channels;
  for (int64_t y = y0; y < y1; ++y) {
    const scalar_t* g_row = g_ptr + (b * height + y) * width * channels;
    for (int64_t col = 0; col < width; ++col)
#pragma omp simd
      for (int64_t c = 0; c < channels; ++c)
        bias_acc[c] += static_cast<acc_t>(g_row[col * channels + c]);
    for (int64_t ky = 0; ky < k; ++ky) {
      const int64_t yy = y + ky - pad;
      if (yy < 0 || yy >= height) continue;
      const scalar_t* x_row = x_ptr + (b * height + yy) * width * channels;
      for (int64_t kx = 0; kx < k; ++kx) {
        acc_t* a = acc + (ky * k + kx) * channels;
        // the output columns whose tap kx reads inside the row: 0 <= col + kx - pad < width
        const int64_t first = std::max<int64_t>(0, pad - kx);
        const int64_t last = std::min<int64_t>(width, width + pad - kx);
        int64_t c0 = 0;
        for (; c0 + kLanes <= channels; c0 += kLanes)
          tap_sum<scalar_t, acc_t, kLanes>(x_row + c0, g_row + c0, a + c0, first, last,
                                           kx - pad, channels, kLanes);
        if (c0 < channels)
          tap_sum<scalar_t, acc_t, kLanes - 1>(x_row + c0, g_row + c0, a + c0, first, last,
                                               kx - pad, channels, channels - c0);
      }
    }
  }
}

// One overload per dtype, each compiled for AVX-512, AVX2 and baseline x86-64 (picked at load
// time): the channel loop is the vector loop.
#define MMLINATTN_DW_ROWS(scalar_t, acc_t)                                                        \
  MMLINATTN_DW_CLONES void weight_grad_rows(const scalar_t* x_ptr, const scalar_t* g_ptr,         \
                                            acc_t* acc, int64_t b, int64_t y0, int64_t y1,        \
                                            int64_t height, int64_t width, int64_t channels,      \
                                            int64_t k) {                                          \
    weight_grad_rows_impl<scalar_t, acc_t>(x_ptr, g_ptr, acc, b, y0, y1, height, width, channels, \
                                           k);                                                    \
  }
MMLINATTN_DW_ROWS(float, float)
MMLINATTN_DW_ROWS(double, double)
MMLINATTN_DW_ROWS(c10::BFloat16, float)
#undef MMLINATTN_DW_ROWS

template <typename scalar_t>
void weight_grad_cpu(const at::Tensor& grad, const at::Tensor& x, at::Tensor& dw,
                     at::Tensor& dbias) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t batch = x.size(0), channels = x.size(1), height = x.size(2), width = x.size(3);
  const int64_t k = dw.size(2), taps = k * k * channels, sums = taps + channels;
  // Channels-last [B, H, W, C] views of the data (the caller made them channels-last).
  const scalar_t* x_ptr = x.const_data_ptr<scalar_t>();
  const scalar_t* g_ptr = grad.const_data_ptr<scalar_t>();
  const int64_t blocks = (height + kRowsPerTask - 1) / kRowsPerTask, tasks = batch * blocks;
  std::vector<acc_t> partial(tasks * sums, acc_t(0));
  at::parallel_for(0, tasks, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b = t / blocks, y0 = (t % blocks) * kRowsPerTask;
      weight_grad_rows(x_ptr, g_ptr, partial.data() + t * sums, b, y0,
                       std::min(height, y0 + kRowsPerTask), height, width, channels, k);
    }
  });
  // Sum the partials in block order into [k, k, C] + [C], then lay them out as the weight
  // [C, 1, k, k] and the bias [C].
  std::vector<acc_t> total(sums, acc_t(0));
  for (int64_t t = 0; t < tasks; ++t) {
    const acc_t* src = partial.data() + t * sums;
    for (int64_t e = 0; e < sums; ++e) total[e] += src[e];
  }
  scalar_t* dw_ptr = dw.mutable_data_ptr<scalar_t>();
  for (int64_t c = 0; c < channels; ++c)
    for (int64_t tap = 0; tap < k * k; ++tap)
      dw_ptr[c * k * k + tap] = static_cast<scalar_t>(total[tap * channels + c]);
  if (dbias.defined()) {
    scalar_t* db_ptr = dbias.mutable_data_ptr<scalar_t>();
    for (int64_t c = 0; c < channels; ++c) db_ptr[c] = static_cast<scalar_t>(total[taps + c]);
  }
}

at::Tensor depthwise_conv2d_forward_cpu(const at::Tensor& x, const at::Tensor& weight,
                                        const c10::optional<at::Tensor>& bias) {
  check_args(x, weight);
  return conv_same(x, weight, bias);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> depthwise_conv2d_backward_cpu(
    const at::Tensor& grad_in, const at::Tensor& x_in, const at::Tensor& weight, bool need_dx,
    bool need_dw, bool need_dbias) {
  check_args(x_in, weight);
  TORCH_CHECK_VALUE(grad_in.sizes() == x_in.sizes(), "grad_out must have x's shape ",
                    x_in.sizes(), ", got ", grad_in.sizes());
  TORCH_CHECK_VALUE(grad_in.scalar_type() == x_in.scalar_type(), "grad_out must have x's dtype ",
                    x_in.scalar_type(), ", got ", grad_in.scalar_type());
  const auto empty = [&]() { return at::empty({0}, x_in.options()); };
  at::Tensor dx = need_dx ? conv_same(grad_in, weight.flip({2, 3}), c10::nullopt) : empty();
  at::Tensor dw = need_dw ? at::zeros_like(weight, at::MemoryFormat::Contiguous) : empty();
  at::Tensor dbias = need_dbias ? at::zeros({x_in.size(1)}, x_in.options()) : empty();
  if (need_dw && grad_in.numel() > 0) {
    // One pass gives both: the bias gradient is a row sum of g, which is in cache anyway.
    const at::Tensor grad = grad_in.contiguous(at::MemoryFormat::ChannelsLast);
    const at::Tensor x = x_in.contiguous(at::MemoryFormat::ChannelsLast);
    at::Tensor db_out = need_dbias ? dbias : at::Tensor();
    AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, x.scalar_type(), "depthwise_conv2d_backward_cpu",
                                   [&] { weight_grad_cpu<scalar_t>(grad, x, dw, db_out); });
  } else if (need_dbias) {
    dbias = grad_in.sum({0, 2, 3});
  }
  return {dx, dw, dbias};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(mmlinattn, m) {
  m.def("depthwise_conv2d_forward(Tensor x, Tensor weight, Tensor? bias) -> Tensor");
  m.def(
      "depthwise_conv2d_backward(Tensor grad_out, Tensor x, Tensor weight, bool need_dx, "
      "bool need_dweight, bool need_dbias) -> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(mmlinattn, CPU, m) {
  m.impl("depthwise_conv2d_forward", &depthwise_conv2d_forward_cpu);
  m.impl("depthwise_conv2d_backward", &depthwise_conv2d_backward_cpu);
}

}  // namespace mmlinattn::depthwise
