// libFuzzer entry point for chat templates (built with clang only; scripts/fuzz.sh builds and runs
// it over tests/fuzz/corpus/template).
#include <cstddef>
#include <cstdint>

#include "template_fuzz_body.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  mnemo::test::ExerciseTemplate(data, size);
  return 0;
}
