/*
 * fake_memory.h: device memory over host memory, for both drivers (see fake_core.h).
 *
 * Every address a driver hands out is real host memory of the process: a plain allocation
 * is an anonymous mapping (MAP_NORESERVE: a simulated 192 GiB device costs only the pages
 * touched), pinned host memory is page-aligned anonymous memory, a mapping of a physical
 * handle maps the handle's part of one memory file (fake_vmm.h). So copies and memsets move
 * bytes, and move them when their stream reaches them:
 *
 *   - an asynchronous copy reads its source and writes its destination when its stream's
 *     clock reaches it, except that a source in pageable host memory is staged when the
 *     call is made (CUDA "API synchronization behavior"), and a copy to pageable host memory
 *     completes before the call returns (a CPU wait);
 *   - the synchronous copies follow the same page per vendor (the face says which);
 *   - while a copy to pinned host memory is in flight, the pages it writes are protected: a
 *     CPU access to the copy's destination before a synchronisation is a hazard (the access
 *     then goes on, and reads what was there before). FAKE_GUARD_HOST=0 turns this off; the
 *     guard sees whole pages, so an access to another part of a page only lifts it.
 */
#ifndef FAKE_MEMORY_H
#define FAKE_MEMORY_H

#define FK_MAX_REGIONS 65536

/* R_MODULE: a module's global variable (cuModuleGetGlobal, hipModuleGetGlobal), device memory
 * charged while the module is loaded. R_IPC: another process's plain allocation opened here
 * (cuIpcOpenMemHandle, hipIpcOpenMemHandle; fake_ipc.h), charged to its exporter only. */
enum { R_NONE, R_PLAIN, R_HOST, R_REGISTERED, R_MANAGED, R_POOL, R_RESERVATION, R_MAPPING,
       R_MODULE, R_IPC };

struct fk_region {
  int kind, device, ctx;
  unsigned long long va, size; /* the range callers see */
  unsigned long long charge;   /* bytes charged to the device */
  unsigned long long span;     /* bytes mapped at va by the fake (R_PLAIN, R_HOST, R_MANAGED, R_POOL) */
  unsigned long long id;       /* a serial: the buffer id pointer queries answer */
  unsigned flags;
  /* R_POOL: a pool's block, in use or cached; R_MODULE: `pool` is the module's slot */
  int pool, in_use, free_clock;
  unsigned long long free_seq;
  /* R_MAPPING */
  int phys;
  unsigned long long offset;
  unsigned access; /* bit d: device d may access it */
  int prot;
  /* R_RESERVATION: ROCr's use count (rocr-285-unmap-many) */
  long uses;
  /* CU_POINTER_ATTRIBUTE_SYNC_MEMOPS (cuPointerSetAttribute) */
  int sync_memops;
  /* R_MANAGED: the advice given (cuMemAdvise, hipMemAdvise) and the last prefetch, for the
   * whole allocation. A location is a device, FK_LOC_CPU or FK_LOC_NONE. */
  int read_mostly, preferred, last_prefetch;
  unsigned accessed_by; /* bit d: device d; bit 31: the CPU */
  /* Legacy IPC (fake_ipc.h). R_PLAIN once exported, and R_IPC: the memory file its bytes are
   * in, plus one (0: anonymous memory). R_IPC: how often this process opened it, and whose it
   * is (the exporter's pid and start time, the allocation's serial there). */
  int ipc_fd1, ipc_opens;
  unsigned long long ipc_pid, ipc_start, ipc_serial;
};
#define FK_LOC_CPU (-1)  /* CU_DEVICE_CPU, hipCpuDeviceId */
#define FK_LOC_NONE (-2) /* CU_DEVICE_INVALID, hipInvalidDeviceId */
static struct fk_region fk_regions[FK_MAX_REGIONS];
static int fk_regions_high;
static unsigned long long fk_next_region_id = 1;

FK_FN struct fk_region *fk_region_add(int kind, unsigned long long va, unsigned long long size,
                                      int device) {
  for (int i = 0; i < FK_MAX_REGIONS; i++) {
    struct fk_region *r = &fk_regions[i];
    if (r->kind != R_NONE) continue;
    memset(r, 0, sizeof *r);
    r->kind = kind;
    r->va = va;
    r->size = size;
    r->device = device;
    r->id = fk_next_region_id++;
    r->preferred = r->last_prefetch = FK_LOC_NONE;
    if (i >= fk_regions_high) fk_regions_high = i + 1;
    return r;
  }
  return NULL;
}

FK_FN void fk_region_drop(struct fk_region *r) {
  r->kind = R_NONE;
  while (fk_regions_high > 0 && fk_regions[fk_regions_high - 1].kind == R_NONE) fk_regions_high--;
}

/* The region of `kind` that starts at `va`. */
FK_FN struct fk_region *fk_region_find(int kind, unsigned long long va) {
  for (int i = 0; i < fk_regions_high; i++)
    if (fk_regions[i].kind == kind && fk_regions[i].va == va) return &fk_regions[i];
  return NULL;
}

/* The memory region (not a reservation) holding `va`: a plain, pinned, registered, managed
 * allocation, a pool's block in use, or a mapping. */
