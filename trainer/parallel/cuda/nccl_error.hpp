#pragma once
// NCCL return codes as exceptions, for the NCCL communicators (CUDA builds; includes nccl.h).
#include <nccl.h>

namespace wb::parallel {

// Throws a CUDA-style error naming the call, file:line and NCCL's message for a result other than ncclSuccess.
void check_nccl(ncclResult_t rc, const char* statement, const char* file, int line);

}  // namespace wb::parallel

#define WB_NCCL_CHECK(call) ::wb::parallel::check_nccl((call), #call, __FILE__, __LINE__)
