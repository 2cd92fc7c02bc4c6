//! [`DeviceWrapper`]: one forwarding [`Device`] for every adaptor that changes a few calls of
//! the device beneath it and passes the rest down (see the trait).
#![deny(unsafe_code)]

use std::fmt;
use std::ptr::NonNull;

use crate::device::{
    peer_access_unsupported, CaptureMode, CaptureStatus, Device, DeviceInfo, Event, MemInfo,
    PhysicalHandle, PoolUsage, Stream, StreamOrderedPool, VirtualMemory,
};
use crate::error::{Error, Result};

/// A fallible call of a [`Device`], [`VirtualMemory`] or [`StreamOrderedPool`], with its
/// arguments, as [`DeviceWrapper::before`] and [`DeviceWrapper::after`] see it.
///
/// The infallible queries (`info`, `peer_access`, `granularity`, `holds_released_memory`)
/// pass down unseen.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Call<'a> {
    /// [`Device::mem_info`].
    MemInfo,
    /// [`Device::alloc`].
    Alloc {
        /// Bytes asked for.
        size: u64,
    },
    /// [`Device::free`].
    Free {
        /// The allocation.
        ptr: u64,
        /// Its size.
        size: u64,
    },
    /// [`Device::create_stream`].
    CreateStream,
    /// [`Device::destroy_stream`].
    DestroyStream(Stream),
    /// [`Device::synchronize_stream`].
    SynchronizeStream(Stream),
    /// [`Device::synchronize_device`].
    SynchronizeDevice,
    /// [`Device::create_event`].
    CreateEvent,
    /// [`Device::record_event`].
    RecordEvent {
        /// The event.
        event: Event,
        /// The stream it is recorded on.
        stream: Stream,
    },
    /// [`Device::event_complete`].
    EventComplete(Event),
    /// [`Device::synchronize_event`].
    SynchronizeEvent(Event),
    /// [`Device::destroy_event`].
    DestroyEvent(Event),
    /// [`Device::wait_event`].
    WaitEvent {
        /// The stream that waits.
        stream: Stream,
        /// The event it waits for.
        event: Event,
    },
    /// [`Device::can_access_peer`], with the peer's facts.
    CanAccessPeer(&'a DeviceInfo),
    /// [`Device::enable_peer_access`], with the peer's facts.
    EnablePeerAccess(&'a DeviceInfo),
    /// [`VirtualMemory::reserve`], or [`VirtualMemory::reserve_at`] (which is `reserve` when
    /// `addr` is 0): both named `reserve`, so that a fault injected into reservations reaches
    /// both.
    Reserve {
        /// Bytes of address space.
        size: u64,
        /// Their alignment (0: the granularity).
        alignment: u64,
        /// The address asked for (`reserve_at`'s hint); 0: anywhere (`reserve`).
        addr: u64,
    },
    /// [`VirtualMemory::free_reservation`].
    FreeReservation {
        /// The reservation.
        va: u64,
        /// Its size.
        size: u64,
    },
    /// [`VirtualMemory::create_physical`].
    CreatePhysical {
        /// Bytes of physical memory.
        size: u64,
    },
    /// [`VirtualMemory::release_physical`].
    ReleasePhysical(PhysicalHandle),
    /// [`VirtualMemory::map`].
    Map {
        /// Where.
        va: u64,
        /// How many bytes.
        size: u64,
        /// Of which physical memory.
        handle: PhysicalHandle,
        /// From how far into it.
        offset: u64,
    },
    /// [`VirtualMemory::set_access`], or [`VirtualMemory::set_access_with_peers`] (which is
    /// `set_access` when `peers` is empty).
    SetAccess {
        /// Where.
        va: u64,
        /// How many bytes.
        size: u64,
        /// The peer devices granted access too.
        peers: &'a [u32],
    },
    /// [`VirtualMemory::unmap`].
    Unmap {
        /// Where.
        va: u64,
        /// How many bytes.
        size: u64,
    },
    /// [`StreamOrderedPool::alloc_async`].
    AllocAsync {
        /// Bytes asked for.
        size: u64,
        /// For work on which stream.
        stream: Stream,
    },
    /// [`StreamOrderedPool::free_async`].
    FreeAsync {
        /// The allocation.
        ptr: u64,
        /// Freed in order on which stream.
        stream: Stream,
    },
    /// [`StreamOrderedPool::set_release_threshold`].
    SetReleaseThreshold(u64),
    /// [`StreamOrderedPool::release_threshold`].
    ReleaseThreshold,
    /// [`StreamOrderedPool::trim_to`].
    TrimTo(u64),
    /// [`StreamOrderedPool::usage`].
    Usage,
    /// [`Device::copy_to_host`].
    CopyToHost {
        /// The host memory written, as an address.
        dst: usize,
        /// The device memory read.
        src: u64,
        /// How many bytes.
        size: u64,
        /// Queued on which stream.
        stream: Stream,
    },
    /// [`Device::copy_from_host`].
    CopyFromHost {
        /// The device memory written.
        dst: u64,
        /// The host memory read, as an address.
        src: usize,
        /// How many bytes.
        size: u64,
        /// Queued on which stream.
        stream: Stream,
    },
    /// [`Device::alloc_pinned_host`].
    AllocPinnedHost {
        /// Bytes asked for.
        size: u64,
    },
    /// [`Device::free_pinned_host`].
    FreePinnedHost {
        /// The memory, as an address.
        ptr: usize,
        /// Its size.
        size: u64,
    },
    /// [`Device::register_host`].
    RegisterHost {
        /// The memory, as an address.
        ptr: usize,
        /// Its size.
        size: u64,
    },
    /// [`Device::unregister_host`].
    UnregisterHost {
        /// The memory, as an address.
        ptr: usize,
        /// Its size.
        size: u64,
    },
    /// [`Device::capture_status`].
    CaptureStatus(Stream),
    /// [`Device::exchange_capture_mode`].
    ExchangeCaptureMode(CaptureMode),
}

impl Call<'_> {
    /// Every name [`Call::name`] gives, in the order of [`Call::ordinal`]: the names replay's
    /// `--json` counts calls by (`device_calls_by_name`) and a cost table prices.
    pub const NAMES: [&'static str; 37] = [
        "mem_info",
        "alloc",
        "free",
        "create_stream",
        "destroy_stream",
        "synchronize_stream",
        "synchronize_device",
        "create_event",
        "record_event",
        "wait_event",
        "event_complete",
        "synchronize_event",
        "destroy_event",
        "can_access_peer",
        "enable_peer_access",
        "reserve",
        "free_reservation",
        "create_physical",
        "release_physical",
        "map",
        "set_access",
        "set_access_with_peers",
        "unmap",
        "alloc_async",
        "free_async",
        "set_release_threshold",
        "release_threshold",
        "trim_to",
        "usage",
        "copy_to_host",
        "copy_from_host",
        "alloc_pinned_host",
        "free_pinned_host",
        "register_host",
        "unregister_host",
        "capture_status",
        "exchange_capture_mode",
    ];

    /// The method's name (`alloc`, `record_event`, `set_access_with_peers`, …), as errors
    /// name calls.
    pub fn name(&self) -> &'static str {
        Self::NAMES[self.ordinal()]
    }

    /// The index of this call's name in [`Call::NAMES`].
    pub fn ordinal(&self) -> usize {
        match self {
            Call::MemInfo => 0,
            Call::Alloc { .. } => 1,
            Call::Free { .. } => 2,
            Call::CreateStream => 3,
            Call::DestroyStream(_) => 4,
            Call::SynchronizeStream(_) => 5,
            Call::SynchronizeDevice => 6,
            Call::CreateEvent => 7,
            Call::RecordEvent { .. } => 8,
            Call::WaitEvent { .. } => 9,
            Call::EventComplete(_) => 10,
            Call::SynchronizeEvent(_) => 11,
            Call::DestroyEvent(_) => 12,
            Call::CanAccessPeer(_) => 13,
            Call::EnablePeerAccess(_) => 14,
            Call::Reserve { .. } => 15,
            Call::FreeReservation { .. } => 16,
            Call::CreatePhysical { .. } => 17,
            Call::ReleasePhysical(_) => 18,
            Call::Map { .. } => 19,
            Call::SetAccess { peers: [], .. } => 20,
            Call::SetAccess { .. } => 21,
            Call::Unmap { .. } => 22,
            Call::AllocAsync { .. } => 23,
            Call::FreeAsync { .. } => 24,
            Call::SetReleaseThreshold(_) => 25,
            Call::ReleaseThreshold => 26,
            Call::TrimTo(_) => 27,
            Call::Usage => 28,
            Call::CopyToHost { .. } => 29,
            Call::CopyFromHost { .. } => 30,
            Call::AllocPinnedHost { .. } => 31,
            Call::FreePinnedHost { .. } => 32,
            Call::RegisterHost { .. } => 33,
            Call::UnregisterHost { .. } => 34,
            Call::CaptureStatus(_) => 35,
            Call::ExchangeCaptureMode(_) => 36,
        }
    }

    /// The bytes the call acts on where its cost may grow with them (what it allocates,
    /// frees, reserves, maps, opens to access, unmaps or copies); 0 for a call without a size.
    pub fn bytes(&self) -> u64 {
        match *self {
            Call::Alloc { size }
            | Call::Free { size, .. }
            | Call::Reserve { size, .. }
            | Call::FreeReservation { size, .. }
            | Call::CreatePhysical { size }
            | Call::Map { size, .. }
            | Call::SetAccess { size, .. }
            | Call::Unmap { size, .. }
            | Call::AllocAsync { size, .. }
            | Call::CopyToHost { size, .. }
            | Call::CopyFromHost { size, .. }
            | Call::AllocPinnedHost { size }
            | Call::FreePinnedHost { size, .. }
            | Call::RegisterHost { size, .. }
            | Call::UnregisterHost { size, .. } => size,
            _ => 0,
        }
    }
}

