/*
 * fakecuda: a conformance driver with the CUDA driver API's common surface (libcuda.so.1's
 * names, signatures, codes and documented rules), over host memory. The behaviour lives in
 * the core (fake_core.h and its concerns); this file is CUDA's face: names, argument rules,
 * codes, the device it impersonates and the symbol table cuGetProcAddress answers from.
 *
 * CUDA's rules it keeps (docs/fakes.md lists every call and what is modelled):
 *   - nothing but cuDriverGetVersion / cuGetErrorName / cuGetErrorString works before cuInit
 *     (CUDA_ERROR_NOT_INITIALIZED); cuInit with no devices is CUDA_ERROR_NO_DEVICE;
 *   - memory, stream, event, module and pool calls act on the calling thread's current
 *     context (a stack: cuCtxPushCurrent / cuCtxPopCurrent / cuCtxSetCurrent) and fail with
 *     CUDA_ERROR_INVALID_CONTEXT when there is none, it was destroyed, or it is a primary
 *     context no longer retained;
 *   - each device has a capacity (the impersonated device's memory unless configured);
 *     allocations, physical handles and pool memory are charged against it;
 *   - streams, events, copies, memsets and launches follow the stream rules of
 *     fake_timeline.h (the legacy default stream, CU_STREAM_NON_BLOCKING, the per-thread
 *     default stream and the _ptsz / _ptds calls) and the copy rules of fake_memory.h ("API
 *     synchronization behavior"); cuMemFree_v2 and cuMemFreeHost synchronise the device
 *     first (a CPU wait) — "Managing memory allocations using cudaMalloc and cudaFree causes
 *     the GPU to synchronize across all executing CUDA streams" (Programming Guide,
 *     stream-ordered allocator) — except cuMemFree of stream-ordered memory, which "will not
 *     perform any implicit synchronization";
 *   - virtual memory (fake_vmm.h) and stream-ordered pools (fake_pools.h) as documented;
 *   - memory shared between processes (fake_ipc.h): handles created with
 *     CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR are exported as descriptors and imported from
 *     them (cuMemExportToShareableHandle, cuMemImportFromShareableHandle); CU_MEM_HANDLE_TYPE_
 *     FABRIC is refused as by a driver without fabric (IMEX) support; plain allocations are
 *     shared by legacy IPC handles (cuIpcGetMemHandle, cuIpcOpenMemHandle, cuIpcCloseMemHandle).
 *
 * Configuration: variables read before the first call (FAKECUDA_DEVICES, default 1;
 * FAKECUDA_CAPACITY bytes, default the device's; FAKECUDA_GRANULARITY, default 2 MiB;
 * FAKECUDA_VERSION, default 12020 (10010 for fakecuda_old); FAKECUDA_DEVICE, default h100 (v100
 * for fakecuda_old)), or fakecuda_configure() before cuInit.
 *
 * Built four ways (fakes/build.rs): this file; fakecuda_old.c (FAKECUDA_OLD: a CUDA 10.1
 * driver, without the virtual memory, pool and later calls), fakecuda_nopeer.c
 * (FAKECUDA_NO_PEER: two devices that cannot access each other's memory) and
 * fakecuda_nopinned.c (FAKECUDA_NO_PINNED_HOST: page-locking refused).
 */
#define _GNU_SOURCE
#include "fake_core.h"
#include "fake_timeline.h"
#include "fake_memory.h"
#include "fake_vmm.h"
#include "fake_ipc.h"
#include "fake_pools.h"
#include "fake_modules.h"
#include "fake_graphs.h"

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef struct fk_ctx *CUcontext;
typedef void *CUstream;
typedef void *CUevent;
typedef void *CUmodule;
typedef void *CUfunction;
typedef void *CUmemoryPool;
typedef void (*CUhostFn)(void *);
typedef void (*CUstreamCallback)(CUstream, CUresult, void *);

#define CUDA_SUCCESS 0
#define CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED 712
#define CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED 713

/* ---- The header's structs, as cuda.h lays them out ---- */

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
  unsigned int allocType;
  unsigned int handleTypes;
  CUmemLocation location;
  void *win32SecurityAttributes;
  size_t maxSize;
  unsigned char reserved[56];
} CUmemPoolProps;

_Static_assert(sizeof(CUmemAllocationProp) == 32, "CUmemAllocationProp is 32 bytes");
_Static_assert(sizeof(CUmemPoolProps) == 88, "CUmemPoolProps is 88 bytes");

/* ---- The device it impersonates ------------------------------------------------------
 * Values from the vendor's deviceQuery / cudaGetDeviceProperties output (docs/fakes.md
 * gives each source): the H100 SXM5 80GB under a CUDA 12.2 driver (caps-tum/mt4g's
 * "NVIDIA H100 80GB HBM3" dump, driver 12020; thamada/nvidia-smi's 8x H100 deviceQuery),
 * and the Tesla V100-SXM2-16GB under a CUDA 10.x driver (ULHPC/ulhpc-docs' deviceQuery). */

#define ATTRS 256
struct cu_model {
  const char *key, *name;
  unsigned long long total;
  int greatest_priority;
  int attrs[48][2];
};
static const struct cu_model cu_models[] = {
    {"h100", "NVIDIA H100 80GB HBM3", 85176483840ULL, -5,
     {{1, 1024}, {2, 1024}, {3, 1024}, {4, 64}, {5, 2147483647}, {6, 65535}, {7, 65535},
      {8, 49152}, {9, 65536}, {10, 32}, {11, 2147483647}, {12, 65536}, {13, 1980000},
      {14, 512}, {15, 1}, {16, 132}, {17, 0}, {18, 0}, {19, 1}, {20, 0}, {31, 1}, {32, 1},
      {33, 24}, {34, 0}, {36, 2619000}, {37, 5120}, {38, 52428800}, {39, 2048}, {40, 3},
      {41, 1}, {50, 0}, {75, 9}, {76, 0}, {78, 1}, {81, 233472}, {82, 65536}, {83, 1},
      {89, 1}, {95, 1}, {97, 232448}, {102, 1}, {103, 1}, {106, 32}, {108, 39321600},
      {111, 1024}, {115, 1}, {119, 1}, {0, 0}}},
    {"v100", "Tesla V100-SXM2-16GB", 16945512448ULL, -1,
     {{1, 1024}, {2, 1024}, {3, 1024}, {4, 64}, {5, 2147483647}, {6, 65535}, {7, 65535},
      {8, 49152}, {9, 65536}, {10, 32}, {11, 2147483647}, {12, 65536}, {13, 1530000},
      {14, 512}, {15, 1}, {16, 80}, {17, 0}, {18, 0}, {19, 1}, {20, 0}, {31, 1}, {32, 1},
      {33, 24}, {34, 0}, {36, 877000}, {37, 4096}, {38, 6291456}, {39, 2048}, {40, 5},
      {41, 1}, {50, 0}, {75, 7}, {76, 0}, {78, 1}, {81, 98304}, {82, 65536}, {83, 1},
      {89, 1}, {95, 1}, {97, 98304}, {106, 32}, {0, 0}}},
};

static int cu_version = 12020;
static const struct cu_model *cu_model;
static int cu_configured_capacity;
static int cu_attributes[FK_MAX_DEVICES][ATTRS];

static unsigned long long env_u64(const char *name, unsigned long long fallback) {
  const char *v = getenv(name);
  if (!v || !*v) return fallback;
  char *end = NULL;
  unsigned long long x = strtoull(v, &end, 0);
  return (end && *end == 0) ? x : fallback;
}

static void cu_apply_model(void) {
  for (int d = 0; d < FK_MAX_DEVICES; d++) {
    memset(cu_attributes[d], 0, sizeof cu_attributes[d]);
    for (int i = 0; cu_model->attrs[i][0]; i++) cu_attributes[d][cu_model->attrs[i][0]] = cu_model->attrs[i][1];
    cu_attributes[d][33] = 24 + 16 * d; /* each device on a bus of its own */
#ifdef FAKECUDA_OLD
    cu_attributes[d][102] = 0;
    cu_attributes[d][115] = 0;
#endif
    if (!cu_configured_capacity) fk_devices[d].capacity = cu_model->total;
  }
}

/* A context's state as made: CUlimit defaults (CU_LIMIT_STACK_SIZE 1024 bytes, PRINTF_FIFO_SIZE
 * 1 MiB, MALLOC_HEAP_SIZE 8 MiB, DEV_RUNTIME_SYNC_DEPTH 2 and DEV_RUNTIME_PENDING_LAUNCH_COUNT
 * 2048 as the Programming Guide and cuda.h give them; the two L2 hints 0: none given), no cache
 * or shared-memory preference, a new id. */
static void cu_ctx_defaults(int c) {
  static const unsigned long long limits[FK_MAX_LIMITS] = {1024, 1 << 20, 8 << 20, 2, 2048, 0, 0};
  memcpy(fk_ctxs[c].limits, limits, sizeof limits);
  fk_ctxs[c].cache_config = 0;
  fk_ctxs[c].shared_config = 0;
  fk_ctxs[c].id = fk_next_ctx_id++;
}

static void fk_face_defaults(void) {
  fk_n_devices = (int)env_u64("FAKECUDA_DEVICES", 1);
#ifdef FAKECUDA_NO_PEER
  if (!getenv("FAKECUDA_DEVICES")) fk_n_devices = 2;
#endif
  if (fk_n_devices > FK_MAX_DEVICES) fk_n_devices = FK_MAX_DEVICES;
  const char *capacity = getenv("FAKECUDA_CAPACITY");
  cu_configured_capacity = capacity && *capacity;
  for (int d = 0; d < FK_MAX_DEVICES; d++) fk_devices[d].capacity = env_u64("FAKECUDA_CAPACITY", 1ULL << 30);
  fk_min_gran = fk_rec_gran = env_u64("FAKECUDA_GRANULARITY", 2ULL << 20);
#ifdef FAKECUDA_OLD
  cu_version = (int)env_u64("FAKECUDA_VERSION", 10010);
  const char *model = getenv("FAKECUDA_DEVICE") ? getenv("FAKECUDA_DEVICE") : "v100";
#else
  cu_version = (int)env_u64("FAKECUDA_VERSION", 12020);
  const char *model = getenv("FAKECUDA_DEVICE") ? getenv("FAKECUDA_DEVICE") : "h100";
#endif
  cu_model = &cu_models[0];
  for (size_t i = 0; i < sizeof cu_models / sizeof cu_models[0]; i++)
    if (!strcmp(cu_models[i].key, model)) cu_model = &cu_models[i];
  cu_apply_model();
  for (int d = 0; d < FK_MAX_DEVICES; d++) cu_ctx_defaults(d);
#ifdef FAKECUDA_NO_PEER
  for (int a = 0; a < FK_MAX_DEVICES; a++)
    for (int b = 0; b < FK_MAX_DEVICES; b++) fk_peer_denied[a][b] = 1;
#endif
}

static void fk_face_returned(int code) { (void)code; }

