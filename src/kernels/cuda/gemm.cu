// Row-major GEMM on cuBLASLt (see gemm.cuh).
//
// Layout: cuBLASLt is column-major. A row-major [r, c] matrix with row stride
// ld is, byte for byte, the column-major [c, r] matrix (its transpose) with
// leading dimension ld. So the row-major product C = op(A) op(B) is computed
// as the column-major product C^T = op(B)^T op(A)^T: cuBLASLt's "A" is our B,
// its "B" is our A, and the transpose flags carry over unchanged.
//
// Plans: building the descriptors and asking the heuristic for an algorithm
// costs tens of microseconds of host time, more than a small GEMM takes on the
// device, and a training step repeats the same few dozen shapes thousands of
// times. So each distinct problem (shapes, strides, transposes, dtypes, beta,
// pointer alignments, including C_in's) gets a Plan (descriptors + the chosen
// algorithm), built once and kept. Keeping the algorithm fixed per problem
// also keeps results bit-identical from run to run.
//
// Split-K: the heuristic is limited to algorithms that either do not split
// the reduction or reduce the parts in fp32 in the workspace. The remaining
// scheme ("in place") adds the parts in the *output* dtype, which for a bf16
// output would round every partial sum to bf16.
// A bf16 C accumulated in place (C_in == C) never reaches cuBLASLt in place:
// such a GEMM rounded the product to bf16 before adding C (results off by up
// to 2^-8 of the product, so a sum that cancels could be off by 20%), on an
// H200 (docs/measurements/2026-11-26-h200-3/matmul.log) and again on an H100
// with a plan that splits nothing (algo 66, split-k 1, reduction scheme 0:
// docs/measurements/2026-11-26-h100-4/gpu_tests_matmul.log), while the same
// plan into another buffer rounded once. So gemm() writes such a sum into a
// temporary buffer (C_in read by the epilogue, one rounding) and copies it
// back: one extra pass over C. The model avoids the case (its one bf16
// accumulation, the q/k/v projections' du, alternates two buffers instead:
// model/model.cpp); an fp32 C in place (dw) is exact enough and runs in place.
// ATTNRES_GEMM_LOG=1 prints each plan's algorithm (id, tile, stages, split,
// reduction scheme) once, to see which one a shape gets.
#include "kernels/cuda/gemm.cuh"

#include <cublasLt.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <mutex>
#include <unordered_map>

#include "core/device.h"
#include "kernels/cuda/common.cuh"

// Checks a cuBLASLt call; a failure throws attnres::InternalError naming the call, the
// file and the line.
#define ATTNRES_CUBLAS_CHECK(call)                                                   \
  do {                                                                               \
    cublasStatus_t st_ = (call);                                                     \
    if (st_ != CUBLAS_STATUS_SUCCESS)                                                \
      ::attnres::fail_internal(__FILE__, ":", __LINE__, ": ", #call, " failed: ",             \
                      cublasLtGetStatusString(st_), " (status ", static_cast<int>(st_), \
                      ")");                                                          \
  } while (0)

namespace attnres::kernels::cuda {

namespace {

// 32 MiB is what cuBLAS recommends for Hopper; the heuristic may use less.
constexpr size_t kWorkspaceBytes = size_t(32) << 20;

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::F32: return CUDA_R_32F;
    case DType::BF16: return CUDA_R_16BF;
    default: fail("gemm: cuBLASLt path takes F32 or BF16, got ", dtype_name(t));
  }
}

// Largest power of two (up to 256, cuBLASLt's default requirement) that
// divides the address: the heuristic must only pick kernels that can load
// from it (a row slice of a tensor is not 256-byte aligned).
uint32_t alignment_of(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t align = 256;
  while (align > 1 && a % align != 0) align >>= 1;
  return align;
}

