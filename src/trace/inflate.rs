//! Inflating a gzip'd trace on a second thread, so that the reader parses one buffer while
//! the next is inflated.
//!
//! Inflating a Kineto trace takes about as long as replaying it (`cargo bench --bench
//! trace_read` times both): a reader that inflates and parses in turn pays their sum, in
//! parallel the longer of the two. A thread of its own inflates the stream into buffers of
//! [`CHUNK_BYTES`] and hands them over a bounded channel ([`DEPTH`] buffers in flight: memory
//! stays at most about `(2 × DEPTH + 2) × CHUNK_BYTES` however large the file); the reader
//! hands each buffer back once used, to be filled again. The reader sees the bytes through
//! [`BufRead`], in order, and a read error where the inflating thread met it. When the reader
//! is dropped before the end, the thread's next hand-over fails and it stops.
#![deny(unsafe_code)]

use std::io::{self, BufRead, ErrorKind, Read};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};

/// Bytes per buffer.
pub(crate) const CHUNK_BYTES: usize = 256 << 10;

/// Buffers filled and not yet taken by the reader, at most.
pub(crate) const DEPTH: usize = 4;

/// The inflated stream, as the reader sees it.
pub(crate) struct Inflated {
    /// Buffers in stream order; an empty one marks the end, an error ends the stream too.
    full: Receiver<io::Result<Vec<u8>>>,
    /// Used buffers, back to the thread.
    empty: SyncSender<Vec<u8>>,
    /// The buffer being read. Invariant: `pos <= current.len()`.
    current: Vec<u8>,
    pos: usize,
    /// The stream has ended (`Ok`), or failed with this error (kind, message, and whether it
    /// is a bound reached: `trace::limit_reached`), which every later read gives again.
    ended: Option<std::result::Result<(), (ErrorKind, String, bool)>>,
}

impl Inflated {
    /// Starts a thread that reads `source` to its end.
    ///
    /// # Errors
    /// The thread cannot be started.
    pub(crate) fn spawn(mut source: Box<dyn Read + Send>) -> io::Result<Inflated> {
        let (full_tx, full) = sync_channel::<io::Result<Vec<u8>>>(DEPTH);
        let (empty, empty_rx) = sync_channel::<Vec<u8>>(DEPTH + 2);
        let send = move |message: io::Result<Vec<u8>>| full_tx.send(message).is_ok();
        std::thread::Builder::new()
            .name("portalloc-inflate".to_string())
            .spawn(move || loop {
                let mut buf = empty_rx.try_recv().unwrap_or_default();
                buf.resize(CHUNK_BYTES, 0);
                let mut n = 0;
                while n < CHUNK_BYTES {
                    match source.read(&mut buf[n..]) {
                        Ok(0) => break,
                        Ok(k) => n += k,
                        Err(e) if e.kind() == ErrorKind::Interrupted => {}
                        Err(e) => {
                            // What was inflated before the error is handed over first.
                            buf.truncate(n);
                            if n > 0 && !send(Ok(buf)) {
                                return;
                            }
                            send(Err(e));
                            return;
                        }
                    }
                }
                buf.truncate(n);
                // The reader is gone (dropped early): stop.
                if !send(Ok(buf)) || n == 0 {
                    return;
                }
            })?;
        Ok(Inflated {
            full,
            empty,
            current: Vec::new(),
            pos: 0,
            ended: None,
        })
    }

    /// The error the stream ended with, again.
    fn failure(kind: ErrorKind, message: &str, limit: bool) -> io::Error {
        if limit {
            crate::trace::limit_reached(message.to_string())
        } else {
            io::Error::new(kind, message.to_string())
        }
    }
}

impl BufRead for Inflated {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        while self.pos == self.current.len() {
            match &self.ended {
                Some(Ok(())) => return Ok(&[]),
                Some(Err((kind, message, limit))) => {
                    return Err(Self::failure(*kind, message, *limit))
                }
                None => {}
            }
            let used = std::mem::take(&mut self.current);
            self.pos = 0;
            if used.capacity() > 0 {
                // Back to the thread; dropped instead when it has enough.
                let _ = self.empty.try_send(used);
            }
            match self.full.recv() {
                Ok(Ok(buf)) if buf.is_empty() => self.ended = Some(Ok(())),
                Ok(Ok(buf)) => self.current = buf,
                Ok(Err(e)) => {
                    let limit = crate::trace::io_kind(&e) == crate::trace::TraceErrorKind::Limit;
                    self.ended = Some(Err((e.kind(), e.to_string(), limit)));
                }
                // The thread ended without a word: it panicked.
                Err(_) => {
                    self.ended = Some(Err((
                        ErrorKind::Other,
                        "the inflating thread stopped".to_string(),
                        false,
                    )))
                }
            }
        }
        Ok(&self.current[self.pos..])
    }

    fn consume(&mut self, amt: usize) {
        self.pos = (self.pos + amt).min(self.current.len());
    }
}

