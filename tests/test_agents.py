"""A real coding agent against `serve`: aider (its own venv, made by tools/setup.sh --dev) edits a
file through the server, with a recording proxy between them. Checked: the protocol (a streamed
reply that ends with finish_reason "stop", not cut at a default cap; aider exits cleanly and
writes the file), not the edit's quality. On the default pair: the fixture model never ends a
whole-file reply (greedy, it repeats itself to the end of the context). The agents bench
(bench/agents.py) times the same client."""

from __future__ import annotations

import http.client
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from support.server import running_server

from sprinter_edge.bench import agents
from sprinter_edge.bench.edits.files import FILES

SOURCE = '''def add(a, b):
    """The sum of a and b."""
    return a + b


def scale(values, factor):
    return [v * factor for v in values]
'''


class Recorder:
    """A loopback proxy to `base` that keeps every request body and every response body."""

    def __init__(self, base: str):
        host, port = base.removeprefix("http://").split(":")
        exchanges: list[tuple[str, dict, bytes]] = []
        self.exchanges = exchanges

        class Handler(BaseHTTPRequestHandler):
            def _forward(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                conn = http.client.HTTPConnection(host, int(port), timeout=600)
                skip = ("host", "content-length")
                headers = {k: v for k, v in self.headers.items() if k.lower() not in skip}
                conn.request(self.command, self.path, body=body or None, headers=headers)
                resp = conn.getresponse()
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in ("transfer-encoding", "content-length", "connection"):
                        self.send_header(k, v)
                self.send_header("Connection", "close")
                self.end_headers()
                seen = b""
                while chunk := resp.read1(65536):
                    seen += chunk
                    self.wfile.write(chunk)
                    self.wfile.flush()
                conn.close()
                request = json.loads(body) if body else {}
                exchanges.append((self.path, request, seen))

            do_GET = do_POST = _forward

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()


@pytest.fixture(scope="module")
def aider() -> Path:
    found = agents.find_aider()
    if found is None:
        pytest.fail("aider is not installed: tools/setup.sh --dev makes .venv-aider")
    return found


@pytest.fixture(scope="module")
def recorded_server(default_pair_paths: tuple[Path, Path],
                    tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Recorder, str]]:
    """`serve` as a user starts it for an agent (its defaults: no --max-tokens), behind a recorder."""
    draft, target = default_pair_paths
    args = ["--target", str(target), "--draft", str(draft), "--threads", "2", "--model-name", "default"]
    with running_server(args, tmp_path_factory.mktemp("serve") / "server.log") as base:
        recorder = Recorder(base)
        yield recorder, base
        recorder.close()


def sse_events(body: bytes) -> list[dict]:
    return [json.loads(line[5:]) for line in body.decode().splitlines()
            if line.startswith("data:") and line[5:].strip() != "[DONE]"]


@pytest.mark.integration
def test_aider_edits_a_file_through_serve(aider: Path, recorded_server: tuple[Recorder, str],
                                          tmp_path: Path) -> None:
    recorder, base = recorded_server
    server = agents.Server()
    server.base, server.model = recorder.base, "default"
    home = tmp_path / "home"
    home.mkdir()
    file = tmp_path / "calc.py"
    file.write_text(SOURCE)
    run = agents.run_aider(aider, server, "whole", file, "Rename the function add to plus.", home)
    code, out = run.exit_code, run.output
    assert code == 0, out
    assert "token limit" not in out, out
    chats = [(req, body) for path, req, body in recorder.exchanges if path.endswith("/chat/completions")]
    assert chats, [path for path, _, _ in recorder.exchanges]
    request, body = chats[0]  # the edit (aider may summarise the chat after it)
    assert request.get("stream") is True and "max_tokens" not in request  # a user's agent, as it is
    events = sse_events(body)
    finishes = [c["finish_reason"] for e in events for c in e.get("choices", []) if c.get("finish_reason")]
    assert finishes == ["stop"], finishes
    text = "".join(c["delta"].get("content") or "" for e in events for c in e.get("choices", []))
    assert text.strip()
    health = httpx.get(f"{base}/health", timeout=30).json()
    assert health["failed"] == 0 and health["totals"]["completion_tokens"] > 0
    assert "def plus(" in file.read_text(), (text, out)  # aider wrote the reply's file
    assert run.written_seconds is not None and 0 < run.written_seconds <= run.exit_seconds


@pytest.mark.slow
def test_the_agents_bench_checks_what_aider_wrote() -> None:
    """The bench's checks, on files written as aider would have: the task's own check for the
    edit, and the follow-up's (a comment on top, the code unchanged)."""
    task = FILES.select(1, ("rename_function",), split="tuning")[0]
    from sprinter_edge.bench.edits.files import reference

    assert agents.follow_up_done(task.code, f"{agents.COMMENT}\n{task.code}") == (True, "")
    assert agents.follow_up_done(task.code, task.code)[0] is False
    assert agents.follow_up_done(task.code, f"{agents.COMMENT}\n{reference(task)}")[1] == "the code changed"
    walls = (("serve:auto", 80.0), ("llama-server", 120.0), ("llama-server-ngram-mod", 100.0))
    turns = [agents.Turn(task.id, task.edit, row, "whole", n, wall, True)
             for row, wall in walls for n in (1, 2)]
    rows = {r.row: r for r in agents.summary(turns)}
    assert rows["serve:auto"].wall_vs_best_llama_server == pytest.approx(0.8)
    assert rows["llama-server-ngram-mod"].turn1_done == 1
    assert "exit_vs_best_llama_server" not in rows["serve:auto"].to_dict()  # no exit times recorded


LONG = ("Write a Python class BankAccount with deposit, withdraw, balance and a transaction history, "
        "with a docstring on every method and a short usage example.")


@pytest.mark.integration
def test_a_long_reply_without_max_tokens_runs_to_its_end(recorded_server: tuple[Recorder, str]) -> None:
    """No max_tokens: the reply ends where the model ends it (finish_reason "stop"), well past
    the 256 tokens a capped default would cut it at, on both endpoints."""
    import openai

    _, base = recorded_server
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0, timeout=900)
    chat = client.chat.completions.create(model="default", messages=[{"role": "user", "content": LONG}])
    assert chat.choices[0].finish_reason == "stop" and chat.usage.completion_tokens > 256, chat.usage
    prompt = f"<|im_start|>user\n{LONG}<|im_end|>\n<|im_start|>assistant\n"  # the chat template, by hand
    text = client.completions.create(model="default", prompt=prompt)
    assert text.choices[0].finish_reason == "stop" and text.usage.completion_tokens > 256, text.usage
