"""The installed package, as a pip user has it.

Run by scripts/test with the python of a fresh virtual environment into which it installed
`./python` (`pip install ./python`), from a directory outside the source tree and without
PORTALLOC_LIBRARY or PYTHONPATH: what is imported must be the installed package, with the
library inside it. Standard library only. Prints "python_package: ok" on success.
"""

import ast
import importlib.metadata
import inspect
import os
import pathlib
import subprocess
import sys
import typing

SOURCE_TREE = pathlib.Path(__file__).resolve().parents[1]

import portalloc  # noqa: E402

PACKAGE = pathlib.Path(portalloc.__file__).resolve().parent

# The command of the README (and of issue #15's "done when"), as a user types it.
README_COMMAND = (
    "import portalloc; a = portalloc.Allocator.create(backend='host', host_simulated=True, "
    "host_capacity=1 << 30, ignore_env=True); print(a.stats())"
)


def imported_from_the_virtual_environment():
    assert sys.prefix != sys.base_prefix, "not a virtual environment: %s" % sys.prefix
    assert pathlib.Path(sys.prefix).resolve() in PACKAGE.parents, (PACKAGE, sys.prefix)
    source_package = SOURCE_TREE / "python"
    assert source_package not in PACKAGE.parents, "imported from the source: %s" % PACKAGE
    assert pathlib.Path.cwd().resolve() != SOURCE_TREE, "run from inside the source tree"


def the_library_is_inside_the_package():
    assert "PORTALLOC_LIBRARY" not in os.environ, "scripts/test must not set it"
    library = pathlib.Path(portalloc.library_path())
    assert library.parent == PACKAGE, (library, PACKAGE)
    portalloc.load()
    assert portalloc._lib_path == str(library), portalloc._lib_path


def the_version_comes_from_cargo():
    # portalloc_version() is the crate's CARGO_PKG_VERSION (tests/capi.rs checks that).
    library_version = portalloc.load().portalloc_version().decode()
    installed = importlib.metadata.version("portalloc")
    assert portalloc.__version__ == installed == library_version, (
        portalloc.__version__,
        installed,
        library_version,
    )


def public_functions():
    """Every public function and method: the names in ``__all__`` and their methods."""
    for name in portalloc.__all__:
        value = getattr(portalloc, name)
        if inspect.isfunction(value):
            yield name, value
        elif inspect.isclass(value) and value.__module__ == "portalloc":
            for member_name, member in vars(value).items():
                member = getattr(member, "__func__", member)  # classmethods
                member = getattr(member, "fget", member)  # properties
                if inspect.isfunction(member) and not member_name.startswith("_"):
                    yield "%s.%s" % (name, member_name), member
                elif member_name == "__init__" and inspect.isfunction(member):
                    yield "%s.__init__" % name, member


def every_public_function_is_typed():
    assert (PACKAGE / "py.typed").is_file(), "py.typed is not installed"
    checked = 0
    for name, fn in public_functions():
        hints = typing.get_type_hints(fn)
        parameters = [
            p
            for p in inspect.signature(fn).parameters.values()
            if p.name not in ("self", "cls")
        ]
        missing = [p.name for p in parameters if p.name not in hints]
        assert not missing, "%s: no type hint for %s" % (name, ", ".join(missing))
        assert "return" in hints, "%s: no return type" % name
        checked += 1
    assert checked >= 25, "only %d public functions found" % checked


