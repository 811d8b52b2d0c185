// The BLAS door (kernels/cpu/blas.h): tiled GEMMs against a triple loop for
// every transpose and for operands inside wider arrays, result bits that do
// not depend on the thread count, and BLAS kept single-threaded whichever
// OpenBLAS build is loaded. CTest runs these cases three times: as they are,
// with the pthread build of OpenBLAS (LD_LIBRARY_PATH), and with OpenBLAS's
// AVX2 (Haswell) kernels, whose rounding depends on where tile edges fall.
#include <omp.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <string>
#include <vector>

#include "kernels/cpu/blas.h"
#include "testing.h"

using namespace attnres;
using namespace attnres::testing;
namespace cpu = attnres::kernels::cpu;

namespace {

// A row-major [rows, cols] block inside a wider array (row length ld > cols):
// the tiles must address it through ld, not cols.
struct Block {
  std::vector<double> v;
  int64_t rows, cols, ld;
  double& at(int64_t r, int64_t c) { return v[static_cast<size_t>(r * ld + c)]; }
  double at(int64_t r, int64_t c) const { return v[static_cast<size_t>(r * ld + c)]; }
};
Block random_block(int64_t rows, int64_t cols, uint64_t seed) {
  const Tensor t = randn({rows, cols + 3}, seed);
  const double* v = t.data<double>();
  return {std::vector<double>(v, v + t.numel()), rows, cols, cols + 3};
}

template <typename T>
std::vector<T> cast(const std::vector<double>& v) {
  return std::vector<T>(v.begin(), v.end());
}

// C = alpha op(A) op(B) + beta C through cpu::gemm, in precision T.
template <typename T>
std::vector<T> run_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const Block& a,
                        const Block& b, const Block& c0, double alpha, double beta) {
  const std::vector<T> av = cast<T>(a.v), bv = cast<T>(b.v);
  std::vector<T> c = cast<T>(c0.v);
  cpu::gemm<T>(ta, tb, m, n, k, T(alpha), av.data(), a.ld, bv.data(), b.ld, T(beta), c.data(),
               c0.ld);
  return c;
}

}  // namespace

TEST_CASE("gemm's tiles give the triple loop for every transpose and leading dimension",
          "[kernels][blas]") {
  // Large enough for several tiles in both directions, with ragged edges.
  const int64_t m = 301, n = 290, k = 37;
  const double alpha = 0.7, beta = -1.3;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      INFO("ta=" << ta << " tb=" << tb);
      const Block a = ta ? random_block(k, m, 1) : random_block(m, k, 1);
      const Block b = tb ? random_block(n, k, 2) : random_block(k, n, 2);
      const Block c0 = random_block(m, n, 3);
      auto opa = [&](int64_t i, int64_t l) { return ta ? a.at(l, i) : a.at(i, l); };
      auto opb = [&](int64_t l, int64_t j) { return tb ? b.at(j, l) : b.at(l, j); };
      const std::vector<double> c = run_gemm<double>(ta, tb, m, n, k, a, b, c0, alpha, beta);
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
          double s = 0, terms = 0;
          for (int64_t l = 0; l < k; ++l) {
            s += opa(i, l) * opb(l, j);
            terms += std::fabs(opa(i, l) * opb(l, j));
          }
          const double want = alpha * s + beta * c0.at(i, j);
          REQUIRE(c[static_cast<size_t>(i * c0.ld + j)] ==
                  approx_terms(want, 1e-14, alpha * terms + std::fabs(beta * c0.at(i, j))));
        }
      // The padding columns beyond n are not C's: untouched.
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = n; j < c0.ld; ++j)
          REQUIRE(c[static_cast<size_t>(i * c0.ld + j)] == c0.at(i, j));
    }
}

TEST_CASE("gemm's bits do not depend on the thread count", "[kernels][blas]") {
  const int saved = omp_get_max_threads();
  const int64_t m = 700, n = 520, k = 129;
  const Block a = random_block(m, k, 4), b = random_block(n, k, 5), c0 = random_block(m, n, 6);
  for (bool f32 : {true, false}) {
    INFO((f32 ? "float32" : "float64"));
    std::vector<std::vector<double>> runs;
    for (int threads : {1, 2, 3}) {
      omp_set_num_threads(threads);
      if (f32) {
        const auto c = run_gemm<float>(false, true, m, n, k, a, b, c0, 1.0, 1.0);
        runs.emplace_back(c.begin(), c.end());
      } else {
        runs.push_back(run_gemm<double>(false, true, m, n, k, a, b, c0, 1.0, 1.0));
      }
    }
    omp_set_num_threads(saved);
    REQUIRE(runs[1] == runs[0]);
    REQUIRE(runs[2] == runs[0]);
    // From inside a parallel region (nested: the tiles run in order on one thread).
    std::vector<double> inside;
#pragma omp parallel num_threads(2)
#pragma omp single
    {
      if (f32) {
        const auto c = run_gemm<float>(false, true, m, n, k, a, b, c0, 1.0, 1.0);
        inside.assign(c.begin(), c.end());
      } else {
        inside = run_gemm<double>(false, true, m, n, k, a, b, c0, 1.0, 1.0);
      }
    }
    REQUIRE(inside == runs[0]);
  }
}

TEST_CASE("BLAS runs single-threaded whichever OpenBLAS build is loaded", "[kernels][blas]") {
  // The build this process is expected to load: the OpenMP one (what CMake
  // links and the RUNPATH finds first), unless CTest swapped in another.
  const char* env = std::getenv("ATTNRES_EXPECT_BLAS_THREADING");
  const std::string expected = env ? env : "OpenMP";
  INFO(cpu::blas_description());
  REQUIRE(cpu::blas_threading() == expected);
  const Block a = random_block(300, 40, 7), b = random_block(300, 40, 8);
  const Block c0 = random_block(300, 300, 9);
#pragma omp parallel num_threads(2)
  run_gemm<float>(false, true, 300, 300, 40, a, b, c0, 1.0, 0.0);
  // A pthread build keeps its own pool: unless told to use one thread it
  // would run every call on it, fighting the OpenMP team (the test's
  // environment asks it for 2 threads). The OpenMP build needs no telling:
  // it runs single-threaded inside our parallel regions, where gemm() calls it.
  if (expected == "pthreads") REQUIRE(cpu::blas_threads() == 1);
  REQUIRE(cpu::blas_description().find(expected + " build") != std::string::npos);
}
