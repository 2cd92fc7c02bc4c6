/*
 * fakehip: a conformance driver for portalloc's hip backend.
 *
 * Exports the HIP runtime symbols portalloc resolves from libamdhip64 (same names, same C
 * signatures, same error codes) over bookkeeping on the host: addresses come from a fake
 * address space and no device memory is touched, so a 192 GiB MI300X is simulated without
 * using memory. The rules follow HIP's: sizes and offsets of the virtual-memory calls are
 * multiples of the minimum granularity, a mapping lies inside one reservation, set-access
 * needs the range mapped, unmap covers whole mappings, a released handle lives until its last
 * mapping goes, the current device is per thread (hipSetDevice / hipGetDevice), streams are
 * clocks of the timeline of fake_common.h (any handle HIP knows: its own streams, NULL,
 * hipStreamLegacy, hipStreamPerThread — the calling thread's own) whose work finishes in
 * order — at once, unless held by a kernel in flight, a stream wait or hold_events — and
 * waiting for an event waits for the work before it, and pools give memory back only down
 * to their release threshold at a synchronisation. A pool's blocks are as fakecuda's: a
 * block freed with hipFreeAsync is cached once its stream's clock reaches the free; a request
 * takes the smallest cached block that fits and is safe for its stream (its free completed,
 * or freed on the same stream, never the per-thread handle), else a new one; a trim gives
 * back only cached blocks whose free completed, and giving one back while a kernel or a copy
 * still uses it is a hazard.
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
 * hipMemAddressReserve's `addr` is a hint, as HIP documents it, in every profile: the
 * reservation is at exactly `addr` when it is non-zero, a multiple of the minimum granularity
 * and of `alignment`, and [addr, addr + size) overlaps no live reservation or allocation;
 * else at a fresh address. A freed reservation's range can so be reserved again at the same
 * address (as vLLM and torch_memory_saver do); a call without a hint never gets it again.
 *
 * Profiles: ROCm as it behaves, beside what it documents. Selected with FAKEHIP_PROFILE at
 * fakehip_reset (an unknown name: documented, said on stderr) or fakehip_set_profile(names)
 * (0; hipErrorInvalidValue for an unknown name, which changes nothing); a comma-separated
 * list, so profiles combine; `documented` adds nothing. fakehip_profile_name(i) lists them
 * (tests/support/fakes.rs' FAKEHIP_PROFILES is checked against it).
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
 *     instead of from `ptr`'s and wants the sum to be exactly `size`; several handles of
 *     different sizes mapped one after another, access set on each, fail from the second.
 *     Modelled: the mappings of the reservation holding `ptr` in address order from the
 *     lowest; refused unless a sum of the first k of them is exactly `size`. With mappings
 *     of one granule each, a set-access over n granules passes whenever the reservation
 *     holds n mappings, which it does: a vmm like portalloc's does not meet it.
 *   rocm-systems-7128-reserve-counted
 *     ROCm/rocm-systems#7128 (merged 2026-06): the runtime's own free-memory counter, which
 *     its allocations are checked against, subtracted address reservations (VA ranges) in
 *     full and never counted physical handles, so after a reservation larger than what it
 *     thought free it clamped to 0 and refused a 32 MiB allocation with hipErrorOutOfMemory
 *     while hipMemGetInfo said GiBs were free. The report is about the pool's own
 *     reservations; that hipMemAddressReserve's ranges (the same kind of VA range object)
 *     were counted too is read from the fix, not reported. Modelled: hipMalloc and
 *     hipExtMallocWithFlags are refused when their bytes, plus every other plain byte, plus
 *     every live reservation of the device, would pass its capacity; hipMemCreate and
 *     hipMemGetInfo are as documented. portalloc's vmm reserves 2 × its limit + 1 GiB, so
 *     while it lives every plain allocation on the device (a caller's, another strategy's)
 *     meets it; vmm itself uses hipMemCreate only.
 *   rocr-285-unmap-many
 *     ROCm/ROCR-Runtime#285 (before ROCm 7.0; the fix was targeted at 7.0): one hipMemUnmap
 *     over several mappings lowers ROCr's use count of the reservation by one only, so its
 *     hipMemAddressFree fails for ever after, though nothing is mapped. Modelled: each
 *     reservation counts a use per hipMemMap and drops one per hipMemUnmap call that unmaps
 *     anything in it; hipMemAddressFree of a reservation still in use is
 *     hipErrorInvalidValue (the report gives ROCr's HSA_STATUS_ERROR_RESOURCE_FREE, not the
 *     HIP code). portalloc's vmm unmaps one granule per call and does not meet it.
 * Reported, not modelled:
 *   ROCm/rocm-systems#11693 (gfx1201, ROCm 7.2.1): after hipMemMap + hipMemSetAccess return,
 *     GPU work for ~1-2 ms still sees the old translation: kernels read zeros and their
 *     stores are lost, without an error; only a wall-clock wait helps (a queue round-trip
 *     does not). Not modelled: what goes wrong is GPU work on the bytes, which fakehip has
 *     none behind, and a fake could only tell "early" by a timer that makes tests flaky.
 *     portalloc's vmm meets it on such a card: it maps on demand and hands the memory out at
 *     once, and a wake maps and then copies the bytes back at once (whether copies see the
 *     stale translation as kernels do is not reported).
 *   ROCm/hip#3781 (ROCm 6.4.0, fixed in 6.4.2): hipMemRelease returns no physical memory at
 *     all, not after hipMemUnmap, hipMemRelease or hipMemAddressFree. Not modelled: one
 *     release's leak below portalloc's VMM gate (ROCm 7), so portalloc's vmm never runs on
 *     it, and nothing an allocator does gets the memory back, so under such a profile the
 *     conformance checks of vmm (run under every profile) could only fail.
 *
 * Peer access is HIP's: hipDeviceCanAccessPeer answers 1 for distinct devices unless
 * fake_set_peer says otherwise, hipDeviceEnablePeerAccess enables it from the current device
 * (hipSetDevice), and hipMemSetAccess takes a descriptor per device (see fake_common.h).
 *
 * Defaults come from the environment at fakehip_reset (FAKEHIP_VERSION, FAKEHIP_DEVICES,
 * FAKEHIP_CAPACITY, FAKEHIP_PROFILE) and the control functions below override them. Faults, call counts, live
 * counts and peer controls: the fake_* API of fake_common.h (fakehip_reset clears them too).
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
  hipErrorPeerAccessUnsupported = 217,
  hipErrorInvalidHandle = 400,
  hipErrorNotReady = 600,
  hipErrorPeerAccessAlreadyEnabled = 704,
  hipErrorPeerAccessNotEnabled = 705,
  hipErrorNotSupported = 801,
};

#define FAKE_STATUS hipError_t
#define FAKE_OK hipSuccess
#define FAKE_INVALID_VALUE hipErrorInvalidValue
#define FAKE_INVALID_DEVICE hipErrorInvalidDevice
#define FAKE_PEER_UNSUPPORTED hipErrorPeerAccessUnsupported
#define FAKE_PEER_ALREADY_ENABLED hipErrorPeerAccessAlreadyEnabled
#define FAKE_PEER_NOT_ENABLED hipErrorPeerAccessNotEnabled
#include "fake_common.h"

#define EXPORT FAKE_EXPORT
#define KIB 1024ULL
#define MIB (1024ULL * 1024ULL)
#define GIB (1024ULL * MIB)
#define MAX_DEVICES FAKE_MAX_DEVICES
#define MAX_OBJECTS 65536
#define MAX_POOLS 64

/* ----- state ----------------------------------------------------------------------------- */

