/*
 * fake_shared.h: a device shared by several processes, as a real driver's device is.
 *
 * Without FAKE_SHARED_DEVICE each process that loads a fake driver has a device of its own
 * (fk_devices[d]: capacity, used). With it, every process that names the same segment charges
 * one device: the segment is a small file mapped MAP_SHARED, with the devices' capacities and
 * 64 process slots, each process writing only its own slot. It is lock-free, so a process
 * killed at any instruction costs the others nothing:
 *
 *   - a process claims a free slot (owner 0) or a dead one by a CAS of its owner word;
 *   - a charge adds to its own slot's used[d], then sums used[d] over the live slots; over
 *     the capacity, it subtracts again and fails (two racing charges may both fail; neither
 *     overcommits, since each sees the other's addition or is seen by it: every access is
 *     sequentially consistent);
 *   - an uncharge subtracts from its own slot;
 *   - live: owner nonzero, the pid exists (kill(pid, 0) is not ESRCH) and is no zombie, and
 *     its start time (/proc/<pid>/stat, field 22) is the slot's; a dead slot counts nothing,
 *     so a killed process's memory is given back by the rule itself.
 *
 * FAKE_SHARED_DEVICE is read once, when the driver first prepares itself: a name (letters,
 * digits, '-', '_', '.'; at most 64) is the file /dev/shm/portalloc-fake-<name>.<euid>; a
 * value starting with '/' is that file. The first process creates it (O_CREAT|O_EXCL, mode
 * 0600) with its own capacities, then sets `ready` (release); the others wait briefly for
 * `ready` and take its capacities. A segment that is not right (size, magic, layout version,
 * another user's, open to others, never made ready) is said in one line on stderr and the
 * process runs with a private device. Nothing removes the file: whoever named it does
 * (portalloc_fakes::SharedDevice, portalloc.testing.SharedDevice).
 *
 * The layout (native byte order; the Rust and Python readers in the kit read it as is):
 *
 *   0   u64 magic (FK_SHARED_MAGIC)       16  u32 devices (8)     24  u64 claims (a counter)
 *   8   u32 layout version                20  u32 slots (64)      32  u64 capacity[8]
 *   12  u32 ready
 *   96  64 slots of 80 bytes: u64 owner (pid << 32 | claim counter; 0: free; bit 31 set
 *       while being claimed: it holds nothing yet), u64 start_time, u64 used[8]
 *   5216  1024 exported objects of 32 bytes (layout version 2): u64 key (creator pid << 32 |
 *       its export counter; 0: free), u64 size, u32 device, u32 pad (0), u64 holders (bit i:
 *       slot i holds a handle of it or a mapping)
 *
 * Exported objects (layout version 2): a physical allocation once exported
 * (requestedHandleTypes POSIX_FD, fake_ipc.h) is memory of the device, not of one process: the
 * real driver frees it when the last process holding a handle of it (its creator's, an
 * importer's) lets go, whoever created it. So from its first export it is charged once, in
 * the object table, not to a slot's used[d] (until then it is its creator's, on its slot; the
 * export counts the object before it takes the slot's charge back, so a sum meanwhile counts
 * it twice, never not at all); it counts while any LIVE slot has its bit in `holders` (the
 * rule of liveness above: a killed holder's bit is ignored, and cleared when its slot is
 * claimed again). A process sets its bit by an atomic OR, clears it by an atomic AND; an entry is
 * taken by a CAS of its key (free: 0, or one no live slot holds), freed by a CAS back to 0
 * when no live holder is left. The key travels with the memory: it is in the memfd's name
 * (fake-exportable-<key>-<device>), which an importer reads back (/proc/self/fd/N).
 *
 * Included by fake_core.h after its devices; called with the lock held, but for the
 * destructor.
 */
#ifndef FAKE_SHARED_H
#define FAKE_SHARED_H

#include <stddef.h>
#include <sys/stat.h>
#include <sys/types.h>

#define FK_SHARED_MAGIC 0x5645444b41464150ULL /* "PAFAKDEV" in little-endian bytes */
#define FK_SHARED_VERSION 2u
#define FK_SHARED_SLOTS 64
#define FK_SHARED_OBJECTS 1024
#define FK_SHARED_CLAIMING 0x80000000ULL /* in the owner word: a claim under way */
#define FK_SHARED_WAIT_MS 500            /* how long a joiner waits for size and `ready` */

