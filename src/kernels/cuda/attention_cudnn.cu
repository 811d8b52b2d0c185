// Causal GQA attention on cuDNN's fused flash-attention engines, through the
// backend graph API (cudnnBackend*: tensor and operation descriptors, an
// operation graph, engine heuristics, an execution plan, a variant pack).
//
// Why a composed graph and not the SDPA operation descriptors. cuDNN 9.19's
// CUDNN_BACKEND_OPERATION_SDPA_FWD/BWD_DESCRIPTOR take Q, K, V, O, stats, a
// scale, sequence lengths, page tables and (forward) a block mask, but no
// attribute for a causal mask (cudnn_graph_v9.h: attributes 2800-2862; the
// causal/score-modifier "subgraph" attribute comes in later versions), and a
// block mask is per tile, not per element. So both passes are the documented
// "flash fused attention" patterns that the runtime-fusion engines recognise
// and run as one fused kernel (docs: "Graph API", Specialized Runtime Fusion
// Engines, Fused Attention fprop/bprop,
// https://docs.nvidia.com/deeplearning/cudnn/developer/graph-api.html; the
// support matrix: SM80+, bf16, head dim <= 128 for the Ampere backward,
// https://docs.nvidia.com/deeplearning/cudnn/frontend/latest/operations/Attention.html):
//
// forward  S = Q K^T (fp32)  * scale  -> causal mask (gen-index row, col;
//          row >= col; binary-select S or -inf) -> softmax with stats:
//          m = max_j S, E = exp(S - m), l = sum_j E, stats = m + log l,
//          P = E / l (bf16) -> O = P V.
// backward D = sum_d dO * O (fp32, in our workspace)
//          P = exp(mask(S * scale - stats))       (recomputed; S as above)
//          dV = P^T dO      dP = dO V^T      dS = P (dP - D) * scale
//          dK = dS^T Q      dQ = dS K  (fp32 accumulator in our workspace,
//          then an identity op to bf16)
//          With GQA (H > Hkv) dK and dV are first formed per query head and
//          summed over each KV head's group by a reduction op.
// K^T and V^T are never materialised: they are the same memory with two
// strides swapped, and the transposes of P and dS are reshape ops (views).
//
// Layout: q, k and v are the column blocks of one joint qkv [B*T, (H + 2 Hkv)
// hd] (q at column 0, k at H hd, v at (H + Hkv) hd), so each is a strided
// view with the joint row stride ld = (H + 2 Hkv) hd: q rows are [B, T, H, hd]
// inside rows of ld elements, and q as the 4-D [B, H, T, hd] tensor cuDNN
// wants has strides (T ld, hd, ld, 1); k and v likewise (Hkv heads, same ld),
// and dq, dk, dv in the joint dqkv too. out and dout are separate [B*T, H hd]
// tensors: strides (T H hd, hd, H hd, 1). The variant pack binds q, k, v at
// their column offsets in qkv (H hd and (H + Hkv) hd elements: 16-byte
// aligned since hd % 8 == 0). cuDNN serves GQA by broadcasting K/V heads (h_q
// a multiple of h_kv).
//
// lse: cuDNN's softmax "stats" output is, by the pattern above, m + log(l) =
// log sum_j exp(S_ij) with S already scaled and masked, natural log (the
// backend's docs call it the log-sum-exp, "natural-log LSE"): exactly our lse
// [B, H, T] fp32, so the forward writes lse directly and the backward reads it.
//
// Plans: built once per (shape, dtype, direction) and kept, like gemm.cu's
// cuBLASLt plans (building one asks the heuristics and may compile a kernel:
// milliseconds to seconds). ld follows from the shape, so the shape stays the
// key. Store::Add does not change the graph: cuDNN writes dq, dk, dv into one
// temporary joint dqkv (same layout, every column written) that cuda::add_
// adds onto dqkv as a whole.
//
// Determinism: the fused backward may accumulate dQ with atomics (the
// heuristics' numerical notes say whether the engine is deterministic);
// ATTNRES_CUDNN_LOG=1 prints each plan's engine and notes once.
#include "kernels/cuda/attention_cudnn.h"

#include "core/build_config.h"

#if ATTNRES_HAVE_CUDNN

#include <cudnn.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/device.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/reduce.h"

