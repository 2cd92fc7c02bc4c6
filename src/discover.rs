//! Device discovery: probe every compiled-in backend, pick one, and explain each choice.
//!
//! Order: `cuda`, then `hip`, then the host, which is always there. `PORTALLOC_BACKEND`
//! (or the builder) forces one: the others are skipped, and a forced backend that cannot
//! serve is an error, never a silent fallback.

use std::sync::Arc;

use serde::Serialize;

use crate::allocator::Allocator;
use crate::backends::host::HostDevice;
use crate::backends::Probe;
use crate::config::Config;
use crate::device::{Device, Vendor};
use crate::error::{Error, Result};

/// What discovery decided about one backend.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "decision", content = "reason", rename_all = "snake_case")]
pub enum Decision {
    /// This backend serves the devices.
    Chosen,
    /// Probed and usable, but an earlier backend was chosen.
    Passed(String),
    /// Probed and not usable (no library, no device, or no device implementation yet).
    Unusable(String),
    /// Not probed, because another backend was forced.
    Skipped(String),
    /// Not in this build (its cargo feature is off).
    NotCompiled,
}

/// One backend's probe and the decision made about it.
#[derive(Debug, Clone, Serialize)]
pub struct Candidate {
    /// The backend.
    pub backend: Vendor,
    /// What probing found (`None` when not probed).
    pub probe: Option<Probe>,
    /// The decision.
    pub decision: Decision,
}

/// The result of probing every compiled-in backend.
#[derive(Debug, Clone)]
pub struct Discovery {
    /// Every backend, in probing order, with what was found and decided.
    pub candidates: Vec<Candidate>,
    /// The backend chosen.
    pub chosen: Vendor,
    /// The devices of the chosen backend that were opened, in ordinal order (every one for
    /// [`discover`]; the one asked for by [`discover_device`]).
    pub devices: Vec<Arc<dyn Device>>,
}

/// Probes the backends and opens the devices of the one chosen.
///
/// # Errors
/// [`Error::NoDevice`] when the backend `config` forces cannot serve (its probe's reason is
/// in the message); [`Error::Unsupported`] when it is not compiled in; errors from opening the
/// host device (an invalid capacity).
pub fn discover(config: &Config) -> Result<Discovery> {
    discover_some(config, None)
}

/// [`discover`], opening only device `ordinal` of the backend chosen: what an allocator of
/// one device needs (the C ABI's `portalloc_global(n)`, the framework hooks,
/// [`Portalloc::for_device`]). The probes open no device; no other device's context is
/// retained and no other device's pool made.
///
/// # Errors
/// As [`discover`]; [`Error::InvalidArgument`] naming the ordinal and the device count
/// when the backend has no such device.
pub fn discover_device(config: &Config, ordinal: u32) -> Result<Discovery> {
    discover_some(config, Some(ordinal))
}

