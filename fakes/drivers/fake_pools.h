/*
 * fake_pools.h: stream-ordered memory pools for both drivers (see fake_core.h), as the
 * vendors document them:
 *
 *   - a pool hands out blocks stream-ordered: a block freed on a stream (cuMemFreeAsync,
 *     hipFreeAsync) is cached by the pool; a request takes the smallest cached block that
 *     fits and is safe for its stream — freed on that very stream, or freed on a stream whose
 *     work up to the free has completed — else memory from the device;
 *   - at a synchronisation a pool gives back what it holds above its release threshold
 *     (only blocks whose free completed); a trim gives back down to what it is asked to
 *     keep; a request the device cannot serve gives back the cached blocks and tries once
 *     more;
 *   - a destroyed pool's handle is invalid at once, and its memory goes when its last block
 *     is freed and that free completed;
 *   - the attributes (CU_MEMPOOL_ATTR_*, hipMemPoolAttr*, the same numbers): 1-3 the reuse
 *     policies (int), 4 the release threshold, 5/6 reserved bytes now/high, 7/8 used bytes
 *     now/high (a high is reset to the current value by setting 0).
 * Giving a block back while an operation in flight uses it, and handing one out under an
 * operation not ordered before the stream that receives it, are hazards.
 */
#ifndef FAKE_POOLS_H
#define FAKE_POOLS_H

#define FK_MAX_POOLS 64
#define FK_POOL_BASE 0x9e0000000000ULL

struct fk_pool_stats {
  int reuse[3];
  unsigned long long threshold, reserved, reserved_high, used, used_high;
};

struct fk_pool {
  unsigned long long serial; /* 0: a free slot */
  int destroyed, device, is_default;
  struct fk_pool_stats stats;
};
static struct fk_pool fk_pools[FK_MAX_POOLS];
static unsigned long long fk_next_pool = 1;
static unsigned long long fk_current_pool[FK_MAX_DEVICES]; /* set by cuDeviceSetMemPool; 0: the default */

FK_FN unsigned long long fk_pool_handle(int slot) {
  return FK_POOL_BASE + 16 * fk_pools[slot].serial;
}

/* The slot of a live (not destroyed) pool handle, or -1. */
FK_FN int fk_pool_of(unsigned long long handle) {
  for (int p = 0; p < FK_MAX_POOLS; p++)
    if (fk_pools[p].serial && !fk_pools[p].destroyed && fk_pool_handle(p) == handle) return p;
  return -1;
}

/* A new pool on `device` with release threshold `threshold`, every reuse policy on; its
 * slot, or -1 when there is no room. */
FK_FN int fk_pool_new(int device, int is_default, unsigned long long threshold) {
  for (int p = 0; p < FK_MAX_POOLS; p++) {
    struct fk_pool *x = &fk_pools[p];
    if (x->serial) continue;
    memset(x, 0, sizeof *x);
    x->serial = fk_next_pool++;
    x->device = device;
    x->is_default = is_default;
    x->stats.reuse[0] = x->stats.reuse[1] = x->stats.reuse[2] = 1;
    x->stats.threshold = threshold;
    return p;
  }
  return -1;
}

/* The default pool of `device` (made at first use, with release threshold `threshold`). */
FK_FN int fk_default_pool(int device, unsigned long long threshold) {
  for (int p = 0; p < FK_MAX_POOLS; p++)
    if (fk_pools[p].serial && fk_pools[p].is_default && fk_pools[p].device == device) return p;
  return fk_pool_new(device, 1, threshold);
}

/* The pool cuMemAllocAsync / hipMallocAsync use on `device`: the one set, else the
 * default. */
FK_FN int fk_device_pool(int device, unsigned long long threshold) {
  int set = fk_current_pool[device] ? fk_pool_of(fk_current_pool[device]) : -1;
  return set >= 0 ? set : fk_default_pool(device, threshold);
}

/* Sets attribute `attr` from `value`: FK_INVALID_VALUE for an unknown attribute or a high
 * reset to non-0. */
