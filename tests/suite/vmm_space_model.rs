//! Model-based test of vmm's address-space chunk manager (`strategy::vmm::space::Space`):
//! random sequences of add_region / find + commit (low and high ends, aligned or not) /
//! candidates / stale commits / free (live, stale and forged tokens) / retoken / carve /
//! in_use_overlapping, with and without remainders folded (at several granules), against a
//! reference model — the ordered-map implementation `Space` had before its slab and binned
//! free index (a `BTreeMap` of chunks by address and a `BTreeSet` of `(size, address)` per
//! class), kept here as the specification of its placements. After
//! every step both must agree on every answer, the placements and grants, the chunks in use,
//! the largest free chunk and the free chunks, and `check_invariants()` must hold.
//!
//! Tokens: the model hands out 1, 2, 3, …; `Space` hands out `(serial << 32) | slot`, whose
//! serial must be the model's token. The test keeps every token `Space` handed out (none may
//! come twice) and gives the model the serial of those, and of any other token one the model
//! never handed out: what `Space` refuses, the model must refuse too, and the other way round.
//! A placement names its chunk's slot (private to `Space`); the model compares the rest.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use portalloc::strategy::vmm::space::{Grant, Placement, Space, CLASSES};
use proptest::prelude::*;

/// The reference: the ordered-map chunk manager, rules spelled out as simply as they go.
#[derive(Debug, Default)]
struct Model {
    /// address → (size, requested, token, region); token 0 = free.
    chunks: BTreeMap<u64, (u64, u64, u64, usize)>,
    /// Free chunks `(size, addr)` per class (classes are numbered by the caller: any
    /// number is one, a class's set made at its first region).
    free: Vec<BTreeSet<(u64, u64)>>,
    regions: Vec<(u64, u64)>,
    class_of: Vec<usize>,
    last_token: u64,
    /// `Space::fold_within`'s granule (0: never fold).
    fold: u64,
}

impl Model {
    fn add_region(&mut self, base: u64, size: u64, class: usize) -> bool {
        let Some(end) = base.checked_add(size) else {
            return false;
        };
        if size == 0
            || base % 256 != 0
            || size % 256 != 0
            || self.regions.iter().any(|&(b, s)| base < b + s && b < end)
        {
            return false;
        }
        self.chunks.insert(base, (size, 0, 0, self.regions.len()));
        self.regions.push((base, size));
        self.class_of.push(class);
        if self.free.len() <= class {
            self.free.resize_with(class + 1, BTreeSet::new);
        }
        self.free[class].insert((size, base));
        true
    }

    fn find(&self, class: usize, rounded: u64, alignment: u64, high: bool) -> Option<Spot> {
        let free = self.free.get(class)?;
        let mut sizes: Vec<u64> = free
            .iter()
            .map(|&(s, _)| s)
            .filter(|&s| s >= rounded)
            .collect();
        sizes.dedup();
        for size in sizes {
            let mut same: Vec<u64> = free.iter().filter(|e| e.0 == size).map(|e| e.1).collect();
            if high {
                same.reverse();
            }
            for chunk in same {
                if let Some(addr) = Space::fit(size, chunk, rounded, alignment, high) {
                    return Some((chunk, size, addr));
                }
            }
        }
        None
    }

    fn candidates(&self, class: usize, rounded: u64, alignment: u64) -> Vec<Spot> {
        let mut out = Vec::new();
        let Some(free) = self.free.get(class) else {
            return out;
        };
        for &(size, chunk) in free.range((rounded, 0)..) {
            let low = Space::fit(size, chunk, rounded, alignment, false);
            let high =
                Space::fit(size, chunk, rounded, alignment, true).filter(|&h| Some(h) != low);
            for addr in low.into_iter().chain(high) {
                out.push((chunk, size, addr));
            }
        }
        out
    }

    fn put(&mut self, addr: u64, size: u64, requested: u64, token: u64, region: usize) {
        self.chunks.insert(addr, (size, requested, token, region));
        if token == 0 {
            self.free[self.class_of[region]].insert((size, addr));
        }
    }

