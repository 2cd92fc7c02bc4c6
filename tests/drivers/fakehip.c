/*
 * fakehip: a conformance driver for portalloc's hip backend.
 *
 * Exports the HIP runtime symbols portalloc resolves from libamdhip64 (same names, same C
 * signatures, same error codes) over bookkeeping on the host: addresses come from a fake
 * address space and no device memory is touched, so a 192 GiB MI300X is simulated without
 * using memory. The rules follow HIP's: sizes and offsets of the virtual-memory calls are
 * multiples of the minimum granularity, a mapping lies inside one reservation, set-access
 * needs the range mapped, unmap covers whole mappings, a released handle lives until its last
 * mapping goes, the current device is per thread (hipSetDevice), streams are clocks (any
 * handle HIP knows: its own streams, NULL, hipStreamLegacy, hipStreamPerThread) whose work
 * finishes in order — at once, unless events are held — and waiting for an event waits for
 * the work before it, and pools give memory back only down to their release threshold at a synchronisation.
 *
 * Personalities (hipRuntimeGetVersion / hipDriverGetVersion):
 *   ROCm 6/7 (default 6.2.41133): hipGetDevicePropertiesR0600, attribute 89 (VMM) = 1,
 *     minimum granularity 4 KiB, recommended 2 MiB;
 *   ROCm 5 (e.g. FAKEHIP_VERSION=50221153 or 5.2): attribute 89 does not exist
 *     (hipErrorInvalidValue) and hipGetDevicePropertiesR0600 answers hipErrorNotSupported;
 *     hipGetDeviceProperties fills the 5.x (R0000) layout.
 * A quirk of ROCm is modelled on purpose: a new pool's release threshold is "never release"
 * (UINT64_MAX) until set, so a shim that forgets to set it keeps every freed byte.
 *
 * Defaults come from the environment at fakehip_reset (FAKEHIP_VERSION, FAKEHIP_DEVICES,
 * FAKEHIP_CAPACITY) and the control functions below override them. Fault injection:
 * fakehip_fail("hipMalloc", n, count, code) makes calls n .. n+count-1 (1-based, counted from
 * now; count < 0: forever) of that function return `code`.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int hipError_t;
enum {
  hipSuccess = 0,
  hipErrorInvalidValue = 1,
  hipErrorOutOfMemory = 2,
  hipErrorNotInitialized = 3,
  hipErrorInvalidDevicePointer = 17,
  hipErrorNoDevice = 100,
  hipErrorInvalidDevice = 101,
  hipErrorInvalidHandle = 400,
  hipErrorNotReady = 600,
  hipErrorNotSupported = 801,
};

#define EXPORT __attribute__((visibility("default")))
#define KIB 1024ULL
#define MIB (1024ULL * 1024ULL)
#define GIB (1024ULL * MIB)
#define MAX_DEVICES 8
#define MAX_OBJECTS 65536
#define MAX_POOLS 64
#define MAX_FAULTS 32
#define MAX_CALLS 64

/* ----- state ----------------------------------------------------------------------------- */

enum kind { FREE_SLOT = 0, ALLOC, POOL_ALLOC, RESERVATION, HANDLE, MAPPING, STREAM, EVENT };

struct object {
  int kind;
  uint64_t addr; /* address, handle, stream or event value */
  uint64_t size;
  int device;
  int released;      /* HANDLE: hipMemRelease called */
  int mapcount;      /* HANDLE: live mappings */
  uint64_t handle;   /* MAPPING: the handle mapped */
  int pool;          /* POOL_ALLOC: pool index */
  uint64_t stream;   /* EVENT: stream of the last record */
  uint64_t seq;      /* EVENT: that stream's clock at the record (0: complete) */
  uint64_t recorded, completed; /* STREAM: its clock (events recorded, events finished) */
};

struct pool {
  int live;
  int device;
  int is_default;
  uint64_t threshold, reserved, used, reserved_high, used_high;
};

struct fault {
  char name[64];
  long seen, nth, count;
  int code;
};

