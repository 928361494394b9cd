//! Why a CPU template was refused: while parsing it (its JSON), or when a machine is built
//! with it on this host. Each is one line a 400's `fault_message` or the command line shows.

/// A template's text (Firecracker's JSON schema) that does not parse or does not hold
/// together.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchemaError {
    #[error("Failed to parse string [{0}] as a bitmap - string is too long (a {1}-bit register)")]
    BitmapTooLong(String, u32),
    #[error("Failed to parse string [{0}] as a bitmap - unknown character: {1:?} (0, 1, x and _ only)")]
    BitmapChar(String, char),
    #[error("Failed to parse string [{0}] as a bitmap - it has no bits")]
    BitmapEmpty(String),
    #[error(
        "No supported number system prefix found in value [{0}]. Make sure to prefix the number with '0x' for \
         hexadecimal numbers or '0b' for binary numbers."
    )]
    NumberPrefix(String),
    #[error("Failed to parse string [{0}] as a number for CPU template - {1}")]
    Number(String, String),
    #[error("Failed to parse string [{0}] as a kvm capability - can not convert to numeric: {1}")]
    KvmCapability(String, String),
    #[error("Invalid CPUID register {0:?}. Must be one of [eax, ebx, ecx, edx]")]
    Register(String),
    #[error("cpuid_modifiers: leaf {0:#x} subleaf {1:#x} is given twice")]
    LeafTwice(u32, u32),
    #[error("cpuid_modifiers: leaf {0:#x} subleaf {1:#x} modifies {2} twice")]
    RegisterTwice(u32, u32, &'static str),
    #[error("msr_modifiers: MSR {0:#x} is given twice")]
    MsrTwice(u32),
    #[error("{0}")]
    Json(String),
}

/// A template this host cannot offer, found while a machine is built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    #[error("the CPU template {template} is for {want} CPUs; this host's is {have}")]
    Vendor { template: String, want: &'static str, have: String },
    #[error(
        "the CPU template {template} keeps {feature} (CPUID leaf {leaf:#x} subleaf {subleaf:#x} {register} bit \
         {bit}), which this host does not offer{why}"
    )]
    Feature {
        template: String,
        feature: String,
        leaf: u32,
        subleaf: u32,
        register: &'static str,
        bit: u32,
        why: String,
    },
    #[error("Template changes a CPUID entry not supported by KVM: Leaf: {0:#x}, Subleaf: {1:#x}")]
    CpuidNotSupported(u32, u32),
    #[error("Template changes an MSR entry not supported by KVM: Register Address: {0:#x}")]
    MsrNotSupported(u32),
    #[error("Missing KVM capabilities: {0:#x}")]
    KvmCapability(u32),
    #[error("{what} failed: {source}")]
    Ioctl {
        what: &'static str,
        #[source]
        source: kvm_ioctls::Error,
    },
}
