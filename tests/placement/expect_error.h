// expect_error.h - checks a failed Result: its code and the words its message must contain.
#pragma once

#include <gtest/gtest.h>

#include <initializer_list>
#include <string>

#include "eplb/status.h"

namespace eplb::testing {

inline ::testing::AssertionResult fails_with(const Status& status, Code code,
                                             std::initializer_list<const char*> needles) {
  if (status.is_ok()) return ::testing::AssertionFailure() << "expected a failure, got ok";
  if (status.code() != code)
    return ::testing::AssertionFailure() << "expected code '" << code_name(code) << "', got " << status.to_string();
  for (const char* needle : needles)
    if (status.message().find(needle) == std::string::npos)
      return ::testing::AssertionFailure() << "message lacks '" << needle << "': " << status.message();
  return ::testing::AssertionSuccess() << status.message();
}

template <typename T>
::testing::AssertionResult fails_with(const Result<T>& result, Code code, std::initializer_list<const char*> needles) {
  if (result.is_ok()) return ::testing::AssertionFailure() << "expected a failure, got a value";
  return fails_with(result.status(), code, needles);
}

}  // namespace eplb::testing
