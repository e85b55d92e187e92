#pragma once
// Tensor: a cheap handle (shared ownership) to storage owned by a backend. It carries the logical shape
// (N,C,H,W for activations and conv weights, N,F or OUT,IN for the classifier, a flat length for
// buffers), the element type, and whether the storage is plain (dense row-major in the logical shape)
// or in a backend-specific layout (the CPU backend keeps activations in oneDNN's blocked layouts).
// Only the backend that made a tensor interprets its storage; everybody else goes through
// Backend::to_host / from_host, which speak plain row-major data.

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

namespace wb::backend {

class Backend;

enum class DType : std::uint8_t { f32, i32, i64 };

std::size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);

// Up to four dimensions, stored inline so that shapes never allocate on the hot path.
class Shape {
 public:
  static constexpr int kMaxRank = 4;
  Shape() = default;
  Shape(std::initializer_list<std::int64_t> dims);
  explicit Shape(const std::vector<std::int64_t>& dims);

  int rank() const { return rank_; }
  std::int64_t operator[](int i) const { return dims_[static_cast<std::size_t>(i)]; }
  std::int64_t numel() const;
  std::vector<std::int64_t> to_vector() const { return {dims_.begin(), dims_.begin() + rank_}; }
  std::string to_string() const;  // "[4, 64, 8, 8]"
  bool operator==(const Shape& other) const;

 private:
  std::array<std::int64_t, kMaxRank> dims_{};
  int rank_ = 0;
};

// Backends derive from TensorImpl to attach their own layout description and ownership.
class TensorImpl {
 public:
  virtual ~TensorImpl() = default;
  Shape shape;
  DType dtype = DType::f32;
  void* data = nullptr;       // host memory on the CPU backend, device memory on an accelerator
  std::size_t bytes = 0;      // size of the storage, padding of blocked layouts included
  bool plain = true;          // dense row-major in `shape`
  const Backend* owner = nullptr;
};

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const { return impl_->shape; }
  DType dtype() const { return impl_->dtype; }
  std::int64_t numel() const { return impl_->shape.numel(); }
  bool is_plain() const { return impl_->plain; }
  std::size_t bytes() const { return impl_->bytes; }
  void* data() const { return impl_->data; }
  template <class T>
  T* data_as() const { return static_cast<T*>(impl_->data); }
  const Backend* backend() const { return impl_->owner; }
  TensorImpl* impl() const { return impl_.get(); }
  void reset() { impl_.reset(); }

 private:
  std::shared_ptr<TensorImpl> impl_;
};

}  // namespace wb::backend
