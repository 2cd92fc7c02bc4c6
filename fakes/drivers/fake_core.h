/*
 * fake_core.h: the core both conformance drivers are faces of. fakecuda.c (the CUDA driver
 * API, libcuda.so.1) and fakehip.c (the HIP runtime API, libamdhip64.so) each define their
 * names, codes, argument rules and symbol table, then include this file and the concerns
 * beside it, in this order:
 *
 *   fake_core.h      the lock, the symbol table's use (call counts, faults by name or by
 *                    group, cuGetProcAddress / hipGetProcAddress), devices and contexts, the
 *                    calling thread's state, the hazard log, the control API's common part
 *   fake_timeline.h  streams as clocks (the legacy default stream's implicit ordering, non-
 *                    blocking streams, per-thread default streams), events, GPU-side waits,
 *                    kernels and host functions in flight, CPU waits, and the race detector:
 *                    every kernel, copy and memset records the ranges it reads and writes
 *                    while it is in flight
 *   fake_memory.h    plain, pinned, registered and managed memory over host memory; copies
 *                    and memsets that move bytes when their stream reaches them; the guard
 *                    that catches a CPU access to pinned memory a copy has yet to write
 *   fake_vmm.h       reservations, physical handles (one memory file), mappings, access
 *   fake_ipc.h       memory exported to and imported from other processes: shareable
 *                    handles (POSIX file descriptors) and legacy IPC handles
 *   fake_pools.h     stream-ordered pools with blocks on the timeline
 *   fake_modules.h   modules, functions, kernel models (the ranges a launch uses) and launch
 *
 * and fake_shared.h (included here, after the devices): one device shared by several
 * processes, when FAKE_SHARED_DEVICE names a segment.
 *
 * The control API (what a test calls beside the vendor's) is specified in docs/fakes.md
 * and docs/fakes.md; `fake_*` functions are common to both drivers, `fakecuda_*` /
 * `fakehip_*` belong to one.
 *
 * Every function here is called with the lock held unless it says otherwise; the exported
 * control functions take it themselves.
 */
#ifndef FAKE_CORE_H
#define FAKE_CORE_H

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define FAKE_EXPORT __attribute__((visibility("default")))
/* A core function a face may not use. */
#define FK_FN static __attribute__((unused))

/* The version of the control API: Controls (Rust, Python) refuse a driver of another. */
#define FK_KIT_VERSION 4

#define FK_MAX_DEVICES 8
#define FK_MAX_CTX 64 /* [0, FK_MAX_DEVICES): the devices' primary contexts */
#define FK_MAX_ENTRIES 512
#define FK_MAX_FAULTS 32
#define FK_HAZARD_LOG 64
#define FK_HAZARD_TEXT 400

/* ---- Codes: the numbers CUDA's driver API and HIP share (HIP copied CUDA's); a face
 * translates the few it answers otherwise. -------------------------------------------- */
enum {
  FK_OK = 0,
  FK_INVALID_VALUE = 1,
  FK_OUT_OF_MEMORY = 2,
  FK_NOT_INITIALIZED = 3,
  FK_DEINITIALIZED = 4,
  FK_NO_DEVICE = 100,
  FK_INVALID_DEVICE = 101,
  FK_INVALID_IMAGE = 200,
  FK_NO_BINARY_FOR_GPU = 209, /* CUDA_ERROR_NO_BINARY_FOR_GPU, hipErrorNoBinaryForGpu */
  FK_INVALID_PTX = 218,       /* CUDA_ERROR_INVALID_PTX, hipErrorInvalidKernelFile */
  FK_INVALID_CONTEXT = 201,
  FK_PEER_UNSUPPORTED = 217,
  FK_INVALID_HANDLE = 400,
  FK_ILLEGAL_STATE = 401, /* CUDA_ERROR_ILLEGAL_STATE, hipErrorIllegalState */
  FK_NOT_FOUND = 500,
  FK_NOT_READY = 600,
  FK_ILLEGAL_ADDRESS = 700,
  FK_PEER_ALREADY_ENABLED = 704,
  FK_PEER_NOT_ENABLED = 705,
  FK_NOT_PERMITTED = 800,
  FK_NOT_SUPPORTED = 801,
  /* Stream capture (fake_graphs.h): CUDA_ERROR_STREAM_CAPTURE_* and hipErrorStreamCapture*,
   * the same numbers. */
  FK_CAPTURE_UNSUPPORTED = 900,
  FK_CAPTURE_INVALIDATED = 901,
  FK_CAPTURE_MERGE = 902,
  FK_CAPTURE_UNMATCHED = 903,
  FK_CAPTURE_UNJOINED = 904,
  FK_CAPTURE_ISOLATION = 905,
  FK_CAPTURE_IMPLICIT = 906,
  FK_CAPTURED_EVENT = 907,
  FK_CAPTURE_WRONG_THREAD = 908,
  FK_UNKNOWN = 999,
};

