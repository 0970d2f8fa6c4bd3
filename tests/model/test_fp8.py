"""FP8 weights (model/fp8.py, runtime/fp8_linear.py) against transformers.

The reference is transformers' model of the original checkpoint with each linear's
weight (lm_head excepted) replaced by its dequantized FP8 value and a forward
pre-hook that fake-quantizes its input per token (absmax / 448 to float8_e4m3fn
and back, in the format's products): the arithmetic our CPU path specifies. The FP8 checkpoints are written
here, from a tiny random model saved by transformers, in compressed-tensors'
layout (per channel and per tensor); the quantization in this file is its own
code, not radixserve's.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from radixserve.model.loader import load_model

FP8 = torch.float8_e4m3fn
PROMPT_LENS = (5, 12, 23)
NEW_TOKENS = 12
# Decoder-layer linears (checkpoint names); the embeddings, norms, lm_head stay as they are.
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
FUSED_LINEARS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")  # Phi-3's checkpoint names


def _prompt(n: int, seed: int) -> list[int]:
    return torch.randint(3, 256, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


# The documented format's arithmetic (docs/fp8.md): scale = absmax times 1/448 rounded to float32,
# values = x times the scale's reciprocal. bfloat16 values often sit exactly on a midpoint of the
# e4m3 grid after scaling, so `x / scale` would round many of them the other way.
INV_448 = torch.tensor(1 / 448.0, dtype=torch.float32)


def _quantize(w: torch.Tensor, per_tensor: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(FP8 weight, float32 scale: `[out, 1]` per channel, `[1]` per tensor)."""
    amax = w.abs().amax() if per_tensor else w.abs().amax(dim=1, keepdim=True)
    scale = (amax.float().clamp(min=1e-12) * INV_448).reshape(1 if per_tensor else (-1, 1))
    return (w.float() * (1.0 / scale)).clamp(-448.0, 448.0).to(FP8), scale


def _fake_quantize_tokens(x: torch.Tensor) -> torch.Tensor:
    scale = x.abs().amax(dim=-1, keepdim=True).float().clamp(min=1e-12) * INV_448
    return ((x.float() * (1.0 / scale)).clamp(-448.0, 448.0).to(FP8).float() * scale).to(x.dtype)


def _is_linear_weight(name: str, linears: tuple[str, ...]) -> bool:
    parts = name.split(".")
    return len(parts) >= 2 and parts[-1] == "weight" and parts[-2] in linears and ".layers." in name


