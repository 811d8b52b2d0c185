#include "core/tensor.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "core/device.h"

namespace attnres {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::F64: return 8;
    case DType::BF16: return 2;
    case DType::I32: return 4;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::F64: return "F64";
    case DType::BF16: return "BF16";
    case DType::I32: return "I32";
  }
  return "?";
}

DType dtype_from_name(const std::string& name) {
  for (DType t : {DType::F32, DType::F64, DType::BF16, DType::I32})
    if (name == dtype_name(t)) return t;
  fail("unsupported dtype '", name, "'");
}

const char* device_name(Device d) { return d == Device::CPU ? "cpu" : "cuda"; }

std::string shape_str(const Shape& s) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << "]";
  return os.str();
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) {
    ATTNRES_CHECK(d >= 0, "negative dimension in shape ", shape_str(s));
    n *= d;
  }
  return n;
}

namespace {
// The host side of tensor_memory. Process-wide like the CUDA allocator's own
// count: every tensor of the process draws from one heap. Atomic, as tensors
// are made and freed on several threads (executor, data loader).
struct HostCounters {
  std::atomic<size_t> in_use{0}, peak{0};
  void add(size_t bytes) {
    const size_t now = in_use.fetch_add(bytes) + bytes;
    size_t p = peak.load();
    while (now > p && !peak.compare_exchange_weak(p, now)) {
    }
  }
};
HostCounters& host_counters() {
  static HostCounters c;
  return c;
}
}  // namespace

TensorMemory tensor_memory(Device d) {
  if (d == Device::CUDA) {
    const cuda::MemoryStats s = cuda::memory_stats();
    return {s.in_use, s.peak};
  }
  return {host_counters().in_use.load(), host_counters().peak.load()};
}

void reset_tensor_peak(Device d) {
  if (d == Device::CUDA) cuda::reset_peak_memory();
  else host_counters().peak.store(host_counters().in_use.load());
}

Storage::Storage(size_t bytes, Device device) : bytes_(bytes), device_(device) {
  if (device == Device::CUDA) {
    data_ = cuda::alloc(bytes);
    return;
  }
  // aligned_alloc needs a size that is a multiple of the alignment.
  size_t rounded = (bytes + 63) / 64 * 64;
  data_ = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
  if (!data_) fail("out of host memory allocating ", bytes, " bytes");
  host_counters().add(bytes);
}

Storage::~Storage() {
  if (device_ == Device::CUDA) {
    cuda::release(data_);
  } else {
    std::free(data_);
    host_counters().in_use.fetch_sub(bytes_);
  }
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  Tensor t;
  t.shape_ = shape;
  t.numel_ = shape_numel(shape);
  t.dtype_ = dtype;
  t.device_ = device;
  t.storage_ = std::make_shared<Storage>(t.nbytes(), device);
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.zero_();
  return t;
}

template <typename T>
Tensor Tensor::from_vector(const std::vector<T>& values, const Shape& shape) {
  Tensor t = empty(shape, dtype_of<T>());
  ATTNRES_CHECK(static_cast<int64_t>(values.size()) == t.numel(), "from_vector: ", values.size(),
                " values for shape ", shape_str(shape));
  std::memcpy(t.raw(), values.data(), t.nbytes());
  return t;
}
template Tensor Tensor::from_vector<float>(const std::vector<float>&, const Shape&);
template Tensor Tensor::from_vector<double>(const std::vector<double>&, const Shape&);
template Tensor Tensor::from_vector<bf16_t>(const std::vector<bf16_t>&, const Shape&);
template Tensor Tensor::from_vector<int32_t>(const std::vector<int32_t>&, const Shape&);

int64_t Tensor::dim(int i) const {
  int n = ndim();
  if (i < 0) i += n;
  ATTNRES_CHECK(i >= 0 && i < n, "dim ", i, " of a tensor with shape ", shape_str(shape_));
  return shape_[i];
}

void* Tensor::raw() const {
  ATTNRES_CHECK(defined(), "raw() of an undefined tensor");
  return static_cast<char*>(storage_->data()) + offset_bytes_;
}

Tensor Tensor::reshape(const Shape& shape) const {
  ATTNRES_CHECK(shape_numel(shape) == numel_, "reshape ", shape_str(shape_), " -> ",
                shape_str(shape));
  Tensor t = *this;
  t.shape_ = shape;
  return t;
}

