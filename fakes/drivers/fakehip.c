/*
 * fakehip: a conformance driver with the HIP runtime API's common surface (libamdhip64's
 * names, signatures, codes and rules), over host memory. The behaviour lives in the core
 * (fake_core.h and its concerns); this file is HIP's face: names, argument rules, codes, the
 * device it impersonates, ROCm's versions and reported behaviours.
 *
 * HIP's rules it keeps (docs/fakes.md lists every call and what is modelled), from HIP's
 * headers and implementation (hipamd 5.2.3, clr):
 *   - the current device is per thread (hipSetDevice / hipGetDevice, 0 until set); HIP
 *     initialises on the first call;
 *   - every call stores its result as the thread's last error, success included
 *     (hipGetLastError reads it and resets it, hipPeekAtLastError reads it);
 *   - streams follow fake_timeline.h (the null stream's implicit ordering with blocking
 *     streams, hipStreamNonBlocking, hipStreamPerThread and the _spt calls); hipFree and
 *     hipHostFree synchronise first ("This API performs an implicit hipDeviceSynchronize()
 *     call"): the device, and every device for pinned memory, as hipamd's ihipFree does;
 *   - hipMemcpy returns once the copy completed, device-to-device included before ROCm 5.6
 *     (from 5.6 a same-device device-to-device copy does not wait); hipMemcpyAsync with
 *     pageable host memory on either side is synchronous ("If host or dest are not pinned,
 *     the memory copy will be performed synchronously"); hipMemset waits (ROCm 5; from 6 it
 *     does not for the start of a plain allocation, as clr's ihipMemset);
 *   - ROCm 5 and 6 differ where HIP did: hipMemoryType's values, hipPointerGetAttributes on
 *     memory HIP does not know (5: hipErrorInvalidValue; 6: success, unregistered), the
 *     device-properties layout (hipGetDeviceProperties fills the 5.x layout,
 *     hipGetDevicePropertiesR0600 the 6.x one), attribute 89 (virtual memory: ROCm 6+),
 *     hipGetProcAddress (ROCm 6.2+).
 *
 *   - memory shared between processes (fake_ipc.h): handles created with
 *     hipMemHandleTypePosixFileDescriptor are exported as descriptors and imported from them
 *     (hipMemExportToShareableHandle, hipMemImportFromShareableHandle; the descriptor's value
 *     cast to void *, ROCm/rocm-systems PR #1564); plain allocations are shared by IPC handles
 *     (hipIpcGetMemHandle, hipIpcOpenMemHandle, hipIpcCloseMemHandle; VMM memory refused, as
 *     since ROCm/clr PR #266); hipMemSetAccess takes host locations (hipMemLocationTypeHost,
 *     2): the CPU's access, as on a large-BAR system.
 *
 * A quirk of ROCm is modelled on purpose: a new pool's release threshold is "never release"
 * (UINT64_MAX) until set, so a shim that forgets to set it keeps every freed byte.
 *
 * Profiles: ROCm as it behaves, beside what it documents. Selected with FAKEHIP_PROFILE at
 * fakehip_reset (an unknown name: documented, said on stderr) or fakehip_set_profile(names)
 * (0; hipErrorInvalidValue for an unknown name, which changes nothing); a comma-separated
 * list, so profiles combine; `documented` adds nothing. fakehip_profile_name(i) lists them.
 *   documented
 *     HIP's documentation: the rules above.
 *   rocm7-reservation-hold
 *     ROCm 7.x on Linux (reported on 7.2 and 7.11-preview, Radeon and MI300X): hipMemRelease
 *     returns no physical memory while an address reservation the handle was mapped into is
 *     still reserved; only hipMemAddressFree of that reservation gives it back
 *     (ROCm/legacy-rocm-build#6021; vllm-project/vllm#37533, #43022, #45827, #46203;
 *     fzyzcjy/torch_memory_saver#84). Modelled: a released handle whose last mapping is gone
 *     keeps its bytes charged (hipMemGetInfo's free does not rise; fake_live counts it in
 *     "bytes" and "handles"; fakehip_held_bytes says how much) until every reservation it was
 *     ever mapped into was freed; then the bytes are returned. fakehip_reset clears it.
 *   rocm-systems-2516-setaccess-prefix
 *     ROCm/rocm-systems#2516 (ROCm 7.x; the fixes, rocm-systems#2451, #2568 and #6977, name
 *     the cause): hipMemSetAccess refuses correct calls with hipErrorInvalidValue for some
 *     sizes, because it sums the sizes of the mappings of the reservation from its first one
 *     instead of from `ptr`'s and wants the sum to be exactly `size`. Modelled: the mappings
 *     of the reservation holding `ptr` in address order from the lowest; refused unless a sum
 *     of the first k of them is exactly `size`.
 *   rocm-systems-7128-reserve-counted
 *     ROCm/rocm-systems#7128 (merged 2026-06): the runtime's own free-memory counter, which
 *     its allocations are checked against, subtracted address reservations in full and never
 *     counted physical handles. Modelled: hipMalloc and hipExtMallocWithFlags are refused when
 *     their bytes, plus every other plain byte, plus every live reservation of the device,
 *     would pass its capacity; hipMemCreate and hipMemGetInfo are as documented.
 *   rocr-285-unmap-many
 *     ROCm/ROCR-Runtime#285 (before ROCm 7.0): one hipMemUnmap over several mappings lowers
 *     ROCr's use count of the reservation by one only, so its hipMemAddressFree fails for
 *     ever after. Modelled: hipMemAddressFree of a reservation still in use is
 *     hipErrorInvalidValue.
 *   rocm-systems-10604-descriptor-per-handle
 *     ROCm/rocm-systems#10604 (ROCm 7.14 on RDNA, gfx1030/1100/1151/1201; not on 7.1.1,
 *     ROCm/legacy-rocm-build#6661): hipMemCreate opens one dmabuf file descriptor per handle,
 *     so at the stock soft RLIMIT_NOFILE of 1024 a process stops at ~1015 handles (1.98 GiB
 *     of 2 MiB handles) with hipErrorOutOfMemory, VRAM free. Modelled: each live handle holds
 *     a real descriptor of the process (/dev/null, opened at hipMemCreate, closed at
 *     hipMemRelease), so the process's own limit bounds the handles; hipMemCreate is
 *     hipErrorOutOfMemory when no descriptor can be opened.
 *   rocm-systems-11185-import-host-access (alias: rocm-7.15)
 *     ROCm/rocm-systems#11185 (ROCm 7.15; the fix is ROCm/rocm-systems PR #10879):
 *     hipMemSetAccess with a descriptor whose location is the host (hipMemLocationTypeHost)
 *     over a range that maps an imported handle (hipMemImportFromShareableHandle) returns
 *     hipErrorInvalidValue. Modelled: exactly that; device descriptors over imported handles,
 *     and host descriptors over handles this process created, work.
 *   rocm-systems-8440-import-needs-fd
 *     ROCm/rocm-systems PR #8440 (ROCm 7.14): hipMemImportFromShareableHandle does not take a
 *     reference of its own to the descriptor; the runtime reads the caller's descriptor again
 *     when the imported handle is mapped and granted access. Modelled: the import remembers
 *     the caller's descriptor number and what it named (st_dev, st_ino); hipMemSetAccess over
 *     a mapping of that handle is hipErrorInvalidValue when the number is closed or names
 *     another file by then. After a successful hipMemSetAccess the descriptor is no longer
 *     read.
 * Reported, not modelled:
 *   ROCm/rocm-systems#11693 (gfx1201, ROCm 7.2.1): after hipMemMap + hipMemSetAccess return,
 *     GPU work for ~1-2 ms still sees the old translation. Not modelled: a fake could only
 *     tell "early" by a timer that makes tests flaky.
 *   ROCm/hip#3781 (ROCm 6.4.0, fixed in 6.4.2): hipMemRelease returns no physical memory at
 *     all. Not modelled: below portalloc's VMM gate (ROCm 7), and nothing an allocator does
 *     gets the memory back.
 *
 * Defaults come from the environment at fakehip_reset (FAKEHIP_VERSION, FAKEHIP_DEVICES,
 * FAKEHIP_CAPACITY, FAKEHIP_PROFILE, FAKEHIP_DEVICE) and the control functions below override
 * them.
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

typedef int hipError_t;
enum {
  hipSuccess = 0,
  hipErrorInvalidValue = 1,
  hipErrorOutOfMemory = 2,
  hipErrorInvalidPitchValue = 12,
  hipErrorInvalidDevicePointer = 17,
  hipErrorInvalidMemcpyDirection = 21,
  hipErrorInvalidDeviceFunction = 98,
  hipErrorNoDevice = 100,
  hipErrorInvalidDevice = 101,
  hipErrorInvalidImage = 200,
  hipErrorFileNotFound = 301,
  hipErrorInvalidHandle = 400,
  hipErrorNotFound = 500,
  hipErrorUnsupportedLimit = 215,
  hipErrorNotReady = 600,
  hipErrorContextIsDestroyed = 709,
  hipErrorCooperativeLaunchTooLarge = 720,
  hipErrorHostMemoryAlreadyRegistered = 712,
  hipErrorHostMemoryNotRegistered = 713,
  hipErrorNotSupported = 801,
  hipErrorStreamCaptureUnsupported = 900,
};

#define EXPORT FAKE_EXPORT
#define KIB 1024ULL
#define MIB (1024ULL * 1024ULL)
#define GIB (1024ULL * MIB)

typedef struct {
  unsigned int x, y, z;
} dim3;

/* ----- the device it impersonates ---------------------------------------------------------
 * hipDeviceProp_t values from the vendors' dumps (docs/fakes.md gives each source): the
 * MI300X (thamada/nvidia-smi's 4x MI300X hipGetDeviceProperties dump and rocminfo; AMD's GPU
 * specs table) and one GCD of an MI250X (ROCm issue rocminfo dumps; caps-tum/mt4g's MI210). */
struct hip_model {
  const char *key, *name, *arch;
  unsigned long long total;
  int major, minor, cus, clock_khz, memory_clock_khz, bus_width, l2, async_engines, pci_bus;
};
static const struct hip_model hip_models[] = {
    {"mi300x", "AMD Instinct MI300X", "gfx942:sramecc+:xnack-", 206141652992ULL, 9, 4, 304,
     2100000, 1300000, 8192, 33554432, 8, 38},
    {"mi250x", "AMD Instinct MI250X", "gfx90a:sramecc+:xnack-", 68702699520ULL, 9, 0, 110,
     1700000, 1600000, 4096, 8388608, 2, 38},
};

static int version;
static const struct hip_model *model;
static int attr_integrated, attr_pools, attr_vmm; /* attr_vmm < 0: by version */
static char arch[64];
static unsigned last_flags;
static int last_device;
static __thread int hip_last_error;

static int major(void) { return version / 10000000; }
static int minor(void) { return version / 100000 % 100; }
static int at_least(int a, int b) { return major() > a || (major() == a && minor() >= b); }

/* ----- profiles: ROCm as it behaves (see the header) ------------------------------------- */

static const struct {
  const char *name;
  unsigned bits;
} profile_names[] = {
    {"documented", 0},
    {"rocm7-reservation-hold", Q_RESERVATION_HOLD},
    {"rocm-systems-2516-setaccess-prefix", Q_SETACCESS_PREFIX},
    {"rocm-systems-7128-reserve-counted", Q_RESERVE_COUNTED},
    {"rocr-285-unmap-many", Q_UNMAP_MANY},
    {"rocm-systems-10604-descriptor-per-handle", Q_DESCRIPTOR_PER_HANDLE},
    {"rocm-systems-11185-import-host-access", Q_IMPORT_HOST_ACCESS},
    {"rocm-systems-8440-import-needs-fd", Q_IMPORT_NEEDS_FD},
    /* An alias: what is reported of ROCm 7.15 that the profiles above model. */
    {"rocm-7.15", Q_IMPORT_HOST_ACCESS},
};

/* The bits of a comma-separated list of profile names into `*bits`; 0, or the length of the
 * first unknown name with `*unknown` pointing at it. */
static size_t parse_profiles(const char *names, unsigned *bits, const char **unknown) {
  *bits = 0;
  for (const char *at = names ? names : ""; *at;) {
    while (*at == ' ' || *at == ',') at++;
    const char *end = at;
    while (*end && *end != ',') end++;
    size_t len = (size_t)(end - at);
    while (len && at[len - 1] == ' ') len--;
    if (len) {
      size_t i, n = sizeof profile_names / sizeof profile_names[0];
      for (i = 0; i < n; i++)
        if (strlen(profile_names[i].name) == len && !strncmp(profile_names[i].name, at, len)) break;
      if (i == n) {
        *unknown = at;
        return len;
      }
      *bits |= profile_names[i].bits;
    }
    at = end;
  }
  return 0;
}

static int parse_version(const char *s) {
  int a = 0, b = 0;
  if (strchr(s, '.') && sscanf(s, "%d.%d", &a, &b) >= 1) return a * 10000000 + b * 100000;
  return atoi(s);
}

/* A device's state as HIP starts it (clr): hipDeviceScheduleSpin, a stack of 1024 bytes a
 * thread and a device heap of 8 MiB (HIP_INITIAL_DM_SIZE). */
static void device_defaults(int dev) {
  fk_ctxs[dev].flags = 1;
  memset(fk_ctxs[dev].limits, 0, sizeof fk_ctxs[dev].limits);
  fk_ctxs[dev].limits[0] = 1024;
  fk_ctxs[dev].limits[2] = 8ULL << 20;
}

static void fk_face_defaults(void) {
  const char *v = getenv("FAKEHIP_VERSION");
  const char *d = getenv("FAKEHIP_DEVICES");
  const char *c = getenv("FAKEHIP_CAPACITY");
  const char *m = getenv("FAKEHIP_DEVICE");
  version = v && *v ? parse_version(v) : 60241133;
  fk_n_devices = d && *d ? atoi(d) : 1;
  if (fk_n_devices > FK_MAX_DEVICES) fk_n_devices = FK_MAX_DEVICES;
  if (fk_n_devices < 0) fk_n_devices = 0;
  model = &hip_models[major() >= 6 ? 0 : 1];
  for (size_t i = 0; m && i < sizeof hip_models / sizeof hip_models[0]; i++)
    if (!strcmp(hip_models[i].key, m)) model = &hip_models[i];
  unsigned long long capacity = c && *c ? strtoull(c, NULL, 10) : model->total;
  for (int i = 0; i < FK_MAX_DEVICES; i++) fk_devices[i].capacity = capacity;
  fk_min_gran = 4 * KIB;
  fk_rec_gran = 2 * MIB;
  attr_integrated = 0;
  attr_pools = 1;
  attr_vmm = -1;
  snprintf(arch, sizeof arch, "%s", model->arch);
  last_flags = 0;
  last_device = -1;
  for (int dev = 0; dev < FK_MAX_DEVICES; dev++) device_defaults(dev);
  fk_host_location_ok = 1; /* hipMemLocationTypeHost in hipMemSetAccess */
  const char *p = getenv("FAKEHIP_PROFILE");
  const char *unknown = NULL;
  size_t bad = parse_profiles(p, &fk_quirks, &unknown);
  if (bad) {
    fprintf(stderr,
            "fakehip: unknown profile \"%.*s\" in FAKEHIP_PROFILE=\"%s\"; using the documented "
            "behaviour\n",
            (int)bad, unknown, p);
    fk_quirks = 0;
  }
}

/* HIP stores every call's result as the calling thread's last error, success included; HIP
 * initialises on its first call. */
static void fk_face_returned(int code) {
  hip_last_error = code;
  if (fk_n_devices > 0) fk_initialised = 1;
}

static int fk_face_code(const char *name) {
  static const struct {
    const char *name;
    int code;
  } codes[] = {
      {"success", 0},          {"invalid_value", 1},      {"out_of_memory", 2},
      {"not_initialized", 3},  {"deinitialized", 4},      {"invalid_device_pointer", 17},
      {"invalid_memcpy_direction", 21}, {"invalid_device_function", 98},
      {"no_device", 100},      {"invalid_device", 101},   {"invalid_image", 200},
      {"no_binary_for_gpu", 209}, {"invalid_kernel_file", 218}, {"context_is_destroyed", 709},
      {"invalid_pitch_value", 12}, {"unsupported_limit", 215},
      {"cooperative_launch_too_large", 720},
      {"invalid_context", 201}, {"peer_unsupported", 217}, {"invalid_handle", 400},
      {"not_found", 500},      {"not_ready", 600},        {"illegal_address", 700},
      {"launch_out_of_resources", 701}, {"peer_already_enabled", 704},
      {"peer_not_enabled", 705}, {"launch_failed", 719},  {"not_permitted", 800},
      {"not_supported", 801},
      {"unknown", 999},
  };
  for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++)
    if (!strcmp(codes[i].name, name)) return codes[i].code;
  return -1;
}

/* The calling thread's current device (0 until hipSetDevice). */
static int current_device(void) { return fk_t_depth ? fk_t_stack[fk_t_depth - 1] : 0; }

static int fk_face_clock(void *stream) {
  unsigned long long handle = (unsigned long long)(uintptr_t)stream;
  int slot = fk_stream_slot(handle);
  int ctx = slot >= 0 ? fk_streams[slot].ctx : current_device();
  return fk_clock_of(ctx, handle, 0);
}

