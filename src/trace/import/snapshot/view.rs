//! A read-only view of what a pickle read produced: the arena of objects ([`Pickle`]), walked
//! by [`Val`] and [`Seq`], each step counted against [`Limits::walk_steps`](super::limits::Limits::walk_steps).
#![deny(unsafe_code)]

use std::cell::Cell;

use super::limits::{Figures, Limit, PickleError};

/// The kind of a container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SeqKind {
    List,
    Tuple,
    /// Items are key, value, key, value, …
    Dict,
    Set,
    FrozenSet,
}

/// A global the reader evaluates when it is called (`REDUCE`); every other one is `Other`,
/// with its name's index in [`Pickle::names`] ([`NO_NAME`] past the names kept).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Global {
    Set,
    FrozenSet,
    Bytearray,
    List,
    Int,
    Encode,
    Reconstructor,
    Other(u32),
}

/// The name index of a global whose name was not kept ([`Pickle::names`] is full).
pub(super) const NO_NAME: u32 = u32::MAX;

/// One object. 16 bytes: payloads and containers live in side tables.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Node {
    None,
    Bool(bool),
    Int(i64),
    /// An integer wider than 64 bits and within 128: index into `Pickle::wide`.
    Wide(u32),
    /// An integer beyond 128 bits, approximated: only its magnitude matters to a reader.
    Huge(f64),
    Float(f64),
    /// Text: `len` bytes of `Pickle::text` from `start`.
    Str {
        start: u32,
        len: u32,
    },
    /// Bytes: `len` bytes from `start` of `Pickle::text` when they are UTF-8 (so that reading
    /// them as text costs no validation), else of `Pickle::raw`.
    Bytes {
        start: u32,
        len: u32,
        text: bool,
    },
    Seq {
        kind: SeqKind,
        index: u32,
    },
    /// A global not (yet) called: reads as `None`.
    Global(Global),
    /// What calling a global the reader does not evaluate made (`REDUCE` of
    /// [`Global::Other`]): opaque, reads as `None`; items appended or set to it
    /// (`APPENDS`, `SETITEMS`: a `collections.deque`, an `OrderedDict`) are dropped. Its
    /// global's name index, as in [`Global::Other`].
    Object(u32),
}

/// What a read produced: the arena and its root.
#[derive(Debug)]
pub(crate) struct Pickle {
    pub(super) nodes: Vec<Node>,
    pub(super) seqs: Seqs,
    pub(super) wide: Vec<i128>,
    /// Strings, and bytes objects that are UTF-8: validated once, when read.
    pub(super) text: String,
    /// Bytes objects that are not UTF-8.
    pub(super) raw: Vec<u8>,
    pub(super) root: u32,
    /// The global the root is built from (a call, an instance, or the global itself).
    pub(super) root_global: Option<String>,
    /// The names of the globals [`Global::Other`] and [`Node::Object`] refer to, as
    /// `global_name` gives them: the first few distinct ones only, so that naming them costs
    /// bounded memory whatever the file.
    pub(super) names: Vec<String>,
    // Read by the tests that hold real files against the limits.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(super) figures: Figures,
    pub(super) walk_limit: u64,
    pub(super) walk_steps: Cell<u64>,
    /// The offset of the byte after the root's STOP.
    pub(super) stop_end: u64,
    /// What follows that STOP.
    pub(super) after: After,
}

/// What follows the STOP of a pickle read ([`Pickle::after`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum After {
    /// Nothing: the input ends there.
    Nothing,
    /// ASCII whitespace only (space, tab, newline, carriage return, form feed, vertical
    /// tab), `bytes` of it: what `pickle.load`, reading to the STOP, never sees.
    Whitespace { bytes: u64 },
    /// Another whole pickle, from offset `start` (after any whitespace): `pickle.dump`
    /// called twice on one file, or a file opened to append.
    Pickle { start: u64 },
    /// Bytes from offset `start` (after any whitespace) that read as no whole pickle within
    /// the limits: a second pickle cut short, padding, other data.
    Bytes { start: u64 },
}

