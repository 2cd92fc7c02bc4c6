/*
 * fake_graphs.h: stream capture and graphs, for both drivers (see fake_core.h for the layout).
 *
 * The vendors' rules (CUDA driver API, "Stream Management" and "Graph Management";
 * cuThreadExchangeStreamCaptureMode; clr's hipamd/src/hip_internal.hpp, hip_stream.cpp,
 * hip_event.cpp and hip_memory.cpp for HIP, which the HIP face follows where CUDA documents
 * no list):
 *
 *   - cuStreamBeginCapture / hipStreamBeginCapture puts a stream in capture: what is queued on
 *     it from then on (kernels, copies, memsets, event records, host functions, waits) is not
 *     run but recorded, in order, into a graph that cuStreamEndCapture / hipStreamEndCapture
 *     returns. The legacy default stream cannot be captured (…_STREAM_CAPTURE_UNSUPPORTED); a
 *     stream already capturing cannot begin again (ILLEGAL_STATE).
 *   - A stream that waits for an event recorded in a capture joins it (a fork); the capture
 *     can end only on the stream that began it (UNMATCHED), from the thread that began it
 *     unless it is relaxed (WRONG_THREAD), and only once every stream that joined has been
 *     waited for by the origin after its last captured work (UNJOINED). A captured stream
 *     waiting for an event recorded outside its capture is ISOLATION; joining two captures is
 *     MERGE.
 *   - Querying or synchronising a stream being captured is STREAM_CAPTURE_UNSUPPORTED (and, on
 *     CUDA, invalidates the capture: "when an invalid operation is attempted during stream
 *     capture, any associated capture graphs are invalidated"; clr leaves it valid); querying
 *     or synchronising an event recorded in a capture under way is CAPTURED_EVENT and
 *     invalidates the capture.
 *   - "Potentially unsafe" calls, made while a capture forbids them, fail with
 *     STREAM_CAPTURE_UNSUPPORTED and invalidate the captures that forbid them: the plain
 *     allocation and free calls (cuMemAlloc, cuMemFree, cuMemAllocHost, cuMemHostRegister and
 *     their kin; hipMalloc, hipFree, hipHostMalloc, hipHostRegister, …). A thread in the global
 *     mode (the default) is forbidden them while it captures in a mode other than relaxed, or
 *     while another thread captures in the global mode; in the thread-local mode, only while
 *     it captures in a mode other than relaxed; in the relaxed mode, never
 *     (cuThreadExchangeStreamCaptureMode / hipThreadExchangeStreamCaptureMode swap the
 *     calling thread's mode). Virtual memory calls are not among them (clr checks none).
 *   - Synchronous copies and memsets while any stream is captured are STREAM_CAPTURE_IMPLICIT
 *     and invalidate every capture, in every mode (clr's CHECK_STREAM_CAPTURING); a context
 *     or device synchronisation is STREAM_CAPTURE_UNSUPPORTED and invalidates every capture.
 *   - An invalidated capture goes on until it is ended; ending it is STREAM_CAPTURE_INVALIDATED
 *     and gives no graph.
 *   - cuGraphInstantiate / hipGraphInstantiate make an executable graph (a copy); launching it
 *     on a stream queues its nodes there, at the addresses captured, each launch anew.
 *
 * What a replay does here: every node is queued on the launch stream in capture order (the
 * branches of a fork are serialised, an order a GPU may not keep: races between them are not
 * seen). Kernels are in flight as any fake kernel is (until fake_finish, a CPU wait, or at
 * once when nothing holds them); copies and memsets move bytes when the stream reaches them.
 * Before a node uses a range, the range must still be memory the device may use: a replay
 * over memory freed, unmapped, trimmed or slept since the capture is a hazard, as is one that
 * races work on another stream over memory handed out again (the race detector).
 *
 * Not modelled, refused so that nothing relies on it: stream-ordered allocation and free
 * inside a capture (graph memory nodes: cuMemAllocAsync, cuMemFreeAsync and the HIP
 * equivalents on a captured stream are STREAM_CAPTURE_UNSUPPORTED and invalidate the
 * capture), and copies from pageable host memory into a capture (they invalidate it). Work
 * queued on the legacy default stream while a blocking stream is captured is queued as
 * usual, not refused as IMPLICIT.
 */