static long long fk_face_contexts(void) { return -1; /* HIP has no context a caller retains */ }

static int valid_device(int d) { return d >= 0 && d < fk_n_devices; }
#define CHECK_DEVICE(d) \
  if (!valid_device(d)) return hipErrorInvalidDevice
/* The clock of `stream` for the calling thread (`pt`: an _spt call), or return
 * hipErrorContextIsDestroyed: what clr answers for a stream it does not know (`hip::isValid`),
 * a destroyed one included. CHECK_STREAM_OR returns another code, where clr does. */
#define CHECK_STREAM_OR(clock, stream, pt, code)                                          \
  int clock = fk_clock_of(current_device(), (unsigned long long)(uintptr_t)(stream), pt); \
  if (!clock) return code
#define CHECK_STREAM(clock, stream, pt) CHECK_STREAM_OR(clock, stream, pt, hipErrorContextIsDestroyed)

/* hipDeviceSynchronize of `device` (-1: every device), counted. */
static void sync_device(int device) {
  fk_cpu_wait();
  for (int c = 1; c < fk_n_clocks; c++)
    if (device < 0 || fk_ctxs[fk_clocks[c].ctx].device == device) fk_force(c, ~0ULL, 0);
}

/* ----- control functions ---------------------------------------------------------------- */

/* Forgets everything: memory, handles, streams, events, faults, counts, hazards; the
 * defaults are read from the environment again. */
EXPORT void fakehip_reset(void) {
  pthread_mutex_lock(&fk_lock);
  if (!fk_prepared) {
    fk_prepare();
  } else {
    fk_memory_reset(); /* regions: before the VMM forgets the reservations' address space */
    fk_vmm_reset();
    fk_pools_reset();
    fk_modules_reset();
    fk_timeline_reset();
    fk_core_reset();
    fk_quirks = 0;
    fk_initialised = 0;
    fk_face_defaults();
    fk_shared_capacities(); /* a shared device keeps the segment's */
  }
  pthread_mutex_unlock(&fk_lock);
}
EXPORT void fakehip_set_version(int v) { LOCKED(version = v); }
/* The profiles in force from now on (a comma-separated list, see the header); 0, or
 * hipErrorInvalidValue for an unknown name, which changes nothing. */
EXPORT int fakehip_set_profile(const char *names) {
  int rc = hipSuccess;
  LOCKED({
    unsigned bits;
    const char *unknown = NULL;
    if (parse_profiles(names, &bits, &unknown))
      rc = hipErrorInvalidValue;
    else
      fk_quirks = bits;
  });
  return rc;
}
/* The name of profile `i` (from 0), or NULL past the last. */
EXPORT const char *fakehip_profile_name(int i) {
  int n = (int)(sizeof profile_names / sizeof profile_names[0]);
  return i >= 0 && i < n ? profile_names[i].name : NULL;
}
/* Bytes of released handles with no mapping left that are still charged. */
EXPORT unsigned long long fakehip_held_bytes(void) {
  unsigned long long n = 0;
  LOCKED(n = fk_held_bytes());
  return n;
}
EXPORT void fakehip_set_devices(int n, unsigned long long bytes) {
  LOCKED({
    fk_n_devices = n < 0 ? 0 : n > FK_MAX_DEVICES ? FK_MAX_DEVICES : n;
    for (int d = 0; d < FK_MAX_DEVICES; d++) fk_devices[d].capacity = bytes;
    fk_shared_capacities(); /* a shared device keeps the segment's */
  });
}
/* attr: 16 (integrated), 88 (pools), 89 (VMM; -1 = by version). */
EXPORT void fakehip_set_attribute(int attr, int value) {
  LOCKED({
    if (attr == 16) attr_integrated = value;
    if (attr == 88) attr_pools = value;
    if (attr == 89) attr_vmm = value;
  });
}
EXPORT void fakehip_set_granularity(unsigned long long minimum, unsigned long long recommended) {
  LOCKED({
    fk_min_gran = minimum;
    fk_rec_gran = recommended;
  });
}
EXPORT void fakehip_set_arch(const char *name) { LOCKED(snprintf(arch, sizeof arch, "%s", name)); }
/* While held, nothing recorded on a stream completes until synchronised or released. */
EXPORT void fakehip_hold_events(int held) { LOCKED(fk_set_hold(held)); }
EXPORT unsigned long long fakehip_device_used(int device) {
  unsigned long long n = 0;
  LOCKED(n = valid_device(device) ? fk_devices[device].used : 0);
  return n;
}
/* Flags of the last hipExtMallocWithFlags (hipMalloc: 0) and the device it charged. */
EXPORT unsigned fakehip_last_malloc_flags(void) {
  unsigned flags = 0;
  LOCKED(flags = last_flags);
  return flags;
}
EXPORT int fakehip_last_device(void) {
  int device = -1;
  LOCKED(device = last_device);
  return device;
}

/* ----- errors ----------------------------------------------------------------------------- */

static const struct fake_error errors[] = {
    {0, "hipSuccess", "no error"},
    {1, "hipErrorInvalidValue", "invalid argument"},
    {2, "hipErrorOutOfMemory", "out of memory"},
    {3, "hipErrorNotInitialized", "initialization error"},
    {4, "hipErrorDeinitialized", "driver shutting down"},
    {12, "hipErrorInvalidPitchValue", "invalid pitch argument"},
    {17, "hipErrorInvalidDevicePointer", "invalid device pointer"},
    {21, "hipErrorInvalidMemcpyDirection", "invalid copy direction for memcpy"},
    {98, "hipErrorInvalidDeviceFunction", "invalid device function"},
    {100, "hipErrorNoDevice", "no ROCm-capable device is detected"},
    {101, "hipErrorInvalidDevice", "invalid device ordinal"},
    {200, "hipErrorInvalidImage", "device kernel image is invalid"},
    {209, "hipErrorNoBinaryForGpu", "no kernel image is available for execution on the device"},
    {201, "hipErrorInvalidContext", "invalid device context"},
    {215, "hipErrorUnsupportedLimit", "limit is not supported on this architecture"},
    {217, "hipErrorPeerAccessUnsupported", "peer access is not supported between these two devices"},
    {218, "hipErrorInvalidKernelFile", "invalid kernel file"},
    {301, "hipErrorFileNotFound", "file not found"},
    {400, "hipErrorInvalidHandle", "invalid resource handle"},
    {401, "hipErrorIllegalState", "the operation cannot be performed in the present state"},
    {500, "hipErrorNotFound", "named symbol not found"},
    {600, "hipErrorNotReady", "device not ready"},
    {700, "hipErrorIllegalAddress", "an illegal memory access was encountered"},
    {704, "hipErrorPeerAccessAlreadyEnabled", "peer access is already enabled"},
    {705, "hipErrorPeerAccessNotEnabled", "peer access has not been enabled"},
    {712, "hipErrorHostMemoryAlreadyRegistered", "part or all of the requested memory range is already mapped"},
    {709, "hipErrorContextIsDestroyed", "context is destroyed"},
    {713, "hipErrorHostMemoryNotRegistered", "pointer does not correspond to a registered memory region"},
    {720, "hipErrorCooperativeLaunchTooLarge", "too many blocks in cooperative launch"},
    {719, "hipErrorLaunchFailure", "unspecified launch failure"},
    {800, "hipErrorNotPermitted", "operation not permitted"},
    {801, "hipErrorNotSupported", "operation not supported"},
    {900, "hipErrorStreamCaptureUnsupported", "operation not permitted when stream is capturing"},
    {901, "hipErrorStreamCaptureInvalidated", "operation failed due to a previous error during capture"},
    {902, "hipErrorStreamCaptureMerge", "operation would result in a merge of separate capture sequences"},
    {903, "hipErrorStreamCaptureUnmatched", "capture was not ended in the same stream as it began"},
    {904, "hipErrorStreamCaptureUnjoined", "capturing stream has unjoined work"},
    {905, "hipErrorStreamCaptureIsolation", "dependency created on uncaptured work in another stream"},
    {906, "hipErrorStreamCaptureImplicit", "operation would make the legacy stream depend on a capturing blocking stream"},
    {907, "hipErrorCapturedEvent", "operation not permitted on an event last recorded in a capturing stream"},
    {908, "hipErrorStreamCaptureWrongThread", "attempt to terminate a thread-local capture sequence from another thread"},
};
/* HIP answers every code; one it does not know is its unknown error. */
static const struct fake_error unknown_error = {999, "hipErrorUnknown", "unknown error"};

static const struct fake_error *error_of(hipError_t e, const char *function) {
  const struct fake_error *known =
      fk_error_of(errors, sizeof errors / sizeof errors[0], e, function);
  return known ? known : &unknown_error;
}
EXPORT const char *hipGetErrorName(hipError_t e) { return error_of(e, "hipGetErrorName")->name; }
EXPORT const char *hipGetErrorString(hipError_t e) {
  return error_of(e, "hipGetErrorString")->text;
}

/* Reads the thread's last error and resets it to hipSuccess. */
EXPORT hipError_t hipGetLastError(void) {
  ENTER("hipGetLastError");
  int e = hip_last_error;
  hip_last_error = hipSuccess;
  pthread_mutex_unlock(&fk_lock);
  return e;
}
/* Reads the thread's last error (and, as HIP's does, stores it again). */
EXPORT hipError_t hipPeekAtLastError(void) {
  int e = hip_last_error;
  ENTER("hipPeekAtLastError");
  RETURN(e);
}

/* ----- devices ---------------------------------------------------------------------------- */

EXPORT hipError_t hipInit(unsigned flags) {
  ENTER("hipInit");
  if (flags != 0) RETURN(hipErrorInvalidValue);
  RETURN(fk_n_devices == 0 ? hipErrorNoDevice : hipSuccess);
}
EXPORT hipError_t hipDriverGetVersion(int *v) {
  ENTER("hipDriverGetVersion");
  if (!v) RETURN(hipErrorInvalidValue);
  *v = version;
  RETURN(hipSuccess);
}
EXPORT hipError_t hipRuntimeGetVersion(int *v) {
  ENTER("hipRuntimeGetVersion");
  if (!v) RETURN(hipErrorInvalidValue);
  *v = version;
  RETURN(hipSuccess);
}
EXPORT hipError_t hipGetDeviceCount(int *count) {
  ENTER("hipGetDeviceCount");
  if (!count) RETURN(hipErrorInvalidValue);
  *count = fk_n_devices;
  RETURN(fk_n_devices == 0 ? hipErrorNoDevice : hipSuccess);
}
EXPORT hipError_t hipSetDevice(int device) {
  ENTER("hipSetDevice");
  if (!valid_device(device)) RETURN(hipErrorInvalidDevice);
  fk_set_current(device);
  RETURN(hipSuccess);
}
EXPORT hipError_t hipGetDevice(int *device) {
  ENTER("hipGetDevice");
  if (!device) RETURN(hipErrorInvalidValue);
  *device = current_device();
  RETURN(hipSuccess);
}
/* The driver-style device handle of an ordinal (the ordinal itself). */
EXPORT hipError_t hipDeviceGet(int *device, int ordinal) {
  ENTER("hipDeviceGet");
  if (!device) RETURN(hipErrorInvalidValue);
  if (!valid_device(ordinal)) RETURN(hipErrorInvalidDevice);
  *device = ordinal;
  RETURN(hipSuccess);
}
EXPORT hipError_t hipDeviceComputeCapability(int *major_out, int *minor_out, int device) {
  ENTER("hipDeviceComputeCapability");
  if (!major_out || !minor_out) RETURN(hipErrorInvalidValue);
  if (!valid_device(device)) RETURN(hipErrorInvalidDevice);
  *major_out = model->major;
  *minor_out = model->minor;
  RETURN(hipSuccess);
}
EXPORT hipError_t hipDeviceCanAccessPeer(int *can, int device, int peer) {
  ENTER("hipDeviceCanAccessPeer");
  RETURN(fk_can_access_peer(can, device, peer));
}
/* From the calling thread's current device to `peer`. */
EXPORT hipError_t hipDeviceEnablePeerAccess(int peer, unsigned flags) {
  ENTER("hipDeviceEnablePeerAccess");
  RETURN(fk_enable_peer(current_device(), peer, flags));
}
EXPORT hipError_t hipDeviceDisablePeerAccess(int peer) {
  ENTER("hipDeviceDisablePeerAccess");
  RETURN(fk_disable_peer(current_device(), peer));
}

/* hipSetDeviceFlags: one scheduling flag, hipDeviceMapHost, hipDeviceLmemResizeToMax; clr keeps
 * only the scheduling flag (what hipGetDeviceFlags answers). */
EXPORT hipError_t hipSetDeviceFlags(unsigned flags) {
  ENTER("hipSetDeviceFlags");
  if (fk_n_devices == 0) RETURN(hipErrorNoDevice);
  unsigned sched = flags & 7u;
  if ((sched != 0 && sched != 1 && sched != 2 && sched != 4) || (flags & ~(7u | 8u | 0x10u)))
    RETURN(hipErrorInvalidValue);
  fk_ctxs[current_device()].flags = sched;
  RETURN(hipSuccess);
}
EXPORT hipError_t hipGetDeviceFlags(unsigned *flags) {
  ENTER("hipGetDeviceFlags");
  if (!flags) RETURN(hipErrorInvalidValue);
  *flags = fk_ctxs[current_device()].flags;
  RETURN(hipSuccess);
}

/* "Destroy all resources and reset all state on the current device": its work completes, its
 * streams, events, modules, device memory and pools go (clr's Device::Reset), its flags and
 * limits are the defaults again. Pinned host memory stays. */
EXPORT hipError_t hipDeviceReset(void) {
  ENTER("hipDeviceReset");
  int dev = current_device();
  fk_cpu_wait();
  fk_ctx_clear(dev, 1, "hipDeviceReset");
  device_defaults(dev);
  RETURN(hipSuccess);
}

/* hipLimitStackSize (0: at most 128 KiB - 16, rounded up to 16) and hipLimitMallocHeapSize (2:
 * below the device's memory), as clr; hipLimitPrintfFifoSize (1): hipErrorUnsupportedLimit. */
EXPORT hipError_t hipDeviceGetLimit(size_t *value, int limit) {
  ENTER("hipDeviceGetLimit");
  if (!value || limit < 0 || limit > 2) RETURN(hipErrorInvalidValue);
  if (limit == 1) RETURN(hipErrorUnsupportedLimit);
  *value = fk_ctxs[current_device()].limits[limit];
  RETURN(hipSuccess);
}
EXPORT hipError_t hipDeviceSetLimit(int limit, size_t value) {
  ENTER("hipDeviceSetLimit");
  if (limit < 0 || limit > 2) RETURN(hipErrorInvalidValue);
  if (limit == 1) RETURN(hipErrorUnsupportedLimit);
  int dev = current_device();
  if (limit == 0 && value > 128 * KIB - 16) RETURN(hipErrorInvalidValue);
  if (limit == 2 && value >= fk_devices[dev].capacity) RETURN(hipErrorInvalidValue);
  fk_ctxs[dev].limits[limit] = limit == 0 ? fk_round_up(value, 16) : value;
  RETURN(hipSuccess);
}

/* Cache and shared-memory bank preferences: checked and ignored, as clr ("No way to set cache
 * config yet"): the getters answer hipFuncCachePreferNone and hipSharedMemBankSizeFourByte. */
EXPORT hipError_t hipDeviceGetCacheConfig(int *config) {
  ENTER("hipDeviceGetCacheConfig");
  if (!config) RETURN(hipErrorInvalidValue);
  *config = 0;
  RETURN(hipSuccess);
}
EXPORT hipError_t hipDeviceSetCacheConfig(int config) {
  ENTER("hipDeviceSetCacheConfig");
  RETURN(config < 0 || config > 3 ? hipErrorInvalidValue : hipSuccess);
}
EXPORT hipError_t hipDeviceGetSharedMemConfig(int *config) {
  ENTER("hipDeviceGetSharedMemConfig");
  if (!config) RETURN(hipErrorInvalidValue);
  *config = 1;
  RETURN(hipSuccess);
}
EXPORT hipError_t hipDeviceSetSharedMemConfig(int config) {
  ENTER("hipDeviceSetSharedMemConfig");
  RETURN(config < 0 || config > 2 ? hipErrorInvalidValue : hipSuccess);
}

/* A bus id as hipDeviceGetPCIBusId writes it ("%04x:%02x:%02x.%01x"), or without the domain. */
EXPORT hipError_t hipDeviceGetByPCIBusId(int *device, const char *id) {
  ENTER("hipDeviceGetByPCIBusId");
  if (!device || !id) RETURN(hipErrorInvalidValue);
  unsigned domain = 0, bus, slot, function = 0;
  char tail;
  if (sscanf(id, "%x:%x:%x.%x%c", &domain, &bus, &slot, &function, &tail) != 4 &&
      (domain = 0, sscanf(id, "%x:%x.%x%c", &bus, &slot, &function, &tail) != 3))
    RETURN(hipErrorInvalidValue);
  for (int d = 0; d < fk_n_devices; d++)
    if (domain == 0 && bus == (unsigned)(model->pci_bus + 32 * d) && slot == 0 && function == 0) {
      *device = d;
      RETURN(hipSuccess);
    }
  RETURN(hipErrorInvalidDevice);
}

