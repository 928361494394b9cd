//! The PCI root: bus 0's functions, their config space whichever way it is reached, BARs
//! placed on the VMM's buses (moving them, and their ioeventfds, when the guest does),
//! and the ECAM shadow pages kept current.

use super::config::{BarKind, ConfigSpace, BAR_COUNT, CONFIG_SIZE};
use super::ecam::EcamShadow;
use super::FUNCTIONS;
use crate::bus::{BusDevice, DeviceId, MmioAddress, PioAddress, SharedBuses};
use crate::ioeventfd::{IoSpace, IoeventfdKey, IoeventfdRegistry};
use crate::layout::PciWindows;
use std::sync::{Arc, Mutex};
use vmm_sys_util::eventfd::EventFd;

/// How the ECAM window is served.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EcamMode {
    /// Every access exits to the VMM.
    Trapped,
    /// Reads come from read-only memory holding current config space; writes exit.
    Mapped,
}

#[derive(Debug, thiserror::Error)]
pub enum PciError {
    #[error("PCI slot 00:{0:02x}.{1} is taken or out of range")]
    SlotTaken(u8, u8),
    #[error("cannot set up the ECAM shadow")]
    Shadow(#[source] super::ecam::ShadowError),
}

/// What answers on one BAR, and where it is on the bus now.
struct BarHandler {
    device: Arc<dyn BusDevice>,
    id: DeviceId,
    /// Where the BAR is decoded now (None: decode off, or no valid place).
    mapped: Option<u64>,
    /// Its ioeventfds while it is off the bus, relative to the BAR: registered with KVM
    /// only while the BAR is decoded, so no kick reaches a device that is off the bus and
    /// no stale registration blocks another BAR.
    parked: Vec<(IoeventfdKey, EventFd)>,
}

/// A device's say in its own config space: told about every write (capability registers
/// may drive device state, like MSI-X enable), and able to answer a read itself (a
/// function that does must set `read_side_effects`, so its ECAM page stays trapped).
pub trait ConfigHook: Send + Sync {
    fn config_written(&self, config: &ConfigSpace, offset: usize, len: usize);

    /// Fills `data` and returns true to answer the read instead of the plain bytes.
    fn config_read(&self, _config: &ConfigSpace, _offset: usize, _data: &mut [u8]) -> bool {
        false
    }
}

/// A function: config space, what serves its BARs, and whether reading its config has
/// side effects (then its ECAM page is never mapped, so such reads keep exiting).
pub struct PciFunction {
    pub name: String,
    pub config: ConfigSpace,
    bars: [Option<BarHandler>; BAR_COUNT],
    pub read_side_effects: bool,
    hook: Option<Arc<dyn ConfigHook>>,
}

impl PciFunction {
    pub fn new(name: &str, config: ConfigSpace) -> Self {
        PciFunction { name: name.into(), config, bars: Default::default(), read_side_effects: false, hook: None }
    }

    pub fn with_hook(mut self, hook: Arc<dyn ConfigHook>) -> Self {
        self.hook = Some(hook);
        self
    }

    /// `device` answers on BAR `index` (declared in the config space), counted as `id`.
    pub fn with_bar(mut self, index: usize, id: DeviceId, device: Arc<dyn BusDevice>) -> Self {
        assert!(self.config.bar(index).is_some(), "VMM bug: BAR {index} not declared in config space");
        self.bars[index] = Some(BarHandler { device, id, mapped: None, parked: Vec::new() });
        self
    }

