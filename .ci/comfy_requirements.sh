#!/usr/bin/env bash
# Called by .ci/run as `comfy_requirements.sh PYTHON COMFY_DIR`: the ComfyUI server requirements (and the
# checkout itself when only a local mirror is present) come from comfy_setup.sh.
exec bash "$(dirname "${BASH_SOURCE[0]}")/comfy_setup.sh" "$@"
