//! Built-in workloads: allocation sequences generated from a model's shapes, so a fresh clone
//! with no trace files can still run a replay.
//!
//! One workload today, `transformer-train` ([`TransformerTrain`]): the allocations of a
//! GPT-2-style decoder trained in PyTorch eager mode, step by step, as the CUDA caching
//! allocator would be asked for them.
//!
//! # How the sequence was derived
//!
//! The reference program is nanoGPT's `GPT` (`model.py`, the canonical PyTorch re-implementation
//! of GPT-2) in training mode with `dropout = 0.0` (its pre-training default; PyTorch's
//! dropout with `p = 0` returns its input and allocates nothing), the *manual* attention path
//! (`q @ kᵀ`, scale, causal `masked_fill`, softmax, `@ v`: what runs without a fused
//! scaled-dot-product kernel), `nn.GELU`, biases everywhere, and the language-model head tied to
//! the token embedding (`lm_head.weight is wte.weight`, so it is one parameter). The optimizer
//! is `torch.optim.AdamW` (default `foreach` implementation) or plain SGD, and the loop is
//!
//! ```text
//! for step in 0..steps:
//!     X, Y = batch()                       # two int64 [batch, seq] tensors
//!     logits, loss = model(X, Y)           # forward
//!     loss.backward()
//!     optimizer.step()
//!     optimizer.zero_grad(set_to_none=True)
//! ```
//!
//! Every tensor that op produces is one allocation, and it is freed when its last reference
//! goes, following autograd's rules:
//!
//! * **Parameters** (tag `parameter`) are allocated first, in `model.parameters()` order (what
//!   `model.to("cuda")` does): `wte` (vocab × hidden), `wpe` (seq × hidden; the context length
//!   is taken as `seq`), then per layer `ln_1` weight and bias, `c_attn` (hidden × 3·hidden +
//!   3·hidden), attention `c_proj` (hidden² + hidden), `ln_2`, `c_fc` (hidden × ffn + ffn),
//!   MLP `c_proj` (ffn × hidden + hidden), and last `ln_f`. They are never freed.
//! * **Forward.** An op's output is an allocation; what autograd saves for backward (tag
//!   `activation`) lives until the backward of the op that saved it, the rest (tag
//!   `temporary`) is freed as soon as nothing refers to it. Per layer, with `N = batch·seq`:
//!   the layer input (saved by `ln_1`), `ln_1`'s output and its fp32 mean and rstd (`N` each),
//!   the contiguous copies of q and kᵀ that `torch.matmul` makes of the head-split views (saved
//!   by `bmm`), the softmax output (batch × heads × seq², saved by softmax and by the second
//!   `bmm`), the causal-mask comparison (seq² bytes, saved by `masked_fill`), the copy of v, the
//!   head-merged attention output (saved by `c_proj`), the residual after attention, `ln_2`'s
//!   output, mean and rstd, the MLP pre-activation and the GELU output (`N` × ffn each). The
//!   `c_attn` output (`N` × 3·hidden) lives until the attention module returns (q, k, v are
//!   views of it); the raw and scaled scores, the masked scores, the `bmm` output before the
//!   head merge and both `c_proj` outputs before their residual add are temporaries.
//! * **Loss.** The logits (`N` × vocab) stay referenced by the caller until the end of the
//!   step; `cross_entropy` saves the log-softmax (`N` × vocab); the loss and `nll_loss`'s total
//!   weight are scalars.
//! * **Backward** runs in reverse. Each op's backward allocates the gradients of its inputs
//!   (tag `temporary`), frees the incoming gradient and the tensors it saved. The gradient of
//!   the loss w.r.t. the logits passes through three `N` × vocab buffers (`nll_loss` backward,
//!   `log_softmax` backward); attention backward allocates the score-sized gradients one after
//!   another (softmax, mask, scale), then the q/k/v gradients and their concatenation into the
//!   `c_attn` output gradient; the two gradients reaching each residual stream are summed in
//!   place (autograd's input buffer), so one of the pair is freed. Parameter gradients (tag
//!   `gradient`) are allocated as each weight's backward computes them and kept (autograd's
//!   `AccumulateGrad` steals the fresh tensor); the tied `wte` gradient is first allocated by
//!   the head's backward and completed in place by the embedding backward (whose own
//!   vocab × hidden result and index-sorting temporaries are freed at once).
//! * **Optimizer** (AdamW, `foreach`): at the first step `exp_avg` and `exp_avg_sq` (tag
//!   `optimizer`) are allocated lazily for each parameter in order, then kept; every step
//!   `_foreach_sqrt(exp_avg_sqs)` allocates one temporary per parameter, all freed when the step
//!   returns; the other updates are in place. The `step` counters live on the host. SGD
//!   (without momentum) allocates nothing.
//! * **zero_grad(set_to_none=True)** (PyTorch ≥ 2.0's default) frees every parameter gradient,
//!   so the next backward allocates them again. At the end of each step the logits, the loss
//!   and the batch are dropped: after the last step only the parameters (and Adam's state) are
//!   live.
//!
//! Sizes are elements × [`TransformerTrain::dtype_bytes`] (pure fp32 or pure bf16/fp16
//! training), except the layer-norm mean and rstd (fp32, as PyTorch keeps them for half
//! types), token ids and positions (int64) and the causal mask (bool). Sizes are exact: the
//! allocator under test does its own rounding (PyTorch's would round to 512 B).
//!
//! # What is not modelled
//!
//! * kernel workspaces (cuBLAS / cuDNN workspaces, reduction scratch of `layer_norm` and
//!   `sum` backward), and host or pinned memory;
//! * anything the caching allocator does itself: rounding, splitting, caching, `empty_cache`;
//!   the events are the *requests*;
//! * streams and threads: everything is on stream 0, thread 0, in one total order; time is a
//!   logical clock (event index × 1000 ns);
//! * mixed precision with fp32 master weights, gradient scaling, activation checkpointing,
//!   fused attention (which saves no score-sized tensors), dropout with `p > 0` (which saves a
//!   mask and an output per dropout), gradient accumulation and clipping;
//! * data loading overlap (nanoGPT prefetches the next batch during the forward).
//!
//! # Calibration
//!
//! For the shape of the eager snapshot in `../shared/traces`
//! (`pytorch-snapshot-gpt2-shape-eager.pickle`: vocab 10 000, hidden 768, 12 layers,
//! context 256, batch 32, fp32; one step), this workload peaks at 7.24 GiB live against the
//! recording's 12.97 GiB (11.69 GiB of it allocated in the window): a ratio of 0.56. The gap
//! is the model, not the method: the recorded program is a LLaMA-style decoder (RMSNorm,
//! RoPE, SwiGLU, hand-written softmax), which keeps about 913 MiB per layer for backward at
//! that shape (ten `N`×hidden tensors, five ffn-sized SwiGLU tensors, two score-sized softmax
//! tensors) where GPT-2 keeps 504 MiB (nine `N`×hidden, two `N`×ffn, one score-sized), and its
//! window starts with the previous step's gradients and logits still live. Per layer, the
//! sizes (24 MiB per `N`×hidden tensor, 96 MiB per ffn- or score-sized one) and the
//! lifetimes (saved until the layer's backward, temporaries freed within the op) are the same
//! in both. `tests/suite/workload.rs` checks the figure.

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};
use crate::trace::{push_generated, Event, Op, TagId, TraceHeader};