FK_FN struct fk_region *fk_region_holding(unsigned long long va) {
  for (int i = 0; i < fk_regions_high; i++) {
    struct fk_region *r = &fk_regions[i];
    if (r->kind == R_NONE || r->kind == R_RESERVATION) continue;
    if (r->kind == R_POOL && !r->in_use) continue;
    if (r->va <= va && va < r->va + (r->size ? r->size : 1)) return r;
  }
  return NULL;
}

FK_FN int fk_is_device_kind(int kind) {
  return kind == R_PLAIN || kind == R_MANAGED || kind == R_POOL || kind == R_MAPPING ||
         kind == R_MODULE || kind == R_IPC;
}

/* True when mappings (adjacent ones too) cover [va, end), each granting `device` access
 * (-1: any) and protection `prot` (0: any). */
static int fk_mapped(unsigned long long va, unsigned long long end, int device, int prot) {
  unsigned long long at = va;
  while (at < end) {
    const struct fk_region *hit = NULL;
    for (int i = 0; i < fk_regions_high; i++) {
      const struct fk_region *m = &fk_regions[i];
      if (m->kind == R_MAPPING && m->va <= at && at < m->va + m->size) hit = m;
    }
    if (!hit || (device >= 0 && !((hit->access >> device) & 1)) || (prot && !(hit->prot & prot)))
      return 0;
    at = hit->va + hit->size;
  }
  return 1;
}

/* True when [va, va + size) lies inside one live plain, managed or pool allocation, or is
 * covered by mappings (adjacent ones too) that grant `device` access: device memory a call
 * of `device` may copy from and to. */
FK_FN int fk_device_range(unsigned long long va, unsigned long long size, int device) {
  unsigned long long end = va + size;
  if (end < va || !size) return 0;
  for (int i = 0; i < fk_regions_high; i++) {
    const struct fk_region *r = &fk_regions[i];
    if ((r->kind == R_PLAIN || r->kind == R_MANAGED || r->kind == R_MODULE || r->kind == R_IPC ||
         (r->kind == R_POOL && r->in_use)) &&
        r->va <= va && end <= r->va + r->size)
      return 1;
  }
  if (device < 0 || device >= FK_MAX_DEVICES) return 0;
  return fk_mapped(va, end, device, 0);
}

/* True when [va, va + size) lies inside one pinned (page-locked or registered) host
 * allocation. */
FK_FN int fk_pinned_range(unsigned long long va, unsigned long long size) {
  for (int i = 0; i < fk_regions_high; i++) {
    const struct fk_region *r = &fk_regions[i];
    if ((r->kind == R_HOST || r->kind == R_REGISTERED) && r->va <= va && va + size <= r->va + r->size)
      return 1;
  }
  return 0;
}

/* True when the bytes of [va, va + size) can be touched now (read, or written when
 * `write`): each part lies in a live region, in mappings with that protection, or in memory the
 * fake does not own (the caller's host memory, registered or not); a part of a reserved range
 * nothing maps there is not. */
static int fk_range_live(unsigned long long va, unsigned long long size, int write) {
  unsigned long long end = va + size;
  if (end < va) return 0;
  unsigned long long at = va;
  while (at < end) {
    unsigned long long next = end;
    const struct fk_region *holding = NULL, *reserved = NULL;
    for (int i = 0; i < fk_regions_high; i++) {
      const struct fk_region *r = &fk_regions[i];
      if (r->kind == R_NONE) continue;
      if (r->va <= at && at < r->va + r->size) {
        if (r->kind == R_RESERVATION)
          reserved = r;
        else if (r->kind != R_MAPPING || (r->prot & (write ? PROT_WRITE : PROT_READ)))
          holding = r;
      } else if (r->va > at && r->va < next) {
        next = r->va; /* the caller's memory runs up to the next region */
      }
    }
    if (holding)
      at = holding->va + holding->size;
    else if (reserved)
      return 0;
    else
      at = next;
  }
  return 1;
}

static unsigned long long fk_page(void) {
  static unsigned long long page;
  if (!page) page = (unsigned long long)sysconf(_SC_PAGESIZE);
  return page;
}

FK_FN void *fk_map_anonymous(unsigned long long span) {
  void *p = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                 -1, 0);
  return p == MAP_FAILED ? NULL : p;
}

/* ---- Plain and managed allocations ----------------------------------------------------- */

/* `size` bytes of device memory for context `ctx` (R_PLAIN, or R_MANAGED), charged as the
 * drivers charge it (rounded up to 256 bytes). */
FK_FN int fk_alloc(int ctx, int kind, unsigned long long size, unsigned flags,
                   unsigned long long *out) {
  int device = fk_ctxs[ctx].device;
  unsigned long long charge = fk_round_up(size, 256), span = fk_round_up(size, fk_page());
  if (charge < size || span < size) return FK_OUT_OF_MEMORY;
  if (!fk_charge(device, charge)) return FK_OUT_OF_MEMORY;
  void *p = fk_map_anonymous(span);
  struct fk_region *r = p ? fk_region_add(kind, (unsigned long long)(uintptr_t)p, size, device) : NULL;
  if (!r) {
    if (p) munmap(p, span);
    fk_uncharge(device, charge);
    return FK_OUT_OF_MEMORY;
  }
  r->ctx = ctx;
  r->charge = charge;
  r->span = span;
  r->flags = flags;
  *out = r->va;
  return FK_OK;
}

