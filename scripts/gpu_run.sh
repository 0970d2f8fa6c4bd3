#!/usr/bin/env bash
# One device call of GPU work, from the repository root on the GPU machine:
#
#     RADIXSERVE_COMMIT=<sha> bash scripts/gpu_run.sh correctness,w1 [suite seconds]
#
# (carry .whl and, when present, .fi_cache). In order, each step bounded so
# that whatever finished comes back under $OUT:
#   1. the wheels and cached FlashInfer kernels (scripts/gpu_env.sh), then the
#      FlashInfer modules of both benchmark models built in parallel threads
#      through the engine's own start-up builds (`kernel_builds`; ~35 s on a
#      fresh machine; an engine's start() builds its own one after another, with
#      a progress line each, so this only overlaps the builds and fills the cache);
#   2. the GPU tests, `pytest -m gpu tests/runtime` (all of them live there; the
#      whole `tests` tree does not collect on the device, which lacks the
#      server's packages), log in $OUT/gpu_tests.log;
#   3. the compiled FlashInfer modules packed into $OUT/fi_cache.tgz and the Triton
#      cache into $OUT/triton_cache.tgz (copy both to .fi_cache/ here and carry that:
#      the next fresh machine skips the builds);
#   4. benchmarks/gpu_suite.py --only <sections>, records in $OUT/h200.jsonl,
#      log in $OUT/suite.log, its lines of figures printed last.
# Seen on a fresh H200 (2026-12-02): steps 1-3 about 3.5 min with a cold JIT
# cache; correctness ~190 s, W1 (both models) ~200 s. One call may run 10 min.
# The 73 GPU tests took 126-137 s on a warm H100 (2026-12-06) and did not all
# finish in 240 s on a fresh one (49 did, then 8 more in 230 s with the warm-up
# test compiling every module): GPU_TESTS_S (default 330) bounds them,
# GPU_TESTS_K="fused_moe or windows" picks some.
set -uo pipefail
sections="${1:?sections, e.g. correctness,w1 (benchmarks/gpu_suite.py --only)}"
suite_s="${2:-300}"
out="${OUT:?run through the device tool: \$OUT is its result folder}"
export PYTHONUNBUFFERED=1
# shellcheck source=scripts/gpu_env.sh
source scripts/gpu_env.sh || exit 1
python3 -c "from benchmarks.gpu_attention_check import prewarm_flashinfer as p; print('prewarm', p())"
# -v: the log names each test's outcome as it ends, so a run cut off by the timeout still
# says which passed (-q prints dots and its summary only at the end). GPU_TESTS_K: a -k filter.
timeout "${GPU_TESTS_S:-330}" python3 -m pytest -v -m gpu tests/runtime -p no:cacheprovider \
    ${GPU_TESTS_K:+-k "$GPU_TESTS_K"} >"$out/gpu_tests.log" 2>&1
tests_rc=$?
echo "gpu tests exit $tests_rc (124: cut off): $(grep -c ' PASSED' "$out/gpu_tests.log") passed," \
    "$(grep -c ' SKIPPED' "$out/gpu_tests.log") skipped," \
    "$(grep -cE ' (FAILED|ERROR)' "$out/gpu_tests.log") failed or errors"
grep -E ' (FAILED|ERROR)' "$out/gpu_tests.log" | head -20
python3 -c "import os; from pathlib import Path
from benchmarks.gpu_attention_check import pack_flashinfer_cache as p
print('fi_cache', p(Path(os.environ['OUT'])))"
pack_triton_cache "$out"
# shellcheck disable=SC2086 # SUITE_ARGS: more gpu_suite.py options, e.g. "--models dummy:qwen3-30b-a3b"
timeout "$suite_s" python3 benchmarks/gpu_suite.py --only "$sections" --out "$out" ${SUITE_ARGS:-} >"$out/suite.log" 2>&1
echo "suite exit $?"
grep -E '^\[|^-- |Error' "$out/suite.log"
