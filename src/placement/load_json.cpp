// .json load files: [[...], ...] ([L][E]), [[[...], ...], ...] ([W][L][E]), or
// an object whose key "load" holds one of these (other keys are ignored).
//
// Parsed with nlohmann's SAX interface straight into the matrix: no DOM, no
// recursion, so deep nesting or huge files cannot exhaust the stack. Errors
// name the JSON path ($[3][7] for a bare array, load[3][7] inside the object)
// or, for syntax errors, the line, column and byte.
#include <fmt/format.h>
#include <climits>
#include <cmath>
#include <nlohmann/json.hpp>
#include <string>

#include "eplb/placement_io.h"
#include "io_util.h"

namespace eplb {
namespace {

using io::file_error;
using json = nlohmann::json;

enum class ValueKind { Number, Array, Object, String, Bool, Null };

const char* kind_name(ValueKind kind) {
  switch (kind) {
    case ValueKind::Number: return "a number";
    case ValueKind::Array: return "an array";
    case ValueKind::Object: return "an object";
    case ValueKind::String: return "a string";
    case ValueKind::Bool: return "a boolean";
    case ValueKind::Null: return "null";
  }
  return "a value";
}

class LoadJsonReader final : public nlohmann::json_sax<json> {
 public:
  explicit LoadJsonReader(std::string_view name) : name_(name) {}

  Status status = Status::ok();
  LoadTrace trace;
  bool object_root = false;
  bool load_done = false;

  bool null() override { return scalar(ValueKind::Null); }
  bool boolean(bool) override { return scalar(ValueKind::Bool); }
  bool string(string_t&) override { return scalar(ValueKind::String); }
  bool binary(binary_t&) override { return scalar(ValueKind::String); }
  bool number_integer(number_integer_t value) override {
    if (!value_arrives(ValueKind::Number)) return false;
    if (!in_load_) return true;
    if (value < 0)
      return fail(fmt::format("{}: value {} is negative (loads are token counts >= 0)", element_path(), value));
    if (!io::exact_in_double(int64_t(value)))
      return fail(fmt::format("{}: integer {} is not exactly representable as a double", element_path(), value));
    return add(double(value));
  }
  bool number_unsigned(number_unsigned_t value) override {
    if (!value_arrives(ValueKind::Number)) return false;
    if (!in_load_) return true;
    if (!io::exact_in_double(uint64_t(value)))
      return fail(fmt::format("{}: integer {} is not exactly representable as a double", element_path(), value));
    return add(double(value));
  }
  bool number_float(number_float_t value, const string_t&) override {
    if (!value_arrives(ValueKind::Number)) return false;
    if (!in_load_) return true;
    if (value < 0 || !std::isfinite(value)) {
      status = io::check_load_value(value, name_, element_path());
      return false;
    }
    return add(value);
  }
  bool start_object(std::size_t) override { return value_arrives(ValueKind::Object) && open(); }
  bool start_array(std::size_t) override { return value_arrives(ValueKind::Array) && open(); }
  bool end_object() override { return close(); }
  bool end_array() override { return close(); }
  bool key(string_t& key) override {
    if (skip_depth_ > 0 || in_load_) return true;
    if (key == "load") {
      if (load_done || expecting_load_) return fail("key \"load\" appears twice");
      expecting_load_ = true;
    }
    return true;
  }
  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception& problem) override {
    std::string what = problem.what();
    size_t bracket = what.find("] ");
    if (what.rfind("[json.exception", 0) == 0 && bracket != std::string::npos) what = what.substr(bracket + 2);
    if (what.rfind("parse error at ", 0) == 0) what = what.substr(15);
    status = file_error(Code::ParseError, name_, fmt::format("byte {}: {}", position, what));
    return false;
  }

 private:
  bool fail(const std::string& what) {
    status = file_error(Code::ParseError, name_, what);
    return false;
  }

  // Path of the element about to be added to the innermost open load array.
  std::string element_path() const {
    std::string path = prefix_;
    for (int k = 1; k < level_; ++k) fmt::format_to(std::back_inserter(path), "[{}]", count_[k] - 1);
    fmt::format_to(std::back_inserter(path), "[{}]", count_[level_]);
    return path;
  }
  // Path of the innermost open load array.
  std::string container_path() const {
    std::string path = prefix_;
    for (int k = 1; k < level_; ++k) fmt::format_to(std::back_inserter(path), "[{}]", count_[k] - 1);
    return path;
  }

  bool scalar(ValueKind kind) { return value_arrives(kind); }

