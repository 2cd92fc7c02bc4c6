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

What they model: every address is real host memory, so copies and memsets move bytes, when
their stream reaches them; streams as the vendors define them (the legacy default stream's
implicit order with blocking streams, non-blocking streams, per-thread default streams, the
calls documented as synchronising, counted as CPU waits); and a race detector: a kernel, copy
or memset that conflicts with work in flight on another stream, with nothing ordering it
after, is a hazard naming both, their streams and ranges, as is memory given back or handed
out under such work and a CPU access to pinned memory a copy has yet to write. No kernel runs
and there is no timing: a kernel stays in flight until the test finishes it or a CPU wait
covers it; what a launched kernel reads and writes is the test's to say
(:meth:`Controls.kernel_model`). ``docs/fakes.md`` lists every call.

Code that loads the vendor's library by name (``libcuda.so.1``, ``libamdhip64.so``) finds the
driver too: a profile's environment puts a folder first on ``LD_LIBRARY_PATH`` where the
driver carries those names (:func:`soname_dir`). One copy of the drivers serves every
process and language: a profile's environment names it in ``PORTALLOC_FAKES_DIR``, which the
Rust crate reads too.

Each process has a device of its own unless ``FAKE_SHARED_DEVICE`` names a segment: the
processes that name one share its device, as on a real machine (:class:`SharedDevice`).

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
import struct
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

