//! The physical side of [`super::VmmAllocator`]: which granule of which reservation is mapped
//! to which piece of which physical handle, how many chunks in use touch each granule, and
//! which mapped granules are free (no chunk in use on them) or still lack access.
//!
//! Reservations are few and large (`2 × limit + 1 GiB` each), so every granule of a
//! reservation has a slot in arrays indexed by its position, in **pages** of [`PAGE`]
//! granules made when a granule of theirs is first mapped or touched (a reservation of which
//! only both ends are used costs two pages, not the whole range). Per page: each granule's
//! backing and touch count, and bitmaps of the mapped, free-mapped and access-less granules,
//! with the free ones counted per page so that the search for granules to stitch skips the
//! pages that have none. Every count the allocator asks for is kept, never computed by
//! iterating; a question about a span costs `O(granules of the span / 64)` word operations.
//!
//! Handles live in a slab (slots reused); idle pieces (held, not mapped) in a set ordered by
//! `(handle id, offset)`, the order they are taken in.
#![deny(unsafe_code)]

use std::collections::BTreeSet;

use rustc_hash::FxHashMap;

/// Granules per page (`2^PAGE_SHIFT`).
const PAGE_SHIFT: u32 = 10;
/// Granules per page.
pub(super) const PAGE: usize = 1 << PAGE_SHIFT;
/// Bitmap words per page.
const WORDS: usize = PAGE / 64;
/// Spans of up to this many granules are touched and untouched a granule at a time: for the
/// few granules of a typical request that costs less than the word-at-a-time passes, whose
/// set-up and bit counts (no `popcnt` in the baseline x86-64 target) dominate a short span.
const SHORT_SPAN: u64 = 8;

/// Where a mapped granule's memory comes from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Backing {
    /// Slot of the handle in [`Physical::handles`].
    slot: u32,
    /// Granule index inside the handle (its offset ÷ the granularity).
    piece: u32,
}

/// [`PAGE`] consecutive granules of a region.
#[derive(Debug)]
struct Page {
    /// The backing of each granule; meaningful exactly where `mapped` is set.
    backing: [Backing; PAGE],
    /// Number of chunks in use overlapping each granule (pending stream-ordered frees
    /// included).
    touch: [u32; PAGE],
    /// Granules mapped.
    mapped: [u64; WORDS],
    /// Invariant: exactly the granules mapped whose `touch` is 0.
    free: [u64; WORDS],
    /// Invariant: a subset of `mapped`: granules whose access was not granted yet (a failed
    /// or not yet made `set_access`).
    no_access: [u64; WORDS],
    /// Granules under memory freed at once (no event: the single-stream path) since the
    /// stream-order fence was last recorded: work queued before that free may still read
    /// them, so they are never unmapped (stitched, trimmed) until a fence covers them and
    /// completes. Empty everywhere while [`Physical::unsettled_any`] is false.
    unsettled: [u64; WORDS],
    /// Granules under memory freed at once before the fence's current record, waiting for
    /// it to complete. Empty everywhere while [`Physical::fenced_any`] is false.
    fenced: [u64; WORDS],
    /// Invariant: the number of bits set in `free`.
    free_count: u32,
}

impl Page {
    fn new() -> Box<Page> {
        Box::new(Page {
            backing: [Backing::default(); PAGE],
            touch: [0; PAGE],
            mapped: [0; WORDS],
            free: [0; WORDS],
            no_access: [0; WORDS],
            unsettled: [0; WORDS],
            fenced: [0; WORDS],
            free_count: 0,
        })
    }
}

impl Page {
    /// Counts a chunk on the granules `[i0, i1)`, which lie in word `w` of this page (`mask`
    /// selects them there): each loses its place on the free bitmap. Returns how many were
    /// free.
    #[inline(always)]
    fn take_free(&mut self, i0: u64, i1: u64, w: usize, mask: u64) -> u64 {
        let k0 = (i0 as usize) & (PAGE - 1);
        let k1 = k0 + (i1 - i0) as usize;
        for t in &mut self.touch[k0..k1] {
            *t += 1;
        }
        let gone = self.free[w] & mask;
        self.free[w] &= !mask;
        let n = few_ones(gone);
        self.free_count -= n;
        u64::from(n)
    }

    /// Undoes [`Page::take_free`]: a mapped granule no chunk touches any more goes on the free
    /// bitmap. Returns how many did.
    #[inline(always)]
    fn give_free(&mut self, i0: u64, i1: u64, w: usize) -> u64 {
        let k0 = (i0 as usize) & (PAGE - 1);
        let k1 = k0 + (i1 - i0) as usize;
        // The granules that no chunk touches any more, as bits of word `w`.
        let mut last = 0u64;
        let shift = k0 & 63;
        for (b, t) in self.touch[k0..k1].iter_mut().enumerate() {
            last |= u64::from(*t <= 1) << (shift + b);
            *t = t.saturating_sub(1);
        }
        let now = self.mapped[w] & last & !self.free[w];
        self.free[w] |= now;
        let n = few_ones(now);
        self.free_count += n;
        u64::from(n)
    }
}

/// The bits set in `x`, which has at most [`SHORT_SPAN`] of them, next to one another or
/// not: a loop over the set bits (no `popcnt` in the baseline x86-64 target, and the
/// portable count is a dozen instructions even for a word that is 0).
#[inline(always)]
fn few_ones(mut x: u64) -> u32 {
    let mut n = 0;
    while x != 0 {
        x &= x - 1;
        n += 1;
    }
    n
}

/// One reservation's granules.
#[derive(Debug)]
struct Region {
    /// First byte (granule-aligned).
    base: u64,
    /// Granules in it.
    granules: u64,
    /// Its pages, `None` until a granule of the page is mapped or touched (then all zero).
    pages: Vec<Option<Box<Page>>>,
}

/// A run of mapped granules: `(va, len, handle id, handle size, offset in the handle)`.
pub(super) type Run = (u64, u64, u64, u64, u64);

/// One physical handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct HandleRec {
    /// The device's id for it.
    pub(super) id: u64,
    /// Bytes (a multiple of the granularity).
    pub(super) size: u64,
    /// Invariant: granules of it mapped now.
    pub(super) mapped: u64,
    /// Base of the region it was made for. Where the driver holds released memory until the
    /// reservation goes ([`crate::device::VirtualMemory::holds_released_memory`]), a handle
    /// is mapped in that region only, so that freeing the region's reservation gives all of
    /// it back.
    pub(super) home: u64,
}

/// A piece of physical memory: `(handle id, offset in bytes, slot)`. Ordered by the device's
/// handle id, then the offset: the order idle pieces are used in.
pub(super) type Piece = (u64, u64, u32);

/// The physical books. See the module docs.
#[derive(Debug)]
pub(super) struct Physical {
    /// log2 of the granularity.
    shift: u32,
    /// Invariant: the regions of the address space, sorted by base, not overlapping.
    regions: Vec<Region>,
    /// Handle slab; `None` = a vacant slot (listed in `vacant`).
    handles: Vec<Option<HandleRec>>,
    /// Vacant slots of `handles`, reused last in, first out.
    vacant: Vec<u32>,
    /// Invariant: number of `Some` in `handles`.
    handle_count: usize,
    /// Pieces of handles held but not mapped. Invariant: with the backing of the mapped
    /// granules, every granule of every handle exactly once.
    idle: BTreeSet<Piece>,
    /// Invariant: granules mapped, over all pages.
    mapped: u64,
    /// Invariant: granules free and mapped, over all pages (= sum of `free_count`).
    free_mapped: u64,
    /// Invariant: granules without access, over all pages.
    no_access: u64,
    /// Invariant: bytes of all handles.
    pool_bytes: u64,
    /// False only when no page has a bit set in `unsettled`.
    unsettled_any: bool,
    /// False only when no page has a bit set in `fenced`.
    fenced_any: bool,
}