fn discover_some(config: &Config, only: Option<u32>) -> Result<Discovery> {
    let forced = config.backend.value;
    let forced_by = format!(
        "{} forces {}",
        config_source_name(config),
        forced.map(Vendor::name).unwrap_or("auto")
    );
    let mut candidates = Vec::new();
    let mut chosen: Option<Vendor> = None;
    // The devices of the vendor backend chosen (CUDA or HIP), when one is.
    let mut vendor_devices: Vec<Arc<dyn Device>> = Vec::new();

    for vendor in [Vendor::Cuda, Vendor::Hip] {
        if !compiled(vendor) {
            if forced == Some(vendor) {
                return Err(Error::Unsupported {
                    what: format!("backend `{vendor}`"),
                    backend: vendor.name(),
                    reason: format!("this build lacks the `{vendor}` cargo feature; rebuild with --features {vendor}"),
                });
            }
            candidates.push(Candidate {
                backend: vendor,
                probe: None,
                decision: Decision::NotCompiled,
            });
            continue;
        }
        if forced.is_some() && forced != Some(vendor) {
            candidates.push(Candidate {
                backend: vendor,
                probe: None,
                decision: Decision::Skipped(forced_by.clone()),
            });
            continue;
        }
        let probe = probe_vendor(vendor, config);
        let decision = if probe.device_count == 0 {
            let why = probe.error.clone().unwrap_or_else(|| "no devices".into());
            if forced == Some(vendor) {
                return Err(Error::NoDevice(format!("{forced_by}, but {vendor}: {why}")));
            }
            Decision::Unusable(why)
        } else if let Some(earlier) = chosen {
            Decision::Passed(format!("{earlier} was chosen first"))
        } else if let Some(ordinal) = only.filter(|&o| o >= probe.device_count) {
            return Err(no_such_device(vendor, ordinal, probe.device_count));
        } else if let Some(opened) = open_vendor(vendor, config, only) {
            match opened {
                Ok(devices) => {
                    chosen = Some(vendor);
                    vendor_devices = devices;
                    Decision::Chosen
                }
                Err(e) => {
                    if forced == Some(vendor) {
                        return Err(Error::NoDevice(format!(
                            "{forced_by}, but its devices could not be opened: {e}"
                        )));
                    }
                    Decision::Unusable(format!(
                        "found {} device(s), but opening them failed: {e}",
                        probe.device_count
                    ))
                }
            }
        } else {
            // The vendor shims' `Device` implementations (allocation, VMM, pools) are built
            // on the probe layer in their own change; until then the host stands in, and
            // says so, rather than pretending to allocate on the GPU.
            let why = format!(
                "found {} device(s), but this build has no {vendor} Device implementation yet",
                probe.device_count
            );
            if forced == Some(vendor) {
                return Err(Error::NoDevice(format!("{forced_by}, but {why}")));
            }
            Decision::Unusable(why)
        };
        candidates.push(Candidate {
            backend: vendor,
            probe: Some(probe),
            decision,
        });
    }

    let host_decision = match chosen {
        Some(v) => Decision::Passed(format!("{v} was chosen first")),
        None => {
            chosen = Some(Vendor::Host);
            Decision::Chosen
        }
    };
    let host_probe = Probe {
        backend: Some(Vendor::Host),
        library: None,
        device_count: config.host_devices.value,
        ..Probe::default()
    };
    candidates.push(Candidate {
        backend: Vendor::Host,
        probe: Some(host_probe),
        decision: host_decision,
    });

    let chosen = chosen.unwrap_or(Vendor::Host);
    let devices = if chosen == Vendor::Host {
        let count = config.host_devices.value;
        let ordinals = match only {
            Some(o) if o >= count => return Err(no_such_device(Vendor::Host, o, count)),
            Some(o) => o..o + 1,
            None => 0..count,
        };
        ordinals
            .map(|ordinal| Ok(Arc::new(host_device(config, ordinal)?) as Arc<dyn Device>))
            .collect::<Result<Vec<_>>>()?
    } else {
        vendor_devices
    };
    Ok(Discovery {
        candidates,
        chosen,
        devices,
    })
}

/// The host device `config` describes (`PORTALLOC_HOST_CAPACITY`, `PORTALLOC_HOST_SIMULATED`),
/// at `ordinal`.
pub fn host_device(config: &Config, ordinal: u32) -> Result<HostDevice> {
    let mut builder = HostDevice::builder()
        .simulated(config.host_simulated.value)
        .ordinal(ordinal);
    if let Some(capacity) = config.host_capacity.value {
        builder = builder.capacity(capacity);
    }
    builder.build()
}

fn config_source_name(config: &Config) -> String {
    match &config.backend.source {
        crate::config::Source::Env(name) => (*name).to_string(),
        crate::config::Source::Builder => "the builder".into(),
        crate::config::Source::Default => "the default".into(),
    }
}

fn compiled(vendor: Vendor) -> bool {
    (vendor != Vendor::Cuda || cfg!(feature = "cuda"))
        && (vendor != Vendor::Hip || cfg!(feature = "hip"))
}

/// Opens every device of a vendor backend, with the library and options `config` gives:
/// CUDA, one [`crate::backends::cuda::CudaDevice`] per ordinal on each device's primary
/// context; HIP, one [`crate::backends::hip::HipDevice`] per ordinal with the AMD tuning in
/// its notes. `None` for a backend without a [`Device`] implementation of its own, or not
/// compiled in (which [`discover`] skips before asking).
#[allow(unused_variables)] // `config` is unused in a build with neither cuda nor hip
fn open_vendor(
    vendor: Vendor,
    config: &Config,
    only: Option<u32>,
) -> Option<Result<Vec<Arc<dyn Device>>>> {
    match vendor {
        #[cfg(feature = "cuda")]
        Vendor::Cuda => Some(crate::backends::cuda::open_some(config, only).map(shared)),
        #[cfg(feature = "hip")]
        Vendor::Hip => Some(crate::backends::hip::open_some(config, only).map(shared)),
        _ => None,
    }
}

