//! The C ABI (feature `c-api`), called from Rust (the exported functions are ordinary Rust
//! functions too) with hostile values; donation through handles; the ledger JSON; per-thread
//! error text; the PyTorch hooks; the header's freshness; and libportalloc.so as C and Python
//! users get it — the workspace member capi/, built here with cargo — checked with `nm` against
//! the header, and run by a C program and the Python module (when `cc`, `nm` and `python3` are
//! present: a missing one is a skip that CI turns into a failure).
#![cfg(feature = "c-api")]

// A binary of its own (see tests/suite/main.rs): it uses a part of the support only.
#[allow(dead_code)]
#[path = "support/mod.rs"]
mod support;

use std::collections::BTreeSet;
use std::ffi::{c_char, c_void, CStr, CString};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::ptr;
use std::sync::OnceLock;
use support::common::assert_mentions_all;

use portalloc::capi::*;
use test_case::test_case;

const MIB: u64 = 1 << 20;

/// An allocator handle that destroys itself.
struct Alloc(*mut PortallocAllocator);

impl Drop for Alloc {
    fn drop(&mut self) {
        // SAFETY: the C ABI accepts any pointer; a destroyed one is refused with a status.
        unsafe { portalloc_destroy(self.0) };
    }
}

/// A bfc allocator on a simulated 64 MiB host device, half of it usable, ignoring the
/// environment.
fn make(strategy: &CStr) -> Alloc {
    let mut o = default_options();
    o.ignore_env = 1;
    o.strategy = strategy.as_ptr();
    o.backend = c"host".as_ptr();
    o.host_capacity = 64 * MIB;
    o.host_simulated = 1;
    o.mem_fraction = 0.5;
    o.preallocate = 0;
    let mut a = ptr::null_mut();
    // SAFETY: valid options with static strings; `a` is valid for one pointer.
    let status = unsafe { portalloc_create_sized(&o, OPTIONS_SIZE, &mut a) };
    assert_eq!(status, PortallocStatus::Ok, "{}", last_error());
    assert!(!a.is_null());
    Alloc(a)
}

/// The size of this header's `PortallocOptions`, as a C caller's `sizeof` gives it.
const OPTIONS_SIZE: usize = std::mem::size_of::<PortallocOptions>();

/// `PortallocOptions` as portalloc 0.1.0's header declared it (the fields up to
/// `ignore_env`), written out here from that header rather than derived from portalloc's own
/// definition: what a program compiled against 0.1.0 has.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct OptionsV1 {
    strategy: *const c_char,
    mem_fraction: f64,
    preallocate: i32,
    backend: *const c_char,
    host_capacity: u64,
    host_simulated: i32,
    backtrace: i32,
    device: u32,
    ignore_env: i32,
}

/// An [`OptionsV1`] followed by bytes a 0.1.0 caller does not own: portalloc must neither
/// write them nor read them.
#[repr(C)]
struct GuardedV1 {
    options: OptionsV1,
    after: [u8; 32],
}

impl GuardedV1 {
    /// `after` filled with `guard`; `options` with bytes portalloc must overwrite.
    fn new(guard: u8) -> Self {
        GuardedV1 {
            options: OptionsV1 {
                strategy: ptr::null(),
                mem_fraction: 9.0,
                preallocate: 9,
                backend: ptr::null(),
                host_capacity: 9,
                host_simulated: 9,
                backtrace: 9,
                device: 9,
                ignore_env: 9,
            },
            after: [guard; 32],
        }
    }

    fn as_options(&mut self) -> *mut PortallocOptions {
        std::ptr::addr_of_mut!(self.options).cast()
    }
}

/// The defaults, through `portalloc_options_init` with this header's size.
fn default_options() -> PortallocOptions {
    let mut o = std::mem::MaybeUninit::<PortallocOptions>::uninit();
    // SAFETY: `o` is valid for writing OPTIONS_SIZE bytes.
    let status = unsafe { portalloc_options_init(o.as_mut_ptr(), OPTIONS_SIZE) };
    assert_eq!(status, PortallocStatus::Ok, "{}", last_error());
    // SAFETY: every byte of the struct written by portalloc_options_init.
    unsafe { o.assume_init() }
}

fn last_error() -> String {
    // SAFETY: portalloc_last_error returns a valid NUL-terminated string.
    unsafe { CStr::from_ptr(portalloc_last_error()) }
        .to_string_lossy()
        .into_owned()
}

fn allocate(a: &Alloc, size: u64, tag: &CStr) -> (u64, *mut c_void) {
    let (mut h, mut p) = (0u64, ptr::null_mut());
    // SAFETY: valid outputs and tag.
    let s = unsafe { portalloc_allocate(a.0, size, 0, 0, tag.as_ptr(), &mut h, &mut p) };
    assert_eq!(s, PortallocStatus::Ok, "{}", last_error());
    (h, p)
}

fn stats(a: &Alloc) -> PortallocStats {
    let mut s = PortallocStats::default();
    // SAFETY: valid output.
    let status = unsafe { portalloc_stats(a.0, &mut s) };
    assert_eq!(status, PortallocStatus::Ok, "{}", last_error());
    s
}

fn ledger_json(a: &Alloc) -> serde_json::Value {
    let mut len = 0usize;
    // SAFETY: a null buffer with capacity 0 asks for the length.
    let s = unsafe { portalloc_ledger_json(a.0, ptr::null_mut(), 0, &mut len) };
    assert_eq!(s, PortallocStatus::BufferTooSmall);
    let mut buf = vec![0u8; len + 1];
    // SAFETY: `buf` has `len + 1` writable bytes.
    let s = unsafe { portalloc_ledger_json(a.0, buf.as_mut_ptr().cast(), buf.len(), &mut len) };
    assert_eq!(s, PortallocStatus::Ok, "{}", last_error());
    assert_eq!(buf[len], 0, "NUL-terminated");
    serde_json::from_slice(&buf[..len]).expect("the ledger JSON parses")
}

#[test]
fn allocate_use_and_free() {
    let a = make(c"bfc");
    let (h, p) = allocate(&a, 1000, c"buffer");
    assert_ne!(h, 0);
    assert!(!p.is_null());
    assert_eq!(p as usize % 256, 0);
    let (mut q, mut size) = (ptr::null_mut(), 0u64);
    // SAFETY: valid outputs.
    let s = unsafe { portalloc_handle_info(a.0, h, &mut q, &mut size) };
    assert_eq!(s, PortallocStatus::Ok);
    assert_eq!((q, size), (p, 1000));
    let st = stats(&a);
    assert_eq!(st.live_allocations, 1);
    assert_eq!(st.bytes_in_use, 1024);
    assert_eq!(st.bytes_limit, 32 * MIB);
    let (h2, p2) = allocate(&a, MIB, c"workspace");
    // SAFETY: plain values.
    assert_eq!(unsafe { portalloc_free(a.0, h) }, PortallocStatus::Ok);
    // SAFETY: plain values.
    assert_eq!(unsafe { portalloc_free_ptr(a.0, p2) }, PortallocStatus::Ok);
    let _ = h2;
    let st = stats(&a);
    assert_eq!((st.live_allocations, st.bytes_in_use), (0, 0));
    let mut released = 0;
    assert_eq!(
        // SAFETY: valid output.
        unsafe { portalloc_trim(a.0, &mut released) },
        PortallocStatus::Ok
    );
    assert!(released > 0);
}

/// Each hostile call: what it does, given a fresh allocator holding one live 4 KiB buffer
/// (`live`) and one freed handle (`freed`, whose pointer was `freed_ptr`).
#[derive(Debug, Clone, Copy)]
enum Hostile {
    NullAllocator,
    MadeUpAllocator,
    DestroyedAllocator,
    NullOutHandle,
    ZeroSize,
    SizeMax,
    AlignmentNotPowerOfTwo,
    AlignmentMax,
    InvalidUtf8Tag,
    DoubleFreeHandle,
    DoubleFreePointer,
    ForeignPointer,
    InteriorPointer,
    NullPointer,
    StaleHandle,
    HandleZero,
    HandleMax,
    NullStatsOut,
    NullLedgerLen,
    NullOptions,
    BadTristate,
    BadPeerAccess,
    BadStrategy,
    BadFraction,
}

struct Fixture {
    a: Alloc,
    live: u64,
    live_ptr: *mut c_void,
    freed: u64,
    freed_ptr: *mut c_void,
}

fn fixture() -> Fixture {
    let a = make(c"bfc");
    let (live, live_ptr) = allocate(&a, 4096, c"buffer");
    let (freed, freed_ptr) = allocate(&a, 4096, c"buffer");
    // SAFETY: plain values.
    assert_eq!(unsafe { portalloc_free(a.0, freed) }, PortallocStatus::Ok);
    Fixture {
        a,
        live,
        live_ptr,
        freed,
        freed_ptr,
    }
}

/// Runs the hostile call; returns its status.
fn run(f: &Fixture, case: Hostile) -> PortallocStatus {
    let (mut h, mut p) = (0u64, ptr::null_mut::<c_void>());
    // SAFETY: (whole block) every pointer passed is null, a valid output, a valid string, or
    // a value portalloc only looks up; the point is that portalloc refuses the bad ones.
    unsafe {
        match case {
            Hostile::NullAllocator => portalloc_free(ptr::null_mut(), f.live),
            Hostile::MadeUpAllocator => portalloc_free(0xdead_bee0 as *mut _, f.live),
            Hostile::DestroyedAllocator => {
                let b = make(c"bfc");
                let raw = b.0;
                drop(b);
                portalloc_allocate(raw, 256, 0, 0, ptr::null(), &mut h, &mut p)
            }
            Hostile::NullOutHandle => {
                portalloc_allocate(f.a.0, 256, 0, 0, ptr::null(), ptr::null_mut(), &mut p)
            }
            Hostile::ZeroSize => {
                let s = portalloc_allocate(f.a.0, 0, 0, 0, ptr::null(), &mut h, &mut p);
                assert!(p.is_null(), "a zero-byte buffer has a null pointer");
                assert_eq!(portalloc_free(f.a.0, h), PortallocStatus::Ok);
                s
            }
            Hostile::SizeMax => {
                portalloc_allocate(f.a.0, u64::MAX, 0, 0, ptr::null(), &mut h, &mut p)
            }
            Hostile::AlignmentNotPowerOfTwo => {
                portalloc_allocate(f.a.0, 256, 3000, 0, ptr::null(), &mut h, &mut p)
            }
            Hostile::AlignmentMax => {
                portalloc_allocate(f.a.0, 256, u64::MAX, 0, ptr::null(), &mut h, &mut p)
            }
            Hostile::InvalidUtf8Tag => {
                let bad = [0xffu8, 0xfe, 0];
                portalloc_allocate(f.a.0, 256, 0, 0, bad.as_ptr().cast(), &mut h, &mut p)
            }
            Hostile::DoubleFreeHandle => portalloc_free(f.a.0, f.freed),
            Hostile::DoubleFreePointer => portalloc_free_ptr(f.a.0, f.freed_ptr),
            Hostile::ForeignPointer => {
                let mine = Box::new(0u64);
                portalloc_free_ptr(f.a.0, (&*mine as *const u64).cast_mut().cast())
            }
            Hostile::InteriorPointer => {
                portalloc_free_ptr(f.a.0, f.live_ptr.cast::<u8>().add(256).cast())
            }
            Hostile::NullPointer => portalloc_free_ptr(f.a.0, ptr::null_mut()),
            Hostile::StaleHandle => {
                // The freed handle's slot is reused by a new buffer: the old handle must not
                // free the new one.
                let (h2, _) = allocate(&f.a, 512, c"buffer");
                let s = portalloc_free(f.a.0, f.freed);
                assert_eq!(portalloc_free(f.a.0, h2), PortallocStatus::Ok);
                s
            }
            Hostile::HandleZero => portalloc_free(f.a.0, 0),
            Hostile::HandleMax => portalloc_free(f.a.0, u64::MAX),
            Hostile::NullStatsOut => portalloc_stats(f.a.0, ptr::null_mut()),
            Hostile::NullLedgerLen => {
                let mut buf = [0 as c_char; 16];
                portalloc_ledger_json(f.a.0, buf.as_mut_ptr(), buf.len(), ptr::null_mut())
            }
            Hostile::NullOptions => {
                let mut out = ptr::null_mut();
                portalloc_create(ptr::null(), &mut out)
            }
            Hostile::BadTristate => with_options(|o| o.preallocate = 7),
            Hostile::BadPeerAccess => with_options(|o| o.peer_access = 2),
            Hostile::BadStrategy => with_options(|o| o.strategy = c"best-guess".as_ptr()),
            Hostile::BadFraction => with_options(|o| o.mem_fraction = f64::NAN),
        }
    }
}

fn with_options(edit: impl FnOnce(&mut PortallocOptions)) -> PortallocStatus {
    let mut o = default_options();
    o.ignore_env = 1;
    o.backend = c"host".as_ptr();
    o.host_simulated = 1;
    o.host_capacity = 64 * MIB;
    edit(&mut o);
    let mut out = ptr::null_mut();
    // SAFETY: valid options and output.
    let s = unsafe { portalloc_create_sized(&o, OPTIONS_SIZE, &mut out) };
    if s == PortallocStatus::Ok {
        drop(Alloc(out));
    }
    s
}

#[test_case(Hostile::NullAllocator, PortallocStatus::NullArgument, "allocator" ; "null allocator")]
#[test_case(Hostile::MadeUpAllocator, PortallocStatus::InvalidAllocator, "not a live portalloc allocator" ; "made up allocator")]
#[test_case(Hostile::DestroyedAllocator, PortallocStatus::InvalidAllocator, "destroyed" ; "destroyed allocator")]
#[test_case(Hostile::NullOutHandle, PortallocStatus::NullArgument, "out_handle" ; "null out handle")]
#[test_case(Hostile::ZeroSize, PortallocStatus::Ok, "" ; "zero size")]
#[test_case(Hostile::SizeMax, PortallocStatus::InvalidArgument, "invalid size" ; "size u64 max")]
#[test_case(Hostile::AlignmentNotPowerOfTwo, PortallocStatus::InvalidArgument, "power of two" ; "alignment not a power of two")]
#[test_case(Hostile::AlignmentMax, PortallocStatus::InvalidArgument, "invalid alignment" ; "alignment u64 max")]
#[test_case(Hostile::InvalidUtf8Tag, PortallocStatus::InvalidArgument, "UTF-8" ; "invalid utf8 tag")]
#[test_case(Hostile::DoubleFreeHandle, PortallocStatus::InvalidHandle, "buffer has been deleted or donated" ; "double free by handle")]
#[test_case(Hostile::DoubleFreePointer, PortallocStatus::UnknownPointer, "not the start of a live buffer" ; "double free by pointer")]
#[test_case(Hostile::ForeignPointer, PortallocStatus::UnknownPointer, "foreign pointer" ; "foreign pointer")]
#[test_case(Hostile::InteriorPointer, PortallocStatus::UnknownPointer, "not the start" ; "interior pointer")]
#[test_case(Hostile::NullPointer, PortallocStatus::NullArgument, "ptr" ; "null pointer")]
#[test_case(Hostile::StaleHandle, PortallocStatus::InvalidHandle, "buffer has been deleted or donated" ; "stale handle")]
#[test_case(Hostile::HandleZero, PortallocStatus::InvalidHandle, "not issued" ; "handle zero")]
#[test_case(Hostile::HandleMax, PortallocStatus::InvalidHandle, "not issued" ; "handle u64 max")]
#[test_case(Hostile::NullStatsOut, PortallocStatus::NullArgument, "out" ; "null stats output")]
#[test_case(Hostile::NullLedgerLen, PortallocStatus::NullArgument, "out_len" ; "null ledger length")]
#[test_case(Hostile::NullOptions, PortallocStatus::NullArgument, "options" ; "null options")]
#[test_case(Hostile::BadTristate, PortallocStatus::InvalidArgument, "preallocate" ; "bad tristate")]
#[test_case(Hostile::BadPeerAccess, PortallocStatus::InvalidArgument, "options.peer_access = 2" ; "bad peer access")]
#[test_case(Hostile::BadStrategy, PortallocStatus::Config, "best-guess" ; "bad strategy")]
#[test_case(Hostile::BadFraction, PortallocStatus::Config, "mem_fraction" ; "bad fraction")]
fn hostile_values_are_refused(case: Hostile, status: PortallocStatus, text: &str) {
    let f = fixture();
    let before = stats(&f.a);
    let got = run(&f, case);
    assert_eq!(got, status, "{case:?}: {}", last_error());
    if status != PortallocStatus::Ok {
        let message = last_error();
        assert!(
            message.contains(text),
            "{case:?}: message {message:?} lacks {text:?}"
        );
    }
    // Nothing freed twice, nothing lost: the live buffer is intact and still freeable once.
    let after = stats(&f.a);
    assert_eq!(after.live_allocations, before.live_allocations, "{case:?}");
    assert_eq!(after.bytes_in_use, before.bytes_in_use, "{case:?}");
    let mut p = ptr::null_mut();
    assert_eq!(
        // SAFETY: valid output.
        unsafe { portalloc_handle_info(f.a.0, f.live, &mut p, ptr::null_mut()) },
        PortallocStatus::Ok
    );
    assert_eq!(p, f.live_ptr);
    assert_eq!(
        // SAFETY: plain values.
        unsafe { portalloc_free(f.a.0, f.live) },
        PortallocStatus::Ok
    );
    assert_eq!(
        // SAFETY: plain values.
        unsafe { portalloc_free(f.a.0, f.live) },
        PortallocStatus::InvalidHandle
    );
    assert_eq!(stats(&f.a).bytes_in_use, 0);
}