impl Pickle {
    /// The object the pickle describes.
    pub(crate) fn root(&self) -> Val<'_> {
        Val {
            pickle: self,
            id: self.root,
        }
    }

    /// The global (`module.name`, cut and escaped as [`global_name`] gives it) the root was
    /// built from: a class instantiated, a function called (`REDUCE`, `NEWOBJ`, `INST`,
    /// `OBJ`, with the state `BUILD` set), or the global itself; `None` for plain data (every
    /// snapshot `_dump_snapshot` writes).
    pub(crate) fn root_global(&self) -> Option<&str> {
        self.root_global.as_deref()
    }

    /// The offset of the byte after the root's STOP: where what follows it starts.
    pub(crate) fn stop_end(&self) -> u64 {
        self.stop_end
    }

    /// What follows the root's STOP.
    pub(crate) fn after(&self) -> After {
        self.after
    }

    /// What the read used.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn figures(&self) -> Figures {
        self.figures
    }

    /// Steps the walk over the result has taken so far.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn walk_steps(&self) -> u64 {
        self.walk_steps.get()
    }

    pub(super) fn node(&self, id: u32) -> Node {
        self.nodes.get(id as usize).copied().unwrap_or(Node::None)
    }

    pub(super) fn seq(&self, index: u32) -> &[u32] {
        self.seqs.get(index)
    }

    /// The bytes of a string or bytes object.
    pub(super) fn payload_of(&self, node: Node) -> Option<&[u8]> {
        match node {
            Node::Str { .. } | Node::Bytes { text: true, .. } => {
                self.text_of(node).map(str::as_bytes)
            }
            Node::Bytes {
                start,
                len,
                text: false,
            } => self
                .raw
                .get(start as usize..(start as usize).saturating_add(len as usize)),
            _ => None,
        }
    }

    /// A string, or a bytes object that is UTF-8. O(1): validated when read.
    pub(super) fn text_of(&self, node: Node) -> Option<&str> {
        match node {
            Node::Str { start, len }
            | Node::Bytes {
                start,
                len,
                text: true,
            } => self
                .text
                .get(start as usize..(start as usize).saturating_add(len as usize)),
            _ => None,
        }
    }

    /// Which of `keys` object `id` is equal to, as a dict key.
    pub(super) fn matching(&self, id: u32, keys: &[&str]) -> Matched {
        let node = self.node(id);
        let Some(payload) = self.payload_of(node) else {
            return Matched::NONE;
        };
        let mut mask = 0;
        // Slices of different lengths compare in O(1): a long key costs no more.
        for (k, key) in keys.iter().enumerate() {
            if same_bytes(payload, key.as_bytes()) {
                mask |= 1 << k;
            }
        }
        Matched {
            mask,
            text: matches!(node, Node::Str { .. }),
        }
    }

    pub(super) fn charge(&self, steps: u64) -> Result<(), PickleError> {
        let reached = self.walk_steps.get().saturating_add(steps);
        self.walk_steps.set(reached);
        if reached > self.walk_limit {
            return Err(PickleError::Limit {
                limit: Limit::WalkSteps,
                reached,
                max: self.walk_limit,
                offset: None,
            });
        }
        Ok(())
    }
}

/// What [`Val::get_all_with`] remembers of the dict before: per pair position (the first
/// [`KeyMemo::POSITIONS`]), its key object and the keys it matched. Valid for one set of keys:
/// a memo is used with the keys it was filled with (objects never change once read).
#[derive(Debug, Default, Clone)]
pub(crate) struct KeyMemo {
    pub(super) known: Vec<(u32, Matched)>,
}

impl KeyMemo {
    /// Pair positions remembered: a snapshot's trace entry has 7 or 8.
    pub(super) const POSITIONS: usize = 16;
}

/// The keys (bit `k`: key `k`) a key object equals, and whether it is text (else bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Matched {
    pub(super) mask: u32,
    pub(super) text: bool,
}

impl Matched {
    pub(super) const NONE: Matched = Matched {
        mask: 0,
        text: false,
    };
}

/// One object of a [`Pickle`], to read.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Val<'p> {
    pub(super) pickle: &'p Pickle,
    pub(super) id: u32,
}