    fn take(&mut self, addr: u64) -> (u64, u64, u64, usize) {
        let c = self.chunks.remove(&addr).unwrap();
        if c.2 == 0 {
            assert!(self.free[self.class_of[c.3]].remove(&(c.0, addr)));
        }
        c
    }

    /// Honoured while the free chunk the placement was found in is there, unchanged.
    fn commit(&mut self, p: Placement, rounded: u64, requested: u64) -> Option<Grant> {
        let &(size, _, token, region) = self.chunks.get(&p.chunk)?;
        let end = p.chunk + size;
        if token != 0
            || size != p.chunk_size
            || p.addr < p.chunk
            || p.addr.checked_add(rounded)? > end
        {
            return None;
        }
        self.take(p.chunk);
        // What is handed out: the request, and a remainder on one side only of at most an
        // eighth of it, in the granule of the request's byte next to it (below: only onto a
        // start at least as aligned).
        let (mut lo, mut hi) = (p.addr, p.addr + rounded);
        let (below, above) = (p.addr - p.chunk, end - hi);
        let g = self.fold;
        if g != 0
            && below == 0
            && above > 0
            && above <= rounded / 8
            && (end - 1) / g == (hi - 1) / g
        {
            hi = end;
        }
        if g != 0
            && above == 0
            && below > 0
            && below <= rounded / 8
            && p.chunk / g == p.addr / g
            && p.chunk.trailing_zeros() >= p.addr.trailing_zeros()
        {
            lo = p.chunk;
        }
        if lo > p.chunk {
            self.put(p.chunk, lo - p.chunk, 0, 0, region);
        }
        if hi < end {
            self.put(hi, end - hi, 0, 0, region);
        }
        self.last_token += 1;
        self.put(lo, hi - lo, requested, self.last_token, region);
        Some(Grant {
            addr: lo,
            size: hi - lo,
            token: self.last_token,
        })
    }

    fn free(&mut self, addr: u64, token: u64) -> Option<(u64, u64)> {
        let &(size, requested, t, region) = self.chunks.get(&addr)?;
        if t == 0 || t != token {
            return None;
        }
        self.take(addr);
        let (mut start, mut end) = (addr, addr + size);
        if let Some((&pa, &(ps, _, pt, pr))) = self.chunks.range(..addr).next_back() {
            if pt == 0 && pr == region && pa + ps == addr {
                self.take(pa);
                start = pa;
            }
        }
        if let Some(&(ns, _, nt, nr)) = self.chunks.get(&end) {
            if nt == 0 && nr == region {
                self.take(end);
                end += ns;
            }
        }
        self.put(start, end - start, 0, 0, region);
        Some((size, requested))
    }

    fn in_use_size(&self, addr: u64, token: u64) -> Option<u64> {
        self.chunks
            .get(&addr)
            .filter(|c| c.2 != 0 && c.2 == token)
            .map(|c| c.0)
    }

    fn retoken(&mut self, addr: u64, token: u64) -> Option<Grant> {
        let size = self.in_use_size(addr, token)?;
        self.last_token += 1;
        self.chunks.get_mut(&addr).unwrap().2 = self.last_token;
        Some(Grant {
            addr,
            size,
            token: self.last_token,
        })
    }

    /// `piece` = `(at, rounded, requested)`.
    fn carve(
        &mut self,
        addr: u64,
        token: u64,
        piece: (u64, u64, u64),
    ) -> Option<(Grant, Vec<Grant>)> {
        let (at, rounded, requested) = piece;
        let size = self.in_use_size(addr, token)?;
        let end = addr + size;
        if at < addr
            || at % 256 != 0
            || rounded == 0
            || rounded % 256 != 0
            || at.checked_add(rounded)? > end
        {
            return None;
        }
        let region = self.take(addr).3;
        let mut rest = Vec::new();
        for (start, size) in [(addr, at - addr), (at + rounded, end - at - rounded)] {
            if size > 0 {
                self.last_token += 1;
                self.put(start, size, size, self.last_token, region);
                rest.push(Grant {
                    addr: start,
                    size,
                    token: self.last_token,
                });
            }
        }
        self.last_token += 1;
        self.put(at, rounded, requested, self.last_token, region);
        let grant = Grant {
            addr: at,
            size: rounded,
            token: self.last_token,
        };
        Some((grant, rest))
    }

