/*
 * fake_timeline.h: streams, events, GPU-side waits, work in flight, CPU waits and the race
 * detector, for both drivers (see fake_core.h for the layout).
 *
 * Every stream is a clock of operations that complete in order. An operation completes
 * once nothing before it on its clock holds it back: a kernel or host function still in
 * flight, or a GPU-side wait for an operation of another clock that has not completed;
 * while the driver is held (fakecuda_hold_events / fakehip_hold_events) nothing completes
 * but what a CPU wait forces. A CPU wait (a stream, event, context or device
 * synchronisation, and the calls the vendors document as synchronising) completes what it
 * waits for, kernels included, and is counted.
 *
 * The vendors' stream rules (CUDA "Stream synchronization behavior"; HIP the same):
 *   - each context (HIP: device) has a legacy default stream (the handles NULL and 0x1):
 *     an operation queued on it first waits for all work queued so far on the context's
 *     blocking streams, and an operation queued on a blocking stream first waits for the
 *     work queued so far on the legacy stream. These implicit waits are GPU-side waits like
 *     any other, so the race detector sees the order they give;
 *   - a stream made with the non-blocking flag (CU_STREAM_NON_BLOCKING, hipStreamNonBlocking)
 *     takes no part in it: a NULL-stream synchronisation does not complete its work;
 *   - the per-thread default stream (the handle 0x2, and NULL in the _ptsz/_ptds calls) is a
 *     blocking stream of the calling thread's own, one per thread and context;
 *   - a destroyed stream's work still completes, and its handle value is handed to the next
 *     stream made, as the drivers' allocators do; events keep naming its clock, which is
 *     never reused.
 *
 * The race detector: every kernel, copy and memset records the ranges it reads and writes
 * while it is in flight. Queueing one that writes a range another in-flight operation of
 * another stream reads or writes (or reads a range one writes), and is not ordered after it
 * (stream order, events and GPU-side waits, the legacy stream's implicit waits, or
 * completion), is a hazard naming both operations, their streams and ranges. So is giving
 * memory back (free, unmap, a pool's trim) while an operation in flight uses it, and
 * handing memory out (a pool's allocation, a mapping) under one not ordered before the
 * stream that receives it.
 */
#ifndef FAKE_TIMELINE_H
#define FAKE_TIMELINE_H

#define FK_MAX_CLOCKS 65536
#define FK_MAX_TASKS 65536
#define FK_MAX_WAITS 65536
#define FK_MAX_ACCESSES 65536
#define FK_MAX_EFFECTS 65536
#define FK_MAX_STREAMS 65536
#define FK_MAX_EVENTS 65536

#define FK_READ 1
#define FK_WRITE 2

enum { CK_LEGACY = 1, CK_PER_THREAD, CK_STREAM };

struct fk_clock {
  unsigned long long recorded, completed;
  int ctx, kind, blocking, retired;
  unsigned long long handle; /* CK_STREAM: the handle callers use */
  int thread;                /* CK_PER_THREAD: the thread's number */
  /* Stream capture (fake_graphs.h): the capture it records into (its slot + 1; 0: none),
   * and, for a stream that joined one, the operation it joined after and the last of its
   * operations the capture's origin stream waited for. */
  int capture;
  unsigned long long joined_at, rejoined;
};
/* Clock 0 means "none". Clocks are never reused, so an event or an operation always names
 * the clock it was queued on. */
static struct fk_clock fk_clocks[FK_MAX_CLOCKS];
static int fk_n_clocks = 1;
static int fk_hold;
static int fk_threads;
static __thread int fk_t_number;

/* Kernels and host functions in flight. A task's id is its slot plus a multiple of
 * FK_MAX_TASKS; a slot is reused once its task finished. */
struct fk_task {
  unsigned long long id;
  int clock, finished, host;
  unsigned long long seq;
  void (*fn)(void *);
  void *data;
  char name[96];
};
static struct fk_task fk_tasks[FK_MAX_TASKS];
static unsigned long long fk_next_task = 1;
static int fk_active[FK_MAX_TASKS]; /* slots of the tasks in flight */
static int fk_n_active;

struct fk_wait {
  int waiter, dep; /* clocks */
  unsigned long long seq, dep_seq;
};
static struct fk_wait fk_waits[FK_MAX_WAITS];
static int fk_n_waits;

/* Ranges operations in flight use. */
struct fk_access {
  int clock, mode;
  unsigned long long seq, va, size;
  char what[96];
};
static struct fk_access fk_accesses[FK_MAX_ACCESSES];
static int fk_n_accesses;

/* What a copy or memset does to the bytes, when its stream reaches it: `rows` rows of `size`
 * bytes, row r at dst + r * dpitch (and src + r * spitch; a staged copy's rows lie packed in
 * `staging`). A 1D copy is one row. */
enum { EF_NONE, EF_COPY, EF_STAGED, EF_SET };
struct fk_effect {
  int kind, clock, width;
  unsigned long long seq, dst, src, size, rows, dpitch, spitch;
  unsigned value;
  void *staging;
};

/* The bytes from the first row's start to the last row's end, on each side. */
FK_FN unsigned long long fk_rows_span(unsigned long long width, unsigned long long rows,
                                      unsigned long long pitch) {
  return rows ? (rows - 1) * pitch + width : 0;
}
static struct fk_effect fk_effects[FK_MAX_EFFECTS];
static int fk_n_effects;
/* The effect fk_effect_rows shapes: the last one queued, or a captured node's. */
static struct fk_effect *fk_last_effect;

/* The capture side (fake_graphs.h): an operation queued on a stream being captured becomes a
 * node of the capture's graph instead of running. */
