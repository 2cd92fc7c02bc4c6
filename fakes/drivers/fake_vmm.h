/*
 * fake_vmm.h: virtual memory management for both drivers (see fake_core.h): the model the
 * vendors document, over the host's own virtual memory.
 *
 *   - a reservation is PROT_NONE address space; its address is a hint, as both vendors
 *     document it: exactly `addr` when it is non-zero, aligned as the face asks, and
 *     [addr, addr + size) overlaps nothing mapped in the process; else wherever the system
 *     puts it. A freed reservation's range stays the fake's (PROT_NONE, bounded) so that it
 *     can be reserved again at the same address (vLLM and torch_memory_saver cycle
 *     reservations so), and a reserve without a hint does not get it;
 *   - a physical handle is a part of one memory file per driver, charged to its device;
 *     releasing it while mapped defers the free to the last unmap (under
 *     Q_DESCRIPTOR_PER_HANDLE it also holds a descriptor of the process until released);
 *     a handle made exportable (requestedHandleTypes POSIX_FD) is one too until its first
 *     export, which moves it into a memory file of its own (its mappings re-mapped over it
 *     where they are), so that a descriptor carries exactly its bytes to another process
 *     (fake_ipc.h), and charges it as an object of the device (fake_shared.h) from then on; an
 *     imported handle is such a file from the start;
 *   - a map maps the handle's part MAP_FIXED without access; set-access grants it per device
 *     (and sets the host protection to the widest granted); an unmap covers whole mappings.
 *
 * ROCm's reported behaviours are switches of this model (fk_quirks), set by fakehip's
 * profiles (fakehip.c says where each was reported).
 */
#ifndef FAKE_VMM_H
#define FAKE_VMM_H

#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif
#ifndef FALLOC_FL_KEEP_SIZE
#define FALLOC_FL_KEEP_SIZE 0x01
#endif
#ifndef FALLOC_FL_PUNCH_HOLE
#define FALLOC_FL_PUNCH_HOLE 0x02
#endif

enum {
  Q_RESERVATION_HOLD = 1u << 0, /* a released handle's bytes stay while a reservation it was
                                   mapped into is reserved */
  Q_SETACCESS_PREFIX = 1u << 1, /* set-access sums mappings from the reservation's first */
  Q_RESERVE_COUNTED = 1u << 2,  /* reservations counted against plain allocations */
  Q_UNMAP_MANY = 1u << 3,       /* one unmap over several mappings drops one use */
  Q_DESCRIPTOR_PER_HANDLE = 1u << 4, /* each live handle holds a file descriptor of the
                                        process, closed at release */
  Q_IMPORT_HOST_ACCESS = 1u << 5, /* set-access with a host location over a mapping of an
                                     imported handle is refused */
  Q_IMPORT_NEEDS_FD = 1u << 6,    /* an import keeps the caller's descriptor, not its own:
                                     closed before set-access, set-access is refused */
};
/* Whether the face takes host locations in set-access descriptors (HIP's
 * hipMemLocationTypeHost: the CPU's access, as on a large-BAR system). */
static int fk_host_location_ok;
#define FK_LOCATION_DEVICE 1
#define FK_LOCATION_HOST 2
#define FK_ACCESS_HOST (1u << 31) /* in a mapping's `access`: the CPU (a host location) */
#define FK_HANDLE_POSIX_FD 1u    /* requested handle types: a POSIX file descriptor */
static unsigned fk_quirks;

#define FK_MAX_PHYS 65536
#define FK_PHYS_BASE 0x7e0000000000ULL