display_as_name!(Call<'_>);

/// An optional part of a device that a [`DeviceWrapper`] may hide.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Capability {
    /// [`Device::virtual_memory`].
    VirtualMemory,
    /// [`Device::stream_ordered_pool`].
    StreamOrderedPool,
    /// [`Device::can_access_peer`], [`Device::enable_peer_access`] and
    /// [`Device::peer_access`]; hidden, they answer as the trait's defaults do (no peers).
    PeerAccess,
}

/// A device that passes every call to the device beneath ([`DeviceWrapper::wrapped`]) except
/// where its hooks say otherwise.
///
/// Like RMM's `device_memory_resource` adaptors, a wrapper owns (or borrows) an upstream and
/// adds one concern. Writing `impl Device` by hand for that means forwarding some thirty
/// methods of three traits, and every wrapper written so repeats them. A type that
/// implements `DeviceWrapper` instead writes only what differs:
///
/// * [`DeviceWrapper::wrapped`]: the device beneath (required);
/// * [`DeviceWrapper::before`]: sees every fallible call, by name and with its arguments
///   ([`Call`]), before it goes down, and may fail it (fault injection, refusals, logs,
///   counters);
/// * [`DeviceWrapper::after`]: sees the error of every call that went down;
/// * [`DeviceWrapper::offers`]: hides a capability ([`Capability`]) of the device beneath;
/// * [`DeviceWrapper::device_info`]: shows other facts than the device beneath.
///
/// Every such type is a [`Device`], a [`VirtualMemory`] and a [`StreamOrderedPool`] (so it
/// cannot implement those itself). Its [`Device::virtual_memory`] and
/// [`Device::stream_ordered_pool`] hand out the wrapper itself when the device beneath has
/// the capability (and the wrapper offers it), so that the capability's calls come through
/// the hooks too. [`crate::adaptor::CountingDevice`] is one.
///
/// ```
/// use std::sync::Mutex;
/// use portalloc::adaptor::{Call, Capability, DeviceWrapper};
/// use portalloc::backends::host::HostDevice;
/// use portalloc::{Device, Error, Stream};
///
/// /// The host device without virtual memory, refusing to synchronise streams and logging
/// /// every call.
/// #[derive(Debug)]
/// struct Picky {
///     host: HostDevice,
///     log: Mutex<Vec<&'static str>>,
/// }
///
/// impl DeviceWrapper for Picky {
///     type Inner = HostDevice;
///     fn wrapped(&self) -> &HostDevice {
///         &self.host
///     }
///     fn before(&self, call: &Call<'_>) -> portalloc::Result<()> {
///         self.log.lock().unwrap().push(call.name());
///         match call {
///             Call::SynchronizeStream(_) => Err(Error::InvalidArgument {
///                 call: call.name(),
///                 reason: "refused".into(),
///             }),
///             _ => Ok(()),
///         }
///     }
///     fn offers(&self, capability: Capability) -> bool {
///         capability != Capability::VirtualMemory
///     }
/// }
///
/// let picky = Picky {
///     host: HostDevice::builder().capacity(1 << 20).build().unwrap(),
///     log: Mutex::new(Vec::new()),
/// };
/// let p = picky.alloc(4096).unwrap();
/// picky.free(p, 4096).unwrap();
/// assert!(picky.synchronize_stream(Stream::DEFAULT).is_err());
/// assert!(picky.virtual_memory().is_none());
/// assert!(picky.stream_ordered_pool().is_some());
/// assert_eq!(*picky.log.lock().unwrap(), ["alloc", "free", "synchronize_stream"]);
/// ```
pub trait DeviceWrapper: Send + Sync + fmt::Debug {
    /// The type of the device beneath.
    type Inner: Device + ?Sized;

