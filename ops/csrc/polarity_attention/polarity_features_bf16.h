// The polarity features of one chunk of bf16 rows with AVX-512: the bf16 counterparts of the CPU
// kernel's fill_features and feature_backward (polarity_attention_cpu.cpp), same layouts, fp32
// results. bf16 values are passed as their bits (uint16_t), so that this interface needs no
// library header. Where bf16_features_vectorised() is false the CPU kernel uses its exact loops
// (std::pow, std::log), as it always does in fp32 and fp64.
#pragma once

#include <cstdint>

namespace mmlinattn::polarity {

// Whether this build and this CPU run the functions below (x86-64 with AVX-512 F, BW, VL, DQ).
bool bf16_features_vectorised();

// feat [tokens, 2d] = phi(x) of x [tokens, d]: |x_tc|^p_c at column c (x > 0) or c + d (x < 0).
void bf16_features(const uint16_t* x, const float* p, int64_t tokens, int64_t d, float* feat);

// Given feat and feat_grad = dL/dphi [tokens, 2d]: dx = sign(x) p |x|^(p-1) g and
// dpower_c += g |x|^p log|x|, g the entry of feat_grad at x's column; x = 0 contributes nothing.
void bf16_feature_backward(const uint16_t* x, const float* p, const float* feat,
                           const float* feat_grad, int64_t tokens, int64_t d, uint16_t* dx,
                           float* dpower);

}  // namespace mmlinattn::polarity
