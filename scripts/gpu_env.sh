# Source from the repository root on the offline GPU machine:
#     source scripts/gpu_env.sh && python3 ...
# - installs the wheels of .whl/ (scripts/build_gpu_wheels.sh) into /tmp/site
#   and puts that, then the repository root, first on PYTHONPATH;
# - installs flashinfer kernels compiled by an earlier run, carried in
#   .fi_cache/ (unpacked `aot/<module>/<module>.so`, or the fi_cache.tgz*
#   archive(s) that benchmarks/gpu_attention_check.py writes), as flashinfer
#   ahead-of-time ops, so they load instead of compiling (~20-90 s each);
# - points FLASHINFER_WORKSPACE_BASE at a fixed folder for kernels that still
#   compile; the benchmark collects them from there into a new archive;
# - points TRITON_CACHE_DIR at a fixed folder and unpacks .fi_cache/triton_cache.tgz
#   (pack_triton_cache below wrote it on an earlier machine) into it: Triton keys its
#   cache by source, options and GPU target, but its group files name absolute paths,
#   hence the fixed folder. An 8B engine's Triton kernels otherwise compile in start().
# Loading AOT ops avoids ninja's checks, which would rebuild on any change of
# path or timestamp between machines.

SITE="${RADIXSERVE_SITE:-/tmp/site}"
if [ -d .whl ]; then
    # Reinstall only when the wheel set changed (a warm machine keeps /tmp).
    stamp="$(ls .whl | cksum)"
    if [ "$(cat "$SITE/.radixserve_wheels" 2>/dev/null)" != "$stamp" ]; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target "$SITE" .whl/*.whl || return 1
        echo "$stamp" >"$SITE/.radixserve_wheels"
    fi
fi
# The repository root too: radixserve is not pip-installed there.
export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"

export FLASHINFER_WORKSPACE_BASE=/tmp/fi_ws
mkdir -p "$FLASHINFER_WORKSPACE_BASE"
if [ -d "$SITE/flashinfer" ] && [ -d .fi_cache ]; then
    aot="$SITE/flashinfer/data/aot"
    mkdir -p "$aot"
    if [ -d .fi_cache/aot ]; then
        cp -r .fi_cache/aot/. "$aot/"
    fi
    if compgen -G ".fi_cache/fi_cache.tgz*" >/dev/null; then
        cat .fi_cache/fi_cache.tgz* | tar -xz -C "$SITE/flashinfer/data"
    fi
    echo "gpu_env: $(find "$aot" -name '*.so' | wc -l) precompiled flashinfer module(s)"
fi

export TRITON_CACHE_DIR=/tmp/triton_cache
mkdir -p "$TRITON_CACHE_DIR"
if [ -f .fi_cache/triton_cache.tgz ] && [ -z "$(ls -A "$TRITON_CACHE_DIR")" ]; then
    tar -xzf .fi_cache/triton_cache.tgz -C "$TRITON_CACHE_DIR"
    echo "gpu_env: $(find "$TRITON_CACHE_DIR" -name '*.cubin' | wc -l) cached Triton kernel(s)"
fi

# Pack the Triton cache into $1/triton_cache.tgz (copy it to .fi_cache/ here and carry it).
pack_triton_cache() {
    tar -czf "$1/triton_cache.tgz" -C "$TRITON_CACHE_DIR" . &&
        echo "triton_cache: $(find "$TRITON_CACHE_DIR" -name '*.cubin' | wc -l) kernel(s)," \
            "$(du -k "$1/triton_cache.tgz" | cut -f1) KiB"
}