#ifndef FAKE_GRAPHS_H
#define FAKE_GRAPHS_H

#define FK_MAX_CAPTURES 64
#define FK_MAX_GRAPHS 4096
#define FK_NODE_RANGES 8
#define FK_GRAPH_BASE 0xce0000000000ULL
#define FK_EXEC_BASE 0xde0000000000ULL
#define FK_NODE_BASE 0xee0000000000ULL

enum { FK_MODE_GLOBAL = 0, FK_MODE_THREAD_LOCAL = 1, FK_MODE_RELAXED = 2 };
enum { NODE_NONE, NODE_KERNEL, NODE_HOST };

struct fk_node_range {
  unsigned long long va, size;
  int mode;
};

/* One captured operation: what it ran (a kernel, a host function, or neither), the ranges it
 * used and the bytes it moved. (clock, seq) is where it was queued while captured. */
struct fk_node {
  int clock;
  unsigned long long seq;
  int task;
  void (*fn)(void *);
  void *data;
  char what[96];
  int n_ranges;
  struct fk_node_range ranges[FK_NODE_RANGES];
  int has_effect;
  struct fk_effect effect;
};

/* A graph (exec 0) or an executable graph (exec 1): its nodes in capture order. */
struct fk_graph {
  unsigned long long serial; /* 0: a free slot */
  int exec, ctx, n, cap;
  struct fk_node *nodes;
  unsigned long long launches;
};
static struct fk_graph fk_graphs[FK_MAX_GRAPHS];
static unsigned long long fk_next_graph = 1;

struct fk_capture {
  unsigned long long id; /* 0: a free slot */
  int origin, mode, thread, invalidated, ctx, graph;
  char why[200];
};
static struct fk_capture fk_captures[FK_MAX_CAPTURES];
static unsigned long long fk_next_capture_id = 1;
static int fk_n_captures;           /* captures under way */
static long long fk_n_invalidations; /* captures invalidated since the last reset */
static char fk_last_invalidation[200];
static __thread int fk_t_capture_mode; /* the calling thread's interaction mode */

/* ---- Graphs ---------------------------------------------------------------------------- */

FK_FN int fk_graph_new(int ctx, int exec) {
  for (int tries = 0; tries < FK_MAX_GRAPHS; tries++) {
    unsigned long long serial = fk_next_graph++;
    struct fk_graph *g = &fk_graphs[serial % FK_MAX_GRAPHS];
    if (g->serial) continue;
    memset(g, 0, sizeof *g);
    g->serial = serial;
    g->exec = exec;
    g->ctx = ctx;
    return (int)(g - fk_graphs);
  }
  return -1;
}

FK_FN void fk_graph_free(int slot) {
  struct fk_graph *g = &fk_graphs[slot];
  for (int i = 0; i < g->n; i++) free(g->nodes[i].effect.staging);
  free(g->nodes);
  memset(g, 0, sizeof *g);
}

FK_FN unsigned long long fk_graph_handle(int slot) {
  const struct fk_graph *g = &fk_graphs[slot];
  return (g->exec ? FK_EXEC_BASE : FK_GRAPH_BASE) + 16 * g->serial;
}

/* The slot of a live graph (exec 0) or executable graph (exec 1) handle, or -1. */
FK_FN int fk_graph_of(unsigned long long handle, int exec) {
  unsigned long long base = exec ? FK_EXEC_BASE : FK_GRAPH_BASE;
  if (handle <= base || (handle - base) % 16 || handle - base >= 0x10000000000ULL) return -1;
  unsigned long long serial = (handle - base) / 16;
  struct fk_graph *g = &fk_graphs[serial % FK_MAX_GRAPHS];
  return g->serial == serial && g->exec == exec ? (int)(g - fk_graphs) : -1;
}

