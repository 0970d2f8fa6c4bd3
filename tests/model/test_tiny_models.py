"""Tiny random checkpoints of every supported architecture, saved by transformers and loaded
by our loader: logits match transformers to 1e-4 relative, greedy tokens are identical."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from radixserve.model.loader import LoadedModel, load_model

KINDS = ("llama3-rope", "llama-tied-bias", "mistral", "qwen2-sharded", "qwen3")
# Gemma 2/3, Phi-3, mixtures of experts: windows of WINDOW, shorter than most prompts.
NEW_KINDS = ("gemma2", "gemma3", "phi3-longrope", "mixtral", "qwen3-moe", "qwen2-moe")
WINDOW = 8

PROMPT_LENS = (5, 12, 23)  # most longer than the new families' windows
NEW_TOKENS = 16


@pytest.fixture(scope="module", params=KINDS + NEW_KINDS)
def tiny(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, helpers: Any) -> Any:
    folder = tmp_path_factory.mktemp(request.param)
    hf = helpers.make_tiny_checkpoint(request.param, folder)
    ours = load_model(str(folder))
    return request.param, folder, hf, ours


def _prompt(n: int, seed: int) -> list[int]:
    return torch.randint(3, 256, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


# kind -> the options its tiny config must read as (everything else: the default).
_OPTIONS: dict[str, dict[str, Any]] = {
    "llama3-rope": {"rope_type": "llama3"},
    "llama-tied-bias": {"qkv_bias": True, "o_bias": True, "mlp_bias": True},
    "mistral": {"head_dim": 32},
    "qwen2-sharded": {"qkv_bias": True},
    "qwen3": {"head_dim": 32, "qk_norm": True},
    "gemma2": {"head_dim": 32, "windows": (WINDOW, None) * 2, "norm_plus_one": True, "softcaps": (1.5, 4.0)},
    "gemma3": {
        "head_dim": 32,
        "windows": (WINDOW, None, WINDOW),
        "qk_norm": True,
        "norm_plus_one": True,
        "rope_type": "linear",  # the global layers'; the local ones have their own base
        "local_theta": 10000.0,
    },
    "phi3-longrope": {"rope_type": "longrope", "windows": (12, 12), "rotary_dim": 8, "fused": True},
    "mixtral": {"windows": (WINDOW, WINDOW), "experts": (4, 2, True)},
    "qwen3-moe": {"qk_norm": True, "experts": (8, 2, False), "sparse": (True, False, True)},
    "qwen2-moe": {"qkv_bias": True, "windows": (WINDOW, None, None, None), "experts": (4, 2, True)},
}


def test_config_options_are_read(tiny: Any) -> None:
    kind, folder, hf, ours = tiny
    cfg, want = ours.config, _OPTIONS[kind]
    assert ours.path == str(folder) and ours.tokenizer is None
    assert cfg.architecture == type(hf).__name__
    assert cfg.tie_word_embeddings == hf.config.tie_word_embeddings
    assert (ours.model.lm_head is None) == cfg.tie_word_embeddings
    assert cfg.qkv_bias == want.get("qkv_bias", False)
    assert cfg.o_bias == want.get("o_bias", False) and cfg.mlp_bias == want.get("mlp_bias", False)
    assert cfg.qk_norm == want.get("qk_norm", False)
    assert cfg.rope.type == want.get("rope_type", "default")
    assert cfg.head_dim == want.get("head_dim", 16)
    assert cfg.layer_windows == want.get("windows", ())
    assert cfg.norm_plus_one == cfg.sandwich_norms == want.get("norm_plus_one", False)
    assert (cfg.attn_logit_softcap, cfg.final_logit_softcap) == want.get("softcaps", (None, None))
    assert cfg.rotary_dim == want.get("rotary_dim") and cfg.fused_checkpoint == want.get("fused", False)
    assert (cfg.local_rope and cfg.local_rope.theta) == want.get("local_theta")
    moe = cfg.moe
    if moe is None:
        assert "experts" not in want
    else:
        assert (moe.num_experts, moe.top_k, moe.renormalize) == want["experts"]
        every_second = tuple(i % 2 == 1 for i in range(cfg.num_layers))  # Qwen2-MoE's decoder_sparse_step=2
        default = (True,) * cfg.num_layers if kind == "mixtral" else every_second
        assert moe.sparse_layers == want.get("sparse", default)
    # Parameter count equals transformers' (tied embeddings counted once).
    assert sum(p.numel() for p in ours.model.parameters()) == sum(p.numel() for p in hf.parameters())


def test_every_tiny_kind_is_tested(helpers: Any) -> None:
    assert set(helpers.tiny_kinds) == set(KINDS + NEW_KINDS) == set(_OPTIONS)


def test_checkpoint_layout(tiny: Any) -> None:
    """One kind is saved in shards with an index; the others as one model.safetensors."""
    kind, folder, _, _ = tiny
    sharded = kind.endswith("sharded")
    assert (folder / "model.safetensors.index.json").is_file() == sharded
    assert (folder / "model.safetensors").is_file() != sharded
    assert (len(list(folder.glob("model-*-of-*.safetensors"))) >= 2) == sharded


@pytest.mark.parametrize("n", PROMPT_LENS)
def test_logits_match_transformers(tiny: Any, helpers: Any, n: int) -> None:
    _, _, hf, ours = tiny
    ids = _prompt(n, seed=n)
    with torch.inference_mode():
        ref = hf(torch.tensor([ids])).logits[0].float()
    last = helpers.our_logits(ours.model, ours.config, ids, None)
    assert last.shape == (1, 256) and last.dtype == torch.float32
    assert helpers.rel_err(last[0], ref[-1]) < 1e-4
    every = helpers.our_logits(ours.model, ours.config, ids, torch.arange(n))
    assert helpers.rel_err(every, ref) < 1e-4
    # Any subset of rows, in any order.
    rows = torch.tensor([n - 1, 0, n // 2])
    assert helpers.rel_err(helpers.our_logits(ours.model, ours.config, ids, rows), ref[rows]) < 1e-4


@pytest.mark.parametrize("mode", ("single", "mixed", "split"))
def test_greedy_matches_transformers(tiny: Any, helpers: Any, mode: str) -> None:
    _, _, hf, ours = tiny
    prompts = [_prompt(n, seed=100 + n) for n in PROMPT_LENS]
    ref = [helpers.hf_greedy(hf, p, NEW_TOKENS) for p in prompts]
    got = helpers.greedy_generate(ours.model, ours.config, prompts, NEW_TOKENS, mode)
    assert got == ref


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16))
def test_half_precision_loads_and_runs(tiny: Any, helpers: Any, dtype: torch.dtype) -> None:
    _, folder, _, ours = tiny
    half: LoadedModel = load_model(str(folder), dtype=dtype)
    assert all(p.dtype == dtype for p in half.model.parameters())
    ids = _prompt(12, seed=7)
    ref = helpers.our_logits(ours.model, ours.config, ids, torch.arange(12))
    got = helpers.our_logits(half.model, half.config, ids, torch.arange(12))
    assert got.dtype == torch.float32
    if ours.config.moe is None:
        assert helpers.rel_err(got, ref) < 3e-2
    else:  # rounding may flip a near-tie of the router: that token's row takes other experts
        rows = [helpers.rel_err(got[i], ref[i]) for i in range(12)]
        assert sum(e < 3e-2 for e in rows) >= len(rows) - 1, rows


def test_spec_as_path_or_with_user_home(tiny: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    _, folder, hf, _ = tiny
    monkeypatch.setenv("HOME", str(Path(folder).parent))
    loaded = load_model(f"~/{Path(folder).name}")
    assert loaded.config.num_layers == hf.config.num_hidden_layers
    assert load_model(Path(folder)).path == str(folder)


def test_engine_without_a_tokenizer_streams_ids(tmp_path: Path, helpers: Any) -> None:
    """A checkpoint without tokenizer files: ids in, ids out, no text; `complete()` and a stream
    with `stream_interval` end with "length" and transformers' greedy tokens (not an abort)."""
    import asyncio

    from radixserve import AsyncEngine, EngineConfig, SamplingParams

    hf = helpers.make_tiny_checkpoint("llama-tied-bias", tmp_path)
    prompt = _prompt(7, seed=3)
    ref = helpers.hf_greedy(hf, prompt, 9)
    params = SamplingParams(temperature=0, max_tokens=9, ignore_eos=True)

    async def main() -> tuple[Any, list[Any]]:
        async with AsyncEngine(
            EngineConfig(model=str(tmp_path), device="cpu", stream_interval=4, stream_interval_ms=0)
        ) as engine:
            done = await engine.complete(prompt, params)
            outs = [o async for o in engine.generate(prompt, params)]
            await engine.check_integrity()
            return done, outs

    done, outs = asyncio.run(main())
    assert done.finish_reason == "length" and done.error is None and list(done.token_ids) == ref
    assert done.text == "" and list(done.delta_token_ids) == ref  # complete(): one output, every token
    assert outs[-1].finish_reason == "length" and [t for o in outs for t in o.delta_token_ids] == ref
    # stream_interval=4: the first token at once, then no output with fewer than 4 new tokens (a
    # consumer that falls behind gets more in one, so the counts are not always exactly 4).
    assert len(outs[0].token_ids) == 1 and all(len(o.delta_token_ids) >= 4 for o in outs[1:-1])
