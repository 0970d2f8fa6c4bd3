#!/usr/bin/env bash
# Build the wheel folder an offline GPU machine needs (see shared/GPU.md).
#
# The device image has Python 3.12, torch, triton, ninja, nvcc but no
# flashinfer, xgrammar or pydantic. flashinfer's other declared needs (numpy,
# ninja, requests, einops, click, tqdm, tabulate, packaging, pynvml via
# nvidia-ml-py) are on the image; nvidia-cudnn-frontend is only imported by
# its cuDNN backend, which radixserve does not use. This collects, into .whl/ (git-ignored):
#   - flashinfer-python 0.3.1.post1 built here from its source release: a
#     ~6 MB just-in-time wheel (the 0.7 binary wheels are 100 MB + extras);
#   - xgrammar 0.2.9 (cp312 manylinux) and its runtime needs missing there.
# Idempotent: a wheel already in .whl/ is not fetched or built again.
# Usage: scripts/build_gpu_wheels.sh [DEST]   (DEST defaults to .whl)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="$(realpath -m "${1:-$ROOT/.whl}")"
PY="${PYTHON:-python3}"
FLASHINFER_VERSION="0.3.1.post1"
mkdir -p "$DEST"

have() { compgen -G "$DEST/$1" >/dev/null; }

# cp312 manylinux x86-64 binary wheels, no dependency resolution (pip would
# resolve against this machine's Python otherwise).
download_binary() {
    "$PY" -m pip download -q --no-deps --only-binary=:all: \
        --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
        --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any \
        -d "$DEST" "$1"
}

# name-glob  requirement. Versions are pinned so two runs give one folder.
BINARY_WHEELS=(
    "xgrammar-0.2.9-*.whl xgrammar==0.2.9"
    "apache_tvm_ffi-*.whl apache-tvm-ffi==0.1.15.post2"
    "pydantic-2.*.whl pydantic==2.14.4"
    "pydantic_core-*.whl pydantic-core==2.50.5"
    "annotated_types-*.whl annotated-types==0.8.0"
    "typing_inspection-*.whl typing-inspection==0.4.5"
    # pydantic-core wants >=4.16, newer than the image may carry; it shadows
    # the image's copy only for programs that put the wheel folder first.
    "typing_extensions-*.whl typing-extensions==4.16.0"
    # jsonschema checks tool definitions (radixserve.tools), imported with the engine.
    "jsonschema-4.*.whl jsonschema==4.26.0"
    "jsonschema_specifications-*.whl jsonschema-specifications==2025.9.1"
    "referencing-*.whl referencing==0.37.0"
    "rpds_py-*.whl rpds-py==2026.9.1"
    "attrs-*.whl attrs==26.1.0"
)
for entry in "${BINARY_WHEELS[@]}"; do
    read -r glob req <<<"$entry"
    if have "$glob"; then
        echo "have $req"
    else
        echo "download $req"
        download_binary "$req"
    fi
done

fi_glob="flashinfer_python-${FLASHINFER_VERSION}-*.whl"
if have "$fi_glob"; then
    echo "have flashinfer-python==$FLASHINFER_VERSION"
else
    echo "build flashinfer-python==$FLASHINFER_VERSION from its source release"
    work="$(mktemp -d)"
    trap 'rm -rf "$work"' EXIT
    # A throwaway venv: its setuptools must be current (the one a new venv
    # carries is too old for flashinfer's pyproject), and the project's venv
    # stays untouched. The build needs no torch: the kernels compile on first use.
    "$PY" -m venv "$work/venv"
    "$work/venv/bin/pip" install -q -U pip setuptools wheel packaging
    # --no-build-isolation: preparing the sdist's metadata must not pull its
    # declared build needs (torch, numpy from source) into an isolated env.
    "$work/venv/bin/pip" download -q --no-deps --no-binary :all: --no-build-isolation \
        "flashinfer-python==$FLASHINFER_VERSION" -d "$work/src"
    mkdir -p "$work/unpacked"
    tar -xzf "$work"/src/flashinfer_python-*.tar.gz -C "$work/unpacked"
    (cd "$work/unpacked"/flashinfer_python-* &&
        "$work/venv/bin/pip" wheel -q --no-deps --no-build-isolation -w "$DEST" .)
fi

echo "wheels in $DEST:"
ls -1 "$DEST"
du -sh "$DEST"
