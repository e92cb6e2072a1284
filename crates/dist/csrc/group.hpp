// What the two translation units share: c10d.cpp builds the store and the group and runs the
// collectives through c10d::Backend's virtual interface; nccl.cpp (which needs the CUDA headers)
// builds the NCCL backend.
#pragma once
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

namespace knowrl {
// ProcessGroupNCCL over `store`, or an exception saying why this build has none.
c10::intrusive_ptr<c10d::Backend> make_nccl(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, int64_t timeout_ms);
} // namespace knowrl