/// Another allocator's handle is refused by this one, and frees nothing of its own: every
/// allocator's first handle used to be the same number, so `portalloc_free(b, a's handle)`
/// freed b's live buffer.
#[test]
fn another_allocators_handle_is_refused() {
    let (a, b) = (make(c"bfc"), make(c"bfc"));
    let (ha, _) = allocate(&a, MIB, c"a");
    let (hb, _) = allocate(&b, MIB, c"b");
    assert_ne!(ha, hb, "two allocators' first handles differ");
    // SAFETY: plain values; the allocators are live.
    let status = unsafe { portalloc_free(b.0, ha) };
    assert_eq!(status, PortallocStatus::InvalidHandle);
    assert!(
        last_error().contains("not issued by this allocator"),
        "{}",
        last_error()
    );
    assert_eq!(stats(&b).live_allocations, 1, "b's own buffer is untouched");
    assert_eq!(stats(&a).live_allocations, 1);
    // SAFETY: each allocator's own handle.
    unsafe {
        assert_eq!(portalloc_free(a.0, ha), PortallocStatus::Ok);
        assert_eq!(portalloc_free(b.0, hb), PortallocStatus::Ok);
    }
}

/// A destroyed allocator's handles are refused by every allocator made after it, however
/// many came and went: handle tags are never reused in a process. (With 16-bit tags reused
/// round robin, the 65,536th allocator after `a` got `a`'s tag, and its first handle was
/// `a`'s: `portalloc_free(new, a's handle)` freed the new allocator's buffer.)
#[test]
fn a_dead_allocators_handle_is_refused_after_many_lifetimes() {
    let a = make(c"platform");
    let (ha, _) = allocate(&a, MIB, c"a");
    drop(a);
    // More allocators than a 16-bit tag tells apart, each offered `a`'s handle.
    for i in 0..(1u32 << 16) + 16 {
        let b = make(c"platform");
        let (hb, _) = allocate(&b, 4096, c"b");
        // SAFETY: plain values; `b` is live.
        let status = unsafe { portalloc_free(b.0, ha) };
        assert_eq!(
            status,
            PortallocStatus::InvalidHandle,
            "allocator {i} after `a` took a's handle {ha:#x} (its own: {hb:#x})"
        );
        assert_eq!(stats(&b).live_allocations, 1, "b's own buffer is untouched");
    }
}

// ---------------------------------------------------------------------------------------
// Destroy racing allocate, made deterministic: in a child process over the conformance
// driver, the allocation is held inside the driver call that takes its memory while the
// destroy runs to its end; then it goes on. It must fail cleanly and give back what it took,
// not return a pointer over memory the destroy freed.

#[cfg(feature = "cuda")]
const DESTROY_CHILD: &str = "PORTALLOC_TEST_CAPI_DESTROY_CHILD";

#[cfg(feature = "cuda")]
#[test_case("platform", "false", "cuMemAlloc_v2" ; "platform")]
#[test_case("bfc", "true", "cuMemAlloc_v2" ; "bfc")]
#[test_case("bfc", "false", "cuMemAlloc_v2" ; "bfc growing")]
#[test_case("vmm", "false", "cuMemCreate" ; "vmm")]
#[test_case("cuda_async", "false", "cuMemAllocFromPoolAsync" ; "async")]
fn an_allocate_racing_destroy_fails_cleanly(strategy: &str, preallocate: &str, held: &str) {
    let driver = DriverCopy::new("fakecuda", &format!("destroy-{strategy}-{preallocate}"));
    let mut child = this_test_alone("destroy_race_child");
    driver
        .configure(&mut child, strategy, preallocate)
        .env(DESTROY_CHILD, held)
        .env("PORTALLOC_BACKEND", "cuda");
    let ran = run_to_end(&mut child);
    assert_ran_to(ran, "destroy race: ok", &format!("{strategy}: "));
}

#[cfg(feature = "cuda")]
#[test]
fn destroy_race_child() {
    let Ok(held) = std::env::var(DESTROY_CHILD) else {
        return; // Run by `an_allocate_racing_destroy_fails_cleanly` with its environment.
    };
    let fake = support::fakes::Fake::at(std::env::var("PORTALLOC_CUDA_LIBRARY").unwrap());
    let mut a = ptr::null_mut();
    // SAFETY: valid output.
    let status = unsafe { portalloc_create_from_env(0, &mut a) };
    assert_eq!(status, PortallocStatus::Ok, "{}", last_error());
    let token = a as usize;
    let (allocated, destroyed) = fake.while_paused(
        &held,
        move || {
            let (mut h, mut p) = (0u64, ptr::null_mut());
            // SAFETY: valid outputs and tag; the allocator may be destroyed meanwhile, which
            // the call must answer with a status.
            let status = unsafe {
                portalloc_allocate(
                    token as *mut PortallocAllocator,
                    MIB,
                    0,
                    0,
                    c"racing".as_ptr(),
                    &mut h,
                    &mut p,
                )
            };
            (status, last_error(), p as usize)
        },
        // SAFETY: the allocator made above, destroyed once.
        move || unsafe { portalloc_destroy(token as *mut PortallocAllocator) },
    );
    assert_eq!(destroyed, PortallocStatus::Ok);
    let (status, message, p) = allocated;
    assert_eq!(
        status,
        PortallocStatus::InvalidAllocator,
        "an allocation that completed after the destroy returned {status:?} and pointer \
         {p:#x} (the destroy freed its memory): {message}"
    );
    assert!(
        message.contains("destroyed while this call ran"),
        "{message}"
    );
    assert_eq!(p, 0, "a pointer came back with the refusal");
    // What it took is back with the driver.
    for what in ["allocations", "pool_allocations", "mappings"] {
        assert_eq!(fake.live(what), 0, "{what} still held after the destroy");
    }
    println!("destroy race: ok");
}

#[test]
fn refused_handle_message_names_the_handle() {
    let f = fixture();
    // SAFETY: plain values.
    let s = unsafe { portalloc_free(f.a.0, f.freed) };
    assert_eq!(s, PortallocStatus::InvalidHandle);
    let m = last_error();
    assert!(m.contains(&format!("{:#018x}", f.freed)), "{m}");
    assert!(m.contains("buffer has been deleted or donated"), "{m}");
}

#[test]
fn donated_handle_is_refused_with_the_exact_text() {
    let a = make(c"bfc");
    let (h, p) = allocate(&a, 8192, c"input");
    let mut h2 = 0;
    // SAFETY: valid tag and output.
    let s = unsafe { portalloc_donate(a.0, h, c"output".as_ptr(), &mut h2) };
    assert_eq!(s, PortallocStatus::Ok, "{}", last_error());
    assert_ne!(h2, h);
    for call in ["free", "info", "donate"] {
        let mut out = 0;
        // SAFETY: plain values and valid outputs.
        let s = unsafe {
            match call {
                "free" => portalloc_free(a.0, h),
                "info" => portalloc_handle_info(a.0, h, ptr::null_mut(), ptr::null_mut()),
                _ => portalloc_donate(a.0, h, ptr::null(), &mut out),
            }
        };
        assert_eq!(s, PortallocStatus::InvalidHandle, "{call}");
        let m = last_error();
        assert!(m.contains("buffer has been deleted or donated"), "{m}");
        assert!(m.contains("donated"), "{m}");
        assert!(m.contains(&format!("{h:#018x}")), "{m}");
    }
    // The consumer has the same memory.
    let mut q = ptr::null_mut();
    // SAFETY: valid output.
    unsafe { portalloc_handle_info(a.0, h2, &mut q, ptr::null_mut()) };
    assert_eq!(q, p);
    let ledger = ledger_json(&a);
    let live = ledger["live"].as_array().unwrap();
    assert_eq!(live.len(), 1);
    assert_eq!(live[0]["tag"], "output");
    assert_eq!(live[0]["donated_from"], "input");
    // Freeing by pointer frees the consumer's buffer, once.
    // SAFETY: plain values.
    assert_eq!(unsafe { portalloc_free_ptr(a.0, p) }, PortallocStatus::Ok);
    assert_eq!(
        // SAFETY: plain values.
        unsafe { portalloc_free(a.0, h2) },
        PortallocStatus::InvalidHandle
    );
    assert_eq!(stats(&a).bytes_in_use, 0);
}

#[test]
fn ledger_json_matches_the_allocations() {
    let a = make(c"bfc");
    let (h1, _) = allocate(&a, 3 * MIB, c"buffer");
    let (_h2, _) = allocate(&a, 1000, c"workspace");
    let (_h3, _) = allocate(&a, 2000, c"workspace");
    // SAFETY: plain values.
    unsafe { portalloc_free(a.0, h1) };
    let j = ledger_json(&a);
    assert_eq!(j["allocator"], "bfc");
    assert_eq!(j["allocations_made"], 3);
    assert_eq!(j["live"].as_array().unwrap().len(), 2);
    let tags = j["tags"].as_array().unwrap();
    let ws = tags.iter().find(|t| t["tag"] == "workspace").unwrap();
    assert_eq!(ws["live"], 2);
    assert_eq!(ws["bytes"], 3000);
    let buf = tags.iter().find(|t| t["tag"] == "buffer").unwrap();
    assert_eq!(
        (buf["live"].as_u64(), buf["peak_bytes"].as_u64()),
        (Some(0), Some(3 * MIB))
    );
    assert_eq!(
        j["upstream"]["bytes_in_use"].as_u64(),
        Some(stats(&a).bytes_in_use)
    );
    // A buffer too small is refused, and nothing is written into it.
    let mut small = [b'x' as c_char; 8];
    let mut len = 0;
    // SAFETY: `small` has 8 writable bytes.
    let s = unsafe { portalloc_ledger_json(a.0, small.as_mut_ptr(), small.len(), &mut len) };
    assert_eq!(s, PortallocStatus::BufferTooSmall);
    assert!(len > 8);
    assert!(small.iter().all(|&c| c == b'x' as c_char));
    // And to a file, as `portalloc ledger FILE` reads it.
    let path = std::env::temp_dir().join(format!("portalloc-ledger-{}.json", std::process::id()));
    let cpath = CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: valid path string.
    let s = unsafe { portalloc_ledger_write(a.0, cpath.as_ptr()) };
    assert_eq!(s, PortallocStatus::Ok, "{}", last_error());
    let snap =
        portalloc::adaptor::LedgerSnapshot::from_json(&std::fs::read_to_string(&path).unwrap())
            .unwrap();
    assert_eq!(snap.live.len(), 2);
    let _ = std::fs::remove_file(path);
}

#[test]
fn out_of_memory_is_a_status_with_the_diagnosis() {
    let a = make(c"bfc");
    let (mut h, mut p) = (0, ptr::null_mut());
    // SAFETY: valid outputs.
    let s = unsafe { portalloc_allocate(a.0, 48 * MIB, 0, 0, ptr::null(), &mut h, &mut p) };
    assert_eq!(s, PortallocStatus::OutOfMemory);
    let m = last_error();
    assert!(m.contains("growth exhausted"), "{m}");
    assert!(m.contains("would help"), "{m}");
    assert_eq!(h, 0, "no handle written on failure");
}

#[test]
fn last_error_is_per_thread() {
    let f = fixture();
    // SAFETY: plain values.
    unsafe { portalloc_free(f.a.0, f.freed) };
    assert!(last_error().contains("deleted or donated"));
    let other = std::thread::spawn(last_error).join().unwrap();
    assert_eq!(other, "", "another thread sees its own (empty) error text");
}

#[test]
fn status_names_and_version() {
    for s in PortallocStatus::ALL {
        // SAFETY: static text.
        let name = unsafe { CStr::from_ptr(portalloc_status_name(s as i32)) };
        assert_eq!(name.to_str().unwrap(), s.name());
    }
    for bad in [-1, 14, i32::MAX, i32::MIN] {
        // SAFETY: static text.
        let name = unsafe { CStr::from_ptr(portalloc_status_name(bad)) };
        assert_eq!(name.to_str().unwrap(), "unknown status");
    }
    // SAFETY: static text.
    let v = unsafe { CStr::from_ptr(portalloc_version()) };
    assert_eq!(v.to_str().unwrap(), env!("CARGO_PKG_VERSION"));
}

#[test]
fn every_strategy_through_the_abi() {
    for strategy in [c"bfc", c"platform", c"vmm"] {
        let a = make(strategy);
        let handles: Vec<u64> = (1..=8).map(|i| allocate(&a, i * 4096, c"t").0).collect();
        assert_eq!(stats(&a).live_allocations, 8);
        for h in handles {
            // SAFETY: plain values.
            assert_eq!(unsafe { portalloc_free(a.0, h) }, PortallocStatus::Ok);
        }
        assert_eq!(stats(&a).bytes_in_use, 0, "{strategy:?}");
    }
}

#[test]
fn destroy_frees_live_buffers() {
    let a = make(c"platform");
    let _ = allocate(&a, MIB, c"t");
    let raw = a.0;
    drop(a);
    assert_eq!(
        // SAFETY: plain values; the pointer is only looked up.
        unsafe { portalloc_destroy(raw) },
        PortallocStatus::InvalidAllocator
    );
}

// ---------------------------------------------------------------------------------------
// The PyTorch hooks, in a child process whose environment selects a small host device.

const CHILD: &str = "PORTALLOC_TEST_CAPI_CHILD";

