//! Exporters: the own format ([`write_portalloc`], over [`jsonl::Writer`]) and RMM's
//! logging CSV ([`RmmCsvWriter`], [`write_rmm_csv`]).
//!
//! RMM CSV carries `Thread,Time,Action,Pointer,Size,Stream`, so a trace written as RMM CSV
//! and read back keeps: the order of events, `time_ns` (written as decimal seconds with nine
//! fraction digits), `thread`, `stream`, `op`, `size`, and which free ends which
//! allocation. It loses the header (baseline, reference, tags, notes), the tags, and the
//! numbering: `seq` comes back as 0, 1, … and `id` as 1, 2, … in order of allocation (the
//! exporter writes each allocation's id as its `Pointer`). A free of an id never allocated
//! in the trace (memory from before the window) has no meaning without the baseline and is
//! counted as an anomaly on the way back in.

use std::io::{BufWriter, Write};

use super::{jsonl, write_error, Event, Op, TraceHeader};
use crate::trace::Result;

/// Writes `header` and every event of `events` in the own format; returns the number of
/// events written.
///
/// # Errors
/// The first `Err` of `events`, an event the own format refuses (see [`jsonl::Writer`]), or
/// the writer fails.
pub fn write_portalloc<W, I>(out: W, header: &TraceHeader, events: I) -> Result<u64>
where
    W: Write,
    I: IntoIterator<Item = Result<Event>>,
{
    let mut w = jsonl::Writer::new(out, header)?;
    for e in events {
        w.write(&e?)?;
    }
    let n = w.events();
    w.finish()?;
    Ok(n)
}

/// Writes events as RMM's logging CSV.
pub struct RmmCsvWriter<W: Write> {
    out: BufWriter<W>,
    rows: u64,
}

impl<W: Write> std::fmt::Debug for RmmCsvWriter<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RmmCsvWriter")
            .field("rows", &self.rows)
            .finish_non_exhaustive()
    }
}

/// The header row RMM writes.
pub const RMM_CSV_HEADER: &str = "Thread,Time,Action,Pointer,Size,Stream";

impl<W: Write> RmmCsvWriter<W> {
    /// Writes the header row.
    ///
    /// # Errors
    /// The writer fails.
    pub fn new(out: W) -> Result<Self> {
        let mut out = BufWriter::new(out);
        writeln!(out, "{RMM_CSV_HEADER}").map_err(write_error)?;
        Ok(RmmCsvWriter { out, rows: 0 })
    }

    /// Writes one event as a row: `Pointer` is the event's id.
    ///
    /// # Errors
    /// The writer fails.
    pub fn write(&mut self, e: &Event) -> Result<()> {
        let action = match e.op {
            Op::Alloc => "allocate",
            Op::Free => "free",
        };
        writeln!(
            self.out,
            "{},{}.{:09},{},{:#x},{},{:#x}",
            e.thread,
            e.time_ns / 1_000_000_000,
            e.time_ns % 1_000_000_000,
            action,
            e.id,
            e.size,
            e.stream
        )
        .map_err(write_error)?;
        self.rows += 1;
        Ok(())
    }

    /// Rows written so far (the header row not counted).
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// Flushes and hands back the writer.
    ///
    /// # Errors
    /// The writer fails.
    pub fn finish(self) -> Result<W> {
        self.out
            .into_inner()
            .map_err(|e| write_error(e.into_error()))
    }
}

/// Writes every event of `events` as RMM CSV; returns the number of rows.
///
/// # Errors
/// The first `Err` of `events`, or the writer fails.
pub fn write_rmm_csv<W, I>(out: W, events: I) -> Result<u64>
where
    W: Write,
    I: IntoIterator<Item = Result<Event>>,
{
    let mut w = RmmCsvWriter::new(out)?;
    for e in events {
        w.write(&e?)?;
    }
    let n = w.rows();
    w.finish()?;
    Ok(n)
}
