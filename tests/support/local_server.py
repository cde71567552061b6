"""A server the tests start as a process on localhost: a free port for it, and the wait until
it answers."""

from __future__ import annotations

import socket
import subprocess
import time
import urllib.request


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_answering(url: str, process: subprocess.Popen[bytes], timeout_s: float) -> None:
    """Until a GET of `url` answers; RuntimeError when the process exits or the time is up."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            urllib.request.urlopen(url, timeout=2).close()
            return
        except OSError as error:
            if time.monotonic() > deadline or process.poll() is not None:
                raise RuntimeError(
                    f"nothing answered at {url} (exit code {process.poll()})"
                ) from error
            time.sleep(0.1)
