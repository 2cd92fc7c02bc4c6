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

The library is found through ``PORTALLOC_LIBRARY`` (a path), then next to this file, then
``target/release`` and ``target/debug`` of the source tree, then the loader's search path.
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
import json
import numbers
import operator
import os
import pathlib
import weakref

__all__ = [
    "PortallocError",
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
}
_OK = 0
_INVALID_ALLOCATOR = 6
_BUFFER_TOO_SMALL = 10


class PortallocError(RuntimeError):
    """A failed portalloc call: ``status`` (an int), ``name`` (``INVALID_HANDLE``, ...) and the
    library's message."""

    def __init__(self, status, message):
        self.status = status
        self.name = STATUS_NAMES.get(status, "UNKNOWN")
        self.message = message
        super().__init__("portalloc: %s: %s" % (self.name, message))


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
    ]


class _Stats(ctypes.Structure):
    _fields_ = [
        ("num_allocs", ctypes.c_uint64),
        ("bytes_in_use", ctypes.c_uint64),
        ("peak_bytes_in_use", ctypes.c_uint64),
        ("largest_alloc_size", ctypes.c_uint64),
        ("bytes_limit", ctypes.c_uint64),
        ("bytes_reserved", ctypes.c_uint64),
        ("peak_bytes_reserved", ctypes.c_uint64),
        ("largest_free_block_bytes", ctypes.c_uint64),
        ("pool_bytes", ctypes.c_uint64),
        ("peak_pool_bytes", ctypes.c_uint64),
        ("fragmentation", ctypes.c_double),
        ("live_allocations", ctypes.c_uint64),
    ]


_lib = None
_lib_path = None


def library_path(path=None):
    """The path of libportalloc.so that :func:`load` would open (``path``: ``str``, ``bytes``
    or ``os.PathLike``)."""
    if path:
        return os.fsdecode(path)
    env = os.environ.get("PORTALLOC_LIBRARY")
    if env:
        return env
    here = pathlib.Path(__file__).resolve().parent
    for candidate in (
        here / "libportalloc.so",
        here.parent / "target" / "release" / "libportalloc.so",
        here.parent / "target" / "debug" / "libportalloc.so",
    ):
        if candidate.exists():
            return str(candidate)
    found = ctypes.util.find_library("portalloc")
    if found:
        return found
    raise FileNotFoundError(
        "libportalloc.so not found: set PORTALLOC_LIBRARY, or build it with "
        "`cargo build --release --features c-api`"
    )


def _sig(lib, name, restype, *argtypes):
    f = getattr(lib, name)
    f.restype = restype
    f.argtypes = list(argtypes)


def load(path=None):
    """Opens libportalloc.so (once) and declares its functions."""
    global _lib, _lib_path
    if _lib is not None:
        return _lib
    p = library_path(path)
    lib = ctypes.CDLL(p)
    if not hasattr(lib, "portalloc_create"):
        raise OSError(
            "%s lacks the portalloc C ABI: build it with `cargo build --features c-api`" % p
        )
    P = ctypes.c_void_p
    S = ctypes.c_int32
    u64 = ctypes.c_uint64
    _sig(lib, "portalloc_version", ctypes.c_char_p)
    _sig(lib, "portalloc_status_name", ctypes.c_char_p, ctypes.c_int32)
    _sig(lib, "portalloc_last_error", ctypes.c_char_p)
    _sig(lib, "portalloc_options_default", S, ctypes.POINTER(_Options))
    _sig(lib, "portalloc_create_from_env", S, ctypes.c_uint32, ctypes.POINTER(P))
    _sig(lib, "portalloc_create", S, ctypes.POINTER(_Options), ctypes.POINTER(P))
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
    _sig(lib, "portalloc_global", S, ctypes.c_int32, ctypes.POINTER(P))
    _sig(lib, "portalloc_torch_alloc", P, ctypes.c_ssize_t, ctypes.c_int, P)
    _sig(lib, "portalloc_torch_free", None, P, ctypes.c_ssize_t, ctypes.c_int, P)
    _lib, _lib_path = lib, p
    return lib


def _check(status):
    if status != _OK:
        raise PortallocError(status, _lib.portalloc_last_error().decode("utf-8", "replace"))


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


def _show(value, limit=48):
    """``repr(value)``, cut to ``limit`` characters."""
    try:
        r = repr(value)
    except Exception:
        r = "<%s>" % type(value).__name__
    return r if len(r) <= limit else r[: limit - 3] + "..."


