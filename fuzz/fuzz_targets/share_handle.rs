//! Hostile share handles: bytes another process (or anyone who can write the channel) sends
//! as a `ShareHandle`. The reader returns, bounded, never panics; what it accepts writes back
//! to the very bytes it read, and names pieces that cover the span.
#![no_main]

use libfuzzer_sys::fuzz_target;
use portalloc::share::{ShareHandle, SharedMemory};

fuzz_target!(|data: &[u8]| {
    // Half the inputs get a valid magic and version, so the fields behind them are reached.
    let mut bytes = data.to_vec();
    if data.first().is_some_and(|b| b & 1 == 1) && bytes.len() >= 12 {
        bytes[..8].copy_from_slice(b"PASHARE\x01");
        bytes[8..12].copy_from_slice(&1u32.to_le_bytes());
    }
    if let Ok(h) = ShareHandle::from_bytes(&bytes) {
        assert_eq!(h.to_bytes(), bytes);
        assert!(h.offset + h.size <= h.span);
        if let SharedMemory::Mapped(pieces) = &h.memory {
            assert_eq!(pieces.iter().map(|p| p.len).sum::<u64>(), h.span);
        }
    }
});
