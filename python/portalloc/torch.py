"""portalloc with PyTorch: what PyTorch's pluggable-allocator interface does not pass on.

With portalloc installed as PyTorch's CUDA allocator (:func:`portalloc.install_torch`,
``torch.cuda.memory.CUDAPluggableAllocator``), ``Tensor.record_stream(stream)`` does nothing:
PyTorch's Python interface gives the pluggable allocator no record-stream hook, so a tensor
used on a side stream (NCCL's, a copy stream) could have its memory handed out again while
that stream's work still reads it. :func:`record_stream` is the replacement. Standard
library only: PyTorch is not imported here, the tensor and stream are only asked for their
pointer, device and handle.
"""

import importlib
from typing import Any, Dict, List, Optional, Sequence

from . import ImportedBuffer, ShareHandle, global_allocator, import_handle

__all__ = [
    "record_stream",
    "graph_pools",
    "release_graph_pools",
    "share_tensor",
    "tensor_from_handle",
]


def _device_of(tensor: Any) -> int:
    """The CUDA device index of ``tensor`` (its ``device.index``, else the current one)."""
    index: Optional[int] = getattr(getattr(tensor, "device", None), "index", None)
    if index is not None:
        return int(index)
    torch = importlib.import_module("torch")  # only for a tensor without a device index
    return int(torch.cuda.current_device())


def record_stream(tensor: Any, stream: Any) -> None:
    """The replacement for ``tensor.record_stream(stream)`` under portalloc: marks the
    memory behind ``tensor`` (its storage, the buffer portalloc handed out) as used by work
    on ``stream`` — a ``torch.cuda.Stream`` (its ``cuda_stream`` handle) or a stream handle
    as an int — so that when the tensor goes, the memory is handed out again only after the
    work queued on ``stream`` before that has completed.

    An empty tensor (no memory) is accepted and nothing is recorded, as with PyTorch's own.
    The per-thread default stream is the calling thread's: the tensor freed on another
    thread waits for the whole device instead.

    Raises :class:`portalloc.PortallocError` (``UNKNOWN_POINTER``) for a tensor whose
    memory portalloc's global allocator of its device did not hand out."""
    storage = tensor.untyped_storage()
    ptr = int(storage.data_ptr())
    handle = int(getattr(stream, "cuda_stream", stream))
    global_allocator(_device_of(tensor)).record_stream(ptr, handle)


def graph_pools(device: int = 0) -> List[Dict[str, int]]:
    """The graph pools of the global allocator of ``device``: one per CUDA graph captured
    through the hook (``torch.cuda.graph``, ``torch.compile(mode="reduce-overhead")``), which
    the hook detects from the stream PyTorch passes. Their memory stays the graphs' — eager
    tensors never get it — until :func:`release_graph_pools`."""
    return global_allocator(device).graph_pools()


def release_graph_pools(device: int = 0) -> int:
    """Releases every graph pool of the global allocator of ``device``: call it once the
    graphs are gone (``graph.reset()``, or deleted), as PyTorch's allocator releases a graph's
    private pool then — PyTorch's Python API does not tell a pluggable allocator. Waits for the
    device; the bytes given back."""
    allocator = global_allocator(device)
    return sum(allocator.release_graph_pool(p["pool"]) for p in allocator.graph_pools())


def share_tensor(tensor: Any) -> ShareHandle:
    """The replacement for sending a CUDA tensor through ``torch.multiprocessing`` under
    portalloc: the :class:`portalloc.ShareHandle` of the memory behind ``tensor`` (its whole
    storage, the buffer portalloc's global allocator of its device handed out), picklable;
    another process rebuilds the tensor with :func:`tensor_from_handle`, given the dtype and
    shape (and, for a view, stride and storage offset) it needs.

    PyTorch's own path (``storage._share_cuda_()``) asks the allocator for a legacy CUDA IPC
    handle, which ``CUDAPluggableAllocator`` refuses ("does not yet support shareIPcHandle");
    see docs/share.md. Waits for the work queued on the tensor's device's current stream, so
    the importer sees what was written before the call (PyTorch sends an IPC event instead).

    Raises :class:`portalloc.PortallocError` (``UNKNOWN_POINTER``) for a tensor whose memory
    portalloc's global allocator did not hand out (``install_torch`` was not called before
    CUDA was initialised), ``UNSUPPORTED`` for a strategy that cannot export
    (``cuda_async``)."""
    torch = importlib.import_module("torch")
    device = _device_of(tensor)
    ptr = int(tensor.untyped_storage().data_ptr())
    torch.cuda.current_stream(device).synchronize()
    return global_allocator(device).export(ptr)


class _TorchImport:
    """An import exposed to PyTorch as CUDA array interface bytes: the tensor made from it
    keeps it (PyTorch holds the object until the storage is freed), and it unmaps once the
    tensor's storage is gone, after the device's current stream finished its work."""

    def __init__(self, imported: ImportedBuffer, device: int) -> None:
        self.imported = imported
        self.device = device
        self.__cuda_array_interface__ = {
            "shape": (imported.size,),
            "typestr": "|u1",
            "data": (imported.ptr, False),
            "version": 3,
            "strides": None,
            # The importer orders its own work; nothing to wait for on a stream here.
            "stream": None,
        }

    def __del__(self) -> None:
        try:
            torch = importlib.import_module("torch")
            torch.cuda.current_stream(self.device).synchronize()
        except Exception:  # interpreter exit: the process's end unmaps it anyway
            pass
        self.imported.close()


def tensor_from_handle(
    handle: ShareHandle,
    dtype: Any,
    shape: Sequence[int],
    device: Optional[int] = None,
    stride: Optional[Sequence[int]] = None,
    storage_offset: int = 0,
) -> Any:
    """The tensor of ``dtype`` and ``shape`` (``stride``: contiguous unless given;
    ``storage_offset`` in elements) over the memory another process shared with
    :func:`share_tensor`, mapped on CUDA device ``device`` (``None``: the current one) with
    :func:`portalloc.import_handle` on the global allocator of that device: no copy, the same
    memory. The import lives as long as the tensor's storage; the exporter keeps the memory
    for it even if it frees the tensor meanwhile (docs/share.md)."""
    torch = importlib.import_module("torch")
    index = int(torch.cuda.current_device()) if device is None else int(device)
    imported = import_handle(handle, global_allocator(index))
    with torch.cuda.device(index):
        raw = torch.as_tensor(_TorchImport(imported, index), device="cuda:%d" % index)
    # Bytes to elements: a view of the uint8 tensor (bfloat16 too, which has no typestr).
    elements = raw.view(dtype)
    if stride is None:
        count = 1
        for n in shape:
            count *= int(n)
        return elements[storage_offset : storage_offset + count].view(tuple(shape))
    return elements.as_strided(tuple(shape), tuple(stride), storage_offset)