/* Gives back the plain or managed allocation at `va`: FK_INVALID_VALUE when there is none.
 * The caller did what the vendor documents first (a device synchronisation). */
FK_FN int fk_free(unsigned long long va, const char *what) {
  struct fk_region *r = fk_region_find(R_PLAIN, va);
  if (!r) r = fk_region_find(R_MANAGED, va);
  if (!r) return FK_INVALID_VALUE;
  fk_check_unused(r->va, r->size, what);
  munmap((void *)(uintptr_t)r->va, r->span);
  /* Exported (legacy IPC): its memory file goes with it; an importer's mapping keeps the
   * bytes it maps ("undefined behaviour" for the vendors; the kernel keeps them here). */
  if (r->ipc_fd1) close(r->ipc_fd1 - 1);
  fk_uncharge(r->device, r->charge);
  fk_region_drop(r);
  return FK_OK;
}

/* ---- Advice over a range (cuMemAdvise, hipMemAdvise; the same numbers) ------------------- */

/* Applies advice 1-6 (set / unset read mostly, preferred location, accessed by) for `device`
 * (FK_LOC_CPU: the CPU) to region `r`, kept for the whole region; FK_INVALID_VALUE for
 * another number. The face checks the device first, as its vendor does. */
FK_FN int fk_advise(struct fk_region *r, int advice, int device) {
  unsigned bit = device == FK_LOC_CPU ? 1u << 31 : device >= 0 && device < 31 ? 1u << device : 0;
  switch (advice) {
    case 1: r->read_mostly = 1; break;
    case 2: r->read_mostly = 0; break;
    case 3: r->preferred = device; break;
    case 4: r->preferred = FK_LOC_NONE; break;
    case 5: r->accessed_by |= bit; break;
    case 6: r->accessed_by &= ~bit; break;
    default: return FK_INVALID_VALUE;
  }
  return FK_OK;
}

/* Range attribute 1-4 (read mostly, preferred location, accessed by, last prefetch location)
 * of region `r` into `out`, `n` ints: the accessed-by list in device order then the CPU, the
 * rest FK_LOC_NONE; the others one int. FK_INVALID_VALUE for another number. */
FK_FN int fk_range_attribute(const struct fk_region *r, int attribute, int *out, size_t n) {
  switch (attribute) {
    case 1: out[0] = r->read_mostly; break;
    case 2: out[0] = r->preferred; break;
    case 3: {
      size_t k = 0;
      for (int d = 0; d < fk_n_devices && k < n; d++)
        if ((r->accessed_by >> d) & 1) out[k++] = d;
      if (k < n && (r->accessed_by >> 31)) out[k++] = FK_LOC_CPU;
      while (k < n) out[k++] = FK_LOC_NONE;
      break;
    }
    case 4: out[0] = r->last_prefetch; break;
    default: return FK_INVALID_VALUE;
  }
  return FK_OK;
}

/* ---- Pinned host memory ------------------------------------------------------------------ */

FK_FN int fk_host_alloc(int device, unsigned long long size, unsigned flags, void **out) {
  unsigned long long span = fk_round_up(size, fk_page());
  if (span < size) return FK_OUT_OF_MEMORY;
  void *p = fk_map_anonymous(span);
  struct fk_region *r = p ? fk_region_add(R_HOST, (unsigned long long)(uintptr_t)p, size, device) : NULL;
  if (!r) {
    if (p) munmap(p, span);
    return FK_OUT_OF_MEMORY;
  }
  r->span = span;
  r->flags = flags;
  *out = p;
  return FK_OK;
}

static void fk_guards_forget(unsigned long long va, unsigned long long size);

FK_FN int fk_host_free(void *p, const char *what) {
  struct fk_region *r = fk_region_find(R_HOST, (unsigned long long)(uintptr_t)p);
  if (!r) return FK_INVALID_VALUE;
  fk_check_unused(r->va, r->size, what);
  fk_guards_forget(r->va, r->span);
  munmap(p, r->span);
  fk_region_drop(r);
  return FK_OK;
}

/* The caller's memory, page-locked (cuMemHostRegister, hipHostRegister). */
FK_FN int fk_host_register(void *p, unsigned long long size, unsigned flags, int device) {
  unsigned long long va = (unsigned long long)(uintptr_t)p;
  if (!p || !size || va + size < va) return FK_INVALID_VALUE;
  for (int i = 0; i < fk_regions_high; i++) {
    const struct fk_region *r = &fk_regions[i];
    if (r->kind != R_NONE && r->va < va + size && va < r->va + r->size) return -1; /* registered */
  }
  struct fk_region *r = fk_region_add(R_REGISTERED, va, size, device);
  if (!r) return FK_OUT_OF_MEMORY;
  r->flags = flags;
  return FK_OK;
}

FK_FN int fk_host_unregister(void *p, const char *what) {
  struct fk_region *r = fk_region_find(R_REGISTERED, (unsigned long long)(uintptr_t)p);
  if (!r) return FK_INVALID_VALUE;
  fk_check_unused(r->va, r->size, what);
  fk_guards_forget(r->va, r->size);
  fk_region_drop(r);
  return FK_OK;
}

