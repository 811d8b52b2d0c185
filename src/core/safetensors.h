// safetensors files (huggingface/safetensors), read and written exactly:
//
//   bytes 0..7   N, the header length, unsigned little-endian 64-bit
//   next N bytes UTF-8 JSON object starting with '{', padded with spaces so
//                that N is a multiple of 8 (the data then starts 8-aligned):
//                  {"__metadata__": {"format": "pt", ...string: string},
//                   "name": {"dtype": "F32", "shape": [d0, ...],
//                            "data_offsets": [begin, end]}, ...}
//   the rest     the data buffer: little-endian, row-major, every byte owned
//                by exactly one tensor (no holes, no overlap, no trailing bytes).
//                Offsets are relative to the buffer start (file offset 8 + N).
//
// Readers reject anything else with an attnres::Error naming the file and
// the rule broken, so a damaged weights file is never silently loaded.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace attnres {

struct NamedTensor {
  std::string name;
  Tensor tensor;
};

// One header entry. Offsets are relative to the data buffer, as in the file.
struct TensorMeta {
  DType dtype = DType::F32;
  Shape shape;
  uint64_t data_begin = 0;
  uint64_t data_end = 0;
};

// Largest header accepted (the Rust reference's MAX_HEADER_SIZE): a corrupt
// length field must not make us allocate gigabytes.
constexpr uint64_t kSafetensorsMaxHeader = 100'000'000;

// Write `tensors` (host tensors, any of F32/F64/BF16/I32) in the given order,
// packed contiguously. `metadata` lands in "__metadata__" next to
// "format": "pt" (which Transformers requires; a "format" key in `metadata`
// overrides it). Atomic: written to a temporary file, fsync'd, renamed.
// Throws on duplicate or reserved names and on device tensors.
void write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// All tensors, as the stored dtype on the CPU, in data-buffer order (which is
// the order they were written in).
std::vector<NamedTensor> read_safetensors(const std::string& path);

// The validated header only (reads 8 + N bytes and stats the file): cheap
// inspection of names, dtypes and shapes without loading the data.
std::map<std::string, TensorMeta> read_safetensors_header(const std::string& path);
// The "__metadata__" map (empty when absent).
std::map<std::string, std::string> read_safetensors_metadata(const std::string& path);

}  // namespace attnres
