//! Hostile bytes as a trace: `trace::open_reader` with the format sniffed or forced, strict
//! or tolerant, and every event read. It must never panic, every error must be a
//! `Error::Trace`, and the events it yields must be well formed (sequence numbers
//! increasing).
#![no_main]

use std::io::Cursor;

use libfuzzer_sys::fuzz_target;
use portalloc::trace::{self, Format, Options};
use portalloc::Error;

/// At most this many events are read per input.
const MAX_EVENTS: usize = 100_000;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, bytes)) = data.split_first() else {
        return;
    };
    let mut options = Options::new().with_strict(mode & 0x80 != 0);
    options.format = match mode & 7 {
        0..=2 => None,
        i => Some(Format::ALL[usize::from(i - 3) % Format::ALL.len()]),
    };
    if mode & 0x40 != 0 {
        options.device = Some(u32::from(mode & 0x3));
    }
    let t = match trace::open_reader(Cursor::new(bytes.to_vec()), "fuzz", &options) {
        Ok(t) => t,
        Err(Error::Trace(_)) => return,
        Err(e) => panic!("open_reader: not a trace error: {e:?}"),
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
            Err(Error::Trace(_)) => break,
            Err(e) => panic!("an event: not a trace error: {e:?}"),
        }
    }
});