/* ---- What a pointer is (pointer attributes, address ranges) ------------------------------ */

struct fk_pointer {
  const struct fk_region *region; /* NULL: memory the driver does not know */
  unsigned long long start, size;
};

FK_FN struct fk_pointer fk_pointer_of(unsigned long long p) {
  struct fk_pointer out = {NULL, 0, 0};
  const struct fk_region *r = fk_region_holding(p);
  if (r) {
    out.region = r;
    out.start = r->va;
    out.size = r->size;
  }
  return out;
}

/* ---- Moving bytes without touching pages that hold none ---------------------------------
 * A simulated device is mostly memory nobody wrote: copying it page by page would make the
 * host allocate what the fake exists not to allocate. So a copy (or a memset to zero) of whole
 * pages finds the source pages that hold no data — a hole of the memory file (SEEK_DATA), an
 * anonymous page never touched (/proc/self/pagemap: neither present nor swapped) — and zeroes
 * the destination's instead (a hole punched, MADV_DONTNEED on the fake's own anonymous
 * memory, a memset elsewhere): the same bytes, without the pages. */

#define FK_MOVE_CHUNK 512 /* pages looked at at once */

static int fk_pagemap_fd = -2;

/* The memory file behind a mapping, and where in it a mapped address lies (fake_vmm.h). */
static int fk_mapping_fd(const struct fk_region *m);
static unsigned long long fk_mapping_file_offset(const struct fk_region *m, unsigned long long va);

/* The memory file behind region `r` (a mapping; a plain allocation once exported, an opened
 * one: fake_ipc.h), with `va`'s offset in it and the bytes it maps from its start; -1 for
 * anonymous memory. */
static int fk_region_file(const struct fk_region *r, unsigned long long va, off_t *at,
                          unsigned long long *extent) {
  if (r->kind == R_MAPPING) {
    *at = (off_t)fk_mapping_file_offset(r, va);
    *extent = r->size;
    return fk_mapping_fd(r);
  }
  if ((r->kind == R_PLAIN || r->kind == R_IPC) && r->ipc_fd1) {
    *at = (off_t)(va - r->va);
    *extent = r->span;
    return r->ipc_fd1 - 1;
  }
  return -1;
}

/* Which of the `n` pages from `va` (page-aligned) hold no data: `empty[i]` 1 for none. */
static void fk_pages_empty(unsigned long long va, int n, unsigned char *empty) {
  memset(empty, 0, (size_t)n);
  unsigned long long page = fk_page();
  const struct fk_region *r = fk_region_holding(va);
  if (!r) return;
  off_t start;
  unsigned long long extent;
  int fd = fk_region_file(r, va, &start, &extent);
  if (fd >= 0 || r->kind == R_MAPPING) {
    if (fd < 0 || va + (unsigned long long)n * page > r->va + extent) return;
    off_t end = start + (off_t)((unsigned long long)n * page);
    off_t at = start;
    while (at < end) {
      off_t data = lseek(fd, at, SEEK_DATA);
      if (data < 0) data = end; /* ENXIO: no data past `at` */
      if (data > end) data = end;
      for (off_t p = at; p < data; p += (off_t)page) empty[(p - start) / (off_t)page] = 1;
      if (data >= end) break;
      off_t hole = lseek(fd, data, SEEK_HOLE);
      if (hole < 0) break;
      at = hole;
    }
    return;
  }
  if (r->kind != R_PLAIN && r->kind != R_MANAGED && r->kind != R_POOL && r->kind != R_HOST &&
      r->kind != R_MODULE)
    return;
  if (va + (unsigned long long)n * page > r->va + r->span) return;
  if (fk_pagemap_fd == -2) fk_pagemap_fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  if (fk_pagemap_fd < 0) return;
  uint64_t entries[FK_MOVE_CHUNK];
  ssize_t got = pread(fk_pagemap_fd, entries, sizeof entries[0] * (size_t)n,
                      (off_t)(va / page * sizeof entries[0]));
  if (got != (ssize_t)(sizeof entries[0] * (size_t)n)) return;
  for (int i = 0; i < n; i++) empty[i] = !(entries[i] >> 62 & 3); /* neither present nor swapped */
}

/* Zeroes the page-aligned [va, va + size) of one region, giving its pages back where the
 * region is the fake's. */
static void fk_zero_pages(unsigned long long va, unsigned long long size) {
  const struct fk_region *r = fk_region_holding(va);
  off_t at;
  unsigned long long extent;
  int fd = r ? fk_region_file(r, va, &at, &extent) : -1;
  if (fd >= 0) {
    /* Shared memory: a hole punched (MADV_DONTNEED would only drop this process's view). */
    if (va + size <= r->va + extent &&
        fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, at, (off_t)size) == 0)
      return;
    memset((void *)(uintptr_t)va, 0, size);
    return;
  }
  if (r && (r->kind == R_PLAIN || r->kind == R_MANAGED || r->kind == R_POOL || r->kind == R_HOST ||
            r->kind == R_MODULE) &&
      va + size <= r->va + r->span && madvise((void *)(uintptr_t)va, size, MADV_DONTNEED) == 0)
    return;
  memset((void *)(uintptr_t)va, 0, size);
}