/// The tag table of every built-in workload, in [`TraceHeader::tags`] order: tag `k` is
/// `TAGS[k - 1]`.
pub const TAGS: [&str; 5] = [
    "parameter",
    "activation",
    "gradient",
    "optimizer",
    "temporary",
];

/// Tag of parameters.
pub const TAG_PARAMETER: TagId = 1;
/// Tag of tensors saved for backward (and of the input batch and the logits).
pub const TAG_ACTIVATION: TagId = 2;
/// Tag of parameter gradients.
pub const TAG_GRADIENT: TagId = 3;
/// Tag of optimizer state.
pub const TAG_OPTIMIZER: TagId = 4;
/// Tag of short-lived tensors: forward temporaries, activation gradients, optimizer scratch.
pub const TAG_TEMPORARY: TagId = 5;

/// Most events a built-in workload may generate (they are held in memory).
pub const MAX_EVENTS: u64 = 20_000_000;

const CALL: &str = "transformer-train workload";

/// The optimizer of [`TransformerTrain`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Optimizer {
    /// `torch.optim.AdamW` (foreach): two state tensors per parameter, allocated at the first
    /// step, plus one temporary per parameter each step.
    #[default]
    Adam,
    /// Plain SGD without momentum: no state, no temporaries.
    Sgd,
}

impl Optimizer {
    /// The name [`Optimizer::from_str`] accepts: `adam` or `sgd`.
    pub fn name(self) -> &'static str {
        match self {
            Optimizer::Adam => "adam",
            Optimizer::Sgd => "sgd",
        }
    }

    /// State tensors per parameter: 2 for Adam, 0 for SGD.
    pub fn states(self) -> u64 {
        match self {
            Optimizer::Adam => 2,
            Optimizer::Sgd => 0,
        }
    }
}

display_as_name!(Optimizer);

impl FromStr for Optimizer {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "adam" | "adamw" => Ok(Optimizer::Adam),
            "sgd" => Ok(Optimizer::Sgd),
            _ => Err(Error::config("optimizer", s, "adam (or adamw), sgd")),
        }
    }
}