/// Calls `f(page, word, mask)` for each bitmap word of the granules `[i0, i1)` of a region,
/// in order, `mask` selecting the granules of the range in that word.
#[inline]
fn words(i0: u64, i1: u64, mut f: impl FnMut(usize, usize, u64)) {
    let mut i = i0;
    while i < i1 {
        let w = i >> 6;
        let hi = ((w + 1) << 6).min(i1);
        let n = hi - i;
        let mask = if n == 64 {
            !0
        } else {
            ((1u64 << n) - 1) << (i & 63)
        };
        f((w >> 4) as usize, (w & 15) as usize, mask);
        i = hi;
    }
}

/// `(page, word, mask)` of the granules `[i0, i1)` of a region when they are at most
/// [`SHORT_SPAN`], not none, and all in one bitmap word (so in one page); `None` otherwise.
#[inline(always)]
fn one_word(i0: u64, i1: u64) -> Option<(usize, usize, u64)> {
    let n = i1.wrapping_sub(i0);
    // `n - 1 < SHORT_SPAN` also refuses an empty span (`n - 1` wraps).
    if n.wrapping_sub(1) >= SHORT_SPAN || i0 >> 6 != (i1 - 1) >> 6 {
        return None;
    }
    let k = (i0 as usize) & (PAGE - 1);
    let mask = ((1u64 << n) - 1) << (k & 63);
    Some(((i0 >> PAGE_SHIFT) as usize, k >> 6, mask))
}

/// `(page, index in page, word, bit)` of granule `i` of a region.
#[inline]
fn pos(i: u64) -> (usize, usize, usize, u64) {
    let k = (i as usize) & (PAGE - 1);
    ((i >> PAGE_SHIFT) as usize, k, k >> 6, 1u64 << (k & 63))
}

impl Physical {
    /// Empty books for this granularity (a power of two).
    pub(super) fn new(granularity: u64) -> Self {
        debug_assert!(granularity.is_power_of_two());
        Physical {
            shift: granularity.trailing_zeros(),
            regions: Vec::new(),
            handles: Vec::new(),
            vacant: Vec::new(),
            handle_count: 0,
            idle: BTreeSet::new(),
            mapped: 0,
            free_mapped: 0,
            no_access: 0,
            pool_bytes: 0,
            unsettled_any: false,
            fenced_any: false,
        }
    }

    fn g(&self) -> u64 {
        1 << self.shift
    }

    /// Adds the reservation `[base, base + size)` (granule-aligned, overlapping none added).
    ///
    /// # Time complexity
    /// `O(regions + size / granularity / PAGE)`.
    pub(super) fn add_region(&mut self, base: u64, size: u64) {
        let granules = size >> self.shift;
        let pages = granules.div_ceil(PAGE as u64) as usize;
        let at = self.regions.partition_point(|r| r.base < base);
        self.regions.insert(
            at,
            Region {
                base,
                granules,
                pages: (0..pages).map(|_| None).collect(),
            },
        );
    }

    /// The region and granule indices `[i0, i1)` of the granule-aligned span `[start, end)`;
    /// `None` when it does not lie inside one region.
    #[inline]
    fn locate(&self, start: u64, end: u64) -> Option<(usize, u64, u64)> {
        let r = self
            .regions
            .partition_point(|x| x.base <= start)
            .checked_sub(1)?;
        let reg = &self.regions[r];
        let i0 = (start - reg.base) >> self.shift;
        let i1 = (end.max(start) - reg.base) >> self.shift;
        (i1 <= reg.granules).then_some((r, i0, i1))
    }

    fn page(&self, r: usize, p: usize) -> Option<&Page> {
        self.regions[r].pages[p].as_deref()
    }

    fn page_mut(&mut self, r: usize, p: usize) -> &mut Page {
        self.regions[r].pages[p].get_or_insert_with(Page::new)
    }

    /// Set bits of `sel` among the granules of `[start, end)` (inside one region).
    fn count(&self, start: u64, end: u64, sel: impl Fn(&Page) -> &[u64; WORDS]) -> u64 {
        let Some((r, i0, i1)) = self.locate(start, end) else {
            return 0;
        };
        let mut n = 0u64;
        words(i0, i1, |p, w, mask| {
            if let Some(page) = self.page(r, p) {
                n += u64::from((sel(page)[w] & mask).count_ones());
            }
        });
        n
    }

    /// Calls `f(address)` for each granule of `[start, end)` (inside one region) whose bit is
    /// set in `sel`, in address order.
    fn each(&self, start: u64, end: u64, sel: impl Fn(&Page) -> &[u64; WORDS], f: impl FnMut(u64)) {
        if let Some((r, i0, i1)) = self.locate(start, end) {
            self.each_in(r, i0, i1, sel, f);
        }
    }

    fn each_in(
        &self,
        r: usize,
        i0: u64,
        i1: u64,
        sel: impl Fn(&Page) -> &[u64; WORDS],
        mut f: impl FnMut(u64),
    ) {
        let reg = &self.regions[r];
        words(i0, i1, |p, w, mask| {
            if let Some(page) = self.page(r, p) {
                let mut bits = sel(page)[w] & mask;
                while bits != 0 {
                    let b = u64::from(bits.trailing_zeros());
                    bits &= bits - 1;
                    let i = ((p as u64) << PAGE_SHIFT) + ((w as u64) << 6) + b;
                    f(reg.base + (i << self.shift));
                }
            }
        });
    }

    // ---- counts -------------------------------------------------------------------------

    /// Granules mapped, over all regions.
    pub(super) fn mapped_count(&self) -> u64 {
        self.mapped
    }

    /// Granules mapped and free (no chunk in use on them), over all regions.
    pub(super) fn free_mapped_count(&self) -> u64 {
        self.free_mapped
    }

    /// Pieces held but not mapped.
    pub(super) fn idle_count(&self) -> u64 {
        self.idle.len() as u64
    }

    /// Bytes of all handles.
    pub(super) fn pool_bytes(&self) -> u64 {
        self.pool_bytes
    }

    /// Handles held.
    pub(super) fn handle_count(&self) -> usize {
        self.handle_count
    }

    /// Granules mapped under the granule-aligned span `[start, end)`.
    ///
    /// # Time complexity
    /// `O(granules / 64)`.
    ///
    /// The allocator asks [`Physical::mapped_and_free_in`]; the model test checks both.
    #[cfg(test)]
    pub(super) fn mapped_in(&self, start: u64, end: u64) -> u64 {
        self.count(start, end, |p| &p.mapped)
    }

    /// `(granules mapped, granules mapped and free)` under the granule-aligned span
    /// `[start, end)`, in one walk: the question every placement asks.
    ///
    /// # Time complexity
    /// `O(granules / 64)`.
    pub(super) fn mapped_and_free_in(&self, start: u64, end: u64) -> (u64, u64) {
        let Some((r, i0, i1)) = self.locate(start, end) else {
            return (0, 0);
        };
        let (mut mapped, mut free) = (0u64, 0u64);
        words(i0, i1, |p, w, mask| {
            if let Some(page) = self.page(r, p) {
                mapped += u64::from((page.mapped[w] & mask).count_ones());
                free += u64::from((page.free[w] & mask).count_ones());
            }
        });
        (mapped, free)
    }

    /// Granules under `[start, end)` that no chunk in use touches.
    ///
    /// # Time complexity
    /// `O(granules)`.
    pub(super) fn untouched_in(&self, start: u64, end: u64) -> u64 {
        let Some((r, i0, i1)) = self.locate(start, end) else {
            return (end.saturating_sub(start)) >> self.shift;
        };
        (i0..i1)
            .filter(|&i| {
                let (p, k, _, _) = pos(i);
                self.page(r, p).map_or(true, |page| page.touch[k] == 0)
            })
            .count() as u64
    }

    /// True when the granule at `v` is mapped.
    pub(super) fn is_mapped(&self, v: u64) -> bool {
        self.bit(v, |p| &p.mapped)
    }