/* Appends a node to graph `slot`; NULL when there is no memory for it. */
FK_FN struct fk_node *fk_graph_append(int slot) {
  struct fk_graph *g = &fk_graphs[slot];
  if (g->n == g->cap) {
    int cap = g->cap ? 2 * g->cap : 16;
    struct fk_node *nodes = realloc(g->nodes, (size_t)cap * sizeof *nodes);
    if (!nodes) return NULL;
    g->nodes = nodes;
    g->cap = cap;
  }
  struct fk_node *n = &g->nodes[g->n++];
  memset(n, 0, sizeof *n);
  return n;
}

/* ---- Captures ---------------------------------------------------------------------------- */

FK_FN struct fk_capture *fk_capture_of(int clock) {
  if (clock <= 0 || clock >= fk_n_clocks || !fk_clocks[clock].capture) return NULL;
  return &fk_captures[fk_clocks[clock].capture - 1];
}

static unsigned long long fk_capture_id_of(int clock) {
  const struct fk_capture *c = fk_capture_of(clock);
  return c ? c->id : 0;
}

/* The capture under way with id `id`, or NULL (ended, or never). */
FK_FN struct fk_capture *fk_capture_by_id(unsigned long long id) {
  if (!id) return NULL;
  for (int i = 0; i < FK_MAX_CAPTURES; i++)
    if (fk_captures[i].id == id) return &fk_captures[i];
  return NULL;
}

/* Invalidates capture `c` (the first reason is kept): it goes on until ended, and ending it
 * gives no graph. */
FK_FN void fk_capture_invalidate(struct fk_capture *c, const char *why) {
  if (!c->invalidated) {
    c->invalidated = 1;
    snprintf(c->why, sizeof c->why, "%s", why);
    snprintf(fk_last_invalidation, sizeof fk_last_invalidation, "%s", why);
    fk_n_invalidations++;
  }
}

FK_FN void fk_capture_invalidate_all(const char *why) {
  for (int i = 0; i < FK_MAX_CAPTURES; i++)
    if (fk_captures[i].id) fk_capture_invalidate(&fk_captures[i], why);
}

/* Refuses an operation on a captured `clock` that the fake does not capture: the capture is
 * invalidated, the call is STREAM_CAPTURE_UNSUPPORTED. */
FK_FN int fk_capture_refuse(int clock, const char *why) {
  struct fk_capture *c = fk_capture_of(clock);
  if (c) fk_capture_invalidate(c, why);
  return FK_CAPTURE_UNSUPPORTED;
}

/* The node of captured operation (clock, seq), made on first use; NULL when the capture is
 * invalidated or out of memory. */
static struct fk_node *fk_capture_node(int clock, unsigned long long seq) {
  struct fk_capture *c = fk_capture_of(clock);
  if (!c || c->invalidated) return NULL;
  struct fk_graph *g = &fk_graphs[c->graph];
  for (int i = g->n - 1; i >= 0 && i >= g->n - 4; i--)
    if (g->nodes[i].clock == clock && g->nodes[i].seq == seq) return &g->nodes[i];
  struct fk_node *n = fk_graph_append(c->graph);
  if (!n) {
    fk_capture_invalidate(c, "the fake ran out of memory for the graph's nodes");
    return NULL;
  }
  n->clock = clock;
  n->seq = seq;
  return n;
}

static void fk_capture_task(struct fk_node *n, int host, void (*fn)(void *), void *data,
                            const char *name) {
  n->task = host ? NODE_HOST : NODE_KERNEL;
  n->fn = fn;
  n->data = data;
  snprintf(n->what, sizeof n->what, "%s", name);
}

