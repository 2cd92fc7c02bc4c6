//! The free-chunk index of bfc's arena and vmm's space: every free chunk, ordered by
//! `(size, address)`, with an `O(1)` jump to the first non-empty size class at or above a
//! request.
//!
//! XLA's 21 bins ([`bins`](super::bins): bin `b` = sizes in `[256 << b, 256 << (b + 1))`, bin
//! 20 open-ended) are kept, each refined TLSF-style into 64 **classes** by the six bits below
//! the size's leading bit (bins 0–5 have fewer distinct sizes, so some classes stay empty;
//! bin 20 is refined by the size's exact power of two as well). Every class covers a contiguous range
//! of sizes and holds its chunks sorted by `(size, address)`, so walking the classes in order
//! walks all free chunks in `(size, address)` order — the same order as XLA's bins, and
//! hence the same best fit: smallest size that fits, lowest address on ties. Two bitmaps
//! (classes per power of two, powers of two with a non-empty class) find the next non-empty
//! class in a few instructions.
//!
//! A class is one cache line (64 bytes, aligned): it keeps up to two chunks inline (then there
//! is no pointer to chase), spills into a sorted `Vec`, and is cut into `Blocks` of at most
//! 16 chunks (a B-tree of two levels) when it holds more than [`BLOCKS_AT`]. Searches
//! within a class compare `(size, address)` as one 128-bit key and take no data-dependent
//! branch; entries move up or down through a register, not by a `memmove` call, and a sorted
//! class finds the place of an entry it gains or loses in the same backward pass that moves
//! the entries above it (one loop exit to mispredict rather than a search's and a shift's).
//! The first load of a class record and the search's mispredictions are what an index
//! operation costs most, hence one line (four inline entries would straddle two) and no
//! data-dependent branch.
#![deny(unsafe_code)]

/// Bits of second-level refinement: 64 classes per power of two. (128 would halve the chunks
/// per class, but double a row to 8 KiB, which every index pays afresh as it makes its rows:
/// short-lived indexes, as a replay makes many, lose more than a long churn gains.)
const SL_BITS: u32 = 6;
const SL_COUNT: usize = 1 << SL_BITS;
/// Powers of two of 256-byte units a `u64` size can have.
const FL_COUNT: usize = 56;
/// Number of classes.
const NUM_CLASSES: usize = FL_COUNT * SL_COUNT;
/// One bit per class of a power of two.
type SlMap = u64;
/// A class holding more chunks than this is cut into `Blocks` (and one holding half as
/// many again is a vector). Below it, a sorted vector's one backward pass to insert or
/// remove costs less than finding a block. At 1,024 the 64 KiB churn's draining heap, with
/// classes of hundreds of chunks, took twice the misses (cachegrind, a 512 KiB last level);
/// at 128 (blocks of 32) the steady churn's classes of tens of chunks still moved half of
/// theirs per insert or removal — vmm's `insert_sorted` alone 142 instructions per
/// allocate+free pair at 64 KiB. At 16 (blocks of 16), per pair at 64 KiB (cachegrind, less
/// the harness): vmm 1,754 → 1,619 instructions and 18.9 → 16.4 L1 misses, bfc 818 → 757 and
/// 9.5 → 8.3, for about one more mispredicted branch; 32 / 32 saved half as much.
pub const BLOCKS_AT: usize = 16;

/// One free chunk as the index knows it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Entry {
    /// Bytes (a non-zero multiple of 256).
    pub size: u64,
    /// First byte.
    pub addr: u64,
    /// The chunk's slab index.
    pub idx: u32,
}

/// Where [`FreeIndex::best_fit_hinted`] found an entry: its class and position there
/// (`u32::MAX` when the class is blocks). Only a hint: checked against the entry before use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hint {
    class: u32,
    pos: u32,
}

impl Hint {
    /// A hint that never holds: the hinted calls search.
    pub const NONE: Hint = Hint {
        class: u32::MAX,
        pos: u32::MAX,
    };
}

/// Entries a class holds inline, without a heap buffer.
const INLINE: usize = 2;

fn key(e: &Entry) -> (u64, u64) {
    (e.size, e.addr)
}

/// `(size, addr)` as one integer, ordered as the pair: comparisons without branches.
#[inline(always)]
fn key128(size: u64, addr: u64) -> u128 {
    (u128::from(size) << 64) | u128::from(addr)
}

#[inline(always)]
fn ekey(e: &Entry) -> u128 {
    key128(e.size, e.addr)
}

/// Classes up to this long are searched by counting rather than halving.
const LINEAR_UP_TO: usize = 8;

/// The number of entries of the sorted `v` whose key is below `k`: where `k` is, or would
/// go. Without data-dependent branches (the classes are short and their keys random, so a
/// branchy search mispredicts at nearly every step).
///
/// # Time complexity
/// `O(log n)` (`O(n)` for `n <= LINEAR_UP_TO`).
#[inline(always)]
fn lower_bound(v: &[Entry], k: u128) -> usize {
    if v.len() <= LINEAR_UP_TO {
        return v.iter().map(|x| usize::from(ekey(x) < k)).sum();
    }
    let (mut base, mut len) = (0, v.len());
    while len > 1 {
        let half = len / 2;
        // A multiplication, not an `if`: the compiler keeps a branch for the 128-bit
        // comparison otherwise, and it mispredicts half the time.
        base += half * usize::from(ekey(&v[base + half]) < k);
        len -= half;
    }
    base + usize::from(ekey(&v[base]) < k)
}

/// Inserts `e` at `pos` of `v`, moving the tail up through a register rather than by a
/// `memmove` call (which costs more than the few entries a class moves).
#[inline]
fn insert_at(v: &mut Vec<Entry>, pos: usize, e: Entry) {
    let mut carry = e;
    for slot in &mut v[pos..] {
        carry = std::mem::replace(slot, carry);
    }
    v.push(carry);
}

/// Removes and returns entry `pos` of the non-empty `v`, moving the tail down as
/// [`insert_at`] moves it up.
#[inline]
fn remove_at_vec(v: &mut Vec<Entry>, pos: usize) -> Entry {
    let mut carry = v.pop().expect("a non-empty class");
    for slot in v[pos..].iter_mut().rev() {
        carry = std::mem::replace(slot, carry);
    }
    carry
}

/// Inserts `e` into the sorted `v`. Searches and shifts in one backward pass, moving each
/// entry above `e` up a slot: one loop exit to mispredict, where a search and then a shift
/// each had theirs. The mirror of [`remove_sorted`].
///
/// # Time complexity
/// `O(n - p)` moves for `e`'s position `p`.
#[inline]
fn insert_sorted(v: &mut Vec<Entry>, e: Entry) {
    let k = ekey(&e);
    v.push(e);
    // On a slice, not through the `Vec`: its pointer and length stay in registers (a store
    // through the `Vec`'s buffer could, for all the compiler knows, change them), and the
    // index checks fold away.
    let s = v.as_mut_slice();
    let mut i = s.len() - 1;
    while i > 0 {
        let below = s[i - 1];
        if ekey(&below) <= k {
            break;
        }
        s[i] = below;
        i -= 1;
    }
    s[i] = e;
}

/// Removes the entry with key `k` from the sorted `v`; false (and `v` unchanged) if there
/// is none. Searches and shifts in one backward pass, carrying each entry down a slot until
/// the carried one is `k`: one loop exit to mispredict, where a search and then a shift each
/// had theirs. A missing key costs a second pass to put the entries back.
///
/// # Time complexity
/// `O(n - p)` moves for the entry at position `p`.
#[inline]
fn remove_sorted(v: &mut Vec<Entry>, k: u128) -> bool {
    let Some(mut carry) = v.pop() else {
        return false;
    };
    // Invariant: `v[j..]` holds the entries after `carry`'s old position, each one slot down.
    let mut j = v.len();
    while ekey(&carry) > k && j > 0 {
        j -= 1;
        carry = std::mem::replace(&mut v[j], carry);
    }
    if ekey(&carry) == k {
        return true;
    }
    insert_at(v, j, carry);
    false
}

