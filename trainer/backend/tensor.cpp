#include "trainer/backend/tensor.hpp"

#include <stdexcept>

namespace wb::backend {

std::size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::f32: return 4;
    case DType::i32: return 4;
    case DType::i64: return 8;
  }
  return 0;
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32: return "f32";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
  }
  return "?";
}

Shape::Shape(std::initializer_list<std::int64_t> dims) : Shape(std::vector<std::int64_t>(dims)) {}

Shape::Shape(const std::vector<std::int64_t>& dims) {
  if (dims.size() > static_cast<std::size_t>(kMaxRank)) {
    throw std::invalid_argument("tensor shape: at most 4 dimensions are supported, got " +
                                std::to_string(dims.size()));
  }
  for (std::size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] < 0) throw std::invalid_argument("tensor shape: negative dimension " + std::to_string(dims[i]));
    dims_[i] = dims[i];
  }
  rank_ = static_cast<int>(dims.size());
}

std::int64_t Shape::numel() const {
  std::int64_t n = 1;
  for (int i = 0; i < rank_; ++i) n *= dims_[static_cast<std::size_t>(i)];
  return n;
}

std::string Shape::to_string() const {
  std::string s = "[";
  for (int i = 0; i < rank_; ++i) {
    if (i) s += ", ";
    s += std::to_string(dims_[static_cast<std::size_t>(i)]);
  }
  return s + "]";
}

bool Shape::operator==(const Shape& other) const {
  if (rank_ != other.rank_) return false;
  for (int i = 0; i < rank_; ++i) {
    if (dims_[static_cast<std::size_t>(i)] != other.dims_[static_cast<std::size_t>(i)]) return false;
  }
  return true;
}

}  // namespace wb::backend
