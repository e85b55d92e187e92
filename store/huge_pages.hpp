#pragma once
// Transparent huge pages for large vectors filled once: on a machine whose page faults are dear (a
// virtual machine's can cost microseconds each), a fault per 4 KiB page dominates filling hundreds of MB
// (an import).

#include <cstddef>
#include <vector>

namespace wb::store {

// Asks the kernel to back [p, p + bytes) with huge pages where it can (transparent huge pages in
// "madvise" mode). Harmless where huge pages are off; ignored below 8 MiB.
void advise_huge_pages(const void* p, std::size_t bytes);

// v.reserve(n), the new capacity advised for huge pages when it is large.
template <class T>
void reserve_huge(std::vector<T>& v, std::size_t n) {
  v.reserve(n);
  advise_huge_pages(v.data(), v.capacity() * sizeof(T));
}

}  // namespace wb::store
