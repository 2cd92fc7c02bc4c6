//! A bounded reader of pickle data from untrusted files (what
//! `torch.cuda.memory._dump_snapshot` writes), and a read-only view of what it read.
//!
//! It runs the pickle virtual machine of protocols 0 to 5 over a stream and keeps the objects
//! in a flat arena: every object is one [`Node`] of a `Vec`, and a container holds the
//! indices of its items (the items of all containers in one arena of their own, [`Seqs`]).
//! An object the pickle refers to more than once (a memo get, `DUP`)
//! is stored once and referred to twice, as in Python. A general-purpose unpickler that
//! copies shared objects lets a file of a few bytes describe an exponential amount of data:
//! 64 bytes of `DUP` + `TUPLE2` pairs describe 2⁶⁴ leaves, which this reader holds as 64
//! nodes. Nothing here recurses (reading, walking, dropping), so nesting depth costs no stack:
//! a pickle nested a million levels deep is read like any other.
//!
//! What grows with the input is bounded by [`Limits`]: bytes read, values pushed, containers,
//! memo entries, payload bytes (strings, bytes, big integers, text arguments) and open marks;
//! the walk over the result ([`Val::get`], [`Seq::iter`]) counts its steps, because a list
//! shared through many references is visited once per reference. The first limit exceeded
//! stops the reader with [`PickleError::Limit`], which names the limit, the value reached,
//! the limit's value and the byte offset. A file that is not a pickle this reader accepts is a
//! [`PickleError::Malformed`] naming what was wrong and where.
//!
//! Semantics follow Python's `pickle` where a snapshot can tell, and otherwise the reader
//! portalloc used before (`serde-pickle` with unresolved globals read as `None`): a global
//! reads as `None`, an instance (`NEWOBJ`, `OBJ`, `INST`) as an empty dict until `BUILD`
//! replaces it by its state, `set`/`frozenset`/`list`/`bytearray`/`int`/`_codecs.encode`
//! calls are evaluated, protocol 0 and 1 strings (`STRING`, `BINSTRING`) are bytes. Opcodes a
//! snapshot never holds (persistent ids, the extension registry, out-of-band buffers) are
//! refused, as is any byte that is not an opcode.
//!
//! # Time complexity
//! Reading is O(n + v + m log m) for n input bytes, v values pushed and m memo entries (O(1)
//! per memo entry numbered below the limit on memo entries, as pickles number them): each
//! opcode does O(1) work besides moving the items of its mark (each item is moved once) and
//! copying a list for `set()`/`list()` calls (each copied item counts as a value pushed).
//! Memory is O(v + payload + m), bounded by the limits. [`Val::get`] is O(k) for a dict of k
//! pairs and [`Seq::iter`] O(1) per item; both count towards [`Limits::walk_steps`].
#![deny(unsafe_code)]

use std::cell::Cell;
use std::collections::BTreeMap;
use std::io::{BufRead, ErrorKind};

use rustc_hash::{FxHashMap, FxHashSet};

use super::limits::{Figures, Limit, Limits, PickleError};
use super::view::{After, Fill, Global, Node, Pickle, SeqKind, Seqs, NO_NAME};

/// How much room the reader makes up front for a pickle of a given size, by what the real
/// snapshots hold per input byte (`real_snapshots_stay_far_below_the_limits` prints it: a
/// container item per 3.4–4.1 bytes, a node per 12–26, a container per 50–190, a memo entry
/// per 33–150, a text byte per 7–24), rounded up so that they fit without a copy: grown by
/// doubling, each vector is copied once or twice, faulting in fresh pages each time. Room is
/// only address space until it is written, and each is capped by its limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Room {
    items: usize,
    nodes: usize,
    containers: usize,
    memo: usize,
    text: usize,
}

impl Room {
    /// The room for `bytes` bytes of input (none when the size is unknown).
    fn for_input(bytes: Option<u64>, limits: &Limits) -> Room {
        let Some(bytes) = bytes else {
            return Room::default();
        };
        let bytes = bytes.min(limits.input_bytes);
        let room = |per: u64, limit: u64| usize::try_from((bytes / per).min(limit)).unwrap_or(0);
        Room {
            items: room(3, limits.values),
            nodes: room(10, limits.values),
            containers: room(40, limits.containers),
            memo: room(24, limits.memo_entries),
            text: room(6, limits.payload_bytes),
        }
    }
}

/// Reads one pickle from `input`, to its `STOP`, and tells what follows it
/// ([`Pickle::after`]: nothing, whitespace, another pickle, other bytes), which the caller
/// judges. `size`: the input's length when known (a file not compressed), to make room up
/// front ([`Room`]); it changes nothing but the time and the copies made.
///
/// # Errors
/// A limit exceeded ([`PickleError::Limit`]); a truncated or corrupt pickle, an unsupported or
/// unknown opcode ([`PickleError::Malformed`]); a read error ([`PickleError::Io`]).
pub(crate) fn read(
    input: &mut dyn BufRead,
    limits: &Limits,
    size: Option<u64>,
) -> Result<Pickle, PickleError> {
    let room = Room::for_input(size, limits);
    let mut r = Reader {
        input: Src::new(input),
        limits: *limits,
        offset: 0,
        op_offset: 0,
        op: 0,
        nodes: Vec::with_capacity(room.nodes),
        seqs: Seqs::with_capacity(room.containers, room.items),
        wide: Vec::new(),
        text: String::with_capacity(room.text),
        raw: Vec::new(),
        scratch: Vec::new(),
        memo: Memo::new(limits.memo_entries, room.memo),
        stack: Vec::new(),
        marks: Vec::new(),
        figures: Figures::default(),
        bottom: None,
        names: Vec::new(),
        name_ids: FxHashMap::default(),
        instances: FxHashSet::default(),
    };
    let root = match r.run() {
        Ok(root) => root,
        Err(PickleError::Malformed { detail, offset }) => {
            // A pickle of another kind of object, which went wrong where a snapshot never
            // goes: say what it is a pickle of.
            return Err(match r.bottom_global() {
                Some(global) => PickleError::Foreign {
                    global: global.to_string(),
                    detail,
                    offset,
                },
                None => PickleError::Malformed { detail, offset },
            });
        }
        Err(e) => return Err(e),
    };
    let root_global = r.bottom.take().filter(|b| b.node == root).map(|b| b.name);
    let stop_end = r.offset;
    // What follows the STOP: told apart here, judged by the caller, who knows what the
    // pickle holds (`pickle.load` reads to the STOP and ignores the rest).
    let after = r.after_stop()?;
    r.figures.used.input_bytes = r.offset;
    r.figures.used.memo_entries = r.memo.len;
    r.figures.nodes = r.nodes.len() as u64;
    Ok(Pickle {
        nodes: r.nodes,
        seqs: r.seqs,
        wide: r.wide,
        text: r.text,
        raw: r.raw,
        root,
        root_global,
        names: r.names,
        figures: r.figures,
        walk_limit: limits.walk_steps,
        stop_end,
        after,
        walk_steps: Cell::new(0),
    })
}

fn io_error(e: std::io::Error) -> PickleError {
    PickleError::Io(crate::trace::io_kind(&e), e.to_string())
}

/// The input through a buffer of the reader's own, read in place: an opcode and its fixed
/// arguments (at most 9 bytes) are taken from one slice with a single bounds check, and a
/// counted string that fits the buffer is stored from it without a copy to a scratch buffer
/// first. (Through `BufRead` each byte costs a dynamic call, each fixed argument a
/// `read_exact`.) Memory stays [`Src::CAPACITY`] whatever the input's size.
struct Src<'a> {
    input: &'a mut dyn BufRead,
    /// Invariant: `buf.len() == Src::CAPACITY`.
    buf: Box<[u8]>,
    /// The bytes not yet consumed are `buf[pos..end]`. Invariant: `pos <= end <= buf.len()`.
    pos: usize,
    end: usize,
}

impl<'a> Src<'a> {
    /// Bytes buffered: a counted string up to this long is read in place.
    const CAPACITY: usize = 1 << 16;

    fn new(input: &'a mut dyn BufRead) -> Self {
        Src {
            input,
            buf: vec![0; Self::CAPACITY].into_boxed_slice(),
            pos: 0,
            end: 0,
        }
    }

    /// The bytes buffered and not consumed.
    #[inline]
    fn available(&self) -> &[u8] {
        &self.buf[self.pos..self.end]
    }

