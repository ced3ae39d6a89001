#!/usr/bin/env bash
# Sanitizer builds for CI (after scripts/build.sh installed the packages):
#   address: AddressSanitizer + UBSan over the model-free unit tests and the engine tests, in build-asan/
#            (the library instrumented; the tests' own code not, see tests/CMakeLists.txt);
#   thread:  ThreadSanitizer over the engine (engine thread, transfer thread, submitting threads), kv
#            (allocator, cache manager, victim index, transfers) and thread-pool tests, in build-tsan/.
#
#   scripts/sanitize.sh [address] [thread]     (both when no argument)
#
# The HTTP layer (mnemo_server) is left out: it alone would add minutes of instrumented compile to a CI
# that must stay under 30 minutes on 2 cores (measured: Release build + tests 12 min, ASan build 11.5 min
# and tests 2 min, TSan build and tests about 7 min, at -O3; both now build at -O1, see below).
# Any sanitizer report fails the test that triggered it (halt_on_error / exitcode), so ctest fails.
# OpenMP (libgomp) is not instrumented for TSan, so the TSan run pins OMP_NUM_THREADS=1: our own
# thread pool, the engine thread and the transfer thread are what it checks.
set -euo pipefail
cd "$(dirname "$0")/.."

kinds=("$@")
((${#kinds[@]})) || kinds=(address thread)
jobs=$(nproc)

for kind in "${kinds[@]}"; do
  case "$kind" in
    address)
      dir=build-asan
      targets=(base_test tokenizer_test chat_test chat_tokens_test sampling_test context_test kv_test
               store_test format_test engine_test engine_window_test batch_plan_test cost_fit_test
               scheduler_test policy_sim_test grammar_test)
      env_vars=(ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:halt_on_error=1 MNEMO_FUZZ_ITERS=2000
                UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1)
      # The tiers-under-pressure run on two architectures (llama3; gemma3, windowed) rather than six:
      # the eviction and transfer paths it stresses do not depend on the architecture, whose own code
      # every other EngineArch test covers under ASan; the six took 80 s of the run's 2-core minutes.
      # (ctest's names of parameterised tests end in '  # GetParam() = ...', hence '( |$)')
      exclude='|^Archs/EngineArch\.ExactUnderPressure/(qwen2|qwen3|phi3|gemma2)( |$)'
      # The grammar matcher (scratch kept across automata, byte-class labels in fixed arrays) runs
      # here; the two pattern tests that are mostly compile-time checks (15 s of the 34 under ASan)
      # run in the Release build only.
      exclude+='|^JsonRegex\.(ZodFormatsWithPatternsWalkValid|RandomPatternsAgreeWithStdRegex)$'
      ;;
    thread)
      dir=build-tsan
      targets=(base_test kv_test engine_test batch_plan_test scheduler_test)
      env_vars=(TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 OMP_NUM_THREADS=1)
      exclude=''
      ;;
    *) echo "sanitize.sh: unknown sanitizer '$kind' (address or thread)" >&2; exit 2 ;;
  esac
  # -O1, the optimisation AddressSanitizer's authors recommend: measured with -fsanitize=address,undefined,
  # user CPU per file at -O3 / -O1: gemv_avx512.cpp 15.9 / 5.7 s, engine.cpp 46.9 / 24.6 s,
  # matmul_dnnl.cpp 8.1 / 4.9 s; the sanitizer builds are most of CI's time.
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="-O1 -DNDEBUG" \
    -DCMAKE_C_FLAGS_RELEASE="-O1 -DNDEBUG" -DMNEMO_SANITIZE="$kind" >/dev/null
  cmake --build "$dir" -j "$jobs" --target "${targets[@]}"
  # Only the targets built above have discovered tests; the rest (and the non-GoogleTest tests that
  # need the whole build) register as *_NOT_BUILT placeholders and are excluded.
  env "${env_vars[@]}" ctest --test-dir "$dir" --output-on-failure -j "$jobs" \
    -E "_NOT_BUILT\$|^(kernels_test_portable|kernels_test_avx2|type_golden_test_portable|openai_client_js|bench_serve_http|status_page_browser)\$${exclude}"
done
