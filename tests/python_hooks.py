"""The Python module and the framework hooks through ctypes, on the host backend.

Run by tests/capi.rs (python_hooks_through_ctypes) against the source tree's module
(PYTHONPATH=python, PORTALLOC_LIBRARY the cdylib it built), and by scripts/test against the
installed package. It selects its small real host device itself (below). Standard library
only. Prints "python_hooks: ok" on success.
"""

import ctypes
import gc
import os
import pathlib
import subprocess
import sys
import tempfile
import threading

# The device the global allocator (the hooks', portalloc.stats()) is made for when first
# used, whatever the caller's environment: 64 MiB of real host memory, half of it usable,
# not preallocated, the default strategy. portalloc reads the environment only then.
os.environ.update(
    PORTALLOC_BACKEND="host",
    PORTALLOC_HOST_CAPACITY="64MiB",
    PORTALLOC_HOST_SIMULATED="false",
    PORTALLOC_MEM_FRACTION="0.5",
    XLA_PYTHON_CLIENT_PREALLOCATE="false",
)
for _name in (
    "XLA_PYTHON_CLIENT_ALLOCATOR",
    "PORTALLOC_ALLOCATOR",
    "XLA_CLIENT_MEM_FRACTION",
    "XLA_PYTHON_CLIENT_MEM_FRACTION",
):
    os.environ.pop(_name, None)

import portalloc  # noqa: E402 (after the environment it reads)
from portalloc import Allocator, PortallocError  # noqa: E402

MIB = 1 << 20
DONATED = "buffer has been deleted or donated"
U64_MAX = 2**64 - 1
INT_MAX = 2**31 - 1
# The options of a small real host device that ignores the environment.
SMALL = dict(
    strategy="bfc",
    backend="host",
    host_capacity=64 * MIB,
    host_simulated=False,
    mem_fraction=0.5,
    preallocate=False,
    ignore_env=True,
)


def expect_error(status_name, text, fn, *args):
    try:
        fn(*args)
    except PortallocError as e:
        assert e.name == status_name, (e.name, status_name, e.message)
        assert text in e.message, (text, e.message)
        return e
    raise AssertionError("expected %s (%r), the call succeeded" % (status_name, text))


def explicit_allocator():
    # Peer access asked for on a single device: nothing to enable, no error.
    with Allocator.create(**dict(SMALL, peer_access=True)) as a:
        a.free(a.allocate(4096, tag="peer"))
    with Allocator.create(**dict(SMALL, host_simulated=True)) as a:
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
    # Inside portalloc.region(name), a thread without a tag of its own — PyTorch's autograd
    # threads in backward() — gets the region's name through the hook; one in a
    # portalloc.tag block gets that block's name.
    made = {}

    def on_a_thread(key, thread_tag=None):
        def run():
            if thread_tag is None:
                made[key] = lib.portalloc_torch_alloc(MIB, 0, None)
            else:
                with portalloc.tag(thread_tag):
                    made[key] = lib.portalloc_torch_alloc(MIB, 0, None)

        t = threading.Thread(target=run)
        t.start()
        t.join()

    with portalloc.region("hook-region"):
        on_a_thread("autograd")
        on_a_thread("tagged", "hook-thread")
    on_a_thread("after")
    tags = {x["ptr"]: x["tag"] for x in portalloc.ledger(0)["live"]}
    assert all(made.values()), made
    assert tags[made["autograd"]] == "hook-region", tags
    assert tags[made["tagged"]] == "hook-thread", tags
    assert tags[made["after"]] == "torch", tags
    for ptr in made.values():
        lib.portalloc_torch_free(ptr, MIB, 0, None)
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


# ---------------------------------------------------------------------------------------
# Hostile input from Python (issue #12): every value the module hands to ctypes is checked
# before ctypes can wrap it around, cut it at a NUL, or turn it into something else.

CHECKS = []


def check(fn):
    CHECKS.append(fn)
    return fn


RANGE_ERRORS = (ValueError, OverflowError)


