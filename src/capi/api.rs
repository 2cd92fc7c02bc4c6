//! The exported functions of the C ABI (see the [module documentation](super)).

use std::ffi::{c_char, c_void};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use super::handles::HandleTable;
use super::handles::{Live, StreamUse};
use super::Deferred;
use super::{
    guard, guard_out, last_error_ptr, read_str, register, require_non_null, unregister,
    with_instance, write_opt, write_out, Failure, Instance, PortallocAllocator, PortallocStatus,
};
use crate::adaptor::{Detect, GraphPools, LedgerAllocator, LedgerOptions};
use crate::allocator::Allocator;
use crate::config::{Config, StrategyKind};
use crate::device::Event;
use crate::device::Stream;
use crate::discover::{discover, discover_device};

/// Options of [`portalloc_create`]. Fill with [`portalloc_options_default`], then set what
/// you need; every field left at its default defers to the environment (unless
/// `ignore_env`), then to portalloc's defaults.
///
/// Versions: the struct only grows, at its end, and every call that reads or writes it is
/// told its size, so that a program and a library of different versions agree on what the
/// other holds. In C this takes nothing: `portalloc_options_default(out)` and
/// `portalloc_create(options, out)` are macros (at the end of `include/portalloc.h`) that call
/// [`portalloc_options_init`] and [`portalloc_create_sized`] with
/// `sizeof(struct PortallocOptions)`. A program compiled against portalloc 0.1.0's header,
/// whose struct ends at `ignore_env`, calls the functions of those names themselves: they
/// read and write that first layout only, and the fields added since take their defaults
/// (`peer_access`: the environment). A size larger than this library knows (a newer header
/// than the library) is refused.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PortallocOptions {
    /// Strategy name as `PORTALLOC_ALLOCATOR` takes it (`bfc`, `platform`, `vmm`, …); null:
    /// the environment or the default.
    pub strategy: *const c_char,
    /// Fraction of total device memory, in (0, 1]; 0: the environment or the default.
    pub mem_fraction: f64,
    /// 1 preallocate, 0 grow, -1 the environment or the default.
    pub preallocate: i32,
    /// Backend to force (`host`, `cuda`, `hip`, `auto`); null: the environment or discovery.
    pub backend: *const c_char,
    /// Capacity of the host device in bytes; 0: the environment or physical memory.
    pub host_capacity: u64,
    /// 1 simulated host device (addresses only), 0 real memory, -1 the environment.
    pub host_simulated: i32,
    /// 1 capture a backtrace at every allocation, 0 not, -1 `PORTALLOC_BACKTRACE`.
    pub backtrace: i32,
    /// The device ordinal.
    pub device: u32,
    /// Nonzero: start from portalloc's defaults instead of the environment.
    pub ignore_env: i32,
    /// 1 enable peer access between the devices that report it, both ways, before the
    /// allocator is made (`cuCtxEnablePeerAccess` / `hipDeviceEnablePeerAccess`; `vmm` then
    /// grants the peers access to what it maps); 0 leave it off; -1 `PORTALLOC_PEER_ACCESS`
    /// (off unless set). Off by default because it changes the devices' primary contexts, which
    /// the whole process shares. A pair that cannot have it — a single device, a pair the
    /// driver does not report as capable, a driver without the peer-access calls — is left as
    /// it is: not an error, as in `Portalloc::from_config`. Not in 0.1.0's layout.
    pub peer_access: i32,
}

/// The size of [`PortallocOptions`] in portalloc 0.1.0, the first layout: the fields up to
/// `ignore_env` (`peer_access` follows it with no padding between), the struct's alignment
/// included. What the functions named `portalloc_options_default` and `portalloc_create`
/// read and write.
const OPTIONS_SIZE_V1: usize = {
    let end = std::mem::offset_of!(PortallocOptions, peer_access);
    let align = std::mem::align_of::<PortallocOptions>();
    end.div_ceil(align) * align
};

/// The sizes of [`PortallocOptions`] this library accepts, oldest first: one per layout.
const OPTIONS_SIZES: [usize; 2] = [OPTIONS_SIZE_V1, std::mem::size_of::<PortallocOptions>()];

/// Refuses a `size` of [`PortallocOptions`] that is not one of [`OPTIONS_SIZES`].
fn check_options_size(call: &str, size: usize) -> Result<(), Failure> {
    if OPTIONS_SIZES.contains(&size) {
        return Ok(());
    }
    let (status, why) = if size > std::mem::size_of::<PortallocOptions>() {
        (
            PortallocStatus::Unsupported,
            "larger than this library's: the program was compiled against a newer portalloc.h \
             than this libportalloc.so; use the library of that version",
        )
    } else {
        (
            PortallocStatus::InvalidArgument,
            "not the size of any layout: pass sizeof(struct PortallocOptions)",
        )
    };
    Err(Failure::new(
        status,
        format!(
            "{call}: a PortallocOptions of {size} bytes is {why} (portalloc {} knows {} and {} \
             bytes)",
            env!("CARGO_PKG_VERSION"),
            OPTIONS_SIZES[0],
            OPTIONS_SIZES[1]
        ),
    ))
}

/// Every field at its default: each defers to the environment, device 0.
fn default_options() -> PortallocOptions {
    PortallocOptions {
        strategy: std::ptr::null(),
        mem_fraction: 0.0,
        preallocate: -1,
        backend: std::ptr::null(),
        host_capacity: 0,
        host_simulated: -1,
        backtrace: -1,
        device: 0,
        ignore_env: 0,
        peer_access: -1,
    }
}

