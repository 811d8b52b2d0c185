// CUDA embedding (see kernels/embedding.h).
//
// Forward: one block per token row, copying the table row in 16-byte packs
// when the pointers and d allow it. Ids are checked on the device: a block
// whose id is outside [0, V) writes nothing and lowers a "first bad position"
// word with atomicMin (deterministic: the minimum does not depend on the
// order), which the host reads after the launch and turns into the same error
// as the CPU's (or, while the step is captured into a CUDA graph, after the
// graph ran: core/cuda/runtime.cuh's StatusSlot).
//
// Backward (deterministic, no float atomics): the positions are bucketed by
// id on the device with CUB's radix sort, which is stable, so each id's
// positions stay in ascending order (ids ascending too); a run-length encoding
// gives the distinct ids and their counts, a scan the offsets. One block per
// (distinct id, column tile) then adds its rows into dweight in ascending
// position order: the same additions, in the same order, as the CPU's serial
// loop. Ids are checked first (the same device-side check and error as the
// forward), so the sort only sees ids in [0, V); in a captured graph the
// check is read after the run, so the adding kernel skips an id outside
// [0, V) instead of writing past dweight (the step then fails with the
// check's error).
#include "kernels/cuda/embedding.h"

#include <algorithm>
#include <climits>
#include <cstdint>

#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_run_length_encode.cuh>
#include <cub/device/device_scan.cuh>

#include "core/device.h"
#include "kernels/cuda/common.cuh"

namespace attnres::kernels::cuda {

namespace {

constexpr int kMaxThreads = 256;

int threads_for(int64_t packs) {
  const int64_t t = ceil_div(packs, 32) * 32;
  return static_cast<int>(std::max<int64_t>(32, std::min<int64_t>(t, kMaxThreads)));
}

template <typename T, int N>
__global__ void embedding_forward_kernel(T* out, const T* weight, const int32_t* tokens,
                                         int64_t d, int64_t V,
                                         unsigned long long* first_bad) {
  const int64_t row = blockIdx.x;
  const int32_t id = tokens[row];
  if (id < 0 || id >= V) {
    if (threadIdx.x == 0) atomicMin(first_bad, static_cast<unsigned long long>(row));
    return;
  }
  const T* src = weight + static_cast<int64_t>(id) * d;
  T* dst = out + row * d;
  const int64_t packs = d / N;  // N divides d
  for (int64_t k = threadIdx.x; k < packs; k += blockDim.x) store<N>(dst + k * N, load<N>(src + k * N));
}

// Marks the first position whose id is outside [0, V) and writes iota[i] = i
// (the values the sort carries along with the ids).
__global__ void check_ids_kernel(const int32_t* tokens, int64_t N, int64_t V, int32_t* iota,
                                 unsigned long long* first_bad) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < N; i += stride) {
    const int32_t id = tokens[i];
    if (id < 0 || id >= V) atomicMin(first_bad, static_cast<unsigned long long>(i));
    if (iota) iota[i] = static_cast<int32_t>(i);
  }
}

// Block (u, tile), u < *n_runs: distinct id ids[u], whose positions are
// positions[offsets[u] .. offsets[u+1]) in ascending order; the thread's pack
// of columns is tile * blockDim.x + threadIdx.x. The block stages the
// positions in shared memory, kTile at a time; each thread keeps kBatch rows'
// loads in flight and adds them in order (a frequent id has thousands of
// positions, summed one after another).
constexpr int kTile = 512;
constexpr int kBatch = 16;