/* hipDevP2PAttr (from 0): performance rank (0: one link kind), access, native atomics, array
 * access — each what the peer link allows. */
EXPORT hipError_t hipDeviceGetP2PAttribute(int *value, int attr, int src, int dst) {
  ENTER("hipDeviceGetP2PAttribute");
  if (!value) RETURN(hipErrorInvalidValue);
  if (src == dst || !valid_device(src) || !valid_device(dst)) RETURN(hipErrorInvalidDevice);
  if (attr < 0 || attr > 3) RETURN(hipErrorInvalidValue);
  *value = attr == 0 ? 0 : !fk_peer_denied[src][dst];
  RETURN(hipSuccess);
}

/* 16 bytes: the fake, the device (shared or this process's) and the ordinal. */
EXPORT hipError_t hipDeviceGetUuid(char *uuid, int device) {
  ENTER("hipDeviceGetUuid");
  if (!uuid) RETURN(hipErrorInvalidValue);
  if (!valid_device(device)) RETURN(hipErrorInvalidDevice);
  fk_device_uuid(uuid, "fkhip-", device);
  RETURN(hipSuccess);
}

static const char *device_name(void) {
  return attr_integrated ? "AMD Instinct MI300A" : model->name;
}

/* hipDeviceGetAttribute: HIP's own numbering (hipDeviceAttribute_t). */
static int attribute_of(int attr, int device, int *value) {
  const struct hip_model *m = model;
  switch (attr) {
    case 0: *value = 0; break;                      /* EccEnabled */
    case 2: *value = m->async_engines; break;       /* AsyncEngineCount */
    case 3: *value = 1; break;                      /* CanMapHostMemory */
    case 5: *value = m->clock_khz; break;           /* ClockRate */
    case 6: *value = 0; break;                      /* ComputeMode */
    case 8: *value = 1; break;                      /* ConcurrentKernels */
    case 9: *value = 1; break;                      /* ConcurrentManagedAccess: clr, = hmmSupported */
    case 10: *value = 1; break;                     /* CooperativeLaunch */
    case 11: *value = 1; break;                     /* CooperativeMultiDeviceLaunch */
    case 16: *value = attr_integrated; break;       /* Integrated */
    case 17: *value = 0; break;                     /* IsMultiGpuBoard */
    case 18: *value = 0; break;                     /* KernelExecTimeout */
    case 19: *value = m->l2; break;                 /* L2CacheSize */
    case 23: *value = m->major; break;              /* ComputeCapabilityMajor */
    case 24: *value = 1; break;                     /* ManagedMemory */
    case 25: *value = 32; break;                    /* MaxBlocksPerMultiProcessor */
    case 26: case 27: case 28: *value = 1024; break; /* MaxBlockDimX/Y/Z */
    case 29: *value = 2147483647; break;            /* MaxGridDimX */
    case 30: case 31: *value = major() >= 6 ? 65536 : 2147483647; break;
    case 56: *value = 1024; break;                  /* MaxThreadsPerBlock */
    case 57: *value = 2048; break;                  /* MaxThreadsPerMultiProcessor */
    case 58: *value = 2147483647; break;            /* MaxPitch */
    case 59: *value = m->bus_width; break;          /* MemoryBusWidth */
    case 60: *value = m->memory_clock_khz; break;   /* MemoryClockRate */
    case 61: *value = m->minor; break;              /* ComputeCapabilityMinor */
    case 63: *value = m->cus; break;                /* MultiprocessorCount */
    case 65: *value = 0; break;                     /* PageableMemoryAccess */
    case 67: *value = m->pci_bus + 32 * device; break; /* PciBusId */
    case 68: *value = 0; break;                     /* PciDeviceId: the slot number */
    case 69: *value = 0; break;                     /* PciDomainID */
    case 71: case 72: *value = 65536; break;        /* MaxRegistersPerBlock / PerMultiprocessor */
    case 74: case 75: case 76: *value = 65536; break; /* shared memory per block / optin / per MP */
    case 78: *value = 1; break;                     /* StreamPrioritiesSupported */
    case 81: *value = 256; break;                   /* TextureAlignment */
    case 83: *value = 2147483647; break;            /* TotalConstantMemory */
    case 85: *value = 0; break;                     /* UnifiedAddressing */
    case 87: *value = 64; break;                    /* WarpSize: a wavefront */
    case 88: *value = attr_pools; break;            /* MemoryPoolsSupported */
    case 89:                                        /* VirtualMemoryManagementSupported */
      if (attr_vmm >= 0) *value = attr_vmm;
      else if (major() >= 6) *value = 1;
      else return hipErrorInvalidValue; /* 5.x: no such attribute */
      break;
    case 10000: *value = m->clock_khz; break;       /* ClockInstructionRate */
    case 10011: *value = 1; break;                  /* IsLargeBar */
    case 10012: *value = 1; break;                  /* AsicRevision */
    case 10015: *value = m->cus; break;             /* PhysicalMultiProcessorCount */
    case 10016: *value = 1; break;                  /* FineGrainSupport */
    default: return hipErrorInvalidValue;
  }
  return hipSuccess;
}
EXPORT hipError_t hipDeviceGetAttribute(int *value, int attr, int device) {
  ENTER("hipDeviceGetAttribute");
  if (!value) RETURN(hipErrorInvalidValue);
  if (!valid_device(device)) RETURN(hipErrorInvalidDevice);
  RETURN(attribute_of(attr, device, value));
}
EXPORT hipError_t hipDeviceGetName(char *name, int len, int device) {
  ENTER("hipDeviceGetName");
  if (!name || len <= 0) RETURN(hipErrorInvalidValue);
  if (!valid_device(device)) RETURN(hipErrorInvalidDevice);
  snprintf(name, (size_t)len, "%s", device_name());
  RETURN(hipSuccess);
}
EXPORT hipError_t hipDeviceTotalMem(size_t *bytes, int device) {
  ENTER("hipDeviceTotalMem");
  if (!bytes) RETURN(hipErrorInvalidValue);
  if (!valid_device(device)) RETURN(hipErrorInvalidDevice);
  *bytes = fk_devices[device].capacity;
  RETURN(hipSuccess);
}
EXPORT hipError_t hipDeviceGetPCIBusId(char *out, int len, int device) {
  ENTER("hipDeviceGetPCIBusId");
  if (!out || len <= 0) RETURN(hipErrorInvalidValue);
  if (!valid_device(device)) RETURN(hipErrorInvalidDevice);
  snprintf(out, (size_t)len, "0000:%02x:00.0", model->pci_bus + 32 * device);
  RETURN(hipSuccess);
}

/* hipDeviceProp_t, filled at the offsets of each layout (docs/fakes.md: computed with
 * offsetof against HIP 5.2.3's header and ROCm 6.2's R0600 struct). */
struct prop_layout {
  size_t size, total_global_mem, shared_per_block, regs_per_block, warp_size, max_threads_per_block,
      max_threads_dim, max_grid_size, clock_rate, memory_clock_rate, memory_bus_width,
      total_const_mem, major, minor, multi_processor_count, l2_cache_size,
      max_threads_per_mp, compute_mode, concurrent_kernels, pci_domain, pci_bus, pci_device,
      max_shared_per_mp, can_map_host, gcn_arch_name, integrated, cooperative_launch,
      managed_memory, clock_instruction_rate, is_large_bar, asic_revision, unified_addressing,
      async_engine_count, memory_pools;
};
static const struct prop_layout layout_r0000 = {
    792, 256, 264, 272, 276, 280, 284, 296, 308, 312, 316, 320, 328, 332, 336, 340, 344, 348,
    360, 364, 368, 372, 376, 388, 396, 652, 656, 772, 352, 764, 768, 0, 0, 0};
static const struct prop_layout layout_r0600 = {
    1472, 288, 296, 304, 308, 320, 324, 336, 348, 608, 612, 352, 360, 364, 388, 616, 624, 404,
    576, 592, 584, 588, 1416, 400, 1160, 396, 688, 652, 1424, 1464, 1468, 604, 600, 744};

static void put_int(void *prop, size_t at, int v) {
  if (at) memcpy((char *)prop + at, &v, sizeof v);
}
static void put_size(void *prop, size_t at, unsigned long long v) {
  size_t s = (size_t)v;
  if (at) memcpy((char *)prop + at, &s, sizeof s);
}

static hipError_t properties(void *prop, int device, const struct prop_layout *l) {
  if (!prop) return hipErrorInvalidValue;
  if (!valid_device(device)) return hipErrorInvalidDevice;
  const struct hip_model *m = model;
  memset(prop, 0, l->size);
  snprintf((char *)prop, 256, "%s", device_name());
  snprintf((char *)prop + l->gcn_arch_name, 256, "%s", arch);
  put_size(prop, l->total_global_mem, fk_devices[device].capacity);
  put_size(prop, l->shared_per_block, 65536);
  put_int(prop, l->regs_per_block, 65536);
  put_int(prop, l->warp_size, 64);
  put_int(prop, l->max_threads_per_block, 1024);
  for (int i = 0; i < 3; i++) {
    put_int(prop, l->max_threads_dim + 4 * (size_t)i, 1024);
    put_int(prop, l->max_grid_size + 4 * (size_t)i,
            i == 0 || major() < 6 ? 2147483647 : 65536);
  }
  put_int(prop, l->clock_rate, m->clock_khz);
  put_int(prop, l->memory_clock_rate, m->memory_clock_khz);
  put_int(prop, l->memory_bus_width, m->bus_width);
  put_size(prop, l->total_const_mem, 2147483647);
  put_int(prop, l->major, m->major);
  put_int(prop, l->minor, m->minor);
  put_int(prop, l->multi_processor_count, m->cus);
  put_int(prop, l->l2_cache_size, m->l2);
  put_int(prop, l->max_threads_per_mp, 2048);
  put_int(prop, l->compute_mode, 0);
  put_int(prop, l->concurrent_kernels, 1);
  put_int(prop, l->pci_domain, 0);
  put_int(prop, l->pci_bus, m->pci_bus + 32 * device);
  put_int(prop, l->pci_device, 0);
  put_size(prop, l->max_shared_per_mp, 65536);
  put_int(prop, l->can_map_host, 1);
  put_int(prop, l->integrated, attr_integrated);
  put_int(prop, l->cooperative_launch, 1);
  put_int(prop, l->managed_memory, 1);
  put_int(prop, l->clock_instruction_rate, m->clock_khz);
  put_int(prop, l->is_large_bar, 1);
  put_int(prop, l->asic_revision, 1);
  put_int(prop, l->unified_addressing, 0);
  put_int(prop, l->async_engine_count, m->async_engines);
  put_int(prop, l->memory_pools, attr_pools);
  return hipSuccess;
}
/* The 5.x layout (R0000): what the unsuffixed export fills in every ROCm. */
EXPORT hipError_t hipGetDeviceProperties(void *prop, int device) {
  ENTER("hipGetDeviceProperties");
  RETURN(properties(prop, device, &layout_r0000));
}
/* ROCm 6+ hipDeviceProp_tR0600. */
EXPORT hipError_t hipGetDevicePropertiesR0600(void *prop, int device) {
  ENTER("hipGetDevicePropertiesR0600");
  if (major() < 6) RETURN(hipErrorNotSupported); /* stands in for the missing symbol */
  RETURN(properties(prop, device, &layout_r0600));
}
EXPORT hipError_t hipMemGetInfo(size_t *free_bytes, size_t *total) {
  ENTER("hipMemGetInfo");
  if (!free_bytes || !total) RETURN(hipErrorInvalidValue);
  *total = fk_devices[current_device()].capacity;
  *free_bytes = fk_device_free(current_device());
  RETURN(hipSuccess);
}
EXPORT hipError_t hipDeviceSynchronize(void) {
  ENTER("hipDeviceSynchronize");
  fk_cpu_wait();
  fk_force_ctx(current_device());
  fk_pools_sync();
  RETURN(hipSuccess);
}
EXPORT hipError_t hipDeviceGetStreamPriorityRange(int *least, int *greatest) {
  ENTER("hipDeviceGetStreamPriorityRange");
  /* clr: Priority::Low (1) and Priority::High (-1). */
  if (least) *least = 1;
  if (greatest) *greatest = -1;
  RETURN(hipSuccess);
}

/* ----- plain and managed allocations ------------------------------------------------------ */

static hipError_t do_malloc(void **ptr, size_t size, unsigned flags, int kind) {
  if (!ptr) return hipErrorInvalidValue;
  last_flags = flags;
  if (size == 0) {
    *ptr = NULL;
    return hipSuccess;
  }
  int d = current_device();
  if (kind == R_PLAIN && fk_counted_refuses(d, fk_round_up(size, 256))) return hipErrorOutOfMemory;
  unsigned long long va;
  int rc = fk_alloc(d, kind, size, flags, &va);
  if (rc != FK_OK) return rc;
  last_device = d;
  *ptr = (void *)(uintptr_t)va;
  return hipSuccess;
}
EXPORT hipError_t hipMalloc(void **ptr, size_t size) {
  ENTER("hipMalloc");
  RETURN(do_malloc(ptr, size, 0, R_PLAIN));
}
EXPORT hipError_t hipExtMallocWithFlags(void **ptr, size_t size, unsigned flags) {
  ENTER("hipExtMallocWithFlags");
  /* 0 default, 1 fine-grained, 2 signal memory, 3 uncached (ROCm 6+). */
  if (flags > 3 || (flags == 3 && major() < 6)) RETURN(hipErrorInvalidValue);
  RETURN(do_malloc(ptr, size, flags, R_PLAIN));
}
/* hipMemAttachGlobal (1) or hipMemAttachHost (2). */
EXPORT hipError_t hipMallocManaged(void **ptr, size_t size, unsigned flags) {
  ENTER("hipMallocManaged");
  if (flags != 1 && flags != 2) RETURN(hipErrorInvalidValue);
  RETURN(do_malloc(ptr, size, flags, R_MANAGED));
}


/* "This API performs an implicit hipDeviceSynchronize() call"; an unknown pointer is
 * hipErrorInvalidValue, as hipamd's ihipFree answers. */
static hipError_t do_free(void *ptr, const char *what) {
  if (!ptr) return hipSuccess;
  unsigned long long va = (unsigned long long)(uintptr_t)ptr;
  struct fk_region *r = fk_region_find(R_PLAIN, va);
  if (!r) r = fk_region_find(R_MANAGED, va);
  if (r) {
    sync_device(r->device);
    return fk_free(va, what);
  }
  struct fk_pointer p = fk_pointer_of(va);
  if (p.region && p.region->kind == R_POOL && p.region->va == va) {
    sync_device(p.region->device);
    fk_pool_free_now(va, "hipFree of stream-ordered memory");
    return hipSuccess;
  }
  return hipErrorInvalidValue;
}
EXPORT hipError_t hipFree(void *ptr) {
  ENTER("hipFree");
  RETURN(do_free(ptr, "hipFree"));
}

EXPORT hipError_t hipMemGetAddressRange(void **base, size_t *size, void *ptr) {
  ENTER("hipMemGetAddressRange");
  struct fk_pointer p = fk_pointer_of((unsigned long long)(uintptr_t)ptr);
  if (!p.region || !fk_is_device_kind(p.region->kind)) RETURN(hipErrorNotFound);
  if (base) *base = (void *)(uintptr_t)p.start;
  if (size) *size = p.size;
  RETURN(hipSuccess);
}

/* Rows of `width` bytes, the pitch rounded up to 256 bytes (clr: imagePitchAlignment_); a zero
 * width or height is a null pointer. */
static hipError_t malloc_pitch(void **ptr, size_t *pitch, size_t width, size_t height) {
  if (!ptr || !pitch) return hipErrorInvalidValue;
  if (!width || !height) {
    *ptr = NULL;
    return hipSuccess;
  }
  unsigned long long rounded = fk_round_up(width, 256);
  if (rounded < width || height > ~0ULL / rounded) return hipErrorInvalidValue;
  hipError_t rc = do_malloc(ptr, rounded * height, 0, R_PLAIN);
  if (rc == hipSuccess) *pitch = rounded;
  return rc;
}
EXPORT hipError_t hipMallocPitch(void **ptr, size_t *pitch, size_t width, size_t height) {
  ENTER("hipMallocPitch");
  RETURN(malloc_pitch(ptr, pitch, width, height));
}
/* The driver-style form: the element size (4, 8 or 16) is checked as CUDA's is. */
EXPORT hipError_t hipMemAllocPitch(void **ptr, size_t *pitch, size_t width, size_t height,
                                   unsigned element) {
  ENTER("hipMemAllocPitch");
  if (element != 4 && element != 8 && element != 16) RETURN(hipErrorInvalidValue);
  RETURN(malloc_pitch(ptr, pitch, width, height));
}

/* The size of the allocation holding `ptr` (device or pinned host memory). */
EXPORT hipError_t hipMemPtrGetInfo(void *ptr, size_t *size) {
  ENTER("hipMemPtrGetInfo");
  const struct fk_region *r = fk_region_holding((unsigned long long)(uintptr_t)ptr);
  if (!size || !r) RETURN(hipErrorInvalidValue);
  *size = r->size;
  RETURN(hipSuccess);
}

/* ----- managed memory: advice, prefetch, attachment, range attributes ---------------------- */

/* Memory the driver knows holding all of [ptr, ptr + count) (HIP takes any of its memory
 * here, not managed memory only), or NULL. */
