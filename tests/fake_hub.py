"""A Hugging Face Hub on 127.0.0.1 for tests: the few endpoints `huggingface_hub` downloads a
repository through (revision info, the file tree, HEAD and GET of each file), serving folders
of this machine. Point `HF_ENDPOINT` at `FakeHub.url`; nothing leaves the machine."""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse


class FakeHub:
    """`repos`: repo id -> folder. Every repository has one commit, its hash derived from its files."""

    def __init__(self, repos: dict[str, Path]) -> None:
        self.repos = repos
        self.requests: list[str] = []
        self.url = ""

    def commit(self, repo: str) -> str:
        digest = hashlib.sha1(repo.encode())
        for path in sorted(self.repos[repo].rglob("*")):
            if path.is_file():
                digest.update(path.name.encode() + path.read_bytes())
        return digest.hexdigest()

    def files(self, repo: str) -> list[Path]:
        root = self.repos[repo]
        return sorted(p for p in root.rglob("*") if p.is_file())


def _handler(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *_: object) -> None:  # quiet
            pass

        def _send(self, code: int, body: bytes = b"", headers: dict[str, str] | None = None,
                  head: bool = False) -> None:
            self.send_response(code)
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if not head:
                self.wfile.write(body)

        def _json(self, value: object) -> None:
            self._send(200, json.dumps(value).encode(), {"Content-Type": "application/json"})

        def _route(self, head: bool) -> None:
            path = unquote(urlparse(self.path).path)
            hub.requests.append(f"{self.command} {path}")
            parts = path.strip("/").split("/")
            if parts[:2] == ["api", "models"] and len(parts) >= 6:
                repo = "/".join(parts[2:4])
                if repo not in hub.repos:
                    self._send(404, b'{"error": "Repository not found"}', {"X-Error-Code": "RepoNotFound"})
                    return
                if parts[4] == "revision":
                    siblings = [{"rfilename": str(p.relative_to(hub.repos[repo]))} for p in hub.files(repo)]
                    self._json({"id": repo, "modelId": repo, "sha": hub.commit(repo), "siblings": siblings,
                                "private": False, "disabled": False, "gated": False, "tags": []})
                    return
                if parts[4] == "tree":
                    tree = [{"type": "file", "path": str(p.relative_to(hub.repos[repo])), "size": p.stat().st_size,
                             "oid": hashlib.sha1(p.read_bytes()).hexdigest()} for p in hub.files(repo)]
                    self._json(tree)
                    return
            if len(parts) >= 5 and parts[2] == "resolve":
                repo = "/".join(parts[:2])
                if repo not in hub.repos:
                    self._send(404, b"", {"X-Error-Code": "RepoNotFound"}, head)
                    return
                file = hub.repos[repo] / "/".join(parts[4:])
                if not file.is_file():
                    self._send(404, b"", {"X-Error-Code": "EntryNotFound"}, head)
                    return
                data = file.read_bytes()
                headers = {"X-Repo-Commit": hub.commit(repo), "ETag": f'"{hashlib.sha1(data).hexdigest()}"'}
                self._send(200, data, headers, head)
                return
            self._send(404, b"", {}, head)

        def do_GET(self) -> None:
            self._route(head=False)

        def do_HEAD(self) -> None:
            self._route(head=True)

    return Handler


@contextmanager
def fake_hub(repos: dict[str, Path]) -> Iterator[FakeHub]:
    """Serve `repos` on 127.0.0.1 (an ephemeral port) while active."""
    hub = FakeHub(repos)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(hub))
    hub.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield hub
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