impl<'p> Val<'p> {
    /// What kind of object it is, as Python names it with an article ("a list", "None"), for
    /// messages about a pickle that is not what was expected.
    pub(crate) fn kind_name(self) -> &'static str {
        match self.pickle.node(self.id) {
            Node::None | Node::Global(_) => "None",
            Node::Object(_) => "an object built from a global",
            Node::Bool(_) => "a bool",
            Node::Int(_) | Node::Wide(_) | Node::Huge(_) => "an int",
            Node::Float(_) => "a float",
            Node::Str { .. } => "a str",
            Node::Bytes { .. } => "a bytes object",
            Node::Seq { kind, .. } => match kind {
                SeqKind::List => "a list",
                SeqKind::Tuple => "a tuple",
                SeqKind::Dict => "a dict",
                SeqKind::Set => "a set",
                SeqKind::FrozenSet => "a frozenset",
            },
        }
    }

    /// The value as a message about a field shows it, bounded: a number as Python prints it
    /// (`-5`, `1180591620717411303424`, `1.5`), text quoted and cut to an excerpt, `None`,
    /// else its kind ("a list"); with what makes it unusable where a size or an ordinal is
    /// wanted ("a negative int", "more than 64 bits", "a float", "a str").
    pub(crate) fn shown(self) -> String {
        match self.pickle.node(self.id) {
            Node::Int(i) if i < 0 => format!("{i} (a negative int)"),
            Node::Int(i) => i.to_string(),
            Node::Wide(w) => match self.pickle.wide.get(w as usize) {
                Some(w) if *w < 0 => format!("{w} (a negative int)"),
                Some(w) => format!("{w} (more than 64 bits)"),
                None => "an int".to_string(),
            },
            Node::Huge(f) if f < 0.0 => "a negative int of more than 128 bits".to_string(),
            Node::Huge(_) => "an int of more than 128 bits".to_string(),
            Node::Float(f) => format!("{f:?} (a float)"),
            Node::Bool(b) => if b { "True" } else { "False" }.to_string(),
            Node::Str { .. } | Node::Bytes { .. } => match self.as_str() {
                Some(text) => format!("{} ({})", crate::trace::excerpt(text), self.kind_name()),
                None => self.kind_name().to_string(),
            },
            Node::None | Node::Global(_) => "None".to_string(),
            _ => match self.made_by() {
                Some(global) => format!("an object of {global}"),
                None => self.kind_name().to_string(),
            },
        }
    }

    /// The global (`module.name`, cut and escaped) an object was made by calling, when it
    /// is one the reader does not evaluate ([`Node::Object`]) and its name was kept.
    pub(crate) fn made_by(self) -> Option<&'p str> {
        match self.pickle.node(self.id) {
            Node::Object(name) => self.pickle.names.get(name as usize).map(String::as_str),
            _ => None,
        }
    }

    /// Whether it is a list (not a tuple).
    pub(crate) fn is_list(self) -> bool {
        matches!(
            self.pickle.node(self.id),
            Node::Seq {
                kind: SeqKind::List,
                ..
            }
        )
    }

    /// Whether it is a dict.
    pub(crate) fn is_dict(self) -> bool {
        self.dict_items().is_some()
    }

    /// The items of a dict: key, value, key, value, …
    fn dict_items(self) -> Option<&'p [u32]> {
        match self.pickle.node(self.id) {
            Node::Seq {
                kind: SeqKind::Dict,
                index,
            } => Some(self.pickle.seq(index)),
            _ => None,
        }
    }

    /// The value of key `key` of a dict: the last pair with that text key, else the last with
    /// that bytes key; `None` for another type or an absent key. Counts one walk step per pair.
    ///
    /// # Time complexity
    /// O(k) for a dict of k pairs.
    ///
    /// # Errors
    /// [`Limit::WalkSteps`] exceeded.
    pub(crate) fn get(self, key: &str) -> Result<Option<Val<'p>>, PickleError> {
        let [value] = self.get_all([key])?;
        Ok(value)
    }

    /// The values of several keys of a dict, each as [`Val::get`] gives it, in one walk of its
    /// pairs: one walk step per pair, however many keys (a snapshot's trace entry is read with
    /// five).
    ///
    /// # Time complexity
    /// O(k × N) comparisons of lengths for a dict of k pairs, a byte comparison only where a
    /// length matches.
    ///
    /// # Errors
    /// [`Limit::WalkSteps`] exceeded.
    pub(crate) fn get_all<const N: usize>(
        self,
        keys: [&str; N],
    ) -> Result<[Option<Val<'p>>; N], PickleError> {
        self.get_all_with(keys, &mut KeyMemo::default())
    }

    /// [`Val::get_all`] for one dict of many read with the same `keys`, remembering in
    /// `memo` which key object at each position matched which keys: the next dict whose key
    /// at that position is the same object (a pickle stores a repeated key once and refers
    /// to it again) is not compared again. Same result as [`Val::get_all`].
    ///
    /// # Time complexity
    /// O(k) for a dict of k pairs whose keys are the objects at the same positions as in the
    /// dict before; O(k × N) otherwise.
    ///
    /// # Errors
    /// [`Limit::WalkSteps`] exceeded.
    pub(crate) fn get_all_with<const N: usize>(
        self,
        keys: [&str; N],
        memo: &mut KeyMemo,
    ) -> Result<[Option<Val<'p>>; N], PickleError> {
        const { assert!(N <= 32, "a KeyMemo mask holds 32 keys") };
        let Some(items) = self.dict_items() else {
            return Ok([None; N]);
        };
        self.pickle.charge(items.len() as u64 / 2)?;
        let mut text = [None; N];
        let mut bytes = [None; N];
        for (position, pair) in items.chunks_exact(2).enumerate() {
            let matched = match memo.known.get(position) {
                Some(&(id, matched)) if id == pair[0] => matched,
                _ => {
                    let matched = self.pickle.matching(pair[0], &keys);
                    if position < KeyMemo::POSITIONS {
                        if position >= memo.known.len() {
                            memo.known.resize(position + 1, (u32::MAX, Matched::NONE));
                        }
                        memo.known[position] = (pair[0], matched);
                    }
                    matched
                }
            };
            // The keys it matched, lowest first (most keys match none).
            let mut mask = matched.mask;
            while mask != 0 {
                let k = mask.trailing_zeros() as usize;
                mask &= mask - 1;
                let found = if matched.text { &mut text } else { &mut bytes };
                if let Some(slot) = found.get_mut(k) {
                    *slot = Some(pair[1]);
                }
            }
        }
        Ok(std::array::from_fn(|k| {
            text[k].or(bytes[k]).map(|id| Val {
                pickle: self.pickle,
                id,
            })
        }))
    }

    /// The keys of a dict, in the pickle's order (none for another type). Counts one walk
    /// step per pair, as [`Val::get`] does.
    ///
    /// # Errors
    /// [`Limit::WalkSteps`] exceeded.
    pub(crate) fn keys(self) -> Result<impl Iterator<Item = Val<'p>> + 'p, PickleError> {
        let items = self.dict_items().unwrap_or(&[]);
        self.pickle.charge(items.len() as u64 / 2)?;
        let pickle = self.pickle;
        Ok(items.chunks_exact(2).map(move |pair| Val {
            pickle,
            id: pair[0],
        }))
    }

    /// Text, or bytes that are UTF-8. O(1).
    pub(crate) fn as_str(self) -> Option<&'p str> {
        self.pickle.text_of(self.pickle.node(self.id))
    }

    /// A non-negative integer that fits, or a bool as 0 or 1.
    pub(crate) fn as_u64(self) -> Option<u64> {
        match self.pickle.node(self.id) {
            Node::Int(i) => u64::try_from(i).ok(),
            Node::Wide(w) => u64::try_from(*self.pickle.wide.get(w as usize)?).ok(),
            Node::Bool(b) => Some(u64::from(b)),
            _ => None,
        }
    }

    /// A number (integer or float; not a bool), as the nearest `f64`.
    pub(crate) fn as_f64(self) -> Option<f64> {
        match self.pickle.node(self.id) {
            Node::Int(i) => Some(i as f64),
            Node::Wide(w) => Some(*self.pickle.wide.get(w as usize)? as f64),
            Node::Huge(f) | Node::Float(f) => Some(f),
            _ => None,
        }
    }

    /// The items of a list or a tuple.
    pub(crate) fn as_list(self) -> Option<Seq<'p>> {
        match self.pickle.node(self.id) {
            Node::Seq {
                kind: SeqKind::List | SeqKind::Tuple,
                index,
            } => Some(Seq {
                pickle: self.pickle,
                items: self.pickle.seq(index),
            }),
            _ => None,
        }
    }
}

