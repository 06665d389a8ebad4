"""Kernel cache: memory LRU, disk round trip (in a second process: nothing compiles), integrity
checks (corrupted, truncated, tampered and foreign entries are never loaded), the 0700 directory,
atomic writes, one build per key under concurrency, and the asynchronous API."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from ms_dynvm.runtime.cache import KernelCache, make_key, pack, unpack

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def counting_build(payload: bytes = b"payload", delay: float = 0.0):
    calls = []

    def build():
        calls.append(1)
        time.sleep(delay)
        return payload

    return build, calls


def test_directory_is_private(tmp_path, monkeypatch):
    d = tmp_path / "c"
    monkeypatch.setenv("DYNVM_CACHE_DIR", str(d))
    old = os.umask(0o022)
    try:
        KernelCache()
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(d).st_mode) == 0o700


def test_memory_then_disk_then_build(tmp_path):
    key = make_key({"ir": "x"})
    c = KernelCache(str(tmp_path))
    build, calls = counting_build()
    assert c.get_or_build(key, build) == b"payload"
    assert c.get_or_build(key, build) == b"payload"
    assert len(calls) == 1 and c.stats()["hits"] == 1 and c.stats()["compiles"] == 1
    c2 = KernelCache(str(tmp_path))  # fresh memory, same disk
    assert c2.get_or_build(key, build) == b"payload"
    assert len(calls) == 1 and c2.stats()["disk_hits"] == 1 and c2.stats()["compiles"] == 0


def test_key_depends_on_every_part():
    base = {"ms_dynvm": "0.1", "compiler": "gcc 12", "flags": ["-O3"], "arch": "x86_64", "ir": "f"}
    keys = {make_key(base)}
    for k, v in [("ms_dynvm", "0.2"), ("compiler", "gcc 13"), ("flags", ["-O2"]), ("arch", "aarch64"), ("ir", "g")]:
        keys.add(make_key({**base, k: v}))
    assert len(keys) == 6 and make_key(dict(reversed(list(base.items())))) == make_key(base)


@pytest.mark.parametrize("damage", ["flip", "truncate", "tamper_key", "empty", "garbage"])
def test_damaged_entries_are_never_loaded(tmp_path, damage):
    key = make_key({"ir": damage})
    c = KernelCache(str(tmp_path))
    c.get_or_build(key, counting_build(b"good payload")[0])
    path = c.path(key)
    data = open(path, "rb").read()
    if damage == "flip":
        i = len(data) - 3
        data = data[:i] + bytes([data[i] ^ 0x40]) + data[i + 1:]
    elif damage == "truncate":
        data = data[:-5]
    elif damage == "tamper_key":  # a valid entry of another key, moved to this key's file
        data = pack(make_key({"ir": "other"}), b"evil payload")
    elif damage == "empty":
        data = b""
    else:
        data = os.urandom(200)
    with open(path, "wb") as f:
        f.write(data)
    loaded = []
    c2 = KernelCache(str(tmp_path))
    build, calls = counting_build(b"rebuilt")
    assert c2.get_or_build(key, build, load_fn=lambda b: loaded.append(b) or b) == b"rebuilt"
    assert loaded == [b"rebuilt"] and len(calls) == 1
    assert c2.stats()["corrupt_entries"] == 1
    assert unpack(key, open(path, "rb").read()) == b"rebuilt"  # replaced by a good entry


def test_pack_unpack():
    key = make_key({"a": 1})
    blob = pack(key, b"xyz")
    assert unpack(key, blob) == b"xyz"
    assert unpack(make_key({"a": 2}), blob) is None
    assert unpack(key, blob[:-1]) is None


def test_concurrent_builds_of_one_key_compile_once(tmp_path):
    c = KernelCache(str(tmp_path))
    key = make_key({"ir": "concurrent"})
    build, calls = counting_build(delay=0.2)
    results = []
    threads = [threading.Thread(target=lambda: results.append(c.get_or_build(key, build))) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [b"payload"] * 6 and len(calls) == 1 and c.stats()["compiles"] == 1


def test_submit_builds_in_background(tmp_path):
    c = KernelCache(str(tmp_path))
    build, calls = counting_build(delay=0.1)
    main = threading.get_ident()
    seen = []

    def build_elsewhere():
        seen.append(threading.get_ident())
        return build()

    fut = c.submit(make_key({"ir": "async"}), build_elsewhere)
    assert fut.result(timeout=10) == b"payload"
    assert seen and seen[0] != main and len(calls) == 1
    assert c.get(make_key({"ir": "async"})) == b"payload"


def test_lru_evicts_per_device(tmp_path):
    c = KernelCache(str(tmp_path), capacity=2, disk=False)
    for i in range(3):
        c.get_or_build(f"k{i}", lambda i=i: bytes([i]))
    c.get_or_build("k0", lambda: b"x", device="gpu")
    assert c.get("k0") is None and c.get("k2") == bytes([2]) and c.get("k0", "gpu") == b"x"
    assert c.stats()["evictions"] == 1


def test_no_temp_files_left(tmp_path):
    c = KernelCache(str(tmp_path))
    c.get_or_build(make_key({"ir": "t"}), counting_build()[0])
    names = [n for _, _, files in os.walk(tmp_path) for n in files]
    assert names and all(n.endswith(".bin") and not n.startswith(".tmp") for n in names)


_CHILD = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, {root!r})
    import numpy as np
    from ms_dynvm.codegen import compile_group
    from ms_dynvm.runtime.cache import KernelCache
    from tests.codegen.groups import chain, reference
    c = KernelCache({d!r})
    fn = chain()
    k = compile_group(fn, cache=c)
    x = np.linspace(-3, 3, 2 * 784, dtype=np.float32).reshape(2, 784)
    ok = all(np.allclose(o, r, rtol=1e-5, atol=1e-6) for o, r in zip(k([x, x]), reference(fn, [x, x])))
    print(json.dumps({{"stats": c.stats(), "ok": ok, "key": k.key}}))
""")


