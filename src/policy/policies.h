// policies.h - factories of the built-in policies (internal to src/policy/).
#pragma once

#include <memory>

#include "eplb/policy.h"

namespace eplb::policies {

std::unique_ptr<Policy> make_deepseek();
std::unique_ptr<Policy> make_relabel();
std::unique_ptr<Policy> make_incremental();
std::unique_ptr<Policy> make_balanced();
std::unique_ptr<Policy> make_cost_aware();

}  // namespace eplb::policies