def _ct_config(strategy: str, static: bool) -> dict[str, Any]:
    acts = {"num_bits": 8, "type": "float", "symmetric": True}
    acts |= {"dynamic": False, "strategy": "tensor"} if static else {"dynamic": True, "strategy": "token"}
    weights = {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": False, "strategy": strategy}
    return {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "quantization_status": "compressed",
        "ignore": ["lm_head"],
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": acts}},
    }


def to_compressed_tensors(
    src: Path, dst: Path, strategy: str, static: bool = False, linears: tuple[str, ...] = LINEARS
) -> dict[str, torch.Tensor]:
    """Write `src`'s checkpoint into `dst` as a compressed-tensors FP8 checkpoint; returns the
    dequantized float32 weight of every quantized linear, by checkpoint name."""
    dst.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, torch.Tensor] = {}
    with safe_open(str(src / "model.safetensors"), framework="pt") as f:
        for name in f.keys():  # noqa: SIM118
            tensors[name] = f.get_tensor(name)
    out: dict[str, torch.Tensor] = {}
    dequantized: dict[str, torch.Tensor] = {}
    for name, t in tensors.items():
        if not _is_linear_weight(name, linears):
            out[name] = t
            continue
        w8, scale = _quantize(t, per_tensor=strategy == "tensor")
        module = name.removesuffix(".weight")
        out[name], out[f"{module}.weight_scale"] = w8, scale
        if static:
            out[f"{module}.input_scale"] = torch.tensor([0.05])
        dequantized[name] = w8.float() * scale.reshape(-1, 1)
    save_file(out, str(dst / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = _ct_config(strategy, static)
    (dst / "config.json").write_text(json.dumps(config))
    shutil.copy(src / "generation_config.json", dst / "generation_config.json")
    return dequantized


def fake_fp8_reference(
    hf: Any, weights: dict[str, torch.Tensor], fake: Callable[[torch.Tensor], torch.Tensor] | None = None
) -> Any:
    """transformers' model with `weights` (checkpoint name -> float weight) in its linears,
    every linear but lm_head fake-quantizing its input with `fake` (default: per token)."""
    fake = fake or _fake_quantize_tokens
    params = dict(hf.named_parameters())
    with torch.no_grad():
        for name, w in weights.items():
            params[name].copy_(w)
    for name, module in hf.named_modules():
        if isinstance(module, nn.Linear) and name != "lm_head":
            module.register_forward_pre_hook(lambda _m, args: (fake(args[0]),))
    return hf


def _engine_greedy(folder: Path, prompts: list[list[int]], **config: Any) -> list[list[int]]:
    """Greedy tokens through the public API, the prompts batched together."""
    from radixserve import AsyncEngine, EngineConfig, SamplingParams

    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)

    async def main() -> list[list[int]]:
        async with AsyncEngine(EngineConfig(model=str(folder), device="cpu", **config)) as engine:
            outs = await asyncio.gather(*(engine.complete(p, params) for p in prompts))
            return [list(o.token_ids) for o in outs]

    return asyncio.run(main())


def check_against(ref: Any, folder: Path, helpers: Any, **config: Any) -> None:
    loaded = load_model(str(folder), quantization=config.get("quantization"))
    assert loaded.quantization == "fp8"
    for n in PROMPT_LENS:
        ids = _prompt(n, seed=n)
        with torch.inference_mode():
            want = ref(torch.tensor([ids])).logits[0].float()
        got = helpers.our_logits(loaded.model, loaded.config, ids, torch.arange(n))
        assert helpers.rel_err(got, want) < 1e-4
    prompts = [_prompt(n, seed=100 + n) for n in PROMPT_LENS]
    want_tokens = [helpers.hf_greedy(ref, p, NEW_TOKENS) for p in prompts]
    assert _engine_greedy(folder, prompts, **config) == want_tokens


@pytest.mark.parametrize(("kind", "strategy"), [("llama3-rope", "channel"), ("qwen3", "tensor")])
def test_compressed_tensors_checkpoint_matches_reference(
    kind: str, strategy: str, tmp_path: Path, helpers: Any
) -> None:
    hf = helpers.make_tiny_checkpoint(kind, tmp_path / "src")
    weights = to_compressed_tensors(tmp_path / "src", tmp_path / "fp8", strategy)
    loaded = load_model(str(tmp_path / "fp8"))
    fp8 = {n for n, p in loaded.model.named_parameters() if p.dtype == FP8}
    assert len(fp8) == 4 * loaded.config.num_layers  # qkv, o, gate_up, down per layer
    assert loaded.model.lm_head.weight.dtype == torch.float32
    check_against(fake_fp8_reference(hf, weights), tmp_path / "fp8", helpers)


def test_fused_checkpoint_with_static_scales(tmp_path: Path, helpers: Any) -> None:
    """Phi-3 stores qkv_proj and gate_up_proj fused: one per-tensor scale spans each; a
    static input_scale is read past (activations run per token)."""
    hf = helpers.make_tiny_checkpoint("phi3-longrope", tmp_path / "src")
    weights = to_compressed_tensors(
        tmp_path / "src", tmp_path / "fp8", "tensor", static=True, linears=FUSED_LINEARS
    )
    assert len(weights) == 4 * hf.config.num_hidden_layers
    check_against(fake_fp8_reference(hf, weights), tmp_path / "fp8", helpers)


def test_quantization_fp8_at_load_of_a_bf16_checkpoint(tmp_path: Path, helpers: Any) -> None:
    hf = helpers.make_tiny_checkpoint("llama-tied-bias", tmp_path / "full")
    hf.to(torch.bfloat16).save_pretrained(tmp_path / "bf16")
    hf = helpers.no_eos(type(hf).from_pretrained(tmp_path / "bf16", dtype=torch.float32).eval())
    weights = {
        n: _quantize(p.detach(), per_tensor=False)
        for n, p in hf.named_parameters()
        if _is_linear_weight(n, LINEARS)
    }
    dequantized = {n: w8.float() * s for n, (w8, s) in weights.items()}
    plain = load_model(str(tmp_path / "bf16"))
    assert plain.quantization is None and all(p.dtype == torch.float32 for p in plain.model.parameters())
    check_against(fake_fp8_reference(hf, dequantized), tmp_path / "bf16", helpers, quantization="fp8")


def test_moe_router_and_experts_stay_in_model_dtype(tmp_path: Path, helpers: Any) -> None:
    helpers.make_tiny_checkpoint("qwen2-moe", tmp_path)
    loaded = load_model(str(tmp_path), quantization="fp8")
    dtypes = {n: p.dtype for n, p in loaded.model.named_parameters()}
    assert dtypes["model.layers.1.mlp.gate.weight"] == torch.float32
    assert dtypes["model.layers.1.mlp.shared_expert_gate.weight"] == torch.float32
    assert dtypes["model.layers.1.mlp.experts.gate_up_proj"] == torch.float32
    assert dtypes["model.layers.1.mlp.shared_expert.gate_up_proj.weight"] == FP8
    assert dtypes["model.layers.0.mlp.down_proj.weight"] == FP8
    assert dtypes["lm_head.weight"] == dtypes["model.embed_tokens.weight"] == torch.float32
    ids = _prompt(9, seed=1)
    logits = helpers.our_logits(loaded.model, loaded.config, ids, None)
    assert torch.isfinite(logits).all()


def test_finegrained_fp8_per_tensor_reads_as_compressed_tensors(tmp_path: Path, helpers: Any) -> None:
    """transformers' `quant_method: "fp8"` with `weight_block_size: null`: a scalar
    `weight_scale_inv` per tensor (transformers multiplies by it), the same numbers as the
    compressed-tensors per-tensor checkpoint."""
    helpers.make_tiny_checkpoint("llama3-rope", tmp_path / "src")
    to_compressed_tensors(tmp_path / "src", tmp_path / "ct", "tensor")
    fg = tmp_path / "fg"
    fg.mkdir()
    with safe_open(str(tmp_path / "ct" / "model.safetensors"), framework="pt") as f:
        tensors = {
            n.replace(".weight_scale", ".weight_scale_inv"): f.get_tensor(n).reshape(())
            if n.endswith(".weight_scale")
            else f.get_tensor(n)
            for n in f.keys()  # noqa: SIM118
        }
    save_file(tensors, str(fg / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((tmp_path / "ct" / "config.json").read_text())
    config["quantization_config"] = {
        "quant_method": "fp8",
        "activation_scheme": "dynamic",
        "weight_block_size": None,
    }
    (fg / "config.json").write_text(json.dumps(config))
    ct, ours = load_model(str(tmp_path / "ct")), load_model(str(fg))
    assert ours.quantization == "fp8"
    ids = _prompt(12, seed=4)
    want = helpers.our_logits(ct.model, ct.config, ids, torch.arange(12))
    assert torch.equal(helpers.our_logits(ours.model, ours.config, ids, torch.arange(12)), want)


@pytest.mark.parametrize(("hidden", "norm_width"), [(64, 64), (16400, None)])
def test_fp8_use_names_the_widths_start_up_compiles(hidden: int, norm_width: int | None) -> None:
    """`fp8_use` lists the input widths of the FP8 linears that quantize their own input (not the
    SiLU-gated down projections: the fused SiLU·mul quantizer feeds them), theirs and the fused
    norm's; a hidden size wider than the fused norm holds runs its norms apart, so no build
    of it (a build would refuse the width and fail the engine's start)."""
    from transformers import LlamaConfig

    from radixserve.model.config import ModelConfig
    from radixserve.model.decoder import DecoderForCausalLM
    from radixserve.model.fp8 import fp8_use, quantizable_linears

    hf = LlamaConfig(
        vocab_size=128,
        hidden_size=hidden,
        intermediate_size=96,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    with torch.device("meta"):  # shapes only
        model = DecoderForCausalLM(ModelConfig.from_hf(hf), torch.bfloat16)
        for _, linear in quantizable_linears(model):
            linear.to_fp8()
    use = fp8_use(model, torch.bfloat16, torch.device("cuda"), plus_one=False)
    assert use.input_widths == (hidden,)
    assert use.silu_widths == (96,)
    assert use.norm_width == norm_width