    /// The device beneath, which every call goes down to.
    fn wrapped(&self) -> &Self::Inner;

    /// Sees `call` before it goes down; an error fails the call with it, and the call does
    /// not go down. Default: lets every call through.
    ///
    /// # Errors
    /// Whatever the wrapper chooses to fail the call with.
    fn before(&self, call: &Call<'_>) -> Result<()> {
        let _ = call;
        Ok(())
    }

    /// Sees how a call that went down ended: `Some(error)` when it failed. Default: nothing.
    fn after(&self, call: &Call<'_>, error: Option<&Error>) {
        let _ = (call, error);
    }

    /// Whether the wrapper shows `capability` of the device beneath (a device beneath
    /// without it never shows it). Default: every one.
    fn offers(&self, capability: Capability) -> bool {
        let _ = capability;
        true
    }

    /// The facts [`Device::info`] reports. Default: those of the device beneath.
    fn device_info(&self) -> &DeviceInfo {
        self.wrapped().info()
    }
}

/// Runs `call` through `wrapper`'s hooks around `down`, the call to the device beneath.
#[inline]
fn through<W: DeviceWrapper + ?Sized, T>(
    wrapper: &W,
    call: Call<'_>,
    down: impl FnOnce() -> Result<T>,
) -> Result<T> {
    wrapper.before(&call)?;
    let result = down();
    wrapper.after(&call, result.as_ref().err());
    result
}

