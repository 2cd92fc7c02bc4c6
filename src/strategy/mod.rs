//! Strategies: each owns device memory and implements [`Allocator`], generic over
//! [`Device`]. No unsafe code here.

use std::sync::Arc;

use crate::allocator::Allocator;
use crate::config::{Config, StrategyKind};
use crate::device::Device;
use crate::error::Result;

pub mod async_pool;
pub mod bfc;
pub mod bins;
mod common;
pub mod free_index;
mod occupancy;
pub mod platform;
pub(crate) mod stream_order;
pub mod vmm;

/// Runs a release that must not be lost (in a `Drop`, where nothing can be returned) and
/// tries it once more if the device refuses: a transient refusal then leaks nothing.
pub(crate) fn release_with_retry(release: impl Fn() -> Result<()>) -> Result<()> {
    release().or_else(|_| release())
}

/// Builds the strategy `config` names over `device`.
///
/// # Errors
/// [`crate::Error::Unsupported`] for a strategy this build or device cannot serve (`async` on
/// a device without a stream-ordered pool) — never a silent fallback to another strategy.
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
        StrategyKind::Vmm => Ok(Box::new(vmm::VmmAllocator::new(
            device,
            vmm::VmmOptions::new(limit),
        )?)),
        StrategyKind::Async => Ok(Box::new(async_pool::AsyncPoolAllocator::new(
            device,
            async_pool::AsyncOptions::from_config(config, total),
        )?)),
    }
}
