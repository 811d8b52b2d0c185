// CUDA backend wiring (the kernels themselves come with the CUDA issue).
// Declared for every build; defined only when the CUDA backend is compiled.
#pragma once
#include <string>
#include <vector>

namespace attnres::cuda {

// Number of visible CUDA devices; 0 when there is no driver or no GPU.
int device_count();
// "NVIDIA H100 80GB HBM3 (sm_90, 79.1 GiB)" for device i.
std::string device_description(int i);
// Smoke kernel used by the GPU tests to prove the toolchain end to end:
// returns a[i] * s + b[i] computed on the device.
std::vector<float> axpy_on_device(const std::vector<float>& a, const std::vector<float>& b, float s);

}  // namespace attnres::cuda
