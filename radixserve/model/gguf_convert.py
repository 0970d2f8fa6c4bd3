"""GGUF file -> Hugging Face folder (config, float32 safetensors, tokenizer), done once and cached.

transformers reads GGUF itself (dequantizing with the `gguf` package and
undoing llama.cpp's q/k permutation), but slowly: about 15 s for a 135M
model, mostly rebuilding the tokenizer. We let it do that once and save the
result as a plain folder that later loads read in about a second.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from radixserve.model.model_cache import build_once, cache_root

# Bump when the folder layout written here changes: old folders are then ignored.
CONVERTER_VERSION = 1


def convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """Write the HF folder of `gguf_path` into `out_dir` (which exists and is empty)."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf_path.parent), gguf_path.name
    try:
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    except Exception as e:
        raise ValueError(f"transformers could not read the GGUF file {gguf_path}: {e}") from e
    config = model.config
    # The weights are dequantized now; a quantization_config would make loaders expect GGUF tensors.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    state = model.state_dict()
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)  # shares the embedding's storage; safetensors refuses aliases
    # float32 holds every dequantized value exactly.
    save_file(
        {k: v.contiguous() for k, v in state.items()}, str(out_dir / "model.safetensors"), {"format": "pt"}
    )
    config.save_pretrained(out_dir)
    model.generation_config.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)  # a fast tokenizer writes tokenizer.json: the quick path on load
    stat = gguf_path.stat()
    source = {"gguf": str(gguf_path), "size": stat.st_size, "converter_version": CONVERTER_VERSION}
    (out_dir / "radixserve_source.json").write_text(json.dumps(source, indent=2) + "\n")


def gguf_folder(gguf_path: Path | str) -> Path:
    """The cached HF folder of a GGUF file, keyed by its path, size and mtime."""
    path = Path(gguf_path).expanduser().resolve()
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file {path} does not exist")
    stat = path.stat()
    key = hashlib.sha256(f"{path}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    final = cache_root() / "gguf" / f"{path.stem}-{key}-c{CONVERTER_VERSION}"
    return build_once(final, lambda tmp: convert_gguf(path, tmp))
