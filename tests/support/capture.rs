//! Stream capture and graphs through the vendors' own calls on a conformance driver: what a
//! caller that captures (PyTorch, vLLM, cudarc) does around portalloc.

use std::ffi::{c_int, c_uint, c_void};
use std::sync::Arc;

use portalloc::adaptor::{Detect, GraphPools};
use portalloc::{Device, Stream, Vendor};

use super::common::Strategy;
use super::fakes::{Fake, FakeDevice};

/// A private copy of `D`'s conformance driver with one device of `capacity` bytes, and that
/// device, current on this thread.
pub fn open<D: FakeDevice>(capacity: u64) -> (Fake, Arc<D>) {
    let fake = Fake::with_devices(D::VENDOR, 1, capacity);
    let device = Arc::new(D::open(&fake, 0));
    device.make_current_for_caller();
    (fake, device)
}

/// `strategy` over `device`, holding at most `limit` bytes, inside graph pools.
pub fn pools_over<D: FakeDevice>(
    strategy: Strategy,
    device: &Arc<D>,
    limit: u64,
    detect: Detect,
) -> GraphPools {
    let upstream = strategy
        .try_build(Arc::clone(device), limit)
        .unwrap_or_else(|e| panic!("{}: {e}", strategy.name()));
    let device: Arc<dyn Device> = Arc::clone(device) as Arc<dyn Device>;
    GraphPools::from_boxed(upstream, device, detect)
}

/// The global capture mode (every thread's at start).
pub const GLOBAL: c_int = 0;

/// The caller's own driver calls: streams, capture, graphs.
pub struct Raw<'a> {
    pub fake: &'a Fake,
}

impl Raw<'_> {
    pub fn cuda(&self) -> bool {
        self.fake.vendor() == Vendor::Cuda
    }

    pub fn stream(&self) -> Stream {
        let mut s: *mut c_void = std::ptr::null_mut();
        let name = if self.cuda() {
            "cuStreamCreate"
        } else {
            "hipStreamCreateWithFlags"
        };
        let f: unsafe extern "C" fn(*mut *mut c_void, c_uint) -> c_int = self.fake.sym(name);
        // SAFETY: one handle written; non-blocking.
        assert_eq!(unsafe { f(&mut s, 1) }, 0);
        // SAFETY: a live stream of this fake, destroyed only after its work completed.
        unsafe { Stream::from_raw(s as u64) }
    }

    pub fn sync(&self, s: Stream) {
        let name = if self.cuda() {
            "cuStreamSynchronize"
        } else {
            "hipStreamSynchronize"
        };
        let f: unsafe extern "C" fn(u64) -> c_int = self.fake.sym(name);
        // SAFETY: a live stream.
        assert_eq!(unsafe { f(s.as_raw()) }, 0, "{name}");
    }

    /// `cuStreamBeginCapture_v2` / `hipStreamBeginCapture` in the global mode.
    pub fn begin(&self, s: Stream) {
        self.begin_in(s, GLOBAL)
    }

    /// `cuStreamBeginCapture_v2` / `hipStreamBeginCapture` in `mode`.
    pub fn begin_in(&self, s: Stream, mode: c_int) {
        let name = if self.cuda() {
            "cuStreamBeginCapture_v2"
        } else {
            "hipStreamBeginCapture"
        };
        let f: unsafe extern "C" fn(u64, c_int) -> c_int = self.fake.sym(name);
        // SAFETY: a live stream; a mode the vendors define.
        assert_eq!(unsafe { f(s.as_raw(), mode) }, 0, "{name}");
    }

    /// `cuStreamDestroy_v2` / `hipStreamDestroy` of the caller's own stream.
    pub fn destroy_stream(&self, s: Stream) {
        let name = if self.cuda() {
            "cuStreamDestroy_v2"
        } else {
            "hipStreamDestroy"
        };
        let f: unsafe extern "C" fn(u64) -> c_int = self.fake.sym(name);
        // SAFETY: the caller's own stream, idle, not used afterwards.
        assert_eq!(unsafe { f(s.as_raw()) }, 0, "{name}");
    }

    /// Ends the capture: the graph, or the code (901: invalidated).
    pub fn end(&self, s: Stream) -> Result<u64, c_int> {
        let name = if self.cuda() {
            "cuStreamEndCapture"
        } else {
            "hipStreamEndCapture"
        };
        let f: unsafe extern "C" fn(u64, *mut u64) -> c_int = self.fake.sym(name);
        let mut g = 0;
        // SAFETY: one handle written.
        match unsafe { f(s.as_raw(), &mut g) } {
            0 => Ok(g),
            rc => Err(rc),
        }
    }

    /// `cuGraphInstantiate` / `hipGraphInstantiate` (the 5-argument form every version
    /// exports, CUDA 10.0's included).
    pub fn instantiate(&self, graph: u64) -> u64 {
        let name = if self.cuda() {
            "cuGraphInstantiate"
        } else {
            "hipGraphInstantiate"
        };
        let f: unsafe extern "C" fn(*mut u64, u64, *mut c_void, *mut i8, usize) -> c_int =
            self.fake.sym(name);
        let mut exec = 0;
        // SAFETY: one handle written; no error node or log asked for.
        let rc = unsafe {
            f(
                &mut exec,
                graph,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            )
        };
        assert_eq!(rc, 0, "{name}");
        exec
    }

    pub fn launch(&self, exec: u64, s: Stream) {
        let name = if self.cuda() {
            "cuGraphLaunch"
        } else {
            "hipGraphLaunch"
        };
        let f: unsafe extern "C" fn(u64, u64) -> c_int = self.fake.sym(name);
        // SAFETY: live handles.
        assert_eq!(unsafe { f(exec, s.as_raw()) }, 0);
    }

    pub fn destroy(&self, graph: u64, exec: u64) {
        let (g, e) = if self.cuda() {
            ("cuGraphDestroy", "cuGraphExecDestroy")
        } else {
            ("hipGraphDestroy", "hipGraphExecDestroy")
        };
        let fg: unsafe extern "C" fn(u64) -> c_int = self.fake.sym(g);
        let fe: unsafe extern "C" fn(u64) -> c_int = self.fake.sym(e);
        // SAFETY: live handles, not used afterwards.
        unsafe {
            assert_eq!(fe(exec), 0);
            assert_eq!(fg(graph), 0);
        }
    }

    pub fn invalidations(&self) -> (i64, String) {
        let f: unsafe extern "C" fn(*mut i8, u64) -> i64 =
            self.fake.sym("fake_capture_invalidations");
        let mut buf = [0i8; 256];
        // SAFETY: at most 256 bytes written, NUL-terminated.
        let n = unsafe { f(buf.as_mut_ptr(), buf.len() as u64) };
        // SAFETY: NUL-terminated within the buffer.
        let why = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) };
        (n, why.to_string_lossy().into_owned())
    }
}