/// Counters of an allocator (XLA's `AllocatorStats` names, plus the ledger's live count).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PortallocStats {
    /// Allocations served.
    pub num_allocs: u64,
    /// Bytes handed out (as rounded by the strategy).
    pub bytes_in_use: u64,
    /// High-water mark of `bytes_in_use`.
    pub peak_bytes_in_use: u64,
    /// Largest single allocation served (rounded).
    pub largest_alloc_size: u64,
    /// The allocator's limit (`fraction × total`); 0 when it has none.
    pub bytes_limit: u64,
    /// Bytes reserved beyond the pool.
    pub bytes_reserved: u64,
    /// High-water mark of `bytes_reserved`.
    pub peak_bytes_reserved: u64,
    /// Largest free block servable without asking the device.
    pub largest_free_block_bytes: u64,
    /// Bytes held from the device.
    pub pool_bytes: u64,
    /// High-water mark of `pool_bytes`.
    pub peak_pool_bytes: u64,
    /// `(free − largest free block) / free`.
    pub fragmentation: f64,
    /// Live buffers (the ledger's count).
    pub live_allocations: u64,
}

/// portalloc's version, as static NUL-terminated text.
#[no_mangle]
pub extern "C" fn portalloc_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}

/// The name of a status code (`PORTALLOC_STATUS_OK`, …), as static text; `"unknown status"`
/// for a value that is not one.
#[no_mangle]
pub extern "C" fn portalloc_status_name(status: i32) -> *const c_char {
    const NAMES: [&std::ffi::CStr; 14] = [
        c"PORTALLOC_STATUS_OK",
        c"PORTALLOC_STATUS_NULL_ARGUMENT",
        c"PORTALLOC_STATUS_INVALID_ARGUMENT",
        c"PORTALLOC_STATUS_OUT_OF_MEMORY",
        c"PORTALLOC_STATUS_INVALID_HANDLE",
        c"PORTALLOC_STATUS_UNKNOWN_POINTER",
        c"PORTALLOC_STATUS_INVALID_ALLOCATOR",
        c"PORTALLOC_STATUS_CONFIG",
        c"PORTALLOC_STATUS_UNSUPPORTED",
        c"PORTALLOC_STATUS_DEVICE",
        c"PORTALLOC_STATUS_BUFFER_TOO_SMALL",
        c"PORTALLOC_STATUS_PANIC",
        c"PORTALLOC_STATUS_INTERNAL",
        c"PORTALLOC_STATUS_SHARE",
    ];
    usize::try_from(status)
        .ok()
        .and_then(|i| NAMES.get(i))
        .map_or(c"unknown status".as_ptr(), |n| n.as_ptr())
}

/// The message of the last failed call on this thread (empty if none failed yet). The text
/// stays valid until the next portalloc call on this thread; copy it to keep it.
#[no_mangle]
pub extern "C" fn portalloc_last_error() -> *const c_char {
    last_error_ptr()
}

/// Fills the first `size` bytes of `out` with the defaults: every field defers to the
/// environment, device 0. `size` is `sizeof(struct PortallocOptions)` of the caller's header
/// (the macro `portalloc_options_default` passes it); one of a layout this library knows, else
/// `PORTALLOC_STATUS_INVALID_ARGUMENT` (`PORTALLOC_STATUS_UNSUPPORTED` when larger than this
/// library's) and nothing is written.
///
/// # Safety
/// `out` is null or valid for writing `size` bytes.
#[no_mangle]
pub unsafe extern "C" fn portalloc_options_init(
    out: *mut PortallocOptions,
    size: usize,
) -> PortallocStatus {
    const CALL: &str = "portalloc_options_init";
    guard(CALL, || {
        require_non_null(CALL, "out", out)?;
        check_options_size(CALL, size)?;
        let defaults = default_options();
        // SAFETY: `size` is at most the size of `defaults` (checked); the caller promises
        // `size` writable bytes at `out`, checked non-null. Bytes: no alignment needed.
        unsafe {
            std::ptr::copy_nonoverlapping(
                std::ptr::addr_of!(defaults).cast::<u8>(),
                out.cast::<u8>(),
                size,
            )
        };
        Ok(())
    })
}

/// [`portalloc_options_init`] of portalloc 0.1.0's layout, for the programs compiled against
/// that header: it writes the fields up to `ignore_env` only. A C program compiled against
/// this header calls [`portalloc_options_init`] through the macro of this name instead.
///
/// # Safety
/// `out` is null or valid for writing portalloc 0.1.0's `PortallocOptions`.
#[no_mangle]
pub unsafe extern "C" fn portalloc_options_default(out: *mut PortallocOptions) -> PortallocStatus {
    // SAFETY: the caller's promise on `out`, for the size of the first layout.
    unsafe { portalloc_options_init(out, OPTIONS_SIZE_V1) }
}

fn tristate(call: &str, field: &str, v: i32) -> Result<Option<bool>, Failure> {
    match v {
        -1 => Ok(None),
        0 => Ok(Some(false)),
        1 => Ok(Some(true)),
        other => Err(Failure::new(
            PortallocStatus::InvalidArgument,
            format!("{call}: options.{field} = {other} is not accepted: 1, 0, or -1 (environment)"),
        )),
    }
}

