//! The address-space side of [`super::VmmAllocator`]: a pure chunk manager over reserved
//! virtual-address ranges, with no device and no I/O.
//!
//! * Each reservation is a **region**, tiled exactly by **chunks** (free or in use). Free
//!   chunks coalesce at once with free neighbours of the same region — across granule
//!   boundaries, whatever is mapped beneath them: the physical side is the allocator's
//!   business, not this one's.
//! * Free chunks are indexed by `(size, address)`. **Best fit**: the smallest free chunk that
//!   fits. Two ends: a *low* request takes the lowest address among the equals and sits at
//!   the chunk's start; a *high* request takes the highest address among them and sits at the
//!   chunk's end. Small and large allocations thus grow towards each other from the two ends
//!   of a reservation, and the small ones cannot pin granules between the large ones.
//! * Every chunk handed out is split to the request (256-byte units): the remainder stays
//!   free. This departs from bfc's split rule on purpose — an unsplit remainder could hold
//!   physical memory nobody can use. Once [`Space::fold_within`] names the granule, the one
//!   exception is a remainder that cannot: at most an eighth of the request, inside the
//!   granule of the request's nearest byte, goes with the request.
//!
//! **Structures**, sized for a steady state of hundreds of thousands of live chunks (where
//! B-trees keyed by address miss the cache on every level, several times per operation): the
//! chunks live in a slab (`Vec`) linked to their neighbours by slot (`prev`/`next`, within a
//! region only, as bfc's arena keeps them); the free chunks of each class sit in a
//! [`FreeIndex`], as bfc's do (size classes with bitmaps, each class sorted by `(size,
//! address)`), which keeps the exact `(size, address)` order and hence the same placements
//! as one ordered set.
//! Nothing maps addresses to slots: a chunk is found from what names it — a [`Grant`]'s token
//! carries the slot, a [`Placement`] the free chunk's slot, each region its first slot — in
//! one load, then checked against the address (a hash probe per operation would cost
//! [`Space::free`] a cache miss or two at scale before the chunk's own).
//!
//! **Tokens** are `(serial << 32) | slot`: `serial` counts the hand-outs (1, 2, …, skipping
//! the multiples of 2³², so that no token is 0), `slot` is the chunk's slot. A token is
//! honoured only while the chunk in its slot is in use at the address given with it under
//! exactly that token, so a stale or forged token is refused — with one bound: the serial
//! keeps only its low 32 bits, so a token can come back once 2³² more hand-outs have been
//! made, if the same slot is handed out again at that very serial (low bits) and address. A
//! token kept that long after its free (over an hour at a million hand-outs a second) could
//! then free another allocation; tokens guard against mistakes, not malice.
//!
//! Every operation is `O(1)` for the chunks plus `O(log k)` in the free index for `k` free
//! chunks in a size class, except an aligned request, which may try several candidates, and
//! the walks (reports, checks, [`Space::in_use_overlapping`]), which are linear in the chunks
//! of the regions they walk.
#![deny(unsafe_code)]

use crate::report::{BinSummary, RegionMap};
use crate::strategy::bins::MIN_ALLOCATION;
use crate::strategy::free_index::{Entry, FreeIndex, Hint};
use crate::strategy::occupancy::{self, check_new_region, ChunkUse, RegionCheck, Tally};
/// Classes every space has from the start: each region serves one class of requests, and
/// each class has its own free index. The allocator numbers its classes (small or large,
/// one per tag that can sleep); a class beyond these gets its index at its first region.
pub const CLASSES: usize = 2;

/// "No chunk" in a link or list head.
const NONE: u32 = u32::MAX;

/// A token's low bits: the slot.
const SLOT_BITS: u32 = 32;

/// The token of hand-out `serial` of slot `slot` (see the module docs).
#[inline]
fn token_of(serial: u64, slot: u32) -> u64 {
    (serial << SLOT_BITS) | u64::from(slot)
}

/// The slot a token names.
#[inline]
fn slot_of(token: u64) -> u32 {
    token as u32
}

/// One slab slot: a chunk, or vacant (`size == 0`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Chunk {
    /// First byte.
    addr: u64,
    /// Bytes; a non-zero multiple of 256 for a chunk, 0 for a vacant slot.
    size: u64,
    /// Bytes the user asked for (in use only; 0 when free).
    requested: u64,
    /// 0 when free; otherwise the token of the allocation holding it, which names this
    /// slot (see the module docs).
    token: u64,
    /// The chunk just below in the same region, or `NONE` at the region's base.
    prev: u32,
    /// The chunk just above in the same region, or `NONE` at the region's end; for a vacant
    /// slot, the next vacant slot.
    next: u32,
    /// Index of the region (reservation) it lies in.
    region: u32,
    /// The allocator's label of a chunk in use ([`Space::set_label`]): the record of its
    /// tag, where the allocator keeps one (see `sleep`). Held in what was the record's
    /// padding, so it costs no memory and no load: the allocator reads and writes it where
    /// allocate and free touch the chunk anyway. 0 when free, and for a chunk handed out
    /// (by [`Space::commit`] or [`Space::carve`]) until it is set.
    label: u32,
}

// The label fills the padding: a chunk's record stays 48 bytes.
const _: () = assert!(std::mem::size_of::<Chunk>() == 48);

impl Chunk {
    const VACANT: Chunk = Chunk {
        addr: 0,
        size: 0,
        requested: 0,
        token: 0,
        prev: NONE,
        next: NONE,
        region: NONE,
        label: 0,
    };

    fn is_free(&self) -> bool {
        self.token == 0
    }

    /// The chunk as an out-of-memory report sees it.
    fn usage(&self) -> ChunkUse {
        ChunkUse {
            addr: self.addr,
            size: self.size,
            requested: (!self.is_free()).then_some(self.requested),
        }
    }
}

/// Where a request would go: found by [`Space::find`] or [`Space::candidates`], taken by
/// [`Space::commit`]. Only those make one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    /// The free chunk it comes out of.
    pub chunk: u64,
    /// Size of that chunk.
    pub chunk_size: u64,
    /// First byte of the allocation.
    pub addr: u64,
    /// The slot that chunk was in when found: spares [`Space::commit`] a search.
    slot: u32,
    /// Where the chunk sat in the free index when found: spares [`Space::commit`] another.
    hint: Hint,
}

/// An allocation made by [`Space::commit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    /// First byte.
    pub addr: u64,
    /// Bytes of the chunk: the rounded request, with a remainder folded into it where
    /// [`Space::fold_within`] folds one.
    pub size: u64,
    /// What [`Space::free`] needs.
    pub token: u64,
}

