//! Peer access between devices: the host (every host device reaches every other, and its
//! `set_access_with_peers` records the peers), the `vmm` strategy granting enabled peers
//! access to what it maps, `Portalloc` enabling it between the devices it discovered only when
//! the configuration asks (`peer_access`, off by default), and the
//! CUDA and HIP shims over conformance drivers whose two devices are declared not
//! peer-capable (no peers, typed errors).

use std::sync::Arc;

use portalloc::adaptor::{Capability, DeviceWrapper};
use portalloc::backends::host::HostDevice;
use portalloc::device::DeviceInfo;
use portalloc::discover::{describe_peer_access, enable_peer_access, PeerLink, PEER_ACCESS_OFF};
use portalloc::strategy::vmm::{VmmAllocator, VmmOptions};
use portalloc::{Allocator, Config, Device, Error, Portalloc, StrategyKind, Stream, Vendor};
use test_case::test_case;

const MIB: u64 = 1 << 20;

fn host(ordinal: u32) -> Arc<HostDevice> {
    Arc::new(
        HostDevice::builder()
            .capacity(256 * MIB)
            .simulated(true)
            .ordinal(ordinal)
            .build()
            .unwrap(),
    )
}

fn hosts(n: u32) -> Vec<Arc<HostDevice>> {
    (0..n).map(host).collect()
}

fn dyns(devices: &[Arc<HostDevice>]) -> Vec<Arc<dyn Device>> {
    devices
        .iter()
        .map(|d| Arc::clone(d) as Arc<dyn Device>)
        .collect()
}

#[test]
fn host_devices_reach_every_other_but_not_themselves() {
    let d = hosts(3);
    for a in &d {
        for b in &d {
            let same = a.info().ordinal == b.info().ordinal;
            assert_eq!(a.can_access_peer(b.as_ref()).unwrap(), !same);
        }
    }
    // A second device object with the same ordinal is not a peer either.
    let twin = host(0);
    assert!(!d[0].can_access_peer(twin.as_ref()).unwrap());
    assert!(matches!(
        d[0].enable_peer_access(d[0].as_ref()),
        Err(Error::Unsupported { .. })
    ));
    assert!(d[0].peer_access().is_empty());
    d[0].enable_peer_access(d[2].as_ref()).unwrap();
    d[0].enable_peer_access(d[1].as_ref()).unwrap();
    d[0].enable_peer_access(d[2].as_ref()).unwrap(); // again: no error
    assert_eq!(d[0].peer_access(), vec![1, 2]);
    assert!(d[1].peer_access().is_empty(), "one direction only");
}

#[test]
fn host_set_access_with_peers_records_them_until_unmapped() {
    let d = hosts(2);
    let vm = d[0].virtual_memory().unwrap();
    let g = vm.granularity();
    let va = vm.reserve(4 * g, 0).unwrap();
    let h = vm.create_physical(2 * g).unwrap();
    vm.map(va, 2 * g, h, 0).unwrap();
    // Not enabled yet: refused, nothing recorded.
    assert!(matches!(
        vm.set_access_with_peers(va, 2 * g, &[1]),
        Err(Error::InvalidArgument { .. })
    ));
    assert!(d[0].peer_access_at(va).is_empty());
    d[0].enable_peer_access(d[1].as_ref()).unwrap();
    vm.set_access_with_peers(va, 2 * g, &[1]).unwrap();
    assert_eq!(d[0].peer_access_at(va), vec![1]);
    assert_eq!(d[0].peer_access_at(va + 2 * g - 1), vec![1]);
    assert!(d[0].peer_access_at(va + 2 * g).is_empty());
    // No peers: plain set_access.
    vm.set_access_with_peers(va, g, &[]).unwrap();
    // Still the driver's rules: the range must be mapped.
    assert!(vm.set_access_with_peers(va + 2 * g, g, &[1]).is_err());
    vm.unmap(va, 2 * g).unwrap();
    assert!(d[0].peer_access_at(va).is_empty(), "forgotten at the unmap");
    vm.release_physical(h).unwrap();
    vm.free_reservation(va, 4 * g).unwrap();
    let c = d[0].census();
    assert_eq!((c.mappings, c.physical_handles, c.reservations), (0, 0, 0));
}