static const struct fake_error cu_errors[] = {
    {0, "CUDA_SUCCESS", "no error"},
    {1, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {2, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {3, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {4, "CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
    {100, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {101, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {200, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"},
    {209, "CUDA_ERROR_NO_BINARY_FOR_GPU", "no kernel image is available for execution on the device"},
    {201, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {215, "CUDA_ERROR_UNSUPPORTED_LIMIT", "limit is not supported on this architecture"},
    {217, "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED", "peer access is not supported between these two devices"},
    {218, "CUDA_ERROR_INVALID_PTX", "a PTX JIT compilation failed"},
    {301, "CUDA_ERROR_FILE_NOT_FOUND", "file not found"},
    {400, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {401, "CUDA_ERROR_ILLEGAL_STATE", "the operation cannot be performed in the present state"},
    {500, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {600, "CUDA_ERROR_NOT_READY", "device not ready"},
    {700, "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"},
    {701, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", "too many resources requested for launch"},
    {704, "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED", "peer access is already enabled"},
    {705, "CUDA_ERROR_PEER_ACCESS_NOT_ENABLED", "peer access has not been enabled"},
    {708, "CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE", "primary context active"},
    {709, "CUDA_ERROR_CONTEXT_IS_DESTROYED", "context is destroyed"},
    {712, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED", "part or all of the requested memory range is already mapped"},
    {713, "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED", "pointer does not correspond to a registered memory region"},
    {719, "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"},
    {720, "CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE", "too many blocks in cooperative launch"},
    {800, "CUDA_ERROR_NOT_PERMITTED", "operation not permitted"},
    {801, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {900, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED", "operation not permitted when stream is capturing"},
    {901, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED", "operation failed due to a previous error during capture"},
    {902, "CUDA_ERROR_STREAM_CAPTURE_MERGE", "operation would result in a merge of separate capture sequences"},
    {903, "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED", "capture was not ended in the same stream as it began"},
    {904, "CUDA_ERROR_STREAM_CAPTURE_UNJOINED", "capturing stream has unjoined work"},
    {905, "CUDA_ERROR_STREAM_CAPTURE_ISOLATION", "dependency created on uncaptured work in another stream"},
    {906, "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT", "operation would make the legacy stream depend on a capturing blocking stream"},
    {907, "CUDA_ERROR_CAPTURED_EVENT", "operation not permitted on an event last recorded in a capturing stream"},
    {908, "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD", "attempt to terminate a thread-local capture sequence from another thread"},
    {999, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

static int fk_face_code(const char *name) {
  static const struct {
    const char *name;
    int code;
  } codes[] = {
      {"success", 0},          {"invalid_value", 1},      {"out_of_memory", 2},
      {"not_initialized", 3},  {"deinitialized", 4},      {"no_device", 100},
      {"invalid_device", 101}, {"invalid_image", 200},    {"invalid_context", 201},
      {"peer_unsupported", 217}, {"invalid_handle", 400}, {"not_found", 500},
      {"not_ready", 600},      {"illegal_address", 700},  {"launch_out_of_resources", 701},
      {"peer_already_enabled", 704}, {"peer_not_enabled", 705}, {"launch_failed", 719},
      {"not_permitted", 800},  {"not_supported", 801},    {"unknown", 999},
      {"no_binary_for_gpu", 209}, {"unsupported_limit", 215}, {"invalid_ptx", 218},
      {"primary_context_active", 708}, {"cooperative_launch_too_large", 720},
  };
  for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++)
    if (!strcmp(codes[i].name, name)) return codes[i].code;
  return -1;
}

/* ---- Contexts -------------------------------------------------------------------------- */

static int cu_ctx_index(const void *p) {
  const struct fk_ctx *c = (const struct fk_ctx *)p;
  if (c < &fk_ctxs[0] || c >= &fk_ctxs[FK_MAX_CTX]) return -1;
  if (((const char *)c - (const char *)fk_ctxs) % sizeof fk_ctxs[0]) return -1;
  return (int)(c - fk_ctxs);
}

static int cu_ctx_usable(int c) {
  return c >= 0 && c < FK_MAX_CTX && fk_ctxs[c].live &&
         (!fk_ctxs[c].primary || fk_ctxs[c].refcount > 0);
}

/* The calling thread's usable current context, or -1. */
static int cu_current(void) {
  int c = fk_current_ctx();
  return cu_ctx_usable(c) ? c : -1;
}

static int fk_face_clock(void *stream) {
  unsigned long long handle = (unsigned long long)(uintptr_t)stream;
  int ctx = cu_current();
  int slot = fk_stream_slot(handle);
  if (slot >= 0) ctx = fk_streams[slot].ctx;
  if (ctx < 0) ctx = 0;
  return fk_clock_of(ctx, handle, 0);
}

static long long fk_face_contexts(void) {
  long long n = 0;
  for (int c = 0; c < FK_MAX_CTX; c++)
    n += fk_ctxs[c].primary ? fk_ctxs[c].refcount : fk_ctxs[c].live;
  return n;
}

/* Checks for the helpers below (which run under the lock and return a code). */
#define CHECK_INIT() \
  if (!fk_initialised) return FK_NOT_INITIALIZED
#define CHECK_CTX(ctx)       \
  CHECK_INIT();              \
  int ctx = cu_current();    \
  if (ctx < 0) return FK_INVALID_CONTEXT
#define CHECK_DEVICE(d) \
  if ((d) < 0 || (d) >= fk_n_devices) return FK_INVALID_DEVICE
/* The clock of stream `s` for a call of context `ctx` (`pt`: a _ptsz call), or return
 * CUDA_ERROR_INVALID_HANDLE. */
#define CHECK_STREAM(clock, ctx, s, pt)                                   \
  int clock = fk_clock_of(ctx, (unsigned long long)(uintptr_t)(s), pt); \
  if (!clock) return FK_INVALID_HANDLE

/* A device synchronisation of `device` (every context's streams on it), counted. */
static void cu_sync_device(int device) {
  fk_cpu_wait();
  for (int c = 1; c < fk_n_clocks; c++)
    if (fk_ctxs[fk_clocks[c].ctx].device == device) fk_force(c, ~0ULL, 0);
}

/* ---- Controls only fakecuda has ------------------------------------------------------ */

/* Sets the devices before cuInit: count, capacity (bytes), granularity (bytes), version. A
 * zero leaves that setting as it is; devices = -1 means none. */
FAKE_EXPORT int fakecuda_configure(int devices, unsigned long long cap, unsigned long long gran,
                                   int ver) {
  int ok = 0;
  LOCKED({
    ok = !fk_initialised;
    if (ok) {
      if (devices < 0) fk_n_devices = 0;
      else if (devices > 0) fk_n_devices = devices > FK_MAX_DEVICES ? FK_MAX_DEVICES : devices;
      if (cap) {
        cu_configured_capacity = 1;
        for (int d = 0; d < FK_MAX_DEVICES; d++) fk_devices[d].capacity = cap;
        fk_shared_capacities(); /* a shared device keeps the segment's */
      }
      if (gran) fk_min_gran = fk_rec_gran = gran;
      if (ver) cu_version = ver;
    }
  });
  return ok ? 0 : -1;
}

/* Overrides a device attribute (e.g. 102 = 0: no virtual memory). */
FAKE_EXPORT void fakecuda_set_attribute(int device, int attribute, int value) {
  LOCKED({
    if (device >= 0 && device < FK_MAX_DEVICES && attribute >= 0 && attribute < ATTRS)
      cu_attributes[device][attribute] = value;
  });
}

/* While held, nothing recorded on a stream completes until synchronised or released;
 * releasing completes it all (kernels finish, host functions run). */
FAKE_EXPORT void fakecuda_hold_events(int held) { LOCKED(fk_set_hold(held)); }

/* Bytes charged on one device. */
FAKE_EXPORT unsigned long long fakecuda_device_used(int device) {
  unsigned long long n = 0;
  LOCKED(n = device >= 0 && device < FK_MAX_DEVICES ? fk_devices[device].used : 0);
  return n;
}

/* ---- Init, version, devices, errors ---------------------------------------------------- */

CUresult cuInit(unsigned int flags) {
  ENTER("cuInit");
  if (flags != 0) RETURN(FK_INVALID_VALUE);
  if (fk_n_devices <= 0) RETURN(FK_NO_DEVICE);
  fk_initialised = 1;
  RETURN(CUDA_SUCCESS);
}

CUresult cuDriverGetVersion(int *v) {
  ENTER("cuDriverGetVersion");
  if (!v) RETURN(FK_INVALID_VALUE);
  *v = cu_version;
  RETURN(CUDA_SUCCESS);
}

static CUresult describe_error(const char *function, CUresult error, const char **out, int text) {
  const struct fake_error *e =
      fk_error_of(cu_errors, sizeof cu_errors / sizeof cu_errors[0], error, function);
  if (!out) return FK_INVALID_VALUE;
  *out = e ? (text ? e->text : e->name) : NULL;
  return e ? CUDA_SUCCESS : FK_INVALID_VALUE;
}
CUresult cuGetErrorName(CUresult error, const char **name) {
  return describe_error("cuGetErrorName", error, name, 0);
}
CUresult cuGetErrorString(CUresult error, const char **text) {
  return describe_error("cuGetErrorString", error, text, 1);
}

CUresult cuDeviceGetCount(int *count) {
  ENTER("cuDeviceGetCount");
  if (!fk_initialised) RETURN(FK_NOT_INITIALIZED);
  if (!count) RETURN(FK_INVALID_VALUE);
  *count = fk_n_devices;
  RETURN(CUDA_SUCCESS);
}

CUresult cuDeviceGet(CUdevice *device, int ordinal) {
  ENTER("cuDeviceGet");
  if (!fk_initialised) RETURN(FK_NOT_INITIALIZED);
  if (!device) RETURN(FK_INVALID_VALUE);
  if (ordinal < 0 || ordinal >= fk_n_devices) RETURN(FK_INVALID_DEVICE);
  *device = ordinal;
  RETURN(CUDA_SUCCESS);
}

static CUresult device_name(char *name, int len, CUdevice dev) {
  CHECK_INIT();
  CHECK_DEVICE(dev);
  if (!name || len <= 0) return FK_INVALID_VALUE;
  snprintf(name, (size_t)len, "%s", cu_model->name);
  return CUDA_SUCCESS;
}
CUresult cuDeviceGetName(char *name, int len, CUdevice dev) {
  ENTER("cuDeviceGetName");
  RETURN(device_name(name, len, dev));
}

static CUresult device_attribute(int *value, int attribute, CUdevice dev) {
  CHECK_INIT();
  CHECK_DEVICE(dev);
  if (!value || attribute <= 0 || attribute >= ATTRS) return FK_INVALID_VALUE;
  *value = cu_attributes[dev][attribute];
  return CUDA_SUCCESS;
}
CUresult cuDeviceGetAttribute(int *value, int attribute, CUdevice dev) {
  ENTER("cuDeviceGetAttribute");
  RETURN(device_attribute(value, attribute, dev));
}

CUresult cuDeviceComputeCapability(int *major, int *minor, CUdevice dev) {
  ENTER("cuDeviceComputeCapability");
  if (!fk_initialised) RETURN(FK_NOT_INITIALIZED);
  if (dev < 0 || dev >= fk_n_devices) RETURN(FK_INVALID_DEVICE);
  if (!major || !minor) RETURN(FK_INVALID_VALUE);
  *major = cu_attributes[dev][75];
  *minor = cu_attributes[dev][76];
  RETURN(CUDA_SUCCESS);
}

static CUresult total_mem(size_t *bytes, CUdevice dev) {
  CHECK_INIT();
  CHECK_DEVICE(dev);
  if (!bytes) return FK_INVALID_VALUE;
  *bytes = fk_devices[dev].capacity;
  return CUDA_SUCCESS;
}
CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
  ENTER("cuDeviceTotalMem_v2");
  RETURN(total_mem(bytes, dev));
}

/* A UUID of 16 bytes: the fake, the device (shared or this process's) and the ordinal. */
static CUresult device_uuid(char *uuid, CUdevice dev) {
  CHECK_INIT();
  CHECK_DEVICE(dev);
  if (!uuid) return FK_INVALID_VALUE;
  fk_device_uuid(uuid, "fkcuda", dev);
  return CUDA_SUCCESS;
}
CUresult cuDeviceGetUuid(char *uuid, CUdevice dev) {
  ENTER("cuDeviceGetUuid");
  RETURN(device_uuid(uuid, dev));
}
CUresult cuDeviceGetUuid_v2(char *uuid, CUdevice dev) {
  ENTER("cuDeviceGetUuid_v2");
  RETURN(device_uuid(uuid, dev));
}

static CUresult pci_bus_id(char *out, int len, CUdevice dev) {
  CHECK_INIT();
  CHECK_DEVICE(dev);
  if (!out || len <= 0) return FK_INVALID_VALUE;
  snprintf(out, (size_t)len, "%08x:%02x:%02x.0", cu_attributes[dev][50], cu_attributes[dev][33],
           cu_attributes[dev][34]);
  return CUDA_SUCCESS;
}
CUresult cuDeviceGetPCIBusId(char *out, int len, CUdevice dev) {
  ENTER("cuDeviceGetPCIBusId");
  RETURN(pci_bus_id(out, len, dev));
}

/* ---- Contexts ----------------------------------------------------------------------------- */

CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) {
  ENTER("cuDevicePrimaryCtxRetain");
  if (!fk_initialised) RETURN(FK_NOT_INITIALIZED);
  if (dev < 0 || dev >= fk_n_devices) RETURN(FK_INVALID_DEVICE);
  if (!pctx) RETURN(FK_INVALID_VALUE);
  fk_ctxs[dev].refcount++;
  *pctx = &fk_ctxs[dev];
  RETURN(CUDA_SUCCESS);
}

static CUresult primary_release(CUdevice dev) {
  CHECK_INIT();
  CHECK_DEVICE(dev);
  if (fk_ctxs[dev].refcount <= 0) return FK_INVALID_CONTEXT;
  fk_ctxs[dev].refcount--;
  return CUDA_SUCCESS;
}
#ifndef FAKECUDA_OLD /* newer than CUDA 10.1 */
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  ENTER("cuDevicePrimaryCtxRelease_v2");
  RETURN(primary_release(dev));
}
#endif
CUresult cuDevicePrimaryCtxRelease(CUdevice dev) {
  ENTER("cuDevicePrimaryCtxRelease");
  RETURN(primary_release(dev));
}

CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active) {
  ENTER("cuDevicePrimaryCtxGetState");
  if (!fk_initialised) RETURN(FK_NOT_INITIALIZED);
  if (dev < 0 || dev >= fk_n_devices) RETURN(FK_INVALID_DEVICE);
  if (!flags || !active) RETURN(FK_INVALID_VALUE);
  *flags = fk_ctxs[dev].flags;
  *active = fk_ctxs[dev].refcount > 0;
  RETURN(CUDA_SUCCESS);
}

/* Context flags (CU_CTX_FLAGS_MASK) with at most one scheduling flag. */
static int cu_flags_ok(unsigned flags) {
  unsigned sched = flags & 7u;
  return !(flags & ~0xffu) && (sched == 0 || sched == 1 || sched == 2 || sched == 4);
}

static CUresult ctx_create(CUcontext *pctx, unsigned flags, CUdevice dev) {
  CHECK_INIT();
  CHECK_DEVICE(dev);
  if (!pctx || !cu_flags_ok(flags)) return FK_INVALID_VALUE;
  for (int c = FK_MAX_DEVICES; c < FK_MAX_CTX; c++) {
    struct fk_ctx *x = &fk_ctxs[c];
    if (x->live) continue;
    memset(x, 0, sizeof *x);
    x->live = 1;
    x->device = dev;
    x->refcount = 1;
    x->flags = flags;
    cu_ctx_defaults(c);
    if (fk_t_depth < (int)(sizeof fk_t_stack / sizeof fk_t_stack[0])) fk_t_stack[fk_t_depth++] = c;
    *pctx = x;
    return CUDA_SUCCESS;
  }
  return FK_OUT_OF_MEMORY;
}
/* A new context of its own, made current (pushed) on the calling thread. */
CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev) {
  ENTER("cuCtxCreate_v2");
  RETURN(ctx_create(pctx, flags, dev));
}

/* A created context goes with its streams, events, modules and memory; popped from the
 * calling thread's stack when current there. */
static CUresult ctx_destroy(CUcontext ctx) {
  CHECK_INIT();
  int c = cu_ctx_index(ctx);
  if (c < 0 || !fk_ctxs[c].live || fk_ctxs[c].primary) return FK_INVALID_CONTEXT;
  /* Its work completes first (the driver waits for it). */
  fk_ctx_clear(c, 0, "cuCtxDestroy_v2");
  fk_ctxs[c].live = 0;
  fk_ctxs[c].legacy_clock = 0;
  if (fk_current_ctx() == c) fk_t_depth--;
  return CUDA_SUCCESS;
}
CUresult cuCtxDestroy_v2(CUcontext ctx) {
  ENTER("cuCtxDestroy_v2");
  RETURN(ctx_destroy(ctx));
}

static CUresult ctx_push(CUcontext ctx) {
  CHECK_INIT();
  int c = cu_ctx_index(ctx);
  if (c < 0 || !fk_ctxs[c].live) return FK_INVALID_CONTEXT;
  if (fk_t_depth == (int)(sizeof fk_t_stack / sizeof fk_t_stack[0])) return FK_OUT_OF_MEMORY;
  fk_t_stack[fk_t_depth++] = c;
  return CUDA_SUCCESS;
}
CUresult cuCtxPushCurrent_v2(CUcontext ctx) {
  ENTER("cuCtxPushCurrent_v2");
  RETURN(ctx_push(ctx));
}

static CUresult ctx_pop(CUcontext *pctx) {
  CHECK_INIT();
  if (fk_t_depth == 0) return FK_INVALID_CONTEXT;
  int c = fk_t_stack[--fk_t_depth];
  if (pctx) *pctx = &fk_ctxs[c];
  return CUDA_SUCCESS;
}
CUresult cuCtxPopCurrent_v2(CUcontext *pctx) {
  ENTER("cuCtxPopCurrent_v2");
  RETURN(ctx_pop(pctx));
}

CUresult cuCtxGetCurrent(CUcontext *pctx) {
  ENTER("cuCtxGetCurrent");
  if (!fk_initialised) RETURN(FK_NOT_INITIALIZED);
  if (!pctx) RETURN(FK_INVALID_VALUE);
  int c = fk_current_ctx();
  *pctx = c < 0 ? NULL : &fk_ctxs[c];
  RETURN(CUDA_SUCCESS);
}

/* Replaces the top of the calling thread's stack (NULL pops it). */
CUresult cuCtxSetCurrent(CUcontext ctx) {
  ENTER("cuCtxSetCurrent");
  if (!fk_initialised) RETURN(FK_NOT_INITIALIZED);
  if (!ctx) {
    fk_set_current(-1);
    RETURN(CUDA_SUCCESS);
  }
  int c = cu_ctx_index(ctx);
  if (c < 0 || !fk_ctxs[c].live) RETURN(FK_INVALID_CONTEXT);
  fk_set_current(c);
  RETURN(CUDA_SUCCESS);
}

static CUresult ctx_device(CUdevice *device) {
  CHECK_CTX(ctx);
  if (!device) return FK_INVALID_VALUE;
  *device = fk_ctxs[ctx].device;
  return CUDA_SUCCESS;
}
CUresult cuCtxGetDevice(CUdevice *device) {
  ENTER("cuCtxGetDevice");
  RETURN(ctx_device(device));
}

static CUresult ctx_flags(unsigned int *flags) {
  CHECK_CTX(ctx);
  if (!flags) return FK_INVALID_VALUE;
  *flags = fk_ctxs[ctx].flags;
  return CUDA_SUCCESS;
}
CUresult cuCtxGetFlags(unsigned int *flags) {
  ENTER("cuCtxGetFlags");
  RETURN(ctx_flags(flags));
}

static CUresult ctx_api_version(CUcontext ctx, unsigned int *version) {
  CHECK_INIT();
  int c = ctx ? cu_ctx_index(ctx) : cu_current();
  if (c < 0 || !fk_ctxs[c].live) return FK_INVALID_CONTEXT;
  if (!version) return FK_INVALID_VALUE;
  *version = 3020;
  return CUDA_SUCCESS;
}
CUresult cuCtxGetApiVersion(CUcontext ctx, unsigned int *version) {
  ENTER("cuCtxGetApiVersion");
  RETURN(ctx_api_version(ctx, version));
}

static CUresult ctx_synchronize(void) {
  CHECK_CTX(ctx);
  fk_cpu_wait();
  fk_force_ctx(ctx);
  fk_pools_sync();
  return CUDA_SUCCESS;
}
CUresult cuCtxSynchronize(void) {
  ENTER("cuCtxSynchronize");
  RETURN(ctx_synchronize());
}

static CUresult priority_range(int *least, int *greatest) {
  CHECK_CTX(ctx);
  (void)ctx;
  if (least) *least = 0;
  if (greatest) *greatest = cu_model->greatest_priority;
  return CUDA_SUCCESS;
}
CUresult cuCtxGetStreamPriorityRange(int *least, int *greatest) {
  ENTER("cuCtxGetStreamPriorityRange");
  RETURN(priority_range(least, greatest));
}

/* Limits (cuCtxSetLimit): the driver "is free to modify the requested value"; the fake keeps
 * it, except the two L2 hints, clamped (to 128 bytes, to the device's persisting L2 size). A
 * limit the device or the version has not: CUDA_ERROR_UNSUPPORTED_LIMIT. */
#define CUDA_ERROR_UNSUPPORTED_LIMIT 215
static int limit_supported(int ctx, unsigned limit, int setting) {
  if (limit == 3 && setting && cu_attributes[fk_ctxs[ctx].device][75] >= 9) return 0;
  if (limit == 5) return cu_version >= 10000;
  if (limit == 6) return cu_version >= 11000;
  return limit <= 4;
}
static CUresult ctx_limit(size_t *get, unsigned limit, size_t set) {
  CHECK_CTX(ctx);
  if (limit >= FK_MAX_LIMITS) return FK_INVALID_VALUE; /* CU_LIMIT_MAX */
  if (!limit_supported(ctx, limit, !get)) return CUDA_ERROR_UNSUPPORTED_LIMIT;
  if (get) {
    *get = fk_ctxs[ctx].limits[limit];
    return CUDA_SUCCESS;
  }
  unsigned long long persisting = (unsigned long long)cu_attributes[fk_ctxs[ctx].device][108];
  if (limit == 5 && set > 128) set = 128;
  if (limit == 6 && set > persisting) set = persisting;
  /* "Setting this value will take effect immediately, and if necessary, the device will
   * block until all preceding requested tasks are complete." */
  if (limit == 0) cu_sync_device(fk_ctxs[ctx].device);
  fk_ctxs[ctx].limits[limit] = set;
  return CUDA_SUCCESS;
}
CUresult cuCtxGetLimit(size_t *value, unsigned int limit) {
  ENTER("cuCtxGetLimit");
  RETURN(value ? ctx_limit(value, limit, 0) : FK_INVALID_VALUE);
}
CUresult cuCtxSetLimit(unsigned int limit, size_t value) {
  ENTER("cuCtxSetLimit");
  RETURN(ctx_limit(NULL, limit, value));
}

/* CUfunc_cache (0 ... 3) and CUsharedconfig (0 ... 2): kept, with no other effect. */
static CUresult ctx_config(int *get, int set, int shared) {
  CHECK_CTX(ctx);
  int *slot = shared ? &fk_ctxs[ctx].shared_config : &fk_ctxs[ctx].cache_config;
  if (get) {
    *get = *slot;
    return CUDA_SUCCESS;
  }
  if (set < 0 || set > (shared ? 2 : 3)) return FK_INVALID_VALUE;
  *slot = set;
  return CUDA_SUCCESS;
}
CUresult cuCtxGetCacheConfig(int *config) {
  ENTER("cuCtxGetCacheConfig");
  RETURN(config ? ctx_config(config, 0, 0) : FK_INVALID_VALUE);
}
CUresult cuCtxSetCacheConfig(int config) {
  ENTER("cuCtxSetCacheConfig");
  RETURN(ctx_config(NULL, config, 0));
}
CUresult cuCtxGetSharedMemConfig(int *config) {
  ENTER("cuCtxGetSharedMemConfig");
  RETURN(config ? ctx_config(config, 0, 1) : FK_INVALID_VALUE);
}
CUresult cuCtxSetSharedMemConfig(int config) {
  ENTER("cuCtxSetSharedMemConfig");
  RETURN(ctx_config(NULL, config, 1));
}

/* The current context's flags, overwritten (CU_CTX_SYNC_MEMOPS makes its synchronous copies
 * synchronise, see fk_copy_2d). */
FK_FN CUresult ctx_set_flags(unsigned flags) {
  CHECK_CTX(ctx);
  if (!cu_flags_ok(flags)) return FK_INVALID_VALUE;
  fk_ctxs[ctx].flags = flags;
  return CUDA_SUCCESS;
}
#ifndef FAKECUDA_OLD /* newer than CUDA 10.1 */
CUresult cuCtxSetFlags(unsigned int flags) {
  ENTER("cuCtxSetFlags");
  RETURN(ctx_set_flags(flags));
}
#endif

/* "If context is supplied as NULL and there is one current, the Id of the current context
 * is returned." */
FK_FN CUresult ctx_id(CUcontext ctx, unsigned long long *id) {
  CHECK_INIT();
  int c = ctx ? cu_ctx_index(ctx) : cu_current();
  if (c < 0 || !fk_ctxs[c].live) return FK_INVALID_CONTEXT;
  if (!id) return FK_INVALID_VALUE;
  *id = fk_ctxs[c].id;
  return CUDA_SUCCESS;
}
#ifndef FAKECUDA_OLD /* newer than CUDA 10.1 */
CUresult cuCtxGetId(CUcontext ctx, unsigned long long *id) {
  ENTER("cuCtxGetId");
  RETURN(ctx_id(ctx, id));
}
#endif

/* The primary context's flags; before CUDA 11 (cuDevicePrimaryCtxSetFlags) not while it is
 * active: CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE; _v2 (CUDA 11) at any time. */
static CUresult primary_set_flags(CUdevice dev, unsigned flags, int v2) {
  CHECK_INIT();
  CHECK_DEVICE(dev);
  if (!cu_flags_ok(flags)) return FK_INVALID_VALUE;
  if (!v2 && fk_ctxs[dev].refcount > 0) return 708; /* CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE */
  fk_ctxs[dev].flags = flags;
  return CUDA_SUCCESS;
}
CUresult cuDevicePrimaryCtxSetFlags(CUdevice dev, unsigned int flags) {
  ENTER("cuDevicePrimaryCtxSetFlags");
  RETURN(primary_set_flags(dev, flags, 0));
}
#ifndef FAKECUDA_OLD /* newer than CUDA 10.1 */
CUresult cuDevicePrimaryCtxSetFlags_v2(CUdevice dev, unsigned int flags) {
  ENTER("cuDevicePrimaryCtxSetFlags_v2");
  RETURN(primary_set_flags(dev, flags, 1));
}
#endif

/* "Destroy all allocations and reset all state on the primary context": its work completes,
 * its streams, events, modules, memory and the device's pools go, its flags and limits are
 * the defaults again, and it is a new context (a new id); its retain count stays. */
static CUresult primary_reset(CUdevice dev, const char *what) {
  CHECK_INIT();
  CHECK_DEVICE(dev);
  fk_cpu_wait();
  fk_ctx_clear(dev, 1, what);
  fk_ctxs[dev].flags = 0;
  cu_ctx_defaults(dev);
  return CUDA_SUCCESS;
}
CUresult cuDevicePrimaryCtxReset(CUdevice dev) {
  ENTER("cuDevicePrimaryCtxReset");
  RETURN(primary_reset(dev, "cuDevicePrimaryCtxReset"));
}
#ifndef FAKECUDA_OLD /* newer than CUDA 10.1 */
CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev) {
  ENTER("cuDevicePrimaryCtxReset_v2");
  RETURN(primary_reset(dev, "cuDevicePrimaryCtxReset_v2"));
}
#endif

/* "[domain]:[bus]:[device].[function]", "[domain]:[bus]:[device]" or "[bus]:[device].[function]"
 * (hexadecimal), as cuDeviceGetPCIBusId writes them. */
static CUresult device_by_pci_bus_id(CUdevice *dev, const char *id) {
  CHECK_INIT();
  if (!dev || !id) return FK_INVALID_VALUE;
  unsigned domain = 0, bus, device, function = 0;
  char tail;
  if (sscanf(id, "%x:%x:%x.%x%c", &domain, &bus, &device, &function, &tail) != 4 &&
      sscanf(id, "%x:%x:%x%c", &domain, &bus, &device, &tail) != 3 &&
      (domain = 0, sscanf(id, "%x:%x.%x%c", &bus, &device, &function, &tail) != 3))
    return FK_INVALID_VALUE;
  for (int d = 0; d < fk_n_devices; d++)
    if ((unsigned)cu_attributes[d][50] == domain && (unsigned)cu_attributes[d][33] == bus &&
        (unsigned)cu_attributes[d][34] == device && function == 0) {
      *dev = d;
      return CUDA_SUCCESS;
    }
  return FK_INVALID_DEVICE;
}
CUresult cuDeviceGetByPCIBusId(CUdevice *dev, const char *id) {
  ENTER("cuDeviceGetByPCIBusId");
  RETURN(device_by_pci_bus_id(dev, id));
}

/* CU_DEVICE_P2P_ATTRIBUTE_*: 1 performance rank (0: one link kind), 2 access supported, 3
 * native atomics, 4 array access — each what the peer link allows. */
static CUresult p2p_attribute(int *value, int attribute, CUdevice src, CUdevice dst) {
  CHECK_INIT();
  CHECK_DEVICE(src);
  CHECK_DEVICE(dst);
  if (src == dst) return FK_INVALID_DEVICE;
  if (!value || attribute < 1 || attribute > 4) return FK_INVALID_VALUE;
  *value = attribute == 1 ? 0 : !fk_peer_denied[src][dst];
  return CUDA_SUCCESS;
}
CUresult cuDeviceGetP2PAttribute(int *value, int attribute, CUdevice src, CUdevice dst) {
  ENTER("cuDeviceGetP2PAttribute");
  RETURN(p2p_attribute(value, attribute, src, dst));
}

/* ---- Peer access (fakecuda_nopeer: every pair refused, as a system without peer links) ---- */

CUresult cuDeviceCanAccessPeer(int *can, CUdevice dev, CUdevice peer) {
  ENTER("cuDeviceCanAccessPeer");
  if (!fk_initialised) RETURN(FK_NOT_INITIALIZED);
  RETURN(fk_can_access_peer(can, dev, peer));
}

/* From the current context's device to `peer_ctx`'s. */
static CUresult enable_peer(CUcontext peer_ctx, unsigned int flags) {
  CHECK_CTX(ctx);
  int p = cu_ctx_index(peer_ctx);
  if (p < 0 || !cu_ctx_usable(p)) return FK_INVALID_CONTEXT;
  return fk_enable_peer(fk_ctxs[ctx].device, fk_ctxs[p].device, flags);
}
CUresult cuCtxEnablePeerAccess(CUcontext peer_ctx, unsigned int flags) {
  ENTER("cuCtxEnablePeerAccess");
  RETURN(enable_peer(peer_ctx, flags));
}

static CUresult disable_peer(CUcontext peer_ctx) {
  CHECK_CTX(ctx);
  int p = cu_ctx_index(peer_ctx);
  if (p < 0 || !fk_ctxs[p].live) return FK_INVALID_CONTEXT;
  return fk_disable_peer(fk_ctxs[ctx].device, fk_ctxs[p].device);
}
CUresult cuCtxDisablePeerAccess(CUcontext peer_ctx) {
  ENTER("cuCtxDisablePeerAccess");
  RETURN(disable_peer(peer_ctx));
}

/* ---- Plain and managed memory ------------------------------------------------------------- */

static CUresult mem_get_info(size_t *free_bytes, size_t *total) {
  CHECK_CTX(ctx);
  if (!free_bytes || !total) return FK_INVALID_VALUE;
  int device = fk_ctxs[ctx].device;
  *free_bytes = fk_device_free(device);
  *total = fk_devices[device].capacity;
  return CUDA_SUCCESS;
}
CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total) {
  ENTER("cuMemGetInfo_v2");
  RETURN(mem_get_info(free_bytes, total));
}

static CUresult mem_alloc(CUdeviceptr *dptr, size_t size, int kind, unsigned flags) {
  CHECK_CTX(ctx);
  if (!dptr || size == 0) return FK_INVALID_VALUE;
  return fk_alloc(ctx, kind, size, flags, dptr);
}
CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t size) {
  ENTER("cuMemAlloc_v2");
  RETURN(mem_alloc(dptr, size, R_PLAIN, 0));
}

/* CU_MEM_ATTACH_GLOBAL (1) or CU_MEM_ATTACH_HOST (2); the device must have managed memory. */
static CUresult mem_alloc_managed(CUdeviceptr *dptr, size_t size, unsigned flags) {
  CHECK_CTX(ctx);
  if (!dptr || size == 0 || (flags != 1 && flags != 2)) return FK_INVALID_VALUE;
  if (!cu_attributes[fk_ctxs[ctx].device][83]) return FK_NOT_SUPPORTED;
  return fk_alloc(ctx, R_MANAGED, size, flags, dptr);
}
CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t size, unsigned int flags) {
  ENTER("cuMemAllocManaged");
  RETURN(mem_alloc_managed(dptr, size, flags));
}


static CUresult mem_free(CUdeviceptr ptr) {
  CHECK_CTX(ctx);
  (void)ctx;
  if (ptr == 0) return CUDA_SUCCESS;
  if (fk_pool_free_now(ptr, "cuMemFree_v2 of stream-ordered memory")) return CUDA_SUCCESS;
  struct fk_region *r = fk_region_find(R_PLAIN, ptr);
  if (!r) r = fk_region_find(R_MANAGED, ptr);
  if (!r) return FK_INVALID_VALUE;
  cu_sync_device(r->device);
  return fk_free(ptr, "cuMemFree_v2");
}
CUresult cuMemFree_v2(CUdeviceptr ptr) {
  ENTER("cuMemFree_v2");
  RETURN(mem_free(ptr));
}

static CUresult address_range(CUdeviceptr *base, size_t *size, CUdeviceptr ptr) {
  CHECK_CTX(ctx);
  (void)ctx;
  struct fk_pointer p = fk_pointer_of(ptr);
  if (!p.region || !fk_is_device_kind(p.region->kind)) return FK_NOT_FOUND;
  if (base) *base = p.start;
  if (size) *size = p.size;
  return CUDA_SUCCESS;
}
CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr ptr) {
  ENTER("cuMemGetAddressRange_v2");
  RETURN(address_range(base, size, ptr));
}

/* Rows of at least `width` bytes, the pitch rounded up to the device's texture alignment
 * (512 bytes on both models: what cuMemAllocPitch answers on them). */
static CUresult mem_alloc_pitch(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height,
                                unsigned element) {
  CHECK_CTX(ctx);
  if (!dptr || !pitch || !width || !height || (element != 4 && element != 8 && element != 16))
    return FK_INVALID_VALUE;
  unsigned long long align = (unsigned long long)cu_attributes[fk_ctxs[ctx].device][14];
  unsigned long long rounded = fk_round_up(width, align ? align : 512);
  if (rounded < width || rounded > (unsigned long long)cu_attributes[fk_ctxs[ctx].device][11] ||
      height > ~0ULL / rounded)
    return FK_INVALID_VALUE;
  CUresult rc = fk_alloc(ctx, R_PLAIN, rounded * height, 0, dptr);
  if (rc == CUDA_SUCCESS) *pitch = rounded;
  return rc;
}
CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height,
                            unsigned int element) {
  ENTER("cuMemAllocPitch_v2");
  RETURN(mem_alloc_pitch(dptr, pitch, width, height, element));
}

/* ---- Managed memory: advice, prefetch, attachment, range attributes ---------------------- */

/* The managed allocation holding all of [ptr, ptr + count), or NULL. */
static struct fk_region *managed_range(CUdeviceptr ptr, size_t count) {
  struct fk_region *r = fk_region_holding(ptr);
  if (!r || r->kind != R_MANAGED || !count || ptr + count < ptr || ptr + count > r->va + r->size)
    return NULL;
  return r;
}

/* A location the Unified Memory driver may be told of: the CPU, or a device with concurrent
 * managed access (attribute 89). */
static CUresult managed_location(int device) {
  if (device == FK_LOC_CPU) return CUDA_SUCCESS;
  if (device < 0 || device >= fk_n_devices || !cu_attributes[device][89]) return FK_INVALID_DEVICE;
  return CUDA_SUCCESS;
}

/* CU_MEM_ADVISE_*: kept for the whole allocation (what cuMemRangeGetAttribute reports); the
 * fake moves no pages. */
static CUresult mem_advise(CUdeviceptr ptr, size_t count, int advice, int device) {
  CHECK_CTX(ctx);
  (void)ctx;
  struct fk_region *r = managed_range(ptr, count);
  if (!r || advice < 1 || advice > 6) return FK_INVALID_VALUE;
  if (advice == 3 || advice == 5) {
    CUresult rc = managed_location(device);
    if (rc != CUDA_SUCCESS) return rc;
  }
  return fk_advise(r, advice, device);
}
CUresult cuMemAdvise(CUdeviceptr ptr, size_t count, int advice, CUdevice device) {
  ENTER("cuMemAdvise");
  RETURN(mem_advise(ptr, count, advice, device));
}
/* The CUmemLocation form (CUDA 12.2): DEVICE (1) with an ordinal, HOST (2). */
FK_FN int location_device(CUmemLocation l) {
  return l.type == 1 ? l.id : l.type == 2 ? FK_LOC_CPU : -3;
}
#ifndef FAKECUDA_OLD /* newer than CUDA 10.1 */
CUresult cuMemAdvise_v2(CUdeviceptr ptr, size_t count, int advice, CUmemLocation location) {
  ENTER("cuMemAdvise_v2");
  int device = location_device(location);
  RETURN(device == -3 ? FK_INVALID_VALUE : mem_advise(ptr, count, advice, device));
}
#endif

/* A prefetch: a stream-ordered operation that moves no bytes the fake keeps (the last
 * location asked for is what cuMemRangeGetAttribute reports, at once, as the driver does). */
static CUresult prefetch(CUdeviceptr ptr, size_t count, int device, CUstream s, int pt) {
  CHECK_CTX(ctx);
  CHECK_STREAM(clock, ctx, s, pt);
  struct fk_region *r = managed_range(ptr, count);
  if (!r) return FK_INVALID_VALUE;
  CUresult rc = managed_location(device);
  if (rc != CUDA_SUCCESS) return rc;
  if (!cu_attributes[fk_ctxs[fk_clocks[clock].ctx].device][89]) return FK_INVALID_DEVICE;
  fk_enqueue(clock);
  r->last_prefetch = device;
  return CUDA_SUCCESS;
}
CUresult cuMemPrefetchAsync(CUdeviceptr ptr, size_t count, CUdevice device, CUstream s) {
  ENTER("cuMemPrefetchAsync");
  RETURN(prefetch(ptr, count, device, s, 0));
}
CUresult cuMemPrefetchAsync_ptsz(CUdeviceptr ptr, size_t count, CUdevice device, CUstream s) {
  ENTER("cuMemPrefetchAsync_ptsz");
  RETURN(prefetch(ptr, count, device, s, 1));
}
#ifndef FAKECUDA_OLD /* newer than CUDA 10.1 */
CUresult cuMemPrefetchAsync_v2(CUdeviceptr ptr, size_t count, CUmemLocation location,
                               unsigned int flags, CUstream s) {
  ENTER("cuMemPrefetchAsync_v2");
  int device = location_device(location);
  RETURN(device == -3 || flags ? FK_INVALID_VALUE : prefetch(ptr, count, device, s, 0));
}
#endif
#ifndef FAKECUDA_OLD /* newer than CUDA 10.1 */
CUresult cuMemPrefetchAsync_v2_ptsz(CUdeviceptr ptr, size_t count, CUmemLocation location,
                                    unsigned int flags, CUstream s) {
  ENTER("cuMemPrefetchAsync_v2_ptsz");
  int device = location_device(location);
  RETURN(device == -3 || flags ? FK_INVALID_VALUE : prefetch(ptr, count, device, s, 1));
}
#endif

/* CU_MEM_RANGE_ATTRIBUTE_*: 1 read mostly, 2 preferred location, 3 accessed by (a list, the
 * rest CU_DEVICE_INVALID), 4 last prefetch location; 5-8 (CUDA 12.2) the same locations as
 * type (CUmemLocationType: 1 device, 2 host, 0 invalid) and id. */
static CUresult range_attribute(void *data, size_t size, int attribute, CUdeviceptr ptr,
                                size_t count) {
  const struct fk_region *r = managed_range(ptr, count);
  if (!data || !r || (attribute != 3 && size != 4) || (attribute == 3 && (!size || size % 4)) ||
      (attribute > 4 && cu_version < 12020))
    return FK_INVALID_VALUE;
  int *out = (int *)data;
  if (attribute <= 4) return fk_range_attribute(r, attribute, out, size / 4);
  int location = attribute <= 6 ? r->preferred : r->last_prefetch;
  if (attribute == 5 || attribute == 7)
    *out = location >= 0 ? 1 : location == FK_LOC_CPU ? 2 : 0;
  else if (attribute == 6 || attribute == 8)
    *out = location >= 0 ? location : 0;
  else
    return FK_INVALID_VALUE;
  return CUDA_SUCCESS;
}
CUresult cuMemRangeGetAttribute(void *data, size_t size, int attribute, CUdeviceptr ptr,
                                size_t count) {
  ENTER("cuMemRangeGetAttribute");
  if (!fk_initialised) RETURN(FK_NOT_INITIALIZED);
  RETURN(range_attribute(data, size, attribute, ptr, count));
}
CUresult cuMemRangeGetAttributes(void **data, size_t *sizes, int *attributes, size_t n,
                                 CUdeviceptr ptr, size_t count) {
  ENTER("cuMemRangeGetAttributes");
  if (!fk_initialised) RETURN(FK_NOT_INITIALIZED);
  if (!data || !sizes || !attributes || !n) RETURN(FK_INVALID_VALUE);
  for (size_t i = 0; i < n; i++) {
    CUresult rc = range_attribute(data[i], sizes[i], attributes[i], ptr, count);
    if (rc != CUDA_SUCCESS) RETURN(rc);
  }
  RETURN(CUDA_SUCCESS);
}

/* CU_MEM_ATTACH_GLOBAL (1), HOST (2) or SINGLE (4), over a whole managed allocation (length
 * 0 or its size); SINGLE not to the NULL stream. A stream-ordered operation; the attachment
 * itself is not modelled (no access from another stream is refused). */
static CUresult attach_mem(CUstream s, CUdeviceptr ptr, size_t length, unsigned flags, int pt) {
  CHECK_CTX(ctx);
  CHECK_STREAM(clock, ctx, s, pt);
  const struct fk_region *r = fk_region_find(R_MANAGED, ptr);
  if (!r || (length && length != r->size) || (flags != 1 && flags != 2 && flags != 4))
    return FK_INVALID_VALUE;
  if (flags == 4 && fk_clocks[clock].kind != CK_STREAM) return FK_INVALID_VALUE;
  fk_enqueue(clock);
  return CUDA_SUCCESS;
}
CUresult cuStreamAttachMemAsync(CUstream s, CUdeviceptr ptr, size_t length, unsigned int flags) {
  ENTER("cuStreamAttachMemAsync");
  RETURN(attach_mem(s, ptr, length, flags, 0));
}
CUresult cuStreamAttachMemAsync_ptsz(CUstream s, CUdeviceptr ptr, size_t length,
                                     unsigned int flags) {
  ENTER("cuStreamAttachMemAsync_ptsz");
  RETURN(attach_mem(s, ptr, length, flags, 1));
}

/* ---- Pinned host memory (fakecuda_nopinned: page-locking refused, as where it cannot be had) ---- */

/* CU_MEMHOSTALLOC_PORTABLE | DEVICEMAP | WRITECOMBINED. */
#define HOST_ALLOC_FLAGS 0x7u

static CUresult host_alloc(void **pp, size_t size, unsigned flags) {
  CHECK_CTX(ctx);
  if (!pp || size == 0 || (flags & ~HOST_ALLOC_FLAGS)) return FK_INVALID_VALUE;
#ifdef FAKECUDA_NO_PINNED_HOST
  (void)ctx;
  return FK_OUT_OF_MEMORY;
#else
  return fk_host_alloc(fk_ctxs[ctx].device, size, flags, pp);
#endif
}
CUresult cuMemHostAlloc(void **pp, size_t size, unsigned int flags) {
  ENTER("cuMemHostAlloc");
  RETURN(host_alloc(pp, size, flags));
}
CUresult cuMemAllocHost_v2(void **pp, size_t size) {
  ENTER("cuMemAllocHost_v2");
  RETURN(host_alloc(pp, size, 0));
}

static CUresult host_free(void *p) {
  CHECK_CTX(ctx);
  if (!p) return CUDA_SUCCESS;
  if (!fk_region_find(R_HOST, (unsigned long long)(uintptr_t)p)) return FK_INVALID_VALUE;
  /* Not documented either way for CUDA (HIP documents it): treated as cuMemFree is. */
  cu_sync_device(fk_ctxs[ctx].device);
  return fk_host_free(p, "cuMemFreeHost");
}
CUresult cuMemFreeHost(void *p) {
  ENTER("cuMemFreeHost");
  RETURN(host_free(p));
}

/* CU_MEMHOSTREGISTER_PORTABLE | DEVICEMAP | IOMEMORY | READ_ONLY. */
static CUresult host_register(void *p, size_t size, unsigned flags) {
  CHECK_CTX(ctx);
  if (!p || size == 0 || (flags & ~0xfu)) return FK_INVALID_VALUE;
#ifdef FAKECUDA_NO_PINNED_HOST
  (void)ctx;
  return FK_OUT_OF_MEMORY;
#else
  int rc = fk_host_register(p, size, flags, fk_ctxs[ctx].device);
  return rc == -1 ? CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED : rc;
#endif
}
CUresult cuMemHostRegister_v2(void *p, size_t size, unsigned int flags) {
  ENTER("cuMemHostRegister_v2");
  RETURN(host_register(p, size, flags));
}

static CUresult host_unregister(void *p) {
  CHECK_CTX(ctx);
  (void)ctx;
  if (!p) return FK_INVALID_VALUE;
  int rc = fk_host_unregister(p, "cuMemHostUnregister");
  return rc == FK_INVALID_VALUE ? CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED : rc;
}
CUresult cuMemHostUnregister(void *p) {
  ENTER("cuMemHostUnregister");
  RETURN(host_unregister(p));
}

static CUresult host_device_pointer(CUdeviceptr *out, void *p, unsigned flags) {
  CHECK_CTX(ctx);
  (void)ctx;
  if (!out || flags) return FK_INVALID_VALUE;
  unsigned long long va = (unsigned long long)(uintptr_t)p;
  if (!fk_pinned_range(va, 1)) return FK_INVALID_VALUE;
  *out = va; /* unified addressing: the same address */
  return CUDA_SUCCESS;
}
CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *out, void *p, unsigned int flags) {
  ENTER("cuMemHostGetDevicePointer_v2");
  RETURN(host_device_pointer(out, p, flags));
}

/* The flags a cuMemHostAlloc / cuMemAllocHost allocation was made with (not registered
 * memory: "will fail if the pointer does not reside in an allocation performed by
 * cuMemAllocHost() or cuMemHostAlloc()"). */
static CUresult host_get_flags(unsigned *flags, void *p) {
  CHECK_CTX(ctx);
  (void)ctx;
  const struct fk_region *r = fk_region_holding((unsigned long long)(uintptr_t)p);
  if (!flags || !p || !r || r->kind != R_HOST) return FK_INVALID_VALUE;
  *flags = r->flags;
  return CUDA_SUCCESS;
}
CUresult cuMemHostGetFlags(unsigned int *flags, void *p) {
  ENTER("cuMemHostGetFlags");
  RETURN(host_get_flags(flags, p));
}

/* ---- Pointer attributes ------------------------------------------------------------------- */

/* Attribute `attr` of `ptr` into `data`; `known` 0 for a pointer the driver does not know. */
static CUresult pointer_attribute(void *data, int attr, CUdeviceptr ptr, int *known) {
  struct fk_pointer p = fk_pointer_of(ptr);
  const struct fk_region *r = p.region;
  *known = r != NULL;
  if (!data) return FK_INVALID_VALUE;
  if (!r) return FK_INVALID_VALUE;
  int host = r->kind == R_HOST || r->kind == R_REGISTERED;
  int ctx = r->kind == R_PLAIN || r->kind == R_MANAGED || r->kind == R_MODULE || r->kind == R_IPC
                ? r->ctx
                : r->device;
  switch (attr) {
    case 1: *(CUcontext *)data = &fk_ctxs[ctx]; break;                   /* CONTEXT */
    case 2: *(unsigned *)data = host ? 1 : 2; break;                     /* MEMORY_TYPE */
    case 3: *(CUdeviceptr *)data = ptr; break;                           /* DEVICE_POINTER */
    case 4:                                                              /* HOST_POINTER */
      if (!host && r->kind != R_MANAGED) return FK_INVALID_VALUE;
      *(void **)data = (void *)(uintptr_t)ptr;
      break;
    case 6: *(int *)data = r->sync_memops; break;                        /* SYNC_MEMOPS */
    case 7: *(unsigned long long *)data = r->id; break;                  /* BUFFER_ID */
    case 8: *(int *)data = r->kind == R_MANAGED; break;                  /* IS_MANAGED */
    case 9: *(int *)data = r->device; break;                             /* DEVICE_ORDINAL */
    case 10: *(int *)data = r->kind == R_PLAIN; break;                   /* IS_LEGACY_CUDA_IPC_CAPABLE */
    case 11: *(CUdeviceptr *)data = p.start; break;                      /* RANGE_START_ADDR */
    case 12: *(size_t *)data = p.size; break;                            /* RANGE_SIZE */
    case 13: *(int *)data = 1; break;                                    /* MAPPED */
    case 14:                                                             /* ALLOWED_HANDLE_TYPES */
      *(unsigned long long *)data = r->kind == R_MAPPING ? fk_phys[r->phys].handle_types : 0;
      break;
    case 16:                                                             /* ACCESS_FLAGS */
      *(unsigned *)data = r->kind == R_MAPPING ? (unsigned)(r->prot & PROT_WRITE ? 3 : r->prot ? 1 : 0) : 3;
      break;
    case 17:                                                             /* MEMPOOL_HANDLE */
      *(CUmemoryPool *)data = r->kind == R_POOL ? (void *)(uintptr_t)fk_pool_handle(r->pool) : NULL;
      break;
    default: return FK_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

static CUresult get_attribute(void *data, int attr, CUdeviceptr ptr) {
  CHECK_INIT();
  int known;
  return pointer_attribute(data, attr, ptr, &known);
}
CUresult cuPointerGetAttribute(void *data, int attr, CUdeviceptr ptr) {
  ENTER("cuPointerGetAttribute");
  RETURN(get_attribute(data, attr, ptr));
}

/* "Unlike cuPointerGetAttribute, this function will not return an error when the ptr
 * encountered is not a valid CUDA pointer. Instead, the attributes are assigned default NULL
 * values and CUDA_SUCCESS is returned." */
static CUresult get_attributes(unsigned n, int *attrs, void **data, CUdeviceptr ptr) {
  CHECK_INIT();
  if (!attrs || !data || n == 0) return FK_INVALID_VALUE;
  for (unsigned i = 0; i < n; i++) {
    int known;
    if (!data[i]) return FK_INVALID_VALUE;
    CUresult rc = pointer_attribute(data[i], attrs[i], ptr, &known);
    if (!known) {
      size_t width = attrs[i] == 2 || attrs[i] == 8 || attrs[i] == 9 || attrs[i] == 13 ||
                             attrs[i] == 10 || attrs[i] == 6 || attrs[i] == 16
                         ? 4
                         : 8;
      memset(data[i], 0, width);
      if (attrs[i] == 9) *(int *)data[i] = -2;
    } else if (rc != CUDA_SUCCESS) {
      return rc;
    }
  }
  return CUDA_SUCCESS;
}
CUresult cuPointerGetAttributes(unsigned int n, int *attrs, void **data, CUdeviceptr ptr) {
  ENTER("cuPointerGetAttributes");
  RETURN(get_attributes(n, attrs, data, ptr));
}

/* CU_POINTER_ATTRIBUTE_SYNC_MEMOPS (6), the one settable attribute: the memory's synchronous
 * copies always synchronise; set while a synchronous operation on it is pending, the call
 * waits for it. */
static CUresult set_attribute(const void *value, int attr, CUdeviceptr ptr) {
  CHECK_CTX(ctx);
  (void)ctx;
  struct fk_region *r = fk_region_holding(ptr);
  if (!value || attr != 6 || !r || !fk_is_device_kind(r->kind)) return FK_INVALID_VALUE;
  unsigned on = *(const unsigned *)value;
  if (on && fk_range_busy(r->va, r->size)) cu_sync_device(r->device);
  r->sync_memops = on != 0;
  return CUDA_SUCCESS;
}
CUresult cuPointerSetAttribute(const void *value, int attr, CUdeviceptr ptr) {
  ENTER("cuPointerSetAttribute");
  RETURN(set_attribute(value, attr, ptr));
}

/* ---- Streams ----------------------------------------------------------------------------- */

static CUresult stream_create(CUstream *ps, unsigned flags, int priority) {
  CHECK_CTX(ctx);
  if (!ps || flags > 1) return FK_INVALID_VALUE;
  /* Out-of-range priorities are clamped to [greatest, least]. */
  int greatest = cu_model->greatest_priority;
  if (priority > 0) priority = 0;
  if (priority < greatest) priority = greatest;
  unsigned long long handle = fk_stream_new(ctx, flags, priority);
  if (!handle) return FK_OUT_OF_MEMORY;
  *ps = (CUstream)(uintptr_t)handle;
  return CUDA_SUCCESS;
}
CUresult cuStreamCreate(CUstream *ps, unsigned int flags) {
  ENTER("cuStreamCreate");
  RETURN(stream_create(ps, flags, 0));
}
CUresult cuStreamCreateWithPriority(CUstream *ps, unsigned int flags, int priority) {
  ENTER("cuStreamCreateWithPriority");
  RETURN(stream_create(ps, flags, priority));
}

static CUresult stream_destroy(CUstream s) {
  CHECK_CTX(ctx);
  (void)ctx;
  int slot = fk_stream_slot((unsigned long long)(uintptr_t)s);
  if (slot < 0) return FK_INVALID_HANDLE;
  fk_stream_destroy(slot);
  return CUDA_SUCCESS;
}
CUresult cuStreamDestroy_v2(CUstream s) {
  ENTER("cuStreamDestroy_v2");
  RETURN(stream_destroy(s));
}


static CUresult stream_synchronize(CUstream s, int pt) {
  CHECK_CTX(ctx);
  CHECK_STREAM(clock, ctx, s, pt);
  if (fk_capture_sync_check(clock, 1, "cuStreamSynchronize") != FK_OK) return FK_CAPTURE_UNSUPPORTED;
  fk_wait_for_clock(clock);
  fk_pools_sync();
  return CUDA_SUCCESS;
}
CUresult cuStreamSynchronize(CUstream s) {
  ENTER("cuStreamSynchronize");
  RETURN(stream_synchronize(s, 0));
}
CUresult cuStreamSynchronize_ptsz(CUstream s) {
  ENTER("cuStreamSynchronize_ptsz");
  RETURN(stream_synchronize(s, 1));
}


static CUresult stream_query(CUstream s, int pt) {
  CHECK_CTX(ctx);
  CHECK_STREAM(clock, ctx, s, pt);
  if (fk_capture_sync_check(clock, 1, "cuStreamQuery") != FK_OK) return FK_CAPTURE_UNSUPPORTED;
  if (fk_stream_idle(clock)) return CUDA_SUCCESS;
  if (!fk_polled((unsigned long long)clock, fk_clocks[clock].recorded)) return FK_NOT_READY;
  fk_wait_for_clock(clock); /* polled long enough: fk_polled */
  return fk_stream_idle(clock) ? CUDA_SUCCESS : FK_NOT_READY;
}
CUresult cuStreamQuery(CUstream s) {
  ENTER("cuStreamQuery");
  RETURN(stream_query(s, 0));
}
CUresult cuStreamQuery_ptsz(CUstream s) {
  ENTER("cuStreamQuery_ptsz");
  RETURN(stream_query(s, 1));
}

static CUresult stream_wait_event(CUstream s, CUevent e, unsigned flags, int pt) {
  CHECK_CTX(ctx);
  CHECK_STREAM(clock, ctx, s, pt);
  struct fk_event *ev = fk_event_of((unsigned long long)(uintptr_t)e);
  if (!ev) return FK_INVALID_HANDLE;
  if (flags > 1) return FK_INVALID_VALUE;
  int handled, rc = fk_capture_wait(clock, ev, &handled);
  if (rc != FK_OK || handled) {
    if (rc == FK_OK) fk_gpu_wait_count++;
    return rc;
  }
  /* Work queued on the stream from now on waits for the event's last record. */
  fk_implicit(clock);
  if (ev->recorded) fk_wait_add(clock, ev->clock, ev->seq, 1);
  else fk_gpu_wait_count++;
  fk_progress();
  return CUDA_SUCCESS;
}
CUresult cuStreamWaitEvent(CUstream s, CUevent e, unsigned int flags) {
  ENTER("cuStreamWaitEvent");
  RETURN(stream_wait_event(s, e, flags, 0));
}
CUresult cuStreamWaitEvent_ptsz(CUstream s, CUevent e, unsigned int flags) {
  ENTER("cuStreamWaitEvent_ptsz");
  RETURN(stream_wait_event(s, e, flags, 1));
}

/* The flags and priority of a stream (the special handles: 0 / the default priority). */
static CUresult stream_get(CUstream s, unsigned *flags, int *priority, CUcontext *pctx, int pt) {
  CHECK_CTX(ctx);
  CHECK_STREAM(clock, ctx, s, pt);
  if (!flags && !priority && !pctx) return FK_INVALID_VALUE;
  int slot = fk_stream_slot((unsigned long long)(uintptr_t)s);
  if (flags) *flags = slot >= 0 ? fk_streams[slot].flags : 0;
  if (priority) *priority = slot >= 0 ? fk_streams[slot].priority : 0;
  if (pctx) *pctx = &fk_ctxs[fk_clocks[clock].ctx];
  return CUDA_SUCCESS;
}
CUresult cuStreamGetFlags(CUstream s, unsigned int *flags) {
  ENTER("cuStreamGetFlags");
  RETURN(flags ? stream_get(s, flags, NULL, NULL, 0) : FK_INVALID_VALUE);
}
CUresult cuStreamGetFlags_ptsz(CUstream s, unsigned int *flags) {
  ENTER("cuStreamGetFlags_ptsz");
  RETURN(flags ? stream_get(s, flags, NULL, NULL, 1) : FK_INVALID_VALUE);
}
CUresult cuStreamGetPriority(CUstream s, int *priority) {
  ENTER("cuStreamGetPriority");
  RETURN(priority ? stream_get(s, NULL, priority, NULL, 0) : FK_INVALID_VALUE);
}
CUresult cuStreamGetPriority_ptsz(CUstream s, int *priority) {
  ENTER("cuStreamGetPriority_ptsz");
  RETURN(priority ? stream_get(s, NULL, priority, NULL, 1) : FK_INVALID_VALUE);
}
CUresult cuStreamGetCtx(CUstream s, CUcontext *pctx) {
  ENTER("cuStreamGetCtx");
  RETURN(pctx ? stream_get(s, NULL, NULL, pctx, 0) : FK_INVALID_VALUE);
}
CUresult cuStreamGetCtx_ptsz(CUstream s, CUcontext *pctx) {
  ENTER("cuStreamGetCtx_ptsz");
  RETURN(pctx ? stream_get(s, NULL, NULL, pctx, 1) : FK_INVALID_VALUE);
}

/* A stream's id, unique for the process's life (a destroyed stream's handle value may come
 * back; its id does not): the number of its clock. */
FK_FN CUresult stream_id(CUstream s, unsigned long long *id, int pt) {
  CHECK_CTX(ctx);
  CHECK_STREAM(clock, ctx, s, pt);
  if (!id) return FK_INVALID_VALUE;
  *id = (unsigned long long)clock;
  return CUDA_SUCCESS;
}
#ifndef FAKECUDA_OLD /* newer than CUDA 10.1 */
CUresult cuStreamGetId(CUstream s, unsigned long long *id) {
  ENTER("cuStreamGetId");
  RETURN(stream_id(s, id, 0));
}
#endif
#ifndef FAKECUDA_OLD /* newer than CUDA 10.1 */
CUresult cuStreamGetId_ptsz(CUstream s, unsigned long long *id) {
  ENTER("cuStreamGetId_ptsz");
  RETURN(stream_id(s, id, 1));
}
#endif

static CUresult launch_host(CUstream s, CUhostFn fn, void *data, int pt) {
  CHECK_CTX(ctx);
  CHECK_STREAM(clock, ctx, s, pt);
  if (!fn) return FK_INVALID_VALUE;
  return fk_launch_host(clock, fn, data) ? CUDA_SUCCESS : FK_OUT_OF_MEMORY;
}
CUresult cuLaunchHostFunc(CUstream s, CUhostFn fn, void *data) {
  ENTER("cuLaunchHostFunc");
  RETURN(launch_host(s, fn, data, 0));
}
CUresult cuLaunchHostFunc_ptsz(CUstream s, CUhostFn fn, void *data) {
  ENTER("cuLaunchHostFunc_ptsz");
  RETURN(launch_host(s, fn, data, 1));
}

/* cuStreamAddCallback's callback takes the stream and a status: called through a host
 * function. */
struct callback {
  CUstreamCallback fn;
  CUstream stream;
  void *data;
};
static void run_callback(void *p) {
  struct callback *c = (struct callback *)p;
  c->fn(c->stream, CUDA_SUCCESS, c->data);
  free(c);
}
static CUresult add_callback(CUstream s, CUstreamCallback fn, void *data, unsigned flags, int pt) {
  CHECK_CTX(ctx);
  CHECK_STREAM(clock, ctx, s, pt);
  if (!fn || flags) return FK_INVALID_VALUE;
  struct callback *c = malloc(sizeof *c);
  if (!c) return FK_OUT_OF_MEMORY;
  c->fn = fn;
  c->stream = s;
  c->data = data;
  if (!fk_launch_host(clock, run_callback, c)) {
    free(c);
    return FK_OUT_OF_MEMORY;
  }
  return CUDA_SUCCESS;
}
CUresult cuStreamAddCallback(CUstream s, CUstreamCallback fn, void *data, unsigned int flags) {
  ENTER("cuStreamAddCallback");
  RETURN(add_callback(s, fn, data, flags, 0));
}
CUresult cuStreamAddCallback_ptsz(CUstream s, CUstreamCallback fn, void *data, unsigned int flags) {
  ENTER("cuStreamAddCallback_ptsz");
  RETURN(add_callback(s, fn, data, flags, 1));
}

/* ---- Events ------------------------------------------------------------------------------- */

/* CU_EVENT_BLOCKING_SYNC | DISABLE_TIMING | INTERPROCESS (which needs DISABLE_TIMING). */
static CUresult event_create(CUevent *pe, unsigned flags) {
  CHECK_CTX(ctx);
  if (!pe || (flags & ~0x7u) || ((flags & 4) && !(flags & 2))) return FK_INVALID_VALUE;
  unsigned long long handle = fk_event_new(ctx, flags);
  if (!handle) return FK_OUT_OF_MEMORY;
  *pe = (CUevent)(uintptr_t)handle;
  return CUDA_SUCCESS;
}
CUresult cuEventCreate(CUevent *pe, unsigned int flags) {
  ENTER("cuEventCreate");
  RETURN(event_create(pe, flags));
}

static CUresult event_record(CUevent e, CUstream s, int pt) {
  CHECK_CTX(ctx);
  struct fk_event *ev = fk_event_of((unsigned long long)(uintptr_t)e);
  if (!ev) return FK_INVALID_HANDLE;
  CHECK_STREAM(clock, ctx, s, pt);
  fk_event_record(ev, clock);
  return CUDA_SUCCESS;
}
CUresult cuEventRecord(CUevent e, CUstream s) {
  ENTER("cuEventRecord");
  RETURN(event_record(e, s, 0));
}
CUresult cuEventRecord_ptsz(CUevent e, CUstream s) {
  ENTER("cuEventRecord_ptsz");
  RETURN(event_record(e, s, 1));
}

/* CU_EVENT_RECORD_DEFAULT (0) or CU_EVENT_RECORD_EXTERNAL (1: meaningful only while a
 * stream is captured; outside a capture a record like any other). */
FK_FN CUresult event_record_flags(CUevent e, CUstream s, unsigned flags, int pt) {
  if (flags > 1) return FK_INVALID_VALUE;
  return event_record(e, s, pt);
}
#ifndef FAKECUDA_OLD /* newer than CUDA 10.1 */
CUresult cuEventRecordWithFlags(CUevent e, CUstream s, unsigned int flags) {
  ENTER("cuEventRecordWithFlags");
  RETURN(event_record_flags(e, s, flags, 0));
}
#endif
#ifndef FAKECUDA_OLD /* newer than CUDA 10.1 */
CUresult cuEventRecordWithFlags_ptsz(CUevent e, CUstream s, unsigned int flags) {
  ENTER("cuEventRecordWithFlags_ptsz");
  RETURN(event_record_flags(e, s, flags, 1));
}
#endif

static CUresult event_query(CUevent e) {
  CHECK_CTX(ctx);
  (void)ctx;
  struct fk_event *ev = fk_event_of((unsigned long long)(uintptr_t)e);
  if (!ev) return FK_INVALID_HANDLE;
  int captured = fk_capture_event_check(ev, "cuEventQuery");
  if (captured != FK_OK) return captured;
  if (fk_event_done(ev)) return CUDA_SUCCESS;
  if (!fk_polled((unsigned long long)(uintptr_t)e, (unsigned long long)ev->clock << 40 ^ ev->seq))
    return FK_NOT_READY;
  fk_cpu_wait(); /* polled long enough: fk_polled */
  fk_force(ev->clock, ev->seq, 0);
  return fk_event_done(ev) ? CUDA_SUCCESS : FK_NOT_READY;
}
CUresult cuEventQuery(CUevent e) {
  ENTER("cuEventQuery");
  RETURN(event_query(e));
}

static CUresult event_synchronize(CUevent e) {
  CHECK_CTX(ctx);
  (void)ctx;
  struct fk_event *ev = fk_event_of((unsigned long long)(uintptr_t)e);
  if (!ev) return FK_INVALID_HANDLE;
  int captured = fk_capture_event_check(ev, "cuEventSynchronize");
  if (captured != FK_OK) return captured;
  /* Waiting for an event waits for the work before it on its stream. */
  fk_cpu_wait();
  if (ev->recorded) fk_force(ev->clock, ev->seq, 0);
  fk_event_done(ev);
  fk_pools_sync();
  return CUDA_SUCCESS;
}
CUresult cuEventSynchronize(CUevent e) {
  ENTER("cuEventSynchronize");
  RETURN(event_synchronize(e));
}

static CUresult event_destroy(CUevent e) {
  CHECK_CTX(ctx);
  (void)ctx;
  struct fk_event *ev = fk_event_of((unsigned long long)(uintptr_t)e);
  if (!ev) return FK_INVALID_HANDLE;
  ev->serial = 0;
  return CUDA_SUCCESS;
}
CUresult cuEventDestroy_v2(CUevent e) {
  ENTER("cuEventDestroy_v2");
  RETURN(event_destroy(e));
}

/* cuda.h: never recorded, or created with CU_EVENT_DISABLE_TIMING: CUDA_ERROR_INVALID_HANDLE;
 * recorded and not complete: CUDA_ERROR_NOT_READY. */
static CUresult event_elapsed(float *ms, CUevent start, CUevent end) {
  CHECK_CTX(ctx);
  (void)ctx;
  if (!ms) return FK_INVALID_VALUE;
  struct fk_event *a = fk_event_of((unsigned long long)(uintptr_t)start);
  struct fk_event *b = fk_event_of((unsigned long long)(uintptr_t)end);
  if (!a || !b || !a->recorded || !b->recorded || (a->flags & 2) || (b->flags & 2))
    return FK_INVALID_HANDLE;
  if (!fk_event_done(a) || !fk_event_done(b)) return FK_NOT_READY;
  *ms = fk_event_ms(a, b);
  return CUDA_SUCCESS;
}
CUresult cuEventElapsedTime(float *ms, CUevent start, CUevent end) {
  ENTER("cuEventElapsedTime");
  RETURN(event_elapsed(ms, start, end));
}

/* ---- Copies ----------------------------------------------------------------------------- */

static CUresult copy(CUdeviceptr dst, int dst_side, CUdeviceptr src, int src_side, size_t n,
                     CUstream s, int pt, int wait, const char *what) {
  CHECK_CTX(ctx);
  CHECK_STREAM(clock, ctx, s, pt);
  return fk_copy(ctx, clock, dst, dst_side, src, src_side, n, wait, what);
}
#define H(p) ((CUdeviceptr)(uintptr_t)(p))

CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n) {
  ENTER("cuMemcpy");
  RETURN(copy(dst, SIDE_ANY, src, SIDE_ANY, n, NULL, 0, FK_SYNC_CUDA, "cuMemcpy"));
}
CUresult cuMemcpy_ptds(CUdeviceptr dst, CUdeviceptr src, size_t n) {
  ENTER("cuMemcpy_ptds");
  RETURN(copy(dst, SIDE_ANY, src, SIDE_ANY, n, NULL, 1, FK_SYNC_CUDA, "cuMemcpy_ptds"));
}
CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
  ENTER("cuMemcpyAsync");
  RETURN(copy(dst, SIDE_ANY, src, SIDE_ANY, n, s, 0, FK_ASYNC, "cuMemcpyAsync"));
}
CUresult cuMemcpyAsync_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
  ENTER("cuMemcpyAsync_ptsz");
  RETURN(copy(dst, SIDE_ANY, src, SIDE_ANY, n, s, 1, FK_ASYNC, "cuMemcpyAsync_ptsz"));
}
CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n) {
  ENTER("cuMemcpyHtoD_v2");
  RETURN(copy(dst, SIDE_DEVICE, H(src), SIDE_HOST, n, NULL, 0, FK_SYNC_CUDA, "cuMemcpyHtoD_v2"));
}
CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr dst, const void *src, size_t n) {
  ENTER("cuMemcpyHtoD_v2_ptds");
  RETURN(copy(dst, SIDE_DEVICE, H(src), SIDE_HOST, n, NULL, 1, FK_SYNC_CUDA, "cuMemcpyHtoD_v2_ptds"));
}
CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n) {
  ENTER("cuMemcpyDtoH_v2");
  RETURN(copy(H(dst), SIDE_HOST, src, SIDE_DEVICE, n, NULL, 0, FK_SYNC_CUDA, "cuMemcpyDtoH_v2"));
}
CUresult cuMemcpyDtoH_v2_ptds(void *dst, CUdeviceptr src, size_t n) {
  ENTER("cuMemcpyDtoH_v2_ptds");
  RETURN(copy(H(dst), SIDE_HOST, src, SIDE_DEVICE, n, NULL, 1, FK_SYNC_CUDA, "cuMemcpyDtoH_v2_ptds"));
}
CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n) {
  ENTER("cuMemcpyDtoD_v2");
  RETURN(copy(dst, SIDE_DEVICE, src, SIDE_DEVICE, n, NULL, 0, FK_SYNC_CUDA, "cuMemcpyDtoD_v2"));
}
CUresult cuMemcpyDtoD_v2_ptds(CUdeviceptr dst, CUdeviceptr src, size_t n) {
  ENTER("cuMemcpyDtoD_v2_ptds");
  RETURN(copy(dst, SIDE_DEVICE, src, SIDE_DEVICE, n, NULL, 1, FK_SYNC_CUDA, "cuMemcpyDtoD_v2_ptds"));
}
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream s) {
  ENTER("cuMemcpyHtoDAsync_v2");
  RETURN(copy(dst, SIDE_DEVICE, H(src), SIDE_HOST, n, s, 0, FK_ASYNC, "cuMemcpyHtoDAsync_v2"));
}
CUresult cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr dst, const void *src, size_t n, CUstream s) {
  ENTER("cuMemcpyHtoDAsync_v2_ptsz");
  RETURN(copy(dst, SIDE_DEVICE, H(src), SIDE_HOST, n, s, 1, FK_ASYNC, "cuMemcpyHtoDAsync_v2_ptsz"));
}
CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, CUstream s) {
  ENTER("cuMemcpyDtoHAsync_v2");
  RETURN(copy(H(dst), SIDE_HOST, src, SIDE_DEVICE, n, s, 0, FK_ASYNC, "cuMemcpyDtoHAsync_v2"));
}
CUresult cuMemcpyDtoHAsync_v2_ptsz(void *dst, CUdeviceptr src, size_t n, CUstream s) {
  ENTER("cuMemcpyDtoHAsync_v2_ptsz");
  RETURN(copy(H(dst), SIDE_HOST, src, SIDE_DEVICE, n, s, 1, FK_ASYNC, "cuMemcpyDtoHAsync_v2_ptsz"));
}
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
  ENTER("cuMemcpyDtoDAsync_v2");
  RETURN(copy(dst, SIDE_DEVICE, src, SIDE_DEVICE, n, s, 0, FK_ASYNC, "cuMemcpyDtoDAsync_v2"));
}
CUresult cuMemcpyDtoDAsync_v2_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
  ENTER("cuMemcpyDtoDAsync_v2_ptsz");
  RETURN(copy(dst, SIDE_DEVICE, src, SIDE_DEVICE, n, s, 1, FK_ASYNC, "cuMemcpyDtoDAsync_v2_ptsz"));
}