/// The items of a list or tuple.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Seq<'p> {
    pub(super) pickle: &'p Pickle,
    pub(super) items: &'p [u32],
}

impl<'p> Seq<'p> {
    /// How many items.
    pub(crate) fn len(self) -> usize {
        self.items.len()
    }

    /// The items in order, each counting one walk step: after the limit, one error and no more.
    pub(crate) fn iter(self) -> impl Iterator<Item = Result<Val<'p>, PickleError>> + 'p {
        let pickle = self.pickle;
        let mut failed = false;
        self.items.iter().map_while(move |&id| {
            if failed {
                return None;
            }
            match pickle.charge(1) {
                Ok(()) => Some(Ok(Val { pickle, id })),
                Err(e) => {
                    failed = true;
                    Some(Err(e))
                }
            }
        })
    }
}

/// The items of every container, in one arena: one allocation for all, not a `Vec` (a
/// `malloc`, a `free`, page faults) for each of a snapshot's tens of thousands. A container is
/// filled after it is made (`APPENDS`, `SETITEMS`), often with others made and filled in
/// between (a dict's items, a list longer than the pickler's batch of 1000), so each has room
/// of its own: it grows in place while its items fit its room or its room ends the arena;
/// otherwise its items move to the end with room for twice as many (none when it has none
/// yet). Each move at least doubles a container's room, so the arena holds at most four slots
/// per item, and an item is moved O(1) times on average.
#[derive(Debug, Default)]
pub(super) struct Seqs {
    /// Container `i` holds `items[spans[i].start..][..spans[i].len]` and owns the room
    /// `items[spans[i].start..][..spans[i].cap]`. Invariants: `len <= cap`;
    /// `start + cap <= items.len()`; the rooms of any two containers are disjoint.
    pub(super) spans: Vec<Span>,
    /// The slots: a container's items, its free room, and rooms it left behind when it moved.
    pub(super) items: Vec<u32>,
}

