"""Which model class runs which Hugging Face `architectures` name."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType

from radixserve.model.decoder import DecoderForCausalLM
from radixserve.model.hf_read import DEFAULT_ARCHITECTURE

# One module tree serves every family; the variants are config options (config.py).
MODEL_REGISTRY: Mapping[str, type[DecoderForCausalLM]] = MappingProxyType(
    {name: DecoderForCausalLM for name in DEFAULT_ARCHITECTURE.values()}
)


class UnsupportedArchitectureError(ValueError):
    pass


def supported_architectures() -> list[str]:
    return sorted(MODEL_REGISTRY)


def resolve_architecture(
    architectures: Sequence[str] | None, model_type: str | None = None
) -> tuple[str, type[DecoderForCausalLM]]:
    """The first supported name in `architectures` and its class."""
    names = list(architectures or [])
    if not names and model_type in DEFAULT_ARCHITECTURE:
        names = [DEFAULT_ARCHITECTURE[model_type]]
    for name in names:
        if name in MODEL_REGISTRY:
            return name, MODEL_REGISTRY[name]
    given = ", ".join(names) if names else f"none (model_type={model_type!r})"
    raise UnsupportedArchitectureError(
        f"unsupported model architecture: {given}; supported: {', '.join(supported_architectures())}"
    )