/* ---- The symbol table: each face lists every call it exports ------------------------- */

/* Groups of calls, for faults that do not name one vendor's call ("@alloc": the next
 * allocation, whichever call makes it). */
enum {
  FK_G_ALLOC = 1u << 0,     /* device memory: plain, pool, managed, physical handles */
  FK_G_FREE = 1u << 1,      /* device memory given back: frees, releases */
  FK_G_HOST_ALLOC = 1u << 2,
  FK_G_HOST_FREE = 1u << 3,
  FK_G_RESERVE = 1u << 4,   /* virtual address ranges */
  FK_G_MAP = 1u << 5,       /* map, set access */
  FK_G_UNMAP = 1u << 6,
  FK_G_COPY = 1u << 7,
  FK_G_MEMSET = 1u << 8,
  FK_G_LAUNCH = 1u << 9,    /* kernels and host functions */
  FK_G_SYNC = 1u << 10,     /* CPU waits: stream, event, context and device synchronisation */
  FK_G_STREAM = 1u << 11,   /* stream creation */
  FK_G_EVENT = 1u << 12,    /* event creation and record */
  FK_G_WAIT = 1u << 13,     /* GPU-side waits */
  FK_G_QUERY = 1u << 14,    /* stream and event queries */
  FK_G_POOL = 1u << 15,     /* pool management: create, destroy, trim, attributes */
  FK_G_MODULE = 1u << 16,   /* module load and function lookup */
};
static const struct {
  const char *name;
  unsigned bits;
} fk_group_names[] = {
    {"@alloc", FK_G_ALLOC},   {"@free", FK_G_FREE},     {"@host_alloc", FK_G_HOST_ALLOC},
    {"@host_free", FK_G_HOST_FREE}, {"@reserve", FK_G_RESERVE}, {"@map", FK_G_MAP},
    {"@unmap", FK_G_UNMAP},   {"@copy", FK_G_COPY},     {"@memset", FK_G_MEMSET},
    {"@launch", FK_G_LAUNCH}, {"@sync", FK_G_SYNC},     {"@stream", FK_G_STREAM},
    {"@event", FK_G_EVENT},   {"@wait", FK_G_WAIT},     {"@query", FK_G_QUERY},
    {"@pool", FK_G_POOL},     {"@module", FK_G_MODULE},
};
#define FK_N_GROUPS ((int)(sizeof fk_group_names / sizeof fk_group_names[0]))

struct fk_entry {
  const char *name; /* the exported symbol */
  const char *base; /* the name cuGetProcAddress / hipGetProcAddress is asked for */
  int since;        /* the driver version from which `base` resolves to `name` */
  int per_thread;   /* 1: the per-thread-default-stream form (_ptsz, _ptds) */
  unsigned groups;  /* FK_G_* */
  void *fn;
};

/* The face's table (defined at the end of each face, after its functions). */
static const struct fk_entry *fk_table(int *n);
/* What a capture under way makes of a call to entry `e` (fake_graphs.h): FK_OK, or the code
 * the vendors return for a call the capture forbids. */
