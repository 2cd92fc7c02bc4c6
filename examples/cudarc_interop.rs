//! A portalloc allocation used by cudarc: copy a buffer to the GPU into memory that
//! portalloc's allocator handed out, read it back with cudarc, and hand it back to portalloc.
//!
//! ```text
//! cargo run --example cudarc_interop --features cudarc
//! XLA_PYTHON_CLIENT_ALLOCATOR=platform cargo run --example cudarc_interop --features cudarc
//! ```
//!
//! On a machine without an NVIDIA GPU it says so and exits: discovery is checked before
//! cudarc is touched, since cudarc's own loader panics when there is no driver.

use portalloc::backends::cuda::cudarc::{stream_of, PortallocSlice};
use portalloc::{Portalloc, Vendor};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let portalloc = Portalloc::from_env()?;
    if portalloc.discovery.chosen != Vendor::Cuda {
        let why = portalloc
            .discovery
            .candidates
            .iter()
            .find(|c| c.backend == Vendor::Cuda)
            .map(|c| format!("{:?}", c.decision))
            .unwrap_or_default();
        println!("no CUDA device, nothing to show ({why})");
        return Ok(());
    }
    let allocator = portalloc.allocator(0).ok_or("no allocator for device 0")?;
    println!(
        "device 0: {} with the {} strategy",
        portalloc.discovery.devices[0].info().name,
        allocator.name()
    );

    // cudarc's context is the device's primary context, the one portalloc uses too; its
    // streams are cudarc's own (cuStreamCreate inside cudarc) and portalloc takes them as
    // they are.
    let ctx = cudarc::driver::CudaContext::new(0)?;
    let stream = ctx.new_stream()?;
    // SAFETY: the handle is only printed, while `stream` lives.
    let handle = unsafe { stream_of(&stream) };
    println!(
        "cudarc stream {:?} is portalloc {handle:?}",
        stream.cu_stream()
    );

    // An owned slice: no borrow of the allocator, so it can live in a struct.
    struct Layer {
        weights: PortallocSlice<f32>,
    }
    let n = 1 << 20;
    let host: Vec<f32> = (0..n).map(|i| i as f32 * 0.5).collect();
    let mut layer = Layer {
        weights: PortallocSlice::alloc(&allocator, n, &stream)?,
    };
    println!(
        "portalloc gave {} bytes at {:#x}",
        layer.weights.buffer().size(),
        layer.weights.buffer().ptr()
    );
    stream.memcpy_htod(&host, layer.weights.as_slice_mut())?;
    let back = stream.clone_dtoh(layer.weights.as_slice())?;
    assert_eq!(
        back, host,
        "the round trip through portalloc's memory changed the data"
    );
    println!("round trip of {n} f32 through portalloc memory: ok");

    // Either free it now, getting the allocator's answer...
    layer.weights.free()?;
    // ...or let a slice go: dropping it frees the memory on its stream, once.
    let again = PortallocSlice::<u8>::alloc(&allocator, 4096, &stream)?;
    drop(again);
    stream.synchronize()?;
    let stats = allocator.stats();
    println!(
        "after: {} bytes in use, {} allocations served, peak {} bytes",
        stats.bytes_in_use, stats.num_allocs, stats.peak_bytes_in_use
    );
    Ok(())
}
