// The CPU / CUDA switch of the op dispatchers (src/kernels/<op>.cpp). Apart from
// kernels/common.h because it depends on the build (core/build_config.h): only
// the dispatchers include it, so every other file compiles the same with and
// without the CUDA backend.
#pragma once
#include "core/build_config.h"
#include "kernels/common.h"

// In a dispatcher, after the argument checks: CUDA tensors go to
// cuda::<op>(...) (declared in kernels/cuda/<op>.h). `return call;` also works
// for void calls. Without the CUDA backend, a CUDA tensor cannot exist, but the
// message says what is missing anyway.
#if ATTNRES_HAVE_CUDA
#define ATTNRES_CUDA_DISPATCH(t, op, call) \
  if ((t).is_cuda()) return call
#else
#define ATTNRES_CUDA_DISPATCH(t, op, call) \
  if ((t).is_cuda()) ::attnres::kernels::fail_no_cuda(op)
#endif
