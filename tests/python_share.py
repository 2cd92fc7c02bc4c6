"""Buffers shared between Python processes: ``Allocator.export`` in a parent, the handle
pickled through ``multiprocessing`` (the spawn start method) to children that
``portalloc.import_handle`` it and answer a checksum of the bytes they see.

Run by tests/capi.rs (python_share_through_multiprocessing) against the source tree's module
(PYTHONPATH=python, PORTALLOC_LIBRARY the cdylib it built), and by tests/python_package.py
against the installed package. Each process makes the same small real host device (the
device of a handle is checked at import: host devices of one capacity are one device).
Standard library only. Prints "python_share: ok" on success.
"""

import ctypes
import hashlib
import multiprocessing
import os
import pickle
import sys

import portalloc
from portalloc import Allocator, PortallocError, ShareHandle

MIB = 1 << 20


def device(strategy):
    """An allocator of ``strategy`` on 64 MiB of real host memory, ignoring the environment."""
    return Allocator.create(
        strategy=strategy,
        backend="host",
        host_capacity=64 * MIB,
        host_simulated=False,
        mem_fraction=0.5,
        preallocate=False,
        ignore_env=True,
    )


def pattern(n, seed):
    return bytes((i * 7 + seed + i // 4096) % 256 for i in range(n))


def child_checksum(strategy, handle):
    """In a spawned child: imports ``handle`` (unpickled), returns what it sees."""
    assert isinstance(handle, ShareHandle), type(handle)
    with device(strategy) as a:
        with portalloc.import_handle(handle, a) as imported:
            assert imported.size == handle.size, (imported, handle)
            seen = ctypes.string_at(imported.ptr, imported.size)
            return (
                os.getpid(),
                imported.exporter_pid,
                imported.size,
                hashlib.sha256(seen).hexdigest(),
            )


def child_holds(strategy, handle, ready, go, answers):
    """In a spawned child: imports ``handle``, says so, waits while the exporter frees the
    buffer, then checks the bytes are still there and closes."""
    with device(strategy) as a:
        imported = portalloc.import_handle(handle, a)
        before = hashlib.sha256(ctypes.string_at(imported.ptr, imported.size)).hexdigest()
        ready.set()
        assert go.wait(60), "the parent never freed"
        after = hashlib.sha256(ctypes.string_at(imported.ptr, imported.size)).hexdigest()
        imported.close()
        imported.close()  # again: nothing
        assert imported.closed
        answers.put((before, after))


def expect(status_name, words, fn, *args):
    try:
        fn(*args)
    except PortallocError as e:
        assert e.name == status_name, (e.name, status_name, str(e))
        assert words in e.message, (words, e.message)
        return
    raise AssertionError("no %s error from %s" % (status_name, fn))


def round_trips(context, strategy):
    with device(strategy) as a:
        sizes = [MIB, 3 * MIB + 100, 4096]
        buffers = [a.allocate(n, tag="weights") for n in sizes]
        expected = []
        for i, b in enumerate(buffers):
            data = pattern(b.size, i)
            ctypes.memmove(b.ptr, data, len(data))
            expected.append(hashlib.sha256(data).hexdigest())
        handles = [a.export(b) for b in buffers]
        assert a.export(buffers[0].ptr) == handles[0], "exporting again gives the same handle"
        for b, h in zip(buffers, handles):
            assert (h.size, h.exporter_pid) == (b.size, os.getpid()), h
            assert h.kind == ("mapped" if strategy == "vmm" else "plain"), h
            assert pickle.loads(pickle.dumps(h)) == h

        # This process's own export is not imported (use the buffer itself).
        expect("SHARE", "this process's own", portalloc.import_handle, handles[0], a)

        with context.Pool(2) as pool:
            answers = pool.starmap(child_checksum, [(strategy, h) for h in handles])
        for (pid, exporter, size, digest), b, want in zip(answers, buffers, expected):
            assert pid != os.getpid()
            assert (exporter, size, digest) == (os.getpid(), b.size, want), (answers, b)

        # Freed while a child holds the import: kept, the child's bytes unchanged, then
        # handed back once it closed.
        ready, go, replies = context.Event(), context.Event(), context.Queue()
        child = context.Process(
            target=child_holds, args=(strategy, handles[1], ready, go, replies)
        )
        child.start()
        assert ready.wait(60), "the child did not import"
        a.free(buffers[1])
        assert a.settle() == 1, "the freed buffer is kept for its importer"
        go.set()
        before, after = replies.get(timeout=60)
        child.join(60)
        assert child.exitcode == 0, child.exitcode
        assert before == after == expected[1], (before, after)
        assert a.settle() == 0

        # Freed with no importer: the export is withdrawn.
        a.free(buffers[2])
        with context.Pool(1) as pool:
            try:
                pool.apply(child_checksum, (strategy, handles[2]))
            except PortallocError as e:
                assert e.name == "SHARE", e
            else:
                raise AssertionError("a withdrawn export was imported")
        a.free(buffers[0])


def hostile_handles():
    with device("vmm") as a:
        b = a.allocate(MIB)
        good = bytes(a.export(b))
        for bad, error in [(b"", ValueError), (b"x" * 200, ValueError), (3, TypeError)]:
            try:
                ShareHandle(bad)
            except error:
                pass
            else:
                raise AssertionError("ShareHandle(%r) accepted" % (bad,))
        # The library checks every field: a cut handle names what is wrong.
        expect("INVALID_ARGUMENT", "bytes of pieces", portalloc.import_handle, good[:-1], a)
        expect("UNKNOWN_POINTER", "", a.export, b.ptr + 4096)
        a.free(b)
    # The simulated host device offers no interprocess handles.
    with Allocator.create(
        strategy="bfc", backend="host", host_capacity=64 * MIB, host_simulated=True,
        ignore_env=True,
    ) as sim:
        b = sim.allocate(MIB)
        expect("UNSUPPORTED", "", sim.export, b)


def main():
    context = multiprocessing.get_context("spawn")
    hostile_handles()
    print("ok   hostile_handles", flush=True)
    for strategy in ("vmm", "bfc"):
        round_trips(context, strategy)
        print("ok   round_trips %s" % strategy, flush=True)
    print("python_share: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