    /// True when the granule at `v` is mapped without access.
    pub(super) fn lacks_access(&self, v: u64) -> bool {
        self.bit(v, |p| &p.no_access)
    }

    fn bit(&self, v: u64, sel: impl Fn(&Page) -> &[u64; WORDS]) -> bool {
        let Some((r, i, _)) = self.locate(v, v) else {
            return false;
        };
        let (p, _, w, bit) = pos(i);
        self.page(r, p).is_some_and(|page| sel(page)[w] & bit != 0)
    }

    // ---- touch counts -------------------------------------------------------------------

    /// Counts a chunk in use on the granules of `[start, end)` (inside one region).
    ///
    /// # Time complexity
    /// `O(granules)`: one page lookup and bitmap update per word, not per granule.
    pub(super) fn touch(&mut self, start: u64, end: u64) {
        let Some((r, i0, i1)) = self.locate(start, end) else {
            debug_assert!(false, "a chunk outside every region");
            return;
        };
        self.touch_in(r, i0, i1);
    }

    /// [`Physical::touch`]es `[start, end)` (inside one region) if every granule of it is
    /// mapped with access, and says whether it did; otherwise changes nothing. The steady
    /// state's allocation: one walk over the span answers what placing, backing and touching
    /// it would each have walked it for.
    ///
    /// # Time complexity
    /// `O(granules)`, as [`Physical::touch`].
    #[inline]
    pub(super) fn touch_if_ready(&mut self, start: u64, end: u64) -> bool {
        let Some((r, i0, i1)) = self.locate(start, end) else {
            return false;
        };
        let any_lacking = self.no_access > 0;
        if let Some((p, w, mask)) = one_word(i0, i1) {
            // The steady state's span: a few granules in one bitmap word of one page, so one
            // page lookup and one word of each bitmap answer and update all of them.
            let Some(page) = self.regions[r].pages[p].as_deref_mut() else {
                return false;
            };
            if page.mapped[w] & mask != mask || (any_lacking && page.no_access[w] & mask != 0) {
                return false;
            }
            self.free_mapped -= page.take_free(i0, i1, w, mask);
            return true;
        }
        let mut ready = true;
        words(i0, i1, |p, w, mask| {
            ready &= self.page(r, p).is_some_and(|page| {
                page.mapped[w] & mask == mask && !(any_lacking && page.no_access[w] & mask != 0)
            });
        });
        if ready {
            self.touch_in(r, i0, i1);
        }
        ready
    }

    /// [`Physical::touch`] on the granules `[i0, i1)` of region `r`.
    #[inline]
    fn touch_in(&mut self, r: usize, i0: u64, i1: u64) {
        let mut taken = 0u64;
        let pages = &mut self.regions[r].pages;
        // A free granule is one mapped that no chunk touches (`Page::free`): whatever the
        // count, a chunk touching it now takes it off the free bitmap.
        if i1 - i0 <= SHORT_SPAN {
            for i in i0..i1 {
                let (p, k, w, bit) = pos(i);
                let page = pages[p].get_or_insert_with(Page::new);
                page.touch[k] += 1;
                let gone = page.free[w] & bit;
                page.free[w] &= !gone;
                let n = u32::from(gone != 0);
                page.free_count -= n;
                taken += u64::from(n);
            }
        } else {
            words(i0, i1, |p, w, mask| {
                let page = pages[p].get_or_insert_with(Page::new);
                for b in mask.trailing_zeros()..64 - mask.leading_zeros() {
                    page.touch[(w << 6) + b as usize] += 1;
                }
                let gone = page.free[w] & mask;
                page.free[w] &= !gone;
                page.free_count -= gone.count_ones();
                taken += u64::from(gone.count_ones());
            });
        }
        self.free_mapped -= taken;
    }

    /// Undoes [`Physical::touch`]: a granule no chunk touches any more is free if mapped.
    ///
    /// # Time complexity
    /// `O(granules)`, as [`Physical::touch`].
    pub(super) fn untouch(&mut self, start: u64, end: u64) {
        self.untouch_marking(start, end, false);
    }

    /// [`Physical::untouch`] of a chunk freed at once, with no event, marking its mapped
    /// granules unsettled in the same walk: work queued before the free may still read them,
    /// so they are not unmapped until the fence after them completes. The single-stream
    /// free, kept to one locate and one pass.
    ///
    /// # Time complexity
    /// `O(granules)`, as [`Physical::touch`].
    pub(super) fn untouch_unsettled(&mut self, start: u64, end: u64) {
        self.untouch_marking(start, end, true);
        self.unsettled_any = true;
    }

    #[inline(always)]
    fn untouch_marking(&mut self, start: u64, end: u64, unsettle: bool) {
        let Some((r, i0, i1)) = self.locate(start, end) else {
            debug_assert!(false, "a chunk outside every region");
            return;
        };
        let mut freed = 0u64;
        let pages = &mut self.regions[r].pages;
        if let Some((p, w, mask)) = one_word(i0, i1) {
            // As in `touch_if_ready`: one page, one word of each bitmap.
            if let Some(page) = pages[p].as_deref_mut() {
                if unsettle {
                    page.unsettled[w] |= mask & page.mapped[w];
                }
                self.free_mapped += page.give_free(i0, i1, w);
            }
            return;
        }
        if i1 - i0 <= SHORT_SPAN {
            for i in i0..i1 {
                let (p, k, w, bit) = pos(i);
                // A page never made has no touch to undo.
                let Some(page) = pages[p].as_deref_mut() else {
                    continue;
                };
                if unsettle {
                    page.unsettled[w] |= bit & page.mapped[w];
                }
                let t = &mut page.touch[k];
                *t = t.saturating_sub(1);
                // All ones when no chunk touches it any more: no branch on the count.
                let last = 0u64.wrapping_sub(u64::from(*t == 0));
                let now = page.mapped[w] & bit & last & !page.free[w];
                page.free[w] |= now;
                let n = u32::from(now != 0);
                page.free_count += n;
                freed += u64::from(n);
            }
        } else {
            words(i0, i1, |p, w, mask| {
                let Some(page) = pages[p].as_deref_mut() else {
                    return;
                };
                if unsettle {
                    page.unsettled[w] |= mask & page.mapped[w];
                }
                // The granules of this word that no chunk touches any more.
                let mut last = 0u64;
                for b in mask.trailing_zeros()..64 - mask.leading_zeros() {
                    let t = &mut page.touch[(w << 6) + b as usize];
                    last |= u64::from(*t <= 1) << b;
                    *t = t.saturating_sub(1);
                }
                let now = page.mapped[w] & last & !page.free[w];
                page.free[w] |= now;
                page.free_count += now.count_ones();
                freed += u64::from(now.count_ones());
            });
        }
        self.free_mapped += freed;
    }

    // ---- mapping ------------------------------------------------------------------------

    /// Records `piece` mapped at granule `v` (not mapped), without access.
    ///
    /// # Time complexity
    /// `O(log regions)`.
    ///
    /// The allocator maps through [`Physical::map_all`]; the model test checks both.
    #[cfg(test)]
    pub(super) fn map(&mut self, v: u64, piece: Piece) {
        let Some((r, i, _)) = self.locate(v, v) else {
            debug_assert!(false, "a granule outside every region");
            return;
        };
        self.map_in(r, i, piece);
    }

    /// Records each `pieces[k]` mapped at granule `granules[k]` (ascending, none mapped, all
    /// in one region), without access: [`Physical::map`] for each, with one search for the
    /// region.
    ///
    /// # Time complexity
    /// `O(log regions + granules)`.
    pub(super) fn map_all(&mut self, granules: &[u64], pieces: &[Piece]) {
        debug_assert!(granules.len() == pieces.len() && granules.windows(2).all(|w| w[0] < w[1]));
        let (Some(&first), Some(&last)) = (granules.first(), granules.last()) else {
            return;
        };
        let Some((r, _, _)) = self.locate(first, last + self.g()) else {
            debug_assert!(false, "granules outside every region");
            return;
        };
        let base = self.regions[r].base;
        for (&v, &piece) in granules.iter().zip(pieces) {
            self.map_in(r, (v - base) >> self.shift, piece);
        }
    }

