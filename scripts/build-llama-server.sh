#!/usr/bin/env bash
# Build llama.cpp's llama-server (CPU only, no network features) from the llama.cpp
# sources vendored in the llama-cpp-python source distribution, so the server and
# specview's in-process engine run the very same llama.cpp.
#
# The binary is cached outside the repository and the build is skipped when it exists:
#   ${SPECVIEW_CACHE:-~/.cache/specview}/llama-server/<version>/llama-server
# It prints the binary's path on its last line of stdout.
#
# Environment:
#   LLAMA_CPP_PYTHON_VERSION  sdist version to build from (default 0.3.36)
#   SPECVIEW_LLAMA_SDIST      use this llama_cpp_python-<version>.tar.gz instead of downloading it
#   SPECVIEW_BUILD_JOBS       parallel compile jobs (default 2)
#   SPECVIEW_CACHE            cache root (default ${XDG_CACHE_HOME:-~/.cache}/specview)
# Options:
#   --force                   rebuild even if the binary exists
set -euo pipefail

VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
ROOT="${SPECVIEW_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/specview}/llama-server/$VERSION"
OUT="$ROOT/llama-server"
JOBS="${SPECVIEW_BUILD_JOBS:-2}"
PY="${PYTHON:-python3}"

if [[ -x "$OUT" && "${1:-}" != "--force" ]]; then
    echo "llama-server already built: $("$OUT" --version 2>&1 | head -n 1 || true)" >&2
    echo "$OUT"
    exit 0
fi

for tool in cmake c++ tar; do
    command -v "$tool" >/dev/null || { echo "build-llama-server: '$tool' is needed but not installed" >&2; exit 2; }
done

mkdir -p "$ROOT"
SRC="$ROOT/src"
BUILD="$ROOT/build"

sdist="${SPECVIEW_LLAMA_SDIST:-}"
if [[ -z "$sdist" ]]; then
    dl="$ROOT/sdist"
    mkdir -p "$dl"
    sdist="$(ls "$dl"/llama_cpp_python-"$VERSION".tar.gz 2>/dev/null || true)"
    if [[ -z "$sdist" ]]; then
        echo "build-llama-server: fetching the llama-cpp-python $VERSION source distribution from PyPI" >&2
        "$PY" -m pip download --no-deps --no-binary :all: --dest "$dl" "llama-cpp-python==$VERSION" >&2
        sdist="$dl/llama_cpp_python-$VERSION.tar.gz"
    fi
fi
[[ -f "$sdist" ]] || { echo "build-llama-server: no source distribution at $sdist" >&2; exit 2; }

if [[ ! -f "$SRC/vendor/llama.cpp/tools/server/CMakeLists.txt" ]]; then
    rm -rf "$SRC" "$SRC.tmp"
    mkdir -p "$SRC.tmp"
    tar -xzf "$sdist" -C "$SRC.tmp" --strip-components=1
    mv "$SRC.tmp" "$SRC"
fi

generator=()
command -v ninja >/dev/null && generator=(-G Ninja)

# Release, CPU only, static, only what llama-server needs.  No OpenSSL (no HTTPS
# downloads) and no web UI (neither built with npm nor fetched prebuilt).
# GGML_NATIVE stays at its default (on), as in llama-cpp-python's own build, so
# both run the same CPU kernels.
cmake -S "$SRC/vendor/llama.cpp" -B "$BUILD" "${generator[@]}" \
    -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_BUILD_COMMON=ON \
    -DLLAMA_BUILD_SERVER=ON \
    -DLLAMA_BUILD_TOOLS=ON \
    -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_APP=OFF \
    -DLLAMA_OPENSSL=OFF \
    -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_UI=OFF \
    -DLLAMA_USE_PREBUILT_UI=OFF \
    -DGGML_CUDA=OFF -DGGML_VULKAN=OFF -DGGML_METAL=OFF -DGGML_HIP=OFF -DGGML_SYCL=OFF \
    -DGGML_BACKEND_DL=OFF \
    >&2

start=$(date +%s)
cmake --build "$BUILD" --target llama-server -j "$JOBS" >&2
echo "build-llama-server: compiled in $(( $(date +%s) - start )) s" >&2

bin="$BUILD/bin/llama-server"
[[ -x "$bin" ]] || { echo "build-llama-server: the build produced no $bin" >&2; exit 2; }
"$bin" --version >&2
install -m 0755 "$bin" "$OUT.tmp"
mv "$OUT.tmp" "$OUT"
echo "$OUT"
