"""What the tiny-model comparisons leave out for Gemma, Phi-3 and the mixtures of experts:
LongRoPE past its switch, the stacked expert weights, and the refusals that name a field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from radixserve.model.loader import load_model
from radixserve.model.moe import SparseMoE
from radixserve.model.weights import checkpoint_views
from radixserve.runtime.attention import AttentionOptions, make_attention_backend
from radixserve.runtime.forward_batch import ForwardBatch


@pytest.fixture(scope="module")
def phi3(tmp_path_factory: pytest.TempPathFactory, helpers: Any) -> tuple[Any, Any]:
    folder = tmp_path_factory.mktemp("phi3")
    return helpers.make_tiny_checkpoint("phi3-longrope", folder), load_model(folder)


@torch.inference_mode()
def test_longrope_switches_to_its_long_factors_by_position(phi3: tuple[Any, Any], helpers: Any) -> None:
    """A prefill up to original_max_position_embeddings (40), then one token at a time past it:
    transformers' model with its cache rotates each new position by the factors its length
    calls for, as our table does by position; chunks and cached prefixes see the same table."""
    from transformers import DynamicCache

    hf, ours = phi3
    original = dict(ours.config.rope.params)["original_max_position_embeddings"]
    assert original == 40
    ids = torch.randint(3, 256, (44,), generator=torch.Generator().manual_seed(5)).tolist()
    cache = DynamicCache(config=hf.config)
    ref = [hf(torch.tensor([ids[:original]]), cache=cache, use_cache=True).logits[0, -1]]
    for p in range(original, len(ids)):
        step = hf(torch.tensor([[ids[p]]]), cache=cache, use_cache=True, position_ids=torch.tensor([[p]]))
        ref.append(step.logits[0, -1])
    # Ours: the same walk, except that the positions past the switch come in one extend.
    loop = helpers.greedy_loop(ours.model, ours.config, len(ids) + 4)
    slots = torch.tensor(loop.alloc(len(ids)))
    prefill = ForwardBatch.build(ids[:original], [original], [0], [slots[:original]])
    loop.attn.plan(prefill)
    first = ours.model(prefill, loop.attn)[0]
    n = len(ids) - original
    rest = ForwardBatch.build(ids[original:], [n], [original], [slots], logit_rows=torch.arange(n))
    loop.attn.plan(rest)
    got = torch.cat([first[None], ours.model(rest, loop.attn)])
    assert helpers.rel_err(got, torch.stack(ref)) < 1e-4


def test_longrope_table_rows_are_transformers_short_then_long(phi3: tuple[Any, Any]) -> None:
    hf, ours = phi3
    rotary = ours.model.model.rotary_emb
    x = torch.zeros(1)
    for p in (0, 39, 40, 300):  # transformers picks by the longest position of a forward
        cos, sin = hf.model.rotary_emb(x, torch.tensor([[p]]))
        half = rotary.cos.shape[-1]
        assert torch.equal(rotary.cos[p], cos[0, 0, :half]) and torch.equal(rotary.sin[p], sin[0, 0, :half])
    emb = hf.model.rotary_emb
    short_40 = (40 * emb.original_inv_freq).cos() * emb.attention_scaling
    assert not torch.allclose(rotary.cos[40], short_40)  # position 40 takes the long factors


def test_phi3_loads_its_fused_projections_whole(phi3: tuple[Any, Any]) -> None:
    hf, ours = phi3
    layer = ours.model.model.layers[0]
    hf_layer = hf.model.layers[0]
    assert torch.equal(layer.self_attn.qkv_proj.weight, hf_layer.self_attn.qkv_proj.weight)
    assert torch.equal(layer.mlp.gate_up_proj.weight, hf_layer.mlp.gate_up_proj.weight)


@pytest.mark.parametrize("kind", ["mixtral", "qwen3-moe"])
def test_experts_are_stacked_and_route_as_transformers(tmp_path: Path, helpers: Any, kind: str) -> None:
    """Each checkpoint expert lands in its slice of `[E, 2I, H]` / `[E, H, I]` (transformers'
    own layout), and checkpoint_views gives the checkpoint's names back."""
    from safetensors import safe_open

    hf = helpers.make_tiny_checkpoint(kind, tmp_path)
    ours = load_model(tmp_path)
    block = ours.model.model.layers[0].mlp
    assert isinstance(block, SparseMoE)
    hf_block = hf.model.layers[0].mlp
    assert torch.equal(block.experts.gate_up_proj, hf_block.experts.gate_up_proj)
    assert torch.equal(block.experts.down_proj, hf_block.experts.down_proj)
    x = torch.randn(9, 64, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        idx, w = block.route(x)
        _, hf_w, hf_idx = hf_block.gate(x)
        assert torch.equal(idx, hf_idx) and torch.allclose(w, hf_w)
        assert helpers.rel_err(block(x), hf_block(x[None])[0]) < 1e-5
    views = checkpoint_views(ours.model)
    with safe_open(str(tmp_path / "model.safetensors"), framework="pt") as f:
        assert set(views) == set(f.keys())
        for name in f.keys():  # noqa: SIM118 (safe_open is not a dict)
            assert torch.equal(views[name], f.get_tensor(name)), name


def test_flashinfer_kernels_refuse_softcap_naming_the_field() -> None:
    """FlashInfer's own kernels (`decode_kernel="flashinfer"`) have no soft-cap; the default
    "flashinfer" build and "triton" run Triton's, which compute it (tests/runtime/test_windows.py)."""
    from radixserve.cache.kv_pool import KVPool, KVPoolConfig

    pool = KVPool(KVPoolConfig(num_layers=2, num_kv_heads=2, head_dim=16, dtype=torch.float32), 8)
    options = AttentionOptions(windows=(8, None), logit_softcap=50.0)
    with pytest.raises(ValueError, match="attn_logit_softcapping=50.0"):
        make_attention_backend(
            "flashinfer", pool, 4, 2, 16, 0.25, decode_kernel="flashinfer", options=options
        )
    torch_backend = make_attention_backend("torch", pool, 4, 2, 16, 0.25, options=options)
    assert torch_backend.supports_windows and not torch_backend.supports_cascade


@pytest.mark.parametrize(
    ("kind", "edit", "needle"),
    [
        ("gemma2", {"hidden_activation": "relu"}, "hidden_activation 'relu'"),
        ("gemma3", {"use_bidirectional_attention": True}, "use_bidirectional_attention"),
        ("phi3-longrope", {"rope_scaling": None, "rope_parameters": {"rope_type": "dynamic"}}, "dynamic"),
        ("gemma2", {"architectures": ["Gemma2ForTokenClassification"]}, "Gemma2ForTokenClassification"),
    ],
)
def test_unsupported_options_fail_at_load_naming_the_field(
    tmp_path: Path, helpers: Any, kind: str, edit: dict[str, Any], needle: str
) -> None:
    helpers.make_tiny_checkpoint(kind, tmp_path)
    path = tmp_path / "config.json"
    raw = json.loads(path.read_text())
    for key, value in edit.items():
        if key == "rope_parameters":
            raw[key] = {**raw[key], **value}
        else:
            raw[key] = value
    path.write_text(json.dumps(raw))
    with pytest.raises(ValueError) as err:
        load_model(tmp_path)
    assert needle in str(err.value)


def test_a_backend_without_windows_caps_the_context_at_the_window(
    tmp_path: Path, helpers: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Triton and torch compute windows: the engine keeps the model's whole context, and Gemma 2's
    soft-cap builds. A backend without windows (FlashInfer's kernels, `decode_kernel="flashinfer"`;
    a stand-in here, on the CPU): full attention equals windowed attention up to the smallest
    window, so the engine's context stops there."""
    pytest.importorskip("triton")
    from radixserve import EngineConfig, engine_build
    from radixserve.engine_build import build_parts
    from radixserve.runtime.attention import TorchAttention
    from radixserve.runtime.runner import ModelRunner

    monkeypatch.setenv("TRITON_INTERPRET", "1")  # lets the backend build on the CPU
    # ...but this process defined the kernels uninterpreted, so the start-up kernel builds
    # (tests/runtime/test_warm_up.py runs them in an interpreter process) are left out here.
    monkeypatch.setattr(ModelRunner, "warm_up", lambda self, builds: 0.0)
    helpers.make_tiny_checkpoint("gemma3", tmp_path / "gemma3")
    base = {"model": str(tmp_path / "gemma3"), "device": "cpu", "kv_cache_tokens": 64}
    assert build_parts(EngineConfig(**base, attention_backend="triton")).context_length == 512
    assert build_parts(EngineConfig(**base, attention_backend="torch")).context_length == 512

    class NoWindows(TorchAttention):
        @property
        def supports_windows(self) -> bool:
            return False

    def no_windows(name: str, pool: Any, *args: Any, **kw: Any) -> NoWindows:  # kw: the backend's choices
        return NoWindows(pool, *args)

    with monkeypatch.context() as m:
        m.setattr(engine_build, "make_attention_backend", no_windows)
        assert build_parts(EngineConfig(**base, attention_backend="torch")).context_length == 8
    helpers.make_tiny_checkpoint("gemma2", tmp_path / "gemma2")
    base["model"] = str(tmp_path / "gemma2")
    assert build_parts(EngineConfig(**base, attention_backend="triton")).runner.attn.supports_logit_softcap
