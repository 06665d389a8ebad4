"""ms_dynvm's logging: one `logging.getLogger("ms_dynvm")` hierarchy, levels from `DYNVM_LOG`.

Loggers are named after the part that logs: `ms_dynvm.alarm`, `ms_dynvm.profiler`,
`ms_dynvm.report`, `ms_dynvm.cache`, ... (`get("alarm")`). `DYNVM_LOG=debug|info|warning|error`
sets the level of the `ms_dynvm` logger (default: warning; unset leaves it to the script's logging
configuration). With `DYNVM_LOG` set and no handler configured anywhere (neither on `ms_dynvm` nor
on the root logger), one stderr handler is added to `ms_dynvm` so that the chosen level shows;
without it, warnings still show through Python's last-resort handler, and a script that configures
logging gets ms_dynvm's records like any library's.

`warn_once(key, message)`: one logging warning per cause and process (the fallback alarm, failures
of observability itself). `ms_dynvm.warn.warn_once` (a `RuntimeWarning` through `warnings`, for
problems a script should be able to filter or test for) logs its message here too, at debug level.
Core layer: no MindSpore.
"""

from __future__ import annotations

import logging
import os
import sys
import threading

ROOT = "ms_dynvm"
LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "warn": logging.WARNING,
          "error": logging.ERROR, "critical": logging.CRITICAL}

_WARNED: set = set()
_LOCK = threading.Lock()
_configured = False


def configure(level: str | None = None) -> logging.Logger:
    """Apply `level` (or `$DYNVM_LOG`) to the `ms_dynvm` logger; returns it. An unknown level name is
    reported once on stderr and ignored (a typo in an environment variable must not stop a script)."""
    global _configured
    root = logging.getLogger(ROOT)
    name = (level if level is not None else os.environ.get("DYNVM_LOG", "")).strip().lower()
    _configured = True
    if not name:
        return root
    lv = LEVELS.get(name)
    if lv is None and name.isdigit():
        lv = int(name)
    if lv is None:
        print(f"ms_dynvm: DYNVM_LOG={name!r} is not one of {', '.join(sorted(LEVELS))}; ignored",
              file=sys.stderr)
        return root
    root.setLevel(lv)
    if not root.handlers and not logging.getLogger().handlers:
        h = logging.StreamHandler()
        h.setFormatter(logging.Formatter("[%(name)s] %(levelname)s: %(message)s"))
        root.addHandler(h)
        root.propagate = False  # (the root logger has no handler: nothing is lost)
    return root


def get(name: str = "") -> logging.Logger:
    """The logger `ms_dynvm.<name>` (`ms_dynvm` itself for "")."""
    if not _configured:
        configure()
    return logging.getLogger(f"{ROOT}.{name}" if name else ROOT)


def warn_once(key: str, message: str, logger: str = "", *args) -> bool:
    """Log `message` at WARNING on `ms_dynvm.<logger>` unless a warning of `key` was logged in this
    process. Returns whether it logged."""
    with _LOCK:
        if key in _WARNED:
            return False
        _WARNED.add(key)
    get(logger).warning(message, *args)
    return True


def forget(key: str | None = None) -> None:
    """Forget that `key` (None: every key) was warned about (tests)."""
    with _LOCK:
        if key is None:
            _WARNED.clear()
        else:
            _WARNED.discard(key)
