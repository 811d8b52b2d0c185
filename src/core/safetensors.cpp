#include "core/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>
#include <system_error>
#include <utility>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/fileio.h"

namespace attnres {

namespace {

// ordered_json keeps header keys in file order, so tensors of equal offset
// (0-sized ones) come back in the order they were written.
using ojson = nlohmann::ordered_json;

constexpr const char* kMetadataKey = "__metadata__";

struct ParsedHeader {
  std::vector<std::pair<std::string, TensorMeta>> tensors;  // sorted by data offset
  std::map<std::string, std::string> metadata;
  uint64_t data_start = 0;  // file offset of the data buffer: 8 + N
};

// Checked a*b for sizes that come from an untrusted header.
bool mul_overflows(uint64_t a, uint64_t b, uint64_t* out) { return __builtin_mul_overflow(a, b, out); }

std::string offsets_str(const TensorMeta& m) {
  return "[" + std::to_string(m.data_begin) + ", " + std::to_string(m.data_end) + "]";
}

TensorMeta parse_entry(const std::string& path, const std::string& name, const ojson& e) {
  auto bad = [&](const auto&... why) { fail(path, ": tensor '", name, "': ", why...); };
  if (!e.is_object()) bad("header entry is not an object");
  TensorMeta m;

  auto dt = e.find("dtype");
  if (dt == e.end() || !dt->is_string()) bad("missing or non-string \"dtype\"");
  const std::string dtype = dt->get<std::string>();
  try {
    m.dtype = dtype_from_name(dtype);
  } catch (const Error&) {
    bad("unsupported dtype '", dtype, "' (attnres reads F32, F64, BF16 and I32)");
  }

  auto sh = e.find("shape");
  if (sh == e.end() || !sh->is_array()) bad("missing or non-array \"shape\"");
  uint64_t numel = 1;
  for (const auto& d : *sh) {
    if (!d.is_number_unsigned() || d.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
      bad("\"shape\" must hold non-negative integers, got ", sh->dump());
    const uint64_t v = d.get<uint64_t>();
    if (mul_overflows(numel, v, &numel) || numel > static_cast<uint64_t>(INT64_MAX))
      bad("shape ", sh->dump(), " has too many elements");
    m.shape.push_back(static_cast<int64_t>(v));
  }

  auto off = e.find("data_offsets");
  if (off == e.end() || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
      !(*off)[1].is_number_unsigned())
    bad("\"data_offsets\" must be [begin, end] with non-negative integers");
  m.data_begin = (*off)[0].get<uint64_t>();
  m.data_end = (*off)[1].get<uint64_t>();
  if (m.data_end < m.data_begin) bad("data_offsets ", offsets_str(m), " end before they begin");

  uint64_t nbytes = 0;
  if (mul_overflows(numel, dtype_size(m.dtype), &nbytes))
    bad("shape ", shape_str(m.shape), " has too many bytes");
  if (m.data_end - m.data_begin != nbytes)
    bad("data_offsets ", offsets_str(m), " span ", m.data_end - m.data_begin, " bytes but ",
        dtype, shape_str(m.shape), " needs ", nbytes);
  return m;
}

// Reads and validates everything but the tensor bytes themselves.
ParsedHeader parse_header(const std::string& path, int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0)
    fail(path, ": cannot stat: ", std::error_code(errno, std::generic_category()).message());
  if (!S_ISREG(st.st_mode)) fail(path, ": not a regular file");
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size < 8)
    fail(path, ": not a safetensors file: ", size,
         " bytes is shorter than the 8-byte header length field");

