#!/usr/bin/env bash
# Build specview's one-folder desktop app with PyInstaller, from a clean virtual environment.
#
#   bash scripts/build-bundle.sh            -> dist/specview/specview (Linux), dist/specview.app (macOS)
#
# The bundle carries the llama.cpp libraries of the llama-cpp-python installed in that venv, so
# it runs on whatever GPU API that build was compiled for: set CMAKE_ARGS for a GPU build
# (packaging/README.md has one line per API). pip's wheel cache is used, so a llama-cpp-python
# already built on this machine with the same CMAKE_ARGS is not compiled again.
#
# Environment:
#   PYTHON               interpreter for the venv (default python3)
#   SPECVIEW_BUNDLE_VENV the venv folder (default build/bundle-venv; created fresh each build)
#   SPECVIEW_DIST        output folder (default dist)
# It prints the bundle's folder on its last line of stdout.
set -euo pipefail
cd "$(dirname "$0")/.."

PY="${PYTHON:-python3}"
VENV="${SPECVIEW_BUNDLE_VENV:-build/bundle-venv}"
DIST="${SPECVIEW_DIST:-dist}"
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore

start=$(date +%s)
rm -rf "$VENV"
"$PY" -m venv "$VENV"
VPY="$VENV/bin/python"
[[ -x "$VPY" ]] || VPY="$VENV/Scripts/python.exe"   # Windows
echo "build-bundle: installing specview, its demo model and PyInstaller into $VENV" >&2
"$VPY" -m pip install -q --upgrade pip >&2
if [[ -n "${CMAKE_ARGS:-}" ]]; then
    # a GPU build: compile llama-cpp-python with these flags; pip's cache could hand back a CPU wheel
    echo "build-bundle: compiling llama-cpp-python with CMAKE_ARGS=$CMAKE_ARGS" >&2
    "$VPY" -m pip install -q --no-cache-dir --no-binary llama-cpp-python 'llama-cpp-python==0.3.36' >&2
fi
"$VPY" -m pip install -q '.[demo]' 'pyinstaller>=6.10' >&2
echo "build-bundle: freezing (packaging/specview.spec)" >&2
"$VPY" -m PyInstaller packaging/specview.spec --noconfirm --clean --log-level WARN \
    --distpath "$DIST" --workpath build/pyinstaller >&2
size=$(du -sm "$DIST/specview" | cut -f1)
echo "build-bundle: $DIST/specview is ${size} MB, built in $(( $(date +%s) - start )) s" >&2
echo "$DIST/specview"
