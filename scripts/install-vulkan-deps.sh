#!/usr/bin/env bash
# What a Vulkan build of llama.cpp needs on Debian 12 (bookworm), and the Vulkan driver that
# runs it without a GPU (Mesa's lavapipe):
#   - mesa-vulkan-drivers + libvulkan1 from bookworm-backports (Mesa 25): bookworm's own Mesa
#     22.3.6 crashes inside libvulkan_lvp.so on llama.cpp's shaders;
#   - glslc (bookworm's 2023.2 compiles every shader lavapipe can run);
#   - the Vulkan headers of Debian 13's libvulkan-dev 1.4.309 and the matching SPIR-V headers
#     (spirv-headers, whose CMake config ggml-vulkan asks for), unpacked into a folder (nothing
#     installed): bookworm's 1.3.239 headers fail in ggml-vulkan.cpp with
#     "'LayerSettingEXT' is not a member of 'vk'". A trixie source line is added pinned to
#     priority 1, so no installed package ever upgrades from it.
#
# The headers land in ${SPECVIEW_CACHE:-~/.cache/specview}/vulkan-headers/<version>/usr/include
# and that include folder is printed on the last line of stdout.
#
# Environment:
#   SPECVIEW_CACHE            cache root (default ${XDG_CACHE_HOME:-~/.cache}/specview)
#   SPECVIEW_VULKAN_HEADERS   use this include folder instead (it must hold vulkan/vulkan.hpp)
# Exits non-zero, saying which part is missing, when any of this cannot be had.
set -euo pipefail

say() { echo "install-vulkan-deps: $*" >&2; }
die() { say "$*"; exit 3; }

CACHE="${SPECVIEW_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/specview}"
HEADERS_VERSION=1.4.309
HEADERS_DIR="$CACHE/vulkan-headers/$HEADERS_VERSION"

# Headers new enough for the vendored ggml-vulkan.cpp: vk::LayerSettingEXT arrived in 1.3.2xx's
# successors; check the declaration itself rather than a version number.
headers_ok() {
    grep -qs "struct LayerSettingEXT" "$1/vulkan/vulkan_structs.hpp" \
        && [[ -f "$1/../share/cmake/SPIRV-Headers/SPIRV-HeadersConfig.cmake" || -f /usr/share/cmake/SPIRV-Headers/SPIRV-HeadersConfig.cmake ]]
}

mesa_ok() {
    local v
    v="$(dpkg-query -W -f='${Version}' mesa-vulkan-drivers 2>/dev/null || true)"
    [[ -n "$v" ]] && dpkg --compare-versions "$v" ge 24 && [[ -n "$(ls /usr/share/vulkan/icd.d/lvp_icd*.json 2>/dev/null)" ]]
}

have_all() {
    command -v glslc >/dev/null && mesa_ok && [[ -e /usr/lib/x86_64-linux-gnu/libvulkan.so.1 || -n "$(ldconfig -p | grep libvulkan.so.1)" ]]
}

if [[ -n "${SPECVIEW_VULKAN_HEADERS:-}" ]]; then
    headers_ok "$SPECVIEW_VULKAN_HEADERS" || die "\$SPECVIEW_VULKAN_HEADERS=$SPECVIEW_VULKAN_HEADERS has no vk::LayerSettingEXT (Vulkan headers older than 1.3.2xx)"
    include="$SPECVIEW_VULKAN_HEADERS"
else
    include="$HEADERS_DIR/usr/include"
fi

if have_all && headers_ok "$include"; then
    say "already in place: glslc $(glslc --version 2>/dev/null | head -n 1 | awk '{print $2}'), mesa-vulkan-drivers $(dpkg-query -W -f='${Version}' mesa-vulkan-drivers), headers in $include"
    echo "$include"
    exit 0
fi

command -v apt-get >/dev/null || die "apt-get not found: install glslc, Mesa >= 24 (lavapipe) and Vulkan headers >= 1.3.2xx by hand, then give SPECVIEW_VULKAN_HEADERS"
[[ "$(id -u)" == 0 ]] || die "must run as root to install mesa-vulkan-drivers, libvulkan1 and glslc"
. /etc/os-release
[[ "${VERSION_CODENAME:-}" == bookworm ]] || say "written for Debian 12 (bookworm); this is ${PRETTY_NAME:-an unknown system}, trying anyway"

# Where bookworm itself comes from, so backports and trixie come from the same place.
mirror="$(grep -rhoE '(https?://[^ ]+/debian)/?( |$)' /etc/apt/sources.list /etc/apt/sources.list.d/ 2>/dev/null \
          | grep -v security | head -n 1 | tr -d ' ' | sed 's:/$::' || true)"
[[ -n "$mirror" ]] || die "found no Debian mirror in apt's sources to take bookworm-backports and trixie from"

list=/etc/apt/sources.list.d/specview-vulkan.sources
if [[ ! -f "$list" ]]; then
    say "adding bookworm-backports and trixie (pinned to priority 1) from $mirror"
    cat > "$list" <<EOF
# Added by specview's scripts/install-vulkan-deps.sh: Mesa 25 from backports, and trixie only for
# 'apt-get download libvulkan-dev/trixie' (see the pin in preferences.d/specview-trixie).
Types: deb
URIs: $mirror
Suites: bookworm-backports trixie
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
    cat > /etc/apt/preferences.d/specview-trixie <<'EOF'
# Nothing installs or upgrades from trixie unless asked for by name and release.
Package: *
Pin: release n=trixie
Pin-Priority: 1
EOF
fi
apt-get update -qq >&2 || die "apt-get update failed (with the backports and trixie lines in $list)"

if ! have_all; then
    say "installing mesa-vulkan-drivers and libvulkan1 from bookworm-backports, glslc from bookworm"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        -t bookworm-backports mesa-vulkan-drivers libvulkan1 >&2 \
        || die "could not install mesa-vulkan-drivers/libvulkan1 from bookworm-backports"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends glslc >&2 \
        || die "could not install glslc"
fi
mesa_ok || die "mesa-vulkan-drivers $(dpkg-query -W -f='${Version}' mesa-vulkan-drivers 2>/dev/null || echo '(none)') has no lavapipe >= 24; bookworm's 22.3.6 crashes in libvulkan_lvp.so"
command -v glslc >/dev/null || die "glslc is still missing"

if ! headers_ok "$include"; then
    say "fetching the Vulkan $HEADERS_VERSION headers (Debian 13's libvulkan-dev and spirv-headers) into $HEADERS_DIR"
    tmp="$(mktemp -d)"
    chmod 755 "$tmp"   # apt's download user writes there
    trap 'rm -rf "$tmp"' EXIT
    (cd "$tmp" && apt-get download "libvulkan-dev/trixie" "spirv-headers/trixie" >&2) \
        || die "apt-get download libvulkan-dev/trixie spirv-headers/trixie failed"
    rm -rf "$HEADERS_DIR.tmp"
    mkdir -p "$HEADERS_DIR.tmp"
    for deb in "$tmp"/*.deb; do dpkg -x "$deb" "$HEADERS_DIR.tmp"; done
    rm -rf "$HEADERS_DIR"
    mv "$HEADERS_DIR.tmp" "$HEADERS_DIR"
    headers_ok "$include" || die "the unpacked packages give no vk::LayerSettingEXT or SPIRV-Headers CMake config under $HEADERS_DIR"
fi

say "glslc $(glslc --version | head -n 1 | awk '{print $2}'), mesa-vulkan-drivers $(dpkg-query -W -f='${Version}' mesa-vulkan-drivers), headers in $include"
echo "$include"
