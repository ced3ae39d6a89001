#!/usr/bin/env bash
# Installs the Debian packages mnemo needs (when missing) and builds it in Release into build/.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(cmake ninja-build g++ pkg-config libgtest-dev libgmock-dev libdnnl-dev libopenblas-dev
          nlohmann-json3-dev libcli11-dev libspdlog-dev libfmt-dev libxxhash-dev libsqlite3-dev
          libboost1.81-dev libcpp-httplib-dev libssl-dev libpq-dev gnuplot-nox chromium
          postgresql-15 haproxy libhiredis-dev redis-server)
# postgresql-15, haproxy, redis-server: the store and scale-out tests run them; hiredis: --kv-remote
missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
# Node.js runs the official OpenAI client in the server tests; any recent one will do.
command -v npm >/dev/null 2>&1 || missing+=(nodejs npm)
if ((${#missing[@]})); then
  sudo=""
  [[ $(id -u) == 0 ]] || sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# npm packages, pinned by their package-lock.json: uPlot for the status page (embedded at build
# time), the npm clients (openai, ai, @langchain/openai) and playwright-core for the tests.
for d in src/web tests/server/js tests/web; do
  (cd "$d" && npm ci --no-audit --no-fund --loglevel=error)
done

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build build -j "$(nproc)"
