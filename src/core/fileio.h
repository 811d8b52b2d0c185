// File I/O primitives shared by every layer: RAII file descriptors, durable
// (fsync'd) atomic writes, whole-file reads, and a streaming XXH64 checksum.
//
// "Atomic" here means the POSIX recipe: write a temporary file in the same
// directory, fsync it, rename() it over the final name, fsync the directory.
// A reader (or a process restarted after a crash or power loss) then sees
// either the old content or the new one, never a prefix of the new one.
//
// Every failure throws attnres::Error naming the file and the OS reason.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace attnres {

// Owns one POSIX file descriptor; closes it on destruction.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd() { reset(); }
  UniqueFd(UniqueFd&& o) noexcept : fd_(o.release()) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    if (this != &o) reset(o.release());
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  int get() const { return fd_; }
  explicit operator bool() const { return fd_ >= 0; }
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void reset(int fd = -1);  // closes the current descriptor (errors ignored)

 private:
  int fd_ = -1;
};

// open(2) that throws "<path>: cannot open (<what>): <reason>" on failure.
UniqueFd open_file(const std::string& path, int flags, unsigned mode = 0644);

// Write all `n` bytes (looping over short writes and EINTR).
void write_all(int fd, const void* data, size_t n, const std::string& path);
// Read exactly `n` bytes at `offset`; a short read is an error ("truncated").
void pread_exact(int fd, void* data, size_t n, uint64_t offset, const std::string& path);

uint64_t file_size(const std::string& path);  // throws if missing or not a regular file

// fsync a file or directory by path. Directories must be fsync'd after a
// rename/create inside them for the new name itself to survive a power loss.
void fsync_path(const std::string& path);
// The directory containing `path` ("." for a bare file name).
std::string parent_dir(const std::string& path);
// rename(2) followed by an fsync of the destination's directory (and of the
// source's, when different), so the move is durable once this returns.
void rename_durable(const std::string& from, const std::string& to);

// Streams bytes into a temporary file next to `path`; commit() makes them
// appear under `path` atomically and durably. Destroyed without commit()
// (e.g. during exception unwinding), it deletes the temporary file, so a
// failed write never leaves a partial file under either name.
class AtomicFileWriter {
 public:
  explicit AtomicFileWriter(std::string path);
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  void write(const void* data, size_t n);
  void write(std::string_view s) { write(s.data(), s.size()); }
  uint64_t bytes_written() const { return written_; }
  void commit();  // fsync, close, rename over `path`, fsync the directory

  const std::string& path() const { return path_; }
  const std::string& temp_path() const { return temp_path_; }

 private:
  std::string path_;
  std::string temp_path_;
  UniqueFd fd_;
  uint64_t written_ = 0;
  bool committed_ = false;
};

void write_file_atomic(const std::string& path, const void* data, size_t n);
void write_text_file_atomic(const std::string& path, const std::string& content);
// Whole file as a string; throws "<path>: cannot open ...: No such file or directory" etc.
std::string read_text_file(const std::string& path);

// XXH64 (Yann Collet's xxHash, 64-bit variant, bit-exact with the reference
// implementation and `xxhsum -H1`): four independent 64-bit multiply-rotate
// lanes over 32-byte stripes, so it runs at several GB/s on one core. Not
// cryptographic: it detects truncation, bit rot and torn writes, not tampering.
class Xxh64 {
 public:
  explicit Xxh64(uint64_t seed = 0);
  void update(const void* data, size_t n);
  uint64_t digest() const;  // may be called repeatedly; update() can continue after

 private:
  uint64_t v_[4];
  uint64_t seed_;
  uint64_t total_ = 0;
  unsigned char buf_[32];
  size_t buf_len_ = 0;
};

uint64_t xxh64(const void* data, size_t n, uint64_t seed = 0);
// XXH64 of a whole file, streamed in large blocks; `size_out` gets the byte count.
uint64_t xxh64_file(const std::string& path, uint64_t* size_out = nullptr);
// 16 lowercase hex digits (the form xxhsum prints).
std::string hex64(uint64_t v);

}  // namespace attnres
