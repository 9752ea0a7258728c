"""A loopback HTTP server for the download tests: serves a folder, lists the paths asked for."""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


class _Server(ThreadingHTTPServer):
    daemon_threads = True


@contextlib.contextmanager
def serve(served: Path) -> Iterator[ThreadingHTTPServer]:
    """Serve `served`; the server's `.folder` is served/files, `.url` its URL, `.requests` the
    paths asked for."""
    (served / "files").mkdir(parents=True, exist_ok=True)
    requests: list[str] = []

    class Handler(SimpleHTTPRequestHandler):
        def do_GET(self):
            requests.append(self.path)
            super().do_GET()

        def log_message(self, *args):
            pass

    httpd = _Server(("127.0.0.1", 0), functools.partial(Handler, directory=str(served)))
    # shutdown() waits for serve_forever's next poll: 0.5 s by default, for every test that serves
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    httpd.folder, httpd.requests = served / "files", requests
    httpd.url = f"http://127.0.0.1:{httpd.server_address[1]}/files/"
    try:
        yield httpd
    finally:
        httpd.shutdown()
        httpd.server_close()
