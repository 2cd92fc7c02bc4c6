/*
 * fake_modules.h: modules, functions, kernel models and launches for both drivers (see
 * fake_core.h); and the census (fake_live), which counts what every concern holds.
 *
 * No code runs. A module is loaded from an image the fake recognises — an ELF object (a
 * cubin, an AMD GPU code object), a CUDA fatbin, a clang offload bundle, or PTX text —
 * and a function is looked up by name: in PTX text it must be one of the `.entry` names
 * (else not found), in a binary image any name is taken. A launch is a kernel queued on its
 * stream, in flight until a test finishes it (fake_finish, fake_finish_all) or a CPU wait
 * covers it, holding back the work after it on its stream.
 *
 * What a kernel reads and writes the fake cannot know: the test says it per function name,
 * once, as a kernel model (fake_kernel_model), which each launch applies to its own
 * parameters:
 *
 *   model   = access { " " access }        (spaces, commas or semicolons between)
 *   access  = mode ":" pointer ":" size
 *   mode    = "r" | "w" | "rw"
 *   pointer = "a" N [ "+" INT ]            parameter N (from 0), a device pointer
 *   size    = factor { "*" factor }
 *   factor  = INT | "i" N | "z" N          a constant, or parameter N as a 32-bit int or as a
 *                                          64-bit size
 *
 * e.g. "r:a0:4*i2 w:a1:4*i2" for `scale(const float *x, float *y, int n)`. Each range is
 * checked as the race detector checks copies; a range that is not device memory the
 * launching device may use — another device's without peer access to it enabled included —
 * is a hazard (an illegal address on a GPU). A function without a
 * model uses no memory the fake knows of.
 */
#ifndef FAKE_MODULES_H
#define FAKE_MODULES_H

#define FK_MAX_MODULES 256
#define FK_MAX_NAMES 64
#define FK_MAX_GLOBALS 64
#define FK_MAX_FUNCTIONS 4096
#define FK_MAX_MODELS 256
#define FK_MAX_MODEL_ACCESSES 8
#define FK_MAX_IMAGE (256ULL << 20) /* the most bytes of an image or file the fake reads */
#define FK_MAX_GLOBAL (1ULL << 30)  /* the largest global variable the fake allocates */
#define FK_MODULE_BASE 0xae0000000000ULL
#define FK_FUNCTION_BASE 0xbe0000000000ULL

/* What a function reports of itself (cuFuncGetAttribute, hipFuncGetAttributes): the fake
 * compiles nothing, so every function is a small kernel — no static shared, constant or local
 * memory, FK_FN_REGS registers a thread. */
#define FK_FN_REGS 32

struct fk_global {
  char name[64];
  unsigned long long va, size;
};

struct fk_module {
  unsigned long long serial; /* 0: a free slot */
  int ctx, any_name, n_names, n_globals;
  char names[FK_MAX_NAMES][64];
  struct fk_global globals[FK_MAX_GLOBALS];
};
static struct fk_module fk_modules[FK_MAX_MODULES];
static unsigned long long fk_next_module = 1;

struct fk_function {
  unsigned long long serial; /* 0: a free slot */
  int module;
  char name[64];
  /* Set by cuFuncSetAttribute / hipFuncSetAttribute (-1: the device's default) and
   * cuFuncSetCacheConfig / hipFuncSetCacheConfig. */
  int max_dynamic_shared, carveout, cache_config;
};
static struct fk_function fk_functions[FK_MAX_FUNCTIONS];
static unsigned long long fk_next_function = 1;

struct fk_factor {
  int kind; /* 0 constant, 'i' int32 parameter, 'z' 64-bit parameter */
  int arg;
  unsigned long long k;
};
struct fk_model_access {
  int mode, ptr_arg, n_factors;
  unsigned long long offset;
  struct fk_factor factors[4];
};
struct fk_model {
  char name[64];
  int n;
  struct fk_model_access access[FK_MAX_MODEL_ACCESSES];
};
static struct fk_model fk_models[FK_MAX_MODELS];
static int fk_n_models;

/* ---- Reading images -------------------------------------------------------------------- */

