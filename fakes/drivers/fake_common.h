/*
 * fake_common.h: the control API both conformance fakes (fakecuda.c, fakehip.c) export, and
 * the machinery behind it, written once. This comment is the spec; `tests/vendor_fakes.rs`
 * checks it on both fakes, and `tests/support/fakes.rs` is its Rust side.
 *
 * Faults and call counts
 *   void fake_fail(const char *function, long nth, long count, int code)
 *       Calls nth .. nth+count-1 of `function` (1-based, counted from this call; nth < 1 counts
 *       as 1) return `code` without doing anything; count < 0: every call from the nth on,
 *       until fake_clear_faults; count = 0 arms nothing. Several faults may be armed at once,
 *       each counting on its own; of those due, the one armed first answers. At most
 *       FAKE_MAX_FAULTS (32) are armed at once (a fault's slot is free again after its last
 *       failing call); arming one more, or naming a function that is empty or of 64
 *       characters or more, aborts the process with a message on stderr, since a fault
 *       silently not armed would let a test pass that checks nothing.
 *   void fake_clear_faults(void)
 *       Disarms every fault. (fakehip_reset also forgets faults, call counts and peer state;
 *       fakecuda keeps its state for the life of the loaded library: load a private copy.)
 *   long long fake_calls(const char *function)
 *       How many times the exported vendor call `function` was made since the library was
 *       loaded (or, for fakehip, since fakehip_reset), failed ones included. Every exported
 *       vendor function counts its calls; a function never called answers 0.
 *
 * A call that blocks (as a free, an unmap or a synchronisation can wait for the device)
 *   void fake_pause(const char *function)
 *       From now on, calls of `function` wait — before they count, fail or touch any state of
 *       the fake, so other calls go on — until fake_resume. One function at a time.
 *   void fake_resume(void)
 *       Lets every waiting call go on and pauses nothing any more.
 *   int fake_waiting(void)
 *       How many calls are waiting now.
 *
 * Live counts: long long fake_live(const char *what), one vocabulary in both fakes; -1 for a
 * name neither knows:
 *   allocations       plain device allocations (cuMemAlloc / hipMalloc, hipExtMallocWithFlags)
 *   pool_allocations  live allocations from stream-ordered pools
 *   pool_reserved     bytes the pools hold (in use or cached), default pools included
 *   pools             created pools (default pools are not counted)
 *   handles           physical memory handles, released-but-still-mapped ones included, and
 *                     (fakehip, rocm7-reservation-hold) released ones a reservation holds
 *   mappings          mappings of handles into reserved address ranges
 *   reservations      reserved virtual address ranges
 *   streams           created streams
 *   events            created events
 *   bytes             device memory charged, all devices together (held handles included)
 *   contexts          primary-context references (CUDA); fakehip answers -1: HIP has no
 *                     context a caller retains
 *   host_allocations  pinned host memory (cuMemHostAlloc / hipHostMalloc) not freed
 *
 * Peer access (both fakes export the vendor's can-access / enable calls)
 *   void fake_set_peer(int device, int peer, int can)
 *       Declares whether `device` can access `peer`'s memory (default: every pair of distinct
 *       devices can). The can-access call answers it, and an enable of a pair that cannot
 *       fails with the vendor's "peer access unsupported" (217).
 *   int fake_peer_enabled(int device, int peer)
 *       1 when peer access from `device` to `peer` was enabled, else 0.
 *   int fake_access(unsigned long long va, int device)
 *       1 when the mapping holding `va` grants `device` access (set-access with a descriptor
 *       for that device), 0 when it does not, -1 when no mapping holds `va`.
 *   The set-access calls take several descriptors: each names an existing device (else the
 *   vendor's invalid-device error), and a device other than the owner of the memory must be
 *   linked to the owner by an enabled peer access, in either direction (else the vendor's
 *   "peer access not enabled", 705). The vmm strategy grants the devices its device enabled
 *   access to, so either direction counts; real drivers ask only for a peer-capable pair.
 *
 * The timeline: streams, kernels, GPU-side waits (both fakes, one model)
 *   Every stream is a clock of operations (event records, stream-ordered frees, waits,
 *   kernels) that complete in order. The handles NULL and the legacy stream (0x1) share one
 *   clock; the per-thread stream (0x2) names a clock of the calling thread's own, so two
 *   threads' per-thread streams are two streams, as on a GPU; a destroyed stream's handle
 *   value is handed to the next stream created, as the drivers' allocators do.
 *   unsigned long long fake_launch(void *stream, unsigned long long va, unsigned long long size)
 *       A kernel on `stream` that uses [va, va + size): in flight, and holding back the work
 *       queued after it on its stream, until fake_finish or a CPU wait that covers it. 0 when
 *       the stream is unknown.
 *   void fake_finish(unsigned long long kernel)
 *       The kernel completes (nothing for an unknown or finished one).
 *   int fake_kernel_done(unsigned long long kernel)
 *       1 once it completed (fake_finish, or a CPU wait), 0 while in flight, -1 unknown.
 *   int fake_ordered(unsigned long long kernel, void *stream)
 *       1 when work queued on `stream` from now on runs after the kernel: the kernel is done,
 *       `stream` is the kernel's own stream, or `stream` waits (the vendor's stream-wait-event
 *       call), directly or through other streams' waits, for an event recorded after it on
 *       its stream; else 0 (-1 unknown kernel).
 *   long long fake_hazards(void)
 *       How many times memory was freed, unmapped or given back to the device (plain free,
 *       unmap, a pool trimming a block) while a kernel still used it: undefined behaviour on
 *       a GPU. const char *fake_first_hazard(void): what the first one was ("" for none).
 *   long long fake_cpu_waits(void)
 *       CPU waits so far: stream, event and device synchronisations (each call, whether or
 *       not it had to wait). A CPU wait completes what it waits for, kernels included.
 *   long long fake_gpu_waits(void)
 *       Stream-wait-event calls so far.
 *   Copies between device and host memory (cuMemcpyDtoHAsync_v2 / cuMemcpyHtoDAsync_v2,
 *   hipMemcpyDtoHAsync / hipMemcpyHtoDAsync) are operations on their stream's clock like the
 *   others: ordered after a kernel in flight or a wait queued before them, complete when their
 *   clock reaches them (an event recorded after one says when). The device range must lie
 *   inside one live plain or pool allocation, or be covered by mappings (adjacent ones too)
 *   that grant the current device access; the host pointer must be non-null; else the
 *   vendor's invalid-value error (an unknown stream: its invalid-handle error). Zero bytes
 *   succeed and queue nothing. While a copy is in flight, freeing or unmapping its device
 *   range, or freeing its pinned host memory, is a hazard as for a kernel. fakecuda's device
 *   memory is real, so its copies move the bytes (when queued); fakehip's has none behind it,
 *   so its copies only check and queue.
 *   Pinned host memory (cuMemHostAlloc / cuMemFreeHost, hipHostMalloc / hipHostFree) is
 *   malloc'd memory, counted in fake_live("host_allocations") until freed.
 *
 * The caller's current device: fakecuda keeps each thread's current context
 * (cuCtxGetCurrent / cuCtxSetCurrent), fakehip each thread's current device (hipGetDevice /
 * hipSetDevice), as the drivers do: a test reads them with those calls.
 *
 * Each fake defines, before including this file, FAKE_STATUS (its result type) and its codes
 * FAKE_OK, FAKE_INVALID_VALUE, FAKE_INVALID_DEVICE, FAKE_PEER_UNSUPPORTED (217),
 * FAKE_PEER_ALREADY_ENABLED (704), FAKE_PEER_NOT_ENABLED (705); after it the hooks
 * fake_prepare (defaults), fake_live_of and fake_access_of, each called with the lock held.
 */
