"""transformers' twin of the embedded model, loaded once per session for the server tests' references."""

from __future__ import annotations

import functools
from typing import Any

import torch

from radixserve.model.embedded import embedded_model_dir


@functools.cache
def hf_model_and_tokenizer() -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = embedded_model_dir()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(path)