#[test]
fn enable_peer_access_links_every_pair_both_ways() {
    let d = hosts(3);
    let links = enable_peer_access(&dyns(&d));
    assert_eq!(links.len(), 6);
    assert!(links.iter().all(|l| l.enabled && l.reason.is_none()));
    assert_eq!(
        links.iter().map(|l| (l.device, l.peer)).collect::<Vec<_>>(),
        vec![(0, 1), (0, 2), (1, 0), (1, 2), (2, 0), (2, 1)]
    );
    for (i, dev) in d.iter().enumerate() {
        let others: Vec<u32> = (0..3).filter(|&o| o != i as u32).collect();
        assert_eq!(dev.peer_access(), others);
    }
    assert_eq!(describe_peer_access(&links, 0), "devices 1, 2");
    assert_eq!(links[0].to_string(), "0 -> 1: enabled");
    // One device: nothing to link.
    let one = hosts(1);
    let links = enable_peer_access(&dyns(&one));
    assert!(links.is_empty());
    assert_eq!(describe_peer_access(&links, 0), "none (no other device)");
}

/// A device that offers nothing beyond the required calls: the trait's defaults.
#[derive(Debug)]
struct Plain(Arc<HostDevice>);

impl DeviceWrapper for Plain {
    type Inner = HostDevice;
    fn wrapped(&self) -> &HostDevice {
        &self.0
    }
    fn offers(&self, _: Capability) -> bool {
        false
    }
}

#[test]
fn the_trait_defaults_offer_no_peers() {
    let a: Arc<dyn Device> = Arc::new(Plain(host(0)));
    let b: Arc<dyn Device> = Arc::new(Plain(host(1)));
    assert!(!a.can_access_peer(b.as_ref()).unwrap());
    assert!(matches!(
        a.enable_peer_access(b.as_ref()),
        Err(Error::Unsupported { .. })
    ));
    assert!(a.peer_access().is_empty());
    let links = enable_peer_access(&[Arc::clone(&a), Arc::clone(&b)]);
    assert_eq!(links.len(), 2);
    assert!(links.iter().all(|l| !l.enabled));
    // The reason is the device's own refusal, as `enable_peer_access` gives it.
    let shown = describe_peer_access(&links, 0);
    assert!(
        shown.starts_with("none (device 0 (") && shown.contains("does not offer peer access"),
        "{shown}"
    );
}

#[test]
fn a_host_device_is_no_peer_of_another_backend() {
    // A device claiming another vendor (a wrapper around a host device).
    #[derive(Debug)]
    struct Other(Plain, DeviceInfo);
    impl DeviceWrapper for Other {
        type Inner = Plain;
        fn wrapped(&self) -> &Plain {
            &self.0
        }
        fn device_info(&self) -> &DeviceInfo {
            &self.1
        }
    }
    let inner = host(1);
    let mut info = inner.info().clone();
    info.vendor = Vendor::Cuda;
    let other = Other(Plain(inner), info);
    let h = host(0);
    assert!(!h.can_access_peer(&other).unwrap());
    assert!(matches!(
        h.enable_peer_access(&other),
        Err(Error::Unsupported { .. })
    ));
}

// ---- vmm ----

#[test]
fn vmm_grants_the_enabled_peers_access_to_what_it_maps() {
    let d = hosts(3);
    enable_peer_access(&dyns(&d));
    let a = VmmAllocator::new(Arc::clone(&d[0]), VmmOptions::new(64 * MIB)).unwrap();
    assert_eq!(a.peers(), vec![1, 2]);
    let small = a.allocate(1000, 0, Stream::DEFAULT, "s").unwrap();
    let large = a.allocate(5 * MIB, 0, Stream::DEFAULT, "l").unwrap();
    for x in [&small, &large] {
        assert_eq!(d[0].peer_access_at(x.ptr()), vec![1, 2]);
        assert_eq!(d[0].peer_access_at(x.ptr() + x.size() - 1), vec![1, 2]);
    }
    a.check_invariants().unwrap();
    a.deallocate(small).unwrap();
    a.deallocate(large).unwrap();
    a.trim().unwrap();
    drop(a);
    let c = d[0].census();
    assert_eq!((c.mappings, c.physical_handles, c.bytes_in_use), (0, 0, 0));
}

