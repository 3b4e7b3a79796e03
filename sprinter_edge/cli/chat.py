"""`sprinter-edge chat`: an interactive, streaming, multi-turn chat in the terminal."""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TextIO

from ..errors import ContextOverflowError, SprinterError
from ..methods import get_strategy, methods
from ..serving.chat_session import ChatSession
from ..verifiers.operating_point import OperatingPoint
from .common import (
    add_across_requests_args,
    add_decoding_args,
    add_hardware_args,
    add_model_args,
    engine_from,
    sampling_from,
)

PROMPT = ">>> "
BLOCK = '"""'  # a line starting with it opens a message of several lines, one ending with it closes it
HELP = """commands:
  /help            this help
  /file PATH       attach a file to your next message, to edit: it goes in the message and, as
                   the predicted output, to the copy (an unchanged line costs no target step)
  /temp X          sampling temperature (0: greedy)
  /max N           new tokens at most per reply ("none": to the reply's end)
  /stats           counters of the last reply (tokens, speed, target calls, KV reuse)
  /method NAME     switch the decoding method ({methods})
  /threshold X     sprinter: flag tokens whose verifier score is below X (0 < X <= 1)
  /reset           forget the conversation
  /exit            leave (Ctrl-D works too)
A pasted block of lines is one message (with GNU readline); or type \"\"\" on a line, the lines,
and \"\"\" again.
Ctrl-C stops the current reply; the conversation goes on."""
CHAT_MAX_TOKENS = 2048  # a reply may be a whole file written back


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("chat", help="interactive multi-turn chat in the terminal",
                       description="Chat with a model pair: replies stream as they are generated, "
                                   "the conversation is kept (and its KV cache reused) across turns. "
                                   "Type /help inside the chat for the commands.")
    p.add_argument("--system", default=None, metavar="TEXT",
                   help="system message that opens the conversation (default: the template's)")
    p.add_argument("--history-file", type=Path, default=None, metavar="FILE",
                   help="keep the line-editing history (up arrow) in FILE across sessions")
    p.add_argument("--show-stats", action="store_true",
                   help="print a one-line summary of the counters after every reply")
    add_across_requests_args(p)
    add_decoding_args(p, max_tokens_default=CHAT_MAX_TOKENS)
    add_model_args(p)
    add_hardware_args(p)
    p.set_defaults(func=run)


class _Interrupt:
    """While active, Ctrl-C sets a flag instead of raising, so a reply stops between
    decoding steps and the models' KV caches stay consistent."""

    def __init__(self) -> None:
        self.hit = False

    @contextlib.contextmanager
    def catching(self) -> Iterator[None]:
        self.hit = False

        def handler(signum: int, frame: object) -> None:
            self.hit = True

        old = signal.signal(signal.SIGINT, handler)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, old)


def line_editor() -> str:
    """What input() edits lines with: "gnu" (GNU readline: a bracketed paste is one message),
    "libedit" (readline's stand-in in many macOS Pythons: each pasted line is its own input) or
    "none" (Windows: no readline)."""
    try:
        import readline
    except ImportError:
        return "none"
    return "libedit" if "libedit" in (readline.__doc__ or "") else "gnu"


def paste_hint(editor: str) -> str | None:
    """The line the REPL prints at start where a paste of several lines is not one message."""
    if editor == "gnu":
        return None
    here = "libedit's readline" if editor == "libedit" else "no readline"
    return (f"To paste several lines as one message: type {BLOCK} on a line, paste, then {BLOCK} on a line "
            f"(with {here} here, each pasted line would go alone).")