/// The device beneath `wrapper` (never missing: a `Result` only so that `forward!` treats
/// it as it treats the optional capabilities).
fn device_beneath<W: DeviceWrapper + ?Sized>(wrapper: &W) -> Result<&W::Inner> {
    Ok(wrapper.wrapped())
}

/// The virtual memory of the device beneath `wrapper`.
fn vm_beneath<W: DeviceWrapper + ?Sized>(wrapper: &W) -> Result<&dyn VirtualMemory> {
    let inner = wrapper.wrapped();
    inner
        .virtual_memory()
        .ok_or_else(|| missing_beneath(inner, "virtual memory"))
}

/// The stream-ordered pool of the device beneath `wrapper`.
fn pool_beneath<W: DeviceWrapper + ?Sized>(wrapper: &W) -> Result<&dyn StreamOrderedPool> {
    let inner = wrapper.wrapped();
    inner
        .stream_ordered_pool()
        .ok_or_else(|| missing_beneath(inner, "stream-ordered pools"))
}

fn missing_beneath<D: Device + ?Sized>(inner: &D, what: &str) -> Error {
    Error::Unsupported {
        what: what.into(),
        backend: inner.info().vendor.name(),
        reason: format!("the device beneath has no {what}"),
    }
}

/// The methods that only pass down, one line each: `fn method(args) -> T = call;` is the
/// method of the trait being implemented that runs `call` through the hooks and then
/// `beneath(self)?.method(args)`.
macro_rules! forward {
    ($beneath:ident: $(fn $method:ident($($arg:ident: $ty:ty),*) -> $ret:ty = $call:expr;)*) => {
        $(
            fn $method(&self $(, $arg: $ty)*) -> Result<$ret> {
                through(self, $call, || $beneath(self)?.$method($($arg),*))
            }
        )*
    };
}