FK_FN int fk_ident_char(char c) {
  return c == '_' || c == '$' || c == '.' || (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') ||
         (c >= 'A' && c <= 'Z');
}

FK_FN void fk_module_add_name(struct fk_module *m, const char *name, size_t len) {
  if (!len || len >= 64 || m->n_names == FK_MAX_NAMES) return;
  for (int i = 0; i < m->n_names; i++)
    if (strlen(m->names[i]) == len && !memcmp(m->names[i], name, len)) return;
  memcpy(m->names[m->n_names], name, len);
  m->names[m->n_names][len] = 0;
  m->n_names++;
}

FK_FN void fk_module_add_global(struct fk_module *m, const char *name, size_t len,
                                unsigned long long size) {
  if (!len || len >= 64 || !size || m->n_globals == FK_MAX_GLOBALS) return;
  for (int i = 0; i < m->n_globals; i++)
    if (strlen(m->globals[i].name) == len && !memcmp(m->globals[i].name, name, len)) return;
  struct fk_global *g = &m->globals[m->n_globals++];
  memcpy(g->name, name, len);
  g->name[len] = 0;
  g->size = size;
  g->va = 0;
}

/* The size of a PTX fundamental type (.b8 ... .f64, .pred), 0 for one the fake does not know. */
FK_FN unsigned long long fk_ptx_type_size(const char *t, size_t len) {
  static const struct {
    const char *name;
    unsigned long long size;
  } types[] = {{".b8", 1},  {".u8", 1},  {".s8", 1},  {".b16", 2}, {".u16", 2}, {".s16", 2},
               {".f16", 2}, {".bf16", 2}, {".b32", 4}, {".u32", 4}, {".s32", 4}, {".f32", 4},
               {".b64", 8}, {".u64", 8}, {".s64", 8}, {".f64", 8}, {".pred", 1},
               {".f16x2", 4}, {".b128", 16}};
  for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
    if (strlen(types[i].name) == len && !memcmp(types[i].name, t, len)) return types[i].size;
  return 0;
}

/* The `.entry` names and the module-scope `.global` / `.const` variables of PTX text into `m`
 * (a variable's size: its type's times its array extents; initialisers are not read, a
 * variable starts zeroed). 1 for PTX, 0 for text that is no PTX (neither `.version` nor
 * `.entry` in it), -1 for PTX the driver would refuse (CUDA_ERROR_INVALID_PTX): no `.version`
 * or `.target` directive outside comments, or braces left open (a truncated text). Reads at
 * most FK_MAX_IMAGE bytes. */
FK_FN int fk_ptx_read(const char *text, struct fk_module *m) {
  size_t n = strnlen(text, (size_t)FK_MAX_IMAGE);
  if (!memmem(text, n, ".version", 8) && !memmem(text, n, ".entry", 6)) return 0;
  int version = 0, target = 0;
  int depth = 0; /* braces: a variable is module-scope at depth 0 */
  for (size_t i = 0; i < n; i++) {
    char c = text[i];
    if (c == '/' && i + 1 < n && text[i + 1] == '/') { /* a line comment */
      while (i < n && text[i] != '\n') i++;
      continue;
    }
    if (c == '"') { /* a string (a .file name, say): nothing in it is a directive */
      const char *end = memchr(text + i + 1, '"', n - i - 1);
      if (!end) return -1;
      i = (size_t)(end - text);
      continue;
    }
    if (c == '/' && i + 1 < n && text[i + 1] == '*') { /* a block comment */
      const char *end = memmem(text + i + 2, n - i - 2, "*/", 2);
      if (!end) return -1;
      i = (size_t)(end - text) + 1;
      continue;
    }
    if (c == '{') depth++;
    if (c == '}' && --depth < 0) return -1;
    if (c != '.' || (i > 0 && fk_ident_char(text[i - 1]))) continue;
    const char *at = text + i;
    if (!depth && !strncmp(at, ".version", 8) && !fk_ident_char(at[8])) version = 1;
    if (!depth && !strncmp(at, ".target", 7) && !fk_ident_char(at[7])) target = 1;
    if (!strncmp(at, ".entry", 6) && !fk_ident_char(at[6])) {
      const char *p = at + 6;
      while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
      size_t len = 0;
      while (p[len] && p[len] != '.' && fk_ident_char(p[len])) len++;
      fk_module_add_name(m, p, len);
      continue;
    }
    int is_global = !strncmp(at, ".global", 7) && !fk_ident_char(at[7]);
    int is_const = !strncmp(at, ".const", 6) && !fk_ident_char(at[6]);
    if (depth || (!is_global && !is_const)) continue;
    /* .global [.align N] .type name[a][b]... [= {...}] ; */
    const char *p = at + (is_global ? 7 : 6);
    unsigned long long size = 0;
    for (;;) {
      while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
      if (*p != '.') break;
      size_t len = 1;
      while (fk_ident_char(p[len]) && p[len] != '.') len++;
      if (len == 6 && !strncmp(p, ".align", 6)) {
        p += len;
        while (*p == ' ' || *p == '\t') p++;
        while (*p >= '0' && *p <= '9') p++;
        continue;
      }
      if (len == 2 && !strncmp(p, ".v", 2)) break;
      unsigned long long t = fk_ptx_type_size(p, len);
      if (len == 3 && (!strncmp(p, ".v2", 3) || !strncmp(p, ".v4", 3) || !strncmp(p, ".v8", 3))) {
        unsigned long long lanes = (unsigned long long)(p[2] - '0');
        p += len;
        while (*p == ' ' || *p == '\t') p++;
        size_t tl = 1;
        while (fk_ident_char(p[tl]) && p[tl] != '.') tl++;
        t = lanes * fk_ptx_type_size(p, tl);
        len = tl;
      }
      if (!t) break; /* .texref, .surfref, .samplerref, an unknown type: not a variable */
      size = t;
      p += len;
    }
    if (!size) continue;
    size_t len = 0;
    while (fk_ident_char(p[len]) && p[len] != '.') len++;
    const char *name = p;
    p += len;
    while (*p == '[') {
      char *end;
      unsigned long long extent = strtoull(p + 1, &end, 10);
      if (*end != ']' || !extent || size > FK_MAX_GLOBAL / extent) {
        size = 0;
        break;
      }
      size *= extent;
      p = end + 1;
    }
    if (size) fk_module_add_global(m, name, len, size);
  }
  return version && target && depth == 0 ? 1 : -1;
}

static unsigned long long fk_le(const unsigned char *p, int bytes) {
  unsigned long long v = 0;
  for (int i = bytes - 1; i >= 0; i--) v = v << 8 | p[i];
  return v;
}

/* Whether [p, p + n) can be read: what the fake reads of an image whose size it was not told
 * (cuModuleLoadData takes none) it checks first, so that an image whose headers point past its
 * end is refused instead of faulting. process_vm_readv of the process's own memory answers
 * EFAULT for a page that is unmapped or unreadable (PROT_NONE) without a signal; where it is
 * not allowed (a seccomp filter), mincore says at least whether each page is mapped. */
static int fk_readable(const void *p, unsigned long long n) {
  unsigned long long start = (unsigned long long)(uintptr_t)p, end = start + n;
  if (end < start) return 0;
  static char scratch[4096];
  for (unsigned long long at = start; at < end;) {
    size_t chunk = (size_t)(end - at < sizeof scratch ? end - at : sizeof scratch);
    struct iovec local = {scratch, chunk}, remote = {(void *)(uintptr_t)at, chunk};
    ssize_t got = process_vm_readv(getpid(), &local, 1, &remote, 1, 0);
    if (got > 0) {
      at += (unsigned long long)got;
      continue;
    }
    if (got < 0 && errno == EFAULT) return 0;
    /* Not allowed here: whether the pages are mapped, at least. */
    unsigned long long page = fk_page();
    unsigned char resident;
    for (unsigned long long q = at / page * page; q < end; q += page)
      if (mincore((void *)(uintptr_t)q, page, &resident) != 0) return 0;
    return 1;
  }
  return 1;
}

/* An ELF machine: EM_CUDA for CUDA's face, EM_AMDGPU for HIP's. */
#define FK_EM_CUDA 190
#define FK_EM_AMDGPU 224

/* The symbols of a 64-bit little-endian ELF object at `b`, of at most `limit` bytes, into
 * `m`: functions (STT_FUNC, and AMD's STT_AMDGPU_HSA_KERNEL) as names, objects (STT_OBJECT,
 * sized) as globals; local symbols are skipped.
 *   1   read (a symbol table, or none: an object with no section headers);
 *   0   no 64-bit little-endian ELF object (a stand-in: the magic bytes and little else);
 *   FK_NO_BINARY_FOR_GPU   an object for another machine than `machine`;
 *   -1  headers that point past `limit` or at memory that is not there (a corrupt image). */
FK_FN int fk_elf_read(const unsigned char *b, unsigned long long limit, int machine,
                      struct fk_module *m) {
  if (limit < 64) return 0;
  if (!fk_readable(b, 64)) return -1;
  if (memcmp(b, "\x7f" "ELF", 4) || b[4] != 2 /* 64-bit */ || b[5] != 1 /* LE */) return 0;
  if ((int)fk_le(b + 0x12, 2) != machine) return FK_NO_BINARY_FOR_GPU;
  unsigned long long shoff = fk_le(b + 0x28, 8), shentsize = fk_le(b + 0x3a, 2),
                     shnum = fk_le(b + 0x3c, 2);
  if (!shnum) return 1;
  if (shentsize < 64 || shoff > limit || shnum * shentsize > limit - shoff ||
      !fk_readable(b + shoff, shnum * shentsize))
    return -1;
  for (unsigned long long i = 0; i < shnum; i++) {
    const unsigned char *sh = b + shoff + i * shentsize;
    if (fk_le(sh + 4, 4) != 2 /* SHT_SYMTAB */) continue;
    unsigned long long off = fk_le(sh + 0x18, 8), size = fk_le(sh + 0x20, 8),
                       link = fk_le(sh + 0x28, 4), entsize = fk_le(sh + 0x38, 8);
    if (entsize < 24 || off > limit || size > limit - off || link >= shnum ||
        !fk_readable(b + off, size))
      return -1;
    const unsigned char *strsh = b + shoff + link * shentsize;
    unsigned long long str_off = fk_le(strsh + 0x18, 8), str_size = fk_le(strsh + 0x20, 8);
    if (str_off > limit || str_size > limit - str_off || !fk_readable(b + str_off, str_size))
      return -1;
    const char *strings = (const char *)b + str_off;
    for (unsigned long long at = 0; at + entsize <= size; at += entsize) {
      const unsigned char *sym = b + off + at;
      unsigned long long name = fk_le(sym, 4);
      int type = sym[4] & 0xf, bind = sym[4] >> 4;
      unsigned long long sym_size = fk_le(sym + 16, 8);
      if (bind == 0 /* STB_LOCAL */ || name >= str_size) continue;
      size_t len = strnlen(strings + name, (size_t)(str_size - name));
      if (len == str_size - name) continue; /* not terminated inside the table */
      if (type == 2 /* STT_FUNC */ || type == 10 /* STT_AMDGPU_HSA_KERNEL */)
        fk_module_add_name(m, strings + name, len);
      else if (type == 1 /* STT_OBJECT */ && sym_size && sym_size <= FK_MAX_GLOBAL)
        fk_module_add_global(m, strings + name, len, sym_size);
    }
  }
  return 1;
}

/* The ELF objects for `machine` inside a CUDA fatbin (header: magic, version, header size,
 * size of what follows; its entries found by the ELF magic at 8-byte boundaries, compressed
 * ones not read) or a clang offload bundle (entries of offset, size and target; the `amdgcn`
 * ones read), of at most `limit` bytes: how many were read, FK_NO_BINARY_FOR_GPU when there
 * was none for the machine, -1 for a container whose headers point past its end. */
FK_FN int fk_container_read(const unsigned char *b, unsigned long long limit, int machine,
                            struct fk_module *m) {
  static const unsigned char fatbin[4] = {0x50, 0xed, 0x55, 0xba};
  int read = 0;
  if (!memcmp(b, fatbin, 4)) {
    if (limit < 16 || !fk_readable(b, 16)) return -1;
    unsigned long long header = fk_le(b + 6, 2), size = fk_le(b + 8, 8);
    if (header < 16 || header > limit || size > limit - header || !fk_readable(b, header + size))
      return -1;
    unsigned long long end = header + size;
    int foreign = 0;
    for (unsigned long long at = header; at + 64 <= end; at += 8) {
      if (memcmp(b + at, "\x7f" "ELF", 4)) continue;
      int rc = fk_elf_read(b + at, end - at, machine, m);
      if (rc < 0) return -1;
      read += rc == 1;
      foreign += rc == FK_NO_BINARY_FOR_GPU;
    }
    /* "A collection of different cubin and/or PTX files" (cuModuleLoadFatBinary): one of PTX
     * or compressed entries only is a stand-in for the fake (any function name). */
    return read ? read : foreign ? FK_NO_BINARY_FOR_GPU : 0;
  }
  if (limit < 32 || !fk_readable(b, 32)) return -1;
  unsigned long long n = fk_le(b + 24, 8), at = 32;
  int entries = 0;
  if (n > 64) return -1;
  for (unsigned long long i = 0; i < n; i++) {
    if (at + 24 > limit || !fk_readable(b + at, 24)) return -1;
    unsigned long long off = fk_le(b + at, 8), size = fk_le(b + at + 8, 8),
                       id = fk_le(b + at + 16, 8);
    if (id > 4096 || at + 24 + id > limit || !fk_readable(b + at + 24, id)) return -1;
    if (off > limit || size > limit - off || !fk_readable(b + off, size)) return -1;
    int amdgcn = memmem(b + at + 24, (size_t)id, "amdgcn", 6) != NULL;
    at += 24 + id;
    if (!amdgcn) continue;
    entries++;
    if (size < 64) continue;
    int rc = fk_elf_read(b + off, size, machine, m);
    if (rc < 0) return -1;
    read += rc == 1;
  }
  /* No amdgcn entry: no code for the device (clr: hipErrorNoBinaryForGpu); entries the fake
   * cannot read are a stand-in. */
  return read ? read : entries ? 0 : FK_NO_BINARY_FOR_GPU;
}

/* ---- Modules ------------------------------------------------------------------------ */

/* Gives back the memory of module `slot`'s globals. */
FK_FN void fk_module_globals_free(int slot) {
  struct fk_module *m = &fk_modules[slot];
  for (int i = 0; i < m->n_globals; i++) {
    struct fk_global *g = &m->globals[i];
    struct fk_region *r = g->va ? fk_region_find(R_MODULE, g->va) : NULL;
    if (r) {
      fk_check_unused(r->va, r->size, "a module's unload");
      munmap((void *)(uintptr_t)r->va, r->span);
      fk_uncharge(r->device, r->charge);
      fk_region_drop(r);
    }
    g->va = 0;
  }
}

/* Device memory for module `slot`'s globals, charged to its context's device and zeroed. */
FK_FN int fk_module_globals_alloc(int slot) {
  struct fk_module *m = &fk_modules[slot];
  int device = fk_ctxs[m->ctx].device;
  for (int i = 0; i < m->n_globals; i++) {
    struct fk_global *g = &m->globals[i];
    unsigned long long charge = fk_round_up(g->size, 256), span = fk_round_up(g->size, fk_page());
    if (!fk_charge(device, charge)) {
      fk_module_globals_free(slot);
      return FK_OUT_OF_MEMORY;
    }
    void *p = fk_map_anonymous(span);
    struct fk_region *r =
        p ? fk_region_add(R_MODULE, (unsigned long long)(uintptr_t)p, g->size, device) : NULL;
    if (!r) {
      if (p) munmap(p, span);
      fk_uncharge(device, charge);
      fk_module_globals_free(slot);
      return FK_OUT_OF_MEMORY;
    }
    r->ctx = m->ctx;
    r->pool = slot;
    r->charge = charge;
    r->span = span;
    g->va = r->va;
  }
  return FK_OK;
}

/* Loads a module for context `ctx` from `image` (of `size` bytes; 0: not told, at most
 * FK_MAX_IMAGE are read): its handle, or 0 with `*code` set. PTX text (`ptx`: the CUDA face)
 * names its kernels (`.entry`) and globals; an ELF object for `machine`, a fatbin or an
 * offload bundle name them in their symbol tables; a binary image with nothing the fake can
 * read there (a stand-in: the magic bytes and little else) takes any function name and has no
 * globals. Refused: FK_INVALID_VALUE (NULL), FK_INVALID_PTX (PTX the driver would not take;
 * under HIP anything that is no code object: hipErrorInvalidKernelFile), FK_INVALID_IMAGE
 * (bytes that are no image, or whose headers point past its end), FK_NO_BINARY_FOR_GPU (code
 * for another machine), FK_OUT_OF_MEMORY (its globals do not fit). */
FK_FN unsigned long long fk_module_load(int ctx, const void *image, unsigned long long size,
                                        int machine, int ptx, int *code) {
  *code = FK_INVALID_VALUE;
  if (!image) return 0;
  const unsigned char *b = (const unsigned char *)image;
  unsigned long long limit = size && size < FK_MAX_IMAGE ? size : FK_MAX_IMAGE;
  int slot = -1;
  for (int i = 0; i < FK_MAX_MODULES && slot < 0; i++)
    if (!fk_modules[i].serial) slot = i;
  *code = FK_OUT_OF_MEMORY;
  if (slot < 0) return 0;
  struct fk_module *m = &fk_modules[slot];
  memset(m, 0, sizeof *m);
  static const unsigned char fatbin[4] = {0x50, 0xed, 0x55, 0xba};
  int magic = (limit >= 4 && !memcmp(b, "\x7f" "ELF", 4)) ? 1
              : (limit >= 4 && !memcmp(b, fatbin, 4) && machine == FK_EM_CUDA) ? 2
              : (limit >= 24 && !memcmp(b, "__CLANG_OFFLOAD_BUNDLE__", 24) && machine == FK_EM_AMDGPU)
                  ? 2
              /* a compressed offload bundle (clr takes it; the fake reads none of it) */
              : (limit >= 4 && !memcmp(b, "CCOB", 4) && machine == FK_EM_AMDGPU) ? 3
                                                                                  : 0;
  int rc;
  if (magic == 1) {
    /* The object's size is not passed: its section headers say where it ends. */
    rc = fk_elf_read(b, limit, machine, m);
    m->any_name = rc == 0 || !m->n_names;
  } else if (magic == 2) {
    rc = fk_container_read(b, limit, machine, m);
    m->any_name = !m->n_names;
  } else if (magic == 3) {
    rc = 1;
    m->any_name = 1;
  } else {
    rc = ptx ? fk_ptx_read((const char *)image, m) : 0;
    if (rc == 0) {
      *code = ptx ? FK_INVALID_IMAGE : FK_INVALID_PTX;
      return 0;
    }
    if (rc < 0) rc = FK_INVALID_PTX;
  }
  if (rc < 0 || rc == FK_NO_BINARY_FOR_GPU || rc == FK_INVALID_PTX) {
    *code = rc == FK_NO_BINARY_FOR_GPU || rc == FK_INVALID_PTX ? rc : FK_INVALID_IMAGE;
    return 0;
  }
  m->serial = fk_next_module++;
  m->ctx = ctx;
  *code = fk_module_globals_alloc(slot);
  if (*code != FK_OK) {
    m->serial = 0;
    return 0;
  }
  return FK_MODULE_BASE + 16 * m->serial;
}

/* The bytes of file `path` (NUL-terminated, at most FK_MAX_IMAGE; `*size` of them): a
 * malloc'd buffer the caller frees, or NULL with `*code` FK_NOT_FOUND (no such file) or
 * FK_OUT_OF_MEMORY. */
FK_FN char *fk_read_file(const char *path, unsigned long long *size, int *code) {
  FILE *f = fopen(path, "rb");
  *code = FK_NOT_FOUND;
  if (!f) return NULL;
  *code = FK_OUT_OF_MEMORY;
  char *bytes = NULL;
  size_t n = 0, cap = 0;
  for (;;) {
    if (n + 4097 > cap) {
      cap = cap ? cap * 2 : 65536;
      char *grown = cap > FK_MAX_IMAGE + 65536 ? NULL : realloc(bytes, cap);
      if (!grown) {
        free(bytes);
        fclose(f);
        return NULL;
      }
      bytes = grown;
    }
    size_t got = fread(bytes + n, 1, 4096, f);
    n += got;
    if (got < 4096) break;
  }
  fclose(f);
  bytes[n] = 0;
  *size = n;
  *code = FK_OK;
  return bytes;
}

FK_FN int fk_module_of(unsigned long long handle) {
  for (int i = 0; i < FK_MAX_MODULES; i++)
    if (fk_modules[i].serial && FK_MODULE_BASE + 16 * fk_modules[i].serial == handle) return i;
  return -1;
}

/* Unloads a module: its functions and globals are gone (launches already queued run on; one
 * still using a global is a hazard). */
FK_FN int fk_module_unload(unsigned long long handle) {
  int slot = fk_module_of(handle);
  if (slot < 0) return FK_INVALID_HANDLE;
  for (int i = 0; i < FK_MAX_FUNCTIONS; i++)
    if (fk_functions[i].serial && fk_functions[i].module == slot) fk_functions[i].serial = 0;
  fk_module_globals_free(slot);
  fk_modules[slot].serial = 0;
  return FK_OK;
}

/* Global `name` of module `handle`: FK_OK with its address and size, FK_INVALID_HANDLE for
 * no such module, FK_NOT_FOUND for no such global. */
FK_FN int fk_module_global(unsigned long long handle, const char *name, unsigned long long *va,
                           unsigned long long *size) {
  int slot = fk_module_of(handle);
  if (slot < 0) return FK_INVALID_HANDLE;
  const struct fk_module *m = &fk_modules[slot];
  for (int i = 0; i < m->n_globals; i++)
    if (!strcmp(m->globals[i].name, name)) {
      *va = m->globals[i].va;
      *size = m->globals[i].size;
      return FK_OK;
    }
  return FK_NOT_FOUND;
}

/* Function `name` of module `handle`: its handle, or 0 with `*code` set. */
FK_FN unsigned long long fk_function_get(unsigned long long handle, const char *name, int *code) {
  int slot = fk_module_of(handle);
  *code = FK_INVALID_HANDLE;
  if (slot < 0) return 0;
  *code = FK_INVALID_VALUE;
  if (!name || !name[0] || strlen(name) >= 64) return 0;
  struct fk_module *m = &fk_modules[slot];
  int found = m->any_name;
  for (int i = 0; i < m->n_names && !found; i++) found = !strcmp(m->names[i], name);
  *code = FK_NOT_FOUND;
  if (!found) return 0;
  for (int i = 0; i < FK_MAX_FUNCTIONS; i++)
    if (fk_functions[i].serial && fk_functions[i].module == slot &&
        !strcmp(fk_functions[i].name, name)) {
      *code = FK_OK;
      return FK_FUNCTION_BASE + 16 * fk_functions[i].serial;
    }
  for (int i = 0; i < FK_MAX_FUNCTIONS; i++) {
    struct fk_function *f = &fk_functions[i];
    if (f->serial) continue;
    memset(f, 0, sizeof *f);
    f->serial = fk_next_function++;
    f->module = slot;
    f->max_dynamic_shared = -1;
    f->carveout = -1;
    snprintf(f->name, sizeof f->name, "%s", name);
    *code = FK_OK;
    return FK_FUNCTION_BASE + 16 * f->serial;
  }
  *code = FK_OUT_OF_MEMORY;
  return 0;
}

FK_FN struct fk_function *fk_function_of(unsigned long long handle) {
  if (handle <= FK_FUNCTION_BASE || (handle - FK_FUNCTION_BASE) % 16) return NULL;
  unsigned long long serial = (handle - FK_FUNCTION_BASE) / 16;
  for (int i = 0; i < FK_MAX_FUNCTIONS; i++)
    if (fk_functions[i].serial == serial) return &fk_functions[i];
  return NULL;
}

/* ---- Occupancy ------------------------------------------------------------------------ */

/* What a multiprocessor (a compute unit) holds, from the device's attributes. */
struct fk_sm_limits {
  int warp, max_threads_per_block, max_threads, max_blocks, regs, shared, sms;
  unsigned long long max_dynamic; /* the function's dynamic shared memory limit */
};

/* Blocks of `block` threads, each with `dynamic` bytes of dynamic shared memory, that one
 * multiprocessor runs at once: the fewest its threads, blocks, registers (FK_FN_REGS a
 * thread, whole warps) and shared memory allow. 0 for a block the function cannot run (too
 * many threads, more dynamic shared memory than its limit). As the
 * vendors' occupancy calculators, without their allocation granularities. */
FK_FN int fk_blocks_per_sm(const struct fk_sm_limits *l, int block, unsigned long long dynamic) {
  if (block <= 0 || block > l->max_threads_per_block || l->warp <= 0 || dynamic > l->max_dynamic)
    return 0;
  long long threads = (long long)((block + l->warp - 1) / l->warp) * l->warp;
  long long n = l->max_threads / threads;
  if (n > l->max_blocks) n = l->max_blocks;
  long long by_regs = l->regs / (threads * FK_FN_REGS);
  if (by_regs < n) n = by_regs;
  if (dynamic) {
    long long by_shared = (long long)((unsigned long long)l->shared / dynamic);
    if (by_shared < n) n = by_shared;
  }
  return n < 0 ? 0 : (int)n;
}

/* The block size that keeps the most threads of a multiprocessor busy (the largest among
 * equals), at most `limit` threads (0: the device's most), with `dynamic(block)` bytes of
 * dynamic shared memory a block (NULL: `fixed`); and the grid that fills every
 * multiprocessor with it. */
FK_FN void fk_best_block(const struct fk_sm_limits *l, int limit,
                         unsigned long long (*dynamic)(int), unsigned long long fixed,
                         int *grid, int *block) {
  int best = 0, best_blocks = 0;
  long long best_threads = 0;
  if (limit <= 0 || limit > l->max_threads_per_block) limit = l->max_threads_per_block;
  for (int b = limit; b > 0; b -= (b % l->warp) ? b % l->warp : l->warp) {
    int n = fk_blocks_per_sm(l, b, dynamic ? dynamic(b) : fixed);
    if ((long long)n * b > best_threads) {
      best_threads = (long long)n * b;
      best = b;
      best_blocks = n;
    }
  }
  *block = best;
  *grid = best_blocks * l->sms;
}

/* ---- Kernel models -------------------------------------------------------------------- */

FK_FN int fk_parse_uint(const char **s, unsigned long long *out) {
  const char *p = *s;
  if (*p < '0' || *p > '9') return 0;
  char *end;
  errno = 0;
  *out = strtoull(p, &end, 0);
  if (errno || end == p) return 0;
  *s = end;
  return 1;
}

/* Parses `text` into `m`; 0, or the 1-based position of the first character it could not
 * read. */
FK_FN int fk_parse_model(const char *text, struct fk_model *m) {
  const char *s = text;
  m->n = 0;
  for (;;) {
    while (*s == ' ' || *s == ',' || *s == ';' || *s == '\t' || *s == '\n') s++;
    if (!*s) return 0;
    if (m->n == FK_MAX_MODEL_ACCESSES) return (int)(s - text) + 1;
    struct fk_model_access *a = &m->access[m->n];
    memset(a, 0, sizeof *a);
    if (!strncmp(s, "rw:", 3)) {
      a->mode = FK_READ | FK_WRITE;
      s += 3;
    } else if (!strncmp(s, "r:", 2)) {
      a->mode = FK_READ;
      s += 2;
    } else if (!strncmp(s, "w:", 2)) {
      a->mode = FK_WRITE;
      s += 2;
    } else {
      return (int)(s - text) + 1;
    }
    unsigned long long n;
    if (*s != 'a') return (int)(s - text) + 1;
    s++;
    if (!fk_parse_uint(&s, &n) || n > 63) return (int)(s - text) + 1;
    a->ptr_arg = (int)n;
    if (*s == '+') {
      s++;
      if (!fk_parse_uint(&s, &a->offset)) return (int)(s - text) + 1;
    }
    if (*s != ':') return (int)(s - text) + 1;
    s++;
    for (;;) {
      if (a->n_factors == 4) return (int)(s - text) + 1;
      struct fk_factor *f = &a->factors[a->n_factors];
      if (*s == 'i' || *s == 'z') {
        f->kind = *s;
        s++;
        if (!fk_parse_uint(&s, &n) || n > 63) return (int)(s - text) + 1;
        f->arg = (int)n;
      } else if (!fk_parse_uint(&s, &f->k)) {
        return (int)(s - text) + 1;
      }
      a->n_factors++;
      if (*s != '*') break;
      s++;
    }
    if (*s && *s != ' ' && *s != ',' && *s != ';' && *s != '\t' && *s != '\n')
      return (int)(s - text) + 1;
    m->n++;
  }
}

FK_FN const struct fk_model *fk_model_of(const char *name) {
  for (int i = 0; i < fk_n_models; i++)
    if (!strcmp(fk_models[i].name, name)) return &fk_models[i];
  return NULL;
}

/* Says what kernel `name` reads and writes (the grammar above; an empty model: nothing);
 * replaces an earlier model of the name. 0, or the 1-based position of the first character
 * of `model` that could not be read; -1 for a name of no or 64+ characters, -2 when 256
 * models are registered already. */
FAKE_EXPORT int fake_kernel_model(const char *name, const char *model) {
  if (!name || !name[0] || strlen(name) >= 64 || !model) return -1;
  struct fk_model parsed;
  int bad = fk_parse_model(model, &parsed);
  if (bad) return bad;
  snprintf(parsed.name, sizeof parsed.name, "%s", name);
  int rc = 0;
  LOCKED({
    int i;
    for (i = 0; i < fk_n_models; i++)
      if (!strcmp(fk_models[i].name, name)) break;
    if (i == fk_n_models) {
      if (fk_n_models == FK_MAX_MODELS)
        rc = -2;
      else
        fk_n_models++;
    }
    if (!rc) fk_models[i] = parsed;
  });
  return rc;
}

/* The value of a factor from the launch's parameters; 0 when it cannot be read. */
FK_FN unsigned long long fk_factor_value(const struct fk_factor *f, void **params, int *ok) {
  if (f->kind == 0) return f->k;
  if (!params || !params[f->arg]) {
    *ok = 0;
    return 0;
  }
  if (f->kind == 'i') {
    int v;
    memcpy(&v, params[f->arg], sizeof v);
    return v < 0 ? 0 : (unsigned long long)v;
  }
  unsigned long long v;
  memcpy(&v, params[f->arg], sizeof v);
  return v;
}

/* ---- Launches ------------------------------------------------------------------------- */

/* Queues kernel `name` of context `ctx` on `clock` with parameters `params` (an array of
 * pointers to each parameter, as cuLaunchKernel takes them; NULL: none); its model's ranges
 * are used while it is in flight. Answers the kernel's id (0: no room). */
FK_FN unsigned long long fk_launch(int ctx, int clock, const char *name, void **params) {
  unsigned long long seq = fk_queue(clock);
  unsigned long long id = fk_task_new(clock, seq, "kernel", 0, NULL, NULL);
  if (!id) {
    fk_progress();
    return 0;
  }
  struct fk_task *t = fk_task_of(id);
  snprintf(t->name, sizeof t->name, "kernel %llu (%.60s)", id, name);
  fk_t_last_kernel = id;
  const struct fk_model *m = fk_model_of(name);
  int device = fk_ctxs[ctx].device;
  for (int i = 0; m && i < m->n; i++) {
    const struct fk_model_access *a = &m->access[i];
    int ok = 1;
    unsigned long long ptr = 0, size = 1;
    if (params && params[a->ptr_arg])
      memcpy(&ptr, params[a->ptr_arg], sizeof ptr);
    else
      ok = 0;
    for (int k = 0; k < a->n_factors; k++) size *= fk_factor_value(&a->factors[k], params, &ok);
    ptr += a->offset;
    char name_of_clock[96];
    if (!ok) {
      fk_hazard("%s on %s: its model reads parameter %d, which the launch did not pass",
                t->name, fk_clock_name(clock, name_of_clock, sizeof name_of_clock), a->ptr_arg);
      continue;
    }
    if (!size) continue;
    if (!fk_device_range(ptr, size, device)) {
      fk_hazard("%s on %s %s [%#llx, %#llx), which is no device memory device %d may use (an "
                "illegal address on a GPU)",
                t->name, fk_clock_name(clock, name_of_clock, sizeof name_of_clock),
                fk_verb(a->mode), ptr, ptr + size, device);
      continue;
    }
    /* Another device's memory (not managed, not a mapping, whose access is checked above) is
     * reachable from a kernel only once peer access to that device is enabled. */
    const struct fk_region *owner = fk_region_holding(ptr);
    if (owner && owner->kind != R_MANAGED && owner->kind != R_MAPPING && owner->device != device &&
        !fk_peer_on[device][owner->device]) {
      fk_hazard("%s on %s %s [%#llx, %#llx), device %d's memory, without peer access from device "
                "%d to it (an illegal address on a GPU)",
                t->name, fk_clock_name(clock, name_of_clock, sizeof name_of_clock),
                fk_verb(a->mode), ptr, ptr + size, owner->device, device);
      continue;
    }
    fk_use(clock, seq, ptr, size, a->mode, t->name);
  }
  fk_progress();
  return id;
}

/* A host function on `clock`: it runs when the stream reaches it (under the driver's lock,
 * refusing driver calls, as the vendors forbid them). */
FK_FN unsigned long long fk_launch_host(int clock, void (*fn)(void *), void *data) {
  unsigned long long seq = fk_queue(clock);
  unsigned long long id = fk_task_new(clock, seq, "host function", 1, fn, data);
  fk_progress();
  return id;
}

/* ---- The census ----------------------------------------------------------------------- */

/* The face's count of contexts (CUDA: primary retains and created contexts; HIP: -1). */
static long long fk_face_contexts(void);

static const char *const fk_live_names[] = {
    "allocations", "pool_allocations", "pool_reserved", "pools",   "handles",
    "mappings",    "reservations",     "streams",       "events",  "bytes",
    "contexts",    "host_allocations", "modules",       "in_flight",
};

FK_FN long long fk_live_of(int what) {
  long long n = 0;
  switch (what) {
    case 0:
    case 1:
    case 5:
    case 6:
    case 11:
      for (int i = 0; i < fk_regions_high; i++) {
        const struct fk_region *r = &fk_regions[i];
        if (what == 0) n += r->kind == R_PLAIN || r->kind == R_MANAGED;
        if (what == 1) n += r->kind == R_POOL && r->in_use;
        if (what == 5) n += r->kind == R_MAPPING;
        if (what == 6) n += r->kind == R_RESERVATION;
        if (what == 11) n += r->kind == R_HOST || r->kind == R_REGISTERED;
      }
      return n;
    case 2:
      for (int p = 0; p < FK_MAX_POOLS; p++)
        if (fk_pools[p].serial) n += (long long)fk_pools[p].stats.reserved;
      return n;
    case 3:
      for (int p = 0; p < FK_MAX_POOLS; p++)
        n += fk_pools[p].serial && !fk_pools[p].destroyed && !fk_pools[p].is_default;
      return n;
    case 4:
      for (int i = 0; i < fk_phys_high; i++) n += fk_phys[i].serial != 0;
      return n;
    case 7:
      for (int i = 0; i < fk_streams_high; i++) n += fk_streams[i].live;
      return n;
    case 8:
      for (int i = 0; i < FK_MAX_EVENTS; i++) n += fk_events[i].serial != 0;
      return n;
    case 9:
      for (int d = 0; d < FK_MAX_DEVICES; d++) n += (long long)fk_devices[d].used;
      return n;
    case 10:
      return fk_face_contexts();
    case 12:
      for (int i = 0; i < FK_MAX_MODULES; i++) n += fk_modules[i].serial != 0;
      return n;
    case 13:
      n = fk_n_active;
      for (int i = 0; i < fk_n_effects; i++) n += fk_effects[i].kind != EF_NONE;
      return n;
  }
  return -1;
}

/* A live count, one vocabulary in both drivers (-1 for a name neither knows):
 *   allocations       plain and managed device allocations
 *   pool_allocations  live allocations from stream-ordered pools
 *   pool_reserved     bytes the pools hold (in use or cached), default pools included
 *   pools             created pools (default pools are not counted)
 *   handles           physical memory handles, released-but-still-mapped (or held) ones too
 *   mappings          mappings of handles into reserved ranges
 *   reservations      reserved virtual address ranges
 *   streams           created streams
 *   events            created events
 *   bytes             device memory charged, all devices together
 *   contexts          CUDA: primary-context retains and created contexts; HIP: -1
 *   host_allocations  pinned host memory not freed, and host memory still registered
 *   modules           loaded modules
 *   in_flight         kernels, host functions, copies and memsets not complete */
FAKE_EXPORT long long fake_live(const char *what) {
  long long n = -1;
  LOCKED({
    for (int w = 0; what && w < (int)(sizeof fk_live_names / sizeof fk_live_names[0]); w++)
      if (!strcmp(fk_live_names[w], what)) n = fk_live_of(w);
  });
  return n;
}

/* Whether the mapping holding `va` grants `device` access (1, 0), -1 when none holds it. */
FAKE_EXPORT int fake_access(unsigned long long va, int device) {
  int granted = -1;
  LOCKED(granted = fk_access_of(va, device));
  return granted;
}

FK_FN void fk_modules_reset(void) {
  memset(fk_modules, 0, sizeof fk_modules);
  memset(fk_functions, 0, sizeof fk_functions);
}

/* ---- A context torn down (cuCtxDestroy, cuDevicePrimaryCtxReset, hipDeviceReset) -------- */

/* Completes the work of context `c` (the driver waits for it), then destroys its streams,
 * events and modules and frees its device memory (plain, managed, and the pools' blocks on
 * its device when `pools`: every pool emptied, the created ones destroyed). */
FK_FN void fk_ctx_clear(int c, int pools, const char *what) {
  for (int k = 1; k < fk_n_clocks; k++)
    if (fk_clocks[k].ctx == c) fk_force(k, ~0ULL, 0);
  for (int i = 0; i < fk_streams_high; i++)
    if (fk_streams[i].live && fk_streams[i].ctx == c) fk_stream_destroy(i);
  for (int i = 0; i < FK_MAX_EVENTS; i++)
    if (fk_events[i].serial && fk_events[i].ctx == c) fk_events[i].serial = 0;
  for (int i = 0; i < FK_MAX_MODULES; i++)
    if (fk_modules[i].serial && fk_modules[i].ctx == c)
      fk_module_unload(FK_MODULE_BASE + 16 * fk_modules[i].serial);
  for (int i = 0; i < fk_regions_high; i++) {
    struct fk_region *r = &fk_regions[i];
    if ((r->kind == R_PLAIN || r->kind == R_MANAGED) && r->ctx == c) fk_free(r->va, what);
  }
  if (!pools) return;
  int device = fk_ctxs[c].device;
  for (int p = 0; p < FK_MAX_POOLS; p++) {
    struct fk_pool *x = &fk_pools[p];
    if (!x->serial || x->device != device) continue;
    for (int i = 0; i < fk_regions_high; i++) {
      struct fk_region *b = &fk_regions[i];
      if (b->kind != R_POOL || b->pool != p) continue;
      if (b->in_use) x->stats.used -= b->size;
      b->in_use = 0;
      b->free_clock = 0;
      b->free_seq = 0;
      fk_pool_give_back(x, b);
    }
    if (!x->is_default) x->serial = 0;
  }
  fk_current_pool[device] = 0;
}

#endif /* FAKE_MODULES_H */
