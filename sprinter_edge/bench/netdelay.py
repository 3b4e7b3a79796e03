"""A network's delay on the loopback: a TCP proxy that holds every chunk for a fixed time.

This kernel has no `netem`, so the RPC bench puts one of these between llama.cpp's RPC client
and `ggml-rpc-server`. Each direction delivers a chunk `delay` seconds after it arrived, in
order, without waiting for the chunks before it to be delivered (a link's latency, not its
bandwidth): a request and its answer pay one round trip of 2 x delay.

    python -m sprinter_edge.bench.netdelay --listen 127.0.0.1:50100 --to 127.0.0.1:50052 --delay-ms 5
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import socket
import subprocess
import sys
import threading
import time

from ..processes import stop_process, wait_listening

log = logging.getLogger(__name__)

CHUNK = 1 << 16


class DelayProxy:
    """Listens on (host, port) and forwards each connection to `to`, `delay_ms` each way; runs
    its own event loop on a thread (`with DelayProxy(...) as proxy:` or start/stop). A timed
    client must not share its process (`DelayProxyProcess`): the proxy's thread would wait for
    the client's GIL, up to 5 ms a chunk."""

    def __init__(self, to: tuple[str, int], delay_ms: float, *, host: str = "127.0.0.1", port: int = 0):
        self.to, self.delay = to, delay_ms / 1000.0
        self.host, self.port = host, port
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"delay-proxy-{delay_ms:g}ms", daemon=True)
        self._server: asyncio.base_events.Server | None = None

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self) -> DelayProxy:
        self._thread.start()
        self._ready.wait(10)
        if self._server is None:
            raise OSError(f"the delay proxy could not listen on {self.host}:{self.port}")
        return self

    def stop(self) -> None:
        if self._thread.is_alive():
            with contextlib.suppress(TimeoutError):
                asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(5)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def __enter__(self) -> DelayProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._server = self._loop.run_until_complete(
                asyncio.start_server(self._connection, self.host, self.port))
            self.port = self._server.sockets[0].getsockname()[1]
        except OSError as exc:
            log.error("delay proxy: %s", exc)
        finally:
            self._ready.set()
        if self._server is not None:
            self._loop.run_forever()
        self._loop.close()

    async def _connection(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            server_r, server_w = await asyncio.open_connection(*self.to)
        except OSError:
            client_w.close()  # nothing there: the client sees the connection end, as without us
            return
        for w in (client_w, server_w):
            with contextlib.suppress(OSError):
                w.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with contextlib.suppress(asyncio.CancelledError):  # stop() ends every connection
            await asyncio.gather(self._pipe(client_r, server_w), self._pipe(server_r, client_w))

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Chunks from `reader` to `writer`, each `delay` after it arrived; the other side's end
        (or a reset) closes this one."""
        held: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def deliver() -> None:
            while True:
                due, data = await held.get()
                if not data:
                    break
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                writer.write(data)
                await writer.drain()

        sender = asyncio.ensure_future(deliver())
        try:
            while data := await reader.read(CHUNK):
                held.put_nowait((time.monotonic() + self.delay, data))
        except OSError:
            pass
        held.put_nowait((0.0, b""))
        with contextlib.suppress(OSError):
            await sender
        writer.close()


class DelayProxyProcess:
    """A `DelayProxy` in a process of its own (`python -m sprinter_edge.bench.netdelay`), ready
    when `start` returns."""

    def __init__(self, to: tuple[str, int], delay_ms: float, *, port: int):
        self.port = port
        self.args = [sys.executable, "-m", "sprinter_edge.bench.netdelay", "--listen", f"127.0.0.1:{port}",
                     "--to", f"{to[0]}:{to[1]}", "--delay-ms", f"{delay_ms:g}"]
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 20.0) -> DelayProxyProcess:
        self.proc = subprocess.Popen(self.args, stdout=subprocess.DEVNULL)
        wait_listening(self.port, self.proc, timeout, "the delay proxy")
        return self

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc, grace=10)

    def __enter__(self) -> DelayProxyProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sprinter_edge.bench.netdelay",
                                description="A TCP proxy that delays every chunk each way (a network's "
                                            "latency on the loopback, where netem is missing).")
    p.add_argument("--listen", default="127.0.0.1:0", metavar="HOST:PORT",
                   help="address to listen on (default: %(default)s, a free port)")
    p.add_argument("--to", required=True, metavar="HOST:PORT", help="where connections go")
    p.add_argument("--delay-ms", type=float, default=1.0, help="delay each way in ms (default: %(default)s)")
    args = p.parse_args(argv)
    host, _, port = args.listen.rpartition(":")
    to_host, _, to_port = args.to.rpartition(":")
    with DelayProxy((to_host, int(to_port)), args.delay_ms, host=host, port=int(port)) as proxy:
        print(f"delaying {args.delay_ms:g} ms each way: {proxy.endpoint} -> {args.to} (Ctrl-C stops)",
              flush=True)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        with contextlib.suppress(KeyboardInterrupt):
            threading.Event().wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
