//! A GPU library of the kind cudarc is, and how it tests its CUDA and ROCm paths on a machine
//! without a GPU (`tests/matrix.rs`).
//!
//! [`Gpu`] loads the vendor's driver itself — `libcuda.so.1`, else `libamdhip64.so`, by name
//! — and makes its calls checked: non-blocking streams, events, GPU-side waits, copies,
//! memsets, module load and launch, device and pinned memory. [`Scaler`] is what the library
//! is for: it stages input on an upload stream into memory from portalloc, scales it with a
//! kernel on a compute stream (into memory from portalloc, reading a factor the library keeps
//! in memory of the driver's own) and copies the result back into pinned memory.
//!
//! The stream-ordering contract (portalloc's, RMM's, PyTorch's `record_stream`) makes one
//! thing the caller's job: work on other streams that used a buffer must be ordered before
//! its free. Each `bug-*` feature leaves one such order out (see `Cargo.toml`); the fake
//! drivers' race detector catches each under every profile.

mod sys;

use std::ffi::{c_int, c_uint, c_void};
use std::sync::Arc;

use portalloc::allocator::{Allocation, Allocator};
use portalloc::{Portalloc, Stream};

pub use sys::Status;
use sys::{Api, Driver};

/// What went wrong: a vendor call and its status, or portalloc's error.
#[derive(Debug)]
pub enum Error {
    /// No vendor driver with a device could be loaded.
    NoDriver(String),
    /// A vendor call refused.
    Call {
        /// The call.
        call: &'static str,
        /// Its status.
        status: Status,
    },
    /// portalloc refused.
    Portalloc(portalloc::Error),
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::NoDriver(why) => write!(f, "no GPU driver: {why}"),
            Error::Call { call, status } => write!(f, "{call} failed with status {status}"),
            Error::Portalloc(e) => write!(f, "portalloc: {e}"),
        }
    }
}

impl std::error::Error for Error {}

impl From<portalloc::Error> for Error {
    fn from(e: portalloc::Error) -> Error {
        Error::Portalloc(e)
    }
}

/// This library's results.
pub type Result<T> = std::result::Result<T, Error>;

fn check(call: &'static str, status: Status) -> Result<()> {
    if status == 0 {
        Ok(())
    } else {
        Err(Error::Call { call, status })
    }
}

/// `CU_STREAM_NON_BLOCKING` / `hipStreamNonBlocking`: the library's streams take no part in
/// the legacy default stream's implicit synchronisation (cudarc makes its streams so).
const NON_BLOCKING: c_uint = 1;
/// `CU_EVENT_DISABLE_TIMING` / `hipEventDisableTiming`.
const NO_TIMING: c_uint = 2;

/// The kernels, as PTX (what `cuModuleLoadData` takes). `scale(x, y, w, n)`: `y[i] = x[i] *
/// w[0]` for `i < n`.
const PTX: &str = "
.version 7.0
.target sm_70
.address_size 64
.visible .entry scale(.param .u64 x, .param .u64 y, .param .u64 w, .param .u32 n)
{
    ret;
}
\0";

/// The kernels for ROCm: an AMD GPU code object (an ELF image; a real build of this library
/// ships the one `hipcc --genco` makes, this stand-in carries its header only).
const CODE_OBJECT: [u8; 64] = {
    let mut image = [0u8; 64];
    image[0] = 0x7f;
    image[1] = b'E';
    image[2] = b'L';
    image[3] = b'F';
    image
};

/// A vendor's device 0, loaded and checked.
pub struct Gpu {
    driver: Driver,
    /// CUDA: the device's primary context, made current on every thread that calls.
    context: *mut c_void,
}

// SAFETY: the driver's calls are thread-safe, and the context handle is only passed to them.
unsafe impl Send for Gpu {}
// SAFETY: as above.
unsafe impl Sync for Gpu {}

/// A stream of the library's own (a raw handle).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawStream(pub u64);

/// An event of the library's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawEvent(pub u64);

