// Tensor: shape + dtype + device over reference-counted storage.
//
// Tensors are value types with shared storage (like torch.Tensor): copying a
// Tensor makes another view of the same bytes, `clone()` copies the bytes.
// Layout is always dense row-major; sub-tensors along dim 0 (`rows`) and
// reshapes share storage.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "core/error.h"

namespace attnres {

enum class DType : uint8_t { F32, F64, BF16, I32 };
enum class Device : uint8_t { CPU, CUDA };

size_t dtype_size(DType t);
const char* dtype_name(DType t);   // safetensors spelling: "F32", "F64", "BF16", "I32"
DType dtype_from_name(const std::string& name);  // throws on unknown
const char* device_name(Device d);

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& s);  // "[2, 3]"
int64_t shape_numel(const Shape& s);

// C++ type <-> DType (F32 = float, F64 = double, I32 = int32_t, BF16 = bf16_t).
template <typename T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::F32; }
template <> constexpr DType dtype_of<double>() { return DType::F64; }
template <> constexpr DType dtype_of<int32_t>() { return DType::I32; }
template <> constexpr DType dtype_of<bf16_t>() { return DType::BF16; }

// Bytes held by live tensors on a device, and their high-water mark since the
// last reset_tensor_peak: what activation memory is measured with. On the CPU
// Storage counts them; on CUDA the caching allocator does (cuda::memory_stats).
struct TensorMemory {
  size_t in_use = 0, peak = 0;
};
TensorMemory tensor_memory(Device d);
void reset_tensor_peak(Device d);

// Owns one allocation on one device. Host memory is 64-byte aligned; device
// memory comes from the CUDA caching allocator (core/device.h).
class Storage {
 public:
  Storage(size_t bytes, Device device);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
  Device device_;
};

class Tensor {
 public:
  Tensor() = default;  // undefined tensor (defined() == false)
  static Tensor empty(const Shape& shape, DType dtype = DType::F32, Device device = Device::CPU);
  static Tensor zeros(const Shape& shape, DType dtype = DType::F32, Device device = Device::CPU);
  // Host tensor holding a copy of `values`.
  template <typename T>
  static Tensor from_vector(const std::vector<T>& values, const Shape& shape);

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int ndim() const { return static_cast<int>(shape_.size()); }
  int64_t dim(int i) const;  // negative i counts from the end
  int64_t numel() const { return numel_; }
  size_t nbytes() const { return static_cast<size_t>(numel_) * dtype_size(dtype_); }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  bool is_cpu() const { return device_ == Device::CPU; }
  bool is_cuda() const { return device_ == Device::CUDA; }

  // Typed pointer to the first element; checks that T matches the dtype.
  template <typename T>
  T* data() const {
    ATTNRES_CHECK(defined(), "data() of an undefined tensor");
    ATTNRES_CHECK(dtype_of<T>() == dtype_, "tensor is ", dtype_name(dtype_), ", accessed as ",
                  dtype_name(dtype_of<T>()));
    return reinterpret_cast<T*>(raw());
  }
  void* raw() const;

  Tensor reshape(const Shape& shape) const;           // same numel, shares storage
  Tensor rows(int64_t begin, int64_t count) const;    // slice of dim 0, shares storage
  // One view of the parts' rows, one part after the other, when each part's
  // elements start where the one before it ends, in the same allocation with
  // the same dtype and row shape (e.g. consecutive rows() slices of one
  // tensor, model/params.h's joined weights); an undefined tensor otherwise.
  static Tensor joined_rows(const std::vector<Tensor>& parts);
  Tensor clone() const;                               // deep copy
  Tensor to(DType dtype) const;                       // host conversion (copy)
  Tensor to(Device device) const;                     // copy to device (or clone if same)
  void zero_();
  void copy_from(const Tensor& src);                  // same numel and dtype, any devices
  std::string describe() const;                       // "F32[2, 3] cpu"

 private:
  std::shared_ptr<Storage> storage_;
  size_t offset_bytes_ = 0;
  Shape shape_;
  int64_t numel_ = 0;
  DType dtype_ = DType::F32;
  Device device_ = Device::CPU;
};

}  // namespace attnres
