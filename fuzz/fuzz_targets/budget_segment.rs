//! Hostile shared-budget segments: the bytes are another process's writes into a segment
//! (a valid header first, so the slot and log readers get past it). The readers must return,
//! bounded, and never panic; a slot they report has a pid matching its owner word and at most
//! the layout's tags and asks.
#![no_main]

use std::sync::atomic::{AtomicU64, Ordering};

use libfuzzer_sys::fuzz_target;
use portalloc::budget::layout;

fuzz_target!(|data: &[u8]| {
    let words: Vec<AtomicU64> = (0..layout::TOTAL_WORDS).map(|_| AtomicU64::new(0)).collect();
    layout::init_header(&words, "fuzz", 1 << 30);
    // The first byte picks where the input lands: over the header too, or past it.
    let start = if data.first().is_some_and(|b| b & 1 == 1) { 0 } else { layout::HEADER_WORDS };
    for (i, chunk) in data.get(1..).unwrap_or(&[]).chunks(8).enumerate() {
        let Some(w) = words.get(start + i) else { break };
        let mut b = [0u8; 8];
        b[..chunk.len()].copy_from_slice(chunk);
        w.store(u64::from_le_bytes(b), Ordering::Relaxed);
    }
    let _ = layout::check_header(&words, "fuzz");
    for i in 0..layout::SLOTS {
        if let Ok(v) = layout::read_slot(&words, i) {
            assert_eq!(u64::from(v.pid), v.owner >> 32);
            assert!(v.tags.len() <= layout::TAGS && v.asks.len() <= layout::ASKS);
            assert!(v.acks.len() <= layout::ACKS);
            let _ = v.report();
        }
    }
    assert!(layout::read_log(&words).len() <= layout::LOG_ENTRIES);
    // Reaping and the member list over the same words: bounded, no panic (pids that exist
    // are read from /proc, others are reaped).
    let _ = portalloc::budget::members(&words);
});