impl Read for Inflated {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        let available = self.fill_buf()?;
        let n = available.len().min(out.len());
        out[..n].copy_from_slice(&available[..n]);
        self.consume(n);
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reader of `data` that fails after `fail_after` bytes (when set), in reads of at most
    /// `step` bytes.
    struct Source {
        data: Vec<u8>,
        at: usize,
        step: usize,
        fail_after: Option<usize>,
    }

    impl Read for Source {
        fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
            if self.fail_after.is_some_and(|f| self.at >= f) {
                return Err(io::Error::new(
                    ErrorKind::InvalidData,
                    "corrupt deflate stream",
                ));
            }
            let end = (self.at + self.step.min(out.len())).min(self.data.len());
            let end = self.fail_after.map_or(end, |f| end.min(f));
            let n = end - self.at;
            out[..n].copy_from_slice(&self.data[self.at..end]);
            self.at = end;
            Ok(n)
        }
    }

    fn data(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 + i / 251) as u8).collect()
    }

    #[test]
    fn the_stream_arrives_whole_and_in_order() {
        // (name, length, read size): empty, shorter than a buffer, several buffers and a
        // part, reads smaller than a buffer.
        let cases = [
            ("empty", 0, 1 << 16),
            ("one byte", 1, 1 << 16),
            ("part of a buffer", 1000, 1 << 16),
            ("exactly one buffer", CHUNK_BYTES, CHUNK_BYTES),
            ("many buffers", 3 * DEPTH * CHUNK_BYTES + 17, 1 << 16),
            ("small reads", 2 * CHUNK_BYTES + 5, 4099),
        ];
        for (name, len, step) in cases {
            let want = data(len);
            let source = Source {
                data: want.clone(),
                at: 0,
                step,
                fail_after: None,
            };
            let mut got = Vec::new();
            Inflated::spawn(Box::new(source))
                .unwrap()
                .read_to_end(&mut got)
                .unwrap();
            assert!(
                got == want,
                "{name}: {} bytes, want {}",
                got.len(),
                want.len()
            );
        }
    }

    #[test]
    fn an_error_comes_after_the_bytes_before_it_and_stays() {
        let len = CHUNK_BYTES + 100;
        let source = Source {
            data: data(2 * len),
            at: 0,
            step: 1 << 16,
            fail_after: Some(len),
        };
        let mut r = Inflated::spawn(Box::new(source)).unwrap();
        let mut got = vec![0u8; len];
        r.read_exact(&mut got).unwrap();
        assert!(got == data(len));
        for _ in 0..2 {
            let e = r.fill_buf().unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidData);
            assert!(e.to_string().contains("corrupt deflate stream"), "{e}");
        }
    }

    #[test]
    fn dropping_the_reader_early_stops_the_thread() {
        // An endless source: the thread must stop at its next hand-over once the reader is
        // gone (else this test would not end: the channel is bounded).
        struct Endless;
        impl Read for Endless {
            fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
                out.fill(b'x');
                Ok(out.len())
            }
        }
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        struct Notify<R>(R, std::sync::mpsc::Sender<()>);
        impl<R: Read> Read for Notify<R> {
            fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
                self.0.read(out)
            }
        }
        impl<R> Drop for Notify<R> {
            fn drop(&mut self) {
                let _ = self.1.send(());
            }
        }
        let mut r = Inflated::spawn(Box::new(Notify(Endless, done_tx))).unwrap();
        let mut first = [0u8; 10];
        r.read_exact(&mut first).unwrap();
        assert_eq!(&first, b"xxxxxxxxxx");
        drop(r);
        // The source is dropped when the thread returns (a minute is far more than it needs:
        // the bound only turns a hang into a failure).
        done_rx
            .recv_timeout(std::time::Duration::from_secs(60))
            .expect("the inflating thread did not stop");
    }
}