/* POOL_CACHED: a pool's block freed by hipFreeAsync, its memory still the pool's. */
enum kind {
  FREE_SLOT = 0,
  ALLOC,
  POOL_ALLOC,
  RESERVATION,
  HANDLE,
  MAPPING,
  STREAM,
  EVENT,
  HOST_ALLOC,
  POOL_CACHED
};

struct object {
  int kind;
  uint64_t addr; /* address, handle, stream or event value; HOST_ALLOC: the malloc'd memory */
  uint64_t size;
  int device;
  int released;      /* HANDLE: hipMemRelease called */
  int mapcount;      /* HANDLE: live mappings */
  uint64_t handle;   /* MAPPING: the handle mapped */
  int pool;          /* POOL_ALLOC, POOL_CACHED: pool index */
  int clock;         /* STREAM: its clock; EVENT: the clock of the last record's stream;
                        POOL_CACHED: the clock of the stream it was freed on */
  uint64_t seq;      /* EVENT, POOL_CACHED: its number on that clock (0: complete) */
  unsigned access;   /* MAPPING: bit d, device d may access it (hipMemSetAccess) */
  long uses;         /* RESERVATION: ROCr's use count (rocr-285-unmap-many) */
};

struct pool {
  int live;      /* the slot is in use: a pool, or a destroyed one still holding blocks */
  int destroyed; /* hipMemPoolDestroy was called: its handle is gone, its blocks go when free */
  int device;
  int is_default;
  struct fake_pool_stats stats;
};

static __thread int current_device = 0;

static int version;
static int n_devices;
static uint64_t capacity;
static uint64_t min_gran, rec_gran;
static int attr_integrated, attr_pools, attr_vmm; /* attr_vmm < 0: by version */
/* Destroyed streams' handle values, which the next hipStreamCreateWithFlags hands out again,
 * as drivers reuse freed handles. */
#define MAX_REUSED 64
static uint64_t reusable_streams[MAX_REUSED];
static int n_reusable;
static char arch[64];
static unsigned last_flags;
static int last_device;

static uint64_t used[MAX_DEVICES];
static struct object objects[MAX_OBJECTS];
static int high; /* objects[0 .. high) may be in use */
static struct pool pools[MAX_POOLS];
static uint64_t next_va, next_id;
static int initialised;

/* ----- profiles: ROCm as it behaves (see the header) ------------------------------------- */

enum {
  PROFILE_RESERVATION_HOLD = 1u << 0,
  PROFILE_SETACCESS_PREFIX = 1u << 1,
  PROFILE_RESERVE_COUNTED = 1u << 2,
  PROFILE_UNMAP_MANY = 1u << 3,
};
static const struct {
  const char *name;
  unsigned bits;
} profile_names[] = {
    {"documented", 0},
    {"rocm7-reservation-hold", PROFILE_RESERVATION_HOLD},
    {"rocm-systems-2516-setaccess-prefix", PROFILE_SETACCESS_PREFIX},
    {"rocm-systems-7128-reserve-counted", PROFILE_RESERVE_COUNTED},
    {"rocr-285-unmap-many", PROFILE_UNMAP_MANY},
};
static unsigned profile; /* PROFILE_* bits in force */

/* The bits of a comma-separated list of profile names into `*bits`; 0, or the length of the
 * first unknown name with `*unknown` pointing at it. Spaces around a name are ignored and an
 * empty list is `documented`. */
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

/* Which reservation each handle was ever mapped into, while both live: under
 * rocm7-reservation-hold a released handle's bytes stay charged while any pair of its is
 * left. Recorded in every profile (a pair goes when its handle is dropped or its reservation
 * freed), so a profile only changes what a release gives back. */
