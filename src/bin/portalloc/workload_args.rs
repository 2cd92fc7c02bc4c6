//! Shape options of the built-in workloads (`--layers`, `--hidden`, …).

use clap::Args;
use portalloc::replay::workload::{TransformerTrain, Workload};
use portalloc::Result;

/// The model shape of `--workload transformer-train`; unset options keep the defaults
/// (GPT-2 small: 12 layers, hidden 768, batch 8, sequence 1024, vocabulary 50257, fp32).
#[derive(Args, Debug, Default, Clone)]
pub struct ShapeArgs {
    /// Transformer layers.
    #[arg(long)]
    pub layers: Option<u32>,
    /// Hidden size (model width).
    #[arg(long)]
    pub hidden: Option<u64>,
    /// Batch size.
    #[arg(long)]
    pub batch: Option<u64>,
    /// Sequence length.
    #[arg(long)]
    pub seq: Option<u64>,
    /// Vocabulary size.
    #[arg(long)]
    pub vocab: Option<u64>,
    /// Attention heads (0 or unset: hidden / 64).
    #[arg(long)]
    pub heads: Option<u32>,
    /// Bytes per element (4 = fp32, 2 = bf16).
    #[arg(long)]
    pub dtype_bytes: Option<u64>,
    /// Training steps; of an XLA dump directory, executions to replay (default 1), each
    /// one's outputs the next one's arguments.
    #[arg(long)]
    pub steps: Option<u32>,
}

impl ShapeArgs {
    /// Applies the options given to a workload.
    pub fn apply(&self, workload: Workload) -> Result<Workload> {
        match workload {
            Workload::TransformerTrain(t) => {
                let t = TransformerTrain {
                    layers: self.layers.unwrap_or(t.layers),
                    hidden: self.hidden.unwrap_or(t.hidden),
                    batch: self.batch.unwrap_or(t.batch),
                    seq: self.seq.unwrap_or(t.seq),
                    vocab: self.vocab.unwrap_or(t.vocab),
                    heads: self.heads.unwrap_or(t.heads),
                    dtype_bytes: self.dtype_bytes.unwrap_or(t.dtype_bytes),
                    steps: self.steps.unwrap_or(t.steps),
                    ..t
                };
                t.validate()?;
                Ok(Workload::TransformerTrain(t))
            }
        }
    }
}