/* memmove(dst, src, size) (src 0: memset to zero), skipping the pages that hold no data. */
static void fk_move(unsigned long long dst, unsigned long long src, unsigned long long size) {
  unsigned long long page = fk_page();
  int overlap = src && dst < src + size && src < dst + size;
  if (size < 16 * page || overlap || (src && (dst - src) % page)) {
    if (src)
      memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, size);
    else
      memset((void *)(uintptr_t)dst, 0, size);
    return;
  }
  unsigned long long head = fk_round_up(dst, page) - dst;
  if (src) memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, head);
  else memset((void *)(uintptr_t)dst, 0, head);
  unsigned long long at = head;
  unsigned char empty[FK_MOVE_CHUNK];
  while (size - at >= page) {
    unsigned long long pages = (size - at) / page;
    int n = pages > FK_MOVE_CHUNK ? FK_MOVE_CHUNK : (int)pages;
    if (src) fk_pages_empty(src + at, n, empty);
    else memset(empty, 1, (size_t)n);
    for (int i = 0; i < n;) {
      int j = i;
      while (j < n && empty[j] == empty[i]) j++;
      unsigned long long from = at + (unsigned long long)i * page, len = (unsigned long long)(j - i) * page;
      if (empty[i])
        fk_zero_pages(dst + from, len);
      else
        memmove((void *)(uintptr_t)(dst + from), (const void *)(uintptr_t)(src + from), len);
      i = j;
    }
    at += (unsigned long long)n * page;
  }
  if (at < size) {
    if (src) memmove((void *)(uintptr_t)(dst + at), (const void *)(uintptr_t)(src + at), size - at);
    else memset((void *)(uintptr_t)(dst + at), 0, size - at);
  }
}

/* ---- Copies and memsets ------------------------------------------------------------------ */

enum { SIDE_DEVICE = 1, SIDE_HOST = 2, SIDE_ANY = 3 };
/* How a synchronous call waits (the face's vendor page): */
enum {
  FK_ASYNC = 0,    /* the ...Async calls */
  FK_SYNC_CUDA,    /* CUDA's synchronous memcpy: see fk_copy */
  FK_SYNC_FULL,    /* returns once the copy completed, whatever the memory */
};

static void fk_guard_add(int clock, unsigned long long seq, unsigned long long va,
                         unsigned long long size, const char *what);

/* Which side [p, p + size) is on for a call of `device`, judged by where it starts, as clr's
 * ihipMemcpy_validate judges it (the object holding the start, then the size against it):
 * SIDE_DEVICE when it lies in device memory `device` may use; SIDE_HOST when it lies in pinned
 * memory, or starts in memory the driver does not know (the caller's own); 0 when it starts in
 * memory the driver knows but runs past it, or in a reserved range nothing maps there. */
FK_FN int fk_side_of(unsigned long long p, unsigned long long size, int device) {
  if (fk_device_range(p, size, device)) return SIDE_DEVICE;
  if (fk_pinned_range(p, size)) return SIDE_HOST;
  if (fk_region_holding(p)) return 0;
  for (int i = 0; i < fk_regions_high; i++) {
    const struct fk_region *r = &fk_regions[i];
    if (r->kind == R_RESERVATION && r->va <= p && p < r->va + r->size) return 0;
  }
  return SIDE_HOST;
}

/* Whether a synchronous copy or memset over [va, va + size) must complete before returning
 * whatever its kind: the memory has CU_POINTER_ATTRIBUTE_SYNC_MEMOPS set. */
FK_FN int fk_sync_memops(unsigned long long va, unsigned long long size) {
  const struct fk_region *r = fk_region_holding(va);
  return r && r->sync_memops && va + size <= r->va + r->size;
}

/* A 2D copy on `clock` for a call named `what`: `height` rows of `width` bytes, row r from
 * src + r * spitch to dst + r * dpitch (a 1D copy: one row, see fk_copy). Each side must be of
 * the kind the call names (SIDE_ANY: whichever it is, as with unified addressing): device
 * memory its device (`dst_device`, `src_device`: the call's device, or a peer's) may use, or a
 * non-null host pointer. Nothing to copy queues nothing. How it waits:
 *   FK_ASYNC      as the vendors document the async calls: a pageable source is staged at
 *                 the call, a pageable destination is written before the call returns (a CPU
 *                 wait), everything else when the stream reaches the copy;
 *   FK_SYNC_CUDA  CUDA's synchronous cuMemcpy*: host to device from pageable memory waits for
 *                 the stream first and stages the source; from pinned memory, and device to
 *                 host, return once the copy completed; device to device does not wait (unless
 *                 either side has SYNC_MEMOPS set, or `sync_memops`: the context's flag);
 *   FK_SYNC_FULL  returns once the copy completed.
 * FK_INVALID_VALUE for a pitch smaller than the width, ranges that wrap, or a side of the
 * wrong kind. */