#define MAX_HOLDS 65536
struct hold {
  uint64_t handle, reservation;
};
static struct hold holds[MAX_HOLDS];
static int n_holds;

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
  n_reusable = 0;
  fake_timeline_reset();
  snprintf(arch, sizeof arch, "gfx942:sramecc+:xnack-");
  last_flags = 0;
  last_device = -1;
  memset(used, 0, sizeof used);
  for (int i = 0; i < high; i++)
    if (objects[i].kind == HOST_ALLOC) free((void *)(uintptr_t)objects[i].addr);
  memset(objects, 0, sizeof objects);
  memset(pools, 0, sizeof pools);
  fake_common_reset();
  n_holds = 0;
  const char *p = getenv("FAKEHIP_PROFILE");
  const char *unknown = NULL;
  size_t bad = parse_profiles(p, &profile, &unknown);
  if (bad) {
    fprintf(stderr,
            "fakehip: unknown profile \"%.*s\" in FAKEHIP_PROFILE=\"%s\"; using the documented "
            "behaviour\n",
            (int)bad, unknown, p);
    profile = 0;
  }
  high = 0;
  next_va = 0x100000000000ULL; /* 16 TiB: far from anything the host maps */
  next_id = 0x5000;
  initialised = 1;
}

static void fake_prepare(void) {
  if (!initialised) reset_locked();
}

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

/* Streams are clocks of the timeline (fake_common.h): the special handles NULL and
 * hipStreamLegacy (0x1) share the null stream's clock, hipStreamPerThread (0x2) names the
 * calling thread's own. */
static int valid_stream(void *stream) {
  uint64_t s = (uint64_t)(uintptr_t)stream;
  return s <= 2 || find(STREAM, s) != NULL;
}

/* The clock of a valid stream handle. */
static int clock_of(uint64_t s) {
  if (s <= 1) return FAKE_NULL_CLOCK;
  if (s == 2) return fake_per_thread_clock();
  struct object *o = find(STREAM, s);
  return o ? o->clock : FAKE_NULL_CLOCK;
}

static int fake_clock_of_handle(void *stream) {
  return valid_stream(stream) ? clock_of((uint64_t)(uintptr_t)stream) : 0;
}

static int event_done(struct object *e) { return fake_clock_done(e->clock, e->seq); }

static uint64_t take_va(uint64_t size, uint64_t align) {
  if (align < 2 * MIB) align = 2 * MIB;
  uint64_t va = (next_va + align - 1) & ~(align - 1);
  next_va = va + ((size + 2 * MIB - 1) & ~(2 * MIB - 1)) + 2 * MIB; /* guard gap */
  return va;
}

static uint64_t new_id(void) { return (next_id += 16); }

/* True when [va, va + size) overlaps a live reservation or allocation: what holds an
 * address. */
static int va_taken(uint64_t va, uint64_t size) {
  for (int i = 0; i < high; i++) {
    struct object *o = &objects[i];
    if ((o->kind == RESERVATION || o->kind == ALLOC || o->kind == POOL_ALLOC ||
         o->kind == POOL_CACHED) &&
        o->addr < va + size && va < o->addr + o->size)
      return 1;
  }
  return 0;
}

/* hipMemAddressReserve's address: exactly the hint `want` when it is non-zero, aligned to the
 * minimum granularity and to `alignment`, and free, else a fresh one from take_va. Hintless
 * calls only move forward, so a freed range is never handed out again without a hint; an
 * honoured hint past next_va moves it on, so no fresh address lands on it later. */
static uint64_t reserve_va(uint64_t want, uint64_t size, uint64_t alignment) {
  int usable = want && want % min_gran == 0 && (!alignment || want % alignment == 0) &&
               want + size > want && !va_taken(want, size);
  if (!usable) return take_va(size, alignment);
  uint64_t end = ((want + size + 2 * MIB - 1) & ~(2 * MIB - 1)) + 2 * MIB; /* guard gap */
  if (end > next_va) next_va = end;
  return want;
}

static int charge(int device, uint64_t bytes) {
  if (used[device] + bytes > capacity || used[device] + bytes < used[device]) return 0;
  used[device] += bytes;
  return 1;
}

static int valid_device(int d) { return d >= 0 && d < n_devices; }

static uint64_t round256(uint64_t n) { return (n + 255) & ~255ULL; }

/* ----- control functions (called by the tests through libloading) ------------------------- */

/* Not LOCKED: its fake_prepare would reset first, and say an unknown profile twice. */
EXPORT void fakehip_reset(void) {
  pthread_mutex_lock(&lock);
  reset_locked();
  pthread_mutex_unlock(&lock);
}
EXPORT void fakehip_set_version(int v) { LOCKED(version = v); }
/* The profiles in force from now on (a comma-separated list, see the header); 0, or
 * hipErrorInvalidValue for an unknown name, which changes nothing. What a profile holds back
 * already (a held handle) stays as it is until its reservation goes or the reset. */
EXPORT int fakehip_set_profile(const char *names) {
  int rc = hipSuccess;
  LOCKED({
    unsigned bits;
    const char *unknown = NULL;
    if (parse_profiles(names, &bits, &unknown))
      rc = hipErrorInvalidValue;
    else
      profile = bits;
  });
  return rc;
}
/* The name of profile `i` (from 0), or NULL past the last: the list the tests check theirs
 * against. */
EXPORT const char *fakehip_profile_name(int i) {
  int n = (int)(sizeof profile_names / sizeof profile_names[0]);
  return i >= 0 && i < n ? profile_names[i].name : NULL;
}
/* Bytes of released handles with no mapping left that are still charged (what
 * rocm7-reservation-hold holds back), all devices together. */