FK_FN int fk_pool_set(struct fk_pool *x, int attr, const void *value) {
  struct fk_pool_stats *s = &x->stats;
  if (!value) return FK_INVALID_VALUE;
  if (attr >= 1 && attr <= 3) {
    s->reuse[attr - 1] = *(const int *)value;
    return FK_OK;
  }
  unsigned long long v = *(const unsigned long long *)value;
  switch (attr) {
    case 4: s->threshold = v; return FK_OK;
    case 6:
      if (v) return FK_INVALID_VALUE; /* a high is only reset, to 0 */
      s->reserved_high = s->reserved;
      return FK_OK;
    case 8:
      if (v) return FK_INVALID_VALUE;
      s->used_high = s->used;
      return FK_OK;
    default: return FK_INVALID_VALUE;
  }
}

FK_FN int fk_pool_get(const struct fk_pool *x, int attr, void *value) {
  const struct fk_pool_stats *s = &x->stats;
  if (!value) return FK_INVALID_VALUE;
  const unsigned long long by_attr[] = {0, 0, 0, 0, s->threshold, s->reserved, s->reserved_high,
                                        s->used, s->used_high};
  if (attr >= 1 && attr <= 3)
    *(int *)value = s->reuse[attr - 1];
  else if (attr >= 4 && attr <= 8)
    *(unsigned long long *)value = by_attr[attr];
  else
    return FK_INVALID_VALUE;
  return FK_OK;
}

FK_FN void fk_pool_grow(struct fk_pool *x, unsigned long long reserved, unsigned long long used) {
  struct fk_pool_stats *s = &x->stats;
  s->reserved += reserved;
  s->used += used;
  if (s->reserved > s->reserved_high) s->reserved_high = s->reserved;
  if (s->used > s->used_high) s->used_high = s->used;
}

/* Gives a cached block back to the device. */
FK_FN void fk_pool_give_back(struct fk_pool *x, struct fk_region *b) {
  fk_check_unused(b->va, b->size, "a pool giving back a block");
  munmap((void *)(uintptr_t)b->va, b->span);
  x->stats.reserved -= b->size;
  fk_uncharge(x->device, b->size);
  fk_region_drop(b);
}

/* Gives back cached blocks whose free completed until the pool holds at most `keep` (never
 * what is in use, nor a block whose free is still in flight). */
FK_FN void fk_pool_release(int slot, unsigned long long keep) {
  struct fk_pool *x = &fk_pools[slot];
  for (int i = 0; i < fk_regions_high && x->stats.reserved > keep; i++) {
    struct fk_region *b = &fk_regions[i];
    if (b->kind == R_POOL && b->pool == slot && !b->in_use && fk_done(b->free_clock, b->free_seq))
      fk_pool_give_back(x, b);
  }
}

/* A destroyed pool gives back every block whose free completed; its slot is free once it
 * holds none. */
FK_FN void fk_pool_settle(int slot) {
  fk_pool_release(slot, 0);
  for (int i = 0; i < fk_regions_high; i++)
    if (fk_regions[i].kind == R_POOL && fk_regions[i].pool == slot) return;
  fk_pools[slot].serial = 0;
}

/* At a synchronisation: pools give back what is above their threshold, destroyed pools
 * what they can. */
FK_FN void fk_pools_sync(void) {
  for (int p = 0; p < FK_MAX_POOLS; p++) {
    struct fk_pool *x = &fk_pools[p];
    if (!x->serial) continue;
    if (x->destroyed)
      fk_pool_settle(p);
    else if (x->stats.reserved > x->stats.threshold)
      fk_pool_release(p, x->stats.threshold);
  }
}

FK_FN int fk_pool_destroy(int slot) {
  if (fk_pools[slot].is_default) return FK_INVALID_VALUE;
  fk_pools[slot].destroyed = 1;
  fk_pool_settle(slot);
  return FK_OK;
}

static int fk_capture_refuse(int clock, const char *why); /* fake_graphs.h */

