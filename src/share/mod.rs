//! Memory another process can map: export of allocations, import in another process.
//!
//! The room of its own for the third border of `DESIGN.md` ("Importers"). Strategies say what
//! lies under an allocation ([`Allocator::backing`]) and nothing more; everything else is
//! here:
//!
//! - [`Sharing`] wraps a strategy (every [`crate::Portalloc`] allocator is one) and exports
//!   its allocations ([`Sharing::export`]) as a [`ShareHandle`]: vmm memory as the vendors'
//!   shareable handles (POSIX descriptors), bfc and platform memory as the driver's legacy
//!   IPC handle of the device allocation under it, with the offset of the buffer in it.
//! - [`import`] maps a handle in another process — its own reservation, access set for its
//!   device only — and gives an [`ImportedBuffer`] that unmaps on drop.
//! - The descriptors reach the importer through `pidfd_getfd` or a Unix socket ([`fds`]).
//!
//! # Lifetimes, as the drivers rule them
//!
//! - **The importer's bytes stay valid while it holds the import**, whatever the exporter does:
//!   - *free*: an exported allocation freed while a live process imports it is not given to
//!     the strategy: [`Sharing`] keeps it (still counted in the exporter's books, as it is
//!     still held) and frees it once no importer holds it — at the next allocation, trim or
//!     [`Sharing::settle`]. Freed with no importer, the export is withdrawn at once: later
//!     imports of its handle are refused.
//!   - *trim* gives back only what no export or import holds.
//!   - *sleep* of a tag withdraws the exports of its allocations. The exporter's handles go
//!     back to the driver, but a shareable handle keeps its memory while any process holds it,
//!     so what importers map stays theirs and unchanged: the exporter's wake maps new memory
//!     (its later writes are not the importer's). [`SleepReport::kept_by_importers`] says how
//!     many bytes the device could not take back.
//!   - *exit or `SIGKILL` of the exporter*: vmm memory lives on in the importer (the driver's
//!     rule for shareable handles); legacy IPC memory (bfc, platform) is the exporter's and
//!     dies with it, as CUDA and HIP document: import vmm memory where the exporter may die
//!     first.
//! - **A dead importer costs the exporter nothing**: its marks in the exporter's registry
//!   count as nothing once its pid is gone.
//! - **Counted once.** The exporter's books count its allocations, exported or not; an
//!   importer's allocator counts nothing it imported ([`imported_bytes`] says how much it
//!   maps). The driver counts physical memory once however many processes map it.
//!
//! # Vendors' reported behaviours, handled
//!
//! - ROCm 7.15 refuses host-access descriptors on imported handles (ROCm/rocm-systems#11185):
//!   an import grants its own device only, never the host.
//! - ROCm 7.14 loses an import whose descriptor was closed before it was mapped
//!   (ROCm/rocm-systems PR #8440): the descriptors stay open until access is set.
//! - ROCm rejects legacy IPC handles of VMM memory (ROCm/clr PR #266): vmm memory is only ever
//!   exported as shareable handles.
#![deny(unsafe_code)]

pub mod fds;
pub mod handle;
pub mod registry;

use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

pub use fds::{receive, send, ReceivedFds};
pub use handle::{ShareHandle, SharedMemory, SharedPiece};

use crate::allocator::{Allocation, Allocator, Backing, GraphPoolStats, Keep, SleepReport};
use crate::device::{Device, PhysicalHandle, Stream, Vendor};
use crate::error::{Error, Result};
use crate::stats::Stats;
use registry::Registry;

/// Bytes this process maps from other processes' exports now.
static IMPORTED: AtomicU64 = AtomicU64::new(0);

/// The next export's key, process-wide: a handle of an export withdrawn never names a later
/// one, whichever allocator made it.
static NEXT_KEY: AtomicU64 = AtomicU64::new(1);

/// The serial of the next descriptor an export opens, process-wide (see [`SharedPiece`]).
static NEXT_SERIAL: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(1);

/// This process's registry while any allocator has exports: one file per process, shared by
/// every [`Sharing`], removed when the last of them goes.
static REGISTRY: Mutex<std::sync::Weak<Registry>> = Mutex::new(std::sync::Weak::new());

fn process_registry() -> Result<Arc<Registry>> {
    let mut held = lock(&REGISTRY);
    if let Some(r) = held.upgrade() {
        return Ok(r);
    }
    let (pid, start) = me();
    let r = Arc::new(Registry::create(&registry::default_dir(), pid, start)?);
    *held = Arc::downgrade(&r);
    Ok(r)
}