/// The refusal of an ordinal the chosen backend does not have.
fn no_such_device(vendor: Vendor, ordinal: u32, count: u32) -> Error {
    Error::InvalidArgument {
        call: "discover_device",
        reason: format!(
            "device {ordinal} does not exist: the {vendor} backend has {count} device(s){}",
            match count {
                0 => String::new(),
                n => format!(", ordinals 0 to {}", n - 1),
            }
        ),
    }
}

/// The devices a backend opened, as `discover` hands them out.
#[cfg(any(feature = "cuda", feature = "hip"))]
fn shared<D: Device + 'static>(devices: Vec<D>) -> Vec<Arc<dyn Device>> {
    devices
        .into_iter()
        .map(|d| Arc::new(d) as Arc<dyn Device>)
        .collect()
}

#[allow(unused_variables)] // `config` is unused in a build with neither cuda nor hip
fn probe_vendor(vendor: Vendor, config: &Config) -> Probe {
    match vendor {
        #[cfg(feature = "cuda")]
        Vendor::Cuda => crate::backends::cuda::probe(config),
        #[cfg(feature = "hip")]
        Vendor::Hip => crate::backends::hip::probe(config),
        other => Probe {
            backend: Some(other),
            ..Probe::default()
        },
    }
}

/// Peer access between two devices of the chosen backend, as [`enable_peer_access`] (or
/// [`peer_access_off`]) left it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PeerLink {
    /// The device whose work accesses the memory (ordinal).
    pub device: u32,
    /// The device whose memory is accessed (ordinal).
    pub peer: u32,
    /// True when peer access was enabled.
    pub enabled: bool,
    /// Why not, when not.
    pub reason: Option<String>,
}

impl std::fmt::Display for PeerLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} -> {}: ", self.device, self.peer)?;
        match (&self.enabled, &self.reason) {
            (true, _) => f.write_str("enabled"),
            (false, Some(why)) => write!(f, "not enabled ({why})"),
            (false, None) => f.write_str("not enabled"),
        }
    }
}

/// Enables peer access between every two of `devices` (one backend's, by ordinal) that
/// report it in both directions ([`Device::can_access_peer`]), both ways, so that each
/// device's [`Device::peer_access`] lists exactly the devices that can access it too (what
/// the `vmm` strategy grants access to on its mappings). Returns one [`PeerLink`] per
/// ordered pair of distinct devices; failures are recorded there, never fatal.
pub fn enable_peer_access(devices: &[Arc<dyn Device>]) -> Vec<PeerLink> {
    let mut links = Vec::new();
    for (i, a) in devices.iter().enumerate() {
        for b in &devices[i + 1..] {
            let can = |x: &Arc<dyn Device>, y: &Arc<dyn Device>| match x.can_access_peer(y.as_ref())
            {
                Ok(true) => Ok(()),
                // The device's own account of why not (a driver without the peer calls reads
                // differently from one that says no).
                Ok(false) => Err(match x.peer_access_refusal(y.as_ref()) {
                    crate::Error::Unsupported { reason, .. } => reason,
                    other => other.to_string(),
                }),
                Err(e) => Err(e.to_string()),
            };
            let both = can(a, b).and_then(|()| can(b, a));
            for (x, y) in [(a, b), (b, a)] {
                let outcome = both
                    .clone()
                    .and_then(|()| x.enable_peer_access(y.as_ref()).map_err(|e| e.to_string()));
                if let Err(why) = &outcome {
                    tracing::debug!(device = x.info().ordinal, peer = y.info().ordinal, %why,
                        "peer access not enabled");
                }
                links.push(PeerLink {
                    device: x.info().ordinal,
                    peer: y.info().ordinal,
                    enabled: outcome.is_ok(),
                    reason: outcome.err(),
                });
            }
        }
    }
    links.sort_by_key(|l| (l.device, l.peer));
    links
}

