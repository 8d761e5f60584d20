// RoIAlign with average pooling (mmcv's RoIAlign with pool_mode='avg', torchvision's roi_align):
// the CPU operators (fp32, fp64, bf16). The design is in docs/ops/roi_align.md.
//
// Output bin (py, px) of roi k averages gh x gw bilinear samples of channel c,
//   out[k, c, py, px] = 1 / (gh gw) sum_{iy, ix} sum_{4 taps t} wy_t(iy) wx_t(ix) in[b, c, y_t, x_t],
// and the weights are separable: a sample's row taps depend on (py, iy) only and its column taps
// on (px, ix) only (a sample outside [-1, H] x [-1, W] has weight 0). So one roi's weights are
// ph * gh row entries and pw * gw column entries. The map is read channels-last: every tap is a
// vector of contiguous channels (the vector loop), accumulated in fp32 (fp64 stays fp64).
//
// The forward runs rois in parallel. The backward runs blocks of channels in parallel; each adds
// its channels of every roi into the gradient in roi order, so no two threads write one element
// and the result does not depend on the number of threads. It needs the rois only, not the map.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace mmlinattn::roi_align {
namespace {

// The most samples per bin side with sampling_ratio = 0 (ceil(bin size)): a bin that spans more
// feature-map pixels is an error, not a loop that never ends.
constexpr int64_t kMaxGrid = 1 << 12;

// A sample's two neighbours along one axis: their offsets (index * stride) and weights.
template <typename acc_t>
struct AxisTap {
  int64_t low = 0, high = 0;
  acc_t w_low = 0, w_high = 0;
};

template <typename acc_t>
struct RoiGeometry {
  int64_t batch;
  acc_t start_y, start_x, bin_h, bin_w;
  int64_t grid_h, grid_w;
  acc_t count;  // max(grid_h * grid_w, 1)
};

struct Params {
  int64_t pooled_h, pooled_w, sampling_ratio;
  double spatial_scale;
  bool aligned;
};

template <typename acc_t>
int64_t grid_size(acc_t roi_size, int64_t bins, int64_t sampling_ratio, int64_t k) {
  if (sampling_ratio > 0) return sampling_ratio;
  const acc_t n = std::ceil(roi_size / static_cast<acc_t>(bins));
  if (!(n > 0)) return 0;  // an empty or inverted roi (or NaN): no samples, output 0
  TORCH_CHECK_VALUE(n <= kMaxGrid, "rois[", k, "] spans ", roi_size,
                    " feature-map pixels per side: with sampling_ratio=0 a bin takes at most ",
                    kMaxGrid, " samples per side; pass a positive sampling_ratio");
  return static_cast<int64_t>(n);
}

// mmcv's roi_align_forward_cpu geometry: the roi in feature-map pixels (shifted by half a pixel
// when aligned), its bin sizes and sampling grid.
template <typename acc_t>
RoiGeometry<acc_t> roi_geometry(const acc_t* roi, const Params& p, int64_t k) {
  const acc_t scale = static_cast<acc_t>(p.spatial_scale);
  const acc_t offset = p.aligned ? acc_t(0.5) : acc_t(0);
  RoiGeometry<acc_t> g;
  g.batch = static_cast<int64_t>(roi[0]);
  g.start_x = roi[1] * scale - offset;
  g.start_y = roi[2] * scale - offset;
  acc_t roi_w = roi[3] * scale - offset - g.start_x;
  acc_t roi_h = roi[4] * scale - offset - g.start_y;
  if (!p.aligned) {  // legacy mode: rois at least one pixel wide
    roi_w = std::max(roi_w, acc_t(1));
    roi_h = std::max(roi_h, acc_t(1));
  }
  g.bin_h = roi_h / static_cast<acc_t>(p.pooled_h);
  g.bin_w = roi_w / static_cast<acc_t>(p.pooled_w);
  g.grid_h = grid_size(roi_h, p.pooled_h, p.sampling_ratio, k);
  g.grid_w = grid_size(roi_w, p.pooled_w, p.sampling_ratio, k);
  g.count = static_cast<acc_t>(std::max<int64_t>(g.grid_h * g.grid_w, 1));
  return g;
}

// The taps of sample i of bin b along an axis of `size` pixels, for every (b, i):
// coordinate start + b * bin + (i + 0.5) * bin / grid, clamped as mmcv's bilinear_interpolate.
template <typename acc_t>
void axis_taps(acc_t start, acc_t bin, int64_t bins, int64_t grid, int64_t size, int64_t stride,
               std::vector<AxisTap<acc_t>>& taps) {
  taps.assign(bins * grid, AxisTap<acc_t>());
  for (int64_t b = 0; b < bins; ++b)
    for (int64_t i = 0; i < grid; ++i) {
      acc_t v = start + static_cast<acc_t>(b) * bin +
                static_cast<acc_t>(i + 0.5) * bin / static_cast<acc_t>(grid);
      if (!(v >= acc_t(-1) && v <= static_cast<acc_t>(size))) continue;  // outside (or NaN): 0
      if (v <= 0) v = 0;
      int64_t low = static_cast<int64_t>(v), high;
      if (low >= size - 1) {
        low = high = size - 1;
        v = static_cast<acc_t>(low);
      } else {
        high = low + 1;
      }
      const acc_t frac = v - static_cast<acc_t>(low);
      taps[b * grid + i] = {low * stride, high * stride, acc_t(1) - frac, frac};
    }
}

// The four bilinear corners of the sample at row taps ty and column taps tx: their pixel indices
// (row * W + col) and weights, in mmcv's order (low/low, low/high, high/low, high/high).
template <typename acc_t>
struct Corners {
  int64_t pixel[4];
  acc_t weight[4];
};

template <typename acc_t>
inline __attribute__((always_inline)) Corners<acc_t> corners(const AxisTap<acc_t>& ty,
                                                             const AxisTap<acc_t>& tx) {
  return {{ty.low + tx.low, ty.low + tx.high, ty.high + tx.low, ty.high + tx.high},
          {ty.w_low * tx.w_low, ty.w_low * tx.w_high, ty.w_high * tx.w_low, ty.w_high * tx.w_high}};
}

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define MMLINATTN_ROI_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define MMLINATTN_ROI_CLONES
#endif

// One roi's output [C, ph, pw] from its image's channels-last map [H, W, C]; acc holds C values.
template <typename scalar_t, typename acc_t>
inline __attribute__((always_inline)) void forward_roi_impl(
    const scalar_t* map, scalar_t* out, acc_t* acc, const AxisTap<acc_t>* ys,
    const AxisTap<acc_t>* xs, int64_t grid_h, int64_t grid_w, acc_t count, int64_t pooled_h,
    int64_t pooled_w, int64_t channels) {
  const int64_t bins = pooled_h * pooled_w;
  for (int64_t py = 0; py < pooled_h; ++py)
    for (int64_t px = 0; px < pooled_w; ++px) {
      std::fill(acc, acc + channels, acc_t(0));
      for (int64_t iy = 0; iy < grid_h; ++iy) {
        const AxisTap<acc_t>& ty = ys[py * grid_h + iy];
        for (int64_t ix = 0; ix < grid_w; ++ix) {
          const Corners<acc_t> k = corners(ty, xs[px * grid_w + ix]);
          const scalar_t* p1 = map + k.pixel[0] * channels;
          const scalar_t* p2 = map + k.pixel[1] * channels;
          const scalar_t* p3 = map + k.pixel[2] * channels;
          const scalar_t* p4 = map + k.pixel[3] * channels;
          const acc_t w1 = k.weight[0], w2 = k.weight[1], w3 = k.weight[2], w4 = k.weight[3];
#pragma omp simd
          for (int64_t c = 0; c < channels; ++c)
            acc[c] += w1 * static_cast<acc_t>(p1[c]) + w2 * static_cast<acc_t>(p2[c]) +
                      w3 * static_cast<acc_t>(p3[c]) + w4 * static_cast<acc_t>(p4[c]);
        }
      }
      scalar_t* o = out + py * pooled_w + px;
      for (int64_t c = 0; c < channels; ++c) o[c * bins] = static_cast<scalar_t>(acc[c] / count);
    }
}

// One roi's gradient for the channels [c0, c0 + lanes): grad_out [C, ph, pw] of the roi, added
// into its image's channels-last gradient [H, W, C] (fp32 for bf16); g holds `lanes` values.
template <typename scalar_t, typename acc_t>
inline __attribute__((always_inline)) void backward_roi_impl(
    const scalar_t* grad_out, acc_t* grad_map, acc_t* g, const AxisTap<acc_t>* ys,
    const AxisTap<acc_t>* xs, int64_t grid_h, int64_t grid_w, acc_t count, int64_t pooled_h,
    int64_t pooled_w, int64_t channels, int64_t c0, int64_t lanes) {
  const int64_t bins = pooled_h * pooled_w;
  for (int64_t py = 0; py < pooled_h; ++py)
    for (int64_t px = 0; px < pooled_w; ++px) {
      const scalar_t* go = grad_out + c0 * bins + py * pooled_w + px;
      for (int64_t c = 0; c < lanes; ++c) g[c] = static_cast<acc_t>(go[c * bins]) / count;
      for (int64_t iy = 0; iy < grid_h; ++iy) {
        const AxisTap<acc_t>& ty = ys[py * grid_h + iy];
        for (int64_t ix = 0; ix < grid_w; ++ix) {
          const Corners<acc_t> k = corners(ty, xs[px * grid_w + ix]);
          // the four corners may be one pixel (a clamped sample): one after the other, not fused
          for (int corner = 0; corner < 4; ++corner) {
            acc_t* p = grad_map + k.pixel[corner] * channels + c0;
            const acc_t w = k.weight[corner];
#pragma omp simd
            for (int64_t c = 0; c < lanes; ++c) p[c] += w * g[c];
          }
        }
      }
    }
}

// One overload per dtype, each compiled for AVX-512, AVX2 and baseline x86-64 (picked at load
// time): the channel loop is the vector loop.
#define MMLINATTN_ROI_KERNELS(scalar_t, acc_t)                                                    \
  MMLINATTN_ROI_CLONES void forward_roi(                                                          \
      const scalar_t* map, scalar_t* out, acc_t* acc, const AxisTap<acc_t>* ys,                   \
      const AxisTap<acc_t>* xs, int64_t grid_h, int64_t grid_w, acc_t count, int64_t pooled_h,    \
      int64_t pooled_w, int64_t channels) {                                                       \
    forward_roi_impl<scalar_t, acc_t>(map, out, acc, ys, xs, grid_h, grid_w, count, pooled_h,     \
                                      pooled_w, channels);                                        \
  }                                                                                               \
  MMLINATTN_ROI_CLONES void backward_roi(                                                         \
      const scalar_t* grad_out, acc_t* grad_map, acc_t* g, const AxisTap<acc_t>* ys,             \
      const AxisTap<acc_t>* xs, int64_t grid_h, int64_t grid_w, acc_t count, int64_t pooled_h,    \
      int64_t pooled_w, int64_t channels, int64_t c0, int64_t lanes) {                            \
    backward_roi_impl<scalar_t, acc_t>(grad_out, grad_map, g, ys, xs, grid_h, grid_w, count,      \
                                       pooled_h, pooled_w, channels, c0, lanes);                  \
  }
MMLINATTN_ROI_KERNELS(float, float)
MMLINATTN_ROI_KERNELS(double, double)
MMLINATTN_ROI_KERNELS(c10::BFloat16, float)
#undef MMLINATTN_ROI_KERNELS

void check_params(const Params& p) {
  TORCH_CHECK_VALUE(p.pooled_h > 0 && p.pooled_w > 0,
                    "output_size must be positive, got (", p.pooled_h, ", ", p.pooled_w, ")");
  TORCH_CHECK_VALUE(p.sampling_ratio >= 0, "sampling_ratio must be >= 0 (0: adaptive), got ",
                    p.sampling_ratio);
  TORCH_CHECK_VALUE(std::isfinite(p.spatial_scale) && p.spatial_scale > 0,
                    "spatial_scale must be a positive finite number, got ", p.spatial_scale);
}

// The rois as [K, 5] in the compute dtype (fp64 for an fp64 map, fp32 otherwise), each batch
// index checked against the map's batch size (the kernels index with it).
at::Tensor checked_rois(const at::Tensor& rois, at::ScalarType map_dtype, int64_t batch) {
  TORCH_CHECK_VALUE(rois.dim() == 2 && rois.size(1) == 5,
                    "rois must be [K, 5] (batch index, x1, y1, x2, y2), got ", rois.sizes());
  TORCH_CHECK_VALUE(at::isFloatingType(rois.scalar_type()),
                    "rois must be floating point, got ", rois.scalar_type());
  const at::ScalarType acc = map_dtype == at::kDouble ? at::kDouble : at::kFloat;
  at::Tensor out = rois.to(acc).contiguous();
  AT_DISPATCH_FLOATING_TYPES(acc, "roi_align_rois", [&] {
    const scalar_t* r = out.const_data_ptr<scalar_t>();
    for (int64_t k = 0; k < out.size(0); ++k)
      TORCH_CHECK_INDEX(r[k * 5] >= 0 && r[k * 5] < static_cast<scalar_t>(batch), "rois[", k,
                        ", 0] must be a batch index in [0, ", batch, "), got ", r[k * 5]);
  });
  return out;
}

at::Tensor roi_align_forward_cpu(const at::Tensor& input, const at::Tensor& rois_in,
                                 int64_t pooled_h, int64_t pooled_w, double spatial_scale,
                                 int64_t sampling_ratio, bool aligned) {
  TORCH_CHECK_VALUE(input.dim() == 4, "input must be [B, C, H, W], got ", input.sizes());
  const Params p{pooled_h, pooled_w, sampling_ratio, spatial_scale, aligned};
  check_params(p);
  const int64_t batch = input.size(0), channels = input.size(1);
  const int64_t height = input.size(2), width = input.size(3);
  const at::Tensor rois = checked_rois(rois_in, input.scalar_type(), batch);
  const int64_t num_rois = rois.size(0);
  const std::vector<int64_t> out_size{num_rois, channels, pooled_h, pooled_w};
  // every sample of an empty map is outside it
  if (num_rois == 0 || channels == 0 || height == 0 || width == 0)
    return at::zeros(out_size, input.options());
  at::Tensor out = at::empty(out_size, input.options());
  const at::Tensor map = input.contiguous(at::MemoryFormat::ChannelsLast);
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, input.scalar_type(), "roi_align_forward_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* map_ptr = map.const_data_ptr<scalar_t>();
    const acc_t* roi_ptr = rois.const_data_ptr<acc_t>();
    scalar_t* out_ptr = out.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, num_rois, 1, [&](int64_t k0, int64_t k1) {
      std::vector<AxisTap<acc_t>> ys, xs;
      std::vector<acc_t> acc(channels);
      for (int64_t k = k0; k < k1; ++k) {
        const RoiGeometry<acc_t> g = roi_geometry(roi_ptr + k * 5, p, k);
        axis_taps(g.start_y, g.bin_h, pooled_h, g.grid_h, height, width, ys);
        axis_taps(g.start_x, g.bin_w, pooled_w, g.grid_w, width, int64_t(1), xs);
        forward_roi(map_ptr + g.batch * height * width * channels,
                    out_ptr + k * channels * pooled_h * pooled_w, acc.data(), ys.data(),
                    xs.data(), g.grid_h, g.grid_w, g.count, pooled_h, pooled_w, channels);
      }
    });
  });
  return out;
}