fn child_env(cmd: &mut Command) -> &mut Command {
    cmd.env("PORTALLOC_BACKEND", "host")
        .env("PORTALLOC_HOST_CAPACITY", "64MiB")
        .env("PORTALLOC_HOST_SIMULATED", "false")
        .env("PORTALLOC_MEM_FRACTION", "0.5")
        .env("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
        .env_remove("XLA_PYTHON_CLIENT_ALLOCATOR")
        .env_remove("PORTALLOC_ALLOCATOR")
        .env_remove("XLA_CLIENT_MEM_FRACTION")
        .env_remove("XLA_PYTHON_CLIENT_MEM_FRACTION")
}

/// A command that runs the test `name` of this test executable, alone.
fn this_test_alone(name: &str) -> Command {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", name, "--nocapture", "--test-threads=1"]);
    cmd
}

/// Runs `cmd` to its end: whether it succeeded, and its output (stdout, then stderr).
fn run_to_end(cmd: &mut Command) -> (bool, String) {
    let out = cmd.output().unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

/// The standard output of `cmd`, which must succeed: a failure shows its standard error.
fn stdout_of(cmd: &mut Command) -> Vec<u8> {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{cmd:?} did not start: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// Asserts that a run of [`run_to_end`] succeeded and printed `marker`; a failure shows
/// `context` and the output.
fn assert_ran_to((succeeded, text): (bool, String), marker: &str, context: &str) {
    assert!(succeeded, "{context}{text}");
    assert!(text.contains(marker), "{context}{text}");
}

/// A private copy of the conformance driver `name` (`fakecuda`, `fakehip`) for one child
/// process (its books are per process, and a copy keeps a parallel test's out of them);
/// removed on drop.
#[cfg(any(feature = "cuda", feature = "hip"))]
struct DriverCopy(PathBuf);

#[cfg(any(feature = "cuda", feature = "hip"))]
impl DriverCopy {
    fn new(name: &str, tag: &str) -> DriverCopy {
        let lib = std::env::temp_dir().join(format!(
            "portalloc-capi-{tag}-{}-lib{name}.so",
            std::process::id()
        ));
        std::fs::copy(support::driver(name), &lib).unwrap();
        DriverCopy(lib)
    }

    /// Points `cmd` at this driver (for either vendor: the fakes take 256 MiB a device) with
    /// `strategy` and `preallocate` chosen through XLA's variables, half the memory, and no
    /// other variable choosing the allocator; the caller sets the backend.
    fn configure<'c>(
        &self,
        cmd: &'c mut Command,
        strategy: &str,
        preallocate: &str,
    ) -> &'c mut Command {
        cmd.env("PORTALLOC_CUDA_LIBRARY", &self.0)
            .env("PORTALLOC_HIP_LIBRARY", &self.0)
            .env("FAKECUDA_CAPACITY", (256 * MIB).to_string())
            .env("FAKEHIP_CAPACITY", (256 * MIB).to_string())
            .env("PORTALLOC_MEM_FRACTION", "0.5")
            .env("XLA_PYTHON_CLIENT_ALLOCATOR", strategy)
            .env("XLA_PYTHON_CLIENT_PREALLOCATE", preallocate)
            .env_remove("PORTALLOC_ALLOCATOR")
            .env_remove("PORTALLOC_PEER_ACCESS")
            .env_remove("XLA_CLIENT_MEM_FRACTION")
            .env_remove("XLA_PYTHON_CLIENT_MEM_FRACTION")
            .env_remove("TF_GPU_ALLOCATOR")
    }
}

#[cfg(any(feature = "cuda", feature = "hip"))]
impl Drop for DriverCopy {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[test]
fn torch_hooks() {
    let ran = run_to_end(child_env(&mut this_test_alone("torch_hooks_in_child")).env(CHILD, "1"));
    // The child installs no `tracing` subscriber, as a C or Python program does not: the
    // out-of-memory null it got is explained on standard error, report included.
    let oom = "portalloc: warning: portalloc_torch_alloc(size 1099511627776, device 0) failed \
               (PORTALLOC_STATUS_OUT_OF_MEMORY); returning null, which PyTorch keeps as the \
               tensor's pointer";
    assert!(
        ran.1.contains(oom),
        "no OOM warning on standard error:\n{}",
        ran.1
    );
    assert!(
        ran.1.contains("largest free chunk:"),
        "the warning lacks the report:\n{}",
        ran.1
    );
    assert_ran_to(ran, "1 passed", "");
}

#[test]
fn torch_hooks_in_child() {
    if std::env::var(CHILD).is_err() {
        return; // Run by `torch_hooks` with the environment it needs.
    }
    let p = portalloc_torch_alloc(1 << 20, 0, 0x1234 as *mut c_void);
    assert!(!p.is_null(), "{}", last_error());
    // Real host memory: usable.
    // SAFETY: 1 MiB of real host memory just allocated for this test.
    unsafe { std::ptr::write_bytes(p.cast::<u8>(), 0xab, 1 << 20) };
    let mut g = ptr::null_mut();
    // SAFETY: valid output.
    assert_eq!(unsafe { portalloc_global(0, &mut g) }, PortallocStatus::Ok);
    let global = Alloc(g);
    let j = ledger_json(&global);
    assert_eq!(j["live"][0]["tag"], "torch");
    assert_eq!(j["live"][0]["stream"], 0x1234);
    assert_eq!(j["live"][0]["size"], 1 << 20);
    // The global allocator cannot be destroyed.
    assert_eq!(
        // SAFETY: plain value.
        unsafe { portalloc_destroy(g) },
        PortallocStatus::InvalidArgument
    );
    assert!(last_error().contains("cannot be destroyed"));
    std::mem::forget(global);
    // Hostile sizes: null, with a message.
    assert!(portalloc_torch_alloc(-1, 0, ptr::null_mut()).is_null());
    assert!(last_error().contains("negative"));
    assert!(portalloc_torch_alloc(0, 0, ptr::null_mut()).is_null());
    assert!(portalloc_torch_alloc(isize::MAX, 0, ptr::null_mut()).is_null());
    assert!(portalloc_torch_alloc(1024, -3, ptr::null_mut()).is_null());
    assert!(portalloc_torch_alloc(1024, 5, ptr::null_mut()).is_null());
    assert!(last_error().contains("device 5"), "{}", last_error());
    // Out of memory (1 TiB of a 64 MiB device): null, and a warning the parent reads.
    assert!(portalloc_torch_alloc(1 << 40, 0, ptr::null_mut()).is_null());
    assert!(last_error().contains("out of memory"), "{}", last_error());
    portalloc_torch_free(p, 1 << 20, 0, ptr::null_mut());
    // Double free and foreign pointers are refused, not freed.
    portalloc_torch_free(p, 1 << 20, 0, ptr::null_mut());
    assert!(last_error().contains("not the start of a live buffer"));
    let mine = Box::new(7u64);
    portalloc_torch_free(
        (&*mine as *const u64).cast_mut().cast(),
        8,
        0,
        ptr::null_mut(),
    );
    portalloc_torch_free(ptr::null_mut(), 0, 0, ptr::null_mut());
    let mut s = PortallocStats::default();
    // SAFETY: valid output.
    unsafe { portalloc_stats(g, &mut s) };
    assert_eq!((s.live_allocations, s.bytes_in_use), (0, 0));
}

// ---------------------------------------------------------------------------------------
// Foreign streams through the PyTorch hooks and the C ABI: in a child process whose
// environment selects the CUDA backend over a private copy of the conformance driver, the
// streams are made with the driver's own cuStreamCreate (as PyTorch makes its side streams),
// and the caller's work on them is held in flight with the driver's event controls.

#[cfg(feature = "cuda")]
const FOREIGN_CHILD: &str = "PORTALLOC_TEST_CAPI_FOREIGN_CHILD";

#[cfg(feature = "cuda")]
#[test_case("bfc", "true" ; "bfc")]
#[test_case("bfc", "false" ; "bfc growing")]
#[test_case("vmm", "false" ; "vmm")]
#[test_case("cuda_async", "false" ; "async")]
#[test_case("platform", "false" ; "platform")]
fn foreign_streams_through_the_hooks(strategy: &str, preallocate: &str) {
    let driver = DriverCopy::new("fakecuda", &format!("foreign-{strategy}-{preallocate}"));
    let mut child = this_test_alone("foreign_streams_child");
    driver
        .configure(&mut child, strategy, preallocate)
        .env(FOREIGN_CHILD, "1")
        .env("PORTALLOC_BACKEND", "cuda");
    let ran = run_to_end(&mut child);
    assert_ran_to(ran, "foreign streams: ok", &format!("{strategy}: "));
}

#[cfg(feature = "cuda")]
#[test]
fn foreign_streams_child() {
    if std::env::var(FOREIGN_CHILD).is_err() {
        return; // Run by `foreign_streams_through_the_hooks` with the environment it needs.
    }
    let path = std::env::var("PORTALLOC_CUDA_LIBRARY").unwrap();
    // The conformance driver, already loaded by portalloc under the same path (one instance).
    let fake = support::fakes::Fake::at(&path);
    let init: unsafe extern "C" fn(u32) -> i32 = fake.sym("cuInit");
    // SAFETY: flags 0.
    assert_eq!(unsafe { init(0) }, 0);
    // PyTorch's runtime makes device 0's primary context current on its thread; portalloc's
    // calls leave it so.
    let ctx = fake.primary(0);
    fake.set_current(ctx);
    let first = portalloc_torch_alloc(4096, 0, ptr::null_mut());
    assert!(!first.is_null(), "{}", last_error());
    assert_eq!(
        fake.current(),
        ctx,
        "the hook changed the caller's current context"
    );
    let (s, t, u) = (
        support::targets::caller_stream(&fake),
        support::targets::caller_stream(&fake),
        support::targets::caller_stream(&fake),
    );
    let overlaps = |p: *mut c_void, q: *mut c_void, len: usize| {
        let (p, q) = (p as usize, q as usize);
        p < q + len && q < p + len
    };
    const LEN: usize = 1 << 20;
    let raw = |st: portalloc::Stream| st.as_raw() as usize as *mut c_void;

    // The PyTorch hooks: a buffer used on S by a kernel still running, freed on S.
    let keep_t = portalloc_torch_alloc(4096, 0, raw(t));
    assert!(!keep_t.is_null(), "{}", last_error());
    let x = portalloc_torch_alloc(LEN as isize, 0, raw(s));
    assert!(!x.is_null(), "{}", last_error());
    let work = fake.launch(s, x as u64, LEN as u64);
    portalloc_torch_free(x, LEN as isize, 0, raw(s));
    let on_t = portalloc_torch_alloc(LEN as isize, 0, raw(t));
    assert!(!on_t.is_null(), "{}", last_error());
    assert!(
        !overlaps(on_t, x, LEN) || fake.ordered(work, t),
        "the hook handed memory a kernel on S still uses to T, with nothing ordering T after it"
    );

    // The C ABI on the global allocator: the same with its own calls, on U.
    let mut g = ptr::null_mut();
    // SAFETY: valid output.
    assert_eq!(unsafe { portalloc_global(0, &mut g) }, PortallocStatus::Ok);
    let (mut h, mut y) = (0u64, ptr::null_mut());
    // SAFETY: valid outputs and tag.
    let status =
        unsafe { portalloc_allocate(g, LEN as u64, 0, s.as_raw(), c"y".as_ptr(), &mut h, &mut y) };
    assert_eq!(status, PortallocStatus::Ok, "{}", last_error());
    let work2 = fake.launch(s, y as u64, LEN as u64);
    // SAFETY: a handle this allocator issued.
    assert_eq!(unsafe { portalloc_free(g, h) }, PortallocStatus::Ok);
    let (mut h2, mut z) = (0u64, ptr::null_mut());
    // SAFETY: valid outputs and tag.
    let status =
        unsafe { portalloc_allocate(g, LEN as u64, 0, u.as_raw(), c"z".as_ptr(), &mut h2, &mut z) };
    assert_eq!(status, PortallocStatus::Ok, "{}", last_error());
    assert!(
        !overlaps(z, y, LEN) || fake.ordered(work2, u),
        "the C ABI handed memory a kernel on S still uses to U, with nothing ordering U after it"
    );

    // A buffer of T used by a kernel on a side stream U (record_stream): its free waits for
    // that kernel, whatever stream asks next.
    let side = portalloc_torch_alloc(LEN as isize, 0, raw(t));
    assert!(!side.is_null(), "{}", last_error());
    // SAFETY: the global allocator; U is the caller's live stream.
    let recorded = unsafe { portalloc_record_stream(g, side, u.as_raw()) };
    assert_eq!(recorded, PortallocStatus::Ok, "{}", last_error());
    let on_side = fake.launch(u, side as u64, LEN as u64);
    portalloc_torch_free(side, LEN as isize, 0, raw(t));
    for st in [t, s] {
        let next = portalloc_torch_alloc(LEN as isize, 0, raw(st));
        assert!(!next.is_null(), "{}", last_error());
        assert!(
            !overlaps(next, side, LEN) || fake.ordered(on_side, st),
            "memory a kernel on the recorded side stream still uses was handed out again"
        );
        portalloc_torch_free(next, LEN as isize, 0, raw(st));
    }
    fake.finish(on_side);

    // The same buffer case with the side stream another thread's per-thread default stream
    // (handle 2 names a different stream on each thread): that thread records it and runs a
    // kernel there; the free here cannot be ordered by an event on this thread's per-thread
    // stream, so the memory must not come back before that kernel.
    let shared = portalloc_torch_alloc(LEN as isize, 0, raw(t));
    assert!(!shared.is_null(), "{}", last_error());
    let (shared_at, global_at) = (shared as usize, g as usize);
    let on_other_thread = std::thread::scope(|scope| {
        scope
            .spawn(|| {
                fake.set_current(ctx);
                let (shared, g) = (
                    shared_at as *mut c_void,
                    global_at as *mut PortallocAllocator,
                );
                let per_thread = portalloc::Stream::PER_THREAD;
                // SAFETY: the global allocator; the per-thread default stream is always live.
                let recorded = unsafe { portalloc_record_stream(g, shared, per_thread.as_raw()) };
                assert_eq!(recorded, PortallocStatus::Ok, "{}", last_error());
                fake.launch(per_thread, shared_at as u64, LEN as u64)
            })
            .join()
            .unwrap()
    });
    portalloc_torch_free(shared, LEN as isize, 0, raw(t));
    for st in [t, s] {
        let next = portalloc_torch_alloc(LEN as isize, 0, raw(st));
        assert!(!next.is_null(), "{}", last_error());
        assert!(
            !overlaps(next, shared, LEN)
                || fake.kernel_done(on_other_thread)
                || fake.ordered(on_other_thread, st),
            "memory a kernel on another thread's recorded per-thread stream still uses was \
             handed out again"
        );
        portalloc_torch_free(next, LEN as isize, 0, raw(st));
    }
    fake.finish(on_other_thread);

    for k in [work, work2] {
        fake.finish(k);
    }
    for (p, st) in [(first, portalloc::Stream::DEFAULT), (keep_t, t), (on_t, t)] {
        portalloc_torch_free(p, 0, 0, raw(st));
    }
    // SAFETY: a handle this allocator issued.
    assert_eq!(unsafe { portalloc_free(g, h2) }, PortallocStatus::Ok);
    // A free after the side stream's kernel completed hands the deferred buffer back.
    let last = portalloc_torch_alloc(4096, 0, raw(t));
    portalloc_torch_free(last, 4096, 0, raw(t));
    let mut st = PortallocStats::default();
    // SAFETY: valid output.
    unsafe { portalloc_stats(g, &mut st) };
    assert_eq!((st.live_allocations, st.bytes_in_use), (0, 0));
    assert_eq!(
        fake.current(),
        ctx,
        "a call changed the caller's current context"
    );
    let (hazards, first_hazard) = fake.hazards();
    assert_eq!(hazards, 0, "{first_hazard}");
    support::targets::destroy_caller_streams(&fake, &[s, t, u]);
    println!("foreign streams: ok");
}

// ---------------------------------------------------------------------------------------
// The caller's current device, through the hooks and the C ABI, in a child process whose
// conformance driver has two devices: the caller works on device 1 (torch.cuda.set_device(1),
// hipSetDevice(1)) while portalloc serves device 0.

const DEVICE_CHILD: &str = "PORTALLOC_TEST_CAPI_DEVICE_CHILD";

#[cfg(feature = "cuda")]
#[test_case("cuda", "platform" ; "cuda platform")]
#[test_case("cuda", "bfc" ; "cuda bfc")]
#[test_case("cuda", "vmm" ; "cuda vmm")]
#[test_case("cuda", "cuda_async" ; "cuda async")]
fn the_callers_current_device_is_kept(vendor: &str, strategy: &str) {
    callers_device_in_child(vendor, strategy);
}

#[cfg(feature = "hip")]
#[test_case("hip", "platform" ; "hip platform")]
#[test_case("hip", "vmm" ; "hip vmm")]
fn the_callers_current_hip_device_is_kept(vendor: &str, strategy: &str) {
    callers_device_in_child(vendor, strategy);
}

#[cfg(any(feature = "cuda", feature = "hip"))]
fn callers_device_in_child(vendor: &str, strategy: &str) {
    let name = if vendor == "hip" {
        "fakehip"
    } else {
        "fakecuda"
    };
    let driver = DriverCopy::new(name, &format!("device-{vendor}-{strategy}"));
    let mut child = this_test_alone("callers_device_child");
    driver
        .configure(&mut child, strategy, "false")
        .env(DEVICE_CHILD, vendor)
        .env("PORTALLOC_BACKEND", vendor)
        .env("FAKECUDA_DEVICES", "2")
        .env("FAKEHIP_DEVICES", "2")
        .env("FAKEHIP_VERSION", "7.0");
    let ran = run_to_end(&mut child);
    assert_ran_to(
        ran,
        "caller's device: ok",
        &format!("{vendor} {strategy}: "),
    );
}

#[test]
fn callers_device_child() {
    let Ok(vendor) = std::env::var(DEVICE_CHILD) else {
        return; // Run by `the_callers_current_device_is_kept` with the environment it needs.
    };
    #[cfg(any(feature = "cuda", feature = "hip"))]
    {
        use support::fakes::Fake;
        let var = if vendor == "hip" {
            "PORTALLOC_HIP_LIBRARY"
        } else {
            "PORTALLOC_CUDA_LIBRARY"
        };
        let fake = Fake::at(std::env::var(var).unwrap());
        let cuda = vendor == "cuda";
        if cuda {
            let init: unsafe extern "C" fn(u32) -> i32 = fake.sym("cuInit");
            // SAFETY: flags 0.
            assert_eq!(unsafe { init(0) }, 0);
        }
        // The caller works on device 1.
        let theirs = fake.primary(1);
        fake.set_current(theirs);
        let contexts = cuda.then(|| fake.live("contexts"));
        let check = |after: &str| {
            assert_eq!(
                fake.current(),
                theirs,
                "{after} changed the caller's current {}",
                if cuda { "context" } else { "device" }
            );
        };
        let p = portalloc_torch_alloc(MIB as isize, 0, ptr::null_mut());
        assert!(!p.is_null(), "{}", last_error());
        check("portalloc_torch_alloc (the first: discovery and opening)");
        // Only device 0 was opened: one primary context more, one pool at most.
        if let Some(before) = contexts {
            assert_eq!(
                fake.live("contexts"),
                before + 1,
                "portalloc retained a context of a device nobody asked for"
            );
        }
        assert!(
            fake.live("pools") <= 1,
            "a pool was made on a device nobody asked for"
        );
        portalloc_torch_free(p, MIB as isize, 0, ptr::null_mut());
        check("portalloc_torch_free");
        let mut g = ptr::null_mut();
        // SAFETY: valid output.
        assert_eq!(unsafe { portalloc_global(0, &mut g) }, PortallocStatus::Ok);
        check("portalloc_global");
        let (mut h, mut q) = (0u64, ptr::null_mut());
        // SAFETY: valid outputs and tag.
        let status = unsafe { portalloc_allocate(g, 3 * MIB, 0, 0, c"q".as_ptr(), &mut h, &mut q) };
        assert_eq!(status, PortallocStatus::Ok, "{}", last_error());
        check("portalloc_allocate");
        // SAFETY: a handle of this allocator; valid output.
        unsafe {
            let mut released = 0;
            assert_eq!(portalloc_free(g, h), PortallocStatus::Ok);
            check("portalloc_free");
            assert_eq!(portalloc_trim(g, &mut released), PortallocStatus::Ok);
            check("portalloc_trim");
        }
        // The caller's own next allocation lands on its device, 1.
        if cuda {
            let alloc: unsafe extern "C" fn(*mut u64, usize) -> i32 = fake.sym("cuMemAlloc_v2");
            let free: unsafe extern "C" fn(u64) -> i32 = fake.sym("cuMemFree_v2");
            let used: unsafe extern "C" fn(i32) -> u64 = fake.sym("fakecuda_device_used");
            let mut d = 0u64;
            // SAFETY: one pointer written; then freed once; by value.
            unsafe {
                let before = used(1);
                assert_eq!(alloc(&mut d, 4096), 0, "the caller's cuMemAlloc failed");
                assert!(
                    used(1) > before,
                    "the caller's cuMemAlloc did not land on device 1"
                );
                assert_eq!(free(d), 0);
            }
        } else {
            let malloc: unsafe extern "C" fn(*mut *mut c_void, usize) -> i32 =
                fake.sym("hipMalloc");
            let free: unsafe extern "C" fn(*mut c_void) -> i32 = fake.sym("hipFree");
            let last: unsafe extern "C" fn() -> i32 = fake.sym("fakehip_last_device");
            let mut d = ptr::null_mut();
            // SAFETY: one pointer written; then freed once.
            unsafe {
                assert_eq!(malloc(&mut d, 4096), 0);
                assert_eq!(last(), 1, "the caller's hipMalloc did not land on device 1");
                assert_eq!(free(d), 0);
            }
        }
        println!("caller's device: ok");
    }
    #[cfg(not(any(feature = "cuda", feature = "hip")))]
    let _ = vendor;
}

// ---------------------------------------------------------------------------------------
// The versions of PortallocOptions: sized entry points, and 0.1.0's callers.

/// What `portalloc_options_init` answers for each size of struct, and which bytes of a
/// 128-byte buffer it writes: exactly the first `size` on success, none on a refusal.
#[test_case(OPTIONS_SIZE, PortallocStatus::Ok, "" ; "this header's size")]
#[test_case(std::mem::size_of::<OptionsV1>(), PortallocStatus::Ok, "" ; "0.1.0's size")]
#[test_case(0, PortallocStatus::InvalidArgument, "0 bytes is not the size of any layout" ; "zero")]
#[test_case(std::mem::size_of::<OptionsV1>() - 1, PortallocStatus::InvalidArgument, "not the size of any layout" ; "one byte short of 0.1.0's")]
#[test_case(std::mem::size_of::<OptionsV1>() + 4, PortallocStatus::InvalidArgument, "not the size of any layout" ; "between the layouts")]
#[test_case(OPTIONS_SIZE + 8, PortallocStatus::Unsupported, "newer portalloc.h" ; "a newer header's")]
fn options_init_writes_the_size_it_is_given(size: usize, status: PortallocStatus, text: &str) {
    #[repr(C, align(8))]
    struct Buffer([u8; 128]);
    let mut buffer = Buffer([0xa5; 128]);
    // SAFETY: 128 writable bytes, aligned for a PortallocOptions; `size` is at most 128.
    let got = unsafe { portalloc_options_init(buffer.0.as_mut_ptr().cast(), size) };
    assert_eq!(got, status, "{}", last_error());
    let written = if got == PortallocStatus::Ok { size } else { 0 };
    assert!(
        buffer.0[written..].iter().all(|&b| b == 0xa5),
        "bytes past {written} were written"
    );
    if got != PortallocStatus::Ok {
        assert!(last_error().contains(text), "{}", last_error());
        return;
    }
    // The first layout's fields at their defaults, whichever the size.
    // SAFETY: at least 0.1.0's bytes were written; an OptionsV1 is read from them.
    let v1 = unsafe { buffer.0.as_ptr().cast::<OptionsV1>().read() };
    assert!(v1.strategy.is_null() && v1.backend.is_null());
    assert_eq!(
        (v1.mem_fraction, v1.preallocate, v1.host_capacity),
        (0.0, -1, 0)
    );
    assert_eq!(
        (v1.host_simulated, v1.backtrace, v1.device, v1.ignore_env),
        (-1, -1, 0, 0)
    );
    if size == OPTIONS_SIZE {
        // SAFETY: every byte of a PortallocOptions was written.
        let o = unsafe { buffer.0.as_ptr().cast::<PortallocOptions>().read() };
        assert_eq!(o.peer_access, -1, "peer access defers to the environment");
    }
}

#[test]
fn create_sized_refuses_sizes_of_no_layout() {
    let o = default_options();
    for (size, status) in [
        (0, PortallocStatus::InvalidArgument),
        (OPTIONS_SIZE - 4, PortallocStatus::InvalidArgument),
        (OPTIONS_SIZE + 8, PortallocStatus::Unsupported),
    ] {
        let mut out = ptr::null_mut();
        // SAFETY: `o` is readable for OPTIONS_SIZE bytes; larger sizes are refused before any
        // byte is read.
        let got = unsafe { portalloc_create_sized(&o, size, &mut out) };
        assert_eq!(got, status, "size {size}: {}", last_error());
        assert!(out.is_null(), "size {size}");
        assert!(
            last_error().contains("PortallocOptions"),
            "{}",
            last_error()
        );
    }
}

/// The functions a program compiled against portalloc 0.1.0's header calls, on its struct
/// (which ends at `ignore_env`) followed by bytes it does not own: `portalloc_options_default`
/// writes the first layout and nothing after it, and `portalloc_create` reads nothing after
/// it — here 0x7f bytes, which as `peer_access` would be refused — so the allocator is made
/// and works.
#[test]
fn callers_compiled_against_the_first_layout_keep_working() {
    let mut g = GuardedV1::new(0x7f);
    assert_eq!(
        // SAFETY: `g.options` is valid for writing 0.1.0's struct.
        unsafe { portalloc_options_default(g.as_options()) },
        PortallocStatus::Ok
    );
    assert_eq!(
        g.after, [0x7f; 32],
        "portalloc_options_default wrote past 0.1.0's struct"
    );
    assert_eq!(
        (
            g.options.preallocate,
            g.options.host_simulated,
            g.options.ignore_env
        ),
        (-1, -1, 0)
    );
    g.options.ignore_env = 1;
    g.options.backend = c"host".as_ptr();
    g.options.host_simulated = 1;
    g.options.host_capacity = 64 * MIB;
    g.options.strategy = c"bfc".as_ptr();
    g.options.preallocate = 0;
    let mut a = ptr::null_mut();
    // SAFETY: 0.1.0's struct with static strings; `a` valid for one pointer.
    let status = unsafe { portalloc_create(g.as_options(), &mut a) };
    assert_eq!(status, PortallocStatus::Ok, "{}", last_error());
    let a = Alloc(a);
    let (h, p) = allocate(&a, 4096, c"v1");
    assert!(!p.is_null());
    // SAFETY: plain values.
    assert_eq!(unsafe { portalloc_free(a.0, h) }, PortallocStatus::Ok);
    // A 0.1.0 struct's fields are still checked.
    g.options.backtrace = 5;
    let mut b = ptr::null_mut();
    // SAFETY: as above.
    let status = unsafe { portalloc_create(g.as_options(), &mut b) };
    assert_eq!(status, PortallocStatus::InvalidArgument);
    assert!(last_error().contains("backtrace"), "{}", last_error());
}

// ---------------------------------------------------------------------------------------
// Peer access through the C ABI, over the CUDA conformance drivers (two devices; the vmm
// strategy grants the devices with peer access to what it maps, which the fake records), in
// a child process whose environment names the driver.

#[cfg(feature = "cuda")]
const PEER_CHILD: &str = "PORTALLOC_TEST_CAPI_PEER_CHILD";

/// How the child makes its allocator: with this header's struct and its `peer_access`
/// value, or with 0.1.0's struct (no such field).
#[cfg(feature = "cuda")]
#[derive(Debug, Clone, Copy)]
enum Layout {
    Current(i32),
    V1,
}

#[cfg(feature = "cuda")]
impl Layout {
    /// The child's variable: the value of `peer_access`, or `v1`.
    fn var(self) -> String {
        match self {
            Layout::Current(peer_access) => peer_access.to_string(),
            Layout::V1 => "v1".into(),
        }
    }
}

#[cfg(feature = "cuda")]
#[test_case("fakecuda", Layout::Current(1), None, true ; "on")]
#[test_case("fakecuda", Layout::Current(0), Some("1"), false ; "off beats the environment")]
#[test_case("fakecuda", Layout::Current(-1), Some("1"), true ; "the environment")]
#[test_case("fakecuda", Layout::Current(-1), None, false ; "off by default")]
#[test_case("fakecuda", Layout::V1, Some("1"), true ; "first layout the environment")]
#[test_case("fakecuda", Layout::V1, None, false ; "first layout off by default")]
#[test_case("fakecuda_nopeer", Layout::Current(1), None, false ; "driver without peer calls no-op")]
#[test_case("fakecuda_nopeer", Layout::V1, Some("1"), false ; "driver without peer calls first layout no-op")]
fn peer_access_through_the_abi(driver: &str, layout: Layout, env: Option<&str>, enabled: bool) {
    let fake = support::fakes::Fake::copy(driver);
    let mut cmd = this_test_alone("peer_access_child");
    cmd.env(PEER_CHILD, layout.var())
        .env("PORTALLOC_TEST_CAPI_PEER_EXPECT", enabled.to_string())
        .env("PORTALLOC_TEST_CAPI_PEER_DRIVER", fake.path())
        .env(portalloc::config::PORTALLOC_CUDA_LIBRARY, fake.path())
        .env("PORTALLOC_BACKEND", "cuda")
        .env("FAKECUDA_DEVICES", "2")
        .env_remove("PORTALLOC_ALLOCATOR")
        .env_remove("XLA_PYTHON_CLIENT_ALLOCATOR")
        .env_remove("PORTALLOC_MEM_FRACTION")
        .env_remove("XLA_CLIENT_MEM_FRACTION")
        .env_remove("XLA_PYTHON_CLIENT_MEM_FRACTION");
    match env {
        Some(v) => cmd.env("PORTALLOC_PEER_ACCESS", v),
        None => cmd.env_remove("PORTALLOC_PEER_ACCESS"),
    };
    assert_ran_to(run_to_end(&mut cmd), "peer child: ok", "");
}

#[cfg(feature = "cuda")]
#[test]
fn peer_access_child() {
    let Ok(layout) = std::env::var(PEER_CHILD) else {
        return; // Run by `peer_access_through_the_abi` with the environment it needs.
    };
    let expect: bool = std::env::var("PORTALLOC_TEST_CAPI_PEER_EXPECT")
        .unwrap()
        .parse()
        .unwrap();
    // The driver portalloc loads: the same library, so the fake's records are its.
    let fake = support::fakes::Fake::at(std::env::var("PORTALLOC_TEST_CAPI_PEER_DRIVER").unwrap());
    let mut a = ptr::null_mut();
    let status = if layout == "v1" {
        let mut g = GuardedV1::new(0x7f);
        // SAFETY: 0.1.0's struct, then static strings; `a` valid for one pointer.
        unsafe {
            assert_eq!(
                portalloc_options_default(g.as_options()),
                PortallocStatus::Ok
            );
            g.options.strategy = c"vmm".as_ptr();
            g.options.mem_fraction = 0.5;
            portalloc_create(g.as_options(), &mut a)
        }
    } else {
        let value: i32 = layout.parse().unwrap();
        let mut o = default_options();
        o.strategy = c"vmm".as_ptr();
        o.mem_fraction = 0.5;
        o.peer_access = value;
        // SAFETY: this header's struct with static strings; `a` valid for one pointer.
        unsafe { portalloc_create_sized(&o, OPTIONS_SIZE, &mut a) }
    };
    // Asked for or not, on a driver without the peer calls too, the allocator is made.
    assert_eq!(status, PortallocStatus::Ok, "{}", last_error());
    let a = Alloc(a);
    assert_eq!(
        (fake.peer_enabled(0, 1), fake.peer_enabled(1, 0)),
        (expect, expect),
        "peer access between the two devices"
    );
    let (h, p) = allocate(&a, 3 * MIB, c"shared");
    assert_eq!(
        (fake.access(p as u64, 0), fake.access(p as u64, 1)),
        (Some(true), Some(expect)),
        "vmm's grant of device 1"
    );
    // SAFETY: plain values.
    assert_eq!(unsafe { portalloc_free(a.0, h) }, PortallocStatus::Ok);
    drop(a);
    println!("peer child: ok");
}

// ---------------------------------------------------------------------------------------
// Tags that can sleep: declared by portalloc_declare_sleep_tag and by setting a thread or a
// process tag; the process tag across threads; a donated buffer and a deferred free under a
// sleep. A process tag, once set, labels every untagged buffer of the process: those tests
// run in a child process of their own.

/// The tag and the sleep state the ledger gives the live buffer at `p`.
fn live_tag(a: *mut PortallocAllocator, p: *mut c_void) -> (String, bool) {
    let a = std::mem::ManuallyDrop::new(Alloc(a));
    let j = ledger_json(&a);
    let entry = j["live"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["ptr"].as_u64() == Some(p as u64))
        .unwrap_or_else(|| panic!("no live buffer at {p:?} in {}", j["live"]))
        .clone();
    (
        entry["tag"].as_str().unwrap().to_string(),
        entry["asleep"].as_bool().unwrap_or(false),
    )
}

/// Allocates with a null tag (the thread's, else the process's, else `buffer`).
fn allocate_untagged(a: *mut PortallocAllocator, size: u64) -> (u64, *mut c_void) {
    let (mut h, mut p) = (0u64, ptr::null_mut());
    // SAFETY: a null tag and valid outputs.
    let s = unsafe { portalloc_allocate(a, size, 0, 0, ptr::null(), &mut h, &mut p) };
    assert_eq!(s, PortallocStatus::Ok, "{}", last_error());
    (h, p)
}

fn set_thread_tag(tag: Option<&CStr>) -> PortallocStatus {
    // SAFETY: null or a valid string.
    unsafe { portalloc_set_thread_tag(tag.map_or(ptr::null(), CStr::as_ptr)) }
}

fn set_process_tag(tag: Option<&CStr>) -> PortallocStatus {
    // SAFETY: null or a valid string.
    unsafe { portalloc_set_process_tag(tag.map_or(ptr::null(), CStr::as_ptr)) }
}

fn sleep(a: &Alloc, tag: &CStr, keep: bool) {
    // SAFETY: a valid tag.
    let s = unsafe { portalloc_sleep(a.0, tag.as_ptr(), keep) };
    assert_eq!(s, PortallocStatus::Ok, "sleep {tag:?}: {}", last_error());
}

fn wake(a: &Alloc, tag: &CStr) {
    // SAFETY: a valid tag.
    let s = unsafe { portalloc_wake(a.0, tag.as_ptr()) };
    assert_eq!(s, PortallocStatus::Ok, "wake {tag:?}: {}", last_error());
}

fn bytes_asleep(a: &Alloc) -> u64 {
    let mut asleep = 0;
    // SAFETY: a valid output; the other is null.
    let s = unsafe { portalloc_sleep_stats(a.0, &mut asleep, ptr::null_mut()) };
    assert_eq!(s, PortallocStatus::Ok, "{}", last_error());
    asleep
}

/// The three calls that take a tag that can sleep refuse an empty tag, one over 1024 bytes
/// and text that is not UTF-8, each with INVALID_ARGUMENT and a message naming the call and
/// what is wrong; `portalloc_declare_sleep_tag` refuses null as every call refuses a null
/// required pointer. A refused thread tag leaves the thread's tag as it was.
#[test]
fn sleep_tags_refuse_empty_oversize_and_non_utf8_tags() {
    type SetTag = unsafe extern "C" fn(*const c_char) -> PortallocStatus;
    let calls: [(&str, SetTag); 3] = [
        ("portalloc_declare_sleep_tag", portalloc_declare_sleep_tag),
        ("portalloc_set_thread_tag", portalloc_set_thread_tag),
        ("portalloc_set_process_tag", portalloc_set_process_tag),
    ];
    let oversize = CString::new("x".repeat(1025)).unwrap();
    let not_utf8 = [0xffu8, 0xfe, 0];
    for (name, call) in calls {
        let cases: [(*const c_char, &[&str]); 3] = [
            (c"".as_ptr(), &["`tag` is empty", "non-empty"]),
            (oversize.as_ptr(), &["1025 bytes", "at most 1024"]),
            (not_utf8.as_ptr().cast(), &["not UTF-8"]),
        ];
        for (tag, words) in cases {
            // SAFETY: NUL-terminated text.
            let s = unsafe { call(tag) };
            assert_eq!(
                s,
                PortallocStatus::InvalidArgument,
                "{name}: {}",
                last_error()
            );
            let message = last_error();
            assert!(message.starts_with(name), "{message}");
            assert_mentions_all(&message, words);
        }
    }
    // SAFETY: null is refused, never read.
    let s = unsafe { portalloc_declare_sleep_tag(ptr::null()) };
    assert_eq!(s, PortallocStatus::NullArgument);
    assert_mentions_all(
        &last_error(),
        &["portalloc_declare_sleep_tag", "`tag` is null"],
    );
    // 1024 bytes is the most, and accepted.
    let longest = CString::new("y".repeat(1024)).unwrap();
    // SAFETY: a valid string.
    let s = unsafe { portalloc_declare_sleep_tag(longest.as_ptr()) };
    assert_eq!(s, PortallocStatus::Ok, "{}", last_error());
    assert!(portalloc::sleep_tags::is_sleepable(
        longest.to_str().unwrap()
    ));

    // A refused thread tag changes nothing: the buffers are still labelled with the one set.
    let a = make(c"bfc");
    assert_eq!(set_thread_tag(Some(c"capi-kept")), PortallocStatus::Ok);
    assert_eq!(set_thread_tag(Some(c"")), PortallocStatus::InvalidArgument);
    assert_eq!(
        set_thread_tag(Some(oversize.as_c_str())),
        PortallocStatus::InvalidArgument
    );
    let (_, p) = allocate_untagged(a.0, 4096);
    assert_eq!(live_tag(a.0, p).0, "capi-kept");
    assert_eq!(set_thread_tag(None), PortallocStatus::Ok);
}

/// What a call is given for its tag, in [`one_rule_for_tags_in_every_call`].
#[derive(Debug, Clone, Copy)]
enum TagCall {
    Allocate,
    Donate,
    Sleep,
    Wake,
    SetThreadTag,
}

/// Runs `call` on a fresh vmm allocator with `tag`; its status and the error text.
fn tag_call(call: TagCall, tag: &CStr) -> (PortallocStatus, String) {
    let a = make(c"vmm");
    let (mut h, mut p) = (0u64, ptr::null_mut());
    // SAFETY: a valid tag and outputs.
    let s = unsafe { portalloc_allocate(a.0, 4096, 0, 0, c"kept".as_ptr(), &mut h, &mut p) };
    assert_eq!(s, PortallocStatus::Ok, "{}", last_error());
    let mut new = 0u64;
    // SAFETY: each with a NUL-terminated tag and valid outputs.
    let status = unsafe {
        match call {
            TagCall::Allocate => portalloc_allocate(a.0, 4096, 0, 0, tag.as_ptr(), &mut h, &mut p),
            TagCall::Donate => portalloc_donate(a.0, h, tag.as_ptr(), &mut new),
            TagCall::Sleep => portalloc_sleep(a.0, tag.as_ptr(), true),
            TagCall::Wake => portalloc_wake(a.0, tag.as_ptr()),
            TagCall::SetThreadTag => portalloc_set_thread_tag(tag.as_ptr()),
        }
    };
    let message = last_error();
    assert_eq!(set_thread_tag(None), PortallocStatus::Ok);
    (status, message)
}

/// One rule for a tag, whichever call takes it: at most 1024 bytes everywhere (allocate and
/// donate accepted longer ones that sleep then refused), and an empty tag refused wherever a
/// tag names what sleeps (sleep and wake were a silent no-op where `tag("")` was refused).
#[test_case(TagCall::Allocate, 1025, PortallocStatus::InvalidArgument ; "allocate refuses 1025 bytes")]
#[test_case(TagCall::Donate, 1025, PortallocStatus::InvalidArgument ; "donate refuses 1025 bytes")]
#[test_case(TagCall::Sleep, 1025, PortallocStatus::InvalidArgument ; "sleep refuses 1025 bytes")]
#[test_case(TagCall::Wake, 1025, PortallocStatus::InvalidArgument ; "wake refuses 1025 bytes")]
#[test_case(TagCall::SetThreadTag, 1025, PortallocStatus::InvalidArgument ; "thread tag refuses 1025 bytes")]
#[test_case(TagCall::Allocate, 1024, PortallocStatus::Ok ; "allocate takes 1024 bytes")]
#[test_case(TagCall::Donate, 1024, PortallocStatus::Ok ; "donate takes 1024 bytes")]
#[test_case(TagCall::Sleep, 1024, PortallocStatus::Ok ; "sleep takes 1024 bytes")]
#[test_case(TagCall::Wake, 1024, PortallocStatus::Ok ; "wake takes 1024 bytes")]
#[test_case(TagCall::SetThreadTag, 1024, PortallocStatus::Ok ; "thread tag takes 1024 bytes")]
#[test_case(TagCall::Sleep, 0, PortallocStatus::InvalidArgument ; "sleep refuses an empty tag")]
#[test_case(TagCall::Wake, 0, PortallocStatus::InvalidArgument ; "wake refuses an empty tag")]
#[test_case(TagCall::SetThreadTag, 0, PortallocStatus::InvalidArgument ; "thread tag refuses an empty tag")]
fn one_rule_for_tags_in_every_call(call: TagCall, bytes: usize, expected: PortallocStatus) {
    let tag = CString::new("t".repeat(bytes)).unwrap();
    let (status, message) = tag_call(call, &tag);
    assert_eq!(status, expected, "{call:?} with {bytes} bytes: {message}");
    if expected != PortallocStatus::Ok {
        let words: &[&str] = if bytes == 0 {
            &["`tag` is empty", "untagged buffers never sleep"]
        } else {
            &["1025 bytes", "at most 1024"]
        };
        assert_mentions_all(&message, words);
    }
}

/// Opening a region declares its tag; `portalloc_declare_sleep_tag` declares one for the
/// callers that pass it themselves; a tag only passed to `portalloc_allocate` stays a name.
#[test]
fn regions_and_declare_make_tags_that_can_sleep() {
    use portalloc::sleep_tags::is_sleepable;
    let a = make(c"bfc");
    allocate(&a, 4096, c"capi-only-a-name");
    assert!(!is_sleepable("capi-only-a-name"));

    assert!(!is_sleepable("capi-declared"));
    // SAFETY: a valid string.
    let s = unsafe { portalloc_declare_sleep_tag(c"capi-declared".as_ptr()) };
    assert_eq!(s, PortallocStatus::Ok, "{}", last_error());
    assert!(is_sleepable("capi-declared"));
    // Again: nothing more.
    // SAFETY: a valid string.
    let s = unsafe { portalloc_declare_sleep_tag(c"capi-declared".as_ptr()) };
    assert_eq!(s, PortallocStatus::Ok, "{}", last_error());

    assert!(!is_sleepable("capi-thread-region"));
    assert_eq!(
        set_thread_tag(Some(c"capi-thread-region")),
        PortallocStatus::Ok
    );
    assert!(is_sleepable("capi-thread-region"));
    assert_eq!(set_thread_tag(None), PortallocStatus::Ok);
    assert!(
        is_sleepable("capi-thread-region"),
        "a declaration lasts for the process"
    );
}

const PROCESS_TAG_CHILD: &str = "PORTALLOC_TEST_CAPI_PROCESS_TAG_CHILD";

#[test]
fn the_process_tag_labels_every_thread_without_its_own() {
    let ran = run_to_end(
        child_env(&mut this_test_alone("process_tag_child")).env(PROCESS_TAG_CHILD, "1"),
    );
    assert_ran_to(ran, "process tag: ok", "");
}

#[test]
fn process_tag_child() {
    if std::env::var(PROCESS_TAG_CHILD).is_err() {
        return; // Run by `the_process_tag_labels_every_thread_without_its_own`.
    }
    let a = make(c"vmm");
    let raw = a.0 as usize;
    let on_thread = |f: fn(*mut PortallocAllocator) -> (u64, *mut c_void)| {
        let p = std::thread::spawn(move || f(raw as *mut PortallocAllocator).1 as usize)
            .join()
            .unwrap();
        p as *mut c_void
    };
    let untagged = |a: *mut PortallocAllocator| allocate_untagged(a, 4096);
    let with_thread_tag = |a: *mut PortallocAllocator| {
        assert_eq!(set_thread_tag(Some(c"capi-mine")), PortallocStatus::Ok);
        allocate_untagged(a, 4096)
    };
    let explicit = |a: *mut PortallocAllocator| {
        assert_eq!(set_thread_tag(Some(c"capi-mine")), PortallocStatus::Ok);
        let (mut h, mut p) = (0, ptr::null_mut());
        // SAFETY: a valid tag and outputs.
        let s =
            unsafe { portalloc_allocate(a, 4096, 0, 0, c"capi-explicit".as_ptr(), &mut h, &mut p) };
        assert_eq!(s, PortallocStatus::Ok, "{}", last_error());
        (h, p)
    };
    let torch = |_: *mut PortallocAllocator| (0, portalloc_torch_alloc(4096, 0, ptr::null_mut()));
    let torch_with_thread_tag = |_: *mut PortallocAllocator| {
        assert_eq!(set_thread_tag(Some(c"capi-mine")), PortallocStatus::Ok);
        (0, portalloc_torch_alloc(4096, 0, ptr::null_mut()))
    };
    let mut g = ptr::null_mut();
    // SAFETY: a valid output.
    assert_eq!(unsafe { portalloc_global(0, &mut g) }, PortallocStatus::Ok);

    // No process tag: the defaults.
    assert_eq!(live_tag(a.0, on_thread(untagged)).0, "buffer");
    assert_eq!(live_tag(g, on_thread(torch)).0, "torch");

    assert!(!portalloc::sleep_tags::is_sleepable("capi-region"));
    assert_eq!(
        set_process_tag(Some(c"capi-region")),
        PortallocStatus::Ok,
        "{}",
        last_error()
    );
    assert!(
        portalloc::sleep_tags::is_sleepable("capi-region"),
        "set, it is declared"
    );
    // Another thread, with no thread tag of its own, and this one: the process tag.
    let region = on_thread(untagged);
    assert_eq!(live_tag(a.0, region).0, "capi-region");
    assert_eq!(live_tag(a.0, untagged(a.0).1).0, "capi-region");
    assert_eq!(
        live_tag(g, on_thread(torch)).0,
        "capi-region",
        "the PyTorch hook"
    );
    // The thread's tag wins over it, and an explicit tag over both.
    assert_eq!(live_tag(a.0, on_thread(with_thread_tag)).0, "capi-mine");
    assert_eq!(live_tag(g, on_thread(torch_with_thread_tag)).0, "capi-mine");
    assert_eq!(live_tag(a.0, on_thread(explicit)).0, "capi-explicit");
    // Refused tags leave it as it was.
    assert_eq!(set_process_tag(Some(c"")), PortallocStatus::InvalidArgument);
    let oversize = CString::new("z".repeat(1025)).unwrap();
    assert_eq!(
        set_process_tag(Some(oversize.as_c_str())),
        PortallocStatus::InvalidArgument
    );
    assert_eq!(live_tag(a.0, on_thread(untagged)).0, "capi-region");
    // A sleep of the process tag takes what the other threads made under it.
    sleep(&a, c"capi-region", true);
    assert_eq!(live_tag(a.0, region), ("capi-region".to_string(), true));
    assert_eq!(
        bytes_asleep(&a),
        3 * 4096,
        "the three buffers made under it"
    );
    wake(&a, c"capi-region");
    // Null clears it: the defaults again.
    assert_eq!(set_process_tag(None), PortallocStatus::Ok);
    assert_eq!(live_tag(a.0, on_thread(untagged)).0, "buffer");
    assert_eq!(live_tag(g, on_thread(torch)).0, "torch");
    println!("process tag: ok");
}

/// A buffer freed while another stream's work may still use it (`portalloc_record_stream`)
/// is held back from the allocator until that work completes; from its free on, it is no
/// sleeper: a sleep of its tag takes the live buffers of the tag, not it.
#[test]
fn a_deferred_free_is_no_sleeper() {
    let a = make(c"vmm");
    let (deferred, dp) = allocate(&a, MIB, c"capi-deferred");
    let (live, lp) = allocate(&a, 2 * MIB, c"capi-deferred");
    // SAFETY: a live buffer; 0x51de is any stream of the host device.
    let s = unsafe { portalloc_record_stream(a.0, dp, 0x51de) };
    assert_eq!(s, PortallocStatus::Ok, "{}", last_error());
    // SAFETY: a handle of this allocator.
    let s = unsafe { portalloc_free(a.0, deferred) };
    assert_eq!(s, PortallocStatus::Ok, "{}", last_error());
    assert!(
        stats(&a).bytes_in_use >= 3 * MIB,
        "the free was not deferred: {:?}",
        stats(&a)
    );
    sleep(&a, c"capi-deferred", false);
    assert_eq!(
        bytes_asleep(&a),
        2 * MIB,
        "the deferred buffer was put to sleep with the live one"
    );
    assert_eq!(live_tag(a.0, lp), ("capi-deferred".to_string(), true));
    wake(&a, c"capi-deferred");
    assert_eq!(bytes_asleep(&a), 0);
    // The next call hands the deferred buffer back (its stream's work is done).
    // SAFETY: a handle of this allocator.
    assert_eq!(unsafe { portalloc_free(a.0, live) }, PortallocStatus::Ok);
    assert_eq!(stats(&a).bytes_in_use, 0);
}

/// A donated buffer sleeps under its consumer's tag from the donation on, not its giver's.
#[test]
fn a_donated_buffer_sleeps_with_its_consumer() {
    let a = make(c"vmm");
    let (weights, wp) = allocate(&a, 4 * MIB, c"capi-weights");
    let mut output = 0;
    // SAFETY: a live handle, a valid tag and output.
    let s = unsafe { portalloc_donate(a.0, weights, c"capi-output".as_ptr(), &mut output) };
    assert_eq!(s, PortallocStatus::Ok, "{}", last_error());
    sleep(&a, c"capi-weights", false);
    assert_eq!(
        bytes_asleep(&a),
        0,
        "a sleep of the giver's tag took the donated buffer"
    );
    assert_eq!(live_tag(a.0, wp), ("capi-output".to_string(), false));
    sleep(&a, c"capi-output", false);
    assert_eq!(bytes_asleep(&a), 4 * MIB);
    assert_eq!(live_tag(a.0, wp), ("capi-output".to_string(), true));
    wake(&a, c"capi-output");
    assert_eq!(bytes_asleep(&a), 0);
    // SAFETY: the consumer's handle.
    assert_eq!(unsafe { portalloc_free(a.0, output) }, PortallocStatus::Ok);
}

/// A declared tag's buffers lie on memory of their own in vmm, however their allocations
/// interleave with another tag's: its sleep hands back at least their bytes.
#[test]
fn a_declared_tags_sleep_hands_back_its_memory() {
    let a = make(c"vmm");
    // SAFETY: a valid string.
    let s = unsafe { portalloc_declare_sleep_tag(c"capi-affine".as_ptr()) };
    assert_eq!(s, PortallocStatus::Ok, "{}", last_error());
    for _ in 0..8 {
        allocate(&a, 512 * 1024, c"capi-neighbour");
        allocate(&a, 512 * 1024, c"capi-affine");
    }
    let before = stats(&a).pool_bytes;
    sleep(&a, c"capi-affine", false);
    let after = stats(&a).pool_bytes;
    assert_eq!(bytes_asleep(&a), 4 * MIB);
    assert!(
        before - after >= 4 * MIB,
        "the sleep of 4 MiB of a declared tag handed back {} bytes ({before} → {after})",
        before - after
    );
    wake(&a, c"capi-affine");
}

// ---------------------------------------------------------------------------------------
// The shared budget between processes, in child processes whose environment joins it (the
// host backend joins only with PORTALLOC_SHARED_BUDGET=1) or not, each with a segment
// directory of its own.

const BUDGET_CHILD: &str = "PORTALLOC_TEST_CAPI_BUDGET_CHILD";

/// A fresh directory for a child's budget segments; removed on drop.
struct SegmentDir(PathBuf);

impl SegmentDir {
    fn new(name: &str) -> SegmentDir {
        let dir = std::env::temp_dir().join(format!(
            "portalloc-capi-budget-{name}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        SegmentDir(dir)
    }
}

impl Drop for SegmentDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs `budget_child` in a child with `PORTALLOC_SHARED_BUDGET` as `joined` (unset: None)
/// and the segments in a directory of its own; returns its output.
fn run_budget_child(mode: &str, shared_budget: Option<&str>) -> (bool, String) {
    let dir = SegmentDir::new(mode);
    let mut cmd = this_test_alone("budget_child");
    child_env(&mut cmd)
        .env(BUDGET_CHILD, mode)
        .env("PORTALLOC_SHARED_BUDGET_DIR", &dir.0)
        .env("PORTALLOC_MEMBER_NAME", "capi-budget-child")
        .env_remove("PORTALLOC_SHARED_BUDGET");
    if let Some(v) = shared_budget {
        cmd.env("PORTALLOC_SHARED_BUDGET", v);
    }
    run_to_end(&mut cmd)
}

/// The members of the budget through `portalloc_budget_json`, asked for their length first
/// as a C caller does.
fn budget_members() -> Result<serde_json::Value, (PortallocStatus, String)> {
    let mut len = 0usize;
    // SAFETY: a null buffer of capacity 0 and a valid `out_len`.
    let s = unsafe { portalloc_budget_json(ptr::null_mut(), 0, &mut len) };
    if s != PortallocStatus::BufferTooSmall {
        return Err((s, last_error()));
    }
    assert!(len > 1, "a JSON array of the members: {len} bytes");
    let mut buf = vec![0u8; len + 1];
    // SAFETY: `buf` is valid for `len + 1` bytes.
    let s = unsafe { portalloc_budget_json(buf.as_mut_ptr().cast(), buf.len(), &mut len) };
    assert_eq!(s, PortallocStatus::Ok, "{}", last_error());
    assert_eq!(buf[len], 0, "NUL-terminated");
    Ok(serde_json::from_slice(&buf[..len]).unwrap())
}

/// This process's entry of tag `tag` in the budget: (keep, in_use).
fn my_budget_tag(tag: &str) -> Option<(bool, bool)> {
    let members = budget_members().unwrap_or_else(|(s, e)| panic!("{s:?}: {e}"));
    let me = members
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["pid"] == std::process::id())
        .unwrap_or_else(|| panic!("this process is not among the members: {members}"));
    assert_eq!(me["name"], "capi-budget-child", "{me}");
    me["tags"].as_array().unwrap().iter().find_map(|t| {
        (t["name"] == tag).then(|| {
            assert_eq!(t["reclaimable"], true, "{t}");
            (t["keep"] == true, t["in_use"] == true)
        })
    })
}

/// A budget call on a tag: its status and the thread's last error.
type TagCallFn = fn(Option<&CStr>) -> (PortallocStatus, String);

fn declare_reclaimable(tag: Option<&CStr>, keep: i32) -> (PortallocStatus, String) {
    // SAFETY: a valid string or null.
    let s = unsafe { portalloc_declare_reclaimable(tag.map_or(ptr::null(), CStr::as_ptr), keep) };
    (s, last_error())
}

fn using_begin(tag: Option<&CStr>) -> (PortallocStatus, String) {
    // SAFETY: a valid string or null.
    let s = unsafe { portalloc_using_begin(tag.map_or(ptr::null(), CStr::as_ptr)) };
    (s, last_error())
}

fn using_end(tag: Option<&CStr>) -> (PortallocStatus, String) {
    // SAFETY: a valid string or null.
    let s = unsafe { portalloc_using_end(tag.map_or(ptr::null(), CStr::as_ptr)) };
    (s, last_error())
}

/// A process that joined its device's budget declares a tag reclaimable, which the budget
/// lists under its pid; `using` sections nest and pin the tag until the last ends; an end
/// without its begin, and tags that are null, empty, not UTF-8 or too long, are refused
/// with their status and message.
#[test]
fn reclaimable_tags_and_using_sections_through_the_abi() {
    assert_ran_to(
        run_budget_child("joined", Some("1")),
        "budget child: ok",
        "",
    );
}

/// With `PORTALLOC_SHARED_BUDGET=0`, or on the host backend without it, the process runs
/// alone: declaring, using and listing say so (`UNSUPPORTED`), and an end has no begin.
#[test_case(Some("0") ; "switched off")]
#[test_case(None ; "host backend without the variable")]
fn a_process_without_a_budget_runs_alone(shared_budget: Option<&str>) {
    assert_ran_to(
        run_budget_child("alone", shared_budget),
        "budget child: ok",
        "",
    );
}

#[test]
fn budget_child() {
    let Ok(mode) = std::env::var(BUDGET_CHILD) else {
        return; // Run by the two tests above.
    };
    // Refused whatever the budget: the tag as every call reads it.
    let calls: [TagCallFn; 3] = [|t| declare_reclaimable(t, 1), using_begin, using_end];
    for call in calls {
        let (s, e) = call(None);
        assert_eq!(s, PortallocStatus::NullArgument, "{e}");
        assert!(e.contains("`tag` is null"), "{e}");
        let (s, e) = call(Some(c"\xff\xfe"));
        assert_eq!(s, PortallocStatus::InvalidArgument, "{e}");
        assert!(e.contains("not UTF-8"), "{e}");
        let (s, e) = call(Some(c""));
        assert_eq!(s, PortallocStatus::InvalidArgument, "{e}");
        assert!(e.contains("`tag` is empty"), "{e}");
    }
    let (s, e) = using_end(Some(c"capi-never-begun"));
    assert_eq!(s, PortallocStatus::InvalidArgument, "{e}");
    assert_mentions_all(
        &e,
        &["portalloc_using_end", "capi-never-begun", "no section"],
    );

    if mode == "alone" {
        let runs_alone = |(s, e): (PortallocStatus, String), call: &str| {
            assert_eq!(s, PortallocStatus::Unsupported, "{call}: {e}");
            assert_mentions_all(&e, &[call, "runs alone", "PORTALLOC_SHARED_BUDGET"]);
        };
        runs_alone(
            declare_reclaimable(Some(c"capi-kv"), 1),
            "portalloc_declare_reclaimable",
        );
        runs_alone(using_begin(Some(c"capi-kv")), "portalloc_using_begin");
        runs_alone(
            budget_members().expect_err("no budget to list"),
            "portalloc_budget_json",
        );
        let (s, e) = using_end(Some(c"capi-kv"));
        assert_eq!(
            s,
            PortallocStatus::InvalidArgument,
            "a refused begin opens nothing: {e}"
        );
        println!("budget child: ok");
        return;
    }

    // Refused by the budget: a tag over 24 bytes, a `keep_contents` that is not 0 or 1, a
    // null `out_len`.
    let (s, e) = declare_reclaimable(Some(c"capi-a-tag-of-25-bytes-xx"), 1);
    assert_eq!(s, PortallocStatus::InvalidArgument, "{e}");
    assert_mentions_all(&e, &["portalloc_declare_reclaimable", "24 bytes"]);
    let (s, e) = declare_reclaimable(Some(c"capi-kv"), 2);
    assert_eq!(s, PortallocStatus::InvalidArgument, "{e}");
    assert!(e.contains("keep_contents = 2"), "{e}");
    // SAFETY: a null `out_len` is refused before anything is written.
    let s = unsafe { portalloc_budget_json(ptr::null_mut(), 0, ptr::null_mut()) };
    assert_eq!(s, PortallocStatus::NullArgument, "{}", last_error());

    assert_eq!(my_budget_tag("capi-kv"), None, "not declared yet");
    let (s, e) = declare_reclaimable(Some(c"capi-kv"), 1);
    assert_eq!(s, PortallocStatus::Ok, "{e}");
    assert!(
        portalloc::sleep_tags::is_sleepable("capi-kv"),
        "declared as a tag that can sleep too"
    );
    assert_eq!(my_budget_tag("capi-kv"), Some((true, false)));
    let (s, e) = declare_reclaimable(Some(c"capi-kv"), 0);
    assert_eq!(s, PortallocStatus::Ok, "{e}");
    assert_eq!(
        my_budget_tag("capi-kv"),
        Some((false, false)),
        "declared again: keep off"
    );

    // Sections nest; the tag is in use until the last ends, then free to reclaim again.
    assert_eq!(
        using_begin(Some(c"capi-kv")).0,
        PortallocStatus::Ok,
        "{}",
        last_error()
    );
    assert_eq!(my_budget_tag("capi-kv"), Some((false, true)));
    assert_eq!(
        using_begin(Some(c"capi-kv")).0,
        PortallocStatus::Ok,
        "{}",
        last_error()
    );
    assert_eq!(
        using_end(Some(c"capi-kv")).0,
        PortallocStatus::Ok,
        "{}",
        last_error()
    );
    assert_eq!(
        my_budget_tag("capi-kv"),
        Some((false, true)),
        "one section still open"
    );
    // Ended on another thread than the one that began it: the sections are the process's.
    let ended = std::thread::spawn(|| using_end(Some(c"capi-kv")))
        .join()
        .unwrap();
    assert_eq!(ended.0, PortallocStatus::Ok, "{}", ended.1);
    assert_eq!(my_budget_tag("capi-kv"), Some((false, false)));
    let (s, e) = using_end(Some(c"capi-kv"));
    assert_eq!(s, PortallocStatus::InvalidArgument, "one end too many: {e}");
    assert!(e.contains("no section"), "{e}");
    assert_eq!(
        my_budget_tag("capi-kv"),
        Some((false, false)),
        "nothing changed"
    );
    println!("budget child: ok");
}

// ---------------------------------------------------------------------------------------
// The header, a C program and the Python module.

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The names of the functions src/capi exports.
fn exported_functions() -> Vec<String> {
    let mut names = Vec::new();
    for file in ["mod.rs", "api.rs", "torch.rs"] {
        let text = std::fs::read_to_string(root().join("src/capi").join(file)).unwrap();
        let mut after_no_mangle = false;
        for line in text.lines() {
            let l = line.trim();
            if l == "#[no_mangle]" {
                after_no_mangle = true;
            } else if after_no_mangle && l.starts_with("pub ") {
                let rest = &l[l.find("fn ").expect("a fn after #[no_mangle]") + 3..];
                names.push(rest[..rest.find('(').unwrap()].to_string());
                after_no_mangle = false;
            }
        }
    }
    names
}

#[test]
fn header_declares_every_exported_function() {
    let header = std::fs::read_to_string(root().join("include/portalloc.h")).unwrap();
    let names = exported_functions();
    assert!(names.len() >= 19, "{names:?}");
    for name in &names {
        assert!(
            header.contains(&format!(" {name}(")) || header.contains(&format!("*{name}(")),
            "include/portalloc.h lacks {name}: regenerate it (see cbindgen.toml)"
        );
    }
    assert_mentions_all(
        &header,
        &[
            "PortallocStatus",
            "PortallocOptions",
            "PortallocStats",
            "PortallocAllocator",
        ],
    );
}

#[test]
fn header_is_what_cbindgen_generates() {
    let out = std::env::temp_dir().join(format!("portalloc-{}.h", std::process::id()));
    let run = Command::new("cbindgen")
        .current_dir(root())
        .args(["--config", "cbindgen.toml", "src/capi/mod.rs", "--output"])
        .arg(&out)
        .output();
    match run {
        Err(_) => eprintln!("skipped: cbindgen is not installed (cargo install cbindgen)"),
        Ok(r) if !r.status.success() => {
            panic!("cbindgen failed: {}", String::from_utf8_lossy(&r.stderr))
        }
        Ok(_) => {
            let fresh = std::fs::read_to_string(&out).unwrap();
            let _ = std::fs::remove_file(&out);
            let committed = std::fs::read_to_string(root().join("include/portalloc.h")).unwrap();
            assert!(
                fresh == committed,
                "include/portalloc.h is stale: run `cbindgen --config cbindgen.toml \
                 src/capi/mod.rs --output include/portalloc.h`"
            );
        }
    }
}

/// libportalloc.so as C and Python users get it: the workspace member capi/ (package
/// `portalloc-capi`; the root crate is an rlib only), built once per test process with the
/// cargo and profile of this test run. A failed build fails the test.
fn cdylib() -> &'static Path {
    static LIBRARY: OnceLock<PathBuf> = OnceLock::new();
    LIBRARY.get_or_init(|| {
        let mut cargo = Command::new(env!("CARGO"));
        cargo.current_dir(root()).args([
            "build",
            "-p",
            "portalloc-capi",
            "--message-format=json-render-diagnostics",
        ]);
        if !cfg!(debug_assertions) {
            cargo.arg("--release");
        }
        String::from_utf8_lossy(&stdout_of(&mut cargo))
            .lines()
            .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
            .filter(|message| {
                message["reason"] == "compiler-artifact"
                    && message["target"]["kind"] == serde_json::json!(["cdylib"])
            })
            .find_map(|message| message["filenames"][0].as_str().map(PathBuf::from))
            .expect("cargo reports the cdylib of portalloc-capi")
    })
}

/// The crate types of the library of each workspace package that has one (`cargo metadata`).
fn library_crate_types() -> std::collections::BTreeMap<String, serde_json::Value> {
    let metadata = stdout_of(Command::new(env!("CARGO")).current_dir(root()).args([
        "metadata",
        "--no-deps",
        "--format-version",
        "1",
    ]));
    let metadata: serde_json::Value = serde_json::from_slice(&metadata).unwrap();
    let mut libraries = std::collections::BTreeMap::new();
    for package in metadata["packages"].as_array().unwrap() {
        for target in package["targets"].as_array().unwrap() {
            let kinds = target["kind"].as_array().unwrap();
            if kinds
                .iter()
                .any(|k| ["lib", "rlib", "cdylib"].contains(&k.as_str().unwrap()))
            {
                let name = package["name"].as_str().unwrap().to_string();
                libraries.insert(name, target["crate_types"].clone());
            }
        }
    }
    libraries
}

#[test]
fn only_portalloc_capi_is_a_cdylib() {
    // A crate that depends on portalloc builds what portalloc's [lib] declares: an rlib, not
    // also a shared library nobody asked for.
    let libraries = library_crate_types();
    assert_eq!(
        libraries["portalloc"],
        serde_json::json!(["rlib"]),
        "{libraries:?}"
    );
    assert_eq!(
        libraries["portalloc-capi"],
        serde_json::json!(["cdylib"]),
        "{libraries:?}"
    );
}

fn tool(name: &str) -> bool {
    Command::new(name).arg("--version").output().is_ok()
}

/// The functions include/portalloc.h declares (its comments left out).
fn header_functions() -> BTreeSet<String> {
    let header = std::fs::read_to_string(root().join("include/portalloc.h")).unwrap();
    let mut names = BTreeSet::new();
    for line in header.lines().filter(|l| !l.trim_start().starts_with("//")) {
        for (at, _) in line.match_indices("portalloc_") {
            let name: String = line[at..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if line[at + name.len()..].starts_with('(') {
                names.insert(name);
            }
        }
    }
    names
}

#[test]
fn cdylib_exports_exactly_the_functions_of_the_header() {
    if !tool("nm") {
        return support::skip("nm (binutils) is not installed");
    }
    let declared = header_functions();
    // PyTorch's CUDAPluggableAllocator loads the hooks by these names.
    for hook in ["portalloc_torch_alloc", "portalloc_torch_free"] {
        assert!(declared.contains(hook), "the header lacks {hook}");
    }
    assert!(declared.len() >= 19, "{declared:?}");
    let lib = cdylib();
    let symbols = stdout_of(Command::new("nm").args(["-D", "--defined-only"]).arg(lib));
    // Lines `ADDRESS TYPE NAME`: the functions (T) named portalloc_*.
    let exported: BTreeSet<String> = String::from_utf8_lossy(&symbols)
        .lines()
        .filter_map(
            |line| match line.split_whitespace().collect::<Vec<_>>()[..] {
                [_, "T", name] if name.starts_with("portalloc_") => Some(name.to_string()),
                _ => None,
            },
        )
        .collect();
    assert_eq!(
        exported,
        declared,
        "{} exports other functions than include/portalloc.h declares",
        lib.display()
    );
}

/// Compiles the C program `source` (under tests/) against the header in `include` (under the
/// repository) and libportalloc.so, runs it with the host device of [`child_env`], and checks
/// it printed `marker`.
fn c_program(source: &str, include: &str, marker: &str) {
    if !tool("cc") {
        return support::skip("no C compiler (cc)");
    }
    let lib = cdylib();
    let dir = lib.parent().unwrap();
    let stem = source.trim_end_matches(".c");
    let exe = std::env::temp_dir().join(format!("portalloc-{stem}-{}", std::process::id()));
    stdout_of(
        Command::new("cc")
            .args([
                "-std=c99",
                "-Wall",
                "-Wextra",
                "-Werror",
                "-pedantic",
                "-pthread",
            ])
            .arg(format!("-I{}", root().join(include).display()))
            .arg(root().join("tests").join(source))
            .arg("-o")
            .arg(&exe)
            .arg(lib)
            .arg(format!("-Wl,-rpath,{}", dir.display())),
    );
    let ran = run_to_end(child_env(&mut Command::new(&exe)));
    let _ = std::fs::remove_file(&exe);
    assert_ran_to(ran, marker, "");
}

#[test]
fn c_program_against_the_header_and_cdylib() {
    c_program("capi_c.c", "include", "capi_c: ok");
}

/// A C program as portalloc 0.1.0 built it (the functions of 0.1.0's names, on an object of
/// 0.1.0's size) runs on today's library: they read and write 0.1.0's struct only.
#[test]
fn c_program_of_the_first_layout() {
    c_program("capi_v1.c", "include", "capi_v1: ok");
}

#[test]
fn python_hooks_through_ctypes() {
    if !tool("python3") {
        return support::skip("python3 is not installed");
    }
    // The module of the source tree (python/portalloc) with the library just built; the
    // installed package is tested by scripts/test (tests/python_package.py). The script sets
    // the environment of its host device itself.
    let ran = run_to_end(
        Command::new("python3")
            .arg(root().join("tests/python_hooks.py"))
            .env("PORTALLOC_LIBRARY", cdylib())
            .env("PYTHONPATH", root().join("python")),
    );
    assert_ran_to(ran, "python_hooks: ok", "");
}

/// Buffers shared between Python processes (`tests/python_share.py`): exported in the
/// parent, pickled through `multiprocessing` (spawn) to children that import them and answer
/// a checksum; vmm and bfc on real host memory.
#[test]
fn python_share_through_multiprocessing() {
    if !tool("python3") {
        return support::skip("python3 is not installed");
    }
    let ran = run_to_end(
        Command::new("python3")
            .arg(root().join("tests/python_share.py"))
            .env("PORTALLOC_LIBRARY", cdylib())
            .env("PYTHONPATH", root().join("python")),
    );
    assert_ran_to(ran, "python_share: ok", "");
}

/// The Python module from the caller's side over the CUDA conformance driver
/// (`tests/python_streams.py`): the caller's current context kept, CuPy's current stream
/// used, `portalloc.torch.record_stream`, `close()` racing an allocation.
#[cfg(feature = "cuda")]
#[test]
fn python_streams_over_fakecuda() {
    if !tool("python3") {
        return support::skip("python3 is not installed");
    }
    let driver = DriverCopy::new("fakecuda", "python-streams");
    let ran = run_to_end(
        driver
            .configure(&mut Command::new("python3"), "bfc", "false")
            .arg(root().join("tests/python_streams.py"))
            .env("PORTALLOC_LIBRARY", cdylib())
            .env("PYTHONPATH", root().join("python"))
            .env("PORTALLOC_BACKEND", "cuda")
            .env("FAKECUDA_DEVICES", "2"),
    );
    assert_ran_to(ran, "python_streams: ok", "");
}

// ---------------------------------------------------------------------------------------
// Graph pools through the C ABI and the PyTorch hook, driven as PyTorch drives them: the
// capturing stream passed to `portalloc_torch_alloc`, frees during and after the capture,
// eager work after it, 100 replays — in a child process per strategy and vendor (the hook's
// allocator is process-global), over a private copy of the conformance driver.

const GRAPH_CHILD: &str = "PORTALLOC_TEST_CAPI_GRAPH_CHILD";

#[cfg(all(feature = "cuda", feature = "hip"))]
#[test_case("cuda", "bfc", "true" ; "cuda bfc")]
#[test_case("cuda", "bfc", "false" ; "cuda bfc growing")]
#[test_case("cuda", "platform", "false" ; "cuda platform")]
#[test_case("cuda", "vmm", "false" ; "cuda vmm")]
#[test_case("cuda", "cuda_async", "false" ; "cuda async")]
#[test_case("hip", "bfc", "true" ; "hip bfc")]
#[test_case("hip", "bfc", "false" ; "hip bfc growing")]
#[test_case("hip", "platform", "false" ; "hip platform")]
#[test_case("hip", "vmm", "false" ; "hip vmm")]
#[test_case("hip", "cuda_async", "false" ; "hip async")]
fn graph_pools_through_the_torch_hook_and_the_c_abi(vendor: &str, strategy: &str, pre: &str) {
    let name = if vendor == "hip" {
        "fakehip"
    } else {
        "fakecuda"
    };
    let driver = DriverCopy::new(name, &format!("graph-{vendor}-{strategy}-{pre}"));
    let mut child = this_test_alone("graph_pools_child");
    driver
        .configure(&mut child, strategy, pre)
        .env(GRAPH_CHILD, vendor)
        .env("PORTALLOC_BACKEND", vendor)
        .env("FAKEHIP_VERSION", "7.0");
    let ran = run_to_end(&mut child);
    assert_ran_to(
        ran,
        "graph pools: ok",
        &format!("{vendor} {strategy} {pre}: "),
    );
}

#[test]
fn graph_pools_child() {
    let Ok(vendor) = std::env::var(GRAPH_CHILD) else {
        return; // Run by `graph_pools_through_the_torch_hook_and_the_c_abi`.
    };
    #[cfg(any(feature = "cuda", feature = "hip"))]
    {
        use std::ffi::c_int;
        use support::fakes::Fake;
        let cuda = vendor == "cuda";
        let var = if cuda {
            "PORTALLOC_CUDA_LIBRARY"
        } else {
            "PORTALLOC_HIP_LIBRARY"
        };
        let fake = Fake::at(std::env::var(var).unwrap());
        let pick = |c: &'static str, h: &'static str| if cuda { c } else { h };
        if cuda {
            let init: unsafe extern "C" fn(u32) -> c_int = fake.sym("cuInit");
            // SAFETY: flags 0.
            assert_eq!(unsafe { init(0) }, 0);
            fake.set_current(fake.primary(0));
        }
        let stream = || {
            let create: unsafe extern "C" fn(*mut *mut c_void, u32) -> c_int =
                fake.sym(pick("cuStreamCreate", "hipStreamCreateWithFlags"));
            let mut s = ptr::null_mut();
            // SAFETY: one handle written; non-blocking.
            assert_eq!(unsafe { create(&mut s, 1) }, 0);
            s
        };
        let sync = |s: *mut c_void| {
            let f: unsafe extern "C" fn(*mut c_void) -> c_int =
                fake.sym(pick("cuStreamSynchronize", "hipStreamSynchronize"));
            // SAFETY: a live stream.
            assert_eq!(unsafe { f(s) }, 0);
        };
        let begin: unsafe extern "C" fn(*mut c_void, c_int) -> c_int =
            fake.sym(pick("cuStreamBeginCapture_v2", "hipStreamBeginCapture"));
        let end: unsafe extern "C" fn(*mut c_void, *mut u64) -> c_int =
            fake.sym(pick("cuStreamEndCapture", "hipStreamEndCapture"));
        let instantiate: unsafe extern "C" fn(*mut u64, u64, u64) -> c_int = fake.sym(pick(
            "cuGraphInstantiateWithFlags",
            "hipGraphInstantiateWithFlags",
        ));
        let launch: unsafe extern "C" fn(u64, *mut c_void) -> c_int =
            fake.sym(pick("cuGraphLaunch", "hipGraphLaunch"));
        let invalidations: unsafe extern "C" fn(*mut c_char, u64) -> i64 =
            fake.sym("fake_capture_invalidations");
        let kernel = |s: *mut c_void, p: *mut c_void, n: u64| {
            // SAFETY: a live stream of this fake.
            fake.launch_writing(
                unsafe { portalloc::Stream::from_raw(s as u64) },
                p as u64,
                n,
            )
        };
        let (s, eager_stream) = (stream(), stream());

        // 1. The PyTorch hook: it detects the capture from the stream PyTorch passes. The
        // warm-up runs on the eager stream and the capture on a stream of its own, as
        // `torch.cuda.graph` does (docs/graphs.md says what capturing on the stream a vmm
        // was used on alone costs).
        let warm = portalloc_torch_alloc(4 << 20, 0, eager_stream);
        assert!(!warm.is_null(), "{}", last_error());
        kernel(eager_stream, warm, 4 << 20);
        sync(eager_stream);
        portalloc_torch_free(warm, 4 << 20, 0, eager_stream);
        // SAFETY: a live stream; the global mode.
        assert_eq!(unsafe { begin(s, 0) }, 0);
        let a = portalloc_torch_alloc(4 << 20, 0, s);
        assert!(!a.is_null(), "{}", last_error());
        kernel(s, a, 4 << 20);
        let b = portalloc_torch_alloc(2 << 20, 0, s);
        kernel(s, b, 2 << 20);
        portalloc_torch_free(a, 4 << 20, 0, s); // during the capture
        let c = portalloc_torch_alloc(4 << 20, 0, s);
        assert_eq!(c, a, "reused within its capture");
        kernel(s, c, 4 << 20);
        let mut graph = 0;
        // SAFETY: one handle written.
        let rc = unsafe { end(s, &mut graph) };
        let mut why = [0 as c_char; 256];
        // SAFETY: at most 256 bytes written, NUL-terminated.
        let n = unsafe { invalidations(why.as_mut_ptr(), 256) };
        // SAFETY: NUL-terminated.
        let why = unsafe { CStr::from_ptr(why.as_ptr()) }.to_string_lossy();
        assert_eq!((rc, n), (0, 0), "the capture was invalidated: {why}");
        portalloc_torch_free(b, 2 << 20, 0, s);
        portalloc_torch_free(c, 4 << 20, 0, s);
        let mut eager = Vec::new();
        for i in 0..6u64 {
            let n = (2 + i % 3) << 20;
            let x = portalloc_torch_alloc(n as isize, 0, eager_stream);
            assert!(!x.is_null(), "{}", last_error());
            for &(p, len) in &[(a, 4u64 << 20), (b, 2 << 20)] {
                let (x0, p0) = (x as u64, p as u64);
                assert!(
                    x0 + n <= p0 || p0 + len <= x0,
                    "an eager buffer over the graph's"
                );
            }
            eager.push((x, n, kernel(eager_stream, x, n)));
        }
        let mut exec = 0;
        // SAFETY: one handle written.
        assert_eq!(unsafe { instantiate(&mut exec, graph, 0) }, 0);
        for _ in 0..100 {
            // SAFETY: live handles.
            assert_eq!(unsafe { launch(exec, s) }, 0);
        }
        sync(s);
        assert_eq!(fake.hazards().0, 0, "{}", fake.hazards().1);
        for (x, n, k) in eager {
            fake.finish(k);
            portalloc_torch_free(x, n as isize, 0, eager_stream);
        }
        sync(eager_stream);
        let mut global = ptr::null_mut();
        // SAFETY: valid output.
        let status = unsafe { portalloc_global(0, &mut global) };
        assert_eq!(status, PortallocStatus::Ok);
        let (mut ids, mut count) = ([0u64; 4], 0usize);
        // SAFETY: four slots and one count.
        let status = unsafe { portalloc_graph_pools(global, ids.as_mut_ptr(), 4, &mut count) };
        assert_eq!(
            (status, count),
            (PortallocStatus::Ok, 1),
            "one pool, made for the capture"
        );
        let (mut held, mut in_use, mut free) = (0, 0, 0);
        // SAFETY: three outputs.
        let status = unsafe {
            portalloc_graph_pool_stats(global, ids[0], &mut held, &mut in_use, &mut free)
        };
        assert_eq!(status, PortallocStatus::Ok);
        assert_eq!((held, in_use, free), (6 << 20, 0, 6 << 20));
        // The ledger's snapshot lists the pool too.
        let mut len = 0usize;
        // SAFETY: no buffer, one length written (BUFFER_TOO_SMALL is the expected answer).
        unsafe { portalloc_ledger_json(global, ptr::null_mut(), 0, &mut len) };
        let mut json = vec![0u8; len + 1];
        // SAFETY: `len + 1` writable bytes, one length.
        let status = unsafe {
            portalloc_ledger_json(global, json.as_mut_ptr().cast(), json.len(), &mut len)
        };
        assert_eq!(status, PortallocStatus::Ok);
        let snapshot: serde_json::Value = serde_json::from_slice(&json[..len]).unwrap();
        let listed = &snapshot["graph_pools"][0];
        assert_eq!(listed["held_bytes"], 6 << 20, "{snapshot}");
        assert_eq!(listed["free_bytes"], 6 << 20, "{snapshot}");
        let mut released = 0;
        // SAFETY: one output.
        let status = unsafe { portalloc_graph_pool_release(global, ids[0], &mut released) };
        assert_eq!(
            (status, released),
            (PortallocStatus::Ok, 6 << 20),
            "{}",
            last_error()
        );

        // 2. The C ABI, routed explicitly.
        let mut a2 = ptr::null_mut();
        // SAFETY: valid output.
        let status = unsafe { portalloc_create_from_env(0, &mut a2) };
        assert_eq!(status, PortallocStatus::Ok);
        let mut pool = 0;
        // SAFETY: a null tag, one output.
        let status = unsafe { portalloc_graph_pool_create(a2, ptr::null(), &mut pool) };
        assert_eq!(status, PortallocStatus::Ok);
        assert_eq!(portalloc_graph_pool_begin(a2, pool, s), PortallocStatus::Ok);
        // SAFETY: a live stream; the global mode.
        assert_eq!(unsafe { begin(s, 0) }, 0);
        let (mut h, mut p) = (0u64, ptr::null_mut());
        // SAFETY: valid outputs and tag.
        let status = unsafe {
            portalloc_allocate(
                a2,
                1 << 20,
                0,
                s as u64,
                c"captured".as_ptr(),
                &mut h,
                &mut p,
            )
        };
        assert_eq!(status, PortallocStatus::Ok, "{}", last_error());
        kernel(s, p, 1 << 20);
        // SAFETY: one handle written.
        assert_eq!(unsafe { end(s, &mut graph) }, 0);
        assert_eq!(portalloc_graph_pool_end(a2, pool), PortallocStatus::Ok);
        // SAFETY: a live handle of this allocator.
        assert_eq!(unsafe { portalloc_free(a2, h) }, PortallocStatus::Ok);
        // SAFETY: one output.
        let status = unsafe { portalloc_graph_pool_release(a2, pool, &mut released) };
        assert_eq!((status, released), (PortallocStatus::Ok, 1 << 20));
        // SAFETY: made above.
        assert_eq!(unsafe { portalloc_destroy(a2) }, PortallocStatus::Ok);
        println!("graph pools: ok");
    }
    #[cfg(not(any(feature = "cuda", feature = "hip")))]
    let _ = vendor;
}

// ---------------------------------------------------------------------------------------
// Buffers shared with other processes (src/capi/share.rs): export to bytes, hostile bytes,
// tokens, and a round trip with a child process of this test executable.

const SHARE_CHILD: &str = "PORTALLOC_TEST_CAPI_SHARE_CHILD";

/// An allocator of `strategy` on a 64 MiB host device with real memory (exportable), ignoring
/// the environment: a child process made with the same options is on the same device.
fn make_real(strategy: &CStr) -> Alloc {
    let mut o = default_options();
    o.ignore_env = 1;
    o.strategy = strategy.as_ptr();
    o.backend = c"host".as_ptr();
    o.host_capacity = 64 * MIB;
    o.host_simulated = 0;
    o.mem_fraction = 0.5;
    o.preallocate = 0;
    let mut a = ptr::null_mut();
    // SAFETY: valid options with static strings; `a` is valid for one pointer.
    let status = unsafe { portalloc_create_sized(&o, OPTIONS_SIZE, &mut a) };
    assert_eq!(status, PortallocStatus::Ok, "{}", last_error());
    Alloc(a)
}

/// `portalloc_export` of the buffer at `p`: the status, and the bytes on success.
fn export(a: &Alloc, p: *mut c_void) -> (PortallocStatus, Vec<u8>) {
    let mut len = 0usize;
    // SAFETY: no buffer, one length written.
    let s = unsafe { portalloc_export(a.0, p, ptr::null_mut(), 0, &mut len) };
    if s != PortallocStatus::BufferTooSmall {
        return (s, Vec::new());
    }
    let mut bytes = vec![0u8; len];
    // SAFETY: `bytes` holds `len` writable bytes.
    let s = unsafe { portalloc_export(a.0, p, bytes.as_mut_ptr(), len, &mut len) };
    bytes.truncate(len);
    (s, bytes)
}

/// `portalloc_import` of `bytes`: the status, the message, and the import on success.
fn import(a: &Alloc, bytes: &[u8]) -> (PortallocStatus, String, *mut PortallocImport) {
    let mut out = ptr::null_mut();
    // SAFETY: `bytes` valid for its length; one pointer written.
    let s = unsafe { portalloc_import(a.0, bytes.as_ptr(), bytes.len(), &mut out) };
    (s, last_error(), out)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap())
        .collect()
}

/// The bytes a buffer of `len` holds in these tests.
fn share_pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + i / 4096) as u8).collect()
}

