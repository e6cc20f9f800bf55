#!/usr/bin/env bash
# Installs sieve's build and test dependencies from Debian's packages (Debian 12 / bookworm).
set -euo pipefail
packages=(
  build-essential cmake ninja-build pkg-config git
  clang libclang-rt-14-dev            # libFuzzer + sanitizer runtimes for the fuzz targets
  clang-format                        # scripts/check-format.sh
  libfmt-dev libspdlog-dev nlohmann-json3-dev libcli11-dev libcpp-httplib-dev prometheus-cpp-dev
  curl                                # end-to-end server tests
  chromium                            # the web page's browser tests (driven by playwright-core)
  haproxy                             # replicas behind a balancer (deploy/haproxy, its e2e test)
  libhwy-dev libpcre2-dev
  libicu-dev                          # NFC for tokenizers whose tokenizer.json composes text
  libboost-dev                        # Boost.Beast / Asio: the event-driven HTTP server
  libgtest-dev libgmock-dev libbenchmark-dev
)
# Node.js and npm run the end-to-end server tests (the openai npm package). Machines that already
# have them (e.g. from NodeSource, whose nodejs bundles npm) keep theirs: Debian's npm package would
# replace that nodejs.
if ! command -v node > /dev/null || ! command -v npm > /dev/null; then
  packages+=(nodejs npm)
fi
exec "$(dirname "$0")/apt-install.sh" install-deps "${packages[@]}"