static void fk_capture_range(struct fk_node *n, unsigned long long va, unsigned long long size,
                             int mode, const char *what) {
  if (!size) return;
  if (n->n_ranges == FK_NODE_RANGES) {
    struct fk_capture *c = fk_capture_of(n->clock);
    if (c) fk_capture_invalidate(c, "a captured operation uses more ranges than the fake keeps");
    return;
  }
  n->ranges[n->n_ranges++] = (struct fk_node_range){va, size, mode};
  /* A kernel keeps the name its launch gave it; a copy or memset is named by its call. */
  if (n->task == NODE_NONE || !n->what[0]) snprintf(n->what, sizeof n->what, "%s", what);
}

static struct fk_effect *fk_capture_effect(struct fk_node *n, int kind, void *staging) {
  if (kind == EF_STAGED) {
    struct fk_capture *c = fk_capture_of(n->clock);
    if (c)
      fk_capture_invalidate(c, "a copy from pageable host memory was queued on a captured "
                               "stream (the fake captures copies between device or pinned memory)");
    return NULL;
  }
  (void)staging;
  n->has_effect = 1;
  return &n->effect;
}

/* Whether the calling thread is forbidden potentially unsafe calls now: by its own capture in
 * a mode other than relaxed (global and thread-local modes), or by another thread's capture in
 * the global mode (global mode). With `invalidate`, the captures that forbid it are
 * invalidated for `why`. */
FK_FN int fk_capture_forbids(int invalidate, const char *why) {
  if (!fk_n_captures || fk_t_capture_mode == FK_MODE_RELAXED) return 0;
  int me = fk_thread_number(), forbids = 0;
  for (int i = 0; i < FK_MAX_CAPTURES; i++) {
    struct fk_capture *c = &fk_captures[i];
    if (!c->id) continue;
    int mine = c->thread == me && c->mode != FK_MODE_RELAXED;
    int theirs = fk_t_capture_mode == FK_MODE_GLOBAL && c->thread != me &&
                 c->mode == FK_MODE_GLOBAL;
    if (mine || theirs) {
      forbids = 1;
      if (invalidate) fk_capture_invalidate(c, why);
    }
  }
  return forbids;
}

static int fk_name_has(const char *name, const char *part) { return strstr(name, part) != NULL; }

static int fk_capture_enter(const struct fk_entry *e) {
  if (!fk_n_captures) return FK_OK;
  const char *name = e->name;
  char why[200];
  unsigned g = e->groups;
  if ((g & (FK_G_COPY | FK_G_MEMSET)) && !fk_name_has(name, "Async")) {
    snprintf(why, sizeof why, "%s, a synchronous copy or memset, was called while a stream was "
                              "captured", name);
    fk_capture_invalidate_all(why);
    return FK_CAPTURE_IMPLICIT;
  }
  if (!strcmp(name, "cuCtxSynchronize") || !strcmp(name, "hipDeviceSynchronize") ||
      !strcmp(name, "hipCtxSynchronize")) {
    snprintf(why, sizeof why, "%s was called while a stream was captured", name);
    fk_capture_invalidate_all(why);
    return FK_CAPTURE_UNSUPPORTED;
  }
  int unsafe = (g & (FK_G_ALLOC | FK_G_FREE | FK_G_HOST_ALLOC | FK_G_HOST_FREE)) &&
               !fk_name_has(name, "Async") && !fk_name_has(name, "Pool") &&
               !fk_name_has(name, "MemCreate") && !fk_name_has(name, "MemRelease");
  if (unsafe) {
    snprintf(why, sizeof why, "%s, a potentially unsafe call, was made while a capture forbade it "
                              "(the thread's capture mode is %s)", name,
             fk_t_capture_mode == FK_MODE_GLOBAL ? "global" : "thread-local");
    if (fk_capture_forbids(1, why)) return FK_CAPTURE_UNSUPPORTED;
  }
  return FK_OK;
}

/* A stream query or synchronisation: STREAM_CAPTURE_UNSUPPORTED while it is captured, and,
 * with `invalidate` (CUDA: "when an invalid operation is attempted during stream capture, any
 * associated capture graphs are invalidated"; clr returns the code and leaves it), the capture
 * invalidated. */