def the_readme_command_works_from_the_root_directory():
    environment = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PORTALLOC_", "XLA_")) and k != "PYTHONPATH"
    }
    out = subprocess.run(
        [sys.executable, "-c", README_COMMAND],
        cwd="/",
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    print("from /: %s" % out.stdout.strip())
    stats = ast.literal_eval(out.stdout.strip())
    assert set(stats) == set(portalloc.Stats.__annotations__), stats
    assert stats["live_allocations"] == 0 and stats["bytes_in_use"] == 0, stats
    assert 0 < stats["bytes_limit"] <= 1 << 30, stats


def sleep_and_wake_keep_the_pointer_and_the_bytes():
    """The feature's "done when", through the installed package on the host backend (real
    memory) with vmm: two tagged buffers written; the weights put to sleep lower the pool by
    their size and leave the KV cache as it was; with the device filled, their wake raises
    and loses nothing; after freeing, the wake restores the same pointer with the same
    bytes; the KV cache discarded and woken; a tensor-like buffer tagged by
    ``portalloc.tag`` sleeps with its tag."""
    import ctypes

    mib = 1 << 20
    a = portalloc.Allocator.create(
        strategy="vmm",
        backend="host",
        host_simulated=False,
        host_capacity=256 * mib,
        mem_fraction=0.75,
        ignore_env=True,
    )
    weights = a.allocate(64 * mib, tag="weights")
    kv = a.allocate(32 * mib, tag="kv")
    w_bytes = bytes(range(256)) * (64 * mib // 256)
    kv_bytes = bytes(reversed(range(256))) * (32 * mib // 256)
    ctypes.memmove(weights.ptr, w_bytes, len(w_bytes))
    ctypes.memmove(kv.ptr, kv_bytes, len(kv_bytes))
    before = a.stats()["pool_bytes"]
    a.sleep("weights")
    after = a.stats()
    assert before - after["pool_bytes"] >= 64 * mib, (before, after)
    assert after["bytes_asleep"] == 64 * mib and after["host_bytes_asleep"] == 64 * mib, after
    assert ctypes.string_at(kv.ptr, len(kv_bytes)) == kv_bytes, "kv changed"
    fillers = []
    try:
        while True:
            fillers.append(a.allocate(8 * mib, tag="filler"))
    except portalloc.PortallocError as e:
        assert e.status == 3, e  # OUT_OF_MEMORY
    try:
        a.wake("weights")
        raise AssertionError("the wake of a full device succeeded")
    except portalloc.PortallocError as e:
        assert e.status == 3 and "weights" in str(e), e
    assert [t["tag"] for t in a.sleeping()] == ["weights"], a.sleeping()
    for f in fillers:
        a.free(f)
    a.wake("weights")
    assert a.info(weights)[0] == weights.ptr
    assert ctypes.string_at(weights.ptr, len(w_bytes)) == w_bytes, "weights lost bytes"
    a.sleep("kv", keep=False)
    a.wake("kv")
    assert a.stats()["bytes_asleep"] == 0
    with portalloc.tag("activations"):
        with portalloc.tag("weights"):
            inner = a.allocate(mib, tag=None)
        outer = a.allocate(mib, tag=None)
    plain = a.allocate(mib, tag=None)
    a.sleep("weights")
    live = {b["ptr"]: (b["tag"], b["asleep"]) for b in a.ledger()["live"]}
    assert live[inner.ptr] == ("weights", True), live
    assert live[outer.ptr] == ("activations", False), live
    assert live[plain.ptr] == ("buffer", False), live
    assert live[weights.ptr] == ("weights", True), live
    a.wake("weights")
    assert ctypes.string_at(weights.ptr, len(w_bytes)) == w_bytes
    for b in (weights, kv, inner, outer, plain):
        a.free(b)
    a.close()


def regions_tag_the_buffers_of_other_threads():
    """``portalloc.region(name)`` tags the buffers allocated without a tag on threads
    started inside it — PyTorch's autograd threads during ``backward()`` — and they sleep
    with the region's name; a ``portalloc.tag`` block on such a thread wins; regions nest,
    and leaving one (by an exception too) restores the one outside."""
    import threading

    mib = 1 << 20
    a = portalloc.Allocator.create(
        strategy="vmm",
        backend="host",
        host_simulated=False,
        host_capacity=128 * mib,
        mem_fraction=0.5,
        ignore_env=True,
    )
    made = {}

    def on_a_thread(key, thread_tag=None):
        def run():
            if thread_tag is None:
                made[key] = a.allocate(mib)
            else:
                with portalloc.tag(thread_tag):
                    made[key] = a.allocate(mib)

        t = threading.Thread(target=run)
        t.start()
        t.join()
        assert key in made, "the thread failed to allocate %s" % key

    with portalloc.region("weights"):
        on_a_thread("autograd")
        on_a_thread("own", "mine")
        made["here"] = a.allocate(mib)
        with portalloc.tag("block"):
            made["block"] = a.allocate(mib)
        made["explicit"] = a.allocate(mib, tag="named")
        with portalloc.region("inner"):
            on_a_thread("inner")
        on_a_thread("outer again")
        try:
            with portalloc.region("raised"):
                on_a_thread("raised")
                raise KeyError("leaving by an exception")
        except KeyError:
            pass
        on_a_thread("after the exception")
    on_a_thread("outside")
    expected = {
        "autograd": "weights",
        "own": "mine",
        "here": "weights",
        "block": "block",
        "explicit": "named",
        "inner": "inner",
        "outer again": "weights",
        "raised": "raised",
        "after the exception": "weights",
        "outside": "buffer",
    }
    live = {b["ptr"]: b["tag"] for b in a.ledger()["live"]}
    got = {key: live[made[key].ptr] for key in expected}
    assert got == expected, got
    assert {key: made[key].tag for key in expected} == expected, made
    weights = [key for key, t in expected.items() if t == "weights"]
    before = a.stats()["pool_bytes"]
    a.sleep("weights", keep=False)
    after = a.stats()
    assert after["bytes_asleep"] == len(weights) * mib, after
    asleep = {b["ptr"] for b in a.ledger()["live"] if b["asleep"]}
    assert asleep == {made[key].ptr for key in weights}, (asleep, made)
    # Declared by the region, the tag's buffers lie on memory of their own: all of it
    # goes back.
    assert before - after["pool_bytes"] >= len(weights) * mib, (before, after)
    a.wake("weights")
    assert a.stats()["bytes_asleep"] == 0
    for b in made.values():
        a.free(b)
    a.close()


def a_buffer_says_the_tag_its_allocation_got() -> None:
    """``Buffer.tag`` is the tag the allocation was made with, as the ledger books it, even
    while another thread opens and leaves a region (the tag is resolved once, before the
    allocation, not looked up again after it)."""
    import threading

    a = portalloc.Allocator.create(
        strategy="vmm",
        backend="host",
        host_simulated=True,
        host_capacity=1 << 30,
        mem_fraction=0.9,
        ignore_env=True,
    )
    stop = threading.Event()

    def flip() -> None:
        while not stop.is_set():
            with portalloc.region("py-race-region"):
                pass

    flipper = threading.Thread(target=flip)
    flipper.start()
    try:
        buffers = [a.allocate(4096) for _ in range(2000)]
    finally:
        stop.set()
        flipper.join()
    booked = {b["ptr"]: b["tag"] for b in a.ledger()["live"]}
    wrong = [(b.tag, booked[b.ptr]) for b in buffers if b.tag != booked[b.ptr]]
    assert not wrong, "%d of %d buffers name another tag than the ledger's, e.g. %r" % (
        len(wrong),
        len(buffers),
        wrong[:3],
    )
    tags = {b.tag for b in buffers}
    assert tags <= {"buffer", "py-race-region"}, tags
    for b in buffers:
        a.free(b)
    a.close()


def one_rule_for_tags():
    """An empty tag is refused alike by ``tag``, ``sleep`` and ``wake`` (``sleep("")`` was a
    silent no-op); a tag over 1024 bytes alike by ``allocate`` and ``sleep`` (``allocate``
    took it), while 1024 bytes are taken by both."""
    a = portalloc.Allocator.create(
        strategy="vmm", backend="host", host_capacity=64 << 20, mem_fraction=0.5, ignore_env=True
    )
    for name, call in (
        ("tag", lambda: portalloc.tag("").__enter__()),
        ("sleep", lambda: a.sleep("")),
        ("wake", lambda: a.wake("")),
    ):
        try:
            call()
            raise AssertionError("%s('') was accepted" % name)
        except ValueError as e:
            assert "untagged buffers never sleep" in str(e), (name, e)
    too_long = "t" * 1025
    for name, refused in (
        ("allocate", lambda: a.allocate(4096, tag=too_long)),
        ("sleep", lambda: a.sleep(too_long)),
    ):
        try:
            refused()
            raise AssertionError("%s with a 1025-byte tag was accepted" % name)
        except portalloc.PortallocError as e:
            assert "at most 1024" in str(e), (name, e)
    longest = a.allocate(4096, tag="t" * 1024)
    a.sleep("t" * 1024)
    a.wake("t" * 1024)
    a.free(longest)
    a.close()


# The shared budget, in a child process on a host device that joins it
# (PORTALLOC_SHARED_BUDGET=1, a segment directory of its own): a tag declared reclaimable is
# listed under this process, in use inside ``with portalloc.using`` (nested too) and not
# after, an exception inside propagates and ends the block.
BUDGET_SCRIPT = """
import os, portalloc

def mine(tag):
    [me] = [m for m in portalloc.budget() if m["pid"] == os.getpid()]
    assert me["name"] == "python-budget", me
    tags = [t for t in me["tags"] if t["name"] == tag]
    return tags[0] if tags else None

assert mine("kv") is None
portalloc.declare_reclaimable("kv", keep=False)
kv = mine("kv")
assert kv == dict(kv, reclaimable=True, keep=False, in_use=False, asleep=False), kv
with portalloc.using("kv"):
    assert mine("kv")["in_use"]
    with portalloc.using("kv"):
        assert mine("kv")["in_use"]
    assert mine("kv")["in_use"], "the outer block is still open"
assert not mine("kv")["in_use"]
try:
    with portalloc.using("kv"):
        raise KeyError("inside")
except KeyError as e:
    assert e.args == ("inside",), e
else:
    raise AssertionError("the exception did not propagate")
assert not mine("kv")["in_use"]
print("budget: ok")
"""

# The same process switched off (PORTALLOC_SHARED_BUDGET=0): it runs alone, and says so.
ALONE_SCRIPT = """
import portalloc
for call in (lambda: portalloc.declare_reclaimable("kv"), portalloc.budget):
    try:
        call()
    except portalloc.PortallocError as e:
        assert e.name == "UNSUPPORTED" and "runs alone" in e.message, (e.name, e.message)
    else:
        raise AssertionError("no error running alone")
try:
    with portalloc.using("kv"):
        raise AssertionError("entered a block running alone")
except portalloc.PortallocError as e:
    assert e.name == "UNSUPPORTED", e
print("alone: ok")
"""


def the_shared_budget_from_python():
    """:func:`portalloc.declare_reclaimable`, ``with portalloc.using(tag)`` and
    :func:`portalloc.budget` over the global allocator of a host device that joined the
    shared budget; and a process that did not join one is told it runs alone."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="portalloc-budget-") as segments:
        for script, joined, marker in (
            (BUDGET_SCRIPT, "1", "budget: ok"),
            (ALONE_SCRIPT, "0", "alone: ok"),
        ):
            environment = {
                k: v
                for k, v in os.environ.items()
                if not k.startswith(("PORTALLOC_", "XLA_")) and k != "PYTHONPATH"
            }
            environment.update(
                PORTALLOC_BACKEND="host",
                PORTALLOC_HOST_CAPACITY="64MiB",
                PORTALLOC_HOST_SIMULATED="true",
                PORTALLOC_SHARED_BUDGET=joined,
                PORTALLOC_SHARED_BUDGET_DIR=segments,
                PORTALLOC_MEMBER_NAME="python-budget",
            )
            out = subprocess.run(
                [sys.executable, "-c", script],
                cwd="/",
                env=environment,
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert out.returncode == 0 and marker in out.stdout, out.stdout + out.stderr


def sharing_between_processes():
    # tests/python_share.py with this interpreter: the installed package, in spawned
    # multiprocessing children too.
    subprocess.run(
        [sys.executable, str(SOURCE_TREE / "tests" / "python_share.py")], check=True
    )


CHECKS = [
    imported_from_the_virtual_environment,
    the_library_is_inside_the_package,
    the_version_comes_from_cargo,
    every_public_function_is_typed,
    the_readme_command_works_from_the_root_directory,
    sleep_and_wake_keep_the_pointer_and_the_bytes,
    regions_tag_the_buffers_of_other_threads,
    a_buffer_says_the_tag_its_allocation_got,
    one_rule_for_tags,
    the_shared_budget_from_python,
    sharing_between_processes,
]


def main():
    for check in CHECKS:
        check()
        print("ok   %s" % check.__name__, flush=True)
    print("python_package: ok (portalloc %s, %s)" % (portalloc.__version__, PACKAGE))
    return 0


if __name__ == "__main__":
    sys.exit(main())