impl Gpu {
    /// CUDA's driver if it loads and has a device, else HIP's.
    ///
    /// # Errors
    /// [`Error::NoDriver`], saying what each vendor's loader or initialisation said.
    pub fn open() -> Result<Gpu> {
        let mut why = Vec::new();
        match Driver::cuda() {
            Ok(driver) => {
                let Api::Cuda(cu) = &driver.api else {
                    unreachable!()
                };
                let mut count = 0;
                let mut context = std::ptr::null_mut();
                // SAFETY: the CUDA calls with valid out pointers.
                let opened = unsafe {
                    check("cuInit", (cu.cuInit)(0))
                        .and_then(|()| check("cuDeviceGetCount", (cu.cuDeviceGetCount)(&mut count)))
                        .and_then(|()| {
                            check(
                                "cuDevicePrimaryCtxRetain",
                                (cu.cuDevicePrimaryCtxRetain)(&mut context, 0),
                            )
                        })
                };
                match opened {
                    Ok(()) if count > 0 => {
                        let gpu = Gpu { driver, context };
                        gpu.bind()?;
                        return Ok(gpu);
                    }
                    Ok(()) => why.push("cuda: no device".to_string()),
                    Err(e) => why.push(format!("cuda: {e}")),
                }
            }
            Err(e) => why.push(format!("cuda: {e}")),
        }
        match Driver::hip() {
            Ok(driver) => {
                let Api::Hip(hip) = &driver.api else {
                    unreachable!()
                };
                let mut count = 0;
                // SAFETY: the HIP call with a valid out pointer.
                match check("hipGetDeviceCount", unsafe {
                    (hip.hipGetDeviceCount)(&mut count)
                }) {
                    Ok(()) if count > 0 => {
                        let gpu = Gpu {
                            driver,
                            context: std::ptr::null_mut(),
                        };
                        gpu.bind()?;
                        return Ok(gpu);
                    }
                    Ok(()) => why.push("hip: no device".to_string()),
                    Err(e) => why.push(format!("hip: {e}")),
                }
            }
            Err(e) => why.push(format!("hip: {e}")),
        }
        Err(Error::NoDriver(why.join("; ")))
    }