/// The marks this process holds in exporters' registries, one per export however many times
/// it imports it: (exporter pid, start time, record, key) → (the registry, the mark's slot,
/// the mark, the imports holding it).
type MarkKey = (u32, u64, u32, u64);
#[allow(clippy::type_complexity)]
static MARKS: Mutex<Option<HashMap<MarkKey, (Arc<Registry>, usize, u64, u32)>>> = Mutex::new(None);

/// Takes a use of this process's mark for export `key`, marking with `make` the first time.
fn take_mark(
    key: MarkKey,
    make: impl FnOnce() -> Result<(Arc<Registry>, usize, u64)>,
) -> Result<()> {
    let mut marks = lock(&MARKS);
    let table = marks.get_or_insert_with(HashMap::new);
    if let Some(entry) = table.get_mut(&key) {
        entry.3 += 1;
        return Ok(());
    }
    let (registry, slot, mark) = make()?;
    table.insert(key, (registry, slot, mark, 1));
    Ok(())
}

/// Whether the export this process marks as `key` still stands.
fn mark_holds(key: MarkKey) -> bool {
    let marks = lock(&MARKS);
    marks
        .as_ref()
        .and_then(|t| t.get(&key))
        .is_some_and(|(registry, ..)| registry.holds(key.2, key.3))
}

/// Gives back a use of the mark `key`; the last clears it, and removes the registry of an
/// exporter that died without removing it.
fn drop_mark(key: MarkKey) {
    let mut marks = lock(&MARKS);
    let Some(table) = marks.as_mut() else {
        return;
    };
    let Some(entry) = table.get_mut(&key) else {
        return;
    };
    entry.3 -= 1;
    if entry.3 > 0 {
        return;
    }
    let Some((registry, slot, mark, _)) = table.remove(&key) else {
        return;
    };
    registry.unmark(key.2, key.3, slot, mark);
    if crate::budget::process_start_time(key.0) != Some(key.1) {
        registry.unlink();
    }
}

/// An exported object this process imported: a physical handle (by the exporter, its
/// descriptor and the descriptor's serial) or a device allocation opened through its IPC
/// handle (by where it opened), on one device (by the `Arc`'s address).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum ObjectKey {
    Physical {
        device: usize,
        pid: u32,
        start: u64,
        fd: i32,
        serial: u32,
    },
    Plain {
        device: usize,
        base: u64,
    },
}

/// Every object imported now: its local handle (or base), its bytes, and the imports using
/// it. Each is imported, and counted in [`imported_bytes`], once however many buffers lie on
/// it, as the driver counts it once.
static OBJECTS: Mutex<Option<ObjectTable>> = Mutex::new(None);

/// Object → (its local handle or base, its bytes, the imports using it).
type ObjectTable = HashMap<ObjectKey, (u64, u64, u32)>;

/// Takes a use of `key`, importing it with `make` (its local handle and bytes) when this is
/// the first.
fn take_object(key: ObjectKey, make: impl FnOnce() -> Result<(u64, u64)>) -> Result<u64> {
    let mut objects = lock(&OBJECTS);
    let table = objects.get_or_insert_with(HashMap::new);
    if let Some((local, _, uses)) = table.get_mut(&key) {
        *uses += 1;
        return Ok(*local);
    }
    let (local, bytes) = make()?;
    table.insert(key, (local, bytes, 1));
    IMPORTED.fetch_add(bytes, Ordering::Relaxed);
    Ok(local)
}

/// Gives back a use of `key`; `Some(local)` when it was the last, for the caller to release.
fn drop_object(key: ObjectKey) -> Option<u64> {
    let mut objects = lock(&OBJECTS);
    let table = objects.as_mut()?;
    let (local, bytes, uses) = table.get_mut(&key)?;
    *uses -= 1;
    if *uses > 0 {
        return None;
    }
    let (local, bytes) = (*local, *bytes);
    table.remove(&key);
    IMPORTED.fetch_sub(bytes, Ordering::Relaxed);
    Some(local)
}

/// Bytes of device memory this process maps from other processes now ([`import`]): counted by
/// no allocator of this process, since the exporter's books count them.
pub fn imported_bytes() -> u64 {
    IMPORTED.load(Ordering::Relaxed)
}

fn vendor_code(v: Vendor) -> u8 {
    match v {
        Vendor::Host => 0,
        Vendor::Cuda => 1,
        Vendor::Hip => 2,
    }
}

fn device_id(device: &dyn Device) -> u64 {
    handle::fnv1a(&crate::budget::device_key(device.info()))
}