    /// Buffers at least `n` bytes (`n <= CAPACITY`) unless the input ends first; returns the
    /// bytes available.
    ///
    /// # Time complexity
    /// O(CAPACITY) when it refills; O(1) when `n` bytes are there.
    ///
    /// # Errors
    /// A read error of the input.
    fn fill(&mut self, n: usize) -> std::io::Result<usize> {
        let n = n.min(Self::CAPACITY);
        if self.end - self.pos >= n {
            return Ok(self.end - self.pos);
        }
        self.buf.copy_within(self.pos..self.end, 0);
        self.end -= self.pos;
        self.pos = 0;
        while self.end < n {
            match self.input.read(&mut self.buf[self.end..]) {
                Ok(0) => break,
                Ok(k) => self.end += k,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(self.end - self.pos)
    }

    /// Consumes `n` bytes of those available.
    #[inline]
    fn consume(&mut self, n: usize) {
        self.pos = (self.pos + n).min(self.end);
    }
}

/// The memo: node ids by memo id. Pickles number their memo entries 0, 1, 2, … (`MEMOIZE`
/// takes the next number; Python's `BINPUT` the same), so ids below the limit on memo entries
/// are kept in a vector indexed by id, O(1) each; any other id (a hand-written pickle) in a
/// map. The vector grows only to the largest id stored, so it holds at most the limit's
/// number of 4-byte slots.
struct Memo {
    /// `dense[id]` = the node of memo id `id`, or [`Memo::EMPTY`]. Invariant:
    /// `dense.len() <= dense_bound`.
    dense: Vec<u32>,
    /// Ids at or above `dense_bound`.
    sparse: BTreeMap<u32, u32>,
    /// Ids below it go to `dense`.
    dense_bound: u32,
    /// Entries stored: slots of `dense` not [`Memo::EMPTY`] plus `sparse.len()`.
    len: u64,
}

impl Memo {
    /// An empty slot (no node has this id: node ids are bounded by the limit on values pushed).
    const EMPTY: u32 = u32::MAX;

    /// A memo for at most `max_entries` entries, with room for `room` ids without a copy.
    fn new(max_entries: u64, room: usize) -> Self {
        Memo {
            dense: Vec::with_capacity(room),
            sparse: BTreeMap::new(),
            dense_bound: u32::try_from(max_entries).unwrap_or(u32::MAX - 1),
            len: 0,
        }
    }

    #[inline]
    fn get(&self, id: u32) -> Option<u32> {
        if id < self.dense_bound {
            self.dense
                .get(id as usize)
                .copied()
                .filter(|&n| n != Self::EMPTY)
        } else {
            self.sparse.get(&id).copied()
        }
    }

    fn insert(&mut self, id: u32, node: u32) {
        if id < self.dense_bound {
            let i = id as usize;
            if i == self.dense.len() {
                // The next id, as pickles number them.
                self.dense.push(Self::EMPTY);
            } else if i > self.dense.len() {
                self.dense.resize(i + 1, Self::EMPTY);
            }
            if self.dense[i] == Self::EMPTY {
                self.len += 1;
            }
            self.dense[i] = node;
        } else if self.sparse.insert(id, node).is_none() {
            self.len += 1;
        }
    }
}

/// The pickle virtual machine.
struct Reader<'a> {
    input: Src<'a>,
    limits: Limits,
    /// Bytes consumed.
    offset: u64,
    /// Offset and byte of the opcode being run, for messages.
    op_offset: u64,
    op: u8,
    nodes: Vec<Node>,
    seqs: Seqs,
    wide: Vec<i128>,
    text: String,
    raw: Vec<u8>,
    /// A reused buffer for arguments: lines, counted strings before they are stored, `LONG1`
    /// and `LONG4` bytes.
    scratch: Vec<u8>,
    memo: Memo,
    /// Node ids.
    stack: Vec<u32>,
    /// Stack lengths at each open MARK.
    marks: Vec<usize>,
    figures: Figures,
    /// The object at the bottom of the stack (the one that becomes the root) when it is
    /// built from a global, and that global's name: kept for one object only, so that naming
    /// what a pickle is costs no memory that grows with it.
    bottom: Option<Bottom>,
    /// The names of [`Global::Other`] globals, the first [`NAMES_KEPT`] distinct ones
    /// (`Pickle::names`), and their indices by name.
    names: Vec<String>,
    name_ids: FxHashMap<String, u32>,
    /// The instances made by `NEWOBJ`, `NEWOBJ_EX`, `OBJ`, `INST` and
    /// `copyreg._reconstructor` (empty dicts until `BUILD`): `APPENDS` to one (a subclass of
    /// `list`) drops its items. At most one per container.
    instances: FxHashSet<u32>,
}

/// The most distinct global names kept for messages ([`Reader::names`]): a list of objects
/// is named by the globals of its items, a few of them.
const NAMES_KEPT: usize = 64;

/// An object at the bottom of the stack and the global it is built from.
#[derive(Debug)]
struct Bottom {
    /// Its node id.
    node: u32,
    /// `module.name`, as [`global_name`] gives it.
    name: String,
}

/// The most characters of a global's name kept for a message.
const GLOBAL_NAME_CHARS: usize = 80;

/// `module.name` of a global, for a message: at most [`GLOBAL_NAME_CHARS`] characters (then
/// `…` and the full length in bytes), control characters escaped, bytes that are not UTF-8
/// replaced.
///
/// # Time complexity
/// O([`GLOBAL_NAME_CHARS`]) whatever the lengths: a memo get pushes a long string again
/// without paying for it, so a name is never read further than it is shown.
fn global_name(module: &[u8], name: &[u8]) -> String {
    // A UTF-8 character is at most 4 bytes: enough of each part for the characters shown.
    let head = |part: &[u8]| -> String {
        String::from_utf8_lossy(&part[..part.len().min(4 * GLOBAL_NAME_CHARS)]).into_owned()
    };
    let shown = format!("{}.{}", head(module), head(name));
    let mut out = String::new();
    for c in shown.chars().take(GLOBAL_NAME_CHARS) {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    let bytes = module.len() + 1 + name.len();
    if shown.chars().nth(GLOBAL_NAME_CHARS).is_some() || shown.len() < bytes {
        out.push_str(&format!("… ({bytes} bytes)"));
    }
    out
}

impl Reader<'_> {
    /// The global the object at the bottom of the stack is built from, if it is.
    fn bottom_global(&self) -> Option<&str> {
        let bottom = self.bottom.as_ref()?;
        (self.stack.first() == Some(&bottom.node)).then_some(bottom.name.as_str())
    }

    /// After a global named `name` ([`global_name`]) was pushed: remembered when it is at
    /// the bottom of the stack.
    fn pushed_global(&mut self, name: String) {
        if let [node] = self.stack[..] {
            self.bottom = Some(Bottom { node, name });
        }
    }

    /// Whether `popped` (a callable or an instance just popped) was the bottom object built
    /// from a global: then what replaces it is, too ([`Reader::replaced_bottom`]).
    fn was_bottom(&self, popped: u32) -> bool {
        self.stack.is_empty() && self.bottom.as_ref().is_some_and(|b| b.node == popped)
    }

    /// The index in [`Reader::names`] of a global named `name` ([`global_name`]):
    /// [`NO_NAME`] once [`NAMES_KEPT`] other names are kept.
    ///
    /// # Time complexity
    /// O(`name.len()`), at most O([`GLOBAL_NAME_CHARS`]).
    fn name_id(&mut self, name: &str) -> u32 {
        if let Some(&id) = self.name_ids.get(name) {
            return id;
        }
        if self.names.len() >= NAMES_KEPT {
            return NO_NAME;
        }
        let id = self.names.len() as u32;
        self.names.push(name.to_string());
        self.name_ids.insert(name.to_string(), id);
        id
    }

    /// The global `module.name`, and its name ([`global_name`]) where it is kept: for a
    /// global the reader does not evaluate, so that what calling it makes can be named inside
    /// a container, and for any global at the bottom of the stack (the root's candidate).
    /// Other globals (`set`, `list`, … inside a snapshot) cost no naming.
    fn global_named(&self, module: &[u8], name: &[u8]) -> (Global, Option<String>) {
        let global = global(module, name);
        let named = matches!(global, Global::Other(_)) || self.stack.is_empty();
        (global, named.then(|| global_name(module, name)))
    }

    /// Pushes `global` named `name` ([`Reader::global_named`]): a global the reader does not
    /// evaluate refers to its name's index ([`Reader::name_id`]); at the bottom of the stack,
    /// the name is remembered as the root's ([`Reader::pushed_global`]).
    fn push_global(&mut self, global: Global, name: Option<String>) -> Result<(), PickleError> {
        let global = match (global, &name) {
            (Global::Other(_), Some(name)) => Global::Other(self.name_id(name)),
            (Global::Other(_), None) => Global::Other(NO_NAME),
            (other, _) => other,
        };
        let bottom = self.stack.is_empty();
        self.push_new(Node::Global(global))?;
        if let (true, Some(name)) = (bottom, name) {
            self.pushed_global(name);
        }
        Ok(())
    }

    /// Whether object `id` takes items it is not a container of kind `kind` for: `APPEND`,
    /// `APPENDS` (`kind` list) or `SETITEM`, `SETITEMS` (dict) on what calling a global
    /// made ([`Node::Object`]: Python calls its `extend`, `append` or `__setitem__`, as of a
    /// `collections.deque` or an `OrderedDict`), or `APPENDS` on an instance (a subclass of
    /// `list`). Their items are dropped: the object is opaque, and holds nothing more.
    fn takes_items(&self, id: u32, kind: SeqKind) -> bool {
        match (self.node(id), kind) {
            (Node::Object(_), SeqKind::List | SeqKind::Dict) => true,
            (Node::Seq { .. }, SeqKind::List) => self.instances.contains(&id),
            _ => false,
        }
    }

    /// What follows the STOP just read: nothing; ASCII whitespace only (`pickle.load` ignores
    /// what follows, and an editor or `echo >>` adds a newline); another pickle; or other
    /// bytes. Bytes after the whitespace are another pickle when they read as one to a STOP
    /// of their own (a PROTO, as protocols 2 and later begin, is not enough: `\x80\x04junk`
    /// is none), with a memo and a stack of their own and within what is left of the limits.
    /// Consumes what it reads; the whitespace counts towards the limit on input bytes.
    ///
    /// # Errors
    /// A read error of the input; whitespace past the limit on input bytes.
    fn after_stop(&mut self) -> Result<After, PickleError> {
        let mut whitespace = 0u64;
        loop {
            if self.input.fill(1).map_err(io_error)? == 0 {
                return Ok(if whitespace == 0 {
                    After::Nothing
                } else {
                    After::Whitespace { bytes: whitespace }
                });
            }
            let n = self
                .input
                .available()
                .iter()
                .take_while(|b| b.is_ascii_whitespace() || **b == 0x0b)
                .count();
            if n == 0 {
                break;
            }
            self.input.consume(n);
            self.offset += n as u64;
            whitespace += n as u64;
            if self.offset > self.limits.input_bytes {
                self.op_offset = self.offset;
                return self.exceeded(Limit::InputBytes, self.offset);
            }
        }
        let start = self.offset;
        self.stack.clear();
        self.marks.clear();
        self.memo = Memo::new(self.limits.memo_entries, 0);
        self.bottom = None;
        Ok(match self.run() {
            Ok(_) => After::Pickle { start },
            Err(PickleError::Io(kind, e)) => return Err(PickleError::Io(kind, e)),
            Err(_) => After::Bytes { start },
        })
    }

    /// The object now at the bottom of the stack replaces the one built from a global, when
    /// `was` ([`Reader::was_bottom`]).
    fn replaced_bottom(&mut self, was: bool) {
        if let (true, Some(&node), Some(bottom)) = (was, self.stack.first(), self.bottom.as_mut()) {
            bottom.node = node;
        }
    }

    #[cold]
    fn malformed<T>(&self, detail: impl Into<String>) -> Result<T, PickleError> {
        Err(PickleError::Malformed {
            detail: detail.into(),
            offset: self.op_offset,
        })
    }

    #[cold]
    fn exceeded<T>(&self, limit: Limit, reached: u64) -> Result<T, PickleError> {
        Err(PickleError::Limit {
            limit,
            reached,
            max: self.limits.of(limit),
            offset: Some(self.op_offset),
        })
    }

    /// `reached`, or the error when it is past `limit`.
    #[inline]
    fn within(&self, limit: Limit, reached: u64) -> Result<u64, PickleError> {
        if reached > self.limits.of(limit) {
            return self.exceeded(limit, reached);
        }
        Ok(reached)
    }

    #[cold]
    fn underflow<T>(&self) -> Result<T, PickleError> {
        self.malformed(format!(
            "stack underflow in opcode {}",
            describe_opcode(self.op)
        ))
    }

    #[cold]
    fn truncated<T>(&self) -> Result<T, PickleError> {
        self.malformed(format!(
            "the input ends inside opcode {}",
            describe_opcode(self.op)
        ))
    }

    // ---- input

    #[inline]
    fn byte(&mut self) -> Result<u8, PickleError> {
        self.fixed::<1>().map(|[b]| b)
    }

    #[inline]
    fn fixed<const N: usize>(&mut self) -> Result<[u8; N], PickleError> {
        if let Some(bytes) = self.input.available().first_chunk::<N>() {
            let bytes = *bytes;
            self.input.consume(N);
            self.offset += N as u64;
            return Ok(bytes);
        }
        self.fixed_slow()
    }

    /// [`Reader::fixed`] when the buffer holds fewer than `N` bytes.
    #[cold]
    fn fixed_slow<const N: usize>(&mut self) -> Result<[u8; N], PickleError> {
        if self.input.fill(N).map_err(io_error)? < N {
            // As `read_exact`: what there was is consumed.
            let got = self.input.available().len();
            self.input.consume(got);
            self.offset += got as u64;
            return self.truncated();
        }
        self.fixed()
    }

    fn u32_le(&mut self) -> Result<u32, PickleError> {
        self.fixed::<4>().map(u32::from_le_bytes)
    }

    /// A length that must not be negative (`BINSTRING`, `LONG4`).
    fn i32_len(&mut self) -> Result<u64, PickleError> {
        let n = i32::from_le_bytes(self.fixed::<4>()?);
        match u64::try_from(n) {
            Ok(n) => Ok(n),
            Err(_) => self.malformed(format!("negative length {n}")),
        }
    }

    /// Counts `n` more payload bytes, before they are read or made.
    fn charge_payload(&mut self, n: u64) -> Result<(), PickleError> {
        self.figures.used.payload_bytes = self.check_room(n)?;
        Ok(())
    }

    /// Fails if `n` more payload bytes would exceed the limit (without counting them);
    /// otherwise the payload bytes they would make.
    fn check_room(&self, n: u64) -> Result<u64, PickleError> {
        let reached = self.figures.used.payload_bytes.saturating_add(n);
        self.within(Limit::PayloadBytes, reached)
    }

    /// Reads `len` bytes into the scratch buffer.
    fn read_scratch(&mut self, len: u64) -> Result<(), PickleError> {
        self.charge_payload(len)?;
        self.scratch.clear();
        let mut left = len;
        while left > 0 {
            let available = self.input.fill(1).map_err(io_error)?;
            if available == 0 {
                return self.truncated();
            }
            let take = available.min(usize::try_from(left).unwrap_or(usize::MAX));
            self.scratch
                .extend_from_slice(&self.input.available()[..take]);
            self.input.consume(take);
            self.offset += take as u64;
            left -= take as u64;
        }
        Ok(())
    }

    /// Reads a `\n`-terminated text argument into the scratch buffer, without the `\n` (and a
    /// `\r` before it). Its bytes count as payload.
    fn read_line(&mut self) -> Result<(), PickleError> {
        self.scratch.clear();
        loop {
            if self.input.fill(1).map_err(io_error)? == 0 {
                return self.truncated();
            }
            let buf = self.input.available();
            let (take, done) = match buf.iter().position(|&b| b == b'\n') {
                Some(i) => (i + 1, true),
                None => (buf.len(), false),
            };
            let room = self
                .limits
                .payload_bytes
                .saturating_sub(self.figures.used.payload_bytes);
            if (self.scratch.len() + take) as u64 > room {
                let reached = self.figures.used.payload_bytes + (self.scratch.len() + take) as u64;
                return self.exceeded(Limit::PayloadBytes, reached);
            }
            self.scratch.extend_from_slice(&buf[..take]);
            self.input.consume(take);
            self.offset += take as u64;
            if done {
                break;
            }
        }
        self.charge_payload(self.scratch.len() as u64)?;
        self.scratch.pop();
        if self.scratch.last() == Some(&b'\r') {
            self.scratch.pop();
        }
        Ok(())
    }

    fn offset_u32(&self, n: usize) -> Result<u32, PickleError> {
        match u32::try_from(n) {
            Ok(n) => Ok(n),
            // Unreachable while the limits stay below u32::MAX (asserted in `limits`).
            Err(_) => self.exceeded(Limit::PayloadBytes, n as u64),
        }
    }

    // ---- objects and the stack

    fn count_values(&mut self, n: u64) -> Result<(), PickleError> {
        let reached = self.figures.used.values.saturating_add(n);
        self.figures.used.values = self.within(Limit::Values, reached)?;
        Ok(())
    }

    fn push(&mut self, id: u32) -> Result<(), PickleError> {
        self.count_values(1)?;
        self.stack.push(id);
        Ok(())
    }

    fn push_new(&mut self, node: Node) -> Result<(), PickleError> {
        self.count_values(1)?;
        let id = self.offset_u32(self.nodes.len())?;
        self.nodes.push(node);
        self.stack.push(id);
        Ok(())
    }

    fn push_seq(&mut self, kind: SeqKind, fill: Fill) -> Result<(), PickleError> {
        self.figures.used.containers =
            self.within(Limit::Containers, self.figures.used.containers + 1)?;
        let made = match fill {
            Fill::Empty => self.seqs.push(&[]),
            Fill::Stack { at, end } => {
                let made = self.seqs.push(&self.stack[at..end]);
                self.stack.truncate(at);
                made
            }
            Fill::Copy(source) => self.seqs.push_copy(source),
        };
        let index = self.arena_result(made)?;
        self.push_new(Node::Seq { kind, index })
    }

    /// Pushes a new instance: an empty dict until `BUILD` gives its state, remembered as an
    /// instance ([`Reader::takes_items`]).
    fn push_instance(&mut self) -> Result<(), PickleError> {
        self.push_seq(SeqKind::Dict, Fill::Empty)?;
        if let Some(&id) = self.stack.last() {
            self.instances.insert(id);
        }
        Ok(())
    }

    /// Appends `new` (`Stack` or nothing) to container `index`.
    fn extend_seq(&mut self, index: usize, new: Fill) -> Result<(), PickleError> {
        let extended = match new {
            Fill::Stack { at, end } => {
                let extended = self.seqs.extend(index, &self.stack[at..end]);
                self.stack.truncate(at);
                extended
            }
            Fill::Empty | Fill::Copy(_) => Ok(()),
        };
        self.arena_result(extended)
    }

    /// Appends `items` (popped already) to container `index`.
    fn push_extend(&mut self, index: usize, items: &[u32]) -> Result<(), PickleError> {
        let extended = self.seqs.extend(index, items);
        self.arena_result(extended)
    }

    /// What a [`Seqs`] method did, as the reader's result.
    fn arena_result<T>(&self, r: Result<T, u64>) -> Result<T, PickleError> {
        match r {
            Ok(made) => Ok(made),
            // Unreachable while the limits stay below u32::MAX / 4 (asserted in `limits`).
            Err(n) => self.exceeded(Limit::Values, n),
        }
    }

    /// Stores `bytes` (already counted as payload): in the text arena when they are UTF-8.
    fn store(&mut self, bytes: &[u8], must_be_text: bool) -> Result<Node, PickleError> {
        let stored = store_in(&mut self.text, &mut self.raw, bytes, must_be_text);
        self.stored(stored)
    }

    /// The node [`store_in`] made, or its error.
    fn stored(&self, stored: Result<Node, StoreFailure>) -> Result<Node, PickleError> {
        match stored {
            Ok(node) => Ok(node),
            Err(StoreFailure::NotUtf8) => self.malformed("a string that is not UTF-8"),
            // Unreachable while the limits stay below u32::MAX (asserted in `limits`).
            Err(StoreFailure::Offset(n)) => self.exceeded(Limit::PayloadBytes, n),
        }
    }

    /// The length argument of a counted string or bytes opcode, by its width: one byte, four
    /// (signed for BINSTRING, as Python reads it) or eight.
    fn length(&mut self, op: u8) -> Result<u64, PickleError> {
        match op {
            op::SHORT_BINUNICODE | op::SHORT_BINSTRING | op::SHORT_BINBYTES => {
                self.byte().map(u64::from)
            }
            op::BINSTRING => self.i32_len(),
            op::BINUNICODE | op::BINBYTES => self.u32_le().map(u64::from),
            _ => self.fixed::<8>().map(u64::from_le_bytes),
        }
    }

    /// Reads a counted string of `len` bytes and pushes it (`text`) or a bytes object.
    fn push_counted(&mut self, len: u64, text: bool) -> Result<(), PickleError> {
        let n = usize::try_from(len).unwrap_or(usize::MAX);
        if n > Src::CAPACITY {
            self.read_scratch(len)?;
            let scratch = std::mem::take(&mut self.scratch);
            let stored = self.store(&scratch, text);
            self.scratch = scratch;
            let node = stored?;
            return self.push_new(node);
        }
        // In place, from the input's buffer: counted (before it is read) as `read_scratch`
        // counts it, and truncated the same way.
        self.charge_payload(len)?;
        let got = self.input.fill(n).map_err(io_error)?;
        if got < n {
            self.input.consume(got);
            self.offset += got as u64;
            return self.truncated();
        }
        let bytes = &self.input.buf[self.input.pos..self.input.pos + n];
        let stored = store_in(&mut self.text, &mut self.raw, bytes, text);
        self.input.consume(n);
        self.offset += len;
        let node = self.stored(stored)?;
        self.push_new(node)
    }

    /// Pushes `bytes` (made, not read) as a string (`text`, valid UTF-8) or a bytes object.
    fn push_made(&mut self, bytes: &[u8], text: bool) -> Result<(), PickleError> {
        self.charge_payload(bytes.len() as u64)?;
        let node = self.store(bytes, text)?;
        self.push_new(node)
    }

    /// Pushes string `id` of `len` bytes as bytes (latin-1), counted before it is made: a long
    /// string converted many times.
    fn push_latin1(&mut self, id: u32, len: u32) -> Result<(), PickleError> {
        self.check_room(len.into())?;
        let bytes = latin1(self.text_of(id).unwrap_or_default());
        self.push_made(&bytes, false)
    }

    fn push_int(&mut self, value: i128) -> Result<(), PickleError> {
        match i64::try_from(value) {
            Ok(i) => self.push_new(Node::Int(i)),
            Err(_) => {
                let w = self.offset_u32(self.wide.len())?;
                self.wide.push(value);
                self.push_new(Node::Wide(w))
            }
        }
    }

    /// Where the items above the last mark start (a pop never crosses a mark).
    fn floor(&self) -> usize {
        self.marks.last().copied().unwrap_or(0)
    }

    fn pop(&mut self) -> Result<u32, PickleError> {
        if self.stack.len() > self.floor() {
            if let Some(id) = self.stack.pop() {
                return Ok(id);
            }
        }
        self.underflow()
    }

    #[inline]
    fn top(&self) -> Result<u32, PickleError> {
        if self.stack.len() > self.floor() {
            if let Some(&id) = self.stack.last() {
                return Ok(id);
            }
        }
        self.underflow()
    }

    /// Where the items above the last mark, which is closed, start on the stack.
    fn close_mark(&mut self) -> Result<usize, PickleError> {
        match self.marks.pop() {
            Some(at) => Ok(at.min(self.stack.len())),
            None => self.malformed(format!(
                "opcode {} without a MARK",
                describe_opcode(self.op)
            )),
        }
    }

    /// Drops the items above the last mark, which is closed.
    fn pop_mark(&mut self) -> Result<(), PickleError> {
        let at = self.close_mark()?;
        self.stack.truncate(at);
        Ok(())
    }

    /// The index of the container on top of the stack, which must be of `kind`.
    fn top_seq(&mut self, kind: SeqKind) -> Result<usize, PickleError> {
        let id = self.top()?;
        let index = match self.nodes.get(id as usize) {
            Some(&Node::Seq { kind: k, index }) if k == kind => Some(index as usize),
            _ => None,
        };
        if let Some(i) = index.filter(|&i| i < self.seqs.len()) {
            return Ok(i);
        }
        self.malformed(format!(
            "opcode {} on a stack top that is not a {}",
            describe_opcode(self.op),
            match kind {
                SeqKind::List => "list",
                SeqKind::Tuple => "tuple",
                SeqKind::Dict => "dict",
                SeqKind::Set | SeqKind::FrozenSet => "set",
            }
        ))
    }

    fn memoize(&mut self, id: u32) -> Result<(), PickleError> {
        let top = self.top()?;
        if self.memo.get(id).is_none() {
            self.within(Limit::MemoEntries, self.memo.len + 1)?;
        }
        self.memo.insert(id, top);
        Ok(())
    }

    fn memo_get(&mut self, id: u32) -> Result<(), PickleError> {
        match self.memo.get(id) {
            Some(node) => self.push(node),
            None => self.malformed(format!("memo entry {id} is read before it is stored")),
        }
    }

    /// Runs the `BINGET` and `LONG_BINGET` opcodes that follow, while their arguments are
    /// buffered and nothing goes wrong, in a loop of their own: a snapshot's lists of stack
    /// frames are runs of memo gets (three quarters of its opcodes), and a two-way branch
    /// here is predicted where the dispatch of every opcode is not. Whatever it does not run
    /// (another opcode, an argument not buffered, a missing memo entry, a limit reached) is
    /// left to [`Reader::step`], which runs it or reports it as it would have.
    ///
    /// # Time complexity
    /// O(1) per opcode run.
    #[inline]
    fn more_gets(&mut self) {
        // Over the buffered bytes, with the counters in registers and written back once: the
        // checks of `run` (each opcode within the input limit) and of `push` (the values
        // pushed within theirs) become two budgets.
        let bytes = self.input.available();
        if !matches!(bytes.first(), Some(&(op::BINGET | op::LONG_BINGET))) {
            // Most runs are one get (a dict's key): nothing to set up.
            return;
        }
        let byte_budget = self.limits.input_bytes.saturating_sub(self.offset);
        let value_budget = self.limits.values.saturating_sub(self.figures.used.values);
        let mut at = 0usize;
        let mut pushed = 0u64;
        loop {
            let (id, len) = match bytes.get(at..) {
                Some([op::BINGET, id, ..]) => (u32::from(*id), 2),
                Some([op::LONG_BINGET, a, b, c, d, ..]) => {
                    (u32::from_le_bytes([*a, *b, *c, *d]), 5)
                }
                _ => break,
            };
            if at as u64 >= byte_budget || pushed >= value_budget {
                break;
            }
            let Some(node) = self.memo.get(id) else {
                break;
            };
            self.stack.push(node);
            pushed += 1;
            at += len;
        }
        self.figures.used.values += pushed;
        self.input.consume(at);
        self.offset += at as u64;
    }

    /// Runs a `MEMOIZE` that follows, and then (`mark`) a `MARK`, while nothing goes wrong,
    /// in line: a pickler memoizes each container and string it makes and opens the items of a
    /// container with a mark, so these follow `EMPTY_DICT`, `EMPTY_LIST` and strings, where a
    /// branch per opcode is predicted and the dispatch of the next opcode is not. Whatever it
    /// does not run (another opcode, a limit reached, a stack with nothing above the mark) is
    /// left to [`Reader::step`], which runs it or reports it as it would have.
    ///
    /// # Time complexity
    /// O(1).
    #[inline]
    fn more_memoize(&mut self, mark: bool) {
        if self.input.available().first() != Some(&op::MEMOIZE) {
            return;
        }
        // The checks of `run` (the opcode within the input limit) and of `memoize`.
        let id = u32::try_from(self.memo.len).unwrap_or(u32::MAX);
        if self.offset >= self.limits.input_bytes
            || self.stack.len() <= self.floor()
            || (self.memo.len >= self.limits.memo_entries && self.memo.get(id).is_none())
        {
            return;
        }
        let Some(&top) = self.stack.last() else {
            return;
        };
        self.memo.insert(id, top);
        self.input.consume(1);
        self.offset += 1;
        if !mark
            || self.input.available().first() != Some(&op::MARK)
            || self.offset >= self.limits.input_bytes
            || self.marks.len() as u64 >= self.limits.open_marks
        {
            return;
        }
        // As `MARK` in `step`.
        let reached = self.marks.len() as u64 + 1;
        self.figures.used.open_marks = self.figures.used.open_marks.max(reached);
        self.marks.push(self.stack.len());
        self.input.consume(1);
        self.offset += 1;
    }

    /// The escaped text argument (protocol 0) of `opcode`, read as a line and unescaped.
    fn escaped_line<T>(
        &mut self,
        opcode: &str,
        unescape: fn(&[u8]) -> Option<T>,
    ) -> Result<T, PickleError> {
        self.read_line()?;
        match unescape(&self.scratch) {
            Some(v) => Ok(v),
            None => self.malformed(format!("a {opcode} argument with a bad escape")),
        }
    }

    /// Where the items above the last mark (popped with it) start and end on the stack, for
    /// a container of `kind`: of a dict's, a key without a value is dropped, as the reader
    /// before did.
    fn marked_items(&mut self, kind: SeqKind) -> Result<(usize, usize), PickleError> {
        let at = self.close_mark()?;
        let mut end = self.stack.len();
        if kind == SeqKind::Dict {
            end -= (end - at) & 1;
        }
        Ok((at, end))
    }

    /// Moves the items above the last mark, which is closed, to the end of the container of
    /// `kind` below it: [`Reader::marked_items`] then [`Reader::top_seq`], with no `Vec` in
    /// between (a snapshot fills each of its many dicts and lists with one `SETITEMS` or
    /// `APPENDS`).
    fn extend_below_mark(&mut self, kind: SeqKind) -> Result<(), PickleError> {
        let (at, end) = self.marked_items(kind)?;
        // The container: the stack top once the items are gone.
        let container = if at > self.floor() {
            at.checked_sub(1).and_then(|i| self.stack.get(i)).copied()
        } else {
            None
        };
        let index = match container.and_then(|id| self.nodes.get(id as usize)) {
            Some(&Node::Seq { kind: k, index }) if k == kind => Some(index as usize),
            _ => None,
        };
        match index.filter(|&i| i < self.seqs.len()) {
            Some(i) => self.extend_seq(i, Fill::Stack { at, end }),
            None => {
                self.stack.truncate(at);
                match container {
                    None => self.underflow(),
                    Some(id) if self.takes_items(id, kind) => Ok(()),
                    Some(_) => self.top_seq(kind).map(|_| ()),
                }
            }
        }
    }

    /// The memo id argument of a PUT or GET opcode: a text line, one byte or four, by its
    /// width.
    #[inline]
    fn memo_id(&mut self, op: u8) -> Result<u32, PickleError> {
        match op {
            op::BINPUT | op::BINGET => self.byte().map(u32::from),
            op::LONG_BINPUT | op::LONG_BINGET => self.u32_le(),
            _ => self.text_memo_id(),
        }
    }

    fn text_memo_id(&mut self) -> Result<u32, PickleError> {
        self.read_line()?;
        match self.scratch_as() {
            Some(id) => Ok(id),
            None => self.malformed("a memo id that is not a number"),
        }
    }

    /// The scratch buffer as a `T`, where it is UTF-8 text that parses as one.
    fn scratch_as<T: std::str::FromStr>(&self) -> Option<T> {
        std::str::from_utf8(&self.scratch).ok()?.parse().ok()
    }

    fn node(&self, id: u32) -> Node {
        self.nodes.get(id as usize).copied().unwrap_or(Node::None)
    }

    /// The text of string `id`. O(1).
    fn text_of(&self, id: u32) -> Option<&str> {
        match self.node(id) {
            Node::Str { start, len } => self
                .text
                .get(start as usize..(start as usize).saturating_add(len as usize)),
            _ => None,
        }
    }

    /// The container of list `id` (for `set()`, `frozenset()`, `list()` calls).
    fn list_index(&self, id: u32) -> Option<u32> {
        match self.node(id) {
            Node::Seq {
                kind: SeqKind::List,
                index,
            } => Some(index),
            _ => None,
        }
    }

    // ---- the machine

    /// Runs opcodes up to STOP; returns the root.
    fn run(&mut self) -> Result<u32, PickleError> {
        loop {
            self.op_offset = self.offset;
            self.within(Limit::InputBytes, self.offset + 1)?;
            let op = match self.byte() {
                Ok(op) => op,
                Err(PickleError::Malformed { .. }) => {
                    return self.malformed("the input ends before the end of the pickle (no STOP)")
                }
                Err(e) => return Err(e),
            };
            self.op = op;
            if let Some(root) = self.step(op)? {
                return Ok(root);
            }
        }
    }

    /// Runs one opcode; `Some(root)` at STOP.
    fn step(&mut self, op: u8) -> Result<Option<u32>, PickleError> {
        match op {
            // Framing and protocol: arguments skipped.
            op::PROTO => {
                self.byte()?;
            }
            op::FRAME => {
                self.fixed::<8>()?;
            }
            op::STOP => return self.pop().map(Some),

            // The stack and marks.
            op::MARK => {
                let reached = self.within(Limit::OpenMarks, self.marks.len() as u64 + 1)?;
                self.figures.used.open_marks = self.figures.used.open_marks.max(reached);
                self.marks.push(self.stack.len());
            }
            op::POP => {
                // As Python: a POP with nothing above the last mark pops the mark.
                if self.stack.len() > self.floor() {
                    self.pop()?;
                } else {
                    self.pop_mark()?;
                }
            }
            op::POP_MARK => {
                self.pop_mark()?;
            }
            // The same object again, not a copy: a copy is what makes DUP chains exponential.
            op::DUP => {
                let top = self.top()?;
                self.push(top)?;
            }

            // The memo.
            op::PUT | op::BINPUT | op::LONG_BINPUT => {
                let id = self.memo_id(op)?;
                self.memoize(id)?;
            }
            op::MEMOIZE => {
                let id = u32::try_from(self.memo.len).unwrap_or(u32::MAX);
                self.memoize(id)?;
            }
            op::GET | op::BINGET | op::LONG_BINGET => {
                let id = self.memo_id(op)?;
                self.memo_get(id)?;
                self.more_gets();
            }

            // Constants and numbers.
            op::NONE => self.push_new(Node::None)?,
            op::NEWTRUE => self.push_new(Node::Bool(true))?,
            op::NEWFALSE => self.push_new(Node::Bool(false))?,
            op::INT => {
                self.read_line()?;
                // Protocol 1 spells booleans 00 and 01.
                let node = match self.scratch.as_slice() {
                    b"00" => Node::Bool(false),
                    b"01" => Node::Bool(true),
                    _ => match self.scratch_as() {
                        Some(i) => Node::Int(i),
                        None => return self.malformed("an INT argument that is not a number"),
                    },
                };
                self.push_new(node)?;
            }
            op::LONG => {
                self.read_line()?;
                if self.scratch.last() == Some(&b'L') {
                    self.scratch.pop();
                }
                self.push_decimal()?;
            }
            op::FLOAT => {
                self.read_line()?;
                match self.scratch_as() {
                    Some(f) => self.push_new(Node::Float(f))?,
                    None => return self.malformed("a FLOAT argument that is not a number"),
                }
            }
            op::BINFLOAT => {
                let bytes = self.fixed::<8>()?;
                self.push_new(Node::Float(f64::from_be_bytes(bytes)))?;
            }
            op::BININT => {
                let bytes = self.fixed::<4>()?;
                self.push_new(Node::Int(i32::from_le_bytes(bytes).into()))?;
            }
            op::BININT1 => {
                let b = self.byte()?;
                self.push_new(Node::Int(b.into()))?;
            }
            op::BININT2 => {
                let bytes = self.fixed::<2>()?;
                self.push_new(Node::Int(u16::from_le_bytes(bytes).into()))?;
            }
            op::LONG1 => {
                let len = self.byte()?;
                let n = usize::from(len);
                if self.input.available().len() >= n {
                    // In place (a snapshot's addresses): counted as `read_scratch` counts it.
                    self.charge_payload(len.into())?;
                    let value = twos_complement(&self.input.available()[..n]);
                    self.input.consume(n);
                    self.offset += u64::from(len);
                    self.push_wide(value)?;
                } else {
                    self.read_scratch(len.into())?;
                    self.push_twos_complement()?;
                }
            }
            op::LONG4 => {
                let len = self.i32_len()?;
                self.read_scratch(len)?;
                self.push_twos_complement()?;
            }

            // Strings and bytes.
            op::SHORT_BINUNICODE | op::BINUNICODE | op::BINUNICODE8 => {
                let len = self.length(op)?;
                self.push_counted(len, true)?;
                self.more_memoize(false);
            }
            op::SHORT_BINSTRING
            | op::SHORT_BINBYTES
            | op::BINSTRING
            | op::BINBYTES
            | op::BINBYTES8
            | op::BYTEARRAY8 => {
                let len = self.length(op)?;
                self.push_counted(len, false)?;
            }
            op::STRING => {
                let bytes = self.escaped_line("STRING", unescape_string)?;
                self.push_made(&bytes, false)?;
            }
            op::UNICODE => {
                let text = self.escaped_line("UNICODE", unescape_raw_unicode)?;
                self.push_made(text.as_bytes(), true)?;
            }

            // Containers.
            op::EMPTY_TUPLE => self.push_seq(SeqKind::Tuple, Fill::Empty)?,
            op::EMPTY_LIST => {
                self.push_seq(SeqKind::List, Fill::Empty)?;
                self.more_memoize(true);
            }
            op::EMPTY_DICT => {
                self.push_seq(SeqKind::Dict, Fill::Empty)?;
                self.more_memoize(true);
            }
            op::EMPTY_SET => self.push_seq(SeqKind::Set, Fill::Empty)?,
            op::TUPLE1 | op::TUPLE2 | op::TUPLE3 => {
                // The top 1, 2 or 3 items, in stack order (none below the last mark).
                let n = usize::from(op - op::TUPLE1) + 1;
                let end = self.stack.len();
                if end < self.floor() + n {
                    return self.underflow();
                }
                self.push_seq(SeqKind::Tuple, Fill::Stack { at: end - n, end })?;
            }
            // Built from the items above the mark.
            op::TUPLE | op::LIST | op::DICT | op::FROZENSET => {
                let kind = match op {
                    op::TUPLE => SeqKind::Tuple,
                    op::LIST => SeqKind::List,
                    op::DICT => SeqKind::Dict,
                    _ => SeqKind::FrozenSet,
                };
                let (at, end) = self.marked_items(kind)?;
                self.push_seq(kind, Fill::Stack { at, end })?;
            }
            // Added to the container below the mark.
            op::APPENDS | op::SETITEMS | op::ADDITEMS => {
                let kind = match op {
                    op::APPENDS => SeqKind::List,
                    op::SETITEMS => SeqKind::Dict,
                    _ => SeqKind::Set,
                };
                self.extend_below_mark(kind)?;
            }
            op::APPEND => {
                let item = self.pop()?;
                if self
                    .top()
                    .is_ok_and(|top| self.takes_items(top, SeqKind::List))
                {
                    return Ok(None);
                }
                let index = self.top_seq(SeqKind::List)?;
                self.push_extend(index, &[item])?;
            }
            op::SETITEM => {
                let value = self.pop()?;
                let key = self.pop()?;
                if self
                    .top()
                    .is_ok_and(|top| self.takes_items(top, SeqKind::Dict))
                {
                    return Ok(None);
                }
                let index = self.top_seq(SeqKind::Dict)?;
                self.push_extend(index, &[key, value])?;
            }

            // Globals, calls and instances: snapshots hold none; read as the reader before did.
            op::GLOBAL => {
                self.read_line()?;
                let module = std::mem::take(&mut self.scratch);
                self.read_line()?;
                let (global, name) = self.global_named(&module, &self.scratch);
                self.scratch = module;
                self.push_global(global, name)?;
            }
            op::STACK_GLOBAL => {
                let name = self.pop()?;
                let module = self.pop()?;
                let (Some(name), Some(module)) = (self.text_of(name), self.text_of(module)) else {
                    return self.malformed("STACK_GLOBAL on names that are not strings");
                };
                let (global, name) = self.global_named(module.as_bytes(), name.as_bytes());
                self.push_global(global, name)?;
            }
            op::REDUCE => {
                let args = self.pop()?;
                let callable = self.pop()?;
                let was = self.was_bottom(callable);
                self.reduce(callable, args)?;
                self.replaced_bottom(was);
            }
            op::NEWOBJ | op::NEWOBJ_EX | op::OBJ => {
                // The arguments go: the items above the mark, or a tuple (and, NEWOBJ_EX, a
                // dict of keyword arguments).
                if op == op::OBJ {
                    self.pop_mark()?;
                } else {
                    for _ in 0..1 + u8::from(op == op::NEWOBJ_EX) {
                        self.pop()?;
                    }
                }
                let class = self.pop()?;
                let was = self.was_bottom(class);
                self.push_instance()?;
                self.replaced_bottom(was);
            }
            op::INST => {
                self.read_line()?;
                let module = std::mem::take(&mut self.scratch);
                self.read_line()?;
                let name = global_name(&module, &self.scratch);
                self.scratch = module;
                self.pop_mark()?;
                self.push_instance()?;
                self.pushed_global(name);
            }
            op::BUILD => {
                // The instance becomes its state; what calling a global made stays itself
                // (its state dropped), so that it can still be named.
                let state = self.pop()?;
                let instance = self.pop()?;
                let was = self.was_bottom(instance);
                match self.node(instance) {
                    Node::Object(_) => self.push(instance)?,
                    _ => self.push(state)?,
                }
                self.replaced_bottom(was);
            }

            op::PERSID
            | op::BINPERSID
            | op::EXT1
            | op::EXT2
            | op::EXT4
            | op::NEXT_BUFFER
            | op::READONLY_BUFFER => {
                return self.malformed(format!(
                    "unsupported opcode {} (a snapshot never holds it)",
                    describe_opcode(op)
                ));
            }
            other => return self.malformed(format!("unknown opcode 0x{other:02x}")),
        }
        Ok(None)
    }

    /// `REDUCE`: calls a global with an argument tuple.
    fn reduce(&mut self, callable: u32, args: u32) -> Result<(), PickleError> {
        // Only the first and the last two arguments matter: the tuple is not copied (a
        // large one reduced many times would cost time no limit counts).
        let (first, second_last, last) = match self.node(args) {
            Node::Seq {
                kind: SeqKind::Tuple,
                index,
            } => {
                let args = self.seqs.get(index);
                (
                    args.first().copied(),
                    args.iter().rev().nth(1).copied(),
                    args.last().copied(),
                )
            }
            _ => return self.malformed("REDUCE with arguments that are not a tuple"),
        };
        let Node::Global(global) = self.node(callable) else {
            return self.malformed("REDUCE of something that is not a global");
        };
        match global {
            Global::Set | Global::FrozenSet | Global::List => {
                let list = last.and_then(|id| self.list_index(id));
                let Some(len) = list.map(|index| self.seqs.get(index).len()) else {
                    return self.malformed("set(), frozenset() or list() without a list");
                };
                // The copy is as large as the list: its items count as values pushed, before
                // it is made.
                self.count_values(len as u64)?;
                let fill = list.map_or(Fill::Empty, Fill::Copy);
                let kind = match global {
                    Global::Set => SeqKind::Set,
                    Global::FrozenSet => SeqKind::FrozenSet,
                    _ => SeqKind::List,
                };
                self.push_seq(kind, fill)
            }
            Global::Int => match last.map(|id| self.node(id)) {
                Some(node @ (Node::Int(_) | Node::Wide(_) | Node::Huge(_))) => self.push_new(node),
                _ => self.malformed("int() without an integer"),
            },
            Global::Bytearray => match first.map(|id| (id, self.node(id))) {
                Some((id, Node::Bytes { .. })) => self.push(id),
                Some((id, Node::Str { len, .. })) => self.push_latin1(id, len),
                _ => self.malformed("bytearray() without bytes or a string"),
            },
            Global::Encode => {
                // _codecs.encode(text, 'latin1'): bytes of protocols below 3.
                let (Some(text), Some(encoding)) = (second_last, last) else {
                    return self.malformed("_codecs.encode() without two strings");
                };
                match (self.node(text), self.text_of(encoding)) {
                    (Node::Str { len, .. }, Some(_)) => self.push_latin1(text, len),
                    _ => self.malformed("_codecs.encode() without two strings"),
                }
            }
            Global::Reconstructor => self.push_instance(),
            Global::Other(name) => self.push_new(Node::Object(name)),
        }
    }

    /// A decimal integer in the scratch buffer (`LONG`).
    fn push_decimal(&mut self) -> Result<(), PickleError> {
        let text = std::str::from_utf8(&self.scratch).unwrap_or("");
        let digits = text.strip_prefix(['-', '+']).unwrap_or(text);
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return self.malformed("a LONG argument that is not a number");
        }
        if let Ok(i) = text.parse::<i128>() {
            return self.push_int(i);
        }
        match text.parse::<f64>() {
            Ok(f) => self.push_new(Node::Huge(f)),
            Err(_) => self.malformed("a LONG argument that is not a number"),
        }
    }

