// Token shards in llm.c's format (docs/model.md section 5).
//
//   bytes [0, 1024): 256 little-endian int32 header words
//       header[0] = 20240520, header[1] = 1  -> tokens are uint16
//       header[0] = 20240801, header[1] = 7  -> tokens are uint32
//       header[2] = number of tokens; the other words are zero
//   bytes [1024, end): the tokens; the file size must be exactly
//       1024 + count * token_size
//
// Anything else is rejected with an Error naming the file and the problem.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/span.h"

namespace attnres::data {

inline constexpr int32_t kShardMagicU16 = 20240520;
inline constexpr int32_t kShardVersionU16 = 1;
inline constexpr int32_t kShardMagicU32 = 20240801;
inline constexpr int32_t kShardVersionU32 = 7;
inline constexpr int kShardHeaderWords = 256;
inline constexpr int64_t kShardHeaderBytes = kShardHeaderWords * 4;

struct ShardInfo {
  std::string path;
  int64_t count = 0;    // tokens in the shard
  int token_bytes = 0;  // 2 (uint16) or 4 (uint32)
};

// Checks header and size of a shard without reading its tokens.
ShardInfo validate_shard(const std::string& path);

// Writes `tokens` as a shard with 2- or 4-byte tokens. Every id must fit the
// token size (and be >= 0). The file is replaced atomically.
void write_shard(const std::string& path, Span<const int32_t> tokens, int token_bytes);

// Expands a `data.train` / `data.val` value into shard paths, sorted: a file is
// itself, a directory means every `*.bin` file inside it, anything else is a
// glob pattern (POSIX glob()). `key` names the config key in error messages.
std::vector<std::string> resolve_data_spec(const std::string& spec, const std::string& key);

// A validated shard mapped read-only into memory. Move-only; unmaps on
// destruction. The mapping is shared with the page cache, so many loaders (or
// ranks on one node) reading the same shards cost no extra memory.
class MappedShard {
 public:
  explicit MappedShard(const std::string& path);
  ~MappedShard();
  MappedShard(MappedShard&& o) noexcept;
  MappedShard& operator=(MappedShard&& o) noexcept;
  MappedShard(const MappedShard&) = delete;
  MappedShard& operator=(const MappedShard&) = delete;

  const ShardInfo& info() const { return info_; }
  const std::string& path() const { return info_.path; }
  int64_t size() const { return info_.count; }

  // Copies tokens [offset, offset + out.size()) into `out` as int32. Throws if
  // the range is outside the shard or a uint32 token does not fit in int32.
  void read(int64_t offset, Span<int32_t> out) const;

 private:
  void unmap();

  ShardInfo info_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
};

}  // namespace attnres::data
