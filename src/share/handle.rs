//! [`ShareHandle`]: what one process hands another so that it can map an allocation — plain
//! bytes, the same for the same export every time, that any channel carries (a pipe, a
//! socket, a pickle, a file), and a checked reader for bytes that may be hostile.
//!
//! # Layout (version 1, little-endian)
//!
//! ```text
//!  0  8  magic "PASHARE\x01"             40  8  size: the allocation's bytes
//!  8  4  version (1)                     48  8  offset: allocation - start of the span
//! 12  1  kind (1 mapped, 2 plain)        56  8  span: bytes mapped (mapped: the granules;
//! 13  1  vendor (0 host, 1 cuda, 2 hip)          plain: the device allocation)
//! 14  2  zero                            64  8  device: FNV-1a of the device's key
//! 16  4  exporter's pid                  72  8  zero
//! 20  4  record in the exporter's registry
//! 24  8  exporter's start time (clock ticks after boot)
//! 32  8  export id (the registry record's key)
//! 80  plain: 64 bytes, the driver's legacy IPC handle
//!     mapped: u32 pieces (1 ..= MAX_PIECES), u32 zero, then per piece 32 bytes:
//!             i32 descriptor in the exporter, u32 the descriptor's serial (which export of
//!             a handle opened it: a number the exporter reuses names another object), u64
//!             handle size, u64 offset in the handle, u64 length
//! ```
//!
//! Nothing in it is uninitialised or depends on memory layout: the writer writes every byte,
//! so exporting one allocation twice gives equal bytes (PyTorch shipped handles that differed
//! by uninitialised padding, pytorch/pytorch#198305).
#![deny(unsafe_code)]

use crate::error::{Error, Result};

/// The first 8 bytes of every handle.
pub const MAGIC: [u8; 8] = *b"PASHARE\x01";
/// The layout version written and the only one read.
pub const VERSION: u32 = 1;
/// The most pieces a mapped handle may list: a 4 GiB buffer in 2 MiB granules, each its own
/// handle, is 2048.
pub const MAX_PIECES: usize = 1 << 16;
const HEADER: usize = 80;
const PIECE: usize = 32;

/// One run of a mapped export: `len` bytes from `offset` of the physical handle the exporter
/// holds open as descriptor `fd`, of `handle_size` bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SharedPiece {
    /// The descriptor's number in the exporting process.
    pub fd: i32,
    /// Which descriptor of that number: the exporter counts the descriptors it opens, so an
    /// importer never takes a new one for an old one it holds.
    pub serial: u32,
    /// The whole physical handle's size.
    pub handle_size: u64,
    /// Where in the handle this run starts.
    pub offset: u64,
    /// The run's length.
    pub len: u64,
}

/// What lies under an exported allocation, as the importer needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SharedMemory {
    /// Physical handles mapped one after another (vmm).
    Mapped(Vec<SharedPiece>),
    /// The device allocation behind a legacy IPC handle (bfc, platform).
    Plain([u8; 64]),
}

/// An exported allocation, as another process imports it ([`crate::share::import`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShareHandle {
    /// The backend: 0 host, 1 cuda, 2 hip.
    pub vendor: u8,
    /// The exporting process.
    pub pid: u32,
    /// Its start time, so that a reused pid is not taken for it.
    pub start_time: u64,
    /// Its registry record, where importers say they hold the memory.
    pub record: u32,
    /// The record's key: which export it is.
    pub export_id: u64,
    /// The allocation's size.
    pub size: u64,
    /// Where the allocation starts in the span mapped.
    pub offset: u64,
    /// The bytes mapped: the granules (mapped) or the device allocation (plain).
    pub span: u64,
    /// Which physical device (FNV-1a of [`crate::budget::device_key`]).
    pub device: u64,
    /// What lies under it.
    pub memory: SharedMemory,
}

fn bad(reason: String) -> Error {
    Error::ShareHandle { reason }
}