/// Where a container's items are in [`Seqs::items`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Span {
    pub(super) start: u32,
    pub(super) len: u32,
    pub(super) cap: u32,
}

/// What a new container holds.
#[derive(Debug, Clone, Copy)]
pub(super) enum Fill {
    Empty,
    /// The stack's items `at..end`, which are popped (with any above them).
    Stack {
        at: usize,
        end: usize,
    },
    /// A copy of the items of container `index`.
    Copy(u32),
}

impl Seqs {
    /// Room for `containers` containers of `items` items in all, made without a copy.
    pub(super) fn with_capacity(containers: usize, items: usize) -> Self {
        Seqs {
            spans: Vec::with_capacity(containers),
            items: Vec::with_capacity(items),
        }
    }

    /// Containers.
    pub(super) fn len(&self) -> usize {
        self.spans.len()
    }

    /// The items of container `index` (none for an index out of range). O(1).
    #[inline]
    pub(super) fn get(&self, index: u32) -> &[u32] {
        match self.spans.get(index as usize) {
            Some(s) => self
                .items
                .get(s.start as usize..s.start as usize + s.len as usize)
                .unwrap_or(&[]),
            None => &[],
        }
    }

    /// A new container holding `items`; its index.
    ///
    /// # Time complexity
    /// O(`items.len()`) amortized.
    ///
    /// # Errors
    /// The arena would pass `u32::MAX` slots (the limits keep it far below): the slots it
    /// would reach.
    pub(super) fn push(&mut self, items: &[u32]) -> Result<u32, u64> {
        let index = u32::try_from(self.spans.len()).map_err(|_| self.spans.len() as u64)?;
        let start = self.items.len();
        let span = span(start, items.len(), items.len())?;
        self.items.extend_from_slice(items);
        self.spans.push(span);
        Ok(index)
    }

