// Declarations only: see gloo-decl/README.md.
#pragma once
namespace gloo {
namespace transport {
class Device;
class UnboundBuffer;
} // namespace transport
} // namespace gloo