/// Restores the order of `v` after `v[pos]` was overwritten.
fn resettle(v: &mut [Entry], mut pos: usize) {
    while pos > 0 && key(&v[pos - 1]) > key(&v[pos]) {
        v.swap(pos - 1, pos);
        pos -= 1;
    }
    while pos + 1 < v.len() && key(&v[pos + 1]) < key(&v[pos]) {
        v.swap(pos, pos + 1);
        pos += 1;
    }
}

/// Entries a block of a [`Blocks`] class holds at most.
const BLOCK_MAX: usize = 16;
/// Entries every block of a [`Blocks`] class holds at least (fewer, and it merges with a
/// neighbour).
const BLOCK_MIN: usize = BLOCK_MAX / 4;

/// A crowded class: its entries, sorted by `(size, addr)`, cut into blocks of
/// [`BLOCK_MIN`]`..=`[`BLOCK_MAX`] entries, with the first key of each block beside them.
///
/// A B-tree of two levels with wide nodes, in place of `BTreeMap`'s three or more levels of
/// eleven keys: at the many hundreds of chunks a class holds while a full heap drains, each
/// level is a cache miss, and the first keys of all the classes' blocks (16 bytes a block)
/// are few enough to stay in cache. An operation counts the first keys at or below its key
/// (no data-dependent branch), then works in one block as a sorted class does in its `Vec`.
///
/// Invariants: `firsts.len() == blocks.len()`; `firsts[i]` is the key of `blocks[i][0]`;
/// every block holds `BLOCK_MIN..=BLOCK_MAX` entries, sorted, each above the entries of
/// the blocks before it; `len` is their number, more than [`BLOCKS_AT`]` / 2`.
#[derive(Debug)]
struct Blocks {
    firsts: Vec<u128>,
    blocks: Vec<Vec<Entry>>,
    len: usize,
}

/// The number of `firsts` at or below `k` (sorted `firsts`), without data-dependent
/// branches.
#[inline(always)]
fn count_at_or_below(firsts: &[u128], k: u128) -> usize {
    if firsts.len() <= 2 * LINEAR_UP_TO {
        return firsts.iter().map(|&f| usize::from(f <= k)).sum();
    }
    let (mut base, mut len) = (0, firsts.len());
    while len > 1 {
        let half = len / 2;
        base += half * usize::from(firsts[base + half] <= k);
        len -= half;
    }
    base + usize::from(firsts[base] <= k)
}

/// A block holding `v`, with room to grow to one past [`BLOCK_MAX`] (a split's trigger)
/// without reallocating.
fn new_block(v: &[Entry]) -> Vec<Entry> {
    let mut b = Vec::with_capacity(BLOCK_MAX + 1);
    b.extend_from_slice(v);
    b
}

impl Blocks {
    /// The sorted `v` (more than `BLOCKS_AT / 2` entries, hence at least `BLOCK_MIN`) cut
    /// into blocks three-quarters full.
    fn from_sorted(v: &[Entry]) -> Blocks {
        debug_assert!(v.len() > BLOCKS_AT / 2 && v.len() >= BLOCK_MIN);
        let mut blocks: Vec<Vec<Entry>> = v.chunks(BLOCK_MAX * 3 / 4).map(new_block).collect();
        // A short last block goes into the one before (which then holds < BLOCK_MAX).
        if blocks.last().is_some_and(|b| b.len() < BLOCK_MIN) {
            let last = blocks.pop().unwrap_or_default();
            if let Some(before) = blocks.last_mut() {
                before.extend_from_slice(&last);
            }
        }
        Blocks {
            firsts: blocks.iter().map(|b| ekey(&b[0])).collect(),
            blocks,
            len: v.len(),
        }
    }

    /// The block where key `k` is or would go: the last whose first key is at or below
    /// `k` (the first block if none is).
    #[inline(always)]
    fn block_of(&self, k: u128) -> usize {
        count_at_or_below(&self.firsts, k).saturating_sub(1)
    }

    /// Where the first entry at or above `k` is: block and position (`blocks.len()` past
    /// the last).
    #[inline]
    fn seek(&self, k: u128) -> (usize, usize) {
        let i = self.block_of(k);
        let pos = lower_bound(&self.blocks[i], k);
        if pos < self.blocks[i].len() {
            (i, pos)
        } else {
            // Block `i + 1`, if any, starts above `k`.
            (i + 1, 0)
        }
    }

    #[inline]
    fn insert(&mut self, e: Entry) {
        let k = ekey(&e);
        let i = self.block_of(k);
        let b = &mut self.blocks[i];
        insert_sorted(b, e);
        let full = b.len() > BLOCK_MAX;
        // Only the first block can gain an entry below its first.
        self.firsts[i] = self.firsts[i].min(k);
        self.len += 1;
        if full {
            self.split(i);
        }
    }

    /// Removes the entry with key `k`; false if there is none.
    #[inline]
    fn remove(&mut self, k: u128) -> bool {
        let i = self.block_of(k);
        if !remove_sorted(&mut self.blocks[i], k) {
            return false;
        }
        self.removed_from(i);
        true
    }

    /// Removes and returns the first entry at or above `k`.
    #[inline]
    fn take_first_at_least(&mut self, k: u128) -> Option<Entry> {
        let (i, pos) = self.seek(k);
        let e = remove_at_vec(self.blocks.get_mut(i)?, pos);
        self.removed_from(i);
        Some(e)
    }

    /// Books the removal of an entry of block `i`: its first key, and a merge if it is
    /// short now.
    #[inline]
    fn removed_from(&mut self, i: usize) {
        self.len -= 1;
        if self.blocks[i].len() < BLOCK_MIN {
            self.merge(i);
        } else {
            self.firsts[i] = ekey(&self.blocks[i][0]);
        }
    }

    /// Splits the overfull block `i` in two halves.
    #[cold]
    #[inline(never)]
    fn split(&mut self, i: usize) {
        let b = &mut self.blocks[i];
        let upper = new_block(&b[b.len() / 2..]);
        b.truncate(b.len() / 2);
        self.firsts.insert(i + 1, ekey(&upper[0]));
        self.blocks.insert(i + 1, upper);
    }

    /// Merges the short block `i` with a neighbour (there is one: a class of blocks holds
    /// more than one block's worth), splitting the result again if overfull.
    #[cold]
    #[inline(never)]
    fn merge(&mut self, i: usize) {
        let lo = if i + 1 < self.blocks.len() { i } else { i - 1 };
        let hi = self.blocks.remove(lo + 1);
        self.firsts.remove(lo + 1);
        let b = &mut self.blocks[lo];
        b.extend_from_slice(&hi);
        self.firsts[lo] = ekey(&b[0]);
        if b.len() > BLOCK_MAX {
            self.split(lo);
        }
    }

    /// The entry of exactly `size` bytes with the highest address.
    fn last_of_size(&self, size: u64) -> Option<Entry> {
        let k = key128(size, u64::MAX);
        let b = &self.blocks[self.block_of(k)];
        let end = b.partition_point(|x| ekey(x) <= k);
        end.checked_sub(1).map(|i| b[i]).filter(|e| e.size == size)
    }

    fn get(&self, k: u128) -> Option<u32> {
        let b = &self.blocks[self.block_of(k)];
        b.get(lower_bound(b, k))
            .filter(|x| ekey(x) == k)
            .map(|x| x.idx)
    }