    /// A little-endian two's-complement integer in the scratch buffer (`LONG1`, `LONG4`).
    fn push_twos_complement(&mut self) -> Result<(), PickleError> {
        let value = twos_complement(&self.scratch);
        self.push_wide(value)
    }

    /// Pushes what [`twos_complement`] read.
    fn push_wide(&mut self, value: Result<i128, f64>) -> Result<(), PickleError> {
        match value {
            Ok(i) => self.push_int(i),
            Err(huge) => self.push_new(Node::Huge(huge)),
        }
    }
}

/// A little-endian two's-complement integer: `Ok` within 128 bits, else `Err` of its
/// approximate value (beyond 128 bits only the magnitude can matter to a reader).
fn twos_complement(bytes: &[u8]) -> Result<i128, f64> {
    let negative = bytes.last().is_some_and(|b| b & 0x80 != 0);
    if bytes.len() <= 16 {
        return Ok(sign_extended(bytes, negative));
    }
    // Sign-extension bytes carry no value: drop them, keeping the sign bit.
    let mut len = bytes.len();
    let fill = if negative { 0xff } else { 0x00 };
    while len > 1 && bytes[len - 1] == fill && (bytes[len - 2] & 0x80 != 0) == negative {
        len -= 1;
    }
    let bytes = &bytes[..len];
    if bytes.len() <= 16 {
        return Ok(sign_extended(bytes, negative));
    }
    let magnitude = bytes.iter().rev().fold(0.0f64, |acc, &b| {
        acc * 256.0 + f64::from(if negative { !b } else { b })
    });
    Err(if negative { -magnitude } else { magnitude })
}