struct fk_shared_slot {
  _Atomic unsigned long long owner, start_time;
  _Atomic unsigned long long used[FK_MAX_DEVICES];
};
struct fk_shared_object {
  _Atomic unsigned long long key, size;
  _Atomic unsigned device;
  unsigned pad;
  _Atomic unsigned long long holders;
};
struct fk_shared_segment {
  unsigned long long magic;
  unsigned version;
  _Atomic unsigned ready;
  unsigned devices, slots;
  _Atomic unsigned long long claims;
  unsigned long long capacity[FK_MAX_DEVICES];
  struct fk_shared_slot slot[FK_SHARED_SLOTS];
  struct fk_shared_object object[FK_SHARED_OBJECTS];
};
_Static_assert(sizeof(struct fk_shared_slot) == 16 + 8 * FK_MAX_DEVICES, "a slot's layout");
_Static_assert(offsetof(struct fk_shared_segment, capacity) == 32, "the header's layout");
_Static_assert(offsetof(struct fk_shared_segment, slot) == 96, "the header's layout");
_Static_assert(sizeof(struct fk_shared_object) == 32, "an object's layout");
_Static_assert(offsetof(struct fk_shared_segment, object) == 96 + 80 * FK_SHARED_SLOTS, "the layout");
_Static_assert(sizeof(struct fk_shared_segment) == 96 + 80 * FK_SHARED_SLOTS + 32 * FK_SHARED_OBJECTS,
               "the layout");

static struct fk_shared_segment *fk_shared; /* NULL: this process's device is private */
static struct fk_shared_slot *fk_shared_own;
static pid_t fk_shared_pid;
static int fk_shared_tried;
static char fk_shared_file[4096];

/* Field 22 of /proc/<pid>/stat (the start time, in clock ticks after boot) and whether the
 * process is a zombie; 0 when it cannot be read. */
static int fk_proc_start(pid_t pid, unsigned long long *start, int *zombie) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return 0;
  buf[n] = 0;
  char *p = strrchr(buf, ')'); /* the name (field 2) may hold anything but ends there */
  if (!p) return 0;
  p++;
  for (int field = 3; *p; field++) {
    while (*p == ' ') p++;
    if (!*p) break;
    if (field == 3) *zombie = *p == 'Z' || *p == 'X';
    if (field == 22) {
      *start = strtoull(p, NULL, 10);
      return 1;
    }
    while (*p && *p != ' ') p++;
  }
  return 0;
}

/* Whether the process that claimed `s` as `owner` still runs. */
static int fk_shared_live(const struct fk_shared_slot *s, unsigned long long owner) {
  if (!owner) return 0;
  pid_t pid = (pid_t)(owner >> 32);
  if (kill(pid, 0) == -1 && errno == ESRCH) return 0;
  unsigned long long start = 0;
  int zombie = 0;
  if (!fk_proc_start(pid, &start, &zombie)) return 1; /* no /proc: kill's word */
  if (zombie) return 0;
  if (owner & FK_SHARED_CLAIMING) return 1; /* its start time is not written yet */
  return atomic_load(&s->start_time) == start;
}

/* The slots whose bit is set in `want` that are live (this process's own always is). */
static unsigned long long fk_shared_live_mask(unsigned long long want) {
  unsigned long long mask = 0;
  for (int i = 0; i < FK_SHARED_SLOTS; i++) {
    if (!((want >> i) & 1)) continue;
    struct fk_shared_slot *s = &fk_shared->slot[i];
    unsigned long long owner = atomic_load(&s->owner);
    if (!owner || (owner & FK_SHARED_CLAIMING)) continue;
    if (s == fk_shared_own || fk_shared_live(s, owner)) mask |= 1ULL << i;
  }
  return mask;
}

/* The bytes charged to `device` by every live process: their slots' used[d], and each object
 * of the device that some live process holds, once. */
