/*
 * fake_ipc.h: device memory exported from one process and imported into another, for both
 * drivers (see fake_core.h), over real processes and real file descriptors.
 *
 * Two mechanisms, as the vendors have two:
 *
 *   - Shareable handles of virtual memory (cuMemExportToShareableHandle /
 *     cuMemImportFromShareableHandle, CUDA 10.2; hipMemExportToShareableHandle /
 *     hipMemImportFromShareableHandle). A handle created with POSIX_FD among its requested
 *     handle types is a part of the driver's memory file, as any handle, until it is first
 *     exported: then it moves into a memory file of its own (fk_phys_share: copied, its
 *     mappings in this process re-mapped over the file where they are, its part of the
 *     driver's file given back), named fake-exportable-<key>-<device>, and its charge on a
 *     shared device moves from this process's slot into an object. So a handle never exported
 *     holds no descriptor, as with the vendors' drivers (CUDA opens none before
 *     cuMemExportToShareableHandle). Each export gives the caller a new descriptor of that
 *     file (O_CLOEXEC, the caller's to close). Importing takes a descriptor (CUDA: "the
 *     shareable handle ... for POSIX_FD the value of the descriptor cast to void *"; HIP the
 *     same, ROCm/rocm-systems PR #1564), checks it is such a file (its name, read back through
 *     /proc/self/fd, and its size), and makes a handle of this process over a descriptor of
 *     its own (dup: "the application may close the file descriptor once imported", as CUDA's
 *     guide to IPC with the VMM API says) — except under Q_IMPORT_NEEDS_FD. Both processes
 *     map the same file MAP_SHARED: one's writes are the other's reads. On a shared device the
 *     bytes are counted once (fake_shared.h's objects), on a private one the importer's own
 *     device is charged.
 *
 *   - Legacy IPC handles of plain allocations (cuIpcGetMemHandle / cuIpcOpenMemHandle /
 *     cuIpcCloseMemHandle; hipIpc*). The first export of an allocation moves its bytes into a
 *     memory file (copied, then the file mapped MAP_SHARED|MAP_FIXED over the same address: the
 *     pointer does not change), kept until the allocation is freed. The 64-byte handle names
 *     the exporter's process and that descriptor; opening it opens /proc/<pid>/fd/<fd> and maps
 *     it at a fresh address of the importer, an R_IPC region that copies, memsets and pointer
 *     queries take as device memory. The exporter's allocation stays charged to it alone.
 *
 * The legacy handle's bytes (a fixed layout, little-endian, every byte written: the same
 * allocation exported twice gives the same 64 bytes — pytorch/pytorch#198305 shipped handles
 * whose uninitialised padding differed):
 *
 *   0   8 bytes  magic "PAFAKIPC"
 *   8   u32      the exporter's pid
 *   12  u32      the memory file's descriptor in the exporter
 *   16  u64      the exporter's start time (/proc/<pid>/stat field 22): a reused pid is refused
 *   24  u64      the allocation's size
 *   32  u64      the allocation's serial in the exporter (also in the file's name,
 *                fake-ipc-<pid>-<serial>: a descriptor number reused after a free is refused)
 *   40  u32      the exporter's device
 *   44  20 bytes zero
 */
#ifndef FAKE_IPC_H
#define FAKE_IPC_H

#include <sys/stat.h>

/* ---- Moving memory into a file of its own ------------------------------------------------ */

/* Maps [va, va + size) over memory file `fd` from `at`, shared, with protection `prot`, in
 * place of what is mapped there (the address does not change); 0 when it cannot, and then
 * what was mapped there still is. */
static int fk_map_over(unsigned long long va, unsigned long long size, int prot, int fd,
                       unsigned long long at) {
  return mmap((void *)(uintptr_t)va, size, prot, MAP_SHARED | MAP_FIXED, fd, (off_t)at) !=
         MAP_FAILED;
}