/// A GPT-2-style decoder trained in PyTorch eager mode: see the [module docs](self) for the
/// derivation. [`Default`] is GPT-2 small: 12 layers, hidden 768, 12 heads, vocab 50 257,
/// batch 8, sequence 1024, fp32, Adam, 2 steps.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TransformerTrain {
    /// Decoder blocks (≥ 1).
    pub layers: u32,
    /// Model width `d` (≥ 1, a multiple of the head count).
    pub hidden: u64,
    /// Sequences per batch (≥ 1).
    pub batch: u64,
    /// Tokens per sequence (≥ 1); also the context length, so the size of `wpe`.
    pub seq: u64,
    /// Vocabulary size (≥ 1); default 50 257.
    pub vocab: u64,
    /// Attention heads; 0 (the default) means `hidden / 64`.
    pub heads: u32,
    /// MLP width as a multiple of `hidden` (≥ 1); default 4.
    pub ffn_mult: u64,
    /// Bytes per element: 4 (fp32, default), 2 (bf16/fp16), also 1 or 8.
    pub dtype_bytes: u64,
    /// Training steps (≥ 1); default 2: the first allocates gradients and optimizer state
    /// lazily, the second shows the steady state.
    pub steps: u32,
    /// The optimizer; default Adam.
    pub optimizer: Optimizer,
}

impl Default for TransformerTrain {
    fn default() -> Self {
        TransformerTrain {
            layers: 12,
            hidden: 768,
            batch: 8,
            seq: 1024,
            vocab: 50257,
            heads: 0,
            ffn_mult: 4,
            dtype_bytes: 4,
            steps: 2,
            optimizer: Optimizer::Adam,
        }
    }
}

fn invalid(reason: impl Into<String>) -> Error {
    Error::InvalidArgument {
        call: CALL,
        reason: reason.into(),
    }
}

fn mul(a: u64, b: u64, what: &str) -> Result<u64> {
    a.checked_mul(b)
        .ok_or_else(|| invalid(format!("{what} overflows 64 bits ({a} × {b})")))
}

fn add(a: u64, b: u64, what: &str) -> Result<u64> {
    a.checked_add(b)
        .ok_or_else(|| invalid(format!("{what} overflows 64 bits ({a} + {b})")))
}

/// Every size the generator needs, in bytes, computed once with checked arithmetic.
#[derive(Debug, Clone)]
struct Dims {
    layers: u32,
    /// Parameter sizes in `model.parameters()` order.
    params: Vec<u64>,
    /// `N × hidden`.
    nd: u64,
    /// `N × 3·hidden`.
    n3d: u64,
    /// `N × ffn`.
    nf: u64,
    /// `batch × heads × seq²`.
    scores: u64,
    /// `N × vocab`.
    nv: u64,
    /// `N` fp32 (layer-norm mean or rstd).
    stat: u64,
    /// `N` int64 (token ids).
    ids: u64,
    /// `seq` int64 (positions).
    pos: u64,
    /// `seq²` bool (causal mask comparison).
    mask: u64,
    /// `seq × hidden` (position embedding output).
    pos_emb: u64,
    /// `vocab × hidden` (token embedding gradient).
    wte: u64,
    /// One element (loss, total weight, loss gradient).
    scalar: u64,
}

/// Parameters per layer, and their offsets in [`Dims::params`].
const PER_LAYER: usize = 12;
const LN1_W: usize = 0;
const LN1_B: usize = 1;
const QKV_W: usize = 2;
const QKV_B: usize = 3;
const PROJ_W: usize = 4;
const PROJ_B: usize = 5;
const LN2_W: usize = 6;
const LN2_B: usize = 7;
const FC_W: usize = 8;
const FC_B: usize = 9;
const FCP_W: usize = 10;
const FCP_B: usize = 11;
/// Index of `wte` and `wpe`; layer `l`'s parameters start at `2 + 12·l`.
const WTE: usize = 0;
const WPE: usize = 1;

fn layer_param(l: u32, k: usize) -> usize {
    2 + PER_LAYER * l as usize + k
}

impl TransformerTrain {
    /// The head count in effect: [`TransformerTrain::heads`], or `hidden / 64` when it is 0.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `heads` is 0 and `hidden` is not a positive multiple of
    /// 64, or the head count does not divide `hidden`.
    pub fn effective_heads(&self) -> Result<u32> {
        let heads = if self.heads == 0 {
            if self.hidden == 0 || self.hidden % 64 != 0 {
                return Err(invalid(format!(
                    "heads = 0 means hidden / 64, but hidden = {} is not a positive multiple of 64; set heads explicitly",
                    self.hidden
                )));
            }
            u32::try_from(self.hidden / 64).map_err(|_| {
                invalid(format!(
                    "hidden / 64 = {} heads is too many",
                    self.hidden / 64
                ))
            })?
        } else {
            self.heads
        };
        if self.hidden % u64::from(heads) != 0 {
            return Err(invalid(format!(
                "hidden = {} is not divisible by heads = {heads}",
                self.hidden
            )));
        }
        Ok(heads)
    }

