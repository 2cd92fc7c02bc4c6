/*
 * fakecuda: a conformance driver for portalloc's CUDA backend.
 *
 * A small C library that exports the CUDA driver API symbols portalloc resolves (with the
 * `_v2` names libcuda exports) over host memory, so the real shim — loading, symbol
 * resolution, context handling, error mapping, every strategy — runs without a GPU. It
 * follows the driver's rules where portalloc depends on them:
 *
 *   - nothing but cuDriverGetVersion / cuGetErrorName / cuGetErrorString works before cuInit
 *     (CUDA_ERROR_NOT_INITIALIZED); cuInit with no devices is CUDA_ERROR_NO_DEVICE;
 *   - memory, stream, event and pool calls act on the calling thread's *current* context and
 *     fail with CUDA_ERROR_INVALID_CONTEXT when there is none (or it was released), so a shim
 *     that forgets cuCtxSetCurrent on a new thread fails here as it would on a GPU;
 *   - each device has a capacity; allocations, physical handles and pool memory are charged
 *     against it and CUDA_ERROR_OUT_OF_MEMORY comes back past it;
 *   - virtual memory is the driver's model over mmap + memfd: cuMemAddressReserve reserves
 *     PROT_NONE address space, cuMemCreate makes a memory file, cuMemMap maps it MAP_FIXED
 *     without access, cuMemSetAccess grants read-write, cuMemUnmap must cover whole
 *     mappings, cuMemRelease of a mapped handle defers the free to the last unmap;
 *     cuMemAddressReserve's `addr` is a hint, as the driver documents it: the reservation is
 *     at exactly `addr` when it is non-zero, aligned to the granularity and to `alignment`,
 *     and [addr, addr + size) overlaps no live reservation (and, this being the host's
 *     address space, nothing else the process mapped); else wherever the system puts it. A
 *     freed reservation's range stays the fake's (PROT_NONE) so it can be reserved again at
 *     the same address, and a reserve without a hint does not get it;
 *   - pools hand out memory stream-ordered (work is synchronous here), keep freed memory
 *     cached, give back what is above the release threshold at the next synchronisation, and
 *     answer the RESERVED/USED_MEM_CURRENT/HIGH attributes;
 *   - streams are clocks (any handle the driver knows: its own streams, NULL, CU_STREAM_LEGACY,
 *     CU_STREAM_PER_THREAD): work on one finishes in order, at once unless held "in flight"
 *     (fakecuda_hold_events); waiting for an event waits for the work before it; a pool block
 *     freed on a stream is reused by another only once that free has finished.
 *
 *   - peer access is the driver's: cuDeviceCanAccessPeer answers 1 for distinct devices
 *     unless fake_set_peer says otherwise, cuCtxEnablePeerAccess enables it from the current
 *     context to a peer's, and cuMemSetAccess takes a descriptor per device (see
 *     fake_common.h).
 *
 * Configuration: environment variables read at load (FAKECUDA_DEVICES, default 1;
 * FAKECUDA_CAPACITY bytes, default 1 GiB; FAKECUDA_GRANULARITY, default 2 MiB;
 * FAKECUDA_VERSION, default 12020), or fakecuda_configure() before cuInit.
 * Faults, call counts, live counts and peer controls: the fake_* API of fake_common.h; what
 * only this fake has: fakecuda_* below.
 *
 * Built four times by the tests (tests/support/mod.rs): this file (libfakecuda.so),
 * fakecuda_old.c, which defines FAKECUDA_OLD and includes it (libfakecuda_old.so): a CUDA 10.1
 * driver without the virtual memory and pool symbols, fakecuda_nopeer.c, which defines
 * FAKECUDA_NO_PEER (libfakecuda_nopeer.so): a driver without the peer-access calls, and
 * fakecuda_nopinned.c, which defines FAKECUDA_NO_PINNED_HOST (libfakecuda_nopinned.so): a
 * driver without cuMemHostAlloc / cuMemFreeHost.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUmemGenericAllocationHandle;

#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_OUT_OF_MEMORY 2
#define CUDA_ERROR_NOT_INITIALIZED 3
#define CUDA_ERROR_NO_DEVICE 100
#define CUDA_ERROR_INVALID_DEVICE 101
#define CUDA_ERROR_INVALID_CONTEXT 201
#define CUDA_ERROR_PEER_ACCESS_UNSUPPORTED 217
#define CUDA_ERROR_INVALID_HANDLE 400
#define CUDA_ERROR_NOT_READY 600
#define CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED 704
#define CUDA_ERROR_PEER_ACCESS_NOT_ENABLED 705
#define CUDA_ERROR_NOT_SUPPORTED 801
#define CUDA_ERROR_UNKNOWN 999

#define FAKE_STATUS CUresult
#define FAKE_OK CUDA_SUCCESS
#define FAKE_INVALID_VALUE CUDA_ERROR_INVALID_VALUE
#define FAKE_INVALID_DEVICE CUDA_ERROR_INVALID_DEVICE
#define FAKE_PEER_UNSUPPORTED CUDA_ERROR_PEER_ACCESS_UNSUPPORTED
#define FAKE_PEER_ALREADY_ENABLED CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED
#define FAKE_PEER_NOT_ENABLED CUDA_ERROR_PEER_ACCESS_NOT_ENABLED
#include "fake_common.h"
#define MAX_DEVICES FAKE_MAX_DEVICES

/* ---- The header's structs, as portalloc's sys crate declares them ---- */

typedef struct {
  unsigned int type;
  int id;
} CUmemLocation;

typedef struct {
  unsigned int type;
  unsigned int requestedHandleTypes;
  CUmemLocation location;
  void *win32HandleMetaData;
  struct {
    unsigned char compressionType;
    unsigned char gpuDirectRDMACapable;
    unsigned short usage;
    unsigned char reserved[4];
  } allocFlags;
} CUmemAllocationProp;

typedef struct {
  CUmemLocation location;
  unsigned int flags;
} CUmemAccessDesc;

typedef struct {
  unsigned int allocType;
  unsigned int handleTypes;
  CUmemLocation location;
  void *win32SecurityAttributes;
  size_t maxSize;
  unsigned char reserved[56];
} CUmemPoolProps;

_Static_assert(sizeof(CUmemAllocationProp) == 32, "CUmemAllocationProp is 32 bytes");
_Static_assert(sizeof(CUmemAccessDesc) == 12, "CUmemAccessDesc is 12 bytes");
_Static_assert(sizeof(CUmemPoolProps) == 88, "CUmemPoolProps is 88 bytes");

/* ---- State ---- */

typedef struct ctx {
  int device;
  int refcount;
} ctx_t;

typedef struct alloc {
  struct alloc *next;
  unsigned long long ptr, size, charge;
  int device;
} alloc_t;

typedef struct handle {
  struct handle *next;
  unsigned long long id, size;
  int device, fd, released, mappings;
} handle_t;

typedef struct mapping {
  struct mapping *next;
  unsigned long long va, size;
  handle_t *handle;
  unsigned access; /* bit d: device d may access it (cuMemSetAccess) */
} mapping_t;

typedef struct reservation {
  struct reservation *next;
  unsigned long long va, size;
} reservation_t;