    fn in_use(&self) -> Vec<(u64, u64)> {
        self.chunks
            .iter()
            .filter(|c| c.1 .2 != 0)
            .map(|(&a, c)| (a, c.0))
            .collect()
    }

    fn in_use_overlapping(&self, start: u64, end: u64) -> Vec<(u64, u64)> {
        self.in_use()
            .into_iter()
            .filter(|&(a, s)| a < end && a + s > start)
            .collect()
    }

    fn free_chunks_descending(&self) -> Vec<(u64, u64)> {
        let mut all: Vec<(u64, u64)> = self.free.iter().flatten().copied().collect();
        all.sort_unstable_by(|a, b| b.cmp(a));
        all
    }
}

/// A placement as the model sees it: `(chunk, chunk_size, addr)`.
type Spot = (u64, u64, u64);

fn spot(p: &Placement) -> Spot {
    (p.chunk, p.chunk_size, p.addr)
}

/// A grant of `Space` as the model hands it out: the token's serial for the token.
fn serial(g: Grant) -> Grant {
    Grant {
        token: g.token >> 32,
        ..g
    }
}

#[derive(Debug, Clone)]
enum Op {
    /// A region at `base` units of 256 B (occasionally not a multiple of 256) of `units`.
    AddRegion {
        base: u64,
        units: u64,
        class: usize,
        misaligned: bool,
    },
    /// find, then commit what it found.
    Alloc {
        class: usize,
        units: u64,
        align_log: u32,
        high: bool,
        requested_less: u64,
    },
    /// find without a commit: the placement is remembered for a later (stale) one.
    Peek {
        class: usize,
        units: u64,
        align_log: u32,
        high: bool,
    },
    /// candidates (compared in full), then commit the `pick`-th.
    Candidate {
        class: usize,
        units: u64,
        align_log: u32,
        pick: usize,
    },
    /// commit a placement found earlier (stale or not; `find`'s hint for `commit` stale or
    /// not).
    Recommit {
        pick: usize,
        units: u64,
    },
    /// Many allocations of one size, then every other one freed: many free chunks of one
    /// size, which makes size classes crowded (and ties in address to break).
    Burst {
        class: usize,
        units: u64,
        count: usize,
        high: bool,
    },
    Free(usize),
    /// free with a token once valid (freed, retokened or carved since).
    FreeStale(usize),
    /// free at a live address with forged tokens: off by `delta`, in the slot part or the
    /// serial part; another live chunk's; its serial with another live chunk's slot.
    Forged {
        pick: usize,
        delta: u64,
    },
    Retoken(usize),
    Carve {
        pick: usize,
        at_units: u64,
        units: u64,
    },
    Overlapping {
        start: u64,
        units: u64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let class = 0..CLASSES + 1;
    let align = prop_oneof![4 => Just(8u32), 1 => 8u32..17];
    prop_oneof![
        2 => (0u64..64, 1u64..2048, 0..CLASSES + 1, prop::bool::weighted(0.05)).prop_map(
            |(slot, units, class, misaligned)| Op::AddRegion {
                base: slot * 512,
                units,
                class,
                misaligned,
            }
        ),
        12 => (class.clone(), 1u64..64, align.clone(), any::<bool>(), 0u64..300).prop_map(
            |(class, units, align_log, high, requested_less)| Op::Alloc {
                class,
                units,
                align_log,
                high,
                requested_less,
            }
        ),
        2 => (class.clone(), 1u64..64, align.clone(), any::<bool>()).prop_map(
            |(class, units, align_log, high)| Op::Peek {
                class,
                units,
                align_log,
                high,
            }
        ),
        2 => (class.clone(), 1u64..64, align, any::<usize>()).prop_map(
            |(class, units, align_log, pick)| Op::Candidate {
                class,
                units,
                align_log,
                pick,
            }
        ),
        1 => (any::<usize>(), 1u64..8).prop_map(|(pick, units)| Op::Recommit { pick, units }),
        1 => (0..CLASSES, 1u64..4, 10usize..150, any::<bool>()).prop_map(
            |(class, units, count, high)| Op::Burst {
                class,
                units,
                count,
                high,
            }
        ),
        10 => any::<usize>().prop_map(Op::Free),
        1 => any::<usize>().prop_map(Op::FreeStale),
        1 => (any::<usize>(), 1u64..3).prop_map(|(pick, delta)| Op::Forged { pick, delta }),
        2 => any::<usize>().prop_map(Op::Retoken),
        2 => (any::<usize>(), 0u64..16, 0u64..16).prop_map(|(pick, at_units, units)| {
            Op::Carve {
                pick,
                at_units,
                units,
            }
        }),
        1 => (0u64..40_000, 0u64..4096).prop_map(|(start, units)| Op::Overlapping {
            start: start * 256,
            units,
        }),
    ]
}

/// Both implementations and what the test remembers of their answers.
#[derive(Default)]
struct Pair {
    space: Space,
    model: Model,
    /// Chunks in use `(addr, token)`.
    live: Vec<(u64, u64)>,
    /// Tokens no longer valid `(addr, token)`.
    stale: Vec<(u64, u64)>,
    /// Placements found so far.
    placements: Vec<Placement>,
    /// Every token `Space` handed out.
    handed: HashSet<u64>,
}

impl Pair {
    /// The model's token for a token of `Space`'s: its serial if `Space` handed it out, else
    /// one the model never hands out.
    fn model_token(&self, token: u64) -> u64 {
        if self.handed.contains(&token) {
            token >> 32
        } else {
            u64::MAX
        }
    }