  unsigned char len_bytes[8];
  pread_exact(fd, len_bytes, 8, 0, path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len_bytes[i];  // little-endian on any host
  if (n > kSafetensorsMaxHeader)
    fail(path, ": not a safetensors file: header length ", n, " exceeds the limit of ",
         kSafetensorsMaxHeader, " bytes");
  if (n > size - 8)
    fail(path, ": truncated: header length ", n, " runs past the end of the ", size,
         "-byte file");

  std::string text(n, '\0');
  pread_exact(fd, text.data(), n, 8, path);
  if (text.empty() || text[0] != '{')
    fail(path, ": not a safetensors file: the JSON header does not start with '{'");

  // nlohmann keeps one value for a repeated key without telling us, and the
  // format forbids duplicates (an ambiguous file). The parse callback sees
  // every key, so track the keys of each open object.
  std::vector<std::set<std::string>> open_objects;
  std::string duplicate;
  bool duplicate_is_tensor = false;
  auto on_event = [&](int /*depth*/, ojson::parse_event_t ev, ojson& parsed) {
    if (ev == ojson::parse_event_t::object_start) {
      open_objects.emplace_back();
    } else if (ev == ojson::parse_event_t::object_end) {
      if (!open_objects.empty()) open_objects.pop_back();
    } else if (ev == ojson::parse_event_t::key && !open_objects.empty()) {
      const std::string k = parsed.get<std::string>();
      if (!open_objects.back().insert(k).second && duplicate.empty()) {
        duplicate = k;
        duplicate_is_tensor = open_objects.size() == 1;
      }
    }
    return true;
  };
  ojson header;
  try {
    header = ojson::parse(text.begin(), text.end(), on_event);
  } catch (const ojson::exception& e) {
    fail(path, ": header is not valid JSON: ", e.what());
  }
  if (!header.is_object()) fail(path, ": header is not a JSON object");
  if (!duplicate.empty())
    fail(path, duplicate_is_tensor ? ": duplicate tensor name '" : ": duplicate header key '",
         duplicate, "'");

  ParsedHeader out;
  out.data_start = 8 + n;
  for (const auto& [name, entry] : header.items()) {
    if (name == kMetadataKey) {
      if (!entry.is_object()) fail(path, ": \"__metadata__\" must be an object of strings");
      for (const auto& [k, v] : entry.items()) {
        if (!v.is_string())
          fail(path, ": \"__metadata__\" value of '", k, "' must be a string, got ", v.dump());
        out.metadata[k] = v.get<std::string>();
      }
      continue;
    }
    out.tensors.emplace_back(name, parse_entry(path, name, entry));
  }

  // The buffer must be tiled exactly: sorted by offset, each tensor starts
  // where the previous one ended. stable_sort keeps header order for the
  // zero-sized tensors that share an offset.
  std::stable_sort(out.tensors.begin(), out.tensors.end(), [](const auto& a, const auto& b) {
    return std::make_pair(a.second.data_begin, a.second.data_end) <
           std::make_pair(b.second.data_begin, b.second.data_end);
  });
  uint64_t covered = 0;
  const std::pair<std::string, TensorMeta>* prev = nullptr;
  for (const auto& t : out.tensors) {
    const TensorMeta& m = t.second;
    if (m.data_begin < covered)
      fail(path, ": tensor '", t.first, "' data_offsets ", offsets_str(m), " overlap tensor '",
           prev->first, "' ", offsets_str(prev->second));
    if (m.data_begin > covered)
      fail(path, ": hole in the data buffer: bytes [", covered, ", ", m.data_begin,
           ") belong to no tensor (next is '", t.first, "')");
    covered = m.data_end;
    prev = &t;
  }
  const uint64_t available = size - out.data_start;
  if (covered > available)
    fail(path, ": truncated: the header describes ", covered, " data bytes but only ", available,
         " follow the header (file is ", size, " bytes, expected ", out.data_start + covered, ")");
  if (covered < available)
    fail(path, ": ", available - covered, " trailing bytes after the last tensor (file is ", size,
         " bytes, expected ", out.data_start + covered, ")");
  return out;
}

}  // namespace

void write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  ojson header = ojson::object();
  ojson& meta = header[kMetadataKey];
  meta["format"] = "pt";  // Transformers refuses a __metadata__ without a known format
  for (const auto& [k, v] : metadata) meta[k] = v;

  uint64_t offset = 0;
  std::set<std::string> names;
  for (const auto& [name, t] : tensors) {
    if (name == kMetadataKey) fail(path, ": '", name, "' is reserved and cannot name a tensor");
    if (!names.insert(name).second) fail(path, ": duplicate tensor name '", name, "'");
    if (!t.defined()) fail(path, ": tensor '", name, "' is undefined");
    if (!t.is_cpu())
      fail(path, ": tensor '", name, "' is on ", device_name(t.device()),
           "; copy it to the host before saving");
    const uint64_t nbytes = t.nbytes();
    header[name] = {{"dtype", dtype_name(t.dtype())},
                    {"shape", t.shape()},
                    {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
  }

  std::string text;
  try {
    text = header.dump();
  } catch (const ojson::exception& e) {  // e.g. a name that is not valid UTF-8
    fail(path, ": cannot encode the header: ", e.what());
  }
  // Pad with spaces so that the data buffer starts 8-byte aligned, as the
  // reference writer does (lets readers mmap and use the data in place).
  text.append((8 - text.size() % 8) % 8, ' ');

  unsigned char len_bytes[8];
  for (int i = 0; i < 8; ++i) len_bytes[i] = static_cast<unsigned char>(text.size() >> (8 * i));

  AtomicFileWriter out(path);
  out.write(len_bytes, 8);
  out.write(text);
  for (const auto& nt : tensors)
    if (nt.tensor.nbytes() > 0) out.write(nt.tensor.raw(), nt.tensor.nbytes());
  out.commit();
}

std::vector<NamedTensor> read_safetensors(const std::string& path) {
  UniqueFd fd = open_file(path, O_RDONLY);
  const ParsedHeader h = parse_header(path, fd.get());
  std::vector<NamedTensor> out;
  out.reserve(h.tensors.size());
  for (const auto& [name, m] : h.tensors) {
    Tensor t = Tensor::empty(m.shape, m.dtype, Device::CPU);
    if (t.nbytes() > 0) pread_exact(fd.get(), t.raw(), t.nbytes(), h.data_start + m.data_begin, path);
    out.push_back({name, std::move(t)});
  }
  return out;
}

std::map<std::string, TensorMeta> read_safetensors_header(const std::string& path) {
  UniqueFd fd = open_file(path, O_RDONLY);
  ParsedHeader h = parse_header(path, fd.get());
  return {std::make_move_iterator(h.tensors.begin()), std::make_move_iterator(h.tensors.end())};
}

std::map<std::string, std::string> read_safetensors_metadata(const std::string& path) {
  UniqueFd fd = open_file(path, O_RDONLY);
  return parse_header(path, fd.get()).metadata;
}

}  // namespace attnres
