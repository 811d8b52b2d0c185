// A minimal std::span stand-in (we target C++17): a non-owning view of a
// contiguous sequence. Use it instead of pointer + length pairs.
#pragma once
#include <array>
#include <cstddef>
#include <type_traits>
#include <vector>

namespace attnres {

template <typename T>
class Span {
 public:
  using value_type = std::remove_cv_t<T>;
  constexpr Span() = default;
  constexpr Span(T* data, size_t size) : data_(data), size_(size) {}
  template <typename U, typename = std::enable_if_t<std::is_convertible_v<U (*)[], T (*)[]>>>
  Span(std::vector<U>& v) : data_(v.data()), size_(v.size()) {}
  template <typename U, typename = std::enable_if_t<std::is_convertible_v<const U (*)[], T (*)[]>>>
  Span(const std::vector<U>& v) : data_(v.data()), size_(v.size()) {}
  template <typename U, size_t N,
            typename = std::enable_if_t<std::is_convertible_v<U (*)[], T (*)[]>>>
  constexpr Span(std::array<U, N>& a) : data_(a.data()), size_(N) {}
  // Span<T> -> Span<const T>.
  template <typename U, typename = std::enable_if_t<!std::is_same_v<U, T> &&
                                                    std::is_convertible_v<U (*)[], T (*)[]>>>
  constexpr Span(const Span<U>& s) : data_(s.data()), size_(s.size()) {}

  constexpr T* data() const { return data_; }
  constexpr size_t size() const { return size_; }
  constexpr bool empty() const { return size_ == 0; }
  constexpr T& operator[](size_t i) const { return data_[i]; }
  constexpr T* begin() const { return data_; }
  constexpr T* end() const { return data_ + size_; }
  constexpr Span subspan(size_t offset, size_t count) const { return {data_ + offset, count}; }

 private:
  T* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace attnres