/// At most 16 little-endian bytes, extended with the sign `negative`. From the most
/// significant byte down, over the sign's fill, in registers: not through a 16-byte array in
/// memory (`memcpy`, then a wait on the store), once per address and timestamp.
#[inline]
fn sign_extended(bytes: &[u8], negative: bool) -> i128 {
    let sign: i128 = if negative { -1 } else { 0 };
    bytes
        .iter()
        .rev()
        .fold(sign, |value, &b| (value << 8) | i128::from(b))
}

/// Why [`store_in`] stored nothing.
enum StoreFailure {
    /// Text that is not UTF-8.
    NotUtf8,
    /// An offset past `u32::MAX` (the limits keep them below).
    Offset(u64),
}

/// Stores `bytes` in the text arena when they are UTF-8, else (unless `must_be_text`) in the
/// raw one; the node that refers to them.
fn store_in(
    text: &mut String,
    raw: &mut Vec<u8>,
    bytes: &[u8],
    must_be_text: bool,
) -> Result<Node, StoreFailure> {
    let offset = |n: usize| u32::try_from(n).map_err(|_| StoreFailure::Offset(n as u64));
    match std::str::from_utf8(bytes) {
        Ok(s) => {
            let start = offset(text.len())?;
            let len = offset(s.len())?;
            text.push_str(s);
            Ok(if must_be_text {
                Node::Str { start, len }
            } else {
                Node::Bytes {
                    start,
                    len,
                    text: true,
                }
            })
        }
        Err(_) if must_be_text => Err(StoreFailure::NotUtf8),
        Err(_) => {
            let start = offset(raw.len())?;
            let len = offset(bytes.len())?;
            raw.extend_from_slice(bytes);
            Ok(Node::Bytes {
                start,
                len,
                text: false,
            })
        }
    }
}

