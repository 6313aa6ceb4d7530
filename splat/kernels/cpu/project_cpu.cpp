// Fused per-surfel projection on the CPU (see project_cpu.h): the per-surfel
// maths of ../project_surfels.h (shared with cuda/project.cu), run over
// blocks of kBlock surfels, each block's loops vectorised, blocks in parallel.
#include "project_cpu.h"

#include <algorithm>
#include <cmath>

#include "../core.h"
#include "../project_surfels.h"
#include "dispatch.h"

namespace splat {

namespace {

// Surfels per block: the vector loops of ../project_surfels.h run over a
// block, and what passes between loops (the log's cutoffs, view directions,
// the SH basis) is kept in block arrays.
constexpr int kBlock = 64;

}  // namespace

// Vector-ISA clones of the float32 blocks, chosen at load time like the
// raster tile loops (rasterize_cpu.cpp); float64 runs the baseline build.
// No AVX-512 clone: there GCC 12's vectoriser fuses a*b+c / a*b-c lane pairs
// into vfmaddsub despite -ffp-contract=off, which changes the rounding
// (caught by test_projection.py's vector-against-scalar test and by
// test_cpu_kernels.py's scan of the built extension for FMA instructions).
// Not in the anonymous namespace: target_clones needs external linkage.
SPLAT_CLONES_AVX2 int64_t project_forward_block_f32(const ProjectInputs<float>& in,
                                                    const ProjectOutputs<float>& out,
                                                    const float campos[3], int64_t b0, int len) {
  return project_forward_block<kBlock>(in, out, campos, b0, len);
}
SPLAT_CLONES_AVX2 void project_backward_block_f32(const ProjectInputs<float>& in,
                                                  const ProjectGrads<float>& g,
                                                  const float campos[3], int64_t b0, int len) {
  project_backward_block<kBlock>(in, g, campos, b0, len);
}

namespace {

int64_t run_forward_block(const ProjectInputs<float>& in, const ProjectOutputs<float>& out,
                          const float campos[3], int64_t b0, int len) {
  return project_forward_block_f32(in, out, campos, b0, len);
}
int64_t run_forward_block(const ProjectInputs<double>& in, const ProjectOutputs<double>& out,
                          const double campos[3], int64_t b0, int len) {
  return project_forward_block<kBlock>(in, out, campos, b0, len);
}
void run_backward_block(const ProjectInputs<float>& in, const ProjectGrads<float>& g,
                        const float campos[3], int64_t b0, int len) {
  project_backward_block_f32(in, g, campos, b0, len);
}
void run_backward_block(const ProjectInputs<double>& in, const ProjectGrads<double>& g,
                        const double campos[3], int64_t b0, int len) {
  project_backward_block<kBlock>(in, g, campos, b0, len);
}

}  // namespace

template <typename T>
int64_t project_forward_cpu(const ProjectInputs<T>& in, const ProjectOutputs<T>& out) {
  T campos[3];
  camera_centre(in, campos);
  int64_t bad = 0;
#pragma omp parallel for schedule(static) reduction(+ : bad)
  for (int64_t b0 = 0; b0 < in.n; b0 += kBlock)
    bad += run_forward_block(in, out, campos, b0, int(std::min<int64_t>(kBlock, in.n - b0)));
  return bad;
}

template <typename T>
void project_backward_cpu(const ProjectInputs<T>& in, const ProjectGrads<T>& g) {
  T campos[3];
  camera_centre(in, campos);
#pragma omp parallel for schedule(static)
  for (int64_t b0 = 0; b0 < in.n; b0 += kBlock)
    run_backward_block(in, g, campos, b0, int(std::min<int64_t>(kBlock, in.n - b0)));
}

template int64_t project_forward_cpu<float>(const ProjectInputs<float>&,
                                            const ProjectOutputs<float>&);
template int64_t project_forward_cpu<double>(const ProjectInputs<double>&,
                                             const ProjectOutputs<double>&);
template void project_backward_cpu<float>(const ProjectInputs<float>&, const ProjectGrads<float>&);
template void project_backward_cpu<double>(const ProjectInputs<double>&,
                                           const ProjectGrads<double>&);

}  // namespace splat
