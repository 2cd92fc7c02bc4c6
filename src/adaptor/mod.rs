//! Adaptors: wrappers that own an upstream and add one concern, composed like RMM's
//! `statistics_` / `logging_` / `limiting_` resource adaptors.
//!
//! | adaptor | wraps | adds |
//! |---|---|---|
//! | [`DeviceWrapper`] | a [`crate::Device`] | nothing by itself: the forwarding every device adaptor shares; its hooks see, fail or hide calls |
//! | [`CountingDevice`] | a [`crate::Device`] | counts every device call by kind (replay's "device calls" column; leak checks) |
//! | [`GraphPools`] | a [`crate::Allocator`] | graph pools: memory handed out while a stream is captured into a graph stays the graph's until released; captured requests reach the strategy on a side stream, in the relaxed capture mode; frees of eager memory on a captured stream held until its capture ends |
//! | [`LedgerAllocator`] | a [`crate::Allocator`] | every live allocation (size, rounded size, stream, tag, age, optional backtrace), totals and peaks per tag, JSON snapshots, donation, and a [diagnosis](crate::diagnose) on every out-of-memory error |
//! | `RecorderAllocator` (feature `trace`) | an [`crate::Allocator`] | records its allocation trace for `portalloc replay` |

mod call_log;
mod counting;
mod forward;
mod graph_pools;
mod ledger;
#[cfg(feature = "trace")]
mod recorder;

pub use call_log::{CallLog, LoggedCall};
pub use counting::{CallCounts, CallTally, CountingDevice};
pub use forward::{Call, Capability, DeviceWrapper};
pub use graph_pools::{
    Detect, GraphPoolHooks, GraphPoolId, GraphPoolStats, GraphPools, RangesHook,
};
pub use ledger::{
    LedgerAllocator, LedgerOptions, LedgerSnapshot, LiveAllocation, PoolStats, TagTotals,
    BACKTRACE_VARIABLE, SNAPSHOT_VERSION,
};
#[cfg(feature = "trace")]
pub use recorder::RecorderAllocator;
