//! AMD tuning: the choices [`super::HipDevice`] makes for AMD GPUs, each with its reason.
//! Every choice is also written into [`crate::DeviceInfo::notes`], so `portalloc info` shows
//! it. The decisions are pure functions of what the runtime reports, tested without a GPU.
//!
//! | choice | what | why |
//! |---|---|---|
//! | capability gates | from `hipDeviceGetAttribute`, never the properties struct | `hipDeviceProp_t` changed layout in ROCm 6 (R0600); attributes are stable numbers |
//! | virtual memory | only on ROCm ≥ 7 **and** attribute 89 (`hipDeviceAttributeVirtualMemoryManagementSupported`) = 1 | `hipMemMap` / `hipMemSetAccess` had known bugs before ROCm 7; 5.2.3 has no such attribute |
//! | released memory | probed when a device with virtual memory is opened (`backends/gpu/probe.rs`): a released handle's memory given back at release, or held until its reservation is freed; the note `released memory` | ROCm 7.x on Linux holds it (ROCm/legacy-rocm-build#6021), so vmm must free and re-reserve a range to return memory; which runtimes do is found by trying, not read from a version |
//! | pools | only with attribute 88 (`hipDeviceAttributeMemoryPoolsSupported`) = 1 | the runtime says whether its stream-ordered allocator works on the device |
//! | pool release threshold | set explicitly when the pool is made and whenever asked | ROCm pools are known to keep freed memory otherwise |
//! | chunk size and alignment | the recommended granularity, raised to 2 MiB | AMD GPUs map memory in 2 MiB fragments; ROCm may report 4 KiB as the minimum, and smaller chunks cost page-table entries and TLB reach |
//! | memory kind | coarse-grained (`hipMalloc`) by default; fine-grained or uncached (`hipExtMallocWithFlags`) on request | coarse-grained memory is device-coherent at kernel boundaries and runs at full bandwidth; fine-grained (host-coherent during kernels) is slower and only for those who need it |
//! | APU | attribute 16 (`hipDeviceAttributeIntegrated`) reported | on an APU (MI300A) device memory is the same HBM the CPU uses: a preallocated fraction is taken from the host too |
//! | XNACK | `HSA_XNACK` and the architecture's `xnack±` feature reported | with XNACK on, page faults are retried (unified memory can migrate); with it off, a fault is fatal |
//! | new mappings | on gfx12 (RDNA 4), memory just mapped is used only [`MAP_VISIBLE_GFX12`] after the map returned | there `hsa_amd_vmem_map` returns before the page tables have the mapping: work in the next ~2 ms reads zeros and its writes are lost, and no queue submission orders it — only wall-clock time does (ROCm/rocm-systems#11693, ROCm/clr#288) |

use serde::Serialize;

use super::HipVersion;
use crate::units::Bytes;

/// The fragment size of AMD GPUs' page tables: chunks and alignments are at least this.
pub const FRAGMENT: u64 = 2 << 20;

/// How long a new mapping stays invisible to GPU work on gfx12 (RDNA 4): the delay that took
/// corruption to 0 of 300 runs in ROCm/clr#288's measurements on an RX 9070 XT.
pub const MAP_VISIBLE_GFX12: std::time::Duration = std::time::Duration::from_millis(2);

/// How long memory just mapped must wait before GPU work may use it on architecture `arch`
/// (as [`arch_short`] gives it), and the note saying so.
///
/// ```
/// use portalloc::backends::hip::tuning::{map_visible_after, MAP_VISIBLE_GFX12};
/// assert_eq!(map_visible_after("gfx1201").0, MAP_VISIBLE_GFX12);
/// assert!(map_visible_after("gfx942").0.is_zero());
/// ```
pub fn map_visible_after(arch: &str) -> (std::time::Duration, String) {
    if arch.starts_with("gfx12") {
        (
            MAP_VISIBLE_GFX12,
            format!(
                "visible {} ms after the map on {arch}: vmm waits that long before it hands new \
                 mappings out or copies into them (ROCm/rocm-systems#11693)",
                MAP_VISIBLE_GFX12.as_millis()
            ),
        )
    } else {
        (
            std::time::Duration::ZERO,
            "visible when the map returns".to_string(),
        )
    }
}