    /// Records a token `Space` handed out: a new one.
    fn handed(&mut self, g: Grant) -> Grant {
        assert!(self.handed.insert(g.token), "token {:#x} again", g.token);
        g
    }

    fn commit(&mut self, p: Placement, rounded: u64, requested: u64) {
        let got = self.space.commit(p, rounded, requested);
        assert_eq!(
            got.map(serial),
            self.model.commit(p, rounded, requested),
            "commit {p:?}"
        );
        if let Some(g) = got {
            self.handed(g);
            self.live.push((g.addr, g.token));
        }
    }

    fn alloc(&mut self, class: usize, rounded: u64, alignment: u64, high: bool, requested: u64) {
        let p = self.space.find(class, rounded, alignment, high);
        let want = self.model.find(class, rounded, alignment, high);
        assert_eq!(
            p.as_ref().map(spot),
            want,
            "find {rounded} aligned {alignment}, high {high}"
        );
        if let Some(p) = p {
            self.placements.push(p);
            self.commit(p, rounded, requested);
        }
    }

    fn free(&mut self, i: usize) {
        let (addr, token) = self.live.swap_remove(i);
        let got = self.space.free(addr, token);
        let want = self.model.free(addr, self.model_token(token));
        assert_eq!(got, want, "free {addr:#x}");
        assert!(got.is_some());
        self.stale.push((addr, token));
    }

