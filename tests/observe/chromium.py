"""Load a page in headless Chromium and collect its console errors and a full-page screenshot, through
the DevTools protocol over `--remote-debugging-pipe` (file descriptors 3 and 4, NUL-separated JSON;
no extra Python package). `find()` is the browser binary or None; `load(url, png)` returns
{"errors": [...], "console": [...], "title": ..., "png": path}."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tempfile
import time


def find() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        p = shutil.which(name)
        if p:
            return p
    return None


class _Pipe:
    def __init__(self, proc, w, r):
        self.proc, self.w, self.r = proc, w, r
        self.buf = b""
        self.n = 0
        self.events: list = []

    def send(self, method: str, params: dict | None = None, session: str | None = None) -> int:
        self.n += 1
        msg = {"id": self.n, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self.w, json.dumps(msg).encode() + b"\0")
        return self.n

    def _read(self, deadline: float) -> dict:
        while b"\0" not in self.buf:
            if time.monotonic() > deadline:
                raise TimeoutError("chromium did not answer")
            chunk = os.read(self.r, 1 << 20)
            if not chunk:
                raise RuntimeError("chromium closed the pipe")
            self.buf += chunk
        raw, self.buf = self.buf.split(b"\0", 1)
        return json.loads(raw)

    def call(self, method: str, params: dict | None = None, session: str | None = None, timeout: float = 30) -> dict:
        i = self.send(method, params, session)
        deadline = time.monotonic() + timeout
        while True:
            msg = self._read(deadline)
            if msg.get("id") == i:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            self.events.append(msg)

    def wait_event(self, method: str, timeout: float = 30) -> dict:
        for k, msg in enumerate(self.events):
            if msg.get("method") == method:
                return self.events.pop(k)
        deadline = time.monotonic() + timeout
        while True:
            msg = self._read(deadline)
            if msg.get("method") == method:
                return msg
            self.events.append(msg)


def load(url: str, png: str, binary: str | None = None, width: int = 1280, settle_s: float = 0.5) -> dict:
    binary = binary or find()
    if binary is None:
        raise FileNotFoundError("no chromium binary")
    prof = tempfile.mkdtemp(prefix="dvm-chromium-")
    r_ours, w_theirs = os.pipe()  # chromium writes fd 4
    r_theirs, w_ours = os.pipe()  # chromium reads fd 3
    args = [binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
            "--remote-debugging-pipe", f"--user-data-dir={prof}", "--no-first-run", "--no-default-browser-check",
            "about:blank"]

    def fds():
        os.dup2(r_theirs, 3)
        os.dup2(w_theirs, 4)

    proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            preexec_fn=fds, pass_fds=(3, 4, r_theirs, w_theirs))
    os.close(r_theirs)
    os.close(w_theirs)
    pipe = _Pipe(proc, w_ours, r_ours)
    try:
        target = pipe.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        sess = pipe.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for dom in ("Page.enable", "Runtime.enable", "Log.enable"):
            pipe.call(dom, session=sess)
        pipe.call("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": 900, "deviceScaleFactor": 1, "mobile": False}, session=sess)
        pipe.call("Page.navigate", {"url": url}, session=sess)
        pipe.wait_event("Page.loadEventFired", timeout=60)
        time.sleep(settle_s)
        # Drain what arrived meanwhile (a round trip flushes the queue up to now).
        pipe.call("Runtime.evaluate", {"expression": "1"}, session=sess)
        title = pipe.call("Runtime.evaluate", {"expression": "document.title", "returnByValue": True},
                          session=sess)["result"].get("value")
        images = pipe.call("Runtime.evaluate", {
            "expression": "Array.from(document.images).map(i => [i.complete, i.naturalWidth])",
            "returnByValue": True}, session=sess)["result"].get("value")
        metrics = pipe.call("Page.getLayoutMetrics", session=sess)
        size = metrics.get("cssContentSize") or metrics["contentSize"]
        shot = pipe.call("Page.captureScreenshot", {
            "format": "png", "captureBeyondViewport": True,
            "clip": {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}},
            session=sess, timeout=60)
        with open(png, "wb") as f:
            f.write(base64.b64decode(shot["data"]))
        errors, console = [], []
        for msg in pipe.events:
            m, p = msg.get("method"), msg.get("params", {})
            if m == "Runtime.consoleAPICalled":
                text = " ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", []))
                console.append((p.get("type"), text))
                if p.get("type") in ("error", "assert"):
                    errors.append(f"console.{p.get('type')}: {text}")
            elif m == "Runtime.exceptionThrown":
                d = p.get("exceptionDetails", {})
                errors.append(f"exception: {d.get('text')} {d.get('exception', {}).get('description', '')}")
            elif m == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                e = p["entry"]
                errors.append(f"log: {e.get('text')} ({e.get('url', '')})")
        return {"errors": errors, "console": console, "title": title, "images": images, "png": png,
                "height": size["height"]}
    finally:
        try:
            pipe.call("Browser.close", timeout=5)
        except Exception:  # noqa: BLE001
            pass
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        os.close(w_ours)
        os.close(r_ours)
        shutil.rmtree(prof, ignore_errors=True)