EXPORT unsigned long long fakehip_held_bytes(void) {
  unsigned long long n = 0;
  LOCKED({
    for (int i = 0; i < high; i++)
      if (objects[i].kind == HANDLE && objects[i].released && !objects[i].mapcount)
        n += objects[i].size;
  });
  return n;
}
EXPORT void fakehip_set_devices(int n, unsigned long long bytes) {
  LOCKED({
    n_devices = n < 0 ? 0 : n > MAX_DEVICES ? MAX_DEVICES : n;
    capacity = bytes;
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
    min_gran = minimum;
    rec_gran = recommended;
  });
}
EXPORT void fakehip_set_arch(const char *name) { LOCKED(snprintf(arch, sizeof arch, "%s", name)); }
/* While held, recorded events stay pending until synchronised or released. */
EXPORT void fakehip_hold_events(int held) {
  LOCKED(fake_set_hold(held));
}
/* fake_live's answers (fake_common.h). */
static long long fake_live_of(enum fake_live_what what) {
  static const int kinds[LIVE_KINDS] = {
      [LIVE_ALLOCATIONS] = ALLOC,   [LIVE_POOL_ALLOCATIONS] = POOL_ALLOC,
      [LIVE_RESERVATIONS] = RESERVATION, [LIVE_HANDLES] = HANDLE,
      [LIVE_MAPPINGS] = MAPPING,    [LIVE_STREAMS] = STREAM,
      [LIVE_EVENTS] = EVENT,        [LIVE_HOST_ALLOCATIONS] = HOST_ALLOC,
  };
  long long n = 0;
  switch (what) {
    case LIVE_POOLS:
      for (int p = 0; p < MAX_POOLS; p++)
        n += pools[p].live && !pools[p].destroyed && !pools[p].is_default;
      return n;
    case LIVE_BYTES:
      for (int d = 0; d < MAX_DEVICES; d++) n += (long long)used[d];
      return n;
    case LIVE_POOL_RESERVED:
      for (int p = 0; p < MAX_POOLS; p++)
        if (pools[p].live) n += (long long)pools[p].stats.reserved;
      return n;
    case LIVE_CONTEXTS:
      return -1; /* HIP has no context a caller retains */
    default:
      for (int i = 0; i < high; i++) n += objects[i].kind == kinds[what];
      return n;
  }
}
/* fake_access's answer (fake_common.h). */
static int fake_access_of(unsigned long long va, int device) {
  for (int i = 0; i < high; i++) {
    struct object *m = &objects[i];
    if (m->kind == MAPPING && m->addr <= va && va < m->addr + m->size)
      return fake_device_index_ok(device) && (m->access >> device) & 1;
  }
  return -1;
}
EXPORT unsigned long long fakehip_device_used(int device) {
  unsigned long long n = 0;
  LOCKED(n = valid_device(device) ? used[device] : 0);
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
    {hipSuccess, "hipSuccess", "no error"},
    {hipErrorInvalidValue, "hipErrorInvalidValue", "invalid argument"},
    {hipErrorOutOfMemory, "hipErrorOutOfMemory", "out of memory"},
    {hipErrorNotInitialized, "hipErrorNotInitialized", "initialization error"},
    {hipErrorInvalidDevicePointer, "hipErrorInvalidDevicePointer", "invalid device pointer"},
    {hipErrorNoDevice, "hipErrorNoDevice", "no ROCm-capable device is detected"},
    {hipErrorInvalidDevice, "hipErrorInvalidDevice", "invalid device ordinal"},
    {hipErrorPeerAccessUnsupported, "hipErrorPeerAccessUnsupported",
     "peer access is not supported between these two devices"},
    {hipErrorInvalidHandle, "hipErrorInvalidHandle", "invalid resource handle"},
    {hipErrorNotReady, "hipErrorNotReady", "device not ready"},
    {hipErrorPeerAccessAlreadyEnabled, "hipErrorPeerAccessAlreadyEnabled",
     "peer access is already enabled"},
    {hipErrorPeerAccessNotEnabled, "hipErrorPeerAccessNotEnabled",
     "peer access has not been enabled"},
    {hipErrorNotSupported, "hipErrorNotSupported", "operation not supported"},
};
/* HIP answers every code; one it does not know is its unknown error. */
static const struct fake_error unknown_error = {999, "hipErrorUnknown", "unknown error"};