impl<W: DeviceWrapper> Device for W {
    forward! { device_beneath:
        fn mem_info() -> MemInfo = Call::MemInfo;
        fn alloc(size: u64) -> u64 = Call::Alloc { size };
        fn free(ptr: u64, size: u64) -> () = Call::Free { ptr, size };
        fn create_stream() -> Stream = Call::CreateStream;
        fn synchronize_stream(stream: Stream) -> () = Call::SynchronizeStream(stream);
        fn synchronize_device() -> () = Call::SynchronizeDevice;
        fn create_event() -> Event = Call::CreateEvent;
        fn record_event(event: Event, stream: Stream) -> () = Call::RecordEvent { event, stream };
        fn event_complete(event: Event) -> bool = Call::EventComplete(event);
        fn synchronize_event(event: Event) -> () = Call::SynchronizeEvent(event);
        fn destroy_event(event: Event) -> () = Call::DestroyEvent(event);
        fn wait_event(stream: Stream, event: Event) -> () = Call::WaitEvent { stream, event };
        fn capture_status(stream: Stream) -> CaptureStatus = Call::CaptureStatus(stream);
        fn exchange_capture_mode(mode: CaptureMode) -> CaptureMode = Call::ExchangeCaptureMode(mode);
    }

    #[allow(unsafe_code)]
    unsafe fn destroy_stream(&self, stream: Stream) -> Result<()> {
        through(self, Call::DestroyStream(stream), || {
            // SAFETY: the caller's promise, passed on unchanged.
            unsafe { device_beneath(self)?.destroy_stream(stream) }
        })
    }
    #[allow(unsafe_code)]
    unsafe fn copy_to_host(&self, dst: *mut u8, src: u64, size: u64, stream: Stream) -> Result<()> {
        let call = Call::CopyToHost {
            dst: dst as usize,
            src,
            size,
            stream,
        };
        through(self, call, || {
            // SAFETY: the caller's promise, passed on unchanged.
            unsafe { device_beneath(self)?.copy_to_host(dst, src, size, stream) }
        })
    }
    #[allow(unsafe_code)]
    unsafe fn copy_from_host(
        &self,
        dst: u64,
        src: *const u8,
        size: u64,
        stream: Stream,
    ) -> Result<()> {
        let call = Call::CopyFromHost {
            dst,
            src: src as usize,
            size,
            stream,
        };
        through(self, call, || {
            // SAFETY: the caller's promise, passed on unchanged.
            unsafe { device_beneath(self)?.copy_from_host(dst, src, size, stream) }
        })
    }
    fn alloc_pinned_host(&self, size: u64) -> Result<Option<NonNull<u8>>> {
        through(self, Call::AllocPinnedHost { size }, || {
            self.wrapped().alloc_pinned_host(size)
        })
    }
    #[allow(unsafe_code)]
    unsafe fn free_pinned_host(&self, ptr: NonNull<u8>, size: u64) -> Result<()> {
        let call = Call::FreePinnedHost {
            ptr: ptr.as_ptr() as usize,
            size,
        };
        through(self, call, || {
            // SAFETY: the caller's promise, passed on unchanged.
            unsafe { self.wrapped().free_pinned_host(ptr, size) }
        })
    }
    #[allow(unsafe_code)]
    unsafe fn register_host(&self, ptr: NonNull<u8>, size: u64) -> Result<bool> {
        let call = Call::RegisterHost {
            ptr: ptr.as_ptr() as usize,
            size,
        };
        through(self, call, || {
            // SAFETY: the caller's promise, passed on unchanged.
            unsafe { self.wrapped().register_host(ptr, size) }
        })
    }
    #[allow(unsafe_code)]
    unsafe fn unregister_host(&self, ptr: NonNull<u8>, size: u64) -> Result<()> {
        let call = Call::UnregisterHost {
            ptr: ptr.as_ptr() as usize,
            size,
        };
        through(self, call, || {
            // SAFETY: the caller's promise, passed on unchanged.
            unsafe { self.wrapped().unregister_host(ptr, size) }
        })
    }