  // Every value (scalar or container start) passes here first: it decides
  // whether the value belongs to the load, is skipped, or is an error.
  bool value_arrives(ValueKind kind) {
    pending_open_ = Pending::None;
    if (skip_depth_ > 0) {
      if (kind == ValueKind::Array || kind == ValueKind::Object) pending_open_ = Pending::Skip;
      return true;
    }
    if (!started_) {
      started_ = true;
      if (kind == ValueKind::Array) {
        prefix_ = "$";
        pending_open_ = Pending::Load;
        return true;
      }
      if (kind == ValueKind::Object) {
        object_root = true;
        pending_open_ = Pending::RootObject;
        return true;
      }
      return fail("byte 0: the top level is " + std::string(kind_name(kind)) +
                  "; expected an array of arrays or an object with key \"load\"");
    }
    if (in_load_) {
      bool number = kind == ValueKind::Number, array = kind == ValueKind::Array;
      if (level_ == 1) {
        if (!array) return fail(element_path() + ": expected an array (a layer or a step), found " + kind_name(kind));
        pending_open_ = Pending::Load;
        ++count_[1];
        return true;
      }
      if (level_ == 2) {
        if (number && dimensions_ == 0) dimensions_ = 2;
        if (array && dimensions_ == 0) dimensions_ = 3;
        if (number && dimensions_ == 2) return true;  // add() counts it
        if (array && dimensions_ == 3) {
          pending_open_ = Pending::Load;
          ++count_[2];
          return true;
        }
        return fail(element_path() + ": expected " + (dimensions_ == 2 ? "a number" : "an array (a layer)") +
                    ", found " + kind_name(kind) +
                    (number || array ? " (rows mix numbers and arrays)" : ""));
      }
      // level 3: only numbers
      if (number) return true;
      return fail(element_path() + ": expected a number, found " + kind_name(kind));
    }
    // The value of a key of the top-level object.
    if (expecting_load_) {
      expecting_load_ = false;
      if (kind != ValueKind::Array)
        return fail("load: expected an array of arrays, found " + std::string(kind_name(kind)));
      prefix_ = "load";
      pending_open_ = Pending::Load;
      return true;
    }
    if (kind == ValueKind::Array || kind == ValueKind::Object) pending_open_ = Pending::Skip;
    return true;
  }

  bool open() {
    switch (pending_open_) {
      case Pending::Skip: ++skip_depth_; break;
      case Pending::RootObject: break;
      case Pending::Load:
        in_load_ = true;
        ++level_;
        count_[level_] = 0;
        break;
      case Pending::None: return fail("internal: unexpected container");
    }
    pending_open_ = Pending::None;
    return true;
  }

  bool add(double value) {
    trace.values.push_back(value);
    ++count_[level_];
    return true;
  }

  bool check_count(size_t count, size_t& expected, const char* what) {
    if (count == 0) return fail(container_path() + ": empty array (zero-size dimension)");
    if (count > size_t(INT_MAX)) return fail(container_path() + ": too many elements");
    if (expected == 0) {
      expected = count;
      return true;
    }
    if (count != expected)
      return fail(
          fmt::format("{}: ragged rows: {} {}, expected {} like the first", container_path(), count, what, expected));
    return true;
  }

  bool close() {
    if (skip_depth_ > 0) {
      --skip_depth_;
      return true;
    }
    if (!in_load_) return true;  // the top-level object ends
    size_t count = count_[level_];
    if (level_ == 3 || (level_ == 2 && dimensions_ == 2)) {
      if (!check_count(count, experts_, "values")) return false;
    } else if (level_ == 2) {
      if (!check_count(count, layers_, "layers")) return false;
    } else {  // level 1: the load array itself
      if (count == 0) return fail(container_path() + ": empty array (no layers)");
      if (count > size_t(INT_MAX)) return fail(container_path() + ": too many elements");
      if (dimensions_ == 0) return fail(container_path() + ": empty array (zero-size dimension)");
      trace.num_experts = int(experts_);
      if (dimensions_ == 2) {
        trace.num_steps = 1;
        trace.num_layers = int(count);
      } else {
        trace.num_steps = int(count);
        trace.num_layers = int(layers_);
      }
      in_load_ = false;
      load_done = true;
    }
    --level_;
    return true;
  }

  enum class Pending { None, Skip, RootObject, Load };

  std::string_view name_;
  std::string prefix_;
  bool started_ = false;
  bool in_load_ = false;
  bool expecting_load_ = false;
  Pending pending_open_ = Pending::None;
  int skip_depth_ = 0;
  int level_ = 0;
  size_t count_[4] = {0, 0, 0, 0};
  int dimensions_ = 0;
  size_t experts_ = 0;
  size_t layers_ = 0;
};

}  // namespace

Result<LoadTrace> parse_load_json(std::string_view text, std::string_view name) {
  if (text.find_first_not_of(" \t\r\n") == std::string_view::npos)
    return file_error(Code::ParseError, name, "empty file (expected a JSON array of arrays)");
  LoadJsonReader reader(name);
  bool ok = false;
  try {
    ok = json::sax_parse(text.begin(), text.end(), &reader, json::input_format_t::json, true);
  } catch (const std::exception& unexpected) {
    return file_error(Code::ParseError, name, std::string("cannot parse: ") + unexpected.what());
  }
  if (!ok) {
    if (!reader.status.is_ok()) return reader.status;
    return file_error(Code::ParseError, name, "cannot parse");
  }
  if (!reader.load_done)
    return file_error(Code::ParseError, name, reader.object_root ? "the top-level object has no key \"load\""
                                                                 : "no load array found");
  LoadTrace trace = std::move(reader.trace);
  EPLB_TRY(io::check_trace_shape(trace, name));
  return trace;
}

}  // namespace eplb
