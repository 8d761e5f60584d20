// The CPU's limit for laplacian_kernel, measured: the inner loops of the AVX-512 kernels
// (ops/csrc/laplacian_kernel/laplacian_kernel_avx512.cpp) on data that stays in L1, with no
// output, no exp and no loop bookkeeping beyond the kernels' own, on every OpenMP thread.
//   forward  : per channel, 4 query rows x 2 key vectors: |q - k| accumulated (sub, abs, fma)
//   backward : per channel vector, 4 rows x 4 keys: s = g sign(q - k); dq -= s; dk += s
//   fma      : 12 independent fp32 FMA chains in registers, the arithmetic peak (the ceiling of
//              any product-based kernel, e.g. the Newton-Schulz steps)
// Prints one JSON line: element-ops per second (one |q_ic - k_jc| term; the backward counts its
// dq and dk terms, 2 per pair and channel) for the forward, the backward, fp32 flops per second
// (an FMA = 2) for the FMA peak, and the thread count.
// Built and run by tools/benchmarks/ops_laplacian.py (g++ -O3 -march=native -fopenmp).
#include <immintrin.h>
#include <omp.h>

#include <chrono>
#include <cstdio>

#ifndef __AVX512F__
int main() {
  std::printf("{\"error\": \"this CPU (or compiler) has no AVX-512\"}\n");
  return 0;
}
#else
constexpr int kChannels = 32, kRepeats = 200000;

double forward_rate() {
  alignas(64) float q[4][kChannels], kt[kChannels][32];
  for (int c = 0; c < kChannels; ++c) {
    for (int r = 0; r < 4; ++r) q[r][c] = 0.01f * (r + c);
    for (int j = 0; j < 32; ++j) kt[c][j] = 0.02f * (j - c);
  }
  __m512 acc[4][2];
  for (auto& row : acc)
    for (auto& a : row) a = _mm512_setzero_ps();
  const __m512 one = _mm512_set1_ps(1.f);
  const auto start = std::chrono::steady_clock::now();
  for (int rep = 0; rep < kRepeats; ++rep)
    for (int c = 0; c < kChannels; ++c) {
      const __m512 k0 = _mm512_load_ps(&kt[c][0]), k1 = _mm512_load_ps(&kt[c][16]);
      for (int r = 0; r < 4; ++r) {
        const __m512 qb = _mm512_set1_ps(q[r][c]);
        acc[r][0] = _mm512_fmadd_ps(_mm512_abs_ps(_mm512_sub_ps(qb, k0)), one, acc[r][0]);
        acc[r][1] = _mm512_fmadd_ps(_mm512_abs_ps(_mm512_sub_ps(qb, k1)), one, acc[r][1]);
      }
      asm volatile("" ::: "memory");  // keep every load
    }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  float sink = 0;
  for (auto& row : acc)
    for (auto& a : row) sink += _mm512_reduce_add_ps(a);
  if (sink == 1.2345f) std::printf(" ");
  return double(kRepeats) * kChannels * 4 * 32 / seconds;
}

double backward_rate() {
  alignas(64) float q[4][kChannels], k[4][kChannels], g[4][4];
  for (int c = 0; c < kChannels; ++c)
    for (int r = 0; r < 4; ++r) q[r][c] = 0.01f * (r + c), k[r][c] = 0.02f * (r - c);
  for (int r = 0; r < 4; ++r)
    for (int u = 0; u < 4; ++u) g[r][u] = 1e-7f * (r - u);
  const __m512i table = _mm512_set1_epi32((2 << 0) | (2 << 4) | (8 << 8) | (10 << 12) | (9 << 16) |
                                          (10 << 20) | (9 << 24) | (10 << 28));
  __m512 dq[4][2], dk[4][2];
  for (int r = 0; r < 4; ++r)
    for (int v = 0; v < 2; ++v) dq[r][v] = dk[r][v] = _mm512_setzero_ps();
  const auto start = std::chrono::steady_clock::now();
  for (int rep = 0; rep < kRepeats; ++rep) {
    for (int r = 0; r < 4; ++r)
      for (int u = 0; u < 4; ++u) {
        const __m512 gb = _mm512_set1_ps(g[r][u]);
        for (int v = 0; v < 2; ++v) {
          const __m512 d = _mm512_sub_ps(_mm512_load_ps(&q[r][16 * v]), _mm512_load_ps(&k[u][16 * v]));
          const __m512 s = _mm512_fixupimm_ps(d, d, table, 0);
          dq[r][v] = _mm512_fnmadd_ps(s, gb, dq[r][v]);
          dk[u][v] = _mm512_fmadd_ps(s, gb, dk[u][v]);
        }
      }
    asm volatile("" ::: "memory");
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  float sink = 0;
  for (int r = 0; r < 4; ++r)
    for (int v = 0; v < 2; ++v) sink += _mm512_reduce_add_ps(dq[r][v]) + _mm512_reduce_add_ps(dk[r][v]);
  if (sink == 1.2345f) std::printf(" ");
  return double(kRepeats) * 4 * 4 * 32 * 2 / seconds;  // dq and dk terms
}

double fma_rate() {
  constexpr int kChains = 12;
  __m512 acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm512_set1_ps(1.f + 1e-7f * i);
  const __m512 b = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
  const auto start = std::chrono::steady_clock::now();
  for (int rep = 0; rep < 64 * kRepeats; ++rep)
    for (int i = 0; i < kChains; ++i) acc[i] = _mm512_fmadd_ps(acc[i], b, c);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  float sink = 0;
  for (auto& a : acc) sink += _mm512_reduce_add_ps(a);
  if (sink == 1.2345f) std::printf(" ");
  return 64.0 * kRepeats * kChains * 16 * 2 / seconds;
}

int main() {
  double forward = 0, backward = 0, fma = 0;
  int threads = 1;
#pragma omp parallel reduction(+ : forward, backward)
  {
#pragma omp single
    threads = omp_get_num_threads();
    forward += forward_rate();
#pragma omp barrier
    backward += backward_rate();
#pragma omp barrier
    fma += fma_rate();
  }
  std::printf("{\"forward\": %.4g, \"backward\": %.4g, \"fma_flops\": %.4g, \"threads\": %d}\n",
              forward, backward, fma, threads);
  return 0;
}
#endif