    /// The entries at or above `k`, in order.
    fn iter_from(&self, k: u128) -> BlocksIter<'_> {
        let (i, pos) = self.seek(k);
        let head = self.blocks.get(i).map_or(&[][..], |b| &b[pos..]);
        let rest = self.blocks.get(i + 1..).unwrap_or_default();
        head.iter().chain(rest.iter().flatten())
    }

    fn last(&self) -> Option<Entry> {
        self.blocks.last().and_then(|b| b.last()).copied()
    }

    /// The block invariants (the order of all entries is checked by the caller).
    fn check(&self) -> Result<(), String> {
        if self.firsts.len() != self.blocks.len() {
            return Err(format!(
                "{} first keys for {} blocks",
                self.firsts.len(),
                self.blocks.len()
            ));
        }
        for (i, (b, &first)) in self.blocks.iter().zip(&self.firsts).enumerate() {
            if !(BLOCK_MIN..=BLOCK_MAX).contains(&b.len()) {
                return Err(format!("block {i} holds {} entries", b.len()));
            }
            if ekey(&b[0]) != first {
                return Err(format!("block {i}'s first key is not its first entry's"));
            }
        }
        let total: usize = self.blocks.iter().map(Vec::len).sum();
        if total != self.len || total <= BLOCKS_AT / 2 {
            return Err(format!("{total} entries in blocks, len = {}", self.len));
        }
        Ok(())
    }
}

/// The entries of a [`Blocks`] class from some key on.
type BlocksIter<'a> = std::iter::Chain<
    std::slice::Iter<'a, Entry>,
    std::iter::Flatten<std::slice::Iter<'a, Vec<Entry>>>,
>;

/// The chunks of one class, sorted by `(size, addr)`.
#[derive(Debug)]
#[repr(align(64))]
enum Class {
    /// Up to `INLINE` entries in place (most classes hold a handful: no pointer to chase).
    Inline { len: u8, items: [Entry; INLINE] },
    /// Invariant: more than `INLINE / 2` and at most `BLOCKS_AT` entries.
    Sorted(Vec<Entry>),
    /// Invariant: more than `BLOCKS_AT / 2` entries (see [`Blocks`]).
    Blocks(Blocks),
}

impl Class {
    const EMPTY: Class = Class::Inline {
        len: 0,
        items: [Entry {
            size: 0,
            addr: 0,
            idx: 0,
        }; INLINE],
    };

    /// An inline class holding the entries of `v` (at most `INLINE`).
    fn inline_from(v: &[Entry]) -> Class {
        let mut items = [Entry::default(); INLINE];
        items[..v.len()].copy_from_slice(v);
        Class::Inline {
            len: v.len() as u8,
            items,
        }
    }

    fn len(&self) -> usize {
        match self {
            Class::Inline { len, .. } => usize::from(*len),
            Class::Sorted(v) => v.len(),
            Class::Blocks(b) => b.len,
        }
    }

    /// The entries, when not blocks.
    #[inline(always)]
    fn slice(&self) -> Option<&[Entry]> {
        match self {
            Class::Inline { len, items } => Some(&items[..usize::from(*len)]),
            Class::Sorted(v) => Some(v),
            Class::Blocks(_) => None,
        }
    }

    /// The entries, mutable, when not blocks.
    fn slice_mut(&mut self) -> Option<&mut [Entry]> {
        match self {
            Class::Inline { len, items } => Some(&mut items[..usize::from(*len)]),
            Class::Sorted(v) => Some(v),
            Class::Blocks(_) => None,
        }
    }

    #[inline]
    fn insert(&mut self, e: Entry) {
        match self {
            Class::Inline { len, items } => {
                let n = usize::from(*len);
                let pos = lower_bound(&items[..n], ekey(&e));
                if n < INLINE {
                    // A fixed, unrolled shift of the slots above `pos` (those past `len`
                    // hold nothing that matters).
                    for i in (1..INLINE).rev() {
                        if i > pos {
                            items[i] = items[i - 1];
                        }
                    }
                    items[pos] = e;
                    *len += 1;
                } else {
                    let mut v = Vec::with_capacity(2 * INLINE);
                    v.extend_from_slice(items);
                    insert_at(&mut v, pos, e);
                    *self = Class::Sorted(v);
                }
            }
            Class::Sorted(v) => {
                insert_sorted(v, e);
                if v.len() > BLOCKS_AT {
                    *self = Class::Blocks(Blocks::from_sorted(v));
                }
            }
            Class::Blocks(b) => b.insert(e),
        }
    }

    #[inline]
    fn remove(&mut self, size: u64, addr: u64) -> bool {
        let k = key128(size, addr);
        let v = match self {
            Class::Inline { len, items } => &items[..usize::from(*len)],
            Class::Sorted(v) => {
                if !remove_sorted(v, k) {
                    return false;
                }
                if v.len() <= INLINE / 2 {
                    *self = Class::inline_from(v);
                }
                return true;
            }
            Class::Blocks(b) => {
                if !b.remove(k) {
                    return false;
                }
                self.thinned();
                return true;
            }
        };
        let pos = lower_bound(v, k);
        if v.get(pos).is_some_and(|x| ekey(x) == k) {
            self.remove_at(pos);
            true
        } else {
            false
        }
    }

    /// Turns a class of blocks that has lost an entry back into a vector once it holds
    /// `BLOCKS_AT / 2` or fewer.
    #[inline]
    fn thinned(&mut self) {
        if let Class::Blocks(b) = self {
            if b.len <= BLOCKS_AT / 2 {
                *self = Class::Sorted(b.blocks.concat());
            }
        }
    }

    /// Removes and returns the entry at `pos` of a class that is not blocks.
    #[inline]
    fn remove_at(&mut self, pos: usize) -> Entry {
        match self {
            Class::Inline { len, items } => {
                let e = items[pos];
                // A fixed, unrolled shift, as in `insert`.
                for i in 0..INLINE - 1 {
                    if i >= pos {
                        items[i] = items[i + 1];
                    }
                }
                *len -= 1;
                e
            }
            Class::Sorted(v) => {
                let e = remove_at_vec(v, pos);
                if v.len() <= INLINE / 2 {
                    *self = Class::inline_from(v);
                }
                e
            }
            Class::Blocks(_) => unreachable!("remove_at on blocks"),
        }
    }

    /// Removes and returns the first entry with `size >= at_least`: one search where
    /// [`Class::first_at_least`] then [`Class::remove`] would make two.
    #[inline]
    fn take_first_at_least(&mut self, at_least: u64) -> Option<Entry> {
        let pos = match self {
            Class::Inline { len, items } => {
                lower_bound(&items[..usize::from(*len)], key128(at_least, 0))
            }
            Class::Sorted(v) => lower_bound(v, key128(at_least, 0)),
            Class::Blocks(b) => {
                let e = b.take_first_at_least(key128(at_least, 0))?;
                self.thinned();
                return Some(e);
            }
        };
        (pos < self.len()).then(|| self.remove_at(pos))
    }

    /// Replaces the entry `(size, addr)` by `e`, which belongs to the same class; false if
    /// there was no such entry.
    fn replace(&mut self, size: u64, addr: u64, e: Entry) -> bool {
        let v: &mut [Entry] = match self {
            Class::Inline { len, items } => &mut items[..usize::from(*len)],
            Class::Sorted(v) => v,
            Class::Blocks(_) => {
                if !self.remove(size, addr) {
                    return false;
                }
                self.insert(e);
                return true;
            }
        };
        let k = key128(size, addr);
        let pos = lower_bound(v, k);
        if !v.get(pos).is_some_and(|x| ekey(x) == k) {
            return false;
        }
        v[pos] = e;
        resettle(v, pos);
        true
    }