#[test_case(c"vmm", 1 ; "vmm memory is a mapped handle")]
#[test_case(c"bfc", 2 ; "bfc memory is a plain handle")]
fn export_gives_the_same_checked_bytes_every_time(strategy: &CStr, kind: u8) {
    let a = make_real(strategy);
    let (_, p) = allocate(&a, 3 * MIB, c"weights");
    let (s, bytes) = export(&a, p);
    assert_eq!(s, PortallocStatus::Ok, "{}", last_error());
    assert_eq!(&bytes[..8], b"PASHARE\x01");
    assert_eq!(bytes[12], kind);
    assert_eq!(
        u32::from_le_bytes(bytes[16..20].try_into().unwrap()),
        std::process::id()
    );
    assert_eq!(
        u64::from_le_bytes(bytes[40..48].try_into().unwrap()),
        3 * MIB
    );
    assert_eq!(export(&a, p), (PortallocStatus::Ok, bytes.clone()), "again");

    // A buffer one byte short: nothing written, the length needed.
    let mut short = vec![0xEEu8; bytes.len() - 1];
    let mut len = 0usize;
    // SAFETY: `short` holds its length of writable bytes.
    let s = unsafe { portalloc_export(a.0, p, short.as_mut_ptr(), short.len(), &mut len) };
    assert_eq!(s, PortallocStatus::BufferTooSmall, "{}", last_error());
    assert_eq!(len, bytes.len());
    assert!(
        short.iter().all(|&b| b == 0xEE),
        "written into a short buffer"
    );

    // Hostile arguments.
    // SAFETY: the ABI refuses null and foreign pointers with a status.
    unsafe {
        let s = portalloc_export(a.0, p, ptr::null_mut(), 0, ptr::null_mut());
        assert_eq!(s, PortallocStatus::NullArgument);
        assert!(last_error().contains("out_len"), "{}", last_error());
        let s = portalloc_export(a.0, ptr::null_mut(), ptr::null_mut(), 0, &mut len);
        assert_eq!(s, PortallocStatus::NullArgument);
        let inside = p.cast::<u8>().add(4096).cast();
        let s = portalloc_export(a.0, inside, ptr::null_mut(), 0, &mut len);
        assert_eq!(s, PortallocStatus::UnknownPointer, "{}", last_error());
        let s = portalloc_export(0x7 as *mut _, p, ptr::null_mut(), 0, &mut len);
        assert_eq!(s, PortallocStatus::InvalidAllocator);
    }
    // SAFETY: a live buffer.
    assert_eq!(unsafe { portalloc_free_ptr(a.0, p) }, PortallocStatus::Ok);
    // Freed: no longer a live buffer of the allocator.
    assert_eq!(export(&a, p).0, PortallocStatus::UnknownPointer);
    let mut parked = 99usize;
    // SAFETY: one size written.
    let s = unsafe { portalloc_share_settle(a.0, &mut parked) };
    assert_eq!((s, parked), (PortallocStatus::Ok, 0), "{}", last_error());
}

