// python/src/bindings.h - one bind_* function per area of eplb._eplb.
#pragma once

#include <pybind11/pybind11.h>

namespace eplb::python {

void bind_policy(pybind11::module_& module);     // bind_policy.cpp: place, policy_names
void bind_maps(pybind11::module_& module);       // maps.cpp: logical maps, slot preservation
void bind_metrics(pybind11::module_& module);    // metrics.cpp: rank loads, balancedness
void bind_plan(pybind11::module_& module);       // bind_plan.cpp: migration plan statistics
void bind_files(pybind11::module_& module);      // files.cpp: load files, placement JSON
void bind_group(pybind11::module_& module);      // group.cpp: process groups (bootstraps, Python exchange)
void bind_agent(pybind11::module_& module);      // agent.cpp: the transfer agent, agent-allocated buffers
void bind_xfer(pybind11::module_& module);       // bind_xfer.cpp: the agent's transfer calls (eplb.nixl)
void bind_migrate(pybind11::module_& module);    // bind_migrate.cpp: Migrator, AsyncMigration, reports, deadlines

}  // namespace eplb::python
