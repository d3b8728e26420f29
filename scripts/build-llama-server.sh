#!/usr/bin/env bash
# llama.cpp's llama-server, from the llama.cpp sources vendored in the llama-cpp-python source
# distribution, so the server and specview's in-process engine run the very same llama.cpp.
#
# It is the llama-server of scripts/build-llama-cpp.sh (the one llama.cpp build: Vulkan + CPU,
# shared libraries), linked where specview looks for it when neither --server-bin nor
# $SPECVIEW_LLAMA_SERVER is given:
#   ${SPECVIEW_CACHE:-~/.cache/specview}/llama-server/<version>/llama-server
# Without GGML_VK_VISIBLE_DEVICES naming a CPU-type Vulkan device it computes on a GPU if there
# is one, else on the CPU; `-ngl 0` keeps every layer on the CPU.
# It prints the binary's path on its last line of stdout.
#
# Environment and options: as scripts/build-llama-cpp.sh (LLAMA_CPP_PYTHON_VERSION,
# SPECVIEW_LLAMA_SDIST, SPECVIEW_VULKAN_HEADERS, SPECVIEW_BUILD_JOBS, SPECVIEW_CACHE, --force).
set -euo pipefail

VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
ROOT="${SPECVIEW_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/specview}/llama-server/$VERSION"
OUT="$ROOT/llama-server"

bin="$(bash "$(dirname "$0")/build-llama-cpp.sh" "$@" | tail -n 1)"
[[ -x "$bin/llama-server" ]] || { echo "build-llama-server: no llama-server in $bin" >&2; exit 2; }
mkdir -p "$ROOT"
# a link, not a copy: the binary finds its shared libraries beside itself in the build
ln -sfn "$bin/llama-server" "$OUT.tmp"
mv -T "$OUT.tmp" "$OUT"
echo "$OUT"