/* Pinned host memory (cuMemHostAlloc): malloc'd, until cuMemFreeHost. */
typedef struct host_alloc {
  struct host_alloc *next;
  void *ptr;
  unsigned long long size;
} host_alloc_t;

typedef struct stream stream_t;

typedef struct block {
  struct block *next;
  unsigned long long ptr, size;
  int in_use;
  int free_clock;               /* the clock of the last cuMemFreeAsync's stream */
  unsigned long long free_seq;  /* that clock's number for the free */
} block_t;

typedef struct pool {
  struct pool *next;
  int device, is_default, destroyed;
  struct fake_pool_stats stats;
  block_t *blocks;
} pool_t;

/* A stream is a clock of the timeline (fake_common.h): the operations the fake tracks (event
 * records, pool frees, waits, kernels) finish in order, as on a GPU. The special handles NULL
 * and CU_STREAM_LEGACY (0x1) share the legacy default stream's clock, CU_STREAM_PER_THREAD
 * (0x2) names the calling thread's own. */
struct stream {
  struct stream *next;
  int device;
  int clock;
};

typedef struct event {
  struct event *next;
  int device, recorded;
  int clock;              /* the clock of the last record's stream */
  unsigned long long seq; /* its number on that clock; 0: complete */
} event_t;

static __thread ctx_t *current;

static int configured, initialized;
static int n_devices = 1, version = 12020;
static unsigned long long capacity = 1ULL << 30, granularity = 2ULL << 20;
static unsigned long long used[MAX_DEVICES];
static int attributes[MAX_DEVICES][256];
static ctx_t contexts[MAX_DEVICES];

static alloc_t *allocs;
static handle_t *handles;
static mapping_t *mappings;
static reservation_t *reservations;
static host_alloc_t *host_allocs;
static pool_t *pools;
static stream_t *streams;
static event_t *events;

static unsigned long long env_u64(const char *name, unsigned long long fallback) {
  const char *v = getenv(name);
  if (!v || !*v) return fallback;
  char *end = NULL;
  unsigned long long x = strtoull(v, &end, 0);
  return (end && *end == 0) ? x : fallback;
}

static void configure_defaults(void) {
  if (configured) return;
  configured = 1;
  n_devices = (int)env_u64("FAKECUDA_DEVICES", 1);
  if (n_devices > MAX_DEVICES) n_devices = MAX_DEVICES;
  capacity = env_u64("FAKECUDA_CAPACITY", 1ULL << 30);
  granularity = env_u64("FAKECUDA_GRANULARITY", 2ULL << 20);
#ifdef FAKECUDA_OLD
  version = (int)env_u64("FAKECUDA_VERSION", 10010);
#else
  version = (int)env_u64("FAKECUDA_VERSION", 12020);
#endif
  for (int d = 0; d < MAX_DEVICES; d++) {
    memset(attributes[d], 0, sizeof attributes[d]);
    attributes[d][75] = 9; /* compute capability 9.0 */
    attributes[d][76] = 0;
#ifndef FAKECUDA_OLD
    attributes[d][102] = 1; /* virtual memory management */
    attributes[d][115] = 1; /* memory pools */
#endif
    contexts[d].device = d;
  }
}

static void fake_prepare(void) { configure_defaults(); }

#define NEED_INIT() \
  if (!initialized) RETURN(CUDA_ERROR_NOT_INITIALIZED)
/* A live current context, or return CUDA_ERROR_INVALID_CONTEXT. */
#define NEED_CURRENT() \
  NEED_INIT();         \
  if (!current || current->refcount <= 0) RETURN(CUDA_ERROR_INVALID_CONTEXT)
/* The device of the current context, or return CUDA_ERROR_INVALID_CONTEXT. */
#define NEED_CTX(dev) \
  NEED_CURRENT();     \
  int dev = current->device

/* Pushes `node` at the head of `list`. */
#define PUSH(list, node) ((node)->next = (list), (list) = (node))

static unsigned long long round_up(unsigned long long x, unsigned long long to) {
  return (x + to - 1) / to * to;
}

static int charge(int device, unsigned long long bytes) {
  if (bytes > capacity || used[device] > capacity - bytes) return 0;
  used[device] += bytes;
  return 1;
}

static void *map_anonymous(unsigned long long size) {
  void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                 -1, 0);
  return p == MAP_FAILED ? NULL : p;
}

/* ---- Inspection and fault injection (for the tests, through libloading) ---- */

/* Sets the devices before cuInit: count, capacity (bytes), granularity (bytes), version. A
 * zero leaves that setting as it is; devices = -1 means none. */
int fakecuda_configure(int devices, unsigned long long cap, unsigned long long gran, int ver) {
  int ok = 0;
  LOCKED({
    ok = !initialized;
    if (ok) {
      if (devices < 0) n_devices = 0;
      else if (devices > 0) n_devices = devices > MAX_DEVICES ? MAX_DEVICES : devices;
      if (cap) capacity = cap;
      if (gran) granularity = gran;
      if (ver) version = ver;
    }
  });
  return ok ? 0 : -1;
}

/* Overrides a device attribute (e.g. 102 = 0: no virtual memory). */
void fakecuda_set_attribute(int device, int attribute, int value) {
  LOCKED({
    if (fake_device_index_ok(device) && attribute >= 0 && attribute < 256)
      attributes[device][attribute] = value;
  });
}

/* While held, work recorded on streams (events, pool frees) stays in flight (cuEventQuery:
 * CUDA_ERROR_NOT_READY) until synchronised or released; releasing completes it all. */
void fakecuda_hold_events(int held) {
  LOCKED(fake_set_hold(held));
}

/* fake_live's answers (fake_common.h). */
static long long fake_live_of(enum fake_live_what what) {
  long long n = 0;
/* Adds `term` for each node `x` of `list`. */
#define SUM(type, x, list, term) \
  for (type *x = (list); x; x = x->next) n += (long long)(term)
  switch (what) {
    case LIVE_ALLOCATIONS: SUM(alloc_t, a, allocs, 1); break;
    case LIVE_HANDLES: SUM(handle_t, h, handles, 1); break;
    case LIVE_MAPPINGS: SUM(mapping_t, m, mappings, 1); break;
    case LIVE_RESERVATIONS: SUM(reservation_t, r, reservations, 1); break;
    case LIVE_POOLS: SUM(pool_t, p, pools, !p->is_default && !p->destroyed); break;
    case LIVE_POOL_ALLOCATIONS:
      for (pool_t *p = pools; p; p = p->next) SUM(block_t, b, p->blocks, b->in_use);
      break;
    case LIVE_POOL_RESERVED: SUM(pool_t, p, pools, p->stats.reserved); break;
    case LIVE_STREAMS: SUM(stream_t, s, streams, 1); break;
    case LIVE_EVENTS: SUM(event_t, e, events, 1); break;
    case LIVE_CONTEXTS:
      for (int d = 0; d < MAX_DEVICES; d++) n += contexts[d].refcount;
      break;
    case LIVE_HOST_ALLOCATIONS: SUM(host_alloc_t, h, host_allocs, 1); break;
    case LIVE_BYTES:
      for (int d = 0; d < MAX_DEVICES; d++) n += (long long)used[d];
      break;
    default: n = -1;
  }
#undef SUM
  return n;
}