/// One [`PeerLink`] per ordered pair of distinct `devices`, none enabled, saying that the
/// configuration leaves peer access off ([`Config::peer_access`]): what
/// [`Portalloc::from_config`] reports when it enables none. Calls nothing on the devices.
pub fn peer_access_off(devices: &[Arc<dyn Device>]) -> Vec<PeerLink> {
    let ordinals: Vec<u32> = devices.iter().map(|d| d.info().ordinal).collect();
    let mut links: Vec<PeerLink> = ordinals
        .iter()
        .flat_map(|&device| {
            ordinals
                .iter()
                .filter(move |&&peer| peer != device)
                .map(move |&peer| PeerLink {
                    device,
                    peer,
                    enabled: false,
                    reason: Some(PEER_ACCESS_OFF.to_string()),
                })
        })
        .collect();
    links.sort_by_key(|l| (l.device, l.peer));
    links
}

/// Peer access between `devices` as `config` asks: [`enable_peer_access`] when
/// [`Config::peer_access`] is on, else [`peer_access_off`] (the default: nothing is changed
/// on the devices' contexts).
pub fn configure_peer_access(config: &Config, devices: &[Arc<dyn Device>]) -> Vec<PeerLink> {
    if config.peer_access.value {
        enable_peer_access(devices)
    } else {
        peer_access_off(devices)
    }
}

/// Why [`peer_access_off`]'s links are not enabled.
pub const PEER_ACCESS_OFF: &str = "peer access is off, the default; PORTALLOC_PEER_ACCESS=1 or \
     Config::builder().peer_access(true) turns it on";

/// One line about device `ordinal`'s peer access among `links`: `devices 1, 2`, or `none`
/// with the first reason.
pub fn describe_peer_access(links: &[PeerLink], ordinal: u32) -> String {
    let mine: Vec<&PeerLink> = links.iter().filter(|l| l.device == ordinal).collect();
    let on: Vec<String> = mine
        .iter()
        .filter(|l| l.enabled)
        .map(|l| l.peer.to_string())
        .collect();
    if !on.is_empty() {
        return format!(
            "device{} {}",
            if on.len() > 1 { "s" } else { "" },
            on.join(", ")
        );
    }
    match mine.iter().find_map(|l| l.reason.as_deref()) {
        Some(why) => format!("none ({why})"),
        None => "none (no other device)".into(),
    }
}

/// Discovery, configuration and one allocator per device, in one value.
///
/// [`Portalloc::from_env`] takes the configuration from the environment (the variables of
/// [`config::VARIABLES`](crate::config::VARIABLES), JAX's among them);
/// [`Portalloc::from_config`] from code. Here two simulated host devices, each with its own
/// `vmm` allocator:
///
/// ```
/// use portalloc::discover::Decision;
/// use portalloc::{Config, Portalloc, StrategyKind, Stream, Vendor};
///
/// let config = Config::builder()
///     .ignore_env()
///     .backend(Some(Vendor::Host))
///     .host_devices(2)
///     .host_capacity(8 << 30)
///     .host_simulated(true)
///     .strategy(StrategyKind::Vmm)
///     .mem_fraction(0.5)
///     .build()?;
/// let portalloc = Portalloc::from_config(config)?;
///
/// // Every compiled-in backend was considered; the host was forced, so the others were
/// // skipped without being probed.
/// let host = portalloc.discovery.candidates.iter().find(|c| c.backend == Vendor::Host);
/// assert_eq!(host.map(|c| &c.decision), Some(&Decision::Chosen));
/// assert_eq!(portalloc.allocators.len(), 2);
///
/// for ordinal in 0..2 {
///     let allocator = portalloc.allocator(ordinal).expect("two devices");
///     assert_eq!(allocator.name(), "vmm");
///     assert_eq!(allocator.stats().bytes_limit, Some(4 << 30));
///     let a = allocator.allocate(3 << 20, 0, Stream::DEFAULT, "weights")?;
///     assert_eq!(allocator.stats().bytes_in_use, 3 << 20);
///     allocator.deallocate(a)?;
/// }
/// assert!(portalloc.allocator(2).is_none());
/// # Ok::<(), portalloc::Error>(())
/// ```
pub struct Portalloc {
    /// The configuration used.
    pub config: Config,
    /// What discovery found.
    pub discovery: Discovery,
    /// One allocator per device, by ordinal, shared: clone the `Arc` to keep one (a
    /// [`crate::DeviceBuffer`] does).
    pub allocators: Vec<Arc<dyn Allocator>>,
    /// Export of each allocator's allocations to other processes ([`crate::share`]), by
    /// ordinal: [`Portalloc::sharing`].
    pub sharing: Vec<crate::share::Sharing>,
    /// Peer access between the devices: enabled before the allocators were built when
    /// [`Config::peer_access`] is on ([`enable_peer_access`]), else every pair not enabled
    /// ([`peer_access_off`]).
    pub peers: Vec<PeerLink>,
}

