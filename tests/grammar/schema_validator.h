// A small JSON Schema validator for the tests (the keywords the grammar compiler supports), written
// from the specification independently of the compiler, so that a compiler bug fails a test.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace mnemo::test {

// Empty when `value` satisfies `schema` (resolving $ref in `root`), else why not.
std::string Validate(const nlohmann::ordered_json& schema, const nlohmann::ordered_json& value,
                     const nlohmann::ordered_json& root);

}  // namespace mnemo::test
