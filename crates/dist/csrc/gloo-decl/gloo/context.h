// Declarations only: see gloo-decl/README.md. setTimeout is named by an inline member of
// ProcessGroupGloo that the shim never calls.
#pragma once
#include <chrono>
namespace gloo {
class Context {
 public:
  void setTimeout(std::chrono::milliseconds timeout);
};
} // namespace gloo