    /// Checks every parameter: all counts ≥ 1, `dtype_bytes` in {1, 2, 4, 8}, `hidden`
    /// divisible by the head count, no size overflowing 64 bits, and at most [`MAX_EVENTS`]
    /// events.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming the first parameter that is wrong.
    pub fn validate(&self) -> Result<()> {
        self.dims().map(|_| ())
    }

    /// Parameters of the model (elements), the tied head counted once.
    ///
    /// # Errors
    /// As [`TransformerTrain::validate`].
    pub fn parameter_count(&self) -> Result<u64> {
        let dims = self.dims()?;
        let bytes = dims
            .params
            .iter()
            .try_fold(0u64, |acc, &p| add(acc, p, "parameter bytes"))?;
        Ok(bytes / self.dtype_bytes)
    }

    /// The `source` of the generated header:
    /// `workload:transformer-train(layers=12,hidden=768,…)`.
    pub fn source(&self) -> String {
        let heads = self
            .effective_heads()
            .map_or_else(|_| self.heads.to_string(), |h| h.to_string());
        format!(
            "workload:transformer-train(layers={},hidden={},heads={},batch={},seq={},vocab={},ffn_mult={},dtype_bytes={},steps={},optimizer={})",
            self.layers,
            self.hidden,
            heads,
            self.batch,
            self.seq,
            self.vocab,
            self.ffn_mult,
            self.dtype_bytes,
            self.steps,
            self.optimizer
        )
    }

    /// The number of events [`TransformerTrain::events`] returns, computed without generating
    /// them.
    ///
    /// # Errors
    /// As [`TransformerTrain::validate`] (except the [`MAX_EVENTS`] limit).
    pub fn event_count(&self) -> Result<u64> {
        self.check_scalars()?;
        Ok(self.count_events())
    }

    fn check_scalars(&self) -> Result<()> {
        for (name, v) in [
            ("layers", u64::from(self.layers)),
            ("hidden", self.hidden),
            ("batch", self.batch),
            ("seq", self.seq),
            ("vocab", self.vocab),
            ("ffn_mult", self.ffn_mult),
            ("steps", u64::from(self.steps)),
        ] {
            if v == 0 {
                return Err(invalid(format!("{name} must be at least 1")));
            }
        }
        if !matches!(self.dtype_bytes, 1 | 2 | 4 | 8) {
            return Err(invalid(format!(
                "dtype_bytes = {} is not one of 1, 2, 4 (fp32), 8",
                self.dtype_bytes
            )));
        }
        self.effective_heads()?;
        Ok(())
    }

    /// Exact event count, in u128 arithmetic saturated to u64 (the generator's structure,
    /// counted).
    fn count_events(&self) -> u64 {
        let l = u128::from(self.layers);
        let steps = u128::from(self.steps);
        let params = 2 + PER_LAYER as u128 * l + 2;
        // Per step, allocations other than parameter gradients, all freed within the step:
        // batch and embeddings 6, per layer 23 forward and 15 backward, head and loss 7,
        // backward of the loss and ln_f 5, embedding backward 4.
        let forward = 6 + 23 * l + 7;
        let backward = 5 + 15 * l + 4;
        let opt_tmp = match self.optimizer {
            Optimizer::Adam => params,
            Optimizer::Sgd => 0,
        };
        let per_step = 2 * (forward + backward + opt_tmp) + 2 * params; // + grads alloc/free
        let state = params * u128::from(self.optimizer.states());
        let total = params + state + steps * per_step;
        u64::try_from(total).unwrap_or(u64::MAX)
    }

