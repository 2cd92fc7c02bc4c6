//! What the fuzz targets share: a reader of the fuzzer's bytes, and the checks every trace
//! read must pass. Each target uses part of it.
#![allow(dead_code)]

use std::io::Cursor;

use portalloc::trace::{self, Options};

/// At most this many events are read per input.
pub const MAX_EVENTS: usize = 100_000;

/// A little-endian reader that yields zeros when the input runs out.
pub struct Bytes<'a>(pub &'a [u8]);

impl Bytes<'_> {
    /// The next byte; `None` at the end.
    pub fn u8(&mut self) -> Option<u8> {
        let (&b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(b)
    }

    /// The next byte; 0 at the end.
    pub fn byte(&mut self) -> u8 {
        self.u8().unwrap_or(0)
    }

    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.byte(), self.byte()])
    }

    pub fn u64(&mut self) -> u64 {
        (0..8).fold(0u64, |acc, i| acc | u64::from(self.byte()) << (8 * i))
    }
}

/// Opens `bytes` as a trace with `options` and reads up to [`MAX_EVENTS`] events: it must
/// never panic, every error (a `TraceError`) must be at most `max_message_bytes`, and
/// sequence numbers must increase.
pub fn read_trace(bytes: Vec<u8>, options: &Options, max_message_bytes: usize) {
    let check_message = |m: &str| {
        assert!(m.len() <= max_message_bytes, "message of {} bytes", m.len());
    };
    let t = match trace::open_reader(Cursor::new(bytes), "fuzz", options) {
        Ok(t) => t,
        Err(m) => return check_message(m.message()),
    };
    let mut last: Option<u64> = None;
    for event in t.take(MAX_EVENTS) {
        match event {
            Ok(e) => {
                if let Some(prev) = last {
                    assert!(
                        e.seq > prev,
                        "sequence numbers must increase: {prev} then {}",
                        e.seq
                    );
                }
                last = Some(e.seq);
            }
            Err(m) => return check_message(m.message()),
        }
    }
}