fn no_interprocess(device: &dyn Device) -> Error {
    let info = device.info();
    Error::Unsupported {
        what: "export and import of memory between processes".into(),
        backend: info.vendor.name(),
        reason: format!(
            "device {} ({}) offers no shareable or IPC handles (not Linux?)",
            info.ordinal, info.name
        ),
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// This process: its pid and start time.
fn me() -> (u32, u64) {
    let pid = crate::backends::shared_segment::current_pid();
    (pid, crate::budget::process_start_time(pid).unwrap_or(0))
}

/// One export.
#[derive(Debug)]
struct Export {
    handle: ShareHandle,
    /// The physical handles whose descriptors it names (mapped), each once.
    physical: Vec<PhysicalHandle>,
    /// The bytes an importer keeps alive, by object (a physical handle's id, or the plain
    /// allocation's base), each once: exports on one object count it once.
    objects: Vec<(u64, u64)>,
    tag: Option<String>,
}

#[derive(Debug, Default)]
struct State {
    registry: Option<Arc<Registry>>,
    /// Live exports by allocation address.
    exports: HashMap<u64, Export>,
    /// The descriptor of each exported physical handle, its serial, and how many exports
    /// name it.
    fds: HashMap<u64, (OwnedFd, u32, usize)>,
    /// Freed allocations still imported somewhere: freed once nobody imports them.
    parked: Vec<Allocation>,
}

/// A strategy whose allocations can be exported to other processes: [`Allocator`] like the
/// strategy it wraps, plus [`Sharing::export`]. Every allocator of a [`crate::Portalloc`] is
/// one ([`crate::Portalloc::sharing`]).
///
/// ```
/// use std::sync::Arc;
/// use portalloc::{backends::host::HostDevice, share::Sharing, Allocator, Device, Stream};
/// use portalloc::strategy::vmm::{VmmAllocator, VmmOptions};
///
/// // Real memory: a simulated host device has none to hand to another process.
/// let device: Arc<dyn Device> = Arc::new(
///     HostDevice::builder().capacity(64 << 20).simulated(false).build().unwrap(),
/// );
/// let vmm = Arc::new(VmmAllocator::new(Arc::clone(&device), VmmOptions::new(32 << 20)).unwrap());
/// let sharing = Sharing::new(vmm, Arc::clone(&device));
/// let a = sharing.allocate(1 << 20, 0, Stream::DEFAULT, "weights").unwrap();
/// let handle = sharing.export(&a).unwrap();
/// // Another process: portalloc::share::import(&its_device, &ShareHandle::from_bytes(&bytes)?)
/// let bytes = handle.to_bytes();
/// assert_eq!(portalloc::share::ShareHandle::from_bytes(&bytes).unwrap(), handle);
/// sharing.deallocate(a).unwrap();
/// ```
pub struct Sharing(Arc<Room>);

/// What a [`Sharing`] and its clones share.
struct Room {
    inner: Arc<dyn Allocator>,
    device: Arc<dyn Device>,
    state: Mutex<State>,
    /// Live exports (a free with none touches no lock of this room).
    exported: AtomicUsize,
    /// Allocations parked: a request settles them when non-zero.
    parked: AtomicUsize,
}

impl std::fmt::Debug for Sharing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = &self.0;
        f.debug_struct("Sharing")
            .field("inner", &s.inner.name())
            .field("exported", &s.exported.load(Ordering::Relaxed))
            .field("parked", &s.parked.load(Ordering::Relaxed))
            .finish()
    }
}

impl Sharing {
    /// `inner`'s allocations, exportable from `device` (the device `inner` allocates from).
    pub fn new(inner: Arc<dyn Allocator>, device: Arc<dyn Device>) -> Sharing {
        Sharing(Arc::new(Room {
            inner,
            device,
            state: Mutex::new(State::default()),
            exported: AtomicUsize::new(0),
            parked: AtomicUsize::new(0),
        }))
    }

    /// The allocator it wraps.
    pub fn inner(&self) -> &Arc<dyn Allocator> {
        &self.0.inner
    }

    /// Exports `allocation`, a live one of this allocator: a handle another process imports
    /// with [`import`]. Exporting it again gives the same handle (the same bytes). The
    /// descriptors the handle names stay open in this process until the export is withdrawn
    /// (the allocation freed with no importer, or its tag put to sleep).
    ///
    /// # Errors
    /// As [`Allocator::backing`] (a strategy that cannot say, an allocation asleep);
    /// [`Error::Unsupported`] for a device without interprocess handles or a physical handle
    /// the driver made unexportable; [`Error::Share`] when 4096 exports are live; the
    /// driver's error.
    pub fn export(&self, allocation: &Allocation) -> Result<ShareHandle> {
        self.0.export(allocation)
    }

    /// As [`Sharing::export`], for the allocation of `size` bytes at `ptr` whose backing
    /// and tag the caller asked of the adaptors above this one (the C ABI's ledger keeps
    /// allocations of its own).
    ///
    /// # Errors
    /// As [`Sharing::export`].
    #[cfg_attr(not(feature = "c-api"), allow(dead_code))]
    pub(crate) fn export_parts(
        &self,
        ptr: u64,
        size: u64,
        backing: Backing,
        tag: Option<String>,
    ) -> Result<ShareHandle> {
        self.0.export_parts(ptr, size, backing, tag)
    }