    fn dims(&self) -> Result<Dims> {
        self.check_scalars()?;
        let events = self.count_events();
        if events > MAX_EVENTS {
            return Err(invalid(format!(
                "{events} events (layers = {}, steps = {}) exceed the limit of {MAX_EVENTS}",
                self.layers, self.steps
            )));
        }
        let heads = u64::from(self.effective_heads()?);
        let db = self.dtype_bytes;
        let d = self.hidden;
        let ffn = mul(self.ffn_mult, d, "ffn width")?;
        let n = mul(self.batch, self.seq, "batch × seq")?;
        let el = |count: u64, what: &str| mul(count, db, what);

        let d3 = mul(3, d, "3 × hidden")?;
        let layer = [
            el(d, "ln_1 weight")?,
            el(d, "ln_1 bias")?,
            el(mul(d, d3, "c_attn weight")?, "c_attn weight")?,
            el(d3, "c_attn bias")?,
            el(
                mul(d, d, "attention c_proj weight")?,
                "attention c_proj weight",
            )?,
            el(d, "attention c_proj bias")?,
            el(d, "ln_2 weight")?,
            el(d, "ln_2 bias")?,
            el(mul(d, ffn, "c_fc weight")?, "c_fc weight")?,
            el(ffn, "c_fc bias")?,
            el(mul(ffn, d, "MLP c_proj weight")?, "MLP c_proj weight")?,
            el(d, "MLP c_proj bias")?,
        ];
        let wte = el(mul(self.vocab, d, "wte")?, "wte")?;
        let mut params = Vec::with_capacity(4 + PER_LAYER * self.layers as usize);
        params.push(wte);
        params.push(el(mul(self.seq, d, "wpe")?, "wpe")?);
        for _ in 0..self.layers {
            params.extend_from_slice(&layer);
        }
        params.push(el(d, "ln_f weight")?);
        params.push(el(d, "ln_f bias")?);

        let stat_bytes = if db >= 8 { 8 } else { 4 };
        let dims = Dims {
            layers: self.layers,
            nd: el(mul(n, d, "batch × seq × hidden")?, "activation")?,
            n3d: el(mul(n, d3, "batch × seq × 3·hidden")?, "qkv activation")?,
            nf: el(mul(n, ffn, "batch × seq × ffn")?, "MLP activation")?,
            scores: el(
                mul(
                    mul(self.batch, heads, "batch × heads")?,
                    mul(self.seq, self.seq, "seq²")?,
                    "attention scores",
                )?,
                "attention scores",
            )?,
            nv: el(mul(n, self.vocab, "batch × seq × vocab")?, "logits")?,
            stat: mul(n, stat_bytes, "layer-norm statistics")?,
            ids: mul(n, 8, "token ids")?,
            pos: mul(self.seq, 8, "positions")?,
            mask: mul(self.seq, self.seq, "causal mask")?,
            pos_emb: el(mul(self.seq, d, "seq × hidden")?, "position embedding")?,
            wte,
            scalar: db,
            params,
        };
        // The whole model must be countable in 64 bits: an upper bound of everything live at
        // once (parameters, gradients, optimizer state and scratch, every activation).
        let p_total = dims
            .params
            .iter()
            .try_fold(0u64, |acc, &p| add(acc, p, "parameter bytes"))?;
        let per_layer = [
            mul(dims.nd, 16, "layer activations")?,
            mul(dims.nf, 4, "layer activations")?,
            mul(dims.scores, 4, "layer activations")?,
            mul(dims.stat, 4, "layer activations")?,
            dims.mask,
        ]
        .iter()
        .try_fold(0u64, |acc, &b| add(acc, b, "layer activations"))?;
        let all_layers = mul(per_layer, u64::from(self.layers), "activations")?;
        [
            mul(p_total, 5, "parameters, gradients and optimizer state")?,
            mul(dims.nv, 4, "logits")?,
            mul(dims.ids, 2, "batch")?,
            mul(dims.nd, 8, "embeddings")?,
            mul(dims.wte, 2, "embedding gradient")?,
            dims.pos_emb,
            dims.pos,
        ]
        .iter()
        .try_fold(all_layers, |acc, &b| add(acc, b, "peak live bytes"))?;
        Ok(dims)
    }

    /// The header (tags [`TAGS`], source [`TransformerTrain::source`], derivation notes) and
    /// the events of `steps` training steps.
    ///
    /// The default shape gives 3,540 events; see [`TransformerTrain::event_count`].
    ///
    /// # Errors
    /// As [`TransformerTrain::validate`].
    pub fn events(&self) -> Result<(TraceHeader, Vec<Event>)> {
        let dims = self.dims()?;
        let mut header = TraceHeader::new(self.source());
        header.tags = TAGS.iter().map(|t| (*t).to_string()).collect();
        header.notes = vec![
            "generated by portalloc: the allocation requests of a GPT-2-style decoder (nanoGPT, eager PyTorch, manual attention, dropout 0, tied head) trained with the given shapes".to_string(),
            format!(
                "loop: batch, forward, loss, backward, {} step, zero_grad(set_to_none=True); parameters first, gradients allocated by each backward, optimizer state at the first step",
                self.optimizer
            ),
            "not modelled: kernel workspaces (cuBLAS, reductions), caching-allocator rounding, multiple streams; time is a logical clock".to_string(),
        ];
        let capacity = usize::try_from(self.count_events()).unwrap_or(0);
        let mut g = Gen {
            events: Vec::with_capacity(capacity),
            next_id: 0,
        };
        let params: Vec<Buf> = dims
            .params
            .iter()
            .map(|&p| g.alloc(p, TAG_PARAMETER))
            .collect();
        let mut state: Vec<Buf> = Vec::new();
        for _ in 0..self.steps {
            header.step_starts.push(g.events.len() as u64);
            self.step(&mut g, &dims, &mut state);
        }
        // Parameters and optimizer state stay live past the end of the trace, as in the
        // program: nothing frees them.
        drop(params);
        drop(state);
        Ok((header, g.events))
    }