#[test]
fn the_simulated_host_device_cannot_export() {
    let a = make(c"bfc");
    let (_, p) = allocate(&a, MIB, c"weights");
    let (s, _) = export(&a, p);
    assert_eq!(s, PortallocStatus::Unsupported, "{}", last_error());
    assert!(
        last_error().contains("portalloc_export"),
        "{}",
        last_error()
    );
}

#[test]
fn hostile_share_handles_are_refused_with_what_is_wrong() {
    let a = make_real(c"vmm");
    let (_, p) = allocate(&a, MIB, c"weights");
    let (s, good) = export(&a, p);
    assert_eq!(s, PortallocStatus::Ok, "{}", last_error());

    let mut cases: Vec<(&str, Vec<u8>, PortallocStatus, &str)> = vec![
        (
            "empty",
            Vec::new(),
            PortallocStatus::InvalidArgument,
            "at least 80",
        ),
        (
            "cut",
            good[..good.len() - 1].to_vec(),
            PortallocStatus::InvalidArgument,
            "bytes of pieces",
        ),
        (
            "magic",
            [b"XASHARE\x01".as_slice(), &good[8..]].concat(),
            PortallocStatus::InvalidArgument,
            "not a portalloc share handle",
        ),
        (
            "version",
            [&good[..8], &7u32.to_le_bytes(), &good[12..]].concat(),
            PortallocStatus::InvalidArgument,
            "layout version 7",
        ),
        (
            "own",
            good.clone(),
            PortallocStatus::Share,
            "this process's own",
        ),
    ];
    // Another process's export that does not exist: pid 1 has no registry.
    let mut foreign = good.clone();
    foreign[16..20].copy_from_slice(&1u32.to_le_bytes());
    cases.push((
        "exporter gone",
        foreign,
        PortallocStatus::Share,
        "has no registry",
    ));
    for (name, bytes, status, says) in cases {
        let (s, message, out) = import(&a, &bytes);
        assert_eq!(s, status, "{name}: {message}");
        assert!(message.contains("portalloc_import"), "{name}: {message}");
        assert!(message.contains(says), "{name}: {message}");
        assert!(out.is_null(), "{name}: an import written");
    }

    let mut out = ptr::null_mut();
    // SAFETY: the ABI refuses null arguments and overlong lengths before reading.
    unsafe {
        let s = portalloc_import(a.0, ptr::null(), 0, &mut out);
        assert_eq!(s, PortallocStatus::NullArgument);
        let s = portalloc_import(a.0, good.as_ptr(), good.len(), ptr::null_mut());
        assert_eq!(s, PortallocStatus::NullArgument);
        let s = portalloc_import(a.0, good.as_ptr(), usize::MAX, &mut out);
        assert_eq!(s, PortallocStatus::InvalidArgument);
        assert!(last_error().contains("longer than any"), "{}", last_error());
        let s = portalloc_import(0x7 as *mut _, good.as_ptr(), good.len(), &mut out);
        assert_eq!(s, PortallocStatus::InvalidAllocator);
    }
    assert!(out.is_null());

    // Imports that were never made: refused, never dereferenced; a null close is a no-op.
    let made_up = 0x1238 as *mut PortallocImport;
    let (mut q, mut size) = (ptr::null_mut(), 0u64);
    // SAFETY: the ABI looks tokens up, never dereferences them.
    unsafe {
        assert_eq!(
            portalloc_import_ptr(made_up, &mut q),
            PortallocStatus::InvalidHandle
        );
        assert!(
            last_error().contains("not a live import"),
            "{}",
            last_error()
        );
        assert_eq!(
            portalloc_import_size(made_up, &mut size, ptr::null_mut()),
            PortallocStatus::InvalidHandle
        );
        assert_eq!(
            portalloc_import_ptr(ptr::null(), &mut q),
            PortallocStatus::NullArgument
        );
        assert_eq!(
            portalloc_import_close(made_up),
            PortallocStatus::InvalidHandle
        );
        assert_eq!(portalloc_import_close(ptr::null_mut()), PortallocStatus::Ok);
    }
}