/* ---- Memsets ----------------------------------------------------------------------------
 * "API synchronization behavior": the synchronous memsets are "asynchronous with respect to
 * the host except when the target is pinned host memory or a Unified Memory region, in which
 * case they are fully synchronous"; the ...Async ones are asynchronous. */

/* How a synchronous memset over [dst, dst + span) waits. */
static int memset_wait(CUdeviceptr dst, unsigned long long span, int sync) {
  if (!sync) return FK_ASYNC;
  const struct fk_region *r = fk_region_holding(dst);
  return fk_pinned_range(dst, span) || (r && r->kind == R_MANAGED) ? FK_SYNC_FULL : FK_ASYNC;
}

static CUresult memset_on(CUdeviceptr dst, unsigned value, int width, size_t n, CUstream s, int pt,
                          int sync, const char *what) {
  CHECK_CTX(ctx);
  CHECK_STREAM(clock, ctx, s, pt);
  int wait = memset_wait(dst, (unsigned long long)n * (unsigned)width, sync);
  return fk_memset(ctx, clock, dst, value, width, n, wait, what);
}
#define MEMSET(name, type, width, pt)                                        \
  CUresult name(CUdeviceptr dst, type value, size_t n) {                     \
    ENTER(#name);                                                            \
    RETURN(memset_on(dst, (unsigned)value, width, n, NULL, pt, 1, #name));   \
  }
#define MEMSET_ASYNC(name, type, width, pt)                                  \
  CUresult name(CUdeviceptr dst, type value, size_t n, CUstream s) {         \
    ENTER(#name);                                                            \
    RETURN(memset_on(dst, (unsigned)value, width, n, s, pt, 0, #name));      \
  }
MEMSET(cuMemsetD8_v2, unsigned char, 1, 0)
MEMSET(cuMemsetD8_v2_ptds, unsigned char, 1, 1)
MEMSET(cuMemsetD16_v2, unsigned short, 2, 0)
MEMSET(cuMemsetD16_v2_ptds, unsigned short, 2, 1)
MEMSET(cuMemsetD32_v2, unsigned int, 4, 0)
MEMSET(cuMemsetD32_v2_ptds, unsigned int, 4, 1)
MEMSET_ASYNC(cuMemsetD8Async, unsigned char, 1, 0)
MEMSET_ASYNC(cuMemsetD8Async_ptsz, unsigned char, 1, 1)
MEMSET_ASYNC(cuMemsetD16Async, unsigned short, 2, 0)
MEMSET_ASYNC(cuMemsetD16Async_ptsz, unsigned short, 2, 1)
MEMSET_ASYNC(cuMemsetD32Async, unsigned int, 4, 0)
MEMSET_ASYNC(cuMemsetD32Async_ptsz, unsigned int, 4, 1)

/* ---- Peer copies ------------------------------------------------------------------------
 * cuMemcpyPeerAsync is ordered on its stream only. cuMemcpyPeer "is asynchronous with
 * respect to the host, but serialized with respect to all pending ... asynchronous work" on
 * the current, source and destination devices: on the current context's legacy stream,
 * after a GPU-side wait for everything queued on those devices. (Work queued later on the
 * peers is not held behind it.) */

static CUresult copy_peer(CUdeviceptr dst, CUcontext dst_ctx, CUdeviceptr src, CUcontext src_ctx,
                          size_t n, CUstream s, int pt, int async, const char *what) {
  CHECK_CTX(ctx);
  CHECK_STREAM(clock, ctx, s, pt);
  int d = cu_ctx_index(dst_ctx), c = cu_ctx_index(src_ctx);
  if (d < 0 || c < 0 || !cu_ctx_usable(d) || !cu_ctx_usable(c)) return FK_INVALID_CONTEXT;
  int dst_device = fk_ctxs[d].device, src_device = fk_ctxs[c].device;
  if (!n) return CUDA_SUCCESS;
  if (!fk_device_range(dst, n, dst_device) || !fk_device_range(src, n, src_device))
    return FK_INVALID_VALUE;
  const struct fk_region *dr = fk_region_holding(dst), *sr = fk_region_holding(src);
  if (!dr || !sr || dr->device != dst_device || sr->device != src_device) return FK_INVALID_VALUE;
  if (!async) {
    for (int k = 1; k < fk_n_clocks; k++) {
      int device = fk_ctxs[fk_clocks[k].ctx].device;
      if (k != clock && (device == dst_device || device == src_device ||
                         device == fk_ctxs[ctx].device))
        fk_wait_add(clock, k, fk_clocks[k].recorded, 0);
    }
  }
  return fk_copy_2d(clock, dst_device, dst, n, SIDE_DEVICE, src_device, src, n, SIDE_DEVICE, n,
                    1, async ? FK_ASYNC : FK_SYNC_CUDA, (fk_ctxs[ctx].flags & 0x80) != 0, what);
}
CUresult cuMemcpyPeer(CUdeviceptr dst, CUcontext dst_ctx, CUdeviceptr src, CUcontext src_ctx,
                      size_t n) {
  ENTER("cuMemcpyPeer");
  RETURN(copy_peer(dst, dst_ctx, src, src_ctx, n, NULL, 0, 0, "cuMemcpyPeer"));
}
CUresult cuMemcpyPeer_ptds(CUdeviceptr dst, CUcontext dst_ctx, CUdeviceptr src, CUcontext src_ctx,
                           size_t n) {
  ENTER("cuMemcpyPeer_ptds");
  RETURN(copy_peer(dst, dst_ctx, src, src_ctx, n, NULL, 1, 0, "cuMemcpyPeer_ptds"));
}
CUresult cuMemcpyPeerAsync(CUdeviceptr dst, CUcontext dst_ctx, CUdeviceptr src,
                           CUcontext src_ctx, size_t n, CUstream s) {
  ENTER("cuMemcpyPeerAsync");
  RETURN(copy_peer(dst, dst_ctx, src, src_ctx, n, s, 0, 1, "cuMemcpyPeerAsync"));
}
CUresult cuMemcpyPeerAsync_ptsz(CUdeviceptr dst, CUcontext dst_ctx, CUdeviceptr src,
                                CUcontext src_ctx, size_t n, CUstream s) {
  ENTER("cuMemcpyPeerAsync_ptsz");
  RETURN(copy_peer(dst, dst_ctx, src, src_ctx, n, s, 1, 1, "cuMemcpyPeerAsync_ptsz"));
}

/* ---- 2D copies and memsets ----------------------------------------------------------------- */

/* CUDA_MEMCPY2D, as cuda.h lays it out (128 bytes). */
typedef struct {
  size_t srcXInBytes, srcY;
  unsigned int srcMemoryType;
  const void *srcHost;
  CUdeviceptr srcDevice;
  void *srcArray;
  size_t srcPitch;
  size_t dstXInBytes, dstY;
  unsigned int dstMemoryType;
  void *dstHost;
  CUdeviceptr dstDevice;
  void *dstArray;
  size_t dstPitch;
  size_t WidthInBytes, Height;
} CUDA_MEMCPY2D;
_Static_assert(sizeof(CUDA_MEMCPY2D) == 128, "CUDA_MEMCPY2D is 128 bytes");

/* One side of a 2D copy: its start and side from CUmemorytype (HOST 1, DEVICE 2, UNIFIED 4;
 * ARRAY 3: the fake makes no arrays, so no array handle is valid). 0 when invalid. */
static int copy_side(unsigned type, const void *host, CUdeviceptr device, size_t x, size_t y,
                     size_t pitch, unsigned long long *start, int *side) {
  unsigned long long base = type == 1 ? (unsigned long long)(uintptr_t)host : device;
  if ((type != 1 && type != 2 && type != 4) || !base) return 0;
  if (y && pitch && y > (~0ULL - base - x) / pitch) return 0;
  *start = base + y * pitch + x;
  *side = type == 1 ? SIDE_HOST : type == 2 ? SIDE_DEVICE : SIDE_ANY;
  return 1;
}

/* `aligned`: cuMemcpy2D's pitch limit (CU_DEVICE_ATTRIBUTE_MAX_PITCH; cuMemcpy2DUnaligned has
 * none). A pitch "must be greater than or equal to WidthInBytes + XInBytes". */
static CUresult copy_2d(const CUDA_MEMCPY2D *c, CUstream s, int pt, int async, int aligned,
                        const char *what) {
  CHECK_CTX(ctx);
  CHECK_STREAM(clock, ctx, s, pt);
  if (!c) return FK_INVALID_VALUE;
  if (!c->WidthInBytes || !c->Height) return CUDA_SUCCESS;
  size_t spitch = c->srcPitch ? c->srcPitch : c->WidthInBytes + c->srcXInBytes;
  size_t dpitch = c->dstPitch ? c->dstPitch : c->WidthInBytes + c->dstXInBytes;
  if ((c->Height > 1 && (!c->srcPitch || !c->dstPitch)) ||
      spitch < c->WidthInBytes + c->srcXInBytes || dpitch < c->WidthInBytes + c->dstXInBytes)
    return FK_INVALID_VALUE;
  unsigned long long max_pitch = (unsigned long long)cu_attributes[fk_ctxs[ctx].device][11];
  if (aligned && (spitch > max_pitch || dpitch > max_pitch)) return FK_INVALID_VALUE;
  unsigned long long src, dst;
  int src_side, dst_side;
  if (!copy_side(c->srcMemoryType, c->srcHost, c->srcDevice, c->srcXInBytes, c->srcY, spitch,
                 &src, &src_side) ||
      !copy_side(c->dstMemoryType, c->dstHost, c->dstDevice, c->dstXInBytes, c->dstY, dpitch,
                 &dst, &dst_side))
    return FK_INVALID_VALUE;
  int device = fk_ctxs[ctx].device;
  return fk_copy_2d(clock, device, dst, dpitch, dst_side, device, src, spitch, src_side,
                    c->WidthInBytes, c->Height, async ? FK_ASYNC : FK_SYNC_CUDA,
                    (fk_ctxs[ctx].flags & 0x80) != 0, what);
}
CUresult cuMemcpy2D_v2(const CUDA_MEMCPY2D *c) {
  ENTER("cuMemcpy2D_v2");
  RETURN(copy_2d(c, NULL, 0, 0, 1, "cuMemcpy2D_v2"));
}
CUresult cuMemcpy2D_v2_ptds(const CUDA_MEMCPY2D *c) {
  ENTER("cuMemcpy2D_v2_ptds");
  RETURN(copy_2d(c, NULL, 1, 0, 1, "cuMemcpy2D_v2_ptds"));
}
CUresult cuMemcpy2DUnaligned_v2(const CUDA_MEMCPY2D *c) {
  ENTER("cuMemcpy2DUnaligned_v2");
  RETURN(copy_2d(c, NULL, 0, 0, 0, "cuMemcpy2DUnaligned_v2"));
}
CUresult cuMemcpy2DUnaligned_v2_ptds(const CUDA_MEMCPY2D *c) {
  ENTER("cuMemcpy2DUnaligned_v2_ptds");
  RETURN(copy_2d(c, NULL, 1, 0, 0, "cuMemcpy2DUnaligned_v2_ptds"));
}
CUresult cuMemcpy2DAsync_v2(const CUDA_MEMCPY2D *c, CUstream s) {
  ENTER("cuMemcpy2DAsync_v2");
  RETURN(copy_2d(c, s, 0, 1, 1, "cuMemcpy2DAsync_v2"));
}
CUresult cuMemcpy2DAsync_v2_ptsz(const CUDA_MEMCPY2D *c, CUstream s) {
  ENTER("cuMemcpy2DAsync_v2_ptsz");
  RETURN(copy_2d(c, s, 1, 1, 1, "cuMemcpy2DAsync_v2_ptsz"));
}

/* cuMemsetD2D8/16/32: `height` rows of `width` elements, `pitch` bytes apart. */
static CUresult memset_2d(CUdeviceptr dst, size_t pitch, unsigned value, int width, size_t count,
                          size_t height, CUstream s, int pt, int sync, const char *what) {
  CHECK_CTX(ctx);
  CHECK_STREAM(clock, ctx, s, pt);
  if (height > 1 && pitch > (unsigned long long)cu_attributes[fk_ctxs[ctx].device][11])
    return FK_INVALID_VALUE;
  int wait = memset_wait(dst, fk_rows_span((unsigned long long)count * (unsigned)width, height, pitch), sync);
  return fk_memset_2d(ctx, clock, dst, pitch, value, width, count, height, wait, what);
}
#define MEMSET_2D(name, type, width, pt)                                                      \
  CUresult name(CUdeviceptr dst, size_t pitch, type value, size_t count, size_t height) {     \
    ENTER(#name);                                                                             \
    RETURN(memset_2d(dst, pitch, (unsigned)value, width, count, height, NULL, pt, 1, #name)); \
  }
#define MEMSET_2D_ASYNC(name, type, width, pt)                                                \
  CUresult name(CUdeviceptr dst, size_t pitch, type value, size_t count, size_t height,       \
                CUstream s) {                                                                 \
    ENTER(#name);                                                                             \
    RETURN(memset_2d(dst, pitch, (unsigned)value, width, count, height, s, pt, 0, #name));    \
  }
MEMSET_2D(cuMemsetD2D8_v2, unsigned char, 1, 0)
MEMSET_2D(cuMemsetD2D8_v2_ptds, unsigned char, 1, 1)
MEMSET_2D(cuMemsetD2D16_v2, unsigned short, 2, 0)
MEMSET_2D(cuMemsetD2D16_v2_ptds, unsigned short, 2, 1)
MEMSET_2D(cuMemsetD2D32_v2, unsigned int, 4, 0)
MEMSET_2D(cuMemsetD2D32_v2_ptds, unsigned int, 4, 1)
MEMSET_2D_ASYNC(cuMemsetD2D8Async, unsigned char, 1, 0)
MEMSET_2D_ASYNC(cuMemsetD2D8Async_ptsz, unsigned char, 1, 1)
MEMSET_2D_ASYNC(cuMemsetD2D16Async, unsigned short, 2, 0)
MEMSET_2D_ASYNC(cuMemsetD2D16Async_ptsz, unsigned short, 2, 1)
MEMSET_2D_ASYNC(cuMemsetD2D32Async, unsigned int, 4, 0)
MEMSET_2D_ASYNC(cuMemsetD2D32Async_ptsz, unsigned int, 4, 1)

/* ---- Modules and launches -------------------------------------------------------------- */

/* An image of `size` bytes (0: not told): PTX, a cubin (EM_CUDA) or a fatbin. */
static CUresult module_load_sized(CUmodule *m, const void *image, unsigned long long size) {
  CHECK_CTX(ctx);
  if (!m || !image) return FK_INVALID_VALUE;
  int code;
  unsigned long long handle = fk_module_load(ctx, image, size, FK_EM_CUDA, 1, &code);
  if (handle) *m = (CUmodule)(uintptr_t)handle;
  return code;
}
static CUresult module_load(CUmodule *m, const void *image) {
  return module_load_sized(m, image, 0);
}
CUresult cuModuleLoadData(CUmodule *m, const void *image) {
  ENTER("cuModuleLoadData");
  RETURN(module_load(m, image));
}
CUresult cuModuleLoadDataEx(CUmodule *m, const void *image, unsigned int n, int *options,
                            void **values) {
  ENTER("cuModuleLoadDataEx");
  (void)options;
  (void)values;
  (void)n;
  RETURN(module_load(m, image));
}

/* A module from a file: its bytes, as cuModuleLoadData takes them. */
static CUresult module_load_file(CUmodule *m, const char *path) {
  CHECK_CTX(ctx);
  (void)ctx;
  if (!m || !path) return FK_INVALID_VALUE;
  int code;
  unsigned long long size;
  char *bytes = fk_read_file(path, &size, &code);
  if (!bytes) return code == FK_NOT_FOUND ? 301 /* CUDA_ERROR_FILE_NOT_FOUND */ : code;
  CUresult rc = module_load_sized(m, bytes, size ? size : 1);
  free(bytes);
  return rc;
}
CUresult cuModuleLoad(CUmodule *m, const char *path) {
  ENTER("cuModuleLoad");
  RETURN(module_load_file(m, path));
}

static CUresult module_function(CUfunction *f, CUmodule m, const char *name) {
  CHECK_CTX(ctx);
  (void)ctx;
  if (!f || !name) return FK_INVALID_VALUE;
  int code;
  unsigned long long handle = fk_function_get((unsigned long long)(uintptr_t)m, name, &code);
  if (handle) *f = (CUfunction)(uintptr_t)handle;
  return code;
}
CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name) {
  ENTER("cuModuleGetFunction");
  RETURN(module_function(f, m, name));
}

static CUresult module_unload(CUmodule m) {
  CHECK_CTX(ctx);
  (void)ctx;
  return fk_module_unload((unsigned long long)(uintptr_t)m);
}
CUresult cuModuleUnload(CUmodule m) {
  ENTER("cuModuleUnload");
  RETURN(module_unload(m));
}

/* A fat binary (cuModuleLoadFatBinary): loaded as cuModuleLoadData loads any image. */
CUresult cuModuleLoadFatBinary(CUmodule *m, const void *image) {
  ENTER("cuModuleLoadFatBinary");
  RETURN(module_load(m, image));
}

/* "One of the parameters dptr or bytes (not both) can be NULL." */
static CUresult module_global(CUdeviceptr *dptr, size_t *bytes, CUmodule m, const char *name) {
  CHECK_CTX(ctx);
  (void)ctx;
  if ((!dptr && !bytes) || !name) return FK_INVALID_VALUE;
  unsigned long long va, size;
  int rc = fk_module_global((unsigned long long)(uintptr_t)m, name, &va, &size);
  if (rc != FK_OK) return rc;
  if (dptr) *dptr = va;
  if (bytes) *bytes = size;
  return CUDA_SUCCESS;
}
CUresult cuModuleGetGlobal_v2(CUdeviceptr *dptr, size_t *bytes, CUmodule m, const char *name) {
  ENTER("cuModuleGetGlobal_v2");
  RETURN(module_global(dptr, bytes, m, name));
}

FK_FN CUresult function_module(CUmodule *m, CUfunction f) {
  CHECK_CTX(ctx);
  (void)ctx;
  if (!m) return FK_INVALID_VALUE;
  const struct fk_function *fn = fk_function_of((unsigned long long)(uintptr_t)f);
  if (!fn) return FK_INVALID_HANDLE;
  *m = (CUmodule)(uintptr_t)(FK_MODULE_BASE + 16 * fk_modules[fn->module].serial);
  return CUDA_SUCCESS;
}
#ifndef FAKECUDA_OLD /* newer than CUDA 10.1 */
CUresult cuFuncGetModule(CUmodule *m, CUfunction f) {
  ENTER("cuFuncGetModule");
  RETURN(function_module(m, f));
}
#endif

/* The most dynamic shared memory a launch of `fn` may ask for: what cuFuncSetAttribute set,
 * else the device's shared memory per block (no static shared memory: FK_FN_REGS's note). */
static int max_dynamic_shared(const struct fk_function *fn, int device) {
  return fn->max_dynamic_shared >= 0 ? fn->max_dynamic_shared : cu_attributes[device][8];
}

/* CU_FUNC_ATTRIBUTE_*, 0-9 and (CUDA 12 on compute capability 9.0) the cluster ones, 10-15. */
static CUresult function_attribute(int *value, int attr, CUfunction f) {
  CHECK_CTX(ctx);
  if (!value) return FK_INVALID_VALUE;
  const struct fk_function *fn = fk_function_of((unsigned long long)(uintptr_t)f);
  if (!fn) return FK_INVALID_HANDLE;
  const int *a = cu_attributes[fk_ctxs[ctx].device];
  int clusters = cu_version >= 12000 && a[75] >= 9;
  switch (attr) {
    case 0: *value = a[1]; break;                            /* MAX_THREADS_PER_BLOCK */
    case 1: case 2: case 3: *value = 0; break;               /* SHARED, CONST, LOCAL_SIZE_BYTES */
    case 4: *value = FK_FN_REGS; break;                      /* NUM_REGS */
    case 5: case 6: *value = a[75] * 10 + a[76]; break;      /* PTX_VERSION, BINARY_VERSION */
    case 7: *value = 0; break;                               /* CACHE_MODE_CA */
    case 8: *value = max_dynamic_shared(fn, fk_ctxs[ctx].device); break;
    case 9: *value = fn->carveout; break;                    /* PREFERRED_SHARED_MEMORY_CARVEOUT */
    case 10: case 11: case 12: case 13: case 14: case 15:    /* the cluster attributes */
      if (!clusters) return FK_INVALID_VALUE;
      *value = 0;
      break;
    default: return FK_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}
CUresult cuFuncGetAttribute(int *value, int attr, CUfunction f) {
  ENTER("cuFuncGetAttribute");
  RETURN(function_attribute(value, attr, f));
}

/* MAX_DYNAMIC_SHARED_SIZE_BYTES (8): at most the device's opt-in shared memory per block
 * (attribute 97); PREFERRED_SHARED_MEMORY_CARVEOUT (9): -1 (the default) to 100 percent.
 * Other attributes are read-only (CUDA_ERROR_INVALID_VALUE). */
static CUresult function_set_attribute(CUfunction f, int attr, int value) {
  CHECK_CTX(ctx);
  struct fk_function *fn = fk_function_of((unsigned long long)(uintptr_t)f);
  if (!fn) return FK_INVALID_HANDLE;
  int optin = cu_attributes[fk_ctxs[ctx].device][97];
  if (attr == 8 && value >= 0 && value <= (optin ? optin : cu_attributes[fk_ctxs[ctx].device][8]))
    fn->max_dynamic_shared = value;
  else if (attr == 9 && value >= -1 && value <= 100)
    fn->carveout = value;
  else
    return FK_INVALID_VALUE;
  return CUDA_SUCCESS;
}
CUresult cuFuncSetAttribute(CUfunction f, int attr, int value) {
  ENTER("cuFuncSetAttribute");
  RETURN(function_set_attribute(f, attr, value));
}

static CUresult function_cache_config(CUfunction f, int config) {
  CHECK_CTX(ctx);
  (void)ctx;
  struct fk_function *fn = fk_function_of((unsigned long long)(uintptr_t)f);
  if (!fn) return FK_INVALID_HANDLE;
  if (config < 0 || config > 3) return FK_INVALID_VALUE;
  fn->cache_config = config;
  return CUDA_SUCCESS;
}
CUresult cuFuncSetCacheConfig(CUfunction f, int config) {
  ENTER("cuFuncSetCacheConfig");
  RETURN(function_cache_config(f, config));
}

/* ---- Occupancy ----------------------------------------------------------------------------- */

/* A multiprocessor of `device` as function `fn` may use it. */
static struct fk_sm_limits sm_limits(int device, const struct fk_function *fn) {
  const int *a = cu_attributes[device];
  struct fk_sm_limits l = {a[10], a[1], a[39], a[106], a[82], a[81], a[16],
                           (unsigned long long)max_dynamic_shared(fn, device)};
  return l;
}

static CUresult occupancy(int *blocks, CUfunction f, int block, size_t dynamic, unsigned flags) {
  CHECK_CTX(ctx);
  if (!blocks || flags > 1) return FK_INVALID_VALUE;
  const struct fk_function *fn = fk_function_of((unsigned long long)(uintptr_t)f);
  if (!fn) return FK_INVALID_HANDLE;
  struct fk_sm_limits l = sm_limits(fk_ctxs[ctx].device, fn);
  *blocks = fk_blocks_per_sm(&l, block, dynamic);
  return CUDA_SUCCESS;
}
CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int *blocks, CUfunction f, int block,
                                                     size_t dynamic) {
  ENTER("cuOccupancyMaxActiveBlocksPerMultiprocessor");
  RETURN(occupancy(blocks, f, block, dynamic, 0));
}
CUresult cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int *blocks, CUfunction f, int block,
                                                              size_t dynamic, unsigned int flags) {
  ENTER("cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags");
  RETURN(occupancy(blocks, f, block, dynamic, flags));
}

/* CUoccupancyB2DSize: the dynamic shared memory a block of the size given uses. The callback
 * runs under the driver's lock, as the fake's host functions do (a driver call from it is
 * CUDA_ERROR_NOT_PERMITTED). */
typedef size_t (*CUoccupancyB2DSize)(int);
static CUoccupancyB2DSize occupancy_callback;
static unsigned long long call_occupancy_callback(int block) {
  fk_t_in_callback = 1; /* driver calls from it are refused, as from a host function */
  unsigned long long bytes = (unsigned long long)occupancy_callback(block);
  fk_t_in_callback = 0;
  return bytes;
}
static CUresult potential_block(int *grid, int *block, CUfunction f, CUoccupancyB2DSize b2d,
                                size_t dynamic, int limit, unsigned flags) {
  CHECK_CTX(ctx);
  if (!grid || !block || flags > 1 || limit < 0) return FK_INVALID_VALUE;
  const struct fk_function *fn = fk_function_of((unsigned long long)(uintptr_t)f);
  if (!fn) return FK_INVALID_HANDLE;
  struct fk_sm_limits l = sm_limits(fk_ctxs[ctx].device, fn);
  occupancy_callback = b2d;
  fk_best_block(&l, limit, b2d ? call_occupancy_callback : NULL, dynamic, grid, block);
  return CUDA_SUCCESS;
}
CUresult cuOccupancyMaxPotentialBlockSize(int *grid, int *block, CUfunction f,
                                          CUoccupancyB2DSize b2d, size_t dynamic, int limit) {
  ENTER("cuOccupancyMaxPotentialBlockSize");
  RETURN(potential_block(grid, block, f, b2d, dynamic, limit, 0));
}
CUresult cuOccupancyMaxPotentialBlockSizeWithFlags(int *grid, int *block, CUfunction f,
                                                   CUoccupancyB2DSize b2d, size_t dynamic,
                                                   int limit, unsigned int flags) {
  ENTER("cuOccupancyMaxPotentialBlockSizeWithFlags");
  RETURN(potential_block(grid, block, f, b2d, dynamic, limit, flags));
}

/* ---- Launches ------------------------------------------------------------------------------
 * A launch is checked as the driver checks it — grid and block within the device's limits,
 * dynamic shared memory within the function's limit (above the device's 48 KiB a block only
 * after cuFuncSetAttribute raised it), kernelParams or extra, not both — and queued as a
 * kernel in flight (fake_modules.h). A cooperative launch also needs the device's cooperative
 * launch attribute and a grid that fits on the device at once. */

static CUresult launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                       unsigned bz, unsigned shared, CUstream s, void **params, void **extra,
                       int pt, int cooperative) {
  CHECK_CTX(ctx);
  struct fk_function *fn = fk_function_of((unsigned long long)(uintptr_t)f);
  if (!fn) return FK_INVALID_HANDLE;
  CHECK_STREAM(clock, ctx, s, pt);
  int device = fk_ctxs[ctx].device;
  const int *a = cu_attributes[device];
  if (!gx || !gy || !gz || !bx || !by || !bz || gx > (unsigned)a[5] || gy > (unsigned)a[6] ||
      gz > (unsigned)a[7] || bx > (unsigned)a[2] || by > (unsigned)a[3] || bz > (unsigned)a[4] ||
      (unsigned long long)bx * by * bz > (unsigned long long)a[1] || (params && extra))
    return FK_INVALID_VALUE;
  if (shared > (unsigned)max_dynamic_shared(fn, device)) return FK_INVALID_VALUE;
  if (cooperative) {
    if (!a[95]) return FK_NOT_SUPPORTED;
    struct fk_sm_limits l = sm_limits(device, fn);
    unsigned long long fits =
        (unsigned long long)fk_blocks_per_sm(&l, (int)(bx * by * bz), shared) * (unsigned)a[16];
    if ((unsigned long long)gx * gy * gz > fits) return 720; /* COOPERATIVE_LAUNCH_TOO_LARGE */
  }
  return fk_launch(ctx, clock, fn->name, params) ? CUDA_SUCCESS : FK_OUT_OF_MEMORY;
}
CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                        unsigned int bx, unsigned int by, unsigned int bz, unsigned int shared,
                        CUstream s, void **params, void **extra) {
  ENTER("cuLaunchKernel");
  RETURN(launch(f, gx, gy, gz, bx, by, bz, shared, s, params, extra, 0, 0));
}
CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                             unsigned int bx, unsigned int by, unsigned int bz, unsigned int shared,
                             CUstream s, void **params, void **extra) {
  ENTER("cuLaunchKernel_ptsz");
  RETURN(launch(f, gx, gy, gz, bx, by, bz, shared, s, params, extra, 1, 0));
}
CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                                   unsigned int bx, unsigned int by, unsigned int bz,
                                   unsigned int shared, CUstream s, void **params) {
  ENTER("cuLaunchCooperativeKernel");
  RETURN(launch(f, gx, gy, gz, bx, by, bz, shared, s, params, NULL, 0, 1));
}
CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy,
                                        unsigned int gz, unsigned int bx, unsigned int by,
                                        unsigned int bz, unsigned int shared, CUstream s,
                                        void **params) {
  ENTER("cuLaunchCooperativeKernel_ptsz");
  RETURN(launch(f, gx, gy, gz, bx, by, bz, shared, s, params, NULL, 1, 1));
}

/* ---- Legacy IPC (CUDA 4.1; fake_ipc.h) ------------------------------------------------------ */

/* CUipcMemHandle: 64 opaque bytes, passed by value. */
typedef struct {
  unsigned char reserved[FK_IPC_HANDLE_BYTES];
} CUipcMemHandle;
#define CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS 1u

static CUresult ipc_get(CUipcMemHandle *h, CUdeviceptr p) {
  CHECK_CTX(ctx);
  (void)ctx;
  if (!h) return FK_INVALID_VALUE;
  return fk_ipc_get(p, h->reserved);
}
CUresult cuIpcGetMemHandle(CUipcMemHandle *h, CUdeviceptr p) {
  ENTER("cuIpcGetMemHandle");
  RETURN(ipc_get(h, p));
}

static CUresult ipc_open(CUdeviceptr *p, const CUipcMemHandle *h, unsigned flags) {
  CHECK_CTX(ctx);
  if (!p) return FK_INVALID_VALUE;
  return fk_ipc_open(ctx, fk_ctxs[ctx].device, h->reserved, flags, p);
}
/* cuda.h maps cuIpcOpenMemHandle to _v2 from CUDA 11.0; the two take the same arguments. */
CUresult cuIpcOpenMemHandle(CUdeviceptr *p, CUipcMemHandle h, unsigned int flags) {
  ENTER("cuIpcOpenMemHandle");
  RETURN(ipc_open(p, &h, flags));
}
CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *p, CUipcMemHandle h, unsigned int flags) {
  ENTER("cuIpcOpenMemHandle_v2");
  RETURN(ipc_open(p, &h, flags));
}

static CUresult ipc_close(CUdeviceptr p) {
  CHECK_CTX(ctx);
  (void)ctx;
  return fk_ipc_close(p, "cuIpcCloseMemHandle");
}
CUresult cuIpcCloseMemHandle(CUdeviceptr p) {
  ENTER("cuIpcCloseMemHandle");
  RETURN(ipc_close(p));
}

#ifndef FAKECUDA_OLD
/* ---- Virtual memory (CUDA 10.2) ------------------------------------------------------------ */

static int location_ok(const CUmemLocation *l) {
  return l->type == 1 /* CU_MEM_LOCATION_TYPE_DEVICE */ && l->id >= 0 && l->id < fk_n_devices;
}

static CUresult granularity(size_t *g, const CUmemAllocationProp *prop, unsigned option) {
  CHECK_INIT();
  if (!g || !prop || option > 1 || prop->type != 1 || !location_ok(&prop->location))
    return FK_INVALID_VALUE;
  *g = fk_min_gran;
  return CUDA_SUCCESS;
}
CUresult cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *prop,
                                       unsigned int option) {
  ENTER("cuMemGetAllocationGranularity");
  RETURN(granularity(g, prop, option));
}

/* CUmemAllocationHandleType: NONE 0, POSIX_FILE_DESCRIPTOR 1, WIN32 2, WIN32_KMT 4,
 * FABRIC 8 (CUDA 12.3). */
#define CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR 1u
#define CU_MEM_HANDLE_TYPE_FABRIC 8u

/* requestedHandleTypes: none or POSIX_FD (exportable, fake_ipc.h). FABRIC is refused with
 * CUDA_ERROR_NOT_SUPPORTED, as on a system without fabric (IMEX) support — the impersonated
 * devices report CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED 0; where the device has it
 * but the process has no IMEX channel, the driver answers CUDA_ERROR_NOT_PERMITTED instead
 * (microsoft/mscclpp#467, MoonshotAI/MoonEP#28), and callers probe for both
 * (pytorch/pytorch#156074). Windows types, and unknown bits, are invalid values. */
static CUresult mem_create(CUmemGenericAllocationHandle *out, size_t size,
                           const CUmemAllocationProp *prop, unsigned long long flags) {
  CHECK_CTX(ctx);
  (void)ctx;
  if (!out || !prop || flags || size == 0 || size % fk_min_gran || prop->type != 1 ||
      !location_ok(&prop->location) ||
      (prop->requestedHandleTypes & ~(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR |
                                      CU_MEM_HANDLE_TYPE_FABRIC)))
    return FK_INVALID_VALUE;
  if (prop->requestedHandleTypes & CU_MEM_HANDLE_TYPE_FABRIC) return FK_NOT_SUPPORTED;
  int code;
  unsigned long long h = fk_phys_create(prop->location.id, size, prop->requestedHandleTypes, &code);
  if (h) *out = h;
  return code;
}
CUresult cuMemCreate(CUmemGenericAllocationHandle *out, size_t size, const CUmemAllocationProp *prop,
                     unsigned long long flags) {
  ENTER("cuMemCreate");
  RETURN(mem_create(out, size, prop, flags));
}

static CUresult mem_release(CUmemGenericAllocationHandle h) {
  CHECK_CTX(ctx);
  (void)ctx;
  return fk_phys_release(h);
}
CUresult cuMemRelease(CUmemGenericAllocationHandle h) {
  ENTER("cuMemRelease");
  RETURN(mem_release(h));
}

/* A new descriptor of the handle's memory (the caller's to close): only for a handle created
 * with POSIX_FD requested, only of that type, flags 0 ("reserved, must be zero"). */
static CUresult export_handle(void *shareable, CUmemGenericAllocationHandle h, unsigned type,
                              unsigned long long flags) {
  CHECK_CTX(ctx);
  (void)ctx;
  if (!shareable || flags || type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
    return FK_INVALID_VALUE;
  return fk_phys_export(h, (int *)shareable);
}
CUresult cuMemExportToShareableHandle(void *shareable, CUmemGenericAllocationHandle h,
                                      unsigned int type, unsigned long long flags) {
  ENTER("cuMemExportToShareableHandle");
  RETURN(export_handle(shareable, h, type, flags));
}

/* For POSIX_FD `os_handle` is the descriptor's value cast to a pointer; the import holds a
 * descriptor of its own, so the caller may close its one at once. */
static CUresult import_handle(CUmemGenericAllocationHandle *out, void *os_handle, unsigned type) {
  CHECK_CTX(ctx);
  (void)ctx;
  if (!out || type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return FK_INVALID_VALUE;
  intptr_t fd = (intptr_t)os_handle;
  if (fd < 0 || fd > INT32_MAX) return FK_INVALID_VALUE;
  return fk_phys_import((int)fd, out);
}
CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *out, void *os_handle,
                                        unsigned int type) {
  ENTER("cuMemImportFromShareableHandle");
  RETURN(import_handle(out, os_handle, type));
}

/* The properties the handle was created with (an imported one: pinned, its device, POSIX_FD). */
static CUresult handle_properties(CUmemAllocationProp *prop, CUmemGenericAllocationHandle h) {
  CHECK_CTX(ctx);
  (void)ctx;
  int device;
  unsigned types;
  if (!prop || fk_phys_properties(h, &device, &types) != FK_OK) return FK_INVALID_VALUE;
  memset(prop, 0, sizeof *prop);
  prop->type = 1; /* CU_MEM_ALLOCATION_TYPE_PINNED */
  prop->requestedHandleTypes = types;
  prop->location.type = 1; /* CU_MEM_LOCATION_TYPE_DEVICE */
  prop->location.id = device;
  return CUDA_SUCCESS;
}
CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop,
                                                CUmemGenericAllocationHandle h) {
  ENTER("cuMemGetAllocationPropertiesFromHandle");
  RETURN(handle_properties(prop, h));
}

/* `addr` is a hint, as the driver documents it (fake_vmm.h). */
static CUresult address_reserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                                unsigned long long flags) {
  CHECK_CTX(ctx);
  if (!ptr || size == 0 || size % fk_min_gran || flags || (alignment & (alignment - 1)))
    return FK_INVALID_VALUE;
  unsigned long long align = alignment > fk_min_gran ? alignment : fk_min_gran;
  return fk_reserve(fk_ctxs[ctx].device, size, align, align, addr, ptr);
}
CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                             unsigned long long flags) {
  ENTER("cuMemAddressReserve");
  RETURN(address_reserve(ptr, size, alignment, addr, flags));
}

static CUresult address_free(CUdeviceptr va, size_t size) {
  CHECK_CTX(ctx);
  (void)ctx;
  return fk_address_free(va, size);
}
CUresult cuMemAddressFree(CUdeviceptr va, size_t size) {
  ENTER("cuMemAddressFree");
  RETURN(address_free(va, size));
}

static CUresult mem_map(CUdeviceptr va, size_t size, size_t offset, CUmemGenericAllocationHandle h,
                        unsigned long long flags) {
  CHECK_CTX(ctx);
  (void)ctx;
  if (flags) return FK_INVALID_VALUE;
  return fk_map(va, size, offset, h, fk_min_gran);
}
CUresult cuMemMap(CUdeviceptr va, size_t size, size_t offset, CUmemGenericAllocationHandle h,
                  unsigned long long flags) {
  ENTER("cuMemMap");
  RETURN(mem_map(va, size, offset, h, flags));
}

static CUresult set_access(CUdeviceptr va, size_t size, const struct fake_access_desc *desc,
                           size_t count) {
  CHECK_CTX(ctx);
  (void)ctx;
  return fk_set_access(va, size, desc, count, fk_min_gran);
}
CUresult cuMemSetAccess(CUdeviceptr va, size_t size, const struct fake_access_desc *desc,
                        size_t count) {
  ENTER("cuMemSetAccess");
  RETURN(set_access(va, size, desc, count));
}

static CUresult get_access(unsigned long long *flags, const CUmemLocation *location, CUdeviceptr ptr) {
  CHECK_CTX(ctx);
  (void)ctx;
  if (!flags || !location || !location_ok(location)) return FK_INVALID_VALUE;
  int granted = fk_access_of(ptr, location->id);
  if (granted < 0) return FK_INVALID_VALUE;
  struct fk_pointer p = fk_pointer_of(ptr);
  *flags = !granted ? 0 : (p.region->prot & PROT_WRITE) ? 3 : 1;
  return CUDA_SUCCESS;
}
CUresult cuMemGetAccess(unsigned long long *flags, const CUmemLocation *location, CUdeviceptr ptr) {
  ENTER("cuMemGetAccess");
  RETURN(get_access(flags, location, ptr));
}

static CUresult mem_unmap(CUdeviceptr va, size_t size) {
  CHECK_CTX(ctx);
  (void)ctx;
  return fk_unmap(va, size, fk_min_gran, "cuMemUnmap");
}
CUresult cuMemUnmap(CUdeviceptr va, size_t size) {
  ENTER("cuMemUnmap");
  RETURN(mem_unmap(va, size));
}

/* ---- Stream-ordered pools (CUDA 11.2) --------------------------------------------------- */

#define POOL(p) ((unsigned long long)(uintptr_t)(p))

static CUresult default_pool(CUmemoryPool *out, CUdevice dev, int current) {
  CHECK_INIT();
  CHECK_DEVICE(dev);
  if (!out) return FK_INVALID_VALUE;
  if (!cu_attributes[dev][115]) return FK_NOT_SUPPORTED;
  int p = current ? fk_device_pool(dev, 0) : fk_default_pool(dev, 0);
  if (p < 0) return FK_OUT_OF_MEMORY;
  *out = (CUmemoryPool)(uintptr_t)fk_pool_handle(p);
  return CUDA_SUCCESS;
}
CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *out, CUdevice dev) {
  ENTER("cuDeviceGetDefaultMemPool");
  RETURN(default_pool(out, dev, 0));
}
CUresult cuDeviceGetMemPool(CUmemoryPool *out, CUdevice dev) {
  ENTER("cuDeviceGetMemPool");
  RETURN(default_pool(out, dev, 1));
}

