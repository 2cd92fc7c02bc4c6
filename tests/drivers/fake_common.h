/*
 * fake_common.h: the control API both conformance fakes (fakecuda.c, fakehip.c) export, and
 * the machinery behind it, written once. This comment is the spec; `tests/vendor_fakes.rs`
 * checks it on both fakes, and `tests/support/fakes.rs` is its Rust side.
 *
 * Faults and call counts
 *   void fake_fail(const char *function, long nth, long count, int code)
 *       Calls nth .. nth+count-1 of `function` (1-based, counted from this call; nth < 1 counts
 *       as 1) return `code` without doing anything; count < 0: every call from the nth on,
 *       until fake_clear_faults. Several faults may be armed at once, each counting on its own;
 *       the first that is due answers.
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
 *   handles           physical memory handles, released-but-still-mapped ones included
 *   mappings          mappings of handles into reserved address ranges
 *   reservations      reserved virtual address ranges
 *   streams           created streams
 *   events            created events
 *   bytes             device memory charged, all devices together
 *   contexts          primary-context references (CUDA); fakehip answers -1: HIP has no
 *                     context a caller retains
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
 * Each fake defines, before including this file, FAKE_STATUS (its result type) and its codes
 * FAKE_OK, FAKE_INVALID_VALUE, FAKE_INVALID_DEVICE, FAKE_PEER_UNSUPPORTED (217),
 * FAKE_PEER_ALREADY_ENABLED (704), FAKE_PEER_NOT_ENABLED (705); after it the hooks
 * fake_prepare (defaults), fake_live_of and fake_access_of, each called with the lock held.
 */
#ifndef FAKE_COMMON_H
#define FAKE_COMMON_H

#include <pthread.h>
#include <stdio.h>
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
  LIVE_KINDS
};
static const char *const fake_live_names[LIVE_KINDS] = {
    "allocations", "pool_allocations", "pool_reserved", "pools",  "handles",  "mappings",
    "reservations", "streams",         "events",        "bytes",  "contexts",
};

struct fake_fault {
  char function[64];
  long seen, nth, count;
  int code;
};

struct fake_counter {
  char function[64];
  long long calls;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct fake_fault fake_faults[FAKE_MAX_FAULTS];
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
  for (int f = 0; f < FAKE_MAX_FAULTS; f++) {
    struct fake_fault *x = &fake_faults[f];
    if (!x->function[0] || strcmp(x->function, function)) continue;
    x->seen++;
    int due = x->seen >= x->nth && (x->count < 0 || x->seen < x->nth + x->count);
    if (due && code == FAKE_OK) code = (FAKE_STATUS)x->code;
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
  LOCKED({
    for (int f = 0; f < FAKE_MAX_FAULTS; f++) {
      struct fake_fault *x = &fake_faults[f];
      if (x->function[0]) continue;
      snprintf(x->function, sizeof x->function, "%s", function);
      x->seen = 0;
      x->nth = nth < 1 ? 1 : nth;
      x->count = count;
      x->code = code;
      break;
    }
  });
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

#endif /* FAKE_COMMON_H */