/* fake_access's answer (fake_common.h). */
static int fake_access_of(unsigned long long va, int device) {
  for (mapping_t *m = mappings; m; m = m->next)
    if (m->va <= va && va < m->va + m->size)
      return fake_device_index_ok(device) && (m->access >> device) & 1;
  return -1;
}

/* Bytes charged on one device. */
unsigned long long fakecuda_device_used(int device) {
  unsigned long long n = 0;
  LOCKED(n = fake_device_index_ok(device) ? used[device] : 0);
  return n;
}

/* ---- Init, version, devices, errors ---- */

CUresult cuInit(unsigned int flags) {
  ENTER("cuInit");
  if (flags != 0) RETURN(CUDA_ERROR_INVALID_VALUE);
  if (n_devices <= 0) RETURN(CUDA_ERROR_NO_DEVICE);
  initialized = 1;
  RETURN(CUDA_SUCCESS);
}

CUresult cuDriverGetVersion(int *v) {
  ENTER("cuDriverGetVersion");
  if (!v) RETURN(CUDA_ERROR_INVALID_VALUE);
  *v = version;
  RETURN(CUDA_SUCCESS);
}

CUresult cuDeviceGetCount(int *count) {
  ENTER("cuDeviceGetCount");
  NEED_INIT();
  if (!count) RETURN(CUDA_ERROR_INVALID_VALUE);
  *count = n_devices;
  RETURN(CUDA_SUCCESS);
}

CUresult cuDeviceGet(CUdevice *device, int ordinal) {
  ENTER("cuDeviceGet");
  NEED_INIT();
  if (!device) RETURN(CUDA_ERROR_INVALID_VALUE);
  if (ordinal < 0 || ordinal >= n_devices) RETURN(CUDA_ERROR_INVALID_DEVICE);
  *device = ordinal;
  RETURN(CUDA_SUCCESS);
}

#define NEED_DEVICE(d) \
  if ((d) < 0 || (d) >= n_devices) RETURN(CUDA_ERROR_INVALID_DEVICE)

CUresult cuDeviceGetName(char *name, int len, CUdevice dev) {
  ENTER("cuDeviceGetName");
  NEED_INIT();
  NEED_DEVICE(dev);
  if (!name || len <= 0) RETURN(CUDA_ERROR_INVALID_VALUE);
  snprintf(name, (size_t)len, "FakeCUDA Device %d", dev);
  RETURN(CUDA_SUCCESS);
}

CUresult cuDeviceGetAttribute(int *value, int attribute, CUdevice dev) {
  ENTER("cuDeviceGetAttribute");
  NEED_INIT();
  NEED_DEVICE(dev);
  if (!value || attribute <= 0 || attribute >= 256) RETURN(CUDA_ERROR_INVALID_VALUE);
  *value = attributes[dev][attribute];
  RETURN(CUDA_SUCCESS);
}

CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
  ENTER("cuDeviceTotalMem_v2");
  NEED_INIT();
  NEED_DEVICE(dev);
  if (!bytes) RETURN(CUDA_ERROR_INVALID_VALUE);
  *bytes = capacity;
  RETURN(CUDA_SUCCESS);
}