    /// ioeventfds at offsets (`key.addr`) inside BAR `index`, registered wherever the BAR
    /// is decoded.
    pub fn with_ioeventfds(mut self, index: usize, ioeventfds: Vec<(IoeventfdKey, EventFd)>) -> Self {
        if let Some(bar) = self.bars[index].as_mut() {
            bar.parked.extend(ioeventfds);
        }
        self
    }
}

struct PciState {
    /// Boxed: a function's 4 KiB config space is allocated for the few that exist, not
    /// for all 256 slots (which made 145 KiB resident in every VM).
    functions: Vec<Option<Box<PciFunction>>>,
    shadow: EcamShadow,
    mode: EcamMode,
}

/// BAR placement problems logged before we go quiet (a guest can provoke them at will).
const MAX_BAR_WARNINGS: u32 = 16;

pub struct PciRoot {
    state: Mutex<PciState>,
    bar_warnings: std::sync::atomic::AtomicU32,
    buses: Arc<SharedBuses>,
    ioeventfds: Arc<IoeventfdRegistry>,
    /// Where BARs may be decoded.
    windows: PciWindows,
}

impl PciRoot {
    pub fn new(
        buses: Arc<SharedBuses>,
        ioeventfds: Arc<IoeventfdRegistry>,
        shadow: EcamShadow,
        mode: EcamMode,
        windows: PciWindows,
    ) -> Result<Self, PciError> {
        let mut functions = Vec::with_capacity(FUNCTIONS);
        functions.resize_with(FUNCTIONS, || None);
        let state = Mutex::new(PciState { functions, shadow, mode: EcamMode::Trapped });
        let root = PciRoot { state, bar_warnings: Default::default(), buses, ioeventfds, windows };
        root.set_ecam_mode(mode)?;
        Ok(root)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PciState> {
        crate::sync::lock(&self.state)
    }

    /// Plugs `function` in at 00:`device`.`func` and places its BARs.
    pub fn add(&self, device: u8, func: u8, function: PciFunction) -> Result<(), PciError> {
        let index = usize::from(device) << 3 | usize::from(func);
        let mut state = self.lock();
        if device >= 32 || func >= 8 || state.functions[index].is_some() {
            return Err(PciError::SlotTaken(device, func));
        }
        let changes_slots = function.read_side_effects;
        state.functions[index] = Some(Box::new(function));
        self.place_bars(&mut state, index);
        state.shadow.refresh(index, state.functions[index].as_deref().map(|f| f.config.bytes()));
        // Only a function whose page must stay trapped changes which pages are mapped.
        if state.mode == EcamMode::Mapped && changes_slots {
            let mode = state.mode;
            Self::remap_shadow(&mut state, mode)?;
        }
        Ok(())
    }

    /// Unplugs the function at 00:`device`.`func`: its BARs off the bus, their ioeventfds
    /// out of KVM, its config space reading all-ones again. Returns it (its BARs' specs
    /// say what to give back to the allocators).
    pub fn remove(&self, device: u8, func: u8) -> Option<Box<PciFunction>> {
        let index = usize::from(device) << 3 | usize::from(func);
        let mut state = self.lock();
        let mut function = state.functions.get_mut(index)?.take()?;
        for bar in 0..BAR_COUNT {
            self.take_off_bus(&mut function, bar);
            if let Some(handler) = function.bars[bar].as_mut() {
                handler.parked.clear();
            }
        }
        state.shadow.refresh(index, None);
        if state.mode == EcamMode::Mapped && function.read_side_effects {
            let mode = state.mode;
            if let Err(e) = Self::remap_shadow(&mut state, mode) {
                self.warn(format_args!("{}: ECAM shadow not remapped after its unplug: {e}", function.name));
            }
        }
        Some(function)
    }

    /// Maps or unmaps the read-only shadow of the ECAM window (at run time too).
    pub fn set_ecam_mode(&self, mode: EcamMode) -> Result<(), PciError> {
        let mut state = self.lock();
        Self::remap_shadow(&mut state, mode)
    }

    fn remap_shadow(state: &mut PciState, mode: EcamMode) -> Result<(), PciError> {
        let trapped: Vec<bool> =
            state.functions.iter().map(|f| f.as_ref().is_some_and(|f| f.read_side_effects)).collect();
        match mode {
            EcamMode::Mapped => state.shadow.map(|page| !trapped[page]),
            EcamMode::Trapped => state.shadow.unmap(),
        }
        .map_err(PciError::Shadow)?;
        state.mode = mode;
        Ok(())
    }

    /// A config read of function `index` (bus 0); a missing function reads all-ones.
    pub fn config_read(&self, index: usize, offset: usize, data: &mut [u8]) {
        match self.lock().functions.get(index).and_then(Option::as_deref) {
            Some(f) if f.hook.as_ref().is_some_and(|h| h.config_read(&f.config, offset, data)) => {}
            Some(f) => f.config.read(offset, data),
            None => data.fill(0xff),
        }
    }

    /// A config write: applied, BARs moved if their address or decode changed, and the
    /// function's ECAM shadow page rewritten before the vCPU resumes.
    pub fn config_write(&self, index: usize, offset: usize, data: &[u8]) {
        let mut state = self.lock();
        let Some(function) = state.functions.get_mut(index).and_then(Option::as_deref_mut) else { return };
        function.config.write(offset, data);
        if let Some(hook) = &function.hook {
            hook.config_written(&function.config, offset, data.len());
        }
        self.place_bars(&mut state, index);
        let state = &mut *state;
        state.shadow.refresh(index, state.functions[index].as_deref().map(|f| f.config.bytes()));
    }

    /// Takes every BAR of the functions at `indices` off the bus (their ioeventfds parked).
    /// A restore clears them all before it puts any back, so that no saved place is
    /// refused for a place another function was given when it was built.
    pub fn unplace_bars(&self, indices: &[usize]) {
        let mut state = self.lock();
        for &index in indices {
            let Some(function) = state.functions.get_mut(index).and_then(Option::as_deref_mut) else { continue };
            for bar in 0..BAR_COUNT {
                self.take_off_bus(function, bar);
            }
        }
    }

    /// Puts a snapshot's config space back on function `index`: its BARs placed where the
    /// guest had them, the device told (MSI-X enable and mask), the ECAM shadow rewritten.
    /// Every BAR the guest had decoded must land where it was, its ioeventfds with it:
    /// a device the guest cannot reach is a restore that failed, never a quiet one.
    pub fn restore_config(&self, index: usize, saved: &[u8]) -> Result<(), String> {
        let mut state = self.lock();
        let function = state.functions.get_mut(index).and_then(Option::as_deref_mut).ok_or("no such function")?;
        function.config.restore(saved)?;
        if let Some(hook) = &function.hook {
            // No register written (an empty range): the device re-reads its capabilities.
            hook.config_written(&function.config, 0, 0);
        }
        self.place_bars(&mut state, index);
        let state = &mut *state;
        state.shadow.refresh(index, state.functions[index].as_deref().map(|f| f.config.bytes()));
        let function = state.functions[index].as_deref().ok_or("no such function")?;
        for (bar, handler) in function.bars.iter().enumerate() {
            let Some(handler) = handler else { continue };
            match self.place_for(function, bar) {
                Some(at) if handler.mapped != Some(at) => {
                    return Err(format!("BAR{bar} cannot be put back at {at:#x} (something else is there)"))
                }
                Some(at) if !handler.parked.is_empty() => {
                    return Err(format!("BAR{bar} at {at:#x}: KVM refused its ioeventfds"))
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Where BAR `bar` of `function` belongs: the address its config space gives, if
    /// decode is on and the BAR lies wholly inside a window of its kind.
    fn place_for(&self, function: &PciFunction, bar: usize) -> Option<u64> {
        let spec = function.config.bar(bar)?;
        let address = function.config.bar_address(bar).unwrap_or(0);
        let w = &self.windows;
        let windows = match spec.kind {
            BarKind::Io => [&w.io, &w.io],
            BarKind::Memory32 => [&w.mmio32, &w.mmio32],
            BarKind::Memory64 => [&w.mmio32, &w.mmio64],
        };
        let end = address.checked_add(spec.size);
        let fits = windows.iter().any(|w| w.start <= address && end.is_some_and(|end| end <= w.end));
        (function.config.bar_enabled(bar) && fits).then_some(address)
    }

    /// Takes BAR `bar` of `function` off the bus if it is on it, parking its ioeventfds.
    fn take_off_bus(&self, function: &mut PciFunction, bar: usize) {
        let (Some(spec), Some(handler)) = (function.config.bar(bar), function.bars[bar].as_mut()) else { return };
        let Some(old) = handler.mapped.take() else { return };
        tracing::debug!("{} BAR{bar}: off the bus at {old:#x}", function.name);
        let space = if spec.is_memory() { IoSpace::Mmio } else { IoSpace::Pio };
        let _ = self.buses.update(|b| match space {
            IoSpace::Pio => b.pio.remove(PioAddress(old as u16)).map(drop),
            IoSpace::Mmio => b.mmio.remove(MmioAddress(old)).map(drop),
        });
        match self.ioeventfds.take_range(space, old, spec.size) {
            Ok(taken) => handler.parked.extend(taken),
            Err(e) => self.warn(format_args!("{} BAR{bar}: ioeventfds stay at {old:#x}: {e}", function.name)),
        }
    }

    /// Puts each BAR of function `index` where its config space says, or takes it off the
    /// bus when decode is off or the address is not a valid place for it.
    fn place_bars(&self, state: &mut PciState, index: usize) {
        let Some(function) = state.functions[index].as_deref_mut() else { return };
        for bar in 0..BAR_COUNT {
            let Some(spec) = function.config.bar(bar) else { continue };
            let wanted = self.place_for(function, bar);
            if function.bars[bar].as_ref().is_none_or(|h| h.mapped == wanted) {
                continue;
            }
            self.take_off_bus(function, bar);
            let Some(new) = wanted else { continue };
            let Some(handler) = function.bars[bar].as_mut() else { continue };
            let space = if spec.is_memory() { IoSpace::Mmio } else { IoSpace::Pio };
            let (id, device) = (handler.id, handler.device.clone());
            let placed = self.buses.update(|b| match space {
                IoSpace::Pio => b.pio.insert(PioAddress(new as u16), spec.size, id, device),
                IoSpace::Mmio => b.mmio.insert(MmioAddress(new), spec.size, id, device),
            });
            match placed {
                Ok(()) => {
                    tracing::debug!("{} BAR{bar}: on the bus at {new:#x} ({:#x} bytes)", function.name, spec.size);
                    handler.mapped = Some(new);
                    self.register_parked(&function.name, bar, handler, new);
                }
                // The bus says why (an overlap, say): the BAR stays off the bus.
                Err(e) => self.warn(format_args!("{} BAR{bar} at {new:#x}: {e}; left off the bus", function.name)),
            }
        }
    }

    fn warn(&self, message: std::fmt::Arguments) {
        let n = self.bar_warnings.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if n < MAX_BAR_WARNINGS {
            tracing::warn!("{message}");
        } else if n == MAX_BAR_WARNINGS {
            tracing::warn!("further BAR placement problems are not reported");
        }
    }

    /// Replaces the ioeventfds of BAR `bar` of function `index` (offsets in `key.addr`):
    /// the old ones leave KVM, the new ones are registered wherever the BAR is decoded.
    pub fn set_bar_ioeventfds(&self, index: usize, bar: usize, ioeventfds: Vec<(IoeventfdKey, EventFd)>) {
        let mut state = self.lock();
        let Some(function) = state.functions.get_mut(index).and_then(Option::as_deref_mut) else { return };
        let (Some(spec), Some(handler)) = (function.config.bar(bar), function.bars[bar].as_mut()) else { return };
        let space = if spec.is_memory() { IoSpace::Mmio } else { IoSpace::Pio };
        handler.parked = ioeventfds;
        if let Some(base) = handler.mapped {
            if let Err(e) = self.ioeventfds.take_range(space, base, spec.size) {
                self.warn(format_args!("{} BAR{bar}: old ioeventfds stay: {e}", function.name));
            }
            self.register_parked(&function.name, bar, handler, base);
        }
    }

    /// Registers a mapped BAR's parked ioeventfds at `base`; those KVM refuses stay parked.
    fn register_parked(&self, name: &str, bar: usize, handler: &mut BarHandler, base: u64) {
        let mut still_parked = Vec::new();
        for (key, fd) in handler.parked.drain(..) {
            let at = IoeventfdKey { addr: key.addr + base, ..key };
            if let Err(e) = self.ioeventfds.register(at, &fd) {
                self.warn(format_args!("{name} BAR{bar}: ioeventfd not registered: {e}"));
                still_parked.push((key, fd));
            }
        }
        handler.parked = still_parked;
    }

    /// Where BAR `bar` of function `index` is decoded now (for tests and the lab).
    pub fn bar_mapping(&self, index: usize, bar: usize) -> Option<u64> {
        self.lock().functions.get(index)?.as_ref()?.bars.get(bar)?.as_ref()?.mapped
    }

    /// A copy of ECAM page `index` as a mapped read would see it.
    pub fn with_shadow_page(&self, index: usize) -> Vec<u8> {
        self.lock().shadow.page(index)
    }

    /// A copy of a function's config space (for tests and the lab).
    pub fn config_snapshot(&self, index: usize) -> Option<[u8; CONFIG_SIZE]> {
        self.lock().functions.get(index)?.as_ref().map(|f| *f.config.bytes())
    }
}