FK_FN int fk_copy_2d(int clock, int dst_device, unsigned long long dst, unsigned long long dpitch,
                     int dst_side, int src_device, unsigned long long src,
                     unsigned long long spitch, int src_side, unsigned long long width,
                     unsigned long long height, int wait, int sync_memops, const char *what) {
  if (!width || !height) return FK_OK;
  if (!dst || !src || dpitch < width || spitch < width) return FK_INVALID_VALUE;
  if ((height - 1) > (~0ULL - width) / (dpitch > spitch ? dpitch : spitch)) return FK_INVALID_VALUE;
  unsigned long long dst_span = fk_rows_span(width, height, dpitch);
  unsigned long long src_span = fk_rows_span(width, height, spitch);
  if (dst + dst_span < dst || src + src_span < src) return FK_INVALID_VALUE;
  int dst_is = fk_side_of(dst, dst_span, dst_device), src_is = fk_side_of(src, src_span, src_device);
  if (!dst_is || !src_is || (dst_side == SIDE_DEVICE && dst_is != SIDE_DEVICE) ||
      (src_side == SIDE_DEVICE && src_is != SIDE_DEVICE))
    return FK_INVALID_VALUE;
  int dst_pinned = dst_is == SIDE_HOST && fk_pinned_range(dst, dst_span);
  int src_pinned = src_is == SIDE_HOST && fk_pinned_range(src, src_span);
  int src_pageable = src_is == SIDE_HOST && !src_pinned;
  int dst_pageable = dst_is == SIDE_HOST && !dst_pinned;
  int to_host = dst_is == SIDE_HOST, from_host = src_is == SIDE_HOST;
  if (wait == FK_SYNC_CUDA &&
      (sync_memops || fk_sync_memops(dst, dst_span) || fk_sync_memops(src, src_span)))
    wait = FK_SYNC_FULL;

  /* The CPU waits before the copy starts: CUDA's synchronous copy from pageable memory. */
  if (wait == FK_SYNC_CUDA && src_pageable && !to_host) {
    fk_cpu_wait();
    fk_force(clock, ~0ULL, 0);
  }
  unsigned long long seq = fk_queue(clock);
  /* "The memory areas may not overlap" (cudaMemcpy, hipMemcpy); checked for 1D copies (2D
   * rows may interleave without overlapping). */
  if (height == 1 && dst < src + width && src < dst + width) {
    fk_hazard("%s copies [%#llx, %#llx) onto [%#llx, %#llx), which overlap (the vendors' copies "
              "may not overlap: undefined behaviour)",
              what, src, src + src_span, dst, dst + dst_span);
  }
  /* Pageable memory is never touched by the device: only the device side is in flight (each
   * side as the span from its first row to its last). */
  if (!src_pageable) fk_use(clock, seq, src, src_span, FK_READ, what);
  if (!dst_pageable) fk_use(clock, seq, dst, dst_span, FK_WRITE, what);
  if (src_pageable) {
    if (width > ~0ULL / height || width * height > (1ULL << 40)) {
      fk_progress();
      return FK_OUT_OF_MEMORY;
    }
    char *staging = malloc(width * height);
    if (!staging) {
      fk_progress();
      return FK_OUT_OF_MEMORY;
    }
    for (unsigned long long r = 0; r < height; r++)
      memcpy(staging + r * width, (const char *)(uintptr_t)(src + r * spitch), width);
    fk_effect_add(clock, seq, EF_STAGED, dst, 0, width, 0, 0, staging);
    fk_effect_rows(height, dpitch, width);
  } else {
    fk_effect_add(clock, seq, EF_COPY, dst, src, width, 0, 0, NULL);
    fk_effect_rows(height, dpitch, spitch);
  }
  fk_progress();
  int blocks = wait == FK_SYNC_FULL || (to_host && dst_pageable) ||
               (wait == FK_SYNC_CUDA && (to_host || (from_host && !src_pageable)));
  if (blocks) {
    fk_cpu_wait();
    fk_force(clock, seq, 0);
  } else if (dst_pinned && !fk_done(clock, seq)) {
    fk_guard_add(clock, seq, dst, dst_span, what);
  }
  return FK_OK;
}

/* A copy of `size` bytes from `src` to `dst` on `clock`, for a call of context `ctx` named
 * `what`: both sides as the context's device sees them; see fk_copy_2d. */
FK_FN int fk_copy(int ctx, int clock, unsigned long long dst, int dst_side, unsigned long long src,
                  int src_side, unsigned long long size, int wait, const char *what) {
  int device = fk_ctxs[ctx].device;
  return fk_copy_2d(clock, device, dst, size, dst_side, device, src, size, src_side, size,
                    size ? 1 : 0, wait, (fk_ctxs[ctx].flags & 0x80) != 0, what);
}

/* A 2D memset on `clock`: `height` rows of `count` elements of `width` bytes (1, 2, 4) set to
 * `value`, row r at dst + r * pitch, in device memory context `ctx`'s device may use or in
 * pinned host memory (which the device reaches through unified addressing); `wait` as for
 * fk_copy_2d (FK_SYNC_FULL returns once it completed). Pinned memory a memset has yet to set
 * is guarded as a copy's destination is. */