    fn step(&self, g: &mut Gen, dims: &Dims, state: &mut Vec<Buf>) {
        let x_ids = g.alloc(dims.ids, TAG_ACTIVATION);
        let y_ids = g.alloc(dims.ids, TAG_ACTIVATION);

        // ---- forward ----
        let pos = g.alloc(dims.pos, TAG_ACTIVATION); // saved by wpe's embedding
        let tok_emb = g.alloc(dims.nd, TAG_TEMPORARY);
        let pos_emb = g.alloc(dims.pos_emb, TAG_TEMPORARY);
        let mut x = g.op(dims.nd, TAG_ACTIVATION, [tok_emb, pos_emb]);
        let mut saved = Vec::with_capacity(dims.layers as usize);
        for _ in 0..dims.layers {
            let (layer, out) = forward_layer(g, dims, x);
            saved.push(layer);
            x = out;
        }
        let lnf = g.layer_norm(dims);
        let logits = g.alloc(dims.nv, TAG_ACTIVATION);
        let logp = g.alloc(dims.nv, TAG_ACTIVATION);
        let loss = g.alloc(dims.scalar, TAG_ACTIVATION);
        let total_weight = g.alloc(dims.scalar, TAG_ACTIVATION);

        // ---- backward ----
        let mut grads: Vec<Option<Buf>> = Vec::with_capacity(dims.params.len());
        grads.resize_with(dims.params.len(), || None);
        let grad_loss = g.alloc(dims.scalar, TAG_TEMPORARY);
        let grad_logp = g.op(dims.nv, TAG_TEMPORARY, [grad_loss, total_weight]);
        let grad_logits = g.op(dims.nv, TAG_TEMPORARY, [grad_logp, logp]);
        let grad_lnf_out = g.alloc(dims.nd, TAG_TEMPORARY);
        // The tied weight's gradient: the head's part, held until the embedding's is added.
        grads[WTE] = Some(g.alloc(dims.wte, TAG_GRADIENT));
        g.free_all([grad_logits, lnf.out]);
        let mut grad = g.alloc(dims.nd, TAG_TEMPORARY);
        let lnf_w = dims.params.len() - 2;
        grads[lnf_w] = Some(g.alloc(dims.params[lnf_w], TAG_GRADIENT));
        grads[lnf_w + 1] = Some(g.alloc(dims.params[lnf_w + 1], TAG_GRADIENT));
        g.free_all([grad_lnf_out, lnf.mean, lnf.rstd, x]);
        for (l, layer) in (0..dims.layers).zip(saved).rev() {
            grad = backward_layer(g, dims, l, layer, grad, &mut grads);
        }
        // Embeddings: x = wte[X] + wpe[pos] (broadcast over the batch).
        let grad_pos_emb = g.alloc(dims.pos_emb, TAG_TEMPORARY);
        grads[WPE] = Some(g.alloc(dims.params[WPE], TAG_GRADIENT));
        g.free_all([grad_pos_emb, pos]);
        let sorted = g.alloc(dims.ids, TAG_TEMPORARY);
        let order = g.alloc(dims.ids, TAG_TEMPORARY);
        let wte_part = g.alloc(dims.wte, TAG_TEMPORARY);
        // wte_part is added in place into the head's part.
        g.free_all([sorted, order, grad, wte_part]);

        // ---- optimizer ----
        if self.optimizer == Optimizer::Adam {
            if state.is_empty() {
                for &p in &dims.params {
                    state.push(g.alloc(p, TAG_OPTIMIZER));
                    state.push(g.alloc(p, TAG_OPTIMIZER));
                }
            }
            let sqrt: Vec<Buf> = dims
                .params
                .iter()
                .map(|&p| g.alloc(p, TAG_TEMPORARY))
                .collect();
            g.free_all(sqrt);
        }
        // zero_grad(set_to_none=True)
        g.free_all(grads.into_iter().flatten());
        g.free_all([logits, loss, x_ids, y_ids]);
    }
}

/// What one decoder block keeps for its backward.
struct SavedLayer {
    x_in: Buf,
    ln1: LayerNorm,
    q: Buf,
    k: Buf,
    mask: Buf,
    att: Buf,
    v: Buf,
    y: Buf,
    x_mid: Buf,
    ln2: LayerNorm,
    fc: Buf,
    gelu: Buf,
}

/// What a layer norm saves for its backward.
struct LayerNorm {
    out: Buf,
    mean: Buf,
    rstd: Buf,
}