struct fk_phys {
  unsigned long long serial; /* 0: a free slot */
  unsigned long long size, offset; /* its part of the memory file */
  int device, released, mappings;
  int descriptor1; /* Q_DESCRIPTOR_PER_HANDLE: the descriptor it holds, plus one (0: none) */
  /* Exported once (POSIX_FD requested) or imported: its own memory file, plus one (0: a part
   * of the driver's), which is all of it (offset 0); the key of its object (fake_shared.h). */
  int file1;
  unsigned handle_types; /* the requested handle types (FK_HANDLE_POSIX_FD) */
  int imported;          /* made by an import, not a create */
  int object;            /* charged as an object of a shared device (else to this process) */
  unsigned long long key;
  /* Q_IMPORT_NEEDS_FD: the descriptor the caller imported from, plus one (0: none), and what
   * it named then (st_dev, st_ino). */
  int caller_fd1;
  unsigned long long caller_dev, caller_ino;
};
static struct fk_phys fk_phys[FK_MAX_PHYS];
static int fk_phys_high;
static unsigned long long fk_next_phys = 1;
static int fk_phys_fd = -1;
static unsigned long long fk_phys_end; /* the memory file's parts given so far */

/* The memory file handle `p`'s bytes are in. */
FK_FN int fk_phys_file(const struct fk_phys *p) { return p->file1 ? p->file1 - 1 : fk_phys_fd; }

static int fk_mapping_fd(const struct fk_region *m) { return fk_phys_file(&fk_phys[m->phys]); }

static unsigned long long fk_mapping_file_offset(const struct fk_region *m, unsigned long long va) {
  return fk_phys[m->phys].offset + m->offset + (va - m->va);
}

FK_FN unsigned long long fk_phys_handle(const struct fk_phys *p) {
  return FK_PHYS_BASE + 16 * p->serial;
}

/* The live handle `handle` (released ones included), or NULL. */
FK_FN struct fk_phys *fk_phys_of(unsigned long long handle) {
  for (int i = 0; i < fk_phys_high; i++)
    if (fk_phys[i].serial && fk_phys_handle(&fk_phys[i]) == handle) return &fk_phys[i];
  return NULL;
}

/* Under Q_DESCRIPTOR_PER_HANDLE: a descriptor of the process for a new handle to hold (ROCm
 * 7.14's runtime opens a dmabuf one per hipMemCreate), plus one; 0 when the process has none
 * left (EMFILE: its RLIMIT_NOFILE; ENFILE: the system's), which the face answers as out of
 * memory, as ROCm does. Without the quirk: -1 (nothing to hold). */
FK_FN int fk_handle_descriptor(void) {
  if (!(fk_quirks & Q_DESCRIPTOR_PER_HANDLE)) return -1;
  int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  return fd < 0 ? 0 : fd + 1;
}

/* Closes the descriptor `p` holds, if any. */
FK_FN void fk_phys_close_descriptor(struct fk_phys *p) {
  if (p->descriptor1 > 0) close(p->descriptor1 - 1);
  p->descriptor1 = 0;
}

/* The key of the next object this process exports (fake_shared.h): pid << 32 | a counter. */
static unsigned fk_next_key;

/* Charges imported handle `p`: once, as an object of a shared device (the importer of an
 * object counted already adds nothing); else to this process's device, as any handle. 0 when
 * the device has not the bytes. (A created handle is charged to this process's slot, and that
 * charge moves into its object at its first export: fake_ipc.h, fk_phys_share.) */
FK_FN int fk_phys_charge(struct fk_phys *p) {
  int held = fk_shared ? fk_shared_object_hold(p->key, p->device, p->size, 0) : -1;
  if (held == 0) return 0;
  if (held < 0) return fk_charge(p->device, p->size); /* private, or the table is full */
  p->object = 1;
  fk_devices[p->device].used += p->size; /* what this process holds (fake_live "bytes") */
  return 1;
}

FK_FN void fk_phys_uncharge(struct fk_phys *p) {
  if (!p->object) {
    fk_uncharge(p->device, p->size);
    return;
  }
  fk_shared_object_drop(p->key);
  struct fk_device *d = &fk_devices[p->device];
  d->used -= p->size > d->used ? d->used : p->size;
  p->object = 0;
}

/* A free entry of the table, or NULL. */
FK_FN struct fk_phys *fk_phys_slot(void) {
  for (int i = 0; i < FK_MAX_PHYS; i++)
    if (!fk_phys[i].serial) return &fk_phys[i];
  return NULL;
}

