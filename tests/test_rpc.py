"""The target on llama.cpp's rpc-server (`--target-rpc`): a real `ggml-rpc-server` process, the
fixture model, faults made by killing the server. No timing here (bench --rpc-delays has it)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from sprinter_edge.backend import llama_tools
from sprinter_edge.backend.rpc import dial, parse_endpoints
from sprinter_edge.bench import network
from sprinter_edge.bench.netdelay import DelayProxy
from sprinter_edge.errors import BackendError, SettingsError
from sprinter_edge.processes import free_port

PROMPT = "List the days of the week:"
LONG = "Write a long essay about the history of computers."  # 500 tokens and more, greedy


def test_endpoints_parse_and_refuse() -> None:
    assert parse_endpoints("10.0.0.2:50052, 10.0.0.3:50053") == ("10.0.0.2:50052", "10.0.0.3:50053")
    assert parse_endpoints(["[::1]:50052"]) == ("[::1]:50052",)
    for bad in ("10.0.0.2", "10.0.0.2:port", ":50052", "host:70000"):
        with pytest.raises(SettingsError, match="HOST:PORT"):
            parse_endpoints(bad)


def test_nothing_listening_is_one_line() -> None:
    port = free_port()
    with pytest.raises(BackendError, match=f"cannot reach the target's rpc-server at 127.0.0.1:{port}"):
        dial(f"127.0.0.1:{port}", timeout=2)


def test_delay_proxy_keeps_order_and_ends_with_the_server() -> None:
    srv = socket.create_server(("127.0.0.1", 0))

    def echo_then_close() -> None:
        conn, _ = srv.accept()
        with conn:
            got = b""
            while len(got) < 30_000:
                got += conn.recv(65536)
            conn.sendall(got[::-1])

    threading.Thread(target=echo_then_close, daemon=True).start()
    payload = bytes(range(256)) * 117 + b"end"  # 29,955 bytes, sent in several chunks
    with DelayProxy(srv.getsockname()[:2], 2.0) as proxy, \
            socket.create_connection(("127.0.0.1", proxy.port)) as c:
        for i in range(0, len(payload), 7000):
            c.sendall(payload[i:i + 7000])
        c.sendall(b"x" * 45)
        back = b""
        while chunk := c.recv(65536):  # ends: the server closed, and the proxy passed it on
            back += chunk
    assert back == (payload + b"x" * 45)[::-1]
    srv.close()


def test_delays_parse() -> None:
    assert network.parse_delays("0,1,5") == (0.0, 1.0, 5.0)
    ports = {network.proxy_port(d, server) for d in (0, 1, 5, 100) for server in range(8)}
    assert len(ports) == 32 and max(ports) < 65536
    for bad in ("", "a", "-1", "101"):
        with pytest.raises(Exception, match="--rpc-delays"):
            network.parse_delays(bad)


# ------------------------------------------------------------------------ a real rpc-server

@pytest.fixture()
def rpc_server(tmp_path: Path):
    binary = llama_tools.find_tool(network.RPC_SERVER)
    if binary is None:
        pytest.fail(f"{network.RPC_SERVER} is not built: run tools/setup.sh --dev")
    server = network.RpcServer(binary, threads=1, cache=False, log=tmp_path / "rpc-server.log").start()
    yield server
    server.stop()


def run_cli(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sprinter_edge", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "SPRINTER_EDGE_EXTRA_BUFFERS": "0"})


def generate_args(target: Path, *extra: str, prompt: str = PROMPT) -> list[str]:
    return ["generate", prompt, "--target", str(target), "--method", "ar", "--ctx", "1024", "--threads", "1",
            "--flash-attn", "off", "--temperature", "0", *extra]


@pytest.mark.slow
def test_greedy_through_rpc_matches_the_local_target(rpc_server: network.RpcServer,
                                                      fixture_target_path: Path) -> None:
    """The same CPU kernels on both sides (repacking off here, none on the server): the same
    tokens. The reply is read as the CLI prints it."""
    local = run_cli(*generate_args(fixture_target_path, "--max-tokens", "48"))
    remote = run_cli(*generate_args(fixture_target_path, "--max-tokens", "48",
                                    "--target-rpc", rpc_server.endpoint))
    assert local.returncode == 0, local.stderr
    assert remote.returncode == 0, remote.stderr
    assert remote.stdout == local.stdout and local.stdout.strip()


def test_a_server_not_there_at_load_is_one_line(fixture_target_path: Path) -> None:
    port = free_port()
    r = run_cli(*generate_args(fixture_target_path, "--target-rpc", f"127.0.0.1:{port}"))
    assert r.returncode == BackendError.exit_code, r.stderr
    assert f"cannot reach the target's rpc-server at 127.0.0.1:{port}" in r.stderr
    assert "Traceback" not in r.stderr and r.stderr.count("error:") == 1


def test_a_server_killed_mid_reply_ends_it_with_one_line(rpc_server: network.RpcServer,
                                                        fixture_target_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "sprinter_edge",
                             *generate_args(fixture_target_path, "--max-tokens", "500",
                                            "--target-rpc", rpc_server.endpoint, prompt=LONG)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "SPRINTER_EDGE_EXTRA_BUFFERS": "0"})
    assert proc.stdout is not None
    proc.stdout.read(40)  # the reply has begun
    rpc_server.kill()
    out, err = proc.communicate(timeout=60)  # never a hang
    assert proc.returncode == 10, err
    assert f"the target's rpc-server at {rpc_server.endpoint} went away" in err
    assert "Traceback" not in err and "ggml_abort" not in err and err.count("error:") == 1


@pytest.mark.slow
def test_serve_answers_503_after_the_server_died_and_comes_back(rpc_server: network.RpcServer,
                                                                  fixture_target_path: Path,
                                                                  tmp_path: Path) -> None:
    """The engine's worker process ends with its rpc-server; the server itself stays (the same
    process, never started again), answers 503 meanwhile, and a new worker serves once the
    rpc-server is back."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = (tmp_path / "serve.log").open("w")
    serve = subprocess.Popen([sys.executable, "-m", "sprinter_edge", "serve", "--port", str(port),
                              "--target", str(fixture_target_path), "--method", "ar", "--ctx", "1024",
                              "--threads", "1", "--flash-attn", "off", "--target-rpc", rpc_server.endpoint],
                             stdout=log, stderr=subprocess.STDOUT,
                             env={**os.environ, "SPRINTER_EDGE_EXTRA_BUFFERS": "0"})

    def health() -> int:
        return health_body()[0]

    def health_body() -> tuple[int, dict]:
        try:
            with urllib.request.urlopen(base + "/health", timeout=5) as r:
                return r.status, json.load(r)
        except urllib.error.HTTPError as exc:
            return exc.code, json.load(exc)
        except OSError:
            return 0, {}

    def wait_ready(timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while health() != 200:
            assert serve.poll() is None and time.monotonic() < deadline, (tmp_path / "serve.log").read_text()
            time.sleep(0.3)

    def post(max_tokens: int, stream: bool) -> urllib.request.Request:
        body = {"model": "m", "messages": [{"role": "user", "content": LONG}], "max_tokens": max_tokens,
                "temperature": 0, "stream": stream}
        return urllib.request.Request(base + "/v1/chat/completions", data=json.dumps(body).encode(),
                                      headers={"Content-Type": "application/json"})

    try:
        wait_ready()
        before = health_body()[1]
        with urllib.request.urlopen(post(400, True), timeout=60) as resp:
            events = 0
            while events < 10:  # a few tokens in (the prompt's progress comments before them)
                line = resp.readline()
                assert line.startswith((b"data:", b":")), line
                events += line.startswith(b"data:")
                resp.readline()
            rpc_server.kill()
            rest = resp.read().decode()  # the stream ends, with an error event: no hang
        assert '"error"' in rest and "went away" in rest
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(post(8, False), timeout=30)
        assert err.value.code == 503 and "went away" in err.value.read().decode()
        status, body = health_body()
        assert status == 503 and body["status"] == "restarting" and "went away" in body["error"]
        rpc_server.start()  # back on the same port: a new worker loads and answers
        wait_ready()
        with urllib.request.urlopen(post(8, False), timeout=60) as resp:
            assert json.load(resp)["choices"][0]["message"]["content"]
        after = health_body()[1]
        assert after["pid"] == before["pid"] == serve.pid and after["worker_pid"] != before["worker_pid"]
    finally:
        serve.terminate()
        serve.wait(20)
        log.close()
    text = (tmp_path / "serve.log").read_text()
    assert "Traceback" not in text and "ggml_abort" not in text
    assert text.count("sprinter-edge serve: model") == 1  # the server never started again


def test_costs_are_kept_per_route(fixture_target_path: Path) -> None:
    """A target through an rpc-server is timed there, round trips included; a local target's key
    is what it was before the RPC backend (the tables users have stay valid)."""
    from sprinter_edge.backend.llama import LoadOptions
    from sprinter_edge.costs.table import file_key

    local = file_key(fixture_target_path, LoadOptions())
    assert "rpc" not in local
    far = file_key(fixture_target_path, LoadOptions(rpc=("10.0.0.2:50052",)))
    assert far == {**local, "rpc": ["10.0.0.2:50052"]}
    assert far != file_key(fixture_target_path, LoadOptions(rpc=("10.0.0.3:50052",)))
