//! What the kit's own tests share: a private copy of a driver (its own state, so tests run in
//! parallel), and a GPU driven through one vendor's calls.
#![allow(dead_code)] // each test crate uses part of it

use std::ffi::{c_int, c_uint, c_void};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use portalloc_fakes::{Controls, Driver, Vendor};

static COPIES: AtomicU64 = AtomicU64::new(0);

/// A private copy of a driver and its controls.
pub struct Fake {
    pub lib: libloading::Library,
    pub controls: Controls,
    pub path: PathBuf,
    pub vendor: Vendor,
}

impl Fake {
    pub fn new(driver: Driver) -> Fake {
        let n = COPIES.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!(
            "portalloc-fakes-test-{}-{n}-lib{}.so",
            std::process::id(),
            driver.name
        ));
        std::fs::copy(driver.path(), &path).expect("a private copy");
        // SAFETY: one of the kit's drivers; nothing runs at load.
        let lib = unsafe { libloading::Library::new(&path) }.expect("it loads");
        let controls = Controls::open(&path).expect("its controls");
        Fake {
            lib,
            controls,
            path,
            vendor: driver.vendor,
        }
    }

    pub fn sym<T: Copy>(&self, name: &str) -> T {
        // SAFETY: each caller names a function with the vendor's signature for it.
        *unsafe { self.lib.get::<T>(name.as_bytes()) }.unwrap_or_else(|e| panic!("{name}: {e}"))
    }
}

impl Drop for Fake {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

pub type R = c_int;

/// What a test does on a GPU, through one vendor's calls (`cu*` or `hip*`).
pub struct Gpu {
    pub fake: Fake,
}

#[macro_export]
macro_rules! call {
    ($gpu:expr, $cuda:literal, $hip:literal, $ty:ty) => {
        $gpu.fake.sym::<$ty>(match $gpu.fake.vendor {
            Vendor::Cuda => $cuda,
            Vendor::Hip => $hip,
        })
    };
}

impl Gpu {
    /// Device 0 of a private copy of `driver`, current on this thread.
    pub fn new(driver: Driver) -> Gpu {
        let gpu = Gpu {
            fake: Fake::new(driver),
        };
        gpu.current();
        gpu
    }

    /// Makes device 0 current on the calling thread (CUDA: its primary context).
    pub fn current(&self) {
        // SAFETY: the vendors' signatures.
        unsafe {
            match self.fake.vendor {
                Vendor::Cuda => {
                    assert_eq!(
                        self.fake.sym::<unsafe extern "C" fn(c_uint) -> R>("cuInit")(0),
                        0
                    );
                    let mut ctx = std::ptr::null_mut::<c_void>();
                    let retain: unsafe extern "C" fn(*mut *mut c_void, c_int) -> R =
                        self.fake.sym("cuDevicePrimaryCtxRetain");
                    assert_eq!(retain(&mut ctx, 0), 0);
                    let set: unsafe extern "C" fn(*mut c_void) -> R =
                        self.fake.sym("cuCtxSetCurrent");
                    assert_eq!(set(ctx), 0);
                }
                Vendor::Hip => {
                    let set: unsafe extern "C" fn(c_int) -> R = self.fake.sym("hipSetDevice");
                    assert_eq!(set(0), 0);
                }
            }
        }
    }

    pub fn c(&self) -> &Controls {
        &self.fake.controls
    }

    pub fn stream(&self, flags: c_uint) -> u64 {
        let f = call!(
            self,
            "cuStreamCreate",
            "hipStreamCreateWithFlags",
            unsafe extern "C" fn(*mut u64, c_uint) -> R
        );
        let mut s = 0;
        // SAFETY: one handle written.
        assert_eq!(unsafe { f(&mut s, flags) }, 0);
        s
    }

    pub fn destroy_stream(&self, s: u64) {
        let f = call!(
            self,
            "cuStreamDestroy_v2",
            "hipStreamDestroy",
            unsafe extern "C" fn(u64) -> R
        );
        // SAFETY: a live stream.
        assert_eq!(unsafe { f(s) }, 0);
    }

