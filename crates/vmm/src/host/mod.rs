//! The host profile: what a host's KVM needs from the VMM beyond the KVM API, chosen once
//! at start, so that the exit path on a host that needs nothing carries nothing.
//!
//! A host whose KVM runs guest CPL0 natively (kvm_intel, kvm_amd) is `native`: none of
//! the workarounds below is installed. A nested, pagetable-based KVM (kvm_pvm) emulates
//! guest CPL0 one instruction at a time and leaves some instructions and one transition
//! undone; its profile is `nested`, which installs the CPUID masks (`cpuid`), instruction
//! completion (`emulate`, `nested_exits`), the LSTAR watch (`emulate::syscall`) and the vCPU
//! filter's extra ioctls (crate::seccomp). docs/architecture.md, "The nested-host profile",
//! says why each is needed and what it costs.

pub mod cpuid;
pub mod emulate;
pub mod nested_exits;
pub mod readonly_probe;

pub use nested_exits::NestedExits;

/// `--host-profile`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ProfileChoice {
    /// Probe the host (the default).
    #[default]
    Auto,
    Nested,
    Native,
}

impl std::str::FromStr for ProfileChoice {
    type Err = ProfileParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(ProfileChoice::Auto),
            "nested" => Ok(ProfileChoice::Nested),
            "native" => Ok(ProfileChoice::Native),
            other => Err(ProfileParseError(other.to_string())),
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("no host profile '{0}' (have: auto, nested, native)")]
pub struct ProfileParseError(String);

/// Which workarounds a machine installs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostKind {
    /// Guest CPL0 runs natively: no workaround.
    Native,
    /// Guest CPL0 is emulated and left incomplete in places: every workaround.
    Nested,
}

/// The profile in force and why it was chosen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostProfile {
    pub kind: HostKind,
    pub why: String,
}

impl HostProfile {
    /// The profile `choice` asks for, probing the host for `auto`.
    pub fn choose(choice: ProfileChoice) -> HostProfile {
        match choice {
            ProfileChoice::Auto => HostProfile::probe(),
            ProfileChoice::Nested => HostProfile { kind: HostKind::Nested, why: "forced by --host-profile".into() },
            ProfileChoice::Native => HostProfile { kind: HostKind::Native, why: "forced by --host-profile".into() },
        }
    }

    /// Which KVM module serves /dev/kvm: kvm_pvm runs guest CPL0 by emulation (nested),
    /// kvm_intel and kvm_amd run it in hardware (native). Where /sys is not there to ask (a
    /// jail), /dev/kvm is: see [`HostProfile::from_kvm`].
    pub fn probe() -> HostProfile {
        let modules = std::path::Path::new("/sys/module");
        if !modules.exists() {
            return HostProfile::from_kvm();
        }
        HostProfile::from_modules(|m| modules.join(m).exists())
    }

    /// From KVM itself: kvm_intel and kvm_amd report the size of a vCPU's nested state
    /// (KVM_CAP_NESTED_STATE, whether or not nesting is on); kvm_pvm has none to report.
    fn from_kvm() -> HostProfile {
        let nested_state = match crate::kvm::open() {
            Ok(kvm) => kvm.check_extension_int(kvm_ioctls::Cap::NestedState),
            Err(_) => {
                return HostProfile {
                    kind: HostKind::Native,
                    why: "no /sys/module, and /dev/kvm cannot be opened".into(),
                }
            }
        };
        if nested_state == 0 {
            return HostProfile {
                kind: HostKind::Nested,
                why: "no /sys/module here (a jail?); KVM reports no nested state, as kvm_pvm does".into(),
            };
        }
        HostProfile {
            kind: HostKind::Native,
            why: "no /sys/module here (a jail?); KVM reports nested state: hardware KVM".into(),
        }
    }

    fn from_modules(loaded: impl Fn(&str) -> bool) -> HostProfile {
        if loaded("kvm_pvm") {
            return HostProfile {
                kind: HostKind::Nested,
                why: "KVM is kvm_pvm: guest CPL0 is emulated, some of it never completed".into(),
            };
        }
        let why = match ["kvm_intel", "kvm_amd"].into_iter().find(|m| loaded(m)) {
            Some(module) => format!("KVM is {module}: guest CPL0 runs in hardware"),
            None => "no known nested KVM module loaded".to_string(),
        };
        HostProfile { kind: HostKind::Native, why }
    }

    pub fn nested(&self) -> bool {
        self.kind == HostKind::Nested
    }

    pub fn name(&self) -> &'static str {
        match self.kind {
            HostKind::Native => "native",
            HostKind::Nested => "nested",
        }
    }

    /// The features hidden from the guest's CPUID.
    pub fn cpuid_masks(&self) -> cpuid::Masks {
        match self.kind {
            HostKind::Native => cpuid::Masks::PLATFORM,
            HostKind::Nested => cpuid::Masks::NESTED,
        }
    }

    /// What a Linux guest's command line needs on this host, added when it lacks them
    /// (docs/linux.md): on a nested host, the `clearcpuid` list: XSAVE (154; its KVM shows
    /// XSAVE whatever CPUID says and cannot emulate xrstor at CPL0; cleared as `noxsave`
    /// would, but a word with `=`, which Linux never hands to init: Kata's agent, as
    /// init, refuses an argument it does not know), and SSSE3, SSE4.1/4.2, AES-NI,
    /// PCLMULQDQ (self-tests in them are instructions KVM cannot emulate, each completed
    /// by the VMM at an exit's cost), and `rodata=off` (the W+X walk and rodata
    /// self-test take tens of minutes where CPL0 is emulated), `cryptomgr.notests` (a
    /// kernel built with the crypto self-tests, Firecracker's own config among them, runs
    /// them for minutes at emulated CPL0; Kata passes it for the same reason) and
    /// `initcall_blacklist=jent_mod_init` (the jitter entropy source's start-up test hashes
    /// with SHA-3 in a loop that soft-locks for minutes at emulated CPL0; the guest keeps
    /// its other entropy, virtio-rng among it). None on a native host.
    pub fn linux_args(&self) -> &'static [&'static str] {
        match self.kind {
            HostKind::Native => &[],
            HostKind::Nested => &[
                "clearcpuid=154,137,147,148,153,129",
                "rodata=off",
                "cryptomgr.notests",
                "initcall_blacklist=jent_mod_init",
            ],
        }
    }

    /// `nested (KVM is kvm_pvm: ...)`, for logs and the exit profile.
    pub fn describe(&self) -> String {
        format!("{} ({})", self.name(), self.why)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probe_follows_the_kvm_module_and_the_flag_wins() {
        assert!(HostProfile::from_modules(|m| m == "kvm_pvm" || m == "kvm_intel").nested());
        let native = HostProfile::from_modules(|m| m == "kvm_amd");
        assert_eq!((native.kind, native.why.contains("kvm_amd")), (HostKind::Native, true));
        assert_eq!(native.cpuid_masks(), cpuid::Masks::PLATFORM);
        assert_eq!(HostProfile::choose(ProfileChoice::Native).kind, HostKind::Native);
        assert_eq!(HostProfile::choose(ProfileChoice::Nested).cpuid_masks(), cpuid::Masks::NESTED);
        assert!("fast".parse::<ProfileChoice>().is_err());
        assert_eq!("native".parse::<ProfileChoice>().unwrap(), ProfileChoice::Native);
    }
}
