"""llama.cpp's own `llama-server` as a bench peer: what a user of local models runs instead.

One server process per configuration (plain, draft-simple at its defaults and tuned, the two
n-gram proposers), started on 127.0.0.1 at a free port with the engine rows' GGUF files,
threads and context, kept for the whole run so that its calls interleave prompt by prompt with
the package's own rows (an idle server computes nothing), and always stopped at the end, also
on an error or Ctrl-C (and, on Linux, when this process dies).

Each prompt goes to /completion as the same token ids the engine rows decode (the chat-rendered
prompt: no second tokenisation or template), with `cache_prompt: false` so every call reads
its prompt anew, as the engine rows do. Speed and draft counters are the server's own
`timings`: `predicted_per_second` (its decode steps over the time after the first token: one
step per token as for the engine rows, whose first token costs a step of its own), `prompt_ms`
(the time to first token: the prompt read by the target, and by the draft, which mirrors every
target batch, and the first token sampled), `draft_n`, `draft_n_accepted`.

The binary comes from tools/build_llama_server.sh (`backend.llama_tools.find_tool`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..backend.host import performance_cores
from ..processes import ServerError, die_with_parent, free_port, stop_process, wait_healthy

log = logging.getLogger(__name__)

# method name -> (llama-server options, whether it loads the pair's draft with -md)
SERVER_CONFIGS: dict[str, tuple[tuple[str, ...], bool]] = {
    "llama-server": (("--spec-type", "none"), False),
    "llama-server-draft": (("--spec-type", "draft-simple"), True),  # its defaults: n_max 3, p_min 0
    "llama-server-draft-tuned": (("--spec-type", "draft-simple", "--spec-draft-n-max", "16",
                                  "--spec-draft-p-min", "0.75"), True),
    "llama-server-ngram-mod": (("--spec-type", "ngram-mod"), False),
    "llama-server-ngram-simple": (("--spec-type", "ngram-simple"), False),
    # the best of a sweep of llama.cpp's n-gram and draft settings on the edit tasks' tuning
    # split (results/bench-results-anchor-sweep.json: 1.45x ar; ngram-simple's defaults 1.43x)
    "llama-server-ngram-simple-tuned": (("--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "6",
                                         "--spec-ngram-simple-size-m", "32"), False),
}
SERVER_METHODS = tuple(SERVER_CONFIGS)
# a configuration's own options, named after its --spec-type's option family: a row
# `llama-server-ngram-mod[n-match=16,n-min=8]` adds `--spec-ngram-mod-n-match 16
# --spec-ngram-mod-n-min 8` (a sweep of llama.cpp's settings is a bench run over such rows)
OPTION_FAMILY = {"llama-server-draft": "draft", "llama-server-draft-tuned": "draft",
                 "llama-server-ngram-mod": "ngram-mod", "llama-server-ngram-simple": "ngram-simple",
                 "llama-server-ngram-simple-tuned": "ngram-simple"}
_SET = re.compile(r"([\w-]+)\[([^\]]*)\]")
_OPTION = re.compile(r"([a-z][a-z0-9-]*)=([\w.]+)")
PLAIN = "llama-server"
STARTUP_TIMEOUT = 180.0  # seconds for the server to load its models and answer /health
REQUEST_TIMEOUT = 900.0  # one completion


def parse_server_row(name: str) -> tuple[str, tuple[str, ...]] | None:
    """(configuration, its extra llama-server options) for a row named `CONFIG[key=value,...]`
    (OPTION_FAMILY); None for a name of another form. ValueError: a bad one."""
    m = _SET.fullmatch(name)
    if m is None:
        return None
    base, body = m.groups()
    family = OPTION_FAMILY.get(base)
    if family is None:
        raise ValueError(f"{name!r}: settings go with one of {', '.join(OPTION_FAMILY)}")
    options: list[str] = []
    for item in filter(None, (x.strip() for x in body.split(","))):
        o = _OPTION.fullmatch(item)
        if o is None:
            raise ValueError(f"{name!r}: {item!r} is not key=value (e.g. n-match=16)")
        options += [f"--spec-{family}-{o.group(1)}", o.group(2)]
    return base, tuple(options)


def server_base(name: str) -> str:
    """The configuration a row runs: `name` itself or, for `CONFIG[...]`, CONFIG."""
    m = _SET.fullmatch(name)
    return m.group(1) if m else name


@dataclass
class ServerRun:
    """One completion, in the fields the bench's peer rows share (`peers.PeerRun`) plus the
    server's own timings."""

    tokens: list[int]
    text: str
    new_tokens: int
    prefill_seconds: float  # the server's prompt_ms: the prompt read and the first token sampled
    decode_seconds: float  # the server's predicted_ms: the time after the first token
    total_seconds: float  # the client's, request to response
    finish_reason: str
    timings: dict[str, Any] = field(default_factory=dict)

    @property
    def tokens_per_second(self) -> float:
        """The server's `predicted_per_second`: its decode steps (the tokens after the first,
        which the prompt's last batch yields) over the time after the first token."""
        return float(self.timings.get("predicted_per_second") or 0.0)

    @property
    def timed_tokens(self) -> int:
        """The tokens `decode_seconds` produced: predicted_n - 1."""
        return max(int(self.timings.get("predicted_n") or 0) - 1, 0)


