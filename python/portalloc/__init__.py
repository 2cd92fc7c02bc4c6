"""portalloc for Python: ctypes bindings of ``libportalloc.so`` (the C ABI, cargo feature
``c-api``) and installation into PyTorch or CuPy. Standard library only.

    import portalloc
    portalloc.install()              # PyTorch and/or CuPy, whichever is importable
    ...
    print(portalloc.stats())         # the device's global allocator (the one the hooks use)
    print(portalloc.ledger()["tags"])

or explicitly::

    with portalloc.Allocator.create(strategy="bfc", mem_fraction=0.5) as a:
        buf = a.allocate(1 << 20, tag="workspace")
        a.free(buf)

Installed with ``pip install ./python`` (from the repository root), the package holds the
library (``libportalloc.abi3.so``, built from the workspace member ``capi/``) next to this
file, which is where it is loaded from; ``PORTALLOC_LIBRARY`` (a path), when set, names
another one. From a source tree (``PYTHONPATH=python``) it is ``target/release`` or
``target/debug`` (``cargo build -p portalloc-capi``), then the loader's search path.
Allocators read the same environment variables as JAX (``XLA_PYTHON_CLIENT_ALLOCATOR``,
``XLA_CLIENT_MEM_FRACTION``, ``XLA_PYTHON_CLIENT_PREALLOCATE``) and ``PORTALLOC_*``.

Every value is checked before it reaches ctypes, which would otherwise wrap integers around
(``2**64 + 4096`` bytes would be 4096) and cut text at a NUL: an integer outside what the C
ABI takes is an ``OverflowError``, something that is not an integer a ``TypeError``, text
with a NUL (or not ``str``) a ``ValueError`` (``TypeError``); each names the argument, the
value and what is accepted. Paths are ``str``, ``bytes`` or ``os.PathLike``.

An owned :class:`Allocator` is destroyed by :meth:`Allocator.close`, by ``with``, or, when
the last reference to it (or to one of its buffers: a :class:`Buffer` keeps its allocator
alive) goes, by its finalizer (``weakref.finalize``, which also runs at interpreter exit).
The global allocators (:func:`global_allocator`) are never destroyed.
"""

import ctypes
import ctypes.util
import importlib
import importlib.metadata
import json
import numbers
import operator
import os
import pathlib
import threading
import weakref
from contextlib import contextmanager
from typing import (
    Any,
    Callable,
    Dict,
    Iterator,
    List,
    Optional,
    SupportsIndex,
    Tuple,
    TypedDict,
    Union,
    cast,
)

__all__ = [
    "__version__",
    "PortallocError",
    "Stats",
    "Buffer",
    "Allocator",
    "load",
    "library_path",
    "install",
    "install_torch",
    "install_cupy",
    "global_allocator",
    "stats",
    "ledger",
    "sleep",
    "wake",
    "tag",
    "region",
    "declare",
    "declare_reclaimable",
    "using",
    "budget",
    "ShareHandle",
    "ImportedBuffer",
    "import_handle",
    "settle",
    "STATUS_NAMES",
]

STATUS_NAMES = {
    0: "OK",
    1: "NULL_ARGUMENT",
    2: "INVALID_ARGUMENT",
    3: "OUT_OF_MEMORY",
    4: "INVALID_HANDLE",
    5: "UNKNOWN_POINTER",
    6: "INVALID_ALLOCATOR",
    7: "CONFIG",
    8: "UNSUPPORTED",
    9: "DEVICE",
    10: "BUFFER_TOO_SMALL",
    11: "PANIC",
    12: "INTERNAL",
    13: "SHARE",
}
try:
    # The installed distribution's version, which setup.py takes from Cargo: the version of
    # the crate the bundled library was built from (its portalloc_version()).
    __version__ = importlib.metadata.version(__name__)
except importlib.metadata.PackageNotFoundError:  # imported from a source tree
    __version__ = "0+source"

PathArg = Union[str, bytes, os.PathLike[str], os.PathLike[bytes]]
"""A path: ``str``, ``bytes`` or ``os.PathLike``."""

_OK = 0
_INVALID_ALLOCATOR = 6
_BUFFER_TOO_SMALL = 10


class PortallocError(RuntimeError):
    """A failed portalloc call: ``status`` (an int), ``name`` (``INVALID_HANDLE``, ...) and the
    library's message."""

    def __init__(self, status: int, message: str) -> None:
        self.status = status
        self.name = STATUS_NAMES.get(status, "UNKNOWN")
        self.message = message
        super().__init__("portalloc: %s: %s" % (self.name, message))

    def __reduce__(self) -> Tuple[Any, Tuple[int, str]]:
        # Picklable with its status (multiprocessing sends a child's error to its parent):
        # the default would call __init__ with the formatted text alone.
        return (PortallocError, (self.status, self.message))


class _Options(ctypes.Structure):
    _fields_ = [
        ("strategy", ctypes.c_char_p),
        ("mem_fraction", ctypes.c_double),
        ("preallocate", ctypes.c_int32),
        ("backend", ctypes.c_char_p),
        ("host_capacity", ctypes.c_uint64),
        ("host_simulated", ctypes.c_int32),
        ("backtrace", ctypes.c_int32),
        ("device", ctypes.c_uint32),
        ("ignore_env", ctypes.c_int32),
        ("peer_access", ctypes.c_int32),
    ]


class Stats(TypedDict):
    """An allocator's counters (:meth:`Allocator.stats`; XLA's ``AllocatorStats`` names), in
    the order of the C ABI's ``PortallocStats``: its ``int`` fields are ``uint64_t``, its
    ``float`` a ``double``."""

    num_allocs: int
    bytes_in_use: int
    peak_bytes_in_use: int
    largest_alloc_size: int
    bytes_limit: int
    bytes_reserved: int
    peak_bytes_reserved: int
    largest_free_block_bytes: int
    pool_bytes: int
    peak_pool_bytes: int
    fragmentation: float
    live_allocations: int
    #: Bytes of buffers asleep (:meth:`Allocator.sleep`): their addresses kept, their device
    #: memory handed back; not in ``bytes_in_use``.
    bytes_asleep: int
    #: Bytes of sleeping buffers' contents held in host memory.
    host_bytes_asleep: int


#: The fields of ``Stats`` that ``PortallocStats`` holds (the rest come from
#: ``portalloc_sleep_stats``).
_SLEEP_FIELDS = ("bytes_asleep", "host_bytes_asleep")


class _Stats(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_double if kind is float else ctypes.c_uint64)
        for name, kind in Stats.__annotations__.items()
        if name not in _SLEEP_FIELDS
    ]


_lib: Optional[ctypes.CDLL] = None
_lib_path: Optional[str] = None


def _candidates(here: pathlib.Path) -> List[pathlib.Path]:
    """Where the library may be, in order: inside the installed package (setuptools-rust
    names it ``libportalloc.abi3.so``; a plain ``libportalloc.so`` copied there too), then the
    cargo output of the source tree this file is in (``python/portalloc/``)."""
    source_target = here.parent.parent / "target"
    return [
        here / "libportalloc.abi3.so",
        here / "libportalloc.so",
        source_target / "release" / "libportalloc.so",
        source_target / "debug" / "libportalloc.so",
    ]