/// The first ROCm release on which portalloc enables virtual memory.
pub const VMM_MIN_MAJOR: i32 = 7;

/// HIP's attribute numbers (not CUDA's).
pub mod attribute {
    use portalloc_sys::hip as sys;

    /// `hipDeviceAttributeIntegrated` (16): an APU.
    pub const INTEGRATED: sys::hipDeviceAttribute_t = sys::hipDeviceAttributeIntegrated;
    /// `hipDeviceAttributeMemoryPoolsSupported` (88).
    pub const POOLS: sys::hipDeviceAttribute_t = sys::hipDeviceAttributeMemoryPoolsSupported;
    /// `hipDeviceAttributeVirtualMemoryManagementSupported` (89, ROCm 6+).
    pub const VMM: sys::hipDeviceAttribute_t =
        sys::hipDeviceAttributeVirtualMemoryManagementSupported;
}

/// Which kind of device memory plain allocations get: the configuration's
/// [`HipMemoryKind`](crate::config::HipMemoryKind) (`PORTALLOC_HIP_MEMORY`), with its
/// allocation flags here.
pub use crate::config::HipMemoryKind as MemoryKind;

impl MemoryKind {
    /// The `hipExtMallocWithFlags` flags, or `None` for plain `hipMalloc`.
    pub fn flags(self) -> Option<u32> {
        match self {
            MemoryKind::Coarse => None,
            MemoryKind::FineGrained => Some(portalloc_sys::hip::hipDeviceMallocFinegrained),
            MemoryKind::Uncached => Some(portalloc_sys::hip::hipDeviceMallocUncached),
        }
    }
}

/// A capability decision and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Gate {
    /// Whether the capability is offered.
    pub on: bool,
    /// Why (what was found, and what would be needed).
    pub reason: String,
}

impl Gate {
    fn on(reason: String) -> Gate {
        Gate { on: true, reason }
    }
    fn off(reason: String) -> Gate {
        Gate { on: false, reason }
    }
}

fn attribute_text(value: Option<i32>) -> String {
    match value {
        Some(v) => format!("= {v}"),
        None => "not answered".into(),
    }
}

/// Virtual memory: ROCm ≥ 7, the VMM symbols, and attribute 89 = 1.
pub fn vmm_gate(version: HipVersion, attribute: Option<i32>, symbols: bool) -> Gate {
    let attr = format!(
        "hipDeviceAttributeVirtualMemoryManagementSupported (89) {}",
        attribute_text(attribute)
    );
    if !symbols {
        return Gate::off(format!(
            "HIP {version} does not export the virtual-memory calls (hipMemCreate, hipMemMap, …)"
        ));
    }
    if version.major() < VMM_MIN_MAJOR {
        let despite = if attribute == Some(1) {
            "off even though"
        } else {
            "and"
        };
        return Gate::off(format!(
            "HIP {version} is older than ROCm {VMM_MIN_MAJOR} (hipMemMap/hipMemSetAccess have \
             known bugs before ROCm {VMM_MIN_MAJOR}); {despite} {attr}"
        ));
    }
    if attribute != Some(1) {
        return Gate::off(format!(
            "HIP {version}, but {attr}: the device does not support it"
        ));
    }
    Gate::on(format!("HIP {version} ≥ ROCm {VMM_MIN_MAJOR} and {attr}"))
}

/// Stream-ordered pools: the pool symbols and attribute 88 = 1.
pub fn pool_gate(attribute: Option<i32>, symbols: bool) -> Gate {
    let attr = format!(
        "hipDeviceAttributeMemoryPoolsSupported (88) {}",
        attribute_text(attribute)
    );
    if !symbols {
        return Gate::off(
            "this runtime does not export the pool calls (hipMemPoolCreate, …; HIP 5.1+)".into(),
        );
    }
    if attribute != Some(1) {
        return Gate::off(format!(
            "{attr}: the device has no stream-ordered allocator"
        ));
    }
    Gate::on(format!(
        "{attr}; the release threshold is set explicitly (0 when the pool is made, then what \
         the strategy asks), since ROCm pools otherwise keep freed memory"
    ))
}