    /// `cuda` or `hip`.
    pub fn vendor(&self) -> &'static str {
        match self.driver.api {
            Api::Cuda(_) => "cuda",
            Api::Hip(_) => "hip",
        }
    }

    /// Makes device 0 current on the calling thread (cudarc's `bind_to_thread`).
    fn bind(&self) -> Result<()> {
        // SAFETY: the vendor's calls; the context is the retained primary context.
        match &self.driver.api {
            Api::Cuda(cu) => check("cuCtxSetCurrent", unsafe {
                (cu.cuCtxSetCurrent)(self.context)
            }),
            Api::Hip(hip) => check("hipSetDevice", unsafe { (hip.hipSetDevice)(0) }),
        }
    }

    /// A non-blocking stream.
    pub fn stream(&self) -> Result<RawStream> {
        self.bind()?;
        let mut s = 0;
        // SAFETY: one handle written.
        let status = unsafe {
            match &self.driver.api {
                Api::Cuda(cu) => (cu.cuStreamCreate)(&mut s, NON_BLOCKING),
                Api::Hip(hip) => (hip.hipStreamCreateWithFlags)(&mut s, NON_BLOCKING),
            }
        };
        check("stream create", status).map(|()| RawStream(s))
    }

    /// Destroys a stream (its work still completes, as the vendors document).
    pub fn destroy_stream(&self, s: RawStream) -> Result<()> {
        self.bind()?;
        // SAFETY: a live stream of this library's.
        let status = unsafe {
            match &self.driver.api {
                Api::Cuda(cu) => (cu.cuStreamDestroy_v2)(s.0),
                Api::Hip(hip) => (hip.hipStreamDestroy)(s.0),
            }
        };
        check("stream destroy", status)
    }

    /// Waits on the CPU for everything queued on `s`.
    pub fn synchronize(&self, s: RawStream) -> Result<()> {
        self.bind()?;
        // SAFETY: a live stream.
        let status = unsafe {
            match &self.driver.api {
                Api::Cuda(cu) => (cu.cuStreamSynchronize)(s.0),
                Api::Hip(hip) => (hip.hipStreamSynchronize)(s.0),
            }
        };
        check("stream synchronize", status)
    }

    /// An event recorded on `s` now.
    pub fn record(&self, s: RawStream) -> Result<RawEvent> {
        self.bind()?;
        let mut e = 0;
        // SAFETY: one handle written; live handles.
        let status = unsafe {
            match &self.driver.api {
                Api::Cuda(cu) => match (cu.cuEventCreate)(&mut e, NO_TIMING) {
                    0 => (cu.cuEventRecord)(e, s.0),
                    other => other,
                },
                Api::Hip(hip) => match (hip.hipEventCreateWithFlags)(&mut e, NO_TIMING) {
                    0 => (hip.hipEventRecord)(e, s.0),
                    other => other,
                },
            }
        };
        check("event record", status).map(|()| RawEvent(e))
    }

    /// Work queued on `s` from now on waits, on the GPU, for `e`.
    pub fn wait(&self, s: RawStream, e: RawEvent) -> Result<()> {
        self.bind()?;
        // SAFETY: live handles.
        let status = unsafe {
            match &self.driver.api {
                Api::Cuda(cu) => (cu.cuStreamWaitEvent)(s.0, e.0, 0),
                Api::Hip(hip) => (hip.hipStreamWaitEvent)(s.0, e.0, 0),
            }
        };
        check("stream wait event", status)
    }

    /// Waits on the CPU for `e`, then destroys it.
    pub fn finish_event(&self, e: RawEvent) -> Result<()> {
        self.bind()?;
        // SAFETY: a live event, not used again.
        let status = unsafe {
            match &self.driver.api {
                Api::Cuda(cu) => match (cu.cuEventSynchronize)(e.0) {
                    0 => (cu.cuEventDestroy_v2)(e.0),
                    other => other,
                },
                Api::Hip(hip) => match (hip.hipEventSynchronize)(e.0) {
                    0 => (hip.hipEventDestroy)(e.0),
                    other => other,
                },
            }
        };
        check("event synchronize", status)
    }

    /// Destroys `e` (its record still completes).
    pub fn drop_event(&self, e: RawEvent) -> Result<()> {
        self.bind()?;
        // SAFETY: a live event, not used again.
        let status = unsafe {
            match &self.driver.api {
                Api::Cuda(cu) => (cu.cuEventDestroy_v2)(e.0),
                Api::Hip(hip) => (hip.hipEventDestroy)(e.0),
            }
        };
        check("event destroy", status)
    }

    /// `bytes` of device memory from the driver itself (`cuMemAlloc`, `hipMalloc`).
    pub fn alloc(&self, bytes: usize) -> Result<u64> {
        self.bind()?;
        let mut p = 0;
        // SAFETY: one pointer written.
        let status = unsafe {
            match &self.driver.api {
                Api::Cuda(cu) => (cu.cuMemAlloc_v2)(&mut p, bytes),
                Api::Hip(hip) => (hip.hipMalloc)(&mut p, bytes),
            }
        };
        check("alloc", status).map(|()| p)
    }

    /// Frees memory from [`Gpu::alloc`] (the vendors synchronise the device first).
    pub fn free(&self, p: u64) -> Result<()> {
        self.bind()?;
        // SAFETY: memory from `alloc`, not used again.
        let status = unsafe {
            match &self.driver.api {
                Api::Cuda(cu) => (cu.cuMemFree_v2)(p),
                Api::Hip(hip) => (hip.hipFree)(p),
            }
        };
        check("free", status)
    }

    /// `bytes` of pinned host memory.
    pub fn pinned(&self, bytes: usize) -> Result<*mut u8> {
        self.bind()?;
        let mut p = std::ptr::null_mut();
        // SAFETY: one pointer written.
        let status = unsafe {
            match &self.driver.api {
                Api::Cuda(cu) => (cu.cuMemHostAlloc)(&mut p, bytes, 0),
                Api::Hip(hip) => (hip.hipHostMalloc)(&mut p, bytes, 0),
            }
        };
        check("pinned alloc", status).map(|()| p.cast())
    }

    /// Frees memory from [`Gpu::pinned`].
    pub fn free_pinned(&self, p: *mut u8) -> Result<()> {
        self.bind()?;
        // SAFETY: pinned memory from `pinned`, not used again.
        let status = unsafe {
            match &self.driver.api {
                Api::Cuda(cu) => (cu.cuMemFreeHost)(p.cast()),
                Api::Hip(hip) => (hip.hipHostFree)(p.cast()),
            }
        };
        check("pinned free", status)
    }

    /// Queues a copy of `src` into device memory `dst` on `s`.
    ///
    /// # Safety
    /// `dst` holds `src.len()` bytes until the stream reaches the copy.
    pub unsafe fn upload(&self, dst: u64, src: &[u8], s: RawStream) -> Result<()> {
        self.bind()?;
        // SAFETY: the caller's contract; a pageable source is staged by the driver at the
        // call (CUDA "API synchronization behavior").
        let status = unsafe {
            match &self.driver.api {
                Api::Cuda(cu) => {
                    (cu.cuMemcpyHtoDAsync_v2)(dst, src.as_ptr().cast(), src.len(), s.0)
                }
                Api::Hip(hip) => (hip.hipMemcpyHtoDAsync)(dst, src.as_ptr().cast(), src.len(), s.0),
            }
        };
        check("upload", status)
    }

    /// Queues a copy of `bytes` of device memory `src` into pinned memory `dst` on `s`.
    ///
    /// # Safety
    /// Both hold `bytes` until the stream reaches the copy; `dst` is not read before then.
    pub unsafe fn download(
        &self,
        dst: *mut u8,
        src: u64,
        bytes: usize,
        s: RawStream,
    ) -> Result<()> {
        self.bind()?;
        // SAFETY: the caller's contract.
        let status = unsafe {
            match &self.driver.api {
                Api::Cuda(cu) => (cu.cuMemcpyDtoHAsync_v2)(dst.cast(), src, bytes, s.0),
                Api::Hip(hip) => (hip.hipMemcpyDtoHAsync)(dst.cast(), src, bytes, s.0),
            }
        };
        check("download", status)
    }

    /// Queues a fill of `words` 32-bit words at `dst` with `value` on `s`.
    pub fn fill(&self, dst: u64, value: u32, words: usize, s: RawStream) -> Result<()> {
        self.bind()?;
        // SAFETY: the driver checks the range against its allocations.
        let status = unsafe {
            match &self.driver.api {
                Api::Cuda(cu) => (cu.cuMemsetD32Async)(dst, value, words, s.0),
                Api::Hip(hip) => (hip.hipMemsetD32Async)(dst, value as c_int, words, s.0),
            }
        };
        check("fill", status)
    }

    /// Loads the library's kernels; the module and `scale`.
    fn load(&self) -> Result<(u64, u64)> {
        self.bind()?;
        let (mut module, mut function) = (0, 0);
        // SAFETY: NUL-terminated PTX, or a code object; handles written.
        let status = unsafe {
            match &self.driver.api {
                Api::Cuda(cu) => match (cu.cuModuleLoadData)(&mut module, PTX.as_ptr().cast()) {
                    0 => (cu.cuModuleGetFunction)(&mut function, module, c"scale".as_ptr()),
                    other => other,
                },
                Api::Hip(hip) => {
                    match (hip.hipModuleLoadData)(&mut module, CODE_OBJECT.as_ptr().cast()) {
                        0 => (hip.hipModuleGetFunction)(&mut function, module, c"scale".as_ptr()),
                        other => other,
                    }
                }
            }
        };
        check("module load", status).map(|()| (module, function))
    }

    fn unload(&self, module: u64) -> Result<()> {
        self.bind()?;
        // SAFETY: a loaded module, not used again.
        let status = unsafe {
            match &self.driver.api {
                Api::Cuda(cu) => (cu.cuModuleUnload)(module),
                Api::Hip(hip) => (hip.hipModuleUnload)(module),
            }
        };
        check("module unload", status)
    }

    /// Queues `scale(x, y, w, n)` on `s`: one thread per element, 256 to a block.
    fn scale(&self, function: u64, x: u64, y: u64, w: u64, n: u32, s: RawStream) -> Result<()> {
        self.bind()?;
        let (mut x, mut y, mut w, mut n) = (x, y, w, n);
        let mut params = [
            (&mut x as *mut u64).cast::<c_void>(),
            (&mut y as *mut u64).cast(),
            (&mut w as *mut u64).cast(),
            (&mut n as *mut u32).cast(),
        ];
        let blocks = n.div_ceil(256).max(1);
        // SAFETY: a live function and stream; the parameters outlive the call (the driver
        // copies them when the call is made).
        let status = unsafe {
            match &self.driver.api {
                Api::Cuda(cu) => (cu.cuLaunchKernel)(
                    function,
                    blocks,
                    1,
                    1,
                    256,
                    1,
                    1,
                    0,
                    s.0,
                    params.as_mut_ptr(),
                    std::ptr::null_mut(),
                ),
                Api::Hip(hip) => (hip.hipModuleLaunchKernel)(
                    function,
                    blocks,
                    1,
                    1,
                    256,
                    1,
                    1,
                    0,
                    s.0,
                    params.as_mut_ptr(),
                    std::ptr::null_mut(),
                ),
            }
        };
        check("launch", status)
    }
}