pub(crate) fn make_instance(
    config: &Config,
    ordinal: u32,
    global: bool,
) -> Result<Instance, Failure> {
    // One device is opened, unless peer access is asked for (it needs the peers).
    let discovery = if config.peer_access.value {
        discover(config)?
    } else {
        discover_device(config, ordinal)?
    };
    let count = discovery.devices.len();
    let device = discovery
        .devices
        .iter()
        .find(|d| d.info().ordinal == ordinal)
        .cloned()
        .ok_or_else(|| {
            Failure::new(
                PortallocStatus::InvalidArgument,
                format!(
                    "device {ordinal} does not exist: the {} backend has {count} device(s), \
                     ordinals 0 to {}",
                    discovery.chosen,
                    count.saturating_sub(1)
                ),
            )
        })?;
    // Peer access as the configuration asks (off unless asked), before the strategy is
    // built, as `Portalloc::from_config` does: `vmm` grants the peers the device reports.
    crate::discover::configure_peer_access(config, &discovery.devices);
    // A member of the device's shared budget as the configuration says, as
    // `Portalloc::from_config` makes its allocators (a segment that cannot be used: alone,
    // with one warning).
    let crate::discover::Member {
        allocator: strategy,
        budget,
        sharing,
    } = crate::discover::build_member_boxed(config, &device)?;
    // Graph pools over the strategy: a global allocator (the PyTorch and CuPy hooks) is never
    // told when its caller captures, so it asks the driver about every request's stream.
    let detect = if global {
        Detect::EveryRequest
    } else {
        Detect::WhileRouted
    };
    let pools = GraphPools::from_boxed(strategy, Arc::clone(&device), detect);
    // The backtrace switch is the configuration's: PORTALLOC_BACKTRACE (unless ignore_env)
    // or the caller's explicit choice, through the builder.
    let options = LedgerOptions::default().with_config(config);
    let upstream: Box<dyn Allocator> = Box::new(pools.clone());
    let ledger = LedgerAllocator::from_boxed(upstream, options).with_device(Arc::clone(&device));
    Ok(Instance {
        ledger,
        pools,
        table: Mutex::new(HandleTable::new()?),
        global,
        device,
        deferred: Mutex::new(Vec::new()),
        budget,
        sharing,
    })
}

/// Creates an allocator for device `device` from the environment (`XLA_*`, `PORTALLOC_*`),
/// like `Portalloc::from_env`, with a ledger. Writes it to `*out`.
///
/// # Safety
/// `out` is null or valid for writing one pointer.
#[no_mangle]
pub unsafe extern "C" fn portalloc_create_from_env(
    device: u32,
    out: *mut *mut PortallocAllocator,
) -> PortallocStatus {
    const CALL: &str = "portalloc_create_from_env";
    // SAFETY: the caller's promise on `out`.
    unsafe {
        guard_out(CALL, out, || {
            let config = Config::from_env()?;
            Ok(register(make_instance(&config, device, false)?))
        })
    }
}

/// Creates an allocator from explicit options (see [`PortallocOptions`]) of `size` bytes:
/// `sizeof(struct PortallocOptions)` of the caller's header (the macro `portalloc_create`
/// passes it). The fields a smaller, older layout lacks take their defaults; a size of no
/// known layout is refused as [`portalloc_options_init`] refuses it. Writes the allocator to
/// `*out`.
///
/// # Safety
/// `options` is null or points to `size` readable bytes holding a `PortallocOptions` whose
/// string fields are null or NUL-terminated; `out` is null or valid for writing one pointer.
#[no_mangle]
pub unsafe extern "C" fn portalloc_create_sized(
    options: *const PortallocOptions,
    size: usize,
    out: *mut *mut PortallocAllocator,
) -> PortallocStatus {
    const CALL: &str = "portalloc_create";
    guard(CALL, || {
        require_non_null(CALL, "options", options)?;
        require_non_null(CALL, "out", out)?;
        check_options_size(CALL, size)?;
        let mut o = default_options();
        // SAFETY: `size` is at most the size of `o` (checked); the caller promises `size`
        // readable bytes at `options`, checked non-null. Bytes: no alignment needed, and
        // every bit pattern is a value of these fields.
        unsafe {
            std::ptr::copy_nonoverlapping(
                options.cast::<u8>(),
                std::ptr::addr_of_mut!(o).cast::<u8>(),
                size,
            )
        };
        // SAFETY: the caller's promise on the string fields.
        let config = unsafe { config_of(&o) }?;
        let instance = make_instance(&config, o.device, false)?;
        // SAFETY: the caller's promise on `out`, checked non-null above.
        unsafe { write_out(CALL, "out", out, register(instance)) }
    })
}

/// [`portalloc_create_sized`] with portalloc 0.1.0's layout, for the programs compiled
/// against that header: it reads the fields up to `ignore_env` only, and the later ones
/// (`peer_access`) take their defaults. A C program compiled against this header calls
/// [`portalloc_create_sized`] through the macro of this name instead.
///
/// # Safety
/// `options` is null or points to a valid `PortallocOptions` of portalloc 0.1.0 whose string
/// fields are null or NUL-terminated; `out` is null or valid for writing one pointer.
#[no_mangle]
pub unsafe extern "C" fn portalloc_create(
    options: *const PortallocOptions,
    out: *mut *mut PortallocAllocator,
) -> PortallocStatus {
    // SAFETY: the caller's promises, for the size of the first layout.
    unsafe { portalloc_create_sized(options, OPTIONS_SIZE_V1, out) }
}

/// The configuration `o` asks for.
///
/// # Safety
/// The string fields of `o` are null or NUL-terminated.
unsafe fn config_of(o: &PortallocOptions) -> Result<Config, Failure> {
    const CALL: &str = "portalloc_create";
    let mut b = Config::builder();
    if o.ignore_env != 0 {
        b = b.ignore_env();
    }
    // SAFETY: the caller's promise on the string fields.
    if let Some(s) = unsafe { read_str(CALL, "options.strategy", o.strategy) }? {
        b = b.strategy(s.parse::<StrategyKind>()?);
    }
    if o.mem_fraction != 0.0 {
        b = b.mem_fraction(o.mem_fraction);
    }
    if let Some(p) = tristate(CALL, "preallocate", o.preallocate)? {
        b = b.preallocate(p);
    }
    // SAFETY: as above.
    if let Some(s) = unsafe { read_str(CALL, "options.backend", o.backend) }? {
        let backend = crate::config::parse_backend("options.backend", &s)?;
        b = b.backend(backend);
    }
    if o.host_capacity != 0 {
        b = b.host_capacity(o.host_capacity);
    }
    if let Some(s) = tristate(CALL, "host_simulated", o.host_simulated)? {
        b = b.host_simulated(s);
    }
    if let Some(bt) = tristate(CALL, "backtrace", o.backtrace)? {
        b = b.backtrace(bt);
    }
    if let Some(p) = tristate(CALL, "peer_access", o.peer_access)? {
        b = b.peer_access(p);
    }
    Ok(b.build()?)
}