    pub fn malloc(&self, n: usize) -> u64 {
        let f = call!(
            self,
            "cuMemAlloc_v2",
            "hipMalloc",
            unsafe extern "C" fn(*mut u64, usize) -> R
        );
        let mut p = 0;
        // SAFETY: one pointer written.
        assert_eq!(unsafe { f(&mut p, n) }, 0);
        p
    }

    pub fn free(&self, p: u64) -> R {
        let f = call!(
            self,
            "cuMemFree_v2",
            "hipFree",
            unsafe extern "C" fn(u64) -> R
        );
        // SAFETY: the vendors' signature; the driver checks the pointer.
        unsafe { f(p) }
    }

    pub fn host_alloc(&self, n: usize) -> *mut u8 {
        let f = call!(
            self,
            "cuMemHostAlloc",
            "hipHostMalloc",
            unsafe extern "C" fn(*mut *mut u8, usize, c_uint) -> R
        );
        let mut p = std::ptr::null_mut();
        // SAFETY: one pointer written.
        assert_eq!(unsafe { f(&mut p, n, 0) }, 0);
        p
    }

    pub fn host_free(&self, p: *mut u8) -> R {
        let f = call!(
            self,
            "cuMemFreeHost",
            "hipHostFree",
            unsafe extern "C" fn(*mut u8) -> R
        );
        // SAFETY: the vendors' signature; the driver checks the pointer.
        unsafe { f(p) }
    }

    pub fn htod_async(&self, dst: u64, src: *const u8, n: usize, s: u64) -> R {
        let f = call!(
            self,
            "cuMemcpyHtoDAsync_v2",
            "hipMemcpyHtoDAsync",
            unsafe extern "C" fn(u64, *const u8, usize, u64) -> R
        );
        // SAFETY: the caller keeps both ranges valid until the stream reaches the copy.
        unsafe { f(dst, src, n, s) }
    }

    pub fn dtoh_async(&self, dst: *mut u8, src: u64, n: usize, s: u64) -> R {
        let f = call!(
            self,
            "cuMemcpyDtoHAsync_v2",
            "hipMemcpyDtoHAsync",
            unsafe extern "C" fn(*mut u8, u64, usize, u64) -> R
        );
        // SAFETY: as for htod_async.
        unsafe { f(dst, src, n, s) }
    }

    pub fn dtoh(&self, dst: *mut u8, src: u64, n: usize) -> R {
        let f = call!(
            self,
            "cuMemcpyDtoH_v2",
            "hipMemcpyDtoH",
            unsafe extern "C" fn(*mut u8, u64, usize) -> R
        );
        // SAFETY: as for htod_async.
        unsafe { f(dst, src, n) }
    }

    pub fn memset_async(&self, dst: u64, value: u8, n: usize, s: u64) -> R {
        let f = call!(
            self,
            "cuMemsetD8Async",
            "hipMemsetD8Async",
            unsafe extern "C" fn(u64, u8, usize, u64) -> R
        );
        // SAFETY: the driver checks the range.
        unsafe { f(dst, value, n, s) }
    }

    pub fn event(&self) -> u64 {
        let f = call!(
            self,
            "cuEventCreate",
            "hipEventCreateWithFlags",
            unsafe extern "C" fn(*mut u64, c_uint) -> R
        );
        let mut e = 0;
        // SAFETY: one handle written.
        assert_eq!(unsafe { f(&mut e, 2) }, 0);
        e
    }

    pub fn record(&self, e: u64, s: u64) {
        let f = call!(
            self,
            "cuEventRecord",
            "hipEventRecord",
            unsafe extern "C" fn(u64, u64) -> R
        );
        // SAFETY: live handles.
        assert_eq!(unsafe { f(e, s) }, 0);
    }

