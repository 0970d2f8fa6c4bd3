"""`TextTokenizer`: a model's tokenizer.json run by the `tokenizers` library itself, so
generating from text never imports transformers (~1.5-2 s on a 2-core machine).

transformers' generic fast tokenizer (`TokenizersBackend`, what AutoTokenizer picks
for a plain tokenizer.json) encodes and decodes by calling this same `tokenizers.Tokenizer`;
`direct_tokenizer` takes this path only for folders where transformers would not change
that tokenizer while loading it (no special tokens to add, no post-processor rebuilt for
add_bos/eos_token, no padding, truncation or clean-up, no Mistral regex patch): see
`_direct_applies`. Chat templates are rendered by `chat_template` (jinja2 set up as
transformers sets it up). Everything else (`__call__`, saving, ...) is transformers' own
tokenizer of the folder, loaded on first use (`hf`).
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any, Protocol

# Named special tokens in transformers' order (SPECIAL_TOKENS_ATTRIBUTES): all_special_ids follows it.
NAMED_SPECIAL = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
# tokenizer_config.json keys that TokenizersBackend only stores (or checks against tokenizer.json
# below). Any other key may change how it loads, so that folder goes to transformers.
PLAIN_KEYS = frozenset(
    {
        *NAMED_SPECIAL,
        "backend",
        "tokenizer_class",
        "is_local",
        "local_files_only",
        "model_max_length",
        "model_input_names",
        "padding_side",
        "truncation_side",
        "clean_up_tokenization_spaces",
        "chat_template",
        "added_tokens_decoder",
        "extra_special_tokens",
        "additional_special_tokens",
        "errors",
    }
)
MISTRAL_TYPES = frozenset({"mistral", "mistral3", "voxtral", "ministral", "pixtral"})
MISTRAL_PATCH_MIN_VOCAB = 100_000  # transformers looks for the Mistral regex bug only above this
TOKEN_FLAGS = ("content", "single_word", "lstrip", "rstrip", "normalized", "special")


def direct_tokenizer(folder: Path, generic_classes: frozenset[str]) -> TextTokenizer | None:
    """The folder's tokenizer without transformers, or None where transformers must load it."""
    if not (folder / "tokenizer.json").is_file():
        return None
    try:
        config = json.loads((folder / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict) or config.get("tokenizer_class") not in generic_classes:
        return None
    if not set(config) <= PLAIN_KEYS:
        return None
    from tokenizers import Tokenizer

    try:
        backend = Tokenizer.from_file(str(folder / "tokenizer.json"))
    except Exception:  # noqa: BLE001 - transformers then reports what is wrong with the file
        return None
    return TextTokenizer(folder, backend, config) if _direct_applies(folder, config, backend) else None


def _direct_applies(folder: Path, config: dict[str, Any], backend: Any) -> bool:
    if backend.truncation or backend.padding or backend.post_processor is None:
        return False  # transformers would reset them or build a post-processor
    if config.get("clean_up_tokenization_spaces"):
        return False  # transformers may clean decoded text (4.x does, 5 not for BPE)
    added = {
        t.content: {"id": i, **{k: getattr(t, k) for k in TOKEN_FLAGS}}
        for i, t in backend.get_added_tokens_decoder().items()
    }
    extra = config.get("extra_special_tokens") or config.get("additional_special_tokens") or []
    named = [config.get(k) for k in NAMED_SPECIAL]
    # A special token not among tokenizer.json's added tokens would be added by transformers.
    for token in [*named, *extra]:
        if token is not None and (not isinstance(token, str) or token not in added):
            return False
    for i, entry in (config.get("added_tokens_decoder") or {}).items():
        same = added.get(entry.get("content")) if isinstance(entry, dict) else None
        if same is None or same["id"] != int(i) or any(same.get(k) != entry.get(k) for k in TOKEN_FLAGS):
            return False
    vocab = backend.get_vocab_size(with_added_tokens=True)
    return vocab <= MISTRAL_PATCH_MIN_VOCAB or not _mistral_patch_possible(folder)


def _mistral_patch_possible(folder: Path) -> bool:
    """transformers' condition (in `_patch_mistral_regex`) for checking a local tokenizer."""
    try:
        model = json.loads((folder / "config.json").read_text())
        major = int(str(model.get("transformers_version") or "0").split(".")[0])
    except (OSError, ValueError, AttributeError):
        return True
    return major < 5 and (model.get("model_type") is None or model.get("model_type") in MISTRAL_TYPES)


class TokenizerLike(Protocol):
    """What the worker calls on the model's tokenizer: a `TextTokenizer` or transformers' own."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    def decode(self, token_ids: list[int], skip_special_tokens: bool = False) -> str: ...


class TextTokenizer:
    """encode / decode / vocabulary / special tokens as transformers' tokenizer of the
    folder gives them; any other attribute is that tokenizer's (`hf`, loaded on first use)."""

    is_fast = True

    def __init__(self, folder: Path, backend: Any, config: dict[str, Any]) -> None:
        self.folder = folder
        self.backend_tokenizer = backend
        self.name_or_path = str(folder)
        self._config = config
        self._hf: Any = None
        self._hf_lock = threading.Lock()
        self._template: tuple[bool, str | None] | None = None
        for key in NAMED_SPECIAL:  # bos_token, bos_token_id, ...
            token = config.get(key)
            setattr(self, key, token)
            setattr(self, key + "_id", None if token is None else backend.token_to_id(token))
        extra = config.get("extra_special_tokens") or config.get("additional_special_tokens") or []
        named = [config[k] for k in NAMED_SPECIAL if config.get(k) is not None]
        self.all_special_tokens: list[str] = list(dict.fromkeys([*named, *extra]))
        self.all_special_ids: list[int] = [backend.token_to_id(t) for t in self.all_special_tokens]

    @property
    def hf(self) -> Any:
        """transformers' tokenizer of the folder (imports transformers on first use)."""
        with self._hf_lock:
            if self._hf is None:
                from transformers import PreTrainedTokenizerFast

                self._hf = PreTrainedTokenizerFast.from_pretrained(str(self.folder))
            return self._hf

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("_hf", "_hf_lock", "_config", "_template", "backend_tokenizer"):
            raise AttributeError(name)
        return getattr(self.hf, name)

    def __len__(self) -> int:
        return int(self.backend_tokenizer.get_vocab_size(with_added_tokens=True))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.hf(*args, **kwargs)

    @property
    def vocab_size(self) -> int:
        return int(self.backend_tokenizer.get_vocab_size(with_added_tokens=False))

    def encode(self, text: Any, add_special_tokens: bool = True, **kwargs: Any) -> list[int]:
        if kwargs or not isinstance(text, str):
            return list(self.hf.encode(text, add_special_tokens=add_special_tokens, **kwargs))
        # encode_batch, not encode: it releases the GIL, so a long prompt tokenized in a worker
        # thread (the HTTP server does) leaves the event loop running; the ids are the same.
        (encoding,) = self.backend_tokenizer.encode_batch([text], add_special_tokens=add_special_tokens)
        return list(encoding.ids)

    def decode(self, token_ids: Any, skip_special_tokens: bool = False, **kwargs: Any) -> Any:
        if isinstance(token_ids, int):
            token_ids = [token_ids]
        plain = isinstance(token_ids, list | tuple) and all(type(t) is int for t in token_ids)
        if kwargs or not plain:
            return self.hf.decode(token_ids, skip_special_tokens=skip_special_tokens, **kwargs)
        return str(self.backend_tokenizer.decode(list(token_ids), skip_special_tokens=skip_special_tokens))

    def get_vocab(self) -> dict[str, int]:
        return dict(self.backend_tokenizer.get_vocab(with_added_tokens=True))

    def convert_tokens_to_ids(self, tokens: str | list[str]) -> int | list[int] | None:
        if isinstance(tokens, str):
            index = self.backend_tokenizer.token_to_id(tokens)
            return self.unk_token_id if index is None else int(index)
        return [self.convert_tokens_to_ids(t) for t in tokens]  # type: ignore[misc]

    def convert_ids_to_tokens(self, ids: int | list[int], skip_special_tokens: bool = False) -> Any:
        if isinstance(ids, int):
            return self.backend_tokenizer.id_to_token(ids)
        skip = set(self.all_special_ids) if skip_special_tokens else set()
        return [self.backend_tokenizer.id_to_token(int(i)) for i in ids if int(i) not in skip]

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        decoder = self.backend_tokenizer.decoder
        return str(decoder.decode(tokens)) if decoder is not None else " ".join(tokens)

    @property
    def special_tokens_map(self) -> dict[str, str]:
        """The named special tokens that are set, in transformers' order (chat templates read them)."""
        return {k: self._config[k] for k in NAMED_SPECIAL if self._config.get(k) is not None}

    @property
    def chat_template(self) -> str | None:
        """The template transformers reads: chat_template.jinja or tokenizer_config.json's string."""
        simple, source = self._template_source()
        return source if simple else self.hf.chat_template  # type: ignore[no-any-return]

    def _template_source(self) -> tuple[bool, str | None]:
        """(True, the template or None) where it is one string in the folder; (False, None)
        where transformers picks it (several named templates, or a file and a config entry)."""
        if self._template is None:
            in_config = self._config.get("chat_template")
            jinja = self.folder / "chat_template.jinja"
            others = (self.folder / "chat_template.json").exists() or (
                self.folder / "additional_chat_templates"
            ).exists()
            if others or (in_config is not None and (jinja.is_file() or not isinstance(in_config, str))):
                self._template = (False, None)
            else:
                self._template = (True, jinja.read_text(encoding="utf-8") if jinja.is_file() else in_config)
        return self._template

    def apply_chat_template(self, conversation: Any, *args: Any, **kwargs: Any) -> Any:
        """transformers' `apply_chat_template`. A one-string template is rendered by
        `chat_template.apply` (jinja2 as transformers sets it up, no transformers import);
        calls it does not render (see that module) go to transformers' tokenizer."""
        from radixserve.model import chat_template  # jinja2: only chat prompts import it

        simple, source = self._template_source()
        if kwargs.get("chat_template") is not None:  # a template string given by the caller
            source = kwargs["chat_template"]
        if simple and source is not None and not args:
            try:
                return chat_template.apply(
                    source, self.special_tokens_map, self._encode_chat, conversation, **kwargs
                )
            except chat_template.Unsupported:
                pass
        return self.hf.apply_chat_template(conversation, *args, **kwargs)

    def _encode_chat(self, text: str) -> list[int]:
        return self.encode(text, add_special_tokens=False)


def transformers_tokenizer(tokenizer: Any) -> Any:
    """The transformers tokenizer behind `tokenizer` (itself when it is one): for
    libraries that inspect it, such as xgrammar's `TokenizerInfo.from_huggingface`."""
    return tokenizer.hf if isinstance(tokenizer, TextTokenizer) else tokenizer