static CUresult set_mem_pool(CUdevice dev, CUmemoryPool pool) {
  CHECK_INIT();
  CHECK_DEVICE(dev);
  int p = fk_pool_of(POOL(pool));
  if (p < 0 || fk_pools[p].device != dev) return FK_INVALID_VALUE;
  fk_current_pool[dev] = POOL(pool);
  return CUDA_SUCCESS;
}
CUresult cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool) {
  ENTER("cuDeviceSetMemPool");
  RETURN(set_mem_pool(dev, pool));
}

static CUresult pool_create(CUmemoryPool *out, const CUmemPoolProps *props) {
  CHECK_INIT();
  if (!out || !props || props->allocType != 1 || props->handleTypes > 1 ||
      !location_ok(&props->location) || props->win32SecurityAttributes)
    return FK_INVALID_VALUE;
  for (size_t i = 0; i < sizeof props->reserved; i++)
    if (props->reserved[i]) return FK_INVALID_VALUE;
  if (!cu_attributes[props->location.id][115]) return FK_NOT_SUPPORTED;
  int p = fk_pool_new(props->location.id, 0, 0);
  if (p < 0) return FK_OUT_OF_MEMORY;
  *out = (CUmemoryPool)(uintptr_t)fk_pool_handle(p);
  return CUDA_SUCCESS;
}
CUresult cuMemPoolCreate(CUmemoryPool *out, const CUmemPoolProps *props) {
  ENTER("cuMemPoolCreate");
  RETURN(pool_create(out, props));
}