    fn step(&mut self, op: &Op) {
        match *op {
            Op::AddRegion {
                base,
                units,
                class,
                misaligned,
            } => {
                let base = base * 256 + u64::from(misaligned) * 16;
                let ok = self.space.add_region(base, units * 256, class).is_ok();
                assert_eq!(
                    ok,
                    self.model.add_region(base, units * 256, class),
                    "add_region"
                );
            }
            Op::Alloc {
                class,
                units,
                align_log,
                high,
                requested_less,
            } => {
                let rounded = units * 256;
                let requested = rounded - requested_less.min(255);
                self.alloc(class, rounded, 1 << align_log, high, requested);
            }
            Op::Peek {
                class,
                units,
                align_log,
                high,
            } => {
                let (rounded, alignment) = (units * 256, 1 << align_log);
                let p = self.space.find(class, rounded, alignment, high);
                assert_eq!(
                    p.as_ref().map(spot),
                    self.model.find(class, rounded, alignment, high),
                    "find"
                );
                self.placements.extend(p);
            }
            Op::Candidate {
                class,
                units,
                align_log,
                pick,
            } => {
                let (rounded, alignment) = (units * 256, 1 << align_log);
                let got: Vec<Placement> =
                    self.space.candidates(class, rounded, alignment).collect();
                assert_eq!(
                    got.iter().map(spot).collect::<Vec<_>>(),
                    self.model.candidates(class, rounded, alignment),
                    "candidates"
                );
                if !got.is_empty() {
                    let p = got[pick % got.len()];
                    self.placements.push(p);
                    self.commit(p, rounded, rounded);
                }
            }
            Op::Recommit { pick, units } => {
                if !self.placements.is_empty() {
                    let p = self.placements[pick % self.placements.len()];
                    self.commit(p, units * 256, 1);
                }
            }
            Op::Burst {
                class,
                units,
                count,
                high,
            } => {
                let first = self.live.len();
                for _ in 0..count {
                    self.alloc(class, units * 256, 256, high, 1);
                }
                // Every other one of them.
                let made: Vec<(u64, u64)> = self.live[first..].iter().step_by(2).copied().collect();
                for chunk in made {
                    let i = self.live.iter().position(|&c| c == chunk).unwrap();
                    self.free(i);
                }
            }
            Op::Free(i) => {
                if !self.live.is_empty() {
                    self.free(i % self.live.len());
                }
            }
            Op::FreeStale(i) => {
                if !self.stale.is_empty() {
                    let (addr, token) = self.stale[i % self.stale.len()];
                    let got = self.space.free(addr, token);
                    assert_eq!(got, None, "stale free {addr:#x} token {token:#x}");
                    assert_eq!(self.model.free(addr, self.model_token(token)), None);
                    assert_eq!(self.space.in_use_size(addr, token), None);
                }
            }
            Op::Forged { pick, delta } => {
                if !self.live.is_empty() {
                    let (addr, token) = self.live[pick % self.live.len()];
                    let mut forged = vec![
                        (addr, token + delta),
                        (addr, token + (delta << 32)),
                        (addr + 256, token),
                        (addr, 0),
                    ];
                    // Another live chunk's token, and this serial with that chunk's slot.
                    let (_, other) = self.live[(pick / 2 + 1) % self.live.len()];
                    if other != token {
                        forged.push((addr, other));
                        forged.push((addr, (token >> 32 << 32) | (other & 0xffff_ffff)));
                    }
                    for (a, t) in forged {
                        assert_eq!(self.space.free(a, t), None, "forged {a:#x} token {t:#x}");
                        assert_eq!(self.model.free(a, self.model_token(t)), None);
                        assert_eq!(self.space.retoken(a, t), None);
                        assert_eq!(self.space.in_use_size(a, t), None);
                        assert_eq!(self.space.carve(a, t, a, 256, 1), None);
                    }
                }
            }
            Op::Retoken(i) => {
                if !self.live.is_empty() {
                    let i = i % self.live.len();
                    let (addr, token) = self.live[i];
                    let model_token = self.model_token(token);
                    assert_eq!(
                        self.space.in_use_size(addr, token),
                        self.model.in_use_size(addr, model_token)
                    );
                    let got = self.space.retoken(addr, token);
                    assert_eq!(
                        got.map(serial),
                        self.model.retoken(addr, model_token),
                        "retoken"
                    );
                    let g = self.handed(got.expect("a live chunk"));
                    self.live[i] = (g.addr, g.token);
                    self.stale.push((addr, token));
                }
            }
            Op::Carve {
                pick,
                at_units,
                units,
            } => {
                if !self.live.is_empty() {
                    let i = pick % self.live.len();
                    let (addr, token) = self.live[i];
                    let (at, rounded) = (addr + at_units * 256, units * 256);
                    let got = self.space.carve(addr, token, at, rounded, rounded / 2);
                    let model_token = self.model_token(token);
                    let want = self
                        .model
                        .carve(addr, model_token, (at, rounded, rounded / 2));
                    assert_eq!(
                        got.clone()
                            .map(|(g, rest)| (serial(g), rest.into_iter().map(serial).collect())),
                        want,
                        "carve {addr:#x} at {at:#x}+{rounded}"
                    );
                    if let Some((g, rest)) = got {
                        self.handed(g);
                        for &r in &rest {
                            self.handed(r);
                        }
                        self.stale.push((addr, token));
                        self.live[i] = (g.addr, g.token);
                        self.live.extend(rest.iter().map(|r| (r.addr, r.token)));
                    }
                }
            }
            Op::Overlapping { start, units } => {
                let end = start + units * 256;
                let got: Vec<(u64, u64)> = self.space.in_use_overlapping(start, end).collect();
                assert_eq!(
                    got,
                    self.model.in_use_overlapping(start, end),
                    "overlapping"
                );
            }
        }
    }

