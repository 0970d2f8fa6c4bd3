"""Block-scaled FP8 checkpoints (transformers' fine-grained FP8 with `weight_block_size`:
DeepSeek-V3's and the Qwen3 FP8 releases' layout) against transformers.

The checkpoints are written here from tiny random models saved by transformers, with this
file's own block quantizer: one `weight_scale_inv` per `[block_n, block_k]` tile of each
decoder-layer linear, the last tile of a dim cut short where the dim is not whole blocks.
The reference is transformers' model with those dequantized weights and every linear's input
(lm_head excepted) fake-quantized per token in groups of `block_k` columns, as transformers'
fine-grained FP8 linear quantizes it (absmax / 448 in the format's products).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from radixserve.model.loader import load_model
from radixserve.runtime.fp8_block import (
    block_scales,
    check_block_device,
    check_block_shape,
    reference_block_linear,
)
from tests.model.test_fp8 import FP8, INV_448, LINEARS, check_against, fake_fp8_reference


def _pad_to(t: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    return torch.nn.functional.pad(t, (0, cols - t.shape[1], 0, rows - t.shape[0]))


def quantize_blocks(w: torch.Tensor, block: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(FP8 weight, float32 scales `[ceil(N / bn), ceil(K / bk)]`): absmax / 448 per tile."""
    (n, k), (bn, bk) = w.shape, block
    nb, kb = -(-n // bn), -(-k // bk)
    tiles = _pad_to(w.float(), nb * bn, kb * bk).view(nb, bn, kb, bk)
    scale = tiles.abs().amax(dim=(1, 3)).clamp(min=1e-12) * INV_448
    full = scale.repeat_interleave(bn, 0).repeat_interleave(bk, 1)[:n, :k]
    return (w.float() * (1.0 / full)).clamp(-448.0, 448.0).to(FP8), scale


def _fake_quantize_groups(x: torch.Tensor, group: int) -> torch.Tensor:
    k = x.shape[-1]
    kb = -(-k // group)
    g = torch.nn.functional.pad(x.float(), (0, kb * group - k)).unflatten(-1, (kb, group))
    scale = g.abs().amax(dim=-1, keepdim=True).clamp(min=1e-12) * INV_448
    q = (g * (1.0 / scale)).clamp(-448.0, 448.0).to(FP8).float() * scale
    return q.flatten(-2)[..., :k].to(x.dtype)


def to_block_fp8(src: Path, dst: Path, block: tuple[int, int]) -> dict[str, torch.Tensor]:
    """Write `src`'s checkpoint into `dst` as transformers' fine-grained FP8 with `block`
    tiles; returns the dequantized float32 weight of every quantized linear."""
    dst.mkdir(parents=True, exist_ok=True)
    out: dict[str, torch.Tensor] = {}
    dequantized: dict[str, torch.Tensor] = {}
    with safe_open(str(src / "model.safetensors"), framework="pt") as f:
        for name in f.keys():  # noqa: SIM118
            t = f.get_tensor(name)
            parts = name.split(".")
            if ".layers." not in name or parts[-1] != "weight" or parts[-2] not in LINEARS:
                out[name] = t
                continue
            w8, scale = quantize_blocks(t, block)
            out[name], out[name + "_scale_inv"] = w8, scale
            n, k = t.shape
            full = scale.repeat_interleave(block[0], 0).repeat_interleave(block[1], 1)[:n, :k]
            dequantized[name] = w8.float() * full
    save_file(out, str(dst / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = {
        "quant_method": "fp8",
        "activation_scheme": "dynamic",
        "weight_block_size": list(block),
    }
    (dst / "config.json").write_text(json.dumps(config))
    shutil.copy(src / "generation_config.json", dst / "generation_config.json")
    return dequantized


# llama3-rope: hidden 64, q 64, k/v 32, intermediate 160; blocks of 16 rows and 48 columns leave
# every K dim's last block short (64 = 48 + 16, 160 = 3 * 48 + 16). qwen3: q 128, k/v 64, 32 x 32.
@pytest.mark.parametrize(("kind", "block"), [("llama3-rope", (16, 48)), ("qwen3", (32, 32))])
def test_block_fp8_checkpoint_matches_reference(
    kind: str, block: tuple[int, int], tmp_path: Path, helpers: Any
) -> None:
    hf = helpers.make_tiny_checkpoint(kind, tmp_path / "src")
    weights = to_block_fp8(tmp_path / "src", tmp_path / "fp8", block)
    loaded = load_model(str(tmp_path / "fp8"))
    layer = loaded.model.model.layers[0]
    assert layer.self_attn.qkv_proj.weight.dtype == FP8
    assert layer.mlp.down_proj.weight_block == block
    assert loaded.model.lm_head.weight.dtype == torch.float32
    ref = fake_fp8_reference(hf, weights, lambda x: _fake_quantize_groups(x, block[1]))
    check_against(ref, tmp_path / "fp8", helpers)


def test_compressed_tensors_fp8_block_reads_as_finegrained(tmp_path: Path, helpers: Any) -> None:
    """llm-compressor's FP8_BLOCK scheme (weights `strategy: "block"`, activations per token group)
    stores the same numbers under `weight_scale`: the same model as the fine-grained checkpoint."""
    helpers.make_tiny_checkpoint("llama3-rope", tmp_path / "src")
    to_block_fp8(tmp_path / "src", tmp_path / "fg", (16, 48))
    ct = tmp_path / "ct"
    ct.mkdir()
    with safe_open(str(tmp_path / "fg" / "model.safetensors"), framework="pt") as f:
        tensors = {n.replace(".weight_scale_inv", ".weight_scale"): f.get_tensor(n) for n in f.keys()}  # noqa: SIM118
    save_file(tensors, str(ct / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((tmp_path / "fg" / "config.json").read_text())
    weights = {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": False, "strategy": "block"}
    acts = {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": True, "strategy": "group"}
    config["quantization_config"] = {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "ignore": ["lm_head"],
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": weights | {"block_structure": [16, 48]},
                "input_activations": acts | {"group_size": 48},
            }
        },
    }
    (ct / "config.json").write_text(json.dumps(config))
    fg, ours = load_model(str(tmp_path / "fg")), load_model(str(ct))
    assert ours.model.model.layers[1].self_attn.o_proj.weight_block == (16, 48)
    ids = torch.randint(3, 256, (12,), generator=torch.Generator().manual_seed(4)).tolist()
    want = helpers.our_logits(fg.model, fg.config, ids, torch.arange(12))
    assert torch.equal(helpers.our_logits(ours.model, ours.config, ids, torch.arange(12)), want)


def test_block_scales_of_fused_parts_must_be_whole_blocks(tmp_path: Path, helpers: Any) -> None:
    """gate/up of 160 rows cannot stack with 24-row scale blocks: refused, naming the parts."""
    helpers.make_tiny_checkpoint("llama3-rope", tmp_path / "src")
    to_block_fp8(tmp_path / "src", tmp_path / "fp8", (24, 32))
    with pytest.raises(ValueError, match=r"scales of 24 rows .* gate \(160 rows\), up \(160 rows\)"):
        load_model(str(tmp_path / "fp8"))


def test_reference_block_linear_is_the_blockwise_sum() -> None:
    """The CPU reference equals the definition: per K group, the token group's dequantized
    values times the weight tile's, summed over groups, plus the bias."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(5, 80, generator=gen)
    w = torch.randn(48, 80, generator=gen)
    bias = torch.randn(48, generator=gen)
    block = (16, 32)
    w8, s = quantize_blocks(w, block)
    scale = block_scales(s, 80, block[1])
    assert scale.shape == (3, 4) and torch.equal(scale[:, :3], s) and not scale[:, 3:].any()
    got = reference_block_linear(x, w8, scale, block, bias)
    want = bias.clone().expand(5, 48).clone()
    for g in range(3):
        cols = slice(32 * g, min(32 * (g + 1), 80))
        xq = _fake_quantize_groups(x[:, cols], 32)
        wd = w8[:, cols].float() * s[:, g].repeat_interleave(16)[:, None]
        want += xq @ wd.t()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_block_fp8_refused_where_its_gemm_does_not_run() -> None:
    check_block_device((9, 0), "cuda:0")
    for other in ((8, 9), (10, 0), (12, 0)):
        with pytest.raises(ValueError, match=r"weight_block_size.*Hopper.*cuda:0 has"):
            check_block_device(other, "cuda:0")
    check_block_shape("l", 256, 1024, (128, 128))
    with pytest.raises(ValueError, match="takes 128x128 only"):
        check_block_shape("l", 256, 1024, (64, 128))
    with pytest.raises(ValueError, match=r"l is 192x1024.*multiples of 128"):
        check_block_shape("l", 192, 1024, (128, 128))