static struct fk_region *known_range(const void *ptr, size_t count) {
  unsigned long long va = (unsigned long long)(uintptr_t)ptr;
  struct fk_region *r = fk_region_holding(va);
  if (!r || !count || va + count < va || va + count > r->va + r->size) return NULL;
  return r;
}

/* hipMemAdvise: as clr, a device is checked unless the advice is read-mostly; the advice is
 * kept for the whole allocation (what hipMemRangeGetAttribute reports). */
EXPORT hipError_t hipMemAdvise(const void *ptr, size_t count, int advice, int device) {
  ENTER("hipMemAdvise");
  int read_mostly = advice == 1 || advice == 2;
  if (!read_mostly && device != FK_LOC_CPU && !valid_device(device)) RETURN(hipErrorInvalidDevice);
  struct fk_region *r = known_range(ptr, count);
  if (!ptr || !count || !r || advice < 1 || advice > 6) RETURN(hipErrorInvalidValue);
  RETURN(fk_advise(r, advice, device));
}

/* A stream-ordered prefetch (NULL: the destination device's null stream, as clr); memory the
 * driver does not know is hipErrorNotSupported (no HMM access to system memory). */
EXPORT hipError_t hipMemPrefetchAsync(const void *ptr, size_t count, int device, void *stream) {
  ENTER("hipMemPrefetchAsync");
  if (!ptr || !count) RETURN(hipErrorInvalidValue);
  unsigned long long handle = (unsigned long long)(uintptr_t)stream;
  if (handle && handle != 1 && handle != 2 && fk_stream_slot(handle) < 0)
    RETURN(hipErrorContextIsDestroyed);
  if (device != FK_LOC_CPU && !valid_device(device)) RETURN(hipErrorInvalidDevice);
  struct fk_region *r = fk_region_holding((unsigned long long)(uintptr_t)ptr);
  if (!r) RETURN(hipErrorNotSupported);
  if (!known_range(ptr, count)) RETURN(hipErrorInvalidValue);
  int owner = device == FK_LOC_CPU || handle ? current_device() : device;
  int clock = fk_clock_of(owner, handle, 0);
  if (!clock) RETURN(hipErrorInvalidValue);
  fk_enqueue(clock);
  r->last_prefetch = device;
  RETURN(hipSuccess);
}

/* hipMemRangeAttribute 1-4, as CUDA's (the accessed-by list ends in hipInvalidDeviceId). */
static hipError_t range_attribute(void *data, size_t size, int attribute, const void *ptr,
                                  size_t count) {
  const struct fk_region *r = known_range(ptr, count);
  if (!data || !size || !r || (attribute != 3 && size != 4) || size % 4) return hipErrorInvalidValue;
  return fk_range_attribute(r, attribute, (int *)data, size / 4);
}
EXPORT hipError_t hipMemRangeGetAttribute(void *data, size_t size, int attribute, const void *ptr,
                                          size_t count) {
  ENTER("hipMemRangeGetAttribute");
  RETURN(range_attribute(data, size, attribute, ptr, count));
}
EXPORT hipError_t hipMemRangeGetAttributes(void **data, size_t *sizes, int *attributes, size_t n,
                                           const void *ptr, size_t count) {
  ENTER("hipMemRangeGetAttributes");
  if (!data || !sizes || !attributes || !n || !ptr || !count) RETURN(hipErrorInvalidValue);
  for (size_t i = 0; i < n; i++) {
    hipError_t rc = range_attribute(data[i], sizes[i], attributes[i], ptr, count);
    if (rc != hipSuccess) RETURN(rc);
  }
  RETURN(hipSuccess);
}

/* Checked as clr checks it, and nothing else: clr queues nothing ("Unclear what should be
 * done for this interface in AMD HMM"). */
EXPORT hipError_t hipStreamAttachMemAsync(void *stream, void *ptr, size_t length, unsigned flags) {
  ENTER("hipStreamAttachMemAsync");
  if (!ptr) RETURN(hipErrorInvalidValue);
  unsigned long long handle = (unsigned long long)(uintptr_t)stream;
  if (handle && handle != 1 && handle != 2 && fk_stream_slot(handle) < 0)
    RETURN(hipErrorContextIsDestroyed);
  if ((flags != 1 && flags != 2 && flags != 4) || (flags == 4 && !stream))
    RETURN(hipErrorInvalidValue);
  const struct fk_region *r = fk_region_holding((unsigned long long)(uintptr_t)ptr);
  if (!r && !length) RETURN(hipErrorInvalidValue);
  if (!r) RETURN(hipErrorInvalidValue); /* no HMM access to system memory */
  if ((r->kind == R_MANAGED || r->kind == R_HOST) && length && length != r->size)
    RETURN(hipErrorInvalidValue);
  RETURN(hipSuccess);
}

/* ----- pinned host memory ------------------------------------------------------------------ */

/* hipHostMallocPortable | Mapped | WriteCombined | NumaUser | Coherent | NonCoherent. */
#define HOST_MALLOC_FLAGS 0xE0000007u
static hipError_t host_malloc(void **ptr, size_t size, unsigned flags) {
  if (!ptr || (flags & ~HOST_MALLOC_FLAGS)) return hipErrorInvalidValue;
  if (size == 0) {
    *ptr = NULL;
    return hipSuccess;
  }
  return fk_host_alloc(current_device(), size, flags, ptr);
}
EXPORT hipError_t hipHostMalloc(void **ptr, size_t size, unsigned flags) {
  ENTER("hipHostMalloc");
  RETURN(host_malloc(ptr, size, flags));
}
EXPORT hipError_t hipMallocHost(void **ptr, size_t size) {
  ENTER("hipMallocHost");
  RETURN(host_malloc(ptr, size, 0));
}
/* Synchronises every device first (pinned memory is any device's), as hipamd does. */
static hipError_t host_free(void *ptr, const char *what) {
  if (!ptr) return hipSuccess;
  if (!fk_region_find(R_HOST, (unsigned long long)(uintptr_t)ptr)) return hipErrorInvalidValue;
  sync_device(-1);
  return fk_host_free(ptr, what);
}
EXPORT hipError_t hipHostFree(void *ptr) {
  ENTER("hipHostFree");
  RETURN(host_free(ptr, "hipHostFree"));
}
EXPORT hipError_t hipFreeHost(void *ptr) {
  ENTER("hipFreeHost");
  RETURN(host_free(ptr, "hipFreeHost"));
}
/* hipHostRegisterDefault | Portable | Mapped | IoMemory | ReadOnly. */
EXPORT hipError_t hipHostRegister(void *ptr, size_t size, unsigned flags) {
  ENTER("hipHostRegister");
  if (!ptr || size == 0 || (flags & ~0xfu)) RETURN(hipErrorInvalidValue);
  int rc = fk_host_register(ptr, size, flags, current_device());
  if (rc == -1) RETURN(at_least(6, 0) ? hipErrorHostMemoryAlreadyRegistered : hipErrorInvalidValue);
  RETURN(rc);
}
EXPORT hipError_t hipHostUnregister(void *ptr) {
  ENTER("hipHostUnregister");
  if (!ptr) RETURN(hipErrorInvalidValue);
  int rc = fk_host_unregister(ptr, "hipHostUnregister");
  if (rc == FK_INVALID_VALUE && at_least(6, 0)) RETURN(hipErrorHostMemoryNotRegistered);
  RETURN(rc);
}
EXPORT hipError_t hipHostGetDevicePointer(void **out, void *ptr, unsigned flags) {
  ENTER("hipHostGetDevicePointer");
  if (!out || flags || !fk_pinned_range((unsigned long long)(uintptr_t)ptr, 1))
    RETURN(hipErrorInvalidValue);
  *out = ptr;
  RETURN(hipSuccess);
}

/* The flags of a hipHostMalloc allocation (registered memory: hipErrorInvalidValue, as clr,
 * "to match with Nvidia behaviour"). */
EXPORT hipError_t hipHostGetFlags(unsigned *flags, void *ptr) {
  ENTER("hipHostGetFlags");
  const struct fk_region *r = fk_region_holding((unsigned long long)(uintptr_t)ptr);
  if (!flags || !ptr || !r || r->kind != R_HOST) RETURN(hipErrorInvalidValue);
  *flags = r->flags;
  RETURN(hipSuccess);
}

/* ----- pointer attributes ------------------------------------------------------------------ */

/* hipPointerAttribute_t: 32 bytes in every ROCm; the memory type's values changed in 6.0. */
struct hip_pointer_attribute {
  int type;
  int device;
  void *device_pointer;
  void *host_pointer;
  int is_managed;
  unsigned allocation_flags;
};
_Static_assert(sizeof(struct hip_pointer_attribute) == 32, "hipPointerAttribute_t is 32 bytes");

/* hipMemoryType of a region: ROCm 5 (Host 0, Device 1, Managed 4) or 6 (Host 1, Device 2,
 * Managed 3; Unregistered 0). */
static int memory_type(const struct fk_region *r) {
  int host = r->kind == R_HOST || r->kind == R_REGISTERED;
  if (major() >= 6) return host ? 1 : r->kind == R_MANAGED ? 3 : 2;
  return host ? 0 : r->kind == R_MANAGED && at_least(5, 3) ? 4 : 1;
}

EXPORT hipError_t hipPointerGetAttributes(struct hip_pointer_attribute *out, const void *ptr) {
  ENTER("hipPointerGetAttributes");
  if (!out || !ptr) RETURN(hipErrorInvalidValue);
  memset(out, 0, sizeof *out);
  struct fk_pointer p = fk_pointer_of((unsigned long long)(uintptr_t)ptr);
  if (!p.region) {
    if (major() < 6) RETURN(hipErrorInvalidValue);
    out->type = 0;     /* hipMemoryTypeUnregistered */
    out->device = -2;  /* hipInvalidDeviceId */
    RETURN(hipSuccess);
  }
  const struct fk_region *r = p.region;
  out->type = memory_type(r);
  out->device = r->device;
  out->device_pointer = (void *)ptr;
  if (r->kind == R_HOST || r->kind == R_REGISTERED || r->kind == R_MANAGED) out->host_pointer = (void *)ptr;
  out->is_managed = r->kind == R_MANAGED;
  out->allocation_flags = r->flags;
  RETURN(hipSuccess);
}

/* hipPointerGetAttribute: CUDA's numbering (HIP_POINTER_ATTRIBUTE_*). */
static hipError_t pointer_attribute(void *data, int attr, unsigned long long ptr) {
  if (!data) return hipErrorInvalidValue;
  struct fk_pointer p = fk_pointer_of(ptr);
  const struct fk_region *r = p.region;
  if (!r) return hipErrorInvalidValue;
  switch (attr) {
    case 2: *(unsigned *)data = (unsigned)memory_type(r); break;
    case 3: *(void **)data = (void *)(uintptr_t)ptr; break;
    case 4: *(void **)data = (void *)(uintptr_t)ptr; break;
    case 6: *(int *)data = 0; break;
    case 7: *(unsigned long long *)data = r->id; break;
    case 8: *(int *)data = r->kind == R_MANAGED; break;
    case 9: *(int *)data = r->device; break;
    case 11: *(void **)data = (void *)(uintptr_t)p.start; break;
    case 12: *(size_t *)data = p.size; break;
    case 13: *(int *)data = 1; break;
    case 17:
      *(void **)data = r->kind == R_POOL ? (void *)(uintptr_t)fk_pool_handle(r->pool) : NULL;
      break;
    default: return hipErrorInvalidValue;
  }
  return hipSuccess;
}
EXPORT hipError_t hipPointerGetAttribute(void *data, int attr, void *ptr) {
  ENTER("hipPointerGetAttribute");
  RETURN(pointer_attribute(data, attr, (unsigned long long)(uintptr_t)ptr));
}
EXPORT hipError_t hipDrvPointerGetAttributes(unsigned n, int *attrs, void **data, void *ptr) {
  ENTER("hipDrvPointerGetAttributes");
  if (!attrs || !data || !n) RETURN(hipErrorInvalidValue);
  for (unsigned i = 0; i < n; i++) {
    hipError_t rc = pointer_attribute(data[i], attrs[i], (unsigned long long)(uintptr_t)ptr);
    if (rc != hipSuccess) RETURN(rc);
  }
  RETURN(hipSuccess);
}

/* ----- copies ------------------------------------------------------------------------------ */

static int pageable(unsigned long long p, unsigned long long size) {
  return !fk_device_range(p, size, current_device()) && !fk_pinned_range(p, size);
}

/* The sides of a hipMemcpyKind (hipMemcpyHostToHost 0 ... Default 4). */
static int sides_of(int kind, int *dst, int *src) {
  static const int d[] = {SIDE_HOST, SIDE_DEVICE, SIDE_HOST, SIDE_DEVICE, SIDE_ANY};
  static const int s[] = {SIDE_HOST, SIDE_HOST, SIDE_DEVICE, SIDE_DEVICE, SIDE_ANY};
  if (kind < 0 || kind > 4) return 0;
  *dst = d[kind];
  *src = s[kind];
  return 1;
}

/* A copy on `stream`: `sync` 1 for the synchronous calls. */
static hipError_t copy(void *dst, const void *src, size_t n, int kind, void *stream, int pt, int sync,
                       const char *what) {
  int dst_side, src_side;
  if (!sides_of(kind, &dst_side, &src_side)) return hipErrorInvalidMemcpyDirection;
  if (n && (!dst || !src)) return hipErrorInvalidValue;
  CHECK_STREAM(clock, stream, pt);
  unsigned long long d = (unsigned long long)(uintptr_t)dst, s = (unsigned long long)(uintptr_t)src;
  int wait;
  if (sync) {
    /* From ROCm 5.6 a same-device device-to-device copy does not wait. */
    int d2d = n && fk_device_range(d, n, current_device()) && fk_device_range(s, n, current_device());
    wait = d2d && at_least(5, 6) ? FK_ASYNC : FK_SYNC_FULL;
  } else {
    wait = n && (pageable(d, n) || pageable(s, n)) ? FK_SYNC_FULL : FK_ASYNC;
  }
  return fk_copy(current_device(), clock, d, dst_side, s, src_side, n, wait, what);
}
EXPORT hipError_t hipMemcpy(void *dst, const void *src, size_t n, int kind) {
  ENTER("hipMemcpy");
  RETURN(copy(dst, src, n, kind, NULL, 0, 1, "hipMemcpy"));
}
EXPORT hipError_t hipMemcpy_spt(void *dst, const void *src, size_t n, int kind) {
  ENTER("hipMemcpy_spt");
  RETURN(copy(dst, src, n, kind, NULL, 1, 1, "hipMemcpy_spt"));
}
EXPORT hipError_t hipMemcpyWithStream(void *dst, const void *src, size_t n, int kind, void *stream) {
  ENTER("hipMemcpyWithStream");
  RETURN(copy(dst, src, n, kind, stream, 0, 1, "hipMemcpyWithStream"));
}
EXPORT hipError_t hipMemcpyAsync(void *dst, const void *src, size_t n, int kind, void *stream) {
  ENTER("hipMemcpyAsync");
  RETURN(copy(dst, src, n, kind, stream, 0, 0, "hipMemcpyAsync"));
}
EXPORT hipError_t hipMemcpyAsync_spt(void *dst, const void *src, size_t n, int kind, void *stream) {
  ENTER("hipMemcpyAsync_spt");
  RETURN(copy(dst, src, n, kind, stream, 1, 0, "hipMemcpyAsync_spt"));
}
EXPORT hipError_t hipMemcpyHtoD(void *dst, void *src, size_t n) {
  ENTER("hipMemcpyHtoD");
  RETURN(copy(dst, src, n, 1, NULL, 0, 1, "hipMemcpyHtoD"));
}
EXPORT hipError_t hipMemcpyDtoH(void *dst, void *src, size_t n) {
  ENTER("hipMemcpyDtoH");
  RETURN(copy(dst, src, n, 2, NULL, 0, 1, "hipMemcpyDtoH"));
}
EXPORT hipError_t hipMemcpyDtoD(void *dst, void *src, size_t n) {
  ENTER("hipMemcpyDtoD");
  RETURN(copy(dst, src, n, 3, NULL, 0, 1, "hipMemcpyDtoD"));
}
EXPORT hipError_t hipMemcpyHtoDAsync(void *dst, void *src, size_t n, void *stream) {
  ENTER("hipMemcpyHtoDAsync");
  RETURN(copy(dst, src, n, 1, stream, 0, 0, "hipMemcpyHtoDAsync"));
}
EXPORT hipError_t hipMemcpyDtoHAsync(void *dst, void *src, size_t n, void *stream) {
  ENTER("hipMemcpyDtoHAsync");
  RETURN(copy(dst, src, n, 2, stream, 0, 0, "hipMemcpyDtoHAsync"));
}
EXPORT hipError_t hipMemcpyDtoDAsync(void *dst, void *src, size_t n, void *stream) {
  ENTER("hipMemcpyDtoDAsync");
  RETURN(copy(dst, src, n, 3, stream, 0, 0, "hipMemcpyDtoDAsync"));
}

/* ----- memsets ----------------------------------------------------------------------------- */

/* `sync` 1 for hipMemset / hipMemsetD*: they wait (ROCm 5); from ROCm 6 not for the start of a
 * plain allocation. */
