// ProcessGroupNCCL for GPU ranks, in its own translation unit: it needs the CUDA and NCCL headers
// (the wheel's nvidia-* packages, plus nvidia-cuda-crt and nvidia-cuda-cccl, which
// scripts/requirements.txt pins). build.rs defines KNOWRL_WITH_NCCL only when they are all there.
#include "group.hpp"

#include <stdexcept>

#ifdef KNOWRL_WITH_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace knowrl {
c10::intrusive_ptr<c10d::Backend> make_nccl(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, int64_t timeout_ms) {
#ifdef KNOWRL_WITH_NCCL
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = std::chrono::milliseconds(timeout_ms);
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, options);
#else
  (void)store, (void)rank, (void)size, (void)timeout_ms;
  throw std::runtime_error(
      "this build of knowrl has no NCCL: the CUDA / NCCL headers were not found next to libtorch at build time");
#endif
}
} // namespace knowrl