#[test]
fn vmm_add_peer_grants_what_is_mapped_already() {
    let d = hosts(2);
    let a = VmmAllocator::new(Arc::clone(&d[0]), VmmOptions::new(64 * MIB)).unwrap();
    assert!(a.peers().is_empty());
    let x = a.allocate(3 * MIB, 0, Stream::DEFAULT, "x").unwrap();
    assert!(d[0].peer_access_at(x.ptr()).is_empty());
    // Not enabled on the device: the grant fails and the peer is not added.
    assert!(a.add_peer(1).is_err());
    assert!(a.peers().is_empty());
    d[0].enable_peer_access(d[1].as_ref()).unwrap();
    let before = a.counters().set_access;
    a.add_peer(1).unwrap();
    assert_eq!(a.peers(), vec![1]);
    assert!(a.counters().set_access > before);
    assert_eq!(d[0].peer_access_at(x.ptr()), vec![1]);
    a.add_peer(1).unwrap(); // again: nothing to do
    let y = a.allocate(100, 0, Stream::DEFAULT, "y").unwrap();
    assert_eq!(d[0].peer_access_at(y.ptr()), vec![1]);
    a.check_invariants().unwrap();
    a.deallocate(x).unwrap();
    a.deallocate(y).unwrap();
}

// ---- Portalloc ----

/// Three simulated host devices, the `vmm` strategy on each, peer access as `peer_access`
/// says (`None`: the default).
fn three_hosts(peer_access: Option<bool>) -> Portalloc {
    let mut builder = Config::builder()
        .ignore_env()
        .backend(Some(Vendor::Host))
        .host_devices(3)
        .host_simulated(true)
        .host_capacity(1 << 30)
        .strategy(StrategyKind::Vmm);
    if let Some(on) = peer_access {
        builder = builder.peer_access(on);
    }
    Portalloc::from_config(builder.build().unwrap()).unwrap()
}

#[test]
fn portalloc_enables_peer_access_between_the_devices_it_found_when_asked() {
    let p = three_hosts(Some(true));
    assert_eq!(p.allocators.len(), 3);
    assert_eq!(p.discovery.devices.len(), 3);
    assert_eq!(p.peers.len(), 6);
    assert!(p.peers.iter().all(|l: &PeerLink| l.enabled));
    for d in &p.discovery.devices {
        assert_eq!(d.peer_access().len(), 2);
    }
    for (i, a) in p.allocators.iter().enumerate() {
        let x = a.allocate(MIB, 0, Stream::DEFAULT, "x").unwrap();
        assert_eq!(a.name(), "vmm");
        a.deallocate(x).unwrap();
        assert_eq!(
            describe_peer_access(&p.peers, i as u32),
            match i {
                0 => "devices 1, 2",
                1 => "devices 0, 2",
                _ => "devices 0, 1",
            }
        );
    }
}

/// Off by default and when turned off: no device's peer list changes, every pair is
/// reported not enabled with the setting that turns it on, and `vmm` grants no peer.
#[test_case(None ; "off by default")]
#[test_case(Some(false) ; "off when asked")]
fn portalloc_leaves_peer_access_off_unless_asked(peer_access: Option<bool>) {
    let p = three_hosts(peer_access);
    assert!(!p.config.peer_access.value);
    assert_eq!(p.peers.len(), 6);
    for link in &p.peers {
        assert!(!link.enabled, "{link}");
        assert_eq!(link.reason.as_deref(), Some(PEER_ACCESS_OFF));
    }
    assert!(PEER_ACCESS_OFF.contains("PORTALLOC_PEER_ACCESS=1"));
    for (i, d) in p.discovery.devices.iter().enumerate() {
        assert!(d.peer_access().is_empty(), "device {i}");
        assert_eq!(
            describe_peer_access(&p.peers, i as u32),
            format!("none ({PEER_ACCESS_OFF})")
        );
        let a = &p.allocators[i];
        let x = a.allocate(MIB, 0, Stream::DEFAULT, "x").unwrap();
        assert!(d.peer_access().is_empty(), "vmm grants no peer: {i}");
        a.deallocate(x).unwrap();
    }
}

