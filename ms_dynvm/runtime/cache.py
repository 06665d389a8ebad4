"""Kernel cache: an in-memory LRU per device plus an integrity-checked disk cache.

Keys: `make_key(parts)` is the sha256 of a canonical JSON of everything that determines the binary:
the ms_dynvm version, compiler version and flags, target arch (`platform.machine()`, gcc
`-dumpmachine`), and the canonical IR text of the group with its signature (callers add these).

Disk layout: `<dir>/<key[:2]>/<key>.bin`, `<dir>` = `$DYNVM_CACHE_DIR` or `~/.cache/ms_dynvm`, created
with mode 0700 (kernels are code we will dlopen: other users must not be able to plant one). An
existing directory is used as it is when it is ours and not writable by group or others (never
chmod'ed: `DYNVM_CACHE_DIR=/tmp` must not change /tmp); else, or when it cannot be created, the cache
keeps to memory, with one warning (`disk_problem` says why). A write that fails is counted
(`disk_write_errors`) and the artifact stays in memory. Each
entry is `MAGIC | sha256(body) | len(body) | body`, body = `key` (utf-8, 64 hex chars) + payload. On
load the magic, length, hash and embedded key are checked before the payload is handed to the
loader; a corrupted, truncated or tampered entry is counted (`corrupt_entries`), deleted and rebuilt.
Writes go to a temp file in the same directory and are published with `os.replace`, which is atomic
on POSIX: a concurrent reader sees the old entry or the new one, never a half-written file.

Concurrency: one build per key at a time (a lock per key); other threads asking for the same key wait
and then get the cached result. `submit` builds on a background thread and returns a Future (tier-up:
the block keeps running eagerly meanwhile).

Counters (`stats()`): hits (memory), disk_hits, misses (neither), compiles, compile_seconds,
corrupt_entries, evictions, disk_write_errors.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import os
import stat
import struct
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from ms_dynvm.warn import warn_once

MAGIC = b"DVMKC001"
_HEADER = struct.Struct("<8s32sQ")  # magic, sha256(body), len(body)


def default_dir() -> str:
    return os.environ.get("DYNVM_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "ms_dynvm")


def make_key(parts: dict) -> str:
    """sha256 hex of `parts` (a JSON-able dict) in canonical form."""
    text = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def pack(key: str, payload: bytes) -> bytes:
    body = key.encode() + payload
    return _HEADER.pack(MAGIC, hashlib.sha256(body).digest(), len(body)) + body


def unpack(key: str, data: bytes) -> bytes | None:
    """The payload of an entry for `key`, or None when anything does not check out."""
    if len(data) < _HEADER.size:
        return None
    magic, digest, n = _HEADER.unpack_from(data)
    body = data[_HEADER.size:]
    if magic != MAGIC or n != len(body) or hashlib.sha256(body).digest() != digest:
        return None
    k = key.encode()
    if body[:len(k)] != k:
        return None
    return body[len(k):]


class KernelCache:
    """LRU (per device) + disk cache of built artifacts.

    `build_fn() -> bytes` makes the artifact (e.g. a .so); `load_fn(bytes) -> object` turns it into
    what callers use (e.g. a ctypes library); both are given per call so that one cache serves any
    backend. `disk=False` keeps everything in memory."""

    def __init__(self, directory: str | None = None, *, capacity: int = 256, disk: bool = True):
        self.directory = directory or default_dir()
        self.capacity = capacity
        self.disk = disk
        self._mem: dict[str, OrderedDict] = {}
        self._lock = threading.Lock()
        self._key_locks: dict[str, threading.Lock] = {}
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self.counters = {"hits": 0, "misses": 0, "disk_hits": 0, "compiles": 0, "compile_seconds": 0.0,
                         "corrupt_entries": 0, "evictions": 0, "disk_write_errors": 0}
        self.disk_problem: str | None = None  # why the disk cache is off, when it was asked for
        if disk:
            problem = _prepare_dir(self.directory)
            if problem is not None:
                # Memory only: every build happens in this process, nothing is read from or written
                # to a directory that is unusable or that others could write kernels into.
                self.disk = False
                self.disk_problem = problem
                warn_once(f"cache-dir:{self.directory}:{problem}",
                          f"ms_dynvm: kernel cache directory {self.directory!r} {problem}; kernels are "
                          f"cached in memory only (set DYNVM_CACHE_DIR to a private directory)", stacklevel=3)

    # --- public API -----------------------------------------------------------------------------
    def stats(self) -> dict:
        with self._lock:
            return dict(self.counters)

    def get(self, key: str, device: str = "cpu"):
        """The in-memory object for `key`, or None (no disk access, no counting)."""
        with self._lock:
            lru = self._mem.get(device)
            return lru.get(key) if lru else None

    def has(self, key: str, device: str = "cpu") -> bool:
        """Whether `key` would load without a build: in memory, or an entry on disk (not checked
        here: a corrupted one is found, and rebuilt, by the load). No counting."""
        if self.get(key, device) is not None:
            return True
        return self.disk and os.path.exists(self.path(key))

    def get_or_build(self, key: str, build_fn: Callable[[], bytes], load_fn: Callable[[bytes], object] = bytes,
                     device: str = "cpu"):
        """Memory, then disk, then build (once per key even under concurrency)."""
        obj = self._mem_lookup(key, device, count=True)
        if obj is not None:
            return obj
        with self._key_lock(key):
            obj = self._mem_lookup(key, device, count=False)
            if obj is not None:  # built by the thread we waited for
                self._count("hits")
                return obj
            payload = self._disk_read(key) if self.disk else None
            if payload is not None:
                self._count("disk_hits")
            else:
                self._count("misses")
                t0 = time.perf_counter()
                payload = build_fn()
                with self._lock:
                    self.counters["compiles"] += 1
                    self.counters["compile_seconds"] += time.perf_counter() - t0
                if self.disk:
                    self._disk_write(key, payload)
            obj = load_fn(payload)
            self._mem_insert(key, device, obj)
            return obj

    def submit(self, key: str, build_fn: Callable[[], bytes], load_fn: Callable[[bytes], object] = bytes,
               device: str = "cpu") -> concurrent.futures.Future:
        """`get_or_build` on a background thread; the Future's result is the loaded object."""
        with self._lock:
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="dvm-compile")
            pool = self._pool
        return pool.submit(self.get_or_build, key, build_fn, load_fn, device)

    def path(self, key: str) -> str:
        return os.path.join(self.directory, key[:2], key + ".bin")

    def clear_memory(self) -> None:
        with self._lock:
            self._mem.clear()

    # --- internals ------------------------------------------------------------------------------
    def _count(self, name: str) -> None:
        with self._lock:
            self.counters[name] += 1

    def _key_lock(self, key: str) -> threading.Lock:
        with self._lock:
            return self._key_locks.setdefault(key, threading.Lock())

    def _mem_lookup(self, key: str, device: str, count: bool):
        with self._lock:
            lru = self._mem.get(device)
            if lru is not None and key in lru:
                lru.move_to_end(key)
                if count:
                    self.counters["hits"] += 1
                return lru[key]
        return None

    def _mem_insert(self, key: str, device: str, obj) -> None:
        with self._lock:
            lru = self._mem.setdefault(device, OrderedDict())
            lru[key] = obj
            lru.move_to_end(key)
            while len(lru) > self.capacity:
                lru.popitem(last=False)
                self.counters["evictions"] += 1

    def _disk_read(self, key: str) -> bytes | None:
        path = self.path(key)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return None
        except OSError:
            return None
        payload = unpack(key, data)
        if payload is None:
            self._count("corrupt_entries")
            try:
                os.unlink(path)
            except OSError:
                pass
        return payload

    def _disk_write(self, key: str, payload: bytes) -> None:
        d = os.path.dirname(self.path(key))
        try:
            os.makedirs(d, mode=0o700, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-", suffix=".bin")
        except OSError:  # (the directory became unusable: the artifact stays in memory)
            self._count("disk_write_errors")
            return
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(pack(key, payload))
            # Atomic publish: os.replace is atomic on POSIX, so readers never see a partial entry.
            os.replace(tmp, self.path(key))
        except OSError:
            if os.path.exists(tmp):
                os.unlink(tmp)


def _prepare_dir(d: str) -> str | None:
    """Create the cache directory `d` with mode 0700, or check an existing one: None when it is
    usable, else why not. An existing directory is never chmod'ed (it may be shared, /tmp say);
    it must be ours and not writable by group or others (they could plant a kernel whose hash
    checks), and we must be able to write it."""
    if os.path.exists(d) and not os.path.isdir(d):
        return "is not a directory"
    try:
        if not os.path.isdir(d):
            os.makedirs(d, mode=0o700, exist_ok=True)
            os.chmod(d, 0o700)  # makedirs' mode is masked by the umask
        st = os.stat(d)
    except OSError as e:
        return f"cannot be created ({e.strerror or e})"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    if st.st_uid != os.getuid():
        return "belongs to another user"
    if st.st_mode & 0o022:
        return f"is writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
    if not os.access(d, os.W_OK | os.X_OK):
        return "is not writable"
    return None


_DEFAULT: KernelCache | None = None
_DEFAULT_LOCK = threading.Lock()


def default_cache() -> KernelCache:
    """The process-wide cache (created on first use, in `default_dir()`)."""
    global _DEFAULT
    with _DEFAULT_LOCK:
        if _DEFAULT is None:
            _DEFAULT = KernelCache()
        return _DEFAULT


__all__ = ["KernelCache", "MAGIC", "default_cache", "default_dir", "make_key", "pack", "unpack"]
