"""CUDA rendering on any machine: every group the GPU tests use (the codegen tests' fused patterns,
several dtypes, and every fused group of the recorded programs) renders to CUDA C, and compiles
with NVRTC where the library is importable (no launch). Also the backend protocol's two adapters."""

from __future__ import annotations

import glob
import os

import numpy as np
import pytest

import ms_dynvm
from ms_dynvm.codegen.backend import CBackend, CudaBackend, get_backend
from ms_dynvm.codegen.cuda import nvrtc
from ms_dynvm.codegen.cuda.kernel import kernel_source, supports
from ms_dynvm.codegen.cuda.render import templates_dir
from ms_dynvm.codegen.spec import CodegenError, lower
from ms_dynvm.ir.function import Function
from ms_dynvm.passes.fuse import fuse
from ms_dynvm.runtime.gpu_executor import _generalised
from tests.codegen import groups
from tests.gpu import cases

PROGRAMS = sorted(glob.glob(os.path.join(os.path.dirname(__file__), "programs", "*.dvm")))


def program_groups():
    out = []
    for path in PROGRAMS:
        prog = ms_dynvm.load_program(path)
        for bi, block in enumerate(prog.blocks):
            if not block.instrs:
                continue
            for k, g in enumerate(fuse(Function.from_block(prog, bi))):
                if g.kind != "single":
                    out.append((f"{os.path.basename(path)}:b{bi}g{k}", _generalised(g.function) or g.function))
    return out


ALL = [(name, fn) for name, fn in cases.named_groups()] + program_groups()


def test_templates_found():
    d = templates_dir()
    for name in ("dvm_common.cuh", "map_nest.cu", "map_step.cu", "row_nest.cu", "index_ops.cu"):
        assert os.path.isfile(os.path.join(d, name))


@pytest.mark.parametrize("name,fn", ALL, ids=[n for n, _ in ALL])
def test_renders_and_compiles(name, fn):
    try:
        spec, source, nests = kernel_source(fn)
    except CodegenError as e:
        assert "fill" in str(e) or "not supported" in str(e), e
        assert not supports(fn)[0]
        return
    assert len(nests) == len(spec.nests) >= 1
    for n in nests:
        assert "void __launch_bounds__" in source and n.name in source
    if not nvrtc.available():
        pytest.skip(f"NVRTC not importable here ({nvrtc.unavailable_reason()}): rendered only")
    art = nvrtc.compile_source(source, 90)
    kind, image = nvrtc.split_artifact(art)
    assert kind == "cubin" and image[:4] == b"\x7fELF"


def test_compile_error_keeps_log_and_source():
    if not nvrtc.available():
        pytest.skip(f"NVRTC not importable here ({nvrtc.unavailable_reason()})")
    with pytest.raises(nvrtc.NvrtcError) as e:
        nvrtc.compile_source('extern "C" __global__ void k() { undefined_thing(); }', 90)
    assert "undefined_thing" in e.value.log and "undefined_thing" in e.value.source


def test_backend_protocol():
    fn = groups.chain()
    for be in (CBackend(), CudaBackend(), get_backend("cuda"), get_backend("cpu")):
        ok, why = be.supports(fn)
        assert ok, why
    spec = lower(fn, eager_math=False)
    src = CudaBackend().render(spec)
    assert "dvm_n0" in src and "float4" in src
    csrc = CBackend().render(lower(fn))
    assert "dvm_kernel" in csrc
    bad = groups.G()
    x = bad.param("f32", (4, 4))
    bad.op("matmul", x, x)
    ok, why = CudaBackend().supports(bad.fn())
    assert not ok and "matmul" in why


def test_run_program_cpu_is_the_interpreter():
    path = PROGRAMS[0]
    prog = ms_dynvm.load_program(path)
    z = np.load(path[:-4] + ".npz")
    ins = [z[f"arr_{i}"] for i in range(len(z.files))]
    out = ms_dynvm.run_program(prog, ins, device="cpu")
    ref = ms_dynvm.interpret(prog, ins)
    for o, r in zip(out, ref):
        np.testing.assert_array_equal(o, r)
    with pytest.raises(ValueError):
        ms_dynvm.run_program(prog, ins, device="tpu")


@pytest.mark.parametrize("name", ["masked_softmax", "masked_softmax_bcast", "layer_norm_gelu", "log_softmax"])
def test_row_nest_keeps_short_rows_in_registers(name):
    """A multi-step row nest gets a register path beside the general one: there every buffer is
    accessed in memory at most once (inputs loaded once, outputs stored once after the last step),
    where the general path re-reads the row in every step."""
    import re

    from ms_dynvm.codegen.cuda.render import ROW_CACHE

    fn = dict(cases.named_groups())[name]
    spec, source, nests = kernel_source(fn)
    nid = next(i for i, n in enumerate(nests) if n.kind == "row")
    assert len(spec.nests[nid].steps) >= 2
    body = source[source.index(f"dvm_n{nid}("):]
    assert f"* {ROW_CACHE}) {{" in body
    fast, general = body.split("} else {", 1)

    def accesses(text, buf):
        return len(re.findall(rf"(?<!\w){buf}\[", text))

    reread = 0
    for b in spec.buffers:
        assert accesses(fast, b.name) <= 1, (b.name, fast)
        reread += accesses(general, b.name) > 1
    assert reread >= 1  # the general path does read something twice: the register path saves that