/* Enters `p` (filled) in the table as a live handle; its handle. */
FK_FN unsigned long long fk_phys_enter(struct fk_phys *p) {
  p->serial = fk_next_phys++;
  if (p - fk_phys >= fk_phys_high) fk_phys_high = (int)(p - fk_phys) + 1;
  return fk_phys_handle(p);
}

/* A new physical handle of `size` bytes on `device` (charged), with the requested handle
 * types `types` (FK_HANDLE_POSIX_FD: exportable); its handle, or 0 with `*code` set. An
 * exportable handle is a part of the driver's memory file like any other until its first
 * export (fake_ipc.h: fk_phys_share), as a real driver opens no descriptor for it before
 * then. */
FK_FN unsigned long long fk_phys_create(int device, unsigned long long size, unsigned types,
                                        int *code) {
  *code = FK_OUT_OF_MEMORY;
  int descriptor1 = fk_handle_descriptor();
  if (!descriptor1) return 0;
  if (!fk_charge(device, size)) {
    if (descriptor1 > 0) close(descriptor1 - 1);
    return 0;
  }
  if (fk_phys_fd < 0) {
    fk_phys_fd = memfd_create("fake-device-memory", MFD_CLOEXEC);
    if (fk_phys_fd < 0) {
      fk_uncharge(device, size);
      if (descriptor1 > 0) close(descriptor1 - 1);
      return 0;
    }
  }
  unsigned long long offset = fk_round_up(fk_phys_end, fk_page());
  unsigned long long end = offset + fk_round_up(size, fk_page());
  struct fk_phys *p = NULL;
  for (int i = 0; i < FK_MAX_PHYS && !p; i++)
    if (!fk_phys[i].serial) p = &fk_phys[i];
  if (!p || end < offset || ftruncate(fk_phys_fd, (off_t)end) != 0) {
    fk_uncharge(device, size);
    if (descriptor1 > 0) close(descriptor1 - 1);
    return 0;
  }
  fk_phys_end = end;
  memset(p, 0, sizeof *p);
  p->serial = fk_next_phys++;
  p->size = size;
  p->offset = offset;
  p->device = device;
  p->handle_types = types;
  p->descriptor1 = descriptor1 > 0 ? descriptor1 : 0;
  if (p - fk_phys >= fk_phys_high) fk_phys_high = (int)(p - fk_phys) + 1;
  *code = FK_OK;
  return fk_phys_handle(p);
}

/* Which reservation each handle was ever mapped into, while both live: under
 * Q_RESERVATION_HOLD a released handle's bytes stay charged while any pair of its is left.
 * Recorded in every profile, so a profile only changes what a release gives back. */
#define FK_MAX_HOLDS 65536
struct fk_hold {
  unsigned long long phys, reservation;
};
static struct fk_hold fk_holds[FK_MAX_HOLDS];
static int fk_n_holds;

FK_FN int fk_holds_of(unsigned long long phys) {
  int n = 0;
  for (int i = 0; i < fk_n_holds; i++) n += fk_holds[i].phys == phys;
  return n;
}

FK_FN int fk_hold_add(unsigned long long phys, unsigned long long reservation) {
  for (int i = 0; i < fk_n_holds; i++)
    if (fk_holds[i].phys == phys && fk_holds[i].reservation == reservation) return 1;
  if (fk_n_holds == FK_MAX_HOLDS) return 0;
  fk_holds[fk_n_holds].phys = phys;
  fk_holds[fk_n_holds].reservation = reservation;
  fk_n_holds++;
  return 1;
}

/* Forgets the pairs of handle `phys` (non-zero) or of reservation `reservation` (non-zero). */
FK_FN void fk_holds_forget(unsigned long long phys, unsigned long long reservation) {
  int n = 0;
  for (int i = 0; i < fk_n_holds; i++)
    if (!((phys && fk_holds[i].phys == phys) ||
          (reservation && fk_holds[i].reservation == reservation)))
      fk_holds[n++] = fk_holds[i];
  fk_n_holds = n;
}

/* A released handle with no mapping left gives its bytes back — unless Q_RESERVATION_HOLD
 * keeps them charged while a reservation it was mapped into is still reserved. */
