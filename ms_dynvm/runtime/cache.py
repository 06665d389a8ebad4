"""Kernel cache: an in-memory LRU per device plus an integrity-checked disk cache.

Keys: `make_key(parts)` is the sha256 of a canonical JSON of everything that determines the binary:
the ms_dynvm version, compiler version and flags, target arch (`platform.machine()`, gcc
`-dumpmachine`), and the canonical IR text of the group with its signature (callers add these).

Disk layout: `<dir>/<key[:2]>/<key>.bin`, `<dir>` = `$DYNVM_CACHE_DIR` or `~/.cache/ms_dynvm`, created
with mode 0700 (kernels are code we will dlopen: other users must not be able to plant one). Each
entry is `MAGIC | sha256(body) | len(body) | body`, body = `key` (utf-8, 64 hex chars) + payload. On
load the magic, length, hash and embedded key are checked before the payload is handed to the
loader; a corrupted, truncated or tampered entry is counted (`corrupt_entries`), deleted and rebuilt.
Writes go to a temp file in the same directory and are published with `os.replace`, which is atomic
on POSIX: a concurrent reader sees the old entry or the new one, never a half-written file.

Concurrency: one build per key at a time (a lock per key); other threads asking for the same key wait
and then get the cached result. `submit` builds on a background thread and returns a Future (tier-up:
the block keeps running eagerly meanwhile).

Counters (`stats()`): hits (memory), disk_hits, misses (neither), compiles, compile_seconds,
corrupt_entries, evictions.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import os
import struct
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

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
                         "corrupt_entries": 0, "evictions": 0}
        if disk:
            os.makedirs(self.directory, mode=0o700, exist_ok=True)
            os.chmod(self.directory, 0o700)  # makedirs' mode is masked by umask and ignored if it exists

    # --- public API -----------------------------------------------------------------------------
    def stats(self) -> dict:
        with self._lock:
            return dict(self.counters)

    def get(self, key: str, device: str = "cpu"):
        """The in-memory object for `key`, or None (no disk access, no counting)."""
        with self._lock:
            lru = self._mem.get(device)
            return lru.get(key) if lru else None

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
        os.makedirs(d, mode=0o700, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-", suffix=".bin")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(pack(key, payload))
            # Atomic publish: os.replace is atomic on POSIX, so readers never see a partial entry.
            os.replace(tmp, self.path(key))
        except OSError:
            if os.path.exists(tmp):
                os.unlink(tmp)


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
