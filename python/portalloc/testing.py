"""Fake CUDA drivers and HIP runtimes, for testing the CUDA and ROCm paths of GPU code on a
machine without a GPU: the Python side of the Rust crate ``portalloc-fakes``, for a pytest
suite. Standard library only; it does not load ``libportalloc``.

Each driver is a small C library that exports the CUDA driver API (``libcuda.so.1``'s symbols)
or the HIP runtime API (``libamdhip64.so``'s) with the vendors' signatures, error codes and
rules, over bookkeeping on the host. A :class:`Profile` is a driver and the environment that
selects one of its personalities (a CUDA or ROCm version, a driver without virtual memory,
peer access or pinned memory, or a behaviour ROCm was reported to have, named after its bug
report); :data:`MATRIX` is every profile. A driver keeps its state per process, so code runs
under a profile in a process of its own, started with the profile's environment::

    import subprocess, sys
    import pytest
    from portalloc import testing

    @pytest.mark.parametrize("profile", testing.MATRIX, ids=testing.names())
    def test_my_library(profile: testing.Profile) -> None:
        profile.run([sys.executable, "-m", "my_library.selftest"], check=True)

Inside that process, :func:`current` is the profile and :class:`Controls` opens the driver
the code under test loaded (the same path is the same library): hold a kernel in flight over
a range, read the hazard log, inject faults, read the census of what is live.

The drivers are built on first use from their C sources (shipped inside this package) with
``$CC`` (else ``cc``) into a cache folder (``$PORTALLOC_FAKES_CACHE``, else
``$XDG_CACHE_HOME/portalloc-fakes``, else ``~/.cache/portalloc-fakes``), one folder per
version of the sources; ``$PORTALLOC_FAKES_DIR``, when set, is a folder of drivers already
built (the Rust crate's, say), used as it is.

What they model and what they do not: no kernel runs (a test holds one "in flight" over a
range with :meth:`Controls.launch` and finishes it; the driver counts a free under it as a
hazard); fakecuda's device memory is host memory (its copies move bytes), fakehip's is none;
no timing.

From a shell (any language's CI)::

    python -m portalloc.testing list            # the matrix
    eval "$(python -m portalloc.testing env rocm5)"   # export one profile's variables
"""

import ctypes
import dataclasses
import functools
import hashlib
import json
import os
import pathlib
import shlex
import subprocess
import sys
import tempfile
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

__all__ = [
    "CUDA",
    "HIP",
    "DRIVERS",
    "MATRIX",
    "PROFILE_VARIABLE",
    "Controls",
    "Census",
    "FakesError",
    "Profile",
    "current",
    "driver_path",
    "names",
    "profile",
]

CUDA = "cuda"
"""The CUDA driver API (``libcuda.so.1``)."""
HIP = "hip"
"""The HIP runtime API (``libamdhip64.so``)."""

DRIVERS: Dict[str, str] = {
    "fakecuda": CUDA,
    "fakecuda_old": CUDA,
    "fakecuda_nopeer": CUDA,
    "fakecuda_nopinned": CUDA,
    "fakehip": HIP,
}
"""Every driver, by name (its source is ``<name>.c``), and the API it exports."""

LIBRARY_VARIABLE: Dict[str, str] = {
    CUDA: "PORTALLOC_CUDA_LIBRARY",
    HIP: "PORTALLOC_HIP_LIBRARY",
}
"""The variable portalloc reads for each vendor's library path."""

PROFILE_VARIABLE = "PORTALLOC_FAKES_PROFILE"
"""Set by :meth:`Profile.env` to the profile's name: :func:`current` reads it."""

# The most of a compiler's complaint an error message carries.
_MESSAGE_LIMIT = 2000


class FakesError(RuntimeError):
    """A driver could not be built or loaded: what failed and what would help."""


def _sources() -> pathlib.Path:
    """The drivers' C sources: inside the installed package (``_fakes/``), else the
    repository's (``fakes/drivers``, for a source tree)."""
    here = pathlib.Path(__file__).resolve().parent
    for folder in (here / "_fakes", here.parent.parent / "fakes" / "drivers"):
        if (folder / "fake_common.h").is_file():
            return folder
    raise FakesError(
        "the fake drivers' C sources are in neither %s nor %s: reinstall portalloc"
        % (here / "_fakes", here.parent.parent / "fakes" / "drivers")
    )