static int fk_capture_enter(const struct fk_entry *e);
/* The face's defaults, read from the environment before the first call is served. */
static void fk_face_defaults(void);
/* The face's answer to a code a call returns (HIP records it as the thread's last error). */
static void fk_face_returned(int code);
/* The face's name for a neutral code name ("out_of_memory"), or -1 when it has none. */
static int fk_face_code(const char *name);

/* ---- The lock and the state it guards ------------------------------------------------- */

static pthread_mutex_t fk_lock = PTHREAD_MUTEX_INITIALIZER;
static int fk_prepared;

/* Calls counted per table entry. */
static long long fk_calls[FK_MAX_ENTRIES];

struct fk_fault {
  int used;
  int entry;       /* the call's index, or -1 for a group */
  unsigned group;  /* the group's bits */
  long seen, nth, count;
  long long armed; /* when (the earliest armed of those due answers) */
  int code;
};
static struct fk_fault fk_faults[FK_MAX_FAULTS];
static long long fk_armed;

/* The calling thread's state. `fk_epoch` is bumped by a reset, which forgets every thread's
 * per-thread streams. */
static int fk_epoch = 1;
static __thread int fk_t_epoch;
static __thread int fk_t_stack[16]; /* the context stack (CUDA); HIP: [0] the device */
static __thread int fk_t_depth;
static __thread int fk_t_pt_clock[FK_MAX_CTX]; /* per-thread default streams, by context */
static __thread int fk_t_in_callback;          /* running a host function */
static __thread unsigned long long fk_t_last_kernel;

/* Devices: capacity and what is charged against it. */
struct fk_device {
  unsigned long long capacity, used;
};
static int fk_n_devices = 1;
static struct fk_device fk_devices[FK_MAX_DEVICES];
static unsigned long long fk_min_gran = 2ULL << 20, fk_rec_gran = 2ULL << 20;
static int fk_initialised; /* cuInit / the first HIP call succeeded */

#include "fake_shared.h"

/* Contexts: [0, FK_MAX_DEVICES) are the devices' primary contexts (HIP's devices). */
#define FK_MAX_LIMITS 10
struct fk_ctx {
  int live;     /* created contexts: until destroyed; primary: always */
  int device;
  int primary;
  int refcount; /* primary: retains (CUDA); created: 1 */
  int legacy_clock;
  unsigned flags;
  unsigned long long id;                     /* cuCtxGetId: new for each context made */
  unsigned long long limits[FK_MAX_LIMITS];  /* CUlimit / hipLimit_t values (the face's) */
  int cache_config, shared_config;           /* CUfunc_cache, CUsharedconfig (and HIP's) */
};
static struct fk_ctx fk_ctxs[FK_MAX_CTX];
static unsigned long long fk_next_ctx_id __attribute__((unused)) = 1; /* CUDA's context ids */

/* Peer access. */
static int fk_peer_denied[FK_MAX_DEVICES][FK_MAX_DEVICES];
static int fk_peer_on[FK_MAX_DEVICES][FK_MAX_DEVICES];

/* Hazards: undefined behaviour on a GPU, logged (the first FK_HAZARD_LOG texts kept). */
static long long fk_hazard_count;
static char fk_hazard_log[FK_HAZARD_LOG][FK_HAZARD_TEXT];
static long long fk_cpu_wait_count, fk_gpu_wait_count;

FK_FN void fk_hazard(const char *format, ...) __attribute__((format(printf, 1, 2)));
FK_FN void fk_hazard(const char *format, ...) {
  if (fk_hazard_count < FK_HAZARD_LOG) {
    va_list args;
    va_start(args, format);
    vsnprintf(fk_hazard_log[fk_hazard_count], FK_HAZARD_TEXT, format, args);
    va_end(args);
  }
  fk_hazard_count++;
}

FK_FN unsigned long long fk_round_up(unsigned long long x, unsigned long long to) {
  return to ? (x + to - 1) / to * to : x;
}

/* ---- Entries: the table's index of a name, counts, faults ------------------------------ */

FK_FN int fk_entry_index(const char *name) {
  int n;
  const struct fk_entry *t = fk_table(&n);
  for (int i = 0; i < n && i < FK_MAX_ENTRIES; i++)
    if (!strcmp(t[i].name, name)) return i;
  return -1;
}

