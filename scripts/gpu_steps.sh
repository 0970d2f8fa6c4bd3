#!/usr/bin/env bash
# Several benchmarks/gpu_suite.py runs in one device call, each bounded so the call ends in time:
#
#     DEADLINE=580 bash scripts/gpu_steps.sh \
#         "w1l_bf16|120|--only w1l --w1l 128/128:3000" \
#         "w1l_fp8|120|--only w1l --w1l 128/128:3000 --quantization fp8"
#
# Each step is NAME|SECONDS|gpu_suite.py arguments. It runs for at most SECONDS and never past
# DEADLINE seconds from the script's start (default 580: a call may run 600), and is skipped when
# under 30 s are left. Its log is $OUT/NAME.log; its records are appended to the JSONL in $OUT
# (gpu_suite.py appends, so the steps keep each other's). The figures' lines print as each step
# ends: a call cut off still shows what finished. A lent machine goes back after ~30 s idle, so
# one call of several steps, composed beforehand, wastes no start (each start took 1.5-5 min).
# PYTHON picks the interpreter (default python3); gpu_env.sh sets up wheels and kernels first,
# and the Triton kernels compiled meanwhile are packed into $OUT/triton_cache.tgz at the end.
set -uo pipefail
out="${OUT:?run through the device tool: \$OUT is its result folder}"
deadline="${DEADLINE:-580}"
python="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1
# shellcheck source=scripts/gpu_env.sh
source scripts/gpu_env.sh || exit 1
if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name --format=csv,noheader
fi
for step in "$@"; do
    IFS='|' read -r name limit args <<<"$step"
    left=$((deadline - SECONDS))
    if [ "$left" -lt 30 ]; then
        echo "== $name: skipped, $left s left"
        continue
    fi
    [ "$limit" -gt "$left" ] && limit=$left
    echo "== $name (at most $limit s, $SECONDS s in)"
    # shellcheck disable=SC2086 # args: the step's gpu_suite.py options, split as written
    timeout "$limit" "$python" benchmarks/gpu_suite.py --out "$out" $args >"$out/$name.log" 2>&1
    echo "$name rc $? (124: cut off)"
    grep -E '^\[|^-- |done after|Error' "$out/$name.log" | tail -20
done
pack_triton_cache "$out"
echo "steps done at $SECONDS s"
