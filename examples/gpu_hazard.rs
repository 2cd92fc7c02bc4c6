//! What only a GPU can show: a stream still writing into memory that was freed on it, while
//! another stream is handed that memory. Run by `scripts/gpu-check` for every strategy
//! (`XLA_PYTHON_CLIENT_ALLOCATOR`), on a machine with an NVIDIA GPU:
//!
//! ```text
//! XLA_PYTHON_CLIENT_ALLOCATOR=vmm cargo run --release --example gpu_hazard --features cudarc
//! ```
//!
//! Each trial queues on stream `S` many zero-fills of a 256 MiB buffer `x` (tens of
//! milliseconds of GPU work), frees `x` on `S` while that work still runs, allocates `y` of the
//! same size on stream `T`, and copies 2s into `y` on `T`. If `T` was handed `x`'s memory with
//! nothing ordering `T` after `S`'s work — no completed event, no GPU-side wait — `S`'s late
//! zeros land in `y`. The zeros found in `y` are counted; any is a failure (exit status 1).
//! Without an NVIDIA GPU it says so and exits 0.

use portalloc::backends::cuda::cudarc::PortallocSlice;
use portalloc::{Portalloc, Vendor};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let portalloc = Portalloc::from_env()?;
    if portalloc.discovery.chosen != Vendor::Cuda {
        println!("no CUDA device: nothing to check");
        return Ok(());
    }
    let allocator = portalloc.allocator(0).ok_or("no allocator for device 0")?;
    let strategy = allocator.name().to_string();
    let ctx = cudarc::driver::CudaContext::new(0)?;
    let (s, t) = (ctx.new_stream()?, ctx.new_stream()?);
    const N: usize = 256 << 20;
    const FILLS: usize = 200;
    let twos = vec![2u8; N];
    let (mut bad, mut reused) = (0, 0);
    for trial in 0..10 {
        let mut x = PortallocSlice::<u8>::alloc(&allocator, N, &s)?;
        for _ in 0..FILLS {
            s.memset_zeros(x.as_slice_mut())?;
        }
        let x_ptr = x.buffer().ptr();
        // Freed on S while S's fills still run.
        x.free()?;
        let mut y = PortallocSlice::<u8>::alloc(&allocator, N, &t)?;
        let same = y.buffer().ptr() == x_ptr;
        t.memcpy_htod(&twos, y.as_slice_mut())?;
        s.synchronize()?;
        t.synchronize()?;
        let back = t.clone_dtoh(y.as_slice())?;
        let wrong = back.iter().filter(|&&b| b != 2).count();
        reused += usize::from(same);
        bad += usize::from(wrong > 0);
        if trial < 2 || wrong > 0 {
            println!(
                "{strategy}: trial {trial}: y {} x's address; {wrong} bytes overwritten by S's \
                 late work",
                if same { "reuses" } else { "does not reuse" }
            );
        }
        y.free()?;
    }
    ctx.synchronize()?;
    println!(
        "{strategy}: S's late writes reached T's buffer in {bad} of 10 trials (x's memory \
         reused by T in {reused}) — {}",
        if bad == 0 { "ok" } else { "FAIL" }
    );
    if bad > 0 {
        std::process::exit(1);
    }
    Ok(())
}