    /// The first entry with `size >= at_least` — or, with `last_of_size`, the last entry of
    /// that entry's size — and its position (`None` in blocks).
    #[inline(always)]
    fn first_at_least(&self, at_least: u64, last_of_size: bool) -> Option<(Entry, Option<usize>)> {
        let Some(v) = self.slice() else {
            let e = self.find_from(at_least, |_| true)?;
            let e = if last_of_size {
                self.last_of_size(e.size)?
            } else {
                e
            };
            return Some((e, None));
        };
        let mut pos = lower_bound(v, key128(at_least, 0));
        let size = v.get(pos)?.size;
        if last_of_size {
            // Chunks of one size are few: a step or two forward, not a second search.
            while v.get(pos + 1).is_some_and(|x| x.size == size) {
                pos += 1;
            }
        }
        Some((v[pos], Some(pos)))
    }

    /// True when the entry at `pos` is `(size, addr)`.
    #[inline]
    fn holds_at(&self, pos: usize, size: u64, addr: u64) -> bool {
        self.slice()
            .and_then(|v| v.get(pos))
            .is_some_and(|x| ekey(x) == key128(size, addr))
    }

    fn last(&self) -> Option<Entry> {
        match self {
            Class::Blocks(b) => b.last(),
            _ => self.slice().and_then(|v| v.last().copied()),
        }
    }

    /// The first entry with `size >= at_least` that `accept`s, in `(size, addr)` order.
    fn find_from(&self, at_least: u64, mut accept: impl FnMut(&Entry) -> bool) -> Option<Entry> {
        match self {
            Class::Blocks(b) => b
                .iter_from(key128(at_least, 0))
                .find(|e| accept(e))
                .copied(),
            _ => {
                let v = self.slice()?;
                let start = lower_bound(v, key128(at_least, 0));
                v[start..].iter().find(|e| accept(e)).copied()
            }
        }
    }

    /// The entry of exactly `size` bytes with the highest address.
    #[inline]
    fn last_of_size(&self, size: u64) -> Option<Entry> {
        match self {
            Class::Blocks(b) => b.last_of_size(size),
            _ => {
                let v = self.slice()?;
                let end = v.partition_point(|x| x.size <= size);
                end.checked_sub(1).map(|i| v[i]).filter(|e| e.size == size)
            }
        }
    }

    /// The entries with `size >= at_least`, in `(size, addr)` order.
    fn iter_from(&self, at_least: u64) -> ClassIter<'_> {
        match self {
            Class::Blocks(b) => ClassIter::Blocks(b.iter_from(key128(at_least, 0))),
            _ => {
                let v = self.slice().unwrap_or_default();
                ClassIter::Slice(v[lower_bound(v, key128(at_least, 0))..].iter())
            }
        }
    }

    fn get(&self, size: u64, addr: u64) -> Option<u32> {
        match self {
            Class::Blocks(b) => b.get(key128(size, addr)),
            _ => {
                let v = self.slice()?;
                let k = key128(size, addr);
                v.get(lower_bound(v, k))
                    .filter(|x| ekey(x) == k)
                    .map(|x| x.idx)
            }
        }
    }

    fn entries(&self) -> Vec<Entry> {
        match self {
            Class::Blocks(b) => b.blocks.concat(),
            _ => self.slice().map(<[Entry]>::to_vec).unwrap_or_default(),
        }
    }
}

/// The entries of one class from some size on, in `(size, addr)` order.
enum ClassIter<'a> {
    Slice(std::slice::Iter<'a, Entry>),
    Blocks(BlocksIter<'a>),
}

impl Iterator for ClassIter<'_> {
    type Item = Entry;

    fn next(&mut self) -> Option<Entry> {
        match self {
            ClassIter::Slice(it) => it.next().copied(),
            ClassIter::Blocks(it) => it.next().copied(),
        }
    }
}

/// The class of a chunk of `size` bytes (at least 256).
#[inline]
fn class_of(size: u64) -> usize {
    let units = (size >> 8).max(1);
    let lz = units.leading_zeros();
    // The `SL_BITS` bits below the leading one, read after shifting that bit to the top: the
    // same for sizes above and below `SL_COUNT` units, where choosing between a right and a left shift by
    // the size's magnitude was a branch mispredicted on about one class lookup in five.
    let sl = ((units << lz) >> (63 - SL_BITS)) as usize & (SL_COUNT - 1);
    (63 - lz) as usize * SL_COUNT + sl
}

/// The classes of one power of two (4 KiB).
type Row = [Class; SL_COUNT];

/// A row of empty classes, on the heap. Out of line: built in place, its 4 KiB would make
/// the frame of every insertion that might call it that large (a stack probe per call).
#[cold]
#[inline(never)]
fn new_row() -> Box<Row> {
    Box::new([const { Class::EMPTY }; SL_COUNT])
}

/// What a class of a row never made reads as.
static EMPTY_CLASS: Class = Class::EMPTY;

/// Free chunks ordered by `(size, address)`; see the module docs.
#[derive(Debug)]
pub struct FreeIndex {
    /// Row `f` holds classes `f * SL_COUNT .. (f + 1) * SL_COUNT`, made when a chunk of that
    /// power of two first arrives: an index is cheap to make and to drop (a full table,
    /// 224 KiB, would be written or faulted in by every index made — a replay makes many — and
    /// read back when dropped), and the rows a workload uses are few. Invariant: class `c` holds exactly the
    /// indexed chunks with `class_of(size) == c`, sorted by `(size, addr)`; a row never made
    /// holds none.
    rows: [Option<Box<Row>>; FL_COUNT],
    /// Bit `s` of `sl_map[f]` set iff class `f * SL_COUNT + s` is non-empty.
    sl_map: [SlMap; FL_COUNT],
    /// Bit `f` set iff `sl_map[f] != 0`.
    fl_map: u64,
    /// Invariant: the number of entries in all classes.
    len: usize,
}

impl Default for FreeIndex {
    fn default() -> Self {
        Self::new()
    }
}

impl FreeIndex {
    /// An empty index: no class row made yet.
    ///
    /// # Time complexity
    /// `O(1)`, no allocation.
    pub fn new() -> Self {
        FreeIndex {
            rows: [const { None }; FL_COUNT],
            sl_map: [0; FL_COUNT],
            fl_map: 0,
            len: 0,
        }
    }

    /// Number of chunks indexed.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Class `c` (an empty one if its row was never made).
    #[inline]
    fn class(&self, c: usize) -> &Class {
        self.rows[c / SL_COUNT]
            .as_deref()
            .map_or(&EMPTY_CLASS, |row| &row[c % SL_COUNT])
    }

    /// Class `c`, if its row was made.
    #[inline]
    fn class_if_made(&mut self, c: usize) -> Option<&mut Class> {
        self.rows[c / SL_COUNT]
            .as_deref_mut()
            .map(|row| &mut row[c % SL_COUNT])
    }

    /// Class `c`, its row made if need be.
    #[inline]
    fn class_made(&mut self, c: usize) -> &mut Class {
        let row = self.rows[c / SL_COUNT].get_or_insert_with(new_row);
        &mut row[c % SL_COUNT]
    }

