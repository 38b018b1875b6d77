"""Runs the API and a dispatcher for `trainmaster up`, restarting either if it dies.

`python -m api.stack.supervisor STATE_FILE`; SIGTERM stops both children, then itself.
"""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
import time
from pathlib import Path

from trainmaster import json_logs
from trainmaster.config import home

log = logging.getLogger("trainmaster.supervisor")

COMMANDS = {"api": ["api", "--host", "127.0.0.1"], "dispatcher": ["dispatcher"]}
MAX_BACKOFF_S = 30.0


def main(state_file: str) -> int:
    json_logs.configure()
    state = json.loads(Path(state_file).read_text())
    port = state["api_url"].rsplit(":", 1)[1]
    trainmaster = str(Path(sys.executable).with_name("trainmaster"))
    logs = home() / "logs"
    stopping = False

    def stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    children: dict[str, subprocess.Popen[bytes]] = {}
    backoff = {name: 1.0 for name in COMMANDS}
    next_start = {name: 0.0 for name in COMMANDS}

    while not stopping:
        for name, args in COMMANDS.items():
            child = children.get(name)
            if child is not None and child.poll() is None:
                continue
            if child is not None:
                log.warning("component_exited", extra={"component": name, "code": child.returncode})
                next_start[name] = time.monotonic() + backoff[name]
                backoff[name] = min(backoff[name] * 2, MAX_BACKOFF_S)
                children.pop(name)
            if time.monotonic() < next_start[name]:
                continue
            command = [trainmaster, *args, *(["--port", port] if name == "api" else [])]
            with (logs / f"{name}.log").open("ab") as out:
                children[name] = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
            log.info("component_started", extra={"component": name, "pid": children[name].pid})
            (home() / "supervised.json").write_text(json.dumps({k: c.pid for k, c in children.items()}))
        time.sleep(0.5)

    for child in children.values():
        child.terminate()
    for child in children.values():
        try:
            child.wait(15)
        except subprocess.TimeoutExpired:
            child.kill()
    (home() / "supervised.json").unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