struct fk_node;
static struct fk_node *fk_capture_node(int clock, unsigned long long seq);
static void fk_capture_task(struct fk_node *n, int host, void (*fn)(void *), void *data,
                            const char *name);
static void fk_capture_range(struct fk_node *n, unsigned long long va, unsigned long long size,
                             int mode, const char *what);
static struct fk_effect *fk_capture_effect(struct fk_node *n, int kind, void *staging);
static void fk_graphs_reset(void);

/* The memory side of effects (fake_memory.h). */
static int fk_range_live(unsigned long long va, unsigned long long size, int write);
static void fk_move(unsigned long long dst, unsigned long long src, unsigned long long size);
static void fk_guard_lift(unsigned long long va, unsigned long long size);
static void fk_guards_settle(void);

FK_FN int fk_done(int clock, unsigned long long seq) {
  return seq == 0 || clock <= 0 || fk_clocks[clock].completed >= seq;
}

FK_FN int fk_thread_number(void) {
  if (!fk_t_number) fk_t_number = ++fk_threads;
  return fk_t_number;
}

FK_FN int fk_clock_new(int ctx, int kind, int blocking, unsigned long long handle) {
  if (fk_n_clocks >= FK_MAX_CLOCKS) return 0;
  struct fk_clock *c = &fk_clocks[fk_n_clocks];
  memset(c, 0, sizeof *c);
  c->ctx = ctx;
  c->kind = kind;
  c->blocking = blocking;
  c->handle = handle;
  if (kind == CK_PER_THREAD) c->thread = fk_thread_number();
  return fk_n_clocks++;
}

/* The legacy default stream of context `ctx`. */
FK_FN int fk_legacy_clock(int ctx) {
  if (ctx < 0 || ctx >= FK_MAX_CTX) return 0;
  if (!fk_ctxs[ctx].legacy_clock) fk_ctxs[ctx].legacy_clock = fk_clock_new(ctx, CK_LEGACY, 1, 0);
  return fk_ctxs[ctx].legacy_clock;
}

/* The calling thread's per-thread default stream of context `ctx`. */
FK_FN int fk_pt_clock(int ctx) {
  if (ctx < 0 || ctx >= FK_MAX_CTX) return 0;
  fk_thread();
  if (!fk_t_pt_clock[ctx]) fk_t_pt_clock[ctx] = fk_clock_new(ctx, CK_PER_THREAD, 1, 2);
  return fk_t_pt_clock[ctx];
}

/* How a hazard names a clock. */
FK_FN const char *fk_clock_name(int c, char *out, size_t n) {
  if (c <= 0 || c >= fk_n_clocks) {
    snprintf(out, n, "no stream");
    return out;
  }
  const struct fk_clock *k = &fk_clocks[c];
  int device = fk_ctxs[k->ctx].device;
  switch (k->kind) {
    case CK_LEGACY:
      snprintf(out, n, "the legacy default stream (NULL) of device %d", device);
      break;
    case CK_PER_THREAD:
      snprintf(out, n, "the per-thread default stream of thread %d", k->thread);
      break;
    default:
      snprintf(out, n, "stream %#llx%s", k->handle, k->retired ? " (destroyed)" : "");
  }
  return out;
}

/* ---- Tasks -------------------------------------------------------------------------- */

FK_FN struct fk_task *fk_task_of(unsigned long long id) {
  if (!id) return NULL;
  struct fk_task *t = &fk_tasks[id % FK_MAX_TASKS];
  return t->id == id ? t : NULL;
}

FK_FN void fk_task_finish(struct fk_task *t) {
  if (t->finished) return;
  t->finished = 1;
  int slot = (int)(t - fk_tasks);
  for (int i = 0; i < fk_n_active; i++) {
    if (fk_active[i] == slot) {
      fk_active[i] = fk_active[--fk_n_active];
      break;
    }
  }
}

static void fk_apply_effects(void);

/* Runs a host function (the vendors forbid it to call them: such calls are refused), after
 * the bytes of the copies and memsets before it on its stream landed ("called after currently
 * enqueued work"). */
FK_FN void fk_task_run(struct fk_task *t) {
  if (t->host && t->fn) {
    fk_apply_effects();
    fk_t_in_callback = 1;
    t->fn(t->data);
    fk_t_in_callback = 0;
  }
  fk_task_finish(t);
}

/* Completes what nothing holds back (nothing while held), runs the host functions whose
 * turn came, and applies the effects of what completed (a CPU wait's too while held). */
static void fk_progress(void) {
  if (fk_hold) {
    fk_apply_effects();
    return;
  }
  if (!fk_n_active && !fk_n_waits) {
    for (int c = 1; c < fk_n_clocks; c++) fk_clocks[c].completed = fk_clocks[c].recorded;
    fk_apply_effects();
    return;
  }
  static unsigned long long limit[FK_MAX_CLOCKS];
  for (;;) {
    int changed = 0;
    for (int c = 1; c < fk_n_clocks; c++) limit[c] = fk_clocks[c].recorded;
    for (int i = 0; i < fk_n_active; i++) {
      struct fk_task *t = &fk_tasks[fk_active[i]];
      if (t->seq - 1 < limit[t->clock]) limit[t->clock] = t->seq - 1;
    }
    for (int i = 0; i < fk_n_waits; i++) {
      struct fk_wait *w = &fk_waits[i];
      if (!fk_done(w->dep, w->dep_seq) && w->seq - 1 < limit[w->waiter])
        limit[w->waiter] = w->seq - 1;
    }
    for (int c = 1; c < fk_n_clocks; c++) {
      if (limit[c] > fk_clocks[c].completed) {
        fk_clocks[c].completed = limit[c];
        changed = 1;
      }
    }
    /* A host function runs once its stream reached it. */
    for (int i = 0; i < fk_n_active; i++) {
      struct fk_task *t = &fk_tasks[fk_active[i]];
      if (t->host && fk_clocks[t->clock].completed + 1 == t->seq) {
        fk_task_run(t);
        changed = 1;
        break;
      }
    }
    if (!changed) break;
  }
  fk_apply_effects();
}