def library_path(path: Optional[PathArg] = None) -> str:
    """The path of libportalloc.so that :func:`load` would open: ``path`` when given, else
    ``PORTALLOC_LIBRARY`` when set, else the one inside this package.

    Raises ``FileNotFoundError`` when there is none."""
    if path:
        return os.fsdecode(path)
    env = os.environ.get("PORTALLOC_LIBRARY")
    if env:
        return env
    for candidate in _candidates(pathlib.Path(__file__).resolve().parent):
        if candidate.exists():
            return str(candidate)
    found = ctypes.util.find_library("portalloc")
    if found:
        return found
    raise FileNotFoundError(
        "libportalloc.so not found: install the package (`pip install ./python` from the "
        "repository root), set PORTALLOC_LIBRARY, or build it with "
        "`cargo build --release -p portalloc-capi`"
    )


def _sig(lib: ctypes.CDLL, name: str, restype: Any, *argtypes: Any) -> None:
    f = getattr(lib, name)
    f.restype = restype
    f.argtypes = list(argtypes)


def load(path: Optional[PathArg] = None) -> ctypes.CDLL:
    """Opens libportalloc.so (once: later calls return the same library, whatever ``path``)
    and declares its functions. Raises ``OSError`` for a library without the C ABI."""
    global _lib, _lib_path
    if _lib is not None:
        return _lib
    p = library_path(path)
    lib = ctypes.CDLL(p)
    # portalloc_create_sized: the C ABI, of a version with this module's options struct.
    if not hasattr(lib, "portalloc_create_sized"):
        raise OSError(
            "%s lacks the portalloc C ABI (or is older than this module): build it with "
            "`cargo build -p portalloc-capi`" % p
        )
    P = ctypes.c_void_p
    S = ctypes.c_int32
    u64 = ctypes.c_uint64
    _sig(lib, "portalloc_version", ctypes.c_char_p)
    _sig(lib, "portalloc_status_name", ctypes.c_char_p, ctypes.c_int32)
    _sig(lib, "portalloc_last_error", ctypes.c_char_p)
    # The options by size (the C header's macros do the same): this struct's layout, which
    # has fields portalloc 0.1.0's lacks.
    _sig(lib, "portalloc_options_init", S, ctypes.POINTER(_Options), ctypes.c_size_t)
    _sig(lib, "portalloc_create_from_env", S, ctypes.c_uint32, ctypes.POINTER(P))
    _sig(
        lib,
        "portalloc_create_sized",
        S,
        ctypes.POINTER(_Options),
        ctypes.c_size_t,
        ctypes.POINTER(P),
    )
    _sig(lib, "portalloc_destroy", S, P)
    _sig(
        lib,
        "portalloc_allocate",
        S,
        P,
        u64,
        u64,
        u64,
        ctypes.c_char_p,
        ctypes.POINTER(u64),
        ctypes.POINTER(P),
    )
    _sig(lib, "portalloc_free", S, P, u64)
    _sig(lib, "portalloc_free_ptr", S, P, P)
    _sig(lib, "portalloc_record_stream", S, P, P, u64)
    _sig(lib, "portalloc_handle_info", S, P, u64, ctypes.POINTER(P), ctypes.POINTER(u64))
    _sig(lib, "portalloc_donate", S, P, u64, ctypes.c_char_p, ctypes.POINTER(u64))
    _sig(lib, "portalloc_stats", S, P, ctypes.POINTER(_Stats))
    _sig(
        lib,
        "portalloc_ledger_json",
        S,
        P,
        ctypes.c_char_p,
        ctypes.c_size_t,
        ctypes.POINTER(ctypes.c_size_t),
    )
    _sig(lib, "portalloc_ledger_write", S, P, ctypes.c_char_p)
    _sig(lib, "portalloc_trim", S, P, ctypes.POINTER(u64))
    _sig(lib, "portalloc_sleep", S, P, ctypes.c_char_p, ctypes.c_bool)
    _sig(lib, "portalloc_wake", S, P, ctypes.c_char_p)
    _sig(lib, "portalloc_sleep_stats", S, P, ctypes.POINTER(u64), ctypes.POINTER(u64))
    _sig(lib, "portalloc_set_thread_tag", S, ctypes.c_char_p)
    _sig(lib, "portalloc_set_process_tag", S, ctypes.c_char_p)
    _sig(lib, "portalloc_declare_sleep_tag", S, ctypes.c_char_p)
    _sig(lib, "portalloc_global", S, ctypes.c_int32, ctypes.POINTER(P))
    _sig(lib, "portalloc_declare_reclaimable", S, ctypes.c_char_p, ctypes.c_int)
    _sig(lib, "portalloc_using_begin", S, ctypes.c_char_p)
    _sig(lib, "portalloc_using_end", S, ctypes.c_char_p)
    _sig(
        lib,
        "portalloc_budget_json",
        S,
        ctypes.c_char_p,
        ctypes.c_size_t,
        ctypes.POINTER(ctypes.c_size_t),
    )
    _sig(lib, "portalloc_torch_alloc", P, ctypes.c_ssize_t, ctypes.c_int, P)
    _sig(lib, "portalloc_torch_free", None, P, ctypes.c_ssize_t, ctypes.c_int, P)
    _sig(lib, "portalloc_graph_pool_create", S, P, ctypes.c_char_p, ctypes.POINTER(u64))
    _sig(lib, "portalloc_graph_pool_begin", S, P, u64, P)
    _sig(lib, "portalloc_graph_pool_end", S, P, u64)
    _sig(lib, "portalloc_graph_pool_release", S, P, u64, ctypes.POINTER(u64))
    _sig(lib, "portalloc_graph_pool_sleep", S, P, u64, ctypes.c_bool)
    _sig(lib, "portalloc_graph_pool_wake", S, P, u64)
    _sig(
        lib,
        "portalloc_graph_pool_stats",
        S,
        P,
        u64,
        ctypes.POINTER(u64),
        ctypes.POINTER(u64),
        ctypes.POINTER(u64),
    )
    _sig(
        lib,
        "portalloc_graph_pools",
        S,
        P,
        ctypes.POINTER(u64),
        ctypes.c_size_t,
        ctypes.POINTER(ctypes.c_size_t),
    )
    # Sharing with other processes.
    _sig(
        lib,
        "portalloc_export",
        S,
        P,
        P,
        ctypes.c_char_p,
        ctypes.c_size_t,
        ctypes.POINTER(ctypes.c_size_t),
    )
    _sig(lib, "portalloc_import", S, P, ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(P))
    _sig(lib, "portalloc_import_ptr", S, P, ctypes.POINTER(P))
    _sig(
        lib,
        "portalloc_import_size",
        S,
        P,
        ctypes.POINTER(u64),
        ctypes.POINTER(ctypes.c_uint32),
    )
    _sig(lib, "portalloc_import_close", S, P)
    _sig(lib, "portalloc_share_settle", S, P, ctypes.POINTER(ctypes.c_size_t))
    _lib, _lib_path = lib, p
    return lib


def _check(status: int) -> None:
    if status != _OK:
        message = load().portalloc_last_error().decode("utf-8", "replace")
        raise PortallocError(status, message)