impl std::fmt::Debug for Portalloc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Portalloc")
            .field("config", &self.config)
            .field("chosen", &self.discovery.chosen)
            .field("peers", &self.peers)
            .field(
                "allocators",
                &self
                    .allocators
                    .iter()
                    .map(|a| a.name().to_string())
                    .collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// The allocator of `device` as `config` says, a member of the device's shared budget when
/// the configuration joins one ([`crate::budget`]): its ceiling lowers the memory fraction, and
/// a segment that cannot be used means running alone, with one warning.
fn build_member(config: &Config, device: &Arc<dyn Device>) -> Result<Member> {
    build_member_boxed(config, device)
}

/// An allocator, the shared budget it is a member of (`None`: it runs alone), and the room
/// that exports its allocations to other processes (under the budget, so that the budget's
/// trims and sleeps withdraw exports first).
pub(crate) struct Member {
    /// The allocator to call.
    pub(crate) allocator: Box<dyn Allocator>,
    /// Its shared budget, if it joined one (the C ABI keeps it).
    #[cfg_attr(not(feature = "c-api"), allow(dead_code))]
    pub(crate) budget: Option<Arc<crate::budget::SharedBudget>>,
    /// Export of its allocations ([`crate::share`]).
    pub(crate) sharing: crate::share::Sharing,
}

/// [`build_member`], boxed, with the budget it joined: what the C ABI puts under its graph
/// pools and ledger, so that its allocators are members as a [`Portalloc`]'s are.
pub(crate) fn build_member_boxed(config: &Config, device: &Arc<dyn Device>) -> Result<Member> {
    let info = device.info();
    let options = config
        .shared_budget
        .as_ref()
        .filter(|o| info.vendor != Vendor::Host || o.include_host);
    let share = |strategy: Box<dyn Allocator>| {
        crate::share::Sharing::new(Arc::from(strategy), Arc::clone(device))
    };
    let Some(options) = options else {
        let sharing = share(crate::strategy::build(config, Arc::clone(device))?);
        return Ok(Member {
            allocator: Box::new(sharing.clone()),
            budget: None,
            sharing,
        });
    };
    let total = info.total_bytes;
    let mut config = config.clone();
    if let Some(ceiling) = options.ceiling {
        let fraction = ceiling.of(total) as f64 / total.max(1) as f64;
        if fraction < config.mem_fraction.value {
            config.mem_fraction.value = fraction.max(f64::MIN_POSITIVE);
        }
    }
    let sharing = share(crate::strategy::build(&config, Arc::clone(device))?);
    match crate::budget::SharedBudget::join(&crate::budget::device_key(info), total, options) {
        Ok(budget) => Ok(Member {
            allocator: Box::new(crate::budget::BudgetAllocator::new(
                Arc::new(sharing.clone()),
                Arc::clone(&budget),
            )),
            budget: Some(budget),
            sharing,
        }),
        Err(e) => {
            crate::budget::warn_once(&e);
            Ok(Member {
                allocator: Box::new(sharing.clone()),
                budget: None,
                sharing,
            })
        }
    }
}

impl Portalloc {
    /// Reads the environment, discovers devices and builds the configured strategy on each.
    ///
    /// # Errors
    /// Configuration errors, discovery errors, and [`Error::Unsupported`] for a strategy the
    /// chosen backend cannot serve.
    pub fn from_env() -> Result<Portalloc> {
        Portalloc::from_config(Config::from_env()?)
    }

    /// As [`Portalloc::from_env`], with an explicit configuration: no environment variable
    /// is read here, everything comes from `config` (built with
    /// [`crate::ConfigBuilder::ignore_env`], nothing at all is read).
    ///
    /// When [`Config::peer_access`] is on (`PORTALLOC_PEER_ACCESS=1`,
    /// [`crate::ConfigBuilder::peer_access`]), peer access is enabled between the devices that
    /// report it ([`enable_peer_access`]) before the allocators are built, so that `vmm`
    /// grants the peers access to what it maps. It is off by default, since enabling it
    /// changes the primary contexts the whole process shares (PyTorch, cudarc); see
    /// [`crate::config`].
    ///
    /// # Errors
    /// As [`Portalloc::from_env`], less the configuration's.
    pub fn from_config(config: Config) -> Result<Portalloc> {
        let discovery = discover(&config)?;
        let peers = configure_peer_access(&config, &discovery.devices);
        Portalloc::build(config, discovery, peers)
    }

    /// Builds the allocator of every device discovered, as `config` says.
    fn build(config: Config, discovery: Discovery, peers: Vec<PeerLink>) -> Result<Portalloc> {
        let members = discovery
            .devices
            .iter()
            .map(|d| build_member(&config, d))
            .collect::<Result<Vec<_>>>()?;
        let (allocators, sharing) = members
            .into_iter()
            .map(|m| (Arc::from(m.allocator), m.sharing))
            .unzip();
        Ok(Portalloc {
            config,
            discovery,
            allocators,
            sharing,
            peers,
        })
    }

    /// [`Portalloc::from_config`] for device `ordinal` alone: discovery opens only that
    /// device ([`discover_device`]) — no other device's context is retained, no other pool
    /// made — and [`Portalloc::allocator`]`(0)` is its allocator. With peer access on,
    /// every device is opened, since enabling it needs the peers.
    ///
    /// # Errors
    /// As [`Portalloc::from_config`]; [`Error::InvalidArgument`] for an ordinal the backend
    /// does not have.
    pub fn for_device(config: Config, ordinal: u32) -> Result<Portalloc> {
        if config.peer_access.value {
            let mut all = Portalloc::from_config(config)?;
            let index = all
                .discovery
                .devices
                .iter()
                .position(|d| d.info().ordinal == ordinal)
                .ok_or_else(|| {
                    no_such_device(
                        all.discovery.chosen,
                        ordinal,
                        all.discovery.devices.len() as u32,
                    )
                })?;
            let device = all.discovery.devices.swap_remove(index);
            let allocator = all.allocators.swap_remove(index);
            let sharing = all.sharing.swap_remove(index);
            all.discovery.devices = vec![device];
            all.allocators = vec![allocator];
            all.sharing = vec![sharing];
            return Ok(all);
        }
        let discovery = discover_device(&config, ordinal)?;
        let peers = peer_access_off(&discovery.devices);
        Portalloc::build(config, discovery, peers)
    }

    /// The shared budget device `ordinal`'s allocator joined ([`crate::budget`]), if it joined
    /// one: where this process declares reclaimable tags and marks the sections that use them.
    pub fn budget(&self, ordinal: usize) -> Option<Arc<crate::budget::SharedBudget>> {
        let device = self.discovery.devices.get(ordinal)?;
        let options = self.config.shared_budget.as_ref()?;
        crate::budget::SharedBudget::joined(&crate::budget::segment_path(
            &options.dir,
            &crate::budget::device_key(device.info()),
            crate::budget::current_uid(),
        ))
    }

    /// The export room of device `ordinal`'s allocator: [`crate::share::Sharing::export`]
    /// hands its allocations to other processes, which [`crate::share::import`] them.
    pub fn sharing(&self, ordinal: usize) -> Option<&crate::share::Sharing> {
        self.sharing.get(ordinal)
    }

    /// The allocator of device `ordinal`, shared: it lives as long as the last `Arc` (a
    /// buffer, a struct of yours), not only as long as this value.
    pub fn allocator(&self, ordinal: usize) -> Option<Arc<dyn Allocator>> {
        self.allocators.get(ordinal).cloned()
    }
}