/// Destroys an allocator: frees every buffer still live (handles die with it) and returns
/// its memory to the device. The pointer is refused by every call afterwards; a call that
/// races the destroy either completes before it (its buffer is then freed by it) or fails
/// with `PORTALLOC_STATUS_INVALID_ALLOCATOR` having given back what it took.
///
/// # Safety
/// None beyond the ABI: `allocator` is only looked up, never dereferenced.
#[no_mangle]
pub unsafe extern "C" fn portalloc_destroy(allocator: *mut PortallocAllocator) -> PortallocStatus {
    const CALL: &str = "portalloc_destroy";
    guard(CALL, || {
        let instance = unregister(CALL, allocator)?;
        // Closed under the table's lock: an allocation inserting after this is refused.
        let live = instance.table().close();
        let mut first_error = None;
        for l in live {
            if let Err(f) = give_back(&instance, l) {
                first_error.get_or_insert(f);
            }
        }
        // Buffers waiting for other streams' work: waited for now.
        settle_deferred(&instance, true);
        match first_error {
            Some(f) => Err(f),
            None => Ok(()),
        }
    })
}

/// Frees a buffer taken out of the table: at once, or — when it was used on other streams
/// ([`portalloc_record_stream`]) — once events recorded there now complete.
///
/// # Errors
/// The allocator's refusal of the free.
pub(crate) fn give_back(instance: &Instance, live: Live) -> Result<(), Failure> {
    let Live { allocation, uses } = live;
    if uses.is_empty() {
        return Ok(instance.ledger.deallocate(allocation)?);
    }
    let device = &*instance.device;
    let mut events: Vec<Event> = Vec::new();
    for used in uses {
        let stream = used.stream;
        if !used.reachable_here() {
            // Another thread's per-thread stream: no event this thread records can follow
            // its work, so the device is synchronised (no lock held), as for a per-thread
            // buffer freed off its thread.
            if let Err(e) = device.synchronize_device() {
                super::warn(&format!(
                    "a buffer used on another thread's per-thread stream: could not \
                     synchronize the device before its free: {e}"
                ));
            }
            continue;
        }
        let recorded = device
            .create_event()
            .and_then(|e| match device.record_event(e, stream) {
                Ok(()) => Ok(e),
                Err(err) => {
                    let _ = device.destroy_event(e);
                    Err(err)
                }
            });
        match recorded {
            Ok(e) => events.push(e),
            // No event on that stream: wait for it (or the device) instead; never idle.
            Err(e) => {
                tracing::debug!(stream = stream.as_raw(), error = %e,
                    "no event for a recorded stream; synchronizing it");
                if device.synchronize_stream(stream).is_err() {
                    let _ = device.synchronize_device();
                }
            }
        }
    }
    if events.is_empty() {
        return Ok(instance.ledger.deallocate(allocation)?);
    }
    // The caller has freed it: from now on no sleep of its tag copies or unmaps it, though
    // the allocator holds it until the events complete.
    instance.ledger.freeing(&allocation);
    instance.deferred().push(Deferred { allocation, events });
    Ok(())
}

/// Hands back to the allocator the deferred frees whose events completed (all of them after
/// waiting, with `wait`: on the CPU, with no lock held).
pub(crate) fn settle_deferred(instance: &Instance, wait: bool) {
    let taken = std::mem::take(&mut *instance.deferred());
    if taken.is_empty() {
        return;
    }
    let device = &*instance.device;
    let mut kept = Vec::new();
    for d in taken {
        if wait {
            for &e in &d.events {
                if device.synchronize_event(e).is_err() {
                    let _ = device.synchronize_device();
                }
            }
        }
        let done = d
            .events
            .iter()
            .all(|&e| matches!(device.event_complete(e), Ok(true)));
        if !done {
            kept.push(d);
            continue;
        }
        for &e in &d.events {
            let _ = device.destroy_event(e);
        }
        if let Err(e) = instance.ledger.deallocate(d.allocation) {
            super::warn(&format!("a deferred free was refused: {e}"));
        }
    }
    instance.deferred().extend(kept);
}

/// Allocates `size` bytes aligned to `alignment` (a power of two; 0: the strategy's default)
/// for `stream`, labelled `tag` (null: the thread's tag from `portalloc_set_thread_tag`, else
/// the process's from `portalloc_set_process_tag`, else `"buffer"`; at most 1024 bytes, as
/// every call that takes a tag, else `PORTALLOC_STATUS_INVALID_ARGUMENT`). A tag passed
/// here is a name in the ledger; the buffers of a tag sleep apart from all others only when
/// the tag was declared ([`portalloc_declare_sleep_tag`], or set as a thread or process
/// tag).
/// Writes the handle to `*out_handle` and,
/// if `out_ptr` is not null, the device pointer to `*out_ptr` (null for a zero-byte buffer).
/// `stream` is the caller's own handle as an integer (a `cudaStream_t`, `CUstream` or
/// `hipStream_t` of the device's context, 0 for the default stream): nothing to register.
/// The buffer is freed in stream order on it: another stream gets the memory only after
/// the work queued on `stream` before the free has completed.
///
/// # Safety
/// `tag` is null or NUL-terminated; `out_handle` null or valid for one `uint64_t`; `out_ptr`
/// null or valid for one pointer.
#[no_mangle]
pub unsafe extern "C" fn portalloc_allocate(
    allocator: *mut PortallocAllocator,
    size: u64,
    alignment: u64,
    stream: u64,
    tag: *const c_char,
    out_handle: *mut u64,
    out_ptr: *mut *mut c_void,
) -> PortallocStatus {
    const CALL: &str = "portalloc_allocate";
    with_instance(CALL, allocator, |instance| {
        require_non_null(CALL, "out_handle", out_handle)?;
        // SAFETY: the caller's promise on `tag`.
        let tag = unsafe { read_optional_tag(CALL, "tag", tag) }?;
        let (handle, ptr) = allocate(&instance, size, alignment, stream, tag.as_deref())?;
        // SAFETY: the caller's promises on the output pointers; `out_handle` checked above.
        unsafe {
            write_out(CALL, "out_handle", out_handle, handle)?;
            write_opt(out_ptr, ptr as usize as *mut c_void);
        }
        Ok(())
    })
}