impl Drop for Gpu {
    fn drop(&mut self) {
        if let Api::Cuda(cu) = &self.driver.api {
            // SAFETY: the retain made in `open`.
            let _ = unsafe { (cu.cuDevicePrimaryCtxRelease)(0) };
        }
    }
}

/// The value every element of a step's output is filled with before the kernel writes it:
/// no kernel runs on the fake drivers, so the output a test reads back is this (1.0f32).
pub const FILL: f32 = 1.0;

/// Scales vectors on the GPU: input staged on an upload stream, the kernel on a compute
/// stream, results copied back into pinned memory.
pub struct Scaler {
    gpu: Arc<Gpu>,
    allocator: Arc<dyn Allocator>,
    upload: RawStream,
    compute: RawStream,
    /// A third stream: the factor is uploaded on it (and, `bug-free-on-wrong-stream`, the
    /// input allocated for it, the wrong one).
    side: RawStream,
    module: u64,
    function: u64,
    /// The factor, in memory of the driver's own (not portalloc's).
    factor: u64,
    /// Recorded on the compute stream after the last kernel: what an upload of the factor
    /// must wait for.
    last_kernel: std::sync::Mutex<Option<RawEvent>>,
}

/// Host memory a result is copied back into: pinned where the driver gives it (copies into
/// it are asynchronous), else ordinary memory (copies into it complete before they return).
enum HostBuffer {
    Pinned(*mut u8),
    Pageable(Vec<u8>),
}