FK_FN unsigned fk_group_of(const char *name) {
  for (int g = 0; g < FK_N_GROUPS; g++)
    if (!strcmp(fk_group_names[g].name, name)) return fk_group_names[g].bits;
  return 0;
}

static void fk_prepare(void);

/* Counts a call of entry `index` and answers the fault due for it, or FK_OK. */
FK_FN int fk_enter(int index) {
  fk_prepare();
  if (index < 0) return FK_OK;
  int n;
  const struct fk_entry *t = fk_table(&n);
  fk_calls[index]++;
  int code = FK_OK;
  long long first = -1;
  for (int f = 0; f < FK_MAX_FAULTS; f++) {
    struct fk_fault *x = &fk_faults[f];
    if (!x->used) continue;
    if (x->entry >= 0 ? x->entry != index : !(x->group & t[index].groups)) continue;
    x->seen++;
    if (x->seen < x->nth) continue;
    /* The calls due are nth .. nth + count - 1, counted without forming nth + count. */
    long past = x->seen - x->nth;
    if (x->count >= 0 && past >= x->count) continue;
    if (first < 0 || x->armed < first) {
      first = x->armed;
      code = x->code;
    }
    if (x->count >= 0 && past + 1 >= x->count) x->used = 0; /* spent */
  }
  /* An injected fault comes first; then what a capture under way forbids. */
  if (code == FK_OK) code = fk_capture_enter(&t[index]);
  return code;
}

/* The paused function (fake_pause) and the calls waiting for it; under fk_pause_lock,
 * which is never held with fk_lock. */
static pthread_mutex_t fk_pause_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t fk_pause_changed = PTHREAD_COND_INITIALIZER;
static char fk_paused[64];
static int fk_waiters;

FK_FN void fk_gate(const char *function) {
  pthread_mutex_lock(&fk_pause_lock);
  if (fk_paused[0] && !strcmp(fk_paused, function)) {
    fk_waiters++;
    pthread_cond_broadcast(&fk_pause_changed);
    while (fk_paused[0] && !strcmp(fk_paused, function))
      pthread_cond_wait(&fk_pause_changed, &fk_pause_lock);
    fk_waiters--;
  }
  pthread_mutex_unlock(&fk_pause_lock);
}

/* Entering a vendor call: waits while it is paused, refuses a call from a host function
 * (the vendors forbid them), takes the lock, counts the call and answers an injected fault
 * at once. The index of the name is looked up once per call site. */
#define ENTER(function)                                      \
  static int fk_index_ = -2;                                 \
  if (fk_index_ == -2) fk_index_ = fk_entry_index(function); \
  if (fk_t_in_callback) return FK_NOT_PERMITTED;             \
  fk_gate(function);                                         \
  pthread_mutex_lock(&fk_lock);                              \
  {                                                          \
    int fault_ = fk_enter(fk_index_);                        \
    if (fault_ != FK_OK) {                                   \
      fk_face_returned(fault_);                              \
      pthread_mutex_unlock(&fk_lock);                        \
      return fault_;                                         \
    }                                                        \
  }
#define RETURN(code)               \
  do {                             \
    int r_ = (code);               \
    fk_face_returned(r_);          \
    pthread_mutex_unlock(&fk_lock); \
    return r_;                     \
  } while (0)
/* A control function called from a host function, which runs under the driver's lock, would
 * wait for that lock for ever: it stops the process saying why instead. */
static void fk_not_in_callback(const char *function) {
  if (!fk_t_in_callback) return;
  fprintf(stderr,
          "%s: called from a host function; the fake runs host functions under its lock, as the "
          "vendors forbid driver calls in them, so a control call there cannot run\n",
          function);
  abort();
}
/* Runs the statements given under the lock, with the defaults in place. */
#define LOCKED(...)                \
  do {                             \
    fk_not_in_callback(__func__);  \
    pthread_mutex_lock(&fk_lock);  \
    fk_prepare();                  \
    __VA_ARGS__;                   \
    pthread_mutex_unlock(&fk_lock); \
  } while (0)