fn global(module: &[u8], name: &[u8]) -> Global {
    match (module, name) {
        (b"__builtin__" | b"builtins", b"set") => Global::Set,
        (b"__builtin__" | b"builtins", b"frozenset") => Global::FrozenSet,
        (b"__builtin__" | b"builtins", b"bytearray") => Global::Bytearray,
        (b"__builtin__" | b"builtins", b"list") => Global::List,
        (b"__builtin__" | b"builtins", b"int") => Global::Int,
        (b"_codecs", b"encode") => Global::Encode,
        (b"copy_reg" | b"copyreg", b"_reconstructor") => Global::Reconstructor,
        _ => Global::Other(NO_NAME),
    }
}

/// Code points below 256 as bytes (latin-1), as `_codecs.encode(text, 'latin1')` makes them.
fn latin1(text: &str) -> Vec<u8> {
    text.chars().map(|c| c as u32 as u8).collect()
}

/// A protocol 0 `STRING` argument: optional matching quotes, Python escapes.
fn unescape_string(line: &[u8]) -> Option<Vec<u8>> {
    let body = match line {
        [q, body @ .., e] if q == e && (*q == b'"' || *q == b'\'') => body,
        _ => line,
    };
    let mut out = Vec::with_capacity(body.len());
    let mut it = body.iter();
    while let Some(&b) = it.next() {
        if b != b'\\' {
            out.push(b);
            continue;
        }
        let c = match it.next()? {
            b'\\' => b'\\',
            b'\'' => b'\'',
            b'"' => b'"',
            b'a' => 0x07,
            b'b' => 0x08,
            b't' => b'\t',
            b'n' => b'\n',
            b'v' => 0x0b,
            b'f' => 0x0c,
            b'r' => b'\r',
            b'x' => {
                let hi = (*it.next()? as char).to_digit(16)?;
                let lo = (*it.next()? as char).to_digit(16)?;
                (hi * 16 + lo) as u8
            }
            _ => return None,
        };
        out.push(c);
    }
    Some(out)
}

/// A protocol 0 `UNICODE` argument (raw-unicode-escape): `\uXXXX`, `\UXXXXXXXX`, other
/// bytes are code points below 256.
fn unescape_raw_unicode(line: &[u8]) -> Option<String> {
    let mut out = String::with_capacity(line.len());
    let mut it = line.iter();
    while let Some(&b) = it.next() {
        if b != b'\\' {
            out.push(char::from(b));
            continue;
        }
        let digits = match it.next()? {
            b'u' => 4,
            b'U' => 8,
            _ => return None,
        };
        let mut code = 0u32;
        for _ in 0..digits {
            code = code * 16 + (*it.next()? as char).to_digit(16)?;
        }
        out.push(char::from_u32(code)?);
    }
    Some(out)
}

/// An opcode byte for messages: its name, and the byte.
fn describe_opcode(b: u8) -> String {
    match opcode_name(b) {
        Some(name) => format!("{name} (0x{b:02x})"),
        None => format!("0x{b:02x}"),
    }
}

/// The opcodes of protocols 0 to 5 (module `op`), named as Python's `pickletools` names
/// them, and [`opcode_name`]: one list, so that a name cannot drift from its byte.
macro_rules! opcodes {
    ($($name:ident = $byte:expr,)*) => {
        mod op {
            $(pub(super) const $name: u8 = $byte;)*
        }

        fn opcode_name(b: u8) -> Option<&'static str> {
            use op::*;
            Some(match b {
                $($name => stringify!($name),)*
                _ => return None,
            })
        }
    };
}

opcodes! {
    MARK = b'(',
    STOP = b'.',
    POP = b'0',
    POP_MARK = b'1',
    DUP = b'2',
    FLOAT = b'F',
    INT = b'I',
    BININT = b'J',
    BININT1 = b'K',
    LONG = b'L',
    BININT2 = b'M',
    NONE = b'N',
    PERSID = b'P',
    BINPERSID = b'Q',
    REDUCE = b'R',
    STRING = b'S',
    BINSTRING = b'T',
    SHORT_BINSTRING = b'U',
    UNICODE = b'V',
    BINUNICODE = b'X',
    APPEND = b'a',
    BUILD = b'b',
    GLOBAL = b'c',
    DICT = b'd',
    EMPTY_DICT = b'}',
    APPENDS = b'e',
    GET = b'g',
    BINGET = b'h',
    INST = b'i',
    LONG_BINGET = b'j',
    LIST = b'l',
    EMPTY_LIST = b']',
    OBJ = b'o',
    PUT = b'p',
    BINPUT = b'q',
    LONG_BINPUT = b'r',
    SETITEM = b's',
    TUPLE = b't',
    EMPTY_TUPLE = b')',
    SETITEMS = b'u',
    BINFLOAT = b'G',
    PROTO = 0x80,
    NEWOBJ = 0x81,
    EXT1 = 0x82,
    EXT2 = 0x83,
    EXT4 = 0x84,
    TUPLE1 = 0x85,
    TUPLE2 = 0x86,
    TUPLE3 = 0x87,
    NEWTRUE = 0x88,
    NEWFALSE = 0x89,
    LONG1 = 0x8a,
    LONG4 = 0x8b,
    BINBYTES = b'B',
    SHORT_BINBYTES = b'C',
    SHORT_BINUNICODE = 0x8c,
    BINUNICODE8 = 0x8d,
    BINBYTES8 = 0x8e,
    EMPTY_SET = 0x8f,
    ADDITEMS = 0x90,
    FROZENSET = 0x91,
    NEWOBJ_EX = 0x92,
    STACK_GLOBAL = 0x93,
    MEMOIZE = 0x94,
    FRAME = 0x95,
    BYTEARRAY8 = 0x96,
    NEXT_BUFFER = 0x97,
    READONLY_BUFFER = 0x98,
}

#[cfg(test)]
mod tests {
    use super::super::view::{KeyMemo, Val};
    use super::*;