/* A CPU wait for `clock` up to its operation `seq` (ULLONG_MAX: all queued): completes
 * what it waits for first (other clocks' operations it waits for on the GPU, its kernels,
 * its host functions, in order), then the clock. */
static void fk_force(int clock, unsigned long long seq, int depth) {
  if (clock <= 0 || clock >= fk_n_clocks || depth > 64) return;
  struct fk_clock *k = &fk_clocks[clock];
  if (seq > k->recorded) seq = k->recorded;
  if (k->completed >= seq) return;
  for (int i = 0; i < fk_n_waits; i++)
    if (fk_waits[i].waiter == clock && fk_waits[i].seq <= seq)
      fk_force(fk_waits[i].dep, fk_waits[i].dep_seq, depth + 1);
  for (;;) {
    struct fk_task *first = NULL;
    for (int i = 0; i < fk_n_active; i++) {
      struct fk_task *t = &fk_tasks[fk_active[i]];
      if (t->clock == clock && t->seq <= seq && (!first || t->seq < first->seq)) first = t;
    }
    if (!first) break;
    /* Everything before it on the clock is done: its turn came. */
    if (k->completed < first->seq - 1) k->completed = first->seq - 1;
    fk_task_run(first);
  }
  if (k->completed < seq) k->completed = seq;
  fk_progress();
}

/* While held, nothing queued completes until synchronised or released; releasing completes
 * it all (kernels finish, host functions run). fakecuda_hold_events / fakehip_hold_events. */
FK_FN void fk_set_hold(int held) {
  fk_hold = held;
  if (!held) {
    /* Each clock in order, after what it waits for on the GPU. */
    for (int c = 1; c < fk_n_clocks; c++) fk_force(c, ~0ULL, 0);
    while (fk_n_active) fk_task_run(&fk_tasks[fk_active[0]]);
    fk_progress();
  }
}

/* Every clock of context `ctx` (-1: of every context): a context or device
 * synchronisation. */
FK_FN void fk_force_ctx(int ctx) {
  for (int c = 1; c < fk_n_clocks; c++)
    if (ctx < 0 || fk_clocks[c].ctx == ctx) fk_force(c, ~0ULL, 0);
}

/* Polling (cuStreamQuery, cuEventQuery, hipStreamQuery, hipEventQuery): no time passes on the
 * fake, so a loop that queries behind work held in flight would spin for ever. A query that
 * finds `key` (its stream's clock, or its event) not ready fk_query_patience times in a row
 * is answered by a CPU wait: fk_polled says when (0: never). */
#define FK_QUERY_PATIENCE 1000
#define FK_POLLS 256
static int fk_query_patience = FK_QUERY_PATIENCE;
/* What each stream or event was last found waiting for, and how many times in a row: one
 * count per key (so that a loop polling several, or threads polling their own, each end), reset
 * when the work waited for changes (completed another way, or more queued). */
static struct fk_poll {
  unsigned long long key, target;
  int count;
} fk_polls[FK_POLLS];
/* A query found `key` not ready, waiting for `target` (its stream's last operation, or its
 * event's record): 1 when that is the fk_query_patience-th time in a row. */
FK_FN int fk_polled(unsigned long long key, unsigned long long target) {
  struct fk_poll *p = &fk_polls[(key ^ (key >> 17)) % FK_POLLS];
  if (p->key != key || p->target != target) {
    p->key = key;
    p->target = target;
    p->count = 0;
  }
  if (fk_query_patience <= 0 || ++p->count < fk_query_patience) return 0;
  p->count = 0;
  return 1;
}

/* Counts a CPU wait: every synchronisation, whether or not it had to wait. */
FK_FN void fk_cpu_wait(void) { fk_cpu_wait_count++; }

/* `waiter` waits on the GPU for `dep` up to `dep_seq`; counted when the caller asked for it
 * (the vendor's stream-wait-event call), not when the stream rules imply it. */
FK_FN void fk_wait_add(int waiter, int dep, unsigned long long dep_seq, int asked) {
  if (asked) fk_gpu_wait_count++;
  /* A captured stream runs nothing: its graph is replayed in capture order (fake_graphs.h). */
  if (fk_clocks[waiter].capture) return;
  if (fk_done(dep, dep_seq) || waiter == dep) return;
  if (fk_n_waits == FK_MAX_WAITS) {
    /* Forget the waits that completed: they hold nothing back, and what they ordered has
     * completed too. */
    int n = 0;
    for (int i = 0; i < fk_n_waits; i++)
      if (!fk_done(fk_waits[i].waiter, fk_waits[i].seq)) fk_waits[n++] = fk_waits[i];
    fk_n_waits = n;
    if (n == FK_MAX_WAITS) {
      fk_force(dep, dep_seq, 0); /* no room: wait on the CPU instead */
      return;
    }
  }
  struct fk_wait *w = &fk_waits[fk_n_waits++];
  w->waiter = waiter;
  w->dep = dep;
  w->dep_seq = dep_seq;
  w->seq = ++fk_clocks[waiter].recorded;
}