def _setup_readline(history_file: Path | None) -> Callable[[], None]:
    """Line editing and history for input(); returns the function that saves the history."""
    editor = line_editor()
    if editor == "none":  # Windows without pyreadline: plain input()
        return lambda: None
    import readline

    if editor == "libedit":  # its own syntax, and no bracketed paste (paste_hint says so)
        readline.parse_and_bind("bind ^I rl_complete")
    else:
        readline.parse_and_bind("tab: complete")
        # a paste of several lines arrives as one input (the terminal marks where it starts and ends)
        readline.parse_and_bind("set enable-bracketed-paste on")
    if history_file is None:
        return lambda: None
    with contextlib.suppress(OSError):
        readline.read_history_file(history_file)
    readline.set_history_length(1000)

    def save() -> None:
        with contextlib.suppress(OSError):
            history_file.parent.mkdir(parents=True, exist_ok=True)
            readline.write_history_file(history_file)

    return save


def format_stats(session: ChatSession) -> str:
    result, turn = session.last_result, session.last_turn
    if result is None or turn is None:
        return "no reply yet"
    s = result.stats
    c, t = s.counters, s.timings
    lines = [
        f"method {s.method}, finish {result.finish_reason}: {len(result.token_ids)} tokens "
        f"in {t.total_seconds:.2f} s ({s.tokens_per_second:.2f} tok/s after the prompt)",
        f"prompt {turn.prompt_tokens} tokens: {turn.reused_tokens} reused from the KV cache, "
        f"{turn.reread_tokens} read ({t.prefill_seconds:.2f} s)",
        f"target calls {c.target_calls} ({s.target_calls_per_token:.3f}/token), draft calls "
        f"{c.draft_calls}",
        f"tokens: target {c.target_sampled}, draft {c.draft_sampled}, kept {c.kept}, "
        f"accepted {c.accepted}, resampled {c.resampled}, bonus {c.bonus}, flags {c.flags}",
        f"output: {s.guarantee}",
        f"conversation: {len(session.messages)} messages",
    ]
    if s.prediction is not None:
        used = s.prediction
        lines.append(f"attached file (the predicted output): {used.accepted_prediction_tokens} of its "
                     f"tokens used, {used.rejected_prediction_tokens} not")
    return "\n".join(lines)