template <typename T, int N>
__global__ void embedding_backward_kernel(float* dweight, const T* dout, const uint32_t* ids,
                                          const int32_t* offsets, const int32_t* positions,
                                          const int32_t* n_runs, int64_t d, int64_t V) {
  __shared__ int32_t s_pos[kTile];
  if (int(blockIdx.x) >= *n_runs) return;  // the grid is sized for the most runs possible
  const int64_t id = ids[blockIdx.x];
  if (id >= V) return;  // flagged (ids are unsigned here: a negative one is large too)
  const int64_t k = int64_t(blockIdx.y) * blockDim.x + threadIdx.x;
  const bool active = k < d / N;
  const int32_t beg = offsets[blockIdx.x], end = offsets[blockIdx.x + 1];
  float* dst = dweight + id * d + k * N;
  const T* src = dout + k * N;
  Vec<float, N> acc;
  if (active) acc = load<N>(dst);
  for (int32_t base = beg; base < end; base += kTile) {
    const int cnt = end - base < kTile ? end - base : kTile;
    __syncthreads();  // the previous tile is consumed
    for (int t = threadIdx.x; t < cnt; t += blockDim.x) s_pos[t] = positions[base + t];
    __syncthreads();
    if (!active) continue;
    int u = 0;
    for (; u + kBatch <= cnt; u += kBatch) {
      Vec<T, N> v[kBatch];
#pragma unroll
      for (int b = 0; b < kBatch; ++b) v[b] = load<N>(src + static_cast<int64_t>(s_pos[u + b]) * d);
#pragma unroll
      for (int b = 0; b < kBatch; ++b)
#pragma unroll
        for (int e = 0; e < N; ++e) acc.v[e] += to_f32(v[b].v[e]);
    }
    for (; u < cnt; ++u) {
      const Vec<T, N> v = load<N>(src + static_cast<int64_t>(s_pos[u]) * d);
#pragma unroll
      for (int e = 0; e < N; ++e) acc.v[e] += to_f32(v.v[e]);
    }
  }
  if (active) store<N>(dst, acc);
}

}  // namespace

void embedding_forward(Tensor& out, const Tensor& weight, const Tensor& tokens) {
  const char* op = "embedding_forward";
  const int64_t N = tokens.numel(), V = weight.dim(0), d = weight.dim(1);
  if (N == 0) return;
  ATTNRES_CHECK(N <= INT_MAX, op, ": ", N, " tokens is more than one launch handles");
  const int32_t* tok = dptr<int32_t>(tokens);
  const ::attnres::cuda::StatusSlot flag({op, "token", tok, V}, /*value=*/false);
  unsigned long long* bad = &flag.get()->bad;
  dispatch_float(weight, op, [&](auto tag) {
    using T = decltype(tag);
    constexpr int W = pack_of<T>();
    T* po = dptr<T>(out);
    const T* pw = dptr<T>(weight);
    const unsigned grid = static_cast<unsigned>(N);
    if (d % W == 0 && aligned(po, 16) && aligned(pw, 16))
      embedding_forward_kernel<T, W><<<grid, threads_for(d / W), 0, stream()>>>(po, pw, tok, d, V,
                                                                              bad);
    else
      embedding_forward_kernel<T, 1><<<grid, threads_for(d), 0, stream()>>>(po, pw, tok, d, V,
                                                                          bad);
    ATTNRES_CUDA_CHECK_LAUNCH();
  });
  flag.settle();
}

