#include <functional>
#include <utility>

#include "policies.h"

namespace eplb {

namespace {
using Factory = std::unique_ptr<Policy> (*)();
const std::pair<const char*, Factory> kPolicies[] = {
    {"deepseek", policies::make_deepseek},
    {"relabel", policies::make_relabel},
    {"incremental", policies::make_incremental},
    {"balanced", policies::make_balanced},
    {"cost-aware", policies::make_cost_aware},
};
}  // namespace

std::vector<std::string> policy_names() {
  std::vector<std::string> names;
  for (const auto& [name, factory] : kPolicies) names.emplace_back(name);
  return names;
}

Result<std::unique_ptr<Policy>> make_policy(const std::string& name) {
  for (const auto& [known, factory] : kPolicies)
    if (name == known) return factory();
  std::string list;
  for (const auto& [known, factory] : kPolicies) list += (list.empty() ? "" : ", ") + std::string(known);
  return error(Code::InvalidArgument, "unknown policy '" + name + "' (known: " + list + ")");
}

}  // namespace eplb
