"""NVRTC through cuda-python (`cuda.bindings.nvrtc`): CUDA C++ source -> cubin for the device's
architecture, or PTX where this NVRTC cannot emit a cubin for it (the driver JIT-compiles PTX).

`compile_source(source, arch, options)` returns the artifact as bytes prefixed by its kind
(b"CUBIN\\0" or b"PTX\\0\\0\\0"), which is what the kernel cache stores; `split_artifact` undoes it. On a
compile error `NvrtcError` carries the compile log and the source (also written to
`$DYNVM_DUMP_DIR/nvrtc_error_<hash>.cu` when that is set). `available()` says whether NVRTC loads
(no GPU is needed to compile: CI renders and compiles every kernel the GPU tests generate).
"""

from __future__ import annotations

import hashlib
import os

CUBIN, PTX = b"CUBIN\0", b"PTX\0\0\0"


class NvrtcError(RuntimeError):
    def __init__(self, message: str, log: str = "", source: str = ""):
        super().__init__(message + ("\n" + log if log else ""))
        self.log = log
        self.source = source


_STATE: dict = {}


def _nvrtc():
    if "mod" not in _STATE:
        try:
            from cuda.bindings import nvrtc

            err, major, minor = nvrtc.nvrtcVersion()
            if int(err) != 0:
                raise RuntimeError(f"nvrtcVersion: {err}")
            _STATE["mod"] = nvrtc
            _STATE["version"] = (int(major), int(minor))
            err, archs = nvrtc.nvrtcGetSupportedArchs()
            _STATE["archs"] = [int(a) for a in archs] if int(err) == 0 else []
            _STATE["why"] = ""
        except Exception as e:  # ImportError, or the library is missing (cuda.pathfinder's error)
            _STATE["mod"] = None
            _STATE["version"] = None
            _STATE["archs"] = []
            _STATE["why"] = f"{type(e).__name__}: {e}".splitlines()[0]
    return _STATE["mod"]


def available() -> bool:
    return _nvrtc() is not None


def unavailable_reason() -> str:
    _nvrtc()
    return _STATE["why"]


def version() -> tuple | None:
    _nvrtc()
    return _STATE["version"]


def supported_archs() -> list:
    _nvrtc()
    return list(_STATE["archs"])


def _check(err, what: str) -> None:
    if int(err) != 0:
        raise NvrtcError(f"{what}: {err}")


def compile_source(source: str, arch: int, options: list | tuple = ()) -> bytes:
    """Compile `source` for compute capability `arch` (e.g. 90) with extra NVRTC `options`."""
    nvrtc = _nvrtc()
    if nvrtc is None:
        raise NvrtcError(f"NVRTC is not available ({_STATE['why']})")
    cubin = arch in _STATE["archs"]
    target = f"--gpu-architecture={'sm' if cubin else 'compute'}_{arch}"
    opts = [target, "-std=c++17", "-default-device", "-diag-suppress=177", *options]
    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), b"dvm_kernel.cu", 0, [], [])
    _check(err, "nvrtcCreateProgram")
    try:
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), [o.encode() for o in opts])
        if int(err) != 0:
            log = _log(nvrtc, prog)
            digest = hashlib.sha256(source.encode()).hexdigest()[:16]
            dump = os.environ.get("DYNVM_DUMP_DIR")
            if dump:
                os.makedirs(dump, exist_ok=True)
                with open(os.path.join(dump, f"nvrtc_error_{digest}.cu"), "w") as f:
                    f.write(source + "\n/* options: " + " ".join(opts) + "\n" + log + "\n*/\n")
            raise NvrtcError(f"NVRTC compile failed ({err}; source sha256 {digest})", log, source)
        if cubin:
            err, n = nvrtc.nvrtcGetCUBINSize(prog)
            _check(err, "nvrtcGetCUBINSize")
            buf = bytearray(n)
            (err,) = nvrtc.nvrtcGetCUBIN(prog, buf)
            _check(err, "nvrtcGetCUBIN")
            return CUBIN + bytes(buf)
        err, n = nvrtc.nvrtcGetPTXSize(prog)
        _check(err, "nvrtcGetPTXSize")
        buf = bytearray(n)
        (err,) = nvrtc.nvrtcGetPTX(prog, buf)
        _check(err, "nvrtcGetPTX")
        return PTX + bytes(buf)
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def _log(nvrtc, prog) -> str:
    err, n = nvrtc.nvrtcGetProgramLogSize(prog)
    if int(err) != 0 or n <= 1:
        return ""
    buf = bytearray(n)
    nvrtc.nvrtcGetProgramLog(prog, buf)
    return bytes(buf).rstrip(b"\0").decode(errors="replace")


def split_artifact(payload: bytes) -> tuple[str, bytes]:
    """("cubin" | "ptx", image) of a cached artifact."""
    if payload.startswith(CUBIN):
        return "cubin", payload[len(CUBIN):]
    if payload.startswith(PTX):
        return "ptx", payload[len(PTX):]
    raise ValueError("not an NVRTC artifact")


__all__ = ["NvrtcError", "available", "compile_source", "split_artifact", "supported_archs", "unavailable_reason",
           "version"]
