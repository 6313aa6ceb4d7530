// Fused per-surfel projection on the CPU (no torch headers; see bindings.cpp).
//
// One pass per surfel computes what splat/rasterize.py's torch path
// (_project, _screen_bounds, _surfel_colors, facing_normals) computes with
// dozens of whole-array ops: the screen matrix M = K [a b c] (rows Tu, Tv,
// Tw), the centre, the camera-facing normal, the SH colour, the camera depth,
// the pixel rectangle and the radius.  The backward pass recomputes the
// forward quantities of a surfel and applies the exact chain rule (checked by
// float64 finite differences in tests/test_projection.py).  The per-surfel
// maths is ../project_surfels.h, which cuda/project.cu runs too.  Every surfel
// is independent, so both passes are bitwise deterministic for any thread count.
#pragma once

#include <cstdint>

#include "../project_surfels.h"  // ProjectInputs, ProjectOutputs, ProjectGrads

namespace splat {

// Returns the number of surfels whose screen matrix the dtype cannot carry
// (see rasterize.py _check_magnitude); 0 when all are fine.
template <typename T>
int64_t project_forward_cpu(const ProjectInputs<T>& in, const ProjectOutputs<T>& out);

template <typename T>
void project_backward_cpu(const ProjectInputs<T>& in, const ProjectGrads<T>& g);

}  // namespace splat
