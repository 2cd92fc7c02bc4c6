//! Backends: one folder per vendor, each implementing [`crate::Device`]. The host backend is
//! always compiled. Unsafe code lives here (and in `sys/`) only; every block says why it is
//! sound in a `// SAFETY:` line.

pub mod host;