    /// The descriptors `handle` (an export of this allocator, live) names, in the order
    /// [`send`] wants them.
    ///
    /// # Errors
    /// [`Error::Share`] when the handle is not a live export of this allocator.
    pub fn descriptors(&self, handle: &ShareHandle) -> Result<Vec<OwnedFd>> {
        self.0.descriptors(handle)
    }

    /// The processes importing the export of `allocation` now (their pids); empty when it is
    /// not exported.
    pub fn importers(&self, allocation: &Allocation) -> Vec<u32> {
        self.0.importers(allocation)
    }

    /// Frees the parked allocations (freed while imported) nobody imports any more; returns
    /// how many are still parked.
    ///
    /// # Errors
    /// The strategy's error from freeing one (the rest stay parked).
    pub fn settle(&self) -> Result<usize> {
        self.0.settle()
    }

    /// How many allocations are exported now, and how many of them were freed but are kept
    /// for their importers.
    pub fn exports(&self) -> (usize, usize) {
        (
            self.0.exported.load(Ordering::Acquire),
            self.0.parked.load(Ordering::Acquire),
        )
    }
}

impl Room {
    /// [`Sharing::export`].
    fn export(&self, allocation: &Allocation) -> Result<ShareHandle> {
        if let Some(h) = self.exported_at(allocation.ptr()) {
            return Ok(h);
        }
        let backing = self.inner.backing(allocation)?;
        let tag = self.inner.tag_of(allocation);
        self.export_parts(allocation.ptr(), allocation.size(), backing, tag)
    }

    /// The handle of the live export at `ptr`.
    fn exported_at(&self, ptr: u64) -> Option<ShareHandle> {
        lock(&self.state)
            .exports
            .get(&ptr)
            .map(|e| e.handle.clone())
    }

    /// Exports the allocation of `size` bytes at `ptr` over `backing`, which sleeps with
    /// `tag`: for a caller above adaptors that keep allocations of their own (the C ABI's
    /// ledger), which asks them for the backing.
    fn export_parts(
        &self,
        ptr: u64,
        size: u64,
        backing: Backing,
        tag: Option<String>,
    ) -> Result<ShareHandle> {
        let mut state = lock(&self.state);
        if let Some(e) = state.exports.get(&ptr) {
            return Ok(e.handle.clone());
        }
        let ip = self
            .device
            .interprocess()
            .ok_or_else(|| no_interprocess(&*self.device))?;
        let (pid, start) = me();
        if state.registry.is_none() {
            state.registry = Some(process_registry()?);
        }
        let mut physical = Vec::new();
        let mut backing_objects: Vec<(u64, u64)> = Vec::new();
        let (memory, offset, span) = match backing {
            Backing::Plain { base, size } => (
                SharedMemory::Plain(ip.ipc_handle(base)?.0),
                ptr - base,
                size,
            ),
            Backing::Mapped { start, end, pieces } => {
                for p in &pieces {
                    if !backing_objects.iter().any(|&(h, _)| h == p.handle.0) {
                        backing_objects.push((p.handle.0, p.handle_size));
                    }
                }
                let mut shared = Vec::with_capacity(pieces.len());
                for p in &pieces {
                    let (fd, serial) = match state.fds.get_mut(&p.handle.0) {
                        Some((fd, serial, uses)) => {
                            if !physical.contains(&p.handle) {
                                *uses += 1;
                            }
                            (fd.as_raw_fd(), *serial)
                        }
                        None => {
                            let fd = match ip.export_physical(p.handle) {
                                Ok(fd) => fd,
                                Err(e) => {
                                    Self::release_fds(&mut state, &physical);
                                    return Err(e);
                                }
                            };
                            let raw = fd.as_raw_fd();
                            let serial = NEXT_SERIAL.fetch_add(1, Ordering::Relaxed);
                            state.fds.insert(p.handle.0, (fd, serial, 1));
                            (raw, serial)
                        }
                    };
                    if !physical.contains(&p.handle) {
                        physical.push(p.handle);
                    }
                    shared.push(SharedPiece {
                        fd,
                        serial,
                        handle_size: p.handle_size,
                        offset: p.offset,
                        len: p.len,
                    });
                }
                (SharedMemory::Mapped(shared), ptr - start, end - start)
            }
        };
        let objects: Vec<(u64, u64)> = match &memory {
            SharedMemory::Plain(_) => vec![(ptr - offset, span)],
            SharedMemory::Mapped(_) => backing_objects,
        };
        let key = NEXT_KEY.fetch_add(1, Ordering::Relaxed);
        let registry = Arc::clone(state.registry.as_ref().expect("made above"));
        let Some(record) = registry.take(key) else {
            Self::release_fds(&mut state, &physical);
            return Err(Error::Share {
                what: "export an allocation",
                reason: format!(
                    "{} exports are live in this process, the most there can be; free or \
                     withdraw some",
                    registry::RECORDS
                ),
            });
        };
        fds::allow_fetching();
        let handle = ShareHandle {
            vendor: vendor_code(self.device.info().vendor),
            pid,
            start_time: start,
            record,
            export_id: key,
            size,
            offset,
            span,
            device: device_id(&*self.device),
            memory,
        };
        registry.seal(record, key, handle::digest(&handle.to_bytes()));
        state.exports.insert(
            ptr,
            Export {
                handle: handle.clone(),
                physical,
                objects,
                tag,
            },
        );
        self.exported.store(state.exports.len(), Ordering::Release);
        Ok(handle)
    }

