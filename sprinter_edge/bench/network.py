"""The target across a network: `bench --rpc-delays 0,1,5`.

`ggml-rpc-server`s (llama.cpp's, built by tools/build_llama_server.sh) hold the target: one
serves one client at a time, and the engine and every llama-server row's process stay connected
for the whole run, so each gets its own: the engine's rows with `--target-rpc`, each llama-server
row with `--rpc` (their drafts stay on this CPU, as the engine's). For each delay a delaying proxy
(in a process of its own: in the bench's, it would wait for the engine's GIL) sits in front of
each server, and the whole bench runs once through them. A round trip costs 2 x the
delay; a target call makes several. `summary_rows` then puts every row of every delay side by
side: decode speed, its ratio over `ar` at the same delay, target calls per token, end to end.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..backend import llama_tools
from ..errors import SprinterError
from ..processes import die_with_parent, free_port, stop_process, wait_listening
from .netdelay import DelayProxyProcess

RPC_SERVER = "ggml-rpc-server"
# each delay's proxy listens on a port of its own, the same from run to run: the engine's cost
# table is kept per endpoint (costs/table.py), so a second run at a delay reuses its timing
PROXY_PORT_BASE = 40000
MAX_DELAY_MS = 100.0


def proxy_port(delay_ms: float, server: int = 0) -> int:
    """The port of the proxy at `delay_ms` in front of rpc-server `server` (0: the engine's)."""
    return PROXY_PORT_BASE + server * 1001 + round(delay_ms * 10)


@dataclass(frozen=True)
class Route:
    delay_ms: float
    engine: str  # the endpoint for --target-rpc
    peers: tuple[str, ...]  # an endpoint for each llama-server row's --rpc


def parse_delays(text: str) -> tuple[float, ...]:
    try:
        delays = tuple(float(d) for d in text.split(",") if d.strip())
    except ValueError:
        raise SprinterError(f"--rpc-delays takes milliseconds, comma-separated: {text!r}") from None
    if not delays or any(d < 0 or d > MAX_DELAY_MS for d in delays):
        raise SprinterError(f"--rpc-delays takes 0-{MAX_DELAY_MS:g} ms each: {text!r}")
    return delays


class RpcServer:
    """One `ggml-rpc-server` process on 127.0.0.1 (a free port), ready when `start` returns."""

    def __init__(self, binary: Path, *, threads: int | None = None, port: int | None = None,
                 cache: bool = True, log: Path | None = None):
        self.binary, self.port = binary, port or free_port()
        self.args = [str(binary), "-H", "127.0.0.1", "-p", str(self.port)]
        self.args += ["-t", str(threads)] if threads else []
        self.args += ["-c"] if cache else []  # weights kept on its disk: a second load sends hashes
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> RpcServer:
        out = self.log.open("ab") if self.log else subprocess.DEVNULL
        try:
            linux = sys.platform.startswith("linux")  # (preexec_fn: none on Windows; a Linux call)
            self.proc = subprocess.Popen(self.args, stdout=out, stderr=subprocess.STDOUT,
                                         preexec_fn=die_with_parent if linux else None)
        finally:
            if self.log:
                out.close()  # the process holds its own copy
        wait_listening(self.port, self.proc, timeout, RPC_SERVER)
        return self

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc, grace=5)

    def __enter__(self) -> RpcServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def find_rpc_server() -> Path:
    binary = llama_tools.find_tool(RPC_SERVER)
    if binary is None:
        raise SprinterError(f"--rpc-delays needs llama.cpp's {RPC_SERVER}: {llama_tools.BUILD_HINT}")
    return binary


@contextlib.contextmanager
def delayed_routes(delays: Sequence[float], *, peers: int, threads: int | None, log: Path | None = None
                   ) -> Iterator[Iterator[Route]]:
    """An rpc-server for the engine and one for each of `peers` llama-server rows, for the whole
    run; yields each delay's Route in turn, its proxies up while the caller works with it."""
    binary = find_rpc_server()
    with contextlib.ExitStack() as stack:
        servers = [stack.enter_context(RpcServer(binary, threads=threads, log=log)) for _ in range(peers + 1)]

        def routes() -> Iterator[Route]:
            for delay in delays:
                with contextlib.ExitStack() as proxies:
                    ends = [proxies.enter_context(DelayProxyProcess(address(s), delay,
                                                                    port=proxy_port(delay, i))).endpoint
                            for i, s in enumerate(servers)]
                    yield Route(delay, ends[0], tuple(ends[1:]))

        yield routes()


def address(server: RpcServer) -> tuple[str, int]:
    return "127.0.0.1", server.port


SUMMARY_COLUMNS = ("delay_ms", "method", "tokens_per_second", "ratio_vs_ar", "ratio_vs_plain",
                   "target_calls_per_token", "e2e_seconds", "ttft_seconds", "pass_at_1", "exact_match",
                   "file_edit_pass")


def summary_rows(by_delay: dict[float, Sequence[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Every row of every delay, the columns of SUMMARY_COLUMNS."""
    return [{"delay_ms": delay, **{k: row.get(k) for k in SUMMARY_COLUMNS[1:]}}
            for delay, rows in by_delay.items() for row in rows]


def markdown(rows: Sequence[dict[str, Any]]) -> str:
    def cell(key: str, v: Any) -> str:
        if v is None:
            return "-"
        if key in ("ratio_vs_ar", "ratio_vs_plain"):
            return f"{v:.2f}x"
        if key in ("file_edit_pass", "pass_at_1", "exact_match"):
            return f"{v:.0%}"
        if isinstance(v, float):
            return f"{v:.2f}" if key == "target_calls_per_token" else f"{v:.1f}"
        return str(v)

    heads = ("delay each way (ms)", "row", "decode tok/s", "x ar", "x own plain", "target calls/token",
             "end to end s (mean)", "TTFT s (mean)", "HumanEval pass@1", "identical to ar",
             "whole-file edits done")
    lines = ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    lines += ["| " + " | ".join(cell(k, r.get(k)) for k in SUMMARY_COLUMNS) + " |" for r in rows]
    return "\n".join(lines)


def run(delays: Sequence[float], bench_one: Callable[[Route], Sequence[dict[str, Any]]], *, peers: int,
        threads: int | None, log: Path | None = None) -> list[dict[str, Any]]:
    """`bench_one(route)` runs the bench through one delay's route and returns its rows."""
    by_delay: dict[float, Sequence[dict[str, Any]]] = {}
    with delayed_routes(delays, peers=peers, threads=threads, log=log) as routes:
        for route in routes:
            by_delay[route.delay_ms] = bench_one(route)
    return summary_rows(by_delay)
