"""The Python module and the framework hooks through ctypes, on the host backend.

Run by tests/capi.rs (python_hooks_through_ctypes) with PORTALLOC_LIBRARY set to the built
cdylib, PYTHONPATH to python/, and an environment selecting a small real host device.
Standard library only. Prints "python_hooks: ok" on success.
"""

import ctypes
import os
import sys
import tempfile

import portalloc
from portalloc import Allocator, PortallocError

MIB = 1 << 20
DONATED = "buffer has been deleted or donated"


def expect_error(status_name, text, fn, *args):
    try:
        fn(*args)
    except PortallocError as e:
        assert e.name == status_name, (e.name, status_name, e.message)
        assert text in e.message, (text, e.message)
        return e
    raise AssertionError("expected %s (%r), the call succeeded" % (status_name, text))


def explicit_allocator():
    with Allocator.create(
        strategy="bfc",
        backend="host",
        host_capacity=64 * MIB,
        host_simulated=True,
        mem_fraction=0.5,
        preallocate=False,
        ignore_env=True,
    ) as a:
        b = a.allocate(1000, tag="buffer")
        w = a.allocate(2 * MIB, tag="workspace")
        assert b.ptr and b.ptr % 256 == 0, b
        assert a.info(b) == (b.ptr, 1000)
        s = a.stats()
        assert s["live_allocations"] == 2 and s["bytes_limit"] == 32 * MIB, s

        # Free, then double free: an error status and message, nothing freed twice.
        a.free(b)
        e = expect_error("INVALID_HANDLE", DONATED, a.free, b)
        assert ("%#018x" % b.handle) in e.message, e.message
        expect_error("UNKNOWN_POINTER", "not the start of a live buffer", a.free_ptr, b.ptr)
        expect_error("INVALID_ARGUMENT", "power of two", a.allocate, 256, 3)
        expect_error("INVALID_ARGUMENT", "invalid size", a.allocate, 2**64 - 1)
        assert a.stats()["live_allocations"] == 1

        # Use after donation: the exact message, naming the handle.
        out = a.donate(w, "output")
        assert out.ptr == w.ptr and out.size == 2 * MIB
        e = expect_error("INVALID_HANDLE", DONATED, a.free, w)
        assert ("%#018x" % w.handle) in e.message and "donated" in e.message
        expect_error("INVALID_HANDLE", DONATED, a.info, w)

        # The ledger JSON parses and matches.
        led = a.ledger()
        assert led["allocator"] == "bfc", led["allocator"]
        assert len(led["live"]) == 1
        live = led["live"][0]
        assert live["tag"] == "output" and live["donated_from"] == "workspace", live
        assert live["ptr"] == out.ptr and live["size"] == 2 * MIB
        tags = {t["tag"]: t for t in led["tags"]}
        assert tags["buffer"]["live"] == 0 and tags["buffer"]["peak_bytes"] == 1000
        assert tags["output"]["donated_in"] == 1 and tags["workspace"]["donated_out"] == 1
        assert led["upstream"]["bytes_in_use"] == a.stats()["bytes_in_use"]

        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "ledger.json")
            a.write_ledger(path)
            assert os.path.getsize(path) > 0

        # Out of memory: a status, with the diagnosis in the message.
        e = expect_error("OUT_OF_MEMORY", "would help", a.allocate, 48 * MIB)
        a.free_ptr(out.ptr)
        assert a.stats()["bytes_in_use"] == 0


def torch_hooks():
    lib = portalloc.load()
    # The two functions CUDAPluggableAllocator loads, called as PyTorch calls them.
    p = lib.portalloc_torch_alloc(MIB, 0, ctypes.c_void_p(0x42))
    assert p, lib.portalloc_last_error()
    ctypes.memset(p, 0x7F, MIB)  # real host memory on the host backend
    led = portalloc.ledger(0)
    torch_live = [x for x in led["live"] if x["tag"] == "torch"]
    assert len(torch_live) == 1 and torch_live[0]["ptr"] == p, led["live"]
    assert torch_live[0]["stream"] == 0x42
    assert portalloc.stats(0)["live_allocations"] == 1
    lib.portalloc_torch_free(p, MIB, 0, None)
    assert portalloc.stats(0)["live_allocations"] == 0
    # Double free through the hook: refused, not freed.
    lib.portalloc_torch_free(p, MIB, 0, None)
    assert b"not the start of a live buffer" in lib.portalloc_last_error()
    assert not lib.portalloc_torch_alloc(-1, 0, None)
    # The global allocator cannot be closed by accident.
    portalloc.global_allocator(0).close()
    assert portalloc.stats(0)["live_allocations"] == 0


def frameworks():
    # Neither PyTorch nor CuPy is needed; install() reports what it found.
    installed = portalloc.install()
    for name in installed:
        assert name in ("torch", "cupy")
    try:
        import torch  # noqa: F401
    except ImportError:
        assert "torch" not in installed


def main():
    explicit_allocator()
    torch_hooks()
    frameworks()
    print("python_hooks: ok (portalloc %s)" % portalloc.load().portalloc_version().decode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
