//! The sleep workloads the suite measures (`sleep_world`, `rocm_profiles`): a tag's
//! allocations — "weights" — interleaved with another tag's — "kv" — at the scales real models
//! have: large tensors, tensors of a granule and a half, and hundreds of small ones (norms,
//! biases) whose neighbours share granules unless tags are kept apart.

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;

/// One workload of the measurement.
#[derive(Debug, Clone, Copy)]
pub enum Workload {
    /// 8 × 64 MiB weights between 8 × 64 MiB kv.
    Large,
    /// 32 × 1.5 MiB weights between 32 × 1.5 MiB kv: not a multiple of the granule, so each
    /// pair would share one if placed side by side.
    Granular,
    /// 200 weights of 96–672 KiB between 200 kv of 96–672 KiB (deterministic sizes).
    Small,
}

impl Workload {
    /// `(weights size, kv size)` of each pair, in allocation order.
    pub fn pairs(self) -> Vec<(u64, u64)> {
        match self {
            Workload::Large => vec![(64 * MIB, 64 * MIB); 8],
            Workload::Granular => vec![(3 * MIB / 2, 3 * MIB / 2); 32],
            // 96 KiB + k × 32 KiB, k in 0..19, spread by two coprime strides.
            Workload::Small => (0..200u64)
                .map(|i| {
                    let size = |stride: u64| 96 * KIB + ((i * stride) % 19) * 32 * KIB;
                    (size(37), size(11))
                })
                .collect(),
        }
    }

    /// The requests `(tag, size)` in allocation order, weights tagged `weights` and kv `kv`.
    pub fn requests(self, weights: &'static str, kv: &'static str) -> Vec<(&'static str, u64)> {
        self.pairs()
            .into_iter()
            .flat_map(|(w, k)| [(weights, w), (kv, k)])
            .collect()
    }
}
