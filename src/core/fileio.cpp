#include "core/fileio.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <vector>

#include "core/error.h"

namespace attnres {

namespace fs = std::filesystem;

namespace {

// strerror() is not thread-safe; std::error_code's message is.
std::string os_error(int err) { return std::error_code(err, std::generic_category()).message(); }

}  // namespace

// ---------------------------------------------------------------------------
// Descriptors and raw I/O
// ---------------------------------------------------------------------------

void UniqueFd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);  // close errors after fsync carry no extra information
  fd_ = fd;
}

UniqueFd open_file(const std::string& path, int flags, unsigned mode) {
  int fd;
  do {
    fd = ::open(path.c_str(), flags | O_CLOEXEC, static_cast<mode_t>(mode));
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    const int err = errno;
    const char* what = (flags & (O_WRONLY | O_RDWR)) ? "for writing" : "for reading";
    fail(path, ": cannot open ", what, ": ", os_error(err));
  }
  return UniqueFd(fd);
}

void write_all(int fd, const void* data, size_t n, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    // Linux transfers at most ~2 GiB per call; larger tensors need several.
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      fail(path, ": write failed: ", os_error(errno));
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
}

void pread_exact(int fd, void* data, size_t n, uint64_t offset, const std::string& path) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t r = ::pread(fd, p, n, static_cast<off_t>(offset));
    if (r < 0) {
      if (errno == EINTR) continue;
      fail(path, ": read failed at byte ", offset, ": ", os_error(errno));
    }
    if (r == 0) fail(path, ": truncated: unexpected end of file at byte ", offset);
    p += r;
    n -= static_cast<size_t>(r);
    offset += static_cast<uint64_t>(r);
  }
}

uint64_t file_size(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) fail(path, ": cannot stat: ", os_error(errno));
  if (!S_ISREG(st.st_mode)) fail(path, ": not a regular file");
  return static_cast<uint64_t>(st.st_size);
}

void fsync_path(const std::string& path) {
  // O_RDONLY works for both files and directories; fsync on a read-only
  // descriptor still flushes the inode's data and metadata on Linux.
  UniqueFd fd = open_file(path, O_RDONLY);
  if (::fsync(fd.get()) != 0) fail(path, ": fsync failed: ", os_error(errno));
}

std::string parent_dir(const std::string& path) {
  fs::path p(path);
  // "dir/" has an empty filename: its parent is the parent of "dir".
  if (!p.has_filename()) p = p.parent_path();
  fs::path parent = p.parent_path();
  return parent.empty() ? std::string(".") : parent.string();
}

void rename_durable(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0)
    fail(to, ": cannot rename '", from, "' to it: ", os_error(errno));
  const std::string to_dir = parent_dir(to), from_dir = parent_dir(from);
  fsync_path(to_dir);
  if (fs::path(from_dir).lexically_normal() != fs::path(to_dir).lexically_normal())
    fsync_path(from_dir);
}

// ---------------------------------------------------------------------------
// Atomic writes
// ---------------------------------------------------------------------------

AtomicFileWriter::AtomicFileWriter(std::string path) : path_(std::move(path)) {
  const fs::path p(path_);
  if (!p.has_filename()) fail(path_, ": not a file name");
  // Hidden name in the same directory (rename is only atomic within one file
  // system). O_EXCL plus a counter avoids clashing with another writer of the
  // same file, or a leftover from a crashed process that had our pid.
  const std::string dir = parent_dir(path_);
  const std::string stem =
      (fs::path(dir) / ("." + p.filename().string() + ".tmp." + std::to_string(::getpid()))).string();
  for (int attempt = 0;; ++attempt) {
    temp_path_ = stem + "." + std::to_string(attempt);
    const int fd = ::open(temp_path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd >= 0) {
      fd_.reset(fd);
      break;
    }
    if (errno == EINTR || (errno == EEXIST && attempt < 1000)) continue;
    fail(path_, ": cannot create temporary file '", temp_path_, "': ", os_error(errno));
  }
}

AtomicFileWriter::~AtomicFileWriter() {
  if (!committed_) {
    fd_.reset();
    ::unlink(temp_path_.c_str());
  }
}

void AtomicFileWriter::write(const void* data, size_t n) {
  ATTNRES_CHECK(!committed_, "write after commit to ", path_);
  write_all(fd_.get(), data, n, temp_path_);
  written_ += n;
}

void AtomicFileWriter::commit() {
  ATTNRES_CHECK(!committed_, "double commit of ", path_);
  // Data must be on disk before the rename makes it visible: otherwise a
  // power loss can leave the final name pointing at a zero-length file.
  if (::fsync(fd_.get()) != 0) fail(temp_path_, ": fsync failed: ", os_error(errno));
  const int fd = fd_.release();
  if (::close(fd) != 0) fail(temp_path_, ": close failed: ", os_error(errno));
  rename_durable(temp_path_, path_);
  committed_ = true;
}

void write_file_atomic(const std::string& path, const void* data, size_t n) {
  AtomicFileWriter w(path);
  w.write(data, n);
  w.commit();
}

void write_text_file_atomic(const std::string& path, const std::string& content) {
  write_file_atomic(path, content.data(), content.size());
}