/* Copies [from_at, from_at + size) of memory file `from` to the start of `to` (fresh: all
 * holes), the data only: a hole of `from` stays a hole of `to`. 0 when a read or write fails. */
static int fk_file_copy(int to, int from, unsigned long long from_at, unsigned long long size) {
  static char buf[1 << 16];
  off_t end = (off_t)(from_at + size), at = (off_t)from_at;
  while (at < end) {
    off_t data = lseek(from, at, SEEK_DATA);
    if (data < 0 || data >= end) break; /* ENXIO: no data past `at` */
    off_t hole = lseek(from, data, SEEK_HOLE);
    if (hole < 0 || hole > end) hole = end;
    for (off_t x = data; x < hole;) {
      size_t n = (size_t)(hole - x) < sizeof buf ? (size_t)(hole - x) : sizeof buf;
      ssize_t got = pread(from, buf, n, x);
      if (got <= 0 || pwrite(to, buf, (size_t)got, x - (off_t)from_at) != got) return 0;
      x += got;
    }
    at = hole;
  }
  return 1;
}

/* ---- Shareable handles (virtual memory) -------------------------------------------------- */

/* The first export of exportable handle `p` (created here, a part of the driver's memory
 * file): moves its bytes into a memory file of its own, fake-exportable-<key>-<device>, under
 * a new key. Every mapping of it in this process is mapped again over the new file, where it
 * was and with the protection it had (as fk_ipc_share does for a plain allocation), and its
 * part of the driver's file is punched out. On a shared device its bytes, charged to this
 * process's slot so far, become an object of the device: the object is counted first, then
 * the slot's charge taken back, so that a reader of the segment meanwhile counts them twice,
 * never not at all (a full object table keeps them on the slot, as an import would). A host
 * write through a mapping by another thread while the move runs (under the lock) may land in
 * the old part and be lost, as with fk_ipc_share. FK_OUT_OF_MEMORY when there is no memory
 * file or descriptor for it; nothing changed then. */
static int fk_phys_share(struct fk_phys *p) {
  unsigned long long span = fk_round_up(p->size, fk_page());
  unsigned long long key = (unsigned long long)getpid() << 32 | (fk_next_key + 1);
  char name[64];
  snprintf(name, sizeof name, "fake-exportable-%016llx-%d", key, p->device);
  int fd = memfd_create(name, MFD_CLOEXEC);
  if (fd < 0) return FK_OUT_OF_MEMORY;
  if (ftruncate(fd, (off_t)span) != 0 || !fk_file_copy(fd, fk_phys_fd, p->offset, span)) {
    close(fd);
    return FK_OUT_OF_MEMORY;
  }
  int index = (int)(p - fk_phys);
  for (int i = 0; i < fk_regions_high; i++) {
    const struct fk_region *m = &fk_regions[i];
    if (m->kind != R_MAPPING || m->phys != index) continue;
    if (!fk_map_over(m->va, m->size, m->prot, fd, m->offset)) {
      /* Back over the driver's file, those moved already (their bytes are still there). */
      for (int j = 0; j < i; j++) {
        const struct fk_region *b = &fk_regions[j];
        if (b->kind == R_MAPPING && b->phys == index)
          fk_map_over(b->va, b->size, b->prot, fk_phys_fd, p->offset + b->offset);
      }
      close(fd);
      return FK_OUT_OF_MEMORY;
    }
  }
  fk_next_key++;
  p->key = key;
  if (fk_shared && fk_shared_object_hold(key, p->device, p->size, 1) > 0) {
    fk_shared_uncharge(p->device, p->size); /* this process's used stays: now the object's */
    p->object = 1;
  }
  fallocate(fk_phys_fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)p->offset,
            (off_t)span);
  p->file1 = fd + 1;
  p->offset = 0;
  return FK_OK;
}

