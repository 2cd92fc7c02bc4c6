//! What releasing physical memory gives back, found once when a device with virtual memory is
//! opened — never inferred from a version number.
//!
//! The drivers document that a released handle's memory goes back once its last mapping is
//! unmapped. ROCm 7.x on Linux keeps it instead for as long as a reservation it was mapped
//! into stays reserved (ROCm/legacy-rocm-build#6021): vLLM's sleep freed 2 of 180 GiB on an
//! MI300X until it freed and re-reserved each range (vllm-project/vllm#37533,
//! torch_memory_saver#84). The probe tries it with one granule, in a scratch reservation:
//!
//! 1. reserve one granule (no hint), create one granule of physical memory, map it, set
//!    access, unmap;
//! 2. read the free memory, release the handle, read it again: a rise of about the granule
//!    (at least half of it) is "returned at release", and the probe ends (the reservation is
//!    freed);
//! 3. otherwise, once more (another process may have allocated in between): create, map, set
//!    access, unmap, read, release, read;
//! 4. still no rise: read, free the reservation, read — a rise then is "held until its
//!    reservation is freed"; none either is "not known", answered as the documented
//!    behaviour.
//!
//! The first try also watches the process's descriptors (`/proc/self/fd`): a descriptor that
//! appears at the create and goes at the release means the driver spends one per handle
//! (ROCm 7.14, ROCm/rocm-systems#10604) — [`ReleaseProbe::descriptor_per_handle`]. No driver
//! call is added for it.
//!
//! Cost: 9 driver calls (reserve, create, map, set access, unmap, 2 × free memory, release,
//! free reservation) where the memory comes back at release, 18 where it is held, plus the
//! calls that make the device current and the caller's current again. A call refused ends the
//! probe: everything it made is given back (what the driver refuses to take back even then
//! is booked to the device, whose drop gives it back), the answer is false and the note says
//! which call refused.

use super::VendorApi;
use crate::backends::descriptors;
use crate::error::Result;
use crate::units::Bytes;

/// The key of the note ([`crate::DeviceInfo::notes`]) that says what the probe found.
pub(crate) const NOTE: &str = "released memory";

/// What the probe found, and the note that says so.
#[derive(Debug)]
pub(crate) struct ReleaseProbe {
    /// True when a released handle's memory stays in use until its reservation is freed.
    pub(crate) holds: bool,
    /// What was found, how, and what vmm does about it.
    pub(crate) note: String,
    /// What the probe made and the driver refused to take back, twice: the device books it,
    /// so that its drop gives it back.
    pub(crate) kept: Scratch,
    /// Whether the driver opened a file descriptor for the handle and closed it at its
    /// release (`None`: not known — the descriptors cannot be listed, or the probe failed
    /// before a release).
    pub(crate) descriptor_per_handle: Option<bool>,
    /// Whether the driver made the first handle exportable as a POSIX descriptor when asked
    /// (`super::EXPORTABLE_YES`), refused the request for anything but memory (no such handle
    /// type, a container without it: `_NO`), or could not tell (`_UNKNOWN`).
    pub(crate) exportable: u8,
}

/// What the free memory did, in bytes: each release tried, then the reservation's free.
#[derive(Debug)]
enum Found {
    /// A release gave back about the granule (`rises`: what each release tried gave back).
    Returned { rises: Vec<u64> },
    /// No release did; freeing the reservation gave back `freed`.
    Held { rises: Vec<u64>, freed: u64 },
    /// Neither did.
    Unclear { rises: Vec<u64>, freed: u64 },
}

