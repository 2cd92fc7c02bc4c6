"""The Python module and its framework hooks from the caller's side, over the CUDA conformance
driver (fakecuda): the caller's current context, the caller's streams and kernels still in
flight, CuPy's current stream, record_stream, and close() racing an allocation.

Run by tests/capi.rs (python_streams_over_fakecuda) with the environment it needs: the
module of the source tree (PYTHONPATH=python), PORTALLOC_LIBRARY the cdylib it built,
PORTALLOC_BACKEND=cuda and PORTALLOC_CUDA_LIBRARY a private copy of fakecuda with two
devices. Standard library only; PyTorch and CuPy are stood in for by the few attributes the
module asks of them. Prints "python_streams: ok" on success.
"""

import ctypes
import os
import sys
import threading
import time
import types

import portalloc
from portalloc import PortallocError

MIB = 1 << 20
fake = ctypes.CDLL(os.environ["PORTALLOC_CUDA_LIBRARY"])
P = ctypes.c_void_p
for name, restype, argtypes in [
    ("cuInit", ctypes.c_int, [ctypes.c_uint]),
    ("cuDevicePrimaryCtxRetain", ctypes.c_int, [ctypes.POINTER(P), ctypes.c_int]),
    ("cuDevicePrimaryCtxRelease", ctypes.c_int, [ctypes.c_int]),
    ("cuCtxSetCurrent", ctypes.c_int, [P]),
    ("cuCtxGetCurrent", ctypes.c_int, [ctypes.POINTER(P)]),
    ("cuStreamCreate", ctypes.c_int, [ctypes.POINTER(P), ctypes.c_uint]),
    ("cuStreamDestroy_v2", ctypes.c_int, [P]),
    ("fake_launch", ctypes.c_uint64, [P, ctypes.c_uint64, ctypes.c_uint64]),
    ("fake_finish", None, [ctypes.c_uint64]),
    ("fake_ordered", ctypes.c_int, [ctypes.c_uint64, P]),
    ("fake_hazards", ctypes.c_longlong, []),
    ("fake_first_hazard", ctypes.c_char_p, []),
    ("fake_pause", None, [ctypes.c_char_p]),
    ("fake_resume", None, []),
    ("fake_waiting", ctypes.c_int, []),
]:
    f = getattr(fake, name)
    f.restype, f.argtypes = restype, argtypes

assert fake.cuInit(0) == 0


def current():
    ctx = P()
    assert fake.cuCtxGetCurrent(ctypes.byref(ctx)) == 0
    return ctx.value or 0


def primary(device):
    ctx = P()
    assert fake.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), device) == 0
    return ctx.value


def stream():
    s = P()
    assert fake.cuStreamCreate(ctypes.byref(s), 0) == 0
    return s.value


def overlaps(a, b, size):
    return a < b + size and b < a + size


# The caller's own context: device 0's for its streams, and device 1's current around every
# portalloc call (torch.cuda.set_device(1) while a device-0 tensor is freed).
home, theirs = primary(0), primary(1)
assert fake.cuCtxSetCurrent(home) == 0
S, T, U = stream(), stream(), stream()


def kept(call, *args):
    """Calls portalloc with the caller's device 1 current: it must stay current."""
    assert fake.cuCtxSetCurrent(theirs) == 0
    try:
        return call(*args)
    finally:
        now = current()
        assert fake.cuCtxSetCurrent(home) == 0
        name = getattr(call, "__name__", repr(call))
        assert now == theirs, "%s changed the caller's current context" % name


lib = portalloc.load()


def current_device():
    # The first call opens the device: through the hook, as PyTorch's first tensor does.
    p = kept(lib.portalloc_torch_alloc, 4096, 0, S)
    assert p, lib.portalloc_last_error()
    kept(lib.portalloc_torch_free, p, 4096, 0, S)
    g = kept(portalloc.global_allocator, 0)
    b = kept(g.allocate, MIB, 0, T, "kept")
    kept(g.free, b)
    kept(g.stats)
    kept(g.trim)