const SHARE_EXPORTER: &str = "PORTALLOC_TEST_CAPI_SHARE_EXPORTER";

/// A real round trip through the C ABI: an exporter process ([`share_exporter_child`])
/// exports, an importer process ([`share_child`]) imports, checks the bytes, holds the import
/// while the exporter frees the buffer (kept, parked, with its bytes), then closes it: the
/// buffer is handed back. Both are this test executable, alone in their processes: the
/// exporter's registry is one per allocator that exports, and the other tests of this process
/// export on allocators of their own.
#[test_case("vmm" ; "vmm")]
#[test_case("bfc" ; "bfc")]
fn a_child_process_imports_an_export(strategy: &str) {
    let ran = run_to_end(this_test_alone("share_exporter_child").env(SHARE_EXPORTER, strategy));
    assert_ran_to(ran, "share exporter: ok", &format!("{strategy}: "));
}

#[test]
fn share_exporter_child() {
    use std::io::{BufRead, BufReader, Write};
    let Ok(strategy) = std::env::var(SHARE_EXPORTER) else {
        return; // Run by `a_child_process_imports_an_export`.
    };
    let strategy = CString::new(strategy).unwrap();
    let strategy = strategy.as_c_str();
    let a = make_real(strategy);
    let len = 3 * MIB as usize + 512;
    let (_, p) = allocate(&a, len as u64, c"weights");
    let bytes = share_pattern(len);
    // SAFETY: host memory (real, not simulated): the buffer's `len` bytes are this process's.
    unsafe { ptr::copy_nonoverlapping(bytes.as_ptr(), p.cast::<u8>(), len) };
    let (s, handle) = export(&a, p);
    assert_eq!(s, PortallocStatus::Ok, "{}", last_error());

    let mut child = this_test_alone("share_child")
        .env(SHARE_CHILD, hex(&handle))
        .env("SHARE_STRATEGY", strategy.to_str().unwrap())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut reply = || loop {
        match lines.next() {
            Some(line) => {
                // The harness's "test share_child ... " may begin the line.
                let line = line.unwrap();
                if let Some(at) = line.find("REPLY ") {
                    return line[at + "REPLY ".len()..].to_string();
                }
            }
            None => return "(the child ended)".to_string(),
        }
    };
    assert_eq!(reply(), format!("imported {len} {}", std::process::id()));

    // Freed while imported: kept for the child.
    // SAFETY: a live buffer.
    assert_eq!(unsafe { portalloc_free_ptr(a.0, p) }, PortallocStatus::Ok);
    let mut parked = 0usize;
    // SAFETY: one size written.
    let s = unsafe { portalloc_share_settle(a.0, &mut parked) };
    assert_eq!((s, parked), (PortallocStatus::Ok, 1), "{}", last_error());
    writeln!(stdin, "freed").unwrap();
    assert_eq!(reply(), "closed");
    drop(stdin);
    let status = child.wait().unwrap();
    assert!(status.success(), "the child failed: {status}");
    // SAFETY: one size written.
    let s = unsafe { portalloc_share_settle(a.0, &mut parked) };
    assert_eq!((s, parked), (PortallocStatus::Ok, 0), "{}", last_error());
    println!("share exporter: ok");
}

