//! A small pool of idle events, shared by the strategies that keep stream-ordered frees
//! pending (bfc, vmm): creating an event per free would cost a driver call each time.
#![deny(unsafe_code)]

use crate::device::{Device, Event};
use crate::error::Result;

/// At most this many idle events are kept for reuse by stream-ordered frees.
pub const EVENT_POOL: usize = 64;

/// Events not recorded on anything now. Invariant: at most [`EVENT_POOL`] of them.
#[derive(Debug, Default)]
pub(crate) struct IdleEvents {
    idle: Vec<Event>,
}

impl IdleEvents {
    /// An idle event, or a new one from `device`.
    pub(crate) fn take<D: Device + ?Sized>(&mut self, device: &D) -> Result<Event> {
        match self.idle.pop() {
            Some(e) => Ok(e),
            None => device.create_event(),
        }
    }

    /// Keeps `event` for reuse, or destroys it when the pool is full.
    pub(crate) fn give<D: Device + ?Sized>(&mut self, device: &D, event: Event) {
        if self.idle.len() < EVENT_POOL {
            self.idle.push(event);
        } else if let Err(e) = device.destroy_event(event) {
            tracing::debug!(event = event.0, error = %e, "could not destroy an event");
        }
    }

    /// The idle events.
    pub(crate) fn iter(&self) -> impl Iterator<Item = Event> + '_ {
        self.idle.iter().copied()
    }

    /// How many are idle.
    pub(crate) fn len(&self) -> usize {
        self.idle.len()
    }
}