impl ShareHandle {
    /// The handle's bytes (see the module's layout).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(HEADER + 64);
        b.extend_from_slice(&MAGIC);
        b.extend_from_slice(&VERSION.to_le_bytes());
        let kind: u8 = match self.memory {
            SharedMemory::Mapped(_) => 1,
            SharedMemory::Plain(_) => 2,
        };
        b.extend_from_slice(&[kind, self.vendor, 0, 0]);
        b.extend_from_slice(&self.pid.to_le_bytes());
        b.extend_from_slice(&self.record.to_le_bytes());
        for word in [
            self.start_time,
            self.export_id,
            self.size,
            self.offset,
            self.span,
            self.device,
            0,
        ] {
            b.extend_from_slice(&word.to_le_bytes());
        }
        match &self.memory {
            SharedMemory::Plain(ipc) => b.extend_from_slice(ipc),
            SharedMemory::Mapped(pieces) => {
                b.extend_from_slice(&(pieces.len() as u32).to_le_bytes());
                b.extend_from_slice(&0u32.to_le_bytes());
                for p in pieces {
                    b.extend_from_slice(&p.fd.to_le_bytes());
                    b.extend_from_slice(&p.serial.to_le_bytes());
                    for word in [p.handle_size, p.offset, p.len] {
                        b.extend_from_slice(&word.to_le_bytes());
                    }
                }
            }
        }
        b
    }

    /// Reads a handle from `bytes`, checking every field: a clear
    /// [`Error::ShareHandle`] for anything [`ShareHandle::to_bytes`] would not have written.
    ///
    /// # Time complexity
    /// `O(bytes)`; at most [`MAX_PIECES`] pieces are read.
    ///
    /// # Errors
    /// [`Error::ShareHandle`] naming what was wrong and what is accepted.
    pub fn from_bytes(bytes: &[u8]) -> Result<ShareHandle> {
        if bytes.len() < HEADER {
            return Err(bad(format!(
                "{} bytes; a handle is at least {HEADER} (accepted: what ShareHandle::to_bytes \
                 wrote)",
                bytes.len()
            )));
        }
        if bytes[..8] != MAGIC {
            return Err(bad(format!(
                "it starts with {:02x?}, not \"PASHARE\\x01\": not a portalloc share handle",
                &bytes[..8]
            )));
        }
        let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4"));
        let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8"));
        let version = u32_at(8);
        if version != VERSION {
            return Err(bad(format!(
                "layout version {version}; this portalloc reads version {VERSION} (export and \
                 import with the same release)"
            )));
        }
        let (kind, vendor) = (bytes[12], bytes[13]);
        if vendor > 2 {
            return Err(bad(format!(
                "vendor {vendor}; accepted: 0 host, 1 cuda, 2 hip"
            )));
        }
        if bytes[14] != 0 || bytes[15] != 0 || u64_at(72) != 0 {
            return Err(bad("its reserved bytes are not zero".into()));
        }
        let handle = |memory| ShareHandle {
            vendor,
            pid: u32_at(16),
            record: u32_at(20),
            start_time: u64_at(24),
            export_id: u64_at(32),
            size: u64_at(40),
            offset: u64_at(48),
            span: u64_at(56),
            device: u64_at(64),
            memory,
        };
        let rest = &bytes[HEADER..];
        let h = match kind {
            2 => {
                if rest.len() != 64 {
                    return Err(bad(format!(
                        "a plain handle has 64 bytes of IPC handle after its header, not {}",
                        rest.len()
                    )));
                }
                handle(SharedMemory::Plain(rest.try_into().expect("64")))
            }
            1 => {
                if rest.len() < 8 {
                    return Err(bad("a mapped handle is cut before its piece count".into()));
                }
                let n = u32_at(HEADER) as usize;
                if n == 0 || n > MAX_PIECES || u32_at(HEADER + 4) != 0 {
                    return Err(bad(format!(
                        "{n} pieces; accepted: 1 to {MAX_PIECES}, then four zero bytes"
                    )));
                }
                if rest.len() != 8 + n * PIECE {
                    return Err(bad(format!(
                        "{} bytes of pieces for {n} pieces of {PIECE}",
                        rest.len() - 8
                    )));
                }
                let mut pieces = Vec::with_capacity(n);
                for i in 0..n {
                    let at = HEADER + 8 + i * PIECE;
                    let fd = u32_at(at) as i32;
                    if fd < 0 {
                        return Err(bad(format!(
                            "piece {i} names descriptor {fd}; accepted: a descriptor ≥ 0"
                        )));
                    }
                    pieces.push(SharedPiece {
                        fd,
                        serial: u32_at(at + 4),
                        handle_size: u64_at(at + 8),
                        offset: u64_at(at + 16),
                        len: u64_at(at + 24),
                    });
                }
                handle(SharedMemory::Mapped(pieces))
            }
            other => {
                return Err(bad(format!(
                    "kind {other}; accepted: 1 (mapped), 2 (plain)"
                )))
            }
        };
        h.check()?;
        Ok(h)
    }

    /// The checks of the fields' meaning: sizes that fit, pieces that cover the span.
    fn check(&self) -> Result<()> {
        if self.pid == 0 || self.size == 0 || self.span == 0 {
            return Err(bad(format!(
                "pid {}, size {}, span {}: none may be zero",
                self.pid, self.size, self.span
            )));
        }
        match self.offset.checked_add(self.size) {
            Some(end) if end <= self.span => {}
            _ => {
                return Err(bad(format!(
                    "the allocation ({} bytes at {}) runs past the span of {} bytes",
                    self.size, self.offset, self.span
                )))
            }
        }
        if let SharedMemory::Mapped(pieces) = &self.memory {
            let mut total = 0u64;
            for p in pieces {
                let fits = p.len > 0
                    && p.offset
                        .checked_add(p.len)
                        .is_some_and(|end| end <= p.handle_size);
                total = total.saturating_add(p.len);
                if !fits {
                    return Err(bad(format!(
                        "a piece of {} bytes at {} does not lie in its handle of {} bytes",
                        p.len, p.offset, p.handle_size
                    )));
                }
            }
            if total != self.span {
                return Err(bad(format!(
                    "the pieces cover {total} bytes, the span is {}",
                    self.span
                )));
            }
        }
        Ok(())
    }
}

