"""SGLang's `/generate` request, as pydantic models, and its translation to `SamplingParams`.

The shapes follow SGLang's `GenerateReqInput` and sampling parameters: unknown
keys at the top level are ignored (as SGLang does), unknown sampling keys are an
error; fields SGLang has and radixserve cannot honour (images, LoRA, hidden
states, ...) are a 400 that names them instead of being silently dropped.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict

from radixserve.sampling_params import SamplingParams

TOP_K_ALL = 1 << 30  # SGLang's "no top-k" value
_GREEDY_EPS = 1e-6  # SGLang samples greedily below this temperature

# Top-level fields radixserve cannot serve; any value but None/False/[] is refused.
UNSUPPORTED = (
    "image_data",
    "video_data",
    "audio_data",
    "input_embeds",
    "lora_path",
    "session_params",
    "custom_logit_processor",
    "token_ids_logprob",
    "return_hidden_states",
    "return_routed_experts",
    "bootstrap_host",
    "return_flat_raw_top_logprobs",
)


UNSUPPORTED_CODE = "unsupported_feature"  # the error code of a feature radixserve lacks


class NativeError(ValueError):
    """A request the native API refuses, with its HTTP status (and a code for unsupported features)."""

    def __init__(self, message: str, status: int = 400, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


class NativeSamplingParams(BaseModel):
    """`sampling_params` of one request, with SGLang's defaults."""

    model_config = ConfigDict(extra="forbid")

    max_new_tokens: int | None = 128
    min_new_tokens: int | None = 0
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    stop_regex: str | list[str] | None = None
    temperature: float | None = 1.0
    top_p: float | None = 1.0
    top_k: int | None = -1
    min_p: float | None = 0.0
    frequency_penalty: float | None = 0.0
    presence_penalty: float | None = 0.0
    repetition_penalty: float | None = 1.0
    n: int | None = 1
    json_schema: str | None = None
    regex: str | None = None
    ebnf: str | None = None
    choice: list[str] | None = None
    structural_tag: str | None = None
    ignore_eos: bool | None = False
    skip_special_tokens: bool | None = True
    # Only slow tokenizers put spaces between special tokens; radixserve's fast ones never do.
    spaces_between_special_tokens: bool | None = True
    no_stop_trim: bool | None = False
    stream_interval: int | None = None  # every step is streamed
    logit_bias: dict[str, float] | None = None
    sampling_seed: int | None = None
    custom_params: Any = None
    beam_width: int | None = None
    watermark: Any = None


class GenerateReqInput(BaseModel):
    """The body of `/generate`: one prompt (`text` or `input_ids`) or a list of them."""

    model_config = ConfigDict(extra="ignore")

    text: str | list[str] | None = None
    input_ids: list[list[int]] | list[int] | None = None
    sampling_params: NativeSamplingParams | list[NativeSamplingParams] | None = None
    rid: str | list[str] | None = None
    return_logprob: bool | list[bool] | None = None
    logprob_start_len: int | list[int] | None = None
    top_logprobs_num: int | list[int] | None = None
    return_text_in_logprobs: bool = False
    stream: bool = False
    extra_key: str | list[str] | None = None
    image_data: Any = None
    video_data: Any = None
    audio_data: Any = None
    input_embeds: Any = None
    lora_path: Any = None
    session_params: Any = None
    custom_logit_processor: Any = None
    token_ids_logprob: Any = None
    return_hidden_states: Any = None
    return_routed_experts: Any = None
    bootstrap_host: Any = None
    return_flat_raw_top_logprobs: Any = None


@dataclass(frozen=True)
class Item:
    """One prompt of a request, resolved: what to run and what to report."""

    prompt: str | list[int]
    params: SamplingParams
    rid: str
    return_logprob: bool
    logprob_start_len: int  # SGLang's: -1 means no prompt logprobs
    top_logprobs_num: int
    extra_key: str | None


def _given(v: Any) -> bool:
    if isinstance(v, list):
        return any(_given(x) for x in v)
    return v is not None and v is not False and v != {}


def _per_item(value: Any, count: int, name: str, default: Any) -> list[Any]:
    if isinstance(value, list):
        if len(value) != count:
            raise NativeError(f"{name} has {len(value)} entries for {count} prompts")
        return [default if v is None else v for v in value]
    return [default if value is None else value] * count


def _prompts(req: GenerateReqInput) -> tuple[list[str | list[int]], bool]:
    """The prompts and whether the request is a batch (its answer a list)."""
    if (req.text is None) == (req.input_ids is None):
        raise NativeError("give exactly one of text or input_ids")
    if req.text is not None:
        if isinstance(req.text, str):
            return [req.text], False
        return list(req.text), True
    ids = req.input_ids
    assert ids is not None
    if ids and isinstance(ids[0], list):
        return [list(p) for p in ids], True  # type: ignore[arg-type]
    return [list(ids)], False  # type: ignore[arg-type]


