//! Strategies: each owns device memory and implements [`Allocator`], generic over
//! [`Device`]. No unsafe code here.

use std::sync::Arc;

use crate::allocator::Allocator;
use crate::config::{Config, StrategyKind};
use crate::device::Device;
use crate::error::{Error, Result};

pub mod bfc;
pub mod platform;

/// Builds the strategy `config` names over `device`.
///
/// # Errors
/// [`Error::Unsupported`] for a strategy this build or device cannot serve — never a silent
/// fallback to another strategy.
pub fn build(config: &Config, device: Arc<dyn Device>) -> Result<Box<dyn Allocator>> {
    let total = device.info().total_bytes;
    let limit = config.limit(total);
    match config.strategy.value {
        StrategyKind::Bfc => Ok(Box::new(bfc::BfcAllocator::new(
            device,
            bfc::BfcOptions {
                limit,
                preallocate: config.preallocate.value,
            },
        )?)),
        StrategyKind::Platform => Ok(Box::new(platform::PlatformAllocator::new(
            device,
            Some(limit),
        ))),
        other => Err(Error::Unsupported {
            what: format!("strategy `{}`", other.name()),
            backend: device.info().vendor.name(),
            reason: "this strategy is not built yet; use bfc or platform".into(),
        }),
    }
}