    fn agree(&self) {
        if let Err(e) = self.space.check_invariants() {
            panic!("invariants: {e}");
        }
        let s = &self.space;
        assert_eq!(
            s.in_use().collect::<Vec<_>>(),
            self.model.in_use(),
            "in_use"
        );
        assert_eq!(
            s.bytes_in_use(),
            self.model.in_use().iter().map(|c| c.1).sum::<u64>()
        );
        assert_eq!(s.live_count(), self.live.len());
        let free = self.model.free_chunks_descending();
        assert_eq!(s.free_chunks_descending(), free, "free chunks");
        let mut walked: Vec<(u64, u64)> = s.free_chunks().collect();
        walked.sort_unstable_by(|a, b| b.cmp(a));
        assert_eq!(walked, free, "free chunks walked from the slab");
        assert_eq!(
            s.largest_free(),
            free.first().map_or(0, |c| c.0),
            "largest_free"
        );
        assert_eq!(s.regions(), &self.model.regions[..]);
        for class in 0..CLASSES {
            assert_eq!(s.has_class(class), self.model.class_of.contains(&class));
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn space_matches_the_ordered_map_model(
        first in (1u64..4096, 0..CLASSES),
        ops in proptest::collection::vec(op(), 1..120),
        fold in prop_oneof![Just(0u64), Just(4096), Just(1 << 16), Just(2 << 20)],
    ) {
        let mut pair = Pair::default();
        if fold != 0 {
            pair.space.fold_within(fold);
        }
        pair.model.fold = fold;
        pair.step(&Op::AddRegion { base: 1 << 20, units: first.0, class: first.1, misaligned: false });
        pair.agree();
        for op in &ops {
            pair.step(op);
            pair.agree();
        }
        // Everything freed: each region is one free chunk again.
        while !pair.live.is_empty() {
            pair.free(pair.live.len() - 1);
        }
        pair.agree();
        prop_assert_eq!(pair.space.free_chunks_descending().len(), pair.space.regions().len());
    }
}

/// Named cases of the two ends and their ties, for the record (the property test covers
/// them at random).
#[test]
fn ties_go_to_the_lowest_address_low_and_the_highest_high() {
    let mut s = Space::new();
    s.add_region(0, 64 * 256, 0).unwrap();
    // Six 1-unit chunks with 1-unit gaps at 0, 512, …: freeing them leaves equal holes.
    let grants: Vec<Grant> = (0..12)
        .map(|_| {
            let p = s.find(0, 256, 256, false).unwrap();
            s.commit(p, 256, 256).unwrap()
        })
        .collect();
    for g in grants.iter().step_by(2) {
        s.free(g.addr, g.token).unwrap();
    }
    s.check_invariants().unwrap();
    let low = s.find(0, 256, 256, false).unwrap();
    assert_eq!(
        (low.chunk, low.addr),
        (0, 0),
        "low: the lowest of the 1-unit holes"
    );
    let high = s.find(0, 256, 256, true).unwrap();
    assert_eq!(
        (high.chunk, high.addr),
        (2560, 2560),
        "high: the highest of them"
    );
    // Aligned to 1 KiB from the top: the highest hole that starts on 1 KiB.
    let high = s.find(0, 256, 1024, true).unwrap();
    assert_eq!((high.chunk, high.addr), (2048, 2048));
    // Two units fit only the tail.
    let two = s.find(0, 512, 256, true).unwrap();
    assert_eq!((two.chunk, two.addr), (3072, 64 * 256 - 512));
}