impl HostBuffer {
    fn new(gpu: &Gpu, bytes: usize) -> Result<HostBuffer> {
        match gpu.pinned(bytes.max(1)) {
            Ok(p) => Ok(HostBuffer::Pinned(p)),
            // The driver cannot page-lock memory (out of memory, as where the locked-memory
            // limit is reached): ordinary memory, as PyTorch and cudarc fall back to.
            Err(Error::Call { status: 2, .. }) => Ok(HostBuffer::Pageable(vec![0; bytes.max(1)])),
            Err(e) => Err(e),
        }
    }

    fn ptr(&mut self) -> *mut u8 {
        match self {
            HostBuffer::Pinned(p) => *p,
            HostBuffer::Pageable(v) => v.as_mut_ptr(),
        }
    }
}

/// A step in flight: its result is copied back and read by [`Pending::wait`].
pub struct Pending<'s> {
    scaler: &'s Scaler,
    /// The output, in memory from portalloc (for the compute stream, or the step's own),
    /// freed once copied back.
    y: Allocation,
    /// Recorded after the kernel on a step's own stream: what the copy back waits for.
    after: Option<RawEvent>,
    /// The step's own stream, if it still lives: synchronised and destroyed by `wait`.
    own: Option<RawStream>,
    n: usize,
}

