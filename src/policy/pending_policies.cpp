// pending_policies.cpp - placeholders for the policies of issue 5 until the
// `policies` branch lands; that branch deletes this file.
#include "policies.h"

namespace eplb::policies {

namespace {
class PendingPolicy final : public Policy {
 public:
  explicit PendingPolicy(std::string name) : name_(std::move(name)) {}
  std::string name() const override { return name_; }
  Result<Placement> place(const LoadMatrix&, const Topology&, const Placement&, const PolicyOptions&) const override {
    return error(Code::Unsupported, "policy '" + name_ + "' is not built yet");
  }

 private:
  std::string name_;
};
}  // namespace

std::unique_ptr<Policy> make_relabel() { return std::make_unique<PendingPolicy>("relabel"); }
std::unique_ptr<Policy> make_incremental() { return std::make_unique<PendingPolicy>("incremental"); }
std::unique_ptr<Policy> make_balanced() { return std::make_unique<PendingPolicy>("balanced"); }

}  // namespace eplb::policies
