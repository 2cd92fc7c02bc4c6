//! A small GPU library of the kind portalloc is for, and the way it tests its CUDA and ROCm
//! paths on a machine without a GPU (`tests/matrix.rs`).
//!
//! [`Pipeline`] stages data on one stream and computes on another: each step allocates a
//! buffer on the upload stream, copies its data into it there, has a kernel on the compute
//! stream read it, and frees it on the upload stream. portalloc's stream-ordering contract
//! (on `portalloc::device::Device`) makes the last part the caller's job: work on other
//! streams that used the memory must be ordered before the free. [`Pipeline::step`] does that
//! with an event and a GPU-side wait; the `planted-bug` feature leaves it out, and the fake
//! drivers' race detector catches the next step's copy into the same memory under the
//! kernel, under every profile.

use std::sync::Arc;

use portalloc::allocator::Allocator;
use portalloc::device::Device;
use portalloc::{DeviceBuffer, Error, Portalloc, Result, Stream};

/// Two streams on device 0 and portalloc's allocator for it.
pub struct Pipeline {
    device: Arc<dyn Device>,
    allocator: Arc<dyn Allocator>,
    upload: Stream,
    compute: Stream,
}

impl Pipeline {
    /// portalloc as the environment configures it (`Portalloc::from_env`: the backend it
    /// finds, the strategy `PORTALLOC_ALLOCATOR` / `XLA_PYTHON_CLIENT_ALLOCATOR` names), and
    /// two streams made with the driver's own call.
    ///
    /// # Errors
    /// What discovery, configuration or the driver says.
    pub fn new() -> Result<Pipeline> {
        let portalloc = Portalloc::from_env()?;
        let no_device = || Error::Unsupported {
            what: "a pipeline".into(),
            backend: "any",
            reason: "discovery found no device 0".into(),
        };
        let device = portalloc.discovery.devices.first().cloned();
        let device = device.ok_or_else(no_device)?;
        let allocator = portalloc.allocator(0).ok_or_else(no_device)?;
        let upload = device.create_stream()?;
        let compute = device.create_stream()?;
        Ok(Pipeline {
            device,
            allocator,
            upload,
            compute,
        })
    }

    /// The strategy serving the pipeline (`bfc`, `vmm`, `platform`, `async`).
    pub fn strategy(&self) -> &str {
        self.allocator.name()
    }

    /// One step: a buffer for `data` allocated on the upload stream and `data` copied into
    /// it there, `launch` queues the kernel that reads it on the compute stream
    /// (`launch(ptr, size, stream)`), and the buffer is freed on the upload stream once it is
    /// ordered after that kernel.
    ///
    /// # Errors
    /// What the allocator or the driver says.
    pub fn step(&self, data: &[u8], launch: impl FnOnce(u64, u64, Stream)) -> Result<()> {
        let buffer = DeviceBuffer::new(&self.allocator, data.len() as u64, self.upload)?;
        // SAFETY: the buffer holds `data.len()` bytes until its free, ordered after every use
        // below; a pageable source is staged by the driver when the call is made.
        unsafe {
            self.device.copy_from_host(
                buffer.ptr(),
                data.as_ptr(),
                data.len() as u64,
                self.upload,
            )?
        };
        // The compute stream reads what the upload stream wrote.
        let staged = self.device.create_event()?;
        self.device.record_event(staged, self.upload)?;
        self.device.wait_event(self.compute, staged)?;
        self.device.destroy_event(staged)?;
        launch(buffer.ptr(), buffer.size(), self.compute);
        if !cfg!(feature = "planted-bug") {
            // The free is on the upload stream: make it wait, on the GPU, for the compute
            // stream's kernel (RMM's rule, PyTorch's record_stream).
            let read = self.device.create_event()?;
            self.device.record_event(read, self.compute)?;
            self.device.wait_event(self.upload, read)?;
            self.device.destroy_event(read)?;
        }
        buffer.free()
    }

    /// Gives the memory the allocator caches back to the device, as a library does between
    /// phases; the bytes given back.
    ///
    /// # Errors
    /// What the driver says.
    pub fn release(&self) -> Result<u64> {
        self.allocator.trim()
    }
}

impl Drop for Pipeline {
    fn drop(&mut self) {
        // The contract: a stream is destroyed only after the work queued on it has completed.
        for stream in [self.upload, self.compute] {
            let _ = self.device.synchronize_stream(stream);
            // SAFETY: neither stream is used again, and its work is complete.
            let _ = unsafe { self.device.destroy_stream(stream) };
        }
    }
}