def _cache_root() -> pathlib.Path:
    explicit = os.environ.get("PORTALLOC_FAKES_CACHE")
    if explicit:
        return pathlib.Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = pathlib.Path(xdg) if xdg else pathlib.Path.home() / ".cache"
    return base / "portalloc-fakes"


_FLAGS = ["-shared", "-fPIC", "-O1", "-Wall", "-std=c11", "-pthread"]


def _compiler() -> List[str]:
    text = os.environ.get("CC") or "cc"
    try:
        command = shlex.split(text)
    except ValueError as e:
        raise FakesError("CC=%r cannot be split into a command (%s)" % (text[:200], e)) from None
    if not command:
        raise FakesError("CC=%r names no compiler: unset it, or name one (cc, gcc, clang)" % text)
    return command


@functools.lru_cache(maxsize=None)
def _sources_digest(sources: pathlib.Path) -> bytes:
    """The digest of the drivers' sources, read once per process (every profile's
    :meth:`Profile.env` asks for its driver)."""
    digest = hashlib.sha256()
    for source in sorted(sources.iterdir()):
        if source.suffix in (".c", ".h"):
            digest.update(source.name.encode())
            digest.update(source.read_bytes())
    return digest.digest()


def _build(name: str) -> pathlib.Path:
    """Builds driver ``name`` into the cache (once per version of the sources and compiler);
    its path."""
    sources = _sources()
    digest = hashlib.sha256(" ".join(_compiler() + _FLAGS).encode())
    digest.update(_sources_digest(sources))
    folder = _cache_root() / digest.hexdigest()[:16]
    library = folder / ("lib%s.so" % name)
    if library.is_file():
        return library
    try:
        folder.mkdir(parents=True, exist_ok=True)
        # Built under a name of its own, then renamed: other processes may build it too.
        fd, partial = tempfile.mkstemp(prefix="lib%s." % name, suffix=".partial", dir=folder)
        os.close(fd)
    except OSError as e:
        raise FakesError(
            "cannot build the fake drivers in %s (%s): set PORTALLOC_FAKES_CACHE to a folder "
            "that can be written" % (folder, e)
        ) from None
    command = _compiler() + _FLAGS + ["-o", partial, str(sources / ("%s.c" % name))]
    try:
        done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    except OSError as e:
        os.unlink(partial)
        raise FakesError(
            "cannot run the C compiler %r (%s): the fake drivers are built with $CC, else cc"
            % (command[0], e)
        ) from None
    if done.returncode != 0:
        os.unlink(partial)
        said = done.stdout.decode(errors="replace")[-_MESSAGE_LIMIT:]
        raise FakesError(
            "%s failed (status %d) building %s:\n%s"
            % (shlex.join(command), done.returncode, name, said)
        )
    try:
        os.replace(partial, library)
    except OSError as e:
        raise FakesError("cannot place %s (%s)" % (library, e)) from None
    return library


def driver_path(name: str) -> str:
    """The built library of driver ``name`` (a key of :data:`DRIVERS`), built on first use.

    :raises KeyError: for a name that is not a driver.
    :raises FakesError: when it cannot be built.
    """
    if name not in DRIVERS:
        raise KeyError("no driver %r; the drivers are: %s" % (name[:64], ", ".join(DRIVERS)))
    built = os.environ.get("PORTALLOC_FAKES_DIR")
    if built:
        path = pathlib.Path(built) / ("lib%s.so" % name)
        if not path.is_file():
            raise FakesError("PORTALLOC_FAKES_DIR=%s holds no %s" % (built, path.name))
        return str(path)
    return str(_build(name))


