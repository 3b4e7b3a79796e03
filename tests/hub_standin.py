"""A local stand-in for the Hugging Face Hub's file endpoint (the Hub is unreachable here).

It answers HEAD and GET on /{repo}/resolve/{revision}/{filename} with the headers
huggingface_hub reads (X-Repo-Commit, ETag, Content-Length), honours Range requests (so
resumed downloads are exercised), and can cut a response short to simulate a dropped
connection. Loopback only.
"""

from __future__ import annotations

import hashlib
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


class HubStandIn:
    def __init__(self, repo: str, revision: str, files: dict[str, Path]):
        self.repo, self.revision, self.files = repo, revision, files
        self.requests: list[tuple[str, str, str | None]] = []  # (method, path, Range)
        self.drop_after: int | None = None  # bytes each GET sends before the connection drops
        self._etags = {name: hashlib.sha256(p.read_bytes()).hexdigest() for name, p in files.items()}
        handler = self._handler()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> HubStandIn:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        hub = self
        pattern = re.compile(r"^/(?P<repo>.+?)/resolve/(?P<rev>[^/]+)/(?P<file>.+)$")

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _target(self) -> tuple[str, Path] | None:
                m = pattern.match(self.path.split("?")[0])
                if not m or m["repo"] != hub.repo or m["rev"] not in (hub.revision, "main"):
                    return None
                path = hub.files.get(m["file"])
                return (m["file"], path) if path else None

            def _headers(self, name: str, size: int, status: int, extra: dict[str, str]) -> None:
                self.send_response(status)
                self.send_header("X-Repo-Commit", hub.revision)
                self.send_header("ETag", f'"{hub._etags[name]}"')
                self.send_header("Content-Length", str(size))
                self.send_header("Accept-Ranges", "bytes")
                for k, v in extra.items():
                    self.send_header(k, v)
                self.end_headers()

            def do_HEAD(self) -> None:  # noqa: N802
                hub.requests.append(("HEAD", self.path, self.headers.get("Range")))
                found = self._target()
                if not found:
                    self.send_response(404)
                    self.send_header("X-Error-Code", "EntryNotFound")
                    self.end_headers()
                    return
                name, path = found
                self._headers(name, path.stat().st_size, 200, {})

            def do_GET(self) -> None:  # noqa: N802
                rng = self.headers.get("Range")
                hub.requests.append(("GET", self.path, rng))
                found = self._target()
                if not found:
                    self.send_response(404)
                    self.end_headers()
                    return
                name, path = found
                data = path.read_bytes()
                start = 0
                if rng:
                    start = int(re.match(r"bytes=(\d+)-", rng).group(1))  # type: ignore[union-attr]
                body = data[start:]
                status = 206 if start else 200
                extra = {"Content-Range": f"bytes {start}-{len(data) - 1}/{len(data)}"} if start else {}
                self._headers(name, len(body), status, extra)
                if hub.drop_after is not None:
                    self.wfile.write(body[: hub.drop_after])
                    self.wfile.flush()
                    self.connection.shutdown(2)  # drop the connection mid-body
                    return
                self.wfile.write(body)

        return Handler