std::string read_text_file(const std::string& path) {
  UniqueFd fd = open_file(path, O_RDONLY);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) fail(path, ": cannot stat: ", os_error(errno));
  if (S_ISDIR(st.st_mode)) fail(path, ": is a directory, expected a file");
  std::string out;
  char buf[1 << 16];
  for (;;) {
    const ssize_t r = ::read(fd.get(), buf, sizeof buf);
    if (r < 0) {
      if (errno == EINTR) continue;
      fail(path, ": read failed: ", os_error(errno));
    }
    if (r == 0) break;
    out.append(buf, static_cast<size_t>(r));
  }
  return out;
}

// ---------------------------------------------------------------------------
// XXH64 (reference: github.com/Cyan4973/xxHash, xxhash.h, XXH64_*)
// ---------------------------------------------------------------------------

namespace {

constexpr uint64_t kP1 = 0x9E3779B185EBCA87ull;
constexpr uint64_t kP2 = 0xC2B2AE3D27D4EB4Full;
constexpr uint64_t kP3 = 0x165667B19E3779F9ull;
constexpr uint64_t kP4 = 0x85EBCA77C2B2AE63ull;
constexpr uint64_t kP5 = 0x27D4EB2F165667C5ull;

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "XXH64 and safetensors reads assume a little-endian host");

inline uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
inline uint64_t load64(const unsigned char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);  // unaligned-safe; compiles to one load
  return v;
}
inline uint32_t load32(const unsigned char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
inline uint64_t round64(uint64_t acc, uint64_t input) {
  acc += input * kP2;
  acc = rotl(acc, 31);
  return acc * kP1;
}
inline uint64_t merge_round(uint64_t acc, uint64_t val) {
  acc ^= round64(0, val);
  return acc * kP1 + kP4;
}
// One 32-byte stripe: each lane consumes 8 bytes independently, which is what
// lets the CPU overlap the four multiply chains.
inline void stripe(uint64_t v[4], const unsigned char* p) {
  v[0] = round64(v[0], load64(p));
  v[1] = round64(v[1], load64(p + 8));
  v[2] = round64(v[2], load64(p + 16));
  v[3] = round64(v[3], load64(p + 24));
}

}  // namespace

Xxh64::Xxh64(uint64_t seed) : seed_(seed) {
  v_[0] = seed + kP1 + kP2;
  v_[1] = seed + kP2;
  v_[2] = seed;
  v_[3] = seed - kP1;
}

void Xxh64::update(const void* data, size_t n) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  total_ += n;
  if (buf_len_ > 0) {  // complete a stripe left over from the previous call
    const size_t take = std::min(n, sizeof buf_ - buf_len_);
    std::memcpy(buf_ + buf_len_, p, take);
    buf_len_ += take;
    p += take;
    n -= take;
    if (buf_len_ < sizeof buf_) return;
    stripe(v_, buf_);
    buf_len_ = 0;
  }
  uint64_t v[4] = {v_[0], v_[1], v_[2], v_[3]};  // locals stay in registers
  for (; n >= 32; p += 32, n -= 32) stripe(v, p);
  for (int i = 0; i < 4; ++i) v_[i] = v[i];
  std::memcpy(buf_, p, n);
  buf_len_ = n;
}

uint64_t Xxh64::digest() const {
  uint64_t h;
  if (total_ >= 32) {
    h = rotl(v_[0], 1) + rotl(v_[1], 7) + rotl(v_[2], 12) + rotl(v_[3], 18);
    for (int i = 0; i < 4; ++i) h = merge_round(h, v_[i]);
  } else {
    h = seed_ + kP5;
  }
  h += total_;
  const unsigned char* p = buf_;
  size_t n = buf_len_;
  for (; n >= 8; p += 8, n -= 8) h = rotl(h ^ round64(0, load64(p)), 27) * kP1 + kP4;
  if (n >= 4) {
    h = rotl(h ^ (static_cast<uint64_t>(load32(p)) * kP1), 23) * kP2 + kP3;
    p += 4;
    n -= 4;
  }
  for (; n > 0; ++p, --n) h = rotl(h ^ (*p * kP5), 11) * kP1;
  h ^= h >> 33;
  h *= kP2;
  h ^= h >> 29;
  h *= kP3;
  h ^= h >> 32;
  return h;
}

uint64_t xxh64(const void* data, size_t n, uint64_t seed) {
  Xxh64 h(seed);
  h.update(data, n);
  return h.digest();
}

uint64_t xxh64_file(const std::string& path, uint64_t* size_out) {
  UniqueFd fd = open_file(path, O_RDONLY);
  ::posix_fadvise(fd.get(), 0, 0, POSIX_FADV_SEQUENTIAL);  // a hint; failure is harmless
  std::vector<unsigned char> buf(size_t{4} << 20);  // 4 MiB: amortises syscalls, fits L3-ish
  Xxh64 h;
  uint64_t total = 0;
  for (;;) {
    const ssize_t r = ::read(fd.get(), buf.data(), buf.size());
    if (r < 0) {
      if (errno == EINTR) continue;
      fail(path, ": read failed at byte ", total, ": ", os_error(errno));
    }
    if (r == 0) break;
    h.update(buf.data(), static_cast<size_t>(r));
    total += static_cast<uint64_t>(r);
  }
  if (size_out) *size_out = total;
  return h.digest();
}

std::string hex64(uint64_t v) {
  char s[17];
  std::snprintf(s, sizeof s, "%016llx", static_cast<unsigned long long>(v));
  return s;
}

}  // namespace attnres