/* As the driver: returns at once; with allocations still outstanding, the pool's memory goes
 * when the last of them is freed. */
static CUresult pool_destroy(CUmemoryPool pool) {
  CHECK_INIT();
  int p = fk_pool_of(POOL(pool));
  if (p < 0) return FK_INVALID_VALUE;
  for (int d = 0; d < FK_MAX_DEVICES; d++)
    if (fk_current_pool[d] == POOL(pool)) fk_current_pool[d] = 0;
  return fk_pool_destroy(p);
}
CUresult cuMemPoolDestroy(CUmemoryPool pool) {
  ENTER("cuMemPoolDestroy");
  RETURN(pool_destroy(pool));
}

static CUresult pool_attribute(CUmemoryPool pool, int attr, void *value, int set) {
  CHECK_INIT();
  int p = fk_pool_of(POOL(pool));
  if (p < 0) return FK_INVALID_VALUE;
  return set ? fk_pool_set(&fk_pools[p], attr, value) : fk_pool_get(&fk_pools[p], attr, value);
}
CUresult cuMemPoolSetAttribute(CUmemoryPool pool, unsigned int attr, void *value) {
  ENTER("cuMemPoolSetAttribute");
  RETURN(pool_attribute(pool, (int)attr, value, 1));
}
CUresult cuMemPoolGetAttribute(CUmemoryPool pool, unsigned int attr, void *value) {
  ENTER("cuMemPoolGetAttribute");
  RETURN(pool_attribute(pool, (int)attr, value, 0));
}