impl Scaler {
    /// The GPU the environment finds, portalloc's allocator for it as the environment
    /// configures it (`Portalloc::from_env`), three non-blocking streams, the kernels, and
    /// the factor (2.0) in driver memory.
    ///
    /// # Errors
    /// What the driver or portalloc says.
    pub fn new() -> Result<Scaler> {
        let gpu = Arc::new(Gpu::open()?);
        let portalloc = Portalloc::from_env()?;
        let allocator = portalloc
            .allocator(0)
            .ok_or_else(|| Error::NoDriver("portalloc found no device 0".into()))?;
        let (module, function) = gpu.load()?;
        let factor = gpu.alloc(256)?;
        let scaler = Scaler {
            upload: gpu.stream()?,
            compute: gpu.stream()?,
            side: gpu.stream()?,
            gpu,
            allocator,
            module,
            function,
            factor,
            last_kernel: std::sync::Mutex::new(None),
        };
        scaler.set_factor(2.0)?;
        Ok(scaler)
    }

    /// The vendor (`cuda`, `hip`) and portalloc's strategy.
    pub fn describe(&self) -> String {
        format!(
            "{} with portalloc's {}",
            self.gpu.vendor(),
            self.allocator.name()
        )
    }

    /// The library's streams (upload, compute, side), for a test's messages.
    pub fn streams(&self) -> [u64; 3] {
        [self.upload.0, self.compute.0, self.side.0]
    }

    fn portalloc(&self, bytes: u64, s: RawStream, tag: &str) -> Result<Allocation> {
        // SAFETY: a live stream of this library's, destroyed only after its work completed.
        let stream = unsafe { Stream::from_raw(s.0) };
        Ok(self.allocator.allocate(bytes, 0, stream, tag)?)
    }

    /// Sets the factor: an upload, on the side stream, into the driver memory the kernels
    /// read, ordered after the kernel in flight that reads it.
    ///
    /// # Errors
    /// What the driver says.
    pub fn set_factor(&self, factor: f32) -> Result<()> {
        let last = self.last_kernel.lock().unwrap().take();
        if let Some(e) = last {
            if !cfg!(feature = "bug-copy-under-kernel") {
                self.gpu.wait(self.side, e)?;
            }
            self.gpu.drop_event(e)?;
        }
        // SAFETY: 256 bytes of driver memory; a pageable source is staged at the call.
        unsafe {
            self.gpu
                .upload(self.factor, &factor.to_ne_bytes(), self.side)
        }?;
        // The kernels after this read the new factor: the compute stream waits for it.
        let e = self.gpu.record(self.side)?;
        self.gpu.wait(self.compute, e)?;
        self.gpu.drop_event(e)
    }

    /// Queues one step on the library's streams: the input uploaded into memory from
    /// portalloc, the output filled with [`FILL`] and scaled by the kernel into memory from
    /// portalloc. Returns before any of it completes; [`Pending::wait`] copies the result
    /// back.
    ///
    /// # Errors
    /// What the driver or portalloc says.
    pub fn step(&self, input: &[f32]) -> Result<Pending<'_>> {
        let (n, bytes) = (input.len(), std::mem::size_of_val(input));
        // The input's stream: where it is freed, in stream order.
        let input_stream = if cfg!(feature = "bug-free-on-wrong-stream") {
            self.side
        } else {
            self.upload
        };
        let x = self.portalloc(bytes as u64, input_stream, "input")?;
        // SAFETY: `x` holds `bytes` until its free, which is ordered after every use.
        unsafe { self.gpu.upload(x.ptr(), as_bytes(input), self.upload) }?;
        let staged = self.gpu.record(self.upload)?;
        self.gpu.wait(self.compute, staged)?;
        self.gpu.drop_event(staged)?;
        let y = self.portalloc(bytes as u64, self.compute, "output")?;
        self.gpu.fill(y.ptr(), FILL.to_bits(), n, self.compute)?;
        self.gpu.scale(
            self.function,
            x.ptr(),
            y.ptr(),
            self.factor,
            n as u32,
            self.compute,
        )?;
        let kernel = self.gpu.record(self.compute)?;
        // The input is freed on its stream: that stream must first wait for the kernel that
        // reads it (RMM's rule, PyTorch's record_stream).
        if !cfg!(feature = "bug-no-wait") && !cfg!(feature = "bug-free-on-wrong-stream") {
            self.gpu.wait(input_stream, kernel)?;
        }
        self.allocator.deallocate(x)?;
        if let Some(old) = self.last_kernel.lock().unwrap().replace(kernel) {
            self.gpu.drop_event(old)?;
        }
        Ok(Pending {
            scaler: self,
            y,
            after: None,
            own: None,
            n,
        })
    }

    /// One step on a stream of its own, made for it and destroyed once its work completed.
    ///
    /// # Errors
    /// What the driver or portalloc says.
    pub fn step_alone(&self, input: &[f32]) -> Result<Pending<'_>> {
        let (n, bytes) = (input.len(), std::mem::size_of_val(input));
        let s = self.gpu.stream()?;
        let x = self.portalloc(bytes as u64, s, "input")?;
        // SAFETY: as in `step`.
        unsafe { self.gpu.upload(x.ptr(), as_bytes(input), s) }?;
        // Everything the step allocates is for its own stream.
        let y = self.portalloc(bytes as u64, s, "output")?;
        self.gpu.fill(y.ptr(), FILL.to_bits(), n, s)?;
        self.gpu
            .scale(self.function, x.ptr(), y.ptr(), self.factor, n as u32, s)?;
        // The input is freed on its stream, in stream order after the kernel.
        self.allocator.deallocate(x)?;
        let after = self.gpu.record(s)?;
        let own = if cfg!(feature = "bug-destroyed-stream") {
            // Destroyed at once: legal for the driver (the work completes), but portalloc
            // was promised the stream would live until the work before its frees completed,
            // and the next stream made gets this handle.
            self.gpu.destroy_stream(s)?;
            None
        } else {
            Some(s)
        };
        Ok(Pending {
            scaler: self,
            y,
            after: Some(after),
            own,
            n,
        })
    }
}