/// The chunk manager. See the module docs.
#[derive(Debug)]
pub struct Space {
    /// The slab. Invariant: the non-vacant slots are exactly the chunks reachable from the
    /// regions' first slots (`heads`) by `next` links; within a region they tile it exactly,
    /// in address order, with `prev`/`next` links that agree, `region` naming it, no two
    /// neighbours both free, and each token in use naming its own slot with a serial handed
    /// out already.
    chunks: Vec<Chunk>,
    /// Head of the list of vacant slots (linked through `next`), or `NONE`. Invariant: the
    /// list holds exactly the vacant slots.
    vacant: u32,
    /// Bit `s % 64` of word `s / 64` set iff slot `s` holds a chunk in use (`token != 0`).
    /// [`Space::free`] asks here whether a neighbour is free, so that a neighbour in use —
    /// which a free leaves alone — is never loaded (a cache miss apiece at scale). Invariant:
    /// exactly those bits are set, and there is a word for every slot.
    in_use: Vec<u64>,
    /// The slot of the chunk at each region's base (index = `Chunk::region`). It never
    /// changes: a split leaves a chunk's slot to its lowest piece, and a merge keeps the lower
    /// chunk's slot. Invariant: one per region, the slot of the chunk at its base.
    heads: Vec<u32>,
    /// Invariant: `free[k]` holds exactly the free chunks of the regions of class `k`, each
    /// under its size, address and slot; at least [`CLASSES`] of them.
    free: Vec<FreeIndex>,
    /// Reservations `(base, size)`, in the order they were added; index = `Chunk::region`.
    /// Invariant: they do not overlap.
    regions: Vec<(u64, u64)>,
    /// The class of each region.
    class_of: Vec<usize>,
    /// Invariant: sum of the sizes of the chunks in use.
    bytes_in_use: u64,
    /// Invariant: number of chunks in use.
    live: usize,
    /// The serial of the last hand-out (see the module docs). Invariant: no token in use
    /// has serial 0 or, before the serials wrap, a larger one.
    last_serial: u64,
    /// The granule remainders are folded within ([`Space::fold_within`]); 0: never folded.
    /// Invariant: 0 or a power of two.
    fold_granule: u64,
}

/// A remainder of at most `1 / FOLD_PART` of the request is folded into it (see
/// [`Space::fold_within`]): the slack is at most an eighth of the request (a ninth of the
/// chunk), as a bound on what a fold withholds from other requests.
pub const FOLD_PART: u64 = 8;

impl Default for Space {
    fn default() -> Self {
        Self::new()
    }
}

fn align_up(addr: u64, alignment: u64) -> Option<u64> {
    addr.checked_add(alignment - 1)
        .map(|a| a & !(alignment - 1))
}

impl Space {
    /// An empty space.
    pub fn new() -> Self {
        Space {
            chunks: Vec::new(),
            vacant: NONE,
            in_use: Vec::new(),
            heads: Vec::new(),
            free: (0..CLASSES).map(|_| FreeIndex::new()).collect(),
            regions: Vec::new(),
            class_of: Vec::new(),
            bytes_in_use: 0,
            live: 0,
            last_serial: 0,
            fold_granule: 0,
        }
    }

    /// From now on, a split's remainder that lies wholly inside a granule of `granule`
    /// bytes the allocation touches anyway, and is at most `1 / FOLD_PART` of the request,
    /// goes with the allocation instead of becoming a free chunk (`0`: never). Such a
    /// remainder can hold no physical memory of its own, and as a free chunk it would be a
    /// sliver that best fit leaves at the low addresses it prefers: most of the free index's
    /// work in a steady churn (each one moved through its class, and merged again at the
    /// next free), for a range few requests fit. A remainder left below the request
    /// (placement at a chunk's high end) moves the allocation down to the chunk's start,
    /// where the start is aligned at least as the placement was.
    ///
    /// # Panics
    /// When `granule` is neither 0 nor a power of two.
    pub fn fold_within(&mut self, granule: u64) {
        assert!(
            granule == 0 || granule.is_power_of_two(),
            "granule {granule}"
        );
        self.fold_granule = granule;
    }

    /// Whether a remainder of `rest` bytes is folded into a request of `rounded` bytes (see
    /// [`Space::fold_within`]), `[start, end)` being the remainder with the request's byte
    /// next to it: it lies in that byte's granule when `start` and `end - 1` share one.
    #[inline(always)]
    fn folds(&self, rest: u64, rounded: u64, start: u64, end: u64) -> bool {
        let g = self.fold_granule;
        g != 0 && rest <= rounded / FOLD_PART && (start ^ (end - 1)) < g
    }

    /// Adds the region `[base, base + size)` as one free chunk.
    ///
    /// # Errors
    /// A message for a range that is empty, not in 256-byte units, overflows, or overlaps
    /// a region already added, or when the slab is full.
    ///
    /// # Time complexity
    /// `O(regions)`.
    pub fn add_region(&mut self, base: u64, size: u64, class: usize) -> Result<(), String> {
        if class >= u32::MAX as usize {
            return Err(format!("class {class} is out of range"));
        }
        check_new_region(base, size, self.regions.iter().copied())?;
        let region = u32::try_from(self.regions.len())
            .ok()
            .filter(|&r| r != NONE)
            .ok_or("too many regions")?;
        let idx = self.take_slot().ok_or("the chunk table is full")?;
        self.regions.push((base, size));
        self.class_of.push(class);
        self.chunks[idx as usize] = Chunk {
            addr: base,
            size,
            requested: 0,
            token: 0,
            prev: NONE,
            next: NONE,
            region,
            label: 0,
        };
        self.heads.push(idx);
        if self.free.len() <= class {
            self.free.resize_with(class + 1, FreeIndex::new);
        }
        self.free[class].insert(size, base, idx);
        Ok(())
    }

    /// The class of region `region` (an index into [`Space::regions`]).
    pub fn class_of_region(&self, region: usize) -> usize {
        self.class_of[region]
    }

    /// The region (index into [`Space::regions`]) holding `addr`, if any.
    ///
    /// # Time complexity
    /// `O(regions)`.
    pub fn region_at(&self, addr: u64) -> Option<usize> {
        self.regions
            .iter()
            .position(|&(base, size)| base <= addr && addr - base < size)
    }

    /// The class of the region of the chunk in use (or pending) named by `token`.
    ///
    /// # Time complexity
    /// `O(1)`: the token names the chunk's slot.
    pub fn class_of_token(&self, token: u64) -> Option<usize> {
        let c = self.chunks.get(slot_of(token) as usize)?;
        (c.size != 0).then(|| self.class_of[c.region as usize])
    }

