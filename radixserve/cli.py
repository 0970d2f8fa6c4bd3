"""The `radixserve` command: stream a completion (`generate`) or chat (`chat`) in the terminal.

    radixserve generate "Write a haiku about caches" --max-tokens 64
    radixserve generate --chat "What is a radix tree?" --temperature 0
    echo "Summarize: ..." | radixserve generate - --chat
    radixserve chat --system "You are terse."     # /reset clears the history, /exit or EOF ends
    radixserve serve --port 8000 --api-key KEY    # HTTP: OpenAI-compatible and SGLang-native
    radixserve serve --ray --replicas 4           # ... on Ray Serve, replicas by prefix affinity

Both run on the embedded default model unless `--model` names another (a
Hugging Face folder, a .gguf file or `dummy:<shape>`). The command runs one
`AsyncEngine` in an asyncio loop on the main thread, so Ctrl-C cancels the
stream, which aborts the request and frees its KV. Errors print one line to
stderr (set RADIXSERVE_DEBUG=1 for the traceback); exit codes: 0 ok (also when
the reader of stdout goes away, as `| head` does), 1 runtime error (e.g. the
model does not load), 2 bad arguments (also a device this machine lacks), 130
interrupted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import threading
from typing import TYPE_CHECKING, NoReturn

if TYPE_CHECKING:  # the engine imports torch: keep `radixserve --help` fast
    from radixserve.engine import AsyncEngine, Prompt
    from radixserve.outputs import RequestOutput
    from radixserve.sampling_params import SamplingParams

DEFAULT_MODEL = "smollm2-135m-instruct"
EXIT_RUNTIME, EXIT_USAGE, EXIT_INTERRUPTED = 1, 2, 130


class _UsageError(Exception):
    """A bad command line; argparse would print usage and exit, we print one line and return 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # "radixserve: error: " is printed once by _fail; a subcommand names itself.
        sub = self.prog.removeprefix("radixserve").strip()
        raise _UsageError(f"{sub + ': ' if sub else ''}{message} (see {self.prog} --help)")


def _add_engine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model", default=DEFAULT_MODEL, help="embedded name, HF folder, .gguf file or dummy:<shape>"
    )
    p.add_argument("--device", default="auto", help="auto (cuda when available), cpu, cuda, cuda:1")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    p.add_argument(
        "--quantization", default=None, choices=["fp8"], help="fp8: FP8 weights, quantized at load"
    )
    p.add_argument(
        "--kv-cache-dtype",
        default="auto",
        choices=["auto", "fp8_e4m3"],
        help="fp8_e4m3: an FP8 KV cache, twice the tokens in the same memory (auto: the model dtype)",
    )
    p.add_argument("--max-tokens", type=int, default=256, help="most tokens per answer (default 256)")
    p.add_argument("--temperature", type=float, default=0.7, help="0 is greedy (default 0.7)")
    p.add_argument("--top-p", type=float, default=0.95, help="nucleus sampling mass (default 0.95)")
    p.add_argument("--seed", type=int, default=None, help="makes sampling reproducible")
    p.add_argument(
        "--usage", action="store_true", help="after each answer, print token usage (and cache hits) to stderr"
    )


