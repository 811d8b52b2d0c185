// Our one door to BLAS (OpenBLAS's CBLAS): row-major GEMMs and a line saying
// which BLAS runs them.
//
// BLAS itself always runs single-threaded; the parallelism is ours. gemm()
// cuts C into tiles chosen from the shape alone and hands them to the OpenMP
// team, one single-threaded BLAS call per tile (the reduction dimension is
// never cut). Two reasons:
//  - Bits. A BLAS's own threading splits C where the thread count says, and
//    some kernels (OpenBLAS's AVX2 Haswell/Zen kernels) round an element
//    differently depending on whether it falls in an edge tile. Results would
//    then depend on the thread count, and a pipeline rank with fewer threads
//    would not reproduce the single process. With shape-only tiles they don't.
//  - Threads. The pthread build of OpenBLAS (what Debian's libopenblas-dev
//    installs) keeps its own thread pool, which fights the OpenMP team when it
//    is called from inside a parallel region (2.3x slower end to end). Set to
//    one thread, every build behaves the same; the OpenMP build (our default,
//    libopenblas-openmp-dev) runs single-threaded inside our regions anyway.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace attnres::kernels::cpu {

// C[m,n] = alpha op(A) op(B) + beta C, row-major; leading dimensions are the
// row lengths of the stored (untransposed) arrays, so a column block of a
// wider activation can be addressed. Tiles run on the OpenMP team (serially,
// in the same tiles, when called from inside a parallel region): the result
// bits depend on the shapes only.
template <typename T>
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda,
          const T* b, int64_t ldb, T beta, T* c, int64_t ldc);

// The same product as one single-threaded BLAS call, for callers that are
// already inside their own parallel region (attention's per-block products).
template <typename T>
void gemm_serial(bool ta, bool tb, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
                 int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc);

// The BLAS in use, e.g. "OpenBLAS 0.3.21, Cooperlake kernels (OpenBLAS's own
// choice), OpenMP build, called single-threaded on shape-only tiles"; who
// chose the kernels: kernels/cpu/blas_cores.h.
std::string blas_description();

// Warnings for the log and the benchmark: the loaded OpenBLAS is not the
// OpenMP build CI tests (it works, single-threaded as every build here); its
// kernels are of a lower instruction set than the CPU's. Empty when neither.
std::vector<std::string> blas_warnings();

// Which threading the loaded OpenBLAS was built with: "OpenMP", "pthreads" or
// "serial" (openblas_get_parallel()), and the thread count it would use by
// itself for a call made now (1 once gemm() has run: see above).
std::string blas_threading();
int blas_threads();

}  // namespace attnres::kernels::cpu
