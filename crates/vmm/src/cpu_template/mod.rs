//! CPU templates, as Firecracker has them: what the guest's CPUID and MSRs say, changed so
//! that a fleet of mixed hosts looks like one CPU model (and a snapshot taken on one host
//! restores on another). Static templates by name ([`statics`]), custom ones in
//! Firecracker's JSON schema ([`schema`], over [`bitmap`]s); [`apply`] checks one against
//! this host and applies it. Machines take a [`CpuTemplate`] in their configuration.

pub mod apply;
pub mod bitmap;
pub mod error;
pub mod features;
pub mod schema;
pub mod statics;

pub use error::{SchemaError, TemplateError};
pub use schema::CustomTemplate;
pub use statics::StaticTemplate;

/// The template a machine is built with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CpuTemplate {
    Static(StaticTemplate),
    Custom(CustomTemplate),
}

impl CpuTemplate {
    /// How messages name it: `T2`, or `custom (cpu-config)`.
    pub fn describe(&self) -> String {
        match self {
            CpuTemplate::Static(t) => t.name().into(),
            CpuTemplate::Custom(_) => "custom (cpu-config)".into(),
        }
    }

    /// Checked against this host (vendor, features, KVM) and applied to `supported`
    /// (KVM's CPUID) on a host of profile `host`.
    pub fn resolve(
        &self,
        kvm: &kvm_ioctls::Kvm,
        supported: &kvm_bindings::CpuId,
        host: &crate::host::HostProfile,
    ) -> Result<apply::Applied, TemplateError> {
        let (template, vendor) = match self {
            CpuTemplate::Static(t) => (std::borrow::Cow::Owned(t.template()), Some(apply::vendor_of(*t))),
            CpuTemplate::Custom(t) => (std::borrow::Cow::Borrowed(t), None),
        };
        let masks = host.cpuid_masks();
        let hardware = apply::hardware_cpuid;
        let offer = apply::Offer {
            supported,
            masks: &masks,
            hardware: host.nested().then_some(&hardware as &dyn Fn(u32, u32) -> [u32; 4]),
        };
        let cpuid = apply::apply_cpuid(&self.describe(), &template, vendor, &apply::host_vendor(), &offer)?;
        apply::check_kvm(&template, kvm)?;
        Ok(apply::Applied { cpuid, msrs: template.msr_modifiers.clone() })
    }
}
