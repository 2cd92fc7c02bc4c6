//! Adaptors: wrappers that own an upstream and add one concern, composed like RMM's
//! `statistics_` / `logging_` / `limiting_` resource adaptors.
//!
//! | adaptor | wraps | adds |
//! |---|---|---|
//! | [`CountingDevice`] | a [`crate::Device`] | counts every device call by kind (replay's "device calls" column; leak checks) |

mod counting;

pub use counting::{CallCounts, CountingDevice};
