"""One warning per cause and process (core layer: no MindSpore)."""

from __future__ import annotations

import threading
import warnings

_WARNED: set = set()
_LOCK = threading.Lock()


def warn_once(key: str, message: str, stacklevel: int = 2) -> bool:
    """Warn `message` (RuntimeWarning, `stacklevel` as for `warnings.warn` from the caller) unless a
    warning of `key` was given in this process: one missing compiler is one warning, however many
    parts of ms_dynvm find it missing. Returns whether it warned. The message also goes to the
    `ms_dynvm` logger at debug level (`ms_dynvm.observe.log`), so a log holds it in sequence."""
    with _LOCK:
        if key in _WARNED:
            return False
        _WARNED.add(key)
    warnings.warn(message, RuntimeWarning, stacklevel=stacklevel + 1)
    try:
        from ms_dynvm.observe import log

        log.get("warn").debug("%s (%s)", message, key)
    except Exception:  # noqa: BLE001 - logging never breaks the caller
        pass
    return True
