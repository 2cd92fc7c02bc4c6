//! Adaptors: wrappers that own an upstream and add one concern, composed like RMM's
//! `statistics_` / `logging_` / `limiting_` resource adaptors.
//!
//! | adaptor | wraps | adds |
//! |---|---|---|
//! | [`CountingDevice`] | a [`crate::Device`] | counts every device call by kind (replay's "device calls" column; leak checks) |
//! | [`RecorderAllocator`] | an [`crate::Allocator`] | records its allocation trace for `portalloc replay` |

mod counting;
mod recorder;

pub use counting::{CallCounts, CountingDevice};
pub use recorder::RecorderAllocator;