    /// [`Physical::map`] of granule `i` of region `r`.
    #[inline]
    fn map_in(&mut self, r: usize, i: u64, piece: Piece) {
        let (_, off, slot) = piece;
        let shift = self.shift;
        let (p, k, w, bit) = pos(i);
        let page = self.page_mut(r, p);
        debug_assert!(page.mapped[w] & bit == 0, "granule {i} mapped twice");
        page.backing[k] = Backing {
            slot,
            piece: (off >> shift) as u32,
        };
        page.mapped[w] |= bit;
        page.no_access[w] |= bit;
        let free = page.touch[k] == 0;
        if free {
            page.free[w] |= bit;
            page.free_count += 1;
        }
        self.free_mapped += u64::from(free);
        self.mapped += 1;
        self.no_access += 1;
        if let Some(Some(h)) = self.handles.get_mut(slot as usize) {
            h.mapped += 1;
        }
    }

    /// Forgets the mapping of granule `v` and returns its piece; `None` when it is not
    /// mapped.
    ///
    /// # Time complexity
    /// `O(log regions)`.
    pub(super) fn unmap(&mut self, v: u64) -> Option<Piece> {
        let (r, i, _) = self.locate(v, v)?;
        let shift = self.shift;
        let (p, k, w, bit) = pos(i);
        let page = self.regions[r].pages[p].as_deref_mut()?;
        if page.mapped[w] & bit == 0 {
            return None;
        }
        let b = page.backing[k];
        page.mapped[w] &= !bit;
        if page.free[w] & bit != 0 {
            page.free[w] &= !bit;
            page.free_count -= 1;
            self.free_mapped -= 1;
        }
        if page.no_access[w] & bit != 0 {
            page.no_access[w] &= !bit;
            self.no_access -= 1;
        }
        page.unsettled[w] &= !bit;
        page.fenced[w] &= !bit;
        self.mapped -= 1;
        let h = self.handles.get_mut(b.slot as usize)?.as_mut()?;
        h.mapped -= 1;
        Some((h.id, u64::from(b.piece) << shift, b.slot))
    }

    /// Records that the granules of `[start, end)` (inside one region) were granted access.
    ///
    /// # Time complexity
    /// `O(granules / 64)`.
    pub(super) fn grant(&mut self, start: u64, end: u64) {
        let Some((r, i0, i1)) = self.locate(start, end) else {
            return;
        };
        let mut granted = 0u64;
        let pages = &mut self.regions[r].pages;
        words(i0, i1, |p, w, mask| {
            if let Some(page) = pages[p].as_deref_mut() {
                let now = page.no_access[w] & mask;
                page.no_access[w] &= !now;
                granted += u64::from(now.count_ones());
            }
        });
        self.no_access -= granted;
    }

    /// True when no granule of `[start, end)` lacks access.
    ///
    /// # Time complexity
    /// `O(1)` while every granule mapped has access, else `O(granules / 64)`.
    pub(super) fn all_granted(&self, start: u64, end: u64) -> bool {
        self.no_access == 0 || self.count(start, end, |p| &p.no_access) == 0
    }

    /// Appends to `out` the granules of `[start, end)` (inside one region) mapped without
    /// access, in address order.
    ///
    /// # Time complexity
    /// `O(granules / 64)` plus the granules listed.
    pub(super) fn lacking_access(&self, start: u64, end: u64, out: &mut Vec<u64>) {
        if self.no_access > 0 {
            self.each(start, end, |p| &p.no_access, |v| out.push(v));
        }
    }

    /// Appends to `out` the granules of `[start, end)` not mapped, in address order (all of
    /// them when the span lies in no region).
    ///
    /// # Time complexity
    /// `O(granules / 64)` plus the granules listed.
    pub(super) fn unmapped_in(&self, start: u64, end: u64, out: &mut Vec<u64>) {
        let Some((r, i0, i1)) = self.locate(start, end) else {
            out.extend((start..end).step_by(self.g() as usize));
            return;
        };
        let base = self.regions[r].base;
        words(i0, i1, |p, w, mask| {
            let mut bits = self.page(r, p).map_or(mask, |page| !page.mapped[w] & mask);
            while bits != 0 {
                let b = u64::from(bits.trailing_zeros());
                bits &= bits - 1;
                let i = ((p as u64) << PAGE_SHIFT) + ((w as u64) << 6) + b;
                out.push(base + (i << self.shift));
            }
        });
    }

    /// The first `want` free mapped granules outside `[start, end)` whose work is known
    /// complete (not unsettled or fenced), in address order over all regions: the granules
    /// stitching moves.
    ///
    /// # Time complexity
    /// `O(pages)` plus `O(PAGE / 64)` per page holding a free granule looked at, plus the
    /// granules returned.
    #[cfg(test)]
    pub(super) fn victims(&self, start: u64, end: u64, want: u64) -> Vec<u64> {
        self.victims_within(None, start, end, want)
    }

    /// [`Physical::victims`] among the granules of the region based at `region` only, or of
    /// every region (`None`).
    pub(super) fn victims_within(
        &self,
        region: Option<u64>,
        start: u64,
        end: u64,
        want: u64,
    ) -> Vec<u64> {
        let mut out = Vec::new();
        if want == 0 {
            return out;
        }
        for reg in &self.regions {
            if region.is_some_and(|base| base != reg.base) {
                continue;
            }
            for (p, page) in reg.pages.iter().enumerate() {
                let Some(page) = page.as_deref() else {
                    continue;
                };
                if page.free_count == 0 {
                    continue;
                }
                // The page's granules, at most `reg.granules`, in address order: free, and
                // settled (not unsettled or fenced).
                let first = (p as u64) << PAGE_SHIFT;
                let in_page = (reg.granules - first).min(PAGE as u64);
                for w in 0..WORDS {
                    let mut bits = page.free[w] & !(page.unsettled[w] | page.fenced[w]);
                    while bits != 0 {
                        let b = u64::from(bits.trailing_zeros());
                        bits &= bits - 1;
                        let k = ((w as u64) << 6) + b;
                        if k >= in_page {
                            break;
                        }
                        let v = reg.base + ((first + k) << self.shift);
                        if v < start || v >= end {
                            out.push(v);
                            if out.len() as u64 >= want {
                                return out;
                            }
                        }
                    }
                }
            }
        }
        out
    }

    /// Every granule mapped, in address order.
    pub(super) fn mapped_granules(&self) -> Vec<u64> {
        self.all(|p| &p.mapped)
    }

    /// Every free mapped granule whose work is known complete (not unsettled or fenced), in
    /// address order: what trimming unmaps.
    pub(super) fn settled_free_granules(&self) -> Vec<u64> {
        let mut out = self.all(|p| &p.free);
        if self.unsettled_any || self.fenced_any {
            out.retain(|&v| !self.bit(v, |p| &p.unsettled) && !self.bit(v, |p| &p.fenced));
        }
        out
    }

    /// The free mapped granules of the granule-aligned span `[start, end)` (inside one
    /// region) whose work is known complete, in address order, appended to `out`: what a
    /// sleep unmaps under the allocations it puts to sleep.
    ///
    /// # Time complexity
    /// `O(granules / 64)` plus the granules found.
    pub(super) fn settled_free_in(&self, start: u64, end: u64, out: &mut Vec<u64>) {
        let from = out.len();
        self.each(start, end, |p| &p.free, |v| out.push(v));
        if self.unsettled_any || self.fenced_any {
            let mut i = from;
            while i < out.len() {
                let v = out[i];
                if self.bit(v, |p| &p.unsettled) || self.bit(v, |p| &p.fenced) {
                    out.swap_remove(i);
                } else {
                    i += 1;
                }
            }
            out[from..].sort_unstable();
        }
    }

