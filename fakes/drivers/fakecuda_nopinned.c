/*
 * fakecuda_nopinned: the conformance driver where host memory cannot be page-locked — every
 * call fakecuda exports, with cuMemHostAlloc, cuMemAllocHost and cuMemHostRegister answering
 * CUDA_ERROR_OUT_OF_MEMORY — so that a driver that cannot give pinned memory is tested: the
 * shim loads it, and alloc_pinned_host answers that there is none (copies use the caller's
 * ordinary host memory). See fakecuda.c.
 */
#define FAKECUDA_NO_PINNED_HOST 1
#include "fakecuda.c"
