// onnxruntime custom op library of mmlinattn: the operator mmlinattn::LaplacianKernel (CPU, fp32),
// out[b,h,i,j] = exp(-sum_c |q[b,h,i,c] - k[b,h,j,c]| / lambda), q [B,H,N,D], k [B,H,M,D].
// The kernels are the torch operator's (ops/csrc/laplacian_kernel: the same row kernels and
// forward work split, so the same results), run on onnxruntime's intra-op thread pool.
// Built against the onnxruntime C API of version ORT_API_VERSION; it loads into that release and
// every later one (the C API only grows). Loaded with
// SessionOptions.register_custom_ops_library(path); mmlinattn/deploy/onnxruntime.py finds it.
#define ORT_API_MANUAL_INIT
#include <onnxruntime_cxx_api.h>
#include <onnxruntime_lite_custom_op.h>
#undef ORT_API_MANUAL_INIT

#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "laplacian_kernel/laplacian_kernel_cpu.h"

namespace {

namespace lap = mmlinattn::laplacian::cpu;

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

struct LaplacianKernelOp {
  LaplacianKernelOp(const OrtApi* /*api*/, const OrtKernelInfo* info) {
    lambda_ = Ort::ConstKernelInfo(info).GetAttribute<float>("lambda");
  }

  Ort::Status Compute(OrtKernelContext* context, const Ort::Custom::Tensor<float>& q,
                      const Ort::Custom::Tensor<float>& k, Ort::Custom::Tensor<float>& out) {
    const std::vector<int64_t>& qs = q.Shape();
    const std::vector<int64_t>& ks = k.Shape();
    if (!(lambda_ > 0.0f && std::isfinite(lambda_)))
      return Ort::Status(("LaplacianKernel: attribute lambda must be a positive finite number, got " +
                          std::to_string(lambda_)).c_str(), ORT_INVALID_ARGUMENT);
    if (qs.size() != 4 || ks.size() != 4)
      return Ort::Status(("LaplacianKernel: q and k must have 4 dimensions [B,H,N,D] and [B,H,M,D], got " +
                          shape_str(qs) + " and " + shape_str(ks)).c_str(), ORT_INVALID_ARGUMENT);
    if (qs[0] != ks[0] || qs[1] != ks[1] || qs[3] != ks[3])
      return Ort::Status(("LaplacianKernel: q and k must have the same batch, heads and head dim, got " +
                          shape_str(qs) + " and " + shape_str(ks)).c_str(), ORT_INVALID_ARGUMENT);
    const int64_t bh = qs[0] * qs[1], n = qs[2], m = ks[2], d = qs[3];
    float* out_ptr = out.Allocate({qs[0], qs[1], n, m});
    if (bh * n * m == 0) return Ort::Status{nullptr};
    static const lap::Kernels<float> kernels = lap::select_kernels<float>(lap::cpu_has_avx512());
    Ort::KernelContext ctx(context);
    lap::forward_tasks(kernels, q.Data(), k.Data(), out_ptr, bh, n, m, d, -1.0f / lambda_,
                       [&ctx](int64_t begin, int64_t end, const auto& fn) {
                         run_tasks(ctx, begin, end, fn);
                       });
    return Ort::Status{nullptr};
  }

  // fn(t, t + 1) for every task t in [begin, end) on onnxruntime's intra-op threads.
  template <typename Fn>
  static void run_tasks(Ort::KernelContext& ctx, int64_t begin, int64_t end, const Fn& fn) {
    struct Tasks {
      int64_t begin;
      const Fn* fn;
    } tasks{begin, &fn};
    ctx.ParallelFor(
        [](void* data, size_t i) {
          const auto* t = static_cast<const Tasks*>(data);
          const int64_t task = t->begin + static_cast<int64_t>(i);
          (*t->fn)(task, task + 1);
        },
        static_cast<size_t>(end - begin), 0, &tasks);
  }

  float lambda_;
};

}  // namespace

extern "C" __attribute__((visibility("default"))) OrtStatus* ORT_API_CALL
RegisterCustomOps(OrtSessionOptions* options, const OrtApiBase* api_base) {
  const OrtApi* api = api_base->GetApi(ORT_API_VERSION);
  if (api == nullptr)  // an onnxruntime older than these headers; version 1's API can say so
    return api_base->GetApi(1)->CreateStatus(
        ORT_FAIL, ("the mmlinattn onnxruntime ops need onnxruntime with C API version >= " +
                   std::to_string(ORT_API_VERSION) + ", this one is " +
                   api_base->GetVersionString()).c_str());
  Ort::InitApi(api);
  static std::once_flag once;
  static std::unique_ptr<Ort::CustomOpDomain> domain;
  static std::unique_ptr<Ort::Custom::OrtLiteCustomOp> laplacian;
  try {
    std::call_once(once, [] {
      domain = std::make_unique<Ort::CustomOpDomain>("mmlinattn");
      laplacian.reset(Ort::Custom::CreateLiteCustomOp<LaplacianKernelOp>("LaplacianKernel",
                                                                         "CPUExecutionProvider"));
      domain->Add(laplacian.get());
    });
    Ort::UnownedSessionOptions(options).Add(*domain);
  } catch (const Ort::Exception& e) {
    return api->CreateStatus(e.GetOrtErrorCode(), e.what());
  }
  return nullptr;
}