static CUresult pool_trim(CUmemoryPool pool, size_t keep) {
  CHECK_INIT();
  int p = fk_pool_of(POOL(pool));
  if (p < 0) return FK_INVALID_VALUE;
  fk_pool_release(p, keep);
  return CUDA_SUCCESS;
}
CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t keep) {
  ENTER("cuMemPoolTrimTo");
  RETURN(pool_trim(pool, keep));
}

static CUresult alloc_from_pool(CUdeviceptr *dptr, size_t size, CUmemoryPool pool, CUstream s,
                                int pt, const char *what) {
  CHECK_CTX(ctx);
  if (!dptr || size == 0) return FK_INVALID_VALUE;
  int p = fk_pool_of(POOL(pool));
  if (p < 0) return FK_INVALID_VALUE;
  CHECK_STREAM(clock, ctx, s, pt);
  return fk_pool_alloc(p, clock, size, 512, what, dptr);
}
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t size, CUmemoryPool pool, CUstream s) {
  ENTER("cuMemAllocFromPoolAsync");
  RETURN(alloc_from_pool(dptr, size, pool, s, 0, "cuMemAllocFromPoolAsync"));
}
CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t size, CUmemoryPool pool,
                                      CUstream s) {
  ENTER("cuMemAllocFromPoolAsync_ptsz");
  RETURN(alloc_from_pool(dptr, size, pool, s, 1, "cuMemAllocFromPoolAsync_ptsz"));
}