pub(crate) fn allocate(
    instance: &Instance,
    size: u64,
    alignment: u64,
    stream: u64,
    tag: Option<&str>,
) -> Result<(u64, u64), Failure> {
    let stream = Stream(stream);
    let region = if tag.is_none() { region_tag() } else { None };
    let tag = tag.or(region.as_deref()).unwrap_or("buffer");
    settle_deferred(instance, false);
    let a = match instance.ledger.allocate(size, alignment, stream, tag) {
        Err(e) if e.is_out_of_memory() && !instance.deferred().is_empty() => {
            // Memory waiting only for other streams' work: wait for it, then try again.
            settle_deferred(instance, true);
            instance.ledger.allocate(size, alignment, stream, tag)?
        }
        other => other?,
    };
    let ptr = a.ptr();
    let inserted = instance.table().insert(a);
    match inserted {
        Ok(handle) => Ok((handle, ptr)),
        Err((refusal, a)) => {
            // No handle to give (full, or destroyed meanwhile): hand the buffer back rather
            // than leak it, or return memory the destroy frees.
            let _ = instance.ledger.deallocate(a);
            Err(refusal.into())
        }
    }
}

/// Frees the buffer `handle` names. A handle already freed or donated is refused with
/// `PORTALLOC_STATUS_INVALID_HANDLE` ("buffer has been deleted or donated"); nothing is freed
/// twice. Handles are unique among the live allocators of the process: another allocator's
/// handle is refused the same way ("not issued by this allocator").
///
/// # Safety
/// None beyond the ABI: `allocator` is only looked up, never dereferenced.
#[no_mangle]
pub unsafe extern "C" fn portalloc_free(
    allocator: *mut PortallocAllocator,
    handle: u64,
) -> PortallocStatus {
    const CALL: &str = "portalloc_free";
    with_instance(CALL, allocator, |instance| {
        let live = instance
            .table()
            .take(handle, false)
            .map_err(|r| prefixed(CALL, r.into()))?;
        settle_deferred(&instance, false);
        give_back(&instance, live)
    })
}

/// Frees the buffer that starts at `ptr`. A pointer that is not the start of a live buffer of
/// this allocator (foreign, or already freed) is refused with
/// `PORTALLOC_STATUS_UNKNOWN_POINTER`; the memory is never touched.
///
/// # Safety
/// None beyond the ABI: neither pointer is dereferenced.
#[no_mangle]
pub unsafe extern "C" fn portalloc_free_ptr(
    allocator: *mut PortallocAllocator,
    ptr: *mut c_void,
) -> PortallocStatus {
    const CALL: &str = "portalloc_free_ptr";
    with_instance(CALL, allocator, |instance| {
        free_ptr(CALL, &instance, ptr as usize as u64)
    })
}

/// Declares that work on `stream` (another stream than the buffer's own: a side stream, an
/// NCCL stream) uses the live buffer that starts at `ptr`: its free then waits for the work
/// queued on `stream` before the free — events recorded there at the free must complete
/// before the memory goes back to the allocator — as PyTorch's `Tensor.record_stream` does
/// with its own allocator (which its pluggable-allocator interface does not pass on).
/// Recording the buffer's own stream, or one stream twice, does nothing more. The per-thread
/// default stream (2) is the calling thread's: freed on another thread, the buffer waits for
/// the whole device instead (no event there can follow that thread's work). A null `ptr`
/// (a zero-byte buffer, an empty tensor) holds no memory: nothing to record, `OK`.
///
/// # Safety
/// `stream` is a live stream of the allocator's device (0 for the default stream), as for
/// [`portalloc_allocate`]; neither pointer is dereferenced.
#[no_mangle]
pub unsafe extern "C" fn portalloc_record_stream(
    allocator: *mut PortallocAllocator,
    ptr: *mut c_void,
    stream: u64,
) -> PortallocStatus {
    const CALL: &str = "portalloc_record_stream";
    with_instance(CALL, allocator, |instance| {
        if ptr.is_null() {
            return Ok(());
        }
        instance
            .table()
            .record_use(ptr as usize as u64, StreamUse::here(Stream(stream)))
            .map_err(|r| prefixed(CALL, r.into()))
    })
}

pub(crate) fn free_ptr(call: &str, instance: &Instance, ptr: u64) -> Result<(), Failure> {
    if ptr == 0 {
        return Err(Failure::null(call, "ptr"));
    }
    let live = {
        let mut table = instance.table();
        let handle = table.handle_of(ptr).map_err(|r| prefixed(call, r.into()))?;
        table
            .take(handle, false)
            .map_err(|r| prefixed(call, r.into()))?
    };
    settle_deferred(instance, false);
    give_back(instance, live)
}

fn prefixed(call: &str, f: Failure) -> Failure {
    Failure::new(f.status, format!("{call}: {}", f.message))
}

/// Writes the device pointer (null for a zero-byte buffer) and size of the live buffer
/// `handle` names; either output may be null.
///
/// # Safety
/// `out_ptr` null or valid for one pointer; `out_size` null or valid for one `uint64_t`.
#[no_mangle]
pub unsafe extern "C" fn portalloc_handle_info(
    allocator: *mut PortallocAllocator,
    handle: u64,
    out_ptr: *mut *mut c_void,
    out_size: *mut u64,
) -> PortallocStatus {
    const CALL: &str = "portalloc_handle_info";
    with_instance(CALL, allocator, |instance| {
        let (ptr, size) = {
            let table = instance.table();
            let a = table.get(handle).map_err(|r| prefixed(CALL, r.into()))?;
            (a.ptr(), a.size())
        };
        // SAFETY: the caller's promises on the output pointers.
        unsafe {
            write_opt(out_ptr, ptr as usize as *mut c_void);
            write_opt(out_size, size);
        }
        Ok(())
    })
}