    // ---- settling (stream order) ----------------------------------------------------------

    /// Every page made, in every region.
    fn pages_mut(&mut self) -> impl Iterator<Item = &mut Page> {
        self.regions
            .iter_mut()
            .flat_map(|r| r.pages.iter_mut().flatten().map(|p| &mut **p))
    }

    /// The fence was recorded (again): what was unsettled waits for it now.
    ///
    /// # Time complexity
    /// `O(pages)` when anything is unsettled, else `O(1)`.
    pub(super) fn fence_recorded(&mut self) {
        if !self.unsettled_any {
            return;
        }
        for page in self.pages_mut() {
            for w in 0..WORDS {
                page.fenced[w] |= page.unsettled[w];
                page.unsettled[w] = 0;
            }
        }
        self.unsettled_any = false;
        self.fenced_any = true;
    }

    /// A fence recorded and completed at once: every granule unsettled or fenced is settled
    /// ([`Physical::fence_recorded`] then [`Physical::fence_completed`], in one pass).
    ///
    /// # Time complexity
    /// `O(pages)` when anything is unsettled or fenced, else `O(1)`.
    pub(super) fn settle_all(&mut self) {
        if !self.any_unsettled() {
            return;
        }
        for page in self.pages_mut() {
            page.unsettled = [0; WORDS];
            page.fenced = [0; WORDS];
        }
        self.unsettled_any = false;
        self.fenced_any = false;
    }

    /// The fence completed: what waited for it is settled.
    ///
    /// # Time complexity
    /// `O(pages)` when anything was fenced, else `O(1)`.
    pub(super) fn fence_completed(&mut self) {
        if !self.fenced_any {
            return;
        }
        for page in self.pages_mut() {
            page.fenced = [0; WORDS];
        }
        self.fenced_any = false;
    }

    /// True when some granule is unsettled or fenced.
    pub(super) fn any_unsettled(&self) -> bool {
        self.unsettled_any || self.fenced_any
    }

    /// Free mapped granules that are unsettled or fenced: free, but not to be unmapped yet.
    ///
    /// # Time complexity
    /// `O(pages)` when anything is unsettled or fenced, else `O(1)`.
    pub(super) fn unsettled_free(&self) -> u64 {
        if !self.any_unsettled() {
            return 0;
        }
        let mut all = 0u64;
        for page in self.regions.iter().flat_map(|r| r.pages.iter().flatten()) {
            for w in 0..WORDS {
                let bits = page.free[w] & (page.unsettled[w] | page.fenced[w]);
                all += u64::from(bits.count_ones());
            }
        }
        all
    }

    /// [`Physical::unsettled_free`] under the granule-aligned span `[start, end)`.
    ///
    /// # Time complexity
    /// `O(granules / 64)`.
    pub(super) fn unsettled_free_in(&self, start: u64, end: u64) -> u64 {
        if !self.any_unsettled() {
            return 0;
        }
        let Some((r, i0, i1)) = self.locate(start, end) else {
            return 0;
        };
        let mut n = 0u64;
        words(i0, i1, |p, w, mask| {
            if let Some(page) = self.page(r, p) {
                let bits = page.free[w] & (page.unsettled[w] | page.fenced[w]) & mask;
                n += u64::from(bits.count_ones());
            }
        });
        n
    }

    fn all(&self, sel: impl Fn(&Page) -> &[u64; WORDS] + Copy) -> Vec<u64> {
        let mut out = Vec::new();
        for (r, reg) in self.regions.iter().enumerate() {
            for (p, page) in reg.pages.iter().enumerate() {
                if page.is_some() {
                    let i0 = (p as u64) << PAGE_SHIFT;
                    let i1 = (i0 + PAGE as u64).min(reg.granules);
                    self.each_in(r, i0, i1, sel, |v| out.push(v));
                }
            }
        }
        out
    }

    /// Calls `f(from, to)` for each run of consecutive mapped granules under `[start, end)`
    /// (inside one region), in address order.
    ///
    /// # Time complexity
    /// `O(granules / 64)` plus the mapped granules.
    pub(super) fn mapped_runs(&self, start: u64, end: u64, mut f: impl FnMut(u64, u64)) {
        let g = self.g();
        let mut run: Option<(u64, u64)> = None;
        self.each(
            start,
            end,
            |p| &p.mapped,
            |v| {
                run = match run {
                    Some((s, e)) if e == v => Some((s, v + g)),
                    Some((s, e)) => {
                        f(s, e);
                        Some((v, v + g))
                    }
                    None => Some((v, v + g)),
                };
            },
        );
        if let Some((s, e)) = run {
            f(s, e);
        }
    }

    /// The backing of the granules of `[start, end)` (granule-aligned, inside one region, all
    /// mapped) as runs `(va, len, handle id, handle size, offset in the handle)`: consecutive
    /// granules of consecutive pieces of one handle make one run. `None` when a granule is
    /// not mapped (asleep) or the span lies outside every region.
    ///
    /// # Time complexity
    /// `O(log regions + granules)`.
    pub(super) fn pieces_of(&self, start: u64, end: u64) -> Option<Vec<Run>> {
        let (r, i0, i1) = self.locate(start, end)?;
        let g = self.g();
        let mut runs: Vec<Run> = Vec::new();
        for i in i0..i1 {
            let (p, k, w, bit) = pos(i);
            let page = self.page(r, p)?;
            if page.mapped[w] & bit == 0 {
                return None;
            }
            let b = page.backing[k];
            let h = self.handles.get(b.slot as usize).copied().flatten()?;
            let (va, off) = (
                start + ((i - i0) << self.shift),
                u64::from(b.piece) << self.shift,
            );
            match runs.last_mut() {
                Some(run) if run.2 == h.id && run.0 + run.1 == va && run.4 + run.1 == off => {
                    run.1 += g;
                }
                _ => runs.push((va, g, h.id, h.size, off)),
            }
        }
        Some(runs)
    }

    // ---- handles and idle pieces --------------------------------------------------------

    /// Records a new handle of `size` bytes with the device's `id`; returns its slot. Its
    /// pieces are neither mapped nor idle yet: the caller maps them or makes them idle.
    #[cfg(test)]
    pub(super) fn add_handle(&mut self, id: u64, size: u64) -> u32 {
        self.add_handle_for(id, size, 0)
    }

    /// [`Physical::add_handle`] for a handle made for the region based at `home`.
    pub(super) fn add_handle_for(&mut self, id: u64, size: u64, home: u64) -> u32 {
        let rec = HandleRec {
            id,
            size,
            mapped: 0,
            home,
        };
        self.handle_count += 1;
        self.pool_bytes += size;
        let slot = self.vacant.pop().unwrap_or(self.handles.len() as u32);
        if slot as usize == self.handles.len() {
            self.handles.push(None);
        }
        self.handles[slot as usize] = Some(rec);
        slot
    }

    /// Forgets the handle in `slot` (none of its pieces mapped) and its idle pieces; returns
    /// its size.
    pub(super) fn remove_handle(&mut self, slot: u32) -> Option<u64> {
        let rec = self.handles.get_mut(slot as usize)?.take()?;
        self.vacant.push(slot);
        self.handle_count -= 1;
        self.pool_bytes -= rec.size;
        let pieces: Vec<Piece> = self
            .idle
            .range((rec.id, 0, 0)..=(rec.id, u64::MAX, u32::MAX))
            .copied()
            .collect();
        for piece in pieces {
            self.idle.remove(&piece);
        }
        Some(rec.size)
    }

