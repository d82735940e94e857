"""Drive headless Chromium from the standard library: the DevTools protocol over a pipe.

`--remote-debugging-pipe` makes Chromium read commands from file descriptor 3 and write
replies and events to descriptor 4, each message a JSON object ended by a NUL byte. That needs
no websocket client, only two os.pipe()s moved onto 3 and 4 in the child.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from pathlib import Path


class ChromiumUnavailable(RuntimeError):
    """Chromium is missing or does not answer; tests skip with this message."""


def find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


class Chromium:
    """One headless browser with one page; `call` sends a command to that page's session."""

    def __init__(self, width: int = 1200, height: int = 900, timeout: float = 60.0):
        executable = find_chromium()
        if executable is None:
            raise ChromiumUnavailable("no chromium executable on PATH (Debian: apt-get install chromium)")
        self.timeout = timeout
        self._next_id = 0
        self._buffer = b""
        self._events: list[dict] = []
        self._profile = tempfile.mkdtemp(prefix="graphattn-chromium-")
        to_child_read, self._to_child = os.pipe()
        self._from_child, from_child_write = os.pipe()

        def onto_3_and_4() -> None:  # runs in the child between fork and exec
            read_end = fcntl.fcntl(to_child_read, fcntl.F_DUPFD, 10)
            write_end = fcntl.fcntl(from_child_write, fcntl.F_DUPFD, 10)
            os.dup2(read_end, 3)
            os.dup2(write_end, 4)

        args = [
            executable,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-extensions",
            "--disable-dev-shm-usage",
            "--remote-debugging-pipe",
            f"--user-data-dir={self._profile}",
            f"--window-size={width},{height}",
            "about:blank",
        ]
        try:
            self.process = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                close_fds=False,
                preexec_fn=onto_3_and_4,
            )
        except OSError as err:
            _remove_profile(self._profile)
            raise ChromiumUnavailable(f"{executable} cannot start: {err}") from err
        finally:
            os.close(to_child_read)
            os.close(from_child_write)
        try:
            self.session = self._open_page(width, height)
        except Exception as err:
            self.close()
            raise ChromiumUnavailable(f"{executable} started but its DevTools pipe did not answer: {err}") from err

    # -- protocol -----------------------------------------------------------------------------
    def _send(self, method: str, params: dict | None = None, session: str | None = None) -> int:
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._to_child, json.dumps(message).encode() + b"\0")
        return self._next_id

    def _read_message(self, deadline: float) -> dict:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._from_child], [], [], left)[0]:
                raise TimeoutError("no reply from chromium in time")
            chunk = os.read(self._from_child, 1 << 20)
            if not chunk:
                raise ConnectionError("chromium closed its DevTools pipe")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def _command(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        wanted = self._send(method, params, session)
        deadline = time.monotonic() + self.timeout
        while True:
            message = self._read_message(deadline)
            if message.get("id") == wanted:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            self._events.append(message)

    def _open_page(self, width: int, height: int) -> str:
        self._command("Browser.getVersion")
        target = self._command("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self._command("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        self._command(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
            session,
        )
        return session

    def call(self, method: str, params: dict | None = None) -> dict:
        return self._command(method, params, self.session)

    # -- conveniences ---------------------------------------------------------------------------
    def evaluate(self, expression: str):
        """Value of a JavaScript expression in the page (awaited when it is a promise)."""
        result = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True})
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails'].get('exception', {}).get('description')}")
        return result["result"].get("value")

    def open(self, path: Path) -> None:
        self.call("Page.navigate", {"url": Path(path).resolve().as_uri()})

    def wait_for(self, expression: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not self.evaluate(expression):
            if time.monotonic() > deadline:
                raise TimeoutError(f"page never made {expression!r} true")
            time.sleep(0.05)

    def hover(self, x: float, y: float) -> None:
        self.call("Input.dispatchMouseEvent", {"type": "mouseMoved", "x": x, "y": y})

    def screenshot(self, path: Path) -> Path:
        data = self.call("Page.captureScreenshot", {"format": "png"})["data"]
        Path(path).write_bytes(base64.b64decode(data))
        return Path(path)

    def close(self) -> None:
        try:
            self._send("Browser.close")  # lets chromium take its helper processes down with it
        except OSError:
            pass
        for fd in (self._to_child, self._from_child):
            try:
                os.close(fd)
            except OSError:
                pass
        if getattr(self, "process", None) is not None:
            try:
                self.process.wait(timeout=10)  # Browser.close asked it to go
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        _remove_profile(self._profile)

    def __enter__(self) -> Chromium:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _remove_profile(path: str, attempts: int = 50) -> None:
    """Remove chromium's profile directory; its helper processes may still write there for a
    moment after the browser exits (a rmtree racing them fails with 'Directory not empty')."""
    for _ in range(attempts):
        try:
            shutil.rmtree(path)
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.1)
    shutil.rmtree(path, ignore_errors=True)