/// The vendor shims over their conformance drivers (two peer-capable devices): discovery
/// with `PORTALLOC_PEER_ACCESS` set enables access both ways through the vendor call; unset,
/// the call is never made.
#[cfg(any(feature = "cuda", feature = "hip"))]
#[test_case(Vendor::Cuda, "1", true ; "cuda on")]
#[test_case(Vendor::Cuda, "0", false ; "cuda off")]
#[test_case(Vendor::Cuda, "", false ; "cuda unset")]
#[test_case(Vendor::Hip, "yes", true ; "hip on")]
#[test_case(Vendor::Hip, "off", false ; "hip off")]
#[test_case(Vendor::Hip, "", false ; "hip unset")]
fn discovery_enables_vendor_peer_access_only_when_configured(
    vendor: Vendor,
    variable: &str,
    enabled: bool,
) {
    if !cfg!(feature = "cuda") && vendor == Vendor::Cuda
        || !cfg!(feature = "hip") && vendor == Vendor::Hip
    {
        return;
    }
    let fake = crate::support::fakes::Fake::with_devices(vendor, 2, 1 << 30);
    let library = match vendor {
        Vendor::Cuda => portalloc::config::PORTALLOC_CUDA_LIBRARY,
        _ => portalloc::config::PORTALLOC_HIP_LIBRARY,
    };
    let p = crate::support::common::discover_with(&[
        (library, &fake.path()),
        ("PORTALLOC_BACKEND", vendor.name()),
        ("PORTALLOC_PEER_ACCESS", variable),
    ]);
    assert_eq!(p.discovery.chosen, vendor);
    assert_eq!(p.peers.len(), 2);
    assert!(
        p.peers.iter().all(|l| l.enabled == enabled),
        "{:?}",
        p.peers
    );
    assert_eq!(
        (fake.peer_enabled(0, 1), fake.peer_enabled(1, 0)),
        (enabled, enabled)
    );
    let enable_call = match vendor {
        Vendor::Cuda => "cuCtxEnablePeerAccess",
        _ => "hipDeviceEnablePeerAccess",
    };
    assert_eq!(fake.calls(enable_call), if enabled { 2 } else { 0 });
    for d in &p.discovery.devices {
        assert_eq!(d.peer_access().len(), usize::from(enabled));
    }
    drop(p);
    fake.assert_empty();
}

// ---- CUDA and HIP conformance drivers (a pair declared not peer-capable) ----
//
// Both fakes export the peer calls; the pair is declared not capable (`fake_set_peer`), so
// the shims report no peers and typed errors. `tests/suite/vendor_fakes.rs` has the capable paths.

/// A CUDA conformance driver with two devices: the fake, its driver, and both devices.
#[cfg(feature = "cuda")]
type TwoCudaDevices = (
    crate::support::fakes::Fake,
    Arc<portalloc::backends::cuda::Driver>,
    Vec<Arc<dyn Device>>,
);

/// A private copy of the CUDA conformance driver `name` with two devices of 1 GiB, after
/// `configure` (which runs before `cuInit`); its driver, and both devices opened.
#[cfg(feature = "cuda")]
fn two_cuda_devices(
    name: &str,
    configure: impl FnOnce(&crate::support::fakes::Fake),
) -> TwoCudaDevices {
    use portalloc::backends::cuda::{CudaDevice, Driver};

    let fake = crate::support::fakes::Fake::copy(name);
    fake.set_devices(2, 1 << 30);
    configure(&fake);
    let driver = Arc::new(Driver::load(&[fake.path()]).unwrap());
    let devices: Vec<Arc<dyn Device>> = CudaDevice::open_all(Arc::clone(&driver))
        .unwrap()
        .into_iter()
        .map(|d| Arc::new(d) as Arc<dyn Device>)
        .collect();
    assert_eq!(devices.len(), 2);
    (fake, driver, devices)
}

#[cfg(feature = "cuda")]
#[test]
fn cuda_without_peer_capability_reports_no_peers() {
    let (fake, driver, devices) = two_cuda_devices("fakecuda", |fake| {
        fake.set_peer(0, 1, false);
        fake.set_peer(1, 0, false);
    });
    assert!(driver.has_peer_symbols());
    assert!(!devices[0].can_access_peer(devices[1].as_ref()).unwrap());
    assert!(!devices[0].can_access_peer(devices[0].as_ref()).unwrap());
    match devices[0].enable_peer_access(devices[1].as_ref()) {
        Err(Error::Unsupported { reason, .. }) => {
            assert!(reason.contains("cuDeviceCanAccessPeer"), "{reason}")
        }
        other => panic!("expected Unsupported, got {other:?}"),
    }
    assert!(devices[0].peer_access().is_empty());
    assert!(!driver.can_access_peer(0, 1).unwrap());
    // A host device is no CUDA peer.
    assert!(!devices[0].can_access_peer(host(1).as_ref()).unwrap());
    let all = devices;
    let links = enable_peer_access(&all);
    assert_eq!(links.len(), 2);
    // The driver has the calls and says no: the reason says so.
    assert!(
        links.iter().all(|l| !l.enabled
            && l.reason
                .as_deref()
                .is_some_and(|r| r.contains("(cuDeviceCanAccessPeer says no)"))),
        "{links:?}"
    );
    assert_eq!(fake.calls("cuCtxEnablePeerAccess"), 0);
    // vmm on a CUDA device without peers: plain set_access, as before.
    if all[0].virtual_memory().is_some() {
        let a = VmmAllocator::new(Arc::clone(&all[0]), VmmOptions::new(64 * MIB)).unwrap();
        assert!(a.peers().is_empty());
        let x = a.allocate(3 * MIB, 0, Stream::DEFAULT, "x").unwrap();
        assert_eq!(
            (fake.access(x.ptr(), 0), fake.access(x.ptr(), 1)),
            (Some(true), Some(false))
        );
        a.deallocate(x).unwrap();
        a.check_invariants().unwrap();
    }
    drop(all);
    fake.assert_empty();
}