/* The calling thread's state, forgotten by a reset (its per-thread streams). */
FK_FN void fk_thread(void) {
  if (fk_t_epoch != fk_epoch) {
    memset(fk_t_pt_clock, 0, sizeof fk_t_pt_clock);
    fk_t_epoch = fk_epoch;
  }
}

static void fk_prepare(void) {
  if (!fk_prepared) {
    fk_prepared = 1;
    for (int d = 0; d < FK_MAX_DEVICES; d++) {
      fk_ctxs[d].live = 1;
      fk_ctxs[d].device = d;
      fk_ctxs[d].primary = 1;
    }
    fk_face_defaults();
    fk_shared_attach(); /* FAKE_SHARED_DEVICE: after the face's capacities, which it may set */
  }
  fk_thread();
}

/* ---- Devices and contexts --------------------------------------------------------------- */

FK_FN int fk_device_ok(int device) { return device >= 0 && device < fk_n_devices; }

/* Charges `bytes` to `device`; 0 when it does not have them. `used` stays what this process
 * holds; on a shared device (fake_shared.h) the capacity is checked against every live
 * process's. */
FK_FN int fk_charge(int device, unsigned long long bytes) {
  struct fk_device *d = &fk_devices[device];
  int shared = fk_shared ? fk_shared_charge(device, bytes) : -1;
  if (shared == 0) return 0;
  if (shared < 0 && (bytes > d->capacity || d->used > d->capacity - bytes)) return 0;
  d->used += bytes;
  return 1;
}

FK_FN void fk_uncharge(int device, unsigned long long bytes) {
  struct fk_device *d = &fk_devices[device];
  if (bytes > d->used) bytes = d->used;
  if (fk_shared) fk_shared_uncharge(device, bytes);
  d->used -= bytes;
}

/* What `device` has free: its capacity less what every process holds on it. */
FK_FN unsigned long long fk_device_free(int device) {
  unsigned long long used = fk_device_used_all(device), capacity = fk_devices[device].capacity;
  return used > capacity ? 0 : capacity - used;
}

/* The calling thread's current context, or -1. */
FK_FN int fk_current_ctx(void) { return fk_t_depth > 0 ? fk_t_stack[fk_t_depth - 1] : -1; }

FK_FN void fk_set_current(int ctx) {
  if (ctx < 0) {
    if (fk_t_depth > 0) fk_t_depth--;
    return;
  }
  if (fk_t_depth == 0) fk_t_depth = 1;
  fk_t_stack[fk_t_depth - 1] = ctx;
}

/* Whether `device` may be granted access to memory of `owner`. */
FK_FN int fk_peer_linked(int owner, int device) {
  return owner == device || fk_peer_on[owner][device] || fk_peer_on[device][owner];
}

/* The can-access query: 1 for two distinct devices unless declared otherwise. */
FK_FN int fk_can_access_peer(int *can, int device, int peer) {
  if (!can) return FK_INVALID_VALUE;
  if (!fk_device_ok(device) || !fk_device_ok(peer)) return FK_INVALID_DEVICE;
  *can = device != peer && !fk_peer_denied[device][peer];
  return FK_OK;
}

/* Enables access from `device` to `peer`'s memory. */
FK_FN int fk_enable_peer(int device, int peer, unsigned flags) {
  if (flags != 0) return FK_INVALID_VALUE;
  if (!fk_device_ok(device) || !fk_device_ok(peer) || device == peer) return FK_INVALID_DEVICE;
  if (fk_peer_denied[device][peer]) return FK_PEER_UNSUPPORTED;
  if (fk_peer_on[device][peer]) return FK_PEER_ALREADY_ENABLED;
  fk_peer_on[device][peer] = 1;
  return FK_OK;
}

FK_FN int fk_disable_peer(int device, int peer) {
  if (!fk_device_ok(device) || !fk_device_ok(peer) || device == peer) return FK_INVALID_DEVICE;
  if (!fk_peer_on[device][peer]) return FK_PEER_NOT_ENABLED;
  fk_peer_on[device][peer] = 0;
  return FK_OK;
}