    fn info(&self) -> &DeviceInfo {
        self.device_info()
    }
    fn virtual_memory(&self) -> Option<&dyn VirtualMemory> {
        let shown = self.offers(Capability::VirtualMemory);
        (shown && self.wrapped().virtual_memory().is_some()).then_some(self as _)
    }
    fn stream_ordered_pool(&self) -> Option<&dyn StreamOrderedPool> {
        let shown = self.offers(Capability::StreamOrderedPool);
        (shown && self.wrapped().stream_ordered_pool().is_some()).then_some(self as _)
    }
    // Export and import go to the device beneath unlogged: they are the share room's calls
    // (`crate::share`), never a strategy's, and the handles they take and give are its own.
    fn interprocess(&self) -> Option<&dyn crate::device::Interprocess> {
        self.wrapped().interprocess()
    }
    fn can_access_peer(&self, peer: &dyn Device) -> Result<bool> {
        if !self.offers(Capability::PeerAccess) {
            return Ok(false);
        }
        through(self, Call::CanAccessPeer(peer.info()), || {
            self.wrapped().can_access_peer(peer)
        })
    }
    fn enable_peer_access(&self, peer: &dyn Device) -> Result<()> {
        if !self.offers(Capability::PeerAccess) {
            return Err(peer_access_unsupported(self, peer));
        }
        through(self, Call::EnablePeerAccess(peer.info()), || {
            self.wrapped().enable_peer_access(peer)
        })
    }
    fn peer_access_refusal(&self, peer: &dyn Device) -> crate::Error {
        if !self.offers(Capability::PeerAccess) {
            return peer_access_unsupported(self, peer);
        }
        self.wrapped().peer_access_refusal(peer)
    }
    fn peer_access(&self) -> Vec<u32> {
        if !self.offers(Capability::PeerAccess) {
            return Vec::new();
        }
        self.wrapped().peer_access()
    }
}

impl<W: DeviceWrapper> VirtualMemory for W {
    forward! { vm_beneath:
        fn reserve(size: u64, alignment: u64) -> u64 = Call::Reserve { size, alignment, addr: 0 };
        fn reserve_at(size: u64, alignment: u64, addr: u64) -> u64 =
            Call::Reserve { size, alignment, addr };
        fn free_reservation(va: u64, size: u64) -> () = Call::FreeReservation { va, size };
        fn create_physical(size: u64) -> PhysicalHandle = Call::CreatePhysical { size };
        fn release_physical(handle: PhysicalHandle) -> () = Call::ReleasePhysical(handle);
        fn map(va: u64, size: u64, handle: PhysicalHandle, offset: u64) -> () =
            Call::Map { va, size, handle, offset };
        fn unmap(va: u64, size: u64) -> () = Call::Unmap { va, size };
    }

    fn granularity(&self) -> u64 {
        let inner = self.wrapped();
        inner
            .virtual_memory()
            .map_or(inner.info().min_granularity, |vm| vm.granularity())
    }
    fn holds_released_memory(&self) -> bool {
        self.wrapped()
            .virtual_memory()
            .is_some_and(|vm| vm.holds_released_memory())
    }
    fn map_visible_after(&self) -> std::time::Duration {
        self.wrapped()
            .virtual_memory()
            .map_or(std::time::Duration::ZERO, |vm| vm.map_visible_after())
    }
    fn handle_budget(&self) -> Option<u64> {
        self.wrapped()
            .virtual_memory()
            .and_then(|vm| vm.handle_budget())
    }
    fn set_access(&self, va: u64, size: u64) -> Result<()> {
        self.set_access_with_peers(va, size, &[])
    }
    fn set_access_with_peers(&self, va: u64, size: u64, peers: &[u32]) -> Result<()> {
        through(self, Call::SetAccess { va, size, peers }, || {
            let vm = vm_beneath(self)?;
            if peers.is_empty() {
                vm.set_access(va, size)
            } else {
                vm.set_access_with_peers(va, size, peers)
            }
        })
    }
}