def to_sampling_params(
    sp: NativeSamplingParams, return_logprob: bool, top: int, start: int
) -> SamplingParams:
    """radixserve's parameters for SGLang's; a ValueError names what is wrong."""
    for name in ("stop_regex", "structural_tag", "custom_params", "beam_width", "watermark"):
        if _given(getattr(sp, name)):
            raise NativeError(f"sampling_params.{name} is not supported by radixserve", code=UNSUPPORTED_CODE)
    temperature = 1.0 if sp.temperature is None else sp.temperature
    top_k = -1 if sp.top_k is None or sp.top_k == -1 or sp.top_k >= TOP_K_ALL else sp.top_k
    kw: dict[str, Any] = dict(
        max_tokens=128 if sp.max_new_tokens is None else sp.max_new_tokens,
        min_tokens=sp.min_new_tokens or 0,
        temperature=0.0 if 0 <= temperature < _GREEDY_EPS else temperature,
        top_p=1.0 if sp.top_p is None else sp.top_p,
        top_k=top_k,
        min_p=sp.min_p or 0.0,
        frequency_penalty=sp.frequency_penalty or 0.0,
        presence_penalty=sp.presence_penalty or 0.0,
        repetition_penalty=1.0 if sp.repetition_penalty is None else sp.repetition_penalty,
        stop=() if sp.stop is None else sp.stop,
        stop_token_ids=tuple(sp.stop_token_ids or ()),
        include_stop_str_in_output=bool(sp.no_stop_trim),
        ignore_eos=bool(sp.ignore_eos),
        skip_special_tokens=sp.skip_special_tokens is not False,
        seed=sp.sampling_seed,
        n=1 if sp.n is None else sp.n,
        logprobs=return_logprob,
        top_logprobs=top if return_logprob else 0,
    )
    if sp.logit_bias:
        try:
            kw["logit_bias"] = {int(k): v for k, v in sp.logit_bias.items()}
        except ValueError:
            raise NativeError("sampling_params.logit_bias: keys must be token ids") from None
    if return_logprob and start >= 0:
        # SGLang reports the token at logprob_start_len with no logprob, then each later
        # prompt token given the ones before it: radixserve's prompt logprobs from start + 1.
        kw.update(prompt_logprobs=True, prompt_logprobs_start=start + 1)
    for name in ("json_schema", "regex", "ebnf", "choice"):
        value = getattr(sp, name)
        if value:
            kw[name] = value
    try:
        return SamplingParams(**kw)
    except TypeError as e:  # a field this build of radixserve does not have (structured output)
        raise NativeError(
            f"this radixserve build cannot serve that request: {e}", code=UNSUPPORTED_CODE
        ) from None


def resolve(req: GenerateReqInput, max_n: int) -> tuple[list[Item], bool]:
    """The request's prompts as `Item`s, and whether its answer is a list."""
    for name in UNSUPPORTED:
        if _given(getattr(req, name)):
            raise NativeError(
                f"{name} is not supported by radixserve (text-only models)", code=UNSUPPORTED_CODE
            )
    prompts, batch = _prompts(req)
    count = len(prompts)
    if count == 0:
        raise NativeError("the batch is empty")
    sps = _per_item(req.sampling_params, count, "sampling_params", NativeSamplingParams())
    lps = _per_item(req.return_logprob, count, "return_logprob", False)
    starts = _per_item(req.logprob_start_len, count, "logprob_start_len", -1)
    tops = _per_item(req.top_logprobs_num, count, "top_logprobs_num", 0)
    keys = _per_item(req.extra_key, count, "extra_key", None)
    if isinstance(req.rid, list):
        rids = [r or uuid.uuid4().hex for r in _per_item(req.rid, count, "rid", None)]
    elif req.rid is not None:
        rids = [req.rid] if not batch else [f"{req.rid}_{i}" for i in range(count)]
    else:
        rids = [uuid.uuid4().hex for _ in range(count)]
    items = []
    for i in range(count):
        start = int(starts[i]) if lps[i] else -1
        if start < -1:
            raise NativeError(f"logprob_start_len={start}: must be -1 or a prompt position")
        params = to_sampling_params(sps[i], bool(lps[i]), int(tops[i]), start)
        if params.n > max_n:
            raise NativeError(f"sampling_params.n={params.n}: this server allows at most {max_n}")
        items.append(Item(prompts[i], params, rids[i], bool(lps[i]), start, int(tops[i]), keys[i] or None))
    ns = {it.params.n for it in items}
    if len(ns) > 1:
        raise NativeError("sampling_params.n must be the same for every prompt of a batch")
    return items, batch or items[0].params.n > 1