    /// [`Sharing::descriptors`].
    fn descriptors(&self, handle: &ShareHandle) -> Result<Vec<OwnedFd>> {
        let state = lock(&self.state);
        let live = state
            .exports
            .values()
            .any(|e| e.handle.export_id == handle.export_id);
        if !live {
            return Err(Error::Share {
                what: "send an export",
                reason: format!("export {} is not live here", handle.export_id),
            });
        }
        let mut out = Vec::new();
        for fd in fds::descriptors_of(handle) {
            let found = state
                .fds
                .values()
                .find(|(owned, _, _)| owned.as_raw_fd() == fd)
                .ok_or_else(|| Error::Share {
                    what: "send an export",
                    reason: format!("descriptor {fd} is not an exported one"),
                })?;
            out.push(found.0.try_clone().map_err(|source| Error::Os {
                call: "fcntl(F_DUPFD_CLOEXEC)",
                source,
            })?);
        }
        Ok(out)
    }

    /// [`Sharing::importers`].
    fn importers(&self, allocation: &Allocation) -> Vec<u32> {
        self.live_importers(&lock(&self.state), allocation.ptr())
    }

    /// [`Sharing::settle`].
    fn settle(&self) -> Result<usize> {
        let mut state = lock(&self.state);
        self.settle_locked(&mut state)?;
        Ok(state.parked.len())
    }

    fn settle_locked(&self, state: &mut State) -> Result<()> {
        let parked = std::mem::take(&mut state.parked);
        let mut result = Ok(());
        for a in parked {
            let held = self.live_importers(state, a.ptr());
            if held.is_empty() && result.is_ok() {
                self.withdraw(state, a.ptr());
                if let Err(e) = self.inner.deallocate(a) {
                    result = Err(e);
                }
            } else {
                state.parked.push(a);
            }
        }
        self.parked.store(state.parked.len(), Ordering::Release);
        result
    }

    fn live_importers(&self, state: &State, ptr: u64) -> Vec<u32> {
        match (state.exports.get(&ptr), &state.registry) {
            (Some(e), Some(r)) => r.importers(e.handle.record, e.handle.export_id),
            _ => Vec::new(),
        }
    }

    /// Withdraws the export at `ptr`: its record freed, its descriptors closed where no other
    /// export names them.
    fn withdraw(&self, state: &mut State, ptr: u64) {
        if let Some(e) = state.exports.remove(&ptr) {
            if let Some(r) = &state.registry {
                r.give_back(e.handle.record);
            }
            Self::release_fds(state, &e.physical);
        }
        self.exported.store(state.exports.len(), Ordering::Release);
    }

    fn release_fds(state: &mut State, physical: &[PhysicalHandle]) {
        for h in physical {
            if let Some((_, _, uses)) = state.fds.get_mut(&h.0) {
                *uses -= 1;
                if *uses == 0 {
                    state.fds.remove(&h.0);
                }
            }
        }
    }

    fn settle_if_parked(&self) {
        if self.parked.load(Ordering::Acquire) > 0 {
            if let Ok(mut state) = self.state.try_lock() {
                let _ = self.settle_locked(&mut state);
            }
        }
    }
}

impl Drop for Room {
    fn drop(&mut self) {
        // Parked allocations go back to the strategy (its drop reports nothing leaked for
        // them); an importer of vmm memory keeps it by the driver's rule.
        let state = self.state.get_mut().unwrap_or_else(PoisonError::into_inner);
        for a in std::mem::take(&mut state.parked) {
            let _ = self.inner.deallocate(a);
        }
    }
}

impl Clone for Sharing {
    fn clone(&self) -> Sharing {
        Sharing(Arc::clone(&self.0))
    }
}

impl Allocator for Sharing {
    fn name(&self) -> &str {
        self.0.inner.name()
    }

