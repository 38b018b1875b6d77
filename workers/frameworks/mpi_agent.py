"""How mpirun reaches the gang's other nodes without ssh: Open MPI's rsh launcher runs an agent
(`plm_rsh_agent`) as `AGENT HOST COMMAND...` to start its daemon (`orted`) on HOST. Here the agent
hands COMMAND to the Ray Train worker that already holds a bundle on HOST, which runs it.

- `LaunchServer` (a thread in the first worker on each node other than rank 0's): listens on that
  worker's gang port for the job's lifetime; runs `sh -c COMMAND` for a client that knows the job's
  secret, streams its output back, ends it if the client goes away.
- `python -m workers.frameworks.mpi_agent SPEC HOST COMMAND...`: the agent itself, run by mpirun on
  rank 0's node; SPEC is a JSON file `{"secret": ..., "servers": {HOST: [address, port]}}`.
"""

from __future__ import annotations

import hmac
import json
import socket
import struct
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

OUTPUT, EXIT = b"o", b"x"


def _send(sock: socket.socket, kind: bytes, payload: bytes) -> None:
    sock.sendall(kind + struct.pack("!I", len(payload)) + payload)


def _receive_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError("the other side closed the connection")
        data += chunk
    return data


def _receive(sock: socket.socket) -> tuple[bytes, bytes]:
    header = _receive_exactly(sock, 5)
    return header[:1], _receive_exactly(sock, struct.unpack("!I", header[1:])[0])


class LaunchServer(threading.Thread):
    def __init__(self, address: str, port: int, secret: str) -> None:
        super().__init__(name="mpi-launch-server", daemon=True)
        self.secret = secret
        self.listener = socket.create_server((address, port))
        self.listener.settimeout(0.5)
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            try:
                connection, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._serve, args=(connection,), daemon=True).start()

    def _serve(self, connection: socket.socket) -> None:
        with connection:
            try:
                request = json.loads(_receive(connection)[1])
                if not hmac.compare_digest(str(request.get("secret")), self.secret):
                    _send(connection, EXIT, b"126")
                    return
                process = subprocess.Popen(
                    ["sh", "-c", str(request["command"])], stdout=subprocess.PIPE, stderr=subprocess.STDOUT
                )
                assert process.stdout is not None
                try:
                    for line in iter(process.stdout.readline, b""):
                        _send(connection, OUTPUT, line)
                    _send(connection, EXIT, str(process.wait()).encode())
                except OSError:
                    process.kill()  # the agent (and so mpirun) went away: so does what it started
            except (OSError, ValueError, KeyError):
                return

    def stop(self) -> None:
        self.stopping.set()
        self.listener.close()


def run_agent(spec_path: str, host: str, command: list[str]) -> int:
    spec: dict[str, Any] = json.loads(Path(spec_path).read_text())
    server = spec["servers"].get(host)
    if server is None:
        print(f"[trainmaster] mpirun asked for {host}, which holds none of the gang's workers", file=sys.stderr)
        return 255
    with socket.create_connection((server[0], int(server[1])), timeout=30) as sock:
        sock.settimeout(None)
        _send(sock, OUTPUT, json.dumps({"secret": spec["secret"], "command": " ".join(command)}).encode())
        while True:
            kind, payload = _receive(sock)
            if kind == EXIT:
                return int(payload)
            sys.stdout.buffer.write(payload)
            sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(run_agent(sys.argv[1], sys.argv[2], sys.argv[3:]))