    /// `pickle.dumps(SAMPLE, protocol=p)` for p = 0 to 5, written by CPython 3.
    const SAMPLES: [&[u8]; 6] = [
        b"(dp0\nVa\np1\n(lp2\nI1\naI-2\naF3.5\naVx\xe9\np3\nac_codecs\nencode\np4\n(Vy\np5\nVlatin1\np6\ntp7\nRp8\naNaI01\naI00\na(I1\nI2\ntp9\naL1180591620717411303424L\naL-1180591620717411303424L\naL1606938044258990275541962092341162602522202993782792835301376L\naL-1606938044258990275541962092341162602522202993782792835301376L\naI65535\naL2147483648L\naI-2147483648\nasVb\np10\n(lp11\nI7\nasVc\np12\ng11\nsVs\np13\nc__builtin__\nset\np14\n((lp15\nI1\naI2\natp16\nRp17\nsVf\np18\nc__builtin__\nfrozenset\np19\n((lp20\nI3\natp21\nRp22\nsVba\np23\nc__builtin__\nbytearray\np24\n(g4\n(Vz\np25\ng6\ntp26\nRp27\ntp28\nRp29\ns.",
        b"}q\x00(X\x01\x00\x00\x00aq\x01]q\x02(K\x01J\xfe\xff\xff\xffG@\x0c\x00\x00\x00\x00\x00\x00X\x03\x00\x00\x00x\xc3\xa9q\x03c_codecs\nencode\nq\x04(X\x01\x00\x00\x00yq\x05X\x06\x00\x00\x00latin1q\x06tq\x07Rq\x08NI01\nI00\n(K\x01K\x02tq\x09L1180591620717411303424L\nL-1180591620717411303424L\nL1606938044258990275541962092341162602522202993782792835301376L\nL-1606938044258990275541962092341162602522202993782792835301376L\nM\xff\xffL2147483648L\nJ\x00\x00\x00\x80eX\x01\x00\x00\x00bq\n]q\x0bK\x07aX\x01\x00\x00\x00cq\x0ch\x0bX\x01\x00\x00\x00sq\x0dc__builtin__\nset\nq\x0e(]q\x0f(K\x01K\x02etq\x10Rq\x11X\x01\x00\x00\x00fq\x12c__builtin__\nfrozenset\nq\x13(]q\x14K\x03atq\x15Rq\x16X\x02\x00\x00\x00baq\x17c__builtin__\nbytearray\nq\x18(h\x04(X\x01\x00\x00\x00zq\x19h\x06tq\x1aRq\x1btq\x1cRq\x1du.",
        b"\x80\x02}q\x00(X\x01\x00\x00\x00aq\x01]q\x02(K\x01J\xfe\xff\xff\xffG@\x0c\x00\x00\x00\x00\x00\x00X\x03\x00\x00\x00x\xc3\xa9q\x03c_codecs\nencode\nq\x04X\x01\x00\x00\x00yq\x05X\x06\x00\x00\x00latin1q\x06\x86q\x07Rq\x08N\x88\x89K\x01K\x02\x86q\x09\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x00@\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x00\xc0\x8a\x1a\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x01\x8a\x1a\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\xffM\xff\xff\x8a\x05\x00\x00\x00\x80\x00J\x00\x00\x00\x80eX\x01\x00\x00\x00bq\n]q\x0bK\x07aX\x01\x00\x00\x00cq\x0ch\x0bX\x01\x00\x00\x00sq\x0dc__builtin__\nset\nq\x0e]q\x0f(K\x01K\x02e\x85q\x10Rq\x11X\x01\x00\x00\x00fq\x12c__builtin__\nfrozenset\nq\x13]q\x14K\x03a\x85q\x15Rq\x16X\x02\x00\x00\x00baq\x17c__builtin__\nbytearray\nq\x18h\x04X\x01\x00\x00\x00zq\x19h\x06\x86q\x1aRq\x1b\x85q\x1cRq\x1du.",
        b"\x80\x03}q\x00(X\x01\x00\x00\x00aq\x01]q\x02(K\x01J\xfe\xff\xff\xffG@\x0c\x00\x00\x00\x00\x00\x00X\x03\x00\x00\x00x\xc3\xa9q\x03C\x01yq\x04N\x88\x89K\x01K\x02\x86q\x05\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x00@\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x00\xc0\x8a\x1a\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x01\x8a\x1a\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\xffM\xff\xff\x8a\x05\x00\x00\x00\x80\x00J\x00\x00\x00\x80eX\x01\x00\x00\x00bq\x06]q\x07K\x07aX\x01\x00\x00\x00cq\x08h\x07X\x01\x00\x00\x00sq\x09cbuiltins\nset\nq\n]q\x0b(K\x01K\x02e\x85q\x0cRq\x0dX\x01\x00\x00\x00fq\x0ecbuiltins\nfrozenset\nq\x0f]q\x10K\x03a\x85q\x11Rq\x12X\x02\x00\x00\x00baq\x13cbuiltins\nbytearray\nq\x14C\x01zq\x15\x85q\x16Rq\x17u.",
        b"\x80\x04\x95\xd7\x00\x00\x00\x00\x00\x00\x00}\x94(\x8c\x01a\x94]\x94(K\x01J\xfe\xff\xff\xffG@\x0c\x00\x00\x00\x00\x00\x00\x8c\x03x\xc3\xa9\x94C\x01y\x94N\x88\x89K\x01K\x02\x86\x94\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x00@\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x00\xc0\x8a\x1a\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x01\x8a\x1a\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\xffM\xff\xff\x8a\x05\x00\x00\x00\x80\x00J\x00\x00\x00\x80e\x8c\x01b\x94]\x94K\x07a\x8c\x01c\x94h\x07\x8c\x01s\x94\x8f\x94(K\x01K\x02\x90\x8c\x01f\x94(K\x03\x91\x94\x8c\x02ba\x94\x8c\x08builtins\x94\x8c\x09bytearray\x94\x93\x94C\x01z\x94\x85\x94R\x94u.",
        b"\x80\x05\x95\xc1\x00\x00\x00\x00\x00\x00\x00}\x94(\x8c\x01a\x94]\x94(K\x01J\xfe\xff\xff\xffG@\x0c\x00\x00\x00\x00\x00\x00\x8c\x03x\xc3\xa9\x94C\x01y\x94N\x88\x89K\x01K\x02\x86\x94\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x00@\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x00\xc0\x8a\x1a\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x01\x8a\x1a\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\xffM\xff\xff\x8a\x05\x00\x00\x00\x80\x00J\x00\x00\x00\x80e\x8c\x01b\x94]\x94K\x07a\x8c\x01c\x94h\x07\x8c\x01s\x94\x8f\x94(K\x01K\x02\x90\x8c\x01f\x94(K\x03\x91\x94\x8c\x02ba\x94\x96\x01\x00\x00\x00\x00\x00\x00\x00z\x94u.",
    ];

    /// What every sample holds, as `repr` below writes it. `SAMPLE` is
    /// `{'a': [1, -2, 3.5, 'xé', b'y', None, True, False, (1, 2), 2**70, -2**70, 2**200,
    /// -2**200, 65535, 2**31, -2**31], 'b': shared, 'c': shared, 's': {1, 2},
    /// 'f': frozenset({3}), 'ba': bytearray(b'z')}` with `shared = [7]`.
    const SAMPLE: &str = "{'a': [1, -2, 3.5, 'xé', b'y', None, True, False, (1, 2), \
        1180591620717411303424, -1180591620717411303424, huge(1.6069380442589903e60), \
        huge(-1.6069380442589903e60), 65535, 2147483648, -2147483648], 'b': [7], 'c': [7], \
        's': {1, 2}, 'f': frozenset({3}), 'ba': b'z'}";

    /// A Python-like rendering of a value. Recursive, so for small test values only; cut at
    /// depth 16 (mutated inputs can hold cycles).
    fn repr(v: Val<'_>) -> String {
        repr_at(v, 0)
    }

    fn repr_at(v: Val<'_>, depth: usize) -> String {
        if depth > 16 {
            return "...".to_string();
        }
        let p = v.pickle;
        let join = |ids: &[u32]| {
            ids.iter()
                .map(|&id| repr_at(Val { pickle: p, id }, depth + 1))
                .collect::<Vec<_>>()
                .join(", ")
        };
        match p.node(v.id) {
            Node::None | Node::Global(_) => "None".to_string(),
            Node::Object(name) => match p.names.get(name as usize) {
                Some(global) => format!("object({global})"),
                None => "object(?)".to_string(),
            },
            Node::Bool(b) => if b { "True" } else { "False" }.to_string(),
            Node::Int(i) => i.to_string(),
            Node::Wide(w) => p.wide[w as usize].to_string(),
            Node::Huge(f) => format!("huge({f:e})"),
            Node::Float(f) => format!("{f:?}"),
            Node::Str { .. } => format!("'{}'", v.as_str().unwrap()),
            node @ Node::Bytes { .. } => {
                format!(
                    "b'{}'",
                    String::from_utf8_lossy(p.payload_of(node).unwrap())
                )
            }
            Node::Seq { kind, index } => {
                let items = p.seq(index);
                match kind {
                    SeqKind::List => format!("[{}]", join(items)),
                    SeqKind::Tuple => format!("({})", join(items)),
                    SeqKind::Set => format!("{{{}}}", join(items)),
                    SeqKind::FrozenSet => format!("frozenset({{{}}})", join(items)),
                    SeqKind::Dict => {
                        let pairs: Vec<String> = items
                            .chunks_exact(2)
                            .map(|kv| format!("{}: {}", join(&kv[..1]), join(&kv[1..])))
                            .collect();
                        format!("{{{}}}", pairs.join(", "))
                    }
                }
            }
        }
    }

    /// Read as a file is, its size known (room made up front).
    fn read_bytes(bytes: &[u8]) -> Result<Pickle, PickleError> {
        read_with(bytes, Limits::UNTRUSTED)
    }

    fn read_with(bytes: &[u8], limits: Limits) -> Result<Pickle, PickleError> {
        read(&mut &bytes[..], &limits, Some(bytes.len() as u64))
    }

    /// Protocol 4: `body` between PROTO and STOP.
    fn p4(body: &[u8]) -> Vec<u8> {
        [&[0x80, 4][..], body, b"."].concat()
    }

    #[test]
    fn every_protocol_reads_the_same_values() {
        for (protocol, bytes) in SAMPLES.iter().enumerate() {
            let p = read_bytes(bytes).unwrap_or_else(|e| panic!("protocol {protocol}: {e}"));
            assert_eq!(repr(p.root()), SAMPLE, "protocol {protocol}");
            // The list under 'b' and 'c' is one object, stored once.
            let root = p.root();
            let (b, c) = (
                root.get("b").unwrap().unwrap(),
                root.get("c").unwrap().unwrap(),
            );
            assert_eq!(b.id, c.id, "protocol {protocol}");
        }
    }

    #[test]
    fn accessors_read_like_the_reader_before() {
        let p = read_bytes(SAMPLES[4]).unwrap();
        let a = p.root().get("a").unwrap().unwrap().as_list().unwrap();
        let items: Vec<Val<'_>> = a.iter().map(Result::unwrap).collect();
        assert_eq!(a.len(), 16);
        assert_eq!(items[0].as_u64(), Some(1));
        assert_eq!(items[1].as_u64(), None, "negative");
        assert_eq!(items[1].as_f64(), Some(-2.0));
        assert_eq!(items[2].as_f64(), Some(3.5));
        assert_eq!(items[2].as_u64(), None, "a float is not an integer");
        assert_eq!(items[3].as_str(), Some("xé"));
        assert_eq!(
            items[4].as_str(),
            Some("y"),
            "bytes that are UTF-8 read as text"
        );
        assert_eq!((items[6].as_u64(), items[7].as_u64()), (Some(1), Some(0)));
        assert_eq!(items[6].as_f64(), None, "a bool is not a number");
        assert!(items[8].as_list().is_some(), "a tuple reads as a list");
        assert_eq!(items[9].as_u64(), None, "2**70 does not fit");
        assert_eq!(items[9].as_f64(), Some(2f64.powi(70)));
        assert_eq!(items[11].as_f64(), Some(2f64.powi(200)));
        assert_eq!(items[14].as_u64(), Some(1 << 31));
        assert!(p.root().get("s").unwrap().unwrap().as_list().is_none());
        assert!(p.root().get("missing").unwrap().is_none());
        assert!(items[0].get("a").unwrap().is_none(), "get on a non-dict");
    }