def refused(kinds, words, fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` raises one of ``kinds`` whose message holds every one of
    ``words`` (the argument, the value, the accepted range) and stays short."""
    try:
        result = fn(*args, **kwargs)
    except kinds as e:
        text = str(e)
        for w in words:
            assert w in text, "%r lacks %r" % (text, w)
        assert len(text) < 400, "an unbounded message (%d chars): %.200s" % (len(text), text)
        return e
    except Exception as e:
        raise AssertionError(
            "%s(%s) raised %s: %s, not %s"
            % (fn.__name__, _args(args, kwargs), type(e).__name__, e, _names(kinds))
        )
    raise AssertionError(
        "%s(%s) was accepted (returned %s), not refused with %s"
        % (fn.__name__, _args(args, kwargs), _short(result), _names(kinds))
    )


def _short(v):
    r = repr(v)
    return r if len(r) < 160 else r[:157] + "..."


def _args(args, kwargs):
    named = ["%s=%s" % (k, _short(v)) for k, v in kwargs.items()]
    return ", ".join([_short(a) for a in args] + named)


def _names(kinds):
    kinds = kinds if isinstance(kinds, tuple) else (kinds,)
    return "/".join(k.__name__ for k in kinds)


def live(a):
    return a.stats()["live_allocations"]


@check
def graph_pools_through_python():
    """Graph pools from Python on the host device, which captures nothing: a pool is made,
    routed and ended, requests outside a capture pass through, its counters stay at zero, it
    is released; a strategy without sleep refuses the pool's sleep; pool numbers and streams
    are unsigned 64-bit integers; an unknown pool is refused with its number."""
    with Allocator.create(**SMALL) as a:
        pool = a.graph_pool("decode graphs")
        a.begin_graph_pool(pool, 0)
        b = a.allocate(MIB)
        a.end_graph_pool(pool)
        assert a.graph_pools() == [{"pool": pool, "held": 0, "in_use": 0, "free": 0}], a.graph_pools()
        a.free(b)
        expect_error("UNSUPPORTED", "sleep and wake", a.sleep_graph_pool, pool)
        assert a.release_graph_pool(pool) == 0
        expect_error("INVALID_ARGUMENT", "graph pool %d" % pool, a.release_graph_pool, pool)
        expect_error("INVALID_ARGUMENT", "no capture is routed", a.end_graph_pool, pool + 1)
        for bad in (-1, 2**64):
            refused(RANGE_ERRORS, ["pool", str(bad)], a.release_graph_pool, bad)
            refused(RANGE_ERRORS, ["stream", str(bad)], a.begin_graph_pool, 1, bad)
        refused(TypeError, ["keep", "True or False"], a.sleep_graph_pool, 1, "yes")
    # The hooks' allocator detects captures itself: none here, so no pool.
    assert portalloc.global_allocator().graph_pools() == []


@check
def sizes_alignments_streams_are_uint64():
    with Allocator.create(**SMALL) as a:
        for bad in (2**64 + 4096, 2**64, -1):
            refused(RANGE_ERRORS, ["size", str(bad), "2**64"], a.allocate, bad)
            refused(RANGE_ERRORS, ["alignment", str(bad), "2**64"], a.allocate, 4096, bad)
            refused(RANGE_ERRORS, ["stream", str(bad), "2**64"], a.allocate, 4096, 0, bad)
        # A value too long to print whole is cut, not dumped.
        e = refused(RANGE_ERRORS, ["size", "..."], a.allocate, 10**500)
        assert len(str(e)) < 300, str(e)
        # Not an integer: refused, not truncated (4096.7 would allocate 4096 bytes).
        refused(TypeError, ["size", "4096.7"], a.allocate, 4096.7)
        refused(TypeError, ["size", "'4096'"], a.allocate, "4096")
        refused(TypeError, ["stream"], a.allocate, 4096, 0, 1.5)
        assert live(a) == 0, a.ledger()["live"]
        # The edges are still served (or refused by the library, not by ctypes).
        b = a.allocate(4096, 2**12, U64_MAX)
        assert b.size == 4096 and b.ptr % 4096 == 0
        expect_error("INVALID_ARGUMENT", "invalid size", a.allocate, U64_MAX)
        a.free(b)


@check
def handles_and_pointers_are_uint64():
    with Allocator.create(**SMALL) as a:
        b = a.allocate(4096)
        # 2**64 + handle would wrap to the live handle and free it.
        for bad in (b.handle + 2**64, -1):
            refused(RANGE_ERRORS, ["handle", str(bad), "2**64"], a.free, bad)
            refused(RANGE_ERRORS, ["handle", str(bad), "2**64"], a.info, bad)
            refused(RANGE_ERRORS, ["handle", str(bad), "2**64"], a.donate, bad)
        refused(TypeError, ["handle"], a.free, float(b.handle))
        for bad in (b.ptr + 2**64, -1, 2**70):
            refused(RANGE_ERRORS, ["ptr", str(bad)], a.free_ptr, bad)
        refused(TypeError, ["ptr"], a.free_ptr, "0x1000")
        assert live(a) == 1 and a.info(b) == (b.ptr, 4096)
        # Another allocator's buffer is refused by the module; its raw handle is refused by
        # the library too (handles are unique among live allocators).
        with Allocator.create(**SMALL) as other:
            theirs = other.allocate(4096)
            assert theirs.handle != b.handle, (theirs, b)
            refused(ValueError, ["another allocator"], a.free, theirs)
            refused(ValueError, ["another allocator"], a.donate, theirs)
            expect_error("INVALID_HANDLE", "not issued by this allocator", lambda: a.free(theirs.handle))
            assert live(other) == 1
        assert live(a) == 1
        a.free(b.handle)


@check
def devices_are_ordinals():
    for bad in (2**32, -1, 2**31, 2**64):
        words = ["device", str(bad), str(INT_MAX)]
        refused(RANGE_ERRORS, words, Allocator.create, device=bad, **SMALL)
        refused(RANGE_ERRORS, words, Allocator.from_env, bad)
        refused(RANGE_ERRORS, words, Allocator.global_allocator, bad)
        refused(RANGE_ERRORS, words, portalloc.global_allocator, bad)
        refused(RANGE_ERRORS, words, portalloc.stats, bad)
    refused(TypeError, ["device"], Allocator.create, device=0.0, **SMALL)
    # An ordinal in range that does not exist is the library's refusal.
    expect_error(
        "INVALID_ARGUMENT", "device 7 does not exist", lambda: Allocator.create(device=7, **SMALL)
    )


@check
def options_are_checked():
    opts = dict(SMALL)
    for bad in (2**64 + 64 * MIB, -1, 0):
        opts["host_capacity"] = bad
        refused(RANGE_ERRORS, ["host_capacity", str(bad), "2**64"], Allocator.create, **opts)
    opts = dict(SMALL)
    for bad in (0, 0.0, -0.5, 1.5, float("nan"), float("inf")):
        opts["mem_fraction"] = bad
        refused(RANGE_ERRORS, ["mem_fraction", repr(bad)], Allocator.create, **opts)
    opts["mem_fraction"] = "0.5"
    refused(TypeError, ["mem_fraction"], Allocator.create, **opts)
    # A tri-state is None, True or False: the string "false" is not true.
    for name in ("preallocate", "host_simulated", "backtrace", "ignore_env", "peer_access"):
        opts = dict(SMALL)
        opts[name] = "false"
        refused(TypeError, [name, "'false'"], Allocator.create, **opts)


@check
def text_is_str_without_nul():
    with Allocator.create(**SMALL) as a:
        refused(ValueError, ["tag", "NUL"], a.allocate, 4096, tag="work\0space")
        refused(TypeError, ["tag", "bytes"], a.allocate, 4096, tag=b"workspace")
        refused(TypeError, ["tag", "int"], a.allocate, 4096, tag=5)
        b = a.allocate(4096, tag="ok")
        refused(ValueError, ["to_tag", "NUL"], a.donate, b, "out\0put")
        refused(TypeError, ["to_tag"], a.donate, b, 7)
        assert [x["tag"] for x in a.ledger()["live"]] == ["ok"], a.ledger()["live"]
        # Non-ASCII text passes whole.
        c = a.allocate(4096, tag="données ✓")
        assert "données ✓" in [x["tag"] for x in a.ledger()["live"]]
        assert c.tag == "données ✓"
        refused(ValueError, ["tag", "Unicode"], a.allocate, 4096, tag="\udcff")
    # The tags that can sleep: a non-empty str without NUL, of at most 1024 bytes.
    for enter in (portalloc.tag, portalloc.region):
        refused(ValueError, ["name = ''", "non-empty"], _enter, enter, "")
        refused(ValueError, ["name", "NUL"], _enter, enter, "wei\0ghts")
        refused(TypeError, ["name", "bytes"], _enter, enter, b"weights")
        refused(PortallocError, ["1025 bytes", "at most 1024"], _enter, enter, "x" * 1025)
    refused(ValueError, ["declare", "non-empty"], portalloc.declare, "")
    refused(TypeError, ["declare", "None"], portalloc.declare, None)
    refused(PortallocError, ["1025 bytes"], portalloc.declare, "x" * 1025)
    portalloc.declare("x" * 1024)
    for name, value in (("strategy", "bfc\0platform"), ("backend", "host\0cuda")):
        opts = dict(SMALL)
        opts[name] = value
        refused(ValueError, [name, "NUL"], Allocator.create, **opts)
        opts[name] = value.encode()
        refused(TypeError, [name], Allocator.create, **opts)


@check
def regions_on_several_threads_interleave():
    # The process has one region tag: that of the block entered last among those still open.
    # Thread A opens "a", thread B opens "b", A leaves first: the tag is still "b", and none
    # once B has left too.
    with Allocator.create(**SMALL) as a:

        def probe():
            got = []
            t = threading.Thread(target=lambda: got.append(a.allocate(4096)))
            t.start()
            t.join()
            tag = [x["tag"] for x in a.ledger()["live"] if x["ptr"] == got[0].ptr]
            assert tag == [got[0].tag], (tag, got)
            a.free(got[0])
            return got[0].tag

        steps = {k: threading.Event() for k in ("a in", "b in", "a out", "b out")}
        leave = {k: threading.Event() for k in ("a", "b")}

        def region(name, after=None):
            if after is not None:
                steps[after].wait(60)
            with portalloc.region(name):
                steps[name + " in"].set()
                leave[name].wait(60)
            steps[name + " out"].set()

        threads = [
            threading.Thread(target=region, args=("a",)),
            threading.Thread(target=region, args=("b", "a in")),
        ]
        for t in threads:
            t.start()
        assert steps["b in"].wait(60)
        assert probe() == "b"
        leave["a"].set()
        assert steps["a out"].wait(60)
        assert probe() == "b", "leaving A's region ended B's"
        leave["b"].set()
        for t in threads:
            t.join()
        assert probe() == "buffer"


def _enter(context, name):
    """Enters and leaves ``context(name)``."""
    with context(name):
        pass


def _ledger_at(path):
    import json

    with open(path, "rb") as f:
        led = json.loads(f.read().decode("utf-8"))
    assert led["allocator"] == "bfc" and "live" in led and "tags" in led, led
    return led


@check
def ledger_paths():
    cwd = os.getcwd()
    with tempfile.TemporaryDirectory() as d, Allocator.create(**SMALL) as a:
        os.chdir(d)  # a mangled relative name would land here, not in the source tree
        try:
            b = a.allocate(4096, tag="on-disk")
            target = os.path.join(d, "sub dir")
            os.mkdir(target)
            as_str = os.path.join(target, "str.json")
            as_bytes = os.fsencode(os.path.join(target, "bytes.json"))
            as_path = pathlib.Path(target) / "path.json"
            as_bytes_path = _BytesPath(os.fsencode(os.path.join(target, "bytespath.json")))
            for p in (as_str, as_bytes, as_path, as_bytes_path):
                a.write_ledger(p)
                where = os.fspath(p)
                assert os.path.exists(where), "write_ledger(%r) wrote %r, not %r" % (
                    p,
                    sorted(os.listdir(d)) + sorted(os.listdir(target)),
                    where,
                )
                assert _ledger_at(where)["live"][0]["tag"] == "on-disk"
            assert sorted(os.listdir(d)) == ["sub dir"], os.listdir(d)
            refused(ValueError, ["path", "NUL"], a.write_ledger, os.path.join(d, "x\0y"))
            refused(ValueError, ["path", "NUL"], a.write_ledger, b"x\0y")
            refused(TypeError, ["path"], a.write_ledger, 5)
            refused(TypeError, ["path"], a.write_ledger, None)
            assert sorted(os.listdir(d)) == ["sub dir"], os.listdir(d)
            a.free(b)
        finally:
            os.chdir(cwd)


class _BytesPath:
    """An os.PathLike whose __fspath__ is bytes."""

    def __init__(self, b):
        self.b = b

    def __fspath__(self):
        return self.b


def vm_kib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1])
    raise AssertionError("no VmSize in /proc/self/status")


def token_live(raw):
    """Whether the C ABI still knows the allocator token ``raw``."""
    lib = portalloc.load()
    s = portalloc._Stats()
    status = lib.portalloc_stats(ctypes.c_void_p(raw), ctypes.byref(s))
    assert status in (0, 6), (status, lib.portalloc_last_error())
    return status == 0


@check
def dropped_allocators_are_destroyed():
    n, size = 200, 8 * MIB
    gc.collect()
    before = vm_kib()
    raws = []
    for _ in range(n):
        a = Allocator.create(**SMALL)
        b = a.allocate(size, tag="dropped")
        raws.append(a._raw.value)
        del a, b
    gc.collect()
    grown = vm_kib() - before
    still = sum(token_live(r) for r in raws)
    assert still == 0 and grown < 20 * size // 1024, (
        "%d of %d allocators dropped without close() are still alive; the process's address "
        "space grew by %d MiB (%d MiB per drop)" % (still, n, grown >> 10, (grown >> 10) // n)
    )


@check
def a_buffer_keeps_its_allocator_alive():
    # The allocator is dropped at once; its buffer's memory must stay valid while the
    # buffer is reachable, and go with it.
    buf = Allocator.create(**SMALL).allocate(MIB, tag="orphan")
    gc.collect()
    raw = buf.allocator._raw.value
    assert token_live(raw)
    ctypes.memset(buf.ptr, 0x5A, MIB)  # real host memory: a destroyed one would be unmapped
    assert buf.allocator.info(buf) == (buf.ptr, MIB)
    del buf
    gc.collect()
    assert not token_live(raw), "the allocator outlived its last buffer"


@check
def close_is_idempotent_and_final():
    a = Allocator.create(**SMALL)
    b = a.allocate(4096)
    raw = a._raw.value
    a.close()
    a.close()
    assert not token_live(raw)
    # A buffer that outlives its allocator never reaches a destroyed one: a clear error.
    for fn, args in ((a.free, (b,)), (a.info, (b,)), (a.stats, ()), (a.allocate, (4096,))):
        e = expect_error("INVALID_ALLOCATOR", "closed", fn, *args)
    # And the C ABI refuses the old token itself (tokens are never reused).
    lib = portalloc.load()
    assert lib.portalloc_free(ctypes.c_void_p(raw), b.handle) == 6
    assert b"not a live portalloc allocator" in lib.portalloc_last_error()
    del a, b, e
    gc.collect()


@check
def the_global_allocator_is_never_destroyed():
    g = Allocator.global_allocator(0)
    raw = g._raw.value
    g.close()
    del g
    gc.collect()
    assert token_live(raw)
    assert portalloc.global_allocator(0)._raw.value == raw


@check
def allocators_left_open_are_destroyed_at_exit():
    # In a child: an atexit handler registered before the allocator runs after portalloc's
    # finalizers, and sees the allocator gone.
    child = r"""
import atexit, ctypes, portalloc
from portalloc import Allocator
def after():
    lib = portalloc.load()
    s = portalloc._Stats()
    st = lib.portalloc_stats(ctypes.c_void_p(raw), ctypes.byref(s))
    print("at exit: status %%d" %% st, flush=True)
atexit.register(after)
a = Allocator.create(**%r)
buf = a.allocate(1 << 20, tag="left open")
raw = a._raw.value
g = portalloc.global_allocator(0)
""" % (SMALL,)
    out = subprocess.run(
        [sys.executable, "-c", child], capture_output=True, text=True, timeout=120
    )
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    assert "at exit: status 6" in out.stdout, text
    assert "Exception" not in out.stderr and "Traceback" not in out.stderr, text


def hostile():
    failed = []
    for fn in CHECKS:
        try:
            fn()
        except Exception as e:
            failed.append(fn.__name__)
            print("FAIL %s: %s: %s" % (fn.__name__, type(e).__name__, e), flush=True)
        else:
            print("ok   %s" % fn.__name__, flush=True)
    assert not failed, "%d hostile-input checks failed: %s" % (len(failed), ", ".join(failed))


def main():
    explicit_allocator()
    torch_hooks()
    frameworks()
    hostile()
    print("python_hooks: ok (portalloc %s)" % portalloc.load().portalloc_version().decode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