# ---------------------------------------------------------------------------------------
# Checking what goes to ctypes: it converts integers modulo the C type's range and passes
# bytes up to their first NUL, silently.

_U64_MAX = 2**64 - 1
_U64_RANGE = "an integer from 0 to 2**64-1 (%d)" % _U64_MAX
_DEVICE_MAX = 2**31 - 1  # a C int: portalloc_global takes one, and so do the hooks
_DEVICE_RANGE = "a device ordinal from 0 to %d (a C int)" % _DEVICE_MAX
_PTR_BITS = 8 * ctypes.sizeof(ctypes.c_void_p)
_PTR_MAX = 2**_PTR_BITS - 1
_PTR_RANGE = "an address from 0 to 2**%d-1 (%d)" % (_PTR_BITS, _PTR_MAX)


def _show(value: object, limit: int = 48) -> str:
    """``repr(value)``, cut to ``limit`` characters."""
    try:
        r = repr(value)
    except Exception:
        r = "<%s>" % type(value).__name__
    return r if len(r) <= limit else r[: limit - 3] + "..."


def _type_error(call: str, name: str, expected: str, value: object) -> TypeError:
    """The TypeError for argument ``name`` of ``call``: it must be ``expected``."""
    return TypeError(
        "portalloc: %s: %s must be %s, not %s %s"
        % (call, name, expected, type(value).__name__, _show(value))
    )


def _integer(call: str, name: str, value: object, low: int, high: int, accepted: str) -> int:
    """``value`` as an int in ``[low, high]``, or a TypeError / OverflowError naming it."""
    if isinstance(value, bool) or not isinstance(value, SupportsIndex):
        raise _type_error(call, name, "an integer", value)
    v = operator.index(value)
    if not low <= v <= high:
        raise OverflowError(
            "portalloc: %s: %s = %s is out of range: %s" % (call, name, _show(v), accepted)
        )
    return v


def _u64(call: str, name: str, value: object) -> int:
    return _integer(call, name, value, 0, _U64_MAX, _U64_RANGE)


def _device(call: str, device: object) -> int:
    return _integer(call, "device", device, 0, _DEVICE_MAX, _DEVICE_RANGE)


def _address(call: str, name: str, value: object) -> int:
    return _integer(call, name, value, 0, _PTR_MAX, _PTR_RANGE)


def _text(call: str, name: str, value: object, optional: bool = True) -> Optional[bytes]:
    """``value`` (a ``str`` without NUL; ``None`` where ``optional``) as UTF-8 bytes."""
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise _type_error(call, name, "a str or None" if optional else "a str", value)
    if "\0" in value:
        raise ValueError(
            "portalloc: %s: %s = %s contains a NUL character, which C text cannot hold"
            % (call, name, _show(value))
        )
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(
            "portalloc: %s: %s = %s is not valid Unicode text: %s" % (call, name, _show(value), e)
        ) from None


def _path(call: str, name: str, value: object) -> bytes:
    """A ``str``, ``bytes`` or ``os.PathLike`` path as the bytes the OS takes."""
    try:
        encoded = os.fsencode(cast(PathArg, value))
    except TypeError:
        raise _type_error(call, name, "a str, bytes or os.PathLike path", value) from None
    if b"\0" in encoded:
        raise ValueError(
            "portalloc: %s: %s = %s contains a NUL byte, which a path cannot hold"
            % (call, name, _show(value))
        )
    return encoded


def _tristate(call: str, name: str, value: object) -> int:
    """``None`` (the environment), ``True``/``False`` (or 1/0) as -1, 1, 0."""
    if value is None:
        return -1
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, SupportsIndex) and operator.index(value) in (0, 1):
        return operator.index(value)
    raise _type_error(call, name, "None, True or False", value)


def _fraction(call: str, name: str, value: object) -> float:
    """``None`` (0.0: the environment) or a fraction in (0, 1]."""
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise _type_error(call, name, "a number", value)
    f = float(value)
    if not 0.0 < f <= 1.0:  # NaN too
        raise ValueError(
            "portalloc: %s: %s = %s is out of range: a fraction in (0, 1], or None for the "
            "environment" % (call, name, _show(value))
        )
    return f


class Buffer:
    """A live buffer: its ``handle`` (generation-checked), device ``ptr`` (an int; 0 for zero
    bytes), ``size``, ``tag`` and the ``allocator`` it came from.

    A buffer keeps its allocator alive, so its memory stays valid while the buffer is
    reachable even if the allocator object is dropped; it is freed by
    :meth:`Allocator.free`, or with the allocator when the allocator is closed or collected.
    After :meth:`Allocator.close` the allocator's calls raise ``INVALID_ALLOCATOR``."""

    __slots__ = ("handle", "ptr", "size", "tag", "allocator")

    def __init__(
        self,
        handle: int,
        ptr: int,
        size: int,
        tag: str,
        allocator: Optional["Allocator"] = None,
    ) -> None:
        self.handle, self.ptr, self.size, self.tag = handle, ptr, size, tag
        self.allocator = allocator

    def __repr__(self) -> str:
        return "Buffer(handle=%#x, ptr=%#x, size=%d, tag=%r)" % (
            self.handle,
            self.ptr,
            self.size,
            self.tag,
        )


def _made(constructor: Callable[[Any], int]) -> Optional[int]:
    """The ``PortallocAllocator*`` that ``constructor`` (a C ABI call given the output
    argument) writes, after checking its status."""
    out = ctypes.c_void_p()
    _check(constructor(ctypes.byref(out)))
    return out.value


def _destroy(destroy: Callable[[ctypes.c_void_p], int], raw: int) -> int:
    """The finalizer of an owned allocator (and :meth:`Allocator.close`): its status."""
    return destroy(ctypes.c_void_p(raw))