    fn id(&self) -> u64 {
        self.0.inner.id()
    }

    fn allocate(&self, size: u64, alignment: u64, stream: Stream, tag: &str) -> Result<Allocation> {
        self.0.settle_if_parked();
        self.0.inner.allocate(size, alignment, stream, tag)
    }

    /// Frees at once, unless another process imports it: then it is kept until none does.
    fn deallocate(&self, allocation: Allocation) -> Result<()> {
        if self.0.exported.load(Ordering::Acquire) == 0 {
            return self.0.inner.deallocate(allocation);
        }
        let mut state = lock(&self.0.state);
        // An address names one live allocation of the strategy at a time, and an export is
        // withdrawn when its allocation is freed: the export at this address is this one's.
        let ours = state.exports.contains_key(&allocation.ptr());
        if !ours {
            drop(state);
            return self.0.inner.deallocate(allocation);
        }
        if self.0.live_importers(&state, allocation.ptr()).is_empty() {
            self.0.withdraw(&mut state, allocation.ptr());
            drop(state);
            return self.0.inner.deallocate(allocation);
        }
        state.parked.push(allocation);
        self.0.parked.store(state.parked.len(), Ordering::Release);
        Ok(())
    }

    fn stats(&self) -> Stats {
        self.0.inner.stats()
    }

    fn charged(&self, allocation: &Allocation) -> Option<u64> {
        self.0.inner.charged(allocation)
    }

    fn pool_bytes(&self) -> u64 {
        self.0.inner.pool_bytes()
    }

    fn trim(&self) -> Result<u64> {
        {
            let mut state = lock(&self.0.state);
            self.0.settle_locked(&mut state)?;
        }
        self.0.inner.trim()
    }

    /// Withdraws the exports of the tag first (their descriptors would keep the memory), then
    /// sleeps; says what importers keep.
    fn sleep(&self, tag: &str, keep: Keep) -> Result<SleepReport> {
        let kept = {
            let mut state = lock(&self.0.state);
            let of_tag: Vec<u64> = state
                .exports
                .iter()
                .filter(|(_, e)| e.tag.as_deref() == Some(tag))
                .map(|(&p, _)| p)
                .collect();
            // Each object an importer holds, once, however many exports lie on it.
            let mut kept: HashMap<u64, u64> = HashMap::new();
            for ptr in of_tag {
                if !self.0.live_importers(&state, ptr).is_empty() {
                    if let Some(e) = state.exports.get(&ptr) {
                        kept.extend(e.objects.iter().copied());
                    }
                }
                // Parked ones too: this process maps that memory no more after the sleep, so
                // nothing it hands out later can be what an importer sees.
                self.0.withdraw(&mut state, ptr);
            }
            kept.values().sum::<u64>()
        };
        let mut report = self.0.inner.sleep(tag, keep)?;
        report.kept_by_importers = kept;
        Ok(report)
    }

    fn wake(&self, tag: &str) -> Result<SleepReport> {
        self.0.inner.wake(tag)
    }

    fn sleeping(&self) -> Vec<crate::allocator::SleepingTag> {
        self.0.inner.sleeping()
    }

    fn is_asleep(&self, allocation: &Allocation) -> bool {
        self.0.inner.is_asleep(allocation)
    }

    fn retag(&self, allocation: &Allocation, tag: &str) {
        self.0.inner.retag(allocation, tag);
        let mut state = lock(&self.0.state);
        if let Some(e) = state.exports.get_mut(&allocation.ptr()) {
            e.tag = Some(tag.to_string());
        }
    }

    fn freeing(&self, allocation: &Allocation) {
        self.0.inner.freeing(allocation);
    }

    fn check_invariants(&self) -> std::result::Result<(), String> {
        self.0.inner.check_invariants()
    }

    fn queues_on_stream(&self) -> bool {
        self.0.inner.queues_on_stream()
    }

    fn graph_pools(&self) -> Vec<GraphPoolStats> {
        self.0.inner.graph_pools()
    }

    fn tag_of(&self, allocation: &Allocation) -> Option<String> {
        self.0.inner.tag_of(allocation)
    }

    fn backing(&self, allocation: &Allocation) -> Result<Backing> {
        self.0.inner.backing(allocation)
    }
}

/// What an import maps.
#[derive(Debug)]
enum Mapping {
    /// Physical handles imported, mapped into a reservation of our own.
    Mapped {
        reservation: u64,
        span: u64,
        objects: Vec<ObjectKey>,
        mapped: Vec<(u64, u64)>,
    },
    /// Another process's device allocation, opened through its IPC handle (the driver
    /// counts opens of one handle).
    Plain { base: u64, key: ObjectKey },
}