// Everything the descriptors and the algorithm choice depend on.
struct Key {
  int64_t m, n, k, lda, ldb, ldc;
  bool trans_a, trans_b, beta_zero, in_place;  // in_place: beta = 1 and C_in == C
  DType ab, c;
  uint32_t align_a, align_b, align_c, align_cin;  // align_cin: of C_in (= align_c in place)
  bool operator==(const Key& o) const {
    return m == o.m && n == o.n && k == o.k && lda == o.lda && ldb == o.ldb && ldc == o.ldc &&
           trans_a == o.trans_a && trans_b == o.trans_b && beta_zero == o.beta_zero &&
           in_place == o.in_place && ab == o.ab && c == o.c && align_a == o.align_a && align_b == o.align_b &&
           align_c == o.align_c && align_cin == o.align_cin;
  }
};

struct KeyHash {
  size_t operator()(const Key& key) const {
    uint64_t h = 1469598103934665603ull;  // FNV-1a over the fields
    auto mix = [&h](uint64_t v) {
      h ^= v;
      h *= 1099511628211ull;
    };
    mix(key.m), mix(key.n), mix(key.k), mix(key.lda), mix(key.ldb), mix(key.ldc);
    mix(key.trans_a | key.trans_b << 1 | key.beta_zero << 2 | key.in_place << 3);
    mix(static_cast<uint64_t>(key.ab) | static_cast<uint64_t>(key.c) << 8);
    mix(key.align_a | uint64_t(key.align_b) << 16 | uint64_t(key.align_c) << 32 |
        uint64_t(key.align_cin) << 48);
    return static_cast<size_t>(h);
  }
};

// RAII owners of the cuBLASLt descriptor handles (each is a pointer to an
// opaque struct). Destruction errors are ignored: they can only happen at exit.
struct DescDeleter {
  void operator()(cublasLtMatmulDescOpaque_t* p) const { cublasLtMatmulDescDestroy(p); }
};
struct LayoutDeleter {
  void operator()(cublasLtMatrixLayoutOpaque_t* p) const { cublasLtMatrixLayoutDestroy(p); }
};
struct PrefDeleter {
  void operator()(cublasLtMatmulPreferenceOpaque_t* p) const { cublasLtMatmulPreferenceDestroy(p); }
};
using DescPtr = std::unique_ptr<cublasLtMatmulDescOpaque_t, DescDeleter>;
using LayoutPtr = std::unique_ptr<cublasLtMatrixLayoutOpaque_t, LayoutDeleter>;
using PrefPtr = std::unique_ptr<cublasLtMatmulPreferenceOpaque_t, PrefDeleter>;

LayoutPtr make_layout(DType t, int64_t rows, int64_t cols, int64_t ld) {
  cublasLtMatrixLayout_t l = nullptr;
  ATTNRES_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&l, cuda_type(t), static_cast<uint64_t>(rows),
                                                  static_cast<uint64_t>(cols), ld));
  return LayoutPtr(l);
}

// The descriptors of one problem in cuBLASLt's column-major terms, and the
// algorithm the heuristic chose for it.
struct Plan {
  DescPtr op;
  LayoutPtr a, b, c;  // cuBLASLt's A (= our B), B (= our A), C and D (one layout)
  cublasLtMatmulAlgo_t algo{};
};

// One line on stderr: the problem and the algorithm the heuristic chose.
void log_plan(const Key& key, const cublasLtMatmulAlgo_t& algo) {
  // Each attribute read here is 4 bytes (int32 or uint32); -1 where it cannot be read (a
  // diagnostic line must not stop the run).
  auto attr = [&algo](cublasLtMatmulAlgoConfigAttributes_t a) -> long long {
    uint32_t v = 0;
    size_t written = 0;
    return cublasLtMatmulAlgoConfigGetAttribute(&algo, a, &v, sizeof v, &written) ==
                   CUBLAS_STATUS_SUCCESS
               ? static_cast<long long>(v)
               : -1LL;
  };
  std::fprintf(stderr,
               "gemm plan: C[%lld, %lld] %s %s k %lld, A/B %s, C %s, beta %d%s: algo %lld tile %lld "
               "stages %lld split-k %lld reduction scheme %lld\n",
               static_cast<long long>(key.m), static_cast<long long>(key.n),
               key.trans_a ? "A^T" : "A", key.trans_b ? "B^T" : "B", static_cast<long long>(key.k),
               dtype_name(key.ab), dtype_name(key.c), key.beta_zero ? 0 : 1,
               key.in_place ? " in place" : "", attr(CUBLASLT_ALGO_CONFIG_ID),
               attr(CUBLASLT_ALGO_CONFIG_TILE_ID), attr(CUBLASLT_ALGO_CONFIG_STAGES_ID),
               attr(CUBLASLT_ALGO_CONFIG_SPLITK_NUM), attr(CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME));
}