def _type_error(call, name, expected, value):
    """The TypeError for argument ``name`` of ``call``: it must be ``expected``."""
    return TypeError(
        "portalloc: %s: %s must be %s, not %s %s"
        % (call, name, expected, type(value).__name__, _show(value))
    )


def _integer(call, name, value, low, high, accepted):
    """``value`` as an int in ``[low, high]``, or a TypeError / OverflowError naming it."""
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise _type_error(call, name, "an integer", value)
    v = operator.index(value)
    if not low <= v <= high:
        raise OverflowError(
            "portalloc: %s: %s = %s is out of range: %s" % (call, name, _show(v), accepted)
        )
    return v


def _u64(call, name, value):
    return _integer(call, name, value, 0, _U64_MAX, _U64_RANGE)


def _device(call, device):
    return _integer(call, "device", device, 0, _DEVICE_MAX, _DEVICE_RANGE)


def _address(call, name, value):
    return _integer(call, name, value, 0, _PTR_MAX, _PTR_RANGE)


def _text(call, name, value, optional=True):
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


def _path(call, name, value):
    """A ``str``, ``bytes`` or ``os.PathLike`` path as the bytes the OS takes."""
    try:
        encoded = os.fsencode(value)
    except TypeError:
        raise _type_error(call, name, "a str, bytes or os.PathLike path", value) from None
    if b"\0" in encoded:
        raise ValueError(
            "portalloc: %s: %s = %s contains a NUL byte, which a path cannot hold"
            % (call, name, _show(value))
        )
    return encoded


def _tristate(call, name, value):
    """``None`` (the environment), ``True``/``False`` (or 1/0) as -1, 1, 0."""
    if value is None:
        return -1
    if isinstance(value, bool):
        return int(value)
    if hasattr(type(value), "__index__") and operator.index(value) in (0, 1):
        return operator.index(value)
    raise _type_error(call, name, "None, True or False", value)


def _fraction(call, name, value):
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

    def __init__(self, handle, ptr, size, tag, allocator=None):
        self.handle, self.ptr, self.size, self.tag = handle, ptr, size, tag
        self.allocator = allocator

    def __repr__(self):
        return "Buffer(handle=%#x, ptr=%#x, size=%d, tag=%r)" % (
            self.handle,
            self.ptr,
            self.size,
            self.tag,
        )


def _destroy(destroy, raw):
    """The finalizer of an owned allocator (and :meth:`Allocator.close`): its status."""
    return destroy(ctypes.c_void_p(raw))