impl<W: DeviceWrapper> StreamOrderedPool for W {
    forward! { pool_beneath:
        fn alloc_async(size: u64, stream: Stream) -> u64 = Call::AllocAsync { size, stream };
        fn free_async(ptr: u64, stream: Stream) -> () = Call::FreeAsync { ptr, stream };
        fn set_release_threshold(bytes: u64) -> () = Call::SetReleaseThreshold(bytes);
        fn release_threshold() -> u64 = Call::ReleaseThreshold;
        fn trim_to(keep: u64) -> () = Call::TrimTo(keep);
        fn usage() -> PoolUsage = Call::Usage;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::backends::host::HostDevice;

    /// Logs every call it sees and fails the ones named in `refuse`.
    #[derive(Debug)]
    struct Logging {
        host: Arc<HostDevice>,
        refuse: &'static [&'static str],
        hidden: &'static [Capability],
        seen: Mutex<Vec<String>>,
    }

    impl DeviceWrapper for Logging {
        type Inner = HostDevice;
        fn wrapped(&self) -> &HostDevice {
            &self.host
        }
        fn before(&self, call: &Call<'_>) -> Result<()> {
            self.seen.lock().unwrap().push(format!("before {call}"));
            if self.refuse.contains(&call.name()) {
                return Err(Error::InvalidArgument {
                    call: call.name(),
                    reason: "refused by the test".into(),
                });
            }
            Ok(())
        }
        fn after(&self, call: &Call<'_>, error: Option<&Error>) {
            let how = if error.is_some() { "failed" } else { "ok" };
            self.seen
                .lock()
                .unwrap()
                .push(format!("after {call}: {how}"));
        }
        fn offers(&self, capability: Capability) -> bool {
            !self.hidden.contains(&capability)
        }
    }

