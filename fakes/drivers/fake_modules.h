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
 * launching device may use is a hazard (an illegal address on a GPU). A function without a
 * model uses no memory the fake knows of.
 */
#ifndef FAKE_MODULES_H
#define FAKE_MODULES_H

#define FK_MAX_MODULES 256
#define FK_MAX_NAMES 64
#define FK_MAX_FUNCTIONS 4096
#define FK_MAX_MODELS 256
#define FK_MAX_MODEL_ACCESSES 8
#define FK_MODULE_BASE 0xae0000000000ULL
#define FK_FUNCTION_BASE 0xbe0000000000ULL

struct fk_module {
  unsigned long long serial; /* 0: a free slot */
  int ctx, any_name, n_names;
  char names[FK_MAX_NAMES][64];
};
static struct fk_module fk_modules[FK_MAX_MODULES];
static unsigned long long fk_next_module = 1;

struct fk_function {
  unsigned long long serial; /* 0: a free slot */
  int module;
  char name[64];
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

/* ---- Modules ------------------------------------------------------------------------ */

/* The `.entry` names of PTX text into `m`; 0 when `text` is no PTX. */
FK_FN int fk_ptx_names(const char *text, struct fk_module *m) {
  if (!strstr(text, ".version") && !strstr(text, ".entry")) return 0;
  for (const char *at = strstr(text, ".entry"); at; at = strstr(at + 6, ".entry")) {
    const char *p = at + 6;
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
    size_t len = 0;
    while (p[len] && (p[len] == '_' || p[len] == '$' || (p[len] >= '0' && p[len] <= '9') ||
                      (p[len] >= 'a' && p[len] <= 'z') || (p[len] >= 'A' && p[len] <= 'Z')))
      len++;
    if (len && len < 64 && m->n_names < FK_MAX_NAMES) {
      memcpy(m->names[m->n_names], p, len);
      m->names[m->n_names][len] = 0;
      m->n_names++;
    }
  }
  return 1;
}

/* Loads a module for context `ctx` from `image`: its handle, or 0 with `*code` set
 * (FK_INVALID_VALUE for NULL, FK_INVALID_IMAGE for bytes that are no image). */
FK_FN unsigned long long fk_module_load(int ctx, const void *image, int *code) {
  *code = FK_INVALID_VALUE;
  if (!image) return 0;
  const unsigned char *b = (const unsigned char *)image;
  int slot = -1;
  for (int i = 0; i < FK_MAX_MODULES && slot < 0; i++)
    if (!fk_modules[i].serial) slot = i;
  *code = FK_OUT_OF_MEMORY;
  if (slot < 0) return 0;
  struct fk_module *m = &fk_modules[slot];
  memset(m, 0, sizeof *m);
  static const unsigned char fatbin[4] = {0x50, 0xed, 0x55, 0xba};
  if (!memcmp(b, "\x7f" "ELF", 4) || !memcmp(b, fatbin, 4) ||
      !memcmp(b, "__CLANG_OFFLOAD_BUNDLE__", 24)) {
    m->any_name = 1;
  } else if (!fk_ptx_names((const char *)image, m)) {
    *code = FK_INVALID_IMAGE;
    return 0;
  }
  m->serial = fk_next_module++;
  m->ctx = ctx;
  *code = FK_OK;
  return FK_MODULE_BASE + 16 * m->serial;
}

FK_FN int fk_module_of(unsigned long long handle) {
  for (int i = 0; i < FK_MAX_MODULES; i++)
    if (fk_modules[i].serial && FK_MODULE_BASE + 16 * fk_modules[i].serial == handle) return i;
  return -1;
}

/* Unloads a module: its functions are gone (launches already queued run on). */
FK_FN int fk_module_unload(unsigned long long handle) {
  int slot = fk_module_of(handle);
  if (slot < 0) return FK_INVALID_HANDLE;
  for (int i = 0; i < FK_MAX_FUNCTIONS; i++)
    if (fk_functions[i].serial && fk_functions[i].module == slot) fk_functions[i].serial = 0;
  fk_modules[slot].serial = 0;
  return FK_OK;
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
    f->serial = fk_next_function++;
    f->module = slot;
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

#endif /* FAKE_MODULES_H */
