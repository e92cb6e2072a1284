// The C ABI knowrl-dist binds: a TCPStore rendezvous, a ProcessGroupGloo (or nccl.cpp's
// ProcessGroupNCCL) on top of it, and the four collectives the trainer uses. Everything runs
// inside libtorch's own c10d; this file only builds the objects and turns C++ exceptions into
// error strings. Tensors arrive as
// tch's `C_tensor*`, which is an `at::Tensor*` (torch-sys' torch_api.h).
#include "group.hpp"

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {
struct Group {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::Backend> backend;
};

char* copy(const std::string& s) {
  char* out = static_cast<char*>(std::malloc(s.size() + 1));
  std::memcpy(out, s.c_str(), s.size() + 1);
  return out;
}

// Runs f; on an exception stores its message (without the C++ backtrace) in *err, returns 1.
template <class F>
int guard(char** err, F&& f) {
  try {
    f();
    return 0;
  } catch (const c10::Error& e) {
    *err = copy(e.what_without_backtrace());
  } catch (const std::exception& e) {
    *err = copy(e.what());
  } catch (...) {
    *err = copy("unknown C++ exception");
  }
  return 1;
}

bool loopback(const std::string& host) {
  return host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1";
}

// Gloo binds to GLOO_SOCKET_IFNAME when set (as torch does), to loopback when the master is
// local, else to the address this host's name resolves to.
c10::intrusive_ptr<c10d::Backend> make_gloo(
    const c10::intrusive_ptr<c10d::Store>& store, const std::string& host, int rank, int size, int64_t timeout_ms) {
  auto options = c10d::ProcessGroupGloo::Options::create(std::chrono::milliseconds(timeout_ms));
  const char* ifname = std::getenv("GLOO_SOCKET_IFNAME");
  if (ifname != nullptr && *ifname != '\0') {
    options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(ifname));
  } else if (loopback(host)) {
    options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  } else {
    options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  }
  // Collectives are issued one at a time: one worker thread is enough.
  options->threads = 1;
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, options);
}
} // namespace

extern "C" {

// Rank `rank` of `size` meets the others at host:port (rank 0 serves the TCPStore, which waits
// for all of them) and joins backend 0 (gloo) or 1 (NCCL); collectives time out after timeout_ms.
void* knowrl_group_new(
    int backend, const char* host, uint16_t port, int rank, int size, int64_t timeout_ms, char** err) {
  Group* g = nullptr;
  guard(err, [&] {
    c10d::TCPStoreOptions opts;
    opts.port = port;
    opts.isServer = rank == 0;
    opts.numWorkers = static_cast<size_t>(size);
    opts.waitWorkers = true;
    opts.timeout = std::chrono::milliseconds(timeout_ms);
    c10::intrusive_ptr<c10d::Store> store = c10::make_intrusive<c10d::TCPStore>(std::string(host), opts);
    auto b = backend == 1 ? knowrl::make_nccl(store, rank, size, timeout_ms)
                          : make_gloo(store, host, rank, size, timeout_ms);
    g = new Group{store, b};
  });
  return g;
}

void knowrl_group_free(void* g) {
  delete static_cast<Group*>(g);
}

void knowrl_free(char* s) {
  std::free(s);
}

// In place: t = Σ over ranks of t.
int knowrl_all_reduce_sum(void* g, void* t, char** err) {
  return guard(err, [&] {
    std::vector<at::Tensor> ts{*static_cast<at::Tensor*>(t)};
    c10d::AllreduceOptions o;
    o.reduceOp = c10d::ReduceOp::SUM;
    static_cast<Group*>(g)->backend->allreduce(ts, o)->wait();
  });
}

// out (contiguous, size × in's elements) = every rank's `in`, in rank order.
int knowrl_all_gather(void* g, void* out, void* in, char** err) {
  return guard(err, [&] {
    static_cast<Group*>(g)
        ->backend->_allgather_base(*static_cast<at::Tensor*>(out), *static_cast<at::Tensor*>(in))
        ->wait();
  });
}

// In place: t = root's t.
int knowrl_broadcast(void* g, void* t, int root, char** err) {
  return guard(err, [&] {
    std::vector<at::Tensor> ts{*static_cast<at::Tensor*>(t)};
    c10d::BroadcastOptions o;
    o.rootRank = root;
    static_cast<Group*>(g)->backend->broadcast(ts, o)->wait();
  });
}

int knowrl_barrier(void* g, char** err) {
  return guard(err, [&] { static_cast<Group*>(g)->backend->barrier()->wait(); });
}
}
