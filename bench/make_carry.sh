#!/usr/bin/env bash
# Builds the one-call device carry .carry/cs1 (bench/README.md): the cutlass-dsl + FA4 site for the device's
# Python 3.12 as site.tar.xz (+ sha256), and ComfyUI's comfy/ .py files as comfy_py.tar.xz for dit_step.py.
# Usage: bash bench/make_carry.sh [COMFYUI_DIR]   (from the repo root; ~7 min, one core for xz)
# COMFYUI_DIR: a ComfyUI whose comfy/ imports with torch alone, such as 0.3.64 (Comfy-Org/ComfyUI). 0.33.0's comfy/
# imports comfy_kitchen, which the device image lacks: dit_step.py then stops at its import (session 19)
set -euo pipefail
OUTD=.carry/cs1; SITE=$(mktemp -d); mkdir -p $OUTD
python3 -m pip install -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --target "$SITE" \
  nvidia-cutlass-dsl==4.8.1 nvidia-cutlass-dsl-libs-base==4.8.1 nvidia-cutlass-dsl-libs-core==4.8.1 \
  nvidia-cutlass-dsl-libs-cu13==4.8.1 apache-tvm-ffi==0.1.15.post2 torch-c-dlpack-ext==0.1.5 \
  flash-attn-4==4.0.0b36 quack-kernels==0.6.5
find "$SITE" -name __pycache__ -type d -prune -exec rm -rf {} +
rm -rf "$SITE"/nvidia_cutlass_dsl/dsl_packages/iket
(cd "$SITE" && tar cf - . | xz --lzma2=preset=9e,dict=256MiB -T1) > $OUTD/site.tar.xz
(cd $OUTD && sha256sum site.tar.xz > site.tar.xz.sha256)
rm -rf "$SITE"
COMFY=${1:-${COMFYUI_PATH:-$HOME/comfy/ComfyUI}}
if [ -d "$COMFY/comfy" ]; then
  # (with comfyui_version.py: dit_step.py records the version from it; session 37's E printed "ComfyUI ?" without it)
  (cd "$COMFY" && tar cf - --exclude='*.json' --exclude='*.txt' --exclude='*.model' comfy comfyui_version.py | xz -9) \
    > $OUTD/comfy_py.tar.xz
else
  echo "no ComfyUI at $COMFY: comfy_py.tar.xz not built (dit_step.py needs it)"
fi
du -sh $OUTD/*
