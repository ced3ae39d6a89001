// libFuzzer entry point for request parsing (built with clang only; scripts/fuzz.sh builds and runs
// it over tests/fuzz/corpus/request).
#include <cstddef>
#include <cstdint>

#include "request_fuzz_body.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  mnemo::test::ExerciseRequest(data, size);
  return 0;
}