/* The legacy default stream's rules, before an operation is queued on `c`. */
FK_FN void fk_implicit(int c) {
  struct fk_clock *k = &fk_clocks[c];
  if (k->kind == CK_LEGACY) {
    for (int b = 1; b < fk_n_clocks; b++) {
      struct fk_clock *x = &fk_clocks[b];
      if (b != c && x->ctx == k->ctx && x->blocking && x->completed < x->recorded)
        fk_wait_add(c, b, x->recorded, 0);
    }
  } else if (k->blocking) {
    int legacy = fk_ctxs[k->ctx].legacy_clock;
    if (legacy && fk_clocks[legacy].completed < fk_clocks[legacy].recorded)
      fk_wait_add(c, legacy, fk_clocks[legacy].recorded, 0);
  }
}

/* Queues one operation on `clock` (after the implicit waits the stream rules give it);
 * returns its number. The caller makes progress once it has recorded what the operation
 * holds back or does. */
FK_FN unsigned long long fk_queue(int clock) {
  if (!fk_clocks[clock].capture) fk_implicit(clock);
  return ++fk_clocks[clock].recorded;
}

/* Queues an operation with nothing of its own in flight (an event record, a pool free). */
FK_FN unsigned long long fk_enqueue(int clock) {
  unsigned long long seq = fk_queue(clock);
  fk_progress();
  return seq;
}

/* Whether work queued on `clock` before its operation `before` runs after operation `seq`
 * of `a_clock`: it completed, it is earlier on the same clock, or a GPU-side wait of
 * `clock` queued before reaches it (directly, or through other clocks' waits). */
FK_FN int fk_ordered_after(int a_clock, unsigned long long a_seq, int clock,
                           unsigned long long before) {
  if (fk_done(a_clock, a_seq)) return 1;
  if (clock == a_clock) return a_seq < before;
  static unsigned long long reach[FK_MAX_CLOCKS];
  static unsigned stamp[FK_MAX_CLOCKS];
  static unsigned now;
  static int stack[FK_MAX_CLOCKS];
  int top = 0;
  now++;
  stamp[clock] = now;
  reach[clock] = before;
  stack[top++] = clock;
  while (top) {
    int c = stack[--top];
    unsigned long long b = reach[c];
    for (int i = 0; i < fk_n_waits; i++) {
      const struct fk_wait *w = &fk_waits[i];
      if (w->waiter != c || w->seq >= b) continue;
      if (w->dep == a_clock) {
        if (w->dep_seq >= a_seq) return 1;
        continue;
      }
      unsigned long long nb = w->dep_seq + 1;
      /* Visit a clock again only when more of it is known to come first. */
      if ((stamp[w->dep] != now || reach[w->dep] < nb) && top < FK_MAX_CLOCKS) {
        stamp[w->dep] = now;
        reach[w->dep] = nb;
        stack[top++] = w->dep;
      }
    }
  }
  return 0;
}

/* Whether the next operation queued on `clock` would run after operation `a_seq` of
 * `a_clock`: by the order so far, or by the implicit waits the stream rules give it when it
 * is queued (on the legacy stream: every blocking stream's work so far; on a blocking
 * stream: the legacy stream's). */
FK_FN int fk_ordered_next(int a_clock, unsigned long long a_seq, int clock) {
  const struct fk_clock *k = &fk_clocks[clock];
  if (fk_ordered_after(a_clock, a_seq, clock, k->recorded + 1)) return 1;
  if (k->kind == CK_LEGACY) {
    for (int b = 1; b < fk_n_clocks; b++)
      if (b != clock && fk_clocks[b].ctx == k->ctx && fk_clocks[b].blocking &&
          fk_ordered_after(a_clock, a_seq, b, fk_clocks[b].recorded + 1))
        return 1;
  } else if (k->blocking) {
    int legacy = fk_ctxs[k->ctx].legacy_clock;
    if (legacy && fk_ordered_after(a_clock, a_seq, legacy, fk_clocks[legacy].recorded + 1))
      return 1;
  }
  return 0;
}

/* ---- The race detector -------------------------------------------------------------- */

FK_FN void fk_accesses_compact(void) {
  int n = 0;
  for (int i = 0; i < fk_n_accesses; i++)
    if (!fk_done(fk_accesses[i].clock, fk_accesses[i].seq)) fk_accesses[n++] = fk_accesses[i];
  fk_n_accesses = n;
}

FK_FN const char *fk_verb(int mode) {
  return mode == (FK_READ | FK_WRITE) ? "reads and writes" : mode == FK_WRITE ? "writes" : "reads";
}

/* Before operation `seq` of `clock` (`what`) uses [va, va + size) in `mode`: a hazard for
 * every operation in flight on another clock that it conflicts with and is not ordered
 * after. */
FK_FN void fk_race_check(int clock, unsigned long long seq, unsigned long long va,
                         unsigned long long size, int mode, const char *what) {
  if (!size) return;
  for (int i = 0; i < fk_n_accesses; i++) {
    const struct fk_access *a = &fk_accesses[i];
    if (a->va >= va + size || va >= a->va + a->size) continue;
    if (!((a->mode | mode) & FK_WRITE)) continue; /* two reads do not conflict */
    if (a->clock == clock && a->seq == seq) continue; /* the operation itself */
    if (fk_ordered_after(a->clock, a->seq, clock, seq)) continue;
    char mine[96], theirs[96];
    fk_hazard("race: %s on %s %s [%#llx, %#llx) while %s on %s %s [%#llx, %#llx), not ordered "
              "after it",
              what, fk_clock_name(clock, mine, sizeof mine), fk_verb(mode), va, va + size,
              a->what, fk_clock_name(a->clock, theirs, sizeof theirs), fk_verb(a->mode), a->va,
              a->va + a->size);
  }
}

