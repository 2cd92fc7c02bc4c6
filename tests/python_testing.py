"""portalloc.testing as a pytest suite of a library that uses portalloc would use it: every
profile of the matrix in a fresh process, the library's code run there against the profile's
fake driver, and the driver's hazard log read from inside.

Run by scripts/test with the installed package, from /: ``python tests/python_testing.py``.
(Plain asserts and a main, as the other Python tests: pytest is not a dependency.)

The child's "library" allocates a buffer on the default stream, has a kernel on a side stream
(made with the driver's own call, non-blocking as PyTorch's pool makes them) read it, frees
it, allocates again and fills the new buffer on the default stream. Done right, it declares
the side stream's use first (``Allocator.record_stream``, PyTorch's
``Tensor.record_stream``); the planted bug leaves that out, and the fill writes memory the
kernel still reads. Every profile must pass the first and catch the second: a check that
could not fail would pass both.
"""

import ctypes
import json
import os
import shlex
import subprocess
import sys
import tempfile
from typing import Any, Callable, Dict, Type

from portalloc import testing

CHILD = r"""
import ctypes, json, sys
import portalloc
from portalloc import testing

profile = testing.current()
assert profile is not None, "run without a profile"
vendor = ctypes.CDLL(profile.library())
allocator = portalloc.Allocator.from_env()
driver = testing.Controls.current()

# A side stream, made as the caller's own library would: the vendor's call, non-blocking.
side = ctypes.c_void_p()
if profile.vendor == testing.CUDA:
    context = ctypes.c_void_p()
    assert vendor.cuInit(0) == 0
    assert vendor.cuDevicePrimaryCtxRetain(ctypes.byref(context), 0) == 0
    assert vendor.cuCtxSetCurrent(context) == 0
    assert vendor.cuStreamCreate(ctypes.byref(side), 1) == 0
    fill = vendor.cuMemsetD8Async
else:
    assert vendor.hipStreamCreateWithFlags(ctypes.byref(side), 1) == 0
    fill = vendor.hipMemsetD8Async
fill.argtypes = [ctypes.c_uint64, ctypes.c_ubyte, ctypes.c_size_t, ctypes.c_void_p]
side_handle = side.value or 0

buffer = allocator.allocate(1 << 20, stream=0)
kernel = driver.launch(side_handle, buffer.ptr, buffer.size)
if sys.argv[1] == "right":
    allocator.record_stream(buffer.ptr, side_handle)
allocator.free(buffer)
again = allocator.allocate(1 << 20, stream=0)
assert fill(again.ptr, 0, again.size, None) == 0
said = {"hazards": driver.hazards(), "log": driver.hazard_log()}
driver.finish(kernel)
allocator.free(again)
allocator.trim()
allocator.close()
if profile.vendor == testing.CUDA:
    assert vendor.cuStreamDestroy_v2(side) == 0
    assert vendor.cuDevicePrimaryCtxRelease(0) == 0  # every CUDA driver has it; _v2 came with 11
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


def faults_groups_codes_models_and_order() -> None:
    path = testing.driver_path("fakehip")
    driver = testing.Controls(path)
    hip = ctypes.CDLL(path)
    count = ctypes.c_int()
    assert hip.hipGetDeviceCount(ctypes.byref(count)) == 0
    # A call the driver does not export would never fail: refused, naming its family.
    raises(KeyError, lambda: driver.fail("hipMallocc", 1, 1, 2), "hipMallocc", "hipMalloc")
    raises(KeyError, lambda: driver.fail("hipMalloc", 1, 1, "out_of_memry"), "out_of_memry")
    raises(KeyError, lambda: driver.fail_next("alocation", 2), "alocation", "allocation")
    # The next allocation, whichever call makes it, with the vendor's out-of-memory number.
    driver.fail_next("allocation", "out_of_memory")
    ptr = ctypes.c_void_p()
    assert hip.hipMalloc(ctypes.byref(ptr), ctypes.c_size_t(4096)) == 2
    assert hip.hipMalloc(ctypes.byref(ptr), ctypes.c_size_t(4096)) == 0
    assert driver.code("out_of_memory") == 2 and "hipMalloc" in driver.exports()
    # Order, as the driver sees it: a kernel on the null stream, a non-blocking stream.
    side = ctypes.c_void_p()
    assert hip.hipStreamCreateWithFlags(ctypes.byref(side), 1) == 0
    kernel = driver.launch(0, ptr.value or 0, 4096)
    assert not driver.ordered(kernel, side.value or 0)
    assert driver.ordered(kernel, 0)
    assert not driver.streams_ordered(0, side.value or 0)
    assert driver.in_flight() >= 1 and driver.last_kernel() == kernel
    driver.finish_all()
    assert driver.done(kernel) and driver.in_flight() == 0
    # Polling behind a held kernel ends after the driver's patience, counted as a CPU wait.
    kernel = driver.launch(side.value or 0, ptr.value or 0, 4096)
    waits = driver.cpu_waits()
    polls = 1
    while hip.hipStreamQuery(side) == 600:
        polls += 1
    assert polls == 1000 and driver.done(kernel) and driver.cpu_waits() == waits + 1, polls
    assert driver.query_patience(1000) == 1000
    raises(ValueError, lambda: driver.query_patience(-1), "queries")
    # Held, a copy stays in flight until a CPU wait forces it.
    driver.hold(True)
    host = ctypes.c_void_p()  # pinned: a copy from pageable memory is synchronous under HIP
    assert hip.hipHostMalloc(ctypes.byref(host), ctypes.c_size_t(64), 0) == 0
    assert hip.hipMemcpyHtoDAsync(ptr, host, ctypes.c_size_t(64), side) == 0
    assert driver.in_flight() == 1
    assert hip.hipStreamSynchronize(side) == 0 and driver.in_flight() == 0
    driver.hold(False)
    assert hip.hipHostFree(host) == 0
    raises(TypeError, lambda: driver.hold(1), "bool")  # type: ignore[arg-type]
    driver.kernel_model("scale", "r:a0:4*i2 w:a1:4*i2")
    raises(ValueError, lambda: driver.kernel_model("scale", "r:x0:4"), "character 3")
    assert hip.hipStreamDestroy(side) == 0
    assert hip.hipFree(ptr) == 0
    assert driver.holds_no_memory() and driver.hazards() == 0, driver.hazard_log()
    # A driver nobody initialised in this process: its census would say nothing.
    other = testing.Controls(testing.driver_path("fakecuda_old"))
    raises(testing.FakesError, other.census, "never initialised")
    # Profiles: the loader's path and the drivers' folder, and nothing another profile set.
    env = testing.profile("rocm7").environ({"FAKEHIP_PROFILE": "rocr-285-unmap-many"})
    assert "FAKEHIP_PROFILE" not in env, env
    assert env["LD_LIBRARY_PATH"].split(os.pathsep)[0].endswith("sonames/fakehip"), env
    assert os.path.isfile(os.path.join(env["PORTALLOC_FAKES_DIR"], "libfakehip.so")), env
    assert os.path.islink(os.path.join(env["LD_LIBRARY_PATH"].split(os.pathsep)[0], "libamdhip64.so"))


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
    # Nothing here initialised the driver: its raw counts, not a census.
    assert not driver.initialised() and driver.live("allocations") == 0


def every_profile_passes_the_right_code_and_catches_the_planted_bug() -> None:
    for p in testing.MATRIX:
        right = run(p, "right")
        assert right["hazards"] == 0, (p.name, right)
        assert right["clean"], (p.name, right)
        planted = run(p, "planted")
        assert planted["hazards"] >= 1, (p.name, planted)
        race = planted["log"][0]
        assert race.startswith("race: ") and "writes" in race and "kernel" in race, (p.name, race)
        print("%-24s right: no hazard; planted bug: %s" % (p.name, race[:90]))


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
    # One profile after another in a shell, from a cache nothing was built in yet: nothing of
    # the first is left under the second, and the second gets its own driver.
    python = shlex.quote(sys.executable)
    with tempfile.TemporaryDirectory() as cache:
        fresh = {k: v for k, v in os.environ.items() if k != testing.DIR_VARIABLE}
        fresh["PORTALLOC_FAKES_CACHE"] = cache
        shell = subprocess.run(
            [
                "sh",
                "-c",
                'eval "$(%s -m portalloc.testing env rocm7-reservation-hold)" && '
                'eval "$(%s -m portalloc.testing env rocm5)" && '
                'eval "$(%s -m portalloc.testing env cuda10-no-vmm)" && env'
                % (python, python, python),
            ],
            stdout=subprocess.PIPE,
            universal_newlines=True,
            env=fresh,
            check=True,
        ).stdout
        seen = dict(line.split("=", 1) for line in shell.splitlines() if "=" in line)
        assert seen["PORTALLOC_FAKES_PROFILE"] == "cuda10-no-vmm", shell
        assert seen["PORTALLOC_CUDA_LIBRARY"].endswith("libfakecuda_old.so"), shell
        assert os.path.isfile(seen["PORTALLOC_CUDA_LIBRARY"]), shell
        assert "FAKEHIP_PROFILE" not in seen and "FAKEHIP_VERSION" not in seen, shell
    wrong = subprocess.run(
        [sys.executable, "-m", "portalloc.testing", "env", "cuda13"],
        stderr=subprocess.PIPE,
        universal_newlines=True,
    )
    assert wrong.returncode == 1 and "cuda12-no-peer" in wrong.stderr, wrong


if __name__ == "__main__":
    the_matrix_is_well_formed()
    controls_inject_a_fault_and_count_calls()
    faults_groups_codes_models_and_order()
    the_command_line_prints_the_matrix_and_a_profiles_exports()
    hostile_inputs_are_refused_clearly()
    every_profile_passes_the_right_code_and_catches_the_planted_bug()
    print("python_testing: ok")