FK_FN void fk_phys_settle(struct fk_phys *p) {
  if (!p->released || p->mappings) return;
  unsigned long long handle = fk_phys_handle(p);
  if ((fk_quirks & Q_RESERVATION_HOLD) && fk_holds_of(handle)) return;
  fk_holds_forget(handle, 0);
  if (p->file1) {
    /* Its own file: closing it gives the bytes back once no other process holds them. */
    close(p->file1 - 1);
    p->file1 = 0;
    fk_phys_uncharge(p);
  } else {
    if (fk_phys_fd >= 0)
      fallocate(fk_phys_fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)p->offset,
                (off_t)fk_round_up(p->size, fk_page()));
    fk_uncharge(p->device, p->size);
  }
  p->serial = 0;
}

FK_FN int fk_phys_release(unsigned long long handle) {
  struct fk_phys *p = fk_phys_of(handle);
  if (!p || p->released) return FK_INVALID_VALUE;
  p->released = 1;
  fk_phys_close_descriptor(p);
  fk_phys_settle(p);
  return FK_OK;
}

/* Bytes of released handles with no mapping left that are still charged (what
 * Q_RESERVATION_HOLD holds back). */
FK_FN unsigned long long fk_held_bytes(void) {
  unsigned long long n = 0;
  for (int i = 0; i < fk_phys_high; i++)
    if (fk_phys[i].serial && fk_phys[i].released && !fk_phys[i].mappings) n += fk_phys[i].size;
  return n;
}

/* ---- Reservations ------------------------------------------------------------------------ */

/* Freed reservations' ranges, kept mapped PROT_NONE (most recent first) so that nothing
 * else in the process takes them between a free and a reserve at the same address, while a
 * reserve without a hint cannot get them (mmap(NULL) hands out no mapped page). Bounded,
 * the oldest given back to the system first, and all of them when the library is unloaded:
 * a test process loads many private copies. */
#define FK_MAX_FREED 64
#define FK_MAX_FREED_BYTES (4ULL << 40)
struct fk_freed {
  struct fk_freed *next;
  unsigned long long va, size;
};
static struct fk_freed *fk_freed_ranges;

FK_FN void fk_keep_freed(unsigned long long va, unsigned long long size) {
  struct fk_freed *f = calloc(1, sizeof *f);
  if (!f || mmap((void *)(uintptr_t)va, size, PROT_NONE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0) == MAP_FAILED) {
    free(f);
    munmap((void *)(uintptr_t)va, size);
    return;
  }
  f->va = va;
  f->size = size;
  f->next = fk_freed_ranges;
  fk_freed_ranges = f;
  int n = 0;
  unsigned long long bytes = 0;
  for (struct fk_freed **p = &fk_freed_ranges; *p;) {
    struct fk_freed *x = *p;
    n++;
    bytes += x->size;
    if (n > FK_MAX_FREED || bytes > FK_MAX_FREED_BYTES) {
      *p = x->next;
      munmap((void *)(uintptr_t)x->va, x->size);
      free(x);
    } else {
      p = &x->next;
    }
  }
}

/* True when freed ranges cover [va, va + size) wholly. */
FK_FN int fk_freed_covers(unsigned long long va, unsigned long long size) {
  unsigned long long at = va;
  while (at < va + size) {
    struct fk_freed *hit = NULL;
    for (struct fk_freed *f = fk_freed_ranges; f; f = f->next)
      if (f->va <= at && at < f->va + f->size) hit = f;
    if (!hit) return 0;
    at = hit->va + hit->size;
  }
  return 1;
}

/* Takes [va, va + size) out of the freed ranges (the pieces either side stay kept); 0 when
 * there is no memory for the split. */