/* Records that operation `seq` of `clock` uses [va, va + size) in `mode` until it
 * completes. */
FK_FN void fk_access_add(int clock, unsigned long long seq, unsigned long long va,
                         unsigned long long size, int mode, const char *what) {
  if (!size || fk_done(clock, seq)) return;
  if (fk_n_accesses == FK_MAX_ACCESSES) fk_accesses_compact();
  if (fk_n_accesses == FK_MAX_ACCESSES) return;
  struct fk_access *a = &fk_accesses[fk_n_accesses++];
  a->clock = clock;
  a->seq = seq;
  a->va = va;
  a->size = size;
  a->mode = mode;
  snprintf(a->what, sizeof a->what, "%s", what);
}

/* Checks and records one range of an operation being queued. */
FK_FN void fk_use(int clock, unsigned long long seq, unsigned long long va,
                  unsigned long long size, int mode, const char *what) {
  if (fk_clocks[clock].capture) {
    /* Captured: the range is the node's, checked and used at each replay. */
    struct fk_node *n = fk_capture_node(clock, seq);
    if (n) fk_capture_range(n, va, size, mode, what);
    return;
  }
  fk_race_check(clock, seq, va, size, mode, what);
  fk_access_add(clock, seq, va, size, mode, what);
}

/* Before memory goes away (freed, unmapped, trimmed; pinned memory freed): an operation in
 * flight over [va, va + size) is a hazard, and the effects not yet applied over it are
 * dropped (they would land on memory that is gone). */
FK_FN void fk_check_unused(unsigned long long va, unsigned long long size, const char *what) {
  for (int i = 0; i < fk_n_accesses; i++) {
    const struct fk_access *a = &fk_accesses[i];
    if (fk_done(a->clock, a->seq) || a->va >= va + size || va >= a->va + a->size) continue;
    char theirs[96];
    fk_hazard("%s of [%#llx, %#llx) while %s on %s %s [%#llx, %#llx)", what, va, va + size,
              a->what, fk_clock_name(a->clock, theirs, sizeof theirs), fk_verb(a->mode), a->va,
              a->va + a->size);
    break;
  }
  for (int i = 0; i < fk_n_effects; i++) {
    struct fk_effect *e = &fk_effects[i];
    if (e->kind == EF_NONE) continue;
    unsigned long long dst_span = fk_rows_span(e->size, e->rows, e->dpitch);
    unsigned long long src_span = fk_rows_span(e->size, e->rows, e->spitch);
    int hits_dst = e->dst < va + size && va < e->dst + dst_span;
    int hits_src = e->kind == EF_COPY && e->src < va + size && va < e->src + src_span;
    if (hits_dst || hits_src) {
      free(e->staging);
      e->staging = NULL;
      e->kind = EF_NONE;
    }
  }
}

/* Before memory is handed out to work on `clock` (0: to the CPU, no stream): an operation
 * in flight over it that such work is not ordered after is a hazard. */
FK_FN void fk_check_handout(unsigned long long va, unsigned long long size, int clock,
                            const char *what) {
  for (int i = 0; i < fk_n_accesses; i++) {
    const struct fk_access *a = &fk_accesses[i];
    if (fk_done(a->clock, a->seq) || a->va >= va + size || va >= a->va + a->size) continue;
    if (clock > 0 && fk_ordered_after(a->clock, a->seq, clock, ~0ULL)) continue;
    char theirs[96];
    fk_hazard("%s hands out [%#llx, %#llx) while %s on %s %s [%#llx, %#llx)", what, va,
              va + size, a->what, fk_clock_name(a->clock, theirs, sizeof theirs),
              fk_verb(a->mode), a->va, a->va + a->size);
    break;
  }
}

/* Whether an operation in flight uses any of [va, va + size). */
FK_FN int fk_range_busy(unsigned long long va, unsigned long long size) {
  for (int i = 0; i < fk_n_accesses; i++) {
    const struct fk_access *a = &fk_accesses[i];
    if (!fk_done(a->clock, a->seq) && a->va < va + size && va < a->va + a->size) return 1;
  }
  return 0;
}

/* ---- Effects -------------------------------------------------------------------------- */

FK_FN void fk_effect_apply(struct fk_effect *e) {
  if (e->kind == EF_NONE) return;
  unsigned long long dst_span = fk_rows_span(e->size, e->rows, e->dpitch);
  unsigned long long src_span = fk_rows_span(e->size, e->rows, e->spitch);
  int src_ok = e->kind != EF_COPY || fk_range_live(e->src, src_span, 0);
  if (!fk_range_live(e->dst, dst_span, 1) || !src_ok) {
    char name[96];
    fk_hazard("a %s of [%#llx, %#llx) on %s reached memory no longer there",
              e->kind == EF_SET ? "memset" : "copy", e->dst, e->dst + dst_span,
              fk_clock_name(e->clock, name, sizeof name));
  } else {
    fk_guard_lift(e->dst, dst_span);
    if (e->kind == EF_COPY) fk_guard_lift(e->src, src_span);
    for (unsigned long long r = 0; r < e->rows; r++) {
      unsigned long long dst = e->dst + r * e->dpitch;
      if (e->kind == EF_COPY) {
        fk_move(dst, e->src + r * e->spitch, e->size);
      } else if (e->kind == EF_STAGED) {
        memcpy((void *)(uintptr_t)dst, (const char *)e->staging + r * e->size, e->size);
      } else if (e->value == 0) {
        fk_move(dst, 0, e->size);
      } else if (e->width == 1) {
        memset((void *)(uintptr_t)dst, (int)(e->value & 0xff), e->size);
      } else {
        unsigned char *p = (unsigned char *)(uintptr_t)dst;
        for (unsigned long long at = 0; at + (unsigned long long)e->width <= e->size; at += e->width)
          memcpy(p + at, &e->value, (size_t)e->width); /* little-endian: the low bytes */
      }
    }
  }
  free(e->staging);
  e->staging = NULL;
  e->kind = EF_NONE;
}