#[test]
fn share_child() {
    use std::io::{BufRead, Write};
    let Ok(handle) = std::env::var(SHARE_CHILD) else {
        return; // Run by `a_child_process_imports_an_export`.
    };
    let strategy = CString::new(std::env::var("SHARE_STRATEGY").unwrap()).unwrap();
    let a = make_real(&strategy);
    let handle = unhex(&handle);
    let (s, message, imported) = import(&a, &handle);
    assert_eq!(s, PortallocStatus::Ok, "{message}");
    let (mut p, mut size, mut pid) = (ptr::null_mut(), 0u64, 0u32);
    // SAFETY: a live import; valid outputs.
    unsafe {
        assert_eq!(portalloc_import_ptr(imported, &mut p), PortallocStatus::Ok);
        assert_eq!(
            portalloc_import_size(imported, &mut size, &mut pid),
            PortallocStatus::Ok
        );
    }
    let expected = share_pattern(size as usize);
    // SAFETY: host memory mapped here for `size` bytes while the import lives.
    let seen = || unsafe { std::slice::from_raw_parts(p.cast::<u8>(), size as usize) }.to_vec();
    assert!(seen() == expected, "the imported bytes differ");
    println!("REPLY imported {size} {pid}");
    std::io::stdout().flush().unwrap();
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "freed");
    assert!(
        seen() == expected,
        "the bytes changed after the exporter's free"
    );
    // SAFETY: a live import; closed once.
    unsafe {
        assert_eq!(portalloc_import_close(imported), PortallocStatus::Ok);
        assert_eq!(
            portalloc_import_close(imported),
            PortallocStatus::InvalidHandle,
            "closed twice"
        );
    }
    println!("REPLY closed");
    std::io::stdout().flush().unwrap();
}