    fn logging(refuse: &'static [&'static str], hidden: &'static [Capability]) -> Logging {
        let host = HostDevice::builder()
            .capacity(64 << 20)
            .simulated(true)
            .build()
            .unwrap();
        Logging {
            host: Arc::new(host),
            refuse,
            hidden,
            seen: Mutex::new(Vec::new()),
        }
    }

    fn seen(w: &Logging) -> Vec<String> {
        std::mem::take(&mut *w.seen.lock().unwrap())
    }

    #[test]
    fn calls_go_down_through_both_hooks() {
        let w = logging(&[], &[]);
        let p = w.alloc(1 << 20).unwrap();
        assert_eq!(w.host.census().bytes_in_use, 1 << 20, "the call went down");
        assert!(w.alloc(1 << 40).is_err());
        w.free(p, 1 << 20).unwrap();
        assert_eq!(
            seen(&w),
            [
                "before alloc",
                "after alloc: ok",
                "before alloc",
                "after alloc: failed",
                "before free",
                "after free: ok"
            ]
        );
    }

    #[test]
    fn a_refused_call_does_not_go_down() {
        let w = logging(&["alloc", "set_access"], &[]);
        match w.alloc(4096) {
            Err(Error::InvalidArgument { call, .. }) => assert_eq!(call, "alloc"),
            other => panic!("expected the refusal, got {other:?}"),
        }
        assert_eq!(w.host.census().bytes_in_use, 0);
        assert_eq!(seen(&w), ["before alloc"]);
        // set_access_with_peers without peers is set_access, and refused as such.
        let vm = w.virtual_memory().unwrap();
        let g = vm.granularity();
        assert_eq!(g, w.host.info().min_granularity);
        let va = vm.reserve(g, 0).unwrap();
        assert!(vm.set_access_with_peers(va, g, &[]).is_err());
        vm.free_reservation(va, g).unwrap();
        assert_eq!(
            seen(&w)[2..],
            [
                "before set_access",
                "before free_reservation",
                "after free_reservation: ok"
            ]
        );
    }

    #[test]
    #[allow(unsafe_code)]
    fn copies_and_pinned_memory_go_through_the_hooks() {
        let w = logging(&["copy_from_host"], &[]);
        assert_eq!(
            w.alloc_pinned_host(4096).unwrap(),
            None,
            "the simulated host has none"
        );
        let p = w.alloc(4096).unwrap();
        let mut buf = [0u8; 16];
        // SAFETY: `buf` outlives the copy; `p` is a live allocation of 4096 bytes.
        unsafe { w.copy_to_host(buf.as_mut_ptr(), p, 16, Stream::DEFAULT) }.unwrap();
        // SAFETY: as above.
        let refused = unsafe { w.copy_from_host(p, buf.as_ptr(), 16, Stream::DEFAULT) };
        assert!(matches!(
            refused,
            Err(Error::InvalidArgument {
                call: "copy_from_host",
                ..
            })
        ));
        w.free(p, 4096).unwrap();
        assert_eq!(
            seen(&w),
            [
                "before alloc_pinned_host",
                "after alloc_pinned_host: ok",
                "before alloc",
                "after alloc: ok",
                "before copy_to_host",
                "after copy_to_host: ok",
                "before copy_from_host",
                "before free",
                "after free: ok"
            ]
        );
        let bogus = std::ptr::NonNull::from(&mut buf[0]);
        // SAFETY: refused before anything is freed: the device never handed it out.
        let unknown = unsafe { w.free_pinned_host(bogus, 16) };
        assert!(matches!(unknown, Err(Error::UnknownPointer { .. })));
        assert_eq!(
            seen(&w),
            ["before free_pinned_host", "after free_pinned_host: failed"]
        );
    }

    #[test]
    fn reserve_at_is_a_reserve_call_with_its_hint() {
        let w = logging(&[], &[]);
        let vm = w.virtual_memory().unwrap();
        let g = vm.granularity();
        assert!(!vm.holds_released_memory(), "the host's, passed down");
        let va = vm.reserve(2 * g, 0).unwrap();
        vm.free_reservation(va, 2 * g).unwrap();
        assert_eq!(
            vm.reserve_at(2 * g, 0, va).unwrap(),
            va,
            "the hint went down"
        );
        vm.free_reservation(va, 2 * g).unwrap();
        assert_eq!(
            seen(&w)[4..6],
            ["before reserve", "after reserve: ok"],
            "named reserve, so a fault for reserve reaches it"
        );
        let refused = logging(&["reserve"], &[]);
        let vm = refused.virtual_memory().unwrap();
        assert!(vm.reserve_at(2 * g, 0, va).is_err());
        assert_eq!(refused.host.census().reservations, 0, "never went down");
        let reserve_at = Call::Reserve {
            size: 2 * g,
            alignment: 0,
            addr: va,
        };
        assert_eq!(reserve_at.name(), "reserve");
    }

    #[test]
    fn capabilities_come_through_the_wrapper_unless_hidden() {
        let w = logging(&[], &[]);
        let pool = w.stream_ordered_pool().unwrap();
        let p = pool.alloc_async(4096, Stream::DEFAULT).unwrap();
        pool.free_async(p, Stream::DEFAULT).unwrap();
        assert_eq!(
            seen(&w),
            [
                "before alloc_async",
                "after alloc_async: ok",
                "before free_async",
                "after free_async: ok"
            ]
        );

        let hidden = logging(
            &[],
            &[
                Capability::VirtualMemory,
                Capability::StreamOrderedPool,
                Capability::PeerAccess,
            ],
        );
        assert!(hidden.virtual_memory().is_none());
        assert!(hidden.stream_ordered_pool().is_none());
        let other = logging(&[], &[]);
        assert!(!hidden.can_access_peer(&other).unwrap());
        assert!(matches!(
            hidden.enable_peer_access(&other),
            Err(Error::Unsupported { .. })
        ));
        assert!(hidden.peer_access().is_empty());
        assert!(seen(&hidden).is_empty(), "hidden calls never go down");
    }

    #[test]
    fn call_names_are_the_method_names() {
        let peers = [1];
        let cases = [
            (
                Call::SetAccess {
                    va: 0,
                    size: 0,
                    peers: &[],
                },
                "set_access",
            ),
            (
                Call::SetAccess {
                    va: 0,
                    size: 0,
                    peers: &peers,
                },
                "set_access_with_peers",
            ),
            (Call::SynchronizeDevice, "synchronize_device"),
            (Call::TrimTo(0), "trim_to"),
        ];
        for (call, name) in cases {
            assert_eq!(call.name(), name);
            assert_eq!(call.to_string(), name);
        }
    }
}