class Allocator:
    """A portalloc allocator (with its ledger) made through the C ABI.

    ``Allocator(raw, owned=True)`` wraps a ``PortallocAllocator*`` (an int); an owned one is
    destroyed by :meth:`close` or, at the latest, when it is collected or the interpreter
    exits."""

    def __init__(self, raw: Optional[SupportsIndex], owned: bool = True) -> None:
        lib = load()
        address = _integer(
            "Allocator", "raw", raw, 1, _PTR_MAX, "a PortallocAllocator* (nonzero)"
        )
        self._raw = ctypes.c_void_p(address)
        self._owned = bool(owned)
        # Holds the function, not the module: it may run at interpreter exit.
        self._finalizer = (
            weakref.finalize(self, _destroy, lib.portalloc_destroy, address)
            if self._owned
            else None
        )

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` (or the finalizer) destroyed this allocator."""
        return self._finalizer is not None and not self._finalizer.alive

    def _token(self, call: str) -> ctypes.c_void_p:
        if self.closed:
            raise PortallocError(
                _INVALID_ALLOCATOR, "%s: this allocator has been closed (destroyed)" % call
            )
        return self._raw

    def _handle(self, call: str, buffer_or_handle: Union[Buffer, SupportsIndex]) -> int:
        if isinstance(buffer_or_handle, Buffer):
            if buffer_or_handle.allocator is not None and buffer_or_handle.allocator is not self:
                raise ValueError(
                    "portalloc: %s: %r belongs to another allocator (handles are per "
                    "allocator)" % (call, buffer_or_handle)
                )
            return _u64(call, "handle", buffer_or_handle.handle)
        return _u64(call, "handle", buffer_or_handle)

    @classmethod
    def from_env(cls, device: SupportsIndex = 0) -> "Allocator":
        """An allocator for ``device`` configured by the environment."""
        ordinal = _device("Allocator.from_env", device)
        return cls(_made(lambda out: load().portalloc_create_from_env(ordinal, out)))

    @classmethod
    def create(
        cls,
        strategy: Optional[str] = None,
        mem_fraction: Optional[float] = None,
        preallocate: Optional[bool] = None,
        backend: Optional[str] = None,
        host_capacity: Optional[SupportsIndex] = None,
        host_simulated: Optional[bool] = None,
        backtrace: Optional[bool] = None,
        device: SupportsIndex = 0,
        ignore_env: bool = False,
        peer_access: Optional[bool] = None,
    ) -> "Allocator":
        """An allocator from explicit options; ``None`` defers to the environment.

        ``strategy`` and ``backend`` are ``str``; ``mem_fraction`` a number in (0, 1];
        ``host_capacity`` bytes, 1 to 2**64-1; ``preallocate``, ``host_simulated``,
        ``backtrace``, ``ignore_env`` and ``peer_access`` ``True`` or ``False``; ``device`` an
        ordinal. ``peer_access=True`` enables peer access between the devices that report it
        before the allocator is made (``PORTALLOC_PEER_ACCESS``; off by default, since it
        changes contexts the whole process shares); where no pair can have it, nothing
        changes and it is no error."""
        call = "Allocator.create"
        # Each value checked (and converted) before any reaches the C struct.
        checked = dict(
            strategy=_text(call, "strategy", strategy),
            backend=_text(call, "backend", backend),
            mem_fraction=_fraction(call, "mem_fraction", mem_fraction),
            host_capacity=(
                0
                if host_capacity is None
                else _integer(
                    call, "host_capacity", host_capacity, 1, _U64_MAX, "bytes, from 1 to 2**64-1"
                )
            ),
            preallocate=_tristate(call, "preallocate", preallocate),
            host_simulated=_tristate(call, "host_simulated", host_simulated),
            backtrace=_tristate(call, "backtrace", backtrace),
            device=_device(call, device),
            peer_access=_tristate(call, "peer_access", peer_access),
        )
        if _tristate(call, "ignore_env", ignore_env) == -1:
            raise TypeError("portalloc: %s: ignore_env must be True or False, not None" % call)
        lib = load()
        o = _Options()
        size = ctypes.sizeof(_Options)
        _check(lib.portalloc_options_init(ctypes.byref(o), size))
        for field, value in checked.items():
            setattr(o, field, value)
        o.ignore_env = 1 if ignore_env else 0
        return cls(_made(lambda out: lib.portalloc_create_sized(ctypes.byref(o), size, out)))

    @classmethod
    def global_allocator(cls, device: SupportsIndex = 0) -> "Allocator":
        """The process-global allocator of ``device``: the one the PyTorch hooks use."""
        ordinal = _device("global_allocator", device)
        return cls(_made(lambda out: load().portalloc_global(ordinal, out)), owned=False)

    def allocate(
        self,
        size: SupportsIndex,
        alignment: SupportsIndex = 0,
        stream: SupportsIndex = 0,
        tag: Optional[str] = None,
    ) -> Buffer:
        """Allocates ``size`` bytes for use on ``stream``; returns a :class:`Buffer`.

        ``stream`` is the caller's own stream handle as an integer (``torch.cuda.Stream``'s
        ``cuda_stream``, CuPy's ``Stream.ptr``; 0 for the default stream): nothing to
        register. The buffer is freed in stream order on it.

        ``size``, ``alignment`` (a power of two, 0: the default) and ``stream`` are integers
        from 0 to 2**64-1; ``tag`` a ``str`` without NUL of at most 1024 bytes (``None``: the
        name of this thread's :func:`tag` block it is made in, else that of the process's
        :func:`region`, else ``"buffer"``); a longer one raises :class:`PortallocError`
        (``INVALID_ARGUMENT``), as every call that takes a tag does.

        A tag given here is a name in the ledger; for its buffers to sleep apart from every
        other tag's (a sleep then hands back all of their memory), it must be declared:
        :func:`declare`, or made in a :func:`tag` or :func:`region` block of that name, which
        declare it.
        """
        call = "allocate"
        nbytes = _u64(call, "size", size)
        align = _u64(call, "alignment", alignment)
        stream_handle = _u64(call, "stream", stream)
        # The tag is resolved here and passed as it is, so that the buffer says the tag the
        # allocation got even while another thread opens or leaves a region.
        resolved = _tag_or_thread(tag, "buffer")
        encoded = _text(call, "tag", resolved)
        raw = self._token(call)
        handle = ctypes.c_uint64()
        ptr = ctypes.c_void_p()
        _check(
            load().portalloc_allocate(
                raw,
                nbytes,
                align,
                stream_handle,
                encoded,
                ctypes.byref(handle),
                ctypes.byref(ptr),
            )
        )
        return Buffer(handle.value, ptr.value or 0, nbytes, resolved, self)

    def free(self, buffer: Union[Buffer, SupportsIndex]) -> None:
        """Frees a :class:`Buffer` or handle. A freed or donated one raises
        :class:`PortallocError` (``INVALID_HANDLE``)."""
        handle = self._handle("free", buffer)
        _check(load().portalloc_free(self._token("free"), handle))

    def free_ptr(self, ptr: SupportsIndex) -> None:
        """Frees the buffer starting at ``ptr`` (an int)."""
        address = _address("free_ptr", "ptr", ptr)
        _check(load().portalloc_free_ptr(self._token("free_ptr"), ctypes.c_void_p(address)))

    def record_stream(self, ptr: SupportsIndex, stream: SupportsIndex) -> None:
        """Declares that work on ``stream`` (a stream handle as an int: another stream than
        the buffer's own, such as a side or NCCL stream) uses the live buffer starting at
        ``ptr``: when the buffer is freed, its memory goes back to the allocator only once
        the work queued on ``stream`` before the free has completed. What PyTorch's
        ``Tensor.record_stream`` does with its own allocator; see
        :func:`portalloc.torch.record_stream`."""
        call = "record_stream"
        address = _address(call, "ptr", ptr)
        handle = _u64(call, "stream", stream)
        _check(
            load().portalloc_record_stream(self._token(call), ctypes.c_void_p(address), handle)
        )

    def donate(
        self, buffer: Union[Buffer, SupportsIndex], to_tag: Optional[str] = "donated"
    ) -> Buffer:
        """Hands a buffer to a consumer under ``to_tag`` (a ``str`` without NUL of at most
        1024 bytes — a longer one raises :class:`PortallocError`; ``None``: ``"donated"``);
        returns the consumer's :class:`Buffer`. The old handle is dead afterwards."""
        handle = self._handle("donate", buffer)
        encoded = _text("donate", "to_tag", to_tag)
        new = ctypes.c_uint64()
        _check(
            load().portalloc_donate(self._token("donate"), handle, encoded, ctypes.byref(new))
        )
        ptr, size = self.info(new.value)
        return Buffer(new.value, ptr, size, "donated" if to_tag is None else to_tag, self)

    def info(self, buffer: Union[Buffer, SupportsIndex]) -> Tuple[int, int]:
        """``(ptr, size)`` of a live buffer."""
        handle = self._handle("info", buffer)
        ptr = ctypes.c_void_p()
        size = ctypes.c_uint64()
        _check(
            load().portalloc_handle_info(
                self._token("info"), handle, ctypes.byref(ptr), ctypes.byref(size)
            )
        )
        return ptr.value or 0, size.value

    def stats(self) -> Stats:
        """The counters, as a dict (XLA's ``AllocatorStats`` names)."""
        s = _Stats()
        raw = self._token("stats")
        _check(load().portalloc_stats(raw, ctypes.byref(s)))
        values: Dict[str, Any] = {f[0]: getattr(s, f[0]) for f in _Stats._fields_}
        asleep, host = ctypes.c_uint64(), ctypes.c_uint64()
        _check(load().portalloc_sleep_stats(raw, ctypes.byref(asleep), ctypes.byref(host)))
        values["bytes_asleep"], values["host_bytes_asleep"] = asleep.value, host.value
        return cast(Stats, values)

    def sleep(self, tag: str, keep: bool = True) -> None:
        """Hands back the device memory of the live buffers tagged ``tag`` (a ``str``),
        keeping their addresses: with ``keep`` their bytes are copied to host memory first
        (pinned where the driver offers it), without it they are discarded (a KV cache).
        :meth:`wake` maps memory at the same addresses again, so pointers — and CUDA graphs
        captured over them — stay valid. A tag with no awake buffer: nothing to do. An empty
        ``tag`` raises ``ValueError``, as :func:`tag` does (untagged buffers never sleep); one
        over 1024 bytes raises ``INVALID_ARGUMENT``, as everywhere. Only the ``vmm`` strategy
        offers it (others raise ``UNSUPPORTED``).

        All of the tag's memory goes back when the tag was declared before its buffers were
        made — by a :func:`tag` or :func:`region` block of that name, or by :func:`declare`:
        ``vmm`` then keeps them on memory no other tag shares. The buffers of an undeclared
        tag (one only ever given to :meth:`allocate`) sleep too, but hand back only the memory
        they share with no buffer of another tag. A buffer donated (:meth:`donate`) sleeps
        with its new tag, not its old one; a freed buffer whose free waits for another
        stream's work (:meth:`record_stream`) sleeps no more."""
        if not isinstance(keep, bool):
            raise _type_error("sleep", "keep", "True or False", keep)
        encoded = _sleep_tag("sleep", tag, "tag")
        _check(load().portalloc_sleep(self._token("sleep"), encoded, keep))

    def wake(self, tag: str) -> None:
        """Maps device memory again under the sleeping buffers tagged ``tag``, at their
        addresses, and copies their contents back. When the memory cannot be had it raises
        ``OUT_OF_MEMORY`` and nothing is lost: the tag stays asleep, and a later wake can
        succeed. A tag with none asleep: nothing to do."""
        encoded = _sleep_tag("wake", tag, "tag")
        _check(load().portalloc_wake(self._token("wake"), encoded))

    def sleeping(self) -> List[Dict[str, Any]]:
        """The tags with buffers asleep: ``tag``, ``allocations``, ``bytes_asleep``,
        ``host_bytes`` each."""
        found: List[Dict[str, Any]] = self.ledger().get("sleeping", [])
        return found

    def ledger(self) -> Dict[str, Any]:
        """The ledger snapshot (live buffers, totals by tag, last OOM diagnosis) as a dict."""
        raw = self._token("ledger")
        n = ctypes.c_size_t()
        buf = ctypes.create_string_buffer(1)
        status = load().portalloc_ledger_json(raw, None, 0, ctypes.byref(n))
        # Another thread may grow the ledger between two calls: ask again with its length.
        while status == _BUFFER_TOO_SMALL:
            buf = ctypes.create_string_buffer(n.value + 1)
            status = load().portalloc_ledger_json(raw, buf, len(buf), ctypes.byref(n))
        _check(status)
        snapshot: Dict[str, Any] = json.loads(buf.raw[: n.value].decode("utf-8"))
        return snapshot

    def write_ledger(self, path: PathArg) -> None:
        """Writes the ledger snapshot to ``path`` (``str``, ``bytes`` or ``os.PathLike``;
        ``portalloc ledger PATH`` prints it). The C ABI takes UTF-8 paths: one that is not
        is refused (``INVALID_ARGUMENT``)."""
        encoded = _path("write_ledger", "path", path)
        _check(load().portalloc_ledger_write(self._token("write_ledger"), encoded))

    def trim(self) -> int:
        """Returns unused memory to the device; the bytes released."""
        out = ctypes.c_uint64()
        _check(load().portalloc_trim(self._token("trim"), ctypes.byref(out)))
        return out.value

    # ---- graph pools --------------------------------------------------------------------

    def graph_pool(self, tag: Optional[str] = None) -> int:
        """A new graph pool: memory handed out while a stream is captured into a graph and
        routed to it (:meth:`begin_graph_pool`) stays the graph's until
        :meth:`release_graph_pool`. Its memory carries ``tag`` (default ``graph pool N``)."""
        out = ctypes.c_uint64()
        encoded = None if tag is None else _sleep_tag("graph_pool", tag, "tag")
        _check(load().portalloc_graph_pool_create(self._token("graph_pool"), encoded, ctypes.byref(out)))
        return out.value

    def begin_graph_pool(self, pool: int, stream: Any) -> None:
        """Routes the requests of the capture on ``stream`` (a handle as an int, or an object
        with ``cuda_stream``) to ``pool``, until :meth:`end_graph_pool` — PyTorch's
        ``beginAllocateToPool``. Call it before the capture begins."""
        pool = _u64("begin_graph_pool", "pool", pool)
        handle = _u64("begin_graph_pool", "stream", getattr(stream, "cuda_stream", stream))
        _check(load().portalloc_graph_pool_begin(self._token("begin_graph_pool"), pool, handle))

    def end_graph_pool(self, pool: int) -> None:
        """Ends the routes to ``pool``; it keeps its memory."""
        pool = _u64("end_graph_pool", "pool", pool)
        _check(load().portalloc_graph_pool_end(self._token("end_graph_pool"), pool))

    def release_graph_pool(self, pool: int) -> int:
        """Releases ``pool`` once no graph captured into it will run again (the graph's
        ``reset()``): its free memory goes back now, after a device synchronisation; the
        bytes given back."""
        pool = _u64("release_graph_pool", "pool", pool)
        out = ctypes.c_uint64()
        _check(load().portalloc_graph_pool_release(self._token("release_graph_pool"), pool, ctypes.byref(out)))
        return out.value

    def sleep_graph_pool(self, pool: int, keep: bool = True) -> None:
        """Sleeps ``pool``'s memory at its addresses (``vmm``): the graphs captured into it
        run again after :meth:`wake_graph_pool` without capturing again. Register again after
        the wake what was bound to the old memory (NCCL user buffers, IPC handles)."""
        if not isinstance(keep, bool):
            raise _type_error("sleep_graph_pool", "keep", "True or False", keep)
        pool = _u64("sleep_graph_pool", "pool", pool)
        _check(load().portalloc_graph_pool_sleep(self._token("sleep_graph_pool"), pool, keep))

    def wake_graph_pool(self, pool: int) -> None:
        """Wakes ``pool``'s memory at its addresses."""
        pool = _u64("wake_graph_pool", "pool", pool)
        _check(load().portalloc_graph_pool_wake(self._token("wake_graph_pool"), pool))

    def graph_pools(self) -> List[Dict[str, int]]:
        """Every graph pool: ``pool``, ``held``, ``in_use`` and ``free`` bytes each (the
        PyTorch hook makes one per capture it sees)."""
        raw = self._token("graph_pools")
        count = ctypes.c_size_t()
        _check(load().portalloc_graph_pools(raw, None, 0, ctypes.byref(count)))
        ids = (ctypes.c_uint64 * max(count.value, 1))()
        _check(load().portalloc_graph_pools(raw, ids, count.value, ctypes.byref(count)))
        found: List[Dict[str, int]] = []
        for pool in list(ids)[: count.value]:
            held, in_use, free = ctypes.c_uint64(), ctypes.c_uint64(), ctypes.c_uint64()
            _check(
                load().portalloc_graph_pool_stats(
                    raw, pool, ctypes.byref(held), ctypes.byref(in_use), ctypes.byref(free)
                )
            )
            found.append({"pool": int(pool), "held": held.value, "in_use": in_use.value, "free": free.value})
        return found

    # ---- sharing with other processes ---------------------------------------------------

    def export(self, buffer_or_ptr: Union[Buffer, SupportsIndex]) -> "ShareHandle":
        """Exports the live buffer (a :class:`Buffer`, or the int address it starts at) for
        another process: a :class:`ShareHandle`, picklable, which the other process maps with
        :func:`import_handle` on the same device. Exporting again gives an equal handle.

        Freed while another process imports it, the buffer's memory is kept (and still
        counted here) until the importers close their imports, then handed back at the next
        allocation, :meth:`trim` or :meth:`settle`. Raises :class:`PortallocError`:
        ``UNKNOWN_POINTER`` for an address that is not the start of a live buffer of this
        allocator, ``UNSUPPORTED`` for a device or strategy that cannot export (the simulated
        host device, ``cuda_async``)."""
        call = "export"
        if isinstance(buffer_or_ptr, Buffer):
            if buffer_or_ptr.allocator is not None and buffer_or_ptr.allocator is not self:
                raise ValueError(
                    "portalloc: %s: %r belongs to another allocator" % (call, buffer_or_ptr)
                )
            address = _address(call, "ptr", buffer_or_ptr.ptr)
        else:
            address = _address(call, "ptr", buffer_or_ptr)
        raw = self._token(call)
        n = ctypes.c_size_t()
        # A handle of one piece is 120 bytes: most fit the first buffer.
        buf = ctypes.create_string_buffer(256)
        status = load().portalloc_export(
            raw, ctypes.c_void_p(address), buf, len(buf), ctypes.byref(n)
        )
        if status == _BUFFER_TOO_SMALL:
            buf = ctypes.create_string_buffer(n.value)
            status = load().portalloc_export(
                raw, ctypes.c_void_p(address), buf, len(buf), ctypes.byref(n)
            )
        _check(status)
        return ShareHandle(buf.raw[: n.value])

    def settle(self) -> int:
        """Hands back the exported buffers freed while imported that no process imports any
        more (their importers closed or exited); how many are still kept for importers."""
        out = ctypes.c_size_t()
        _check(load().portalloc_share_settle(self._token("settle"), ctypes.byref(out)))
        return out.value

    def close(self) -> None:
        """Destroys the allocator (frees its live buffers); again, nothing. The finalizer
        makes the same call when an unclosed allocator is collected or the interpreter
        exits. The global allocator is not owned and is left alone."""
        if self._finalizer is None:
            return
        status = self._finalizer()  # None once it has run
        if status is not None:
            _check(status)

    def __enter__(self) -> "Allocator":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---------------------------------------------------------------------------------------
# Buffers shared between processes (docs/share.md).

_SHARE_MAGIC = b"PASHARE\x01"
_SHARE_HEADER = 80


class ShareHandle:
    """An exported buffer (:meth:`Allocator.export`), as another process imports it
    (:func:`import_handle`): the handle's bytes (``bytes(handle)``), which any channel
    carries — it pickles to them, so it goes through ``multiprocessing`` queues and pools.

    ``size`` (the buffer's bytes), ``exporter_pid`` and ``kind`` (``"mapped"``: vmm memory,
    which outlives an exporter that exits; ``"plain"``: bfc or platform memory, a legacy IPC
    handle, which dies with its exporter) are read from the bytes. Only the header is checked
    here; the library checks every field at import (``INVALID_ARGUMENT`` naming what is
    wrong)."""

    __slots__ = ("_bytes", "size", "exporter_pid", "kind")

    def __init__(self, data: Union[bytes, bytearray, memoryview]) -> None:
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise _type_error("ShareHandle", "data", "bytes", data)
        raw = bytes(data)
        if len(raw) < _SHARE_HEADER or raw[:8] != _SHARE_MAGIC:
            raise ValueError(
                "portalloc: ShareHandle: %d bytes starting %r are not a portalloc share handle "
                "(what Allocator.export gave)" % (len(raw), raw[:8])
            )
        self._bytes = raw
        self.exporter_pid: int = int.from_bytes(raw[16:20], "little")
        self.size: int = int.from_bytes(raw[40:48], "little")
        self.kind: str = {1: "mapped", 2: "plain"}.get(raw[12], "unknown")

    def __bytes__(self) -> bytes:
        return self._bytes

    def __reduce__(self) -> Tuple[Any, Tuple[bytes]]:
        return (ShareHandle, (self._bytes,))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ShareHandle) and other._bytes == self._bytes

    def __hash__(self) -> int:
        return hash(self._bytes)

    def __repr__(self) -> str:
        return "ShareHandle(kind=%s, size=%d, exporter_pid=%d, %d bytes)" % (
            self.kind,
            self.size,
            self.exporter_pid,
            len(self._bytes),
        )


def _close_import(close: Callable[[ctypes.c_void_p], int], raw: int) -> int:
    """The finalizer of an :class:`ImportedBuffer` (and its ``close``): the status."""
    return close(ctypes.c_void_p(raw))


class ImportedBuffer:
    """Another process's buffer mapped in this one (:func:`import_handle`): ``ptr`` (its
    device address here), ``size``, ``exporter_pid``. The exporter keeps the memory while this
    is open; :meth:`close` (or leaving its ``with`` block) unmaps it — the work on it must
    have finished — and so does the finalizer when it is collected or the interpreter exits.
    Nothing is counted in any allocator of this process: the exporter counts the memory."""

    def __init__(self, raw: int) -> None:
        lib = load()
        self._raw = raw
        ptr = ctypes.c_void_p()
        size = ctypes.c_uint64()
        pid = ctypes.c_uint32()
        self._finalizer = weakref.finalize(self, _close_import, lib.portalloc_import_close, raw)
        _check(lib.portalloc_import_ptr(ctypes.c_void_p(raw), ctypes.byref(ptr)))
        _check(
            lib.portalloc_import_size(
                ctypes.c_void_p(raw), ctypes.byref(size), ctypes.byref(pid)
            )
        )
        self.ptr: int = ptr.value or 0
        self.size: int = size.value
        self.exporter_pid: int = pid.value

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` (or the finalizer) unmapped it."""
        return not self._finalizer.alive

    def close(self) -> None:
        """Unmaps it; again, nothing. Raises :class:`PortallocError` (``DEVICE``) when the
        device failed to unmap it (it is closed all the same)."""
        status = self._finalizer()  # None once it has run
        if status is not None:
            _check(status)

    def __enter__(self) -> "ImportedBuffer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return "ImportedBuffer(ptr=%#x, size=%d, exporter_pid=%d%s)" % (
            self.ptr,
            self.size,
            self.exporter_pid,
            ", closed" if self.closed else "",
        )


def import_handle(
    handle: Union[ShareHandle, bytes], allocator: Optional[Allocator] = None
) -> ImportedBuffer:
    """Maps the buffer another process exported (:meth:`Allocator.export`) on the device of
    ``allocator`` (``None``: the global allocator of device 0, :func:`global_allocator`):
    an :class:`ImportedBuffer` whose ``ptr`` holds the exporter's bytes, the same memory.
    The descriptors are fetched from the exporter with ``pidfd_getfd`` (Linux 5.6, a process
    of the same user).

    Raises :class:`PortallocError`: ``INVALID_ARGUMENT`` for bytes that are not a share
    handle; ``SHARE`` for this process's own export, an export withdrawn (freed with no
    importer, or put to sleep), an exporter that exited, another device, or descriptors that
    cannot be fetched."""
    call = "import_handle"
    if isinstance(handle, ShareHandle):
        data = bytes(handle)
    elif isinstance(handle, (bytes, bytearray)):
        data = bytes(handle)
    else:
        raise _type_error(call, "handle", "a ShareHandle or its bytes", handle)
    owner = global_allocator(0) if allocator is None else allocator
    lib = load()
    out = ctypes.c_void_p()
    _check(lib.portalloc_import(owner._token(call), data, len(data), ctypes.byref(out)))
    if out.value is None:
        raise PortallocError(12, "%s: portalloc_import wrote no import" % call)
    return ImportedBuffer(out.value)


def settle(device: SupportsIndex = 0) -> int:
    """:meth:`Allocator.settle` of the global allocator of ``device``."""
    return global_allocator(device).settle()


def global_allocator(device: SupportsIndex = 0) -> Allocator:
    """The process-global allocator of ``device`` (the PyTorch hooks' and CuPy's)."""
    return Allocator.global_allocator(device)


def stats(device: SupportsIndex = 0) -> Stats:
    """Counters of the global allocator of ``device``."""
    return global_allocator(device).stats()


def ledger(device: SupportsIndex = 0) -> Dict[str, Any]:
    """Ledger snapshot of the global allocator of ``device``."""
    return global_allocator(device).ledger()


def sleep(tag: str, keep: bool = True, device: SupportsIndex = 0) -> None:
    """:meth:`Allocator.sleep` on the global allocator of ``device`` (the one PyTorch's and
    CuPy's buffers come from)."""
    global_allocator(device).sleep(tag, keep)


def wake(tag: str, device: SupportsIndex = 0) -> None:
    """:meth:`Allocator.wake` on the global allocator of ``device``."""
    global_allocator(device).wake(tag)


_tags = threading.local()

#: The open :func:`region` blocks of the process, oldest first: ``(token, name)``. The
#: process tag is the name of the last; guarded by ``_regions_lock``, under which the C
#: ABI's process tag is set too, so that the two agree.
_regions: List[Tuple[object, bytes]] = []
_regions_lock = threading.Lock()


def _tag_or_thread(tag: Optional[str], default: str) -> str:
    """``tag``, else the name of the innermost :func:`tag` block of this thread, else that of
    the process's :func:`region`, else ``default``: the order in which the C ABI labels an
    allocation."""
    if tag is not None:
        return tag
    stack: List[bytes] = getattr(_tags, "stack", [])
    if stack:
        return stack[-1].decode("utf-8")
    with _regions_lock:
        return _regions[-1][1].decode("utf-8") if _regions else default


def _sleep_tag(call: str, name: object, argument: str = "name") -> bytes:
    """``name`` (the ``argument`` of ``call``) as the UTF-8 bytes of a tag that can sleep: a
    non-empty ``str`` without NUL. One rule for every call that names such a tag —
    :func:`tag`, :func:`region`, :func:`declare`, :meth:`Allocator.sleep` and
    :meth:`Allocator.wake` — as the C ABI has: an empty one raises ``ValueError`` here; the
    1024-byte bound is the C ABI's, for these and for a tag given to
    :meth:`Allocator.allocate` or :meth:`Allocator.donate`, and a longer tag raises
    :class:`PortallocError` (``INVALID_ARGUMENT``) from it."""
    encoded = _text(call, argument, name, optional=False)
    if not encoded:
        raise ValueError(
            "portalloc: %s: %s = '' is not accepted: a non-empty %s (untagged buffers "
            "never sleep)" % (call, argument, argument)
        )
    return encoded


def declare(name: str) -> None:
    """Declares ``name`` as a tag whose buffers can sleep on their own: from now on the
    ``vmm`` strategy keeps the buffers tagged ``name`` on memory no other tag shares, so that
    :func:`sleep` hands all of it back. For buffers given the tag explicitly
    (``Allocator.allocate(size, tag=name)``): a tag given so is otherwise only a name in the
    ledger. :func:`tag` and :func:`region` declare their name themselves. Declaring is
    process-wide (every allocator, every device) and lasts for the process; declaring again
    does nothing. ``name`` is a non-empty ``str`` without NUL, of at most 1024 bytes."""
    _check(load().portalloc_declare_sleep_tag(_sleep_tag("declare", name)))


@contextmanager
def tag(name: str) -> Iterator[None]:
    """Inside ``with portalloc.tag(name):``, the buffers this thread allocates without a tag
    of their own — every tensor PyTorch or CuPy allocates through portalloc's hooks — carry
    ``name``, so that :func:`sleep` and :func:`wake` can act on them; ``name`` is declared
    (:func:`declare`), so that a sleep hands back all of their memory. Nested blocks: the
    innermost name; on leaving (by an exception too), the one outside again.

    Only this thread: tensors PyTorch makes on its own threads — autograd's, during
    ``backward()`` — are not tagged by it; :func:`region` tags them. Within this thread the
    block wins over a region."""
    encoded = _sleep_tag("tag", name)
    stack: List[bytes] = getattr(_tags, "stack", [])
    _tags.stack = stack
    _check(load().portalloc_set_thread_tag(encoded))
    stack.append(encoded)
    try:
        yield
    finally:
        stack.pop()
        _check(load().portalloc_set_thread_tag(stack[-1] if stack else None))


@contextmanager
def region(name: str) -> Iterator[None]:
    """Inside ``with portalloc.region(name):``, the buffers that **any thread of the
    process** allocates without a tag of their own carry ``name``, unless that thread is in a
    :func:`tag` block (which wins: explicit tag, then the thread's :func:`tag`, then the
    region, then the default). For the threads a framework starts itself — PyTorch's
    autograd threads make gradients and other tensors during ``backward()`` — which a
    :func:`tag` block on the calling thread does not reach. ``name`` is declared
    (:func:`declare`), so that :func:`sleep` hands back all of its buffers' memory.

    Process-wide, unlike :func:`tag`: while the block is open, every thread's untagged
    buffers get ``name`` — those of threads that have nothing to do with it too. Nested
    blocks: the innermost name; on leaving (by an exception too), the one outside again.
    Blocks opened on several threads at once interleave: the process has one region tag,
    that of the block entered last among those still open, whichever thread entered it;
    leaving a block removes that block only, so the tag is then that of the latest block
    still open (another thread's, possibly), and none once every block is left. So while
    two threads' regions overlap, the buffers of both threads go to the one entered last:
    use :func:`tag` for work that runs on threads of its own at the same time."""
    encoded = _sleep_tag("region", name)
    token = object()
    with _regions_lock:
        _check(load().portalloc_set_process_tag(encoded))
        _regions.append((token, encoded))
    try:
        yield
    finally:
        with _regions_lock:
            for i in range(len(_regions) - 1, -1, -1):
                if _regions[i][0] is token:
                    del _regions[i]
                    break
            _check(load().portalloc_set_process_tag(_regions[-1][1] if _regions else None))


def declare_reclaimable(tag: str, keep: bool = True) -> None:
    """Declares ``tag`` reclaimable in the device's shared budget: while no :func:`using`
    block of this process holds it, another portalloc process on the device that runs out of
    memory may ask this one to put the buffers tagged ``tag`` to sleep — with ``keep`` their
    bytes go to host memory and come back at the same addresses when the tag is used again;
    without it they are discarded (a KV cache that can be recomputed). The tag is declared
    too (:func:`declare`). Declaring again changes ``keep``; a process declares at most 8
    tags. ``tag`` is a non-empty ``str`` without NUL, of at most 24 bytes (a longer one raises
    ``INVALID_ARGUMENT``).

    On the budget of the global allocators (:func:`global_allocator`; device 0's is made
    first when none exists). A process joins its device's budget unless
    ``PORTALLOC_SHARED_BUDGET=0`` (on the host backend only with
    ``PORTALLOC_SHARED_BUDGET=1``); one that joined none runs alone, and this raises
    :class:`PortallocError` ``UNSUPPORTED`` saying so, as :func:`using` and :func:`budget`
    do."""
    if not isinstance(keep, bool):
        raise _type_error("declare_reclaimable", "keep", "True or False", keep)
    encoded = _sleep_tag("declare_reclaimable", tag, "tag")
    _check(load().portalloc_declare_reclaimable(encoded, 1 if keep else 0))


@contextmanager
def using(tag: str) -> Iterator[None]:
    """Inside ``with portalloc.using(tag):``, no other process can have the buffers tagged
    ``tag`` put to sleep (:func:`declare_reclaimable`); a tag another process had put to
    sleep is woken first, at the same addresses (``OUT_OF_MEMORY`` when the memory cannot be
    had, with the tag still asleep). Blocks nest, on any thread: the tag is free to be
    reclaimed again once every block of it is left (by an exception too, which propagates).
    A tag not declared reclaimable is never asked for: the block holds nothing."""
    encoded = _sleep_tag("using", tag, "tag")
    _check(load().portalloc_using_begin(encoded))
    try:
        yield
    finally:
        _check(load().portalloc_using_end(encoded))


def budget() -> List[Dict[str, Any]]:
    """The members of the device's shared budget, this process included: one dict per live
    process (``pid``, ``name``, ``reserved``, ``in_use``, ``cached``, ``asleep``, ``floor``,
    ``ceiling`` (``None``: none), ``given``, ``refused``, and ``tags``: each ``name``,
    ``bytes``, ``reclaimable``, ``keep``, ``in_use``, ``asleep``); with several devices, each
    device's members in turn, by ordinal. What ``portalloc top`` shows."""
    n = ctypes.c_size_t()
    buf = ctypes.create_string_buffer(1)
    status = load().portalloc_budget_json(None, 0, ctypes.byref(n))
    # A process may join between two calls: ask again with its length.
    while status == _BUFFER_TOO_SMALL:
        buf = ctypes.create_string_buffer(n.value + 1)
        status = load().portalloc_budget_json(buf, len(buf), ctypes.byref(n))
    _check(status)
    members: List[Dict[str, Any]] = json.loads(buf.raw[: n.value].decode("utf-8"))
    return members


def install_torch(path: Optional[PathArg] = None) -> Any:
    """Makes portalloc PyTorch's CUDA allocator (before any CUDA memory is allocated).
    Returns the ``CUDAPluggableAllocator``. Raises ImportError without PyTorch."""
    torch = importlib.import_module("torch")  # optional: ImportError without it

    p = library_path(path)
    load(p)
    allocator = torch.cuda.memory.CUDAPluggableAllocator(
        p, "portalloc_torch_alloc", "portalloc_torch_free"
    )
    torch.cuda.memory.change_current_allocator(allocator)
    return allocator


class _CupyOwner:
    """Frees its buffer when CuPy drops the memory it backs."""

    __slots__ = ("allocator", "handle")

    def __init__(self, allocator: "Allocator", handle: int) -> None:
        self.allocator, self.handle = allocator, handle

    def __del__(self) -> None:
        try:
            self.allocator.free(self.handle)
        except Exception:  # never raise from a finaliser
            pass


def install_cupy(path: Optional[PathArg] = None) -> Callable[[int], Any]:
    """Makes portalloc CuPy's allocator (``cupy.cuda.set_allocator``): each request is a
    buffer of the current device's global allocator for CuPy's current stream
    (``cupy.cuda.get_current_stream()``), tagged ``cupy`` (or the name of the :func:`tag`
    block it is made in, else that of the :func:`region`), freed in stream order on that
    stream when CuPy drops it — as CuPy's own pool does. Raises ImportError without
    CuPy."""
    cupy = importlib.import_module("cupy")  # optional: ImportError without it

    load(path)

    def malloc(size: int) -> Any:
        device = cupy.cuda.Device().id
        stream = cupy.cuda.get_current_stream().ptr
        allocator = global_allocator(device)
        # Inside `portalloc.tag(name)`, that name (the thread's tag); else inside
        # `portalloc.region(name)`, that one (the process's); else `cupy`.
        buf = allocator.allocate(size, stream=stream, tag=_tag_or_thread(None, "cupy"))
        owner = _CupyOwner(allocator, buf.handle)
        memory = cupy.cuda.memory.UnownedMemory(buf.ptr, size, owner, device_id=device)
        return cupy.cuda.memory.MemoryPointer(memory, 0)

    cupy.cuda.set_allocator(malloc)
    return malloc


def install(path: Optional[PathArg] = None) -> List[str]:
    """Installs portalloc into every framework present (PyTorch, CuPy); returns the names
    of those it installed into (empty when neither is importable)."""
    installed = []
    for name, fn in (("torch", install_torch), ("cupy", install_cupy)):
        try:
            fn(path)
        except ImportError:
            continue
        installed.append(name)
    return installed