    /// True when some chunk of region `region` is in use (pending frees and sleepers too).
    ///
    /// # Time complexity
    /// Linear in the region's chunks.
    pub fn region_in_use(&self, region: usize) -> bool {
        self.walk(self.head(region)).any(|c| !c.is_free())
    }

    /// Moves region `region`, one free chunk, to class `class`: requests of its old class are
    /// no longer placed there (a region whose addresses could not be had again).
    ///
    /// # Errors
    /// A message when the region holds a chunk in use.
    pub fn reclass_free_region(&mut self, region: usize, class: usize) -> Result<(), String> {
        let idx = self.head(region);
        let c = self.chunks[idx as usize];
        let (base, size) = self.regions[region];
        if !c.is_free() || c.size != size || c.addr != base {
            return Err(format!("region {base:#x}+{size} is not one free chunk"));
        }
        let old = self.class_of[region];
        self.free[old].remove(c.size, c.addr);
        if self.free.len() <= class {
            self.free.resize_with(class + 1, FreeIndex::new);
        }
        self.free[class].insert(c.size, c.addr, idx);
        self.class_of[region] = class;
        Ok(())
    }

    /// The regions `(base, size)`, in the order they were added.
    pub fn regions(&self) -> &[(u64, u64)] {
        &self.regions
    }

    /// Bytes of the chunks in use.
    pub fn bytes_in_use(&self) -> u64 {
        self.bytes_in_use
    }

    /// Number of chunks in use.
    pub fn live_count(&self) -> usize {
        self.live
    }

    /// The largest free chunk (0 when none).
    ///
    /// # Time complexity
    /// `O(1)` per class (`O(log k)` where its top size class is a tree).
    pub fn largest_free(&self) -> u64 {
        self.free
            .iter()
            .filter_map(|f| f.largest().map(|e| e.size))
            .max()
            .unwrap_or(0)
    }

    /// Free chunks `(size, addr)` of every class, from the largest down.
    ///
    /// # Time complexity
    /// `O(n log n)` in the free chunks.
    pub fn free_chunks_descending(&self) -> Vec<(u64, u64)> {
        let mut all: Vec<(u64, u64)> = self
            .free
            .iter()
            .flat_map(FreeIndex::entries)
            .map(|e| (e.size, e.addr))
            .collect();
        all.sort_unstable_by(|a, b| b.cmp(a));
        all
    }

    /// Every free chunk as `(size, addr)`, in slot order (no order of size or address):
    /// for a maximum over the free chunks taken on every stats sample, where collecting and
    /// sorting them all (as [`Space::free_chunks_descending`] does) costs far more.
    ///
    /// # Time complexity
    /// `O(slots)`, one sequential pass over the slab, allocating nothing.
    pub fn free_chunks(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.chunks
            .iter()
            .filter(|c| c.size != 0 && c.is_free())
            .map(|c| (c.size, c.addr))
    }

    /// True when some region of `class` exists.
    pub fn has_class(&self, class: usize) -> bool {
        self.class_of.contains(&class)
    }

    /// Where `rounded` bytes aligned to `alignment` would go in `(size, addr)`-ordered chunk
    /// `(size, addr)`: at its start (`high == false`) or its end; `None` if it does not fit.
    #[inline]
    pub fn fit(size: u64, addr: u64, rounded: u64, alignment: u64, high: bool) -> Option<u64> {
        let end = addr + size;
        if high {
            let start = end.checked_sub(rounded)? & !(alignment - 1);
            (start >= addr).then_some(start)
        } else {
            let start = align_up(addr, alignment)?;
            (start.checked_add(rounded)? <= end).then_some(start)
        }
    }

    /// The best fit for the request (see the module docs), or `None` when no free chunk fits.
    ///
    /// # Time complexity
    /// `O(log k)` for 256-byte alignment; otherwise linear in the candidates tried.
    #[inline(always)]
    pub fn find(
        &self,
        class: usize,
        rounded: u64,
        alignment: u64,
        high: bool,
    ) -> Option<Placement> {
        if alignment == MIN_ALLOCATION {
            // Every chunk starts on 256 and spans whole 256-byte units, so any chunk of at
            // least `rounded` bytes fits at either end: the best fit is the first entry of
            // the smallest size that fits (low), or the last of that size (high).
            let (e, hint) = self.free.get(class)?.best_fit_hinted(rounded, high)?;
            if let Some(addr) = Self::fit(e.size, e.addr, rounded, alignment, high) {
                return Some(Placement {
                    hint,
                    ..Self::placed(e, addr)
                });
            }
        }
        Self::find_aligned(self.free.get(class)?, rounded, alignment, high)
    }

    /// A placement at `addr` in the free chunk `e`.
    #[inline]
    fn placed(e: Entry, addr: u64) -> Placement {
        Placement {
            chunk: e.addr,
            chunk_size: e.size,
            addr,
            slot: e.idx,
            hint: Hint::NONE,
        }
    }

    /// [`Space::find`] for an alignment above 256 bytes, where a chunk large enough may
    /// still not fit: the candidates are tried in order.
    ///
    /// # Time complexity
    /// Linear in the candidates tried.
    #[inline(never)]
    fn find_aligned(
        free: &FreeIndex,
        rounded: u64,
        alignment: u64,
        high: bool,
    ) -> Option<Placement> {
        let placed = Self::placed;
        if !high {
            let mut at = 0;
            let e = free.find(rounded, |e| {
                Self::fit(e.size, e.addr, rounded, alignment, false).is_some_and(|a| {
                    at = a;
                    true
                })
            })?;
            return Some(placed(e, at));
        }
        // High: the smallest size with a fit, and among its chunks the highest address that
        // fits — the last fitting one in address order.
        let mut best: Option<(Entry, u64)> = None;
        for e in free.iter_from(rounded) {
            if best.is_some_and(|(b, _)| b.size != e.size) {
                break;
            }
            if let Some(at) = Self::fit(e.size, e.addr, rounded, alignment, true) {
                best = Some((e, at));
            }
        }
        best.map(|(e, at)| placed(e, at))
    }