Tensor Tensor::rows(int64_t begin, int64_t count) const {
  ATTNRES_CHECK(ndim() >= 1 && begin >= 0 && count >= 0 && begin + count <= shape_[0],
                "rows(", begin, ", ", count, ") of ", shape_str(shape_));
  int64_t row_elems = shape_[0] == 0 ? 0 : numel_ / shape_[0];
  Tensor t = *this;
  t.shape_[0] = count;
  t.numel_ = count * row_elems;
  t.offset_bytes_ += static_cast<size_t>(begin * row_elems) * dtype_size(dtype_);
  return t;
}

Tensor Tensor::joined_rows(const std::vector<Tensor>& parts) {
  if (parts.empty()) return Tensor();
  Tensor t = parts[0];
  if (!t.defined() || t.ndim() < 1) return Tensor();
  for (size_t i = 1; i < parts.size(); ++i) {
    const Tensor& b = parts[i];
    if (!b.defined() || b.storage_ != t.storage_ || b.dtype_ != t.dtype_ ||
        b.ndim() != t.ndim() ||
        !std::equal(t.shape_.begin() + 1, t.shape_.end(), b.shape_.begin() + 1) ||
        b.offset_bytes_ != t.offset_bytes_ + t.nbytes())
      return Tensor();
    t.shape_[0] += b.shape_[0];
    t.numel_ += b.numel_;
  }
  return t;
}

Tensor Tensor::clone() const {
  Tensor t = empty(shape_, dtype_, device_);
  t.copy_from(*this);
  return t;
}

namespace {
// Element i of a host tensor of any dtype, widened to double (exact for every
// dtype we have), and the narrowing store back.
double load_as_double(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::F32: return static_cast<const float*>(p)[i];
    case DType::F64: return static_cast<const double*>(p)[i];
    case DType::I32: return static_cast<const int32_t*>(p)[i];
    case DType::BF16: return bf16_to_float(static_cast<const bf16_t*>(p)[i]);
  }
  return 0;
}
void store_from_double(void* p, DType t, int64_t i, double v) {
  switch (t) {
    case DType::F32: static_cast<float*>(p)[i] = static_cast<float>(v); break;
    case DType::F64: static_cast<double*>(p)[i] = v; break;
    case DType::I32: static_cast<int32_t*>(p)[i] = static_cast<int32_t>(v); break;
    // Via float: double -> float rounding then float -> bf16 rounding can
    // differ from a direct rounding only on exact float ties, which a value
    // that came from float never hits.
    case DType::BF16: static_cast<bf16_t*>(p)[i] = float_to_bf16(static_cast<float>(v)); break;
  }
}
}  // namespace

Tensor Tensor::to(DType dtype) const {
  ATTNRES_CHECK(is_cpu(), "to(dtype) is a host conversion; move ", describe(), " to the cpu first");
  if (dtype == dtype_) return clone();
  Tensor t = empty(shape_, dtype, device_);
  const void* src = raw();
  void* dst = t.raw();
  if (dtype_ == DType::F32 && dtype == DType::BF16) {  // the hot case: weights for a bf16 run
    const float* s = static_cast<const float*>(src);
    bf16_t* d = static_cast<bf16_t*>(dst);
    for (int64_t i = 0; i < numel_; ++i) d[i] = float_to_bf16(s[i]);
    return t;
  }
  for (int64_t i = 0; i < numel_; ++i) store_from_double(dst, dtype, i, load_as_double(src, dtype_, i));
  return t;
}

Tensor Tensor::to(Device device) const {
  Tensor t = empty(shape_, dtype_, device);
  t.copy_from(*this);
  return t;
}

void Tensor::zero_() {
  if (is_cuda()) cuda::zero(raw(), nbytes());
  else std::memset(raw(), 0, nbytes());
}

void Tensor::copy_from(const Tensor& src) {
  ATTNRES_CHECK(src.numel_ == numel_ && src.dtype_ == dtype_, "copy_from ", src.describe(),
                " into ", describe());
  if (is_cpu() && src.is_cpu()) {
    std::memmove(raw(), src.raw(), nbytes());
    return;
  }
  auto side = [](const Tensor& t) { return t.is_cpu() ? cuda::Side::Host : cuda::Side::Device; };
  cuda::copy(raw(), side(*this), src.raw(), side(src), nbytes());
}

std::string Tensor::describe() const {
  if (!defined()) return "undefined tensor";
  return detail::concat(dtype_name(dtype_), shape_str(shape_), " ", device_name(device_));
}

}  // namespace attnres
