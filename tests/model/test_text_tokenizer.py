"""`TextTokenizer` (tokenizer.json through the `tokenizers` library) against transformers'
tokenizer of the same folder, the folders where it must not apply, and a text prompt
through the CLI importing no transformers."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from radixserve.model.loader import LoadedModel
from radixserve.model.text_tokenizer import TextTokenizer, direct_tokenizer
from radixserve.model.tokenizer import GENERIC_FAST_CLASSES, load_tokenizer

TEXTS = (
    "Hello, world!",
    "  spaces\tand\nnewlines  ",
    "数学 émoji 🙂🧪 naïve",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "<repo_name>x<file_sep><|endoftext|> trailing",
    "",
)
CHATS = (
    [{"role": "user", "content": "hi"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "héllo <|im_end|>"}],
    [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "🙂 and 数学"},
    ],
)


def test_ids_and_text_equal_transformers(tokenizer_pair: tuple[TextTokenizer, Any]) -> None:
    ours, ref = tokenizer_pair
    rendered = [ref.apply_chat_template(c, tokenize=False, add_generation_prompt=True) for c in CHATS]
    for text in (*TEXTS, *rendered):
        for special in (True, False):
            ids = ours.encode(text, add_special_tokens=special)
            assert ids == ref.encode(text, add_special_tokens=special), text
            for skip in (True, False):
                assert ours.decode(ids, skip_special_tokens=skip) == ref.decode(ids, skip_special_tokens=skip)
            # Byte-level pieces: every prefix decodes alike (incomplete characters included).
            for n in range(len(ids)):
                assert ours.decode(ids[:n]) == ref.decode(ids[:n])
        assert ours.convert_ids_to_tokens(ids) == ref.convert_ids_to_tokens(ids)
        assert ours.convert_tokens_to_string(ref.convert_ids_to_tokens(ids)) == ref.convert_tokens_to_string(
            ref.convert_ids_to_tokens(ids)
        )
    assert ours.decode(2) == ref.decode(2)
    assert ours.get_vocab() == ref.get_vocab() and (len(ours), ours.vocab_size) == (len(ref), ref.vocab_size)
    assert ours.convert_tokens_to_ids(["<|im_end|>", "Hi", "not-a-token"]) == ref.convert_tokens_to_ids(
        ["<|im_end|>", "Hi", "not-a-token"]
    )
    for name in ("bos", "eos", "pad", "unk"):
        assert getattr(ours, f"{name}_token_id") == getattr(ref, f"{name}_token_id"), name
    assert (ours.all_special_tokens, ours.all_special_ids) == (ref.all_special_tokens, ref.all_special_ids)
    assert ours.chat_template == ref.chat_template
    assert ours.special_tokens_map == ref.special_tokens_map
    for chat in CHATS:  # rendered by radixserve.model.chat_template, without transformers
        kw: dict[str, Any] = {"tokenize": False, "add_generation_prompt": True}
        assert ours.apply_chat_template(chat, **kw) == ref.apply_chat_template(chat, **kw)


def _folder_with(tmp_path: Path, source: str, **config: Any) -> Path:
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(Path(source) / name, tmp_path / name)
    cfg = json.loads((tmp_path / "tokenizer_config.json").read_text())
    cfg.update(config)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg))
    return tmp_path


@pytest.mark.parametrize(
    "change",
    (
        {"add_bos_token": True},  # transformers rebuilds the post-processor
        {"eos_token": "</not-added>"},  # transformers adds the token
        {"clean_up_tokenization_spaces": True, "tokenizer_class": "PreTrainedTokenizerFast"},
        {"tokenizer_class": "LlamaTokenizer"},
    ),
)
def test_folders_transformers_would_change_load_with_transformers(
    tmp_path: Path, embedded: LoadedModel, change: dict[str, Any]
) -> None:
    assert embedded.path is not None
    folder = _folder_with(tmp_path, embedded.path, **change)
    assert direct_tokenizer(folder, GENERIC_FAST_CLASSES) is None
    tok = load_tokenizer(folder)
    assert not isinstance(tok, TextTokenizer) and tok.is_fast


PROBE = """
import sys
from radixserve.cli import main
assert "transformers" not in sys.modules
assert main(["generate", "Hi", "--max-tokens", "2", "--temperature", "0", "--device", "cpu"]) == 0
print()
print(sorted(m for m in sys.modules if m.split(".")[0] == "transformers"))
"""


def test_text_generation_from_the_cli_imports_no_transformers(embedded: LoadedModel) -> None:
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"