/// An allocation of another process, mapped here ([`import`]): unmapped (and its physical
/// handles released, its IPC handle closed) on drop. The exporter keeps its memory for as
/// long as this lives (see the module's lifetimes).
pub struct ImportedBuffer {
    device: Arc<dyn Device>,
    ptr: u64,
    size: u64,
    bytes: u64,
    exporter: (u32, u64),
    mapping: Option<Mapping>,
    mark: Option<MarkKey>,
}

impl std::fmt::Debug for ImportedBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImportedBuffer")
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("size", &self.size)
            .field("exporter", &self.exporter.0)
            .finish()
    }
}

impl ImportedBuffer {
    /// Where the allocation is mapped here.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// Its size.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The device memory this import keeps alive: the whole physical handles (or device
    /// allocation) under it.
    pub fn mapped_bytes(&self) -> u64 {
        self.bytes
    }

    /// The exporting process's pid.
    pub fn exporter_pid(&self) -> u32 {
        self.exporter.0
    }

    /// The device it is mapped on.
    pub fn device(&self) -> &Arc<dyn Device> {
        &self.device
    }

    /// Copies `dst.len()` bytes from `offset` in the buffer into `dst`, on the default
    /// stream, and waits for them.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a range past the buffer; the device's error.
    pub fn read(&self, offset: u64, dst: &mut [u8]) -> Result<()> {
        let at = self.range(offset, dst.len() as u64)?;
        crate::backends::staging::read_device(&*self.device, at, dst)
    }

    /// Copies `src` to `offset` in the buffer, on the default stream, and waits for it.
    ///
    /// # Errors
    /// As [`ImportedBuffer::read`].
    pub fn write(&self, offset: u64, src: &[u8]) -> Result<()> {
        let at = self.range(offset, src.len() as u64)?;
        crate::backends::staging::write_device(&*self.device, at, src)
    }

    fn range(&self, offset: u64, len: u64) -> Result<u64> {
        match offset.checked_add(len) {
            Some(end) if end <= self.size => Ok(self.ptr + offset),
            _ => Err(Error::InvalidArgument {
                call: "ImportedBuffer::read/write",
                reason: format!(
                    "{len} bytes at {offset} run past the buffer's {} bytes",
                    self.size
                ),
            }),
        }
    }

    fn unmap(&mut self) -> Result<()> {
        let Some(mapping) = self.mapping.take() else {
            return Ok(());
        };
        let mut first = Ok(());
        let mut keep = |r: Result<()>| {
            if first.is_ok() {
                first = r;
            }
        };
        match mapping {
            Mapping::Mapped {
                reservation,
                span,
                objects,
                mapped,
            } => {
                if let Some(vm) = self.device.virtual_memory() {
                    for (va, len) in mapped {
                        keep(vm.unmap(va, len));
                    }
                    for key in objects {
                        if let Some(h) = drop_object(key) {
                            keep(vm.release_physical(PhysicalHandle(h)));
                        }
                    }
                    keep(vm.free_reservation(reservation, span));
                }
            }
            Mapping::Plain { base, key } => {
                if let Some(ip) = self.device.interprocess() {
                    keep(ip.close_ipc_handle(base));
                }
                drop_object(key);
            }
        }
        first
    }

    fn unmark(&mut self) {
        if let Some(key) = self.mark.take() {
            drop_mark(key);
        }
    }

    /// Unmaps it now, with the device's answer (drop does the same, silently).
    ///
    /// # Errors
    /// The first error of the device's unmap, release or close; the rest is still done.
    pub fn close(mut self) -> Result<()> {
        let r = self.unmap();
        self.unmark();
        r
    }
}

impl Drop for ImportedBuffer {
    fn drop(&mut self) {
        // Work on it is the caller's to have finished (as with any buffer it frees).
        let _ = self.unmap();
        self.unmark();
    }
}

/// Maps `handle` (another process's export) on `device`, fetching the exporter's descriptors
/// with `pidfd_getfd` ([`fds`]).
///
/// # Errors
/// [`Error::Share`] when the exporter withdrew the export or exited, the device is not the
/// exporter's, or the descriptors cannot be fetched; the device's error when it cannot map.
/// Nothing is left mapped or marked on an error.
pub fn import(device: &Arc<dyn Device>, handle: &ShareHandle) -> Result<ImportedBuffer> {
    import_with(device, handle, ReceivedFds::default())
}