class Allocator:
    """A portalloc allocator (with its ledger) made through the C ABI.

    ``Allocator(raw, owned=True)`` wraps a ``PortallocAllocator*`` (an int); an owned one is
    destroyed by :meth:`close` or, at the latest, when it is collected or the interpreter
    exits."""

    def __init__(self, raw, owned=True):
        lib = load()
        raw = _integer("Allocator", "raw", raw, 1, _PTR_MAX, "a PortallocAllocator* (nonzero)")
        self._raw = ctypes.c_void_p(raw)
        self._owned = bool(owned)
        # Holds the function, not the module: it may run at interpreter exit.
        self._finalizer = (
            weakref.finalize(self, _destroy, lib.portalloc_destroy, raw) if self._owned else None
        )

    @property
    def closed(self):
        """Whether :meth:`close` (or the finalizer) destroyed this allocator."""
        return self._finalizer is not None and not self._finalizer.alive

    def _token(self, call):
        if self.closed:
            raise PortallocError(
                _INVALID_ALLOCATOR, "%s: this allocator has been closed (destroyed)" % call
            )
        return self._raw

    def _handle(self, call, buffer_or_handle):
        if isinstance(buffer_or_handle, Buffer):
            if buffer_or_handle.allocator is not None and buffer_or_handle.allocator is not self:
                raise ValueError(
                    "portalloc: %s: %r belongs to another allocator (handles are per "
                    "allocator)" % (call, buffer_or_handle)
                )
            return _u64(call, "handle", buffer_or_handle.handle)
        return _u64(call, "handle", buffer_or_handle)

    @classmethod
    def from_env(cls, device=0):
        """An allocator for ``device`` configured by the environment."""
        device = _device("Allocator.from_env", device)
        lib = load()
        out = ctypes.c_void_p()
        _check(lib.portalloc_create_from_env(device, ctypes.byref(out)))
        return cls(out.value)

    @classmethod
    def create(
        cls,
        strategy=None,
        mem_fraction=None,
        preallocate=None,
        backend=None,
        host_capacity=None,
        host_simulated=None,
        backtrace=None,
        device=0,
        ignore_env=False,
    ):
        """An allocator from explicit options; ``None`` defers to the environment.

        ``strategy`` and ``backend`` are ``str``; ``mem_fraction`` a number in (0, 1];
        ``host_capacity`` bytes, 1 to 2**64-1; ``preallocate``, ``host_simulated``,
        ``backtrace`` and ``ignore_env`` ``True`` or ``False``; ``device`` an ordinal."""
        call = "Allocator.create"
        strategy = _text(call, "strategy", strategy)
        backend = _text(call, "backend", backend)
        mem_fraction = _fraction(call, "mem_fraction", mem_fraction)
        host_capacity = (
            0
            if host_capacity is None
            else _integer(
                call, "host_capacity", host_capacity, 1, _U64_MAX, "bytes, from 1 to 2**64-1"
            )
        )
        preallocate = _tristate(call, "preallocate", preallocate)
        host_simulated = _tristate(call, "host_simulated", host_simulated)
        backtrace = _tristate(call, "backtrace", backtrace)
        device = _device(call, device)
        if _tristate(call, "ignore_env", ignore_env) == -1:
            raise TypeError("portalloc: %s: ignore_env must be True or False, not None" % call)
        lib = load()
        o = _Options()
        _check(lib.portalloc_options_default(ctypes.byref(o)))
        o.strategy = strategy
        o.mem_fraction = mem_fraction
        o.preallocate = preallocate
        o.backend = backend
        o.host_capacity = host_capacity
        o.host_simulated = host_simulated
        o.backtrace = backtrace
        o.device = device
        o.ignore_env = 1 if ignore_env else 0
        out = ctypes.c_void_p()
        _check(lib.portalloc_create(ctypes.byref(o), ctypes.byref(out)))
        return cls(out.value)

    @classmethod
    def global_allocator(cls, device=0):
        """The process-global allocator of ``device``: the one the PyTorch hooks use."""
        device = _device("global_allocator", device)
        lib = load()
        out = ctypes.c_void_p()
        _check(lib.portalloc_global(device, ctypes.byref(out)))
        return cls(out.value, owned=False)

    def allocate(self, size, alignment=0, stream=0, tag="buffer"):
        """Allocates ``size`` bytes for use on ``stream``; returns a :class:`Buffer`.

        ``stream`` is the caller's own stream handle as an integer (``torch.cuda.Stream``'s
        ``cuda_stream``, CuPy's ``Stream.ptr``; 0 for the default stream): nothing to
        register. The buffer is freed in stream order on it.

        ``size``, ``alignment`` (a power of two, 0: the default) and ``stream`` are integers
        from 0 to 2**64-1; ``tag`` a ``str`` without NUL (``None``: ``"buffer"``).
        """
        call = "allocate"
        size = _u64(call, "size", size)
        alignment = _u64(call, "alignment", alignment)
        stream = _u64(call, "stream", stream)
        encoded = _text(call, "tag", tag)
        raw = self._token(call)
        handle = ctypes.c_uint64()
        ptr = ctypes.c_void_p()
        _check(
            _lib.portalloc_allocate(
                raw,
                size,
                alignment,
                stream,
                encoded,
                ctypes.byref(handle),
                ctypes.byref(ptr),
            )
        )
        return Buffer(handle.value, ptr.value or 0, size, "buffer" if tag is None else tag, self)

    def free(self, buffer):
        """Frees a :class:`Buffer` or handle. A freed or donated one raises
        :class:`PortallocError` (``INVALID_HANDLE``)."""
        handle = self._handle("free", buffer)
        _check(_lib.portalloc_free(self._token("free"), handle))

    def free_ptr(self, ptr):
        """Frees the buffer starting at ``ptr`` (an int)."""
        ptr = _address("free_ptr", "ptr", ptr)
        _check(_lib.portalloc_free_ptr(self._token("free_ptr"), ctypes.c_void_p(ptr)))

    def donate(self, buffer, to_tag="donated"):
        """Hands a buffer to a consumer under ``to_tag`` (a ``str`` without NUL; ``None``:
        ``"donated"``); returns the consumer's :class:`Buffer`. The old handle is dead
        afterwards."""
        handle = self._handle("donate", buffer)
        encoded = _text("donate", "to_tag", to_tag)
        new = ctypes.c_uint64()
        _check(
            _lib.portalloc_donate(self._token("donate"), handle, encoded, ctypes.byref(new))
        )
        ptr, size = self.info(new.value)
        return Buffer(new.value, ptr, size, "donated" if to_tag is None else to_tag, self)

    def info(self, buffer):
        """``(ptr, size)`` of a live buffer."""
        handle = self._handle("info", buffer)
        ptr = ctypes.c_void_p()
        size = ctypes.c_uint64()
        _check(
            _lib.portalloc_handle_info(
                self._token("info"), handle, ctypes.byref(ptr), ctypes.byref(size)
            )
        )
        return ptr.value or 0, size.value

    def stats(self):
        """The counters, as a dict (XLA's ``AllocatorStats`` names)."""
        s = _Stats()
        _check(_lib.portalloc_stats(self._token("stats"), ctypes.byref(s)))
        return {name: getattr(s, name) for name, _ in _Stats._fields_}

    def ledger(self):
        """The ledger snapshot (live buffers, totals by tag, last OOM diagnosis) as a dict."""
        raw = self._token("ledger")
        n = ctypes.c_size_t()
        buf = ctypes.create_string_buffer(1)
        status = _lib.portalloc_ledger_json(raw, None, 0, ctypes.byref(n))
        # Another thread may grow the ledger between two calls: ask again with its length.
        while status == _BUFFER_TOO_SMALL:
            buf = ctypes.create_string_buffer(n.value + 1)
            status = _lib.portalloc_ledger_json(raw, buf, len(buf), ctypes.byref(n))
        _check(status)
        return json.loads(buf.raw[: n.value].decode("utf-8"))

    def write_ledger(self, path):
        """Writes the ledger snapshot to ``path`` (``str``, ``bytes`` or ``os.PathLike``;
        ``portalloc ledger PATH`` prints it). The C ABI takes UTF-8 paths: one that is not
        is refused (``INVALID_ARGUMENT``)."""
        encoded = _path("write_ledger", "path", path)
        _check(_lib.portalloc_ledger_write(self._token("write_ledger"), encoded))

    def trim(self):
        """Returns unused memory to the device; the bytes released."""
        out = ctypes.c_uint64()
        _check(_lib.portalloc_trim(self._token("trim"), ctypes.byref(out)))
        return out.value

    def close(self):
        """Destroys the allocator (frees its live buffers); again, nothing. The finalizer
        makes the same call when an unclosed allocator is collected or the interpreter
        exits. The global allocator is not owned and is left alone."""
        if self._finalizer is None:
            return
        status = self._finalizer()  # None once it has run
        if status is not None:
            _check(status)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def global_allocator(device=0):
    """The process-global allocator of ``device`` (the PyTorch hooks' and CuPy's)."""
    return Allocator.global_allocator(device)


