"""Runs inside a sandbox (its own python3): a server on port 8001 that answers with the headers
it received, one lower-cased ``name: value`` per line, so that a scenario sees what reached it
through the edge. The sandbox scenario scripts upload this file; it imports only the stdlib."""

from __future__ import annotations

import http.server


class Echo(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = "\n".join(f"{k.lower()}: {v}" for k, v in self.headers.items()).encode()
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


if __name__ == "__main__":
    http.server.ThreadingHTTPServer(("0.0.0.0", 8001), Echo).serve_forever()