static hipError_t memset_on(void *dst, unsigned value, int width, size_t count, void *stream, int pt,
                            int sync, const char *what) {
  CHECK_STREAM(clock, stream, pt);
  unsigned long long d = (unsigned long long)(uintptr_t)dst;
  int wait = FK_ASYNC;
  if (sync && (major() < 6 || !fk_region_find(R_PLAIN, d))) wait = FK_SYNC_FULL;
  return fk_memset(current_device(), clock, d, value, width, count, wait, what);
}
EXPORT hipError_t hipMemset(void *dst, int value, size_t n) {
  ENTER("hipMemset");
  RETURN(memset_on(dst, (unsigned)value & 0xff, 1, n, NULL, 0, 1, "hipMemset"));
}
EXPORT hipError_t hipMemset_spt(void *dst, int value, size_t n) {
  ENTER("hipMemset_spt");
  RETURN(memset_on(dst, (unsigned)value & 0xff, 1, n, NULL, 1, 1, "hipMemset_spt"));
}
EXPORT hipError_t hipMemsetAsync(void *dst, int value, size_t n, void *stream) {
  ENTER("hipMemsetAsync");
  RETURN(memset_on(dst, (unsigned)value & 0xff, 1, n, stream, 0, 0, "hipMemsetAsync"));
}
EXPORT hipError_t hipMemsetD8(void *dst, unsigned char value, size_t n) {
  ENTER("hipMemsetD8");
  RETURN(memset_on(dst, value, 1, n, NULL, 0, 1, "hipMemsetD8"));
}
EXPORT hipError_t hipMemsetD8Async(void *dst, unsigned char value, size_t n, void *stream) {
  ENTER("hipMemsetD8Async");
  RETURN(memset_on(dst, value, 1, n, stream, 0, 0, "hipMemsetD8Async"));
}
EXPORT hipError_t hipMemsetD16(void *dst, unsigned short value, size_t n) {
  ENTER("hipMemsetD16");
  RETURN(memset_on(dst, value, 2, n, NULL, 0, 1, "hipMemsetD16"));
}
EXPORT hipError_t hipMemsetD16Async(void *dst, unsigned short value, size_t n, void *stream) {
  ENTER("hipMemsetD16Async");
  RETURN(memset_on(dst, value, 2, n, stream, 0, 0, "hipMemsetD16Async"));
}
EXPORT hipError_t hipMemsetD32(void *dst, int value, size_t n) {
  ENTER("hipMemsetD32");
  RETURN(memset_on(dst, (unsigned)value, 4, n, NULL, 0, 1, "hipMemsetD32"));
}
EXPORT hipError_t hipMemsetD32Async(void *dst, int value, size_t n, void *stream) {
  ENTER("hipMemsetD32Async");
  RETURN(memset_on(dst, (unsigned)value, 4, n, stream, 0, 0, "hipMemsetD32Async"));
}

/* ----- peer and 2D copies, 2D memsets ------------------------------------------------------- */

/* hipMemcpyPeer: a device-to-device copy on the null stream that returns once it completed
 * (clr: ihipMemcpy, not async); hipMemcpyPeerAsync: ordered on its stream only. Each side must
 * be memory of the device named. */
static hipError_t copy_peer(void *dst, int dst_device, const void *src, int src_device, size_t n,
                            void *stream, int async, const char *what) {
  if (!valid_device(dst_device) || !valid_device(src_device)) return hipErrorInvalidDevice;
  CHECK_STREAM(clock, stream, 0);
  if (!n) return hipSuccess;
  unsigned long long d = (unsigned long long)(uintptr_t)dst, s = (unsigned long long)(uintptr_t)src;
  const struct fk_region *dr = fk_region_holding(d), *sr = fk_region_holding(s);
  if (!dr || !sr || dr->device != dst_device || sr->device != src_device ||
      !fk_device_range(d, n, dst_device) || !fk_device_range(s, n, src_device))
    return hipErrorInvalidValue;
  return fk_copy_2d(clock, dst_device, d, n, SIDE_DEVICE, src_device, s, n, SIDE_DEVICE, n, 1,
                    async ? FK_ASYNC : FK_SYNC_FULL, 0, what);
}
EXPORT hipError_t hipMemcpyPeer(void *dst, int dst_device, const void *src, int src_device,
                                size_t n) {
  ENTER("hipMemcpyPeer");
  RETURN(copy_peer(dst, dst_device, src, src_device, n, NULL, 0, "hipMemcpyPeer"));
}
EXPORT hipError_t hipMemcpyPeerAsync(void *dst, int dst_device, const void *src, int src_device,
                                     size_t n, void *stream) {
  ENTER("hipMemcpyPeerAsync");
  RETURN(copy_peer(dst, dst_device, src, src_device, n, stream, 1, "hipMemcpyPeerAsync"));
}

/* As clr's hipMemcpy2D: nothing for a zero width or height; a pitch below the width is
 * hipErrorInvalidPitchValue; it waits as hipMemcpy does (the async form as hipMemcpyAsync:
 * synchronous over pageable memory). */
static hipError_t copy_2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                          size_t height, int kind, void *stream, int pt, int sync,
                          const char *what) {
  int dst_side, src_side;
  if (!sides_of(kind, &dst_side, &src_side)) return hipErrorInvalidMemcpyDirection;
  CHECK_STREAM_OR(clock, stream, pt, hipErrorInvalidValue); /* clr: hipMemcpy2DValidateParams */
  if (!width || !height) return hipSuccess;
  if (width > dpitch || width > spitch) return hipErrorInvalidPitchValue;
  if (!dst || !src) return hipErrorInvalidValue;
  unsigned long long d = (unsigned long long)(uintptr_t)dst, s = (unsigned long long)(uintptr_t)src;
  unsigned long long dspan = fk_rows_span(width, height, dpitch), sspan = fk_rows_span(width, height, spitch);
  int wait = sync || pageable(d, dspan) || pageable(s, sspan) ? FK_SYNC_FULL : FK_ASYNC;
  int device = current_device();
  return fk_copy_2d(clock, device, d, dpitch, dst_side, device, s, spitch, src_side, width, height,
                    wait, 0, what);
}
EXPORT hipError_t hipMemcpy2D(void *dst, size_t dpitch, const void *src, size_t spitch,
                              size_t width, size_t height, int kind) {
  ENTER("hipMemcpy2D");
  RETURN(copy_2d(dst, dpitch, src, spitch, width, height, kind, NULL, 0, 1, "hipMemcpy2D"));
}
EXPORT hipError_t hipMemcpy2D_spt(void *dst, size_t dpitch, const void *src, size_t spitch,
                                  size_t width, size_t height, int kind) {
  ENTER("hipMemcpy2D_spt");
  RETURN(copy_2d(dst, dpitch, src, spitch, width, height, kind, NULL, 1, 1, "hipMemcpy2D_spt"));
}
EXPORT hipError_t hipMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch,
                                   size_t width, size_t height, int kind, void *stream) {
  ENTER("hipMemcpy2DAsync");
  RETURN(copy_2d(dst, dpitch, src, spitch, width, height, kind, stream, 0, 0, "hipMemcpy2DAsync"));
}

/* hipMemset2D: `height` rows of `width` bytes, `pitch` apart; it waits as hipMemset does. */
static hipError_t memset_2d(void *dst, size_t pitch, int value, size_t width, size_t height,
                            void *stream, int pt, int sync, const char *what) {
  CHECK_STREAM(clock, stream, pt);
  if (!width || !height) return hipSuccess;
  if (height > 1 && pitch < width) return hipErrorInvalidPitchValue;
  unsigned long long d = (unsigned long long)(uintptr_t)dst;
  int wait = FK_ASYNC;
  if (sync && (major() < 6 || !fk_region_find(R_PLAIN, d))) wait = FK_SYNC_FULL;
  return fk_memset_2d(current_device(), clock, d, pitch, (unsigned)value & 0xff, 1, width, height,
                      wait, what);
}
EXPORT hipError_t hipMemset2D(void *dst, size_t pitch, int value, size_t width, size_t height) {
  ENTER("hipMemset2D");
  RETURN(memset_2d(dst, pitch, value, width, height, NULL, 0, 1, "hipMemset2D"));
}
EXPORT hipError_t hipMemset2D_spt(void *dst, size_t pitch, int value, size_t width, size_t height) {
  ENTER("hipMemset2D_spt");
  RETURN(memset_2d(dst, pitch, value, width, height, NULL, 1, 1, "hipMemset2D_spt"));
}
EXPORT hipError_t hipMemset2DAsync(void *dst, size_t pitch, int value, size_t width, size_t height,
                                   void *stream) {
  ENTER("hipMemset2DAsync");
  RETURN(memset_2d(dst, pitch, value, width, height, stream, 0, 0, "hipMemset2DAsync"));
}

/* ----- streams ------------------------------------------------------------------------------ */

static hipError_t stream_create(void **stream, unsigned flags, int priority) {
  if (!stream || flags > 1) return hipErrorInvalidValue;
  /* clamped to [High (-1), Low (1)] */
  if (priority < -1) priority = -1;
  if (priority > 1) priority = 1;
  unsigned long long handle = fk_stream_new(current_device(), flags, priority);
  if (!handle) return hipErrorOutOfMemory;
  *stream = (void *)(uintptr_t)handle;
  return hipSuccess;
}
EXPORT hipError_t hipStreamCreate(void **stream) {
  ENTER("hipStreamCreate");
  RETURN(stream_create(stream, 0, 0));
}
EXPORT hipError_t hipStreamCreateWithFlags(void **stream, unsigned flags) {
  ENTER("hipStreamCreateWithFlags");
  RETURN(stream_create(stream, flags, 0));
}
EXPORT hipError_t hipStreamCreateWithPriority(void **stream, unsigned flags, int priority) {
  ENTER("hipStreamCreateWithPriority");
  RETURN(stream_create(stream, flags, priority));
}
/* clr: the null and per-thread streams are invalid handles, any other it does not know (a
 * destroyed one) hipErrorContextIsDestroyed. */
EXPORT hipError_t hipStreamDestroy(void *stream) {
  ENTER("hipStreamDestroy");
  unsigned long long handle = (unsigned long long)(uintptr_t)stream;
  int slot = fk_stream_slot(handle);
  if (!handle || handle == 1 || handle == 2) RETURN(hipErrorInvalidHandle);
  if (slot < 0) RETURN(hipErrorContextIsDestroyed);
  fk_stream_destroy(slot);
  RETURN(hipSuccess);
}

static hipError_t stream_synchronize(void *stream, int pt) {
  CHECK_STREAM(clock, stream, pt);
  if (fk_capture_sync_check(clock, 0, "hipStreamSynchronize") != FK_OK) return FK_CAPTURE_UNSUPPORTED;
  fk_wait_for_clock(clock);
  fk_pools_sync();
  return hipSuccess;
}
EXPORT hipError_t hipStreamSynchronize(void *stream) {
  ENTER("hipStreamSynchronize");
  RETURN(stream_synchronize(stream, 0));
}
EXPORT hipError_t hipStreamSynchronize_spt(void *stream) {
  ENTER("hipStreamSynchronize_spt");
  RETURN(stream_synchronize(stream, 1));
}
static hipError_t stream_query(void *stream, int pt) {
  CHECK_STREAM(clock, stream, pt);
  if (fk_capture_sync_check(clock, 0, "hipStreamQuery") != FK_OK) return FK_CAPTURE_UNSUPPORTED;
  if (fk_stream_idle(clock)) return hipSuccess;
  if (!fk_polled((unsigned long long)clock, fk_clocks[clock].recorded)) return hipErrorNotReady;
  fk_wait_for_clock(clock); /* polled long enough: fk_polled */
  return fk_stream_idle(clock) ? hipSuccess : hipErrorNotReady;
}
EXPORT hipError_t hipStreamQuery(void *stream) {
  ENTER("hipStreamQuery");
  RETURN(stream_query(stream, 0));
}
EXPORT hipError_t hipStreamQuery_spt(void *stream) {
  ENTER("hipStreamQuery_spt");
  RETURN(stream_query(stream, 1));
}
static hipError_t stream_wait_event(void *stream, void *event, unsigned flags, int pt) {
  struct fk_event *e = fk_event_of((unsigned long long)(uintptr_t)event);
  if (!e) return hipErrorInvalidHandle;
  CHECK_STREAM_OR(clock, stream, pt, hipErrorInvalidHandle); /* clr: hipStreamWaitEvent_common */
  if (flags != 0) return hipErrorInvalidValue;
  int handled, rc = fk_capture_wait(clock, e, &handled);
  if (rc != FK_OK || handled) {
    if (rc == FK_OK) fk_gpu_wait_count++;
    return rc;
  }
  fk_implicit(clock);
  if (e->recorded) fk_wait_add(clock, e->clock, e->seq, 1);
  else fk_gpu_wait_count++;
  fk_progress();
  return hipSuccess;
}
EXPORT hipError_t hipStreamWaitEvent(void *stream, void *event, unsigned flags) {
  ENTER("hipStreamWaitEvent");
  RETURN(stream_wait_event(stream, event, flags, 0));
}
EXPORT hipError_t hipStreamWaitEvent_spt(void *stream, void *event, unsigned flags) {
  ENTER("hipStreamWaitEvent_spt");
  RETURN(stream_wait_event(stream, event, flags, 1));
}
static hipError_t stream_get(void *stream, unsigned *flags, int *priority, int *device, int pt) {
  if (!flags && !priority && !device) return hipErrorInvalidValue;
  CHECK_STREAM(clock, stream, pt);
  int slot = fk_stream_slot((unsigned long long)(uintptr_t)stream);
  if (flags) *flags = slot >= 0 ? fk_streams[slot].flags : 0;
  if (priority) *priority = slot >= 0 ? fk_streams[slot].priority : 0;
  if (device) *device = fk_ctxs[fk_clocks[clock].ctx].device;
  return hipSuccess;
}
/* clr: the null stream has no flags to give (hipErrorInvalidValue). */
EXPORT hipError_t hipStreamGetFlags(void *stream, unsigned *flags) {
  ENTER("hipStreamGetFlags");
  RETURN(flags && stream ? stream_get(stream, flags, NULL, NULL, 0) : hipErrorInvalidValue);
}
EXPORT hipError_t hipStreamGetFlags_spt(void *stream, unsigned *flags) {
  ENTER("hipStreamGetFlags_spt");
  RETURN(flags ? stream_get(stream, flags, NULL, NULL, 1) : hipErrorInvalidValue);
}
EXPORT hipError_t hipStreamGetPriority(void *stream, int *priority) {
  ENTER("hipStreamGetPriority");
  RETURN(priority ? stream_get(stream, NULL, priority, NULL, 0) : hipErrorInvalidValue);
}
EXPORT hipError_t hipStreamGetPriority_spt(void *stream, int *priority) {
  ENTER("hipStreamGetPriority_spt");
  RETURN(priority ? stream_get(stream, NULL, priority, NULL, 1) : hipErrorInvalidValue);
}
EXPORT hipError_t hipStreamGetDevice(void *stream, int *device) {
  ENTER("hipStreamGetDevice");
  RETURN(device ? stream_get(stream, NULL, NULL, device, 0) : hipErrorInvalidValue);
}
EXPORT hipError_t hipLaunchHostFunc(void *stream, void (*fn)(void *), void *data) {
  ENTER("hipLaunchHostFunc");
  int clock = fk_clock_of(current_device(), (unsigned long long)(uintptr_t)stream, 0);
  if (!clock) RETURN(hipErrorContextIsDestroyed);
  if (!fn) RETURN(hipErrorInvalidValue);
  RETURN(fk_launch_host(clock, fn, data) ? hipSuccess : hipErrorOutOfMemory);
}
struct callback {
  void (*fn)(void *, int, void *);
  void *stream, *data;
};
static void run_callback(void *p) {
  struct callback *c = (struct callback *)p;
  c->fn(c->stream, hipSuccess, c->data);
  free(c);
}
EXPORT hipError_t hipStreamAddCallback(void *stream, void (*fn)(void *, int, void *), void *data,
                                       unsigned flags) {
  ENTER("hipStreamAddCallback");
  int clock = fk_clock_of(current_device(), (unsigned long long)(uintptr_t)stream, 0);
  if (!clock) RETURN(hipErrorContextIsDestroyed);
  if (!fn || flags) RETURN(hipErrorInvalidValue);
  struct callback *c = malloc(sizeof *c);
  if (!c) RETURN(hipErrorOutOfMemory);
  c->fn = fn;
  c->stream = stream;
  c->data = data;
  if (!fk_launch_host(clock, run_callback, c)) {
    free(c);
    RETURN(hipErrorOutOfMemory);
  }
  RETURN(hipSuccess);
}

/* ----- events ------------------------------------------------------------------------------ */