/// The chunk size and alignment: the recommended granularity raised to the 2 MiB fragment,
/// with the reason. `None`: not queried (virtual memory off).
pub fn chunk_size(minimum: Option<u64>, recommended: Option<u64>) -> (u64, String) {
    match recommended.filter(|&r| r > 0) {
        Some(r) if r >= FRAGMENT && r.is_power_of_two() => (
            r,
            format!(
                "{}: the recommended granularity (minimum {}), at least the 2 MiB fragment",
                Bytes(r),
                Bytes(minimum.unwrap_or(r))
            ),
        ),
        Some(r) => {
            // A power of two ≥ the recommendation and ≥ 2 MiB is a multiple of both.
            let chunk = r.next_power_of_two().max(FRAGMENT);
            (
                chunk,
                format!(
                    "{}: the recommended granularity {} (minimum {}) is below the 2 MiB \
                     fragment AMD GPUs map memory in; smaller chunks cost page-table entries \
                     and TLB reach",
                    Bytes(chunk),
                    Bytes(r),
                    Bytes(minimum.unwrap_or(r))
                ),
            )
        }
        None => (
            FRAGMENT,
            "2 MiB: the fragment AMD GPUs map memory in (granularity not queried: virtual \
             memory is off)"
                .into(),
        ),
    }
}

/// The architecture without its target features: `gfx942:sramecc+:xnack-` → `gfx942`.
pub fn arch_short(full: &str) -> String {
    full.split(':').next().unwrap_or(full).trim().to_string()
}

/// What the architecture string says about XNACK: `Some(true)` for `xnack+`, `Some(false)`
/// for `xnack-`, `None` when it does not say (either mode).
pub fn arch_xnack(full: &str) -> Option<bool> {
    full.split(':').skip(1).find_map(|f| match f.trim() {
        "xnack+" => Some(true),
        "xnack-" => Some(false),
        _ => None,
    })
}

/// The XNACK report from `HSA_XNACK` (as the configuration read it) and the architecture
/// string.
pub fn xnack_note(hsa_xnack: Option<bool>, arch_full: Option<&str>) -> String {
    let env = match hsa_xnack {
        Some(true) => "HSA_XNACK=1: page faults are retried (memory can migrate on demand)",
        Some(false) => "HSA_XNACK=0: a GPU page fault is fatal; memory must be resident",
        None => "HSA_XNACK unset in the configuration (the runtime's default mode)",
    };
    match arch_full.and_then(arch_xnack) {
        Some(true) => format!("{env}; the device runs with xnack+"),
        Some(false) => format!("{env}; the device runs with xnack-"),
        None => env.to_string(),
    }
}

/// The APU report from attribute 16.
pub fn apu_note(integrated: Option<i32>) -> (bool, String) {
    match integrated {
        Some(1) => (
            true,
            "yes (hipDeviceAttributeIntegrated = 1): device memory is the same HBM the CPU \
             uses (MI300A class), so memory preallocated here is taken from the host too; \
             prefer a smaller XLA_CLIENT_MEM_FRACTION or growth"
                .into(),
        ),
        Some(v) => (
            false,
            format!("no (hipDeviceAttributeIntegrated = {v}): discrete GPU"),
        ),
        None => (
            false,
            "unknown (hipDeviceAttributeIntegrated not answered)".into(),
        ),
    }
}

/// The note on the memory kind.
pub fn memory_note(kind: MemoryKind) -> String {
    match kind {
        MemoryKind::Coarse => "coarse-grained (hipMalloc): coherent at kernel boundaries, full \
                               bandwidth; fine-grained or uncached on request \
                               (PORTALLOC_HIP_MEMORY, HipDeviceBuilder::memory)"
            .into(),
        MemoryKind::FineGrained => {
            "fine-grained (hipExtMallocWithFlags, hipDeviceMallocFinegrained): \
                                    host-coherent while kernels run, at a bandwidth cost; \
                                    as requested"
                .into()
        }
        MemoryKind::Uncached => "uncached (hipExtMallocWithFlags, hipDeviceMallocUncached): \
                                 fine-grained and bypassing the GPU caches; as requested"
            .into(),
    }
}
