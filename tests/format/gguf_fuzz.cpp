// libFuzzer entry point for the GGUF reader (built with clang only). Run, for example:
//   gguf_fuzz -max_total_time=60 corpus_dir/
// with corpus_dir seeded by small GGUF files (stories260K.gguf, make-model outputs).
#include <cstddef>
#include <cstdint>

#include "gguf_fuzz_body.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  mnemo::test::ExerciseGguf(data, size);
  return 0;
}