/// Probes `vendor`'s device with one granule of `granularity` bytes: makes the device
/// current, runs the probe, gives back what it made, and makes the caller's current again.
/// What the driver refused to take back is in [`ReleaseProbe::kept`].
pub(crate) fn probe_release<V: VendorApi>(vendor: &V, granularity: u64) -> ReleaseProbe {
    let mut kept = Scratch::default();
    let mut descriptor_per_handle = None;
    let mut exportable = super::EXPORTABLE_UNKNOWN;
    let found = match vendor.enter() {
        Ok(saved) => {
            let mut scratch = Scratch::default();
            let found = run(
                vendor,
                granularity,
                &mut scratch,
                (&mut descriptor_per_handle, &mut exportable),
            );
            kept = scratch.give_back(vendor);
            if let Some(saved) = saved {
                vendor.leave(saved);
            }
            found
        }
        Err(e) => Err(e),
    };
    let g = Bytes(granularity);
    let list = |rises: &[u64]| {
        rises
            .iter()
            .map(|&r| Bytes(r).to_string())
            .collect::<Vec<_>>()
            .join(", then ")
    };
    match found {
        Ok(Found::Returned { rises }) => ReleaseProbe {
            descriptor_per_handle,
            exportable,
            kept,
            holds: false,
            note: format!(
                "returned at release (probed: releasing an unmapped {g} handle gave back {})",
                list(&rises)
            ),
        },
        Ok(Found::Held { rises, freed }) => ReleaseProbe {
            descriptor_per_handle,
            exportable,
            kept,
            holds: true,
            note: format!(
                "held until its reservation is freed (probed: releasing an unmapped {g} handle \
                 gave back {}; freeing the reservation, with the {} released handles it held, \
                 gave back {}) — the vmm strategy frees whole segments of 256 MiB that nothing \
                 awake uses and reserves them again at the same address, so its sleep and trim \
                 return memory",
                list(&rises),
                rises.len(),
                Bytes(freed)
            ),
        },
        Ok(Found::Unclear { rises, freed }) => ReleaseProbe {
            descriptor_per_handle,
            exportable,
            kept,
            holds: false,
            note: format!(
                "not known (probed: the free memory the driver reports rose by {} at the \
                 releases of an unmapped {g} handle and by {} when its reservation was freed); \
                 taken as returned at release",
                list(&rises),
                Bytes(freed)
            ),
        },
        Err(e) => {
            tracing::warn!(backend = V::BACKEND, error = %e,
                "could not probe what releasing physical memory gives back");
            ReleaseProbe {
                kept,
                descriptor_per_handle,
                exportable,
                holds: false,
                note: format!("not known: the probe failed ({e}); taken as returned at release"),
            }
        }
    }
}

/// What the probe made and has not given back yet.
#[derive(Debug, Default)]
pub(crate) struct Scratch {
    /// The scratch reservation `(va, size)`.
    pub(crate) reservation: Option<(u64, u64)>,
    /// The physical handle of the try in progress.
    pub(crate) handle: Option<u64>,
    /// Whether the handle is mapped over the whole reservation.
    pub(crate) mapped: bool,
}

impl Scratch {
    /// Gives back what is left — the mapping, then the handle, then the reservation, each
    /// once more where the probe's own call was refused — and keeps what the driver refuses
    /// again, for the device's books (its drop gives it back, and the census counts it).
    fn give_back<V: VendorApi>(mut self, vendor: &V) -> Scratch {
        let warn = |what: &str, e: crate::Error| {
            tracing::warn!(backend = V::BACKEND, error = %e,
                "probing what a release gives back: could not {what}; the device keeps it \
                 and gives it back when it goes");
        };
        // SAFETY: each is what this probe made and still holds (the probe forgets what it
        // gave back itself), used by nothing (no work was queued), given back once, mappings
        // before their handle and reservation.
        unsafe {
            if let (true, Some((va, size))) = (self.mapped, self.reservation) {
                match vendor.unmap(va, size) {
                    Ok(()) => self.mapped = false,
                    Err(e) => warn("unmap", e),
                }
            }
            if let (false, Some(h)) = (self.mapped, self.handle) {
                match vendor.release_physical(h) {
                    Ok(()) => self.handle = None,
                    Err(e) => warn("release a handle", e),
                }
            }
            if let (false, Some((va, size))) = (self.mapped, self.reservation) {
                match vendor.free_reservation(va, size) {
                    Ok(()) => self.reservation = None,
                    Err(e) => warn("free a reservation", e),
                }
            }
        }
        self
    }
}