static const struct fake_error errors[] = {
    {0, "CUDA_SUCCESS", "no error"},
    {1, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {2, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {3, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {4, "CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
    {100, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {101, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {201, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {217, "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED", "peer access is not supported between these two devices"},
    {400, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {500, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {600, "CUDA_ERROR_NOT_READY", "device not ready"},
    {700, "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"},
    {704, "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED", "peer access is already enabled"},
    {705, "CUDA_ERROR_PEER_ACCESS_NOT_ENABLED", "peer access has not been enabled"},
    {800, "CUDA_ERROR_NOT_PERMITTED", "operation not permitted"},
    {801, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {999, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

/* The name (`text` 0) or text of `error`; CUDA_ERROR_INVALID_VALUE for a code it has not. */
static CUresult describe_error(const char *function, CUresult error, const char **out, int text) {
  const struct fake_error *e = fake_error_of(errors, sizeof errors / sizeof errors[0], error,
                                             function);
  if (!out) return CUDA_ERROR_INVALID_VALUE;
  *out = e ? (text ? e->text : e->name) : NULL;
  return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGetErrorName(CUresult error, const char **name) {
  return describe_error("cuGetErrorName", error, name, 0);
}
CUresult cuGetErrorString(CUresult error, const char **text) {
  return describe_error("cuGetErrorString", error, text, 1);
}

/* ---- Contexts ---- */

CUresult cuDevicePrimaryCtxRetain(ctx_t **pctx, CUdevice dev) {
  ENTER("cuDevicePrimaryCtxRetain");
  NEED_INIT();
  NEED_DEVICE(dev);
  if (!pctx) RETURN(CUDA_ERROR_INVALID_VALUE);
  contexts[dev].refcount++;
  *pctx = &contexts[dev];
  RETURN(CUDA_SUCCESS);
}

static CUresult primary_release(CUdevice dev) {
  NEED_INIT();
  NEED_DEVICE(dev);
  if (contexts[dev].refcount <= 0) RETURN(CUDA_ERROR_INVALID_CONTEXT);
  contexts[dev].refcount--;
  RETURN(CUDA_SUCCESS);
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  ENTER("cuDevicePrimaryCtxRelease_v2");
  return primary_release(dev);
}

CUresult cuDevicePrimaryCtxRelease(CUdevice dev) {
  ENTER("cuDevicePrimaryCtxRelease");
  return primary_release(dev);
}

CUresult cuCtxGetCurrent(ctx_t **pctx) {
  ENTER("cuCtxGetCurrent");
  NEED_INIT();
  if (!pctx) RETURN(CUDA_ERROR_INVALID_VALUE);
  *pctx = current;
  RETURN(CUDA_SUCCESS);
}

CUresult cuCtxSetCurrent(ctx_t *ctx) {
  ENTER("cuCtxSetCurrent");
  NEED_INIT();
  if (ctx && (ctx < &contexts[0] || ctx >= &contexts[MAX_DEVICES])) RETURN(CUDA_ERROR_INVALID_CONTEXT);
  current = ctx;
  RETURN(CUDA_SUCCESS);
}

/* ---- Peer access (not in fakecuda_nopeer) ---- */

#ifndef FAKECUDA_NO_PEER
CUresult cuDeviceCanAccessPeer(int *can, CUdevice dev, CUdevice peer) {
  ENTER("cuDeviceCanAccessPeer");
  NEED_INIT();
  RETURN(fake_can_access_peer(can, dev, peer, n_devices));
}

/* From the current context's device to `peer_ctx`'s. */
CUresult cuCtxEnablePeerAccess(ctx_t *peer_ctx, unsigned int flags) {
  ENTER("cuCtxEnablePeerAccess");
  NEED_CTX(dev);
  if (!peer_ctx || peer_ctx < &contexts[0] || peer_ctx >= &contexts[MAX_DEVICES] ||
      peer_ctx->refcount <= 0)
    RETURN(CUDA_ERROR_INVALID_CONTEXT);
  RETURN(fake_enable_peer(dev, peer_ctx->device, flags, n_devices));
}
#endif /* FAKECUDA_NO_PEER */

/* ---- Plain memory ---- */

CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total) {
  ENTER("cuMemGetInfo_v2");
  NEED_CTX(dev);
  if (!free_bytes || !total) RETURN(CUDA_ERROR_INVALID_VALUE);
  *free_bytes = capacity - used[dev];
  *total = capacity;
  RETURN(CUDA_SUCCESS);
}

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t size) {
  ENTER("cuMemAlloc_v2");
  NEED_CTX(dev);
  if (!dptr || size == 0) RETURN(CUDA_ERROR_INVALID_VALUE);
  unsigned long long bytes = round_up(size, 256);
  if (bytes < size || !charge(dev, bytes)) RETURN(CUDA_ERROR_OUT_OF_MEMORY);
  void *p = map_anonymous(size);
  alloc_t *a = p ? calloc(1, sizeof *a) : NULL;
  if (!a) {
    if (p) munmap(p, size);
    used[dev] -= bytes;
    RETURN(CUDA_ERROR_OUT_OF_MEMORY);
  }
  a->ptr = (unsigned long long)(uintptr_t)p;
  a->size = size;
  a->charge = bytes;
  a->device = dev;
  PUSH(allocs, a);
  *dptr = a->ptr;
  RETURN(CUDA_SUCCESS);
}

CUresult cuMemFree_v2(CUdeviceptr ptr) {
  ENTER("cuMemFree_v2");
  NEED_CURRENT();
  for (alloc_t **pa = &allocs; *pa; pa = &(*pa)->next) {
    alloc_t *a = *pa;
    if (a->ptr != ptr) continue;
    *pa = a->next;
    fake_check_unused(a->ptr, a->size, "cuMemFree_v2");
    munmap((void *)(uintptr_t)a->ptr, a->size);
    used[a->device] -= a->charge;
    free(a);
    RETURN(CUDA_SUCCESS);
  }
  RETURN(CUDA_ERROR_INVALID_VALUE);
}

/* ---- Streams and events ---- */

#define STREAM_LEGACY ((stream_t *)(uintptr_t)1)
#define STREAM_PER_THREAD ((stream_t *)(uintptr_t)2)
/* Destroyed streams, whose handle values the next cuStreamCreate hands out again. */
static stream_t *destroyed_streams;

static int stream_ok(stream_t *s) {
  if (!s || s == STREAM_LEGACY || s == STREAM_PER_THREAD) return 1;
  for (stream_t *t = streams; t; t = t->next)
    if (t == s) return 1;
  return 0;
}

/* The clock of a valid stream handle. */
static int clock_of(stream_t *s) {
  if (!s || s == STREAM_LEGACY) return FAKE_NULL_CLOCK;
  if (s == STREAM_PER_THREAD) return fake_per_thread_clock();
  return s->clock;
}

static int fake_clock_of_handle(void *stream) {
  return stream_ok((stream_t *)stream) ? clock_of((stream_t *)stream) : 0;
}

/* Enqueues one tracked operation on `s`; returns its number. */
static unsigned long long enqueue(stream_t *s) { return fake_enqueue(clock_of(s)); }

static int event_ok(event_t *e) {
  for (event_t *t = events; t; t = t->next)
    if (t == e) return 1;
  return 0;
}

static void release_above_threshold(void);

/* cuStreamCreate / cuEventCreate: a new object of the current context's device, pushed on
 * `list` and written to `*out`; `flags` at most `max_flags`. */
#define CREATE_IN_CONTEXT(list, out, flags, max_flags)                  \
  NEED_CTX(dev);                                                        \
  if (!(out) || (flags) > (max_flags)) RETURN(CUDA_ERROR_INVALID_VALUE); \
  __typeof__(*(out)) made_ = calloc(1, sizeof *made_);                  \
  if (!made_) RETURN(CUDA_ERROR_OUT_OF_MEMORY);                         \
  made_->device = dev;                                                  \
  PUSH(list, made_);                                                    \
  *(out) = made_;                                                       \
  RETURN(CUDA_SUCCESS)

CUresult cuStreamCreate(stream_t **ps, unsigned int flags) {
  ENTER("cuStreamCreate");
  NEED_CTX(dev);
  if (!ps || flags > 1) RETURN(CUDA_ERROR_INVALID_VALUE);
  int clock = fake_clock_new();
  if (!clock) RETURN(CUDA_ERROR_OUT_OF_MEMORY);
  /* The handle of the stream destroyed last, if any: drivers reuse freed handles. */
  stream_t *made = destroyed_streams;
  if (made)
    destroyed_streams = made->next;
  else
    made = calloc(1, sizeof *made);
  if (!made) RETURN(CUDA_ERROR_OUT_OF_MEMORY);
  made->device = dev;
  made->clock = clock;
  PUSH(streams, made);
  *ps = made;
  RETURN(CUDA_SUCCESS);
}

CUresult cuStreamDestroy_v2(stream_t *s) {
  ENTER("cuStreamDestroy_v2");
  NEED_CURRENT();
  for (stream_t **p = &streams; *p; p = &(*p)->next) {
    if (*p != s) continue;
    *p = s->next;
    /* Like the driver, the work already enqueued still completes (kernels in flight run on);
     * events and pool frees keep naming the stream's clock. */
    fake_clock_retire(s->clock);
    PUSH(destroyed_streams, s);
    RETURN(CUDA_SUCCESS);
  }
  RETURN(CUDA_ERROR_INVALID_HANDLE);
}

CUresult cuStreamSynchronize(stream_t *s) {
  ENTER("cuStreamSynchronize");
  NEED_CURRENT();
  if (!stream_ok(s)) RETURN(CUDA_ERROR_INVALID_HANDLE);
  fake_cpu_wait();
  /* The legacy default stream waits for every blocking stream. */
  if (clock_of(s) == FAKE_NULL_CLOCK)
    fake_force_all();
  else
    fake_force(clock_of(s), ~0ULL, 0);
  release_above_threshold();
  RETURN(CUDA_SUCCESS);
}

CUresult cuEventCreate(event_t **pe, unsigned int flags) {
  ENTER("cuEventCreate");
  CREATE_IN_CONTEXT(events, pe, flags, 15);
}

CUresult cuEventRecord(event_t *e, stream_t *s) {
  ENTER("cuEventRecord");
  NEED_CURRENT();
  if (!event_ok(e) || !stream_ok(s)) RETURN(CUDA_ERROR_INVALID_HANDLE);
  e->recorded = 1;
  e->clock = clock_of(s);
  e->seq = enqueue(s);
  RETURN(CUDA_SUCCESS);
}

CUresult cuEventQuery(event_t *e) {
  ENTER("cuEventQuery");
  NEED_CURRENT();
  if (!event_ok(e)) RETURN(CUDA_ERROR_INVALID_HANDLE);
  RETURN(fake_clock_done(e->clock, e->seq) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY);
}

CUresult cuEventSynchronize(event_t *e) {
  ENTER("cuEventSynchronize");
  NEED_CURRENT();
  if (!event_ok(e)) RETURN(CUDA_ERROR_INVALID_HANDLE);
  /* Waiting for an event waits for the work before it on its stream. */
  fake_cpu_wait();
  fake_force(e->clock, e->seq, 0);
  release_above_threshold();
  RETURN(CUDA_SUCCESS);
}

CUresult cuEventDestroy_v2(event_t *e) {
  ENTER("cuEventDestroy_v2");
  NEED_CURRENT();
  for (event_t **p = &events; *p; p = &(*p)->next) {
    if (*p != e) continue;
    *p = e->next;
    free(e);
    RETURN(CUDA_SUCCESS);
  }
  RETURN(CUDA_ERROR_INVALID_HANDLE);
}

/* ---- What cudarc calls besides (so its interop with portalloc runs here too) ---- */

CUresult cuCtxGetDevice(CUdevice *device) {
  ENTER("cuCtxGetDevice");
  NEED_CTX(dev);
  if (!device) RETURN(CUDA_ERROR_INVALID_VALUE);
  *device = dev;
  RETURN(CUDA_SUCCESS);
}

CUresult cuCtxSynchronize(void) {
  ENTER("cuCtxSynchronize");
  NEED_CURRENT();
  fake_cpu_wait();
  fake_force_all();
  release_above_threshold();
  RETURN(CUDA_SUCCESS);
}

CUresult cuStreamWaitEvent(stream_t *s, event_t *e, unsigned int flags) {
  ENTER("cuStreamWaitEvent");
  NEED_CURRENT();
  if (!stream_ok(s) || !event_ok(e)) RETURN(CUDA_ERROR_INVALID_HANDLE);
  if (flags > 1) RETURN(CUDA_ERROR_INVALID_VALUE);
  /* Work queued on `s` from now on waits for the event's last record. */
  if (e->recorded) fake_wait_for(clock_of(s), e->clock, e->seq);
  RETURN(CUDA_SUCCESS);
}

CUresult cuStreamQuery(stream_t *s) {
  ENTER("cuStreamQuery");
  NEED_CURRENT();
  if (!stream_ok(s)) RETURN(CUDA_ERROR_INVALID_HANDLE);
  struct fake_clock *c = &fake_clocks[clock_of(s)];
  RETURN(c->completed == c->recorded ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY);
}

/* True when [ptr, ptr + bytes) lies inside one live plain or pool allocation, or is covered by
 * mappings (adjacent ones too) that grant `device` access (cuMemSetAccess): what the driver
 * can copy from and to. */
static int device_range_ok(unsigned long long ptr, unsigned long long bytes, int device) {
  unsigned long long end = ptr + bytes;
  if (end < ptr) return 0;
  for (alloc_t *a = allocs; a; a = a->next)
    if (ptr >= a->ptr && end <= a->ptr + a->size) return 1;
  for (pool_t *p = pools; p; p = p->next)
    for (block_t *b = p->blocks; b; b = b->next)
      if (b->in_use && ptr >= b->ptr && end <= b->ptr + b->size) return 1;
  unsigned long long at = ptr;
  while (at < end) {
    mapping_t *hit = NULL;
    for (mapping_t *m = mappings; m; m = m->next)
      if (m->va <= at && at < m->va + m->size) hit = m;
    if (!hit || !((hit->access >> device) & 1)) return 0;
    at = hit->va + hit->size;
  }
  return 1;
}

/* A copy of `bytes` between device memory `device_ptr` and host memory `host`, `to_host` or
 * the other way, on `s`: checked, the bytes moved at once (the fake's device memory is real),
 * and queued on the stream's clock, where it completes in order (fake_common.h). */
static CUresult copy(unsigned long long device_ptr, void *host, int to_host, size_t bytes,
                     stream_t *s) {
  NEED_CTX(dev);
  if (!stream_ok(s)) RETURN(CUDA_ERROR_INVALID_HANDLE);
  if (bytes == 0) RETURN(CUDA_SUCCESS);
  if (!host || !device_range_ok(device_ptr, bytes, dev)) RETURN(CUDA_ERROR_INVALID_VALUE);
  if (to_host)
    memcpy(host, (const void *)(uintptr_t)device_ptr, bytes);
  else
    memcpy((void *)(uintptr_t)device_ptr, host, bytes);
  fake_copy_queue(clock_of(s), device_ptr, (unsigned long long)(uintptr_t)host, bytes);
  RETURN(CUDA_SUCCESS);
}

CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t bytes, stream_t *s) {
  ENTER("cuMemcpyHtoDAsync_v2");
  return copy(dst, (void *)src, 0, bytes, s);
}

CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t bytes, stream_t *s) {
  ENTER("cuMemcpyDtoHAsync_v2");
  return copy(src, dst, 1, bytes, s);
}

/* The synchronous copies (cudarc's): on the legacy default stream, and waited for. */
static CUresult copy_sync(unsigned long long device_ptr, void *host, int to_host, size_t bytes) {
  CUresult r = copy(device_ptr, host, to_host, bytes, NULL);
  if (r == CUDA_SUCCESS) LOCKED(fake_force_all());
  return r;
}

CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t bytes) {
  ENTER("cuMemcpyHtoD_v2");
  return copy_sync(dst, (void *)src, 0, bytes);
}

CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t bytes) {
  ENTER("cuMemcpyDtoH_v2");
  return copy_sync(src, dst, 1, bytes);
}

/* ---- Pinned host memory (CUDA 2.2; in fakecuda_old too, not in fakecuda_nopinned) ---- */

#ifndef FAKECUDA_NO_PINNED_HOST

/* CU_MEMHOSTALLOC_PORTABLE | DEVICEMAP | WRITECOMBINED. */
#define HOST_ALLOC_FLAGS 0x7u

CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int flags) {
  ENTER("cuMemHostAlloc");
  NEED_CURRENT();
  if (!pp || bytesize == 0 || (flags & ~HOST_ALLOC_FLAGS)) RETURN(CUDA_ERROR_INVALID_VALUE);
  host_alloc_t *h = calloc(1, sizeof *h);
  void *p = h ? malloc(bytesize) : NULL;
  if (!p) {
    free(h);
    RETURN(CUDA_ERROR_OUT_OF_MEMORY);
  }
  h->ptr = p;
  h->size = bytesize;
  PUSH(host_allocs, h);
  *pp = p;
  RETURN(CUDA_SUCCESS);
}

CUresult cuMemFreeHost(void *p) {
  ENTER("cuMemFreeHost");
  NEED_CURRENT();
  for (host_alloc_t **ph = &host_allocs; *ph; ph = &(*ph)->next) {
    host_alloc_t *h = *ph;
    if (h->ptr != p) continue;
    *ph = h->next;
    fake_check_unused((unsigned long long)(uintptr_t)h->ptr, h->size, "cuMemFreeHost");
    free(h->ptr);
    free(h);
    RETURN(CUDA_SUCCESS);
  }
  RETURN(CUDA_ERROR_INVALID_VALUE);
}
#endif /* FAKECUDA_NO_PINNED_HOST */

#ifdef FAKECUDA_OLD
static void release_above_threshold(void) {}
#else
static pool_t *default_pools[MAX_DEVICES];
static unsigned long long next_handle = 1;

/* ---- Virtual memory (CUDA 10.2) ---- */

static int location_ok(const CUmemLocation *l) {
  return l->type == 1 /* CU_MEM_LOCATION_TYPE_DEVICE */ && l->id >= 0 && l->id < n_devices;
}

CUresult cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *prop, unsigned int option) {
  ENTER("cuMemGetAllocationGranularity");
  NEED_INIT();
  if (!g || !prop || option > 1 || prop->type != 1 || !location_ok(&prop->location))
    RETURN(CUDA_ERROR_INVALID_VALUE);
  *g = granularity;
  RETURN(CUDA_SUCCESS);
}

CUresult cuMemCreate(CUmemGenericAllocationHandle *out, size_t size, const CUmemAllocationProp *prop,
                     unsigned long long flags) {
  ENTER("cuMemCreate");
  NEED_CURRENT();
  if (!out || !prop || flags || size == 0 || size % granularity || prop->type != 1 ||
      !location_ok(&prop->location))
    RETURN(CUDA_ERROR_INVALID_VALUE);
  int d = prop->location.id;
  if (!charge(d, size)) RETURN(CUDA_ERROR_OUT_OF_MEMORY);
  int fd = memfd_create("fakecuda", MFD_CLOEXEC);
  if (fd < 0 || ftruncate(fd, (off_t)size) != 0) {
    if (fd >= 0) close(fd);
    used[d] -= size;
    RETURN(CUDA_ERROR_OUT_OF_MEMORY);
  }
  handle_t *h = calloc(1, sizeof *h);
  if (!h) {
    close(fd);
    used[d] -= size;
    RETURN(CUDA_ERROR_OUT_OF_MEMORY);
  }
  h->id = next_handle++;
  h->size = size;
  h->device = d;
  h->fd = fd;
  PUSH(handles, h);
  *out = h->id;
  RETURN(CUDA_SUCCESS);
}

static void drop_handle(handle_t *h) {
  for (handle_t **p = &handles; *p; p = &(*p)->next) {
    if (*p != h) continue;
    *p = h->next;
    close(h->fd);
    used[h->device] -= h->size;
    free(h);
    return;
  }
}

CUresult cuMemRelease(CUmemGenericAllocationHandle id) {
  ENTER("cuMemRelease");
  NEED_CURRENT();
  for (handle_t *h = handles; h; h = h->next) {
    if (h->id != id || h->released) continue;
    h->released = 1;
    if (h->mappings == 0) drop_handle(h);
    RETURN(CUDA_SUCCESS);
  }
  RETURN(CUDA_ERROR_INVALID_VALUE);
}

#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif

/* Freed reservations' address ranges, kept mapped PROT_NONE by the fake (most recent first)
 * so that nothing else in the process takes them between a free and a reserve at the same
 * address (vLLM and torch_memory_saver cycle reservations so), while a reserve without a
 * hint cannot get them (mmap(NULL) hands out no mapped page). Bounded, oldest given back to
 * the system first, and all of them when the library is unloaded: a test process loads many
 * private copies. */
#define MAX_FREED_RANGES 64
#define MAX_FREED_BYTES (4ULL << 40)
typedef struct freed_range {
  struct freed_range *next;
  unsigned long long va, size;
} freed_range_t;
static freed_range_t *freed_ranges;

/* Keeps [va, va + size) (PROT_NONE, nothing behind it) as a freed range, and gives back the
 * oldest past the bounds. */
static void keep_freed(unsigned long long va, unsigned long long size) {
  freed_range_t *f = calloc(1, sizeof *f);
  if (!f || mmap((void *)(uintptr_t)va, size, PROT_NONE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0) == MAP_FAILED) {
    free(f);
    munmap((void *)(uintptr_t)va, size);
    return;
  }
  f->va = va;
  f->size = size;
  PUSH(freed_ranges, f);
  int n = 0;
  unsigned long long bytes = 0;
  for (freed_range_t **p = &freed_ranges; *p;) {
    freed_range_t *x = *p;
    n++;
    bytes += x->size;
    if (n > MAX_FREED_RANGES || bytes > MAX_FREED_BYTES) {
      *p = x->next;
      munmap((void *)(uintptr_t)x->va, x->size);
      free(x);
    } else {
      p = &x->next;
    }
  }
}

/* True when freed ranges cover [va, va + size) wholly. */
static int freed_covers(unsigned long long va, unsigned long long size) {
  unsigned long long at = va;
  while (at < va + size) {
    freed_range_t *hit = NULL;
    for (freed_range_t *f = freed_ranges; f; f = f->next)
      if (f->va <= at && at < f->va + f->size) hit = f;
    if (!hit) return 0;
    at = hit->va + hit->size;
  }
  return 1;
}

/* Takes [va, va + size) out of the freed ranges (the pieces either side stay kept); 0 when
 * there is no memory for the split. */
static int take_freed(unsigned long long va, unsigned long long size) {
  freed_range_t *spare = calloc(1, sizeof *spare); /* at most one range splits in two */
  if (!spare) return 0;
  unsigned long long end = va + size;
  for (freed_range_t **p = &freed_ranges; *p;) {
    freed_range_t *f = *p;
    unsigned long long f_end = f->va + f->size;
    if (f->va >= end || va >= f_end) {
      p = &f->next;
    } else if (f->va < va && f_end > end) {
      spare->va = end;
      spare->size = f_end - end;
      spare->next = f->next;
      f->size = va - f->va;
      f->next = spare;
      spare = NULL;
      break;
    } else if (f->va < va) {
      f->size = va - f->va;
      p = &f->next;
    } else if (f_end > end) {
      f->size = f_end - end;
      f->va = end;
      p = &f->next;
    } else {
      *p = f->next;
      free(f);
    }
  }
  free(spare);
  return 1;
}

__attribute__((destructor)) static void give_back_freed_ranges(void) {
  while (freed_ranges) {
    freed_range_t *f = freed_ranges;
    freed_ranges = f->next;
    munmap((void *)(uintptr_t)f->va, f->size);
    free(f);
  }
}

static int overlaps_reservation(unsigned long long va, unsigned long long size) {
  for (reservation_t *r = reservations; r; r = r->next)
    if (r->va < va + size && va < r->va + r->size) return 1;
  return 0;
}

/* The hint `want` as the reservation's address, when it can be: non-zero, aligned to `align`,
 * overlapping no live reservation, and either a freed range's or free in the process. 0
 * when it cannot. */
static unsigned long long reserve_at(unsigned long long want, unsigned long long size,
                                     unsigned long long align) {
  if (!want || want % align || want + size < want || overlaps_reservation(want, size)) return 0;
  if (freed_covers(want, size)) return take_freed(want, size) ? want : 0;
  void *p = mmap((void *)(uintptr_t)want, size, PROT_NONE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
  if (p == MAP_FAILED) return 0;
  if ((unsigned long long)(uintptr_t)p != want) { /* a kernel before 4.17 took it as a hint */
    munmap(p, size);
    return 0;
  }
  return want;
}

/* `addr` is a hint, as the driver documents it: honoured when it can be (reserve_at), else
 * the reservation goes where the system puts it. */
CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                             unsigned long long flags) {
  ENTER("cuMemAddressReserve");
  NEED_CURRENT();
  if (!ptr || size == 0 || size % granularity || flags || (alignment & (alignment - 1)))
    RETURN(CUDA_ERROR_INVALID_VALUE);
  unsigned long long align = alignment > granularity ? alignment : granularity;
  unsigned long long start = reserve_at(addr, size, align);
  if (!start) {
    unsigned long long span = size + align;
    void *p = mmap(NULL, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) RETURN(CUDA_ERROR_OUT_OF_MEMORY);
    unsigned long long base = (unsigned long long)(uintptr_t)p;
    start = round_up(base, align);
    if (start > base) munmap(p, start - base);
    if (base + span > start + size)
      munmap((void *)(uintptr_t)(start + size), base + span - start - size);
  }
  reservation_t *r = calloc(1, sizeof *r);
  if (!r) {
    munmap((void *)(uintptr_t)start, size);
    RETURN(CUDA_ERROR_OUT_OF_MEMORY);
  }
  r->va = start;
  r->size = size;
  PUSH(reservations, r);
  *ptr = start;
  RETURN(CUDA_SUCCESS);
}

static int overlaps_mapping(unsigned long long va, unsigned long long size) {
  for (mapping_t *m = mappings; m; m = m->next)
    if (m->va < va + size && va < m->va + m->size) return 1;
  return 0;
}

CUresult cuMemAddressFree(CUdeviceptr va, size_t size) {
  ENTER("cuMemAddressFree");
  NEED_CURRENT();
  for (reservation_t **p = &reservations; *p; p = &(*p)->next) {
    reservation_t *r = *p;
    if (r->va != va) continue;
    if (r->size != size || overlaps_mapping(va, size)) RETURN(CUDA_ERROR_INVALID_VALUE);
    *p = r->next;
    keep_freed(va, size);
    free(r);
    RETURN(CUDA_SUCCESS);
  }
  RETURN(CUDA_ERROR_INVALID_VALUE);
}

CUresult cuMemMap(CUdeviceptr va, size_t size, size_t offset, CUmemGenericAllocationHandle id,
                  unsigned long long flags) {
  ENTER("cuMemMap");
  NEED_CURRENT();
  if (flags || size == 0 || va % granularity || size % granularity || offset % granularity)
    RETURN(CUDA_ERROR_INVALID_VALUE);
  handle_t *h = NULL;
  for (handle_t *t = handles; t; t = t->next)
    if (t->id == id && !t->released) h = t;
  if (!h || offset + size > h->size) RETURN(CUDA_ERROR_INVALID_VALUE);
  int inside = 0;
  for (reservation_t *r = reservations; r; r = r->next)
    if (va >= r->va && va + size <= r->va + r->size) inside = 1;
  if (!inside || overlaps_mapping(va, size)) RETURN(CUDA_ERROR_INVALID_VALUE);
  mapping_t *m = calloc(1, sizeof *m);
  if (!m) RETURN(CUDA_ERROR_OUT_OF_MEMORY);
  void *p = mmap((void *)(uintptr_t)va, size, PROT_NONE, MAP_SHARED | MAP_FIXED, h->fd, (off_t)offset);
  if (p == MAP_FAILED) {
    free(m);
    RETURN(CUDA_ERROR_OUT_OF_MEMORY);
  }
  m->va = va;
  m->size = size;
  m->handle = h;
  h->mappings++;
  PUSH(mappings, m);
  RETURN(CUDA_SUCCESS);
}

/* True when [va, va + size) is entirely covered by mappings. */
static int fully_mapped(unsigned long long va, unsigned long long size) {
  unsigned long long at = va;
  while (at < va + size) {
    mapping_t *hit = NULL;
    for (mapping_t *m = mappings; m; m = m->next)
      if (m->va <= at && at < m->va + m->size) hit = m;
    if (!hit) return 0;
    at = hit->va + hit->size;
  }
  return 1;
}

/* One descriptor per device; a device other than the memory's owner must be linked to it by
 * peer access (fake_common.h). The host protection is the widest any descriptor grants. */
CUresult cuMemSetAccess(CUdeviceptr va, size_t size, const CUmemAccessDesc *desc, size_t count) {
  ENTER("cuMemSetAccess");
  NEED_CURRENT();
  const struct fake_access_desc *d = (const struct fake_access_desc *)desc;
  if (!desc || count == 0 || size == 0 || va % granularity || size % granularity)
    RETURN(CUDA_ERROR_INVALID_VALUE);
  if (!fully_mapped(va, size)) RETURN(CUDA_ERROR_INVALID_VALUE);
  for (mapping_t *m = mappings; m; m = m->next) {
    if (m->va >= va + size || va >= m->va + m->size) continue;
    CUresult refused = fake_check_access(d, count, m->handle->device, n_devices);
    if (refused != CUDA_SUCCESS) RETURN(refused);
  }
  unsigned widest = 0;
  for (size_t i = 0; i < count; i++) widest |= d[i].flags;
  int prot = widest == 3 ? PROT_READ | PROT_WRITE : widest == 1 ? PROT_READ : PROT_NONE;
  if (mprotect((void *)(uintptr_t)va, size, prot) != 0) RETURN(CUDA_ERROR_UNKNOWN);
  for (mapping_t *m = mappings; m; m = m->next)
    if (m->va < va + size && va < m->va + m->size) m->access = fake_apply_access(m->access, d, count);
  RETURN(CUDA_SUCCESS);
}

CUresult cuMemUnmap(CUdeviceptr va, size_t size) {
  ENTER("cuMemUnmap");
  NEED_CURRENT();
  if (size == 0 || va % granularity || size % granularity) RETURN(CUDA_ERROR_INVALID_VALUE);
  /* Every mapping touched must lie wholly inside the range, and the range be fully mapped. */
  for (mapping_t *m = mappings; m; m = m->next)
    if (m->va < va + size && va < m->va + m->size && (m->va < va || m->va + m->size > va + size))
      RETURN(CUDA_ERROR_INVALID_VALUE);
  if (!fully_mapped(va, size)) RETURN(CUDA_ERROR_INVALID_VALUE);
  fake_check_unused(va, size, "cuMemUnmap");
  if (mmap((void *)(uintptr_t)va, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED,
           -1, 0) == MAP_FAILED)
    RETURN(CUDA_ERROR_UNKNOWN);
  for (mapping_t **p = &mappings; *p;) {
    mapping_t *m = *p;
    if (m->va >= va && m->va + m->size <= va + size) {
      *p = m->next;
      handle_t *h = m->handle;
      h->mappings--;
      if (h->released && h->mappings == 0) drop_handle(h);
      free(m);
    } else {
      p = &m->next;
    }
  }
  RETURN(CUDA_SUCCESS);
}

/* ---- Memory pools (CUDA 11.2) ---- */

static int pool_ok(pool_t *p) {
  for (pool_t *t = pools; t; t = t->next)
    if (t == p) return !p->destroyed;
  return 0;
}

static void unlink_pool(pool_t *p) {
  for (pool_t **pp = &pools; *pp; pp = &(*pp)->next) {
    if (*pp != p) continue;
    *pp = p->next;
    free(p);
    return;
  }
}

static void pool_release_free(pool_t *p, unsigned long long keep) {
  for (block_t **pb = &p->blocks; *pb && p->stats.reserved > keep;) {
    block_t *b = *pb;
    /* A block whose free is still in flight on its stream is not free for the driver yet. */
    if (b->in_use || !fake_clock_done(b->free_clock, b->free_seq)) {
      pb = &b->next;
      continue;
    }
    *pb = b->next;
    fake_check_unused(b->ptr, b->size, "a pool giving back a block");
    munmap((void *)(uintptr_t)b->ptr, b->size);
    p->stats.reserved -= b->size;
    used[p->device] -= b->size;
    free(b);
  }
}

/* At a synchronisation: pools give back what is above their threshold, and a destroyed pool
 * everything whose free completed (it goes when it holds nothing). */
static void release_above_threshold(void) {
  for (pool_t *p = pools, *next; p; p = next) {
    next = p->next;
    if (p->destroyed) {
      pool_release_free(p, 0);
      if (!p->blocks) unlink_pool(p);
    } else if (p->stats.reserved > p->stats.threshold) {
      pool_release_free(p, p->stats.threshold);
    }
  }
}

static pool_t *new_pool(int device, int is_default) {
  pool_t *p = calloc(1, sizeof *p);
  if (!p) return NULL;
  p->device = device;
  p->is_default = is_default;
  fake_pool_init(&p->stats, 0);
  PUSH(pools, p);
  return p;
}

CUresult cuDeviceGetDefaultMemPool(pool_t **out, CUdevice dev) {
  ENTER("cuDeviceGetDefaultMemPool");
  NEED_INIT();
  NEED_DEVICE(dev);
  if (!out) RETURN(CUDA_ERROR_INVALID_VALUE);
  if (!attributes[dev][115]) RETURN(CUDA_ERROR_NOT_SUPPORTED);
  if (!default_pools[dev]) default_pools[dev] = new_pool(dev, 1);
  if (!default_pools[dev]) RETURN(CUDA_ERROR_OUT_OF_MEMORY);
  *out = default_pools[dev];
  RETURN(CUDA_SUCCESS);
}

CUresult cuMemPoolCreate(pool_t **out, const CUmemPoolProps *props) {
  ENTER("cuMemPoolCreate");
  NEED_INIT();
  if (!out || !props || props->allocType != 1 || props->handleTypes != 0 ||
      !location_ok(&props->location) || props->win32SecurityAttributes)
    RETURN(CUDA_ERROR_INVALID_VALUE);
  for (size_t i = 0; i < sizeof props->reserved; i++)
    if (props->reserved[i]) RETURN(CUDA_ERROR_INVALID_VALUE);
  if (!attributes[props->location.id][115]) RETURN(CUDA_ERROR_NOT_SUPPORTED);
  pool_t *p = new_pool(props->location.id, 0);
  if (!p) RETURN(CUDA_ERROR_OUT_OF_MEMORY);
  *out = p;
  RETURN(CUDA_SUCCESS);
}

CUresult cuMemPoolDestroy(pool_t *p) {
  ENTER("cuMemPoolDestroy");
  NEED_INIT();
  if (!pool_ok(p) || p->is_default) RETURN(CUDA_ERROR_INVALID_VALUE);
  /* As the driver: returns at once; with allocations still outstanding the pool's memory
   * goes when the last of them is freed. */
  pool_release_free(p, 0);
  p->destroyed = 1;
  if (!p->blocks) unlink_pool(p);
  RETURN(CUDA_SUCCESS);
}

CUresult cuMemPoolSetAttribute(pool_t *p, unsigned int attr, void *value) {
  ENTER("cuMemPoolSetAttribute");
  NEED_INIT();
  if (!pool_ok(p) || !value) RETURN(CUDA_ERROR_INVALID_VALUE);
  RETURN(fake_pool_set(&p->stats, (int)attr, value) ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS);
}

CUresult cuMemPoolGetAttribute(pool_t *p, unsigned int attr, void *value) {
  ENTER("cuMemPoolGetAttribute");
  NEED_INIT();
  if (!pool_ok(p) || !value) RETURN(CUDA_ERROR_INVALID_VALUE);
  RETURN(fake_pool_get(&p->stats, (int)attr, value) ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS);
}

CUresult cuMemPoolTrimTo(pool_t *p, size_t keep) {
  ENTER("cuMemPoolTrimTo");
  NEED_INIT();
  if (!pool_ok(p)) RETURN(CUDA_ERROR_INVALID_VALUE);
  pool_release_free(p, keep);
  RETURN(CUDA_SUCCESS);
}

CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t size, pool_t *p, stream_t *s) {
  ENTER("cuMemAllocFromPoolAsync");
  NEED_CURRENT();
  if (!dptr || size == 0 || !pool_ok(p)) RETURN(CUDA_ERROR_INVALID_VALUE);
  if (!stream_ok(s)) RETURN(CUDA_ERROR_INVALID_HANDLE);
  unsigned long long bytes = round_up(size, 512);
  /* Reuse the smallest cached block that fits and is safe for `s`: freed on `s` itself (stream
   * order; never on the per-thread handle, another stream on each thread), or freed on a
   * stream whose work up to the free has completed — as the driver's pools do. */
  block_t *best = NULL;
  unsigned long long grown = 0;
  for (block_t *b = p->blocks; b; b = b->next) {
    int safe = fake_clock_done(b->free_clock, b->free_seq) ||
               (b->free_clock == clock_of(s) && s != STREAM_PER_THREAD);
    if (!b->in_use && safe && b->size >= bytes && (!best || b->size < best->size)) best = b;
  }
  if (!best) {
    if (!charge(p->device, bytes)) {
      /* Like the driver: give back cached memory and try once more. */
      pool_release_free(p, 0);
      if (!charge(p->device, bytes)) RETURN(CUDA_ERROR_OUT_OF_MEMORY);
    }
    void *mem = map_anonymous(bytes);
    best = mem ? calloc(1, sizeof *best) : NULL;
    if (!best) {
      if (mem) munmap(mem, bytes);
      used[p->device] -= bytes;
      RETURN(CUDA_ERROR_OUT_OF_MEMORY);
    }
    best->ptr = (unsigned long long)(uintptr_t)mem;
    best->size = bytes;
    PUSH(p->blocks, best);
    grown = bytes;
  }
  best->in_use = 1;
  fake_pool_grow(&p->stats, grown, best->size);
  *dptr = best->ptr;
  RETURN(CUDA_SUCCESS);
}

CUresult cuMemFreeAsync(CUdeviceptr ptr, stream_t *s) {
  ENTER("cuMemFreeAsync");
  NEED_CURRENT();
  if (!stream_ok(s)) RETURN(CUDA_ERROR_INVALID_HANDLE);
  for (pool_t *p = pools; p; p = p->next) {
    for (block_t *b = p->blocks; b; b = b->next) {
      if (b->ptr != ptr || !b->in_use) continue;
      b->in_use = 0;
      b->free_clock = clock_of(s);
      b->free_seq = enqueue(s);
      p->stats.used -= b->size;
      if (p->destroyed) {
        pool_release_free(p, 0);
        if (!p->blocks) unlink_pool(p);
      }
      RETURN(CUDA_SUCCESS);
    }
  }
  RETURN(CUDA_ERROR_INVALID_VALUE);
}
#endif /* FAKECUDA_OLD */
