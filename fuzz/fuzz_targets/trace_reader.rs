//! Hostile bytes as a trace: `trace::open_reader` with the format sniffed or forced, strict
//! or tolerant, and every event read. It must never panic, every error must be a
//! `Error::Trace`, and the events it yields must be well formed (sequence numbers
//! increasing).
#![no_main]

use libfuzzer_sys::fuzz_target;
use portalloc::trace::{Format, Options};

mod support;

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
    // Any message length: the formats quote what they could not read.
    support::read_trace(bytes.to_vec(), &options, usize::MAX);
});