    #[test]
    fn wide_integers_are_normalised() {
        // LONG1 with redundant sign bytes: 1, -1, 2**64 - 1 (fits u64), 2**63.
        let cases: [(&[u8], Option<u64>, f64); 5] = [
            (
                &[1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
                Some(1),
                1.0,
            ),
            (&[0xff; 20], None, -1.0),
            (
                &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0],
                Some(u64::MAX),
                1.8446744073709552e19,
            ),
            (
                &[0, 0, 0, 0, 0, 0, 0, 0x80, 0],
                Some(1 << 63),
                9.223372036854776e18,
            ),
            (&[], Some(0), 0.0),
        ];
        for (bytes, as_u64, as_f64) in cases {
            let body = [&[0x8a, bytes.len() as u8][..], bytes].concat();
            let p = read_bytes(&p4(&body)).unwrap();
            assert_eq!(p.root().as_u64(), as_u64, "{bytes:?}");
            assert_eq!(p.root().as_f64(), Some(as_f64), "{bytes:?}");
        }
        // Text LONG beyond 128 bits.
        let p = read_bytes(&p4(b"L-340282366920938463463374607431768211456L\n")).unwrap();
        assert_eq!(p.root().as_f64(), Some(-(2f64.powi(128))));
        assert_eq!(p.root().as_u64(), None);
    }

    #[test]
    fn text_keys_win_over_bytes_keys_and_the_last_duplicate_wins() {
        // {b'a': 1, 'a': 2, 'a': 3, b'a': 4} and {b'k': 5, b'k': 6}
        let p = read_bytes(&p4(
            b"}(C\x01aK\x01\x8c\x01aK\x02\x8c\x01aK\x03C\x01aK\x04u",
        ))
        .unwrap();
        assert_eq!(p.root().get("a").unwrap().unwrap().as_u64(), Some(3));
        let p = read_bytes(&p4(b"}(C\x01kK\x05C\x01kK\x06u")).unwrap();
        assert_eq!(p.root().get("k").unwrap().unwrap().as_u64(), Some(6));
    }

    #[test]
    fn shared_values_are_stored_once() {
        // None, then DUP + TUPLE2 64 times: 2**64 leaves to a copying reader.
        let body: Vec<u8> = std::iter::once(b'N')
            .chain(std::iter::repeat([b'2', 0x86]).take(64).flatten())
            .collect();
        let p = read_bytes(&p4(&body)).unwrap();
        let f = p.figures();
        assert_eq!((f.nodes, f.used.values, f.used.containers), (65, 129, 64));
    }

    #[test]
    fn deep_nesting_uses_no_stack() {
        // A million nested one-tuples and a million nested lists, read and dropped in a
        // test thread (2 MiB of stack): nothing recurses.
        // (Past the limit on containers, which bounds depth for untrusted files.)
        let limits = Limits {
            containers: 2_000_000,
            ..Limits::UNTRUSTED
        };
        let tuples = [&b"N"[..], &vec![0x85; 1_000_000]].concat();
        let p = read_with(&p4(&tuples), limits).unwrap();
        assert_eq!(p.figures().nodes, 1_000_001);
        drop(p);
        let lists = [vec![b']'; 1_000_000], vec![b'a'; 999_999]].concat();
        let p = read_with(&p4(&lists), limits).unwrap();
        assert_eq!(p.figures().used.containers, 1_000_000);
        let mut v = p.root();
        let mut depth = 1;
        while let Some(inner) = v.as_list().and_then(|l| l.iter().next()) {
            v = inner.unwrap();
            depth += 1;
        }
        assert_eq!(depth, 1_000_000);
    }

    fn tiny() -> Limits {
        Limits {
            input_bytes: 1000,
            values: 10,
            containers: 3,
            memo_entries: 2,
            payload_bytes: 16,
            open_marks: 2,
            walk_steps: 4,
        }
    }

    /// Each limit, just exceeded: the limit, the value reached and the opcode's offset.
    #[test]
    fn each_limit_names_itself_the_value_and_the_offset() {
        let cases: Vec<(Vec<u8>, Limit, u64, Option<u64>)> = vec![
            (p4(&[b'N'; 11]), Limit::Values, 11, Some(12)),
            (p4(b"N2222222222"), Limit::Values, 11, Some(12)),
            (p4(b"]]]]"), Limit::Containers, 4, Some(5)),
            (p4(b"N\x94\x94\x94"), Limit::MemoEntries, 3, Some(5)),
            // Re-storing an entry does not add one.
            (
                p4(b"Nq\x00q\x00q\x01q\x00q\x02"),
                Limit::MemoEntries,
                3,
                Some(11),
            ),
            (p4(b"((("), Limit::OpenMarks, 3, Some(4)),
            // The MEMOIZE and MARK run in line after a new container stop at the same limits.
            (p4(b"]\x94]\x94]\x94"), Limit::MemoEntries, 3, Some(7)),
            (p4(b"((}\x94("), Limit::OpenMarks, 3, Some(6)),
            (
                p4(b"\x8c\x11aaaaaaaaaaaaaaaaa"),
                Limit::PayloadBytes,
                17,
                Some(2),
            ),
            (
                p4(b"\x8c\x08aaaaaaaa\x8c\x09aaaaaaaaa"),
                Limit::PayloadBytes,
                17,
                Some(12),
            ),
            (
                p4(b"\x8d\xff\xff\xff\xff\xff\xff\xff\xff"),
                Limit::PayloadBytes,
                u64::MAX,
                Some(2),
            ),
            (
                p4(b"Vaaaaaaaaaaaaaaaaaaaa\n"),
                Limit::PayloadBytes,
                21,
                Some(2),
            ),
            (p4(b"\x8a\x11"), Limit::PayloadBytes, 17, Some(2)),
            (p4(&b"N0".repeat(600)), Limit::Values, 11, Some(22)),
            (
                [&[0x80, 4][..], &[0x95, 0, 0, 0, 0, 0, 0, 0, 0].repeat(200)].concat(),
                Limit::InputBytes,
                1002,
                Some(1001),
            ),
            // set(list) copies the list: its items count as values pushed.
            (
                p4(b"c__builtin__\nset\n](NNNNNNe\x85R"),
                Limit::Values,
                15,
                Some(29),
            ),
        ];
        for (bytes, limit, reached, offset) in cases {
            let e = read_with(&bytes, tiny()).unwrap_err();
            assert_eq!(
                e,
                PickleError::Limit {
                    limit,
                    reached,
                    max: tiny().of(limit),
                    offset
                },
                "{bytes:?}"
            );
            let message = e.to_string();
            assert!(message.contains(limit.name()), "{message}");
        }
    }

    /// `REDUCE` reads its arguments in place: a 200,000-item tuple called 200,000 times is
    /// 4·10¹⁰ item copies to a reader that copies the tuple each time.
    #[test]
    fn reduce_does_not_copy_its_arguments() {
        let mut body = b"cfoo\nbar\nq\x00(".to_vec();
        body.resize(body.len() + 200_000, b'N');
        body.extend(b"tq\x01");
        for _ in 0..200_000 {
            body.extend(b"h\x00h\x01R0");
        }
        body.extend(b"00)");
        let p = read_bytes(&p4(&body)).unwrap();
        assert_eq!(repr(p.root()), "()");
        assert_eq!(p.figures().used.values, 1 + 200_000 + 1 + 3 * 200_000 + 1);
    }

    #[test]
    fn the_walk_counts_its_steps() {
        let p = read_with(&p4(b"](K\x01K\x02K\x03K\x04K\x05e"), tiny()).unwrap();
        let list = p.root().as_list().unwrap();
        let got: Vec<_> = list.iter().collect();
        assert_eq!(got.len(), 5, "four items, then the error, then nothing");
        assert!(got[..4].iter().all(Result::is_ok));
        assert_eq!(
            got[4].as_ref().unwrap_err(),
            &PickleError::Limit {
                limit: Limit::WalkSteps,
                reached: 5,
                max: 4,
                offset: None
            }
        );
        assert!(p.walk_steps() >= 5);
    }

    #[test]
    fn malformed_input_says_what_and_where() {
        let cases: [(&[u8], &str); 13] = [
            (b"", "ends before the end of the pickle"),
            (
                b"\x80\x04\x95\x10\x00",
                "ends inside opcode FRAME (0x95) at byte 2",
            ),
            (
                b"\x80\x04N",
                "ends before the end of the pickle (no STOP) at byte 3",
            ),
            (b"\x80\x04\xff.", "unknown opcode 0xff at byte 2"),
            (b"\x80\x04Q.", "unsupported opcode BINPERSID (0x51)"),
            (b"\x80\x04\x82\x01.", "unsupported opcode EXT1 (0x82)"),
            (
                b"\x80\x04.",
                "stack underflow in opcode STOP (0x2e) at byte 2",
            ),
            (b"\x80\x04(N\x86.", "stack underflow in opcode TUPLE2"),
            (
                b"\x80\x04Nt.",
                "opcode TUPLE (0x74) without a MARK at byte 3",
            ),
            (
                b"\x80\x04NNa.",
                "opcode APPEND (0x61) on a stack top that is not a list",
            ),
            (
                b"\x80\x04j\x00\x00\x00\x01.",
                "memo entry 16777216 is read before it is stored",
            ),
            (
                b"\x80\x04T\xff\xff\xff\xff.",
                "negative length -1 at byte 2",
            ),
            (b"\x80\x04Sabc\\q\n.", "a STRING argument with a bad escape"),
        ];
        for (bytes, expected) in cases {
            let e = read_bytes(bytes).unwrap_err();
            assert!(
                matches!(e, PickleError::Malformed { .. }),
                "{bytes:?}: {e:?}"
            );
            assert!(
                e.to_string().contains(expected),
                "{bytes:?}: {e} lacks {expected:?}"
            );
        }
    }

    #[test]
    fn python_quirks_are_kept() {
        // POP with nothing above the mark pops the mark; INT 01 is True; a dangling dict
        // key is dropped; BUILD replaces an instance by its state; a call of a global the
        // reader does not evaluate is an opaque object (no value a reader takes: None's).
        let p = read_bytes(&p4(b"(0I01\n")).unwrap();
        assert_eq!(repr(p.root()), "True");
        let p = read_bytes(&p4(b"(K\x01K\x02K\x03d")).unwrap();
        assert_eq!(repr(p.root()), "{1: 2}");
        let p = read_bytes(&p4(b"cfoo\nBar\n)\x81}(K\x01K\x02ub")).unwrap();
        assert_eq!(repr(p.root()), "{1: 2}");
        let p = read_bytes(&p4(b"cfoo\nBar\n)R")).unwrap();
        assert_eq!(repr(p.root()), "object(foo.Bar)");
        let root = p.root();
        assert!(root.as_str().is_none() && root.as_u64().is_none() && root.as_list().is_none());
        assert!(!root.is_dict());
        let p = read_bytes(&p4(b"Sa\\x41\\n'\n")).unwrap();
        assert_eq!(repr(p.root()), "b'aA\n''");
        let p = read_bytes(&p4(b"V\\u00e9\\U0001F600\n")).unwrap();
        assert_eq!(p.root().as_str(), Some("é😀"));
    }

    /// Dicts read one after another with one [`KeyMemo`] give what [`Val::get_all`] gives
    /// each: the same key objects at the same positions (remembered), swapped (not), a bytes
    /// key before a text one, a duplicate key, and another set of keys with a fresh memo.
    #[test]
    fn a_key_memo_changes_no_answer() {
        let p = read_bytes(&p4(
            b"](}(X\x01\x00\x00\x00aq\x00K\x01X\x01\x00\x00\x00bq\x01K\x02u}(h\x00K\x03h\x01K\x04u\
              }(h\x01K\x05h\x00K\x06u}(C\x01aK\x07h\x00K\x08u}(h\x00K\x09h\x00K\x0aue",
        ))
        .unwrap();
        let dicts: Vec<Val<'_>> = p
            .root()
            .as_list()
            .unwrap()
            .iter()
            .collect::<Result<_, _>>()
            .unwrap();
        let ints = |vals: [Option<Val<'_>>; 2]| vals.map(|v| v.and_then(Val::as_u64));
        let want = [
            [Some(1), Some(2)],
            [Some(3), Some(4)],
            [Some(6), Some(5)],
            [Some(8), None],
            [Some(10), None],
        ];
        for _ in 0..2 {
            let mut memo = KeyMemo::default();
            for (d, want) in dicts.iter().zip(want) {
                let with_memo = ints(d.get_all_with(["a", "b"], &mut memo).unwrap());
                assert_eq!(with_memo, ints(d.get_all(["a", "b"]).unwrap()));
                assert_eq!(with_memo, want);
            }
        }
        let mut memo = KeyMemo::default();
        let bs: Vec<_> = dicts
            .iter()
            .map(|d| ints(d.get_all_with(["b", "zz"], &mut memo).unwrap())[0])
            .collect();
        assert_eq!(bs, [Some(2), Some(4), Some(5), None, None]);
    }

    proptest::proptest! {
        /// Up to 16 bytes read as the little-endian two's-complement integer they spell:
        /// the bytes sign-extended to 16 and read by `i128::from_le_bytes`.
        #[test]
        fn twos_complement_matches_sign_extension(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..=16),
        ) {
            let fill = if bytes.last().is_some_and(|b| b & 0x80 != 0) { 0xff } else { 0 };
            let mut wide = [fill; 16];
            wide[..bytes.len()].copy_from_slice(&bytes);
            proptest::prop_assert_eq!(twos_complement(&bytes), Ok(i128::from_le_bytes(wide)));
        }
    }