/// One block forward on input `x_in`: returns what it saved and its output.
fn forward_layer(g: &mut Gen, dims: &Dims, x_in: Buf) -> (SavedLayer, Buf) {
    let ln1 = g.layer_norm(dims);
    let qkv = g.alloc(dims.n3d, TAG_TEMPORARY);
    // att = (q @ k^T) * scale: matmul copies the head-split views; bmm saves the copies.
    let q = g.alloc(dims.nd, TAG_ACTIVATION);
    let k = g.alloc(dims.nd, TAG_ACTIVATION);
    let scores = g.alloc(dims.scores, TAG_TEMPORARY);
    let scaled = g.op(dims.scores, TAG_TEMPORARY, [scores]);
    // masked_fill(bias[:, :, :T, :T] == 0, -inf): the comparison is saved.
    let mask = g.alloc(dims.mask, TAG_ACTIVATION);
    let masked = g.op(dims.scores, TAG_TEMPORARY, [scaled]);
    let att = g.op(dims.scores, TAG_ACTIVATION, [masked]);
    // y = att @ v; y.transpose(1, 2).contiguous()
    let v = g.alloc(dims.nd, TAG_ACTIVATION);
    let y_heads = g.alloc(dims.nd, TAG_TEMPORARY);
    let y = g.op(dims.nd, TAG_ACTIVATION, [y_heads]);
    // The attention module returns: the q, k, v views go.
    let proj = g.op(dims.nd, TAG_TEMPORARY, [qkv]);
    let x_mid = g.op(dims.nd, TAG_ACTIVATION, [proj]);
    let ln2 = g.layer_norm(dims);
    let fc = g.alloc(dims.nf, TAG_ACTIVATION);
    let gelu = g.alloc(dims.nf, TAG_ACTIVATION);
    let fc_proj = g.alloc(dims.nd, TAG_TEMPORARY);
    let x_out = g.op(dims.nd, TAG_ACTIVATION, [fc_proj]);
    (
        SavedLayer {
            x_in,
            ln1,
            q,
            k,
            mask,
            att,
            v,
            y,
            x_mid,
            ln2,
            fc,
            gelu,
        },
        x_out,
    )
}

/// One block backward, given the gradient of its output: frees what the block saved and
/// returns the gradient of its input.
fn backward_layer(
    g: &mut Gen,
    dims: &Dims,
    l: u32,
    s: SavedLayer,
    grad_out: Buf,
    grads: &mut [Option<Buf>],
) -> Buf {
    let mut b = Backward { dims, l, grads };
    // MLP: x_out = x_mid + c_proj(gelu(c_fc(ln_2(x_mid)))); the add passes grad_out on.
    let grad_gelu = b.step(g, dims.nf, &[FCP_W, FCP_B], [s.gelu]);
    let grad_fc = b.step(g, dims.nf, &[], [grad_gelu, s.fc]);
    let grad_ln2_out = b.step(g, dims.nd, &[FC_W, FC_B], [grad_fc, s.ln2.out]);
    // grad_out is summed in place into grad_x_mid.
    let dead = [grad_ln2_out, s.ln2.mean, s.ln2.rstd, s.x_mid, grad_out];
    let grad = b.step(g, dims.nd, &[LN2_W, LN2_B], dead);

    // Attention: x_mid = x_in + c_proj(attn(ln_1(x_in))).
    let grad_y = b.step(g, dims.nd, &[PROJ_W, PROJ_B], [s.y]);
    let grad_att = b.step(g, dims.scores, &[], []);
    let grad_v = b.step(g, dims.nd, &[], [grad_y, s.v]);
    let grad_masked = b.step(g, dims.scores, &[], [grad_att, s.att]);
    let grad_scaled = b.step(g, dims.scores, &[], [grad_masked, s.mask]);
    let grad_scores = b.step(g, dims.scores, &[], [grad_scaled]);
    let grad_q = b.step(g, dims.nd, &[], []);
    let grad_k = b.step(g, dims.nd, &[], [grad_scores, s.q, s.k]);
    let grad_qkv = b.step(g, dims.n3d, &[], [grad_q, grad_k, grad_v]);
    let grad_ln1_out = b.step(g, dims.nd, &[QKV_W, QKV_B], [grad_qkv, s.ln1.out]);
    // grad is summed in place into grad_x_in.
    let dead = [grad_ln1_out, s.ln1.mean, s.ln1.rstd, s.x_in, grad];
    b.step(g, dims.nd, &[LN1_W, LN1_B], dead)
}

/// Layer `l`'s backward, step by step.
struct Backward<'a> {
    dims: &'a Dims,
    l: u32,
    /// Every parameter's gradient, by parameter index.
    grads: &'a mut [Option<Buf>],
}

impl Backward<'_> {
    /// One step: allocates a gradient of `size` bytes; then the gradients of `params`, the
    /// parameters of the step's module (by index in the layer); then frees `dead`, which no
    /// later step reads.
    fn step<const N: usize>(
        &mut self,
        g: &mut Gen,
        size: u64,
        params: &[usize],
        dead: [Buf; N],
    ) -> Buf {
        let grad = g.alloc(size, TAG_TEMPORARY);
        for &k in params {
            let i = layer_param(self.l, k);
            self.grads[i] = Some(g.alloc(self.dims.params[i], TAG_GRADIENT));
        }
        g.free_all(dead);
        grad
    }
}