/* ---- Error names (each face's table of the codes it answers) ---------------------------- */

struct fake_error {
  int code;
  const char *name, *text;
};

/* The entry of `code` in `table`, or NULL; counts a call of `function` (never failed: the
 * name query is how a caller reports another call's failure). */
FK_FN const struct fake_error *fk_error_of(const struct fake_error *table, size_t n, int code,
                                           const char *function) {
  /* From a host function (which runs under the lock) only looked up, not counted. */
  if (!fk_t_in_callback) {
    pthread_mutex_lock(&fk_lock);
    fk_prepare();
    int index = fk_entry_index(function);
    if (index >= 0) fk_calls[index]++;
    pthread_mutex_unlock(&fk_lock);
  }
  for (size_t i = 0; i < n; i++)
    if (table[i].code == code) return &table[i];
  return NULL;
}

/* ---- The control API: faults, counts, pauses, peers, hazards --------------------------- */

FAKE_EXPORT int fake_kit_version(void) { return FK_KIT_VERSION; }

/* 1 once the driver was initialised in this process (cuInit, or HIP's first call): a
 * Controls opened on a driver that was not is watching another copy than the code under
 * test loaded. */
FAKE_EXPORT int fake_initialised(void) {
  int on = 0;
  LOCKED(on = fk_initialised);
  return on;
}

/* The name of exported call `i` (from 0), NULL past the last. */
FAKE_EXPORT const char *fake_export(int i) {
  int n;
  const struct fk_entry *t = fk_table(&n);
  return i >= 0 && i < n ? t[i].name : NULL;
}

/* The name of fault group `i` (from 0; "@alloc", ...), NULL past the last. */
FAKE_EXPORT const char *fake_group(int i) {
  return i >= 0 && i < FK_N_GROUPS ? fk_group_names[i].name : NULL;
}

/* 1 when `name` is a call this driver exports or a group: what fake_fail takes. */
FAKE_EXPORT int fake_fail_target(const char *name) {
  return name && (fk_entry_index(name) >= 0 || fk_group_of(name) != 0);
}

/* The vendor's code for a neutral name ("out_of_memory", "invalid_value", ...), -1 for a
 * name the driver has no code for. */
FAKE_EXPORT int fake_code(const char *name) { return name ? fk_face_code(name) : -1; }

static void fk_die(const char *format, ...) __attribute__((format(printf, 1, 2), noreturn));
static void fk_die(const char *format, ...) {
  va_list args;
  va_start(args, format);
  vfprintf(stderr, format, args);
  va_end(args);
  fputc('\n', stderr);
  abort();
}

/* Calls nth .. nth+count-1 of `function` — an exported call, or a group of calls named
 * "@alloc" and so on, counted across its calls — return `code` without doing anything
 * (1-based, counted from now; nth < 1 counts as 1); count < 0: every call from the nth on;
 * count = 0 arms nothing. A name that is neither an exported call nor a group, or a 33rd
 * armed fault, aborts the process with a message: a fault that never fires would let a test
 * pass that checks nothing. */
FAKE_EXPORT void fake_fail(const char *function, long nth, long count, int code) {
  if (!function || !function[0] || strlen(function) >= 64)
    fk_die("fake_fail: a function name of 1 to 63 characters, not %s",
           !function ? "NULL" : function[0] ? "a longer one" : "an empty one");
  int entry = fk_entry_index(function);
  unsigned group = entry < 0 ? fk_group_of(function) : 0;
  if (entry < 0 && !group)
    fk_die("fake_fail: this driver exports no call %s, and it is no group (@alloc, @free, "
           "@copy, ...): a fault on it would never fire (fake_export lists the calls)",
           function);
  if (count == 0) return;
  int armed = 0;
  LOCKED({
    for (int f = 0; f < FK_MAX_FAULTS && !armed; f++) {
      struct fk_fault *x = &fk_faults[f];
      if (x->used) continue;
      x->used = 1;
      x->entry = entry;
      x->group = group;
      x->seen = 0;
      x->nth = nth < 1 ? 1 : nth;
      x->count = count;
      x->code = code;
      x->armed = ++fk_armed;
      armed = 1;
    }
  });
  if (!armed)
    fk_die("fake_fail(%s): %d faults are armed already; disarm them with fake_clear_faults",
           function, FK_MAX_FAULTS);
}

