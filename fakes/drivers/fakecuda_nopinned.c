/*
 * fakecuda_nopinned: the conformance driver without the pinned host memory calls
 * (cuMemHostAlloc, cuMemFreeHost), everything else as fakecuda's — so that a driver that
 * cannot give pinned memory is tested: the shim loads it, and alloc_pinned_host answers that
 * there is none (copies use the caller's ordinary host memory). See fakecuda.c.
 */
#define FAKECUDA_NO_PINNED_HOST 1
#include "fakecuda.c"