static const struct fake_error *error_of(hipError_t e, const char *function) {
  const struct fake_error *known =
      fake_error_of(errors, sizeof errors / sizeof errors[0], e, function);
  return known ? known : &unknown_error;
}
EXPORT const char *hipGetErrorName(hipError_t e) { return error_of(e, "hipGetErrorName")->name; }
EXPORT const char *hipGetErrorString(hipError_t e) {
  return error_of(e, "hipGetErrorString")->text;
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
/* The calling thread's current device (0 until hipSetDevice). */
EXPORT hipError_t hipGetDevice(int *device) {
  ENTER("hipGetDevice");
  if (!device) RETURN(hipErrorInvalidValue);
  *device = current_device;
  RETURN(hipSuccess);
}
EXPORT hipError_t hipDeviceCanAccessPeer(int *can, int device, int peer) {
  ENTER("hipDeviceCanAccessPeer");
  RETURN(fake_can_access_peer(can, device, peer, n_devices));
}
/* From the calling thread's current device to `peer`. */
EXPORT hipError_t hipDeviceEnablePeerAccess(int peer, unsigned flags) {
  ENTER("hipDeviceEnablePeerAccess");
  RETURN(fake_enable_peer(current_device, peer, flags, n_devices));
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
/* Fills a hipDeviceProp_t of `size` bytes: the name at 0, gcnArchName at `arch_at`. */
static hipError_t properties(void *prop, int device, size_t size, size_t arch_at) {
  if (!prop) return hipErrorInvalidValue;
  if (!valid_device(device)) return hipErrorInvalidDevice;
  memset(prop, 0, size);
  device_name(device, (char *)prop, 256);
  snprintf((char *)prop + arch_at, 256, "%s", arch);
  return hipSuccess;
}
/* HIP 5.x hipDeviceProp_t (R0000): 792 bytes, gcnArchName at 396. */
EXPORT hipError_t hipGetDeviceProperties(void *prop, int device) {
  ENTER("hipGetDeviceProperties");
  RETURN(properties(prop, device, 792, 396));
}
/* ROCm 6+ hipDeviceProp_tR0600: 1472 bytes, gcnArchName at 1160. */
EXPORT hipError_t hipGetDevicePropertiesR0600(void *prop, int device) {
  ENTER("hipGetDevicePropertiesR0600");
  if (major() < 6) RETURN(hipErrorNotSupported); /* stands in for the missing symbol */
  RETURN(properties(prop, device, 1472, 1160));
}
EXPORT hipError_t hipMemGetInfo(size_t *free_bytes, size_t *total) {
  ENTER("hipMemGetInfo");
  if (!free_bytes || !total) RETURN(hipErrorInvalidValue);
  *total = capacity;
  *free_bytes = capacity - used[current_device];
  RETURN(hipSuccess);
}

/* ----- plain allocations ------------------------------------------------------------------ */

/* rocm-systems-7128-reserve-counted: the runtime's own free-memory counter, which its plain
 * allocations are checked against, counts address reservations as used and physical handles
 * not at all; true when it refuses `bytes` more on device `d`. */
static int counted_refuses(int d, uint64_t bytes) {
  if (!(profile & PROFILE_RESERVE_COUNTED)) return 0;
  uint64_t counted = used[d];
  for (int i = 0; i < high; i++) {
    struct object *o = &objects[i];
    if (o->device != d) continue;
    if (o->kind == HANDLE) counted -= o->size;
    if (o->kind == RESERVATION) counted += o->size;
  }
  return counted >= capacity || bytes > capacity - counted;
}

static hipError_t do_malloc(void **ptr, size_t size, unsigned flags) {
  if (!ptr) return hipErrorInvalidValue;
  last_flags = flags;
  if (size == 0) {
    *ptr = NULL;
    return hipSuccess;
  }
  int d = current_device;
  if (counted_refuses(d, round256(size))) return hipErrorOutOfMemory;
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
  fake_check_unused(o->addr, o->size, "hipFree");
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
/* How many live reservations handle `h` was mapped into. */
static int holds_of(uint64_t h) {
  int n = 0;
  for (int i = 0; i < n_holds; i++) n += holds[i].handle == h;
  return n;
}
/* Records that handle `h` was mapped into the reservation at `r`; 0 when there is no room. */
static int hold_add(uint64_t h, uint64_t r) {
  for (int i = 0; i < n_holds; i++)
    if (holds[i].handle == h && holds[i].reservation == r) return 1;
  if (n_holds == MAX_HOLDS) return 0;
  holds[n_holds].handle = h;
  holds[n_holds].reservation = r;
  n_holds++;
  return 1;
}
/* Forgets the pairs of handle `h` (h != 0) or of reservation `r` (r != 0). */
static void holds_forget(uint64_t h, uint64_t r) {
  int n = 0;
  for (int i = 0; i < n_holds; i++)
    if (!((h && holds[i].handle == h) || (r && holds[i].reservation == r))) holds[n++] = holds[i];
  n_holds = n;
}
/* A released handle with no mapping left gives its bytes back — unless rocm7-reservation-hold
 * keeps them charged while a reservation it was mapped into is still reserved. */
static void handle_settle(struct object *h) {
  if (!h->released || h->mapcount) return;
  if ((profile & PROFILE_RESERVATION_HOLD) && holds_of(h->addr)) return;
  holds_forget(h->addr, 0);
  used[h->device] -= h->size;
  drop(h);
}
EXPORT hipError_t hipMemRelease(void *handle) {
  ENTER("hipMemRelease");
  struct object *o = find(HANDLE, (uint64_t)(uintptr_t)handle);
  if (!o || o->released) RETURN(hipErrorInvalidValue);
  o->released = 1;
  handle_settle(o);
  RETURN(hipSuccess);
}
/* `addr` is a hint, honoured when it can be (reserve_va). */
EXPORT hipError_t hipMemAddressReserve(void **ptr, size_t size, size_t alignment, void *addr,
                                       unsigned long long flags) {
  ENTER("hipMemAddressReserve");
  if (!ptr || size == 0 || size % min_gran || flags != 0 ||
      (alignment && (alignment & (alignment - 1))))
    RETURN(hipErrorInvalidValue);
  uint64_t va = reserve_va((uint64_t)(uintptr_t)addr, size, alignment);
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
  /* rocr-285-unmap-many: ROCr still counts a user of the range (HSA_STATUS_ERROR_RESOURCE_FREE
   * below HIP; the report does not say which HIP code comes back: invalid value here). */
  if ((profile & PROFILE_UNMAP_MANY) && o->uses > 0) RETURN(hipErrorInvalidValue);
  uint64_t r = o->addr;
  drop(o);
  /* The handles this reservation held (rocm7-reservation-hold) settle once it is gone: one
   * pair at a time, since a settling handle forgets its other pairs. */
  for (int i = 0; i < n_holds;) {
    if (holds[i].reservation != r) {
      i++;
      continue;
    }
    uint64_t h = holds[i].handle;
    holds[i] = holds[--n_holds];
    struct object *x = find(HANDLE, h);
    if (x) handle_settle(x);
    i = 0;
  }
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
  struct object *r = reservation_of(va, size);
  if (!h || h->released || flags != 0 || size == 0 || va % min_gran || size % min_gran ||
      offset % min_gran || offset + size > h->size || !r || mapped_inside(va, size))
    RETURN(hipErrorInvalidValue);
  struct object *m = add(MAPPING, va, size, h->device);
  if (!m) RETURN(hipErrorOutOfMemory);
  if (!hold_add(h->addr, r->addr)) {
    drop(m);
    RETURN(hipErrorOutOfMemory);
  }
  m->handle = h->addr;
  h->mapcount++;
  r->uses++;
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
static int by_address(const void *a, const void *b) {
  uint64_t x = (*(struct object *const *)a)->addr, y = (*(struct object *const *)b)->addr;
  return x < y ? -1 : x > y;
}
/* rocm-systems-2516-setaccess-prefix: HIP checks `size` against the sizes of the mappings of
 * the reservation holding `va` summed from its first (lowest) mapping, not from `va`'s, and
 * refuses unless some such sum is exactly `size`. True when it refuses. */
static int prefix_refuses(uint64_t va, uint64_t size) {
  if (!(profile & PROFILE_SETACCESS_PREFIX)) return 0;
  struct object *r = reservation_of(va, 1);
  if (!r) return 0; /* the documented checks answer */
  static struct object *inside[MAX_OBJECTS];
  int n = 0;
  for (int i = 0; i < high; i++) {
    struct object *m = &objects[i];
    if (m->kind == MAPPING && r->addr <= m->addr && m->addr < r->addr + r->size) inside[n++] = m;
  }
  qsort(inside, (size_t)n, sizeof inside[0], by_address);
  uint64_t sum = 0;
  for (int i = 0; i < n && sum < size; i++) sum += inside[i]->size;
  return sum != size;
}
/* One descriptor per device; a device other than the memory's owner must be linked to it by
 * peer access (fake_common.h). */
EXPORT hipError_t hipMemSetAccess(void *ptr, size_t size, const struct fake_access_desc *desc,
                                  size_t count) {
  ENTER("hipMemSetAccess");
  uint64_t va = (uint64_t)(uintptr_t)ptr;
  int partial;
  if (!desc || count == 0 || size == 0 || va % min_gran || size % min_gran ||
      mapped_bytes(va, size, &partial) != size || prefix_refuses(va, size))
    RETURN(hipErrorInvalidValue);
  for (int i = 0; i < high; i++) {
    struct object *m = &objects[i];
    if (m->kind != MAPPING || m->addr >= va + size || va >= m->addr + m->size) continue;
    hipError_t refused = fake_check_access(desc, count, m->device, n_devices);
    if (refused != hipSuccess) RETURN(refused);
  }
  for (int i = 0; i < high; i++) {
    struct object *m = &objects[i];
    if (m->kind == MAPPING && m->addr < va + size && va < m->addr + m->size)
      m->access = fake_apply_access(m->access, desc, count);
  }
  RETURN(hipSuccess);
}
EXPORT hipError_t hipMemUnmap(void *ptr, size_t size) {
  ENTER("hipMemUnmap");
  uint64_t va = (uint64_t)(uintptr_t)ptr;
  int partial;
  if (size == 0 || va % min_gran || size % min_gran || mapped_bytes(va, size, &partial) != size ||
      partial)
    RETURN(hipErrorInvalidValue);
  fake_check_unused(va, size, "hipMemUnmap");
  /* ROCr's use count of a reservation drops by one per mapping — or, before ROCm 7.0
   * (rocr-285-unmap-many), by one per hipMemUnmap call, however many mappings it covers. */
  for (int i = 0; i < high; i++) {
    struct object *r = &objects[i];
    if (r->kind != RESERVATION || r->addr >= va + size || va >= r->addr + r->size) continue;
    long n = 0;
    for (int j = 0; j < high; j++) {
      struct object *m = &objects[j];
      n += m->kind == MAPPING && m->addr >= va && m->addr < va + size && r->addr <= m->addr &&
           m->addr < r->addr + r->size;
    }
    r->uses -= (profile & PROFILE_UNMAP_MANY) && n ? 1 : n;
  }
  for (int i = 0; i < high; i++) {
    struct object *m = &objects[i];
    if (m->kind != MAPPING || m->addr < va || m->addr >= va + size) continue;
    struct object *h = find(HANDLE, m->handle);
    drop(m);
    if (h) {
      h->mapcount--;
      handle_settle(h);
    }
  }
  RETURN(hipSuccess);
}

/* ----- copies and pinned host memory ------------------------------------------------------- */

/* True when [va, va + size) lies inside one live plain or pool allocation, or is covered by
 * mappings (adjacent ones too) that grant `device` access (hipMemSetAccess). */
static int device_range_ok(uint64_t va, uint64_t size, int device) {
  uint64_t end = va + size;
  if (end < va) return 0;
  for (int i = 0; i < high; i++) {
    struct object *o = &objects[i];
    if ((o->kind == ALLOC || o->kind == POOL_ALLOC) && o->addr <= va && end <= o->addr + o->size)
      return 1;
  }
  uint64_t at = va;
  while (at < end) {
    struct object *hit = NULL;
    for (int i = 0; i < high; i++) {
      struct object *m = &objects[i];
      if (m->kind == MAPPING && m->addr <= at && at < m->addr + m->size) hit = m;
    }
    if (!hit || !fake_device_index_ok(device) || !((hit->access >> device) & 1)) return 0;
    at = hit->addr + hit->size;
  }
  return 1;
}
/* A copy between device memory `device_ptr` and host memory `host` on `stream`: checked and
 * queued on the stream's clock (fake_common.h); no bytes move, there are none behind the
 * fake's device memory. */
static hipError_t copy(uint64_t device_ptr, void *host, size_t bytes, void *stream) {
  if (!valid_stream(stream)) return hipErrorInvalidHandle;
  if (bytes == 0) return hipSuccess;
  if (!host || !device_range_ok(device_ptr, bytes, current_device)) return hipErrorInvalidValue;
  fake_copy_queue(clock_of((uint64_t)(uintptr_t)stream), device_ptr, (uint64_t)(uintptr_t)host,
                  bytes);
  return hipSuccess;
}
EXPORT hipError_t hipMemcpyDtoHAsync(void *dst, void *src, size_t bytes, void *stream) {
  ENTER("hipMemcpyDtoHAsync");
  RETURN(copy((uint64_t)(uintptr_t)src, dst, bytes, stream));
}
EXPORT hipError_t hipMemcpyHtoDAsync(void *dst, void *src, size_t bytes, void *stream) {
  ENTER("hipMemcpyHtoDAsync");
  RETURN(copy((uint64_t)(uintptr_t)dst, src, bytes, stream));
}
/* hipHostMallocPortable | Mapped | WriteCombined | NumaUser | Coherent | NonCoherent. */
#define HOST_MALLOC_FLAGS 0xE0000007u
EXPORT hipError_t hipHostMalloc(void **ptr, size_t size, unsigned flags) {
  ENTER("hipHostMalloc");
  if (!ptr || (flags & ~HOST_MALLOC_FLAGS)) RETURN(hipErrorInvalidValue);
  if (size == 0) {
    *ptr = NULL;
    RETURN(hipSuccess);
  }
  void *p = malloc(size);
  if (!p) RETURN(hipErrorOutOfMemory);
  if (!add(HOST_ALLOC, (uint64_t)(uintptr_t)p, size, current_device)) {
    free(p);
    RETURN(hipErrorOutOfMemory);
  }
  *ptr = p;
  RETURN(hipSuccess);
}
EXPORT hipError_t hipHostFree(void *ptr) {
  ENTER("hipHostFree");
  if (!ptr) RETURN(hipSuccess);
  struct object *o = find(HOST_ALLOC, (uint64_t)(uintptr_t)ptr);
  if (!o) RETURN(hipErrorInvalidValue);
  fake_check_unused(o->addr, o->size, "hipHostFree");
  free(ptr);
  drop(o);
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
  return p < MAX_POOLS && pools[p].live && !pools[p].destroyed ? (int)p : -1;
}
static int new_pool(int device, int is_default) {
  for (int p = 0; p < MAX_POOLS; p++) {
    if (!pools[p].live) {
      memset(&pools[p], 0, sizeof pools[p]);
      pools[p].live = 1;
      pools[p].device = device;
      pools[p].is_default = is_default;
      fake_pool_init(&pools[p].stats, UINT64_MAX); /* the ROCm quirk: never release unless told */
      return p;
    }
  }
  return -1;
}
/* Gives back the cached block `o` of pool `p`: a hazard if a kernel or copy still uses it. */
static void pool_give_back(struct pool *p, struct object *o) {
  fake_check_unused(o->addr, o->size, "a pool giving back a block");
  p->stats.reserved -= o->size;
  used[p->device] -= o->size;
  drop(o);
}
/* Gives back cached blocks whose free completed until the pool holds at most `keep` (never
 * what is in use, nor a block whose free is still in flight on its stream). */
static void pool_release(struct pool *p, uint64_t keep) {
  for (int i = 0; i < high && p->stats.reserved > keep; i++) {
    struct object *o = &objects[i];
    if (o->kind == POOL_CACHED && &pools[o->pool] == p && fake_clock_done(o->clock, o->seq))
      pool_give_back(p, o);
  }
}
/* A destroyed pool gives back every block whose free completed; its slot is free once it
 * holds none. */
static void pool_settle_destroyed(int p) {
  pool_release(&pools[p], 0);
  for (int i = 0; i < high; i++)
    if ((objects[i].kind == POOL_ALLOC || objects[i].kind == POOL_CACHED) && objects[i].pool == p)
      return;
  pools[p].live = 0;
}
static void sync_pools(void) {
  for (int p = 0; p < MAX_POOLS; p++) {
    if (!pools[p].live) continue;
    if (pools[p].destroyed)
      pool_settle_destroyed(p);
    else
      pool_release(&pools[p], pools[p].stats.threshold);
  }
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
  if (p < 0 || pools[p].is_default) RETURN(hipErrorInvalidValue);
  /* As HIP documents it: returns at once; with allocations outstanding, or frees still in
   * flight, the pool's memory goes when the last of them is freed and that free completed. */
  pools[p].destroyed = 1;
  pool_settle_destroyed(p);
  RETURN(hipSuccess);
}
EXPORT hipError_t hipMemPoolSetAttribute(void *handle, int attr, void *value) {
  ENTER("hipMemPoolSetAttribute");
  int p = pool_index(handle);
  if (p < 0 || !value) RETURN(hipErrorInvalidValue);
  RETURN(fake_pool_set(&pools[p].stats, attr, value) ? hipErrorInvalidValue : hipSuccess);
}
EXPORT hipError_t hipMemPoolGetAttribute(void *handle, int attr, void *value) {
  ENTER("hipMemPoolGetAttribute");
  int p = pool_index(handle);
  if (p < 0 || !value) RETURN(hipErrorInvalidValue);
  RETURN(fake_pool_get(&pools[p].stats, attr, value) ? hipErrorInvalidValue : hipSuccess);
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
  uint64_t s = (uint64_t)(uintptr_t)stream;
  /* The smallest cached block that fits and is safe for `stream`: its free completed, or it
   * was freed on this stream (stream order; never on the per-thread handle, another stream on
   * each thread) — as the driver's pools reuse memory. */
  struct object *best = NULL;
  for (int i = 0; i < high; i++) {
    struct object *o = &objects[i];
    if (o->kind != POOL_CACHED || o->pool != p || o->size < bytes) continue;
    int safe = fake_clock_done(o->clock, o->seq) || (o->clock == clock_of(s) && s != 2);
    if (safe && (!best || o->size < best->size)) best = o;
  }
  if (best) {
    best->kind = POOL_ALLOC;
    fake_pool_grow(&x->stats, 0, best->size);
    *ptr = (void *)(uintptr_t)best->addr;
    RETURN(hipSuccess);
  }
  if (!charge(x->device, bytes)) {
    /* Like the driver: give back cached memory and try once more. */
    pool_release(x, 0);
    if (!charge(x->device, bytes)) RETURN(hipErrorOutOfMemory);
  }
  uint64_t va = take_va(bytes, 256);
  struct object *o = add(POOL_ALLOC, va, bytes, x->device);
  if (!o) {
    used[x->device] -= bytes;
    RETURN(hipErrorOutOfMemory);
  }
  o->pool = p;
  fake_pool_grow(&x->stats, bytes, bytes);
  *ptr = (void *)(uintptr_t)va;
  RETURN(hipSuccess);
}
EXPORT hipError_t hipFreeAsync(void *ptr, void *stream) {
  ENTER("hipFreeAsync");
  if (!valid_stream(stream)) RETURN(hipErrorInvalidValue);
  struct object *o = find(POOL_ALLOC, (uint64_t)(uintptr_t)ptr);
  if (!o) RETURN(hipErrorInvalidValue);
  /* The block stays the pool's, reusable once its stream's clock reaches the free. */
  pools[o->pool].stats.used -= o->size;
  o->kind = POOL_CACHED;
  o->clock = clock_of((uint64_t)(uintptr_t)stream);
  o->seq = fake_enqueue(o->clock);
  if (pools[o->pool].destroyed) pool_settle_destroyed(o->pool);
  RETURN(hipSuccess);
}

/* ----- streams and events ----------------------------------------------------------------- */

/* hipStreamCreateWithFlags / hipEventCreateWithFlags: a new object of `kind` on the current
 * device, its handle written to `*out`; `flags` at most `max_flags`. */
static hipError_t create_object(int kind, void **out, unsigned flags, unsigned max_flags) {
  if (!out || flags > max_flags) return hipErrorInvalidValue;
  int clock = kind == STREAM ? fake_clock_new() : 0;
  if (kind == STREAM && !clock) return hipErrorOutOfMemory;
  /* A stream takes the handle of one destroyed before, when there is one. */
  uint64_t id = kind == STREAM && n_reusable ? reusable_streams[--n_reusable] : new_id();
  struct object *o = add(kind, id, 0, current_device);
  if (!o) return hipErrorOutOfMemory;
  o->clock = clock;
  *out = (void *)(uintptr_t)id;
  return hipSuccess;
}
/* The live object of `kind` behind `handle` as `o`, or return hipErrorInvalidHandle. */
#define FIND_OR_INVALID(o, kind, handle)                        \
  struct object *o = find(kind, (uint64_t)(uintptr_t)(handle)); \
  if (!o) RETURN(hipErrorInvalidHandle)

EXPORT hipError_t hipStreamCreateWithFlags(void **stream, unsigned flags) {
  ENTER("hipStreamCreateWithFlags");
  RETURN(create_object(STREAM, stream, flags, 1));
}
/* The plain forms most callers use: flags 0. */
EXPORT hipError_t hipStreamCreate(void **stream) {
  ENTER("hipStreamCreate");
  RETURN(create_object(STREAM, stream, 0, 1));
}
EXPORT hipError_t hipStreamDestroy(void *stream) {
  ENTER("hipStreamDestroy");
  FIND_OR_INVALID(o, STREAM, stream);
  /* The work already enqueued still completes (kernels in flight run on); events keep naming
   * the stream's clock. */
  fake_clock_retire(o->clock);
  if (n_reusable < MAX_REUSED) reusable_streams[n_reusable++] = o->addr;
  drop(o);
  RETURN(hipSuccess);
}
EXPORT hipError_t hipStreamSynchronize(void *stream) {
  ENTER("hipStreamSynchronize");
  if (!valid_stream(stream)) RETURN(hipErrorInvalidHandle);
  fake_cpu_wait();
  int c = clock_of((uint64_t)(uintptr_t)stream);
  /* The null stream waits for every blocking stream. */
  if (c == FAKE_NULL_CLOCK)
    fake_force_all();
  else
    fake_force(c, ~0ULL, 0);
  sync_pools();
  RETURN(hipSuccess);
}
EXPORT hipError_t hipDeviceSynchronize(void) {
  ENTER("hipDeviceSynchronize");
  fake_cpu_wait();
  fake_force_all();
  sync_pools();
  RETURN(hipSuccess);
}
EXPORT hipError_t hipEventCreateWithFlags(void **event, unsigned flags) {
  ENTER("hipEventCreateWithFlags");
  RETURN(create_object(EVENT, event, flags, 7));
}
EXPORT hipError_t hipEventCreate(void **event) {
  ENTER("hipEventCreate");
  RETURN(create_object(EVENT, event, 0, 7));
}
EXPORT hipError_t hipEventRecord(void *event, void *stream) {
  ENTER("hipEventRecord");
  struct object *o = find(EVENT, (uint64_t)(uintptr_t)event);
  if (!o || !valid_stream(stream)) RETURN(hipErrorInvalidHandle);
  o->clock = clock_of((uint64_t)(uintptr_t)stream);
  o->seq = fake_enqueue(o->clock);
  RETURN(hipSuccess);
}
EXPORT hipError_t hipEventQuery(void *event) {
  ENTER("hipEventQuery");
  FIND_OR_INVALID(o, EVENT, event);
  RETURN(event_done(o) ? hipSuccess : hipErrorNotReady);
}
EXPORT hipError_t hipEventSynchronize(void *event) {
  ENTER("hipEventSynchronize");
  FIND_OR_INVALID(o, EVENT, event);
  /* Waiting for an event waits for the work before it on its stream. */
  fake_cpu_wait();
  fake_force(o->clock, o->seq, 0);
  sync_pools();
  RETURN(hipSuccess);
}
/* Work queued on `stream` from now on waits for the event's last record. */
EXPORT hipError_t hipStreamWaitEvent(void *stream, void *event, unsigned flags) {
  ENTER("hipStreamWaitEvent");
  struct object *o = find(EVENT, (uint64_t)(uintptr_t)event);
  if (!o || !valid_stream(stream)) RETURN(hipErrorInvalidHandle);
  if (flags != 0) RETURN(hipErrorInvalidValue);
  if (o->seq) fake_wait_for(clock_of((uint64_t)(uintptr_t)stream), o->clock, o->seq);
  RETURN(hipSuccess);
}
EXPORT hipError_t hipEventDestroy(void *event) {
  ENTER("hipEventDestroy");
  FIND_OR_INVALID(o, EVENT, event);
  drop(o);
  RETURN(hipSuccess);
}