#ifndef FAKE_COMMON_H
#define FAKE_COMMON_H

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FAKE_EXPORT __attribute__((visibility("default")))
#define FAKE_MAX_DEVICES 8
#define FAKE_MAX_FAULTS 32
#define FAKE_MAX_FUNCTIONS 128

/* The names fake_live answers, in the order of enum fake_live_what. */
enum fake_live_what {
  LIVE_ALLOCATIONS,
  LIVE_POOL_ALLOCATIONS,
  LIVE_POOL_RESERVED,
  LIVE_POOLS,
  LIVE_HANDLES,
  LIVE_MAPPINGS,
  LIVE_RESERVATIONS,
  LIVE_STREAMS,
  LIVE_EVENTS,
  LIVE_BYTES,
  LIVE_CONTEXTS,
  LIVE_HOST_ALLOCATIONS,
  LIVE_KINDS
};
static const char *const fake_live_names[LIVE_KINDS] = {
    "allocations", "pool_allocations", "pool_reserved", "pools",  "handles",  "mappings",
    "reservations", "streams",         "events",        "bytes",  "contexts",
    "host_allocations",
};

struct fake_fault {
  char function[64]; /* "" : a free slot */
  long seen, nth, count;
  long long armed;   /* when it was armed (fake_armed's count): the earliest due one answers */
  int code;
};

