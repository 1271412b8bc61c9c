# Install the peers' wheels (FA4 + CuTe-DSL, comfy-kitchen) on the H200 device machine, which has no network.
# Source it from the repo root at the start of a device command:   . bench/install_on_device.sh
#
# The wheels travel as git-ignored folders named in `carry` (one call carries at most 64 MiB), so over
# three calls to the same warm machine (it stays warm ~30 s between calls):
#   call 1: carry [".carry/whl_a"]                              command: . bench/install_on_device.sh
#   call 2: carry [".carry/whl_b"]                              command: . bench/install_on_device.sh
#   call 3: carry [".carry/whl_c", ".carry/pisa_official"]      command: . bench/install_on_device.sh && python3 ...
# Each call stashes what it carried in $STASH (/root/stash, which outlives the call on a warm machine); once
# every part is there it reassembles the split nvidia-cutlass-dsl-libs-cu13 wheel, checks its sha256, installs
# all wheels into $SITE (/tmp/site) and exports PYTHONPATH. A later call on the same machine reuses /tmp/site.
# The folders are made on a developer machine (they are git-ignored; never commit them):
#   P="--no-deps --only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
#      --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64
#      --platform manylinux2014_x86_64 --platform any"
#   python3 -m pip download $P -d .carry/dl flash-attn-4==4.0.0b36 nvidia-cutlass-dsl==4.8.1 \
#       nvidia-cutlass-dsl-libs-base==4.8.1 nvidia-cutlass-dsl-libs-core==4.8.1 nvidia-cutlass-dsl-libs-cu13==4.8.1 \
#       quack-kernels==0.6.5 apache-tvm-ffi==0.1.15.post2 torch-c-dlpack-ext==0.1.5 comfy-kitchen==0.2.40
#   split -b 45M -d -a 1 .carry/dl/nvidia_cutlass_dsl_libs_cu13-*.whl .carry/whl_a/cutlass_libs_cu13.part
#   (move part1 to whl_b; `sha256sum` of the whole wheel into whl_b/cutlass_libs_cu13.sha256; comfy-kitchen:
#   unzip, delete comfy_kitchen/backends/hip and its RECORD lines, zip again under the same file name)
#   whl_a: cutlass_libs_cu13.part0 (first 45 MiB of nvidia_cutlass_dsl_libs_cu13-4.8.1-cp312-...whl)
#   whl_b: cutlass_libs_cu13.part1, cutlass_libs_cu13.sha256, flash_attn_4-4.0.0b36, nvidia_cutlass_dsl-4.8.1,
#          nvidia_cutlass_dsl_libs_base/core-4.8.1, quack_kernels-0.6.5, apache_tvm_ffi-0.1.15.post2,
#          torch_c_dlpack_ext-0.1.5
#   whl_c: comfy_kitchen-0.2.40 repacked without backends/hip (ROCm only)
#   pisa_official: the official PISA kernel file (never committed; bench/peers.py --pisa-dir)
# Everything else FA4 needs (torch, einops, typing-extensions, cuda-bindings, protobuf) is in the image.

STASH=${STASH:-/root/stash}
SITE=${SITE:-/tmp/site}

_psa_install() {
    mkdir -p "$STASH" || return 1
    local d
    for d in .carry/whl_a .carry/whl_b .carry/whl_c; do
        [ -d "$d" ] && cp -f "$d"/* "$STASH"/ 2>/dev/null
    done
    if [ -f "$SITE/.psa_installed" ]; then
        echo "install_on_device: $SITE already installed"
        return 0
    fi
    local missing=""
    for f in cutlass_libs_cu13.part0 cutlass_libs_cu13.part1 cutlass_libs_cu13.sha256; do
        [ -f "$STASH/$f" ] || missing="$missing $f"
    done
    ls "$STASH"/comfy_kitchen-*.whl >/dev/null 2>&1 || missing="$missing comfy_kitchen"
    ls "$STASH"/flash_attn_4-*.whl >/dev/null 2>&1 || missing="$missing flash_attn_4"
    if [ -n "$missing" ]; then
        echo "install_on_device: stashed in $STASH; still missing:$missing"
        return 0
    fi
    (
        cd "$STASH" || exit 1
        local whl
        whl=$(awk '{print $2}' cutlass_libs_cu13.sha256)
        whl=$(basename "$whl")
        cat cutlass_libs_cu13.part0 cutlass_libs_cu13.part1 > "$whl" || exit 1
        echo "$(awk '{print $1}' cutlass_libs_cu13.sha256)  $whl" | sha256sum -c --quiet - || exit 1
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target "$SITE" ./*.whl || exit 1
    ) || { echo "install_on_device: install FAILED"; return 1; }
    touch "$SITE/.psa_installed"
    echo "install_on_device: installed into $SITE"
}

if _psa_install; then
    # --target does not run nvidia_cutlass_dsl_packages.pth, so add the DSL's package dir by hand
    case ":$PYTHONPATH:" in
        *":$SITE:"*) ;;
        *) export PYTHONPATH="$SITE:$SITE/nvidia_cutlass_dsl/dsl_packages${PYTHONPATH:+:$PYTHONPATH}" ;;
    esac
    [ -d .carry/pisa_official ] && export PISA_OFFICIAL_DIR="$PWD/.carry/pisa_official"
    true
else
    false
fi
