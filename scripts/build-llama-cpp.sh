#!/usr/bin/env bash
# Build llama.cpp once, Vulkan and CPU, from the llama.cpp sources vendored in the
# llama-cpp-python source distribution: shared libraries (libllama, libggml*, with the Vulkan
# and CPU backends) plus llama-server, so the server and specview's in-process engine run the
# very same llama.cpp.  llama-cpp-python loads these libraries with LLAMA_CPP_LIB_PATH=<bin>;
# ggml-vulkan uses a CPU-type device (Mesa's lavapipe) only with GGML_VK_VISIBLE_DEVICES=0.
#
# Needs glslc and Vulkan headers new enough for ggml-vulkan.cpp (vk::LayerSettingEXT):
# scripts/install-vulkan-deps.sh puts both in place on Debian 12 (run as root), and prints the
# include folder; this script runs it when $SPECVIEW_VULKAN_HEADERS is not given.  Without them
# it stops with a non-zero exit: it never falls back to a CPU-only build.
#
# The build is cached outside the repository and skipped when it is complete:
#   ${SPECVIEW_CACHE:-~/.cache/specview}/llama-cpp/<version>-vulkan/build/bin
# It prints that bin folder (libllama.so, libggml-vulkan.so, llama-server) on its last line of stdout.
#
# Environment:
#   LLAMA_CPP_PYTHON_VERSION  sdist version to build from (default 0.3.36)
#   SPECVIEW_LLAMA_SDIST      use this llama_cpp_python-<version>.tar.gz instead of downloading it
#   SPECVIEW_VULKAN_HEADERS   Vulkan include folder (default: what install-vulkan-deps.sh prints)
#   SPECVIEW_BUILD_JOBS       parallel compile jobs (default 2)
#   SPECVIEW_CACHE            cache root (default ${XDG_CACHE_HOME:-~/.cache}/specview)
# Options:
#   --force                   rebuild even if the build is complete
set -euo pipefail

VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
CACHE="${SPECVIEW_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/specview}"
ROOT="$CACHE/llama-cpp/$VERSION-vulkan"
BUILD="$ROOT/build"
BIN="$BUILD/bin"
STAMP="$ROOT/complete"
JOBS="${SPECVIEW_BUILD_JOBS:-2}"
PY="${PYTHON:-python3}"
HERE="$(cd "$(dirname "$0")" && pwd)"

say() { echo "build-llama-cpp: $*" >&2; }

complete() {
    [[ -f "$STAMP" && -x "$BIN/llama-server" && -f "$BIN/libllama.so" && -f "$BIN/libggml-vulkan.so" ]]
}

if complete && [[ "${1:-}" != "--force" ]]; then
    say "already built ($(cat "$STAMP")): $BIN"
    echo "$BIN"
    exit 0
fi

for tool in cmake c++ tar; do
    command -v "$tool" >/dev/null || { say "'$tool' is needed but not installed"; exit 2; }
done

# The Vulkan prerequisites, or a clear stop.
include="${SPECVIEW_VULKAN_HEADERS:-}"
if [[ -z "$include" ]]; then
    include="$(bash "$HERE/install-vulkan-deps.sh" | tail -n 1)" \
        || { say "the Vulkan prerequisites could not be had (see above); no Vulkan build, and no CPU-only build in its place"; exit 3; }
fi
grep -qs "struct LayerSettingEXT" "$include/vulkan/vulkan_structs.hpp" \
    || { say "the Vulkan headers in $include are too old for ggml-vulkan.cpp ('LayerSettingEXT' is not a member of 'vk'); see scripts/install-vulkan-deps.sh"; exit 3; }
spirv=()
[[ -f "$include/../share/cmake/SPIRV-Headers/SPIRV-HeadersConfig.cmake" ]] \
    && spirv=(-DSPIRV-Headers_DIR="$(cd "$include/../share/cmake/SPIRV-Headers" && pwd)")
glslc="$(command -v glslc || true)"
[[ -n "$glslc" ]] || { say "glslc (the GLSL to SPIR-V compiler) is not installed: apt-get install glslc"; exit 3; }
# awk reads to the end: one that exits at the first match can close the pipe while ldconfig still writes,
# and under pipefail ldconfig's SIGPIPE (status 141) would stop the script (1 run in 10 here)
libvulkan="$(ldconfig -p | awk '$1 == "libvulkan.so.1" && !found {print $NF; found = 1}')"
[[ -n "$libvulkan" ]] || { say "the Vulkan loader (libvulkan.so.1) is not installed: apt-get install libvulkan1"; exit 3; }

mkdir -p "$ROOT"
SRC="$ROOT/src"

sdist="${SPECVIEW_LLAMA_SDIST:-}"
if [[ -z "$sdist" ]]; then
    for dl in "$ROOT/sdist" "$CACHE/llama-server/$VERSION/sdist"; do
        found="$(ls "$dl"/llama_cpp_python-"$VERSION".tar.gz 2>/dev/null || true)"
        [[ -n "$found" ]] && { sdist="$found"; break; }
    done
    if [[ -z "$sdist" ]]; then
        dl="$ROOT/sdist"
        mkdir -p "$dl"
        say "fetching the llama-cpp-python $VERSION source distribution"
        "$PY" -m pip download --no-deps --no-binary :all: --dest "$dl" "llama-cpp-python==$VERSION" >&2
        sdist="$dl/llama_cpp_python-$VERSION.tar.gz"
    fi
fi
[[ -f "$sdist" ]] || { say "no source distribution at $sdist"; exit 2; }

if [[ ! -f "$SRC/vendor/llama.cpp/ggml/src/ggml-vulkan/CMakeLists.txt" ]]; then
    rm -rf "$SRC" "$SRC.tmp"
    mkdir -p "$SRC.tmp"
    tar -xzf "$sdist" -C "$SRC.tmp" --strip-components=1
    mv "$SRC.tmp" "$SRC"
fi

generator=()
command -v ninja >/dev/null && generator=(-G Ninja)

# Release, shared libraries, CPU + Vulkan, only what libllama and llama-server need.  No
# OpenSSL (no HTTPS downloads) and no web UI.  GGML_NATIVE stays at its default (on), as in
# llama-cpp-python's own build, so both run the same CPU kernels.
rm -f "$STAMP"
cmake -S "$SRC/vendor/llama.cpp" -B "$BUILD" "${generator[@]}" \
    -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_SHARED_LIBS=ON \
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
    -DGGML_VULKAN=ON \
    -DVulkan_INCLUDE_DIR="$include" \
    -DVulkan_LIBRARY="$libvulkan" \
    -DVulkan_GLSLC_EXECUTABLE="$glslc" \
    "${spirv[@]}" \
    -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_HIP=OFF -DGGML_SYCL=OFF \
    -DGGML_BACKEND_DL=OFF \
    >&2

start=$(date +%s)
cmake --build "$BUILD" --target llama llama-server -j "$JOBS" >&2
took=$(( $(date +%s) - start ))
say "compiled in $took s"

for f in llama-server libllama.so libggml.so libggml-base.so libggml-cpu.so libggml-vulkan.so; do
    [[ -e "$BIN/$f" ]] || { say "the build produced no $BIN/$f"; exit 2; }
done
"$BIN/llama-server" --version >&2
echo "llama-cpp-python $VERSION sdist, GGML_VULKAN=ON, headers $include, compiled in $took s on $(date -u +%F)" > "$STAMP"
echo "$BIN"
