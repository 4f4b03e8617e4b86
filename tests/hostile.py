"""A hostile KServe server for tests: a real HTTP server on loopback that answers whatever the test sets, in any
way a broken or lying server can (any status, headers and body; no answer at all; a closed socket; a slow trickle).

Usage::

    with HostileServer() as srv:                      # srv.url: http://127.0.0.1:<port>
        srv.answer(200, b"null", {"Inference-Header-Content-Length": "-5"})
        srv.mode = "close"                            # or "hang" (no answer until the server stops), "answer"

Its handler threads are joined when it stops (``block_on_close``), so a test can count threads before and after.
"""

from __future__ import annotations

import http.server
import threading
import time
from typing import Optional


class HostileServer:
    def __init__(self) -> None:
        self.status, self.body = 200, b"{}"
        self.headers: dict[str, str] = {}
        self.mode = "answer"
        # Answers given in order before the standing one (warm-up answers, then something else).
        self.script: list[tuple[int, bytes, dict[str, str]]] = []
        self.requests = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            timeout = 30  # a client that stops talking does not hold this thread past the test

            def do_POST(self):  # noqa: N802
                length = self.headers.get("Content-Length")
                self.rfile.read(int(length) if length and length.isdigit() else 0)
                self._answer()

            def do_GET(self):  # noqa: N802
                self._answer()

            def _answer(self) -> None:
                with outer._lock:
                    outer.requests += 1
                    status, body, headers = outer.script.pop(0) if outer.script else outer.current()
                    mode = outer.mode
                if mode == "hang":
                    outer._stop.wait(60)
                    self.close_connection = True
                    return
                if mode == "close":
                    self.close_connection = True
                    return
                self.send_response(status)
                lower = {k.lower() for k in headers}
                if "content-length" not in lower:
                    self.send_header("Content-Length", str(len(body)))
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                if mode == "trickle":
                    for i in range(len(body)):
                        if outer._stop.wait(0.2):
                            break
                        self.wfile.write(body[i : i + 1])
                        self.wfile.flush()
                    self.close_connection = True
                    return
                self.wfile.write(body)

            def log_message(self, *a):
                pass

        class Server(http.server.ThreadingHTTPServer):
            daemon_threads = False
            block_on_close = True

        self.server = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread: Optional[threading.Thread] = None

    def current(self) -> tuple[int, bytes, dict[str, str]]:
        return self.status, self.body, dict(self.headers)

    def answer(self, status: int, body: bytes, headers: Optional[dict[str, str]] = None) -> None:
        with self._lock:
            self.status, self.body, self.headers = status, body, dict(headers or {})

    def start(self) -> "HostileServer":
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05})
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self.server.shutdown()
        self.server.server_close()  # joins the handler threads
        if self._thread is not None:
            self._thread.join(30)

    def __enter__(self) -> "HostileServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def live_threads() -> set[threading.Thread]:
    """The threads alive now (taken before the code under test runs)."""
    return set(threading.enumerate())


def threads_left(before: set[threading.Thread], timeout_s: float = 30.0) -> list[str]:
    """The threads started since ``before`` that are still alive after ``timeout_s`` (waiting as long as any is):
    threads that finish their last line a moment after a join are not leaks. Counting threads instead would be
    fooled by threads of earlier tests in the same session ending meanwhile (seen in a full run: 8 threads after,
    10 before, none left by the test)."""
    deadline = time.monotonic() + timeout_s
    while (new := [t for t in threading.enumerate() if t not in before]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return sorted(t.name for t in new)