std::unique_ptr<Plan> make_plan(cublasLtHandle_t handle, const Key& key) {
  auto plan = std::make_unique<Plan>();
  cublasLtMatmulDesc_t op = nullptr;
  ATTNRES_CUBLAS_CHECK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  plan->op.reset(op);
  const cublasOperation_t op_a = key.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = key.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  ATTNRES_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a));
  ATTNRES_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b));
  // Our B ([k, n] or [n, k] row-major) seen column-major: [n, k] or [k, n].
  plan->a = key.trans_b ? make_layout(key.ab, key.k, key.n, key.ldb)
                        : make_layout(key.ab, key.n, key.k, key.ldb);
  // Our A ([m, k] or [k, m] row-major) seen column-major: [k, m] or [m, k].
  plan->b = key.trans_a ? make_layout(key.ab, key.m, key.k, key.lda)
                        : make_layout(key.ab, key.k, key.m, key.lda);
  plan->c = make_layout(key.c, key.n, key.m, key.ldc);

  cublasLtMatmulPreference_t pref_raw = nullptr;
  ATTNRES_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref_raw));
  PrefPtr pref(pref_raw);
  const uint64_t ws = kWorkspaceBytes;
  ATTNRES_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref_raw, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
  const uint32_t schemes = CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
  ATTNRES_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref_raw, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &schemes, sizeof schemes));
  // cuBLASLt's A/B are our B/A; D is our C, C our C_in.
  ATTNRES_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref_raw, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &key.align_b, sizeof key.align_b));
  ATTNRES_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref_raw, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &key.align_a, sizeof key.align_a));
  ATTNRES_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref_raw, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &key.align_cin, sizeof key.align_cin));
  ATTNRES_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref_raw, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &key.align_c, sizeof key.align_c));

  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(handle, op, plan->a.get(), plan->b.get(), plan->c.get(),
                                     plan->c.get(), pref_raw, 1, &result, &found);
  if (st != CUBLAS_STATUS_SUCCESS || found == 0 || result.state != CUBLAS_STATUS_SUCCESS)
    fail("gemm: cuBLASLt has no algorithm for C[", key.m, ", ", key.n, "] = ",
         key.trans_a ? "A^T" : "A", " ", key.trans_b ? "B^T" : "B", " (k = ", key.k, ", lda ",
         key.lda, ", ldb ", key.ldb, ", ldc ", key.ldc, ", A/B ", dtype_name(key.ab), ", C ",
         dtype_name(key.c), "): ", cublasLtGetStatusString(st));
  plan->algo = result.algo;
  if (const char* log = std::getenv("ATTNRES_GEMM_LOG"); log && *log && std::string(log) != "0")
    log_plan(key, plan->algo);
  return plan;
}

// The cuBLASLt handle, its workspace and the plan cache. A function-local
// static (created on the first GEMM, destroyed at exit): the handle and the
// workspace are per-device resources that every GEMM of the process shares,
// like the runtime's compute stream they run on. All GEMMs run on that one
// stream, so one workspace serves them all (stream order keeps uses apart).
class Lt {
 public:
  static Lt& get() {
    static Lt lt;
    return lt;
  }