static unsigned long long fk_shared_sum(int device) {
  unsigned long long want = 0;
  for (int i = 0; i < FK_SHARED_SLOTS; i++)
    if (atomic_load(&fk_shared->slot[i].used[device])) want |= 1ULL << i;
  for (int i = 0; i < FK_SHARED_OBJECTS; i++) {
    struct fk_shared_object *o = &fk_shared->object[i];
    if (atomic_load(&o->key) && atomic_load(&o->device) == (unsigned)device)
      want |= atomic_load(&o->holders);
  }
  unsigned long long live = fk_shared_live_mask(want), sum = 0;
  for (int i = 0; i < FK_SHARED_SLOTS; i++) {
    if (!((live >> i) & 1)) continue;
    unsigned long long u = atomic_load(&fk_shared->slot[i].used[device]);
    sum = sum + u < sum ? ~0ULL : sum + u;
  }
  for (int i = 0; i < FK_SHARED_OBJECTS; i++) {
    struct fk_shared_object *o = &fk_shared->object[i];
    if (!atomic_load(&o->key) || atomic_load(&o->device) != (unsigned)device ||
        !(atomic_load(&o->holders) & live))
      continue;
    unsigned long long u = atomic_load(&o->size);
    sum = sum + u < sum ? ~0ULL : sum + u;
  }
  return sum;
}

/* Clears slot `i`'s bit in every object (a slot claimed anew, or given back). */
static void fk_shared_clear_holder(int i) {
  for (int k = 0; k < FK_SHARED_OBJECTS; k++)
    if (atomic_load(&fk_shared->object[k].holders) & (1ULL << i))
      atomic_fetch_and(&fk_shared->object[k].holders, ~(1ULL << i));
}

/* Claims a slot for this process: a free one, else a dead one; 0 when all are held. */
static int fk_shared_claim(void) {
  struct fk_shared_segment *g = fk_shared;
  pid_t pid = getpid();
  unsigned long long start = 0;
  int zombie = 0;
  fk_proc_start(pid, &start, &zombie);
  for (int pass = 0; pass < 2; pass++)
    for (int i = 0; i < FK_SHARED_SLOTS; i++) {
      struct fk_shared_slot *s = &g->slot[i];
      unsigned long long old = atomic_load(&s->owner);
      if (pass == 0 ? old != 0 : (old == 0 || fk_shared_live(s, old))) continue;
      unsigned long long counter = atomic_fetch_add(&g->claims, 1) % 0x7fffffffULL + 1;
      unsigned long long mine = (unsigned long long)pid << 32 | counter;
      if (!atomic_compare_exchange_strong(&s->owner, &old, mine | FK_SHARED_CLAIMING)) continue;
      for (int d = 0; d < FK_MAX_DEVICES; d++) atomic_store(&s->used[d], 0);
      fk_shared_clear_holder(i); /* a dead process's objects: while CLAIMING, ignored */
      atomic_store(&s->start_time, start);
      atomic_store(&s->owner, mine);
      fk_shared_own = s;
      fk_shared_pid = pid;
      return 1;
    }
  return 0;
}

/* Says why the segment cannot be used, and runs private. */
static void fk_shared_refuse(const char *format, ...) __attribute__((format(printf, 1, 2)));
static void fk_shared_refuse(const char *format, ...) {
  char why[512];
  va_list args;
  va_start(args, format);
  vsnprintf(why, sizeof why, format, args);
  va_end(args);
  fprintf(stderr,
          "portalloc-fakes: FAKE_SHARED_DEVICE: %s: %s; this process runs with a private "
          "device\n",
          fk_shared_file, why);
}

static void fk_sleep_ms(int ms) {
  struct timespec t = {0, ms * 1000000L};
  nanosleep(&t, NULL);
}

/* The devices' capacities are the segment's (a joiner configured otherwise takes them). */
FK_FN void fk_shared_capacities(void) {
  if (!fk_shared) return;
  for (int d = 0; d < FK_MAX_DEVICES; d++) fk_devices[d].capacity = fk_shared->capacity[d];
}