def stats(device=0):
    """Counters of the global allocator of ``device``."""
    return global_allocator(device).stats()


def ledger(device=0):
    """Ledger snapshot of the global allocator of ``device``."""
    return global_allocator(device).ledger()


def install_torch(path=None):
    """Makes portalloc PyTorch's CUDA allocator (before any CUDA memory is allocated).
    Returns the ``CUDAPluggableAllocator``. Raises ImportError without PyTorch."""
    import torch  # noqa: F401 (optional dependency)

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

    def __init__(self, allocator, handle):
        self.allocator, self.handle = allocator, handle

    def __del__(self):
        try:
            self.allocator.free(self.handle)
        except Exception:  # never raise from a finaliser
            pass


def install_cupy(path=None):
    """Makes portalloc CuPy's allocator (``cupy.cuda.set_allocator``): each request is a
    buffer of the current device's global allocator, tagged ``cupy``, freed when CuPy drops
    it. Raises ImportError without CuPy."""
    import cupy  # optional dependency

    load(path)

    def malloc(size):
        device = cupy.cuda.Device().id
        allocator = global_allocator(device)
        buf = allocator.allocate(size, tag="cupy")
        owner = _CupyOwner(allocator, buf.handle)
        memory = cupy.cuda.memory.UnownedMemory(buf.ptr, size, owner, device_id=device)
        return cupy.cuda.memory.MemoryPointer(memory, 0)

    cupy.cuda.set_allocator(malloc)
    return malloc


def install(path=None):
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
