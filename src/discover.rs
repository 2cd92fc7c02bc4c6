//! Device discovery (being written).

use std::sync::Arc;

use crate::allocator::Allocator;
use crate::config::Config;
use crate::device::Device;
use crate::error::Result;

/// The result of probing every compiled-in backend.
#[derive(Debug)]
pub struct Discovery {
    /// The devices of the chosen backend.
    pub devices: Vec<Arc<dyn Device>>,
}

/// Probes the backends.
pub fn discover(_config: &Config) -> Result<Discovery> {
    todo!()
}

/// Discovery, configuration and a strategy per device, in one value.
pub struct Portalloc {
    /// One allocator per device.
    pub allocators: Vec<Box<dyn Allocator>>,
}

impl Portalloc {
    /// From the environment.
    pub fn from_env() -> Result<Portalloc> {
        todo!()
    }
}