@dataclasses.dataclass(frozen=True)
class Profile:
    """A driver and the environment that selects one of its personalities."""

    name: str
    """Unique in :data:`MATRIX`."""
    driver: str
    """The driver it loads: a key of :data:`DRIVERS`."""
    vars: Tuple[Tuple[str, str], ...]
    """Variables the driver reads when it starts."""
    models: str
    """What it models, and where that behaviour was reported."""

    @property
    def vendor(self) -> str:
        """:data:`CUDA` or :data:`HIP`."""
        return DRIVERS[self.driver]

    def driver_path(self) -> str:
        """The driver's built library (built on first use)."""
        return driver_path(self.driver)

    def env(self) -> Dict[str, str]:
        """The variables that run code under this profile: the vendor's library variable
        (``PORTALLOC_CUDA_LIBRARY`` / ``PORTALLOC_HIP_LIBRARY``) set to the driver's path,
        ``PORTALLOC_BACKEND`` to the vendor (so that a real driver the machine also has is
        not picked), the profile's own, and :data:`PROFILE_VARIABLE` to its name."""
        env = {
            LIBRARY_VARIABLE[self.vendor]: self.driver_path(),
            "PORTALLOC_BACKEND": self.vendor,
        }
        env.update(self.vars)
        env[PROFILE_VARIABLE] = self.name
        return env

    def environ(self, base: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
        """``base`` (default: this process's environment) with :meth:`env` over it: for
        ``subprocess``'s ``env=``."""
        merged = dict(os.environ if base is None else base)
        merged.update(self.env())
        return merged

    def run(self, args: Sequence[str], **kwargs: Any) -> "subprocess.CompletedProcess[Any]":
        """``subprocess.run(args, env=self.environ(), **kwargs)``: a fresh process, which
        loads the driver anew."""
        return subprocess.run(list(args), env=self.environ(kwargs.pop("env", None)), **kwargs)


def _profile(name: str, driver: str, models: str, *vars: Tuple[str, str]) -> Profile:
    return Profile(name=name, driver=driver, vars=tuple(vars), models=models)


_ROCM7 = ("FAKEHIP_VERSION", "70051831")

MATRIX: Tuple[Profile, ...] = (
    _profile(
        "cuda12",
        "fakecuda",
        "CUDA 12.2: virtual memory, stream-ordered pools, peer access, pinned memory",
    ),
    _profile(
        "cuda10-no-vmm",
        "fakecuda_old",
        "CUDA 10.1: no virtual memory management, no stream-ordered pools",
    ),
    _profile(
        "cuda12-no-peer",
        "fakecuda_nopeer",
        "two devices and no peer-access calls",
        ("FAKECUDA_DEVICES", "2"),
    ),
    _profile(
        "cuda12-no-pinned",
        "fakecuda_nopinned",
        "no pinned host memory (cuMemHostAlloc refuses)",
    ),
    _profile(
        "rocm5",
        "fakehip",
        "ROCm 5.2: no virtual-memory attribute, the 5.x device-properties layout",
        ("FAKEHIP_VERSION", "50221153"),
    ),
    _profile("rocm6", "fakehip", "ROCm 6.2 as documented", ("FAKEHIP_VERSION", "60241133")),
    _profile("rocm7", "fakehip", "ROCm 7.0 as documented", _ROCM7),
    _profile(
        "rocm7-reservation-hold",
        "fakehip",
        "hipMemRelease returns no memory while a reservation it was mapped into stays "
        "reserved (ROCm/legacy-rocm-build#6021, vllm-project/vllm#37533)",
        _ROCM7,
        ("FAKEHIP_PROFILE", "rocm7-reservation-hold"),
    ),
    _profile(
        "rocm7-setaccess-prefix",
        "fakehip",
        "hipMemSetAccess sums mappings from the reservation's first one "
        "(ROCm/rocm-systems#2516)",
        _ROCM7,
        ("FAKEHIP_PROFILE", "rocm-systems-2516-setaccess-prefix"),
    ),
    _profile(
        "rocm7-reserve-counted",
        "fakehip",
        "address reservations counted against plain allocations' free memory "
        "(ROCm/rocm-systems#7128)",
        _ROCM7,
        ("FAKEHIP_PROFILE", "rocm-systems-7128-reserve-counted"),
    ),
    _profile(
        "rocm7-unmap-many",
        "fakehip",
        "one hipMemUnmap over several mappings leaves the reservation in use for ever "
        "(ROCm/ROCR-Runtime#285, before ROCm 7.0)",
        _ROCM7,
        ("FAKEHIP_PROFILE", "rocr-285-unmap-many"),
    ),
)
"""Every profile: CUDA's personalities, then ROCm's versions and its reported behaviours.
The same as the Rust crate's ``MATRIX`` (portalloc's CI compares them)."""


def names() -> List[str]:
    """The profiles' names, in :data:`MATRIX`'s order (pytest's ``ids=``)."""
    return [p.name for p in MATRIX]


def profile(name: str) -> Profile:
    """The profile named ``name``.

    :raises KeyError: naming the profiles there are, when :data:`MATRIX` has no such one.
    """
    for p in MATRIX:
        if p.name == name:
            return p
    raise KeyError("no profile %r; the matrix has: %s" % (name[:64], ", ".join(names())))


def current() -> Optional[Profile]:
    """The profile this process runs under (:data:`PROFILE_VARIABLE`), if any."""
    name = os.environ.get(PROFILE_VARIABLE)
    return profile(name) if name else None


LIVE = (
    "allocations",
    "pool_allocations",
    "pool_reserved",
    "pools",
    "handles",
    "mappings",
    "reservations",
    "streams",
    "events",
    "bytes",
    "host_allocations",
)
"""The live counts both drivers answer (:meth:`Controls.live`)."""

Census = Dict[str, int]
"""What :meth:`Controls.census` returns: each name of :data:`LIVE` and its count."""

_MEMORY = (
    "allocations",
    "pool_allocations",
    "pool_reserved",
    "handles",
    "mappings",
    "reservations",
    "bytes",
    "host_allocations",
)


def _name(call: str, text: str) -> bytes:
    """``text`` for a C string: a ``str`` without NUL."""
    if not isinstance(text, str):
        raise TypeError("%s: a name as str, not %s" % (call, type(text).__name__))
    if "\0" in text:
        raise ValueError("%s: a name without NUL, not %r" % (call, text[:64]))
    return text.encode()


def _within(call: str, name: str, value: int, bits: int, signed: bool = True) -> None:
    """Refuses an integer the C parameter of ``bits`` bits cannot hold (ctypes would wrap it)."""
    if not isinstance(value, int):
        raise TypeError("%s: %s as int, not %s" % (call, name, type(value).__name__))
    low, high = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
    if not low <= value <= high:
        raise OverflowError("%s: %s=%d is outside [%d, %d]" % (call, name, value, low, high))


class Controls:
    """The controls every driver exports beside the vendor's API (``fake_common.h``, whose
    comment is their specification).

    Open them on the path the code under test loaded, in the same process (the same path is
    the same loaded library, hence the same driver state): ``Controls(current().driver_path())``.
    """

    def __init__(self, path: str) -> None:
        try:
            self._lib = ctypes.CDLL(path)
        except (OSError, ValueError, TypeError) as e:
            raise FakesError("cannot load the fake driver %s: %s" % (path, e)) from None
        try:
            self._declare(self._lib)
        except AttributeError as e:
            raise FakesError("%s is not one of the fake drivers: %s" % (path, e)) from None

    @staticmethod
    def _declare(lib: ctypes.CDLL) -> None:
        lib.fake_fail.argtypes = [ctypes.c_char_p, ctypes.c_long, ctypes.c_long, ctypes.c_int]
        lib.fake_fail.restype = None
        lib.fake_clear_faults.argtypes = []
        lib.fake_clear_faults.restype = None
        for counter in ("fake_calls", "fake_live"):
            getattr(lib, counter).argtypes = [ctypes.c_char_p]
            getattr(lib, counter).restype = ctypes.c_longlong
        lib.fake_launch.argtypes = [ctypes.c_void_p, ctypes.c_ulonglong, ctypes.c_ulonglong]
        lib.fake_launch.restype = ctypes.c_ulonglong
        lib.fake_finish.argtypes = [ctypes.c_ulonglong]
        lib.fake_finish.restype = None
        lib.fake_kernel_done.argtypes = [ctypes.c_ulonglong]
        lib.fake_kernel_done.restype = ctypes.c_int
        for counter in ("fake_hazards", "fake_cpu_waits"):
            getattr(lib, counter).argtypes = []
            getattr(lib, counter).restype = ctypes.c_longlong
        lib.fake_first_hazard.argtypes = []
        lib.fake_first_hazard.restype = ctypes.c_char_p

    def fail(self, function: str, nth: int, count: int, code: int) -> None:
        """Calls ``nth`` .. ``nth + count - 1`` of the vendor call ``function`` (1-based,
        counted from now; ``count < 0``: every one from the ``nth`` on) return ``code``. At
        most 32 faults are armed at once (a fault's slot is free after its last failing call).

        :raises ValueError: for a name that is empty, 64 characters or more, or holds a NUL.
        :raises OverflowError: for a number the C call cannot take."""
        name = _name("fail", function)
        if not 1 <= len(name) < 64:
            raise ValueError("fail: a function name of 1 to 63 characters, not %d" % len(name))
        _within("fail", "nth", nth, 64)
        _within("fail", "count", count, 64)
        _within("fail", "code", code, 32)
        self._lib.fake_fail(name, nth, count, code)

    def clear_faults(self) -> None:
        """Disarms every fault."""
        self._lib.fake_clear_faults()

    def calls(self, function: str) -> int:
        """How many times the vendor call ``function`` was made, failed ones included."""
        return int(self._lib.fake_calls(_name("calls", function)))

    def live(self, what: str) -> int:
        """A live count (a name of :data:`LIVE`).

        :raises KeyError: for a name the driver does not know."""
        n = int(self._lib.fake_live(_name("live", what)))
        if n < 0:
            raise KeyError("no live count %r; the names are: %s" % (what[:64], ", ".join(LIVE)))
        return n

    def census(self) -> Census:
        """Every live count."""
        return {what: self.live(what) for what in LIVE}

    def holds_no_memory(self) -> bool:
        """True when no device memory, pinned host memory or address range is held."""
        return all(self.live(what) == 0 for what in _MEMORY)

    def launch(self, stream: int, ptr: int, size: int) -> int:
        """A kernel on ``stream`` (a handle as an int; 0 for the default stream) that uses
        ``[ptr, ptr + size)``, in flight until :meth:`finish` or a CPU wait that covers it.

        :raises KeyError: when the driver does not know the stream."""
        for name, value in (("stream", stream), ("ptr", ptr), ("size", size)):
            _within("launch", name, value, 64, signed=False)
        kernel = int(self._lib.fake_launch(ctypes.c_void_p(stream), ptr, size))
        if kernel == 0:
            raise KeyError("the driver knows no stream %#x" % stream)
        return kernel

    def finish(self, kernel: int) -> None:
        """The kernel completes (nothing for an unknown or finished one)."""
        _within("finish", "kernel", kernel, 64, signed=False)
        self._lib.fake_finish(kernel)

    def done(self, kernel: int) -> bool:
        """Whether the kernel completed (:meth:`finish`, or a CPU wait).

        :raises KeyError: for a kernel this driver did not launch."""
        _within("done", "kernel", kernel, 64, signed=False)
        state = int(self._lib.fake_kernel_done(kernel))
        if state < 0:
            raise KeyError("kernel %d is not one this driver launched" % kernel)
        return state == 1

    def hazards(self) -> int:
        """How many times memory was freed, unmapped or given back while a kernel or a copy
        still used it: undefined behaviour on a GPU."""
        return int(self._lib.fake_hazards())

    def first_hazard(self) -> str:
        """What the first hazard was ("" for none)."""
        said = self._lib.fake_first_hazard()
        return said.decode(errors="replace") if said else ""

    def cpu_waits(self) -> int:
        """CPU waits so far: stream, event and device synchronisations."""
        return int(self._lib.fake_cpu_waits())


def _main(argv: Sequence[str]) -> int:
    usage = (
        "usage: python -m portalloc.testing list [--json] | env PROFILE | path DRIVER\n"
        "  list     the matrix: each profile, its driver and what it models\n"
        "  env      one profile's variables as shell exports (eval \"$(...)\")\n"
        "  path     a driver's built library"
    )
    if not argv or argv[0] in ("-h", "--help"):
        print(usage)
        return 0 if argv else 2
    try:
        if argv[0] == "list" and len(argv) <= 2 and argv[1:] in ([], ["--json"]):
            if argv[1:]:
                rows = [dataclasses.asdict(p) for p in MATRIX]
                print(json.dumps(rows, indent=1))
            else:
                for p in MATRIX:
                    print("%-24s %-18s %s" % (p.name, p.driver, p.models))
            return 0
        if argv[0] == "env" and len(argv) == 2:
            for key, value in profile(argv[1]).env().items():
                print("export %s=%s" % (key, shlex.quote(value)))
            return 0
        if argv[0] == "path" and len(argv) == 2:
            print(driver_path(argv[1]))
            return 0
    except (KeyError, FakesError) as e:
        print("portalloc.testing: %s" % (e.args[0] if e.args else e), file=sys.stderr)
        return 1
    print(usage, file=sys.stderr)
    return 2


if __name__ == "__main__":
    try:
        sys.exit(_main(sys.argv[1:]))
    except BrokenPipeError:
        # `... list | head`: the reader left; say nothing more (and not at exit either).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