__all__ = [
    "CUDA",
    "HIP",
    "CALLS",
    "CODES",
    "DRIVERS",
    "KIT_VERSION",
    "MATRIX",
    "EXTRA",
    "PROFILE_VARIABLE",
    "SHARED_VARIABLE",
    "SONAMES",
    "Controls",
    "Census",
    "FakesError",
    "Holder",
    "Profile",
    "SharedDevice",
    "SharedObject",
    "current",
    "driver_dir",
    "driver_path",
    "names",
    "profile",
    "soname_dir",
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

DIR_VARIABLE = "PORTALLOC_FAKES_DIR"
"""A folder of drivers built already (the Rust crate's, say): used as it is. Set by
:meth:`Profile.env`, so that every process of a test, in any language, loads one copy."""

KIT_VERSION = 4
"""The version of the drivers' controls this module speaks (``fake_kit_version``)."""

SONAMES: Dict[str, Tuple[str, ...]] = {
    CUDA: ("libcuda.so.1", "libcuda.so"),
    HIP: ("libamdhip64.so", "libamdhip64.so.5", "libamdhip64.so.6", "libamdhip64.so.7"),
}
"""The names a program loads each vendor's library by: each is in every driver's
:func:`soname_dir`."""

_DT_SONAME = {CUDA: "libcuda.so.1", HIP: "libamdhip64.so.6"}

CALLS: Dict[str, str] = {
    "allocation": "@alloc",
    "free": "@free",
    "host_allocation": "@host_alloc",
    "host_free": "@host_free",
    "reservation": "@reserve",
    "map": "@map",
    "unmap": "@unmap",
    "copy": "@copy",
    "memset": "@memset",
    "launch": "@launch",
    "synchronize": "@sync",
    "stream_creation": "@stream",
    "event": "@event",
    "wait": "@wait",
    "query": "@query",
    "pool": "@pool",
    "module": "@module",
}
"""Kinds of call, whichever vendor call makes them, and the drivers' group of each: what
:meth:`Controls.fail_next` takes (the Rust crate's ``Call``)."""

CODES = (
    "invalid_value",
    "out_of_memory",
    "not_initialized",
    "no_device",
    "invalid_device",
    "invalid_handle",
    "not_found",
    "not_ready",
    "illegal_address",
    "launch_failed",
    "not_supported",
    "unknown",
)
"""Statuses by what they mean, each answered with the vendor's number (the Rust crate's
``Code``): what :meth:`Controls.fail` takes beside a raw number."""

# The most of a compiler's complaint an error message carries.
_MESSAGE_LIMIT = 2000


class FakesError(RuntimeError):
    """A driver could not be built or loaded: what failed and what would help."""


def _sources() -> pathlib.Path:
    """The drivers' C sources: inside the installed package (``_fakes/``), else the
    repository's (``fakes/drivers``, for a source tree)."""
    here = pathlib.Path(__file__).resolve().parent
    for folder in (here / "_fakes", here.parent.parent / "fakes" / "drivers"):
        if (folder / "fake_core.h").is_file():
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


def _link_sonames(folder: pathlib.Path, name: str) -> None:
    """``folder/sonames/<name>/`` with the vendor's library names, linked to ``lib<name>.so``
    (relative links, as the Rust crate's build makes them)."""
    links = folder / "sonames" / name
    links.mkdir(parents=True, exist_ok=True)
    for soname in SONAMES[DRIVERS[name]]:
        at = links / soname
        if at.is_symlink() or at.exists():
            continue
        try:
            os.symlink(os.path.join("..", "..", "lib%s.so" % name), str(at))
        except FileExistsError:
            pass  # another process linked it first


def _build(name: str) -> pathlib.Path:
    """Driver ``name`` in the cache (built once per version of the sources and compiler): the
    first use builds every driver there, each with its vendor's soname and its folder of the
    vendor's names, so that a folder a profile names in ``PORTALLOC_FAKES_DIR`` always holds
    all of them (a shell that evaluates one profile's environment after another reads the
    next profile's driver from it); its path."""
    sources = _sources()
    digest = hashlib.sha256(" ".join(_compiler() + _FLAGS).encode())
    digest.update(_sources_digest(sources))
    folder = _cache_root() / digest.hexdigest()[:16]
    for each in DRIVERS:
        _build_one(sources, folder, each)
    return folder / ("lib%s.so" % name)


def _build_one(sources: pathlib.Path, folder: pathlib.Path, name: str) -> None:
    """Builds driver ``name`` into ``folder`` unless it is there, with its soname links."""
    library = folder / ("lib%s.so" % name)
    if library.is_file():
        _link_sonames(folder, name)
        return
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
    soname = "-Wl,-soname,%s" % _DT_SONAME[DRIVERS[name]]
    command = _compiler() + _FLAGS + [soname, "-o", partial, str(sources / ("%s.c" % name))]
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
        _link_sonames(folder, name)
    except OSError as e:
        raise FakesError("cannot place %s (%s)" % (library, e)) from None


def driver_path(name: str) -> str:
    """The built library of driver ``name`` (a key of :data:`DRIVERS`), built on first use.

    :raises KeyError: for a name that is not a driver.
    :raises FakesError: when it cannot be built.
    """
    if name not in DRIVERS:
        raise KeyError("no driver %r; the drivers are: %s" % (name[:64], ", ".join(DRIVERS)))
    built = os.environ.get(DIR_VARIABLE)
    if built:
        path = pathlib.Path(built) / ("lib%s.so" % name)
        if not path.is_file():
            raise FakesError("%s=%s holds no %s" % (DIR_VARIABLE, built, path.name))
        return str(path)
    return str(_build(name))


def driver_dir() -> str:
    """The folder of drivers in use: ``$PORTALLOC_FAKES_DIR`` when set, else this package's
    cache (built on first use)."""
    return os.path.dirname(driver_path("fakecuda"))


def soname_dir(name: str) -> str:
    """The folder in which driver ``name`` carries its vendor's library names
    (:data:`SONAMES`): first on the loader's path, code that loads ``libcuda.so.1`` or
    ``libamdhip64.so`` by name gets this driver — the same library as :func:`driver_path`.

    :raises KeyError: for a name that is not a driver."""
    path = driver_path(name)
    return os.path.join(os.path.dirname(path), "sonames", name)


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

    def library(self) -> str:
        """The path the vendor's library variable is set to, and the library
        :class:`Controls` opens: :meth:`driver_path` (the Rust crate's
        ``Profile::library``)."""
        return self.driver_path()

    def env(self, base: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
        """The variables that run code under this profile: the vendor's library variable
        (``PORTALLOC_CUDA_LIBRARY`` / ``PORTALLOC_HIP_LIBRARY``) set to the driver's path,
        ``PORTALLOC_BACKEND`` to the vendor (so that a real driver the machine also has is
        not picked), ``LD_LIBRARY_PATH`` with the driver's :func:`soname_dir` first (and no
        other driver's: ``base``'s, default this process's, is kept after it),
        ``PORTALLOC_FAKES_DIR`` naming this copy of the drivers, the profile's own, and
        :data:`PROFILE_VARIABLE` to its name."""
        inherited = (os.environ if base is None else base).get("LD_LIBRARY_PATH", "")
        others = [
            p
            for p in inherited.split(os.pathsep)
            if p and not any(p.rstrip("/").endswith("/sonames/" + d) for d in DRIVERS)
        ]
        path = self.driver_path()
        env = {
            LIBRARY_VARIABLE[self.vendor]: path,
            "PORTALLOC_BACKEND": self.vendor,
            "LD_LIBRARY_PATH": os.pathsep.join([soname_dir(self.driver)] + others),
            DIR_VARIABLE: os.path.dirname(path),
        }
        env.update(self.vars)
        env[PROFILE_VARIABLE] = self.name
        return env

    def environ(self, base: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
        """``base`` (default: this process's environment) less every variable another profile
        may have set (:func:`variables`), with :meth:`env` over it: for ``subprocess``'s
        ``env=``."""
        merged = dict(os.environ if base is None else base)
        for name in variables():
            merged.pop(name, None)
        merged.update(self.env(base))
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
        "CUDA 12.2 on an H100 SXM5 80GB: virtual memory, stream-ordered pools, peer access, "
        "pinned memory",
    ),
    _profile(
        "cuda10-no-vmm",
        "fakecuda_old",
        "CUDA 10.1 on a V100-SXM2-16GB: no virtual memory management, no stream-ordered pools",
    ),
    _profile(
        "cuda12-no-peer",
        "fakecuda_nopeer",
        "two devices without a peer link (cuDeviceCanAccessPeer says no)",
        ("FAKECUDA_DEVICES", "2"),
    ),
    _profile(
        "cuda12-no-pinned",
        "fakecuda_nopinned",
        "host memory cannot be page-locked (cuMemHostAlloc refuses)",
    ),
    _profile(
        "rocm5",
        "fakehip",
        "ROCm 5.2 on an MI250X GCD: no virtual-memory attribute, the 5.x device-properties "
        "layout and memory types",
        ("FAKEHIP_VERSION", "50221153"),
    ),
    _profile(
        "rocm6", "fakehip", "ROCm 6.2 on an MI300X as documented", ("FAKEHIP_VERSION", "60241133")
    ),
    _profile("rocm7", "fakehip", "ROCm 7.0 on an MI300X as documented", _ROCM7),
    _profile(
        "rocm7-two-devices",
        "fakehip",
        "ROCm 7.0 with two MI300X: a current device per thread, peer access",
        _ROCM7,
        ("FAKEHIP_DEVICES", "2"),
    ),
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

EXTRA: Tuple[Profile, ...] = (
    _profile(
        "rocm7-descriptor-per-handle",
        "fakehip",
        "ROCm 7.14: hipMemCreate opens a file descriptor per handle, so the process's "
        "RLIMIT_NOFILE bounds its handles (~1015 at ulimit -n 1024) and hipMemCreate answers "
        "out of memory past it (ROCm/rocm-systems#10604)",
        ("FAKEHIP_VERSION", "71460850"),
        ("FAKEHIP_PROFILE", "rocm-systems-10604-descriptor-per-handle"),
    ),
)
"""Profiles kept out of :data:`MATRIX`: each models a behaviour only a test written for it can
see, so a matrix test run under it would cost a process and prove nothing more.
:func:`profile` finds them by name. The same as the Rust crate's ``EXTRA``."""


def names() -> List[str]:
    """The profiles' names, in :data:`MATRIX`'s order (pytest's ``ids=``)."""
    return [p.name for p in MATRIX]


def variables() -> List[str]:
    """The variables any profile sets, and every one the drivers read to pick a personality:
    :meth:`Profile.environ` removes them all before it sets its own (and ``env`` on the command
    line unsets them), so that nothing another profile set (exported by a shell, say) leaks
    into it. ``FAKE_GUARD_HOST`` and ``FAKE_SHARED_DEVICE`` (:class:`SharedDevice`), switches of
    the kit rather than personalities, are kept."""
    found = [
        "PORTALLOC_CUDA_LIBRARY",
        "PORTALLOC_HIP_LIBRARY",
        "PORTALLOC_BACKEND",
        PROFILE_VARIABLE,
        DIR_VARIABLE,
        "FAKECUDA_DEVICES",
        "FAKECUDA_CAPACITY",
        "FAKECUDA_GRANULARITY",
        "FAKECUDA_VERSION",
        "FAKECUDA_DEVICE",
        "FAKEHIP_DEVICES",
        "FAKEHIP_CAPACITY",
        "FAKEHIP_VERSION",
        "FAKEHIP_PROFILE",
        "FAKEHIP_DEVICE",
    ]
    for p in MATRIX + EXTRA:
        for key, _ in p.vars:
            if key not in found:
                found.append(key)
    return found


def profile(name: str) -> Profile:
    """The profile named ``name``, of :data:`MATRIX` or :data:`EXTRA`.

    :raises KeyError: naming the profiles there are, when neither has such one.
    """
    for p in MATRIX + EXTRA:
        if p.name == name:
            return p
    raise KeyError(
        "no profile %r; there are: %s"
        % (name[:64], ", ".join(names() + [p.name for p in EXTRA]))
    )


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
    "modules",
    "in_flight",
    "contexts",
)
"""The live counts both drivers answer (:meth:`Controls.live`); ``contexts`` is CUDA's primary
retains and created contexts, and -1 under HIP, which has none a caller retains."""

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
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError("%s: %s as int, not %s" % (call, name, type(value).__name__))
    low, high = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
    if not low <= value <= high:
        raise OverflowError("%s: %s=%d is outside [%d, %d]" % (call, name, value, low, high))


class Controls:
    """The controls every driver exports beside the vendor's API (``fake_core.h`` and its
    concerns; ``docs/fakes.md`` says what each answers): faults, call counts, live objects,
    kernels in flight and the hazards the race detector logs.

    Open them on the path the code under test loaded, in the same process (the same path is
    the same loaded library, hence the same driver state): ``Controls.current()``, or
    ``Controls(profile.library())``. The checks that could pass vacuously — :meth:`census`,
    :meth:`holds_no_memory`, :meth:`hazards` — refuse a driver the code under test never
    initialised in this process: it watches another copy.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        try:
            self._lib = ctypes.CDLL(path)
        except (OSError, ValueError, TypeError) as e:
            raise FakesError("cannot load the fake driver %s: %s" % (path, e)) from None
        try:
            self._declare(self._lib)
        except AttributeError as e:
            raise FakesError("%s is not one of the fake drivers: %s" % (path, e)) from None
        found = int(self._lib.fake_kit_version())
        if found != KIT_VERSION:
            raise FakesError(
                "%s speaks version %d of the kit's controls, this module version %d: it was "
                "built from other sources (PORTALLOC_FAKES_DIR names another build?)"
                % (path, found, KIT_VERSION)
            )

    @classmethod
    def current(cls) -> "Controls":
        """The controls of the driver of the profile this process runs under: the library the
        profile's environment names, so the one the code under test loads.

        :raises FakesError: outside a profile."""
        p = current()
        if p is None:
            raise FakesError(
                "this process runs under no profile (%s is unset): open the driver by path, "
                "or run under Profile.run" % PROFILE_VARIABLE
            )
        return cls(p.library())

    @staticmethod
    def _declare(lib: ctypes.CDLL) -> None:
        c = ctypes
        signatures = {
            "fake_kit_version": ([], c.c_int),
            "fake_initialised": ([], c.c_int),
            "fake_fail": ([c.c_char_p, c.c_long, c.c_long, c.c_int], None),
            "fake_fail_target": ([c.c_char_p], c.c_int),
            "fake_code": ([c.c_char_p], c.c_int),
            "fake_export": ([c.c_int], c.c_char_p),
            "fake_clear_faults": ([], None),
            "fake_calls": ([c.c_char_p], c.c_longlong),
            "fake_live": ([c.c_char_p], c.c_longlong),
            "fake_launch_mode": ([c.c_void_p, c.c_ulonglong, c.c_ulonglong, c.c_int], c.c_ulonglong),
            "fake_finish": ([c.c_ulonglong], None),
            "fake_finish_all": ([], None),
            "fake_last_kernel": ([], c.c_ulonglong),
            "fake_kernel_done": ([c.c_ulonglong], c.c_int),
            "fake_ordered": ([c.c_ulonglong, c.c_void_p], c.c_int),
            "fake_streams_ordered": ([c.c_void_p, c.c_void_p], c.c_int),
            "fake_in_flight": ([], c.c_longlong),
            "fake_hold": ([c.c_int], None),
            "fake_query_patience": ([c.c_int], c.c_int),
            "fake_kernel_model": ([c.c_char_p, c.c_char_p], c.c_int),
            "fake_hazards": ([], c.c_longlong),
            "fake_hazard": ([c.c_longlong], c.c_char_p),
            "fake_cpu_waits": ([], c.c_longlong),
            "fake_gpu_waits": ([], c.c_longlong),
            "fake_capture_invalidations": ([c.c_char_p, c.c_ulonglong], c.c_longlong),
            "fake_graph_launches": ([c.c_ulonglong], c.c_longlong),
        }
        for name, (args, result) in signatures.items():
            function = getattr(lib, name)
            function.argtypes = args
            function.restype = result

    def exports(self) -> List[str]:
        """Every call the driver exports (what :meth:`fail` takes, with the groups of
        :data:`CALLS`)."""
        found: List[str] = []
        i = 0
        while True:
            name = self._lib.fake_export(i)
            if not name:
                return found
            found.append(name.decode())
            i += 1

    def code(self, code: Union[int, str]) -> int:
        """The driver's number for ``code``: a name of :data:`CODES`, or a number as it is.

        :raises KeyError: for a name the driver has no number for."""
        if isinstance(code, bool):
            raise TypeError("code: a name of CODES or a number, not a bool")
        if isinstance(code, int):
            _within("code", "code", code, 32)
            return code
        n = int(self._lib.fake_code(_name("code", code)))
        if n < 0:
            raise KeyError("the driver has no code %r; the names are: %s" % (code[:64], ", ".join(CODES)))
        return n

    def fail(self, function: str, nth: int, count: int, code: Union[int, str]) -> None:
        """Calls ``nth`` .. ``nth + count - 1`` of ``function`` (1-based, counted from now;
        ``count < 0``: every one from the ``nth`` on) return ``code`` (a name of :data:`CODES`
        or the vendor's number). ``function`` is a call the driver exports (:meth:`exports`)
        or a group of them (the values of :data:`CALLS`), counted across its calls. At most 32
        faults are armed at once (a fault's slot is free after its last failing call).

        :raises ValueError: for a name that is empty, 64 characters or more, or holds a NUL.
        :raises KeyError: for a name that is neither an exported call nor a group (a fault on
            it would never fire), or a code name the driver has no number for.
        :raises OverflowError: for a number the C call cannot take."""
        name = _name("fail", function)
        if not 1 <= len(name) < 64:
            raise ValueError("fail: a function name of 1 to 63 characters, not %d" % len(name))
        _within("fail", "nth", nth, 64)
        _within("fail", "count", count, 64)
        number = self.code(code)
        if not self._lib.fake_fail_target(name):
            like = [e for e in self.exports() if e.startswith(function[:5])][:12]
            raise KeyError(
                "fail: %s exports no call %r and it is no group (%s), so the fault would never "
                "fire; calls of its family: %s"
                % (self.path, function[:64], ", ".join(sorted(CALLS.values())), ", ".join(like) or "none")
            )
        self._lib.fake_fail(name, nth, count, number)

    def fail_next(self, call: str, code: Union[int, str]) -> None:
        """The next call of kind ``call`` (a key of :data:`CALLS`, or its group), whichever
        vendor call makes it, fails with ``code``.

        :raises KeyError: for an unknown kind."""
        group = CALLS.get(call, call)
        if group not in CALLS.values():
            raise KeyError("no kind of call %r; the kinds are: %s" % (call[:64], ", ".join(CALLS)))
        self.fail(group, 1, 1, code)

    def clear_faults(self) -> None:
        """Disarms every fault."""
        self._lib.fake_clear_faults()

    def calls(self, function: str) -> int:
        """How many times the vendor call ``function`` was made, failed ones included (0 for
        one the driver does not export)."""
        return int(self._lib.fake_calls(_name("calls", function)))

    def initialised(self) -> bool:
        """Whether the code under test initialised this driver in this process (``cuInit``,
        or any HIP call): false means it loaded another copy."""
        return bool(self._lib.fake_initialised())

    def _require_initialised(self, what: str) -> None:
        if not self.initialised():
            raise FakesError(
                "%s: the driver at %s was never initialised in this process, so it is not the "
                "one the code under test loaded (another copy?); open the profile's library "
                "(Controls.current(), profile.library())" % (what, self.path)
            )

    def live(self, what: str) -> int:
        """A live count (a name of :data:`LIVE`), raw: it does not ask whether the driver was
        initialised.

        :raises KeyError: for a name the driver does not know (``contexts`` is -1 under HIP,
            which has no context a caller retains)."""
        n = int(self._lib.fake_live(_name("live", what)))
        if n < 0 and what != "contexts":
            raise KeyError("no live count %r; the names are: %s" % (what[:64], ", ".join(LIVE)))
        return n

    def census(self) -> Census:
        """Every live count.

        :raises FakesError: when the driver was never initialised in this process."""
        self._require_initialised("census")
        return {what: self.live(what) for what in LIVE}

    def holds_no_memory(self) -> bool:
        """True when no device memory, pinned host memory or address range is held.

        :raises FakesError: when the driver was never initialised in this process."""
        self._require_initialised("holds_no_memory")
        return all(self.live(what) == 0 for what in _MEMORY)

    def launch(self, stream: int, ptr: int, size: int, writes: bool = False) -> int:
        """A kernel on ``stream`` (a handle as an int; 0 for the default stream) that reads
        ``[ptr, ptr + size)`` (and writes it, with ``writes``), in flight until :meth:`finish`
        or a CPU wait that covers it.

        :raises KeyError: when the driver does not know the stream."""
        for name, value in (("stream", stream), ("ptr", ptr), ("size", size)):
            _within("launch", name, value, 64, signed=False)
        mode = 3 if writes else 1
        kernel = int(self._lib.fake_launch_mode(ctypes.c_void_p(stream), ptr, size, mode))
        if kernel == 0:
            raise KeyError("the driver knows no stream %#x" % stream)
        return kernel

    def kernel_model(self, name: str, model: str) -> None:
        """Says what kernel ``name`` reads and writes, for every launch of a function of that
        name: accesses separated by spaces, each ``MODE:aN[+OFFSET]:SIZE`` (``MODE`` r, w or
        rw; ``aN`` parameter N, a device pointer; ``SIZE`` a product of numbers, ``iN`` and
        ``zN``: parameter N as an int or a 64-bit size), e.g. ``"r:a0:4*i2 w:a1:4*i2"``.

        :raises ValueError: for a model the driver cannot read (the position says where), a
            name of no or 64+ characters, or more than 256 models."""
        rc = int(self._lib.fake_kernel_model(_name("kernel_model", name), _name("kernel_model", model)))
        if rc > 0:
            raise ValueError(
                "kernel model %r: cannot read from character %d on (accesses are "
                "MODE:aN[+OFFSET]:SIZE)" % (model[:200], rc)
            )
        if rc < 0:
            raise ValueError("kernel model refused: a name of 1 to 63 characters, at most 256 models")

    def finish(self, kernel: int) -> None:
        """The kernel completes (nothing for an unknown or finished one)."""
        _within("finish", "kernel", kernel, 64, signed=False)
        self._lib.fake_finish(kernel)

    def finish_all(self) -> None:
        """Every kernel in flight completes and every host function runs (no CPU wait is
        counted)."""
        self._lib.fake_finish_all()

    def last_kernel(self) -> Optional[int]:
        """The last kernel the calling thread launched (the vendor's launch calls, or
        :meth:`launch`)."""
        kernel = int(self._lib.fake_last_kernel())
        return kernel or None

    def done(self, kernel: int) -> bool:
        """Whether the kernel completed (:meth:`finish`, or a CPU wait).

        :raises KeyError: for a kernel this driver did not launch."""
        _within("done", "kernel", kernel, 64, signed=False)
        state = int(self._lib.fake_kernel_done(kernel))
        if state < 0:
            raise KeyError("kernel %d is not one this driver launched" % kernel)
        return state == 1

    def ordered(self, kernel: int, stream: int) -> bool:
        """Whether work queued on ``stream`` from now on runs after ``kernel`` (it completed,
        it is on that stream, or the stream waits for it on the GPU).

        :raises KeyError: for a kernel or stream the driver does not know."""
        _within("ordered", "kernel", kernel, 64, signed=False)
        _within("ordered", "stream", stream, 64, signed=False)
        said = int(self._lib.fake_ordered(kernel, ctypes.c_void_p(stream)))
        if said < 0:
            raise KeyError("the driver knows no kernel %d or stream %#x" % (kernel, stream))
        return said == 1

    def streams_ordered(self, first: int, then: int) -> bool:
        """Whether everything queued so far on ``first`` runs before what is queued next on
        ``then``.

        :raises KeyError: for a stream the driver does not know."""
        _within("streams_ordered", "first", first, 64, signed=False)
        _within("streams_ordered", "then", then, 64, signed=False)
        said = int(self._lib.fake_streams_ordered(ctypes.c_void_p(first), ctypes.c_void_p(then)))
        if said < 0:
            raise KeyError("the driver knows no stream %#x or %#x" % (first, then))
        return said == 1

    def in_flight(self) -> int:
        """Kernels, host functions, copies and memsets not complete."""
        return int(self._lib.fake_in_flight())

    def hold(self, held: bool) -> None:
        """While held, nothing completes that a CPU wait does not force: every copy, memset and
        kernel stays in flight until the code under test synchronises, so a wait missing after
        a copy is seen whatever came before it. Releasing completes everything, in stream
        order."""
        if not isinstance(held, bool):
            raise TypeError("hold: held as bool, not %s" % type(held).__name__)
        self._lib.fake_hold(1 if held else 0)

    def query_patience(self, queries: int) -> int:
        """How many times in a row a stream or event may be queried "not ready" before the
        query completes what it waits for, as a CPU wait would (0: never); answers the previous
        value (the drivers start at 1000)."""
        _within("query_patience", "queries", queries, 32)
        if queries < 0:
            raise ValueError("query_patience: queries >= 0, not %d" % queries)
        return int(self._lib.fake_query_patience(queries))

    def hazards(self) -> int:
        """How many hazards the driver logged (undefined behaviour on a GPU, each: a race
        between streams, memory given back or handed out under work in flight, a CPU access to
        pinned memory a copy had yet to write).

        :raises FakesError: when the driver was never initialised in this process."""
        self._require_initialised("hazards")
        return int(self._lib.fake_hazards())

    def hazard_log(self) -> List[str]:
        """The hazards' texts, each naming the operations, their streams and ranges (the
        first 64 are kept)."""
        texts: List[str] = []
        i = 0
        while True:
            said = self._lib.fake_hazard(i)
            if not said:
                return texts
            texts.append(said.decode(errors="replace"))
            i += 1

    def first_hazard(self) -> str:
        """What the first hazard was ("" for none)."""
        log = self.hazard_log()
        return log[0] if log else ""

    def cpu_waits(self) -> int:
        """CPU waits so far: synchronisations, and the calls documented as synchronising."""
        return int(self._lib.fake_cpu_waits())

    def gpu_waits(self) -> int:
        """GPU-side waits the caller asked for (the stream-wait-event calls)."""
        return int(self._lib.fake_gpu_waits())

    def capture_invalidations(self) -> Tuple[int, str]:
        """Stream captures invalidated since the driver's last reset (a call the capture
        forbids, a query of an event recorded in it, an operation the fake does not capture,
        a fork not joined back), and why the last one was ("" when none was)."""
        buf = ctypes.create_string_buffer(256)
        n = int(self._lib.fake_capture_invalidations(buf, len(buf)))
        return n, buf.value.decode(errors="replace")

    def graph_launches(self, exec_handle: int) -> Optional[int]:
        """How many times the executable graph ``exec_handle`` was launched; None for a
        handle that names none."""
        _within("graph_launches", "exec_handle", exec_handle, 64, signed=False)
        n = int(self._lib.fake_graph_launches(exec_handle))
        return n if n >= 0 else None


SHARED_VARIABLE = "FAKE_SHARED_DEVICE"
"""The variable the drivers read once, when they first prepare themselves: a name (letters,
digits, ``-``, ``_``, ``.``; at most 64), the file ``/dev/shm/portalloc-fake-<name>.<euid>``,
or an absolute path, that file. Every process that names one segment shares its device; unset
or empty, each process has a private device (``fake_shared.h``)."""

# The segment's layout (fake_shared.h; native byte order): a 96-byte header (u64 magic, u32
# layout version, u32 ready, u32 devices, u32 slots, u64 claims, u64 capacity[8]), then 64
# slots of 80 bytes (u64 owner: pid << 32 | claim counter, bit 31 while being claimed; u64
# start time; u64 used[8]), then (layout version 2) 1024 exported objects of 32 bytes (u64
# key, 0: free; u64 size; u32 device; u32 pad; u64 holders: bit i, slot i holds it), each
# counted once while a live slot holds it.
_SHARED_MAGIC = 0x5645444B41464150
_SHARED_LAYOUT_VERSION = 2
_SHARED_DEVICES = 8
_SHARED_SLOTS = 64
_SHARED_OBJECTS = 1024
_SHARED_HEADER = struct.Struct("=QIIIIQ8Q")
_SHARED_SLOT = struct.Struct("=QQ8Q")
_SHARED_OBJECT = struct.Struct("=QQIIQ")
_SHARED_SIZE = (
    _SHARED_HEADER.size + _SHARED_SLOT.size * _SHARED_SLOTS + _SHARED_OBJECT.size * _SHARED_OBJECTS
)
_SHARED_CLAIMING = 0x80000000
_SHARED_NAMES = [0]


@dataclasses.dataclass(frozen=True)
class Holder:
    """A live process holding memory on a shared device: its pid and the bytes its driver
    charged, with those of every exported object it holds (each counted once in
    :meth:`SharedDevice.used`)."""

    pid: int
    bytes: int


@dataclasses.dataclass(frozen=True)
class SharedObject:
    """An exported physical allocation on a shared device (a handle created exportable),
    counted once while any live process holds it: its key (creator pid << 32 | counter), bytes,
    device and the live holders' pids."""

    key: int
    size: int
    device: int
    holders: Tuple[int, ...]


def _proc_start(pid: int) -> Optional[Tuple[int, bool]]:
    """Field 22 of ``/proc/<pid>/stat`` (the start time) and whether the process is a zombie;
    None when there is no such process."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 1 :].split()  # the name (field 2) ends at the last ')'
    if len(fields) < 20:
        return None
    return int(fields[19]), fields[0] in (b"Z", b"X")


class SharedDevice:
    """A device shared by the processes given its environment (:meth:`env`); what it holds,
    read from the segment file, independently of the drivers: a test's oracle for the
    drivers' free memory and for what each process holds.

    ``name`` is a name or an absolute path, as :data:`SHARED_VARIABLE` takes it. The drivers
    create the file when the first process prepares its driver; :meth:`close` (or leaving a
    ``with`` block) removes it if it was not there when this object was made::

        with testing.SharedDevice.unique() as device:
            env = testing.profile("cuda12").environ()
            env.update(device.env())
            ...  # start processes with env; then device.holders(0), device.free(0)
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.path = self._path(name)
        self._fresh = not os.path.exists(self.path)

    @staticmethod
    def _path(name: str) -> str:
        if name.startswith("/"):
            return name
        allowed = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")
        if not name or len(name) > 64 or not set(name) <= allowed:
            raise ValueError(
                "%s=%.80r: not a name (letters, digits, '-', '_', '.'; at most 64) nor an "
                "absolute path" % (SHARED_VARIABLE, name)
            )
        return "/dev/shm/portalloc-fake-%s.%d" % (name, os.geteuid())

    @classmethod
    def unique(cls) -> "SharedDevice":
        """A segment of a name no other ``SharedDevice`` has used: ``p<pid>-<counter>-<ns>``."""
        _SHARED_NAMES[0] += 1
        nanos = time.time_ns() % 10**9
        return cls("p%d-%d-%d" % (os.getpid(), _SHARED_NAMES[0], nanos))

    def env(self) -> Dict[str, str]:
        """The variables to add to a child's environment: :data:`SHARED_VARIABLE`."""
        return {SHARED_VARIABLE: self.name}

    def _read(
        self,
    ) -> Tuple[
        Tuple[int, ...], List[Tuple[int, int, Tuple[int, ...]]], List[Tuple[int, int, int, int]]
    ]:
        with open(self.path, "rb") as f:
            data = f.read()
        if len(data) != _SHARED_SIZE:
            raise FakesError("%s: %d bytes, a segment is %d" % (self.path, len(data), _SHARED_SIZE))
        header = _SHARED_HEADER.unpack_from(data, 0)
        if header[0] != _SHARED_MAGIC or header[1] != _SHARED_LAYOUT_VERSION:
            raise FakesError(
                "%s: magic %#x, layout version %d: not a segment this kit reads"
                % (self.path, header[0], header[1])
            )
        slots = []
        for i in range(_SHARED_SLOTS):
            fields = _SHARED_SLOT.unpack_from(data, _SHARED_HEADER.size + _SHARED_SLOT.size * i)
            slots.append((fields[0], fields[1], fields[2:]))
        objects = []
        base = _SHARED_HEADER.size + _SHARED_SLOT.size * _SHARED_SLOTS
        for i in range(_SHARED_OBJECTS):
            key, size, device, _pad, holders = _SHARED_OBJECT.unpack_from(
                data, base + _SHARED_OBJECT.size * i
            )
            objects.append((key, size, device, holders))
        return header[6:], slots, objects

    @staticmethod
    def _live(slots: List[Tuple[int, int, Tuple[int, ...]]]) -> int:
        """The live slots as bits (the drivers' rule: an owner whose process runs, no zombie,
        and started when the slot says)."""
        mask = 0
        for i, (owner, start_time, _used) in enumerate(slots):
            if not owner or owner & _SHARED_CLAIMING:
                continue
            proc = _proc_start(owner >> 32)
            if proc is not None and not proc[1] and proc[0] == start_time:
                mask |= 1 << i
        return mask

    def capacity(self, device: int) -> int:
        """The bytes ``device`` has: the segment creator's capacity."""
        return self._read()[0][device]

    def objects(self) -> List[SharedObject]:
        """The exported objects some live process holds, with their live holders' pids."""
        _capacity, slots, objects = self._read()
        live = self._live(slots)
        return [
            SharedObject(
                key,
                size,
                device,
                tuple(slots[i][0] >> 32 for i in range(_SHARED_SLOTS) if (holders & live) >> i & 1),
            )
            for key, size, device, holders in objects
            if key and holders & live
        ]

    def holders(self, device: int) -> List[Holder]:
        """The live processes holding memory on ``device``, by slot: what each charged and the
        exported objects it holds."""
        _capacity, slots, objects = self._read()
        live = self._live(slots)
        found = []
        for i, (owner, _start_time, used) in enumerate(slots):
            if not live >> i & 1:
                continue
            held = used[device] + sum(
                size
                for key, size, dev, holders in objects
                if key and dev == device and holders & live and holders >> i & 1
            )
            if held:
                found.append(Holder(owner >> 32, held))
        return found

    def used(self, device: int) -> int:
        """The bytes every live process holds on ``device``: their charges, and each exported
        object some live process holds, once."""
        _capacity, slots, objects = self._read()
        live = self._live(slots)
        charged = sum(slots[i][2][device] for i in range(_SHARED_SLOTS) if live >> i & 1)
        return charged + sum(
            size for key, size, dev, holders in objects if key and dev == device and holders & live
        )

    def free(self, device: int) -> int:
        """What the drivers' memory information reports free: the capacity less
        :meth:`used`."""
        return max(0, self.capacity(device) - self.used(device))

    def close(self) -> None:
        """Removes the segment file if it was not there when this object was made."""
        if self._fresh:
            self._fresh = False
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass

    def __enter__(self) -> "SharedDevice":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _main(argv: Sequence[str]) -> int:
    usage = (
        "usage: python -m portalloc.testing list [--extra] [--json] | env PROFILE | path DRIVER "
        "| sonames DRIVER\n"
        "  list     the matrix: each profile, its driver and what it models (--extra: the\n"
        "           profiles kept out of the matrix)\n"
        "  env      one profile's variables as shell exports (eval \"$(...)\")\n"
        "  path     a driver's built library\n"
        "  sonames  the folder where a driver carries its vendor's library names"
    )
    if not argv or argv[0] in ("-h", "--help"):
        print(usage)
        return 0 if argv else 2
    try:
        options = argv[1:]
        if argv[0] == "list" and len(options) == len(set(options)) <= 2 and all(
            o in ("--json", "--extra") for o in options
        ):
            listed = EXTRA if "--extra" in options else MATRIX
            if "--json" in options:
                rows = [dataclasses.asdict(p) for p in listed]
                print(json.dumps(rows, indent=1))
            else:
                for p in listed:
                    print("%-24s %-18s %s" % (p.name, p.driver, p.models))
            return 0
        if argv[0] == "env" and len(argv) == 2:
            env = profile(argv[1]).env()
            # What another profile (or an earlier `eval`) set goes first.
            for key in variables():
                if key not in env:
                    print("unset %s" % key)
            for key, value in env.items():
                print("export %s=%s" % (key, shlex.quote(value)))
            return 0
        if argv[0] == "path" and len(argv) == 2:
            print(driver_path(argv[1]))
            return 0
        if argv[0] == "sonames" and len(argv) == 2:
            print(soname_dir(argv[1]))
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
