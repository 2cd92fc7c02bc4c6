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
"""

import ctypes
import ctypes.util
import json
import os
import pathlib

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
    """The path of libportalloc.so that :func:`load` would open."""
    if path:
        return str(path)
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


def _text(value):
    return None if value is None else str(value).encode("utf-8")


def _tristate(value):
    return -1 if value is None else (1 if value else 0)


class Buffer:
    """A live buffer: its ``handle`` (generation-checked), device ``ptr`` (an int; 0 for zero
    bytes), ``size`` and ``tag``."""

    __slots__ = ("handle", "ptr", "size", "tag")

    def __init__(self, handle, ptr, size, tag):
        self.handle, self.ptr, self.size, self.tag = handle, ptr, size, tag

    def __repr__(self):
        return "Buffer(handle=%#x, ptr=%#x, size=%d, tag=%r)" % (
            self.handle,
            self.ptr,
            self.size,
            self.tag,
        )


def _handle(buffer_or_handle):
    return buffer_or_handle.handle if isinstance(buffer_or_handle, Buffer) else int(buffer_or_handle)


class Allocator:
    """A portalloc allocator (with its ledger) made through the C ABI."""

    def __init__(self, raw, owned=True):
        self._raw = ctypes.c_void_p(raw)
        self._owned = owned

    @classmethod
    def from_env(cls, device=0):
        """An allocator for ``device`` configured by the environment."""
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
        """An allocator from explicit options; ``None`` defers to the environment."""
        lib = load()
        o = _Options()
        _check(lib.portalloc_options_default(ctypes.byref(o)))
        o.strategy = _text(strategy)
        o.mem_fraction = float(mem_fraction or 0.0)
        o.preallocate = _tristate(preallocate)
        o.backend = _text(backend)
        o.host_capacity = int(host_capacity or 0)
        o.host_simulated = _tristate(host_simulated)
        o.backtrace = _tristate(backtrace)
        o.device = int(device)
        o.ignore_env = 1 if ignore_env else 0
        out = ctypes.c_void_p()
        _check(lib.portalloc_create(ctypes.byref(o), ctypes.byref(out)))
        return cls(out.value)

    @classmethod
    def global_allocator(cls, device=0):
        """The process-global allocator of ``device``: the one the PyTorch hooks use."""
        lib = load()
        out = ctypes.c_void_p()
        _check(lib.portalloc_global(int(device), ctypes.byref(out)))
        return cls(out.value, owned=False)

    def allocate(self, size, alignment=0, stream=0, tag="buffer"):
        """Allocates ``size`` bytes for use on ``stream``; returns a :class:`Buffer`.

        ``stream`` is the caller's own stream handle as an integer (``torch.cuda.Stream``'s
        ``cuda_stream``, CuPy's ``Stream.ptr``; 0 for the default stream): nothing to
        register. The buffer is freed in stream order on it.
        """
        handle = ctypes.c_uint64()
        ptr = ctypes.c_void_p()
        _check(
            _lib.portalloc_allocate(
                self._raw,
                int(size),
                int(alignment),
                int(stream),
                _text(tag),
                ctypes.byref(handle),
                ctypes.byref(ptr),
            )
        )
        return Buffer(handle.value, ptr.value or 0, int(size), tag)

    def free(self, buffer):
        """Frees a :class:`Buffer` or handle. A freed or donated one raises
        :class:`PortallocError` (``INVALID_HANDLE``)."""
        _check(_lib.portalloc_free(self._raw, _handle(buffer)))

    def free_ptr(self, ptr):
        """Frees the buffer starting at ``ptr`` (an int)."""
        _check(_lib.portalloc_free_ptr(self._raw, ctypes.c_void_p(int(ptr))))

    def donate(self, buffer, to_tag="donated"):
        """Hands a buffer to a consumer under ``to_tag``; returns the consumer's
        :class:`Buffer`. The old handle is dead afterwards."""
        new = ctypes.c_uint64()
        _check(
            _lib.portalloc_donate(self._raw, _handle(buffer), _text(to_tag), ctypes.byref(new))
        )
        ptr, size = self.info(new.value)
        return Buffer(new.value, ptr, size, to_tag)

    def info(self, buffer):
        """``(ptr, size)`` of a live buffer."""
        ptr = ctypes.c_void_p()
        size = ctypes.c_uint64()
        _check(
            _lib.portalloc_handle_info(
                self._raw, _handle(buffer), ctypes.byref(ptr), ctypes.byref(size)
            )
        )
        return ptr.value or 0, size.value

    def stats(self):
        """The counters, as a dict (XLA's ``AllocatorStats`` names)."""
        s = _Stats()
        _check(_lib.portalloc_stats(self._raw, ctypes.byref(s)))
        return {name: getattr(s, name) for name, _ in _Stats._fields_}

    def ledger(self):
        """The ledger snapshot (live buffers, totals by tag, last OOM diagnosis) as a dict."""
        n = ctypes.c_size_t()
        status = _lib.portalloc_ledger_json(self._raw, None, 0, ctypes.byref(n))
        if status != _BUFFER_TOO_SMALL:
            _check(status)
        buf = ctypes.create_string_buffer(n.value + 1)
        _check(_lib.portalloc_ledger_json(self._raw, buf, len(buf), ctypes.byref(n)))
        return json.loads(buf.value.decode("utf-8"))

    def write_ledger(self, path):
        """Writes the ledger snapshot to ``path`` (``portalloc ledger PATH`` prints it)."""
        _check(_lib.portalloc_ledger_write(self._raw, _text(os.fspath(path))))

    def trim(self):
        """Returns unused memory to the device; the bytes released."""
        out = ctypes.c_uint64()
        _check(_lib.portalloc_trim(self._raw, ctypes.byref(out)))
        return out.value

    def close(self):
        """Destroys the allocator (frees its live buffers). The global one is left alone."""
        if self._owned and self._raw:
            raw, self._raw = self._raw, ctypes.c_void_p()
            _check(_lib.portalloc_destroy(raw))

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