void embedding_backward(Tensor& dweight, const Tensor& dout, const Tensor& tokens) {
  const char* op = "embedding_backward";
  const int64_t N = tokens.numel(), V = dweight.dim(0), d = dweight.dim(1);
  if (N == 0) return;
  ATTNRES_CHECK(N < INT_MAX, op, ": ", N, " tokens is more than the int32 sort handles");
  const int32_t* tok = dptr<int32_t>(tokens);
  const int n = static_cast<int>(N);

  // Int32 scratch: iota [N], sorted ids [N], sorted positions [N], distinct
  // ids [N], counts [N+1], offsets [N+1], number of runs [1].
  Tensor scratch = Tensor::empty({6 * N + 3}, DType::I32, Device::CUDA);
  int32_t* iota = static_cast<int32_t*>(scratch.raw());
  uint32_t* ids_sorted = reinterpret_cast<uint32_t*>(iota + N);
  int32_t* pos_sorted = iota + 2 * N;
  uint32_t* uniq = reinterpret_cast<uint32_t*>(iota + 3 * N);
  int32_t* counts = iota + 4 * N;
  int32_t* offsets = counts + N + 1;
  int32_t* n_runs = offsets + N + 1;

  // Check the ids first: the sort must only see ids in [0, V).
  {
    const ::attnres::cuda::StatusSlot flag({op, "token", tok, V}, /*value=*/false);
    const int64_t blocks = std::min<int64_t>(ceil_div(N, 256), 4096);
    check_ids_kernel<<<static_cast<unsigned>(blocks), 256, 0, stream()>>>(tok, N, V, iota,
                                                                           &flag.get()->bad);
    ATTNRES_CUDA_CHECK_LAUNCH();
    flag.settle();
  }
  if (d == 0) return;

  // Bucket positions by id: stable radix sort on the id bits in use, then
  // runs (distinct ids, ascending, and their counts) and offsets.
  int end_bit = 1;
  while (end_bit < 31 && (int64_t(1) << end_bit) < V) ++end_bit;
  const auto* keys = reinterpret_cast<const uint32_t*>(tok);
  size_t sort_bytes = 0, rle_bytes = 0, scan_bytes = 0;
  ATTNRES_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, keys, ids_sorted, iota,
                                                     pos_sorted, n, 0, end_bit, stream()));
  ATTNRES_CUDA_CHECK(cub::DeviceRunLengthEncode::Encode(nullptr, rle_bytes, ids_sorted, uniq,
                                                        counts, n_runs, n, stream()));
  ATTNRES_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(nullptr, scan_bytes, counts, offsets, n + 1,
                                                   stream()));
  const size_t temp_bytes = std::max({sort_bytes, rle_bytes, scan_bytes, size_t(1)});
  Tensor temp = Tensor::empty({static_cast<int64_t>(ceil_div(int64_t(temp_bytes), 4))}, DType::I32,
                              Device::CUDA);
  size_t bytes = temp_bytes;
  ATTNRES_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.raw(), bytes, keys, ids_sorted, iota,
                                                     pos_sorted, n, 0, end_bit, stream()));
  // counts[runs..N] stay 0, so the scan's entry at the number of runs is N.
  ATTNRES_CUDA_CHECK(cudaMemsetAsync(counts, 0, sizeof(int32_t) * (N + 1), stream()));
  bytes = temp_bytes;
  ATTNRES_CUDA_CHECK(cub::DeviceRunLengthEncode::Encode(temp.raw(), bytes, ids_sorted, uniq,
                                                        counts, n_runs, n, stream()));
  bytes = temp_bytes;
  ATTNRES_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(temp.raw(), bytes, counts, offsets, n + 1,
                                                   stream()));

  // One block per possible run (blocks past the actual number exit at once).
  const int64_t max_runs = std::min(N, V);
  float* pdw = dptr<float>(dweight);
  dispatch_float(dout, op, [&](auto tag) {
    using T = decltype(tag);
    constexpr int W = pack_of<T>();  // 4 floats, or 8 bf16 into 8 floats
    const T* pd = dptr<T>(dout);
    const bool vec = d % W == 0 && aligned(pd, 16) && aligned(pdw, sizeof(float) * W);
    const int64_t packs = vec ? d / W : d;
    const int threads = threads_for(packs);
    ATTNRES_CHECK(ceil_div(packs, threads) <= 65535, op, ": d = ", d, " is too wide");
    const dim3 grid(static_cast<unsigned>(max_runs), static_cast<unsigned>(ceil_div(packs, threads)));
    if (vec)
      embedding_backward_kernel<T, W>
          <<<grid, threads, 0, stream()>>>(pdw, pd, uniq, offsets, pos_sorted, n_runs, d, V);
    else
      embedding_backward_kernel<T, 1>
          <<<grid, threads, 0, stream()>>>(pdw, pd, uniq, offsets, pos_sorted, n_runs, d, V);
    ATTNRES_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace attnres::kernels::cuda
