"""portalloc.testing as a pytest suite of a library that uses portalloc would use it: every
profile of the matrix in a fresh process, the library's code run there against the profile's
fake driver, and the driver's hazard log read from inside.

Run by scripts/test with the installed package, from /: ``python tests/python_testing.py``.
(Plain asserts and a main, as the other Python tests: pytest is not a dependency.)

The child's "library" allocates a buffer on the default stream, has a kernel on a side stream
(made with the driver's own call) read it, frees it and gives the cache back. Done right, it
declares the side stream's use first (``Allocator.record_stream``, PyTorch's
``Tensor.record_stream``); the planted bug leaves that out. Every profile must pass the first
and catch the second: a check that could not fail would pass both.
"""

import ctypes
import json
import os
import subprocess
import sys
from typing import Any, Callable, Dict, Type

from portalloc import testing

CHILD = r"""
import ctypes, json, sys
import portalloc
from portalloc import testing

profile = testing.current()
assert profile is not None, "run without a profile"
driver = testing.Controls(profile.driver_path())
vendor = ctypes.CDLL(profile.driver_path())
allocator = portalloc.Allocator.from_env()

# A side stream, made as the caller's own library would: the vendor's call.
side = ctypes.c_void_p()
if profile.vendor == testing.CUDA:
    context = ctypes.c_void_p()
    assert vendor.cuInit(0) == 0
    assert vendor.cuDevicePrimaryCtxRetain(ctypes.byref(context), 0) == 0
    assert vendor.cuCtxSetCurrent(context) == 0
    assert vendor.cuStreamCreate(ctypes.byref(side), 0) == 0
else:
    assert vendor.hipStreamCreate(ctypes.byref(side)) == 0
side_handle = side.value or 0

buffer = allocator.allocate(1 << 20, stream=0)
kernel = driver.launch(side_handle, buffer.ptr, buffer.size)
if sys.argv[1] == "right":
    allocator.record_stream(buffer.ptr, side_handle)
allocator.free(buffer)
allocator.trim()
said = {"hazards": driver.hazards(), "first": driver.first_hazard()}
driver.finish(kernel)
allocator.close()
if profile.vendor == testing.CUDA:
    assert vendor.cuStreamDestroy_v2(side) == 0
    assert vendor.cuDevicePrimaryCtxRelease_v2(0) == 0
else:
    assert vendor.hipStreamDestroy(side) == 0
said["clean"] = driver.holds_no_memory()
said["census"] = driver.census()
print(json.dumps(said))
"""