/* From the pool current to the stream's device. Size 0 gives a null pointer (not documented;
 * as HIP's hipMallocAsync does, and cudarc's empty slices ask for it). */
static CUresult alloc_async(CUdeviceptr *dptr, size_t size, CUstream s, int pt, const char *what) {
  CHECK_CTX(ctx);
  if (!dptr) return FK_INVALID_VALUE;
  CHECK_STREAM(clock, ctx, s, pt);
  int device = fk_ctxs[fk_clocks[clock].ctx].device;
  if (!cu_attributes[device][115]) return FK_NOT_SUPPORTED;
  if (size == 0) {
    *dptr = 0;
    return CUDA_SUCCESS;
  }
  int p = fk_device_pool(device, 0);
  if (p < 0) return FK_OUT_OF_MEMORY;
  return fk_pool_alloc(p, clock, size, 512, what, dptr);
}
CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t size, CUstream s) {
  ENTER("cuMemAllocAsync");
  RETURN(alloc_async(dptr, size, s, 0, "cuMemAllocAsync"));
}
CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t size, CUstream s) {
  ENTER("cuMemAllocAsync_ptsz");
  RETURN(alloc_async(dptr, size, s, 1, "cuMemAllocAsync_ptsz"));
}

static CUresult free_async(CUdeviceptr ptr, CUstream s, int pt) {
  CHECK_CTX(ctx);
  CHECK_STREAM(clock, ctx, s, pt);
  if (ptr == 0) return CUDA_SUCCESS;
  return fk_pool_free(ptr, clock);
}
CUresult cuMemFreeAsync(CUdeviceptr ptr, CUstream s) {
  ENTER("cuMemFreeAsync");
  RETURN(free_async(ptr, s, 0));
}
CUresult cuMemFreeAsync_ptsz(CUdeviceptr ptr, CUstream s) {
  ENTER("cuMemFreeAsync_ptsz");
  RETURN(free_async(ptr, s, 1));
}

/* ---- cuGetProcAddress (CUDA 11.3; _v2: CUDA 12.0) ------------------------------------- */

/* The entry `symbol` resolves to for `version` and `flags`: the per-thread form when asked
 * for (CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) and there is one, the newest whose
 * version is at most `version`. `*status`: 0 found, 1 no such symbol, 2 version not
 * sufficient. */
static void *proc_address(const char *symbol, int version, unsigned long long flags, int *status) {
  int n;
  const struct fk_entry *t = fk_table(&n);
  const struct fk_entry *best = NULL;
  int named = 0;
  for (int pass = (flags & 2) ? 1 : 0; pass >= 0 && !best; pass--) {
    for (int i = 0; i < n; i++) {
      if (strcmp(t[i].base, symbol) || t[i].per_thread != pass) continue;
      named = 1;
      if (t[i].since <= version && (!best || t[i].since > best->since)) best = &t[i];
    }
  }
  *status = best ? 0 : named ? 2 : 1;
  return best ? best->fn : NULL;
}

static CUresult get_proc_address(const char *symbol, void **pfn, int version,
                                 unsigned long long flags, int *status) {
  if (!symbol || !pfn || flags > 3) return FK_INVALID_VALUE;
  int found;
  *pfn = proc_address(symbol, version, flags, &found);
  if (status) *status = found;
  /* "The API will return CUDA_SUCCESS and set the returned pfn to NULL if the requested
   * driver function is not supported ... or if the driver symbol is invalid." */
  return CUDA_SUCCESS;
}
CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, unsigned long long flags) {
  ENTER("cuGetProcAddress");
  RETURN(get_proc_address(symbol, pfn, version, flags, NULL));
}
CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, unsigned long long flags,
                             int *status) {
  ENTER("cuGetProcAddress_v2");
  RETURN(get_proc_address(symbol, pfn, version, flags, status));
}
#endif /* FAKECUDA_OLD */

/* ---- Stream capture and graphs (fake_graphs.h) ---------------------------------------- */

static CUresult begin_capture(CUstream s, int mode, int pt) {
  CHECK_CTX(ctx);
  CHECK_STREAM(clock, ctx, s, pt);
  return fk_capture_begin(clock, mode);
}
/* CUDA 10.0's form, without a mode: the global mode. */
CUresult cuStreamBeginCapture(CUstream s) {
  ENTER("cuStreamBeginCapture");
  RETURN(begin_capture(s, FK_MODE_GLOBAL, 0));
}
CUresult cuStreamBeginCapture_v2(CUstream s, int mode) {
  ENTER("cuStreamBeginCapture_v2");
  RETURN(begin_capture(s, mode, 0));
}
CUresult cuStreamBeginCapture_ptsz(CUstream s) {
  ENTER("cuStreamBeginCapture_ptsz");
  RETURN(begin_capture(s, FK_MODE_GLOBAL, 1));
}
CUresult cuStreamBeginCapture_v2_ptsz(CUstream s, int mode) {
  ENTER("cuStreamBeginCapture_v2_ptsz");
  RETURN(begin_capture(s, mode, 1));
}

static CUresult end_capture(CUstream s, void **graph, int pt) {
  CHECK_CTX(ctx);
  if (!graph) return FK_INVALID_VALUE;
  CHECK_STREAM(clock, ctx, s, pt);
  unsigned long long handle = 0;
  int rc = fk_capture_end(clock, &handle);
  *graph = (void *)(uintptr_t)handle;
  return rc;
}
CUresult cuStreamEndCapture(CUstream s, void **graph) {
  ENTER("cuStreamEndCapture");
  RETURN(end_capture(s, graph, 0));
}
CUresult cuStreamEndCapture_ptsz(CUstream s, void **graph) {
  ENTER("cuStreamEndCapture_ptsz");
  RETURN(end_capture(s, graph, 1));
}

static CUresult capture_info(CUstream s, int *status, unsigned long long *id, int pt) {
  CHECK_CTX(ctx);
  if (!status) return FK_INVALID_VALUE;
  CHECK_STREAM(clock, ctx, s, pt);
  return fk_capture_status(clock, status, id);
}
CUresult cuStreamIsCapturing(CUstream s, int *status) {
  ENTER("cuStreamIsCapturing");
  RETURN(capture_info(s, status, NULL, 0));
}
CUresult cuStreamIsCapturing_ptsz(CUstream s, int *status) {
  ENTER("cuStreamIsCapturing_ptsz");
  RETURN(capture_info(s, status, NULL, 1));
}
CUresult cuStreamGetCaptureInfo(CUstream s, int *status, unsigned long long *id) {
  ENTER("cuStreamGetCaptureInfo");
  RETURN(capture_info(s, status, id, 0));
}
CUresult cuStreamGetCaptureInfo_ptsz(CUstream s, int *status, unsigned long long *id) {
  ENTER("cuStreamGetCaptureInfo_ptsz");
  RETURN(capture_info(s, status, id, 1));
}
#ifndef FAKECUDA_OLD
/* CUDA 11.3's: the capture's graph and its open dependencies too. The fake's graph is a
 * sequence, so the dependency set is empty (numDependencies 0, dependencies NULL). */
static CUresult capture_info_v2(CUstream s, int *status, unsigned long long *id, void **graph,
                                const void **deps, size_t *n_deps, int pt) {
  CUresult rc = capture_info(s, status, id, pt);
  if (rc != CUDA_SUCCESS) return rc;
  int clock = fk_clock_of(cu_current(), (unsigned long long)(uintptr_t)s, pt);
  const struct fk_capture *c = fk_capture_of(clock);
  if (graph) *graph = c ? (void *)(uintptr_t)fk_graph_handle(c->graph) : NULL;
  if (deps) *deps = NULL;
  if (n_deps) *n_deps = 0;
  return CUDA_SUCCESS;
}
CUresult cuStreamGetCaptureInfo_v2(CUstream s, int *status, unsigned long long *id, void **graph,
                                   const void **deps, size_t *n_deps) {
  ENTER("cuStreamGetCaptureInfo_v2");
  RETURN(capture_info_v2(s, status, id, graph, deps, n_deps, 0));
}
CUresult cuStreamGetCaptureInfo_v2_ptsz(CUstream s, int *status, unsigned long long *id,
                                        void **graph, const void **deps, size_t *n_deps) {
  ENTER("cuStreamGetCaptureInfo_v2_ptsz");
  RETURN(capture_info_v2(s, status, id, graph, deps, n_deps, 1));
}
#endif

CUresult cuThreadExchangeStreamCaptureMode(int *mode) {
  ENTER("cuThreadExchangeStreamCaptureMode");
  RETURN(fk_capture_exchange_mode(mode));
}

static CUresult graph_instantiate(void **exec, void *graph, unsigned long long flags) {
  CHECK_CTX(ctx);
  (void)ctx;
  if (!exec || flags > 15) return FK_INVALID_VALUE;
  unsigned long long handle = 0;
  int rc = fk_graph_instantiate((unsigned long long)(uintptr_t)graph, &handle);
  if (rc == FK_OK) *exec = (void *)(uintptr_t)handle;
  return rc;
}
/* CUDA 10.0's and 11.0's (_v2) form: an error node and a log buffer, left untouched. */
CUresult cuGraphInstantiate(void **exec, void *graph, void **error_node, char *log, size_t size) {
  ENTER("cuGraphInstantiate");
  (void)error_node, (void)log, (void)size;
  RETURN(graph_instantiate(exec, graph, 0));
}
#ifndef FAKECUDA_OLD
CUresult cuGraphInstantiate_v2(void **exec, void *graph, void **error_node, char *log,
                               size_t size) {
  ENTER("cuGraphInstantiate_v2");
  (void)error_node, (void)log, (void)size;
  RETURN(graph_instantiate(exec, graph, 0));
}
CUresult cuGraphInstantiateWithFlags(void **exec, void *graph, unsigned long long flags) {
  ENTER("cuGraphInstantiateWithFlags");
  RETURN(graph_instantiate(exec, graph, flags));
}
#endif

static CUresult graph_launch(void *exec, CUstream s, int pt) {
  CHECK_CTX(ctx);
  CHECK_STREAM(clock, ctx, s, pt);
  return fk_graph_launch((unsigned long long)(uintptr_t)exec, clock);
}
CUresult cuGraphLaunch(void *exec, CUstream s) {
  ENTER("cuGraphLaunch");
  RETURN(graph_launch(exec, s, 0));
}
CUresult cuGraphLaunch_ptsz(void *exec, CUstream s) {
  ENTER("cuGraphLaunch_ptsz");
  RETURN(graph_launch(exec, s, 1));
}
CUresult cuGraphExecDestroy(void *exec) {
  ENTER("cuGraphExecDestroy");
  RETURN(fk_graph_destroy((unsigned long long)(uintptr_t)exec, 1));
}
CUresult cuGraphDestroy(void *graph) {
  ENTER("cuGraphDestroy");
  RETURN(fk_graph_destroy((unsigned long long)(uintptr_t)graph, 0));
}
/* The number of nodes (`nodes` NULL), or the first *count of them as opaque handles. */
CUresult cuGraphGetNodes(void *graph, void **nodes, size_t *count) {
  ENTER("cuGraphGetNodes");
  RETURN(fk_graph_nodes((unsigned long long)(uintptr_t)graph, nodes, count));
}

/* ---- The symbol table: every exported call, its cuGetProcAddress name and version ---------- */

