"""Contract tests: the calls CupyDevice makes, checked against the real CuPy 14 and NCCL wheels
(`cupy-cuda13x`, `nvidia-nccl-cu13`, installed by the test extra), which import without a GPU.
Where a call needs a device, the test checks that the argument TYPES get through the typed
(Cython) signature -- a wrong type fails with TypeError before any CUDA call, a right one
fails later for want of a GPU. And the strict double (cuda_double.py) must take the same
parameters as the library it stands in for."""

from __future__ import annotations

import inspect
import re

import numpy as np
import pytest
from cuda_double import FakeNcclCommunicator

from coconet.runtime.cuda import CupyDevice
from coconet.runtime.transport import NCCL_DTYPES, NCCL_OPS

cupy = pytest.importorskip("cupy", reason="the cuda test extra installs cupy-cuda13x")
nccl = pytest.importorskip("cupy.cuda.nccl")
if not getattr(nccl, "available", False):  # pragma: no cover - the test extra brings NCCL
    pytest.skip("NCCL is not installed (nvidia-nccl-cu13)", allow_module_level=True)


def _signature(doc: str | None) -> list[str]:
    """Parameter names from a Cython docstring signature 'f(self, int a, bytes b=None)'."""
    assert doc, "the function has no embedded signature"
    m = re.match(r"[\w.]+\((.*?)\)", doc.strip().splitlines()[0])
    assert m, doc.splitlines()[0]
    names = []
    for p in m.group(1).split(","):
        p = p.strip().split("=")[0].strip()
        if p and p not in ("self", "*"):
            names.append(p.split()[-1].lstrip("*"))
    return names


def test_cupy_is_14():
    assert int(cupy.__version__.split(".")[0]) == 14


def test_unique_ids_are_bytes():
    uid = nccl.get_unique_id()
    assert isinstance(uid, bytes)
    assert len(uid) == 128


def test_the_communicator_takes_bytes_and_refuses_a_tuple():
    uid = nccl.get_unique_id()
    with pytest.raises(TypeError):
        nccl.NcclCommunicator(1, tuple(uid), 0)  # what the backend passed before CuPy 14


def test_cupy_device_passes_the_unique_id_through_the_typed_signature():
    device = object.__new__(CupyDevice)
    device.nccl_mod = nccl
    try:
        device.nccl_comm(nccl.get_unique_id(), 1, 0)
    except TypeError as e:  # the argument types were refused
        pytest.fail(f"CupyDevice.nccl_comm passes a type NCCL refuses: {e}")
    except Exception as e:
        assert "commId" not in str(e)


@pytest.mark.parametrize(
    "method",
    ["allReduce", "reduceScatter", "allGather", "broadcast", "reduce", "send", "recv"],
)
def test_the_double_takes_the_parameters_of_the_real_communicator(method):
    real = _signature(getattr(nccl.NcclCommunicator, method).__doc__)
    fake = [p for p in inspect.signature(getattr(FakeNcclCommunicator, method)).parameters][1:]
    assert fake == real


def test_the_double_constructor_matches():
    real = _signature(nccl.NcclCommunicator.__doc__)
    assert real[:3] == ["ndev", "commId", "rank"]


def test_nccl_enums_are_the_numbers_the_backend_sends():
    for name, code in NCCL_DTYPES.items():
        assert getattr(nccl, f"NCCL_{name.upper()}") == code
    for name, code in NCCL_OPS.items():
        assert getattr(nccl, f"NCCL_{name.upper()}") == code


def test_the_cupy_calls_of_cupy_device_exist_with_these_parameters():
    rt, drv = cupy.cuda.runtime, cupy.cuda.driver
    assert _signature(rt.memsetAsync.__doc__) == ["ptr", "value", "size", "stream"]
    assert _signature(rt.ipcOpenMemHandle.__doc__)[0] == "handle"
    assert _signature(rt.deviceCanAccessPeer.__doc__) == ["device", "peerDevice"]
    assert _signature(rt.deviceSynchronize.__doc__) == []
    assert _signature(drv.occupancyMaxActiveBlocksPerMultiprocessor.__doc__) == [
        "func",
        "blockSize",
        "dynamicSMemSize",
    ]
    raw_module = cupy.RawModule.__doc__.strip().splitlines()[0]
    assert "str path=None" in raw_module
    assert "bool enable_cooperative_groups" in raw_module
    asnumpy = inspect.signature(cupy.asnumpy).parameters
    assert "stream" in asnumpy
    assert "blocking" in asnumpy
    assert _signature(cupy.ndarray.set.__doc__) == ["arr", "stream"]
    assert hasattr(cupy.cuda.Device, "pci_bus_id")
    assert "ptr" in dir(cupy.cuda.function.Function)
    # CUDA graphs (CupyDevice.begin_capture / end_capture / replay)
    assert _signature(cupy.cuda.Stream.begin_capture.__doc__) == ["mode"]
    assert _signature(cupy.cuda.Stream.end_capture.__doc__) == []
    assert _signature(cupy.cuda.graph.Graph.launch.__doc__) == ["stream"]


def test_cupy_knows_bf16_as_ml_dtypes():
    import ml_dtypes

    assert np.dtype(ml_dtypes.bfloat16).itemsize == 2
    # CuPy 14's dtype machinery accepts ml_dtypes' bfloat16 (what from_dlpack returns for it)
    assert cupy.dtype(ml_dtypes.bfloat16) == np.dtype(ml_dtypes.bfloat16)


def test_the_cuda_extra_brings_nccl_cublas_and_a_matching_nvrtc():
    """`pip install coconet[cuda]` must bring everything the backend loads: CuPy 14 with its
    toolkit wheels (cuBLAS for matmul, NVRTC for CuPy's own kernels), NCCL, MPI; and an NVRTC
    that cannot drift past the CUDA 13 driver."""
    from importlib.metadata import requires

    from packaging.requirements import Requirement

    reqs = [Requirement(r) for r in requires("coconet") or []]
    cuda = {r.name: r for r in reqs if r.marker and r.marker.evaluate({"extra": "cuda"})}
    assert "ctk" in cuda["cupy-cuda13x"].extras
    assert not cuda["cupy-cuda13x"].specifier.contains("15.0")
    assert "nvidia-nccl-cu13" in cuda
    assert "mpi4py" in cuda
    assert "mpich" in cuda
    for r in reqs:
        if r.name == "nvidia-cuda-nvrtc":
            assert not r.specifier.contains("14.0"), r
