"""Every Triton kernel case on the CPU, in one interpreter process.

`TRITON_INTERPRET=1 python interpreted_cases.py [seed]` runs the attention cases
(attention_cases.py, cascade included), the sliding-window and soft-cap cases
(window_cases.py), the FP8 KV cache cases (fp8_kv_cases.py), the FP8 linear's per-token
quantizer, its SiLU·mul-fused form and the add + norm fused with it (fp8_quant_cases.py), the
decode-fill cases (step_fill_cases.py), the rotary + K/V store cases (rope_store_cases.py), the fused-MoE
and MoE-routing cases (moe_cases.py) and the deterministic mode's (deterministic_cases.py)
and prints one JSON object. tests/runtime/conftest.py runs it once per session in a
subprocess, so that the flag (read when triton defines the kernels) never reaches the test
process and the interpreter starts once for both.
"""

from __future__ import annotations

import json
import os
import sys

import torch
from attention_cases import run_triton_cascade_cases, run_triton_cascade_graph_cases, run_triton_cpu_cases
from deterministic_cases import run_triton_invariance_cases, run_triton_matmul_cases
from fp8_kv_cases import run_triton_f16_tile_cases, run_triton_fp8_cases
from fp8_quant_cases import run_build_cases, run_fp8_quant_cases, run_norm_quant_cases, run_silu_quant_cases
from moe_cases import run_moe_cases, run_route_cases
from rope_store_cases import run_rope_store_cases
from step_fill_cases import run_step_fill_cases
from window_cases import run_window_cases

if __name__ == "__main__":
    seed = int(sys.argv[1]) if len(sys.argv) > 1 else int.from_bytes(os.urandom(4), "little")
    torch.manual_seed(seed)
    results = run_triton_cpu_cases()
    cascade = run_triton_cascade_cases()
    graphs = run_triton_cascade_graph_cases()
    out = {
        "seed": seed,
        "results": results,
        "cascade": cascade,
        "cascade_graph": graphs,
        "windows": run_window_cases(),
        "fp8_kv": run_triton_fp8_cases(),
        "fp8_f16_tiles": run_triton_f16_tile_cases(),
        "fp8_quant": run_fp8_quant_cases(seed),
        "fp8_silu_quant": run_silu_quant_cases(seed),
        "fp8_norm_quant": run_norm_quant_cases(seed),
        "fp8_builds": run_build_cases(),
        "step_fill": run_step_fill_cases(seed),
        "rope_store": run_rope_store_cases(seed),
        "moe": run_moe_cases(seed),
        "moe_route": run_route_cases(seed),
        "invariance": run_triton_invariance_cases(),
        "invariant_matmul": run_triton_matmul_cases(),
    }
    print(json.dumps(out))