    /// A new container holding a copy of the items of container `source`; its index.
    ///
    /// # Time complexity
    /// O(items copied) amortized.
    ///
    /// # Errors
    /// As [`Seqs::push`].
    pub(super) fn push_copy(&mut self, source: u32) -> Result<u32, u64> {
        let index = u32::try_from(self.spans.len()).map_err(|_| self.spans.len() as u64)?;
        let (from, len) = match self.spans.get(source as usize) {
            Some(s) => (s.start as usize, s.len as usize),
            None => (0, 0),
        };
        let start = self.items.len();
        let span = span(start, len, len)?;
        self.items.extend_from_within(from..from + len);
        self.spans.push(span);
        Ok(index)
    }

    /// Appends `new` to the items of container `index` (nothing for an index out of range).
    ///
    /// # Time complexity
    /// O(`new.len()`) amortized: a container moved has room for twice its items.
    ///
    /// # Errors
    /// As [`Seqs::push`].
    pub(super) fn extend(&mut self, index: usize, new: &[u32]) -> Result<(), u64> {
        let Some(&Span { start, len, cap }) = self.spans.get(index) else {
            return Ok(());
        };
        let (start, len, cap) = (start as usize, len as usize, cap as usize);
        let want = len + new.len();
        let tail = self.items.len();
        let moved = if want <= cap {
            self.items[start + len..start + want].copy_from_slice(new);
            span(start, want, cap)?
        } else if start + cap == tail {
            // Its room ends the arena: it grows in place (over its free room, if any).
            self.items.truncate(start + len);
            self.items.extend_from_slice(new);
            span(start, want, want)?
        } else if len == 0 {
            // Nothing to move: it starts again at the end.
            self.items.extend_from_slice(new);
            span(tail, want, want)?
        } else {
            let room = want.saturating_mul(2);
            let moved = span(tail, want, room)?;
            self.items.extend_from_within(start..start + len);
            self.items.extend_from_slice(new);
            self.items.resize(tail + room, 0);
            moved
        };
        self.spans[index] = moved;
        Ok(())
    }

    /// Checks the invariants stated on the fields, exactly.
    #[cfg(test)]
    pub(super) fn check_invariants(&self) -> Result<(), String> {
        let mut rooms: Vec<(usize, usize)> = Vec::new();
        for (i, s) in self.spans.iter().enumerate() {
            let (start, len, cap) = (s.start as usize, s.len as usize, s.cap as usize);
            if len > cap {
                return Err(format!("container {i}: len {len} > cap {cap}"));
            }
            if start + cap > self.items.len() {
                return Err(format!(
                    "container {i}: room {start}..{} past the arena ({})",
                    start + cap,
                    self.items.len()
                ));
            }
            if cap > 0 {
                rooms.push((start, start + cap));
            }
        }
        rooms.sort_unstable();
        for w in rooms.windows(2) {
            if w[0].1 > w[1].0 {
                return Err(format!("rooms {:?} and {:?} overlap", w[0], w[1]));
            }
        }
        Ok(())
    }
}

/// A [`Span`], or the slots it would reach when they pass `u32::MAX`.
pub(super) fn span(start: usize, len: usize, cap: usize) -> Result<Span, u64> {
    let end = start.saturating_add(cap);
    match (u32::try_from(start), u32::try_from(len), u32::try_from(end)) {
        (Ok(start), Ok(len), Ok(_)) => Ok(Span {
            start,
            len,
            cap: cap as u32,
        }),
        _ => Err(end as u64),
    }
}

/// `a == b`, compared in line: keys are a few bytes and most differ in the first, where `==`
/// on slices calls `memcmp`, a large part of a snapshot's import.
#[inline]
pub(super) fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x == y)
}