/* hipEventDefault | BlockingSync | DisableTiming | Interprocess | ReleaseToDevice | ...System. */
#define EVENT_FLAGS 0xC0000007u
static hipError_t event_create(void **event, unsigned flags) {
  if (!event || (flags & ~EVENT_FLAGS)) return hipErrorInvalidValue;
  unsigned long long handle = fk_event_new(current_device(), flags);
  if (!handle) return hipErrorOutOfMemory;
  *event = (void *)(uintptr_t)handle;
  return hipSuccess;
}
EXPORT hipError_t hipEventCreateWithFlags(void **event, unsigned flags) {
  ENTER("hipEventCreateWithFlags");
  RETURN(event_create(event, flags));
}
EXPORT hipError_t hipEventCreate(void **event) {
  ENTER("hipEventCreate");
  RETURN(event_create(event, 0));
}
EXPORT hipError_t hipEventRecord(void *event, void *stream) {
  ENTER("hipEventRecord");
  struct fk_event *e = fk_event_of((unsigned long long)(uintptr_t)event);
  int clock = fk_clock_of(current_device(), (unsigned long long)(uintptr_t)stream, 0);
  if (!e) RETURN(hipErrorInvalidHandle);
  if (!clock) RETURN(hipErrorContextIsDestroyed);
  fk_event_record(e, clock);
  RETURN(hipSuccess);
}
/* A never-recorded event is complete (hipamd). */
EXPORT hipError_t hipEventQuery(void *event) {
  ENTER("hipEventQuery");
  struct fk_event *e = fk_event_of((unsigned long long)(uintptr_t)event);
  if (!e) RETURN(hipErrorInvalidHandle);
  int captured = fk_capture_event_check(e, "hipEventQuery");
  if (captured != FK_OK) RETURN(captured);
  if (fk_event_done(e)) RETURN(hipSuccess);
  if (!fk_polled((unsigned long long)(uintptr_t)event, (unsigned long long)e->clock << 40 ^ e->seq))
    RETURN(hipErrorNotReady);
  fk_cpu_wait(); /* polled long enough: fk_polled */
  fk_force(e->clock, e->seq, 0);
  RETURN(fk_event_done(e) ? hipSuccess : hipErrorNotReady);
}
EXPORT hipError_t hipEventSynchronize(void *event) {
  ENTER("hipEventSynchronize");
  struct fk_event *e = fk_event_of((unsigned long long)(uintptr_t)event);
  if (!e) RETURN(hipErrorInvalidHandle);
  int captured = fk_capture_event_check(e, "hipEventSynchronize");
  if (captured != FK_OK) RETURN(captured);
  /* Waiting for an event waits for the work before it on its stream. */
  fk_cpu_wait();
  if (e->recorded) fk_force(e->clock, e->seq, 0);
  fk_event_done(e);
  fk_pools_sync();
  RETURN(hipSuccess);
}
/* An event destroyed already: hipErrorContextIsDestroyed from ROCm 6 (clr's event set),
 * hipErrorInvalidHandle before (hipamd); the null event: hipErrorInvalidHandle. */
EXPORT hipError_t hipEventDestroy(void *event) {
  ENTER("hipEventDestroy");
  struct fk_event *e = fk_event_of((unsigned long long)(uintptr_t)event);
  if (!e) RETURN(event && major() >= 6 ? hipErrorContextIsDestroyed : hipErrorInvalidHandle);
  e->serial = 0;
  RETURN(hipSuccess);
}
/* As hipamd: ms NULL invalid value; an unknown, unrecorded or untimed event invalid handle;
 * one not complete not ready; the same event 0 ms. */
EXPORT hipError_t hipEventElapsedTime(float *ms, void *start, void *stop) {
  ENTER("hipEventElapsedTime");
  if (!ms) RETURN(hipErrorInvalidValue);
  struct fk_event *a = fk_event_of((unsigned long long)(uintptr_t)start);
  struct fk_event *b = fk_event_of((unsigned long long)(uintptr_t)stop);
  if (!a || !b || a->ctx != b->ctx || !a->recorded || !b->recorded || (a->flags & 2) ||
      (b->flags & 2))
    RETURN(hipErrorInvalidHandle);
  if (!fk_event_done(a) || !fk_event_done(b)) RETURN(hipErrorNotReady);
  *ms = a == b ? 0.0f : fk_event_ms(a, b);
  RETURN(hipSuccess);
}

/* ----- modules and launches ---------------------------------------------------------------- */

EXPORT hipError_t hipModuleLoadData(void **module, const void *image) {
  ENTER("hipModuleLoadData");
  if (!module || !image) RETURN(hipErrorInvalidValue);
  int code;
  unsigned long long handle = fk_module_load(current_device(), image, 0, FK_EM_AMDGPU, 0, &code);
  if (handle) *module = (void *)(uintptr_t)handle;
  RETURN(code);
}
EXPORT hipError_t hipModuleLoadDataEx(void **module, const void *image, unsigned n, void *options,
                                      void **values) {
  ENTER("hipModuleLoadDataEx");
  (void)n;
  (void)options;
  (void)values;
  if (!module || !image) RETURN(hipErrorInvalidValue);
  int code;
  unsigned long long handle = fk_module_load(current_device(), image, 0, FK_EM_AMDGPU, 0, &code);
  if (handle) *module = (void *)(uintptr_t)handle;
  RETURN(code);
}
/* A code object from a file: its bytes, as hipModuleLoadData takes them. */
EXPORT hipError_t hipModuleLoad(void **module, const char *path) {
  ENTER("hipModuleLoad");
  if (!module || !path) RETURN(hipErrorInvalidValue);
  int code;
  unsigned long long size;
  char *bytes = fk_read_file(path, &size, &code);
  if (!bytes) RETURN(code == FK_NOT_FOUND ? hipErrorFileNotFound : code);
  unsigned long long handle =
      fk_module_load(current_device(), bytes, size ? size : 1, FK_EM_AMDGPU, 0, &code);
  free(bytes);
  if (handle) *module = (void *)(uintptr_t)handle;
  RETURN(code);
}
EXPORT hipError_t hipModuleGetFunction(void **function, void *module, const char *name) {
  ENTER("hipModuleGetFunction");
  if (!function || !name) RETURN(hipErrorInvalidValue);
  int code;
  unsigned long long handle = fk_function_get((unsigned long long)(uintptr_t)module, name, &code);
  if (handle) *function = (void *)(uintptr_t)handle;
  RETURN(code == FK_INVALID_HANDLE ? hipErrorNotFound : code); /* clr: hip_platform.cpp */
}
/* clr: a module its platform state does not hold is hipErrorNotFound (the null one, from ROCm
 * 6, hipErrorInvalidResourceHandle). */
EXPORT hipError_t hipModuleUnload(void *module) {
  ENTER("hipModuleUnload");
  if (!module && major() >= 6) RETURN(hipErrorInvalidHandle);
  int rc = fk_module_unload((unsigned long long)(uintptr_t)module);
  RETURN(rc == FK_INVALID_HANDLE ? hipErrorNotFound : rc);
}

/* hipModuleGetGlobal, as clr: no name (or an empty one), or neither output: invalid value; a
 * null module: invalid handle; a global its platform state does not find (an unloaded
 * module's included): not found. */
EXPORT hipError_t hipModuleGetGlobal(void **dptr, size_t *bytes, void *module, const char *name) {
  ENTER("hipModuleGetGlobal");
  if ((!dptr && !bytes) || !name || !name[0]) RETURN(hipErrorInvalidValue);
  if (!module) RETURN(hipErrorInvalidHandle);
  unsigned long long va, size;
  int rc = fk_module_global((unsigned long long)(uintptr_t)module, name, &va, &size);
  if (rc != FK_OK) RETURN(rc == FK_INVALID_HANDLE ? hipErrorNotFound : rc);
  if (dptr) *dptr = (void *)(uintptr_t)va;
  if (bytes) *bytes = size;
  RETURN(hipSuccess);
}

/* The LDS a block may use, less the function's static shared memory (none, see FK_FN_REGS);
 * hipFuncSetAttribute may lower it. */
static int max_dynamic_shared(const struct fk_function *fn) {
  return fn->max_dynamic_shared >= 0 ? fn->max_dynamic_shared : 65536;
}

/* hipFunction_attribute (CUDA's numbering, 0-9), as clr answers it: PTX and binary version the
 * ISA's (9.4: 94), carveout 0. */
static hipError_t function_attribute(int *value, int attr, const struct fk_function *fn) {
  switch (attr) {
    case 0: *value = 1024; break;
    case 1: case 2: case 3: *value = 0; break;
    case 4: *value = FK_FN_REGS; break;
    case 5: case 6: *value = model->major * 10 + model->minor; break;
    case 7: *value = 0; break;
    case 8: *value = max_dynamic_shared(fn); break;
    case 9: *value = 0; break;
    default: return hipErrorInvalidValue;
  }
  return hipSuccess;
}
EXPORT hipError_t hipFuncGetAttribute(int *value, int attr, void *function) {
  ENTER("hipFuncGetAttribute");
  if (!value) RETURN(hipErrorInvalidValue);
  const struct fk_function *fn = fk_function_of((unsigned long long)(uintptr_t)function);
  if (!fn) RETURN(hipErrorInvalidHandle);
  RETURN(function_attribute(value, attr, fn));
}

/* hipFuncAttributes, as hip_runtime_api.h lays it out (56 bytes). */
struct hip_func_attributes {
  int binaryVersion, cacheModeCA;
  size_t constSizeBytes, localSizeBytes;
  int maxDynamicSharedSizeBytes, maxThreadsPerBlock, numRegs, preferredShmemCarveout, ptxVersion;
  size_t sharedSizeBytes;
};
_Static_assert(sizeof(struct hip_func_attributes) == 56, "hipFuncAttributes is 56 bytes");

/* `function` is a host stub a compiled HIP program registers; the fake has none, so it takes
 * a function from hipModuleGetFunction (as hipLaunchKernel does), else
 * hipErrorInvalidDeviceFunction. */
EXPORT hipError_t hipFuncGetAttributes(struct hip_func_attributes *attr, const void *function) {
  ENTER("hipFuncGetAttributes");
  if (!attr) RETURN(hipErrorInvalidValue);
  const struct fk_function *fn = fk_function_of((unsigned long long)(uintptr_t)function);
  if (!fn) RETURN(hipErrorInvalidDeviceFunction);
  memset(attr, 0, sizeof *attr);
  attr->binaryVersion = attr->ptxVersion = model->major * 10 + model->minor;
  attr->maxDynamicSharedSizeBytes = max_dynamic_shared(fn);
  attr->maxThreadsPerBlock = 1024;
  attr->numRegs = FK_FN_REGS;
  attr->preferredShmemCarveout = 0; /* as hipFuncGetAttribute answers it (clr) */
  RETURN(hipSuccess);
}

/* hipFuncAttributeMaxDynamicSharedMemorySize (8): 0 to the LDS available;
 * hipFuncAttributePreferredSharedMemoryCarveout (9): -1 to 100. */
EXPORT hipError_t hipFuncSetAttribute(const void *function, int attr, int value) {
  ENTER("hipFuncSetAttribute");
  if (!function) RETURN(hipErrorInvalidDeviceFunction);
  if (attr < 0 || attr > 10) RETURN(hipErrorInvalidValue);
  struct fk_function *fn = fk_function_of((unsigned long long)(uintptr_t)function);
  if (!fn) RETURN(hipErrorInvalidDeviceFunction);
  if (attr == 8) {
    if (value < 0 || value > 65536) RETURN(hipErrorInvalidValue);
    fn->max_dynamic_shared = value;
  } else if (attr == 9) {
    if (value < -1 || value > 100) RETURN(hipErrorInvalidValue);
    fn->carveout = value;
  }
  RETURN(hipSuccess);
}
EXPORT hipError_t hipFuncSetCacheConfig(const void *function, int config) {
  ENTER("hipFuncSetCacheConfig");
  struct fk_function *fn = fk_function_of((unsigned long long)(uintptr_t)function);
  if (!fn) RETURN(hipErrorInvalidDeviceFunction);
  if (config < 0 || config > 3) RETURN(hipErrorInvalidValue);
  fn->cache_config = config;
  RETURN(hipSuccess);
}

/* ----- occupancy --------------------------------------------------------------------------- */

/* A compute unit: 64-wide wavefronts, 2048 threads, 32 blocks, 64 KiB of LDS. */
static struct fk_sm_limits cu_limits(const struct fk_function *fn) {
  struct fk_sm_limits l = {64, 1024, 2048, 32, 65536, 65536, model->cus,
                           (unsigned long long)max_dynamic_shared(fn)};
  return l;
}
static hipError_t occupancy(int *blocks, const void *function, int block, size_t dynamic,
                            unsigned flags) {
  if (!blocks || flags > 1) return hipErrorInvalidValue;
  const struct fk_function *fn = fk_function_of((unsigned long long)(uintptr_t)function);
  if (!fn) return hipErrorInvalidDeviceFunction;
  if (block <= 0) return hipErrorInvalidValue;
  struct fk_sm_limits l = cu_limits(fn);
  *blocks = fk_blocks_per_sm(&l, block, dynamic);
  return hipSuccess;
}
EXPORT hipError_t hipOccupancyMaxActiveBlocksPerMultiprocessor(int *blocks, const void *f,
                                                               int block, size_t dynamic) {
  ENTER("hipOccupancyMaxActiveBlocksPerMultiprocessor");
  RETURN(occupancy(blocks, f, block, dynamic, 0));
}
EXPORT hipError_t hipOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int *blocks, const void *f,
                                                                        int block, size_t dynamic,
                                                                        unsigned flags) {
  ENTER("hipOccupancyMaxActiveBlocksPerMultiprocessorWithFlags");
  RETURN(occupancy(blocks, f, block, dynamic, flags));
}
EXPORT hipError_t hipModuleOccupancyMaxActiveBlocksPerMultiprocessor(int *blocks, void *f,
                                                                     int block, size_t dynamic) {
  ENTER("hipModuleOccupancyMaxActiveBlocksPerMultiprocessor");
  RETURN(occupancy(blocks, f, block, dynamic, 0));
}
EXPORT hipError_t hipModuleOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int *blocks, void *f,
                                                                              int block,
                                                                              size_t dynamic,
                                                                              unsigned flags) {
  ENTER("hipModuleOccupancyMaxActiveBlocksPerMultiprocessorWithFlags");
  RETURN(occupancy(blocks, f, block, dynamic, flags));
}
static hipError_t potential_block(int *grid, int *block, const void *function, size_t dynamic,
                                  int limit, unsigned flags) {
  if (!grid || !block || flags > 1 || limit < 0) return hipErrorInvalidValue;
  const struct fk_function *fn = fk_function_of((unsigned long long)(uintptr_t)function);
  if (!fn) return hipErrorInvalidDeviceFunction;
  struct fk_sm_limits l = cu_limits(fn);
  fk_best_block(&l, limit, NULL, dynamic, grid, block);
  return hipSuccess;
}
EXPORT hipError_t hipOccupancyMaxPotentialBlockSize(int *grid, int *block, const void *f,
                                                    size_t dynamic, int limit) {
  ENTER("hipOccupancyMaxPotentialBlockSize");
  RETURN(potential_block(grid, block, f, dynamic, limit, 0));
}
EXPORT hipError_t hipModuleOccupancyMaxPotentialBlockSize(int *grid, int *block, void *f,
                                                          size_t dynamic, int limit) {
  ENTER("hipModuleOccupancyMaxPotentialBlockSize");
  RETURN(potential_block(grid, block, f, dynamic, limit, 0));
}
EXPORT hipError_t hipModuleOccupancyMaxPotentialBlockSizeWithFlags(int *grid, int *block, void *f,
                                                                   size_t dynamic, int limit,
                                                                   unsigned flags) {
  ENTER("hipModuleOccupancyMaxPotentialBlockSizeWithFlags");
  RETURN(potential_block(grid, block, f, dynamic, limit, flags));
}

/* ----- launches ---------------------------------------------------------------------------- */

/* Checked as hipModuleLaunchKernel checks it (blocks of at most 1024 threads, dynamic shared
 * memory within the function's limit, kernelParams or extra, not both); a cooperative launch
 * also needs a grid that fits on the device at once. */
static hipError_t launch(struct fk_function *fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                         unsigned by, unsigned bz, void *stream, void **params, void **extra,
                         size_t shared, int pt, int cooperative) {
  if (!fn) return hipErrorInvalidHandle;
  CHECK_STREAM_OR(clock, stream, pt, hipErrorInvalidValue); /* clr: hip_module.cpp */
  if (!gx || !gy || !gz || !bx || !by || !bz || (unsigned long long)bx * by * bz > 1024 ||
      (params && extra) || shared > (size_t)max_dynamic_shared(fn))
    return hipErrorInvalidValue;
  if (cooperative) {
    struct fk_sm_limits l = cu_limits(fn);
    unsigned long long fits =
        (unsigned long long)fk_blocks_per_sm(&l, (int)(bx * by * bz), shared) * (unsigned)l.sms;
    if ((unsigned long long)gx * gy * gz > fits) return hipErrorCooperativeLaunchTooLarge;
  }
  return fk_launch(current_device(), clock, fn->name, params) ? hipSuccess : hipErrorOutOfMemory;
}
EXPORT hipError_t hipModuleLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                        unsigned by, unsigned bz, unsigned shared, void *stream,
                                        void **params, void **extra) {
  ENTER("hipModuleLaunchKernel");
  RETURN(launch(fk_function_of((unsigned long long)(uintptr_t)f), gx, gy, gz, bx, by, bz, stream,
                params, extra, shared, 0, 0));
}
/* `function` is a host stub a compiled HIP program registers; the fake has no such programs,
 * so it takes a function from hipModuleGetFunction, and answers
 * hipErrorInvalidDeviceFunction for anything else. */