def build_parser() -> argparse.ArgumentParser:
    from radixserve.version import __version__

    parser = _Parser(prog="radixserve", description="Run an LLM in the terminal with radixserve.")
    parser.add_argument("--version", action="version", version=f"radixserve {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    gen = sub.add_parser("generate", help="stream the completion of one prompt to stdout")
    gen.add_argument("prompt", help='the prompt text, or "-" to read it from stdin')
    gen.add_argument(
        "--chat", action="store_true", help="send the prompt as one user message (chat template)"
    )
    gen.add_argument("--system", default=None, help="a system message (implies --chat)")
    _add_engine_args(gen)
    chat = sub.add_parser("chat", help="an interactive chat over stdin (/reset, /exit)")
    chat.add_argument("--system", default=None, help="a system message kept across /reset")
    _add_engine_args(chat)
    from radixserve.server.cli_serve import add_serve_parser  # argparse only: no fastapi import here

    add_serve_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except _UsageError as e:
        return _fail(str(e), EXIT_USAGE)
    except SystemExit as e:  # --help
        return e.code if isinstance(e.code, int) else 0
    if args.command == "serve":
        return _serve(args)
    try:
        params = _sampling_params(args)
        _check_device(args.device)
    except ValueError as e:
        return _fail(str(e), EXIT_USAGE)
    try:
        return asyncio.run(_run(args, params))
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader left (`| head`): the stream was closed, which aborted the request. Not
        # an error; stdout goes to devnull so the interpreter's final flush stays quiet.
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as e:
        if os.environ.get("RADIXSERVE_DEBUG"):
            raise
        return _fail(_one_line(e), EXIT_RUNTIME)


def _serve(args: argparse.Namespace) -> int:
    from radixserve.server.cli_serve import check_serve_args, serve_command

    try:
        limits = check_serve_args(args)
    except ValueError as e:
        return _fail(str(e), EXIT_USAGE)
    if args.ray:
        try:  # radixserve.ray: the ray extra
            from radixserve.ray.cli import serve_on_ray
        except ImportError as e:
            return _fail(f"--ray needs Ray Serve: pip install 'radixserve[ray]' ({e})", EXIT_USAGE)
    try:
        if args.ray:
            serve_on_ray(args, limits)
        else:
            serve_command(args, limits)
    except KeyboardInterrupt:  # during start-up, before the server's own handlers
        return EXIT_INTERRUPTED
    except Exception as e:
        if os.environ.get("RADIXSERVE_DEBUG"):
            raise
        return _fail(_one_line(e), EXIT_RUNTIME)
    return 0


def _fail(message: str, code: int) -> int:
    print(f"radixserve: error: {message}", file=sys.stderr)
    return code


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    expected = isinstance(e, (ValueError, OSError, RuntimeError))
    return text if expected and text else f"{type(e).__name__}: {text}".rstrip(": ")


def _check_device(device: str) -> None:
    from radixserve.config import EngineConfig

    EngineConfig(device=device).torch_device()  # ValueError: e.g. cuda on a CPU-only build


def _sampling_params(args: argparse.Namespace) -> SamplingParams:
    from radixserve.sampling_params import SamplingParams

    return SamplingParams(
        max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p, seed=args.seed
    )


async def _run(args: argparse.Namespace, params: SamplingParams) -> int:
    from radixserve.config import EngineConfig
    from radixserve.engine import AsyncEngine

    engine = AsyncEngine(
        EngineConfig(
            model=args.model,
            device=args.device,
            dtype=args.dtype,
            quantization=args.quantization,
            kv_cache_dtype=args.kv_cache_dtype,
        )
    )
    async with engine:
        if args.command == "generate":
            return await _generate(engine, args, params)
        return await _chat(engine, args, params)


async def _generate(engine: AsyncEngine, args: argparse.Namespace, params: SamplingParams) -> int:
    text = sys.stdin.read() if args.prompt == "-" else args.prompt
    prompt: Prompt = text
    if args.chat or args.system is not None:
        prompt = _with_system(args.system, [{"role": "user", "content": text}])
    final = await _stream(engine, prompt, params)
    _report(final, args.usage)
    return 0 if final.finish_reason != "abort" else EXIT_RUNTIME


async def _chat(engine: AsyncEngine, args: argparse.Namespace, params: SamplingParams) -> int:
    history: list[dict[str, str]] = []
    interactive = sys.stdin.isatty()
    while True:
        line = await _read_line(">>> " if interactive else "")
        if line is None or line.strip() in ("/exit", "/quit"):
            return 0
        text = line.strip()
        if text == "/reset":
            history.clear()
            print("(history cleared)", file=sys.stderr)
            continue
        if not text:
            continue
        messages = [*history, {"role": "user", "content": text}]
        try:
            final = await _stream(engine, _with_system(args.system, messages), params)
        except ValueError as e:  # e.g. the conversation outgrew the context
            _fail(f"{_one_line(e)} (use /reset to start over)", EXIT_RUNTIME)
            continue
        _report(final, args.usage)
        if final.finish_reason != "abort":
            history[:] = [*messages, {"role": "assistant", "content": final.text}]


def _with_system(system: str | None, messages: list[dict[str, str]]) -> list[dict[str, str]]:
    return messages if system is None else [{"role": "system", "content": system}, *messages]


async def _stream(engine: AsyncEngine, prompt: Prompt, params: SamplingParams) -> RequestOutput:
    """Write each delta to stdout as it arrives; leaving early (Ctrl-C) aborts the request."""
    final: RequestOutput | None = None
    async with contextlib.aclosing(engine.generate(prompt, params)) as stream:  # type: ignore[type-var]
        async for out in stream:
            sys.stdout.write(out.delta_text)
            sys.stdout.flush()
            final = out
    print()
    assert final is not None and final.finished
    return final


def _report(final: RequestOutput, usage: bool) -> None:
    if final.finish_reason == "abort":
        print(f"radixserve: error: {final.error or 'the request was aborted'}", file=sys.stderr)
    if usage:
        u = final.usage
        print(
            f"[usage] prompt_tokens={u.prompt_tokens} cached_tokens={u.cached_tokens} "
            f"completion_tokens={u.completion_tokens} finish_reason={final.finish_reason}",
            file=sys.stderr,
        )


async def _read_line(prompt: str) -> str | None:
    """One line of stdin (None at EOF), read on a daemon thread so Ctrl-C never waits for Enter."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[str | None] = loop.create_future()

    def settle(line: str | None) -> None:
        if not fut.done():
            fut.set_result(line)

    def read() -> None:
        line = sys.stdin.readline()
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile (Ctrl-C)
            loop.call_soon_threadsafe(settle, line or None)

    if prompt:
        sys.stdout.write(prompt)
        sys.stdout.flush()
    threading.Thread(target=read, name="radixserve-stdin", daemon=True).start()
    return await fut