static void fk_apply_effects(void) {
  if (!fk_n_effects) return;
  int n = 0;
  for (int i = 0; i < fk_n_effects; i++) {
    struct fk_effect *e = &fk_effects[i];
    if (e->kind != EF_NONE && fk_done(e->clock, e->seq)) fk_effect_apply(e);
    if (e->kind != EF_NONE) fk_effects[n++] = *e;
  }
  fk_n_effects = n;
  fk_guards_settle();
}

/* Queues the effect of operation `seq` of `clock` (applied when the clock reaches it): one
 * row; fk_effect_rows makes it `rows` rows. */
FK_FN void fk_effect_add(int clock, unsigned long long seq, int kind, unsigned long long dst,
                         unsigned long long src, unsigned long long size, unsigned value,
                         int width, void *staging) {
  static struct fk_effect dropped;
  struct fk_effect *e;
  if (fk_clocks[clock].capture) {
    struct fk_node *n = fk_capture_node(clock, seq);
    e = n ? fk_capture_effect(n, kind, staging) : NULL;
    if (!e) {
      /* Not captured (the capture is invalidated): shaped, then forgotten. */
      free(staging);
      staging = NULL;
      e = &dropped;
    }
  } else {
    if (fk_n_effects == FK_MAX_EFFECTS) fk_apply_effects();
    if (fk_n_effects == FK_MAX_EFFECTS) fk_force(clock, seq - 1, 0); /* no room: wait first */
    e = &fk_effects[fk_n_effects++];
  }
  fk_last_effect = e;
  e->kind = kind;
  e->clock = clock;
  e->seq = seq;
  e->dst = dst;
  e->src = src;
  e->size = size;
  e->value = value;
  e->width = width;
  e->staging = staging;
  e->rows = 1;
  e->dpitch = e->spitch = size;
}

/* The last effect queued becomes `rows` rows at the pitches given. */
FK_FN void fk_effect_rows(unsigned long long rows, unsigned long long dpitch,
                          unsigned long long spitch) {
  struct fk_effect *e = fk_last_effect;
  e->rows = rows;
  e->dpitch = dpitch;
  e->spitch = spitch;
}

/* ---- Streams -------------------------------------------------------------------------- */

#define FK_STREAM_BASE 0x5e0000000000ULL

struct fk_stream {
  int live, clock, ctx, priority;
  unsigned flags;
  int next_free;
};
static struct fk_stream fk_streams[FK_MAX_STREAMS];
static int fk_streams_high;
static int fk_streams_free = -1; /* destroyed streams' slots, the last destroyed first */

FK_FN unsigned long long fk_stream_handle(int slot) {
  return FK_STREAM_BASE + 16ULL * (unsigned long long)(slot + 1);
}

/* The slot of a live stream handle, or -1. */
FK_FN int fk_stream_slot(unsigned long long handle) {
  if (handle <= FK_STREAM_BASE || (handle - FK_STREAM_BASE) % 16) return -1;
  unsigned long long slot = (handle - FK_STREAM_BASE) / 16 - 1;
  if (slot >= (unsigned long long)fk_streams_high || !fk_streams[slot].live) return -1;
  return (int)slot;
}

/* A new stream of context `ctx`; its handle, or 0 when there is no room. */
FK_FN unsigned long long fk_stream_new(int ctx, unsigned flags, int priority) {
  int slot = fk_streams_free;
  if (slot >= 0) {
    fk_streams_free = fk_streams[slot].next_free;
  } else {
    if (fk_streams_high == FK_MAX_STREAMS) return 0;
    slot = fk_streams_high++;
  }
  unsigned long long handle = fk_stream_handle(slot);
  int clock = fk_clock_new(ctx, CK_STREAM, !(flags & 1), handle);
  if (!clock) {
    fk_streams[slot].next_free = fk_streams_free;
    fk_streams_free = slot;
    return 0;
  }
  struct fk_stream *s = &fk_streams[slot];
  s->live = 1;
  s->clock = clock;
  s->ctx = ctx;
  s->flags = flags;
  s->priority = priority;
  return handle;
}

/* The stream's work already queued still completes (kernels in flight run on); its handle
 * value goes to the next stream made. */
FK_FN void fk_stream_destroy(int slot) {
  struct fk_stream *s = &fk_streams[slot];
  fk_clocks[s->clock].retired = 1;
  s->live = 0;
  s->next_free = fk_streams_free;
  fk_streams_free = slot;
}

/* The clock of a stream handle for calls made in context `ctx`: NULL is the legacy default
 * stream (the per-thread one when `per_thread_null`, the _ptsz/_ptds calls), 0x1 the legacy
 * one, 0x2 the per-thread one; 0 for a handle the driver does not know. */
FK_FN int fk_clock_of(int ctx, unsigned long long handle, int per_thread_null) {
  if (handle == 0) return per_thread_null ? fk_pt_clock(ctx) : fk_legacy_clock(ctx);
  if (handle == 1) return fk_legacy_clock(ctx);
  if (handle == 2) return fk_pt_clock(ctx);
  int slot = fk_stream_slot(handle);
  return slot < 0 ? 0 : fk_streams[slot].clock;
}