def run(profile: testing.Profile, mode: str) -> Dict[str, Any]:
    done = profile.run(
        [sys.executable, "-c", CHILD, mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        universal_newlines=True,
        timeout=120,
    )
    assert done.returncode == 0, "%s (%s): exit %d\n%s" % (
        profile.name,
        mode,
        done.returncode,
        done.stderr[-2000:],
    )
    result: Dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def raises(kind: Type[BaseException], call: Callable[[], object], *named: str) -> None:
    """``call`` raises ``kind`` whose message names each of ``named``."""
    try:
        call()
    except kind as e:
        assert all(n in str(e) for n in named), (named, e)
    else:
        raise AssertionError("accepted, where %s naming %s was due" % (kind.__name__, named))


def the_matrix_is_well_formed() -> None:
    names = testing.names()
    assert len(names) == len(set(names)), names
    assert len(names) >= 11, names
    for p in testing.MATRIX:
        assert p.driver in testing.DRIVERS, p
        env = p.env()
        assert os.path.isfile(env[testing.LIBRARY_VARIABLE[p.vendor]]), env
        assert env["PORTALLOC_BACKEND"] == p.vendor
        assert env[testing.PROFILE_VARIABLE] == p.name
        assert dict(p.vars).items() <= env.items()
    assert testing.profile("rocm5").vars == (("FAKEHIP_VERSION", "50221153"),)
    raises(KeyError, lambda: testing.profile("rocm99"), "rocm99", "rocm7-unmap-many")
    raises(KeyError, lambda: testing.driver_path("libcuda"), "libcuda", "fakecuda_nopinned")


def controls_inject_a_fault_and_count_calls() -> None:
    # In this process, on a driver nobody else loaded: the vendor's own calls, counted.
    path = testing.driver_path("fakehip")
    driver = testing.Controls(path)
    hip = ctypes.CDLL(path)
    before = driver.calls("hipGetDeviceCount")
    count = ctypes.c_int()
    driver.fail("hipGetDeviceCount", 1, 1, 100)
    assert hip.hipGetDeviceCount(ctypes.byref(count)) == 100
    assert hip.hipGetDeviceCount(ctypes.byref(count)) == 0 and count.value >= 1
    assert driver.calls("hipGetDeviceCount") == before + 2
    assert driver.holds_no_memory(), driver.census()
    raises(KeyError, lambda: driver.live("gigawatts"), "gigawatts", "host_allocations")


def hostile_inputs_are_refused_clearly() -> None:
    path = testing.driver_path("fakecuda")
    driver = testing.Controls(path)
    raises(testing.FakesError, lambda: testing.Controls("libm.so.6"), "not one of the fake")
    raises(testing.FakesError, lambda: testing.Controls("/no/such/lib.so"), "/no/such/lib.so")
    raises(ValueError, lambda: driver.fail("cuMemAlloc_v2\0x", 1, 1, 2), "NUL")
    raises(ValueError, lambda: driver.fail("x" * 64, 1, 1, 2), "1 to 63")
    raises(ValueError, lambda: driver.fail("", 1, 1, 2), "1 to 63")
    raises(testing.FakesError, lambda: testing.Controls("/tmp/a\0b.so"), "cannot load")
    raises(OverflowError, lambda: driver.fail("cuMemAlloc_v2", 2**64, 1, 2), "nth")
    raises(KeyError, lambda: driver.done(123456789), "123456789")
    raises(KeyError, lambda: driver.launch(0xDEAD000, 0, 1), "0xdead000")
    # A cache that cannot be written, and a compiler command that cannot be split.
    saved = dict(os.environ)
    try:
        os.environ.pop("PORTALLOC_FAKES_DIR", None)
        os.environ["PORTALLOC_FAKES_CACHE"] = "/proc/portalloc-no-such-cache"
        raises(testing.FakesError, lambda: testing.driver_path("fakehip"), "PORTALLOC_FAKES_CACHE")
        os.environ["PORTALLOC_FAKES_CACHE"] = saved.get("PORTALLOC_FAKES_CACHE", "/tmp/x")
        os.environ["CC"] = 'cc -DX="'
        raises(testing.FakesError, lambda: testing.driver_path("fakehip"), "CC=")
        os.environ["CC"] = "   "
        raises(testing.FakesError, lambda: testing.driver_path("fakehip"), "names no compiler")
    finally:
        os.environ.clear()
        os.environ.update(saved)
    assert driver.holds_no_memory()


def every_profile_passes_the_right_code_and_catches_the_planted_bug() -> None:
    for p in testing.MATRIX:
        right = run(p, "right")
        assert right["hazards"] == 0, (p.name, right)
        assert right["clean"], (p.name, right)
        planted = run(p, "planted")
        assert planted["hazards"] >= 1, (p.name, planted)
        assert "kernel" in planted["first"], (p.name, planted)
        print("%-24s right: no hazard; planted bug: %s" % (p.name, planted["first"][:60]))


def the_command_line_prints_the_matrix_and_a_profiles_exports() -> None:
    listed = subprocess.run(
        [sys.executable, "-m", "portalloc.testing", "list", "--json"],
        stdout=subprocess.PIPE,
        universal_newlines=True,
        check=True,
    )
    rows = json.loads(listed.stdout)
    assert [r["name"] for r in rows] == testing.names()
    exports = subprocess.run(
        [sys.executable, "-m", "portalloc.testing", "env", "cuda12-no-peer"],
        stdout=subprocess.PIPE,
        universal_newlines=True,
        check=True,
    ).stdout
    assert "export FAKECUDA_DEVICES=2\n" in exports, exports
    assert "export PORTALLOC_BACKEND=cuda\n" in exports, exports
    wrong = subprocess.run(
        [sys.executable, "-m", "portalloc.testing", "env", "cuda13"],
        stderr=subprocess.PIPE,
        universal_newlines=True,
    )
    assert wrong.returncode == 1 and "cuda12-no-peer" in wrong.stderr, wrong


if __name__ == "__main__":
    the_matrix_is_well_formed()
    controls_inject_a_fault_and_count_calls()
    the_command_line_prints_the_matrix_and_a_profiles_exports()
    hostile_inputs_are_refused_clearly()
    every_profile_passes_the_right_code_and_catches_the_planted_bug()
    print("python_testing: ok")