  void run(const Key& key, const void* a, const void* b, float beta, const void* c_in, void* c) {
    const Plan* plan = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);  // the map may be used from several host threads
      auto it = plans_.find(key);
      if (it == plans_.end()) it = plans_.emplace(key, make_plan(handle_, key)).first;
      plan = it->second.get();  // plans are never removed, so the pointer stays valid
    }
    const float alpha = 1.0f;
    ATTNRES_CUBLAS_CHECK(cublasLtMatmul(handle_, plan->op.get(), &alpha, b, plan->a.get(), a,
                                        plan->b.get(), &beta, c_in, plan->c.get(), c, plan->c.get(),
                                        &plan->algo, workspace_.raw(), kWorkspaceBytes, stream()));
  }

 private:
  Lt() {
    stream();  // the runtime (device, stream, pool) first, so it outlives this object
    ATTNRES_CUBLAS_CHECK(cublasLtCreate(&handle_));
    workspace_ = Tensor::empty({static_cast<int64_t>(kWorkspaceBytes / 4)}, DType::F32,
                               Device::CUDA);
  }
  ~Lt() {
    plans_.clear();
    cublasLtDestroy(handle_);  // at exit: errors are ignored
  }
  Lt(const Lt&) = delete;
  Lt& operator=(const Lt&) = delete;

  cublasLtHandle_t handle_ = nullptr;
  Tensor workspace_;
  std::mutex mu_;
  std::unordered_map<Key, std::unique_ptr<Plan>, KeyHash> plans_;
};

}  // namespace

void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, DType ab_type,
          const void* a, int64_t lda, const void* b, int64_t ldb, float beta, DType c_type,
          void* c, int64_t ldc, const void* c_in) {
  ATTNRES_CHECK(m >= 0 && n >= 0 && k >= 0, "gemm: negative dims [", m, ", ", n, ", ", k, "]");
  ATTNRES_CHECK(beta == 0.0f || beta == 1.0f, "gemm: beta must be 0 or 1, got ", beta);
  ATTNRES_CHECK(ab_type == DType::F32 || ab_type == DType::BF16, "gemm: A/B must be F32 or BF16");
  ATTNRES_CHECK(c_type == ab_type || c_type == DType::F32, "gemm: C is ", dtype_name(c_type),
                " for ", dtype_name(ab_type), " inputs");
  if (c_in == nullptr) c_in = c;
  ATTNRES_CHECK(c_in == c || beta == 1.0f, "gemm: a separate C_in is only read with beta = 1");
  if (m == 0 || n == 0) return;
  ATTNRES_CHECK(ldc >= n, "gemm: ldc ", ldc, " < n ", n);
  if (k == 0) {  // empty sum: C = beta C_in (beta is 0 or 1)
    const size_t es = dtype_size(c_type), pitch = static_cast<size_t>(ldc) * es;
    if (beta == 0.0f)
      ATTNRES_CUDA_CHECK(cudaMemset2DAsync(c, pitch, 0, static_cast<size_t>(n) * es,
                                           static_cast<size_t>(m), stream()));
    else if (c_in != c)
      ATTNRES_CUDA_CHECK(cudaMemcpy2DAsync(c, pitch, c_in, pitch, static_cast<size_t>(n) * es,
                                           static_cast<size_t>(m), cudaMemcpyDeviceToDevice,
                                           stream()));
    return;
  }
  ATTNRES_CHECK(lda >= (trans_a ? m : k), "gemm: lda ", lda, " too small");
  ATTNRES_CHECK(ldb >= (trans_b ? k : n), "gemm: ldb ", ldb, " too small");
  if (c_in == c && beta == 1.0f && c_type == DType::BF16) {
    // In place in bf16: through a temporary of C's layout (one plan layout
    // serves C_in and C), then back (see the top of this file).
    Tensor tmp = Tensor::empty({m, ldc}, c_type, Device::CUDA);
    gemm(trans_a, trans_b, m, n, k, ab_type, a, lda, b, ldb, beta, c_type, tmp.raw(), ldc, c_in);
    const size_t es = dtype_size(c_type), pitch = static_cast<size_t>(ldc) * es;
    ATTNRES_CUDA_CHECK(cudaMemcpy2DAsync(c, pitch, tmp.raw(), pitch, static_cast<size_t>(n) * es,
                                         static_cast<size_t>(m), cudaMemcpyDeviceToDevice,
                                         stream()));
    return;
  }
  const Key key{m,         n,           k,        lda,   ldb,  ldc,
                trans_a,   trans_b,     beta == 0.0f,   beta == 1.0f && c_in == c, ab_type, c_type,
                alignment_of(a), alignment_of(b), alignment_of(c), alignment_of(c_in)};
  Lt::get().run(key, a, b, beta, c_in, c);
}

}  // namespace attnres::kernels::cuda