/* A stream's queue is empty: everything queued completed. */
FK_FN int fk_clock_idle(int clock) {
  return fk_clocks[clock].completed >= fk_clocks[clock].recorded;
}

/* Whether everything queued on the stream completed (the legacy stream: and everything on its
 * context's blocking streams, which its next operation would wait for). */
FK_FN int fk_stream_idle(int clock) {
  if (!fk_clock_idle(clock)) return 0;
  if (fk_clocks[clock].kind != CK_LEGACY) return 1;
  for (int c = 1; c < fk_n_clocks; c++)
    if (fk_clocks[c].ctx == fk_clocks[clock].ctx && fk_clocks[c].blocking && !fk_clock_idle(c))
      return 0;
  return 1;
}

/* A CPU wait for a stream, counted: for the legacy default stream a marker queued on it
 * (which first waits, on the GPU, for its context's blocking streams) and waited for. */
FK_FN void fk_wait_for_clock(int clock) {
  fk_cpu_wait();
  if (fk_clocks[clock].kind == CK_LEGACY)
    fk_force(clock, fk_enqueue(clock), 0);
  else
    fk_force(clock, ~0ULL, 0);
}

/* ---- Events --------------------------------------------------------------------------- */

#define FK_EVENT_BASE 0x6e0000000000ULL

struct fk_event {
  unsigned long long serial; /* 0: a free slot */
  unsigned long long capture_id; /* the capture its last record was made in (0: none) */
  int ctx, recorded, clock, seen;
  unsigned flags;
  unsigned long long seq;
  struct timespec done_at; /* when the fake first saw it complete */
};
static struct fk_event fk_events[FK_MAX_EVENTS];
static unsigned long long fk_next_event = 1;

FK_FN struct fk_event *fk_event_of(unsigned long long handle) {
  if (handle <= FK_EVENT_BASE || (handle - FK_EVENT_BASE) % 16) return NULL;
  unsigned long long serial = (handle - FK_EVENT_BASE) / 16;
  struct fk_event *e = &fk_events[serial % FK_MAX_EVENTS];
  return e->serial == serial ? e : NULL;
}

/* A new event; its handle, or 0 when there is no room (every slot holds a live event). */
FK_FN unsigned long long fk_event_new(int ctx, unsigned flags) {
  for (int tries = 0; tries < FK_MAX_EVENTS; tries++) {
    unsigned long long serial = fk_next_event++;
    struct fk_event *e = &fk_events[serial % FK_MAX_EVENTS];
    if (e->serial) continue;
    memset(e, 0, sizeof *e);
    e->serial = serial;
    e->ctx = ctx;
    e->flags = flags;
    return FK_EVENT_BASE + 16 * serial;
  }
  return 0;
}

static unsigned long long fk_capture_id_of(int clock);
FK_FN void fk_event_record(struct fk_event *e, int clock) {
  e->capture_id = fk_capture_id_of(clock);
  e->recorded = 1;
  e->seen = 0;
  e->clock = clock;
  e->seq = fk_enqueue(clock);
}

/* Whether the event's last record completed (an event never recorded has). */
FK_FN int fk_event_done(struct fk_event *e) {
  int done = !e->recorded || fk_done(e->clock, e->seq);
  if (done && e->recorded && !e->seen) {
    e->seen = 1;
    clock_gettime(CLOCK_MONOTONIC, &e->done_at);
  }
  return done;
}

/* Milliseconds from `start` to `end` (both recorded and complete, timing on): the host time
 * between the moments the fake saw each complete. */
FK_FN float fk_event_ms(struct fk_event *start, struct fk_event *end) {
  double a = (double)start->done_at.tv_sec * 1e3 + (double)start->done_at.tv_nsec / 1e6;
  double b = (double)end->done_at.tv_sec * 1e3 + (double)end->done_at.tv_nsec / 1e6;
  return (float)(b - a);
}

/* ---- Kernels held in flight ---------------------------------------------------------- */

/* A task on `clock`: a kernel (host 0), in flight until finished, or a host function,
 * which runs when its stream reaches it. Its id, or 0 when every slot holds one in flight. */
FK_FN unsigned long long fk_task_new(int clock, unsigned long long seq, const char *name, int host,
                                     void (*fn)(void *), void *data) {
  for (int tries = 0; tries < FK_MAX_TASKS; tries++) {
    unsigned long long id = fk_next_task++;
    struct fk_task *t = &fk_tasks[id % FK_MAX_TASKS];
    if (t->id && !t->finished) continue;
    memset(t, 0, sizeof *t);
    t->id = id;
    t->clock = clock;
    t->seq = seq;
    t->host = host;
    t->fn = fn;
    t->data = data;
    snprintf(t->name, sizeof t->name, "%s", name);
    if (fk_clocks[clock].capture) {
      /* Captured: a node of the graph, run at each replay; the task itself never runs. */
      struct fk_node *n = fk_capture_node(clock, seq);
      if (n) fk_capture_task(n, host, fn, data, name);
      t->finished = 1;
      return id;
    }
    fk_active[fk_n_active++] = (int)(t - fk_tasks);
    return id;
  }
  return 0;
}

/* ---- Reset ---------------------------------------------------------------------------- */

FK_FN void fk_timeline_reset(void) {
  fk_graphs_reset();
  fk_n_clocks = 1;
  fk_n_active = fk_n_waits = fk_n_accesses = 0;
  for (int i = 0; i < fk_n_effects; i++) free(fk_effects[i].staging);
  fk_n_effects = 0;
  memset(fk_tasks, 0, sizeof fk_tasks);
  memset(fk_streams, 0, sizeof fk_streams);
  fk_streams_high = 0;
  fk_streams_free = -1;
  memset(fk_events, 0, sizeof fk_events);
  fk_hold = 0;
  fk_query_patience = FK_QUERY_PATIENCE;
  memset(fk_polls, 0, sizeof fk_polls);
}