FK_FN int fk_memset_2d(int ctx, int clock, unsigned long long dst, unsigned long long pitch,
                       unsigned value, int width, unsigned long long count,
                       unsigned long long height, int wait, const char *what) {
  if (!count || !height) return FK_OK;
  unsigned long long row = count * (unsigned long long)width;
  if (row / (unsigned long long)width != count) return FK_INVALID_VALUE;
  if (height > 1 && (pitch < row || pitch % (unsigned long long)width)) return FK_INVALID_VALUE;
  if (height > 1 && (height - 1) > (~0ULL - row) / pitch) return FK_INVALID_VALUE;
  if (dst % (unsigned long long)width) return FK_INVALID_VALUE;
  unsigned long long span = fk_rows_span(row, height, height > 1 ? pitch : row);
  int pinned = fk_pinned_range(dst, span);
  if (!pinned && !fk_device_range(dst, span, fk_ctxs[ctx].device)) return FK_INVALID_VALUE;
  unsigned long long seq = fk_queue(clock);
  fk_use(clock, seq, dst, span, FK_WRITE, what);
  fk_effect_add(clock, seq, EF_SET, dst, 0, row, value, width, NULL);
  fk_effect_rows(height, height > 1 ? pitch : row, 0);
  fk_progress();
  if (wait == FK_SYNC_FULL) {
    fk_cpu_wait();
    fk_force(clock, seq, 0);
  } else if (pinned && !fk_done(clock, seq)) {
    fk_guard_add(clock, seq, dst, span, what);
  }
  return FK_OK;
}

/* A memset of `count` elements of `width` bytes (1, 2, 4) to `value` at `dst` on `clock`;
 * see fk_memset_2d. */
FK_FN int fk_memset(int ctx, int clock, unsigned long long dst, unsigned value, int width,
                    unsigned long long count, int wait, const char *what) {
  return fk_memset_2d(ctx, clock, dst, 0, value, width, count, 1, wait, what);
}

/* ---- The guard over pinned memory a copy has yet to write -------------------------------- */

#define FK_MAX_GUARDS 256
#define FK_MAX_SIGNALLED 16

struct fk_guard {
  _Atomic int active;  /* the copy is in flight */
  _Atomic int tripped; /* a CPU access lifted it */
  unsigned long long lo, hi; /* the pages, [lo, hi) */
  unsigned long long va, size;
  int clock;
  unsigned long long seq;
  char what[72];
  char stream[96]; /* its stream's name when the copy was queued (a stream may go before the
                    * hazard is logged) */
};
static struct fk_guard fk_guards[FK_MAX_GUARDS];
static int fk_n_guards; /* slots [0, fk_n_guards) may be in use */
static int fk_guard_on = -1; /* -1: not decided yet (FAKE_GUARD_HOST) */

/* What the signal handler saw, taken under the lock by fk_take_signal_hazards. */
struct fk_signalled {
  unsigned long long address, va, size;
  char what[72];
  char stream[96];
};
static struct fk_signalled fk_signalled[FK_MAX_SIGNALLED];
static _Atomic int fk_n_signalled;
static _Atomic long long fk_signalled_lost;
static struct sigaction fk_old_segv;
static int fk_segv_installed;

static void fk_segv(int sig, siginfo_t *info, void *context) {
  unsigned long long a = (unsigned long long)(uintptr_t)info->si_addr;
  for (int i = 0; i < FK_MAX_GUARDS; i++) {
    struct fk_guard *g = &fk_guards[i];
    if (g->hi == 0 || a < g->lo || a >= g->hi) continue;
    /* One of the fake's pages: let the access go on (it reads what was there before). */
    mprotect((void *)(uintptr_t)g->lo, g->hi - g->lo, PROT_READ | PROT_WRITE);
    if (atomic_load(&g->active) && !atomic_exchange(&g->tripped, 1) && a >= g->va &&
        a < g->va + g->size) {
      int n = atomic_fetch_add(&fk_n_signalled, 1);
      if (n < FK_MAX_SIGNALLED) {
        struct fk_signalled *s = &fk_signalled[n];
        s->address = a;
        s->va = g->va;
        s->size = g->size;
        memcpy(s->what, g->what, sizeof s->what);
        memcpy(s->stream, g->stream, sizeof s->stream);
      } else {
        atomic_fetch_add(&fk_signalled_lost, 1);
      }
    }
    return;
  }
  /* Not the fake's: whoever handled it before. */
  if (fk_old_segv.sa_flags & SA_SIGINFO) {
    fk_old_segv.sa_sigaction(sig, info, context);
  } else if (fk_old_segv.sa_handler == SIG_DFL || fk_old_segv.sa_handler == SIG_IGN) {
    signal(sig, SIG_DFL); /* the access faults again, and the default action ends the process */
  } else {
    fk_old_segv.sa_handler(sig);
  }
}

/* The hazards the signal handler saw, into the log. */
static void fk_take_signal_hazards(void) {
  int n = atomic_load(&fk_n_signalled);
  if (!n) return;
  if (n > FK_MAX_SIGNALLED) n = FK_MAX_SIGNALLED;
  for (int i = 0; i < n; i++) {
    const struct fk_signalled *s = &fk_signalled[i];
    fk_hazard("CPU access of host address %#llx in [%#llx, %#llx) while %s on %s writes it: "
              "read or written before the copy completed (synchronise first)",
              s->address, s->va, s->va + s->size, s->what, s->stream);
  }
  fk_hazard_count += atomic_exchange(&fk_signalled_lost, 0);
  atomic_store(&fk_n_signalled, 0);
}