/// The probe, with the device current (see the module docs); what it made and did not give
/// back is in `scratch`, whether the first handle held a descriptor in `per_handle`.
fn run<V: VendorApi>(
    vendor: &V,
    g: u64,
    scratch: &mut Scratch,
    (per_handle, exportable): (&mut Option<bool>, &mut u8),
) -> Result<Found> {
    let va = vendor.reserve(g, g, 0)?;
    scratch.reservation = Some((va, g));
    let mut rises = Vec::with_capacity(2);
    for attempt in 0..2 {
        let watch = attempt == 0;
        let before_create = watch.then(descriptors::open_set).flatten();
        // The first handle asks to be exportable as a POSIX descriptor: what every handle
        // of the device asks for when the driver takes it.
        let h = if watch {
            match vendor.create_physical(g, true) {
                Ok(h) => {
                    *exportable = super::EXPORTABLE_YES;
                    h
                }
                // What a driver answers a handle type it does not offer: invalid value (1),
                // not permitted (800: CUDA without the IMEX channel or in a container), not
                // supported (801) — the same numbers in CUDA and HIP. Anything else is the
                // probe failing, as for the other calls.
                Err(crate::Error::Driver {
                    code: 1 | 800 | 801,
                    ..
                }) => {
                    *exportable = super::EXPORTABLE_NO;
                    vendor.create_physical(g, false)?
                }
                Err(e) => return Err(e),
            }
        } else {
            vendor.create_physical(g, *exportable == super::EXPORTABLE_YES)?
        };
        let after_create = before_create.as_ref().and(descriptors::open_set());
        scratch.handle = Some(h);
        // SAFETY: `h` was just made; `[va, va + g)` is the whole reservation just made, with
        // nothing mapped in it (the mapping of an earlier try was unmapped).
        unsafe { vendor.map(va, g, 0, h) }?;
        scratch.mapped = true;
        // SAFETY: mapped just above.
        unsafe { vendor.set_access(va, g, &[]) }?;
        // SAFETY: the whole mapping made above; no work uses it.
        unsafe { vendor.unmap(va, g) }?;
        scratch.mapped = false;
        let (before, _) = vendor.mem_info()?;
        // SAFETY: `h` is live and mapped nowhere now; released once (forgotten below).
        unsafe { vendor.release_physical(h) }?;
        scratch.handle = None;
        if let (Some(before), Some(during)) = (&before_create, &after_create) {
            // A descriptor that came with the handle and went with it: another thread's
            // file opened at the create and closed before the release would look the same,
            // which only makes handles larger than they need be.
            if let Some(after) = descriptors::open_set() {
                *per_handle = Some(during.difference(before).any(|fd| !after.contains(fd)));
            }
        }
        let (after, _) = vendor.mem_info()?;
        let rise = after.saturating_sub(before);
        rises.push(rise);
        if rise >= g / 2 {
            return Ok(Found::Returned { rises });
        }
    }
    let (before, _) = vendor.mem_info()?;
    // SAFETY: the whole reservation made above, nothing mapped in it; freed once (forgotten
    // below).
    unsafe { vendor.free_reservation(va, g) }?;
    scratch.reservation = None;
    let (after, _) = vendor.mem_info()?;
    let freed = after.saturating_sub(before);
    Ok(if freed >= g / 2 {
        Found::Held { rises, freed }
    } else {
        Found::Unclear { rises, freed }
    })
}

/// The note that says whether physical handles are exportable (the probe's first handle).
pub(crate) const EXPORT_NOTE: &str = "export";