/// Donates the buffer `handle` names to a consumer that reuses its memory, under `to_tag`
/// (null: `"donated"`; at most 1024 bytes): writes the consumer's new handle to
/// `*out_handle`. The old handle is dead: using it is refused with "buffer has been deleted
/// or donated". The memory is not touched and stays allocated.
///
/// # Safety
/// `to_tag` null or NUL-terminated; `out_handle` null or valid for one `uint64_t`.
#[no_mangle]
pub unsafe extern "C" fn portalloc_donate(
    allocator: *mut PortallocAllocator,
    handle: u64,
    to_tag: *const c_char,
    out_handle: *mut u64,
) -> PortallocStatus {
    const CALL: &str = "portalloc_donate";
    with_instance(CALL, allocator, |instance| {
        require_non_null(CALL, "out_handle", out_handle)?;
        // SAFETY: the caller's promise on `to_tag`.
        let tag = unsafe { read_optional_tag(CALL, "to_tag", to_tag) }?;
        let new_handle = {
            let mut table = instance.table();
            let Live { allocation, uses } = table
                .take(handle, true)
                .map_err(|r| prefixed(CALL, r.into()))?;
            let donated = instance
                .ledger
                .donate(allocation, tag.as_deref().unwrap_or("donated"))?;
            let ptr = donated.ptr();
            let new_handle = table.insert(donated).map_err(|(refusal, a)| {
                let _ = instance.ledger.deallocate(a);
                Failure::from(refusal)
            })?;
            // The consumer's buffer is the same memory: the streams it was used on too.
            for used in uses {
                let _ = table.record_use(ptr, used);
            }
            new_handle
        };
        // SAFETY: the caller's promise on `out_handle`, checked non-null above.
        unsafe { write_out(CALL, "out_handle", out_handle, new_handle) }
    })
}

/// Writes the allocator's counters to `*out`.
///
/// # Safety
/// `out` null or valid for writing one `PortallocStats`.
#[no_mangle]
pub unsafe extern "C" fn portalloc_stats(
    allocator: *mut PortallocAllocator,
    out: *mut PortallocStats,
) -> PortallocStatus {
    const CALL: &str = "portalloc_stats";
    with_instance(CALL, allocator, |instance| {
        let s = instance.ledger.stats();
        let stats = PortallocStats {
            num_allocs: s.num_allocs,
            bytes_in_use: s.bytes_in_use,
            peak_bytes_in_use: s.peak_bytes_in_use,
            largest_alloc_size: s.largest_alloc_size,
            bytes_limit: s.bytes_limit.unwrap_or(0),
            bytes_reserved: s.bytes_reserved,
            peak_bytes_reserved: s.peak_bytes_reserved,
            largest_free_block_bytes: s.largest_free_block_bytes,
            pool_bytes: s.pool_bytes,
            peak_pool_bytes: s.peak_pool_bytes,
            fragmentation: s.fragmentation,
            live_allocations: instance.table().live_count() as u64,
        };
        // SAFETY: the caller's promise on `out`.
        unsafe { write_out(CALL, "out", out, stats) }
    })
}

/// Writes the ledger snapshot as JSON (the format `portalloc ledger FILE` prints) into
/// `buf`, NUL-terminated, and its length (without the NUL) to `*out_len`. When `capacity` is
/// too small (0 with a null `buf` asks for the length), nothing is written to `buf`,
/// `*out_len` is the length needed and the status is `PORTALLOC_STATUS_BUFFER_TOO_SMALL`.
///
/// # Safety
/// `buf` null or valid for writing `capacity` bytes; `out_len` null or valid for one `size_t`.
#[no_mangle]
pub unsafe extern "C" fn portalloc_ledger_json(
    allocator: *mut PortallocAllocator,
    buf: *mut c_char,
    capacity: usize,
    out_len: *mut usize,
) -> PortallocStatus {
    const CALL: &str = "portalloc_ledger_json";
    with_instance(CALL, allocator, |instance| {
        require_non_null(CALL, "out_len", out_len)?;
        let json = instance.ledger.to_json();
        let len = json.len();
        // SAFETY: the caller's promise on `out_len`, checked non-null above.
        unsafe { write_out(CALL, "out_len", out_len, len) }?;
        if buf.is_null() || capacity <= len {
            return Err(Failure::new(
                PortallocStatus::BufferTooSmall,
                format!(
                    "{CALL}: the ledger JSON needs {} bytes with its NUL, the buffer has {capacity}{}",
                    len + 1,
                    if buf.is_null() { " (buf is null)" } else { "" }
                ),
            ));
        }
        // SAFETY: `buf` is non-null and the caller promises `capacity` writable bytes;
        // `len + 1 <= capacity`, and a fresh `String` cannot overlap the caller's buffer.
        unsafe {
            std::ptr::copy_nonoverlapping(json.as_ptr(), buf.cast::<u8>(), len);
            buf.add(len).write(0);
        }
        Ok(())
    })
}

/// Writes the ledger snapshot as JSON to the file at `path` (for `portalloc ledger FILE`).
///
/// # Safety
/// `path` null or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn portalloc_ledger_write(
    allocator: *mut PortallocAllocator,
    path: *const c_char,
) -> PortallocStatus {
    const CALL: &str = "portalloc_ledger_write";
    with_instance(CALL, allocator, |instance| {
        // SAFETY: the caller's promise on `path`.
        let path =
            unsafe { read_str(CALL, "path", path) }?.ok_or_else(|| Failure::null(CALL, "path"))?;
        instance
            .ledger
            .write_json(&path)
            .map_err(|e| Failure::new(PortallocStatus::Internal, format!("{CALL}: {path}: {e}")))
    })
}

