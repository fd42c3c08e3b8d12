"""A fake ``python -m vllm.entrypoints.openai.api_server`` for the launcher tests (standard
library only, so any interpreter runs it). It behaves as the real one does where launching
and stopping are concerned: it listens on ``--host``/``--port``, hands the listening socket
to a child process (vLLM's engine processes outlive a parent that is killed alone), and the
child answers ``/health`` and ``/v1/models``. On SIGTERM the parent exits and leaves the
child serving. ``$FAKE_VLLM_RECORD``: a file where it writes its argv and both pids as JSON.
"""

import json
import os
import socket
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

MODULE = "vllm.entrypoints.openai.api_server"


def serve(fd: int, model: str) -> None:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = {"/health": {}, "/v1/models": {"object": "list", "data": [{"id": model, "object": "model"}]}}
            if self.path not in body:
                self.send_error(404)
                return
            raw = json.dumps(body[self.path]).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler, bind_and_activate=False)
    server.socket.close()
    server.socket = socket.socket(fileno=fd)
    server.serve_forever()


def main(argv: list[str]) -> None:
    if argv[:1] == ["--serve-fd"]:
        serve(int(argv[1]), argv[2])
        return
    options = {
        flag: value for flag, value in zip(argv, argv[1:]) if flag.startswith("--") and not value.startswith("--")
    }
    host, port = options.get("--host", "127.0.0.1"), int(options.get("--port", "8000"))
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does
    sock.bind((host, port))
    sock.listen(16)
    model = options.get("--served-model-name") or options.get("--model", "model")
    child = subprocess.Popen(
        [sys.executable, "-m", MODULE, "--serve-fd", str(sock.fileno()), model], pass_fds=[sock.fileno()]
    )
    record = os.environ.get("FAKE_VLLM_RECORD")
    if record:
        with open(record, "w") as f:
            json.dump({"argv": argv, "pids": [os.getpid(), child.pid]}, f)
    while True:
        time.sleep(1)


if __name__ == "__main__":
    main(sys.argv[1:])