FAKE_EXPORT void fake_clear_faults(void) { LOCKED(memset(fk_faults, 0, sizeof fk_faults)); }

/* Calls of `function` so far (failed ones included); 0 for a name the driver does not
 * export. */
FAKE_EXPORT long long fake_calls(const char *function) {
  long long n = 0;
  LOCKED({
    int i = function ? fk_entry_index(function) : -1;
    if (i >= 0) n = fk_calls[i];
  });
  return n;
}

FAKE_EXPORT void fake_pause(const char *function) {
  pthread_mutex_lock(&fk_pause_lock);
  snprintf(fk_paused, sizeof fk_paused, "%s", function ? function : "");
  pthread_mutex_unlock(&fk_pause_lock);
}

FAKE_EXPORT void fake_resume(void) {
  pthread_mutex_lock(&fk_pause_lock);
  fk_paused[0] = 0;
  pthread_cond_broadcast(&fk_pause_changed);
  pthread_mutex_unlock(&fk_pause_lock);
}

FAKE_EXPORT int fake_waiting(void) {
  pthread_mutex_lock(&fk_pause_lock);
  int n = fk_waiters;
  pthread_mutex_unlock(&fk_pause_lock);
  return n;
}

FAKE_EXPORT void fake_set_peer(int device, int peer, int can) {
  LOCKED({
    if (device >= 0 && device < FK_MAX_DEVICES && peer >= 0 && peer < FK_MAX_DEVICES)
      fk_peer_denied[device][peer] = !can;
  });
}

FAKE_EXPORT int fake_peer_enabled(int device, int peer) {
  int on = 0;
  LOCKED(on = device >= 0 && device < FK_MAX_DEVICES && peer >= 0 && peer < FK_MAX_DEVICES &&
              fk_peer_on[device][peer]);
  return on;
}

static void fk_take_signal_hazards(void);

FAKE_EXPORT long long fake_hazards(void) {
  long long n = 0;
  LOCKED({
    fk_take_signal_hazards();
    n = fk_hazard_count;
  });
  return n;
}

/* The first hazard's text ("" for none). */
FAKE_EXPORT const char *fake_first_hazard(void) {
  LOCKED(fk_take_signal_hazards());
  return fk_hazard_log[0];
}

/* Hazard `i`'s text (from 0; the first FK_HAZARD_LOG are kept), NULL past them. */
FAKE_EXPORT const char *fake_hazard(long long i) {
  const char *text = NULL;
  LOCKED({
    fk_take_signal_hazards();
    if (i >= 0 && i < fk_hazard_count && i < FK_HAZARD_LOG) text = fk_hazard_log[i];
  });
  return text;
}

FAKE_EXPORT long long fake_cpu_waits(void) {
  long long n = 0;
  LOCKED(n = fk_cpu_wait_count);
  return n;
}

FAKE_EXPORT long long fake_gpu_waits(void) {
  long long n = 0;
  LOCKED(n = fk_gpu_wait_count);
  return n;
}

/* Forgets faults, counts, peer links and hazards (fakehip_reset). */
FK_FN void fk_core_reset(void) {
  memset(fk_faults, 0, sizeof fk_faults);
  memset(fk_calls, 0, sizeof fk_calls);
  memset(fk_peer_denied, 0, sizeof fk_peer_denied);
  memset(fk_peer_on, 0, sizeof fk_peer_on);
  fk_hazard_count = fk_cpu_wait_count = fk_gpu_wait_count = 0;
  fk_hazard_log[0][0] = 0;
  for (int c = 0; c < FK_MAX_CTX; c++) {
    fk_ctxs[c].legacy_clock = 0;
    if (c >= FK_MAX_DEVICES) memset(&fk_ctxs[c], 0, sizeof fk_ctxs[c]);
  }
  fk_epoch++;
}

#endif /* FAKE_CORE_H */