/* Installs the handler once; the library then stays loaded (a handler must not be unloaded
 * while the process may still call it). */
static int fk_guard_ready(void) {
  if (fk_guard_on < 0) {
    const char *v = getenv("FAKE_GUARD_HOST");
    fk_guard_on = !(v && !strcmp(v, "0"));
  }
  if (!fk_guard_on) return 0;
  if (!fk_segv_installed) {
    Dl_info self;
    if (dladdr((void *)&fk_segv, &self) && self.dli_fname)
      dlopen(self.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE);
    struct sigaction act;
    memset(&act, 0, sizeof act);
    act.sa_sigaction = fk_segv;
    act.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
    sigemptyset(&act.sa_mask);
    if (sigaction(SIGSEGV, &act, &fk_old_segv) != 0) {
      fk_guard_on = 0;
      return 0;
    }
    fk_segv_installed = 1;
  }
  return 1;
}

static void fk_guard_add(int clock, unsigned long long seq, unsigned long long va,
                         unsigned long long size, const char *what) {
  if (!fk_guard_ready()) return;
  int slot = -1;
  for (int i = 0; i < FK_MAX_GUARDS && slot < 0; i++)
    if (!atomic_load(&fk_guards[i].active)) slot = i;
  if (slot < 0) return;
  struct fk_guard *g = &fk_guards[slot];
  unsigned long long page = fk_page();
  g->hi = 0; /* the handler ignores it while it changes */
  g->va = va;
  g->size = size;
  g->clock = clock;
  g->seq = seq;
  snprintf(g->what, sizeof g->what, "%s", what);
  fk_clock_name(clock, g->stream, sizeof g->stream);
  atomic_store(&g->tripped, 0);
  g->lo = va / page * page;
  g->hi = fk_round_up(va + size, page);
  atomic_store(&g->active, 1);
  if (slot >= fk_n_guards) fk_n_guards = slot + 1;
  mprotect((void *)(uintptr_t)g->lo, g->hi - g->lo, PROT_NONE);
}

/* The fake itself is about to touch [va, va + size): its guarded pages are opened (and
 * closed again by fk_guards_settle). */
static void fk_guard_lift(unsigned long long va, unsigned long long size) {
  for (int i = 0; i < fk_n_guards; i++) {
    struct fk_guard *g = &fk_guards[i];
    if (atomic_load(&g->active) && g->lo < va + size && va < g->hi)
      mprotect((void *)(uintptr_t)g->lo, g->hi - g->lo, PROT_READ | PROT_WRITE);
  }
}

/* Guards whose copy completed go; the pages of those in flight (not tripped) are closed. */
static void fk_guards_settle(void) {
  if (!fk_n_guards) return;
  int live = 0;
  for (int i = 0; i < fk_n_guards; i++) {
    struct fk_guard *g = &fk_guards[i];
    if (!atomic_load(&g->active)) continue;
    if (fk_done(g->clock, g->seq)) {
      atomic_store(&g->active, 0);
      mprotect((void *)(uintptr_t)g->lo, g->hi - g->lo, PROT_READ | PROT_WRITE);
    } else {
      live = 1;
    }
  }
  for (int i = 0; i < fk_n_guards; i++) {
    struct fk_guard *g = &fk_guards[i];
    if (atomic_load(&g->active) && !atomic_load(&g->tripped))
      mprotect((void *)(uintptr_t)g->lo, g->hi - g->lo, PROT_NONE);
  }
  if (!live) fk_n_guards = 0;
}

/* Memory going away: its guards go without touching it. */
static void fk_guards_forget(unsigned long long va, unsigned long long size) {
  for (int i = 0; i < fk_n_guards; i++) {
    struct fk_guard *g = &fk_guards[i];
    if (atomic_load(&g->active) && g->va < va + size && va < g->va + g->size) {
      atomic_store(&g->active, 0);
      g->hi = 0;
    }
  }
}

/* ---- Reset ----------------------------------------------------------------------------- */

/* Gives back every region's memory (fakehip_reset). */
FK_FN void fk_memory_reset(void) {
  for (int i = 0; i < fk_n_guards; i++) {
    atomic_store(&fk_guards[i].active, 0);
    if (fk_guards[i].hi)
      mprotect((void *)(uintptr_t)fk_guards[i].lo, fk_guards[i].hi - fk_guards[i].lo,
               PROT_READ | PROT_WRITE);
    fk_guards[i].hi = 0;
  }
  fk_n_guards = 0;
  for (int i = 0; i < fk_regions_high; i++) {
    struct fk_region *r = &fk_regions[i];
    if (r->span && (r->kind == R_PLAIN || r->kind == R_HOST || r->kind == R_MANAGED ||
                    r->kind == R_POOL || r->kind == R_MODULE || r->kind == R_IPC))
      munmap((void *)(uintptr_t)r->va, r->span);
    if (r->ipc_fd1) close(r->ipc_fd1 - 1);
  }
  memset(fk_regions, 0, sizeof fk_regions);
  fk_regions_high = 0;
  for (int d = 0; d < FK_MAX_DEVICES; d++) fk_devices[d].used = 0;
  fk_shared_forget();
}

#endif /* FAKE_MEMORY_H */