/* Creates or joins the segment FAKE_SHARED_DEVICE names, once; private when unset. */
static void fk_shared_attach(void) {
  if (fk_shared_tried) return;
  fk_shared_tried = 1;
  const char *v = getenv("FAKE_SHARED_DEVICE");
  if (!v || !*v) return;
  if (v[0] == '/') {
    snprintf(fk_shared_file, sizeof fk_shared_file, "%s", v);
    if (strlen(v) >= sizeof fk_shared_file) {
      fk_shared_refuse("the path is too long");
      return;
    }
  } else {
    size_t n = strlen(v);
    int ok = n <= 64;
    for (size_t i = 0; ok && i < n; i++) {
      char c = v[i];
      ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '-' || c == '_' || c == '.';
    }
    snprintf(fk_shared_file, sizeof fk_shared_file, "%.80s", v);
    if (!ok) {
      fk_shared_refuse("not a name (letters, digits, '-', '_', '.'; at most 64) nor an "
                       "absolute path");
      return;
    }
    snprintf(fk_shared_file, sizeof fk_shared_file, "/dev/shm/portalloc-fake-%s.%u", v,
             (unsigned)geteuid());
  }
  /* A file whose creator died before sizing it or making it ready (killed between its
   * O_EXCL create and its ready mark) is replaced, once: it would otherwise make every later
   * process run private. */
  int replaced = 0;
again:;
  const off_t size = (off_t)sizeof(struct fk_shared_segment);
  int fd = -1, created = 0;
  for (int attempt = 0; fd < 0 && attempt < 3; attempt++) {
    fd = open(fk_shared_file, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd >= 0) {
      created = 1;
    } else if (errno == EEXIST) {
      fd = open(fk_shared_file, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
      if (fd < 0 && errno != ENOENT) break; /* ENOENT: removed meanwhile; create it */
    } else {
      break;
    }
  }
  if (fd < 0) {
    fk_shared_refuse("cannot open it (%s)", strerror(errno));
    return;
  }
  struct fk_shared_segment *g = NULL;
  struct stat st;
  if (created) {
    if (fchmod(fd, 0600) || ftruncate(fd, size)) {
      fk_shared_refuse("cannot size it (%s)", strerror(errno));
      close(fd);
      return;
    }
  } else {
    if (fstat(fd, &st)) {
      fk_shared_refuse("cannot stat it (%s)", strerror(errno));
      close(fd);
      return;
    }
    const char *wrong = !S_ISREG(st.st_mode)       ? "not a regular file"
                        : st.st_uid != geteuid()   ? "owned by another user"
                        : (st.st_mode & 077) != 0  ? "open to other users (its mode is not 0600)"
                                                   : NULL;
    if (wrong) {
      fk_shared_refuse("%s", wrong);
      close(fd);
      return;
    }
    /* Its creator sizes it just after creating it: wait a little. */
    for (int ms = 0; st.st_size != size && ms < FK_SHARED_WAIT_MS; ms++) {
      fk_sleep_ms(1);
      if (fstat(fd, &st)) break;
    }
    if (st.st_size == 0 && !replaced) {
      replaced = 1;
      close(fd);
      unlink(fk_shared_file);
      goto again;
    }
    if (st.st_size != size) {
      fk_shared_refuse("it is %lld bytes, a segment of layout version %u is %lld",
                       (long long)st.st_size, FK_SHARED_VERSION, (long long)size);
      close(fd);
      return;
    }
  }
  void *m = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (m == MAP_FAILED) {
    fk_shared_refuse("cannot map it (%s)", strerror(errno));
    return;
  }
  g = m;
  if (created) {
    g->magic = FK_SHARED_MAGIC;
    g->version = FK_SHARED_VERSION;
    g->devices = FK_MAX_DEVICES;
    g->slots = FK_SHARED_SLOTS;
    for (int d = 0; d < FK_MAX_DEVICES; d++) g->capacity[d] = fk_devices[d].capacity;
    atomic_store_explicit(&g->ready, 1, memory_order_release);
  } else {
    int ms = 0;
    while (!atomic_load_explicit(&g->ready, memory_order_acquire) && ms++ < FK_SHARED_WAIT_MS)
      fk_sleep_ms(1);
    const char *wrong = NULL;
    char what[160];
    if (!atomic_load_explicit(&g->ready, memory_order_acquire) && !replaced) {
      replaced = 1;
      munmap(m, (size_t)size);
      unlink(fk_shared_file);
      goto again;
    }
    if (!atomic_load_explicit(&g->ready, memory_order_acquire)) {
      wrong = "it was never made ready (its creator died making it?)";
    } else if (g->magic != FK_SHARED_MAGIC) {
      snprintf(what, sizeof what, "its magic is %#llx, not %#llx: not a segment", g->magic,
               FK_SHARED_MAGIC);
      wrong = what;
    } else if (g->version != FK_SHARED_VERSION) {
      snprintf(what, sizeof what, "its layout version is %u, this driver's is %u", g->version,
               FK_SHARED_VERSION);
      wrong = what;
    } else if (g->devices != FK_MAX_DEVICES || g->slots != FK_SHARED_SLOTS) {
      snprintf(what, sizeof what, "it has %u devices and %u slots, not %d and %d", g->devices,
               g->slots, FK_MAX_DEVICES, FK_SHARED_SLOTS);
      wrong = what;
    }
    if (wrong) {
      fk_shared_refuse("%s", wrong);
      munmap(m, (size_t)size);
      return;
    }
  }
  fk_shared = g;
  if (!fk_shared_claim()) {
    fk_shared_refuse("its %d slots are held by live processes", FK_SHARED_SLOTS);
    fk_shared = NULL;
    munmap(m, (size_t)size);
    return;
  }
  fk_shared_capacities();
}

/* This process's slot: a forked child claims one of its own. */
static struct fk_shared_slot *fk_shared_slot_here(void) {
  if (fk_shared && fk_shared_pid != getpid() && !fk_shared_claim()) {
    fk_shared_refuse("its %d slots are held by live processes", FK_SHARED_SLOTS);
    fk_shared = NULL;
  }
  return fk_shared ? fk_shared_own : NULL;
}

/* Charges `bytes` to `device` on the shared device; 0 when the live processes' sum would
 * pass its capacity. */
static int fk_shared_charge(int device, unsigned long long bytes) {
  struct fk_shared_slot *s = fk_shared_slot_here();
  if (!s) return -1; /* private after all */
  if (bytes > fk_shared->capacity[device]) return 0;
  atomic_fetch_add(&s->used[device], bytes);
  if (fk_shared_sum(device) > fk_shared->capacity[device]) {
    atomic_fetch_sub(&s->used[device], bytes);
    return 0;
  }
  return 1;
}

static void fk_shared_uncharge(int device, unsigned long long bytes) {
  struct fk_shared_slot *s = fk_shared_slot_here();
  if (!s) return;
  unsigned long long old = atomic_load(&s->used[device]);
  while (!atomic_compare_exchange_weak(&s->used[device], &old, bytes > old ? 0 : old - bytes)) {
  }
}

/* What `device` has charged by every process (shared) or by this one (private). */
FK_FN unsigned long long fk_device_used_all(int device) {
  return fk_shared ? fk_shared_sum(device) : fk_devices[device].used;
}

/* ---- Exported objects ------------------------------------------------------------------ */

/* This process holds the object `key` (`size` bytes of `device`) from now on: its bit set in
 * the entry of that key, or in a new entry (`fresh`: the creator's, at the handle's first
 * export, which replaces any entry a dead process left under the same key; its bytes are
 * charged to the creator's slot already, which the caller then takes back, so they are not
 * checked against the capacity again). 1: held; 0: the device has not the bytes (an import of
 * an object counted by nobody live, and counting it passes the capacity): nothing held;
 * -1: the device is private after all; -2: the table is full. */
static int fk_shared_object_hold(unsigned long long key, int device, unsigned long long size,
                                 int fresh) {
  struct fk_shared_slot *s = fk_shared_slot_here();
  if (!s) return -1;
  int me = (int)(s - fk_shared->slot);
  unsigned long long bit = 1ULL << me;
  struct fk_shared_object *o = NULL;
  for (int i = 0; i < FK_SHARED_OBJECTS && !o; i++) {
    struct fk_shared_object *x = &fk_shared->object[i];
    unsigned long long k = key;
    if (atomic_load(&x->key) != key) continue;
    if (fresh) { /* a dead creator's entry under a reused pid: not this object */
      atomic_compare_exchange_strong(&x->key, &k, 0);
      continue;
    }
    unsigned long long before = atomic_fetch_or(&x->holders, bit);
    if (atomic_load(&x->key) != key) { /* freed meanwhile */
      atomic_fetch_and(&x->holders, ~bit);
      continue;
    }
    if (fk_shared_live_mask(before & ~bit)) return 1; /* counted already */
    /* Held by nobody live: it counts again from now, as this process's import says. */
    atomic_store(&x->size, size);
    atomic_store(&x->device, (unsigned)device);
    o = x;
  }
  for (int pass = 0; pass < 2 && !o; pass++)
    for (int i = 0; i < FK_SHARED_OBJECTS && !o; i++) {
      struct fk_shared_object *x = &fk_shared->object[i];
      unsigned long long k = atomic_load(&x->key);
      if (pass == 0 ? k != 0 : (k == 0 || fk_shared_live_mask(atomic_load(&x->holders))))
        continue;
      if (!atomic_compare_exchange_strong(&x->key, &k, key)) continue;
      atomic_store(&x->holders, 0);
      atomic_store(&x->size, size);
      atomic_store(&x->device, (unsigned)device);
      atomic_fetch_or(&x->holders, bit);
      o = x;
    }
  if (!o) return -2;
  if (fresh) return 1;
  if (size > fk_shared->capacity[device] || fk_shared_sum(device) > fk_shared->capacity[device]) {
    unsigned long long after = atomic_fetch_and(&o->holders, ~bit) & ~bit, k = key;
    if (!fk_shared_live_mask(after)) atomic_compare_exchange_strong(&o->key, &k, 0);
    return 0;
  }
  return 1;
}

/* This process lets go of object `key`; the entry is freed when no live process holds it. */
static void fk_shared_object_drop(unsigned long long key) {
  struct fk_shared_slot *s = fk_shared_slot_here();
  if (!s) return;
  unsigned long long bit = 1ULL << (s - fk_shared->slot);
  for (int i = 0; i < FK_SHARED_OBJECTS; i++) {
    struct fk_shared_object *x = &fk_shared->object[i];
    unsigned long long k = key;
    if (atomic_load(&x->key) != key) continue;
    unsigned long long after = atomic_fetch_and(&x->holders, ~bit) & ~bit;
    if (!fk_shared_live_mask(after)) atomic_compare_exchange_strong(&x->key, &k, 0);
  }
}

/* A reset forgets this process's memory: its slot holds nothing, no object included. */
FK_FN void fk_shared_forget(void) {
  struct fk_shared_slot *s = fk_shared_slot_here();
  for (int d = 0; s && d < FK_MAX_DEVICES; d++) atomic_store(&s->used[d], 0);
  if (s) fk_shared_clear_holder((int)(s - fk_shared->slot));
}

/* A process that ends normally (or unloads the driver) gives its slot back. */
__attribute__((destructor)) static void fk_shared_leave(void) {
  struct fk_shared_slot *s = fk_shared_own;
  if (!fk_shared || !s || fk_shared_pid != getpid()) return;
  for (int d = 0; d < FK_MAX_DEVICES; d++) atomic_store(&s->used[d], 0);
  fk_shared_clear_holder((int)(s - fk_shared->slot));
  atomic_store(&s->owner, 0);
  fk_shared = NULL;
}

#endif /* FAKE_SHARED_H */

/* The device's UUID, 16 bytes: `tag` (the vendor's, 6 bytes), then 8 bytes of FNV-1a over what
 * names the device, then the ordinal. A shared device is one device to every process that
 * shares it, so its UUID comes from the segment's file; a private device is a device of this
 * process alone, so its UUID comes from the process (pid and the time it started): code that
 * keys state by device identity (portalloc's shared budget) sees private devices as distinct,
 * as it would two GPUs. */
FK_FN void fk_device_uuid(char *uuid, const char tag[6], int device) {
  unsigned long long h = 1469598103934665603ULL;
  char who[4200];
  int n;
  if (fk_shared)
    n = snprintf(who, sizeof who, "shared:%s", fk_shared_file);
  else
  {
    unsigned long long start = 0;
    int zombie = 0;
    fk_proc_start(getpid(), &start, &zombie);
    n = snprintf(who, sizeof who, "private:%d:%llu", (int)getpid(), start);
  }
  for (int i = 0; i < n && i < (int)sizeof who; i++) {
    h ^= (unsigned char)who[i];
    h *= 1099511628211ULL;
  }
  memcpy(uuid, tag, 6);
  for (int i = 0; i < 8; i++) uuid[6 + i] = (char)(h >> (8 * i));
  uuid[14] = 0;
  uuid[15] = (char)device;
}