thread_local! {
    /// The calling thread's tag ([`portalloc_set_thread_tag`]).
    static THREAD_TAG: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

/// The process's tag ([`portalloc_set_process_tag`]).
static PROCESS_TAG: RwLock<Option<Arc<str>>> = RwLock::new(None);

/// The calling thread's tag, if one is set.
pub(crate) fn thread_tag() -> Option<String> {
    THREAD_TAG.try_with(|t| t.borrow().clone()).ok().flatten()
}

/// The process's tag, if one is set.
pub(crate) fn process_tag() -> Option<Arc<str>> {
    // Replaced whole under the lock: consistent whatever panicked.
    PROCESS_TAG
        .read()
        .unwrap_or_else(PoisonError::into_inner)
        .clone()
}

/// The tag of the region the calling thread allocates in: its thread tag, else the process
/// tag. What an allocation without a tag of its own is labelled (before the default).
pub(crate) fn region_tag() -> Option<String> {
    thread_tag().or_else(|| process_tag().map(|t| t.to_string()))
}

/// The most bytes a tag may have (a name, as `weights` or `kv_cache`).
const MAX_TAG_BYTES: usize = 1024;

/// Reads a tag argument (`argument` names it) that may be null, at most [`MAX_TAG_BYTES`]:
/// one rule for every call that takes a tag, the allocate and donate calls included, so that
/// a tag a buffer was given can always be named to sleep and wake.
///
/// # Safety
/// `tag` null or NUL-terminated.
unsafe fn read_optional_tag(
    call: &str,
    argument: &str,
    tag: *const c_char,
) -> Result<Option<String>, Failure> {
    // SAFETY: the caller's promise on `tag`.
    let tag = unsafe { read_str(call, argument, tag) }?;
    if let Some(tag) = &tag {
        if tag.len() > MAX_TAG_BYTES {
            return Err(Failure::new(
                PortallocStatus::InvalidArgument,
                format!(
                    "{call}: `{argument}` has {} bytes; accepted are tags of at most \
                     {MAX_TAG_BYTES}",
                    tag.len()
                ),
            ));
        }
    }
    Ok(tag)
}

/// Reads a required tag that can sleep: not null, at most [`MAX_TAG_BYTES`], and not empty
/// (`accepted` says what the call takes instead) — the rule of every call that names a tag
/// to sleep, wake or declare: untagged buffers never sleep, so an empty tag names nothing
/// that could.
///
/// # Safety
/// `tag` null or NUL-terminated.
pub(crate) unsafe fn read_sleep_tag(
    call: &str,
    tag: *const c_char,
    accepted: &str,
) -> Result<String, Failure> {
    // SAFETY: the caller's promise on `tag`.
    let tag = unsafe { read_optional_tag(call, "tag", tag) }?
        .ok_or_else(|| Failure::null(call, "tag"))?;
    if tag.is_empty() {
        return Err(Failure::new(
            PortallocStatus::InvalidArgument,
            format!(
                "{call}: `tag` is empty; accepted are {accepted} (untagged buffers never sleep)"
            ),
        ));
    }
    Ok(tag)
}

/// Reads the tag of a region: null (none) or a non-empty tag of at most [`MAX_TAG_BYTES`],
/// which is declared as one that can sleep.
///
/// # Safety
/// `tag` null or NUL-terminated.
unsafe fn read_region_tag(call: &str, tag: *const c_char) -> Result<Option<String>, Failure> {
    if tag.is_null() {
        return Ok(None);
    }
    // SAFETY: the caller's promise on `tag`, non-null here.
    let tag = unsafe { read_sleep_tag(call, tag, "a non-empty tag, or null to clear it") }?;
    crate::sleep_tags::declare_sleepable(&tag);
    Ok(Some(tag))
}

/// Declares `tag` as one whose buffers can sleep on their own: from now on, a `vmm`
/// allocator keeps the buffers allocated under `tag` on memory no other tag shares, so that
/// `portalloc_sleep(allocator, tag, …)` hands all of it back. A tag passed to
/// `portalloc_allocate` is otherwise only a name in the ledger (a tag per call site costs
/// nothing); `portalloc_set_thread_tag` and `portalloc_set_process_tag` declare their tag
/// themselves. Declaring is process-wide, for every allocator, and lasts for the process;
/// declaring a tag again does nothing. A null `tag` is refused
/// (`PORTALLOC_STATUS_NULL_ARGUMENT`), an empty one or one longer than 1024 bytes too
/// (`PORTALLOC_STATUS_INVALID_ARGUMENT`).
///
/// # Safety
/// `tag` null or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn portalloc_declare_sleep_tag(tag: *const c_char) -> PortallocStatus {
    const CALL: &str = "portalloc_declare_sleep_tag";
    guard(CALL, || {
        // SAFETY: the caller's promise on `tag`.
        let tag = unsafe { read_sleep_tag(CALL, tag, "a non-empty tag") }?;
        crate::sleep_tags::declare_sleepable(&tag);
        Ok(())
    })
}

/// Sets the tag of the buffers the calling thread allocates without one (a null `tag` to
/// `portalloc_allocate`, and every buffer of the PyTorch hooks, `torch` otherwise); null
/// clears it. The tag is declared as one that can sleep (see
/// [`portalloc_declare_sleep_tag`]). What `portalloc.tag(name)` sets in Python, so that
/// tensors allocated inside it can be put to sleep by tag. It wins over the process tag
/// ([`portalloc_set_process_tag`]). An empty tag or one longer than 1024 bytes is refused
/// (`PORTALLOC_STATUS_INVALID_ARGUMENT`) and the thread's tag is left as it was.
///
/// # Safety
/// `tag` null or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn portalloc_set_thread_tag(tag: *const c_char) -> PortallocStatus {
    const CALL: &str = "portalloc_set_thread_tag";
    guard(CALL, || {
        // SAFETY: the caller's promise on `tag`.
        let tag = unsafe { read_region_tag(CALL, tag) }?;
        THREAD_TAG.try_with(|t| *t.borrow_mut() = tag).map_err(|_| {
            Failure::new(
                PortallocStatus::Internal,
                format!("{CALL}: the thread is ending"),
            )
        })
    })
}