struct counter {
  char name[64];
  long long calls;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static __thread int current_device = 0;

static int version;
static int n_devices;
static uint64_t capacity;
static uint64_t min_gran, rec_gran;
static int attr_integrated, attr_pools, attr_vmm; /* attr_vmm < 0: by version */
static int hold_events;
static struct object null_clock, per_thread_clock; /* see clock_of */
static char arch[64];
static unsigned last_flags;
static int last_device;

static uint64_t used[MAX_DEVICES];
static struct object objects[MAX_OBJECTS];
static int high; /* objects[0 .. high) may be in use */
static struct pool pools[MAX_POOLS];
static struct fault faults[MAX_FAULTS];
static struct counter counters[MAX_CALLS];
static uint64_t next_va, next_id;
static int initialised;

static int major(void) { return version / 10000000; }

static int parse_version(const char *s) {
  int a = 0, b = 0;
  if (strchr(s, '.') && sscanf(s, "%d.%d", &a, &b) >= 1) return a * 10000000 + b * 100000;
  return atoi(s);
}

static void reset_locked(void) {
  const char *v = getenv("FAKEHIP_VERSION");
  const char *d = getenv("FAKEHIP_DEVICES");
  const char *c = getenv("FAKEHIP_CAPACITY");
  version = v && *v ? parse_version(v) : 60241133;
  n_devices = d && *d ? atoi(d) : 1;
  if (n_devices > MAX_DEVICES) n_devices = MAX_DEVICES;
  capacity = c && *c ? strtoull(c, NULL, 10) : 64 * GIB;
  min_gran = 4 * KIB;
  rec_gran = 2 * MIB;
  attr_integrated = 0;
  attr_pools = 1;
  attr_vmm = -1;
  hold_events = 0;
  memset(&null_clock, 0, sizeof null_clock);
  memset(&per_thread_clock, 0, sizeof per_thread_clock);
  snprintf(arch, sizeof arch, "gfx942:sramecc+:xnack-");
  last_flags = 0;
  last_device = -1;
  memset(used, 0, sizeof used);
  memset(objects, 0, sizeof objects);
  memset(pools, 0, sizeof pools);
  memset(faults, 0, sizeof faults);
  memset(counters, 0, sizeof counters);
  high = 0;
  next_va = 0x100000000000ULL; /* 16 TiB: far from anything the host maps */
  next_id = 0x5000;
  initialised = 1;
}

static void ensure_init(void) {
  if (!initialised) reset_locked();
}

/* Counts the call and answers an injected fault, if one is due. Called with the lock held. */
static hipError_t enter(const char *name) {
  ensure_init();
  int i;
  for (i = 0; i < MAX_CALLS && counters[i].name[0]; i++)
    if (!strcmp(counters[i].name, name)) break;
  if (i < MAX_CALLS) {
    if (!counters[i].name[0]) snprintf(counters[i].name, sizeof counters[i].name, "%s", name);
    counters[i].calls++;
  }
  for (int f = 0; f < MAX_FAULTS; f++) {
    struct fault *x = &faults[f];
    if (!x->name[0] || strcmp(x->name, name)) continue;
    x->seen++;
    if (x->seen >= x->nth && (x->count < 0 || x->seen < x->nth + x->count)) return x->code;
  }
  return hipSuccess;
}

#define ENTER(name)                   \
  pthread_mutex_lock(&lock);          \
  hipError_t fault_ = enter(name);    \
  if (fault_ != hipSuccess) {         \
    pthread_mutex_unlock(&lock);      \
    return fault_;                    \
  }
#define RETURN(code)           \
  do {                         \
    hipError_t r_ = (code);    \
    pthread_mutex_unlock(&lock); \
    return r_;                 \
  } while (0)

static struct object *find(int kind, uint64_t addr) {
  for (int i = 0; i < high; i++)
    if (objects[i].kind == kind && objects[i].addr == addr) return &objects[i];
  return NULL;
}

static struct object *add(int kind, uint64_t addr, uint64_t size, int device) {
  for (int i = 0; i < MAX_OBJECTS; i++) {
    if (objects[i].kind == FREE_SLOT) {
      memset(&objects[i], 0, sizeof objects[i]);
      objects[i].kind = kind;
      objects[i].addr = addr;
      objects[i].size = size;
      objects[i].device = device;
      if (i >= high) high = i + 1;
      return &objects[i];
    }
  }
  return NULL;
}

static void drop(struct object *o) { o->kind = FREE_SLOT; }

/* Streams are clocks: work on one finishes in order, at once unless events are held. The
 * special handles NULL and hipStreamLegacy (0x1) share the null stream's clock,
 * hipStreamPerThread (0x2) has one of its own. */
static int valid_stream(void *stream) {
  uint64_t s = (uint64_t)(uintptr_t)stream;
  return s <= 2 || find(STREAM, s) != NULL;
}

/* The clock of a valid stream handle. */
static struct object *clock_of(uint64_t s) {
  if (s <= 1) return &null_clock;
  if (s == 2) return &per_thread_clock;
  struct object *o = find(STREAM, s);
  return o ? o : &null_clock;
}

static uint64_t enqueue(uint64_t s) {
  struct object *c = clock_of(s);
  c->recorded++;
  if (!hold_events) c->completed = c->recorded;
  return c->recorded;
}

static int event_done(struct object *e) { return e->seq == 0 || clock_of(e->stream)->completed >= e->seq; }

static void complete_all_streams(void) {
  null_clock.completed = null_clock.recorded;
  per_thread_clock.completed = per_thread_clock.recorded;
  for (int i = 0; i < high; i++)
    if (objects[i].kind == STREAM) objects[i].completed = objects[i].recorded;
}

static uint64_t take_va(uint64_t size, uint64_t align) {
  if (align < 2 * MIB) align = 2 * MIB;
  uint64_t va = (next_va + align - 1) & ~(align - 1);
  next_va = va + ((size + 2 * MIB - 1) & ~(2 * MIB - 1)) + 2 * MIB; /* guard gap */
  return va;
}

static uint64_t new_id(void) { return (next_id += 16); }

static int charge(int device, uint64_t bytes) {
  if (used[device] + bytes > capacity || used[device] + bytes < used[device]) return 0;
  used[device] += bytes;
  return 1;
}

static int valid_device(int d) { return d >= 0 && d < n_devices; }

static uint64_t round256(uint64_t n) { return (n + 255) & ~255ULL; }

/* ----- control functions (called by the tests through libloading) ------------------------- */

EXPORT void fakehip_reset(void) {
  pthread_mutex_lock(&lock);
  reset_locked();
  pthread_mutex_unlock(&lock);
}
EXPORT void fakehip_set_version(int v) {
  pthread_mutex_lock(&lock);
  ensure_init();
  version = v;
  pthread_mutex_unlock(&lock);
}
EXPORT void fakehip_set_devices(int n, unsigned long long bytes) {
  pthread_mutex_lock(&lock);
  ensure_init();
  n_devices = n < 0 ? 0 : n > MAX_DEVICES ? MAX_DEVICES : n;
  capacity = bytes;
  pthread_mutex_unlock(&lock);
}
/* attr: 16 (integrated), 88 (pools), 89 (VMM; -1 = by version). */
EXPORT void fakehip_set_attribute(int attr, int value) {
  pthread_mutex_lock(&lock);
  ensure_init();
  if (attr == 16) attr_integrated = value;
  if (attr == 88) attr_pools = value;
  if (attr == 89) attr_vmm = value;
  pthread_mutex_unlock(&lock);
}
EXPORT void fakehip_set_granularity(unsigned long long minimum, unsigned long long recommended) {
  pthread_mutex_lock(&lock);
  ensure_init();
  min_gran = minimum;
  rec_gran = recommended;
  pthread_mutex_unlock(&lock);
}
EXPORT void fakehip_set_arch(const char *name) {
  pthread_mutex_lock(&lock);
  ensure_init();
  snprintf(arch, sizeof arch, "%s", name);
  pthread_mutex_unlock(&lock);
}
/* While held, recorded events stay pending until synchronised or released. */
EXPORT void fakehip_hold_events(int held) {
  pthread_mutex_lock(&lock);
  ensure_init();
  hold_events = held;
  if (!held) complete_all_streams();
  pthread_mutex_unlock(&lock);
}
EXPORT void fakehip_fail(const char *name, long nth, long count, int code) {
  pthread_mutex_lock(&lock);
  ensure_init();
  for (int f = 0; f < MAX_FAULTS; f++) {
    if (!faults[f].name[0]) {
      snprintf(faults[f].name, sizeof faults[f].name, "%s", name);
      faults[f].seen = 0;
      faults[f].nth = nth < 1 ? 1 : nth;
      faults[f].count = count;
      faults[f].code = code;
      break;
    }
  }
  pthread_mutex_unlock(&lock);
}
EXPORT void fakehip_clear_faults(void) {
  pthread_mutex_lock(&lock);
  memset(faults, 0, sizeof faults);
  pthread_mutex_unlock(&lock);
}
/* Calls made of `name` since the last reset (faulted ones included). */
EXPORT long long fakehip_calls(const char *name) {
  long long n = 0;
  pthread_mutex_lock(&lock);
  for (int i = 0; i < MAX_CALLS; i++)
    if (counters[i].name[0] && !strcmp(counters[i].name, name)) n = counters[i].calls;
  pthread_mutex_unlock(&lock);
  return n;
}
/* Live counts: allocations, pool_allocations, reservations, handles, mappings, streams,
 * events, pools (created ones; default pools are not counted), bytes (charged on every
 * device), pool_reserved (bytes pools hold). */
EXPORT long long fakehip_count(const char *what) {
  long long n = 0;
  pthread_mutex_lock(&lock);
  ensure_init();
  int kind = !strcmp(what, "allocations")        ? ALLOC
             : !strcmp(what, "pool_allocations") ? POOL_ALLOC
             : !strcmp(what, "reservations")     ? RESERVATION
             : !strcmp(what, "handles")          ? HANDLE
             : !strcmp(what, "mappings")         ? MAPPING
             : !strcmp(what, "streams")          ? STREAM
             : !strcmp(what, "events")           ? EVENT
                                                 : -1;
  if (kind >= 0) {
    for (int i = 0; i < high; i++)
      if (objects[i].kind == kind) n++;
  } else if (!strcmp(what, "pools")) {
    for (int p = 0; p < MAX_POOLS; p++)
      if (pools[p].live && !pools[p].is_default) n++;
  } else if (!strcmp(what, "bytes")) {
    for (int d = 0; d < MAX_DEVICES; d++) n += (long long)used[d];
  } else if (!strcmp(what, "pool_reserved")) {
    for (int p = 0; p < MAX_POOLS; p++)
      if (pools[p].live) n += (long long)pools[p].reserved;
  } else {
    n = -1;
  }
  pthread_mutex_unlock(&lock);
  return n;
}
EXPORT unsigned long long fakehip_device_used(int device) {
  pthread_mutex_lock(&lock);
  ensure_init();
  unsigned long long n = valid_device(device) ? used[device] : 0;
  pthread_mutex_unlock(&lock);
  return n;
}
/* Flags of the last hipExtMallocWithFlags (hipMalloc: 0) and the device it charged. */
EXPORT unsigned fakehip_last_malloc_flags(void) {
  pthread_mutex_lock(&lock);
  unsigned flags = last_flags;
  pthread_mutex_unlock(&lock);
  return flags;
}
EXPORT int fakehip_last_device(void) {
  pthread_mutex_lock(&lock);
  int device = last_device;
  pthread_mutex_unlock(&lock);
  return device;
}

/* ----- errors ----------------------------------------------------------------------------- */

EXPORT const char *hipGetErrorName(hipError_t e) {
  switch (e) {
    case hipSuccess: return "hipSuccess";
    case hipErrorInvalidValue: return "hipErrorInvalidValue";
    case hipErrorOutOfMemory: return "hipErrorOutOfMemory";
    case hipErrorNotInitialized: return "hipErrorNotInitialized";
    case hipErrorInvalidDevicePointer: return "hipErrorInvalidDevicePointer";
    case hipErrorNoDevice: return "hipErrorNoDevice";
    case hipErrorInvalidDevice: return "hipErrorInvalidDevice";
    case hipErrorInvalidHandle: return "hipErrorInvalidHandle";
    case hipErrorNotReady: return "hipErrorNotReady";
    case hipErrorNotSupported: return "hipErrorNotSupported";
    default: return "hipErrorUnknown";
  }
}
EXPORT const char *hipGetErrorString(hipError_t e) {
  switch (e) {
    case hipSuccess: return "no error";
    case hipErrorInvalidValue: return "invalid argument";
    case hipErrorOutOfMemory: return "out of memory";
    case hipErrorNotInitialized: return "initialization error";
    case hipErrorInvalidDevicePointer: return "invalid device pointer";
    case hipErrorNoDevice: return "no ROCm-capable device is detected";
    case hipErrorInvalidDevice: return "invalid device ordinal";
    case hipErrorInvalidHandle: return "invalid resource handle";
    case hipErrorNotReady: return "device not ready";
    case hipErrorNotSupported: return "operation not supported";
    default: return "unknown error";
  }
}

/* ----- devices ---------------------------------------------------------------------------- */

EXPORT hipError_t hipInit(unsigned flags) {
  ENTER("hipInit");
  if (flags != 0) RETURN(hipErrorInvalidValue);
  RETURN(n_devices == 0 ? hipErrorNoDevice : hipSuccess);
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
  *count = n_devices;
  RETURN(n_devices == 0 ? hipErrorNoDevice : hipSuccess);
}
EXPORT hipError_t hipSetDevice(int device) {
  ENTER("hipSetDevice");
  if (!valid_device(device)) RETURN(hipErrorInvalidDevice);
  current_device = device;
  RETURN(hipSuccess);
}
EXPORT hipError_t hipDeviceGetAttribute(int *value, int attr, int device) {
  ENTER("hipDeviceGetAttribute");
  if (!value) RETURN(hipErrorInvalidValue);
  if (!valid_device(device)) RETURN(hipErrorInvalidDevice);
  switch (attr) {
    case 16: *value = attr_integrated; break;
    case 87: *value = 64; break; /* warp size: a wavefront */
    case 88: *value = attr_pools; break;
    case 89:
      if (attr_vmm >= 0) *value = attr_vmm;
      else if (major() >= 6) *value = 1;
      else RETURN(hipErrorInvalidValue); /* 5.x: no such attribute */
      break;
    default: RETURN(hipErrorInvalidValue);
  }
  RETURN(hipSuccess);
}
static void device_name(int device, char *out, size_t len) {
  snprintf(out, len, "AMD Instinct %s (fakehip %d)", attr_integrated ? "MI300A" : "MI300X", device);
}
EXPORT hipError_t hipDeviceGetName(char *name, int len, int device) {
  ENTER("hipDeviceGetName");
  if (!name || len <= 0) RETURN(hipErrorInvalidValue);
  if (!valid_device(device)) RETURN(hipErrorInvalidDevice);
  device_name(device, name, (size_t)len);
  RETURN(hipSuccess);
}
EXPORT hipError_t hipDeviceTotalMem(size_t *bytes, int device) {
  ENTER("hipDeviceTotalMem");
  if (!bytes) RETURN(hipErrorInvalidValue);
  if (!valid_device(device)) RETURN(hipErrorInvalidDevice);
  *bytes = capacity;
  RETURN(hipSuccess);
}
/* HIP 5.x hipDeviceProp_t (R0000): 792 bytes, name at 0, gcnArchName at 396. */
EXPORT hipError_t hipGetDeviceProperties(void *prop, int device) {
  ENTER("hipGetDeviceProperties");
  if (!prop) RETURN(hipErrorInvalidValue);
  if (!valid_device(device)) RETURN(hipErrorInvalidDevice);
  memset(prop, 0, 792);
  device_name(device, (char *)prop, 256);
  snprintf((char *)prop + 396, 256, "%s", arch);
  RETURN(hipSuccess);
}
/* ROCm 6+ hipDeviceProp_tR0600: 1472 bytes, name at 0, gcnArchName at 1160. */
EXPORT hipError_t hipGetDevicePropertiesR0600(void *prop, int device) {
  ENTER("hipGetDevicePropertiesR0600");
  if (major() < 6) RETURN(hipErrorNotSupported); /* stands in for the missing symbol */
  if (!prop) RETURN(hipErrorInvalidValue);
  if (!valid_device(device)) RETURN(hipErrorInvalidDevice);
  memset(prop, 0, 1472);
  device_name(device, (char *)prop, 256);
  snprintf((char *)prop + 1160, 256, "%s", arch);
  RETURN(hipSuccess);
}
EXPORT hipError_t hipMemGetInfo(size_t *free_bytes, size_t *total) {
  ENTER("hipMemGetInfo");
  if (!free_bytes || !total) RETURN(hipErrorInvalidValue);
  *total = capacity;
  *free_bytes = capacity - used[current_device];
  RETURN(hipSuccess);
}

/* ----- plain allocations ------------------------------------------------------------------ */

static hipError_t do_malloc(void **ptr, size_t size, unsigned flags) {
  if (!ptr) return hipErrorInvalidValue;
  last_flags = flags;
  if (size == 0) {
    *ptr = NULL;
    return hipSuccess;
  }
  int d = current_device;
  if (!charge(d, round256(size))) return hipErrorOutOfMemory;
  uint64_t va = take_va(size, 256);
  if (!add(ALLOC, va, round256(size), d)) {
    used[d] -= round256(size);
    return hipErrorOutOfMemory;
  }
  last_device = d;
  *ptr = (void *)(uintptr_t)va;
  return hipSuccess;
}
EXPORT hipError_t hipMalloc(void **ptr, size_t size) {
  ENTER("hipMalloc");
  RETURN(do_malloc(ptr, size, 0));
}
EXPORT hipError_t hipExtMallocWithFlags(void **ptr, size_t size, unsigned flags) {
  ENTER("hipExtMallocWithFlags");
  /* 0 default, 1 fine-grained, 2 signal memory, 3 uncached (ROCm 6+). */
  if (flags > 3 || (flags == 3 && major() < 6)) RETURN(hipErrorInvalidValue);
  RETURN(do_malloc(ptr, size, flags));
}
EXPORT hipError_t hipFree(void *ptr) {
  ENTER("hipFree");
  if (!ptr) RETURN(hipSuccess);
  struct object *o = find(ALLOC, (uint64_t)(uintptr_t)ptr);
  if (!o) RETURN(hipErrorInvalidValue);
  used[o->device] -= o->size;
  drop(o);
  RETURN(hipSuccess);
}

/* ----- virtual memory --------------------------------------------------------------------- */

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
struct access_desc {
  int loc_type;
  int loc_id;
  int flags;
};

static int prop_ok(const struct prop6 *p) {
  return p && p->type == 1 /* pinned */ && p->loc_type == 1 /* device */ &&
         valid_device(p->loc_id) && p->handle_type == 0 && p->win32 == NULL &&
         p->compression == 0;
}

EXPORT hipError_t hipMemGetAllocationGranularity(size_t *granularity, const struct prop6 *prop,
                                                 int option) {
  ENTER("hipMemGetAllocationGranularity");
  if (!granularity || !prop_ok(prop) || (option != 0 && option != 1)) RETURN(hipErrorInvalidValue);
  *granularity = option == 0 ? min_gran : rec_gran;
  RETURN(hipSuccess);
}
EXPORT hipError_t hipMemCreate(void **handle, size_t size, const struct prop6 *prop,
                               unsigned long long flags) {
  ENTER("hipMemCreate");
  if (!handle || !prop_ok(prop) || flags != 0 || size == 0 || size % min_gran)
    RETURN(hipErrorInvalidValue);
  if (!charge(prop->loc_id, size)) RETURN(hipErrorOutOfMemory);
  uint64_t h = new_id();
  if (!add(HANDLE, h, size, prop->loc_id)) {
    used[prop->loc_id] -= size;
    RETURN(hipErrorOutOfMemory);
  }
  *handle = (void *)(uintptr_t)h;
  RETURN(hipSuccess);
}
EXPORT hipError_t hipMemRelease(void *handle) {
  ENTER("hipMemRelease");
  struct object *o = find(HANDLE, (uint64_t)(uintptr_t)handle);
  if (!o || o->released) RETURN(hipErrorInvalidValue);
  o->released = 1;
  if (o->mapcount == 0) {
    used[o->device] -= o->size;
    drop(o);
  }
  RETURN(hipSuccess);
}
EXPORT hipError_t hipMemAddressReserve(void **ptr, size_t size, size_t alignment, void *addr,
                                       unsigned long long flags) {
  ENTER("hipMemAddressReserve");
  (void)addr;
  if (!ptr || size == 0 || size % min_gran || flags != 0 ||
      (alignment && (alignment & (alignment - 1))))
    RETURN(hipErrorInvalidValue);
  uint64_t va = take_va(size, alignment);
  if (!add(RESERVATION, va, size, current_device)) RETURN(hipErrorOutOfMemory);
  *ptr = (void *)(uintptr_t)va;
  RETURN(hipSuccess);
}
static int mapped_inside(uint64_t va, uint64_t size) {
  for (int i = 0; i < high; i++)
    if (objects[i].kind == MAPPING && objects[i].addr < va + size &&
        va < objects[i].addr + objects[i].size)
      return 1;
  return 0;
}
EXPORT hipError_t hipMemAddressFree(void *ptr, size_t size) {
  ENTER("hipMemAddressFree");
  struct object *o = find(RESERVATION, (uint64_t)(uintptr_t)ptr);
  if (!o || o->size != size || mapped_inside(o->addr, o->size)) RETURN(hipErrorInvalidValue);
  drop(o);
  RETURN(hipSuccess);
}
static struct object *reservation_of(uint64_t va, uint64_t size) {
  for (int i = 0; i < high; i++)
    if (objects[i].kind == RESERVATION && objects[i].addr <= va &&
        va + size <= objects[i].addr + objects[i].size)
      return &objects[i];
  return NULL;
}
EXPORT hipError_t hipMemMap(void *ptr, size_t size, size_t offset, void *handle,
                            unsigned long long flags) {
  ENTER("hipMemMap");
  uint64_t va = (uint64_t)(uintptr_t)ptr;
  struct object *h = find(HANDLE, (uint64_t)(uintptr_t)handle);
  if (!h || h->released || flags != 0 || size == 0 || va % min_gran || size % min_gran ||
      offset % min_gran || offset + size > h->size || !reservation_of(va, size) ||
      mapped_inside(va, size))
    RETURN(hipErrorInvalidValue);
  struct object *m = add(MAPPING, va, size, h->device);
  if (!m) RETURN(hipErrorOutOfMemory);
  m->handle = h->addr;
  h->mapcount++;
  RETURN(hipSuccess);
}
static uint64_t mapped_bytes(uint64_t va, uint64_t size, int *partial) {
  uint64_t n = 0;
  *partial = 0;
  for (int i = 0; i < high; i++) {
    struct object *m = &objects[i];
    if (m->kind != MAPPING || m->addr >= va + size || va >= m->addr + m->size) continue;
    uint64_t lo = m->addr > va ? m->addr : va;
    uint64_t hi = m->addr + m->size < va + size ? m->addr + m->size : va + size;
    n += hi - lo;
    if (m->addr < va || m->addr + m->size > va + size) *partial = 1;
  }
  return n;
}
EXPORT hipError_t hipMemSetAccess(void *ptr, size_t size, const struct access_desc *desc,
                                  size_t count) {
  ENTER("hipMemSetAccess");
  uint64_t va = (uint64_t)(uintptr_t)ptr;
  int partial;
  if (!desc || count != 1 || desc->loc_type != 1 || !valid_device(desc->loc_id) ||
      desc->flags != 3 || size == 0 || va % min_gran || size % min_gran ||
      mapped_bytes(va, size, &partial) != size)
    RETURN(hipErrorInvalidValue);
  RETURN(hipSuccess);
}
EXPORT hipError_t hipMemUnmap(void *ptr, size_t size) {
  ENTER("hipMemUnmap");
  uint64_t va = (uint64_t)(uintptr_t)ptr;
  int partial;
  if (size == 0 || va % min_gran || size % min_gran || mapped_bytes(va, size, &partial) != size ||
      partial)
    RETURN(hipErrorInvalidValue);
  for (int i = 0; i < high; i++) {
    struct object *m = &objects[i];
    if (m->kind != MAPPING || m->addr < va || m->addr >= va + size) continue;
    struct object *h = find(HANDLE, m->handle);
    drop(m);
    if (h && --h->mapcount == 0 && h->released) {
      used[h->device] -= h->size;
      drop(h);
    }
  }
  RETURN(hipSuccess);
}

/* ----- pools ------------------------------------------------------------------------------ */

struct pool_props {
  int alloc_type;
  int handle_types;
  int loc_type;
  int loc_id;
  void *win32;
  unsigned char reserved[64];
};

static void *pool_value(int p) { return (void *)(uintptr_t)(0x9000 + 16 * (uint64_t)p); }
static int pool_index(void *handle) {
  uint64_t v = (uint64_t)(uintptr_t)handle;
  if (v < 0x9000 || (v - 0x9000) % 16) return -1;
  uint64_t p = (v - 0x9000) / 16;
  return p < MAX_POOLS && pools[p].live ? (int)p : -1;
}
static int new_pool(int device, int is_default) {
  for (int p = 0; p < MAX_POOLS; p++) {
    if (!pools[p].live) {
      memset(&pools[p], 0, sizeof pools[p]);
      pools[p].live = 1;
      pools[p].device = device;
      pools[p].is_default = is_default;
      pools[p].threshold = UINT64_MAX; /* the ROCm quirk: never release unless told */
      return p;
    }
  }
  return -1;
}
/* Releases cached bytes until the pool holds at most `keep` (never what is in use). */
static void pool_release(struct pool *p, uint64_t keep) {
  uint64_t cached = p->reserved - p->used;
  uint64_t excess = p->reserved > keep ? p->reserved - keep : 0;
  uint64_t give = excess < cached ? excess : cached;
  p->reserved -= give;
  used[p->device] -= give;
}
static void sync_pools(void) {
  for (int p = 0; p < MAX_POOLS; p++)
    if (pools[p].live) pool_release(&pools[p], pools[p].threshold);
}

EXPORT hipError_t hipDeviceGetDefaultMemPool(void **pool, int device) {
  ENTER("hipDeviceGetDefaultMemPool");
  if (!pool) RETURN(hipErrorInvalidValue);
  if (!valid_device(device)) RETURN(hipErrorInvalidDevice);
  if (!attr_pools) RETURN(hipErrorNotSupported);
  for (int p = 0; p < MAX_POOLS; p++) {
    if (pools[p].live && pools[p].is_default && pools[p].device == device) {
      *pool = pool_value(p);
      RETURN(hipSuccess);
    }
  }
  int p = new_pool(device, 1);
  if (p < 0) RETURN(hipErrorOutOfMemory);
  *pool = pool_value(p);
  RETURN(hipSuccess);
}
EXPORT hipError_t hipMemPoolCreate(void **pool, const struct pool_props *props) {
  ENTER("hipMemPoolCreate");
  if (!pool || !props || props->alloc_type != 1 || props->loc_type != 1 ||
      !valid_device(props->loc_id) || props->handle_types != 0)
    RETURN(hipErrorInvalidValue);
  for (int i = 0; i < 64; i++)
    if (props->reserved[i]) RETURN(hipErrorInvalidValue);
  if (!attr_pools) RETURN(hipErrorNotSupported);
  int p = new_pool(props->loc_id, 0);
  if (p < 0) RETURN(hipErrorOutOfMemory);
  *pool = pool_value(p);
  RETURN(hipSuccess);
}
EXPORT hipError_t hipMemPoolDestroy(void *handle) {
  ENTER("hipMemPoolDestroy");
  int p = pool_index(handle);
  if (p < 0 || pools[p].is_default || pools[p].used) RETURN(hipErrorInvalidValue);
  pool_release(&pools[p], 0);
  pools[p].live = 0;
  RETURN(hipSuccess);
}
EXPORT hipError_t hipMemPoolSetAttribute(void *handle, int attr, void *value) {
  ENTER("hipMemPoolSetAttribute");
  int p = pool_index(handle);
  if (p < 0 || !value) RETURN(hipErrorInvalidValue);
  struct pool *x = &pools[p];
  uint64_t v = *(uint64_t *)value;
  switch (attr) {
    case 1: case 2: case 3: break; /* reuse policies (int): accepted */
    case 4: x->threshold = v; break;
    case 6: if (v) RETURN(hipErrorInvalidValue); x->reserved_high = x->reserved; break;
    case 8: if (v) RETURN(hipErrorInvalidValue); x->used_high = x->used; break;
    default: RETURN(hipErrorInvalidValue);
  }
  RETURN(hipSuccess);
}
EXPORT hipError_t hipMemPoolGetAttribute(void *handle, int attr, void *value) {
  ENTER("hipMemPoolGetAttribute");
  int p = pool_index(handle);
  if (p < 0 || !value) RETURN(hipErrorInvalidValue);
  struct pool *x = &pools[p];
  uint64_t *out = value;
  switch (attr) {
    case 1: case 2: case 3: *(int *)value = 1; break;
    case 4: *out = x->threshold; break;
    case 5: *out = x->reserved; break;
    case 6: *out = x->reserved_high; break;
    case 7: *out = x->used; break;
    case 8: *out = x->used_high; break;
    default: RETURN(hipErrorInvalidValue);
  }
  RETURN(hipSuccess);
}
EXPORT hipError_t hipMemPoolTrimTo(void *handle, size_t keep) {
  ENTER("hipMemPoolTrimTo");
  int p = pool_index(handle);
  if (p < 0) RETURN(hipErrorInvalidValue);
  pool_release(&pools[p], keep);
  RETURN(hipSuccess);
}
EXPORT hipError_t hipMallocFromPoolAsync(void **ptr, size_t size, void *handle, void *stream) {
  ENTER("hipMallocFromPoolAsync");
  int p = pool_index(handle);
  if (!ptr || p < 0 || !valid_stream(stream)) RETURN(hipErrorInvalidValue);
  if (size == 0) {
    *ptr = NULL;
    RETURN(hipSuccess);
  }
  struct pool *x = &pools[p];
  uint64_t bytes = round256(size);
  uint64_t cached = x->reserved - x->used;
  if (cached < bytes) {
    if (!charge(x->device, bytes - cached)) RETURN(hipErrorOutOfMemory);
    x->reserved += bytes - cached;
  }
  x->used += bytes;
  if (x->used > x->used_high) x->used_high = x->used;
  if (x->reserved > x->reserved_high) x->reserved_high = x->reserved;
  uint64_t va = take_va(bytes, 256);
  struct object *o = add(POOL_ALLOC, va, bytes, x->device);
  if (!o) RETURN(hipErrorOutOfMemory);
  o->pool = p;
  *ptr = (void *)(uintptr_t)va;
  RETURN(hipSuccess);
}
EXPORT hipError_t hipFreeAsync(void *ptr, void *stream) {
  ENTER("hipFreeAsync");
  if (!valid_stream(stream)) RETURN(hipErrorInvalidValue);
  struct object *o = find(POOL_ALLOC, (uint64_t)(uintptr_t)ptr);
  if (!o) RETURN(hipErrorInvalidValue);
  pools[o->pool].used -= o->size;
  drop(o);
  RETURN(hipSuccess);
}

/* ----- streams and events ----------------------------------------------------------------- */

EXPORT hipError_t hipStreamCreateWithFlags(void **stream, unsigned flags) {
  ENTER("hipStreamCreateWithFlags");
  if (!stream || flags > 1) RETURN(hipErrorInvalidValue);
  uint64_t id = new_id();
  if (!add(STREAM, id, 0, current_device)) RETURN(hipErrorOutOfMemory);
  *stream = (void *)(uintptr_t)id;
  RETURN(hipSuccess);
}
EXPORT hipError_t hipStreamDestroy(void *stream) {
  ENTER("hipStreamDestroy");
  struct object *o = find(STREAM, (uint64_t)(uintptr_t)stream);
  if (!o) RETURN(hipErrorInvalidHandle);
  /* The work already enqueued still completes: the fake completes it now. */
  for (int i = 0; i < high; i++)
    if (objects[i].kind == EVENT && objects[i].stream == o->addr) objects[i].seq = 0;
  drop(o);
  RETURN(hipSuccess);
}
EXPORT hipError_t hipStreamSynchronize(void *stream) {
  ENTER("hipStreamSynchronize");
  if (!valid_stream(stream)) RETURN(hipErrorInvalidHandle);
  struct object *c = clock_of((uint64_t)(uintptr_t)stream);
  /* The null stream waits for every blocking stream. */
  if (c == &null_clock)
    complete_all_streams();
  else
    c->completed = c->recorded;
  sync_pools();
  RETURN(hipSuccess);
}
EXPORT hipError_t hipDeviceSynchronize(void) {
  ENTER("hipDeviceSynchronize");
  complete_all_streams();
  sync_pools();
  RETURN(hipSuccess);
}
EXPORT hipError_t hipEventCreateWithFlags(void **event, unsigned flags) {
  ENTER("hipEventCreateWithFlags");
  if (!event || flags > 7) RETURN(hipErrorInvalidValue);
  uint64_t id = new_id();
  if (!add(EVENT, id, 0, current_device)) RETURN(hipErrorOutOfMemory);
  *event = (void *)(uintptr_t)id;
  RETURN(hipSuccess);
}
EXPORT hipError_t hipEventRecord(void *event, void *stream) {
  ENTER("hipEventRecord");
  struct object *o = find(EVENT, (uint64_t)(uintptr_t)event);
  if (!o || !valid_stream(stream)) RETURN(hipErrorInvalidHandle);
  o->stream = (uint64_t)(uintptr_t)stream;
  o->seq = enqueue(o->stream);
  RETURN(hipSuccess);
}
EXPORT hipError_t hipEventQuery(void *event) {
  ENTER("hipEventQuery");
  struct object *o = find(EVENT, (uint64_t)(uintptr_t)event);
  if (!o) RETURN(hipErrorInvalidHandle);
  RETURN(event_done(o) ? hipSuccess : hipErrorNotReady);
}
EXPORT hipError_t hipEventSynchronize(void *event) {
  ENTER("hipEventSynchronize");
  struct object *o = find(EVENT, (uint64_t)(uintptr_t)event);
  if (!o) RETURN(hipErrorInvalidHandle);
  /* Waiting for an event waits for the work before it on its stream. */
  struct object *c = clock_of(o->stream);
  if (c->completed < o->seq) c->completed = o->seq;
  sync_pools();
  RETURN(hipSuccess);
}
EXPORT hipError_t hipEventDestroy(void *event) {
  ENTER("hipEventDestroy");
  struct object *o = find(EVENT, (uint64_t)(uintptr_t)event);
  if (!o) RETURN(hipErrorInvalidHandle);
  drop(o);
  RETURN(hipSuccess);
}
