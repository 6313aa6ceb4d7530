"""Compiler flags of the C++ kernels, in one place: setup.py (which reads this
file without importing the package) and the JIT build in splat/_backend.py.

-ffp-contract=off: no fused multiply-adds (GCC contracts by default on ARM, and
    other compilers may on x86), so the CPU kernels round like the GPU build
    (nvcc --fmad=false) and the CUDA emulation tests.
-fno-math-errno: sqrt never sets errno, so it compiles to one instruction with
    no library fallback, and loops over it vectorise (the fused projection).
-fno-trapping-math: floating-point operations are assumed not to trap, so
    conditionals over them become selects and the projection's surfel loops
    vectorise.  Neither flag changes any computed value.
"""

CXX_FLAGS = ["-O3", "-std=c++17", "-fopenmp", "-ffp-contract=off", "-fno-math-errno", "-fno-trapping-math"]
LINK_FLAGS = ["-fopenmp"]
