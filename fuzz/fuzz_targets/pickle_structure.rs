//! Structure-aware fuzzing of the snapshot pickle reader (issue #12). The input decodes into a
//! pickle program that favours what breaks naive unpicklers: long runs of one opcode (nesting,
//! marks, `DUP`), pairs of opcodes repeated (`DUP` + `TUPLE2` doubling, list-in-list nesting),
//! memo puts and gets that share structure, words and numbers of the snapshot format, and
//! lengths that lie; optionally inside a valid snapshot skeleton, whose `device_traces` then
//! holds what the program built. `trace::open_reader` reads it as a snapshot: it must never
//! panic or crash, every error must be an `Error::Trace` with a bounded message, and the events
//! must be well formed (sequence numbers increasing). Runs stay short: the pickle is cut at
//! `MAX_PICKLE_BYTES` and the reader's own limits bound what it holds.
#![no_main]

use libfuzzer_sys::fuzz_target;
use portalloc::trace::{Format, Options};

mod support;
use support::Bytes;

/// The generated pickle is cut at this size.
const MAX_PICKLE_BYTES: usize = 1 << 20;
/// Longer messages mean an input is being echoed.
const MAX_MESSAGE_BYTES: usize = 1024;

/// Opcodes without arguments: marks and the stack, containers, constants, the memo, calls,
/// STOP. (The seeds in `corpus/pickle_structure/` index this table: append, do not reorder.)
const BARE: &[u8] = &[
    b'(', b'0', b'1', b'2', b'N', 0x88, 0x89, b')', b']', b'}', 0x8f, 0x85, 0x86, 0x87, b't', b'l',
    b'd', 0x91, b'a', b'e', b's', b'u', 0x90, 0x94, b'R', 0x81, 0x92, b'o', b'b', 0x93, b'.',
];

/// Keys and values of the snapshot format, and names of globals the reader evaluates.
const WORDS: &[&str] = &[
    "device_traces",
    "segments",
    "action",
    "alloc",
    "free_completed",
    "free_requested",
    "oom",
    "addr",
    "size",
    "stream",
    "time_us",
    "device",
    "total_size",
    "blocks",
    "state",
    "active_allocated",
    "frames",
    "builtins",
    "set",
];

/// A bare opcode chosen by the next byte.
fn bare(b: &mut Bytes) -> u8 {
    BARE[usize::from(b.byte()) % BARE.len()]
}

fn push_word(out: &mut Vec<u8>, opcode: u8, word: &str) {
    out.push(opcode);
    out.push(u8::try_from(word.len()).unwrap_or(u8::MAX));
    out.extend(word.as_bytes());
}

/// Decodes `data` into (strict, device, pickle).
fn generate(data: &[u8]) -> (bool, Option<u32>, Vec<u8>) {
    let mut b = Bytes(data);
    let mode = b.byte();
    let strict = mode & 1 != 0;
    let wrap = mode & 2 != 0;
    let device = (mode & 4 != 0).then_some(u32::from(mode >> 6));
    let mut body = Vec::new();
    while let Some(tag) = b.u8() {
        if body.len() >= MAX_PICKLE_BYTES {
            break;
        }
        match tag % 8 {
            // One opcode, up to 65,535 times: TUPLE1 nesting, open marks, DUP runs.
            0 | 1 => {
                let op = bare(&mut b);
                let n = usize::from(b.u16());
                body.resize(body.len() + n, op);
            }
            // Two opcodes, up to 65,535 times: DUP + TUPLE2 doubling, EMPTY_LIST + APPEND.
            2 => {
                let (x, y) = (bare(&mut b), bare(&mut b));
                for _ in 0..b.u16() {
                    body.extend([x, y]);
                }
            }
            // The memo: a put or a get of a small id, so that gets often find their entry.
            3 => {
                let id = b.byte() % 16;
                match b.byte() % 4 {
                    0 => body.extend([b'q', id]),
                    1 | 2 => body.extend([b'h', id]),
                    _ => {
                        body.push(b'j');
                        body.extend(u32::from(id).to_le_bytes());
                    }
                }
            }
            // A number: BININT1, BININT, LONG1 of up to 20 bytes, BINFLOAT.
            4 => match b.byte() % 4 {
                0 => body.extend([b'K', b.byte()]),
                1 => {
                    body.push(b'J');
                    body.extend(b.u16().to_le_bytes());
                    body.extend(b.u16().to_le_bytes());
                }
                2 => {
                    let len = b.byte() % 21;
                    body.extend([0x8a, len]);
                    for _ in 0..len {
                        body.push(b.byte());
                    }
                }
                _ => {
                    body.push(b'G');
                    body.extend(f64::from(b.u16()).to_be_bytes());
                }
            },
            // A word of the format, as text (SHORT_BINUNICODE) or bytes (SHORT_BINBYTES).
            5 => {
                let word = WORDS[usize::from(b.byte()) % WORDS.len()];
                let opcode = if b.byte() & 1 == 0 { 0x8c } else { b'C' };
                push_word(&mut body, opcode, word);
            }
            // A length that may lie: BINUNICODE8, BINBYTES8, BYTEARRAY8 (8 bytes), BINUNICODE,
            // BINBYTES, BINSTRING (4 bytes), from the input.
            6 => {
                let (opcode, width) = match b.byte() % 6 {
                    0 => (0x8d, 8),
                    1 => (0x8e, 8),
                    2 => (0x96, 8),
                    3 => (b'X', 4),
                    4 => (b'B', 4),
                    _ => (b'T', 4),
                };
                body.push(opcode);
                for _ in 0..width {
                    body.push(b.byte());
                }
            }
            // Raw bytes: opcodes with arguments, text-protocol lines, bytes that are no opcode.
            _ => {
                let n = b.byte() % 16;
                for _ in 0..=n {
                    body.push(b.u8().unwrap_or(b'\n'));
                }
            }
        }
    }
    body.truncate(MAX_PICKLE_BYTES);
    let mut pickle = vec![0x80, 0x04];
    if wrap {
        // {'device_traces': [<what the body leaves above the mark>]}
        pickle.extend(b"}(");
        push_word(&mut pickle, 0x8c, "device_traces");
        pickle.extend(b"](");
        pickle.extend(&body);
        pickle.extend(b"eu.");
    } else {
        pickle.extend(&body);
        pickle.push(b'.');
    }
    (strict, device, pickle)
}

fuzz_target!(|data: &[u8]| {
    let (strict, device, pickle) = generate(data);
    let mut options = Options::new()
        .with_format(Format::PytorchSnapshot)
        .with_strict(strict);
    options.device = device;
    support::read_trace(pickle, &options, MAX_MESSAGE_BYTES);
});