class ChatRepl:
    """The read-eval-print loop over a ChatSession."""

    def __init__(self, session: ChatSession, out: TextIO = sys.stdout, show_stats: bool = False):
        self.session = session
        self.out = out
        self.show_stats = show_stats
        self.interrupt = _Interrupt()
        self.attached: tuple[Path, str] | None = None  # /file: sent with the next message

    def say(self, text: str) -> None:
        self.out.write(text + "\n")
        self.out.flush()

    def loop(self) -> None:
        while True:
            try:
                line = input(PROMPT)
            except EOFError:  # Ctrl-D
                self.say("")
                return
            except KeyboardInterrupt:  # Ctrl-C at the prompt: drop the line
                self.say("")
                continue
            if line.strip().startswith(BLOCK):
                line = self.block(line.strip()[len(BLOCK):])
                if line is None:
                    return
            line = line.strip()
            if not line:
                continue
            if line.startswith("/") and "\n" not in line:
                if self.command(line) == "exit":
                    return
                continue
            self.turn(line)

    def block(self, first: str) -> str | None:
        """The lines of a BLOCK message, up to the line that ends with BLOCK (None: Ctrl-D)."""
        lines = [first]
        while not lines[-1].rstrip().endswith(BLOCK):
            try:
                lines.append(input("... "))
            except EOFError:
                return None
        lines[-1] = lines[-1].rstrip()[:-len(BLOCK)]
        return "\n".join(lines)

    def turn(self, text: str) -> None:
        prediction = None
        if self.attached is not None:
            path, content = self.attached
            text = f"{text}\n\n{path.name}\n```\n{content}\n```"
            prediction, self.attached = content, None
        with self.interrupt.catching():
            try:
                gen = self.session.send(text, prediction=prediction)
            except ContextOverflowError as exc:
                self.say(f"error: the message does not fit: {exc}. Shorten it or /reset the conversation.")
                return
            except SprinterError as exc:
                self.say(f"error: {exc}")
                return
            try:
                for chunk in gen:
                    self.out.write(chunk.text)
                    self.out.flush()
                    if self.interrupt.hit:
                        gen.close()
                        break
            except SprinterError as exc:
                gen.close()
                self.say(f"\nerror: {exc}")
        result = self.session.finish(gen)
        self.say("")
        if result.finish_reason == "cancelled":
            self.say("[stopped]")
        elif result.finish_reason == "length":
            self.say("[max tokens reached]")
        if self.show_stats:
            s = result.stats
            turn = self.session.last_turn
            reread = turn.reread_tokens if turn else 0
            self.say(f"[{s.method}: {len(result.token_ids)} tokens, {s.tokens_per_second:.1f} tok/s, "
                     f"{s.counters.target_calls} target calls, {reread} prompt tokens read]")

    def sampling(self, name: str, arg: str) -> None:
        """/temp X and /max N: the sampling of the replies from now on."""
        params = self.session.params
        try:
            if name == "/temp":
                params = params.replace(temperature=float(arg))
            else:
                params = params.replace(max_tokens=None if arg == "none" else int(arg))
        except (ValueError, SprinterError) as exc:
            usage = "/temp X  (0: greedy)" if name == "/temp" else "/max N  (or none)"
            self.say(f"usage: {usage}: {exc}")
            return
        self.session.params = params
        self.say(f"temperature {params.temperature}" if name == "/temp" else
                 f"max tokens {params.max_tokens or 'none: to the end of the reply'}")

    def command(self, line: str) -> str | None:
        name, _, arg = line.partition(" ")
        arg = arg.strip()
        engine = self.session.engine
        if name in ("/exit", "/quit"):
            return "exit"
        if name == "/help":
            self.say(HELP.format(methods=", ".join(methods())))
        elif name == "/file":
            path = Path(arg).expanduser()
            try:
                content = path.read_text()
            except (OSError, UnicodeDecodeError) as exc:
                self.say(f"usage: /file PATH  (a text file): {exc}")
                return None
            self.attached = (path, content)
            self.say(f"attached {path} ({len(content.splitlines())} lines) to your next message")
        elif name in ("/temp", "/max"):
            self.sampling(name, arg)
        elif name == "/stats":
            self.say(format_stats(self.session))
        elif name == "/reset":
            self.session.reset()
            self.say("conversation cleared")
        elif name == "/method":
            if not arg:
                self.say(f"method: {engine.settings.method} (choose from {', '.join(methods())})")
                return None
            try:
                engine.set_method(arg)
                engine.load()
            except SprinterError as exc:
                self.say(f"error: {exc}")
                return None
            self.say(f"method set to {arg}")
        elif name == "/threshold":
            try:
                point = OperatingPoint(threshold=float(arg))
            except ValueError as exc:  # not a number, or out of range
                self.say(f"usage: /threshold X  (a number in (0, 1]): {exc}")
                return None
            engine.set_operating_point(point)
            value = point.threshold
            uses = get_strategy(engine.settings.method).needs_verifier
            note = "" if uses else " (used by the sprinter and auto methods)"
            self.say(f"threshold set to {value}{note}")
        else:
            self.say(f"unknown command {name!r}; type /help for the list")
        return None


def run(args: argparse.Namespace) -> int:
    params = sampling_from(args)
    engine = engine_from(args).load()
    session = ChatSession(engine, system=args.system, params=params)
    save_history = _setup_readline(args.history_file)
    name = engine.pair.name if engine.pair else engine.target_path.name
    eof = "Ctrl-Z Enter" if sys.platform == "win32" else "Ctrl-D"  # what ends input() there
    print(f"sprinter-edge chat: {name}, method {engine.settings.method}. "
          f"/help for commands, {eof} to leave.", flush=True)
    hint = paste_hint(line_editor())
    if hint:
        print(hint, flush=True)
    try:
        ChatRepl(session, show_stats=args.show_stats).loop()
    finally:
        save_history()
        engine.close()
    return 0
