#!/usr/bin/env bash
# Make sure wgpu finds a native adapter (Vulkan/Metal/D3D12); if not, install Mesa's
# software Vulkan adapter (lavapipe), or say exactly what to install.
set -u
py=${1:-.venv/bin/python}
probe() {
  XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp} "$py" - <<'PY' 2>/dev/null
import sys, wgpu
ok = [a for a in wgpu.gpu.enumerate_adapters_sync()
      if str(a.info.get("backend_type", "")).lower() in ("vulkan", "metal", "d3d12")]
for a in ok:
    print(f"  adapter: {a.info.get('device')} ({a.info.get('backend_type')}, {a.info.get('adapter_type')})")
sys.exit(0 if ok else 1)
PY
}
if probe; then exit 0; fi
echo "No Vulkan/Metal/D3D12 adapter found; installing Mesa's software Vulkan adapter (lavapipe)."
if command -v apt-get >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then SUDO=""; elif command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else SUDO=none; fi
  if [ "$SUDO" != none ]; then
    $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq mesa-vulkan-drivers >/dev/null
    if probe; then exit 0; fi
  fi
fi
cat >&2 <<'MSG'
wgpar needs a WebGPU adapter and none was found, and lavapipe could not be installed here.
Install one of:
  - your GPU's Vulkan driver (Linux), or run on macOS (Metal) / Windows (D3D12);
  - Mesa's software Vulkan driver: Debian/Ubuntu `sudo apt-get install mesa-vulkan-drivers`,
    Fedora `sudo dnf install mesa-vulkan-drivers`, Arch `sudo pacman -S vulkan-swrast`.
MSG
exit 1
