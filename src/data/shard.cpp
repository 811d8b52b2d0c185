#include "data/shard.h"

#include <fcntl.h>
#include <glob.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <dirent.h>
#include <limits>
#include <memory>

#include "core/error.h"
#include "core/fileio.h"

// The format is little-endian on disk and we read it with plain loads.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "token shards assume a little-endian host");

namespace attnres::data {
namespace {

// Reads exactly `bytes` at `offset`, or returns false on a short file.
bool pread_full(int fd, void* buf, size_t bytes, off_t offset, const std::string& path) {
  char* p = static_cast<char*>(buf);
  while (bytes > 0) {
    ssize_t n = ::pread(fd, p, bytes, offset);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail("token shard '", path, "': read error: ", std::strerror(errno));
    if (n == 0) return false;
    p += n;
    bytes -= static_cast<size_t>(n);
    offset += n;
  }
  return true;
}

// The whole check, on an open descriptor, so MappedShard validates the very
// file it maps (no window between check and open).
ShardInfo validate_open_shard(int fd, const std::string& path) {
  struct stat st{};
  if (::fstat(fd, &st) != 0) fail("token shard '", path, "': cannot stat: ", std::strerror(errno));
  if (!S_ISREG(st.st_mode)) fail("token shard '", path, "': not a regular file");
  const int64_t size = static_cast<int64_t>(st.st_size);
  if (size < kShardHeaderBytes)
    fail("token shard '", path, "': file is ", size, " bytes, too short for the ", kShardHeaderBytes,
         "-byte header");

  std::array<int32_t, kShardHeaderWords> header{};
  if (!pread_full(fd, header.data(), kShardHeaderBytes, 0, path))
    fail("token shard '", path, "': file shrank while reading the header");

  ShardInfo info;
  info.path = path;
  if (header[0] == kShardMagicU16) {
    if (header[1] != kShardVersionU16)
      fail("token shard '", path, "': bad version ", header[1], " for magic ", kShardMagicU16,
           " (uint16 tokens need version ", kShardVersionU16, ")");
    info.token_bytes = 2;
  } else if (header[0] == kShardMagicU32) {
    if (header[1] != kShardVersionU32)
      fail("token shard '", path, "': bad version ", header[1], " for magic ", kShardMagicU32,
           " (uint32 tokens need version ", kShardVersionU32, ")");
    info.token_bytes = 4;
  } else {
    fail("token shard '", path, "': bad magic number ", header[0], " (expected ", kShardMagicU16,
         " for uint16 or ", kShardMagicU32, " for uint32 tokens; not an llm.c token shard)");
  }
  if (header[2] < 0) fail("token shard '", path, "': negative token count ", header[2], " in header");
  info.count = header[2];

  const int64_t expected = kShardHeaderBytes + info.count * info.token_bytes;
  if (size < expected)
    fail("token shard '", path, "': truncated: header says ", info.count, " tokens (", expected,
         " bytes) but the file is ", size, " bytes");
  if (size > expected)
    fail("token shard '", path, "': size mismatch: header says ", info.count, " tokens (", expected,
         " bytes) but the file is ", size, " bytes (trailing data)");
  return info;
}

// Opens a shard read-only; the error says what the file was meant to be.
UniqueFd open_shard(const std::string& path) {
  try {
    return open_file(path, O_RDONLY);
  } catch (const Error& e) {
    fail("token shard ", e.what());
  }
}

bool is_regular_file(const std::string& path) {
  struct stat st{};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

bool has_glob_chars(const std::string& s) { return s.find_first_of("*?[") != std::string::npos; }

// RAII for glob_t.
struct GlobResult {
  glob_t g{};
  ~GlobResult() { ::globfree(&g); }
};

}  // namespace

ShardInfo validate_shard(const std::string& path) {
  UniqueFd fd = open_shard(path);
  return validate_open_shard(fd.get(), path);
}

void write_shard(const std::string& path, Span<const int32_t> tokens, int token_bytes) {
  if (token_bytes != 2 && token_bytes != 4)
    fail("token shard '", path, "': token size must be 2 or 4 bytes, got ", token_bytes);
  // The count lives in an int32 header word.
  if (tokens.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max()))
    fail("token shard '", path, "': ", tokens.size(), " tokens exceed the format's limit of ",
         std::numeric_limits<int32_t>::max(), " per shard");
  const int64_t max_id = token_bytes == 2 ? 65535 : std::numeric_limits<int32_t>::max();
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] < 0 || tokens[i] > max_id)
      fail("token shard '", path, "': token ", i, " has id ", tokens[i], ", which does not fit in ",
           token_bytes == 2 ? "uint16" : "uint32 (as a non-negative int32)");

  std::array<int32_t, kShardHeaderWords> header{};
  header[0] = token_bytes == 2 ? kShardMagicU16 : kShardMagicU32;
  header[1] = token_bytes == 2 ? kShardVersionU16 : kShardVersionU32;
  header[2] = static_cast<int32_t>(tokens.size());

  AtomicFileWriter out(path);
  out.write(header.data(), kShardHeaderBytes);
  // Convert in bounded chunks so a large shard needs no second full-size buffer.
  constexpr size_t kChunk = 1 << 16;
  if (token_bytes == 2) {
    std::vector<uint16_t> buf;
    for (size_t i = 0; i < tokens.size(); i += kChunk) {
      size_t n = std::min(kChunk, tokens.size() - i);
      buf.assign(tokens.begin() + i, tokens.begin() + i + n);
      out.write(buf.data(), n * 2);
    }
  } else {
    // Non-negative int32 has the same bytes as uint32.
    out.write(tokens.data(), tokens.size() * 4);
  }
  out.commit();
}