FK_FN int fk_take_freed(unsigned long long va, unsigned long long size) {
  struct fk_freed *spare = calloc(1, sizeof *spare); /* at most one range splits in two */
  if (!spare) return 0;
  unsigned long long end = va + size;
  for (struct fk_freed **p = &fk_freed_ranges; *p;) {
    struct fk_freed *f = *p;
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

__attribute__((destructor)) static void fk_give_back_freed(void) {
  while (fk_freed_ranges) {
    struct fk_freed *f = fk_freed_ranges;
    fk_freed_ranges = f->next;
    munmap((void *)(uintptr_t)f->va, f->size);
    free(f);
  }
  if (fk_phys_fd >= 0) close(fk_phys_fd);
  if (fk_pagemap_fd >= 0) close(fk_pagemap_fd);
}

FK_FN int fk_overlaps_reservation(unsigned long long va, unsigned long long size) {
  for (int i = 0; i < fk_regions_high; i++) {
    const struct fk_region *r = &fk_regions[i];
    if (r->kind == R_RESERVATION && r->va < va + size && va < r->va + r->size) return 1;
  }
  return 0;
}

/* The hint `want` as the reservation's address, when it can be: non-zero, aligned to
 * `align`, overlapping no live reservation, and either a freed range's or free in the
 * process. 0 when it cannot. */
FK_FN unsigned long long fk_reserve_at(unsigned long long want, unsigned long long size,
                                       unsigned long long align) {
  if (!want || want % align || want + size < want || fk_overlaps_reservation(want, size)) return 0;
  if (fk_freed_covers(want, size)) return fk_take_freed(want, size) ? want : 0;
  void *p = mmap((void *)(uintptr_t)want, size, PROT_NONE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
  if (p == MAP_FAILED) return 0;
  if ((unsigned long long)(uintptr_t)p != want) { /* a kernel before 4.17 took it as a hint */
    munmap(p, size);
    return 0;
  }
  return want;
}

/* Reserves `size` bytes: at the hint `want` when it can be (aligned to `hint_align`), else
 * at a fresh address aligned to `fresh_align`. */
FK_FN int fk_reserve(int device, unsigned long long size, unsigned long long hint_align,
                     unsigned long long fresh_align, unsigned long long want,
                     unsigned long long *out) {
  unsigned long long start = fk_reserve_at(want, size, hint_align);
  if (!start) {
    unsigned long long span = size + fresh_align;
    if (span < size) return FK_OUT_OF_MEMORY;
    void *p = mmap(NULL, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return FK_OUT_OF_MEMORY;
    unsigned long long base = (unsigned long long)(uintptr_t)p;
    start = fk_round_up(base, fresh_align);
    if (start > base) munmap(p, start - base);
    if (base + span > start + size)
      munmap((void *)(uintptr_t)(start + size), base + span - start - size);
  }
  struct fk_region *r = fk_region_add(R_RESERVATION, start, size, device);
  if (!r) {
    fk_keep_freed(start, size);
    return FK_OUT_OF_MEMORY;
  }
  *out = start;
  return FK_OK;
}

FK_FN int fk_mapped_inside(unsigned long long va, unsigned long long size) {
  for (int i = 0; i < fk_regions_high; i++) {
    const struct fk_region *m = &fk_regions[i];
    if (m->kind == R_MAPPING && m->va < va + size && va < m->va + m->size) return 1;
  }
  return 0;
}

FK_FN int fk_address_free(unsigned long long va, unsigned long long size) {
  struct fk_region *r = fk_region_find(R_RESERVATION, va);
  if (!r || r->size != size || fk_mapped_inside(va, size)) return FK_INVALID_VALUE;
  /* rocr-285-unmap-many: ROCr still counts a user of the range. */
  if ((fk_quirks & Q_UNMAP_MANY) && r->uses > 0) return FK_INVALID_VALUE;
  fk_region_drop(r);
  fk_keep_freed(va, size);
  /* The handles this reservation held settle once it is gone: one pair at a time, since a
   * settling handle forgets its other pairs. */
  for (int i = 0; i < fk_n_holds;) {
    if (fk_holds[i].reservation != va) {
      i++;
      continue;
    }
    unsigned long long phys = fk_holds[i].phys;
    fk_holds[i] = fk_holds[--fk_n_holds];
    struct fk_phys *p = fk_phys_of(phys);
    if (p) fk_phys_settle(p);
    i = 0;
  }
  return FK_OK;
}

FK_FN struct fk_region *fk_reservation_of(unsigned long long va, unsigned long long size) {
  for (int i = 0; i < fk_regions_high; i++) {
    struct fk_region *r = &fk_regions[i];
    if (r->kind == R_RESERVATION && r->va <= va && va + size <= r->va + r->size) return r;
  }
  return NULL;
}

/* ---- Mappings ---------------------------------------------------------------------------- */

FK_FN int fk_map(unsigned long long va, unsigned long long size, unsigned long long offset,
                 unsigned long long handle, unsigned long long gran) {
  struct fk_phys *p = fk_phys_of(handle);
  struct fk_region *r = fk_reservation_of(va, size);
  if (!p || p->released || size == 0 || va % gran || size % gran || offset % gran ||
      offset + size > p->size || offset + size < offset || !r || fk_mapped_inside(va, size))
    return FK_INVALID_VALUE;
  struct fk_region *m = fk_region_add(R_MAPPING, va, size, p->device);
  if (!m) return FK_OUT_OF_MEMORY;
  if (!fk_hold_add(handle, r->va)) {
    fk_region_drop(m);
    return FK_OUT_OF_MEMORY;
  }
  void *at = mmap((void *)(uintptr_t)va, size, PROT_NONE, MAP_SHARED | MAP_FIXED,
                  fk_phys_file(p), (off_t)(p->offset + offset));
  if (at == MAP_FAILED) {
    fk_region_drop(m);
    return FK_OUT_OF_MEMORY;
  }
  m->phys = (int)(p - fk_phys);
  m->offset = offset;
  m->prot = PROT_NONE;
  p->mappings++;
  r->uses++;
  return FK_OK;
}

/* Bytes of [va, va + size) that mappings cover; `*partial` set when a mapping reaches out
 * of the range. */
FK_FN unsigned long long fk_mapped_bytes(unsigned long long va, unsigned long long size,
                                         int *partial) {
  unsigned long long n = 0;
  *partial = 0;
  for (int i = 0; i < fk_regions_high; i++) {
    const struct fk_region *m = &fk_regions[i];
    if (m->kind != R_MAPPING || m->va >= va + size || va >= m->va + m->size) continue;
    unsigned long long lo = m->va > va ? m->va : va;
    unsigned long long hi = m->va + m->size < va + size ? m->va + m->size : va + size;
    n += hi - lo;
    if (m->va < va || m->va + m->size > va + size) *partial = 1;
  }
  return n;
}

/* The descriptor both vendors' set-access calls take: {location {type, id}, flags}. */
struct fake_access_desc {
  int location_type; /* 1: a device; 2: the host (where the face takes it) */
  int device;
  unsigned int flags; /* 0 none, 1 read, 3 read-write */
};
_Static_assert(sizeof(struct fake_access_desc) == 12, "an access descriptor is 12 bytes");

/* Checks `count` descriptors for memory of `owner`: a malformed one is FK_INVALID_VALUE, an
 * unknown device FK_INVALID_DEVICE, a device not linked to the owner by peer access (in
 * either direction) FK_PEER_NOT_ENABLED. */
FK_FN int fk_check_access(const struct fake_access_desc *desc, size_t count, int owner) {
  if (!desc || count == 0) return FK_INVALID_VALUE;
  for (size_t i = 0; i < count; i++) {
    const struct fake_access_desc *d = &desc[i];
    if (d->flags != 0 && d->flags != 1 && d->flags != 3) return FK_INVALID_VALUE;
    if (d->location_type == FK_LOCATION_HOST && fk_host_location_ok) continue;
    if (d->location_type != FK_LOCATION_DEVICE) return FK_INVALID_VALUE;
    if (!fk_device_ok(d->device)) return FK_INVALID_DEVICE;
    if (d->flags && !fk_peer_linked(owner, d->device)) return FK_PEER_NOT_ENABLED;
  }
  return FK_OK;
}

static int fk_by_address(const void *a, const void *b) {
  unsigned long long x = (*(struct fk_region *const *)a)->va;
  unsigned long long y = (*(struct fk_region *const *)b)->va;
  return x < y ? -1 : x > y;
}

/* rocm-systems-2516-setaccess-prefix: the sizes of the mappings of the reservation holding
 * `va` are summed from its first (lowest) mapping, not from `va`'s, and the call refused
 * unless some such sum is exactly `size`. True when it refuses. */
FK_FN int fk_prefix_refuses(unsigned long long va, unsigned long long size) {
  if (!(fk_quirks & Q_SETACCESS_PREFIX)) return 0;
  struct fk_region *r = fk_reservation_of(va, 1);
  if (!r) return 0;
  static struct fk_region *inside[FK_MAX_REGIONS];
  int n = 0;
  for (int i = 0; i < fk_regions_high; i++) {
    struct fk_region *m = &fk_regions[i];
    if (m->kind == R_MAPPING && r->va <= m->va && m->va < r->va + r->size) inside[n++] = m;
  }
  qsort(inside, (size_t)n, sizeof inside[0], fk_by_address);
  unsigned long long sum = 0;
  for (int i = 0; i < n && sum < size; i++) sum += inside[i]->size;
  return sum != size;
}

FK_FN int fk_set_access(unsigned long long va, unsigned long long size,
                        const struct fake_access_desc *desc, size_t count,
                        unsigned long long gran) {
  int partial;
  if (!desc || count == 0 || size == 0 || va % gran || size % gran)
    return FK_INVALID_VALUE;
  if (fk_mapped_bytes(va, size, &partial) != size || fk_prefix_refuses(va, size))
    return FK_INVALID_VALUE;
  int host = 0;
  for (size_t k = 0; k < count; k++) host |= desc[k].location_type == FK_LOCATION_HOST;
  for (int i = 0; i < fk_regions_high; i++) {
    const struct fk_region *m = &fk_regions[i];
    if (m->kind != R_MAPPING || m->va >= va + size || va >= m->va + m->size) continue;
    int refused = fk_check_access(desc, count, m->device);
    if (refused != FK_OK) return refused;
    const struct fk_phys *p = &fk_phys[m->phys];
    /* rocm-systems-11185-import-host-access: a host location over an imported handle. */
    if ((fk_quirks & Q_IMPORT_HOST_ACCESS) && host && p->imported) return FK_INVALID_VALUE;
    /* rocm-systems-8440-import-needs-fd: the runtime reads the caller's descriptor now. */
    if ((fk_quirks & Q_IMPORT_NEEDS_FD) && p->caller_fd1) {
      struct stat st;
      if (fstat(p->caller_fd1 - 1, &st) != 0 || (unsigned long long)st.st_dev != p->caller_dev ||
          (unsigned long long)st.st_ino != p->caller_ino)
        return FK_INVALID_VALUE;
    }
  }
  unsigned widest = 0;
  for (size_t i = 0; i < count; i++) widest |= desc[i].flags;
  int prot = widest == 3 ? PROT_READ | PROT_WRITE : widest == 1 ? PROT_READ : PROT_NONE;
  if (mprotect((void *)(uintptr_t)va, size, prot) != 0) return FK_UNKNOWN;
  for (int i = 0; i < fk_regions_high; i++) {
    struct fk_region *m = &fk_regions[i];
    if (m->kind != R_MAPPING || m->va >= va + size || va >= m->va + m->size) continue;
    for (size_t k = 0; k < count; k++) {
      unsigned bit = desc[k].location_type == FK_LOCATION_HOST ? FK_ACCESS_HOST : 1u << desc[k].device;
      if (desc[k].flags)
        m->access |= bit;
      else
        m->access &= ~bit;
    }
    m->prot = prot;
    fk_phys[m->phys].caller_fd1 = 0; /* imported into the mapping: no longer read */
  }
  return FK_OK;
}

FK_FN int fk_unmap(unsigned long long va, unsigned long long size, unsigned long long gran,
                   const char *what) {
  int partial;
  if (size == 0 || va % gran || size % gran || fk_mapped_bytes(va, size, &partial) != size ||
      partial)
    return FK_INVALID_VALUE;
  fk_check_unused(va, size, what);
  if (mmap((void *)(uintptr_t)va, size, PROT_NONE,
           MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0) == MAP_FAILED)
    return FK_UNKNOWN;
  /* ROCr's use count of a reservation drops by one per mapping — or, before ROCm 7.0
   * (rocr-285-unmap-many), by one per unmap call, however many mappings it covers. */
  for (int i = 0; i < fk_regions_high; i++) {
    struct fk_region *r = &fk_regions[i];
    if (r->kind != R_RESERVATION || r->va >= va + size || va >= r->va + r->size) continue;
    long n = 0;
    for (int j = 0; j < fk_regions_high; j++) {
      const struct fk_region *m = &fk_regions[j];
      n += m->kind == R_MAPPING && m->va >= va && m->va < va + size && r->va <= m->va &&
           m->va < r->va + r->size;
    }
    r->uses -= (fk_quirks & Q_UNMAP_MANY) && n ? 1 : n;
  }
  for (int i = 0; i < fk_regions_high; i++) {
    struct fk_region *m = &fk_regions[i];
    if (m->kind != R_MAPPING || m->va < va || m->va >= va + size) continue;
    struct fk_phys *p = &fk_phys[m->phys];
    fk_region_drop(m);
    if (p->serial) {
      p->mappings--;
      fk_phys_settle(p);
    }
  }
  return FK_OK;
}

/* Whether the mapping holding `va` grants `device` (FK_LOC_CPU: the host) access (1, 0), -1
 * when none holds it. */
FK_FN int fk_access_of(unsigned long long va, int device) {
  for (int i = 0; i < fk_regions_high; i++) {
    const struct fk_region *m = &fk_regions[i];
    if (m->kind != R_MAPPING || m->va > va || va >= m->va + m->size) continue;
    if (device == FK_LOC_CPU) return (m->access & FK_ACCESS_HOST) != 0;
    return device >= 0 && device < FK_MAX_DEVICES && ((m->access >> device) & 1);
  }
  return -1;
}

/* rocm-systems-7128-reserve-counted: the runtime's own free-memory counter, which plain
 * allocations are checked against, counts address reservations as used and physical
 * handles not at all; true when it refuses `bytes` more on `device`. */
FK_FN int fk_counted_refuses(int device, unsigned long long bytes) {
  if (!(fk_quirks & Q_RESERVE_COUNTED)) return 0;
  unsigned long long counted = fk_device_used_all(device); /* every process's */
  unsigned long long capacity = fk_devices[device].capacity;
  for (int i = 0; i < fk_phys_high; i++)
    if (fk_phys[i].serial && fk_phys[i].device == device) counted -= fk_phys[i].size;
  for (int i = 0; i < fk_regions_high; i++)
    if (fk_regions[i].kind == R_RESERVATION && fk_regions[i].device == device)
      counted += fk_regions[i].size;
  return counted >= capacity || bytes > capacity - counted;
}

/* ---- Reset ------------------------------------------------------------------------------- */

/* Forgets every handle (the memory file goes) and hold; the reservations and mappings are
 * the regions fk_memory_reset forgets, their address space given back here. */
FK_FN void fk_vmm_reset(void) {
  for (int i = 0; i < fk_regions_high; i++) {
    const struct fk_region *r = &fk_regions[i];
    if (r->kind == R_RESERVATION) munmap((void *)(uintptr_t)r->va, r->size);
  }
  for (int i = 0; i < fk_phys_high; i++) {
    struct fk_phys *p = &fk_phys[i];
    if (!p->serial) continue;
    fk_phys_close_descriptor(p);
    if (p->file1) close(p->file1 - 1); /* its object: fk_shared_forget let go of them all */
  }
  memset(fk_phys, 0, sizeof fk_phys);
  fk_phys_high = 0;
  if (fk_phys_fd >= 0) close(fk_phys_fd);
  fk_phys_fd = -1;
  fk_phys_end = 0;
  fk_n_holds = 0;
}

#endif /* FAKE_VMM_H */