FK_FN int fk_capture_sync_check(int clock, int invalidate, const char *call) {
  struct fk_capture *c = fk_capture_of(clock);
  if (!c) return FK_OK;
  if (invalidate) {
    char why[200];
    snprintf(why, sizeof why, "%s of a stream being captured", call);
    fk_capture_invalidate(c, why);
  }
  return FK_CAPTURE_UNSUPPORTED;
}

/* An event query or synchronisation: CAPTURED_EVENT (and the capture invalidated) when its
 * last record was made in a capture still under way. */
FK_FN int fk_capture_event_check(const struct fk_event *e, const char *call) {
  struct fk_capture *c = fk_capture_by_id(e->capture_id);
  if (!c) return FK_OK;
  char why[200];
  snprintf(why, sizeof why, "%s on an event recorded in the capture", call);
  fk_capture_invalidate(c, why);
  return FK_CAPTURED_EVENT;
}

/* A GPU-side wait of `clock` for event `e`. *handled = 1 when the capture rules took it (a
 * stream joining a capture, or the origin waiting for a joined stream): the caller queues no
 * wait. Returns the code. */
FK_FN int fk_capture_wait(int clock, const struct fk_event *e, int *handled) {
  *handled = 0;
  struct fk_capture *ec = fk_capture_by_id(e->capture_id);
  struct fk_capture *wc = fk_capture_of(clock);
  if (ec) {
    if (wc && wc != ec) return FK_CAPTURE_MERGE;
    if (!wc) {
      fk_clocks[clock].capture = (int)(ec - fk_captures) + 1;
      fk_clocks[clock].joined_at = fk_clocks[clock].recorded;
      fk_clocks[clock].rejoined = 0;
    }
    if (clock == ec->origin && e->clock != clock && e->seq > fk_clocks[e->clock].rejoined)
      fk_clocks[e->clock].rejoined = e->seq;
    *handled = 1;
    return FK_OK;
  }
  if (wc && e->recorded && !fk_done(e->clock, e->seq)) return FK_CAPTURE_ISOLATION;
  if (wc) *handled = 1; /* an event complete, or never recorded: nothing to wait for */
  return FK_OK;
}

/* ---- The capture API, shared by both faces ------------------------------------------------- */

FK_FN int fk_capture_begin(int clock, int mode) {
  if (mode < FK_MODE_GLOBAL || mode > FK_MODE_RELAXED) return FK_INVALID_VALUE;
  if (fk_clocks[clock].kind == CK_LEGACY) return FK_CAPTURE_UNSUPPORTED;
  if (fk_clocks[clock].capture) return FK_ILLEGAL_STATE;
  int slot = -1;
  for (int i = 0; i < FK_MAX_CAPTURES; i++)
    if (!fk_captures[i].id) {
      slot = i;
      break;
    }
  if (slot < 0) return FK_OUT_OF_MEMORY;
  int graph = fk_graph_new(fk_clocks[clock].ctx, 0);
  if (graph < 0) return FK_OUT_OF_MEMORY;
  struct fk_capture *c = &fk_captures[slot];
  memset(c, 0, sizeof *c);
  c->id = fk_next_capture_id++;
  c->origin = clock;
  c->mode = mode;
  c->thread = fk_thread_number();
  c->ctx = fk_clocks[clock].ctx;
  c->graph = graph;
  fk_clocks[clock].capture = slot + 1;
  fk_n_captures++;
  return FK_OK;
}