// Channels per backward task: the widest of 64 / 32 / 16 that still gives every thread a task.
int64_t channel_block(int64_t channels) {
  int64_t block = 64;
  while (block > 16 && (channels + block - 1) / block < at::get_num_threads()) block /= 2;
  return block;
}

at::Tensor roi_align_backward_cpu(const at::Tensor& grad_in, const at::Tensor& rois_in,
                                  c10::IntArrayRef input_size, double spatial_scale,
                                  int64_t sampling_ratio, bool aligned) {
  TORCH_CHECK_VALUE(grad_in.dim() == 4, "grad_out must be [K, C, ph, pw], got ", grad_in.sizes());
  TORCH_CHECK_VALUE(input_size.size() == 4, "input_size must be [B, C, H, W], got ", input_size);
  const int64_t batch = input_size[0], channels = input_size[1];
  const int64_t height = input_size[2], width = input_size[3];
  const Params p{grad_in.size(2), grad_in.size(3), sampling_ratio, spatial_scale, aligned};
  check_params(p);
  const at::Tensor rois = checked_rois(rois_in, grad_in.scalar_type(), batch);
  const int64_t num_rois = rois.size(0);
  TORCH_CHECK_VALUE(grad_in.size(0) == num_rois && grad_in.size(1) == channels,
                    "grad_out must be [K, C, ph, pw] with K = ", num_rois, " rois and C = ",
                    channels, ", got ", grad_in.sizes());
  const at::ScalarType dtype = grad_in.scalar_type();
  const at::ScalarType acc_dtype = dtype == at::kDouble ? at::kDouble : at::kFloat;
  // [B, H, W, C] sums in the compute dtype, returned as a [B, C, H, W] tensor of grad_out's dtype
  at::Tensor grad_map = at::zeros({batch, height, width, channels},
                                  grad_in.options().dtype(acc_dtype));
  if (num_rois > 0 && channels > 0 && height > 0 && width > 0) {
    const at::Tensor grad_out = grad_in.contiguous();
    const int64_t block = channel_block(channels);
    const int64_t tasks = (channels + block - 1) / block;
    AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, dtype, "roi_align_backward_cpu", [&] {
      using acc_t = at::opmath_type<scalar_t>;
      const scalar_t* go_ptr = grad_out.const_data_ptr<scalar_t>();
      const acc_t* roi_ptr = rois.const_data_ptr<acc_t>();
      acc_t* map_ptr = grad_map.mutable_data_ptr<acc_t>();
      const int64_t roi_stride = channels * p.pooled_h * p.pooled_w;
      at::parallel_for(0, tasks, 1, [&](int64_t t0, int64_t t1) {
        std::vector<AxisTap<acc_t>> ys, xs;
        std::vector<acc_t> g(block);
        for (int64_t t = t0; t < t1; ++t) {
          const int64_t c0 = t * block, lanes = std::min(block, channels - c0);
          for (int64_t k = 0; k < num_rois; ++k) {
            const RoiGeometry<acc_t> geo = roi_geometry(roi_ptr + k * 5, p, k);
            axis_taps(geo.start_y, geo.bin_h, p.pooled_h, geo.grid_h, height, width, ys);
            axis_taps(geo.start_x, geo.bin_w, p.pooled_w, geo.grid_w, width, int64_t(1), xs);
            backward_roi(go_ptr + k * roi_stride,
                         map_ptr + geo.batch * height * width * channels, g.data(), ys.data(),
                         xs.data(), geo.grid_h, geo.grid_w, geo.count, p.pooled_h, p.pooled_w,
                         channels, c0, lanes);
          }
        }
      });
    });
  }
  return grad_map.permute({0, 3, 1, 2}).to(dtype, /*non_blocking=*/false, /*copy=*/false,
                                            at::MemoryFormat::Contiguous);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(mmlinattn, m) {
  m.def(
      "roi_align_forward(Tensor input, Tensor rois, int pooled_height, int pooled_width, "
      "float spatial_scale, int sampling_ratio, bool aligned) -> Tensor");
  m.def(
      "roi_align_backward(Tensor grad_out, Tensor rois, SymInt[] input_size, float spatial_scale, "
      "int sampling_ratio, bool aligned) -> Tensor");
}

TORCH_LIBRARY_IMPL(mmlinattn, CPU, m) {
  m.impl("roi_align_forward", &roi_align_forward_cpu);
  m.impl("roi_align_backward", &roi_align_backward_cpu);
}

}  // namespace mmlinattn::roi_align