std::vector<std::string> resolve_data_spec(const std::string& spec, const std::string& key) {
  if (spec.empty()) fail(key, ": no token shards given (empty value)");
  struct stat st{};
  std::vector<std::string> paths;
  if (::stat(spec.c_str(), &st) == 0 && S_ISREG(st.st_mode)) {
    paths.push_back(spec);
  } else if (::stat(spec.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    DIR* dir = ::opendir(spec.c_str());
    if (!dir) fail(key, " = '", spec, "': cannot read directory: ", std::strerror(errno));
    std::unique_ptr<DIR, int (*)(DIR*)> guard(dir, ::closedir);
    std::string prefix = spec.back() == '/' ? spec : spec + "/";
    while (const dirent* e = ::readdir(dir)) {
      std::string name = e->d_name;
      // Hidden files are skipped, as a glob "dir/*.bin" would.
      if (name[0] != '.' && name.size() > 4 && name.compare(name.size() - 4, 4, ".bin") == 0 &&
          is_regular_file(prefix + name))
        paths.push_back(prefix + name);
    }
    if (paths.empty()) fail(key, " = '", spec, "': directory contains no *.bin token shards");
  } else {
    GlobResult r;
    int rc = ::glob(spec.c_str(), 0, nullptr, &r.g);
    if (rc == GLOB_NOSPACE) fail(key, " = '", spec, "': out of memory expanding the glob");
    if (rc == GLOB_ABORTED) fail(key, " = '", spec, "': read error while expanding the glob");
    if (rc == 0)
      for (size_t i = 0; i < r.g.gl_pathc; ++i)
        if (is_regular_file(r.g.gl_pathv[i])) paths.emplace_back(r.g.gl_pathv[i]);
    if (paths.empty())
      fail(key, " = '", spec, "': ",
           has_glob_chars(spec) ? "the glob matches no files" : "no such file or directory");
  }
  // Byte order, independent of the locale (glob's sort follows LC_COLLATE).
  std::sort(paths.begin(), paths.end());
  return paths;
}

// ---------------------------------------------------------------------------
// MappedShard

MappedShard::MappedShard(const std::string& path) {
  UniqueFd fd = open_shard(path);
  info_ = validate_open_shard(fd.get(), path);
  map_bytes_ = static_cast<size_t>(kShardHeaderBytes + info_.count * info_.token_bytes);
  void* p = ::mmap(nullptr, map_bytes_, PROT_READ, MAP_SHARED, fd.get(), 0);
  if (p == MAP_FAILED) fail("token shard '", path, "': mmap failed: ", std::strerror(errno));
  map_ = p;
  // The descriptor can close now: the mapping keeps the file alive.
}

MappedShard::~MappedShard() { unmap(); }

MappedShard::MappedShard(MappedShard&& o) noexcept
    : info_(std::move(o.info_)), map_(o.map_), map_bytes_(o.map_bytes_) {
  o.map_ = nullptr;
  o.map_bytes_ = 0;
}

MappedShard& MappedShard::operator=(MappedShard&& o) noexcept {
  if (this != &o) {
    unmap();
    info_ = std::move(o.info_);
    map_ = o.map_;
    map_bytes_ = o.map_bytes_;
    o.map_ = nullptr;
    o.map_bytes_ = 0;
  }
  return *this;
}

void MappedShard::unmap() {
  if (map_) ::munmap(map_, map_bytes_);
  map_ = nullptr;
  map_bytes_ = 0;
}

void MappedShard::read(int64_t offset, Span<int32_t> out) const {
  const int64_t n = static_cast<int64_t>(out.size());
  if (offset < 0 || offset > info_.count || n > info_.count - offset)
    fail("token shard '", info_.path, "': read of tokens [", offset, ", ", offset + n,
         ") is outside the shard's ", info_.count, " tokens");
  const char* base = static_cast<const char*>(map_) + kShardHeaderBytes;
  if (info_.token_bytes == 2) {
    const uint16_t* src = reinterpret_cast<const uint16_t*>(base) + offset;
    for (int64_t i = 0; i < n; ++i) out[i] = src[i];
  } else {
    const uint32_t* src = reinterpret_cast<const uint32_t*>(base) + offset;
    for (int64_t i = 0; i < n; ++i) {
      if (src[i] > static_cast<uint32_t>(std::numeric_limits<int32_t>::max()))
        fail("token shard '", info_.path, "': token ", offset + i, " has id ", src[i],
             ", too large for an int32 token id");
      out[i] = static_cast<int32_t>(src[i]);
    }
  }
}

}  // namespace attnres::data