/// Sets the tag of the buffers that every thread of the process allocates without a tag of
/// its own and without a thread tag; null clears it. An allocation is labelled with, in this
/// order: the tag passed to `portalloc_allocate`, the calling thread's tag
/// ([`portalloc_set_thread_tag`]), this process tag, `buffer` (`torch` for the PyTorch
/// hooks). For the threads a framework starts itself — PyTorch's autograd threads make
/// tensors during `backward()` — on which no thread tag is set: what Python's
/// `portalloc.region(name)` sets. The tag is declared as one that can sleep (see
/// [`portalloc_declare_sleep_tag`]). An empty tag or one longer than 1024 bytes is refused
/// (`PORTALLOC_STATUS_INVALID_ARGUMENT`) and the process tag is left as it was.
///
/// # Safety
/// `tag` null or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn portalloc_set_process_tag(tag: *const c_char) -> PortallocStatus {
    const CALL: &str = "portalloc_set_process_tag";
    guard(CALL, || {
        // SAFETY: the caller's promise on `tag`.
        let tag = unsafe { read_region_tag(CALL, tag) }?;
        *PROCESS_TAG.write().unwrap_or_else(PoisonError::into_inner) = tag.map(Arc::from);
        Ok(())
    })
}

/// Hands back the device memory of the live buffers tagged `tag`, keeping their addresses;
/// with `keep_contents` their bytes are copied to host memory first (pinned where the driver
/// offers it), otherwise discarded. `portalloc_wake` maps memory at the same addresses again.
/// A tag with no awake buffer: nothing to do. An empty tag (untagged buffers never sleep) or
/// one longer than 1024 bytes is refused (`PORTALLOC_STATUS_INVALID_ARGUMENT`), as
/// `portalloc_set_thread_tag` refuses them. Strategies other than `vmm` refuse it with
/// `PORTALLOC_STATUS_UNSUPPORTED`.
///
/// # Safety
/// `tag` null or NUL-terminated (null is refused).
#[no_mangle]
pub unsafe extern "C" fn portalloc_sleep(
    allocator: *mut PortallocAllocator,
    tag: *const c_char,
    keep_contents: bool,
) -> PortallocStatus {
    const CALL: &str = "portalloc_sleep";
    with_instance(CALL, allocator, |instance| {
        // SAFETY: the caller's promise on `tag`.
        let tag = unsafe { read_sleep_tag(CALL, tag, "a non-empty tag") }?;
        let keep = if keep_contents {
            crate::allocator::Keep::Contents
        } else {
            crate::allocator::Keep::Nothing
        };
        // Frees deferred by recorded streams whose work is done go back first: a sleep waits
        // for the whole device anyway, and a buffer being freed must not hold its granules
        // (and, where the driver holds released memory, its segment) through the sleep.
        settle_deferred(&instance, true);
        instance.ledger.sleep(&tag, keep)?;
        Ok(())
    })
}

/// Maps device memory again under the sleeping buffers tagged `tag`, at their addresses,
/// and copies their contents back. When the memory cannot be had the status is
/// `PORTALLOC_STATUS_OUT_OF_MEMORY` and nothing is lost: the tag stays asleep, and a later
/// wake can succeed. A tag with none asleep: nothing to do. The tag is refused as
/// `portalloc_sleep` refuses it.
///
/// # Safety
/// `tag` null or NUL-terminated (null is refused).
#[no_mangle]
pub unsafe extern "C" fn portalloc_wake(
    allocator: *mut PortallocAllocator,
    tag: *const c_char,
) -> PortallocStatus {
    const CALL: &str = "portalloc_wake";
    with_instance(CALL, allocator, |instance| {
        // SAFETY: the caller's promise on `tag`.
        let tag = unsafe { read_sleep_tag(CALL, tag, "a non-empty tag") }?;
        instance.ledger.wake(&tag)?;
        Ok(())
    })
}

/// Writes the bytes of the sleeping buffers to `*out_bytes_asleep` and the bytes of their
/// contents held on the host to `*out_host_bytes` (each if not null).
///
/// # Safety
/// Each output null or valid for one `uint64_t`.
#[no_mangle]
pub unsafe extern "C" fn portalloc_sleep_stats(
    allocator: *mut PortallocAllocator,
    out_bytes_asleep: *mut u64,
    out_host_bytes: *mut u64,
) -> PortallocStatus {
    const CALL: &str = "portalloc_sleep_stats";
    with_instance(CALL, allocator, |instance| {
        let s = instance.ledger.stats();
        // SAFETY: the caller's promises on the outputs.
        unsafe {
            write_opt(out_bytes_asleep, s.bytes_asleep);
            write_opt(out_host_bytes, s.host_bytes_asleep);
        }
        Ok(())
    })
}

/// Returns memory the allocator holds but does not use to the device; writes the bytes
/// released to `*out_released` if it is not null. Frees deferred by
/// `portalloc_record_stream` are completed first (waiting for the streams recorded).
///
/// # Safety
/// `out_released` null or valid for one `uint64_t`.
#[no_mangle]
pub unsafe extern "C" fn portalloc_trim(
    allocator: *mut PortallocAllocator,
    out_released: *mut u64,
) -> PortallocStatus {
    const CALL: &str = "portalloc_trim";
    with_instance(CALL, allocator, |instance| {
        // Deferred frees first, waited for (a trim waits for the work on freed memory too),
        // so that free + trim gives back everything not in use.
        settle_deferred(&instance, true);
        let released = instance.ledger.trim()?;
        // SAFETY: the caller's promise on `out_released`.
        unsafe { write_opt(out_released, released) };
        Ok(())
    })
}