    /// `(slot, record)` of every handle, by the device's handle id.
    pub(super) fn handles_by_id(&self) -> Vec<(u32, HandleRec)> {
        let mut all: Vec<(u32, HandleRec)> = self
            .handles
            .iter()
            .enumerate()
            .filter_map(|(s, h)| h.map(|h| (s as u32, h)))
            .collect();
        all.sort_unstable_by_key(|(_, h)| h.id);
        all
    }

    /// Makes `piece` idle.
    pub(super) fn make_idle(&mut self, piece: Piece) {
        self.idle.insert(piece);
    }

    /// Takes the first idle piece (lowest handle id, then offset).
    pub(super) fn take_idle(&mut self) -> Option<Piece> {
        self.idle.pop_first()
    }

    /// Takes the first idle piece of a handle made for the region based at `home`.
    ///
    /// # Time complexity
    /// Linear in the idle pieces looked at.
    pub(super) fn take_idle_homed(&mut self, home: u64) -> Option<Piece> {
        let handles = &self.handles;
        let piece = *self.idle.iter().find(|&&(_, _, slot)| {
            handles
                .get(slot as usize)
                .and_then(|h| h.as_ref())
                .is_some_and(|h| h.home == home)
        })?;
        self.idle.remove(&piece);
        Some(piece)
    }

    /// `(mapped, free and mapped, unsettled or fenced)` granules of the region based at
    /// `base`: a region none of whose mapped granules is touched, with none of them waiting
    /// for work, can be unmapped whole.
    ///
    /// # Time complexity
    /// `O(pages of the region × PAGE / 64)`.
    pub(super) fn region_counts(&self, base: u64) -> (u64, u64, u64) {
        let Some(reg) = self.regions.iter().find(|r| r.base == base) else {
            return (0, 0, 0);
        };
        let (mut mapped, mut free, mut waiting) = (0u64, 0u64, 0u64);
        for page in reg.pages.iter().flatten() {
            for w in 0..WORDS {
                mapped += u64::from(page.mapped[w].count_ones());
                free += u64::from(page.free[w].count_ones());
                waiting +=
                    u64::from(((page.unsettled[w] | page.fenced[w]) & page.mapped[w]).count_ones());
            }
        }
        (mapped, free, waiting)
    }

    /// Forgets every mapping (the device's were all unmapped) and every handle.
    pub(super) fn clear(&mut self) {
        for reg in &mut self.regions {
            reg.pages.iter_mut().for_each(|p| *p = None);
        }
        self.handles.clear();
        self.vacant.clear();
        self.idle.clear();
        self.handle_count = 0;
        self.mapped = 0;
        self.free_mapped = 0;
        self.no_access = 0;
        self.pool_bytes = 0;
    }

    // ---- invariants ---------------------------------------------------------------------