namespace attnres::kernels::cuda::cudnn {

namespace {

// A failed cuDNN call throws attnres::InternalError naming the call, the status and cuDNN's
// own last message (which says which attribute or pattern it rejected).
[[noreturn]] void cudnn_fail(const char* file, int line, const char* call, cudnnStatus_t st) {
  char msg[1024] = {0};
  cudnnGetLastErrorString(msg, sizeof msg);
  fail_internal(file, ":", line, ": ", call, " failed: ", cudnnGetErrorString(st), " (status ",
                static_cast<int>(st), ")", msg[0] ? ": " : "", msg);
}
#define ATTNRES_CUDNN_CHECK(call)                                                  \
  do {                                                                             \
    const cudnnStatus_t st_ = (call);                                              \
    if (st_ != CUDNN_STATUS_SUCCESS) cudnn_fail(__FILE__, __LINE__, #call, st_);    \
  } while (0)

// ---- descriptors ------------------------------------------------------------------

// Owner of one backend descriptor. Destruction errors are ignored (at exit only).
class Desc {
 public:
  explicit Desc(cudnnBackendDescriptorType_t type) {
    ATTNRES_CUDNN_CHECK(cudnnBackendCreateDescriptor(type, &d_));
  }
  ~Desc() {
    if (d_) cudnnBackendDestroyDescriptor(d_);
  }
  Desc(Desc&& o) noexcept : d_(std::exchange(o.d_, nullptr)) {}
  Desc& operator=(Desc&&) = delete;
  Desc(const Desc&) = delete;
  Desc& operator=(const Desc&) = delete;
  cudnnBackendDescriptor_t get() const { return d_; }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};

void set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
         cudnnBackendAttributeType_t type, int64_t count, const void* values) {
  ATTNRES_CUDNN_CHECK(cudnnBackendSetAttribute(d, name, type, count, values));
}
void set_desc(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
              cudnnBackendDescriptor_t value) {
  set(d, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &value);
}
void set_type(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name, cudnnDataType_t t) {
  set(d, name, CUDNN_TYPE_DATA_TYPE, 1, &t);
}
void finalize(cudnnBackendDescriptor_t d) { ATTNRES_CUDNN_CHECK(cudnnBackendFinalize(d)); }

using Dims = std::vector<int64_t>;

// Unique ids of the tensors a plan's variant pack binds; virtual tensors count up from kVirtual.
enum Uid : int64_t {
  kQ = 1, kK, kV, kO, kStats, kdO, kdQ, kdK, kdV, kRowSum, kdQAcc, kScale, kNegInf, kOne,
  kVirtual = 100
};

// Every descriptor of one graph, created in dependency order and destroyed in reverse (the
// graph and the plan keep references to the tensors and operations).
class Graph {
 public:
  explicit Graph(cudnnHandle_t handle) : handle_(handle) {}
  ~Graph() {
    plan_.reset();
    engine_cfgs_.clear();
    heur_.reset();
    while (!descs_.empty()) descs_.pop_back();
  }
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  // A tensor: real (uid given, bound in the variant pack), virtual (an intermediate that
  // stays inside the fused kernel) or a by-value fp32 scalar (the variant pack points at a
  // host float).
  cudnnBackendDescriptor_t tensor(int64_t uid, cudnnDataType_t t, const Dims& dims,
                                  const Dims& strides, bool is_virtual = false,
                                  bool by_value = false) {
    Desc& d = make(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    const int64_t align = 16, rank = static_cast<int64_t>(dims.size());
    set_type(d.get(), CUDNN_ATTR_TENSOR_DATA_TYPE, t);
    set(d.get(), CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, rank, dims.data());
    set(d.get(), CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, rank, strides.data());
    set(d.get(), CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
    set(d.get(), CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align);
    set(d.get(), CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual);
    if (by_value) set(d.get(), CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value);
    finalize(d.get());
    return d.get();
  }
  cudnnBackendDescriptor_t virt(cudnnDataType_t t, const Dims& dims, const Dims& strides) {
    return tensor(next_virtual_++, t, dims, strides, true);
  }
  cudnnBackendDescriptor_t scalar(int64_t uid) {
    return tensor(uid, CUDNN_DATA_FLOAT, {1, 1, 1, 1}, {1, 1, 1, 1}, false, true);
  }

  // y = op(x[, b[, t]]) elementwise (b, t broadcast). math: the precision it computes in.
  void pointwise(cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
                 cudnnBackendDescriptor_t y, cudnnDataType_t math = CUDNN_DATA_FLOAT,
                 cudnnBackendDescriptor_t t = nullptr, int64_t axis = -1) {
    Desc& pw = make(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    set(pw.get(), CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
    set_type(pw.get(), CUDNN_ATTR_POINTWISE_MATH_PREC, math);
    if (axis >= 0) set(pw.get(), CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
    finalize(pw.get());
    Desc& op = make(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    set_desc(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw.get());
    set_desc(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x);
    if (b) set_desc(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b);
    set_desc(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y);
    if (t) set_desc(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t);
    finalize(op.get());
    ops_.push_back(op.get());
  }
  // c = a b over the last two dims (batched over the first two), fp32 accumulation.
  void matmul(cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t c) {
    Desc& mm = make(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    set_type(mm.get(), CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_DATA_FLOAT);
    finalize(mm.get());
    Desc& op = make(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    set_desc(op.get(), CUDNN_ATTR_OPERATION_MATMUL_ADESC, a);
    set_desc(op.get(), CUDNN_ATTR_OPERATION_MATMUL_BDESC, b);
    set_desc(op.get(), CUDNN_ATTR_OPERATION_MATMUL_CDESC, c);
    set_desc(op.get(), CUDNN_ATTR_OPERATION_MATMUL_DESC, mm.get());
    finalize(op.get());
    ops_.push_back(op.get());
  }
  // y = reduce(x) over the dims where y has extent 1 (or a group of heads: [B, H] -> [B, Hkv]).
  void reduce(cudnnReduceTensorOp_t how, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    Desc& red = make(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    set(red.get(), CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &how);
    set_type(red.get(), CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_DATA_FLOAT);
    finalize(red.get());
    Desc& op = make(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    set_desc(op.get(), CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x);
    set_desc(op.get(), CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y);
    set_desc(op.get(), CUDNN_ATTR_OPERATION_REDUCTION_DESC, red.get());
    finalize(op.get());
    ops_.push_back(op.get());
  }
  // y = x seen with y's dims and strides (a transpose without a copy).
  void reshape(cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    Desc& op = make(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    set_desc(op.get(), CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x);
    set_desc(op.get(), CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y);
    finalize(op.get());
    ops_.push_back(op.get());
  }

  // The operation graph, the heuristics' engine configurations in their order, and the
  // first one that finalizes into an execution plan. "" on success, else why not.
  std::string build_plan() {
    Desc& graph = make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    set(graph.get(), CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
        static_cast<int64_t>(ops_.size()), ops_.data());
    set(graph.get(), CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle_);
    if (cudnnBackendFinalize(graph.get()) != CUDNN_STATUS_SUCCESS)
      return "cuDNN does not take the attention graph (" + last_error() + ")";
    std::string why = "cuDNN's heuristics found no engine for the attention graph";
    for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
      auto heur = std::make_unique<Desc>(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
      set_desc(heur->get(), CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph.get());
      set(heur->get(), CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
      if (cudnnBackendFinalize(heur->get()) != CUDNN_STATUS_SUCCESS) continue;
      int64_t count = 0;
      ATTNRES_CUDNN_CHECK(cudnnBackendGetAttribute(heur->get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                                   CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count,
                                                   nullptr));
      if (count <= 0) continue;
      std::vector<Desc> cfgs;
      std::vector<cudnnBackendDescriptor_t> raw;
      for (int64_t i = 0; i < count; ++i) {
        cfgs.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
        raw.push_back(cfgs.back().get());
      }
      int64_t got = 0;
      ATTNRES_CUDNN_CHECK(cudnnBackendGetAttribute(heur->get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                                   CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got,
                                                   raw.data()));
      for (int64_t i = 0; i < got; ++i) {
        auto plan = std::make_unique<Desc>(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
        set(plan->get(), CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle_);
        set_desc(plan->get(), CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, raw[i]);
        // An engine the heuristics rank may still refuse this shape (or fail to compile):
        // the next one is tried.
        if (cudnnBackendFinalize(plan->get()) != CUDNN_STATUS_SUCCESS) {
          why = "no cuDNN engine finalizes the attention graph (" + last_error() + ")";
          continue;
        }
        ATTNRES_CUDNN_CHECK(cudnnBackendGetAttribute(plan->get(),
                                                     CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                                     CUDNN_TYPE_INT64, 1, nullptr, &workspace_));
        engine_notes(raw[i]);
        plan_ = std::move(plan);
        // The engine configs and the heuristics descriptor live as long as the plan: the
        // plan refers to its engine config, and cuDNN's frontend keeps both for the plan's
        // life (destroying them after finalizing is not documented as safe).
        engine_cfgs_ = std::move(cfgs);
        heur_ = std::move(heur);
        return "";
      }
    }
    return why;
  }

  cudnnBackendDescriptor_t plan() const { return plan_ ? plan_->get() : nullptr; }
  int64_t workspace() const { return workspace_; }
  const std::string& notes() const { return notes_; }

 private:
  Desc& make(cudnnBackendDescriptorType_t type) {
    descs_.push_back(std::make_unique<Desc>(type));
    return *descs_.back();
  }
  static std::string last_error() {
    char msg[1024] = {0};
    cudnnGetLastErrorString(msg, sizeof msg);
    return msg[0] ? std::string(msg) : std::string("no message");
  }
  // The chosen engine's global index and numerical notes, for ATTNRES_CUDNN_LOG.
  void engine_notes(cudnnBackendDescriptor_t cfg) {
    Desc engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
    cudnnBackendDescriptor_t e = engine.get();
    int64_t n = 0;
    if (cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                 1, &n, &e) != CUDNN_STATUS_SUCCESS)
      return;
    int64_t index = -1;
    cudnnBackendGetAttribute(e, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n, &index);
    cudnnBackendNumericalNote_t note[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
    int64_t nn = 0;
    cudnnBackendGetAttribute(e, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                             CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &nn, note);
    notes_ = "engine " + std::to_string(index);
    for (int64_t i = 0; i < nn; ++i)
      if (note[i] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC) notes_ += ", nondeterministic";
  }

  cudnnHandle_t handle_;
  std::vector<std::unique_ptr<Desc>> descs_;
  std::vector<cudnnBackendDescriptor_t> ops_;
  std::unique_ptr<Desc> plan_;
  std::vector<Desc> engine_cfgs_;  // the heuristics' configs, the plan's among them
  std::unique_ptr<Desc> heur_;
  int64_t workspace_ = 0;
  int64_t next_virtual_ = kVirtual;
  std::string notes_;
};

// ---- the two graphs ---------------------------------------------------------------

// [B, H, T, hd] views of `heads` heads of row-major [B*T, ...] activations whose rows are
// ld elements apart (the joint qkv's ld = (H + 2 Hkv) hd for q, k, v and their gradients;
// H hd for out and dout), and of their transposes.
Dims bhtd(const AttnShape& s, int64_t heads) { return {s.B, heads, s.T, s.hd}; }
Dims bhtd_strides(const AttnShape& s, int64_t ld) { return {s.T * ld, s.hd, ld, 1}; }
Dims bhdt(const AttnShape& s, int64_t heads) { return {s.B, heads, s.hd, s.T}; }
Dims bhdt_strides(const AttnShape& s, int64_t ld) { return {s.T * ld, s.hd, 1, ld}; }
// The row strides: of the joint qkv / dqkv (q, k, v and their gradients) and of out / dout.
int64_t ld_qkv(const AttnShape& s) { return qkv_width(s); }  // (H + 2 Hkv) hd
int64_t ld_out(const AttnShape& s) { return s.H * s.hd; }

// Bytes of the backward's own fp32 tensors in the workspace (after the engine's part): the
// row sums D = sum_d dO * O [B, H, T] and the dQ accumulator [B, H, T, hd].
constexpr int64_t kAlign = 256;
int64_t round_up(int64_t x) { return (x + kAlign - 1) / kAlign * kAlign; }
int64_t rowsum_bytes(const AttnShape& s) { return round_up(s.B * s.H * s.T * 4); }
int64_t dqacc_bytes(const AttnShape& s) { return round_up(s.B * s.H * s.T * s.hd * 4); }

// The backward graph's two forms (both compute the same function; which one the fused
// engines recognise is cuDNN's to say, so both are tried, in this order):
//   Frontend: as cuDNN's frontend builds its SDPA backward (cudnn_frontend
//             scaled_dot_product_flash_attention.h, SDPABackwardNode): the causal mask on
//             S * scale, then S - stats; dQ = dS K with K in the I/O type (bf16, a reshape
//             of the K^T tensor).
//   Legacy:   this file's first form (written before that was read): S * scale - stats,
//             then the mask; K re-declared fp32 for dQ.
// ATTNRES_CUDNN_BWD_FORM=frontend or legacy tries only that one.
enum class BwdForm { Frontend, Legacy };

// Where the backward subtracts the stats in masked_scores (the forward does not).
enum class Stats { None, BeforeMask, AfterMask };

// S = Q K^T * scale, causally masked with -inf: [B, H, T, T] fp32, virtual (less the stats
// where `at` says).
cudnnBackendDescriptor_t masked_scores(Graph& g, const AttnShape& s, cudnnBackendDescriptor_t q,
                                       cudnnBackendDescriptor_t kt, cudnnBackendDescriptor_t scale,
                                       cudnnBackendDescriptor_t neg_inf, Stats at,
                                       cudnnBackendDescriptor_t stats) {
  const Dims sd{s.B, s.H, s.T, s.T}, ss{s.H * s.T * s.T, s.T * s.T, s.T, 1};
  auto subtract = [&](cudnnBackendDescriptor_t x) {
    auto shifted = g.virt(CUDNN_DATA_FLOAT, sd, ss);
    g.pointwise(CUDNN_POINTWISE_SUB, x, stats, shifted);
    return shifted;
  };
  auto scores = g.virt(CUDNN_DATA_FLOAT, sd, ss);
  g.matmul(q, kt, scores);
  auto scaled = g.virt(CUDNN_DATA_FLOAT, sd, ss);
  g.pointwise(CUDNN_POINTWISE_MUL, scores, scale, scaled);
  if (at == Stats::BeforeMask) scaled = subtract(scaled);
  // Causal: keep column j of row i where i >= j (top-left aligned diagonal, T_q = T_kv).
  auto row = g.virt(CUDNN_DATA_INT32, sd, ss);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, scaled, nullptr, row, CUDNN_DATA_INT32, nullptr, 2);
  auto col = g.virt(CUDNN_DATA_INT32, sd, ss);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, scaled, nullptr, col, CUDNN_DATA_INT32, nullptr, 3);
  auto keep = g.virt(CUDNN_DATA_BOOLEAN, sd, ss);
  g.pointwise(CUDNN_POINTWISE_CMP_GE, row, col, keep, CUDNN_DATA_BOOLEAN);
  auto masked = g.virt(CUDNN_DATA_FLOAT, sd, ss);
  g.pointwise(CUDNN_POINTWISE_BINARY_SELECT, scaled, neg_inf, masked, CUDNN_DATA_FLOAT, keep);
  return at == Stats::AfterMask ? subtract(masked) : masked;
}

std::string build_forward(Graph& g, const AttnShape& s) {
  const Dims stat_d{s.B, s.H, s.T, 1}, stat_s{s.H * s.T, s.T, 1, 1};
  const int64_t ld = ld_qkv(s), ldo = ld_out(s);  // q/k/v in the joint qkv; out its own
  auto q = g.tensor(kQ, CUDNN_DATA_BFLOAT16, bhtd(s, s.H), bhtd_strides(s, ld));
  auto kt = g.tensor(kK, CUDNN_DATA_BFLOAT16, bhdt(s, s.Hkv), bhdt_strides(s, ld));
  auto v = g.tensor(kV, CUDNN_DATA_BFLOAT16, bhtd(s, s.Hkv), bhtd_strides(s, ld));
  auto o = g.tensor(kO, CUDNN_DATA_BFLOAT16, bhtd(s, s.H), bhtd_strides(s, ldo));
  auto stats = g.tensor(kStats, CUDNN_DATA_FLOAT, stat_d, stat_s);
  auto scale = g.scalar(kScale), neg_inf = g.scalar(kNegInf);
  auto x = masked_scores(g, s, q, kt, scale, neg_inf, Stats::None, nullptr);

  // Softmax with stats, as cuDNN's flash pattern spells it.
  const Dims sd{s.B, s.H, s.T, s.T}, ss{s.H * s.T * s.T, s.T * s.T, s.T, 1};
  auto m = g.virt(CUDNN_DATA_FLOAT, stat_d, stat_s);
  g.reduce(CUDNN_REDUCE_TENSOR_MAX, x, m);
  auto xm = g.virt(CUDNN_DATA_FLOAT, sd, ss);
  g.pointwise(CUDNN_POINTWISE_SUB, x, m, xm);
  auto e = g.virt(CUDNN_DATA_FLOAT, sd, ss);
  g.pointwise(CUDNN_POINTWISE_EXP, xm, nullptr, e);
  auto l = g.virt(CUDNN_DATA_FLOAT, stat_d, stat_s);
  g.reduce(CUDNN_REDUCE_TENSOR_ADD, e, l);
  auto log_l = g.virt(CUDNN_DATA_FLOAT, stat_d, stat_s);
  g.pointwise(CUDNN_POINTWISE_LOG, l, nullptr, log_l);
  g.pointwise(CUDNN_POINTWISE_ADD, m, log_l, stats);
  auto p = g.virt(CUDNN_DATA_BFLOAT16, sd, ss);  // P feeds the tensor cores in bf16
  g.pointwise(CUDNN_POINTWISE_DIV, e, l, p);
  g.matmul(p, v, o);
  return g.build_plan();
}

// group_sum: the dtype of the GQA backward's per-head dK and dV before the sum
// over each KV head's group (unused when H = Hkv); see gqa_sum_types(). form: BwdForm.
std::string build_backward(Graph& g, const AttnShape& s, cudnnDataType_t group_sum, BwdForm form) {
  const Dims stat_d{s.B, s.H, s.T, 1}, stat_s{s.H * s.T, s.T, 1, 1};
  const Dims sd{s.B, s.H, s.T, s.T}, ss{s.H * s.T * s.T, s.T * s.T, s.T, 1};
  const Dims st_s{s.H * s.T * s.T, s.T * s.T, 1, s.T};  // [B, H, Tkv, Tq] view of an S-shaped tensor
  const Dims full_d{s.B, s.H, s.T, s.hd}, full_s{s.H * s.T * s.hd, s.T * s.hd, s.hd, 1};
  // q, k, v and dq, dk, dv: blocks of the joint qkv / dqkv (row stride ld); out and dout:
  // separate [B*T, H hd] tensors (ldo).
  const int64_t ld = ld_qkv(s), ldo = ld_out(s);
  auto q = g.tensor(kQ, CUDNN_DATA_BFLOAT16, bhtd(s, s.H), bhtd_strides(s, ld));
  auto kt = g.tensor(kK, CUDNN_DATA_BFLOAT16, bhdt(s, s.Hkv), bhdt_strides(s, ld));
  auto vt = g.tensor(kV, CUDNN_DATA_BFLOAT16, bhdt(s, s.Hkv), bhdt_strides(s, ld));
  auto o = g.tensor(kO, CUDNN_DATA_BFLOAT16, bhtd(s, s.H), bhtd_strides(s, ldo));
  auto d_o = g.tensor(kdO, CUDNN_DATA_BFLOAT16, bhtd(s, s.H), bhtd_strides(s, ldo));
  auto stats = g.tensor(kStats, CUDNN_DATA_FLOAT, stat_d, stat_s);
  auto dq = g.tensor(kdQ, CUDNN_DATA_BFLOAT16, bhtd(s, s.H), bhtd_strides(s, ld));
  auto dk = g.tensor(kdK, CUDNN_DATA_BFLOAT16, bhtd(s, s.Hkv), bhtd_strides(s, ld));
  auto dv = g.tensor(kdV, CUDNN_DATA_BFLOAT16, bhtd(s, s.Hkv), bhtd_strides(s, ld));
  auto scale = g.scalar(kScale), neg_inf = g.scalar(kNegInf), one = g.scalar(kOne);

  // D = sum_d dO * O, kept in the workspace (the fused kernel reads it per row block).
  auto d_o_o = g.virt(CUDNN_DATA_FLOAT, full_d, full_s);
  g.pointwise(CUDNN_POINTWISE_MUL, d_o, o, d_o_o);
  auto d_sum = g.virt(CUDNN_DATA_FLOAT, stat_d, stat_s);
  g.reduce(CUDNN_REDUCE_TENSOR_ADD, d_o_o, d_sum);
  auto rowsum = g.tensor(kRowSum, CUDNN_DATA_FLOAT, stat_d, stat_s);
  g.pointwise(CUDNN_POINTWISE_MUL, d_sum, one, rowsum);  // (the pattern's dropout-scale slot)

  // P = exp(mask(S * scale) - stats) (Legacy: exp(mask(S * scale - stats)), the same).
  auto x = masked_scores(g, s, q, kt, scale, neg_inf,
                         form == BwdForm::Frontend ? Stats::AfterMask : Stats::BeforeMask, stats);
  auto p = g.virt(CUDNN_DATA_FLOAT, sd, ss);
  g.pointwise(CUDNN_POINTWISE_EXP, x, nullptr, p);

  // out = a^T b for a [B, H, T, T] score-shaped tensor (transposed by a reshape, in bf16),
  // per query head; under GQA the per-head products (in group_sum's dtype) are summed over
  // each KV head's group. dV from P, dK from dS.
  auto transposed_matmul = [&](cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b,
                               cudnnBackendDescriptor_t out) {
    auto at = g.virt(CUDNN_DATA_BFLOAT16, {s.B, s.H, s.T, s.T}, st_s);
    g.reshape(a, at);
    if (s.H == s.Hkv) return g.matmul(at, b, out);
    auto full = g.virt(group_sum, full_d, full_s);
    g.matmul(at, b, full);
    g.reduce(CUDNN_REDUCE_TENSOR_ADD, full, out);
  };

  // dV = P^T dO.
  transposed_matmul(p, d_o, dv);

  // dS = P (dO V^T - D) * scale.
  auto dp = g.virt(CUDNN_DATA_FLOAT, sd, ss);
  g.matmul(d_o, vt, dp);
  auto dp_d = g.virt(CUDNN_DATA_FLOAT, sd, ss);
  g.pointwise(CUDNN_POINTWISE_SUB, dp, rowsum, dp_d);
  auto ds_raw = g.virt(CUDNN_DATA_FLOAT, sd, ss);
  g.pointwise(CUDNN_POINTWISE_MUL, dp_d, p, ds_raw);
  auto ds = g.virt(CUDNN_DATA_FLOAT, sd, ss);
  g.pointwise(CUDNN_POINTWISE_MUL, ds_raw, scale, ds);

  // dK = dS^T Q.
  transposed_matmul(ds, q, dk);

  // dQ = dS K, accumulated in fp32 in the workspace, then rounded into dq once. K is kt
  // seen untransposed: the same memory, so the same row stride ld (kt's strides swapped),
  // in kt's bf16 (Frontend) or re-declared fp32 (Legacy).
  auto k = g.virt(form == BwdForm::Frontend ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT,
                  bhtd(s, s.Hkv), bhtd_strides(s, ld));
  g.reshape(kt, k);
  auto dq_acc = g.tensor(kdQAcc, CUDNN_DATA_FLOAT, full_d, full_s);
  g.matmul(ds, k, dq_acc);
  g.pointwise(CUDNN_POINTWISE_IDENTITY, dq_acc, nullptr, dq);
  return g.build_plan();
}

// ---- plans and the handle -----------------------------------------------------------

struct Key {
  int64_t B, T, H, Hkv, hd;
  bool operator==(const Key& o) const {
    return B == o.B && T == o.T && H == o.H && Hkv == o.Hkv && hd == o.hd;
  }
};
struct KeyHash {
  size_t operator()(const Key& k) const {
    uint64_t h = 1469598103934665603ull;  // FNV-1a over the fields
    for (int64_t v : {k.B, k.T, k.H, k.Hkv, k.hd}) {
      h ^= static_cast<uint64_t>(v);
      h *= 1099511628211ull;
    }
    return static_cast<size_t>(h);
  }
};

// Both passes of one shape (BF16 is the only dtype, so the shape is the key), or why not.
struct Plans {
  std::unique_ptr<Graph> fwd, bwd;
  std::string why;  // "" when both built
  std::string group_sum;  // the GQA backward's per-head dK / dV dtype that built ("" for MHA)
  std::string form;       // the backward's form that built (BwdForm)
};

// The backward's forms to try, in order (see BwdForm).
std::vector<std::pair<BwdForm, const char*>> bwd_forms() {
  const char* env = std::getenv("ATTNRES_CUDNN_BWD_FORM");
  const std::string want = env ? env : "";
  if (want == "frontend") return {{BwdForm::Frontend, "frontend"}};
  if (want == "legacy") return {{BwdForm::Legacy, "legacy"}};
  if (!want.empty()) fail("ATTNRES_CUDNN_BWD_FORM must be frontend or legacy, got '", want, "'");
  return {{BwdForm::Frontend, "frontend"}, {BwdForm::Legacy, "legacy"}};
}

// The dtypes to try for the GQA backward's per-head dK and dV before the group
// sum, in order. cuDNN's frontend declares that intermediate in the I/O type
// (bf16), and the fused engines accept only graphs that match their patterns,
// so bf16 comes first; fp32 (one rounding, after the sum) next.
// ATTNRES_CUDNN_GQA_SUM=bf16 or fp32 tries only that one.
std::vector<std::pair<cudnnDataType_t, const char*>> gqa_sum_types() {
  const char* env = std::getenv("ATTNRES_CUDNN_GQA_SUM");
  const std::string want = env ? env : "";
  if (want == "bf16") return {{CUDNN_DATA_BFLOAT16, "bf16"}};
  if (want == "fp32") return {{CUDNN_DATA_FLOAT, "fp32"}};
  if (!want.empty()) fail("ATTNRES_CUDNN_GQA_SUM must be bf16 or fp32, got '", want, "'");
  return {{CUDNN_DATA_BFLOAT16, "bf16"}, {CUDNN_DATA_FLOAT, "fp32"}};
}

// What rules a shape out before any graph is built.
std::string precheck(const AttnShape& s) {
  if (s.B <= 0 || s.T <= 0 || s.H <= 0 || s.Hkv <= 0 || s.hd <= 0 || s.H % s.Hkv != 0)
    return "invalid shape";
  if (cudnnGetVersion() < 90600)
    return "cuDNN " + std::to_string(cudnnGetVersion()) + " is older than 9.6";
  const cudaDeviceProp& p = ::attnres::cuda::device_properties();
  if (p.major < 8)
    return "device sm_" + std::to_string(p.major * 10 + p.minor) + " is below sm_80";
  // The fused engines' support matrix: head dim a multiple of 8, at most 128 for the
  // Ampere/Ada backward and 256 on Hopper and later.
  const int64_t max_hd = p.major >= 9 ? 256 : 128;
  if (s.hd % 8 != 0 || s.hd > max_hd)
    return "head dim " + std::to_string(s.hd) + " not supported";
  return "";
}

// The cuDNN handle (on the compute stream) and the plans. A function-local static, like
// gemm.cu's cuBLASLt state: one device, one stream, shared by every attention call.
class Cudnn {
 public:
  static Cudnn& get() {
    static Cudnn c;
    return c;
  }

  // The plans of a shape, built on first use (failures are kept too, with the reason).
  const Plans& plans(const AttnShape& s) {
    const Key key{s.B, s.T, s.H, s.Hkv, s.hd};
    std::lock_guard<std::mutex> lock(mu_);  // the map may be used from several host threads
    auto it = plans_.find(key);
    if (it != plans_.end()) return *it->second;  // plans are never removed: stays valid
    auto p = std::make_unique<Plans>();
    p->why = precheck(s);
    if (p->why.empty()) {
      p->fwd = std::make_unique<Graph>(handle_);
      try {
        p->why = build_forward(*p->fwd, s);
        if (p->why.empty()) {
          // Each form, and under GQA each group-sum dtype, in turn until one builds
          // (the reasons of those that did not are kept, in case none does).
          std::string whys;
          bool built = false;
          for (const auto& [form, form_name] : bwd_forms()) {
            for (const auto& [type, name] : gqa_sum_types()) {
              p->bwd = std::make_unique<Graph>(handle_);
              std::string why;
              try {
                why = build_backward(*p->bwd, s, type, form);
              } catch (const std::exception& e) {
                why = e.what();
              }
              if (why.empty()) {
                p->group_sum = s.H == s.Hkv ? "" : name;
                p->form = form_name;
                built = true;
                break;
              }
              whys += std::string(whys.empty() ? "" : "; ") + form_name + " form" +
                      (s.H == s.Hkv ? std::string() : std::string(", GQA sum in ") + name) + ": " + why;
              if (s.H == s.Hkv) break;  // no group sum: one graph per form
            }
            if (built) break;
          }
          p->why = built ? "" : whys;
        }
      } catch (const std::exception& e) {  // a descriptor cuDNN refused: not supported
        p->why = e.what();
      }
      if (!p->why.empty()) p->fwd.reset(), p->bwd.reset();
    }
    if (const char* log = std::getenv("ATTNRES_CUDNN_LOG"); log && *log && std::string(log) != "0")
      std::fprintf(stderr, "cudnn sdpa plan: B %lld T %lld H %lld Hkv %lld hd %lld: %s%s%s\n",
                   (long long)s.B, (long long)s.T, (long long)s.H, (long long)s.Hkv,
                   (long long)s.hd, p->why.empty() ? "fwd " : p->why.c_str(),
                   p->why.empty() ? p->fwd->notes().c_str() : "",
                   p->why.empty() ? (", bwd " + p->bwd->notes() + ", " + p->form + " form" +
                                     (p->group_sum.empty() ? "" : ", GQA sum in " + p->group_sum))
                                        .c_str()
                                  : "");
    return *plans_.emplace(key, std::move(p)).first->second;
  }

  // Runs a plan: binds the uids to pointers and the workspace, on the compute stream.
  void execute(const Graph& g, const std::vector<int64_t>& uids, const std::vector<void*>& ptrs,
               void* workspace) {
    Desc pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
    set(pack.get(), CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64,
        static_cast<int64_t>(uids.size()), uids.data());
    set(pack.get(), CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR,
        static_cast<int64_t>(ptrs.size()), ptrs.data());
    set(pack.get(), CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
    finalize(pack.get());
    ATTNRES_CUDNN_CHECK(cudnnBackendExecute(handle_, g.plan(), pack.get()));
  }

 private:
  Cudnn() {
    stream();  // the runtime (device, stream, pool) first, so it outlives this object
    ATTNRES_CUDNN_CHECK(cudnnCreate(&handle_));
    ATTNRES_CUDNN_CHECK(cudnnSetStream(handle_, stream()));
  }
  ~Cudnn() {
    plans_.clear();
    cudnnDestroy(handle_);  // at exit: errors are ignored
  }
  Cudnn(const Cudnn&) = delete;
  Cudnn& operator=(const Cudnn&) = delete;

  cudnnHandle_t handle_ = nullptr;
  std::mutex mu_;
  std::unordered_map<Key, std::unique_ptr<Plans>, KeyHash> plans_;
};

const Plans& supported_plans(const AttnShape& s, const char* op) {
  const Plans& p = Cudnn::get().plans(s);
  if (!p.why.empty()) fail(op, ": cuDNN attention does not run this shape: ", p.why);
  return p;
}

void check_tensor(const Tensor& t, DType dt, const Shape& shape, const char* op,
                  const char* name) {
  ATTNRES_CHECK(t.defined() && t.is_cuda() && t.dtype() == dt && t.shape() == shape, op, ": ",
                name, " must be a ", dtype_name(dt), " CUDA tensor of the attention's shape, got ",
                t.describe());
  ATTNRES_CHECK(reinterpret_cast<uintptr_t>(t.raw()) % 16 == 0, op, ": ", name,
                " is not 16-byte aligned (cuDNN's tensors are declared so)");
}

// q, k, v (or dq, dk, dv) of a joint qkv (or dqkv): kernels::qkv_blocks. Every tensor is
// declared 16-byte aligned: with hd % 8 == 0 (precheck) the offsets keep a 16-byte
// aligned base so; checked anyway.
QkvBlocks<bf16> aligned_qkv_blocks(const Tensor& qkv, const AttnShape& s, const char* op,
                                   const char* name) {
  const QkvBlocks<bf16> p = qkv_blocks(static_cast<bf16*>(qkv.raw()), s);
  for (const void* ptr : {p.q, p.k, p.v})
    ATTNRES_CHECK(reinterpret_cast<uintptr_t>(ptr) % 16 == 0, op, ": a block of ", name,
                  " is not 16-byte aligned (head dim ", s.hd, ")");
  return p;
}

// Device memory of at least `bytes` from our allocator (cudaMallocAsync: 256-byte aligned).
Tensor workspace(int64_t bytes) {
  return Tensor::empty({std::max<int64_t>(1, (bytes + 3) / 4)}, DType::F32, Device::CUDA);
}

}  // namespace

std::string sdpa_unsupported(const AttnShape& s, DType dt) {
  if (s.dv() != s.hd) return "values of another width than the keys (MLA)";
  if (dt != DType::BF16) return dt == DType::F32 ? "fp32" : dtype_name(dt);
  if (::attnres::cuda::device_count() == 0) return "no CUDA device";
  return Cudnn::get().plans(s).why;
}

void sdpa_forward(Tensor& out, Tensor& lse, const Tensor& qkv, const AttnShape& s) {
  const char* op = "cudnn sdpa_forward";
  const Plans& p = supported_plans(s, op);
  const int64_t N = s.B * s.T;
  check_tensor(qkv, DType::BF16, {N, ld_qkv(s)}, op, "qkv");
  check_tensor(out, DType::BF16, {N, ld_out(s)}, op, "out");
  check_tensor(lse, DType::F32, {s.B, s.H, s.T}, op, "lse");
  const QkvBlocks<bf16> x = aligned_qkv_blocks(qkv, s, op, "qkv");
  // The scale as the CPU and CUDA kernels compute it (in float).
  float scale = 1.f / std::sqrt(static_cast<float>(s.hd));
  float neg_inf = -std::numeric_limits<float>::infinity();
  Tensor ws = workspace(p.fwd->workspace());
  Cudnn::get().execute(*p.fwd, {kQ, kK, kV, kO, kStats, kScale, kNegInf},
                       {x.q, x.k, x.v, out.raw(), lse.raw(), &scale, &neg_inf},
                       ws.raw());
}

void sdpa_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                   const Tensor& lse, const AttnShape& s, Store store) {
  const char* op = "cudnn sdpa_backward";
  const Plans& p = supported_plans(s, op);
  const int64_t N = s.B * s.T;
  check_tensor(qkv, DType::BF16, {N, ld_qkv(s)}, op, "qkv");
  check_tensor(dqkv, DType::BF16, {N, ld_qkv(s)}, op, "dqkv");
  check_tensor(out, DType::BF16, {N, ld_out(s)}, op, "out");
  check_tensor(dout, DType::BF16, {N, ld_out(s)}, op, "dout");
  check_tensor(lse, DType::F32, {s.B, s.H, s.T}, op, "lse");
  float scale = 1.f / std::sqrt(static_cast<float>(s.hd));
  float neg_inf = -std::numeric_limits<float>::infinity();
  float one = 1.f;
  // One allocation: the engine's workspace, then D (row sums) and the fp32 dQ accumulator.
  // The accumulator is zeroed here: whether the engine zeroes it itself is not in the
  // backend's documentation, and a pass over it costs less than a wrong dQ (to measure).
  const int64_t eng = round_up(p.bwd->workspace());
  Tensor ws = workspace(eng + rowsum_bytes(s) + dqacc_bytes(s));
  char* base = static_cast<char*>(ws.raw());
  ATTNRES_CUDA_CHECK(
      cudaMemsetAsync(base + eng + rowsum_bytes(s), 0, dqacc_bytes(s), stream()));
  // Store::Add: cuDNN writes one temporary joint dqkv (its q, k and v blocks cover every
  // column, so all of it is written), which is then added onto dqkv in one pass.
  Tensor tmp;
  Tensor& w = store == Store::Add ? (tmp = Tensor::empty(dqkv.shape(), DType::BF16, Device::CUDA))
                                  : dqkv;
  const QkvBlocks<bf16> x = aligned_qkv_blocks(qkv, s, op, "qkv"),
                        dx = aligned_qkv_blocks(w, s, op, "dqkv");
  Cudnn::get().execute(
      *p.bwd,
      {kQ, kK, kV, kO, kdO, kStats, kdQ, kdK, kdV, kRowSum, kdQAcc, kScale, kNegInf, kOne},
      {x.q, x.k, x.v, out.raw(), dout.raw(), lse.raw(), dx.q, dx.k, dx.v, base + eng,
       base + eng + rowsum_bytes(s), &scale, &neg_inf, &one},
      base);
  if (store == Store::Add) cuda::add_(dqkv, tmp);  // (kernels/cuda/reduce.h)
}

size_t sdpa_workspace_bytes(const AttnShape& s, DType dt) {
  if (!sdpa_unsupported(s, dt).empty()) return 0;
  const Plans& p = Cudnn::get().plans(s);
  const int64_t fwd = std::max<int64_t>(1, p.fwd->workspace());
  const int64_t add_tmp = 2 * (s.B * s.T * ld_qkv(s));  // Store::Add: bf16 joint dqkv
  const int64_t bwd = round_up(p.bwd->workspace()) + rowsum_bytes(s) + dqacc_bytes(s) + add_tmp;
  return static_cast<size_t>(std::max(fwd, bwd));
}

}  // namespace attnres::kernels::cuda::cudnn

#else  // !ATTNRES_HAVE_CUDNN: the interface, refusing.

namespace attnres::kernels::cuda::cudnn {

std::string sdpa_unsupported(const AttnShape&, DType) { return "this build has no cuDNN"; }

void sdpa_forward(Tensor&, Tensor&, const Tensor&, const AttnShape&) {
  fail("cudnn sdpa_forward: this build has no cuDNN");
}
void sdpa_backward(Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                   const AttnShape&, Store) {
  fail("cudnn sdpa_backward: this build has no cuDNN");
}
size_t sdpa_workspace_bytes(const AttnShape&, DType) { return 0; }

}  // namespace attnres::kernels::cuda::cudnn

#endif  // ATTNRES_HAVE_CUDNN