    /// Every class, in order (those of rows never made read as empty).
    fn all_classes(&self) -> impl Iterator<Item = &Class> + '_ {
        (0..NUM_CLASSES).map(|c| self.class(c))
    }

    /// True when no chunk is indexed.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Adds a free chunk.
    ///
    /// # Time complexity
    /// `O(k)` for `k ≤ BLOCKS_AT` chunks in its class (one backward pass that finds the place
    /// and moves the entries above it); beyond, `O(log k)` to find the block and
    /// `O(BLOCK_MAX)` in it, plus `O(k / BLOCK_MIN)` to move the list of blocks when one
    /// splits or merges (at most one operation in `BLOCK_MIN`).
    #[inline]
    pub fn insert(&mut self, size: u64, addr: u64, idx: u32) {
        let c = class_of(size);
        self.class_made(c).insert(Entry { size, addr, idx });
        self.sl_map[c / SL_COUNT] |= 1 << (c % SL_COUNT);
        self.fl_map |= 1 << (c / SL_COUNT);
        self.len += 1;
    }

    /// Removes the free chunk `(size, addr)`; false if it was not indexed.
    ///
    /// # Time complexity
    /// As [`FreeIndex::insert`].
    #[inline]
    pub fn remove(&mut self, size: u64, addr: u64) -> bool {
        let c = class_of(size);
        if !self
            .class_if_made(c)
            .is_some_and(|class| class.remove(size, addr))
        {
            return false;
        }
        self.emptied(c);
        self.len -= 1;
        true
    }

    /// Replaces the free chunk `(size, addr)` by `(new_size, new_addr, idx)` — a split or a
    /// merge — in place when both fall in the same class; false (and no change) if
    /// `(size, addr)` was not indexed.
    ///
    /// # Time complexity
    /// As [`FreeIndex::insert`]; usually a single search.
    #[inline]
    pub fn replace(
        &mut self,
        size: u64,
        addr: u64,
        new_size: u64,
        new_addr: u64,
        idx: u32,
    ) -> bool {
        let c = class_of(size);
        if class_of(new_size) == c {
            let e = Entry {
                size: new_size,
                addr: new_addr,
                idx,
            };
            return self
                .class_if_made(c)
                .is_some_and(|class| class.replace(size, addr, e));
        }
        if !self.remove(size, addr) {
            return false;
        }
        self.insert(new_size, new_addr, idx);
        true
    }

    /// The slab index of the free chunk `(size, addr)`, if indexed.
    pub fn get(&self, size: u64, addr: u64) -> Option<u32> {
        self.class(class_of(size)).get(size, addr)
    }

    /// The first non-empty class at or after `c`.
    fn next_class(&self, c: usize) -> Option<usize> {
        if c >= NUM_CLASSES {
            return None;
        }
        let (f, s) = (c / SL_COUNT, c % SL_COUNT);
        let here = self.sl_map[f] & (SlMap::MAX << s);
        if here != 0 {
            return Some(f * SL_COUNT + here.trailing_zeros() as usize);
        }
        let above = if f + 1 < 64 {
            self.fl_map & (u64::MAX << (f + 1))
        } else {
            0
        };
        if above == 0 {
            return None;
        }
        let f = above.trailing_zeros() as usize;
        Some(f * SL_COUNT + self.sl_map[f].trailing_zeros() as usize)
    }

    /// The best fit for `size` bytes: the smallest free chunk of at least `size`, the lowest
    /// address among equals.
    ///
    /// # Time complexity
    /// `O(log k)` for `k` chunks in a class.
    #[inline]
    pub fn best_fit(&self, size: u64) -> Option<Entry> {
        self.best_fit_hinted(size, false).map(|(e, _)| e)
    }

    /// [`FreeIndex::best_fit`] — or, with `last_of_size`, the chunk of the best fit's size
    /// with the highest address — and a [`Hint`] of where it sits, which spares
    /// [`FreeIndex::replace_hinted`] or [`FreeIndex::remove_hinted`] their search while the
    /// index has not changed in between.
    ///
    /// # Time complexity
    /// `O(log k)` for `k` chunks in a class, plus the chunks of the best fit's size.
    #[inline(always)]
    pub fn best_fit_hinted(&self, size: u64, last_of_size: bool) -> Option<(Entry, Hint)> {
        let mut c = class_of(size);
        let found = match self.class(c).first_at_least(size, last_of_size) {
            Some(found) => found,
            None => {
                c = self.next_class(c + 1)?;
                self.class(c).first_at_least(0, last_of_size)?
            }
        };
        let (e, pos) = found;
        let hint = Hint {
            class: c as u32,
            pos: pos.map_or(u32::MAX, |p| p as u32),
        };
        Some((e, hint))
    }

    /// [`FreeIndex::replace`], with a search spared when `hint` (from
    /// [`FreeIndex::best_fit_hinted`]) still points at `(size, addr)`; any hint is safe: a
    /// stale one costs the search.
    ///
    /// # Time complexity
    /// As [`FreeIndex::replace`]; no search in the class of `(size, addr)` when the hint holds.
    #[inline]
    pub fn replace_hinted(&mut self, hint: Hint, size: u64, addr: u64, e: Entry) -> bool {
        match self.hinted(hint, size, addr) {
            Some((c, pos)) if class_of(e.size) == c => {
                // A class that is not blocks: `holds_at` checked it.
                if let Some(v) = self.class_if_made(c).and_then(Class::slice_mut) {
                    v[pos] = e;
                    resettle(v, pos);
                }
                true
            }
            Some((c, pos)) => {
                self.remove_in(c, pos);
                self.insert(e.size, e.addr, e.idx);
                true
            }
            None => self.replace(size, addr, e.size, e.addr, e.idx),
        }
    }

    /// [`FreeIndex::remove`], with a search spared when `hint` still points at `(size, addr)`
    /// (see [`FreeIndex::replace_hinted`]).
    ///
    /// # Time complexity
    /// As [`FreeIndex::remove`]; no search when the hint holds.
    #[inline]
    pub fn remove_hinted(&mut self, hint: Hint, size: u64, addr: u64) -> bool {
        match self.hinted(hint, size, addr) {
            Some((c, pos)) => {
                self.remove_in(c, pos);
                true
            }
            None => self.remove(size, addr),
        }
    }

    /// `(class, position)` of `hint` if the entry there is `(size, addr)`.
    #[inline]
    fn hinted(&self, hint: Hint, size: u64, addr: u64) -> Option<(usize, usize)> {
        let (c, pos) = (hint.class as usize, hint.pos as usize);
        (c < NUM_CLASSES && self.class(c).holds_at(pos, size, addr)).then_some((c, pos))
    }

    /// Removes the entry at `pos` of class `c`, which is not blocks and holds one there.
    #[inline]
    fn remove_in(&mut self, c: usize, pos: usize) {
        if let Some(class) = self.class_if_made(c) {
            class.remove_at(pos);
            self.emptied(c);
            self.len -= 1;
        }
    }

    /// Removes and returns [`FreeIndex::best_fit`]`(size)`: one search of the class where
    /// `best_fit` then `remove` would make two.
    ///
    /// # Time complexity
    /// As [`FreeIndex::remove`].
    #[inline]
    pub fn take_best_fit(&mut self, size: u64) -> Option<Entry> {
        let mut c = class_of(size);
        // The bitmap says whether the request's own class holds anything, without touching
        // the class (a cache miss when the index is large).
        let here = self.sl_map[c / SL_COUNT] & (1 << (c % SL_COUNT)) != 0;
        let found = if here {
            self.class_if_made(c)?.take_first_at_least(size)
        } else {
            None
        };
        let e = match found {
            Some(e) => e,
            None => {
                c = self.next_class(c + 1)?;
                self.class_if_made(c)?.take_first_at_least(0)?
            }
        };
        self.emptied(c);
        self.len -= 1;
        Some(e)
    }

    /// Clears class `c`'s bits if it is empty now.
    #[inline]
    fn emptied(&mut self, c: usize) {
        if self.class(c).len() == 0 {
            let f = c / SL_COUNT;
            self.sl_map[f] &= !(1 << (c % SL_COUNT));
            if self.sl_map[f] == 0 {
                self.fl_map &= !(1 << f);
            }
        }
    }

    /// The first free chunk of at least `size` bytes, in `(size, address)` order, that
    /// `accept`s.
    ///
    /// # Time complexity
    /// Linear in the chunks tried.
    pub fn find(&self, size: u64, mut accept: impl FnMut(&Entry) -> bool) -> Option<Entry> {
        let mut c = self.next_class(class_of(size))?;
        loop {
            if let Some(e) = self.class(c).find_from(size, &mut accept) {
                return Some(e);
            }
            c = self.next_class(c + 1)?;
        }
    }

    /// Every free chunk of at least `size` bytes, in `(size, address)` order, lazily.
    ///
    /// # Time complexity
    /// `O(1)` per entry yielded, plus a bitmap step per non-empty class.
    pub fn iter_from(&self, size: u64) -> impl Iterator<Item = Entry> + '_ {
        let first = self.next_class(class_of(size));
        std::iter::successors(first, move |&c| self.next_class(c + 1))
            .flat_map(move |c| self.class(c).iter_from(size))
    }

    /// The largest free chunk.
    ///
    /// # Time complexity
    /// `O(1)`.
    pub fn largest(&self) -> Option<Entry> {
        if self.fl_map == 0 {
            return None;
        }
        let f = 63 - self.fl_map.leading_zeros() as usize;
        let s = SlMap::BITS as usize - 1 - self.sl_map[f].leading_zeros() as usize;
        self.class(f * SL_COUNT + s).last()
    }

    /// Every entry, in `(size, address)` order. For checks.
    ///
    /// # Time complexity
    /// `O(n + classes)`.
    pub fn entries(&self) -> Vec<Entry> {
        self.all_classes().flat_map(Class::entries).collect()
    }

    /// Checks the index's own invariants (classes, order, bitmaps, count).
    ///
    /// # Errors
    /// A description of the first one broken.
    pub fn check(&self) -> Result<(), String> {
        let mut total = 0;
        // Only the rows made hold anything, and a row never made must have no bit set: its
        // classes are walked (as empty) only if it has one, which they then contradict.
        // (Walking all 3,584 classes, each copied into a vector, was most of the time of the
        // tests that check after every step.)
        let made = (0..FL_COUNT).filter(|&f| self.rows[f].is_some() || self.sl_map[f] != 0);
        for c in made.flat_map(|f| f * SL_COUNT..(f + 1) * SL_COUNT) {
            let class = self.class(c);
            let entries: std::borrow::Cow<'_, [Entry]> = match class.slice() {
                Some(v) => v.into(),
                None => class.entries().into(),
            };
            total += entries.len();
            match class {
                Class::Sorted(v) if v.len() <= INLINE / 2 || v.len() > BLOCKS_AT => {
                    return Err(format!("class {c} is a Vec of {} entries", v.len()));
                }
                Class::Blocks(b) => b.check().map_err(|e| format!("class {c}: {e}"))?,
                _ => {}
            }
            if entries
                .windows(2)
                .any(|w| (w[0].size, w[0].addr) >= (w[1].size, w[1].addr))
            {
                return Err(format!("class {c} is not sorted by (size, address)"));
            }
            if let Some(e) = entries.iter().find(|e| class_of(e.size) != c) {
                return Err(format!("class {c} holds a chunk of {} bytes", e.size));
            }
            let bit = self.sl_map[c / SL_COUNT] & (1 << (c % SL_COUNT)) != 0;
            if bit == entries.is_empty() {
                return Err(format!("class bitmap disagrees with class {c}"));
            }
        }
        for f in 0..FL_COUNT {
            if (self.fl_map & (1 << f) != 0) != (self.sl_map[f] != 0) {
                return Err(format!("top bitmap disagrees with row {f}"));
            }
        }
        if total != self.len {
            return Err(format!("{total} entries, but len = {}", self.len));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_are_monotonic_and_nest_in_xla_bins() {
        let mut last = 0;
        let mut size = 256;
        while size < (1 << 40) {
            let c = class_of(size);
            assert!(c >= last, "class of {size} went down");
            assert_eq!(
                (c / SL_COUNT).min(20),
                crate::strategy::bins::bin_for_size(size),
                "class of {size} outside its XLA bin"
            );
            last = c;
            size += 256 + size / 97 / 256 * 256;
        }
        assert_eq!(class_of(u64::MAX) / SL_COUNT, FL_COUNT - 1);
    }

    /// The class as the module docs define it: the power of two of the size in 256-byte
    /// units, then the six bits below its leading bit (shifted up where there are fewer).
    fn class_by_definition(size: u64) -> usize {
        let units = (size >> 8).max(1);
        let fl = 63 - units.leading_zeros();
        let sl = if fl >= SL_BITS {
            units >> (fl - SL_BITS)
        } else {
            units << (SL_BITS - fl)
        } as usize
            & (SL_COUNT - 1);
        fl as usize * SL_COUNT + sl
    }

    /// `remove_sorted` on the keys 10, 20, 30 (sizes, address 0): a present key goes and the
    /// rest keep their order; an absent one leaves the vector as it was (the second pass).
    #[test_case::test_case(&[10, 20, 30], 10, true, &[20, 30]; "the first")]
    #[test_case::test_case(&[10, 20, 30], 20, true, &[10, 30]; "the middle")]
    #[test_case::test_case(&[10, 20, 30], 30, true, &[10, 20]; "the last: nothing carried")]
    #[test_case::test_case(&[10, 20, 30], 5, false, &[10, 20, 30]; "absent, below all")]
    #[test_case::test_case(&[10, 20, 30], 25, false, &[10, 20, 30]; "absent, between")]
    #[test_case::test_case(&[10, 20, 30], 35, false, &[10, 20, 30]; "absent, above all")]
    #[test_case::test_case(&[10], 10, true, &[]; "the only one")]
    #[test_case::test_case(&[], 10, false, &[]; "empty")]
    fn remove_sorted_cases(before: &[u64], key: u64, found: bool, after: &[u64]) {
        let entry = |&size: &u64| Entry {
            size,
            addr: 0,
            idx: size as u32,
        };
        let mut v: Vec<Entry> = before.iter().map(entry).collect();
        assert_eq!(remove_sorted(&mut v, key128(key, 0)), found);
        assert_eq!(v, after.iter().map(entry).collect::<Vec<_>>());
    }

    #[test_case::test_case(256, 0; "one unit")]
    #[test_case::test_case(768, 64 + 32; "three units: bits shifted up")]
    #[test_case::test_case(63 << 8, 5 * 64 + 62; "63 units: the last class with gaps")]
    #[test_case::test_case(64 << 8, 6 * 64; "64 units: the first row of exact sizes")]
    #[test_case::test_case(127 << 8, 6 * 64 + 63; "127 units")]
    #[test_case::test_case(3 << 20, 13 * 64 + 32; "3 MiB")]
    #[test_case::test_case(u64::MAX, 55 * 64 + 63; "the largest size")]
    fn class_of_cases(size: u64, class: usize) {
        assert_eq!(
            SL_COUNT, 64,
            "the table is written for 64 classes per power of two"
        );
        assert_eq!(class_of(size), class);
        assert_eq!(class_by_definition(size), class);
    }

    proptest::proptest! {
        #[test]
        fn class_of_follows_its_definition(units in 1u64..=(u64::MAX >> 8), shift in 0u32..56) {
            let size = (units >> shift).max(1) << 8;
            proptest::prop_assert_eq!(class_of(size), class_by_definition(size));
        }
    }

    /// An index of two chunks in one class (4 KiB, inline) and one of 1 MiB, corrupted by
    /// `corrupt`: `check` names what is wrong.
    #[test_case::test_case(|ix| { ix.sl_map[5] |= 1; ix.fl_map |= 1 << 5; }, "class bitmap disagrees with class 320"; "a bit for a row never made")]
    #[test_case::test_case(|ix| ix.fl_map |= 1 << 7, "top bitmap disagrees with row 7"; "a top bit without its row's")]
    #[test_case::test_case(|ix| ix.sl_map[class_of(4096) / SL_COUNT] = 0, "class bitmap disagrees"; "a class's bit cleared")]
    #[test_case::test_case(|ix| ix.len += 1, "entries, but len = 4"; "the count off by one")]
    #[test_case::test_case(|ix| {
        if let Some(Class::Inline { items, .. }) = ix.class_if_made(class_of(4096)) {
            items.swap(0, 1);
        }
    }, "is not sorted"; "a class out of order")]
    #[test_case::test_case(|ix| {
        if let Some(Class::Inline { items, .. }) = ix.class_if_made(class_of(4096)) {
            items[1].size = 8192;
        }
    }, "holds a chunk of 8192 bytes"; "a chunk in another size's class")]
    fn check_names_the_corruption(corrupt: fn(&mut FreeIndex), what: &str) {
        let mut ix = FreeIndex::new();
        ix.insert(4096, 1 << 20, 0);
        ix.insert(4096, 2 << 20, 1);
        ix.insert(1 << 20, 3 << 20, 2);
        ix.check().unwrap();
        corrupt(&mut ix);
        let err = ix.check().unwrap_err();
        assert!(err.contains(what), "{err}");
    }

    #[test]
    fn best_fit_walks_size_then_address() {
        let mut ix = FreeIndex::new();
        for (i, (size, addr)) in [
            (4096, 900),
            (1024, 500),
            (1024, 100),
            (768, 50),
            (1 << 30, 0),
        ]
        .into_iter()
        .enumerate()
        {
            ix.insert(size, addr, i as u32);
        }
        ix.check().unwrap();
        assert_eq!(ix.best_fit(1024).map(|e| e.addr), Some(100));
        assert_eq!(ix.best_fit(769).map(|e| e.addr), Some(100));
        assert_eq!(ix.best_fit(512).map(|e| e.addr), Some(50));
        assert_eq!(ix.best_fit(2048).map(|e| e.addr), Some(900));
        assert_eq!(ix.best_fit(8192).map(|e| e.size), Some(1 << 30));
        assert_eq!(ix.best_fit((1 << 30) + 256), None);
        assert_eq!(ix.largest().map(|e| e.size), Some(1 << 30));
        assert_eq!(ix.find(1024, |e| e.addr > 100).map(|e| e.addr), Some(500));
        assert!(ix.replace(4096, 900, 4352, 800, 0), "same class, moves up");
        assert!(ix.replace(768, 50, 512, 60, 3), "another class");
        assert!(!ix.replace(768, 50, 512, 60, 3));
        ix.check().unwrap();
        assert_eq!(
            ix.best_fit(2048).map(|e| (e.size, e.addr)),
            Some((4352, 800))
        );
        assert_eq!(ix.best_fit(256).map(|e| (e.size, e.addr)), Some((512, 60)));
        assert!(ix.remove(1024, 100));
        assert!(!ix.remove(1024, 100));
        assert_eq!(ix.best_fit(1024).map(|e| e.addr), Some(500));
        ix.check().unwrap();
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]
        /// `take_best_fit` removes exactly what `best_fit` names — the smallest entry of at
        /// least the size, the lowest address on ties, as a sorted set's first entry at or
        /// after `(size, 0)` — and `remove` / `replace` find exactly the entry named, through
        /// every class form: sizes crowd a few classes, so classes grow past `LINEAR_UP_TO` into
        /// halving searches; and the smallest class starts with up to twice `BLOCKS_AT` entries,
        /// so that it begins as blocks (or a vector about to become them) that the operations
        /// grow, or take apart down to empty and back to an inline class.
        #[test]
        fn the_index_agrees_with_a_sorted_set(
            prefill in 0usize..2 * BLOCKS_AT + 2,
            ops in proptest::collection::vec((0u64..2, 1u64..3, 0u8..7, 0usize..1000), 1..800)
        ) {
            let mut ix = FreeIndex::new();
            let mut model = std::collections::BTreeSet::new();
            for k in 0..prefill as u64 {
                // 256 B (the smallest size of the operations), above their addresses.
                let addr = (1 << 60) + (k << 8);
                ix.insert(256, addr, k as u32);
                model.insert((256, addr, k as u32));
            }
            // The last hint handed out and the entry it named, kept across later changes (so
            // often stale).
            let mut hint = (Hint::NONE, (0, 0, 0));
            for (i, (shift, units, op, pick)) in ops.into_iter().enumerate() {
                // Four sizes in as many classes (256 B to 4 KiB), two inserts to a take.
                let size = units << (8 + 3 * shift);
                // An entry of the model, or (when empty) one that is not there.
                let named = model
                    .iter()
                    .nth(pick % model.len().max(1))
                    .copied()
                    .unwrap_or((size, 1 << 60, 0));
                match op {
                    0 | 1 => {
                        let addr = (i as u64) << 40;
                        ix.insert(size, addr, i as u32);
                        model.insert((size, addr, i as u32));
                    }
                    2 => {
                        let want = model.range((size, 0, 0)..).next().copied();
                        let expected = ix.best_fit(size);
                        let got = ix.take_best_fit(size);
                        proptest::prop_assert_eq!(got, expected);
                        proptest::prop_assert_eq!(got.map(|e| (e.size, e.addr, e.idx)), want);
                        if let Some(w) = want {
                            model.remove(&w);
                        }
                    }
                    3 => {
                        // Half the time an address one unit off: not indexed.
                        let (s, a, _) = named;
                        let a = a + u64::from(pick % 2 == 1);
                        let there = model.iter().any(|&(ms, ma, _)| (ms, ma) == (s, a));
                        proptest::prop_assert_eq!(ix.remove(s, a), there);
                        model.retain(|&(ms, ma, _)| (ms, ma) != (s, a));
                    }
                    5 => {
                        // The best fit's size, its first or its last entry, and a hint.
                        let last = pick % 2 == 1;
                        let first = model.range((size, 0, 0)..).next().copied();
                        let want = first.and_then(|(fs, _, _)| {
                            let mut of_size = model.range((fs, 0, 0)..(fs + 1, 0, 0));
                            if last { of_size.next_back() } else { of_size.next() }.copied()
                        });
                        let got = ix.best_fit_hinted(size, last);
                        proptest::prop_assert_eq!(got.map(|(e, _)| (e.size, e.addr, e.idx)), want);
                        hint = got.map_or((Hint::NONE, named), |(e, h)| (h, (e.size, e.addr, e.idx)));
                    }
                    6 => {
                        // The last hint, current or stale, with the entry it named or another,
                        // either maybe gone: the hinted calls answer as the plain ones.
                        let named = if pick % 2 == 0 { hint.1 } else { named };
                        let (s, a, idx) = named;
                        let hint = hint.0;
                        let there = model.contains(&named);
                        if pick % 3 == 0 {
                            proptest::prop_assert_eq!(ix.remove_hinted(hint, s, a), there);
                            model.remove(&named);
                        } else {
                            let e = Entry { size, addr: a, idx };
                            proptest::prop_assert_eq!(ix.replace_hinted(hint, s, a, e), there);
                            if there {
                                model.remove(&named);
                                model.insert((size, a, idx));
                            }
                        }
                    }
                    _ => {
                        // Split or merge: a new size (maybe in another class), same address.
                        let (s, a, idx) = named;
                        let there = model.contains(&named);
                        proptest::prop_assert_eq!(ix.replace(s, a, size, a, idx), there);
                        if there {
                            model.remove(&named);
                            model.insert((size, a, idx));
                        }
                    }
                }
                ix.check().map_err(proptest::test_runner::TestCaseError::fail)?;
                proptest::prop_assert_eq!(ix.len(), model.len());
                let entries: Vec<_> = ix.entries().iter().map(|e| (e.size, e.addr, e.idx)).collect();
                let want: Vec<_> = model.iter().copied().collect();
                proptest::prop_assert_eq!(entries, want);
            }
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]
        /// [`Blocks`] alone against a sorted map, from the smallest class of blocks to some
        /// forty blocks (halving searches of the first keys): every operation answers as the
        /// map does and leaves the block invariants (sizes, first keys, count) whole, through
        /// splits and merges at either end. Four sizes, addresses from a small range, so
        /// that keys collide (an insert of a key held is skipped: the index never holds one
        /// twice) and removes often miss.
        #[test]
        fn blocks_agree_with_a_sorted_map(
            start in (BLOCKS_AT / 2 + 1)..4 * BLOCKS_AT,
            ops in proptest::collection::vec((0u8..7, 0u32..4, 0u64..1500), 1..600)
        ) {
            let entry = |size: u64, addr: u64| Entry { size, addr, idx: (size ^ addr) as u32 };
            let mut model = std::collections::BTreeMap::new();
            let v: Vec<Entry> = (0..start as u64)
                .map(|k| entry(256 << (k * 4 / start as u64), k * 3))
                .collect();
            for e in &v {
                model.insert((e.size, e.addr), e.idx);
            }
            let mut b = Blocks::from_sorted(&v);
            b.check().map_err(proptest::test_runner::TestCaseError::fail)?;
            for (op, shift, addr) in ops {
                let size = 256u64 << shift;
                let k = key128(size, addr);
                // Removals stop at the fewest entries blocks hold (the class turns into a
                // vector there).
                let may_remove = b.len > BLOCKS_AT / 2 + 1;
                match op {
                    0 | 1 => {
                        if let std::collections::btree_map::Entry::Vacant(slot) = model.entry((size, addr)) {
                            slot.insert(entry(size, addr).idx);
                            b.insert(entry(size, addr));
                        }
                    }
                    2 if may_remove => {
                        let there = model.remove(&(size, addr)).is_some();
                        proptest::prop_assert_eq!(b.remove(k), there);
                    }
                    3 if may_remove => {
                        let want = model.range((size, 0)..).next().map(|(&(s, a), &i)| Entry { size: s, addr: a, idx: i });
                        if let Some(w) = want {
                            model.remove(&(w.size, w.addr));
                        }
                        proptest::prop_assert_eq!(b.take_first_at_least(key128(size, 0)), want);
                    }
                    4 => {
                        proptest::prop_assert_eq!(b.get(k), model.get(&(size, addr)).copied());
                        let last = model.range((size, 0)..=(size, u64::MAX)).next_back();
                        proptest::prop_assert_eq!(b.last_of_size(size).map(|e| (e.size, e.addr, e.idx)), last.map(|(&(s, a), &i)| (s, a, i)));
                    }
                    _ => {
                        let got: Vec<_> = b.iter_from(k).map(|e| (e.size, e.addr, e.idx)).collect();
                        let want: Vec<_> = model.range((size, addr)..).map(|(&(s, a), &i)| (s, a, i)).collect();
                        proptest::prop_assert_eq!(got, want);
                    }
                }
                b.check().map_err(proptest::test_runner::TestCaseError::fail)?;
                let all: Vec<_> = b.blocks.concat().iter().map(|e| (e.size, e.addr, e.idx)).collect();
                let want: Vec<_> = model.iter().map(|(&(s, a), &i)| (s, a, i)).collect();
                proptest::prop_assert_eq!(all, want);
                proptest::prop_assert_eq!(b.last().map(|e| (e.size, e.addr)), model.keys().next_back().copied());
            }
        }
    }

    /// A class of blocks whose invariants are broken: `check` names what is wrong.
    #[test_case::test_case(|b| { b.firsts.pop(); }, "first keys for"; "a first key missing")]
    #[test_case::test_case(|b| b.firsts[1] += 1, "block 1's first key"; "a stale first key")]
    #[test_case::test_case(|b| b.len += 1, "entries in blocks, len ="; "the count off by one")]
    #[test_case::test_case(|b| {
        b.len -= b.blocks[1].len() - 1;
        b.blocks[1].truncate(1);
    }, "holds 1 entries"; "a block too short")]
    fn blocks_check_names_the_corruption(corrupt: fn(&mut Blocks), what: &str) {
        let v: Vec<Entry> = (0..BLOCKS_AT as u64 + 1)
            .map(|k| Entry {
                size: 4096,
                addr: k,
                idx: k as u32,
            })
            .collect();
        let mut b = Blocks::from_sorted(&v);
        b.check().unwrap();
        corrupt(&mut b);
        let err = b.check().unwrap_err();
        assert!(err.contains(what), "{err}");
    }

    #[test]
    fn best_fit_last_and_iter_from_follow_the_order() {
        // Inline, Vec and blocks classes alike: the same answers as the sorted entries.
        for copies in [2u64, 6, 2 * BLOCKS_AT as u64] {
            let mut ix = FreeIndex::new();
            let mut i = 0;
            for size in [512u64, 4096, 4352, 1 << 30] {
                for k in 0..copies {
                    ix.insert(size, (k * 7919 % copies) << 32 | size, i);
                    i += 1;
                }
            }
            ix.check().unwrap();
            let all = ix.entries();
            for at_least in [0, 256, 512, 768, 4096, 4352, 4608, 1 << 30, (1 << 30) + 256] {
                let want: Vec<Entry> = all.iter().filter(|e| e.size >= at_least).copied().collect();
                assert_eq!(
                    ix.iter_from(at_least).collect::<Vec<_>>(),
                    want,
                    "from {at_least}"
                );
                // The best fit's size, and among its chunks the highest address.
                let last = want.first().and_then(|first| {
                    want.iter()
                        .filter(|e| e.size == first.size)
                        .max_by_key(|e| e.addr)
                });
                assert_eq!(
                    ix.best_fit_hinted(at_least, true).map(|(e, _)| e),
                    last.copied(),
                    "{at_least} bytes"
                );
            }
        }
    }

    #[test]
    fn crowded_classes_become_blocks_and_back() {
        let mut ix = FreeIndex::new();
        let n = 2 * BLOCKS_AT as u64;
        for i in 0..n {
            ix.insert(4096, (n - i) * 4096, i as u32);
            // `i + 1` entries: a vector up to `BLOCKS_AT`, blocks past it.
            if i < 8 || i + 1 == BLOCKS_AT as u64 {
                ix.check().unwrap();
                let class = ix.class(class_of(4096));
                assert!(matches!(*class, Class::Inline { .. } | Class::Sorted(_)));
            }
            if i == BLOCKS_AT as u64 {
                assert!(matches!(*ix.class(class_of(4096)), Class::Blocks(_)));
            }
        }
        ix.check().unwrap();
        assert!(matches!(*ix.class(class_of(4096)), Class::Blocks(_)));
        assert_eq!(ix.best_fit(4096).map(|e| e.addr), Some(4096));
        for i in 0..n {
            assert!(ix.remove(4096, (i + 1) * 4096));
            assert_eq!(
                ix.best_fit(256).map(|e| e.addr),
                (i < n - 1).then_some((i + 2) * 4096)
            );
        }
        // Inline → Vec → inline again.
        for i in 0..6u64 {
            ix.insert(8192, i * 8192, i as u32);
            ix.check().unwrap();
        }
        assert!(matches!(*ix.class(class_of(8192)), Class::Sorted(_)));
        for i in (0..6u64).rev() {
            assert!(ix.replace(8192, i * 8192, 8192, i * 8192 + 1, i as u32));
            ix.check().unwrap();
            assert!(ix.remove(8192, i * 8192 + 1));
            ix.check().unwrap();
        }
        ix.check().unwrap();
        assert!(ix.is_empty());
        assert!(matches!(
            *ix.class(class_of(4096)),
            Class::Inline { len: 0, .. }
        ));
    }
}