/// As [`import`], with the descriptors received with the handle ([`receive`]): no
/// `pidfd_getfd`.
///
/// # Errors
/// As [`import`].
pub fn import_with(
    device: &Arc<dyn Device>,
    handle: &ShareHandle,
    mut received: ReceivedFds,
) -> Result<ImportedBuffer> {
    let refuse = |reason: String| Error::Share {
        what: "import an allocation",
        reason,
    };
    let info = device.info();
    if handle.vendor != vendor_code(info.vendor) {
        return Err(refuse(format!(
            "the export is of vendor {} memory, the device is {}",
            handle.vendor, info.vendor
        )));
    }
    if handle.device != device_id(&**device) {
        return Err(refuse(format!(
            "the export is of another physical device than device {} ({}; {})",
            info.ordinal,
            info.name,
            crate::budget::device_key(info)
        )));
    }
    let ip = device
        .interprocess()
        .ok_or_else(|| no_interprocess(&**device))?;
    let (my_pid, my_start) = me();
    if handle.pid == my_pid {
        return Err(refuse(
            "the export is this process's own: use the allocation itself".into(),
        ));
    }
    let device_address = Arc::as_ptr(device) as *const () as usize;
    let mark_key: MarkKey = (
        handle.pid,
        handle.start_time,
        handle.record,
        handle.export_id,
    );
    take_mark(mark_key, || {
        let registry = Arc::new(
            Registry::open(&registry::default_dir(), handle.pid, handle.start_time).map_err(
                |_| {
                    refuse(format!(
                        "exporter {} (started at {}) has no registry: it exited, or it uses \
                         another PORTALLOC_SHARE_DIR",
                        handle.pid, handle.start_time
                    ))
                },
            )?,
        );
        let mark = registry::mark_of(my_pid, my_start);
        let digest = handle::digest(&handle.to_bytes());
        let slot = registry.mark(handle.record, handle.export_id, digest, mark)?;
        Ok((registry, slot, mark))
    })?;
    let mut buffer = ImportedBuffer {
        device: Arc::clone(device),
        ptr: 0,
        size: handle.size,
        bytes: 0,
        exporter: (handle.pid, handle.start_time),
        mapping: None,
        mark: Some(mark_key),
    };
    // From here a failure drops `buffer`, which undoes what was done (and the mark).
    match &handle.memory {
        SharedMemory::Plain(ipc) => {
            let base = ip.open_ipc_handle(&crate::device::IpcMemHandle(*ipc), handle.span)?;
            let key = ObjectKey::Plain {
                device: device_address,
                base,
            };
            take_object(key, || Ok((base, handle.span)))?;
            buffer.mapping = Some(Mapping::Plain { base, key });
            buffer.bytes = handle.span;
            buffer.ptr = base + handle.offset;
        }
        SharedMemory::Mapped(pieces) => {
            let vm = device
                .virtual_memory()
                .ok_or_else(|| refuse("the device has no virtual memory to map it into".into()))?;
            let reservation = vm.reserve(handle.span, 0)?;
            buffer.mapping = Some(Mapping::Mapped {
                reservation,
                span: handle.span,
                objects: Vec::new(),
                mapped: Vec::new(),
            });
            // The descriptors of objects not imported yet: received, or copied out of the
            // exporter. Kept open until access is set (ROCm 7.14 needs them until then,
            // rocm-systems PR #8440).
            let mut open: Vec<OwnedFd> = Vec::new();
            let mut at = reservation;
            for p in pieces {
                let key = ObjectKey::Physical {
                    device: device_address,
                    pid: handle.pid,
                    start: handle.start_time,
                    fd: p.fd,
                    serial: p.serial,
                };
                let physical = take_object(key, || {
                    let fd = match received.0.remove(&p.fd) {
                        Some(owned) => owned,
                        None => fds::fetch(handle.pid, handle.start_time, p.fd)?,
                    };
                    let h = ip.import_physical(fd.as_fd(), p.handle_size)?;
                    open.push(fd);
                    Ok((h.0, p.handle_size))
                })?;
                if let Some(Mapping::Mapped { objects, .. }) = &mut buffer.mapping {
                    if !objects.contains(&key) {
                        objects.push(key);
                        buffer.bytes += p.handle_size;
                    } else {
                        // One use per buffer: a second piece of the same object takes none.
                        drop_object(key);
                    }
                }
                vm.map(at, p.len, PhysicalHandle(physical), p.offset)?;
                if let Some(Mapping::Mapped { mapped, .. }) = &mut buffer.mapping {
                    mapped.push((at, p.len));
                }
                at += p.len;
            }
            // The export still stands: the descriptors fetched are its own. (A withdrawal frees
            // the record before it closes the descriptors, so a number closed and reused
            // between the mark and the fetch shows here.)
            if !mark_holds(mark_key) {
                return Err(refuse(
                    "the exporter withdrew this export while it was being imported".into(),
                ));
            }
            // This device only, never the host: ROCm 7.15 refuses host descriptors on imported
            // handles (ROCm/rocm-systems#11185).
            vm.set_access(reservation, handle.span)?;
            drop(open);
            buffer.ptr = reservation + handle.offset;
        }
    }
    Ok(buffer)
}
