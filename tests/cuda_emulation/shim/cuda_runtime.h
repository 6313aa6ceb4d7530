// cudaemu: stands in for the CUDA runtime header when .cu files are compiled
// as host code (see cudaemu.h).
#pragma once
#include "cudaemu.h"