class LlamaServer:
    """One llama-server process of one configuration; `generate` sends one prompt."""

    def __init__(self, name: str, binary: Path, target: Path, *, draft: Path | None = None,
                 n_ctx: int = 4096, n_threads: int | None = None, no_repack: bool = False,
                 flash_attn: str = "auto", rpc: Sequence[str] = (),
                 startup_timeout: float = STARTUP_TIMEOUT, options: Sequence[str] = ()):
        """`options`: the row's own llama-server options, after the configuration's; `rpc`: the
        target's layers on these rpc-servers (its draft stays on this CPU), as the engine's."""
        if name not in SERVER_CONFIGS:
            raise ValueError(f"unknown llama-server configuration {name!r}; choose from "
                             f"{', '.join(SERVER_METHODS)}")
        config_options, needs_draft = SERVER_CONFIGS[name]
        if needs_draft and draft is None:
            raise ServerError(f"{name} needs the pair's draft model (-md); this run has none")
        self.name = name
        self.binary = Path(binary)
        threads = n_threads or performance_cores()  # the engine's default too
        self.port = 0
        self.args: list[str] = ["-m", str(target), "-c", str(n_ctx), "-t", str(threads),
                                "-tb", str(threads), "-np", "1", "--host", "127.0.0.1",
                                "-fa", flash_attn, *config_options, *options]
        if needs_draft and draft is not None:
            self.args += ["-md", str(draft), "-td", str(threads), "-tbd", str(threads)]
        if rpc:
            self.args += ["--rpc", ",".join(rpc), "-ngl", "99"] + (["-ngld", "0"] if needs_draft else [])
        if no_repack:  # the engine loads weights without extra buffer types: the same here
            self.args.append("--no-repack")
        self.startup_timeout = startup_timeout
        self.proc: subprocess.Popen[bytes] | None = None
        self._log_path: Path | None = None

    # ------------------------------------------------------------------ process
    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def command(self) -> list[str]:
        return [str(self.binary), *self.args, "--port", str(self.port)]

    def start(self) -> LlamaServer:
        """Start the server and wait until /health answers ok (a port taken in between: retried)."""
        if self.proc is not None:
            return self
        for attempt in range(3):
            self.port = free_port()
            fd, name = tempfile.mkstemp(prefix=f"sprinter-{self.name}-", suffix=".log")
            self._log_path = Path(name)
            log.info("starting %s: %s", self.name, " ".join(self.command))
            with os.fdopen(fd, "wb") as out:
                self.proc = subprocess.Popen(
                    self.command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                    start_new_session=True,  # Ctrl-C reaches the bench, which stops the server
                    creationflags=getattr(subprocess, "CREATE_NEW_PROCESS_GROUP", 0),  # (Windows' way)
                    preexec_fn=die_with_parent if sys.platform.startswith("linux") else None)
            try:
                self._wait_healthy()
                return self
            except ServerError as exc:
                tail = self.log_tail()
                self.close()
                if "bind" in tail.lower() and attempt < 2:
                    log.warning("%s: port %d taken, retrying", self.name, self.port)
                    continue
                raise ServerError(f"{exc}; its log ends: {tail or '(empty)'}") from None
            except BaseException:
                self.close()
                raise
        raise ServerError(f"{self.name} could not bind a port")  # pragma: no cover

    def _wait_healthy(self) -> None:
        assert self.proc is not None
        wait_healthy(self.url, self.proc, self.startup_timeout, f"{self.name} ({self.binary})")

    def log_text(self) -> str:
        """The server's log so far ("" when it has none)."""
        if self._log_path is None:
            return ""
        try:
            return self._log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = 6) -> str:
        text = self.log_text()
        return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:])

    def close(self) -> None:
        """Stop the process (SIGTERM, then SIGKILL after 10 s) and remove its log."""
        proc, self.proc = self.proc, None
        if proc is not None:
            stop_process(proc, grace=10)
        if self._log_path is not None:
            with contextlib.suppress(OSError):
                self._log_path.unlink()
            self._log_path = None

    def __enter__(self) -> LlamaServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ requests
    def request_body(self, prompt: Sequence[int], max_tokens: int, stop: Sequence[str] = (),
                     temperature: float = 0.0, seed: int | None = None,
                     json_schema: dict[str, Any] | None = None) -> dict[str, Any]:
        """/completion's body: the prompt as token ids, every sampler but temperature neutral
        (greedy: top_k 1; sampling: the full distribution at `temperature`, as the engine rows);
        `json_schema` constrains the reply (the server turns it into a grammar)."""
        body: dict[str, Any] = {
            "prompt": [int(t) for t in prompt], "n_predict": int(max_tokens),
            "temperature": float(max(temperature, 0.0)), "top_k": 1 if temperature <= 0 else 0,
            "top_p": 1.0, "min_p": 0.0, "typical_p": 1.0, "repeat_penalty": 1.0,
            "presence_penalty": 0.0, "frequency_penalty": 0.0, "dry_multiplier": 0.0,
            "xtc_probability": 0.0, "seed": -1 if seed is None else int(seed),
            "stop": list(stop), "cache_prompt": False, "stream": False, "return_tokens": True,
            "n_probs": 0}
        if json_schema is not None:
            body["json_schema"] = json_schema
        return body

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        req = urllib.request.Request(self.url + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT) as resp:
                out = json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode("utf-8", errors="replace")[:300]
            raise ServerError(f"{self.name} answered HTTP {exc.code} to {path}: {detail}") from None
        except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
            alive = self.proc is not None and self.proc.poll() is None
            raise ServerError(f"{self.name} {path} failed ({exc}); server "
                              f"{'running' if alive else 'gone'}; its log ends: {self.log_tail()}") from None
        if not isinstance(out, dict):
            raise ServerError(f"{self.name} {path}: expected a JSON object, got {type(out).__name__}")
        return out

    def detokenize(self, tokens: Sequence[int]) -> str:
        return str(self._post("/detokenize", {"tokens": [int(t) for t in tokens]}).get("content", ""))

    def generate(self, prompt: Sequence[int], max_tokens: int, stop: Sequence[str] = (),
                 temperature: float = 0.0, seed: int | None = None,
                 json_schema: dict[str, Any] | None = None) -> ServerRun:
        """One completion of the prompt's token ids (constrained to `json_schema` when given).
        Cut by a stop text, only the tokens whose text lies wholly before the cut are kept, as
        the engine rows keep them."""
        self.start()
        t0 = time.perf_counter()
        res = self._post("/completion", self.request_body(prompt, max_tokens, stop, temperature, seed,
                                                          json_schema))
        t_end = time.perf_counter()
        timings = dict(res.get("timings") or {})
        if "predicted_per_second" not in timings:
            raise ServerError(f"{self.name}: the response carried no timings: {str(res)[:200]}")
        text = str(res.get("content") or "")
        tokens = [int(t) for t in res.get("tokens") or []]
        stop_type = str(res.get("stop_type") or "")
        if stop_type == "word":  # the server returns the stop text's tokens too
            while tokens and not text.startswith(self.detokenize(tokens)):
                tokens.pop()
        elif stop_type == "eos" and tokens:  # and the end token, which the engine's token ids leave out
            tokens.pop()
        timings["stop_type"] = stop_type
        finish = {"eos": "stop", "word": "stop", "limit": "length"}.get(stop_type, stop_type)
        # the first token comes with the prompt's last batch: prompt_ms is the time to it, the
        # prompt read by the target (and by the draft, which mirrors every target batch)
        ttft = float(timings.get("prompt_ms") or 0.0) / 1e3
        return ServerRun(tokens, text, len(tokens), ttft, float(timings.get("predicted_ms") or 0.0) / 1e3,
                         t_end - t0, finish, timings)


def server_stats(name: str, run: ServerRun) -> dict[str, Any]:
    """The record's stats for one server run: the server's timings, and the target decode
    calls they imply (each target call yields one token plus the draft tokens it accepted; the
    first token comes with the prompt)."""
    t = run.timings
    predicted = int(t.get("predicted_n") or run.new_tokens)
    drafted = int(t.get("draft_n") or 0)
    accepted = int(t.get("draft_n_accepted") or 0)
    return {"method": name, "new_tokens": run.new_tokens, "prefill_seconds": run.prefill_seconds,
            "decode_seconds": run.decode_seconds, "total_seconds": run.total_seconds,
            "finish_reason": run.finish_reason, "tokens_per_second": round(run.tokens_per_second, 3),
            "prompt_n": t.get("prompt_n"), "prompt_ms": t.get("prompt_ms"),
            "predicted_n": predicted, "predicted_ms": t.get("predicted_ms"),
            "predicted_per_second": t.get("predicted_per_second"),
            "draft_n": drafted, "draft_n_accepted": accepted,
            "target_calls": max(predicted - 1 - accepted, 0)}
