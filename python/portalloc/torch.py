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
from typing import Any, Dict, List, Optional

from . import global_allocator

__all__ = ["record_stream", "graph_pools", "release_graph_pools"]


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