def cupy_uses_its_current_stream():
    # CuPy's current stream is S: the hook allocates for S, and frees on S when CuPy drops
    # the memory.
    cuda = types.SimpleNamespace()
    cuda.Device = lambda: types.SimpleNamespace(id=0)
    cuda.get_current_stream = lambda: types.SimpleNamespace(ptr=S)
    made = []

    def unowned(ptr, size, owner, device_id=0):
        made.append((ptr, size, owner))
        return types.SimpleNamespace(ptr=ptr, owner=owner)

    cuda.memory = types.SimpleNamespace(
        UnownedMemory=unowned, MemoryPointer=lambda memory, offset: memory
    )
    cuda.set_allocator = lambda f: None
    sys.modules["cupy"] = types.SimpleNamespace(cuda=cuda)
    try:
        malloc = portalloc.install_cupy()
        m = kept(malloc, MIB)
        ptr = m.ptr
        led = portalloc.ledger(0)
        mine = [x for x in led["live"] if x["ptr"] == ptr]
        assert mine and mine[0]["stream"] == S, (mine, S)
        # CuPy's kernel on S reads it while CuPy drops it.
        kernel = fake.fake_launch(S, ptr, MIB)
        del m, made[:]
        # Another stream asks: it gets that memory only ordered after the kernel.
        g = portalloc.global_allocator(0)
        other = kept(g.allocate, MIB, 0, T, "t")
        assert not overlaps(other.ptr, ptr, MIB) or fake.fake_ordered(kernel, T) == 1, (
            "memory CuPy's kernel on its stream still reads went to another stream"
        )
        fake.fake_finish(kernel)
        kept(g.free, other)
    finally:
        del sys.modules["cupy"]


def record_stream_replaces_torchs():
    # A tensor of the hook on T, used by a kernel on the side stream U, then dropped.
    p = kept(lib.portalloc_torch_alloc, MIB, 0, T)
    assert p, lib.portalloc_last_error()
    storage = types.SimpleNamespace(data_ptr=lambda: p)
    tensor = types.SimpleNamespace(
        untyped_storage=lambda: storage, device=types.SimpleNamespace(index=0)
    )
    import portalloc.torch as pt

    kept(pt.record_stream, tensor, types.SimpleNamespace(cuda_stream=U))
    kernel = fake.fake_launch(U, p, MIB)
    kept(lib.portalloc_torch_free, p, MIB, 0, T)
    for st in (T, S):
        q = kept(lib.portalloc_torch_alloc, MIB, 0, st)
        assert q, lib.portalloc_last_error()
        assert not overlaps(q, p, MIB) or fake.fake_ordered(kernel, st) == 1, (
            "memory the side stream's kernel still reads was handed out again"
        )
        kept(lib.portalloc_torch_free, q, MIB, 0, st)
    fake.fake_finish(kernel)
    # Not a buffer of portalloc's: refused, by name.
    storage.data_ptr = lambda: 0x1234
    try:
        pt.record_stream(tensor, U)
    except PortallocError as e:
        assert e.name == "UNKNOWN_POINTER", e
    else:
        raise AssertionError("record_stream took a pointer portalloc never handed out")
    # An empty tensor holds no memory (its storage's pointer is 0): accepted and nothing to
    # record, as PyTorch's own record_stream accepts it.
    storage.data_ptr = lambda: 0
    kept(pt.record_stream, tensor, U)


def close_racing_allocate():
    # The allocation is held inside the driver's cuMemAlloc while close() runs to its end:
    # it must fail cleanly (INVALID_ALLOCATOR), not return memory close() freed.
    a = kept(
        lambda: portalloc.Allocator.create(strategy="platform", backend="cuda", mem_fraction=0.5)
    )
    got = {}

    def allocate():
        try:
            got["buffer"] = a.allocate(MIB, 0, S, "racing")
        except PortallocError as e:
            got["error"] = e

    fake.fake_pause(b"cuMemAlloc_v2")
    t = threading.Thread(target=allocate)
    t.start()
    deadline = time.time() + 10
    while fake.fake_waiting() == 0:
        assert time.time() < deadline, "the allocation never reached cuMemAlloc"
        time.sleep(0.001)
    a.close()
    fake.fake_resume()
    t.join()
    assert "buffer" not in got, "an allocation racing close() returned %r" % got.get("buffer")
    assert got["error"].name == "INVALID_ALLOCATOR", got["error"]


def main():
    current_device()
    cupy_uses_its_current_stream()
    record_stream_replaces_torchs()
    close_racing_allocate()
    hazards = fake.fake_hazards()
    assert hazards == 0, fake.fake_first_hazard()
    assert current() == home
    for s in (S, T, U):
        assert fake.cuStreamDestroy_v2(s) == 0
    print("python_streams: ok")


main()
