// A small JSON Schema validator for the tests (the keywords the grammar compiler supports, formats
// and patterns included), written from the specification independently of the compiler, so that a
// compiler bug fails a test.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace mnemo::test {

// Whether `value` is a valid `format` string: the formats the compiler generates (date-time, date,
// time, duration, email, hostname, ipv4, ipv6, uuid, uri and their idn / iri kin), checked from
// their RFCs' grammars; any other format passes (an annotation).
bool FormatValid(const std::string& format, const std::string& value);
// Whether the ECMA-262 `pattern` matches somewhere in `value` (std::wregex over code points).
bool PatternMatches(const std::string& pattern, const std::string& value);

// Empty when `value` satisfies `schema` (resolving $ref in `root`), else why not.
std::string Validate(const nlohmann::ordered_json& schema, const nlohmann::ordered_json& value,
                     const nlohmann::ordered_json& root);

}  // namespace mnemo::test