impl Pending<'_> {
    /// Copies the result back (into pinned memory where the driver gives it), waits for the
    /// copy and reads it.
    ///
    /// # Errors
    /// What the driver or portalloc says.
    pub fn wait(self) -> Result<Vec<f32>> {
        let (scaler, gpu) = (self.scaler, &self.scaler.gpu);
        let bytes = self.n * 4;
        if let Some(e) = self.after {
            gpu.wait(scaler.compute, e)?;
            gpu.drop_event(e)?;
        }
        let mut out = HostBuffer::new(gpu, bytes)?;
        let at = out.ptr();
        // SAFETY: `out` holds `bytes`, read only once `done` completed.
        unsafe { gpu.download(at, self.y.ptr(), bytes, scaler.compute) }?;
        let done = gpu.record(scaler.compute)?;
        // Freed on its stream, ordered after the copy: the compute stream's own (stream
        // order), or a step's own stream, which waits for the copy first.
        if let Some(s) = self.own {
            gpu.wait(s, done)?;
        }
        scaler.allocator.deallocate(self.y)?;
        let read = || -> Vec<f32> {
            // SAFETY: `at` holds `bytes` of host memory of this step's.
            let bytes = unsafe { std::slice::from_raw_parts(at, bytes) };
            bytes
                .chunks_exact(4)
                .map(|c| f32::from_ne_bytes(c.try_into().unwrap()))
                .collect()
        };
        let early = cfg!(feature = "bug-read-before-sync").then(read);
        gpu.finish_event(done)?;
        let result = early.unwrap_or_else(read);
        if let Some(s) = self.own {
            gpu.synchronize(s)?;
            gpu.destroy_stream(s)?;
        }
        if let HostBuffer::Pinned(p) = out {
            gpu.free_pinned(p)?;
        }
        Ok(result)
    }
}

impl Drop for Scaler {
    fn drop(&mut self) {
        // The contract: a stream is destroyed only after the work queued on it completed.
        for s in [self.upload, self.compute, self.side] {
            let _ = self.gpu.synchronize(s);
        }
        if let Some(e) = self.last_kernel.lock().unwrap().take() {
            let _ = self.gpu.drop_event(e);
        }
        for s in [self.upload, self.compute, self.side] {
            let _ = self.gpu.destroy_stream(s);
        }
        let _ = self.gpu.free(self.factor);
        let _ = self.gpu.unload(self.module);
    }
}

fn as_bytes(v: &[f32]) -> &[u8] {
    // SAFETY: f32 has no padding and every byte pattern is a valid u8.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast(), std::mem::size_of_val(v)) }
}
