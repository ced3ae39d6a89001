#!/usr/bin/env bash
# Builds the libFuzzer targets with clang, AddressSanitizer and UBSan (every library they link is
# coverage-instrumented) into build-fuzz/, and runs each for SECONDS over its committed seed corpus:
#   request_fuzz   request bodies through the server's parse layer (tests/fuzz/corpus/request)
#   template_fuzz  chat templates and conversations (tests/fuzz/corpus/template)
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]     (60 s each, both targets, when not given)
#
# Installs (when missing) clang, libclang-rt-14-dev (libFuzzer and the sanitizer runtimes) and
# libomp-dev (OpenMP for clang) from Debian. Inputs libFuzzer finds go to
# build-fuzz/corpus/TARGET (kept between runs), a failing input to build-fuzz/artifacts/; the first
# crash, sanitizer report, leak, timeout (60 s per input: a hang, not a slow input; under ASan on 2 busy cores
# one seed template took 11 s) or out-of-memory (2 GiB) fails the run.
# Reproduce one with: build-fuzz/tests/fuzz/TARGET FILE
set -euo pipefail
cd "$(dirname "$0")/.."

secs=${1:-60}
(($# > 0)) && shift
targets=("$@")
((${#targets[@]})) || targets=(request_fuzz template_fuzz)
dir=build-fuzz

missing=()
for p in clang libclang-rt-14-dev libomp-dev; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo=""
  [[ $(id -u) == 0 ]] || sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)

# -O1 as the sanitizer builds (scripts/sanitize.sh); assertions stay on.
cmake -S . -B "$dir" -G Ninja -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ "${launcher[@]}" \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="-O1 -g" -DCMAKE_C_FLAGS_RELEASE="-O1 -g" \
  -DCMAKE_CXX_FLAGS="-fsanitize=fuzzer-no-link" -DMNEMO_SANITIZE=address >/dev/null
cmake --build "$dir" -j "$(nproc)" --target "${targets[@]}"

mkdir -p "$dir/artifacts"
for t in "${targets[@]}"; do
  name=${t%_fuzz}
  mkdir -p "$dir/corpus/$name"
  echo "== $t: ${secs}s"
  ASAN_OPTIONS=detect_leaks=1:halt_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    "$dir/tests/fuzz/$t" -max_total_time="$secs" -timeout=60 -rss_limit_mb=2048 -max_len=65536 \
    -print_final_stats=1 -artifact_prefix="$dir/artifacts/$name-" "$dir/corpus/$name" "tests/fuzz/corpus/$name"
done