/* `size` bytes from pool `slot` for work on `clock`, blocks rounded up to `round`. */
FK_FN int fk_pool_alloc(int slot, int clock, unsigned long long size, unsigned long long round,
                        const char *what, unsigned long long *out) {
  if (fk_clocks[clock].capture)
    return fk_capture_refuse(clock, "a stream-ordered allocation on a captured stream (a graph "
                                    "memory node, which the fake does not model)");
  struct fk_pool *x = &fk_pools[slot];
  unsigned long long bytes = fk_round_up(size, round);
  if (bytes < size) return FK_OUT_OF_MEMORY;
  struct fk_region *best = NULL;
  for (int i = 0; i < fk_regions_high; i++) {
    struct fk_region *b = &fk_regions[i];
    if (b->kind != R_POOL || b->pool != slot || b->in_use || b->size < bytes) continue;
    int safe = fk_done(b->free_clock, b->free_seq) || b->free_clock == clock;
    if (safe && (!best || b->size < best->size)) best = b;
  }
  if (best) {
    fk_check_handout(best->va, best->size, clock, what);
    best->in_use = 1;
    fk_pool_grow(x, 0, best->size);
    *out = best->va;
    return FK_OK;
  }
  if (!fk_charge(x->device, bytes)) {
    /* As the drivers do: give back the cached memory and try once more. */
    fk_pool_release(slot, 0);
    if (!fk_charge(x->device, bytes)) return FK_OUT_OF_MEMORY;
  }
  unsigned long long span = fk_round_up(bytes, fk_page());
  void *mem = fk_map_anonymous(span);
  struct fk_region *b = mem ? fk_region_add(R_POOL, (unsigned long long)(uintptr_t)mem, bytes, x->device)
                            : NULL;
  if (!b) {
    if (mem) munmap(mem, span);
    fk_uncharge(x->device, bytes);
    return FK_OUT_OF_MEMORY;
  }
  b->span = span;
  b->pool = slot;
  b->in_use = 1;
  b->charge = bytes;
  fk_pool_grow(x, bytes, bytes);
  *out = b->va;
  return FK_OK;
}

/* Frees the pool block at `ptr` on `clock`: FK_INVALID_VALUE when no pool handed it out. */
FK_FN int fk_pool_free(unsigned long long ptr, int clock) {
  if (fk_clocks[clock].capture)
    return fk_capture_refuse(clock, "a stream-ordered free on a captured stream (a graph memory "
                                    "node, which the fake does not model)");
  for (int i = 0; i < fk_regions_high; i++) {
    struct fk_region *b = &fk_regions[i];
    if (b->kind != R_POOL || !b->in_use || b->va != ptr) continue;
    int slot = b->pool;
    b->in_use = 0;
    b->free_clock = clock;
    b->free_seq = fk_enqueue(clock);
    fk_pools[slot].stats.used -= b->size;
    if (fk_pools[slot].destroyed) fk_pool_settle(slot);
    return FK_OK;
  }
  return FK_INVALID_VALUE;
}

/* A pool's block at `ptr` freed by the plain free call (cuMemFree, hipFree) named `what`: at
 * once, not stream-ordered (the caller synchronised, or must have: cuMemFree "will not perform
 * any implicit synchronization" of stream-ordered memory). 0 when no pool handed it out. */
FK_FN int fk_pool_free_now(unsigned long long ptr, const char *what) {
  for (int i = 0; i < fk_regions_high; i++) {
    struct fk_region *b = &fk_regions[i];
    if (b->kind != R_POOL || !b->in_use || b->va != ptr) continue;
    fk_check_unused(b->va, b->size, what);
    b->in_use = 0;
    b->free_clock = 0;
    b->free_seq = 0;
    fk_pools[b->pool].stats.used -= b->size;
    if (fk_pools[b->pool].destroyed) fk_pool_settle(b->pool);
    return 1;
  }
  return 0;
}

FK_FN void fk_pools_reset(void) {
  memset(fk_pools, 0, sizeof fk_pools);
  memset(fk_current_pool, 0, sizeof fk_current_pool);
}

#endif /* FAKE_POOLS_H */
