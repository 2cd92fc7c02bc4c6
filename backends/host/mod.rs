//! The host backend: ordinary memory behind the [`Device`] trait, with virtual memory that
//! behaves like the GPU drivers' (interface fixed here; being written).

use crate::device::{Device, DeviceInfo, Event, MemInfo, Stream};
use crate::error::Result;

/// Facts about what a host device holds now, for leak checks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HostCensus {
    /// Live allocations from [`Device::alloc`].
    pub allocations: u64,
    /// Bytes counted against the capacity (allocations + physical handles).
    pub bytes_in_use: u64,
    /// Live physical handles.
    pub physical_handles: u64,
    /// Live mappings.
    pub mappings: u64,
    /// Live address reservations.
    pub reservations: u64,
    /// Live streams.
    pub streams: u64,
    /// Live events.
    pub events: u64,
}

/// Builder for [`HostDevice`].
#[derive(Debug, Clone)]
pub struct HostDeviceBuilder {
    capacity: Option<u64>,
    simulated: bool,
    granularity: u64,
    name: Option<String>,
    ordinal: u32,
}

impl HostDeviceBuilder {
    /// Total memory of the device (default: the machine's physical memory).
    pub fn capacity(mut self, bytes: u64) -> Self {
        self.capacity = Some(bytes);
        self
    }
    /// Track addresses only, touching no memory.
    pub fn simulated(mut self, simulated: bool) -> Self {
        self.simulated = simulated;
        self
    }
    /// Virtual-memory granularity (a power of two, a multiple of the page size; default 2 MiB).
    pub fn granularity(mut self, bytes: u64) -> Self {
        self.granularity = bytes;
        self
    }
    /// A name for reports.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }
    /// The ordinal reported in [`DeviceInfo`].
    pub fn ordinal(mut self, ordinal: u32) -> Self {
        self.ordinal = ordinal;
        self
    }
    /// Builds the device.
    pub fn build(self) -> Result<HostDevice> {
        Ok(HostDevice { info: DeviceInfo { vendor: crate::Vendor::Host, ordinal: self.ordinal, name: self.name.unwrap_or_default(), arch: "host".into(), total_bytes: self.capacity.unwrap_or(0), min_granularity: self.granularity, recommended_granularity: self.granularity, capabilities: Default::default(), notes: vec![] } })
    }
}

/// Host memory as a device.
#[derive(Debug)]
pub struct HostDevice {
    info: DeviceInfo,
}

impl HostDevice {
    /// A builder with the defaults.
    pub fn builder() -> HostDeviceBuilder {
        HostDeviceBuilder { capacity: None, simulated: false, granularity: 2 << 20, name: None, ordinal: 0 }
    }
    /// What the device holds now.
    pub fn census(&self) -> HostCensus {
        HostCensus::default()
    }
}

impl Device for HostDevice {
    fn info(&self) -> &DeviceInfo { &self.info }
    fn mem_info(&self) -> Result<MemInfo> { todo!() }
    fn alloc(&self, _size: u64) -> Result<u64> { todo!() }
    fn free(&self, _ptr: u64, _size: u64) -> Result<()> { todo!() }
    fn create_stream(&self) -> Result<Stream> { todo!() }
    fn destroy_stream(&self, _stream: Stream) -> Result<()> { todo!() }
    fn synchronize_stream(&self, _stream: Stream) -> Result<()> { todo!() }
    fn create_event(&self) -> Result<Event> { todo!() }
    fn record_event(&self, _event: Event, _stream: Stream) -> Result<()> { todo!() }
    fn event_complete(&self, _event: Event) -> Result<bool> { todo!() }
    fn synchronize_event(&self, _event: Event) -> Result<()> { todo!() }
    fn destroy_event(&self, _event: Event) -> Result<()> { todo!() }
}