    pub fn wait(&self, s: u64, e: u64) {
        let f = call!(
            self,
            "cuStreamWaitEvent",
            "hipStreamWaitEvent",
            unsafe extern "C" fn(u64, u64, c_uint) -> R
        );
        // SAFETY: live handles.
        assert_eq!(unsafe { f(s, e, 0) }, 0);
    }

    pub fn sync(&self, s: u64) {
        let f = call!(
            self,
            "cuStreamSynchronize",
            "hipStreamSynchronize",
            unsafe extern "C" fn(u64) -> R
        );
        // SAFETY: a live stream.
        assert_eq!(unsafe { f(s) }, 0);
    }

    pub fn query(&self, s: u64) -> R {
        let f = call!(
            self,
            "cuStreamQuery",
            "hipStreamQuery",
            unsafe extern "C" fn(u64) -> R
        );
        // SAFETY: a live stream.
        unsafe { f(s) }
    }
}

pub const CUDA12: Driver = Driver::FAKECUDA;
pub const HIP: Driver = Driver::FAKEHIP;
pub const NON_BLOCKING: c_uint = 1;
pub const NOT_READY: R = 600;

// ---- code objects ------------------------------------------------------------------------------

/// A 64-bit little-endian ELF object for `machine` with a symbol table of `symbols` (name,
/// type, binding, size): what the fakes read of a cubin or an AMD code object.
pub fn elf(machine: u16, symbols: &[(&str, u8, u8, u64)]) -> Vec<u8> {
    let mut strtab = vec![0u8];
    let mut symtab = vec![0u8; 24];
    for (name, kind, bind, size) in symbols {
        let at = strtab.len() as u32;
        strtab.extend_from_slice(name.as_bytes());
        strtab.push(0);
        let mut sym = [0u8; 24];
        sym[..4].copy_from_slice(&at.to_le_bytes());
        sym[4] = bind << 4 | kind;
        sym[6..8].copy_from_slice(&1u16.to_le_bytes());
        sym[16..24].copy_from_slice(&size.to_le_bytes());
        symtab.extend_from_slice(&sym);
    }
    let strtab_at = 64u64;
    let symtab_at = (strtab_at + strtab.len() as u64).next_multiple_of(8);
    let sections_at = (symtab_at + symtab.len() as u64).next_multiple_of(8);
    let mut out = vec![0u8; 64];
    out[..8].copy_from_slice(b"\x7fELF\x02\x01\x01\x00");
    out[16..18].copy_from_slice(&1u16.to_le_bytes()); // ET_REL
    out[18..20].copy_from_slice(&machine.to_le_bytes());
    out[20..24].copy_from_slice(&1u32.to_le_bytes());
    out[0x28..0x30].copy_from_slice(&sections_at.to_le_bytes());
    out[0x34..0x36].copy_from_slice(&64u16.to_le_bytes());
    out[0x3a..0x3c].copy_from_slice(&64u16.to_le_bytes());
    out[0x3c..0x3e].copy_from_slice(&3u16.to_le_bytes());
    out.extend_from_slice(&strtab);
    out.resize(symtab_at as usize, 0);
    out.extend_from_slice(&symtab);
    out.resize(sections_at as usize, 0);
    let section = |kind: u32, at: u64, size: u64, link: u32, entsize: u64| {
        let mut sh = [0u8; 64];
        sh[4..8].copy_from_slice(&kind.to_le_bytes());
        sh[0x18..0x20].copy_from_slice(&at.to_le_bytes());
        sh[0x20..0x28].copy_from_slice(&size.to_le_bytes());
        sh[0x28..0x2c].copy_from_slice(&link.to_le_bytes());
        sh[0x38..0x40].copy_from_slice(&entsize.to_le_bytes());
        sh
    };
    out.extend_from_slice(&[0u8; 64]);
    out.extend_from_slice(&section(2, symtab_at, symtab.len() as u64, 2, 24));
    out.extend_from_slice(&section(3, strtab_at, strtab.len() as u64, 0, 0));
    out
}

/// A CUDA fatbin holding `elf` (its header, one entry header, the object).
pub fn fatbin(elf: &[u8]) -> Vec<u8> {
    let mut entry = vec![0u8; 64];
    entry[..2].copy_from_slice(&2u16.to_le_bytes()); // an ELF entry
    entry[4..8].copy_from_slice(&64u32.to_le_bytes());
    entry[8..16].copy_from_slice(&(elf.len() as u64).to_le_bytes());
    let mut out = vec![0x50, 0xed, 0x55, 0xba, 1, 0, 16, 0];
    out.extend_from_slice(&((entry.len() + elf.len()) as u64).to_le_bytes());
    out.extend_from_slice(&entry);
    out.extend_from_slice(elf);
    out
}

/// A clang offload bundle of a host entry (empty) and `elf` for an AMD GPU.
pub fn offload_bundle(elf: &[u8]) -> Vec<u8> {
    let ids: [&[u8]; 2] = [
        b"host-x86_64-unknown-linux-gnu-",
        b"hipv4-amdgcn-amd-amdhsa--gfx942",
    ];
    let header = 24 + 8 + ids.iter().map(|id| 24 + id.len()).sum::<usize>();
    let at = header.next_multiple_of(8) as u64;
    let mut out = b"__CLANG_OFFLOAD_BUNDLE__".to_vec();
    out.extend_from_slice(&2u64.to_le_bytes());
    for (id, (offset, size)) in ids.iter().zip([(at, 0u64), (at, elf.len() as u64)]) {
        out.extend_from_slice(&offset.to_le_bytes());
        out.extend_from_slice(&size.to_le_bytes());
        out.extend_from_slice(&(id.len() as u64).to_le_bytes());
        out.extend_from_slice(id);
    }
    out.resize(at as usize, 0);
    out.extend_from_slice(elf);
    out
}

pub const STT_OBJECT: u8 = 1;
pub const STT_FUNC: u8 = 2;
pub const STB_LOCAL: u8 = 0;
pub const STB_GLOBAL: u8 = 1;
/// The machines of the vendors' code objects.
pub const EM_CUDA: u16 = 190;
pub const EM_AMDGPU: u16 = 224;

impl Gpu {
    /// The kernels a test loads, as each vendor takes them: `ptx` (NUL-terminated) for CUDA,
    /// an AMD GPU code object with the same `functions` and `globals` (name, bytes) for HIP,
    /// which takes no PTX.
    pub fn image(&self, ptx: &[u8], functions: &[&str], globals: &[(&str, u64)]) -> Vec<u8> {
        match self.fake.vendor {
            Vendor::Cuda => ptx.to_vec(),
            Vendor::Hip => {
                let mut symbols: Vec<(&str, u8, u8, u64)> = functions
                    .iter()
                    .map(|f| (*f, STT_FUNC, STB_GLOBAL, 64))
                    .collect();
                symbols.extend(
                    globals
                        .iter()
                        .map(|(g, n)| (*g, STT_OBJECT, STB_GLOBAL, *n)),
                );
                elf(EM_AMDGPU, &symbols)
            }
        }
    }
}

impl Gpu {
    /// Page-locks the caller's `[p, p + n)` (`cuMemHostRegister_v2`, `hipHostRegister`).
    pub fn register(&self, p: *mut u8, n: usize) -> R {
        let f = call!(
            self,
            "cuMemHostRegister_v2",
            "hipHostRegister",
            unsafe extern "C" fn(*mut u8, usize, c_uint) -> R
        );
        // SAFETY: the driver only records the range; the caller keeps it alive while registered.
        unsafe { f(p, n, 0) }
    }

    /// Undoes [`Gpu::register`].
    pub fn unregister(&self, p: *mut u8) -> R {
        let f = call!(
            self,
            "cuMemHostUnregister",
            "hipHostUnregister",
            unsafe extern "C" fn(*mut u8) -> R
        );
        // SAFETY: the driver checks the pointer.
        unsafe { f(p) }
    }
}