    /// Checks the invariants stated on the fields against `touch`, the touch count of every
    /// granule recomputed from the chunks in use (absent = 0), and `regions`, the regions of
    /// the address space.
    ///
    /// # Errors
    /// A description of the first one broken.
    pub(super) fn check(
        &self,
        touch: &FxHashMap<u64, u32>,
        regions: &[(u64, u64)],
    ) -> Result<(), String> {
        let g = self.g();
        let mut mine: Vec<(u64, u64)> = self
            .regions
            .iter()
            .map(|r| (r.base, r.granules << self.shift))
            .collect();
        let mut theirs = regions.to_vec();
        theirs.sort_unstable();
        mine.sort_unstable();
        if mine != theirs
            || self
                .regions
                .iter()
                .map(|r| r.base)
                .ne(mine.iter().map(|m| m.0))
        {
            return Err("the physical books' regions differ from the address space's".into());
        }
        let (mut mapped, mut free, mut no_access, mut touched) = (0u64, 0u64, 0u64, 0usize);
        let mut seen: BTreeSet<(u64, u64)> = BTreeSet::new();
        let mut mapped_of: FxHashMap<u32, u64> = FxHashMap::default();
        for reg in &self.regions {
            if reg.pages.len() as u64 != reg.granules.div_ceil(PAGE as u64) {
                return Err(format!("region {:#x}: wrong number of pages", reg.base));
            }
            for (p, page) in reg.pages.iter().enumerate() {
                let Some(page) = page.as_deref() else {
                    continue;
                };
                let mut page_free = 0u32;
                for k in 0..PAGE {
                    let i = ((p as u64) << PAGE_SHIFT) + k as u64;
                    let (w, bit) = (k >> 6, 1u64 << (k & 63));
                    let is = |bits: &[u64; WORDS]| bits[w] & bit != 0;
                    let v = reg.base + (i << self.shift);
                    let t = page.touch[k];
                    if i >= reg.granules {
                        if t != 0 || is(&page.mapped) || is(&page.free) || is(&page.no_access) {
                            return Err(format!("region {:#x}: a granule past its end", reg.base));
                        }
                        continue;
                    }
                    if (is(&page.unsettled) && !self.unsettled_any)
                        || (is(&page.fenced) && !self.fenced_any)
                    {
                        return Err(format!(
                            "granule {v:#x} is unsettled or fenced, the flags say none is"
                        ));
                    }
                    if (is(&page.unsettled) || is(&page.fenced)) && !is(&page.mapped) {
                        return Err(format!("granule {v:#x} is unsettled but not mapped"));
                    }
                    if touch.get(&v).copied().unwrap_or(0) != t {
                        return Err(format!(
                            "granule {v:#x}: use count {t}, the chunks in use say {}",
                            touch.get(&v).copied().unwrap_or(0)
                        ));
                    }
                    touched += usize::from(t > 0);
                    let m = is(&page.mapped);
                    if is(&page.free) != (m && t == 0) {
                        return Err(format!("granule {v:#x}: free-mapped index is wrong"));
                    }
                    if is(&page.no_access) && !m {
                        return Err(format!("granule {v:#x} lacks access but is not mapped"));
                    }
                    page_free += u32::from(is(&page.free));
                    no_access += u64::from(is(&page.no_access));
                    if m {
                        mapped += 1;
                        let b = page.backing[k];
                        let Some(Some(h)) = self.handles.get(b.slot as usize) else {
                            return Err(format!("granule {v:#x} is mapped to no handle"));
                        };
                        let off = u64::from(b.piece) * g;
                        if !seen.insert((h.id, off)) {
                            return Err(format!("handle {} offset {off} is mapped twice", h.id));
                        }
                        *mapped_of.entry(b.slot).or_insert(0) += 1;
                    }
                }
                if page_free != page.free_count {
                    return Err(format!(
                        "region {:#x} page {p}: free count is wrong",
                        reg.base
                    ));
                }
                free += u64::from(page_free);
            }
        }
        if touched != touch.len() {
            return Err("a granule in use lies outside every region".into());
        }
        if (mapped, free, no_access) != (self.mapped, self.free_mapped, self.no_access) {
            return Err(format!(
                "counts: {mapped} mapped, {free} free, {no_access} without access; books say \
                 {}, {}, {}",
                self.mapped, self.free_mapped, self.no_access
            ));
        }
        for &(id, off, slot) in &self.idle {
            match self.handles.get(slot as usize) {
                Some(Some(h)) if h.id == id => {}
                _ => return Err(format!("idle piece of handle {id} names slot {slot}")),
            }
            if !seen.insert((id, off)) {
                return Err(format!("handle {id} offset {off} is idle and mapped"));
            }
        }
        let (mut pool, mut granules, mut count) = (0u64, 0u64, 0usize);
        for (slot, h) in self.handles.iter().enumerate() {
            let vacant = self.vacant.contains(&(slot as u32));
            let Some(h) = h else {
                if !vacant {
                    return Err(format!("handle slot {slot} is empty but not vacant"));
                }
                continue;
            };
            if vacant {
                return Err(format!("handle slot {slot} is held and vacant"));
            }
            count += 1;
            pool += h.size;
            granules += h.size / g;
            if h.size == 0 || h.size % g != 0 {
                return Err(format!("handle {} has size {}", h.id, h.size));
            }
            if mapped_of.get(&(slot as u32)).copied().unwrap_or(0) != h.mapped {
                return Err(format!(
                    "handle {}: mapped count {} is wrong",
                    h.id, h.mapped
                ));
            }
        }
        if self.vacant.len() + count != self.handles.len() || count != self.handle_count {
            return Err("the handle slab's counts are wrong".into());
        }
        let by_id: FxHashMap<u64, u64> = self
            .handles
            .iter()
            .flatten()
            .map(|h| (h.id, h.size))
            .collect();
        if by_id.len() != count
            || granules != seen.len() as u64
            || seen.iter().any(|(id, off)| {
                by_id
                    .get(id)
                    .map_or(true, |&size| off % g != 0 || *off >= size)
            })
        {
            return Err("mapped and idle granules do not tile the handles".into());
        }
        if pool != self.pool_bytes {
            return Err(format!(
                "handles sum to {pool}, pool_bytes = {}",
                self.pool_bytes
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use proptest::prelude::*;

    const G: u64 = 1 << 21;

    /// The rule the bitmaps replace: the free mapped granules in address order, the span
    /// skipped, the first `want` taken.
    fn model_victims(free: &BTreeSet<u64>, start: u64, end: u64, want: u64) -> Vec<u64> {
        free.iter()
            .copied()
            .filter(|v| *v < start || *v >= end)
            .take(want as usize)
            .collect()
    }

    #[derive(Debug, Clone)]
    enum Step {
        Map(usize),
        Unmap(usize),
        Touch(usize, usize),
        TouchIfReady(usize, usize),
        /// `MapAll`, `Grant`, then `TouchIfReady` on one span: a span made ready.
        ReadySpan(usize, usize),
        /// `true`: freed at once, with no event (the granules turn unsettled).
        Untouch(usize, bool),
        /// `Some(false)`: the fence recorded; `Some(true)`: it completed; `None`: both at once.
        Fence(Option<bool>),
        Victims(usize, usize, u64),
        Grant(usize, usize),
        MapAll(usize, usize),
    }

    fn step(n: usize) -> impl Strategy<Value = Step> {
        prop_oneof![
            (0..n).prop_map(Step::Map),
            (0..n).prop_map(Step::Unmap),
            (0..n, 1..40usize).prop_map(|(a, l)| Step::Touch(a, l)),
            (0..n, 1..40usize).prop_map(|(a, l)| Step::TouchIfReady(a, l)),
            (0..n, 1..40usize).prop_map(|(a, l)| Step::ReadySpan(a, l)),
            (0..n, any::<bool>()).prop_map(|(i, at_once)| Step::Untouch(i, at_once)),
            proptest::option::of(any::<bool>()).prop_map(Step::Fence),
            (0..n, 0..40usize, 0..3000u64).prop_map(|(a, l, w)| Step::Victims(a, l, w)),
            (0..n, 0..40usize).prop_map(|(a, l)| Step::Grant(a, l)),
            (0..n, 0..40usize).prop_map(|(a, l)| Step::MapAll(a, l)),
        ]
    }

    // Three regions given out of address order, two of them adjacent, spanning several
    // pages: granule `i` of the concatenation below is at `addr(i)`.
    const SIZES: [u64; 3] = [1100, 300, 700];
    const BASES: [u64; 3] = [(1 << 40) + 300 * G, 1 << 40, 1 << 41];

    fn addr(i: usize) -> (u64, u64) {
        let mut i = i as u64;
        for (b, s) in BASES.iter().zip(SIZES) {
            if i < s {
                return (b + i * G, b + s * G);
            }
            i -= s;
        }
        unreachable!()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]

        /// The books against a model of sets and maps, step by step: counts, stitching
        /// victims in address order, runs, and the exact invariant check.
        #[test]
        fn books_follow_the_model(steps in proptest::collection::vec(step(2100), 1..200)) {
            let mut phys = Physical::new(G);
            for (b, s) in BASES.iter().zip(SIZES) {
                phys.add_region(*b, s * G);
            }
            let h = phys.add_handle(7, 2100 * G);
            let mut pieces: BTreeSet<u64> = (0..2100).collect();
            for &p in &pieces {
                phys.make_idle((7, p * G, h));
            }
            let regions: Vec<(u64, u64)> =
                BASES.iter().zip(SIZES).map(|(b, s)| (*b, s * G)).collect();
            let mut mapped: BTreeMap<u64, u64> = BTreeMap::new();
            let mut touch: FxHashMap<u64, u32> = FxHashMap::default();
            let mut live: Vec<(u64, u64)> = Vec::new();
            // Mapped granules granted access (a granule lacks it from its mapping on).
            let mut granted: BTreeSet<u64> = BTreeSet::new();
            // Mapped granules freed at once (no event), and those waiting for the fence.
            let mut unsettled: BTreeSet<u64> = BTreeSet::new();
            let mut fenced: BTreeSet<u64> = BTreeSet::new();
            let steps = steps.into_iter().flat_map(|s| match s {
                Step::ReadySpan(i, l) => {
                    vec![Step::MapAll(i, l), Step::Grant(i, l), Step::TouchIfReady(i, l)]
                }
                s => vec![s],
            });
            for s in steps {
                match s {
                    Step::Map(i) => {
                        let (v, _) = addr(i);
                        if let std::collections::btree_map::Entry::Vacant(e) = mapped.entry(v) {
                            let p = pieces.pop_first().unwrap();
                            prop_assert_eq!(phys.take_idle(), Some((7, p * G, h)));
                            phys.map(v, (7, p * G, h));
                            e.insert(p);
                            granted.remove(&v);
                        }
                    }
                    Step::Unmap(i) => {
                        let (v, _) = addr(i);
                        let got = phys.unmap(v);
                        match mapped.remove(&v) {
                            Some(p) => {
                                prop_assert_eq!(got, Some((7, p * G, h)));
                                phys.make_idle((7, p * G, h));
                                pieces.insert(p);
                            }
                            None => prop_assert_eq!(got, None),
                        }
                        unsettled.remove(&v);
                        fenced.remove(&v);
                    }
                    Step::Fence(Some(false)) => {
                        phys.fence_recorded();
                        fenced.append(&mut unsettled);
                    }
                    Step::Fence(Some(true)) => {
                        phys.fence_completed();
                        fenced.clear();
                    }
                    Step::Fence(None) => {
                        phys.settle_all();
                        unsettled.clear();
                        fenced.clear();
                    }
                    Step::Touch(i, l) => {
                        let (v, end) = addr(i);
                        let e = (v + l as u64 * G).min(end);
                        phys.touch(v, e);
                        live.push((v, e));
                        for g in (v..e).step_by(G as usize) {
                            *touch.entry(g).or_insert(0) += 1;
                        }
                    }
                    Step::TouchIfReady(i, l) => {
                        // Touched exactly when every granule is mapped with access.
                        let (v, end) = addr(i);
                        let e = (v + l as u64 * G).min(end);
                        let ready = (v..e)
                            .step_by(G as usize)
                            .all(|g| mapped.contains_key(&g) && granted.contains(&g));
                        prop_assert_eq!(phys.touch_if_ready(v, e), ready);
                        if ready {
                            live.push((v, e));
                            for g in (v..e).step_by(G as usize) {
                                *touch.entry(g).or_insert(0) += 1;
                            }
                        }
                    }
                    Step::ReadySpan(..) => unreachable!("expanded above"),
                    Step::Untouch(i, at_once) => {
                        if !live.is_empty() {
                            let (v, e) = live.swap_remove(i % live.len());
                            if at_once {
                                phys.untouch_unsettled(v, e);
                                unsettled.extend(mapped.range(v..e).map(|(&g, _)| g));
                            } else {
                                phys.untouch(v, e);
                            }
                            for g in (v..e).step_by(G as usize) {
                                let t = touch.get_mut(&g).unwrap();
                                *t -= 1;
                                if *t == 0 {
                                    touch.remove(&g);
                                }
                            }
                        }
                    }
                    Step::Victims(i, l, want) => {
                        let (v, end) = addr(i);
                        let e = (v + l as u64 * G).min(end);
                        let free: BTreeSet<u64> = mapped
                            .keys()
                            .copied()
                            .filter(|g| !touch.contains_key(g))
                            .collect();
                        // Stitching unmaps only granules whose work is complete.
                        let settled: BTreeSet<u64> = free
                            .iter()
                            .filter(|g| !unsettled.contains(g) && !fenced.contains(g))
                            .copied()
                            .collect();
                        prop_assert_eq!(
                            phys.victims(v, e, want),
                            model_victims(&settled, v, e, want)
                        );
                        let inside = free.range(v..e).count() as u64;
                        let mapped_in = mapped.range(v..e).count() as u64;
                        prop_assert_eq!(phys.mapped_in(v, e), mapped_in);
                        prop_assert_eq!(phys.mapped_and_free_in(v, e), (mapped_in, inside));
                        let untouched = (v..e).step_by(G as usize).filter(|g| !touch.contains_key(g));
                        prop_assert_eq!(phys.untouched_in(v, e), untouched.count() as u64);
                        let waiting = free
                            .range(v..e)
                            .filter(|g| unsettled.contains(g) || fenced.contains(g))
                            .count() as u64;
                        prop_assert_eq!(phys.unsettled_free_in(v, e), waiting);
                        let mut runs = Vec::new();
                        phys.mapped_runs(v, e, |a, b| runs.push((a, b)));
                        let mut want_runs: Vec<(u64, u64)> = Vec::new();
                        for &g in mapped.range(v..e).map(|(g, _)| g) {
                            match want_runs.last_mut() {
                                Some((_, b)) if *b == g => *b += G,
                                _ => want_runs.push((g, g + G)),
                            }
                        }
                        prop_assert_eq!(runs, want_runs);
                        let mut unmapped = Vec::new();
                        phys.unmapped_in(v, e, &mut unmapped);
                        let want_unmapped: Vec<u64> = (v..e)
                            .step_by(G as usize)
                            .filter(|g| !mapped.contains_key(g))
                            .collect();
                        prop_assert_eq!(unmapped, want_unmapped);
                    }
                    Step::MapAll(i, l) => {
                        // The unmapped granules of a span, mapped in one call.
                        let (v, end) = addr(i);
                        let e = (v + l as u64 * G).min(end);
                        let mut at = Vec::new();
                        phys.unmapped_in(v, e, &mut at);
                        let mut backing = Vec::new();
                        for &g in &at {
                            let p = pieces.pop_first().unwrap();
                            prop_assert_eq!(phys.take_idle(), Some((7, p * G, h)));
                            backing.push((7, p * G, h));
                            mapped.insert(g, p);
                            granted.remove(&g);
                        }
                        phys.map_all(&at, &backing);
                    }
                    Step::Grant(i, l) => {
                        let (v, end) = addr(i);
                        let e = (v + l as u64 * G).min(end);
                        let mut lacking = Vec::new();
                        phys.lacking_access(v, e, &mut lacking);
                        let want_lacking: Vec<u64> = mapped
                            .range(v..e)
                            .map(|(&g, _)| g)
                            .filter(|g| !granted.contains(g))
                            .collect();
                        prop_assert_eq!(lacking, want_lacking);
                        prop_assert_eq!(
                            phys.all_granted(v, e),
                            mapped.range(v..e).all(|(g, _)| granted.contains(g))
                        );
                        phys.grant(v, e);
                        granted.extend(mapped.range(v..e).map(|(&g, _)| g));
                        prop_assert!(phys.all_granted(v, e));
                    }
                }
                prop_assert_eq!(phys.mapped_count(), mapped.len() as u64);
                let free = mapped.keys().filter(|g| !touch.contains_key(g)).count() as u64;
                prop_assert_eq!(phys.free_mapped_count(), free);
                prop_assert_eq!(phys.idle_count(), pieces.len() as u64);
                // Free granules not to be unmapped yet, and the ones trimming may unmap.
                let is_free = |g: &&u64| mapped.contains_key(g) && !touch.contains_key(g);
                let waiting: BTreeSet<u64> = unsettled.union(&fenced).copied().collect();
                prop_assert_eq!(phys.unsettled_free(), waiting.iter().filter(is_free).count() as u64);
                // The flag may stay up after the last such granule is unmapped, never down.
                prop_assert!(phys.any_unsettled() || waiting.is_empty());
                let settled: Vec<u64> =
                    mapped.keys().filter(is_free).filter(|g| !waiting.contains(g)).copied().collect();
                prop_assert_eq!(phys.settled_free_granules(), settled);
                prop_assert_eq!(phys.check(&touch, &regions), Ok(()));
            }
            prop_assert_eq!(phys.mapped_granules(), mapped.keys().copied().collect::<Vec<_>>());
        }
    }

    /// A span of `len` granules from granule `first` of region 0, mapped and granted except
    /// where told otherwise.
    #[test_case::test_case(0, 3, None, None, true; "short span, all ready")]
    #[test_case::test_case(60, 70, None, None, true; "long span across bitmap words")]
    #[test_case::test_case(1020, 8, None, None, true; "short span across two pages")]
    #[test_case::test_case(0, 3, Some(1), None, false; "one granule unmapped")]
    #[test_case::test_case(60, 70, Some(129), None, false; "long span, last granule unmapped")]
    #[test_case::test_case(0, 3, None, Some(2), false; "one granule without access")]
    #[test_case::test_case(60, 70, None, Some(60), false; "long span, first without access")]
    fn touch_if_ready_touches_only_ready_spans(
        first: u64,
        len: u64,
        unmapped: Option<u64>,
        no_access: Option<u64>,
        ready: bool,
    ) {
        let base = BASES[0];
        let mut phys = Physical::new(G);
        phys.add_region(base, SIZES[0] * G);
        let at: Vec<u64> = (first..first + len)
            .filter(|&i| Some(i) != unmapped)
            .map(|i| base + i * G)
            .collect();
        let h = phys.add_handle(7, at.len() as u64 * G);
        let backing: Vec<Piece> = (0..at.len() as u64).map(|k| (7, k * G, h)).collect();
        phys.map_all(&at, &backing);
        let (start, end) = (base + first * G, base + (first + len) * G);
        phys.grant(start, end);
        if let Some(i) = no_access {
            // Remapped: a granule lacks access from its mapping on.
            let v = base + i * G;
            let piece = phys.unmap(v).unwrap();
            phys.map_all(&[v], &[piece]);
        }
        let free_before = phys.free_mapped_count();
        assert_eq!(phys.touch_if_ready(start, end), ready);
        let mut touch: FxHashMap<u64, u32> = FxHashMap::default();
        if ready {
            touch.extend((start..end).step_by(G as usize).map(|g| (g, 1)));
            assert_eq!(phys.free_mapped_count(), 0);
        } else {
            assert_eq!(phys.free_mapped_count(), free_before, "nothing changed");
        }
        assert_eq!(phys.check(&touch, &[(base, SIZES[0] * G)]), Ok(()));
    }

    #[test]
    fn check_catches_a_wrong_count() {
        let mut phys = Physical::new(G);
        phys.add_region(1 << 40, 64 * G);
        let h = phys.add_handle(1, G);
        phys.map(1 << 40, (1, 0, h));
        let regions = [(1 << 40, 64 * G)];
        let none = FxHashMap::default();
        assert_eq!(phys.check(&none, &regions), Ok(()));
        // A touch the chunks do not explain.
        phys.touch(1 << 40, (1 << 40) + G);
        assert!(phys.check(&none, &regions).is_err());
        phys.untouch(1 << 40, (1 << 40) + G);
        phys.free_mapped += 1;
        assert!(phys.check(&none, &regions).is_err());
    }
}