/* Ends the capture begun on `clock`: *graph the graph's handle (0 when none is made). */
FK_FN int fk_capture_end(int clock, unsigned long long *graph) {
  *graph = 0;
  struct fk_capture *c = fk_capture_of(clock);
  if (!c) return FK_ILLEGAL_STATE;
  if (c->origin != clock) return FK_CAPTURE_UNMATCHED;
  if (c->mode != FK_MODE_RELAXED && c->thread != fk_thread_number()) return FK_CAPTURE_WRONG_THREAD;
  int slot = (int)(c - fk_captures) + 1, unjoined = 0;
  for (int k = 1; k < fk_n_clocks; k++) {
    struct fk_clock *x = &fk_clocks[k];
    if (x->capture != slot) continue;
    if (k != clock) {
      unsigned long long last_seen = x->rejoined > x->joined_at ? x->rejoined : x->joined_at;
      if (x->recorded > last_seen) unjoined = 1;
    }
    x->capture = 0;
  }
  int rc = FK_OK;
  if (c->invalidated) {
    rc = FK_CAPTURE_INVALIDATED;
  } else if (unjoined) {
    rc = FK_CAPTURE_UNJOINED;
    fk_capture_invalidate(c, "a stream that joined the capture was not joined back to its origin");
  }
  if (rc == FK_OK)
    *graph = fk_graph_handle(c->graph);
  else
    fk_graph_free(c->graph);
  memset(c, 0, sizeof *c);
  fk_n_captures--;
  fk_progress();
  return rc;
}

/* The capture status of `clock` (0 none, 1 active, 2 invalidated) and its capture's id. The
 * legacy stream while a blocking stream of its context is captured: STREAM_CAPTURE_IMPLICIT
 * (cuStreamIsCapturing). */
FK_FN int fk_capture_status(int clock, int *status, unsigned long long *id) {
  if (fk_clocks[clock].kind == CK_LEGACY) {
    for (int k = 1; k < fk_n_clocks; k++)
      if (fk_clocks[k].capture && fk_clocks[k].blocking && fk_clocks[k].ctx == fk_clocks[clock].ctx)
        return FK_CAPTURE_IMPLICIT;
  }
  const struct fk_capture *c = fk_capture_of(clock);
  if (status) *status = c ? (c->invalidated ? 2 : 1) : 0;
  if (id) *id = c ? c->id : 0;
  return FK_OK;
}

FK_FN int fk_capture_exchange_mode(int *mode) {
  if (!mode || *mode < FK_MODE_GLOBAL || *mode > FK_MODE_RELAXED) return FK_INVALID_VALUE;
  int old = fk_t_capture_mode;
  fk_t_capture_mode = *mode;
  *mode = old;
  return FK_OK;
}

/* An executable graph made from graph `handle`: a copy of its nodes. */
FK_FN int fk_graph_instantiate(unsigned long long handle, unsigned long long *exec) {
  int from = fk_graph_of(handle, 0);
  if (from < 0) return FK_INVALID_VALUE;
  int slot = fk_graph_new(fk_graphs[from].ctx, 1);
  if (slot < 0) return FK_OUT_OF_MEMORY;
  const struct fk_graph *g = &fk_graphs[from];
  for (int i = 0; i < g->n; i++) {
    struct fk_node *n = fk_graph_append(slot);
    if (!n) {
      fk_graph_free(slot);
      return FK_OUT_OF_MEMORY;
    }
    *n = g->nodes[i];
    n->effect.staging = NULL; /* captured effects hold no staging (fk_capture_effect) */
  }
  *exec = fk_graph_handle(slot);
  return FK_OK;
}

FK_FN int fk_graph_destroy(unsigned long long handle, int exec) {
  int slot = fk_graph_of(handle, exec);
  if (slot < 0) return FK_INVALID_VALUE;
  fk_graph_free(slot);
  return FK_OK;
}

/* cuGraphGetNodes / hipGraphGetNodes: with `nodes` NULL the node count in *count; else the
 * first *count nodes as opaque handles (the graph's serial above bit 24, the node's index
 * below), *count set to how many were written. */
FK_FN int fk_graph_nodes(unsigned long long handle, void **nodes, size_t *count) {
  int slot = fk_graph_of(handle, 0);
  if (slot < 0 || !count) return FK_INVALID_VALUE;
  size_t n = (size_t)fk_graphs[slot].n;
  if (!nodes) {
    *count = n;
    return FK_OK;
  }
  size_t k = *count < n ? *count : n;
  for (size_t i = 0; i < k; i++)
    nodes[i] = (void *)(uintptr_t)(FK_NODE_BASE + (fk_graphs[slot].serial << 24) + i);
  *count = k;
  return FK_OK;
}