/// FNV-1a of `text`: the device field of a handle.
pub(crate) fn fnv1a(text: &str) -> u64 {
    digest(text.as_bytes())
}

/// FNV-1a of `bytes`, never 0 (a registry record's digest word is 0 until sealed): what binds
/// a handle's bytes to its export in the exporter's registry.
pub(crate) fn digest(bytes: &[u8]) -> u64 {
    let h = bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    h.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn mapped() -> ShareHandle {
        ShareHandle {
            vendor: 1,
            pid: 77,
            start_time: 12345,
            record: 3,
            export_id: 9,
            size: 3 << 20,
            offset: 4096,
            span: 4 << 20,
            device: fnv1a("cuda-GPU-1"),
            memory: SharedMemory::Mapped(vec![
                SharedPiece {
                    fd: 11,
                    serial: 1,
                    handle_size: 8 << 20,
                    offset: 2 << 20,
                    len: 2 << 20,
                },
                SharedPiece {
                    fd: 12,
                    serial: 2,
                    handle_size: 2 << 20,
                    offset: 0,
                    len: 2 << 20,
                },
            ]),
        }
    }

    #[test]
    fn a_handle_reads_back_as_written_and_writes_the_same_bytes_twice() {
        let h = mapped();
        let bytes = h.to_bytes();
        assert_eq!(ShareHandle::from_bytes(&bytes).unwrap(), h);
        assert_eq!(h.clone().to_bytes(), bytes);
        let plain = ShareHandle {
            memory: SharedMemory::Plain([7; 64]),
            ..mapped()
        };
        assert_eq!(ShareHandle::from_bytes(&plain.to_bytes()).unwrap(), plain);
    }

    #[test]
    fn damaged_handles_say_what_is_wrong() {
        let good = mapped().to_bytes();
        let cases: Vec<(&str, Vec<u8>, &str)> = vec![
            ("short", good[..20].to_vec(), "at least 80"),
            (
                "magic",
                [b"XASHARE\x01".as_slice(), &good[8..]].concat(),
                "not a portalloc",
            ),
            (
                "cut pieces",
                good[..good.len() - 1].to_vec(),
                "bytes of pieces",
            ),
            (
                "version",
                {
                    let mut b = good.clone();
                    b[8] = 9;
                    b
                },
                "layout version 9",
            ),
            (
                "kind",
                {
                    let mut b = good.clone();
                    b[12] = 5;
                    b
                },
                "kind 5",
            ),
            (
                "reserved",
                {
                    let mut b = good.clone();
                    b[75] = 1;
                    b
                },
                "reserved",
            ),
            (
                "span",
                {
                    let mut b = good.clone();
                    b[56..64].copy_from_slice(&(1u64 << 20).to_le_bytes());
                    b
                },
                "runs past the span",
            ),
        ];
        for (name, bytes, says) in cases {
            let e = ShareHandle::from_bytes(&bytes).unwrap_err().to_string();
            assert!(e.contains(says), "{name}: {e}");
        }
    }

    proptest! {
        #[test]
        fn any_bytes_give_a_handle_or_an_error_never_a_panic(
            bytes in proptest::collection::vec(any::<u8>(), 0..400),
            prefix in any::<bool>(),
        ) {
            let bytes = if prefix {
                [MAGIC.as_slice(), &1u32.to_le_bytes(), &bytes].concat()
            } else {
                bytes
            };
            if let Ok(h) = ShareHandle::from_bytes(&bytes) {
                prop_assert_eq!(h.to_bytes(), bytes);
            }
        }
    }
}