    /// One step of the model-based test of [`Seqs`].
    #[derive(Debug, Clone)]
    enum SeqsStep {
        /// A new container with these items.
        Push(Vec<u32>),
        /// A new container copying container `i % len`.
        Copy(usize),
        /// Container `i % len` extended with these items.
        Extend(usize, Vec<u32>),
    }

    fn seqs_step() -> impl proptest::strategy::Strategy<Value = SeqsStep> {
        use proptest::prelude::*;
        let items = || proptest::collection::vec(any::<u32>(), 0..12);
        prop_oneof![
            1 => items().prop_map(SeqsStep::Push),
            1 => any::<usize>().prop_map(SeqsStep::Copy),
            3 => (any::<usize>(), items()).prop_map(|(i, v)| SeqsStep::Extend(i, v)),
        ]
    }

    proptest::proptest! {
        /// The arena holds what a `Vec` per container would, whatever the order in which
        /// containers are made and extended, within four slots per item; its invariants hold
        /// after every step.
        #[test]
        fn seqs_match_a_vec_per_container(
            steps in proptest::collection::vec(seqs_step(), 0..200),
            room in 0usize..64,
        ) {
            let mut seqs = Seqs::with_capacity(room, room);
            let mut model: Vec<Vec<u32>> = Vec::new();
            for step in steps {
                match step {
                    SeqsStep::Push(items) => {
                        let index = seqs.push(&items).unwrap();
                        proptest::prop_assert_eq!(index as usize, model.len());
                        model.push(items);
                    }
                    SeqsStep::Copy(i) if !model.is_empty() => {
                        let i = i % model.len();
                        let index = seqs.push_copy(i as u32).unwrap();
                        proptest::prop_assert_eq!(index as usize, model.len());
                        model.push(model[i].clone());
                    }
                    SeqsStep::Extend(i, items) if !model.is_empty() => {
                        let i = i % model.len();
                        seqs.extend(i, &items).unwrap();
                        model[i].extend_from_slice(&items);
                    }
                    SeqsStep::Copy(_) | SeqsStep::Extend(..) => {}
                }
                if let Err(e) = seqs.check_invariants() {
                    return Err(proptest::test_runner::TestCaseError::fail(e));
                }
                proptest::prop_assert_eq!(seqs.len(), model.len());
                for (i, items) in model.iter().enumerate() {
                    proptest::prop_assert_eq!(seqs.get(i as u32), items.as_slice());
                }
                let total: usize = model.iter().map(Vec::len).sum();
                proptest::prop_assert!(seqs.items.len() <= 4 * total);
            }
            proptest::prop_assert_eq!(seqs.get(model.len() as u32), &[] as &[u32]);
        }
    }

    /// Containers filled in batches with others made in between (a list longer than the
    /// pickler's batch of 1000, the items of a dict after its nested lists) hold their items
    /// in order, and room made from the input's size, too small, absent or too large, changes
    /// nothing.
    #[test]
    fn batched_containers_and_any_room_read_the_same() {
        // The outer list gets a first batch ([1, 2]), then a second made after other
        // containers were filled ([3], and a dict filled after its list [4, 5]).
        let body = b"](](K\x01K\x02ee(](K\x03e}(X\x01\x00\x00\x00a](K\x04K\x05eue";
        let bytes = p4(body);
        let want = "[[1, 2], [3], {'a': [4, 5]}]";
        for size in [None, Some(0), Some(bytes.len() as u64), Some(1 << 40)] {
            let p = read(&mut &bytes[..], &Limits::UNTRUSTED, size).unwrap();
            assert_eq!(repr(p.root()), want, "size {size:?}");
            p.seqs.check_invariants().unwrap();
        }
    }

    /// Every prefix and many one-byte changes of a real-looking pickle: a value or an error,
    /// never a panic.
    #[test]
    fn truncated_and_mutated_samples_never_panic() {
        for bytes in SAMPLES {
            for n in 0..bytes.len() {
                assert!(read_bytes(&bytes[..n]).is_err(), "prefix {n} of {bytes:?}");
            }
            for i in 0..bytes.len() {
                for b in [0x00, 0x28, 0x2e, 0x32, 0x7f, 0x80, 0x86, 0x94, 0xff] {
                    let mut m = bytes.to_vec();
                    m[i] = b;
                    if let Ok(p) = read_with(&m, tiny()) {
                        let _ = repr(p.root());
                    }
                }
            }
        }
    }

    /// A global's name in a message is cut to [`GLOBAL_NAME_CHARS`] characters with its full
    /// length, its control characters escaped, whatever the length of what it is cut from
    /// (a memo get pushes a 16 MiB string again for free: the name is read no further than
    /// it is shown).
    #[test]
    fn global_names_are_cut_and_escaped() {
        assert_eq!(global_name(b"collections", b"deque"), "collections.deque");
        assert_eq!(global_name(b"a\x1bb", b"c\x07"), "a\\u{1b}b.c\\u{7}");
        let long = vec![b'm'; 16 << 20];
        let shown = global_name(&long, b"deque");
        assert_eq!(
            shown,
            format!(
                "{}… ({} bytes)",
                "m".repeat(GLOBAL_NAME_CHARS),
                (16 << 20) + 6
            )
        );
        // Cut inside a character of 4 bytes: replaced, never split.
        let emoji = "\u{1f600}".repeat(400);
        let shown = global_name(emoji.as_bytes(), b"x");
        assert!(
            shown.starts_with(&"\u{1f600}".repeat(GLOBAL_NAME_CHARS)),
            "{shown}"
        );
        assert!(
            shown.ends_with(&format!("… ({} bytes)", emoji.len() + 2)),
            "{shown}"
        );
    }

    /// What calling a global made takes the items appended or set to it (a deque's
    /// `APPENDS`, an `OrderedDict`'s `SETITEM`) and drops them, and keeps its global's name,
    /// through a `BUILD` too; an instance takes `APPENDS` (a subclass of list). What is not
    /// such an object is refused as before. (`pickle.dumps([deque([1, 2], maxlen=5),
    /// deque([3])], protocol=3)`, written by CPython 3.11.)
    #[test]
    fn objects_made_by_globals_take_items() {
        let deques = b"\x80\x03]q\x00(ccollections\ndeque\nq\x01)K\x05\x86q\x02Rq\x03(K\x01K\x02eh\x01)Rq\x04K\x03ae.";
        let p = read_bytes(deques).unwrap();
        assert_eq!(
            repr(p.root()),
            "[object(collections.deque), object(collections.deque)]"
        );
        assert_eq!(p.root_global(), None);
        let cases: [(&[u8], &str); 4] = [
            (
                b"ccollections\nOrderedDict\n)R(X\x01\x00\x00\x00aK\x01u",
                "object(collections.OrderedDict)",
            ),
            (b"cfoo\nBar\n)R}(K\x01K\x02ub", "object(foo.Bar)"),
            (b"](cfoo\nBar\n)RK\x01ae", "[object(foo.Bar)]"),
            (b"cfoo\nBar\n)\x81(K\x01K\x02e", "{}"),
        ];
        for (body, want) in cases {
            let p = read_bytes(&p4(body)).unwrap_or_else(|e| panic!("{body:?}: {e}"));
            assert_eq!(repr(p.root()), want, "{body:?}");
        }
        for body in [&b"cfoo\nBar\nNa"[..], b"cfoo\nBar\n(Ne", b"}(Ne"] {
            let e = read_bytes(&p4(body)).unwrap_err();
            assert!(
                e.to_string().contains("on a stack top that is not a list"),
                "{body:?}: {e}"
            );
        }
    }

    /// Naming globals costs bounded memory: of 100 distinct globals, the first
    /// [`NAMES_KEPT`] are named, the others read as objects with no name.
    #[test]
    fn global_names_kept_are_bounded() {
        let mut body = b"](".to_vec();
        for i in 0..100 {
            body.extend(format!("cm{i}\nf\n)R").as_bytes());
        }
        body.push(b'e');
        let p = read_bytes(&p4(&body)).unwrap();
        assert_eq!(p.names.len(), NAMES_KEPT);
        let items = p.root().as_list().unwrap();
        let named: Vec<Option<&str>> = items.iter().map(|v| v.unwrap().made_by()).collect();
        assert_eq!(named[0], Some("m0.f"));
        assert_eq!(named[NAMES_KEPT - 1], Some("m63.f"));
        assert_eq!(named[NAMES_KEPT], None);
    }

    /// What follows a STOP is told: nothing; whitespace only (counted); another pickle when
    /// the bytes read as one to a STOP of their own (protocol 4, protocol 0 with no PROTO,
    /// after a newline); other bytes otherwise, a PROTO followed by no whole pickle among
    /// them (`\x80\x04junk`, a second pickle cut short, a PROTO of no protocol). Where it
    /// starts is the offset after the whitespace.
    #[test]
    fn what_follows_a_stop_is_told() {
        // `\x80\x04}(`, `\x8c\x08segments`, `]`, `\x8c\x0ddevice_traces`, `]`, `u`, `.`:
        // 4 + 10 + 1 + 15 + 1 + 1 + 1 = 33 bytes.
        let snapshot = b"\x80\x04}(\x8c\x08segments]\x8c\x0ddevice_traces]u.";
        let cases = [
            (b"\x80\x04N.".to_vec(), 4, After::Nothing),
            (b"\x80\x04N.\n".to_vec(), 4, After::Whitespace { bytes: 1 }),
            (
                b"\x80\x04N. \t\r\n\x0b\x0c".to_vec(),
                4,
                After::Whitespace { bytes: 6 },
            ),
            (
                b"\x80\x04N.\x80\x04N.".to_vec(),
                4,
                After::Pickle { start: 4 },
            ),
            (b"N.(lp0\nI1\na.".to_vec(), 2, After::Pickle { start: 2 }),
            (
                b"\x80\x04N.\n\x80\x04N.".to_vec(),
                4,
                After::Pickle { start: 5 },
            ),
            (
                [&snapshot[..], b"\x80\x05N."].concat(),
                33,
                After::Pickle { start: 33 },
            ),
            (b"\x80\x04N.\x00".to_vec(), 4, After::Bytes { start: 4 }),
            (b"\x80\x04N.N".to_vec(), 4, After::Bytes { start: 4 }),
            (b"\x80\x04N.\x80\x07".to_vec(), 4, After::Bytes { start: 4 }),
            (
                b"\x80\x04N.\x80\x04junk".to_vec(),
                4,
                After::Bytes { start: 4 },
            ),
            (
                b"\x80\x04N.\n\x80\x04]".to_vec(),
                4,
                After::Bytes { start: 5 },
            ),
            (
                [&snapshot[..], &snapshot[..20]].concat(),
                33,
                After::Bytes { start: 33 },
            ),
        ];
        for (bytes, end, after) in cases {
            let p = read_bytes(&bytes).unwrap_or_else(|e| panic!("{bytes:?}: {e}"));
            assert_eq!((p.stop_end(), p.after()), (end, after), "{bytes:?}");
        }
    }

    /// Whitespace after the STOP counts towards the limit on input bytes.
    #[test]
    fn whitespace_after_a_stop_is_bounded() {
        let limits = Limits {
            input_bytes: 10,
            ..Limits::UNTRUSTED
        };
        let bytes = [&b"\x80\x04N."[..], &[b' '; 7]].concat();
        assert!(matches!(
            read_with(&bytes, limits),
            Err(PickleError::Limit {
                limit: Limit::InputBytes,
                ..
            })
        ));
        let p = read_with(&bytes[..10], limits).unwrap();
        assert_eq!(p.after(), After::Whitespace { bytes: 6 });
    }

    /// The global the root is built from is known after the read, through a call, an
    /// instance and its state; plain data has none. (`pickle.dumps(collections.deque(),
    /// protocol=4)` and `pickle.dumps({}, protocol=4)`, written by CPython 3.)
    #[test]
    fn the_roots_global_is_named() {
        let deque = b"\x80\x04\x95\x1c\x00\x00\x00\x00\x00\x00\x00\x8c\x0bcollections\x94\x8c\x05deque\x94\x93\x94)R\x94.";
        let p = read(&mut &deque[..], &Limits::UNTRUSTED, None).expect("read");
        assert_eq!(p.root_global(), Some("collections.deque"));
        let dict = b"\x80\x04}\x94.";
        let p = read(&mut &dict[..], &Limits::UNTRUSTED, None).expect("read");
        assert_eq!(p.root_global(), None);
        // A global inside the root (set() of a list) names nothing.
        for sample in SAMPLES {
            let p = read(&mut &sample[..], &Limits::UNTRUSTED, None).expect("read");
            assert_eq!(p.root_global(), None);
        }
    }
}