#[cfg(feature = "hip")]
#[test]
fn hip_without_peer_capability_reports_no_peers() {
    use portalloc::backends::hip::{HipDevice, Runtime};

    let fake = crate::support::fakes::Fake::copy("fakehip");
    fake.set_devices(2, 1 << 30);
    fake.set_peer(0, 1, false);
    let runtime = Arc::new(Runtime::load(&[fake.path()]).unwrap());
    assert!(runtime.has_peer_symbols());
    let a = HipDevice::open(Arc::clone(&runtime), 0).unwrap();
    let b = HipDevice::open(Arc::clone(&runtime), 1).unwrap();
    assert!(!a.can_access_peer(&b).unwrap());
    assert!(matches!(
        a.enable_peer_access(&b),
        Err(Error::Unsupported { .. })
    ));
    assert!(a.peer_access().is_empty());
    assert!(!runtime.device_can_access_peer(0, 1).unwrap());
    assert_eq!(fake.calls("hipDeviceEnablePeerAccess"), 0);
    drop((a, b));
    fake.assert_empty();
}

/// A machine whose devices have no peer link (`fakecuda_nopeer`: two devices, and the
/// driver's peer calls, which every libcuda exports, say no): the shim reports no peers, and
/// enabling peer access on a device is a typed error that says the device says no;
/// `enable_peer_access` records that per pair, never fatal, and discovery with
/// `PORTALLOC_PEER_ACCESS=1` makes its allocators all the same (the C ABI's
/// `peer_access = 1` too: tests/capi.rs).
#[cfg(feature = "cuda")]
#[test]
fn cuda_devices_without_a_peer_link_offer_no_peers() {
    let (fake, driver, devices) = two_cuda_devices("fakecuda_nopeer", |_| ());
    assert!(driver.has_peer_symbols());
    assert!(!driver.can_access_peer(0, 1).unwrap());
    assert!(!devices[0].can_access_peer(devices[1].as_ref()).unwrap());
    match devices[0].enable_peer_access(devices[1].as_ref()) {
        Err(Error::Unsupported { reason, .. }) => {
            assert!(reason.contains("cuDeviceCanAccessPeer"), "{reason}")
        }
        other => panic!("expected Unsupported, got {other:?}"),
    }
    assert!(devices[0].peer_access().is_empty());
    // Per pair, with the reason — that the device says no: never fatal.
    let links = enable_peer_access(&devices);
    assert!(
        links.len() == 2
            && links.iter().all(|l| !l.enabled
                && l.reason
                    .as_deref()
                    .is_some_and(|r| r.contains("(cuDeviceCanAccessPeer says no)"))),
        "{links:?}"
    );
    assert_eq!(fake.calls("cuCtxEnablePeerAccess"), 0);
    drop(devices);

    let p = crate::support::common::discover_with(&[
        (portalloc::config::PORTALLOC_CUDA_LIBRARY, &fake.path()),
        ("PORTALLOC_BACKEND", "cuda"),
        ("PORTALLOC_PEER_ACCESS", "1"),
    ]);
    assert!(p.config.peer_access.value);
    assert_eq!(p.allocators.len(), 2);
    assert!(p.peers.iter().all(|l| !l.enabled), "{:?}", p.peers);
    let x = p.allocators[0]
        .allocate(MIB, 0, Stream::DEFAULT, "x")
        .unwrap();
    p.allocators[0].deallocate(x).unwrap();
    drop(p);
    fake.assert_empty();
}