/* A new descriptor of exportable handle `handle`'s memory file into `*out`, the handle moved
 * into a file of its own first if this is its first export. FK_INVALID_VALUE for an unknown or
 * released handle, or one created without POSIX_FD requested (CUDA: "the handle ... must have
 * been created with the requested handle type"); the face checks the type asked for and the
 * flags. */
FK_FN int fk_phys_export(unsigned long long handle, int *out) {
  struct fk_phys *p = fk_phys_of(handle);
  if (!out || !p || p->released || !(p->handle_types & FK_HANDLE_POSIX_FD))
    return FK_INVALID_VALUE;
  if (!p->file1) {
    int rc = fk_phys_share(p);
    if (rc != FK_OK) return rc;
  }
  int fd = fcntl(p->file1 - 1, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return FK_OUT_OF_MEMORY; /* the process has no descriptor left */
  *out = fd;
  return FK_OK;
}

/* The exportable memory file `fd` names: its object's key, device and size; 0 when it is not
 * one (another file, a closed descriptor, a name that is not the fake's). */
static int fk_exportable_of(int fd, unsigned long long *key, int *device,
                            unsigned long long *size, struct stat *st) {
  char link[64], name[256];
  if (fd < 0 || fstat(fd, st) != 0 || !S_ISREG(st->st_mode) || st->st_size <= 0) return 0;
  snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  ssize_t n = readlink(link, name, sizeof name - 1);
  if (n <= 0) return 0;
  name[n] = 0;
  /* A memfd reads back as "/memfd:<its name> (deleted)". */
  char tail[32] = "";
  if (sscanf(name, "/memfd:fake-exportable-%16llx-%d%31s", key, device, tail) != 3 ||
      strcmp(tail, "(deleted)") != 0)
    return 0;
  *size = (unsigned long long)st->st_size;
  return 1;
}

/* A handle of this process over the exportable memory `fd` names, into `*out`.
 * FK_INVALID_VALUE for a descriptor that is not one (or of a device this process does not
 * have); the out-of-memory code when the device has not the bytes (a private device, or an
 * object nobody live holds any more). */
FK_FN int fk_phys_import(int fd, unsigned long long *out) {
  unsigned long long key, size;
  int device;
  struct stat st;
  if (!out || !fk_exportable_of(fd, &key, &device, &size, &st) || !fk_device_ok(device))
    return FK_INVALID_VALUE;
  struct fk_phys *p = fk_phys_slot();
  if (!p) return FK_OUT_OF_MEMORY;
  memset(p, 0, sizeof *p);
  int own = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (own < 0) return FK_OUT_OF_MEMORY;
  p->size = size;
  p->device = device;
  p->handle_types = FK_HANDLE_POSIX_FD;
  p->imported = 1;
  p->key = key;
  if (!fk_phys_charge(p)) {
    close(own);
    memset(p, 0, sizeof *p);
    return FK_OUT_OF_MEMORY;
  }
  p->file1 = own + 1;
  /* rocm-systems-8440-import-needs-fd: the runtime keeps the caller's descriptor number and
   * reads it again when the handle is mapped and granted access. */
  if (fk_quirks & Q_IMPORT_NEEDS_FD) {
    p->caller_fd1 = fd + 1;
    p->caller_dev = (unsigned long long)st.st_dev;
    p->caller_ino = (unsigned long long)st.st_ino;
  }
  *out = fk_phys_enter(p);
  return FK_OK;
}

/* What a live handle (released-but-mapped ones included) was made with: device, requested
 * handle types. FK_INVALID_VALUE for an unknown one. */
FK_FN int fk_phys_properties(unsigned long long handle, int *device, unsigned *types) {
  struct fk_phys *p = fk_phys_of(handle);
  if (!p) return FK_INVALID_VALUE;
  *device = p->device;
  *types = p->handle_types;
  return FK_OK;
}

/* ---- Legacy IPC handles (plain allocations) ---------------------------------------------- */

#define FK_IPC_HANDLE_BYTES 64
static const char fk_ipc_magic[8] = {'P', 'A', 'F', 'A', 'K', 'I', 'P', 'C'};

static void fk_put_le(unsigned char *at, unsigned long long v, int bytes) {
  for (int i = 0; i < bytes; i++) at[i] = (unsigned char)(v >> (8 * i));
}

static unsigned long long fk_get_le(const unsigned char *at, int bytes) {
  unsigned long long v = 0;
  for (int i = 0; i < bytes; i++) v |= (unsigned long long)at[i] << (8 * i);
  return v;
}

static unsigned long long fk_self_start(void) {
  unsigned long long start = 0;
  int zombie = 0;
  fk_proc_start(getpid(), &start, &zombie);
  return start;
}

/* Moves plain allocation `r`'s bytes into a memory file of its own, mapped where they were;
 * 0 when it cannot (no memory file, no descriptor). Pages holding no data are not copied (a
 * fresh file reads zeros there). */
static int fk_ipc_share(struct fk_region *r) {
  char name[64];
  snprintf(name, sizeof name, "fake-ipc-%d-%llu", (int)getpid(), r->id);
  int fd = memfd_create(name, MFD_CLOEXEC);
  if (fd < 0) return 0;
  if (ftruncate(fd, (off_t)r->span) != 0) {
    close(fd);
    return 0;
  }
  unsigned long long page = fk_page();
  unsigned char empty[FK_MOVE_CHUNK];
  for (unsigned long long at = 0; at < r->span;) {
    unsigned long long pages = (r->span - at) / page;
    int n = pages > FK_MOVE_CHUNK ? FK_MOVE_CHUNK : (int)pages;
    fk_pages_empty(r->va + at, n, empty);
    for (int i = 0; i < n; i++) {
      if (empty[i]) continue;
      const char *from = (const char *)(uintptr_t)(r->va + at + (unsigned long long)i * page);
      if (pwrite(fd, from, page, (off_t)(at + (unsigned long long)i * page)) != (ssize_t)page) {
        close(fd);
        return 0;
      }
    }
    at += (unsigned long long)n * page;
  }
  if (!fk_map_over(r->va, r->span, PROT_READ | PROT_WRITE, fd, 0)) {
    /* the anonymous mapping is still there: nothing changed */
    close(fd);
    return 0;
  }
  r->ipc_fd1 = fd + 1;
  return 1;
}

/* The legacy IPC handle of the plain allocation starting at `va`, into `out` (64 bytes).
 * FK_INVALID_VALUE for anything else: an interior pointer ("a pointer to the base of an
 * existing device memory allocation created with cuMemAlloc"), managed or pool memory, or a
 * mapping of a physical handle (CUDA refuses cuMemCreate memory; HIP since ROCm/clr PR #266). */
FK_FN int fk_ipc_get(unsigned long long va, unsigned char *out) {
  struct fk_region *r = fk_region_find(R_PLAIN, va);
  if (!out || !r) return FK_INVALID_VALUE;
  if (!r->ipc_fd1 && !fk_ipc_share(r)) return FK_OUT_OF_MEMORY;
  memset(out, 0, FK_IPC_HANDLE_BYTES);
  memcpy(out, fk_ipc_magic, sizeof fk_ipc_magic);
  fk_put_le(out + 8, (unsigned long long)getpid(), 4);
  fk_put_le(out + 12, (unsigned long long)(r->ipc_fd1 - 1), 4);
  fk_put_le(out + 16, fk_self_start(), 8);
  fk_put_le(out + 24, r->size, 8);
  fk_put_le(out + 32, r->id, 8);
  fk_put_le(out + 40, (unsigned long long)r->device, 4);
  return FK_OK;
}

/* Opens legacy handle `h` (64 bytes) for context `ctx` (its device), into `*out`:
 *   FK_INVALID_VALUE    not a handle (magic), or flags other than LAZY_ENABLE_PEER_ACCESS
 *                       (1), which both vendors say "must be specified";
 *   FK_INVALID_CONTEXT  the exporting process itself (CUDA answers "invalid device context":
 *                       openucx/ucx#11603; HIP's tests expect hipErrorInvalidContext,
 *                       ROCm/hip#2880);
 *   FK_INVALID_HANDLE   the exporter is dead (its pid gone, or another process's now), or
 *                       the allocation was freed (its descriptor closed, or another file's).
 * Opened again in this process: "the reference count on the handle is incremented by 1 and
 * the existing device pointer is returned" (cuIpcOpenMemHandle). */
FK_FN int fk_ipc_open(int ctx, int device, const unsigned char *h, unsigned flags,
                      unsigned long long *out) {
  if (!out || memcmp(h, fk_ipc_magic, sizeof fk_ipc_magic) != 0 || flags != 1)
    return FK_INVALID_VALUE;
  for (int i = 44; i < FK_IPC_HANDLE_BYTES; i++)
    if (h[i]) return FK_INVALID_VALUE;
  pid_t pid = (pid_t)fk_get_le(h + 8, 4);
  int their_fd = (int)fk_get_le(h + 12, 4);
  unsigned long long start = fk_get_le(h + 16, 8), size = fk_get_le(h + 24, 8);
  unsigned long long serial = fk_get_le(h + 32, 8);
  if (pid == getpid() && start == fk_self_start()) return FK_INVALID_CONTEXT;
  unsigned long long now = 0;
  int zombie = 0;
  if (pid <= 0 || !fk_proc_start(pid, &now, &zombie) || zombie || now != start)
    return FK_INVALID_HANDLE;
  for (int i = 0; i < fk_regions_high; i++) {
    struct fk_region *r = &fk_regions[i];
    if (r->kind == R_IPC && r->ipc_pid == (unsigned long long)pid && r->ipc_start == start &&
        r->ipc_serial == serial) {
      r->ipc_opens++;
      *out = r->va;
      return FK_OK;
    }
  }
  char path[64], want[96], name[128];
  snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)pid, their_fd);
  int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) return FK_INVALID_HANDLE;
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  snprintf(want, sizeof want, "/memfd:fake-ipc-%d-%llu (deleted)", (int)pid, serial);
  ssize_t n = readlink(path, name, sizeof name - 1);
  struct stat st;
  unsigned long long span = fk_round_up(size, fk_page());
  if (n <= 0 || (name[n] = 0, strcmp(name, want) != 0) || fstat(fd, &st) != 0 ||
      (unsigned long long)st.st_size != span || span < size) {
    close(fd);
    return FK_INVALID_HANDLE;
  }
  void *m = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  struct fk_region *r = m == MAP_FAILED ? NULL
                                        : fk_region_add(R_IPC, (unsigned long long)(uintptr_t)m,
                                                        size, device);
  if (!r) {
    if (m != MAP_FAILED) munmap(m, span);
    close(fd);
    return FK_OUT_OF_MEMORY;
  }
  r->ctx = ctx;
  r->span = span;
  r->ipc_fd1 = fd + 1;
  r->ipc_opens = 1;
  r->ipc_pid = (unsigned long long)pid;
  r->ipc_start = start;
  r->ipc_serial = serial;
  *out = r->va;
  return FK_OK;
}

/* Closes what fk_ipc_open returned at `va` (the mapping goes with its last open);
 * FK_INVALID_VALUE for any other pointer. */
FK_FN int fk_ipc_close(unsigned long long va, const char *what) {
  struct fk_region *r = fk_region_find(R_IPC, va);
  if (!r) return FK_INVALID_VALUE;
  if (--r->ipc_opens > 0) return FK_OK;
  fk_check_unused(r->va, r->size, what);
  munmap((void *)(uintptr_t)r->va, r->span);
  close(r->ipc_fd1 - 1);
  fk_region_drop(r);
  return FK_OK;
}

#endif /* FAKE_IPC_H */