    /// Every place the request could go: the start and the end of each free chunk that fits
    /// (with the alignment honoured), in best-fit order. For the search under memory
    /// pressure.
    ///
    /// # Time complexity
    /// `O(free chunks)`.
    pub fn candidates(
        &self,
        class: usize,
        rounded: u64,
        alignment: u64,
    ) -> impl Iterator<Item = Placement> + '_ {
        self.free
            .get(class)
            .into_iter()
            .flat_map(move |f| f.iter_from(rounded))
            .flat_map(move |Entry { size, addr, idx }| {
                let low = Self::fit(size, addr, rounded, alignment, false);
                let high =
                    Self::fit(size, addr, rounded, alignment, true).filter(|&h| Some(h) != low);
                let e = Entry { size, addr, idx };
                low.into_iter()
                    .chain(high)
                    .map(move |at| Self::placed(e, at))
            })
    }

    /// Hands out `rounded` bytes at `p.addr` from the free chunk `p.chunk` (a placement found
    /// by [`Space::find`] or [`Space::candidates`], normally with no change since) — with the
    /// remainder on one side, from `p.chunk` or to the chunk's end, where it is folded (see
    /// [`Space::fold_within`]): the grant says where and how much; `None`
    /// when the placement is stale — no free chunk of `p.chunk_size` bytes at `p.chunk` any
    /// more, or the range not inside it — or the slab is full.
    ///
    /// # Time complexity
    /// `O(1)` plus `O(log k)` in the free index.
    #[inline]
    pub fn commit(&mut self, p: Placement, rounded: u64, requested: u64) -> Option<Grant> {
        let idx = self.placed_slot(&p)?;
        let c = self.chunks[idx as usize];
        let end = p.chunk + c.size;
        let taken_end = p.addr.checked_add(rounded)?;
        if p.addr < p.chunk || taken_end > end {
            return None;
        }
        let (mut front, mut back) = (p.addr - p.chunk, end - taken_end);
        let mut addr = p.addr;
        if front == 0 && back > 0 && self.folds(back, rounded, p.addr + rounded - 1, end) {
            // The remainder above lies in the request's last granule.
            back = 0;
        } else if back == 0
            && front > 0
            && p.chunk.trailing_zeros() >= p.addr.trailing_zeros()
            && self.folds(front, rounded, p.chunk, p.addr + 1)
        {
            // The remainder below lies in the request's first granule, and the chunk's
            // start is aligned at least as the placement: the request moves down to it.
            front = 0;
            addr = p.chunk;
        }
        let rounded = end - back - addr;
        let taken_end = end - back;
        // Slots first, so that a full slab changes nothing.
        let (front_slot, back_slot) = self.take_slots(front > 0, back > 0)?;
        let free = &mut self.free[self.class_of[c.region as usize]];
        // The chunk's slot (and its index entry, where it can) goes to its lowest piece.
        let used = match (front_slot, back_slot) {
            (None, None) => {
                free.remove_hinted(p.hint, c.size, p.chunk);
                idx
            }
            (None, Some(b)) => {
                let rest = Entry {
                    size: back,
                    addr: taken_end,
                    idx: b,
                };
                free.replace_hinted(p.hint, c.size, p.chunk, rest);
                idx
            }
            (Some(u), b) => {
                let rest = Entry {
                    size: front,
                    addr: p.chunk,
                    idx,
                };
                free.replace_hinted(p.hint, c.size, p.chunk, rest);
                if let Some(b) = b {
                    free.insert(back, taken_end, b);
                }
                u
            }
        };
        let token = self.next_token(used);
        if used != idx {
            self.chunks[idx as usize].size = front;
            self.link_after(idx, used, addr, rounded, c.region);
        }
        let u = &mut self.chunks[used as usize];
        u.size = rounded;
        u.requested = requested;
        u.token = token;
        u.label = 0;
        self.mark(used, true);
        if let Some(b) = back_slot {
            self.link_after(used, b, taken_end, back, c.region);
        }
        self.bytes_in_use += rounded;
        self.live += 1;
        Some(Grant {
            addr,
            size: rounded,
            token,
        })
    }

    /// Frees the chunk at `addr` handed out with `token`, coalescing it with its free
    /// neighbours. Returns `(chunk size, requested)`; `None` for a stale or forged token.
    ///
    /// # Time complexity
    /// `O(1)` plus `O(log k)` in the free index.
    #[inline(always)]
    pub fn free(&mut self, addr: u64, token: u64) -> Option<(u64, u64)> {
        self.free_labelled(addr, token)
            .map(|(size, requested, _)| (size, requested))
    }

    /// [`Space::free`], returning the chunk's label as well (see [`Space::set_label`]):
    /// `(chunk size, requested, label)`. The label comes from the record the free loads
    /// anyway, so a caller that keeps books by label needs no lookup of its own.
    ///
    /// # Time complexity
    /// As [`Space::free`].
    #[inline(always)]
    pub fn free_labelled(&mut self, addr: u64, token: u64) -> Option<(u64, u64, u32)> {
        let idx = self.in_use_slot(addr, token)?;
        let c = self.chunks[idx as usize];
        self.bytes_in_use -= c.size;
        self.live -= 1;
        let (prev, next) = (c.prev, c.next);
        // Neighbours are chunks (never vacant slots): not in use means free.
        let free_at = |slot: u32| slot != NONE && !self.is_in_use(slot);
        let (prev_free, next_free) = (free_at(prev), free_at(next));
        let free = &mut self.free[self.class_of[c.region as usize]];
        // A free neighbour's index entry becomes the merged chunk's, in place where it can.
        let mut merged = c.size;
        if next_free {
            let n = self.chunks[next as usize];
            merged += n.size;
            if prev_free {
                free.remove(n.size, n.addr);
            } else {
                free.replace(n.size, n.addr, merged, addr, idx);
            }
        }
        let survivor = if prev_free {
            let p = self.chunks[prev as usize];
            free.replace(p.size, p.addr, p.size + merged, p.addr, prev);
            prev
        } else {
            if !next_free {
                free.insert(merged, addr, idx);
            }
            idx
        };
        self.mark(idx, false);
        if next_free {
            self.unlink(next);
        }
        if prev_free {
            self.unlink(idx);
        }
        let s = &mut self.chunks[survivor as usize];
        s.size += if prev_free { merged } else { merged - c.size };
        if !prev_free {
            s.token = 0;
            s.requested = 0;
            s.label = 0;
        }
        Some((c.size, c.requested, c.label))
    }

    /// Size of the chunk in use at `addr` handed out with `token`; `None` when there is none
    /// (free, stale or forged).
    ///
    /// # Time complexity
    /// `O(1)`.
    pub fn in_use_size(&self, addr: u64, token: u64) -> Option<u64> {
        self.in_use_slot(addr, token)
            .map(|idx| self.chunks[idx as usize].size)
    }

    /// The label of the chunk in use at `addr` handed out with `token` (see
    /// [`Space::set_label`]); `None` when there is none (free, stale or forged).
    ///
    /// # Time complexity
    /// `O(1)`.
    #[inline]
    pub fn label(&self, addr: u64, token: u64) -> Option<u32> {
        self.in_use_slot(addr, token)
            .map(|idx| self.chunks[idx as usize].label)
    }

    /// Labels the chunk in use at `addr` handed out with `token` (the allocator's own mark,
    /// kept in the chunk's record and cleared when the chunk is freed). Returns the label it
    /// had; `None` (nothing changed) when there is no such chunk.
    ///
    /// # Time complexity
    /// `O(1)`: one load of the chunk's record, which the token names.
    #[inline]
    pub fn set_label(&mut self, addr: u64, token: u64, label: u32) -> Option<u32> {
        let idx = self.in_use_slot(addr, token)?;
        Some(std::mem::replace(
            &mut self.chunks[idx as usize].label,
            label,
        ))
    }

    /// Labels the chunk [`Space::commit`] just granted (`grant`, unchanged since): as
    /// [`Space::set_label`] without its lookup — the grant's token names the slot.
    ///
    /// # Time complexity
    /// `O(1)`: one store.
    #[inline(always)]
    pub fn label_granted(&mut self, grant: &Grant, label: u32) {
        let c = &mut self.chunks[slot_of(grant.token) as usize];
        debug_assert!(
            c.token == grant.token && c.addr == grant.addr,
            "a stale grant"
        );
        c.label = label;
    }

    /// The label and size of the chunk in use at `addr` handed out with `token`, its label
    /// cleared to 0 (as the chunk is freed); `None` when there is none.
    ///
    /// # Time complexity
    /// `O(1)`.
    #[inline]
    pub fn take_label(&mut self, addr: u64, token: u64) -> Option<(u32, u64)> {
        let idx = self.in_use_slot(addr, token)?;
        let c = &mut self.chunks[idx as usize];
        Some((std::mem::replace(&mut c.label, 0), c.size))
    }

    /// Every chunk in use whose label is not 0, as `(addr, size, token, label)`, in slot
    /// order (no order of address).
    ///
    /// # Time complexity
    /// `O(slots)`: one sequential pass over the slab, allocating nothing.
    pub fn labelled(&self) -> impl Iterator<Item = (u64, u64, u64, u32)> + '_ {
        self.chunks
            .iter()
            .filter(|c| c.label != 0 && c.size != 0 && !c.is_free())
            .map(|c| (c.addr, c.size, c.token, c.label))
    }

    /// Gives the chunk in use at `addr` (handed out with `token`) a fresh token, so that the
    /// old one is refused from now on. `None` (nothing changed) when there is no such chunk. Its
    /// label stays.
    ///
    /// # Time complexity
    /// `O(1)`.
    pub fn retoken(&mut self, addr: u64, token: u64) -> Option<Grant> {
        let idx = self.in_use_slot(addr, token)?;
        let token = self.next_token(idx);
        let c = &mut self.chunks[idx as usize];
        c.token = token;
        Some(Grant {
            addr,
            size: c.size,
            token: c.token,
        })
    }

    /// Hands a chunk in use out again (a stream-ordered free reused by its own stream):
    /// `[at, at + rounded)` of the chunk at `addr` with `token` becomes a chunk of its own for
    /// `requested` bytes under a fresh token, and the bytes before and after it stay in use
    /// as chunks of their own (fresh tokens too), returned as [`Grant`]s. `None` (nothing
    /// changed) when the chunk is not in use with that token or does not hold the range (or
    /// the slab is full).
    ///
    /// # Time complexity
    /// `O(1)`.
    pub fn carve(
        &mut self,
        addr: u64,
        token: u64,
        at: u64,
        rounded: u64,
        requested: u64,
    ) -> Option<(Grant, Vec<Grant>)> {
        let idx = self.in_use_slot(addr, token)?;
        let c = self.chunks[idx as usize];
        let end = addr + c.size;
        if at < addr
            || at % MIN_ALLOCATION != 0
            || rounded == 0
            || rounded % MIN_ALLOCATION != 0
            || at.checked_add(rounded)? > end
        {
            return None;
        }
        let (front, back) = (at - addr, end - at - rounded);
        let (mid_slot, back_slot) = self.take_slots(front > 0, back > 0)?;
        let mid_slot = mid_slot.unwrap_or(idx);
        // Tokens in address order of the pieces left over, then the carved one's.
        let mut rest = Vec::new();
        let mut token_for = |space: &mut Self, slot: u32, start: u64, size: u64| {
            let t = space.next_token(slot);
            let piece = &mut space.chunks[slot as usize];
            piece.token = t;
            piece.requested = size;
            piece.label = 0;
            space.mark(slot, true);
            rest.push(Grant {
                addr: start,
                size,
                token: t,
            });
        };
        if front > 0 {
            self.chunks[idx as usize].size = front;
            self.link_after(idx, mid_slot, at, rounded, c.region);
            token_for(self, idx, addr, front);
        } else {
            self.chunks[idx as usize].size = rounded;
        }
        if let Some(b) = back_slot {
            self.link_after(mid_slot, b, at + rounded, back, c.region);
            token_for(self, b, at + rounded, back);
        }
        self.live += rest.len();
        let token = self.next_token(mid_slot);
        let m = &mut self.chunks[mid_slot as usize];
        m.token = token;
        m.requested = requested;
        m.label = 0;
        self.mark(mid_slot, true);
        Some((
            Grant {
                addr: at,
                size: rounded,
                token,
            },
            rest,
        ))
    }

    /// The chunks in use that overlap `[start, end)`, as `(addr, size)`, in address order.
    ///
    /// # Time complexity
    /// Linear in the chunks of the regions that overlap the range (up to `end`), plus
    /// `O(regions log regions)`.
    pub fn in_use_overlapping(
        &self,
        start: u64,
        end: u64,
    ) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.regions_by_address()
            .filter(move |&r| {
                let (base, size) = self.regions[r];
                base < end && start < base + size
            })
            .flat_map(move |r| self.walk(self.head(r)))
            .take_while(move |c| c.addr < end)
            .filter(move |c| !c.is_free() && c.addr + c.size > start)
            .map(|c| (c.addr, c.size))
    }

    /// Every chunk in use as `(addr, size)`, in address order.
    ///
    /// # Time complexity
    /// `O(chunks + regions log regions)`.
    pub fn in_use(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.all_chunks()
            .filter(|c| !c.is_free())
            .map(|c| (c.addr, c.size))
    }

    /// XLA's per-bin summary of every chunk (free and in use), non-empty bins only.
    ///
    /// # Time complexity
    /// `O(chunks)`.
    pub fn bin_summaries(&self) -> Vec<BinSummary> {
        occupancy::bin_summaries(self.all_chunks().map(Chunk::usage))
    }

    /// A [`MAP_CELLS`](crate::report::MAP_CELLS)-character occupancy map of
    /// each region (`*` requested, `x` slack, `_` free), as bfc draws them.
    ///
    /// # Time complexity
    /// `O(chunks)`.
    pub fn region_maps(&self) -> Vec<RegionMap> {
        (0..self.regions.len())
            .map(|r| {
                let (base, size) = self.regions[r];
                let chunks = self.walk(self.head(r)).map(Chunk::usage);
                occupancy::region_map(base, size, chunks)
            })
            .collect()
    }

    /// Checks the invariants stated on the fields.
    ///
    /// # Errors
    /// A description of the first one broken.
    ///
    /// # Time complexity
    /// `O(chunks log k + regions²)`.
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut tally = Tally::default();
        // Each slot must be reached exactly once: as a chunk of a region or on the vacant list.
        let mut seen = vec![false; self.chunks.len()];
        if self.heads.len() != self.regions.len() {
            return Err(format!(
                "{} region heads for {} regions",
                self.heads.len(),
                self.regions.len()
            ));
        }
        for (ri, &(base, size)) in self.regions.iter().enumerate() {
            for &(other, other_size) in &self.regions[ri + 1..] {
                if base < other + other_size && other < base + size {
                    return Err(format!(
                        "regions {base:#x}+{size} and {other:#x}+{other_size} overlap"
                    ));
                }
            }
            let mut region = RegionCheck::new(base, size);
            let mut prev = NONE;
            let mut idx = self.heads[ri];
            while idx != NONE {
                let c = self
                    .chunks
                    .get(idx as usize)
                    .ok_or_else(|| format!("region {base:#x}: link to missing slot {idx}"))?;
                if std::mem::replace(&mut seen[idx as usize], true) {
                    return Err(format!("region {base:#x}: slot {idx} reached twice"));
                }
                let at = format!("region {base:#x}, chunk {idx} at {:#x}+{}", c.addr, c.size);
                region.chunk(&at, c.usage(), &mut tally)?;
                if c.prev != prev {
                    return Err(format!("{at}: prev link {} should be {prev}", c.prev));
                }
                if c.region as usize != ri {
                    return Err(format!("{at}: records region {}", c.region));
                }
                if prev == NONE && c.addr != base {
                    return Err(format!("{at}: the region's head, not at its base"));
                }
                let serial = c.token >> SLOT_BITS;
                if !c.is_free()
                    && (slot_of(c.token) != idx
                        || serial == 0
                        || self.last_serial < 1 << (64 - SLOT_BITS) && serial > self.last_serial)
                {
                    return Err(format!("{at}: token {:#x} not handed out to it", c.token));
                }
                if c.is_free() {
                    if c.requested != 0 {
                        return Err(format!("{at}: free, but records {} requested", c.requested));
                    }
                    if c.label != 0 {
                        return Err(format!("{at}: free, but labelled {}", c.label));
                    }
                    if self.free[self.class_of[ri]].get(c.size, c.addr) != Some(idx) {
                        return Err(format!("{at}: free chunk missing from the free index"));
                    }
                }
                prev = idx;
                idx = c.next;
            }
            region.finish()?;
        }
        let mut v = self.vacant;
        while let Some(mark) = seen.get_mut(v as usize) {
            if std::mem::replace(mark, true) {
                return Err(format!("vacant slot {v} reached twice"));
            }
            if self.chunks[v as usize].size != 0 {
                return Err(format!("slot {v} is on the vacant list but holds a chunk"));
            }
            v = self.chunks[v as usize].next;
        }
        if v != NONE {
            return Err(format!("the vacant list links to missing slot {v}"));
        }
        if let Some(lost) = seen.iter().position(|&s| !s) {
            return Err(format!("slot {lost} is neither a chunk nor vacant"));
        }
        if self.in_use.len() != self.chunks.len().div_ceil(64) {
            return Err(format!(
                "{} in-use words for {} slots",
                self.in_use.len(),
                self.chunks.len()
            ));
        }
        let slots = (0..self.in_use.len() * 64).map(|s| s as u32);
        if let Some(s) = slots.into_iter().find(|&s| {
            self.is_in_use(s) != self.chunks.get(s as usize).is_some_and(|c| !c.is_free())
        }) {
            return Err(format!("slot {s}'s in-use bit disagrees with its token"));
        }
        let Tally {
            in_use, live, free, ..
        } = tally;
        let mut indexed = 0;
        for f in &self.free {
            f.check()?;
            indexed += f.len();
        }
        if free != indexed {
            return Err(format!(
                "the free index holds {indexed} chunks, the regions {free} free ones"
            ));
        }
        if in_use != self.bytes_in_use || live != self.live {
            return Err(format!(
                "chunks in use: {live} of {in_use} B, books say {} of {} B",
                self.live, self.bytes_in_use
            ));
        }
        Ok(())
    }

    // ---- internals ----

    /// The slot of the chunk in use at `addr` with `token`: the one the token names, if it
    /// holds such a chunk.
    #[inline]
    fn in_use_slot(&self, addr: u64, token: u64) -> Option<u32> {
        let idx = slot_of(token);
        let c = self.chunks.get(idx as usize)?;
        // A free chunk (or vacant slot) has token 0, which no hand-out gets.
        (c.token == token && token != 0 && c.addr == addr).then_some(idx)
    }

    /// The slot of the free chunk `p` comes out of, if it is still free with the size and
    /// address `p` saw: the slot `p` names, one load in the usual find-then-commit; else the
    /// free index's (merges and splits since may have moved the chunk to another slot).
    #[inline]
    fn placed_slot(&self, p: &Placement) -> Option<u32> {
        // Vacant slots (size 0) never match: a placement's chunk has bytes.
        let holds = |c: &Chunk| c.is_free() && c.addr == p.chunk && c.size == p.chunk_size;
        if self.chunks.get(p.slot as usize).is_some_and(holds) {
            return Some(p.slot);
        }
        self.free.iter().find_map(|f| f.get(p.chunk_size, p.chunk))
    }

    /// The token of the next hand-out, to slot `slot` (see the module docs).
    #[inline]
    fn next_token(&mut self, slot: u32) -> u64 {
        self.last_serial += 1;
        if token_of(self.last_serial, 0) == 0 {
            // Serial's low bits 0: skipped, so that no token is 0 ("free").
            self.last_serial += 1;
        }
        token_of(self.last_serial, slot)
    }

    /// A vacant slot (reused, or a new one); `None` when the slab is full.
    #[inline]
    fn take_slot(&mut self) -> Option<u32> {
        if self.vacant != NONE {
            let idx = self.vacant;
            self.vacant = self.chunks[idx as usize].next;
            return Some(idx);
        }
        let idx = u32::try_from(self.chunks.len())
            .ok()
            .filter(|&i| i != NONE)?;
        self.chunks.push(Chunk::VACANT);
        if idx % 64 == 0 {
            self.in_use.push(0);
        }
        Some(idx)
    }

    /// A vacant slot for each `true`, or none at all (`None`, nothing changed) when the slab
    /// cannot hold them.
    #[inline]
    fn take_slots(&mut self, first: bool, second: bool) -> Option<(Option<u32>, Option<u32>)> {
        let a = if first { Some(self.take_slot()?) } else { None };
        let b = if second {
            let Some(b) = self.take_slot() else {
                if let Some(a) = a {
                    self.release_slot(a);
                }
                return None;
            };
            Some(b)
        } else {
            None
        };
        Some((a, b))
    }

    /// Whether slot `slot` holds a chunk in use.
    #[inline]
    fn is_in_use(&self, slot: u32) -> bool {
        self.in_use[slot as usize / 64] & (1 << (slot % 64)) != 0
    }

    /// Records whether slot `slot` holds a chunk in use (see [`Space::in_use`]).
    #[inline]
    fn mark(&mut self, slot: u32, used: bool) {
        let (word, bit) = (&mut self.in_use[slot as usize / 64], 1u64 << (slot % 64));
        if used {
            *word |= bit;
        } else {
            *word &= !bit;
        }
    }

    /// Puts slot `idx` (holding no chunk) on the vacant list.
    fn release_slot(&mut self, idx: u32) {
        self.mark(idx, false);
        self.chunks[idx as usize] = Chunk {
            next: self.vacant,
            ..Chunk::VACANT
        };
        self.vacant = idx;
    }

    /// Makes the vacant slot `new` the chunk `[addr, addr + size)` (free, no token yet) just
    /// above chunk `after`.
    #[inline]
    fn link_after(&mut self, after: u32, new: u32, addr: u64, size: u64, region: u32) {
        let next = self.chunks[after as usize].next;
        self.chunks[new as usize] = Chunk {
            addr,
            size,
            requested: 0,
            token: 0,
            prev: after,
            next,
            region,
            label: 0,
        };
        self.mark(new, false);
        self.chunks[after as usize].next = new;
        if next != NONE {
            self.chunks[next as usize].prev = new;
        }
    }

    /// Takes chunk `idx` out of its region's list (its bytes now belong to its lower
    /// neighbour) and makes its slot vacant.
    #[inline]
    fn unlink(&mut self, idx: u32) {
        let c = self.chunks[idx as usize];
        if c.prev != NONE {
            self.chunks[c.prev as usize].next = c.next;
        }
        if c.next != NONE {
            self.chunks[c.next as usize].prev = c.prev;
        }
        self.release_slot(idx);
    }

    /// The slot of the chunk at region `r`'s base.
    fn head(&self, r: usize) -> u32 {
        self.heads[r]
    }

    /// The chunks from slot `from` to its region's end, in address order.
    fn walk(&self, from: u32) -> impl Iterator<Item = &Chunk> + '_ {
        std::iter::successors(Some(&self.chunks[from as usize]), |c| {
            (c.next != NONE).then(|| &self.chunks[c.next as usize])
        })
    }

    /// Region indices in address order.
    fn regions_by_address(&self) -> impl Iterator<Item = usize> {
        let mut order: Vec<usize> = (0..self.regions.len()).collect();
        order.sort_unstable_by_key(|&r| self.regions[r].0);
        order.into_iter()
    }

    /// Every chunk, in address order.
    fn all_chunks(&self) -> impl Iterator<Item = &Chunk> + '_ {
        self.regions_by_address()
            .flat_map(move |r| self.walk(self.head(r)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_ends_best_fit_and_coalescing() {
        let mut s = Space::new();
        s.add_region(0, 1 << 20, 0).unwrap();
        let p = s.find(0, 4096, 256, false).unwrap();
        assert_eq!(p.addr, 0);
        let a = s.commit(p, 4096, 4000).unwrap();
        let p = s.find(0, 8192, 256, true).unwrap();
        assert_eq!(p.addr, (1 << 20) - 8192);
        let b = s.commit(p, 8192, 8192).unwrap();
        s.check_invariants().unwrap();
        assert_eq!(s.free(a.addr, a.token), Some((4096, 4000)));
        assert_eq!(s.free(a.addr, a.token), None);
        assert_eq!(s.free(b.addr, b.token), Some((8192, 8192)));
        s.check_invariants().unwrap();
        assert_eq!(s.largest_free(), 1 << 20);
        // Aligned, from the top.
        let p = s.find(0, 256, 1 << 16, true).unwrap();
        assert_eq!(p.addr, (1 << 20) - (1 << 16));
        let g = s.commit(p, 256, 1).unwrap();
        s.check_invariants().unwrap();
        assert_eq!(s.in_use_overlapping(0, 1 << 20).count(), 1);
        s.free(g.addr, g.token).unwrap();
        assert!(s.find(0, 2 << 20, 256, false).is_none());
        assert!(s.add_region(4096, 256, 0).is_err());
    }

    /// A region `[base, base + units U)` folding within 16-unit granules: one free chunk,
    /// from which `rounded` bytes are committed at its low or high end with `alignment`.
    /// Returns the grant and the free chunks left; freeing it gives the region back whole.
    fn fold_one(base: u64, units: u64, rounded: u64, alignment: u64, high: bool) -> (Grant, usize) {
        let mut s = Space::new();
        s.fold_within(16 * U);
        s.add_region(base, units * U, 0).unwrap();
        let p = s.find(0, rounded, alignment, high).unwrap();
        let g = s.commit(p, rounded, rounded).unwrap();
        s.check_invariants().unwrap();
        assert_eq!(s.bytes_in_use(), g.size);
        assert_eq!(s.in_use_size(g.addr, g.token), Some(g.size));
        let left = s.free_chunks().count();
        assert_eq!(s.free(g.addr, g.token), Some((g.size, rounded)));
        s.check_invariants().unwrap();
        assert_eq!(s.free_chunks().collect::<Vec<_>>(), [(units * U, base)]);
        (g, left)
    }

    // `(addr, size)` of the grant and the free chunks left, derived by hand: a remainder of
    // at most an eighth of the request, inside the granule of the request's nearest byte,
    // goes with it; a remainder below moves the request down only onto a start at least as
    // aligned.
    #[test_case::test_case(0, 9, 8 * U, 256, false => ((0, 9 * U), 0); "an eighth above, in the last granule: folded")]
    #[test_case::test_case(0, 8, 7 * U, 256, false => ((0, 7 * U), 1); "more than an eighth above: split")]
    #[test_case::test_case(0, 18, 16 * U, 256, false => ((0, 16 * U), 1); "above, in the next granule: split")]
    #[test_case::test_case(0, 9, 8 * U, 256, true => ((0, 9 * U), 0); "an eighth below: folded, the request moved down")]
    #[test_case::test_case(16 * U - U, 9, 8 * U, 256, true => ((16 * U, 8 * U), 1); "below, in the previous granule: split")]
    #[test_case::test_case(U, 9, 8 * U, 512, true => ((2 * U, 8 * U), 1); "below, on a less aligned start: split")]
    #[test_case::test_case(0, 18, 16 * U, 512, true => ((0, 18 * U), 0); "below, on a start as aligned: folded")]
    fn a_small_remainder_inside_a_touched_granule_is_folded(
        base: u64,
        units: u64,
        rounded: u64,
        alignment: u64,
        high: bool,
    ) -> ((u64, u64), usize) {
        let (g, left) = fold_one(base, units, rounded, alignment, high);
        ((g.addr, g.size), left)
    }

    #[test]
    fn without_a_granule_nothing_is_folded() {
        let mut s = Space::new();
        s.add_region(0, 9 * U, 0).unwrap();
        let g = s
            .commit(s.find(0, 8 * U, 256, false).unwrap(), 8 * U, 8 * U)
            .unwrap();
        assert_eq!((g.addr, g.size), (0, 8 * U));
        assert_eq!(s.free_chunks().collect::<Vec<_>>(), [(U, 8 * U)]);
        s.check_invariants().unwrap();
    }

    #[test]
    fn space_is_send_and_sync() {
        fn shareable<T: Send + Sync>() {}
        shareable::<Space>();
    }

    const U: u64 = 256;

    /// One unit from the bottom and four from the top of class 0, as `(low, high)`.
    fn both_ends(s: &mut Space) -> (Grant, Grant) {
        let low = s.commit(s.find(0, U, 256, false).unwrap(), U, U).unwrap();
        let p = s.find(0, 4 * U, 256, true).unwrap();
        (low, s.commit(p, 4 * U, 4 * U).unwrap())
    }

    /// A region of 64 units with [`both_ends`] taken, and a placement found (not taken) for
    /// one unit: at the start of the free chunk `[U, 60 U)`, naming its slot.
    fn found_between_ends() -> (Space, Grant, Grant, Placement) {
        let mut s = Space::new();
        s.add_region(0, 64 * U, 0).unwrap();
        let (low, high) = both_ends(&mut s);
        let p = s.find(0, U, 256, false).unwrap();
        assert_eq!((p.chunk, p.chunk_size, p.addr), (U, 59 * U, U));
        (s, low, high, p)
    }

    #[test]
    fn a_stale_placement_is_refused() {
        let (mut s, x, y, stale) = found_between_ends();
        // Freeing `x` merges that chunk away and frees its slot; carving `y` reuses the
        // slot for a chunk at 61 units, which is then freed: a free chunk in the named
        // slot, at another address.
        s.free(x.addr, x.token).unwrap();
        let (mid, _) = s.carve(y.addr, y.token, y.addr + U, U, U).unwrap();
        s.free(mid.addr, mid.token).unwrap();
        s.check_invariants().unwrap();
        assert_eq!(
            s.commit(stale, U, 1),
            None,
            "no chunk starts at 256 any more"
        );
        s.check_invariants().unwrap();
        assert_eq!(s.live_count(), 2);
    }

    #[test]
    fn a_placement_follows_its_chunk_into_another_slot() {
        let (mut s, a, b, p) = found_between_ends();
        // Both frees merge into the region's first chunk; the two slots go vacant, the
        // placement's first (so it is reused last). The same two allocations again then
        // put the free chunk `[U, 60 U)` back in the other slot, and `b` in the placement's.
        s.free(a.addr, a.token).unwrap();
        s.free(b.addr, b.token).unwrap();
        let (_, b) = both_ends(&mut s);
        assert_eq!(slot_of(b.token), p.slot, "the placement's slot is in use");
        let g = s.commit(p, U, 1).expect("the chunk is free, as found");
        assert_eq!((g.addr, g.size), (U, U));
        assert_ne!(slot_of(g.token), p.slot);
        s.check_invariants().unwrap();
    }

    /// A space with chunks in use and free ones between them, in two regions.
    fn busy() -> Space {
        let mut s = Space::new();
        s.add_region(1 << 20, 1 << 16, 0).unwrap();
        s.add_region(0, 1 << 16, 1).unwrap();
        for class in [0, 1] {
            let grants: Vec<Grant> = (0..6)
                .map(|i| {
                    let p = s.find(class, 512, 256, i % 2 == 1).unwrap();
                    s.commit(p, 512, 500).unwrap()
                })
                .collect();
            s.free(grants[2].addr, grants[2].token).unwrap();
            if class == 1 {
                s.retoken(grants[0].addr, grants[0].token).unwrap();
            }
        }
        s.check_invariants().unwrap();
        s
    }

    /// The slot of the first chunk of `busy()`'s first region (in use).
    fn in_use(s: &Space) -> u32 {
        s.heads[0]
    }

    #[test]
    fn check_invariants_catches_each_broken_book() {
        type Corruption = fn(&mut Space);
        let cases: [(&str, Corruption); 13] = [
            ("free chunk out of the index", |s| {
                let (size, addr) = s.free_chunks_descending()[0];
                s.free[0].remove(size, addr);
                s.free[1].remove(size, addr);
            }),
            ("region head past the base", |s| {
                s.heads[0] = s.chunks[in_use(s) as usize].next;
            }),
            ("region head missing", |s| {
                s.heads.pop();
            }),
            ("token naming another slot", |s| {
                let i = in_use(s) as usize;
                s.chunks[i].token += 1;
            }),
            ("token with serial 0", |s| {
                let i = in_use(s);
                s.chunks[i as usize].token = token_of(0, i);
            }),
            ("prev link broken", |s| {
                let second = s.chunks[in_use(s) as usize].next;
                s.chunks[second as usize].prev = NONE;
            }),
            ("bytes in use off", |s| s.bytes_in_use += 256),
            ("live count off", |s| s.live -= 1),
            ("slot neither chunk nor vacant", |s| {
                s.chunks.push(Chunk::VACANT)
            }),
            ("token not handed out yet", |s| {
                let i = in_use(s);
                s.chunks[i as usize].token = token_of(s.last_serial + 1, i);
            }),
            ("vacant list through a chunk", |s| s.vacant = 0),
            ("chunk in use without its bit", |s| {
                let i = in_use(s);
                s.mark(i, false);
            }),
            ("free chunk with a bit", |s| {
                let i = s.chunks[in_use(s) as usize].next;
                s.mark(i, true);
            }),
        ];
        for (name, corrupt) in cases {
            let mut s = busy();
            corrupt(&mut s);
            assert!(s.check_invariants().is_err(), "{name} went unnoticed");
        }
    }
}