/* ---- The control API: kernels, holds, order ------------------------------------------- */

/* Each face's: the clock of a stream handle for the calling thread (its current context),
 * or 0 for a handle the driver does not know. */
static int fk_face_clock(void *stream);

/* A kernel on `stream` that uses [va, va + size) in `mode` (1 reads, 2 writes, 3 both): in
 * flight, holding back the work queued after it on its stream, until fake_finish or a CPU
 * wait that covers it. 0 when the stream is unknown or the mode is none of these. */
FAKE_EXPORT unsigned long long fake_launch_mode(void *stream, unsigned long long va,
                                                unsigned long long size, int mode) {
  unsigned long long id = 0;
  if (mode < 1 || mode > 3) return 0;
  LOCKED({
    int clock = fk_face_clock(stream);
    if (clock > 0) {
      unsigned long long seq = fk_queue(clock);
      id = fk_task_new(clock, seq, "kernel", 0, NULL, NULL);
      if (id) {
        struct fk_task *t = fk_task_of(id);
        snprintf(t->name, sizeof t->name, "kernel %llu", id);
        fk_use(clock, seq, va, size, mode, t->name);
        fk_t_last_kernel = id;
      }
      fk_progress();
    }
  });
  return id;
}

/* A kernel that reads [va, va + size) (fake_launch_mode with mode 1): what a test holds in
 * flight over memory it hands to the code under test. */
FAKE_EXPORT unsigned long long fake_launch(void *stream, unsigned long long va,
                                           unsigned long long size) {
  return fake_launch_mode(stream, va, size, FK_READ);
}

FAKE_EXPORT void fake_finish(unsigned long long kernel) {
  LOCKED({
    struct fk_task *t = fk_task_of(kernel);
    if (t && !t->host) {
      fk_task_finish(t);
      fk_progress();
    }
  });
}

/* Every kernel in flight completes (host functions run): the GPU catches up, without a CPU
 * wait counted. */
FAKE_EXPORT void fake_finish_all(void) {
  LOCKED({
    /* The kernels first; then the clocks move on, and each host function runs when its
     * stream reaches it, after the copies before it landed. (Removing a task moves the last
     * one into its slot, which the loop from the end has seen already.) */
    for (int i = fk_n_active - 1; i >= 0; i--) {
      struct fk_task *t = &fk_tasks[fk_active[i]];
      if (!t->host) fk_task_finish(t);
    }
    int held = fk_hold;
    fk_hold = 0;
    fk_progress();
    while (fk_n_active) fk_task_run(&fk_tasks[fk_active[0]]);
    fk_progress();
    fk_hold = held;
  });
}

/* While held (1), nothing completes that a CPU wait does not force: each copy, memset and
 * kernel stays in flight, so a race against work that would often have completed on a GPU
 * already is seen. Releasing (0) completes everything, in stream order. */
FAKE_EXPORT void fake_hold(int held) { LOCKED(fk_set_hold(held)); }

/* Queries answered "not ready" this many times in a row for one stream or event complete what
 * they wait for (as a CPU wait, counted), so that a polling loop behind work held in flight
 * ends (no time passes on the fake); 0: never. The previous value; `n` < 0 leaves it. */
FAKE_EXPORT int fake_query_patience(int n) {
  int old = 0;
  LOCKED({
    old = fk_query_patience;
    if (n >= 0) fk_query_patience = n;
  });
  return old;
}

/* The id of the last kernel the calling thread launched (cuLaunchKernel,
 * hipModuleLaunchKernel, hipLaunchKernel, fake_launch's return), 0 if none. */
FAKE_EXPORT unsigned long long fake_last_kernel(void) { return fk_t_last_kernel; }

FAKE_EXPORT int fake_kernel_done(unsigned long long kernel) {
  int done = -1;
  LOCKED({
    struct fk_task *t = fk_task_of(kernel);
    if (t) done = t->finished;
  });
  return done;
}

/* 1 when work queued on `stream` from now on runs after the kernel: it is done, `stream` is
 * its own, or `stream` waits, directly or through other streams' waits (the legacy stream's
 * implicit ones included), for an event recorded after it; else 0 (-1 unknown kernel or
 * stream). */
FAKE_EXPORT int fake_ordered(unsigned long long kernel, void *stream) {
  int ordered = -1;
  LOCKED({
    struct fk_task *t = fk_task_of(kernel);
    int clock = fk_face_clock(stream);
    if (t && clock > 0) ordered = t->finished || fk_ordered_next(t->clock, t->seq, clock);
  });
  return ordered;
}

/* 1 when everything queued so far on `first` runs before what is queued next on `then`
 * (-1 for a stream the driver does not know). */
FAKE_EXPORT int fake_streams_ordered(void *first, void *then) {
  int ordered = -1;
  LOCKED({
    int a = fk_face_clock(first), b = fk_face_clock(then);
    if (a > 0 && b > 0) ordered = fk_ordered_next(a, fk_clocks[a].recorded, b);
  });
  return ordered;
}

/* Operations in flight (kernels, host functions, copies and memsets not complete). */
FAKE_EXPORT long long fake_in_flight(void) {
  long long n = 0;
  LOCKED({
    fk_accesses_compact();
    n = fk_n_active;
    for (int i = 0; i < fk_n_effects; i++) n += fk_effects[i].kind != EF_NONE;
  });
  return n;
}

#endif /* FAKE_TIMELINE_H */