static hipError_t launch_kernel(const void *function, dim3 grid, dim3 block, void **args,
                                size_t shared, void *stream, int pt, int cooperative) {
  struct fk_function *fn = fk_function_of((unsigned long long)(uintptr_t)function);
  if (!fn) return hipErrorInvalidDeviceFunction;
  return launch(fn, grid.x, grid.y, grid.z, block.x, block.y, block.z, stream, args, NULL, shared,
                pt, cooperative);
}
EXPORT hipError_t hipLaunchKernel(const void *function, dim3 grid, dim3 block, void **args,
                                  size_t shared, void *stream) {
  ENTER("hipLaunchKernel");
  RETURN(launch_kernel(function, grid, block, args, shared, stream, 0, 0));
}
EXPORT hipError_t hipLaunchKernel_spt(const void *function, dim3 grid, dim3 block, void **args,
                                      size_t shared, void *stream) {
  ENTER("hipLaunchKernel_spt");
  RETURN(launch_kernel(function, grid, block, args, shared, stream, 1, 0));
}
EXPORT hipError_t hipLaunchCooperativeKernel(const void *function, dim3 grid, dim3 block,
                                             void **args, unsigned shared, void *stream) {
  ENTER("hipLaunchCooperativeKernel");
  RETURN(launch_kernel(function, grid, block, args, shared, stream, 0, 1));
}
EXPORT hipError_t hipLaunchCooperativeKernel_spt(const void *function, dim3 grid, dim3 block,
                                                 void **args, unsigned shared, void *stream) {
  ENTER("hipLaunchCooperativeKernel_spt");
  RETURN(launch_kernel(function, grid, block, args, shared, stream, 1, 1));
}

/* ----- virtual memory ---------------------------------------------------------------------- */

/* The ROCm 6+ hipMemAllocationProp: type at 0, handle type at 4, location {type, id} at 8,
 * win32 metadata at 16, allocFlags at 24; 32 bytes. */
struct prop6 {
  int type;
  int handle_type;
  int loc_type;
  int loc_id;
  void *win32;
  unsigned char compression, rdma;
  unsigned short usage;
};

/* hipMemAllocationHandleType: hipMemHandleTypeNone 0, hipMemHandleTypePosixFileDescriptor 1
 * (exportable, fake_ipc.h), hipMemHandleTypeWin32 2, hipMemHandleTypeWin32Kmt 4. */
#define HIP_HANDLE_POSIX_FD 1
static int prop_ok(const struct prop6 *p) {
  return p && p->type == 1 /* pinned */ && p->loc_type == 1 /* device */ &&
         valid_device(p->loc_id) && (p->handle_type == 0 || p->handle_type == HIP_HANDLE_POSIX_FD) &&
         p->win32 == NULL && p->compression == 0;
}

EXPORT hipError_t hipMemGetAllocationGranularity(size_t *granularity, const struct prop6 *prop,
                                                 int option) {
  ENTER("hipMemGetAllocationGranularity");
  if (!granularity || !prop_ok(prop) || (option != 0 && option != 1)) RETURN(hipErrorInvalidValue);
  *granularity = option == 0 ? fk_min_gran : fk_rec_gran;
  RETURN(hipSuccess);
}
EXPORT hipError_t hipMemCreate(void **handle, size_t size, const struct prop6 *prop,
                               unsigned long long flags) {
  ENTER("hipMemCreate");
  if (!handle || !prop_ok(prop) || flags != 0 || size == 0 || size % fk_min_gran)
    RETURN(hipErrorInvalidValue);
  int code;
  unsigned long long h = fk_phys_create(prop->loc_id, size, (unsigned)prop->handle_type, &code);
  if (h) *handle = (void *)(uintptr_t)h;
  RETURN(code);
}
EXPORT hipError_t hipMemRelease(void *handle) {
  ENTER("hipMemRelease");
  RETURN(fk_phys_release((unsigned long long)(uintptr_t)handle));
}
/* A new descriptor of the handle's memory, the caller's to close: a handle created with
 * hipMemHandleTypePosixFileDescriptor, that type, flags 0. */
EXPORT hipError_t hipMemExportToShareableHandle(void *shareable, void *handle, int type,
                                                unsigned long long flags) {
  ENTER("hipMemExportToShareableHandle");
  if (!shareable || flags != 0 || type != HIP_HANDLE_POSIX_FD) RETURN(hipErrorInvalidValue);
  RETURN(fk_phys_export((unsigned long long)(uintptr_t)handle, (int *)shareable));
}
/* `os_handle`: the descriptor's value cast to void * (ROCm/rocm-systems PR #1564). The import
 * holds a descriptor of its own, except under rocm-systems-8440-import-needs-fd. */
EXPORT hipError_t hipMemImportFromShareableHandle(void **handle, void *os_handle, int type) {
  ENTER("hipMemImportFromShareableHandle");
  intptr_t fd = (intptr_t)os_handle;
  if (!handle || type != HIP_HANDLE_POSIX_FD || fd < 0 || fd > INT32_MAX)
    RETURN(hipErrorInvalidValue);
  unsigned long long h;
  int rc = fk_phys_import((int)fd, &h);
  if (rc == FK_OK) *handle = (void *)(uintptr_t)h;
  RETURN(rc);
}
/* The ROCm 6+ hipMemAllocationProp the handle was created with. */
EXPORT hipError_t hipMemGetAllocationPropertiesFromHandle(struct prop6 *prop, void *handle) {
  ENTER("hipMemGetAllocationPropertiesFromHandle");
  int device;
  unsigned types;
  if (!prop || fk_phys_properties((unsigned long long)(uintptr_t)handle, &device, &types) != FK_OK)
    RETURN(hipErrorInvalidValue);
  memset(prop, 0, sizeof *prop);
  prop->type = 1;
  prop->handle_type = (int)types;
  prop->loc_type = 1;
  prop->loc_id = device;
  RETURN(hipSuccess);
}
/* `addr` is a hint, honoured when it can be (fake_vmm.h); a fresh address is aligned to the
 * recommended granularity. */
EXPORT hipError_t hipMemAddressReserve(void **ptr, size_t size, size_t alignment, void *addr,
                                       unsigned long long flags) {
  ENTER("hipMemAddressReserve");
  if (!ptr || size == 0 || size % fk_min_gran || flags != 0 ||
      (alignment && (alignment & (alignment - 1))))
    RETURN(hipErrorInvalidValue);
  unsigned long long hint_align = alignment > fk_min_gran ? alignment : fk_min_gran;
  unsigned long long fresh_align = alignment > fk_rec_gran ? alignment : fk_rec_gran;
  unsigned long long va;
  int rc = fk_reserve(current_device(), size, hint_align, fresh_align,
                      (unsigned long long)(uintptr_t)addr, &va);
  if (rc == FK_OK) *ptr = (void *)(uintptr_t)va;
  RETURN(rc);
}
EXPORT hipError_t hipMemAddressFree(void *ptr, size_t size) {
  ENTER("hipMemAddressFree");
  RETURN(fk_address_free((unsigned long long)(uintptr_t)ptr, size));
}
EXPORT hipError_t hipMemMap(void *ptr, size_t size, size_t offset, void *handle,
                            unsigned long long flags) {
  ENTER("hipMemMap");
  if (flags != 0) RETURN(hipErrorInvalidValue);
  RETURN(fk_map((unsigned long long)(uintptr_t)ptr, size, offset,
                (unsigned long long)(uintptr_t)handle, fk_min_gran));
}
EXPORT hipError_t hipMemSetAccess(void *ptr, size_t size, const struct fake_access_desc *desc,
                                  size_t count) {
  ENTER("hipMemSetAccess");
  RETURN(fk_set_access((unsigned long long)(uintptr_t)ptr, size, desc, count, fk_min_gran));
}
struct hip_location {
  int type, id;
};
EXPORT hipError_t hipMemGetAccess(unsigned long long *flags, const struct hip_location *location,
                                  void *ptr) {
  ENTER("hipMemGetAccess");
  int host = location && location->type == FK_LOCATION_HOST;
  if (!flags || !location || (!host && (location->type != 1 || !valid_device(location->id))))
    RETURN(hipErrorInvalidValue);
  int granted = fk_access_of((unsigned long long)(uintptr_t)ptr, host ? FK_LOC_CPU : location->id);
  if (granted < 0) RETURN(hipErrorInvalidValue);
  struct fk_pointer p = fk_pointer_of((unsigned long long)(uintptr_t)ptr);
  *flags = !granted ? 0 : (p.region->prot & PROT_WRITE) ? 3 : 1;
  RETURN(hipSuccess);
}
EXPORT hipError_t hipMemUnmap(void *ptr, size_t size) {
  ENTER("hipMemUnmap");
  RETURN(fk_unmap((unsigned long long)(uintptr_t)ptr, size, fk_min_gran, "hipMemUnmap"));
}

/* ----- IPC handles of plain allocations (fake_ipc.h) --------------------------------------- */

/* hipIpcMemHandle_t: 64 opaque bytes (HIP_IPC_HANDLE_SIZE), passed by value. */
typedef struct {
  unsigned char reserved[FK_IPC_HANDLE_BYTES];
} hipIpcMemHandle_t;

EXPORT hipError_t hipIpcGetMemHandle(hipIpcMemHandle_t *handle, void *ptr) {
  ENTER("hipIpcGetMemHandle");
  if (!handle) RETURN(hipErrorInvalidValue);
  RETURN(fk_ipc_get((unsigned long long)(uintptr_t)ptr, handle->reserved));
}
/* flags: hipIpcMemLazyEnablePeerAccess (1), which "must be specified". */
EXPORT hipError_t hipIpcOpenMemHandle(void **ptr, hipIpcMemHandle_t handle, unsigned flags) {
  ENTER("hipIpcOpenMemHandle");
  if (!ptr) RETURN(hipErrorInvalidValue);
  unsigned long long va;
  int rc = fk_ipc_open(current_device(), current_device(), handle.reserved, flags, &va);
  if (rc == FK_OK) *ptr = (void *)(uintptr_t)va;
  RETURN(rc);
}
EXPORT hipError_t hipIpcCloseMemHandle(void *ptr) {
  ENTER("hipIpcCloseMemHandle");
  RETURN(fk_ipc_close((unsigned long long)(uintptr_t)ptr, "hipIpcCloseMemHandle"));
}

/* ----- pools ------------------------------------------------------------------------------- */

struct pool_props {
  int alloc_type;
  int handle_types;
  int loc_type;
  int loc_id;
  void *win32;
  unsigned char reserved[64];
};
#define POOL(p) ((unsigned long long)(uintptr_t)(p))
#define NEVER UINT64_MAX /* the ROCm quirk: never release unless told */

EXPORT hipError_t hipDeviceGetDefaultMemPool(void **pool, int device) {
  ENTER("hipDeviceGetDefaultMemPool");
  if (!pool) RETURN(hipErrorInvalidValue);
  if (!valid_device(device)) RETURN(hipErrorInvalidDevice);
  if (!attr_pools) RETURN(hipErrorNotSupported);
  int p = fk_default_pool(device, NEVER);
  if (p < 0) RETURN(hipErrorOutOfMemory);
  *pool = (void *)(uintptr_t)fk_pool_handle(p);
  RETURN(hipSuccess);
}
EXPORT hipError_t hipDeviceGetMemPool(void **pool, int device) {
  ENTER("hipDeviceGetMemPool");
  if (!pool) RETURN(hipErrorInvalidValue);
  if (!valid_device(device)) RETURN(hipErrorInvalidDevice);
  if (!attr_pools) RETURN(hipErrorNotSupported);
  int p = fk_device_pool(device, NEVER);
  if (p < 0) RETURN(hipErrorOutOfMemory);
  *pool = (void *)(uintptr_t)fk_pool_handle(p);
  RETURN(hipSuccess);
}
EXPORT hipError_t hipDeviceSetMemPool(int device, void *pool) {
  ENTER("hipDeviceSetMemPool");
  if (!valid_device(device)) RETURN(hipErrorInvalidDevice);
  int p = fk_pool_of(POOL(pool));
  if (p < 0 || fk_pools[p].device != device) RETURN(hipErrorInvalidValue);
  fk_current_pool[device] = POOL(pool);
  RETURN(hipSuccess);
}
EXPORT hipError_t hipMemPoolCreate(void **pool, const struct pool_props *props) {
  ENTER("hipMemPoolCreate");
  if (!pool || !props || props->alloc_type != 1 || props->loc_type != 1 ||
      !valid_device(props->loc_id) || props->handle_types > 1)
    RETURN(hipErrorInvalidValue);
  for (int i = 0; i < 64; i++)
    if (props->reserved[i]) RETURN(hipErrorInvalidValue);
  if (!attr_pools) RETURN(hipErrorNotSupported);
  int p = fk_pool_new(props->loc_id, 0, NEVER);
  if (p < 0) RETURN(hipErrorOutOfMemory);
  *pool = (void *)(uintptr_t)fk_pool_handle(p);
  RETURN(hipSuccess);
}
/* As HIP documents it: returns at once; with allocations outstanding, or frees still in
 * flight, the pool's memory goes when the last of them is freed and that free completed. */
EXPORT hipError_t hipMemPoolDestroy(void *pool) {
  ENTER("hipMemPoolDestroy");
  int p = fk_pool_of(POOL(pool));
  if (p < 0) RETURN(hipErrorInvalidValue);
  for (int d = 0; d < FK_MAX_DEVICES; d++)
    if (fk_current_pool[d] == POOL(pool)) fk_current_pool[d] = 0;
  RETURN(fk_pool_destroy(p));
}
EXPORT hipError_t hipMemPoolSetAttribute(void *pool, int attr, void *value) {
  ENTER("hipMemPoolSetAttribute");
  int p = fk_pool_of(POOL(pool));
  if (p < 0) RETURN(hipErrorInvalidValue);
  RETURN(fk_pool_set(&fk_pools[p], attr, value));
}
EXPORT hipError_t hipMemPoolGetAttribute(void *pool, int attr, void *value) {
  ENTER("hipMemPoolGetAttribute");
  int p = fk_pool_of(POOL(pool));
  if (p < 0) RETURN(hipErrorInvalidValue);
  RETURN(fk_pool_get(&fk_pools[p], attr, value));
}
EXPORT hipError_t hipMemPoolTrimTo(void *pool, size_t keep) {
  ENTER("hipMemPoolTrimTo");
  int p = fk_pool_of(POOL(pool));
  if (p < 0) RETURN(hipErrorInvalidValue);
  fk_pool_release(p, keep);
  RETURN(hipSuccess);
}
EXPORT hipError_t hipMallocFromPoolAsync(void **ptr, size_t size, void *pool, void *stream) {
  ENTER("hipMallocFromPoolAsync");
  int p = fk_pool_of(POOL(pool));
  int clock = fk_clock_of(current_device(), (unsigned long long)(uintptr_t)stream, 0);
  if (!ptr || p < 0 || !clock) RETURN(hipErrorInvalidValue);
  if (size == 0) {
    *ptr = NULL;
    RETURN(hipSuccess);
  }
  unsigned long long va;
  int rc = fk_pool_alloc(p, clock, size, 256, "hipMallocFromPoolAsync", &va);
  if (rc == FK_OK) *ptr = (void *)(uintptr_t)va;
  RETURN(rc);
}
/* From the pool current to the stream's device. ROCm 6 (clr): size 0 is a null pointer, an
 * unknown stream invalid handle; ROCm 5: both invalid value. */
EXPORT hipError_t hipMallocAsync(void **ptr, size_t size, void *stream) {
  ENTER("hipMallocAsync");
  if (!ptr) RETURN(hipErrorInvalidValue);
  int clock = fk_clock_of(current_device(), (unsigned long long)(uintptr_t)stream, 0);
  if (!clock) RETURN(major() >= 6 ? hipErrorInvalidHandle : hipErrorInvalidValue);
  if (size == 0) {
    if (major() < 6) RETURN(hipErrorInvalidValue);
    *ptr = NULL;
    RETURN(hipSuccess);
  }
  int device = fk_ctxs[fk_clocks[clock].ctx].device;
  if (!attr_pools) RETURN(hipErrorNotSupported);
  int p = fk_device_pool(device, NEVER);
  if (p < 0) RETURN(hipErrorOutOfMemory);
  unsigned long long va;
  int rc = fk_pool_alloc(p, clock, size, 256, "hipMallocAsync", &va);
  if (rc == FK_OK) *ptr = (void *)(uintptr_t)va;
  RETURN(rc);
}
/* A pointer no pool handed out is freed as hipFree frees it (hipamd falls back to ihipFree). */
EXPORT hipError_t hipFreeAsync(void *ptr, void *stream) {
  ENTER("hipFreeAsync");
  int clock = fk_clock_of(current_device(), (unsigned long long)(uintptr_t)stream, 0);
  if (!clock) RETURN(major() >= 6 ? hipErrorInvalidHandle : hipErrorInvalidValue);
  if (!ptr) RETURN(hipErrorInvalidValue);
  int rc = fk_pool_free((unsigned long long)(uintptr_t)ptr, clock);
  if (rc == FK_OK) RETURN(hipSuccess);
  if (rc != FK_INVALID_VALUE) RETURN(rc); /* refused on a captured stream */
  RETURN(do_free(ptr, "hipFreeAsync"));
}

/* ----- stream capture and graphs (fake_graphs.h) ------------------------------------------- */