/// A live allocation of the generator. Not `Clone`: freeing consumes it, so the generator
/// cannot free anything twice.
struct Buf {
    id: u64,
    size: u64,
    tag: TagId,
}

struct Gen {
    events: Vec<Event>,
    next_id: u64,
}

impl Gen {
    /// Appends an event, a microsecond after the one before.
    fn push(&mut self, op: Op, id: u64, size: u64, tag: TagId) {
        let time_ns = (self.events.len() as u64).saturating_mul(1000);
        push_generated(&mut self.events, time_ns, op, id, size, tag);
    }

    fn alloc(&mut self, size: u64, tag: TagId) -> Buf {
        let id = self.next_id;
        self.next_id += 1;
        self.push(Op::Alloc, id, size, tag);
        Buf { id, size, tag }
    }

    fn free(&mut self, b: Buf) {
        self.push(Op::Free, b.id, b.size, b.tag);
    }

    /// A layer norm forward: its output, and the mean and reciprocal deviation it saves.
    fn layer_norm(&mut self, dims: &Dims) -> LayerNorm {
        LayerNorm {
            out: self.alloc(dims.nd, TAG_ACTIVATION),
            mean: self.alloc(dims.stat, TAG_ACTIVATION),
            rstd: self.alloc(dims.stat, TAG_ACTIVATION),
        }
    }

    fn free_all(&mut self, bufs: impl IntoIterator<Item = Buf>) {
        for b in bufs {
            self.free(b);
        }
    }

    /// One operation: allocates its output, then frees `dead`, the inputs no later
    /// operation reads.
    fn op<const N: usize>(&mut self, size: u64, tag: TagId, dead: [Buf; N]) -> Buf {
        let out = self.alloc(size, tag);
        self.free_all(dead);
        out
    }
}

/// A built-in workload, by name.
///
/// ```
/// use portalloc::replay::workload::{TransformerTrain, Workload};
/// use portalloc::trace::Op;
///
/// // A two-layer GPT-2-style model, small enough to generate in a blink.
/// let tiny = TransformerTrain {
///     layers: 2,
///     hidden: 128,
///     batch: 2,
///     seq: 64,
///     vocab: 1000,
///     ..TransformerTrain::default()
/// };
/// // Token and position embeddings, 12·h² + 13·h per block, the final layer norm.
/// let (h, per_block) = (128, 12 * 128 * 128 + 13 * 128);
/// assert_eq!(tiny.parameter_count()?, 1000 * h + 64 * h + 2 * per_block + 2 * h);
///
/// let workload: Workload = "transformer-train".parse()?;
/// assert_eq!(workload.name(), "transformer-train");
/// let (header, events) = Workload::TransformerTrain(tiny.clone()).events()?;
/// assert_eq!(events.len() as u64, tiny.event_count()?);
/// assert_eq!(header.source, tiny.source());
/// // Live after the last step: the fp32 parameters and Adam's two states for each; the
/// // gradients went with `zero_grad(set_to_none=True)`, the activations with backward.
/// let (allocated, freed) = events.iter().fold((0, 0), |(a, f), e| match e.op {
///     Op::Alloc => (a + e.size, f),
///     Op::Free => (a, f + e.size),
/// });
/// assert_eq!(allocated - freed, 3 * tiny.parameter_count()? * 4);
/// # Ok::<(), portalloc::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Workload {
    /// `transformer-train`: see [`TransformerTrain`].
    TransformerTrain(TransformerTrain),
}

impl Workload {
    /// The names [`Workload::from_name`] accepts.
    pub fn names() -> &'static [&'static str] {
        &["transformer-train"]
    }

    /// The workload called `name`, with its default parameters.
    ///
    /// # Errors
    /// [`Error::Config`] for an unknown name, listing the accepted ones.
    pub fn from_name(name: &str) -> Result<Workload> {
        match name.trim().to_ascii_lowercase().as_str() {
            "transformer-train" => Ok(Workload::TransformerTrain(TransformerTrain::default())),
            _ => Err(Error::config(
                "workload",
                name,
                format!("one of: {}", Workload::names().join(", ")),
            )),
        }
    }

    /// The workload's name, as [`Workload::from_name`] accepts it.
    pub fn name(&self) -> &'static str {
        match self {
            Workload::TransformerTrain(_) => "transformer-train",
        }
    }

    /// Checks the parameters.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming what is wrong.
    pub fn validate(&self) -> Result<()> {
        match self {
            Workload::TransformerTrain(w) => w.validate(),
        }
    }

    /// The header and the events of the workload.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for parameters that do not make a workload.
    pub fn events(&self) -> Result<(TraceHeader, Vec<Event>)> {
        match self {
            Workload::TransformerTrain(w) => w.events(),
        }
    }
}

impl FromStr for Workload {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        Workload::from_name(s)
    }
}

impl fmt::Display for Workload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Workload::TransformerTrain(w) => f.write_str(&w.source()),
        }
    }
}