struct fake_counter {
  char function[64];
  long long calls;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct fake_fault fake_faults[FAKE_MAX_FAULTS];
/* How many faults were ever armed: each fault's `armed` stamp. */
static long long fake_armed;
static struct fake_counter fake_counters[FAKE_MAX_FUNCTIONS];
static int fake_peer_denied[FAKE_MAX_DEVICES][FAKE_MAX_DEVICES];
static int fake_peer_on[FAKE_MAX_DEVICES][FAKE_MAX_DEVICES];

/* The fake's own parts (defined after this file is included). */
static void fake_prepare(void);
static long long fake_live_of(enum fake_live_what what);
static int fake_access_of(unsigned long long va, int device);

/* Forgets faults, counts and peer links (fakehip_reset). Caller holds the lock. */
static inline void fake_common_reset(void) {
  memset(fake_faults, 0, sizeof fake_faults);
  memset(fake_counters, 0, sizeof fake_counters);
  memset(fake_peer_denied, 0, sizeof fake_peer_denied);
  memset(fake_peer_on, 0, sizeof fake_peer_on);
}

/* Counts a call of `function`. Caller holds the lock. */
static void fake_count_call(const char *function) {
  int i;
  for (i = 0; i < FAKE_MAX_FUNCTIONS && fake_counters[i].function[0]; i++)
    if (!strcmp(fake_counters[i].function, function)) break;
  if (i == FAKE_MAX_FUNCTIONS) return;
  if (!fake_counters[i].function[0])
    snprintf(fake_counters[i].function, sizeof fake_counters[i].function, "%s", function);
  fake_counters[i].calls++;
}

/* Counts the call and answers the fault due for it, or FAKE_OK. Caller holds the lock. */
static FAKE_STATUS fake_enter(const char *function) {
  fake_prepare();
  fake_count_call(function);
  FAKE_STATUS code = FAKE_OK;
  long long first = -1;
  for (int f = 0; f < FAKE_MAX_FAULTS; f++) {
    struct fake_fault *x = &fake_faults[f];
    if (!x->function[0] || strcmp(x->function, function)) continue;
    x->seen++;
    if (x->seen < x->nth) continue;
    /* The calls due are nth .. nth + count - 1, counted without forming nth + count (which a
     * count near LONG_MAX would overflow). */
    long past = x->seen - x->nth; /* due calls before this one */
    if (x->count >= 0 && past >= x->count) continue;
    if (first < 0 || x->armed < first) {
      first = x->armed;
      code = (FAKE_STATUS)x->code;
    }
    /* Spent: this was its last failing call; the slot is free. */
    if (x->count >= 0 && past + 1 >= x->count) x->function[0] = 0;
  }
  return code;
}

/* The paused function (fake_pause), and the calls waiting for it; under pause_lock, which is
 * never held with `lock`. */
static pthread_mutex_t pause_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t pause_changed = PTHREAD_COND_INITIALIZER;
static char fake_paused[64];
static int fake_waiters;

/* Waits while `function` is paused. */
static void fake_gate(const char *function) {
  pthread_mutex_lock(&pause_lock);
  if (fake_paused[0] && !strcmp(fake_paused, function)) {
    fake_waiters++;
    pthread_cond_broadcast(&pause_changed);
    while (fake_paused[0] && !strcmp(fake_paused, function))
      pthread_cond_wait(&pause_changed, &pause_lock);
    fake_waiters--;
  }
  pthread_mutex_unlock(&pause_lock);
}

FAKE_EXPORT void fake_pause(const char *function) {
  pthread_mutex_lock(&pause_lock);
  snprintf(fake_paused, sizeof fake_paused, "%s", function);
  pthread_mutex_unlock(&pause_lock);
}

FAKE_EXPORT void fake_resume(void) {
  pthread_mutex_lock(&pause_lock);
  fake_paused[0] = 0;
  pthread_cond_broadcast(&pause_changed);
  pthread_mutex_unlock(&pause_lock);
}

FAKE_EXPORT int fake_waiting(void) {
  pthread_mutex_lock(&pause_lock);
  int n = fake_waiters;
  pthread_mutex_unlock(&pause_lock);
  return n;
}

/* Waits while the function is paused, takes the lock and counts the call; returns an
 * injected fault at once. */
#define ENTER(function)                         \
  fake_gate(function);                          \
  pthread_mutex_lock(&lock);                    \
  FAKE_STATUS fault_ = fake_enter(function);    \
  if (fault_ != FAKE_OK) {                      \
    pthread_mutex_unlock(&lock);                \
    return fault_;                              \
  }
#define RETURN(code)              \
  do {                            \
    FAKE_STATUS r_ = (code);      \
    pthread_mutex_unlock(&lock);  \
    return r_;                    \
  } while (0)

/* Runs the statements given under the lock, after the fake's defaults are in place. */
#define LOCKED(...)            \
  do {                         \
    pthread_mutex_lock(&lock); \
    fake_prepare();            \
    __VA_ARGS__;               \
    pthread_mutex_unlock(&lock); \
  } while (0)

static inline int fake_device_index_ok(int device) { return device >= 0 && device < FAKE_MAX_DEVICES; }

/* Whether `device` may be granted access to memory of `owner`. */
static inline int fake_peer_linked(int owner, int device) {
  return owner == device || fake_peer_on[owner][device] || fake_peer_on[device][owner];
}

FAKE_EXPORT void fake_fail(const char *function, long nth, long count, int code) {
  if (!function || !function[0] || strlen(function) >= sizeof fake_faults[0].function) {
    fprintf(stderr, "fake_fail: a function name of 1 to %zu characters, not %s\n",
            sizeof fake_faults[0].function - 1,
            !function ? "NULL" : function[0] ? "a longer one" : "an empty one");
    abort();
  }
  if (count == 0) return; /* no call fails */
  int armed = 0;
  LOCKED({
    for (int f = 0; f < FAKE_MAX_FAULTS && !armed; f++) {
      struct fake_fault *x = &fake_faults[f];
      if (x->function[0]) continue;
      snprintf(x->function, sizeof x->function, "%s", function);
      x->seen = 0;
      x->nth = nth < 1 ? 1 : nth;
      x->count = count;
      x->code = code;
      x->armed = ++fake_armed;
      armed = 1;
    }
  });
  if (!armed) {
    fprintf(stderr,
            "fake_fail(%s): %d faults are armed already (FAKE_MAX_FAULTS); disarm them with "
            "fake_clear_faults\n",
            function, FAKE_MAX_FAULTS);
    abort();
  }
}

FAKE_EXPORT void fake_clear_faults(void) { LOCKED(memset(fake_faults, 0, sizeof fake_faults)); }

FAKE_EXPORT long long fake_calls(const char *function) {
  long long n = 0;
  LOCKED({
    for (int i = 0; i < FAKE_MAX_FUNCTIONS; i++)
      if (fake_counters[i].function[0] && !strcmp(fake_counters[i].function, function))
        n = fake_counters[i].calls;
  });
  return n;
}

FAKE_EXPORT long long fake_live(const char *what) {
  long long n = -1;
  LOCKED({
    for (int w = 0; w < LIVE_KINDS; w++)
      if (!strcmp(fake_live_names[w], what)) n = fake_live_of((enum fake_live_what)w);
  });
  return n;
}

FAKE_EXPORT void fake_set_peer(int device, int peer, int can) {
  LOCKED({
    if (fake_device_index_ok(device) && fake_device_index_ok(peer))
      fake_peer_denied[device][peer] = !can;
  });
}

FAKE_EXPORT int fake_peer_enabled(int device, int peer) {
  int on = 0;
  LOCKED(on = fake_device_index_ok(device) && fake_device_index_ok(peer) &&
              fake_peer_on[device][peer]);
  return on;
}

FAKE_EXPORT int fake_access(unsigned long long va, int device) {
  int granted = 0;
  LOCKED(granted = fake_access_of(va, device));
  return granted;
}

/* A vendor error code with its name and text (each fake's table of the codes it returns). */
struct fake_error {
  int code;
  const char *name, *text;
};

/* The entry of `code` in `table` (`n` entries), or NULL; counts a call of `function` (the
 * vendor's name/text query: counted, never failed, as the shim calls it to report another
 * call's failure). */
static inline const struct fake_error *fake_error_of(const struct fake_error *table, size_t n,
                                                     int code, const char *function) {
  LOCKED(fake_count_call(function));
  for (size_t i = 0; i < n; i++)
    if (table[i].code == code) return &table[i];
  return NULL;
}

/* The descriptor both vendors' set-access calls take: {location {type, id}, flags}. */
struct fake_access_desc {
  int location_type; /* 1: a device */
  int device;
  unsigned int flags; /* 0 none, 1 read, 3 read-write */
};
_Static_assert(sizeof(struct fake_access_desc) == 12, "an access descriptor is 12 bytes");

/* Checks `count` descriptors for memory of `owner` among `devices` devices: a malformed one
 * is FAKE_INVALID_VALUE, an unknown device FAKE_INVALID_DEVICE, a device not linked to the
 * owner by peer access FAKE_PEER_NOT_ENABLED. */
static inline FAKE_STATUS fake_check_access(const struct fake_access_desc *desc, size_t count,
                                            int owner, int devices) {
  if (!desc || count == 0) return FAKE_INVALID_VALUE;
  for (size_t i = 0; i < count; i++) {
    const struct fake_access_desc *d = &desc[i];
    if (d->location_type != 1 || (d->flags != 0 && d->flags != 1 && d->flags != 3))
      return FAKE_INVALID_VALUE;
    if (d->device < 0 || d->device >= devices) return FAKE_INVALID_DEVICE;
    if (d->flags && !fake_peer_linked(owner, d->device)) return FAKE_PEER_NOT_ENABLED;
  }
  return FAKE_OK;
}

/* The device bits `desc` grants, applied to `mask`. */
static inline unsigned fake_apply_access(unsigned mask, const struct fake_access_desc *desc,
                                         size_t count) {
  for (size_t i = 0; i < count; i++) {
    if (desc[i].flags)
      mask |= 1u << desc[i].device;
    else
      mask &= ~(1u << desc[i].device);
  }
  return mask;
}

static inline int fake_known_device(int device, int devices) {
  return device >= 0 && device < devices;
}

/* The can-access query: 1 for two distinct devices unless declared otherwise (fake_set_peer). */
static inline FAKE_STATUS fake_can_access_peer(int *can, int device, int peer, int devices) {
  if (!can) return FAKE_INVALID_VALUE;
  if (!fake_known_device(device, devices) || !fake_known_device(peer, devices))
    return FAKE_INVALID_DEVICE;
  *can = device != peer && !fake_peer_denied[device][peer];
  return FAKE_OK;
}

/* Enables access from `device` to `peer`'s memory: flags must be 0, the pair two distinct
 * known devices, capable, and not enabled yet. */
static inline FAKE_STATUS fake_enable_peer(int device, int peer, unsigned flags, int devices) {
  if (flags != 0) return FAKE_INVALID_VALUE;
  if (!fake_known_device(device, devices) || !fake_known_device(peer, devices) || device == peer)
    return FAKE_INVALID_DEVICE;
  if (fake_peer_denied[device][peer]) return FAKE_PEER_UNSUPPORTED;
  if (fake_peer_on[device][peer]) return FAKE_PEER_ALREADY_ENABLED;
  fake_peer_on[device][peer] = 1;
  return FAKE_OK;
}

/* ---- Pools: the attributes both vendors answer, with the same numbers (CU_MEMPOOL_ATTR_* and
 * hipMemPoolAttr*): 1-3 the reuse policies (int), 4 the release threshold, 5/6 reserved bytes
 * now/high, 7/8 used bytes now/high (the highs reset to the current value by setting 0). */

struct fake_pool_stats {
  int reuse[3];
  unsigned long long threshold, reserved, reserved_high, used, used_high;
};

/* A new pool's attributes: every reuse policy on, release threshold `threshold`. */
static inline void fake_pool_init(struct fake_pool_stats *s, unsigned long long threshold) {
  memset(s, 0, sizeof *s);
  s->reuse[0] = s->reuse[1] = s->reuse[2] = 1;
  s->threshold = threshold;
}

/* Sets attribute `attr` from `value`: 1 for an unknown attribute or a high reset to non-0. */
static inline int fake_pool_set(struct fake_pool_stats *s, int attr, const void *value) {
  if (attr >= 1 && attr <= 3) {
    s->reuse[attr - 1] = *(const int *)value;
    return 0;
  }
  unsigned long long v = *(const unsigned long long *)value;
  switch (attr) {
    case 4: s->threshold = v; return 0;
    case 6: s->reserved_high = s->reserved; return v != 0;
    case 8: s->used_high = s->used; return v != 0;
    default: return 1;
  }
}

/* Writes attribute `attr` to `value`: 1 for an unknown attribute. */
static inline int fake_pool_get(const struct fake_pool_stats *s, int attr, void *value) {
  const unsigned long long by_attr[] = {0, 0, 0, 0, s->threshold, s->reserved, s->reserved_high,
                                        s->used, s->used_high};
  if (attr >= 1 && attr <= 3)
    *(int *)value = s->reuse[attr - 1];
  else if (attr >= 4 && attr <= 8)
    *(unsigned long long *)value = by_attr[attr];
  else
    return 1;
  return 0;
}

/* Bytes the pool took from the device (`reserved`) and handed out (`used`), highs kept. */
static inline void fake_pool_grow(struct fake_pool_stats *s, unsigned long long reserved,
                                  unsigned long long used) {
  s->reserved += reserved;
  s->used += used;
  if (s->reserved > s->reserved_high) s->reserved_high = s->reserved;
  if (s->used > s->used_high) s->used_high = s->used;
}


/* ---- The timeline (see the spec above). Every function here is called with `lock` held,
 * except the exported ones, which take it. ---------------------------------------------- */

#define FAKE_MAX_CLOCKS 65536
#define FAKE_MAX_KERNELS 65536
#define FAKE_MAX_WAITS 65536
#define FAKE_NULL_CLOCK 1 /* NULL and the legacy stream */

struct fake_clock {
  unsigned long long recorded, completed;
};
struct fake_kernel {
  int clock, finished;
  unsigned long long seq, va, size;
};
struct fake_wait {
  int waiter, dep; /* clocks */
  unsigned long long seq, dep_seq;
};

/* Clock 0 is never used (it means "none"); clock 1 is the legacy stream's. Clocks are never
 * reused, so an event or a kernel always names the clock it was queued on. */
static struct fake_clock fake_clocks[FAKE_MAX_CLOCKS];
static int fake_n_clocks = 2;
static struct fake_kernel fake_kernels[FAKE_MAX_KERNELS + 1]; /* by id, from 1 */
static int fake_n_kernels;
static int fake_active[FAKE_MAX_KERNELS]; /* ids of the kernels in flight */
static int fake_n_active;
static struct fake_wait fake_waits[FAKE_MAX_WAITS];
static int fake_n_waits;
static int fake_hold; /* held: nothing completes but what a CPU wait forces */
static long long fake_hazard_count, fake_cpu_wait_count, fake_gpu_wait_count;
static char fake_hazard_text[256];
static int fake_epoch = 1; /* bumped by a reset, which forgets every thread's clock */
static __thread int fake_thread_clock, fake_thread_epoch; /* this thread's per-thread stream */

/* A new clock, or 0 when there is no room. */
static int fake_clock_new(void) {
  if (fake_n_clocks >= FAKE_MAX_CLOCKS) return 0;
  memset(&fake_clocks[fake_n_clocks], 0, sizeof fake_clocks[0]);
  return fake_n_clocks++;
}

/* The calling thread's per-thread stream's clock. */
static int fake_per_thread_clock(void) {
  if (!fake_thread_clock || fake_thread_epoch != fake_epoch) {
    fake_thread_clock = fake_clock_new();
    fake_thread_epoch = fake_epoch;
  }
  return fake_thread_clock ? fake_thread_clock : FAKE_NULL_CLOCK;
}

static int fake_clock_done(int clock, unsigned long long seq) {
  return seq == 0 || clock <= 0 || fake_clocks[clock].completed >= seq;
}

/* Completes what nothing holds back: each clock up to its first kernel in flight or wait on
 * an incomplete event (nothing while held). */
static void fake_progress(void) {
  if (fake_hold) return;
  static unsigned long long limit[FAKE_MAX_CLOCKS];
  for (int changed = 1; changed;) {
    changed = 0;
    for (int c = 1; c < fake_n_clocks; c++) limit[c] = fake_clocks[c].recorded;
    for (int i = 0; i < fake_n_active; i++) {
      struct fake_kernel *k = &fake_kernels[fake_active[i]];
      if (k->seq - 1 < limit[k->clock]) limit[k->clock] = k->seq - 1;
    }
    for (int i = 0; i < fake_n_waits; i++) {
      struct fake_wait *w = &fake_waits[i];
      if (!fake_clock_done(w->dep, w->dep_seq) && w->seq - 1 < limit[w->waiter])
        limit[w->waiter] = w->seq - 1;
    }
    for (int c = 1; c < fake_n_clocks; c++) {
      if (limit[c] > fake_clocks[c].completed) {
        fake_clocks[c].completed = limit[c];
        changed = 1;
      }
    }
  }
}

/* Queues one operation on `clock`; returns its number. */
static unsigned long long fake_enqueue(int clock) {
  unsigned long long seq = ++fake_clocks[clock].recorded;
  fake_progress();
  return seq;
}

static void fake_kernel_finish(int id) {
  struct fake_kernel *k = &fake_kernels[id];
  if (k->finished) return;
  k->finished = 1;
  for (int i = 0; i < fake_n_active; i++) {
    if (fake_active[i] == id) {
      fake_active[i] = fake_active[--fake_n_active];
      break;
    }
  }
}

/* A CPU wait for `clock` up to `seq` (everything queued on it: ULLONG_MAX): completes the
 * kernels and the events waited for first, then the clock. */
static void fake_force(int clock, unsigned long long seq, int depth) {
  if (clock <= 0) return;
  if (seq > fake_clocks[clock].recorded) seq = fake_clocks[clock].recorded;
  if (fake_clocks[clock].completed >= seq || depth > 64) return;
  for (int i = 0; i < fake_n_waits; i++)
    if (fake_waits[i].waiter == clock && fake_waits[i].seq <= seq)
      fake_force(fake_waits[i].dep, fake_waits[i].dep_seq, depth + 1);
  for (int i = 0; i < fake_n_active;) {
    struct fake_kernel *k = &fake_kernels[fake_active[i]];
    if (k->clock == clock && k->seq <= seq)
      fake_kernel_finish(fake_active[i]); /* swaps another into slot i */
    else
      i++;
  }
  fake_clocks[clock].completed = seq;
  fake_progress();
}

/* Counts a CPU wait (every synchronisation call, whether or not it had to wait). */
static void fake_cpu_wait(void) { fake_cpu_wait_count++; }

/* A CPU wait for every stream (device synchronisation). */
static void fake_force_all(void) {
  for (int c = 1; c < fake_n_clocks; c++) fake_force(c, ~0ULL, 0);
}

/* Releases or holds everything (the fakes' hold_events controls): releasing completes all. */
static void fake_set_hold(int held) {
  fake_hold = held;
  if (!held) {
    while (fake_n_active) fake_kernel_finish(fake_active[0]);
    for (int c = 1; c < fake_n_clocks; c++) fake_clocks[c].completed = fake_clocks[c].recorded;
  }
}

/* A stream that is destroyed: the work queued on it still completes (at once here, but for
 * its kernels in flight, which run on). */
static void fake_clock_retire(int clock) {
  if (clock <= FAKE_NULL_CLOCK) return;
  unsigned long long limit = fake_clocks[clock].recorded;
  for (int i = 0; i < fake_n_active; i++) {
    struct fake_kernel *k = &fake_kernels[fake_active[i]];
    if (k->clock == clock && k->seq - 1 < limit) limit = k->seq - 1;
  }
  if (limit > fake_clocks[clock].completed) fake_clocks[clock].completed = limit;
  fake_progress();
}

/* `waiter` waits on the GPU for `dep` up to `dep_seq` (an event's record). */
static void fake_wait_for(int waiter, int dep, unsigned long long dep_seq) {
  fake_gpu_wait_count++;
  if (fake_clock_done(dep, dep_seq)) return;
  if (fake_n_waits == FAKE_MAX_WAITS) {
    /* Forget the waits that completed: they hold nothing back, and what they ordered has
     * completed too. */
    int n = 0;
    for (int i = 0; i < fake_n_waits; i++)
      if (!fake_clock_done(fake_waits[i].waiter, fake_waits[i].seq)) fake_waits[n++] = fake_waits[i];
    fake_n_waits = n;
    if (n == FAKE_MAX_WAITS) {
      fake_force(dep, dep_seq, 0); /* no room: wait on the CPU instead */
      return;
    }
  }
  struct fake_wait *w = &fake_waits[fake_n_waits++];
  w->waiter = waiter;
  w->dep = dep;
  w->dep_seq = dep_seq;
  w->seq = ++fake_clocks[waiter].recorded;
  fake_progress();
}

/* Whether work on `clock` queued after its op `before` - 1 runs after kernel `k`. */
static int fake_ordered_before(const struct fake_kernel *k, int clock, unsigned long long before,
                               int depth) {
  if (k->finished) return 1;
  if (clock == k->clock && k->seq < before) return 1;
  if (depth > 16) return 0;
  for (int i = 0; i < fake_n_waits; i++) {
    const struct fake_wait *w = &fake_waits[i];
    if (w->waiter == clock && w->seq < before &&
        fake_ordered_before(k, w->dep, w->dep_seq + 1, depth + 1))
      return 1;
  }
  return 0;
}

/* Copies queued and not complete when last looked at (see the spec above). */
#define FAKE_MAX_COPIES 4096
struct fake_copy {
  int clock;
  unsigned long long seq, va, host, size;
};
static struct fake_copy fake_copies[FAKE_MAX_COPIES];
static int fake_n_copies;

/* Forgets the copies that completed. */
static void fake_forget_copies(void) {
  int n = 0;
  for (int i = 0; i < fake_n_copies; i++)
    if (!fake_clock_done(fake_copies[i].clock, fake_copies[i].seq)) fake_copies[n++] = fake_copies[i];
  fake_n_copies = n;
}

/* Queues a copy of `size` bytes between device memory `va` and host memory `host` on `clock`:
 * in flight over both until the clock reaches it. Returns its number. */
static unsigned long long fake_copy_queue(int clock, unsigned long long va,
                                          unsigned long long host, unsigned long long size) {
  unsigned long long seq = fake_enqueue(clock);
  if (fake_clock_done(clock, seq)) return seq;
  fake_forget_copies();
  if (fake_n_copies < FAKE_MAX_COPIES) {
    struct fake_copy *c = &fake_copies[fake_n_copies++];
    c->clock = clock;
    c->seq = seq;
    c->va = va;
    c->host = host;
    c->size = size;
  }
  return seq;
}

/* Called before memory goes away (freed, unmapped, trimmed; pinned host memory freed): a
 * kernel or a copy in flight over [va, va + size) is a hazard, recorded. */
static void fake_check_unused(unsigned long long va, unsigned long long size, const char *what) {
  for (int i = 0; i < fake_n_active; i++) {
    struct fake_kernel *k = &fake_kernels[fake_active[i]];
    if (k->va < va + size && va < k->va + k->size) {
      if (!fake_hazard_count++)
        snprintf(fake_hazard_text, sizeof fake_hazard_text,
                 "%s of [%#llx, %#llx) while kernel %d (on clock %d) uses [%#llx, %#llx)", what,
                 va, va + size, fake_active[i], k->clock, k->va, k->va + k->size);
      return;
    }
  }
  fake_forget_copies();
  for (int i = 0; i < fake_n_copies; i++) {
    struct fake_copy *c = &fake_copies[i];
    int device_side = c->va < va + size && va < c->va + c->size;
    int host_side = c->host < va + size && va < c->host + c->size;
    if (device_side || host_side) {
      if (!fake_hazard_count++)
        snprintf(fake_hazard_text, sizeof fake_hazard_text,
                 "%s of [%#llx, %#llx) while a copy (operation %llu of clock %d) between device "
                 "[%#llx, %#llx) and host [%#llx, %#llx) is in flight",
                 what, va, va + size, c->seq, c->clock, c->va, c->va + c->size, c->host,
                 c->host + c->size);
      return;
    }
  }
}

/* The clock of a stream handle, or 0 for one the fake does not know (each fake's). */
static int fake_clock_of_handle(void *stream);

FAKE_EXPORT unsigned long long fake_launch(void *stream, unsigned long long va,
                                           unsigned long long size) {
  unsigned long long id = 0;
  LOCKED({
    int clock = fake_clock_of_handle(stream);
    if (clock > 0 && fake_n_kernels < FAKE_MAX_KERNELS) {
      id = (unsigned long long)++fake_n_kernels;
      struct fake_kernel *k = &fake_kernels[id];
      k->clock = clock;
      k->va = va;
      k->size = size;
      k->finished = 0;
      k->seq = ++fake_clocks[clock].recorded;
      fake_active[fake_n_active++] = (int)id;
    }
  });
  return id;
}

FAKE_EXPORT void fake_finish(unsigned long long kernel) {
  LOCKED({
    if (kernel >= 1 && kernel <= (unsigned long long)fake_n_kernels) {
      fake_kernel_finish((int)kernel);
      fake_progress();
    }
  });
}

FAKE_EXPORT int fake_kernel_done(unsigned long long kernel) {
  int done = -1;
  LOCKED(if (kernel >= 1 && kernel <= (unsigned long long)fake_n_kernels) done =
             fake_kernels[kernel].finished);
  return done;
}

FAKE_EXPORT int fake_ordered(unsigned long long kernel, void *stream) {
  int ordered = -1;
  LOCKED({
    int clock = fake_clock_of_handle(stream);
    if (kernel >= 1 && kernel <= (unsigned long long)fake_n_kernels)
      ordered = clock > 0 && fake_ordered_before(&fake_kernels[kernel], clock, ~0ULL, 0);
  });
  return ordered;
}

FAKE_EXPORT long long fake_hazards(void) {
  long long n = 0;
  LOCKED(n = fake_hazard_count);
  return n;
}

FAKE_EXPORT const char *fake_first_hazard(void) { return fake_hazard_text; }

FAKE_EXPORT long long fake_cpu_waits(void) {
  long long n = 0;
  LOCKED(n = fake_cpu_wait_count);
  return n;
}

FAKE_EXPORT long long fake_gpu_waits(void) {
  long long n = 0;
  LOCKED(n = fake_gpu_wait_count);
  return n;
}

/* Forgets the timeline (fakehip_reset). Caller holds the lock. */
static inline void fake_timeline_reset(void) {
  fake_n_clocks = 2;
  memset(&fake_clocks[FAKE_NULL_CLOCK], 0, sizeof fake_clocks[0]);
  fake_n_kernels = fake_n_active = fake_n_waits = fake_n_copies = 0;
  fake_hold = 0;
  fake_hazard_count = fake_cpu_wait_count = fake_gpu_wait_count = 0;
  fake_hazard_text[0] = 0;
  fake_epoch++;
}

#endif /* FAKE_COMMON_H */