/* clr: the null stream (and hipStreamLegacy) cannot be captured. */
static hipError_t begin_capture(void *stream, int mode, int pt) {
  if (!pt && (!stream || stream == (void *)1)) return hipErrorStreamCaptureUnsupported;
  CHECK_STREAM_OR(clock, stream, pt, hipErrorInvalidHandle);
  return fk_capture_begin(clock, mode);
}
EXPORT hipError_t hipStreamBeginCapture(void *stream, int mode) {
  ENTER("hipStreamBeginCapture");
  RETURN(begin_capture(stream, mode, 0));
}
EXPORT hipError_t hipStreamBeginCapture_spt(void *stream, int mode) {
  ENTER("hipStreamBeginCapture_spt");
  RETURN(begin_capture(stream, mode, 1));
}
static hipError_t end_capture(void *stream, void **graph, int pt) {
  if (!graph) return hipErrorInvalidValue;
  CHECK_STREAM_OR(clock, stream, pt, hipErrorInvalidHandle);
  unsigned long long handle = 0;
  int rc = fk_capture_end(clock, &handle);
  *graph = (void *)(uintptr_t)handle;
  return rc;
}
EXPORT hipError_t hipStreamEndCapture(void *stream, void **graph) {
  ENTER("hipStreamEndCapture");
  RETURN(end_capture(stream, graph, 0));
}
EXPORT hipError_t hipStreamEndCapture_spt(void *stream, void **graph) {
  ENTER("hipStreamEndCapture_spt");
  RETURN(end_capture(stream, graph, 1));
}
static hipError_t capture_info(void *stream, int *status, unsigned long long *id, int pt) {
  if (!status) return hipErrorInvalidValue;
  CHECK_STREAM_OR(clock, stream, pt, hipErrorInvalidHandle);
  return fk_capture_status(clock, status, id);
}
EXPORT hipError_t hipStreamIsCapturing(void *stream, int *status) {
  ENTER("hipStreamIsCapturing");
  RETURN(capture_info(stream, status, NULL, 0));
}
EXPORT hipError_t hipStreamIsCapturing_spt(void *stream, int *status) {
  ENTER("hipStreamIsCapturing_spt");
  RETURN(capture_info(stream, status, NULL, 1));
}
EXPORT hipError_t hipStreamGetCaptureInfo(void *stream, int *status, unsigned long long *id) {
  ENTER("hipStreamGetCaptureInfo");
  RETURN(capture_info(stream, status, id, 0));
}
EXPORT hipError_t hipStreamGetCaptureInfo_spt(void *stream, int *status, unsigned long long *id) {
  ENTER("hipStreamGetCaptureInfo_spt");
  RETURN(capture_info(stream, status, id, 1));
}
EXPORT hipError_t hipThreadExchangeStreamCaptureMode(int *mode) {
  ENTER("hipThreadExchangeStreamCaptureMode");
  RETURN(fk_capture_exchange_mode(mode));
}
static hipError_t graph_instantiate(void **exec, void *graph) {
  if (!exec) return hipErrorInvalidValue;
  unsigned long long handle = 0;
  int rc = fk_graph_instantiate((unsigned long long)(uintptr_t)graph, &handle);
  if (rc == FK_OK) *exec = (void *)(uintptr_t)handle;
  return rc;
}
EXPORT hipError_t hipGraphInstantiate(void **exec, void *graph, void **error_node, char *log,
                                      size_t size) {
  ENTER("hipGraphInstantiate");
  (void)error_node, (void)log, (void)size;
  RETURN(graph_instantiate(exec, graph));
}
EXPORT hipError_t hipGraphInstantiateWithFlags(void **exec, void *graph, unsigned long long flags) {
  ENTER("hipGraphInstantiateWithFlags");
  if (flags > 15) RETURN(hipErrorInvalidValue);
  RETURN(graph_instantiate(exec, graph));
}
static hipError_t graph_launch(void *exec, void *stream, int pt) {
  CHECK_STREAM_OR(clock, stream, pt, hipErrorInvalidHandle);
  return fk_graph_launch((unsigned long long)(uintptr_t)exec, clock);
}
EXPORT hipError_t hipGraphLaunch(void *exec, void *stream) {
  ENTER("hipGraphLaunch");
  RETURN(graph_launch(exec, stream, 0));
}
EXPORT hipError_t hipGraphLaunch_spt(void *exec, void *stream) {
  ENTER("hipGraphLaunch_spt");
  RETURN(graph_launch(exec, stream, 1));
}
EXPORT hipError_t hipGraphExecDestroy(void *exec) {
  ENTER("hipGraphExecDestroy");
  RETURN(fk_graph_destroy((unsigned long long)(uintptr_t)exec, 1));
}
EXPORT hipError_t hipGraphDestroy(void *graph) {
  ENTER("hipGraphDestroy");
  RETURN(fk_graph_destroy((unsigned long long)(uintptr_t)graph, 0));
}
/* The number of nodes (`nodes` NULL), or the first *count of them as opaque handles. */
EXPORT hipError_t hipGraphGetNodes(void *graph, void **nodes, size_t *count) {
  ENTER("hipGraphGetNodes");
  RETURN(fk_graph_nodes((unsigned long long)(uintptr_t)graph, nodes, count));
}

/* ----- hipGetProcAddress (ROCm 6.2) -------------------------------------------------------- */

/* Any exported call by name; as clr, hipGetDeviceProperties is the R0600 form from HIP 6.0
 * (hipVersion 600); an unknown name is hipErrorInvalidValue with SYMBOL_NOT_FOUND. */
EXPORT hipError_t hipGetProcAddress(const char *symbol, void **pfn, int hip_version,
                                    unsigned long long flags, int *status) {
  ENTER("hipGetProcAddress");
  if (!at_least(6, 2)) RETURN(hipErrorNotSupported); /* stands in for the missing symbol */
  if (!symbol || !symbol[0] || !pfn) RETURN(hipErrorInvalidValue);
  (void)flags;
  const char *name = symbol;
  if (hip_version >= 600 && !strcmp(symbol, "hipGetDeviceProperties"))
    name = "hipGetDevicePropertiesR0600";
  int n;
  const struct fk_entry *t = fk_table(&n);
  for (int i = 0; i < n; i++) {
    if (strcmp(t[i].name, name)) continue;
    *pfn = t[i].fn;
    if (status) *status = 0;
    RETURN(hipSuccess);
  }
  *pfn = NULL;
  if (status) *status = 1;
  RETURN(hipErrorInvalidValue);
}

/* ----- the symbol table -------------------------------------------------------------------- */

#define E(name, groups) {#name, #name, 0, 0, groups, (void *)name}
#define P(name, base, groups) {#name, base, 0, 1, groups, (void *)name}
static const struct fk_entry hip_table[] = {
    E(hipGetErrorName, 0),
    E(hipGetErrorString, 0),
    E(hipGetLastError, 0),
    E(hipPeekAtLastError, 0),
    E(hipInit, 0),
    E(hipDriverGetVersion, 0),
    E(hipRuntimeGetVersion, 0),
    E(hipGetDeviceCount, 0),
    E(hipSetDevice, 0),
    E(hipGetDevice, 0),
    E(hipDeviceGet, 0),
    E(hipDeviceComputeCapability, 0),
    E(hipDeviceCanAccessPeer, 0),
    E(hipDeviceEnablePeerAccess, 0),
    E(hipDeviceDisablePeerAccess, 0),
    E(hipDeviceGetAttribute, 0),
    E(hipDeviceGetName, 0),
    E(hipDeviceTotalMem, 0),
    E(hipDeviceGetPCIBusId, 0),
    E(hipGetDeviceProperties, 0),
    E(hipGetDevicePropertiesR0600, 0),
    E(hipMemGetInfo, 0),
    E(hipDeviceSynchronize, FK_G_SYNC),
    E(hipDeviceGetStreamPriorityRange, 0),
    E(hipMalloc, FK_G_ALLOC),
    E(hipExtMallocWithFlags, FK_G_ALLOC),
    E(hipMallocManaged, FK_G_ALLOC),
    E(hipFree, FK_G_FREE),
    E(hipMemGetAddressRange, 0),
    E(hipHostMalloc, FK_G_HOST_ALLOC),
    E(hipMallocHost, FK_G_HOST_ALLOC),
    E(hipHostFree, FK_G_HOST_FREE),
    E(hipFreeHost, FK_G_HOST_FREE),
    E(hipHostRegister, FK_G_HOST_ALLOC),
    E(hipHostUnregister, FK_G_HOST_FREE),
    E(hipHostGetDevicePointer, 0),
    E(hipPointerGetAttributes, 0),
    E(hipPointerGetAttribute, 0),
    E(hipDrvPointerGetAttributes, 0),
    E(hipMemcpy, FK_G_COPY),
    P(hipMemcpy_spt, "hipMemcpy", FK_G_COPY),
    E(hipMemcpyWithStream, FK_G_COPY),
    E(hipMemcpyAsync, FK_G_COPY),
    P(hipMemcpyAsync_spt, "hipMemcpyAsync", FK_G_COPY),
    E(hipMemcpyHtoD, FK_G_COPY),
    E(hipMemcpyDtoH, FK_G_COPY),
    E(hipMemcpyDtoD, FK_G_COPY),
    E(hipMemcpyHtoDAsync, FK_G_COPY),
    E(hipMemcpyDtoHAsync, FK_G_COPY),
    E(hipMemcpyDtoDAsync, FK_G_COPY),
    E(hipMemset, FK_G_MEMSET),
    P(hipMemset_spt, "hipMemset", FK_G_MEMSET),
    E(hipMemsetAsync, FK_G_MEMSET),
    E(hipMemsetD8, FK_G_MEMSET),
    E(hipMemsetD8Async, FK_G_MEMSET),
    E(hipMemsetD16, FK_G_MEMSET),
    E(hipMemsetD16Async, FK_G_MEMSET),
    E(hipMemsetD32, FK_G_MEMSET),
    E(hipMemsetD32Async, FK_G_MEMSET),
    E(hipStreamCreate, FK_G_STREAM),
    E(hipStreamCreateWithFlags, FK_G_STREAM),
    E(hipStreamCreateWithPriority, FK_G_STREAM),
    E(hipStreamDestroy, 0),
    E(hipStreamSynchronize, FK_G_SYNC),
    P(hipStreamSynchronize_spt, "hipStreamSynchronize", FK_G_SYNC),
    E(hipStreamQuery, FK_G_QUERY),
    P(hipStreamQuery_spt, "hipStreamQuery", FK_G_QUERY),
    E(hipStreamWaitEvent, FK_G_WAIT),
    P(hipStreamWaitEvent_spt, "hipStreamWaitEvent", FK_G_WAIT),
    E(hipStreamGetFlags, 0),
    P(hipStreamGetFlags_spt, "hipStreamGetFlags", 0),
    E(hipStreamGetPriority, 0),
    P(hipStreamGetPriority_spt, "hipStreamGetPriority", 0),
    E(hipStreamGetDevice, 0),
    E(hipLaunchHostFunc, FK_G_LAUNCH),
    E(hipStreamAddCallback, FK_G_LAUNCH),
    E(hipEventCreate, FK_G_EVENT),
    E(hipEventCreateWithFlags, FK_G_EVENT),
    E(hipEventRecord, FK_G_EVENT),
    E(hipEventQuery, FK_G_QUERY),
    E(hipEventSynchronize, FK_G_SYNC),
    E(hipEventDestroy, 0),
    E(hipEventElapsedTime, 0),
    E(hipModuleLoad, FK_G_MODULE),
    E(hipModuleLoadData, FK_G_MODULE),
    E(hipModuleLoadDataEx, FK_G_MODULE),
    E(hipModuleGetFunction, FK_G_MODULE),
    E(hipModuleUnload, 0),
    E(hipModuleLaunchKernel, FK_G_LAUNCH),
    E(hipLaunchKernel, FK_G_LAUNCH),
    P(hipLaunchKernel_spt, "hipLaunchKernel", FK_G_LAUNCH),
    E(hipMemGetAllocationGranularity, 0),
    E(hipMemCreate, FK_G_ALLOC),
    E(hipMemRelease, FK_G_FREE),
    E(hipMemAddressReserve, FK_G_RESERVE),
    E(hipMemAddressFree, 0),
    E(hipMemMap, FK_G_MAP),
    E(hipMemSetAccess, FK_G_MAP),
    E(hipMemGetAccess, 0),
    E(hipMemUnmap, FK_G_UNMAP),
    E(hipMemExportToShareableHandle, 0),
    E(hipMemImportFromShareableHandle, FK_G_ALLOC),
    E(hipMemGetAllocationPropertiesFromHandle, 0),
    E(hipIpcGetMemHandle, 0),
    E(hipIpcOpenMemHandle, FK_G_MAP),
    E(hipIpcCloseMemHandle, FK_G_UNMAP),
    E(hipDeviceGetDefaultMemPool, 0),
    E(hipDeviceGetMemPool, 0),
    E(hipDeviceSetMemPool, FK_G_POOL),
    E(hipMemPoolCreate, FK_G_POOL),
    E(hipMemPoolDestroy, FK_G_POOL),
    E(hipMemPoolSetAttribute, FK_G_POOL),
    E(hipMemPoolGetAttribute, 0),
    E(hipMemPoolTrimTo, FK_G_POOL),
    E(hipMallocFromPoolAsync, FK_G_ALLOC),
    E(hipMallocAsync, FK_G_ALLOC),
    E(hipFreeAsync, FK_G_FREE),
    E(hipStreamBeginCapture, 0),
    P(hipStreamBeginCapture_spt, "hipStreamBeginCapture", 0),
    E(hipStreamEndCapture, 0),
    P(hipStreamEndCapture_spt, "hipStreamEndCapture", 0),
    E(hipStreamIsCapturing, FK_G_QUERY),
    P(hipStreamIsCapturing_spt, "hipStreamIsCapturing", FK_G_QUERY),
    E(hipStreamGetCaptureInfo, FK_G_QUERY),
    P(hipStreamGetCaptureInfo_spt, "hipStreamGetCaptureInfo", FK_G_QUERY),
    E(hipThreadExchangeStreamCaptureMode, 0),
    E(hipGraphInstantiate, 0),
    E(hipGraphInstantiateWithFlags, 0),
    E(hipGraphLaunch, FK_G_LAUNCH),
    P(hipGraphLaunch_spt, "hipGraphLaunch", FK_G_LAUNCH),
    E(hipGraphExecDestroy, 0),
    E(hipGraphDestroy, 0),
    E(hipGraphGetNodes, 0),
    E(hipGetProcAddress, 0),
    E(hipSetDeviceFlags, 0),
    E(hipGetDeviceFlags, 0),
    E(hipDeviceReset, FK_G_SYNC),
    E(hipDeviceGetLimit, 0),
    E(hipDeviceSetLimit, 0),
    E(hipDeviceGetCacheConfig, 0),
    E(hipDeviceSetCacheConfig, 0),
    E(hipDeviceGetSharedMemConfig, 0),
    E(hipDeviceSetSharedMemConfig, 0),
    E(hipDeviceGetByPCIBusId, 0),
    E(hipDeviceGetP2PAttribute, 0),
    E(hipDeviceGetUuid, 0),
    E(hipMallocPitch, FK_G_ALLOC),
    E(hipMemAllocPitch, FK_G_ALLOC),
    E(hipMemPtrGetInfo, 0),
    E(hipHostGetFlags, 0),
    E(hipMemAdvise, 0),
    E(hipMemPrefetchAsync, 0),
    E(hipMemRangeGetAttribute, 0),
    E(hipMemRangeGetAttributes, 0),
    E(hipStreamAttachMemAsync, 0),
    E(hipMemcpyPeer, FK_G_COPY),
    E(hipMemcpyPeerAsync, FK_G_COPY),
    E(hipMemcpy2D, FK_G_COPY),
    P(hipMemcpy2D_spt, "hipMemcpy2D", FK_G_COPY),
    E(hipMemcpy2DAsync, FK_G_COPY),
    E(hipMemset2D, FK_G_MEMSET),
    P(hipMemset2D_spt, "hipMemset2D", FK_G_MEMSET),
    E(hipMemset2DAsync, FK_G_MEMSET),
    E(hipModuleGetGlobal, 0),
    E(hipFuncGetAttribute, 0),
    E(hipFuncGetAttributes, 0),
    E(hipFuncSetAttribute, 0),
    E(hipFuncSetCacheConfig, 0),
    E(hipOccupancyMaxActiveBlocksPerMultiprocessor, 0),
    E(hipOccupancyMaxActiveBlocksPerMultiprocessorWithFlags, 0),
    E(hipModuleOccupancyMaxActiveBlocksPerMultiprocessor, 0),
    E(hipModuleOccupancyMaxActiveBlocksPerMultiprocessorWithFlags, 0),
    E(hipOccupancyMaxPotentialBlockSize, 0),
    E(hipModuleOccupancyMaxPotentialBlockSize, 0),
    E(hipModuleOccupancyMaxPotentialBlockSizeWithFlags, 0),
    E(hipLaunchCooperativeKernel, FK_G_LAUNCH),
    P(hipLaunchCooperativeKernel_spt, "hipLaunchCooperativeKernel", FK_G_LAUNCH),
};

static const struct fk_entry *fk_table(int *n) {
  *n = (int)(sizeof hip_table / sizeof hip_table[0]);
  return hip_table;
}