#define E(name, base, since, groups) {#name, base, since, 0, groups, (void *)name}
#define P(name, base, since, groups) {#name, base, since, 1, groups, (void *)name}
static const struct fk_entry cu_table[] = {
    E(cuInit, "cuInit", 2000, 0),
    E(cuDriverGetVersion, "cuDriverGetVersion", 2020, 0),
    E(cuGetErrorName, "cuGetErrorName", 6000, 0),
    E(cuGetErrorString, "cuGetErrorString", 6000, 0),
    E(cuDeviceGetCount, "cuDeviceGetCount", 2000, 0),
    E(cuDeviceGet, "cuDeviceGet", 2000, 0),
    E(cuDeviceGetName, "cuDeviceGetName", 2000, 0),
    E(cuDeviceGetAttribute, "cuDeviceGetAttribute", 2000, 0),
    E(cuDeviceComputeCapability, "cuDeviceComputeCapability", 2000, 0),
    E(cuDeviceTotalMem_v2, "cuDeviceTotalMem", 3020, 0),
    E(cuDeviceGetUuid, "cuDeviceGetUuid", 9020, 0),
    E(cuDeviceGetUuid_v2, "cuDeviceGetUuid", 11040, 0),
    E(cuDeviceGetPCIBusId, "cuDeviceGetPCIBusId", 4010, 0),
    E(cuDeviceCanAccessPeer, "cuDeviceCanAccessPeer", 4000, 0),
    E(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", 7000, 0),
    E(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease", 7000, 0),
#ifndef FAKECUDA_OLD
    E(cuDevicePrimaryCtxRelease_v2, "cuDevicePrimaryCtxRelease", 11000, 0),
#endif
    E(cuDevicePrimaryCtxGetState, "cuDevicePrimaryCtxGetState", 7000, 0),
    E(cuCtxCreate_v2, "cuCtxCreate", 3020, 0),
    E(cuCtxDestroy_v2, "cuCtxDestroy", 4000, 0),
    E(cuCtxPushCurrent_v2, "cuCtxPushCurrent", 4000, 0),
    E(cuCtxPopCurrent_v2, "cuCtxPopCurrent", 4000, 0),
    E(cuCtxGetCurrent, "cuCtxGetCurrent", 4000, 0),
    E(cuCtxSetCurrent, "cuCtxSetCurrent", 4000, 0),
    E(cuCtxGetDevice, "cuCtxGetDevice", 2000, 0),
    E(cuCtxGetFlags, "cuCtxGetFlags", 7000, 0),
    E(cuCtxGetApiVersion, "cuCtxGetApiVersion", 3020, 0),
    E(cuCtxSynchronize, "cuCtxSynchronize", 2000, FK_G_SYNC),
    E(cuCtxGetStreamPriorityRange, "cuCtxGetStreamPriorityRange", 5050, 0),
    E(cuCtxEnablePeerAccess, "cuCtxEnablePeerAccess", 4000, 0),
    E(cuCtxDisablePeerAccess, "cuCtxDisablePeerAccess", 4000, 0),
    E(cuMemGetInfo_v2, "cuMemGetInfo", 3020, 0),
    E(cuMemAlloc_v2, "cuMemAlloc", 3020, FK_G_ALLOC),
    E(cuMemAllocManaged, "cuMemAllocManaged", 6000, FK_G_ALLOC),
    E(cuMemFree_v2, "cuMemFree", 3020, FK_G_FREE),
    E(cuMemGetAddressRange_v2, "cuMemGetAddressRange", 3020, 0),
    E(cuMemHostAlloc, "cuMemHostAlloc", 2020, FK_G_HOST_ALLOC),
    E(cuMemAllocHost_v2, "cuMemAllocHost", 3020, FK_G_HOST_ALLOC),
    E(cuMemFreeHost, "cuMemFreeHost", 2000, FK_G_HOST_FREE),
    E(cuMemHostRegister_v2, "cuMemHostRegister", 6050, FK_G_HOST_ALLOC),
    E(cuMemHostUnregister, "cuMemHostUnregister", 4000, FK_G_HOST_FREE),
    E(cuMemHostGetDevicePointer_v2, "cuMemHostGetDevicePointer", 3020, 0),
    E(cuPointerGetAttribute, "cuPointerGetAttribute", 4000, 0),
    E(cuPointerGetAttributes, "cuPointerGetAttributes", 7000, 0),
    E(cuIpcGetMemHandle, "cuIpcGetMemHandle", 4010, 0),
    E(cuIpcOpenMemHandle, "cuIpcOpenMemHandle", 4010, FK_G_MAP),
    E(cuIpcCloseMemHandle, "cuIpcCloseMemHandle", 4010, FK_G_UNMAP),
    E(cuStreamCreate, "cuStreamCreate", 2000, FK_G_STREAM),
    E(cuStreamCreateWithPriority, "cuStreamCreateWithPriority", 5050, FK_G_STREAM),
    E(cuStreamDestroy_v2, "cuStreamDestroy", 4000, 0),
    E(cuStreamSynchronize, "cuStreamSynchronize", 2000, FK_G_SYNC),
    P(cuStreamSynchronize_ptsz, "cuStreamSynchronize", 7000, FK_G_SYNC),
    E(cuStreamQuery, "cuStreamQuery", 2000, FK_G_QUERY),
    P(cuStreamQuery_ptsz, "cuStreamQuery", 7000, FK_G_QUERY),
    E(cuStreamWaitEvent, "cuStreamWaitEvent", 3020, FK_G_WAIT),
    P(cuStreamWaitEvent_ptsz, "cuStreamWaitEvent", 7000, FK_G_WAIT),
    E(cuStreamGetFlags, "cuStreamGetFlags", 5050, 0),
    P(cuStreamGetFlags_ptsz, "cuStreamGetFlags", 7000, 0),
    E(cuStreamGetPriority, "cuStreamGetPriority", 5050, 0),
    P(cuStreamGetPriority_ptsz, "cuStreamGetPriority", 7000, 0),
    E(cuStreamGetCtx, "cuStreamGetCtx", 9020, 0),
    P(cuStreamGetCtx_ptsz, "cuStreamGetCtx", 9020, 0),
    E(cuStreamAddCallback, "cuStreamAddCallback", 5000, FK_G_LAUNCH),
    P(cuStreamAddCallback_ptsz, "cuStreamAddCallback", 7000, FK_G_LAUNCH),
    E(cuLaunchHostFunc, "cuLaunchHostFunc", 10000, FK_G_LAUNCH),
    P(cuLaunchHostFunc_ptsz, "cuLaunchHostFunc", 10000, FK_G_LAUNCH),
    E(cuEventCreate, "cuEventCreate", 2000, FK_G_EVENT),
    E(cuEventRecord, "cuEventRecord", 2000, FK_G_EVENT),
    P(cuEventRecord_ptsz, "cuEventRecord", 7000, FK_G_EVENT),
    E(cuEventQuery, "cuEventQuery", 2000, FK_G_QUERY),
    E(cuEventSynchronize, "cuEventSynchronize", 2000, FK_G_SYNC),
    E(cuEventDestroy_v2, "cuEventDestroy", 4000, 0),
    E(cuEventElapsedTime, "cuEventElapsedTime", 2000, 0),
    E(cuMemcpy, "cuMemcpy", 4000, FK_G_COPY),
    P(cuMemcpy_ptds, "cuMemcpy", 7000, FK_G_COPY),
    E(cuMemcpyAsync, "cuMemcpyAsync", 4000, FK_G_COPY),
    P(cuMemcpyAsync_ptsz, "cuMemcpyAsync", 7000, FK_G_COPY),
    E(cuMemcpyHtoD_v2, "cuMemcpyHtoD", 3020, FK_G_COPY),
    P(cuMemcpyHtoD_v2_ptds, "cuMemcpyHtoD", 7000, FK_G_COPY),
    E(cuMemcpyDtoH_v2, "cuMemcpyDtoH", 3020, FK_G_COPY),
    P(cuMemcpyDtoH_v2_ptds, "cuMemcpyDtoH", 7000, FK_G_COPY),
    E(cuMemcpyDtoD_v2, "cuMemcpyDtoD", 3020, FK_G_COPY),
    P(cuMemcpyDtoD_v2_ptds, "cuMemcpyDtoD", 7000, FK_G_COPY),
    E(cuMemcpyHtoDAsync_v2, "cuMemcpyHtoDAsync", 3020, FK_G_COPY),
    P(cuMemcpyHtoDAsync_v2_ptsz, "cuMemcpyHtoDAsync", 7000, FK_G_COPY),
    E(cuMemcpyDtoHAsync_v2, "cuMemcpyDtoHAsync", 3020, FK_G_COPY),
    P(cuMemcpyDtoHAsync_v2_ptsz, "cuMemcpyDtoHAsync", 7000, FK_G_COPY),
    E(cuMemcpyDtoDAsync_v2, "cuMemcpyDtoDAsync", 3020, FK_G_COPY),
    P(cuMemcpyDtoDAsync_v2_ptsz, "cuMemcpyDtoDAsync", 7000, FK_G_COPY),
    E(cuMemsetD8_v2, "cuMemsetD8", 3020, FK_G_MEMSET),
    P(cuMemsetD8_v2_ptds, "cuMemsetD8", 7000, FK_G_MEMSET),
    E(cuMemsetD16_v2, "cuMemsetD16", 3020, FK_G_MEMSET),
    P(cuMemsetD16_v2_ptds, "cuMemsetD16", 7000, FK_G_MEMSET),
    E(cuMemsetD32_v2, "cuMemsetD32", 3020, FK_G_MEMSET),
    P(cuMemsetD32_v2_ptds, "cuMemsetD32", 7000, FK_G_MEMSET),
    E(cuMemsetD8Async, "cuMemsetD8Async", 3020, FK_G_MEMSET),
    P(cuMemsetD8Async_ptsz, "cuMemsetD8Async", 7000, FK_G_MEMSET),
    E(cuMemsetD16Async, "cuMemsetD16Async", 3020, FK_G_MEMSET),
    P(cuMemsetD16Async_ptsz, "cuMemsetD16Async", 7000, FK_G_MEMSET),
    E(cuMemsetD32Async, "cuMemsetD32Async", 3020, FK_G_MEMSET),
    P(cuMemsetD32Async_ptsz, "cuMemsetD32Async", 7000, FK_G_MEMSET),
    E(cuCtxGetLimit, "cuCtxGetLimit", 3010, 0),
    E(cuCtxSetLimit, "cuCtxSetLimit", 3010, 0),
    E(cuCtxGetCacheConfig, "cuCtxGetCacheConfig", 3020, 0),
    E(cuCtxSetCacheConfig, "cuCtxSetCacheConfig", 3020, 0),
    E(cuCtxGetSharedMemConfig, "cuCtxGetSharedMemConfig", 4020, 0),
    E(cuCtxSetSharedMemConfig, "cuCtxSetSharedMemConfig", 4020, 0),
    E(cuDevicePrimaryCtxSetFlags, "cuDevicePrimaryCtxSetFlags", 7000, 0),
    E(cuDevicePrimaryCtxReset, "cuDevicePrimaryCtxReset", 7000, FK_G_SYNC),
    E(cuDeviceGetByPCIBusId, "cuDeviceGetByPCIBusId", 4010, 0),
    E(cuDeviceGetP2PAttribute, "cuDeviceGetP2PAttribute", 8000, 0),
    E(cuMemAllocPitch_v2, "cuMemAllocPitch", 3020, FK_G_ALLOC),
    E(cuMemHostGetFlags, "cuMemHostGetFlags", 2030, 0),
    E(cuMemAdvise, "cuMemAdvise", 8000, 0),
    E(cuMemPrefetchAsync, "cuMemPrefetchAsync", 8000, 0),
    P(cuMemPrefetchAsync_ptsz, "cuMemPrefetchAsync", 8000, 0),
    E(cuMemRangeGetAttribute, "cuMemRangeGetAttribute", 8000, 0),
    E(cuMemRangeGetAttributes, "cuMemRangeGetAttributes", 8000, 0),
    E(cuStreamAttachMemAsync, "cuStreamAttachMemAsync", 6000, 0),
    P(cuStreamAttachMemAsync_ptsz, "cuStreamAttachMemAsync", 7000, 0),
    E(cuPointerSetAttribute, "cuPointerSetAttribute", 6000, 0),
    E(cuMemcpyPeer, "cuMemcpyPeer", 4000, FK_G_COPY),
    P(cuMemcpyPeer_ptds, "cuMemcpyPeer", 7000, FK_G_COPY),
    E(cuMemcpyPeerAsync, "cuMemcpyPeerAsync", 4000, FK_G_COPY),
    P(cuMemcpyPeerAsync_ptsz, "cuMemcpyPeerAsync", 7000, FK_G_COPY),
    E(cuMemcpy2D_v2, "cuMemcpy2D", 3020, FK_G_COPY),
    P(cuMemcpy2D_v2_ptds, "cuMemcpy2D", 7000, FK_G_COPY),
    E(cuMemcpy2DUnaligned_v2, "cuMemcpy2DUnaligned", 3020, FK_G_COPY),
    P(cuMemcpy2DUnaligned_v2_ptds, "cuMemcpy2DUnaligned", 7000, FK_G_COPY),
    E(cuMemcpy2DAsync_v2, "cuMemcpy2DAsync", 3020, FK_G_COPY),
    P(cuMemcpy2DAsync_v2_ptsz, "cuMemcpy2DAsync", 7000, FK_G_COPY),
    E(cuMemsetD2D8_v2, "cuMemsetD2D8", 3020, FK_G_MEMSET),
    P(cuMemsetD2D8_v2_ptds, "cuMemsetD2D8", 7000, FK_G_MEMSET),
    E(cuMemsetD2D16_v2, "cuMemsetD2D16", 3020, FK_G_MEMSET),
    P(cuMemsetD2D16_v2_ptds, "cuMemsetD2D16", 7000, FK_G_MEMSET),
    E(cuMemsetD2D32_v2, "cuMemsetD2D32", 3020, FK_G_MEMSET),
    P(cuMemsetD2D32_v2_ptds, "cuMemsetD2D32", 7000, FK_G_MEMSET),
    E(cuMemsetD2D8Async, "cuMemsetD2D8Async", 3020, FK_G_MEMSET),
    P(cuMemsetD2D8Async_ptsz, "cuMemsetD2D8Async", 7000, FK_G_MEMSET),
    E(cuMemsetD2D16Async, "cuMemsetD2D16Async", 3020, FK_G_MEMSET),
    P(cuMemsetD2D16Async_ptsz, "cuMemsetD2D16Async", 7000, FK_G_MEMSET),
    E(cuMemsetD2D32Async, "cuMemsetD2D32Async", 3020, FK_G_MEMSET),
    P(cuMemsetD2D32Async_ptsz, "cuMemsetD2D32Async", 7000, FK_G_MEMSET),
    E(cuModuleLoad, "cuModuleLoad", 2000, FK_G_MODULE),
    E(cuModuleLoadData, "cuModuleLoadData", 2000, FK_G_MODULE),
    E(cuModuleLoadDataEx, "cuModuleLoadDataEx", 2010, FK_G_MODULE),
    E(cuModuleGetFunction, "cuModuleGetFunction", 2000, FK_G_MODULE),
    E(cuModuleUnload, "cuModuleUnload", 2000, 0),
    E(cuLaunchKernel, "cuLaunchKernel", 4000, FK_G_LAUNCH),
    P(cuLaunchKernel_ptsz, "cuLaunchKernel", 7000, FK_G_LAUNCH),
    E(cuModuleLoadFatBinary, "cuModuleLoadFatBinary", 2000, FK_G_MODULE),
    E(cuModuleGetGlobal_v2, "cuModuleGetGlobal", 3020, 0),
    E(cuFuncGetAttribute, "cuFuncGetAttribute", 2020, 0),
    E(cuFuncSetAttribute, "cuFuncSetAttribute", 9000, 0),
    E(cuFuncSetCacheConfig, "cuFuncSetCacheConfig", 3000, 0),
    E(cuLaunchCooperativeKernel, "cuLaunchCooperativeKernel", 9000, FK_G_LAUNCH),
    P(cuLaunchCooperativeKernel_ptsz, "cuLaunchCooperativeKernel", 9000, FK_G_LAUNCH),
    E(cuOccupancyMaxActiveBlocksPerMultiprocessor, "cuOccupancyMaxActiveBlocksPerMultiprocessor", 6050, 0),
    E(cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags, "cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags", 7000, 0),
    E(cuOccupancyMaxPotentialBlockSize, "cuOccupancyMaxPotentialBlockSize", 6050, 0),
    E(cuOccupancyMaxPotentialBlockSizeWithFlags, "cuOccupancyMaxPotentialBlockSizeWithFlags", 7000, 0),
#ifndef FAKECUDA_OLD
    E(cuCtxSetFlags, "cuCtxSetFlags", 12010, 0),
    E(cuCtxGetId, "cuCtxGetId", 12000, 0),
    E(cuDevicePrimaryCtxSetFlags_v2, "cuDevicePrimaryCtxSetFlags", 11000, 0),
    E(cuDevicePrimaryCtxReset_v2, "cuDevicePrimaryCtxReset", 11000, FK_G_SYNC),
    E(cuMemAdvise_v2, "cuMemAdvise", 12020, 0),
    E(cuMemPrefetchAsync_v2, "cuMemPrefetchAsync", 12020, 0),
    P(cuMemPrefetchAsync_v2_ptsz, "cuMemPrefetchAsync", 12020, 0),
    E(cuEventRecordWithFlags, "cuEventRecordWithFlags", 11010, FK_G_EVENT),
    P(cuEventRecordWithFlags_ptsz, "cuEventRecordWithFlags", 11010, FK_G_EVENT),
    E(cuStreamGetId, "cuStreamGetId", 12000, 0),
    P(cuStreamGetId_ptsz, "cuStreamGetId", 12000, 0),
    E(cuFuncGetModule, "cuFuncGetModule", 11000, 0),
    E(cuGetProcAddress, "cuGetProcAddress", 11030, 0),
    E(cuGetProcAddress_v2, "cuGetProcAddress", 12000, 0),
    E(cuMemGetAllocationGranularity, "cuMemGetAllocationGranularity", 10020, 0),
    E(cuMemCreate, "cuMemCreate", 10020, FK_G_ALLOC),
    E(cuMemRelease, "cuMemRelease", 10020, FK_G_FREE),
    E(cuMemAddressReserve, "cuMemAddressReserve", 10020, FK_G_RESERVE),
    E(cuMemAddressFree, "cuMemAddressFree", 10020, 0),
    E(cuMemMap, "cuMemMap", 10020, FK_G_MAP),
    E(cuMemSetAccess, "cuMemSetAccess", 10020, FK_G_MAP),
    E(cuMemGetAccess, "cuMemGetAccess", 10020, 0),
    E(cuMemUnmap, "cuMemUnmap", 10020, FK_G_UNMAP),
    E(cuMemExportToShareableHandle, "cuMemExportToShareableHandle", 10020, 0),
    E(cuMemImportFromShareableHandle, "cuMemImportFromShareableHandle", 10020, FK_G_ALLOC),
    E(cuMemGetAllocationPropertiesFromHandle, "cuMemGetAllocationPropertiesFromHandle", 10020, 0),
    E(cuIpcOpenMemHandle_v2, "cuIpcOpenMemHandle", 11000, FK_G_MAP),
    E(cuDeviceGetDefaultMemPool, "cuDeviceGetDefaultMemPool", 11020, 0),
    E(cuDeviceGetMemPool, "cuDeviceGetMemPool", 11020, 0),
    E(cuDeviceSetMemPool, "cuDeviceSetMemPool", 11020, FK_G_POOL),
    E(cuMemPoolCreate, "cuMemPoolCreate", 11020, FK_G_POOL),
    E(cuMemPoolDestroy, "cuMemPoolDestroy", 11020, FK_G_POOL),
    E(cuMemPoolSetAttribute, "cuMemPoolSetAttribute", 11020, FK_G_POOL),
    E(cuMemPoolGetAttribute, "cuMemPoolGetAttribute", 11020, 0),
    E(cuMemPoolTrimTo, "cuMemPoolTrimTo", 11020, FK_G_POOL),
    E(cuMemAllocFromPoolAsync, "cuMemAllocFromPoolAsync", 11020, FK_G_ALLOC),
    P(cuMemAllocFromPoolAsync_ptsz, "cuMemAllocFromPoolAsync", 11020, FK_G_ALLOC),
    E(cuMemAllocAsync, "cuMemAllocAsync", 11020, FK_G_ALLOC),
    P(cuMemAllocAsync_ptsz, "cuMemAllocAsync", 11020, FK_G_ALLOC),
    E(cuMemFreeAsync, "cuMemFreeAsync", 11020, FK_G_FREE),
    P(cuMemFreeAsync_ptsz, "cuMemFreeAsync", 11020, FK_G_FREE),
#endif
    E(cuStreamBeginCapture, "cuStreamBeginCapture", 10000, 0),
    E(cuStreamEndCapture, "cuStreamEndCapture", 10000, 0),
    P(cuStreamEndCapture_ptsz, "cuStreamEndCapture", 10000, 0),
    E(cuStreamIsCapturing, "cuStreamIsCapturing", 10000, FK_G_QUERY),
    P(cuStreamIsCapturing_ptsz, "cuStreamIsCapturing", 10000, FK_G_QUERY),
    E(cuGraphInstantiate, "cuGraphInstantiate", 10000, 0),
    E(cuGraphLaunch, "cuGraphLaunch", 10000, FK_G_LAUNCH),
    P(cuGraphLaunch_ptsz, "cuGraphLaunch", 10000, FK_G_LAUNCH),
    E(cuGraphExecDestroy, "cuGraphExecDestroy", 10000, 0),
    E(cuGraphDestroy, "cuGraphDestroy", 10000, 0),
    E(cuGraphGetNodes, "cuGraphGetNodes", 10000, 0),
    P(cuStreamBeginCapture_ptsz, "cuStreamBeginCapture", 10000, 0),
    E(cuStreamBeginCapture_v2, "cuStreamBeginCapture", 10010, 0),
    P(cuStreamBeginCapture_v2_ptsz, "cuStreamBeginCapture", 10010, 0),
    E(cuStreamGetCaptureInfo, "cuStreamGetCaptureInfo", 10010, FK_G_QUERY),
    P(cuStreamGetCaptureInfo_ptsz, "cuStreamGetCaptureInfo", 10010, FK_G_QUERY),
    E(cuThreadExchangeStreamCaptureMode, "cuThreadExchangeStreamCaptureMode", 10010, 0),
#ifndef FAKECUDA_OLD
    E(cuGraphInstantiate_v2, "cuGraphInstantiate", 11000, 0),
    E(cuStreamGetCaptureInfo_v2, "cuStreamGetCaptureInfo", 11030, FK_G_QUERY),
    P(cuStreamGetCaptureInfo_v2_ptsz, "cuStreamGetCaptureInfo", 11030, FK_G_QUERY),
    E(cuGraphInstantiateWithFlags, "cuGraphInstantiateWithFlags", 11040, 0),
#endif
};

static const struct fk_entry *fk_table(int *n) {
  *n = (int)(sizeof cu_table / sizeof cu_table[0]);
  return cu_table;
}
