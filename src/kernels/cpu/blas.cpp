#include "kernels/cpu/blas.h"

#include "kernels/cpu/blas_cores.h"

#include <cblas.h>

#include <algorithm>
#include <utility>

namespace attnres::kernels::cpu {

namespace {

// C is cut into tiles of at most kMaxTile x kMaxTile, halved (the longer side
// first, in multiples of kAlign, not below kMinTile) until there are at least
// kTargetTiles: enough to spread over a node's cores, large enough that one
// BLAS call runs near its single-core peak (repacking operands per tile is
// the cost: 64 x 64 tiles made the CPU bench's step ~6% slower than OpenBLAS's
// own threading, 128 x 128 and up are within noise of it). kAlign keeps tile
// edges on the kernels' register-block multiples.
constexpr int64_t kMaxTile = 512, kMinTile = 128, kAlign = 32, kTargetTiles = 32;

// Products of at most this many multiply-adds (m n k) are one BLAS call made
// from here, without a parallel region: forking a team costs more than such a
// product (and much more when processes share cores, as a test run's do).
// OpenBLAS never threads them itself (interface/gemm.c: m n k <= 65536 x
// GEMM_MULTITHREAD_THRESHOLD, 4 unless its build changed it), so they stay
// single-threaded.
constexpr double kSmallProduct = 65536.0 * 4;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

struct Tiling {
  int64_t tm, tn;  // tile rows and columns
};

Tiling tiling(int64_t m, int64_t n) {
  int64_t tm = std::min(m, kMaxTile), tn = std::min(n, kMaxTile);
  auto halve = [](int64_t t) {
    return std::max(kMinTile, ceil_div(ceil_div(t, 2), kAlign) * kAlign);
  };
  while (ceil_div(m, tm) * ceil_div(n, tn) < kTargetTiles) {
    const bool cut_m = tm > kMinTile && (tm >= tn || tn <= kMinTile);
    const bool cut_n = !cut_m && tn > kMinTile;
    if (cut_m) tm = halve(tm);
    else if (cut_n) tn = halve(tn);
    else break;
  }
  return {tm, tn};
}

// BLAS rejects a leading dimension of 0 (empty operands), hence max(1, .).
int ld(int64_t x) { return static_cast<int>(std::max<int64_t>(1, x)); }

void call(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k), alpha, a,
              ld(lda), b, ld(ldb), beta, c, ld(ldc));
}
void call(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, const double* a,
          int64_t lda, const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k), alpha, a,
              ld(lda), b, ld(ldb), beta, c, ld(ldc));
}

// A pthread build of OpenBLAS runs every call on its own pool unless told to
// use one thread; done once, before the first call. Not for the OpenMP build:
// there openblas_set_num_threads also sets OpenMP's thread count (ours), and
// a call made inside an active parallel region is single-threaded anyway.
void ensure_single_threaded_blas() {
  static const bool done = [] {
    if (openblas_get_parallel() == 1) openblas_set_num_threads(1);
    return true;
  }();
  (void)done;
}

}  // namespace

template <typename T>
void gemm_serial(bool ta, bool tb, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
                 int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  ensure_single_threaded_blas();
  call(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

template <typename T>
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda,
          const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  ensure_single_threaded_blas();
  if (static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) <= kSmallProduct)
    return call(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  const Tiling t = tiling(m, n);
  const int64_t mt = ceil_div(m, t.tm), nt = ceil_div(n, t.tn);
  // Always a parallel region, even for one tile: inside an active region the
  // OpenMP build of OpenBLAS runs single-threaded; outside it would use the
  // whole team and split C its own way.
#pragma omp parallel for schedule(dynamic)
  for (int64_t tile = 0; tile < mt * nt; ++tile) {
    const int64_t i0 = (tile / nt) * t.tm, j0 = (tile % nt) * t.tn;
    const int64_t rows = std::min(t.tm, m - i0), cols = std::min(t.tn, n - j0);
    // Row i of op(A) is row i of A, or column i of A when transposed; the same
    // for column j of op(B).
    const T* ai = ta ? a + i0 : a + i0 * lda;
    const T* bj = tb ? b + j0 * ldb : b + j0;
    call(ta, tb, rows, cols, k, alpha, ai, lda, bj, ldb, beta, c + i0 * ldc + j0, ldc);
  }
}

std::string blas_threading() {
  switch (openblas_get_parallel()) {
    case 0: return "serial";
    case 1: return "pthreads";
    default: return "OpenMP";
  }
}

int blas_threads() { return openblas_get_num_threads(); }

std::vector<std::string> blas_warnings() {
  std::vector<std::string> w;
  if (openblas_get_parallel() != 2)
    w.push_back("the " + blas_threading() +
                " build of OpenBLAS is loaded; it runs single-threaded under our OpenMP tiles, but "
                "the tested build is the OpenMP one (Debian: apt-get install "
                "libopenblas-openmp-dev, then rebuild)");
  if (std::string k = blas_kernels_warning(); !k.empty()) w.push_back(std::move(k));
  return w;
}

std::string blas_description() {
  // openblas_get_config(): "OpenBLAS 0.3.21 NO_LAPACKE DYNAMIC_ARCH ... USE_OPENMP Cooperlake
  // MAX_THREADS=64"; the first two words are the version.
  std::string config = openblas_get_config();
  const size_t v = config.find(' ', config.find(' ') + 1);
  return config.substr(0, v) + ", " + blas_kernels_description() + ", " + blas_threading() +
         " build, called single-threaded on shape-only tiles";
}

template void gemm<float>(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t,
                          const float*, int64_t, float, float*, int64_t);
template void gemm<double>(bool, bool, int64_t, int64_t, int64_t, double, const double*, int64_t,
                           const double*, int64_t, double, double*, int64_t);
template void gemm_serial<float>(bool, bool, int64_t, int64_t, int64_t, float, const float*,
                                 int64_t, const float*, int64_t, float, float*, int64_t);
template void gemm_serial<double>(bool, bool, int64_t, int64_t, int64_t, double, const double*,
                                  int64_t, const double*, int64_t, double, double*, int64_t);

}  // namespace attnres::kernels::cpu
