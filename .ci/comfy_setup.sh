#!/usr/bin/env bash
# Make the ComfyUI versions the tests run against available, and install what their servers need on CPU.
#   bash .ci/comfy_setup.sh [PYTHON] [COMFY_DIR]      (defaults: .venv/bin/python, $COMFYUI_PATH or ~/comfy/ComfyUI)
# Versions (newest last):   0.3.64 from $COMFYUI_MIRROR     (default /work/.mirror/Comfy-Org+ComfyUI/repo)
#                           0.33.0 from $COMFYUI_MIRROR_033 (default /work/.mirror/yzkee+ComfyUI/repo)
# The first goes to COMFY_DIR, each later one beside it as COMFY_DIR-<version> (tests/comfy_server.py finds
# them there). A folder that already holds a checkout is used as it is. ComfyUI is on no package registry
# (PyPI's `comfyui` is an unrelated 0.0.1 placeholder; comfy-cli clones from GitHub), so a checkout comes
# from a local bare mirror, materialised with git archive (blobs missing from a partial mirror are left out),
# or not at all: then one SKIP NOTICE per version, and that version's tests skip loudly.
#
# One venv serves every version (measured, see the pack's README "Tests"): the versions' runtime
# requirements are compatible, and the only pins that differ are the UI packages (frontend, workflow
# templates, embedded docs). The newest version's UI pins go into the venv; every older version gets its
# own into <its checkout>/.psa-site-packages (pip --target, no deps), which the tests put on PYTHONPATH in
# front of the venv when they start that version's server. A second venv would cost another torch
# install (~6.9 GB, ~100 s) for no test that needs it. Contains no ComfyUI code.
set -euo pipefail
VPY=${1:-.venv/bin/python}
COMFY=${2:-${COMFYUI_PATH:-$HOME/comfy/ComfyUI}}
SITE=.psa-site-packages
say() { printf '[comfy_setup] %s\n' "$*"; }

VERSIONS=("0.3.64" "0.33.0")
declare -A MIRROR=(["0.3.64"]="${COMFYUI_MIRROR:-/work/.mirror/Comfy-Org+ComfyUI/repo}"
                   ["0.33.0"]="${COMFYUI_MIRROR_033:-/work/.mirror/yzkee+ComfyUI/repo}")

materialise() {  # materialise MIRROR DIR
  local mirror=$1 dir=$2 sha p missing excludes=()
  mkdir -p "$dir"
  # paths whose blob is absent from the mirror (a partial snapshot, e.g. two tokenizer files of 0.33.0)
  missing=$(git --git-dir="$mirror" ls-tree -r HEAD | awk '{print $3}' \
    | git --git-dir="$mirror" cat-file --batch-check | awk '$2 == "missing" {print $1}')
  for sha in $missing; do
    p=$(git --git-dir="$mirror" ls-tree -r HEAD | awk -v s="$sha" '$3 == s {print $4}')
    say "  skipping $p (blob not in the mirror)"
    excludes+=(":(exclude)$p")
  done
  # git still reports an excluded missing blob on stderr; the archive is complete without it
  { git --git-dir="$mirror" archive HEAD -- . "${excludes[@]}" 2>/dev/null || true; } | tar -x -C "$dir"
  [ -f "$dir/main.py" ]
}

have=()   # "version dir" of every version available
for i in "${!VERSIONS[@]}"; do
  ver=${VERSIONS[$i]}
  dir=$COMFY; [ "$i" -gt 0 ] && dir="$COMFY-$ver"
  mirror=${MIRROR[$ver]}
  if [ ! -f "$dir/main.py" ]; then
    if [ -d "$mirror" ] && git --git-dir="$mirror" rev-parse -q --verify HEAD >/dev/null 2>&1; then
      say "materialising ComfyUI $ver ($(git --git-dir="$mirror" describe --tags --always HEAD 2>/dev/null)) from $mirror into $dir"
      materialise "$mirror" "$dir" || { say "ERROR: materialising ComfyUI $ver into $dir failed"; exit 1; }
    else
      say "SKIP NOTICE: ComfyUI $ver: no checkout at $dir and no mirror at $mirror (ComfyUI is on no package registry): its real-ComfyUI tests will skip"
      continue
    fi
  fi
  got=$(sed -n 's/^__version__ = "\(.*\)"/\1/p' "$dir/comfyui_version.py" 2>/dev/null || true)
  [ "$got" = "$ver" ] || say "WARNING: $dir holds ComfyUI ${got:-of unknown version}, expected $ver; testing what is there"
  have+=("$ver $dir")
done
[ ${#have[@]} -gt 0 ] || exit 0

# runtime requirements of every version, minus torch (pinned by .ci/run) and minus the UI pins (below)
UI='^(comfyui-frontend-package|comfyui-workflow-templates|comfyui-embedded-docs)'
reqs=(); files=()
for entry in "${have[@]}"; do
  dir=${entry#* }
  f=$(mktemp); reqs+=("-r" "$f"); files+=("$f")
  grep -vE "^(torch|torchvision|torchaudio)\s*$|^\s*#|^\s*$|$UI" "$dir/requirements.txt" > "$f"
done
say "installing the runtime requirements of ComfyUI $(printf '%s ' "${have[@]%% *}")into one venv"
"$VPY" -m pip install -q "${reqs[@]}" spandrel requests
rm -f "${files[@]}"
# 0.33's server imports torchaudio at start-up (comfy/sd.py: the LTX audio VAE; 0.3.64 runs with or without
# it); 2.11.1 imports beside torch 2.14.1, and --no-deps keeps pip from replacing torch with the one it names
"$VPY" -m pip install -q --no-deps torchaudio==2.11.1 \
  || say "WARNING: torchaudio 2.11.1 could not be installed; the ComfyUI 0.33 server will not start"

# UI pins: the newest version's into the venv, each older version's into its own site folder
last=$((${#have[@]} - 1))
for i in "${!have[@]}"; do
  ver=${have[$i]%% *}; dir=${have[$i]#* }
  pins=$(grep -E "$UI" "$dir/requirements.txt" | tr '\n' ' ')
  if [ "$i" -eq "$last" ]; then
    rm -rf "${dir:?}/$SITE"
    say "ComfyUI $ver: UI pins into the venv: $pins"
    # shellcheck disable=SC2086
    "$VPY" -m pip install -q $pins
  else
    say "ComfyUI $ver: UI pins into $dir/$SITE: $pins"
    rm -rf "${dir:?}/$SITE"
    # shellcheck disable=SC2086
    "$VPY" -m pip install -q --no-deps --target "$dir/$SITE" $pins
  fi
done

for entry in "${have[@]}"; do
  ver=${entry%% *}; dir=${entry#* }
  PYTHONPATH="$dir/$SITE${PYTHONPATH:+:$PYTHONPATH}" "$VPY" - "$dir" <<'PY'
import sys
sys.path.insert(0, sys.argv[1])
import torch, torchvision, aiohttp, transformers, av, scipy, comfy_api.latest  # noqa: F401
from importlib.metadata import version
v = open(sys.argv[1] + "/comfyui_version.py").read().split('"')[1]
print(f"[comfy_setup] ComfyUI {v} at {sys.argv[1]} imports: ok (frontend {version('comfyui-frontend-package')})")
PY
done
