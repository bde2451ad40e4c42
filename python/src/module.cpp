// eplb._eplb: the C++ library behind the Python package `eplb`. Not a public
// API: the package's pure-Python modules convert inputs (torch, numpy,
// lists, any dtype) and call these functions with C-contiguous float64 and
// int64 numpy arrays. Every failure raises eplb.errors.Error (a ValueError)
// carrying the library's Status code and message.
#include "bindings.h"
#include "convert.h"

PYBIND11_MODULE(_eplb, module) {
  module.doc() = "eplb's C++ library (private; use the `eplb` package)";
  module.attr("__version__") = EPLB_VERSION;
  eplb::python::register_status_translator();
  eplb::python::bind_policy(module);
  eplb::python::bind_maps(module);
  eplb::python::bind_metrics(module);
  eplb::python::bind_plan(module);
  eplb::python::bind_files(module);
  eplb::python::bind_group(module);
  eplb::python::bind_agent(module);
  eplb::python::bind_xfer(module);
  eplb::python::bind_migrate(module);
}