/* Launches executable graph `handle` on `clock`: each node queued in capture order. On a
 * captured stream the nodes join that capture (a child graph, flattened). */
FK_FN int fk_graph_launch(unsigned long long handle, int clock) {
  int slot = fk_graph_of(handle, 1);
  if (slot < 0) return FK_INVALID_VALUE;
  struct fk_graph *g = &fk_graphs[slot];
  g->launches++;
  int device = fk_ctxs[fk_clocks[clock].ctx].device;
  char stream_name[96];
  fk_clock_name(clock, stream_name, sizeof stream_name);
  for (int i = 0; i < g->n; i++) {
    const struct fk_node *n = &g->nodes[i];
    unsigned long long seq = fk_queue(clock);
    char what[96];
    snprintf(what, sizeof what, "%.40s, node %d of graph %#llx", n->what, i, handle);
    if (n->task != NODE_NONE) {
      unsigned long long id = fk_task_new(clock, seq, what, n->task == NODE_HOST, n->fn, n->data);
      struct fk_task *t = fk_task_of(id);
      if (t && n->task == NODE_KERNEL) {
        snprintf(t->name, sizeof t->name, "kernel %llu (%.40s, graph %#llx node %d)", id, n->what,
                 handle, i);
        snprintf(what, sizeof what, "%s", t->name);
        fk_t_last_kernel = id;
      }
    }
    for (int r = 0; r < n->n_ranges; r++) {
      const struct fk_node_range *x = &n->ranges[r];
      if (!fk_clocks[clock].capture && !fk_device_range(x->va, x->size, device) &&
          !fk_pinned_range(x->va, x->size)) {
        fk_hazard("a launch of graph %#llx on %s: %s %s [%#llx, %#llx), captured there, which is "
                  "no longer memory device %d may use (freed, unmapped, trimmed or slept since "
                  "the capture)",
                  handle, stream_name, what, fk_verb(x->mode), x->va, x->va + x->size, device);
        continue;
      }
      fk_use(clock, seq, x->va, x->size, x->mode, what);
    }
    if (n->has_effect) {
      const struct fk_effect *e = &n->effect;
      fk_effect_add(clock, seq, e->kind, e->dst, e->src, e->size, e->value, e->width, NULL);
      fk_effect_rows(e->rows, e->dpitch, e->spitch);
    }
  }
  fk_progress();
  return FK_OK;
}

static void fk_graphs_reset(void) {
  for (int i = 0; i < FK_MAX_GRAPHS; i++)
    if (fk_graphs[i].serial) fk_graph_free(i);
  memset(fk_captures, 0, sizeof fk_captures);
  fk_n_captures = 0;
  fk_n_invalidations = 0;
  fk_last_invalidation[0] = 0;
}

/* ---- The control API ---------------------------------------------------------------------- */

/* Captures invalidated since the last reset (by a forbidden call, an event query, a copy the
 * fake does not capture, an unjoined fork), and the reason for the last one (copied into
 * `out`, at most `n` bytes, NUL-terminated; `out` may be NULL). */
FAKE_EXPORT long long fake_capture_invalidations(char *out, unsigned long long n) {
  long long count = 0;
  LOCKED({
    count = fk_n_invalidations;
    if (out && n) snprintf(out, (size_t)n, "%s", fk_last_invalidation);
  });
  return count;
}

/* Times executable graph `exec` was launched (-1: no such executable graph). */
FAKE_EXPORT long long fake_graph_launches(unsigned long long exec) {
  long long n = -1;
  LOCKED({
    int slot = fk_graph_of(exec, 1);
    if (slot >= 0) n = (long long)fk_graphs[slot].launches;
  });
  return n;
}

#endif /* FAKE_GRAPHS_H */