def test_disk_round_trip_in_a_second_process(tmp_path):
    import json

    d = str(tmp_path / "kc")
    runs = []
    for _ in range(2):
        proc = subprocess.run([sys.executable, "-c", _CHILD.format(root=ROOT, d=d)], capture_output=True,
                              text=True, timeout=120, cwd=ROOT)
        assert proc.returncode == 0, proc.stderr
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    first, second = runs
    assert first["ok"] and second["ok"] and first["key"] == second["key"]
    assert first["stats"]["compiles"] == 1
    assert second["stats"]["compiles"] == 0 and second["stats"]["disk_hits"] == 1


def test_an_existing_shared_directory_is_not_chmoded_nor_used(tmp_path, monkeypatch):
    import warnings

    from ms_dynvm import warn as warn_mod

    monkeypatch.setattr(warn_mod, "_WARNED", set())
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)  # like /tmp
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        c = KernelCache(str(shared))
        KernelCache(str(shared))  # a second cache on it: no second warning
    assert stat.S_IMODE(os.stat(shared).st_mode) == 0o1777
    assert not c.disk and "writable by group or others" in c.disk_problem
    assert len([x for x in w if "kernel cache directory" in str(x.message)]) == 1
    key = make_key({"ir": "shared"})
    build, calls = counting_build()
    assert c.get_or_build(key, build) == b"payload" and c.get_or_build(key, build) == b"payload"
    assert len(calls) == 1 and os.listdir(shared) == []  # memory only


def test_an_unusable_directory_keeps_the_cache_in_memory(tmp_path, monkeypatch):
    from ms_dynvm import warn as warn_mod

    monkeypatch.setattr(warn_mod, "_WARNED", set())
    a_file = tmp_path / "f"
    a_file.write_text("x")
    for d, why in ((a_file, "not a directory"), (a_file / "sub", "cannot be created")):
        with pytest.warns(RuntimeWarning, match="memory only"):
            c = KernelCache(str(d))
        assert not c.disk and why in c.disk_problem
        build, calls = counting_build()
        assert c.get_or_build(make_key({"ir": str(d)}), build) == b"payload"


def test_a_private_existing_directory_is_used_as_it_is(tmp_path):
    d = tmp_path / "mine"
    d.mkdir()
    os.chmod(d, 0o755)
    c = KernelCache(str(d))
    assert c.disk and c.disk_problem is None and stat.S_IMODE(os.stat(d).st_mode) == 0o755


def test_has_sees_memory_and_disk_entries_without_counting(tmp_path):
    key = make_key({"ir": "has"})
    c = KernelCache(str(tmp_path))
    assert not c.has(key)
    build, _ = counting_build()
    c.get_or_build(key, build)
    before = c.stats()
    assert c.has(key)
    c.clear_memory()
    assert c.has(key)  # on disk
    assert not KernelCache(str(tmp_path), disk=False).has(key)
    assert c.stats() == before
