// CUDA error checking: every runtime call is checked and a failure throws
// attnres::Error naming the file, line and the failing call.
#pragma once
#include <cuda_runtime.h>

#include "core/error.h"

#define ATTNRES_CUDA_CHECK(call)                                                       \
  do {                                                                                 \
    cudaError_t err_ = (call);                                                         \
    if (err_ != cudaSuccess)                                                           \
      ::attnres::fail(__FILE__, ":", __LINE__, ": ", #call, " failed: ",               \
                      cudaGetErrorName(err_), " (", cudaGetErrorString(err_), ")");   \
  } while (0)
