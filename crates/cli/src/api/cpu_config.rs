//! CPU templates in the microVM's configuration, as Firecracker keeps them: one slot, which
//! `machine-config`'s `cpu_template` fills with a static template (`"None"` empties it; a
//! machine-config without the field leaves it as it was) and `PUT /cpu-config` (or the
//! config file's `cpu-config`, an object or a file's path) with a custom one. The
//! configuration, and so a snapshot's state file, holds the template itself, never a path.

use super::model::MachineConfig;
use super::vm::{Fault, Vm};
use exitless_vmm::cpu_template::{CpuTemplate, CustomTemplate};

impl Vm {
    /// `PUT /cpu-config`: a custom template, replacing any static one.
    pub fn set_cpu_config(&mut self, template: CustomTemplate) -> Result<(), Fault> {
        self.pre_boot()?;
        self.config.cpu_config = Some(serde_json::to_value(&template)?);
        self.config.machine_config.cpu_template = None;
        Ok(())
    }

    /// The config file's `cpu-config`: a template, or the path of a file holding one.
    pub fn set_cpu_config_section(&mut self, section: serde_json::Value) -> Result<(), Fault> {
        let template = match section {
            serde_json::Value::String(path) => crate::cpu_template::read_file(path.as_ref()).map_err(Fault)?,
            value => CustomTemplate::from_value(value).map_err(|e| Fault(format!("cpu-config: {e}")))?,
        };
        self.set_cpu_config(template)
    }

    /// The template a machine-config `c` leaves in force: its static one (a custom one is
    /// dropped), none for `"None"`, or the one before when it names none.
    pub(super) fn take_cpu_template(&mut self, c: &mut MachineConfig) -> Result<(), Fault> {
        match c.cpu_template.as_deref() {
            None => c.cpu_template = self.config.machine_config.cpu_template.clone(),
            Some(name) => {
                let template =
                    crate::cpu_template::static_template(name).map_err(|e| Fault(format!("cpu_template: {e}.")))?;
                c.cpu_template = template.map(|t| t.name().to_string());
                self.config.cpu_config = None;
            }
        }
        Ok(())
    }

    /// The template the machine is built with (a restore's comes from its snapshot's
    /// configuration, checked against this host the same way).
    pub(super) fn cpu_template(&self) -> Result<Option<CpuTemplate>, Fault> {
        if let Some(value) = &self.config.cpu_config {
            let custom = CustomTemplate::from_value(value.clone()).map_err(|e| Fault(format!("cpu-config: {e}")))?;
            return Ok(Some(CpuTemplate::Custom(custom)));
        }
        match self.config.machine_config.cpu_template.as_deref() {
            None => Ok(None),
            Some(name) => Ok(crate::cpu_template::static_template(name)
                .map_err(|e| Fault(format!("cpu_template: {e}.")))?
                .map(CpuTemplate::Static)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use exitless_vmm::cpu_template::StaticTemplate;

    fn mc(template: Option<&str>) -> MachineConfig {
        MachineConfig { cpu_template: template.map(str::to_string), ..MachineConfig::default() }
    }

    #[test]
    fn one_slot_for_a_static_or_a_custom_template_as_in_firecracker() {
        let mut vm = Vm::new("t".into());
        let custom = CustomTemplate::from_json(br#"{"kvm_capabilities": ["171"]}"#).unwrap();
        vm.set_cpu_config(custom.clone()).unwrap();
        assert_eq!(vm.cpu_template().unwrap(), Some(CpuTemplate::Custom(custom.clone())));
        // A machine-config that names none keeps it; one that names a template replaces it.
        vm.set_machine_config(mc(None)).unwrap();
        assert_eq!(vm.cpu_template().unwrap(), Some(CpuTemplate::Custom(custom.clone())));
        vm.set_machine_config(mc(Some("T2S"))).unwrap();
        assert_eq!(vm.cpu_template().unwrap(), Some(CpuTemplate::Static(StaticTemplate::T2S)));
        assert!(vm.config.cpu_config.is_none());
        // A custom one replaces the static one; "None" empties the slot.
        vm.set_cpu_config(custom).unwrap();
        assert_eq!(vm.config.machine_config.cpu_template, None);
        vm.set_machine_config(mc(Some("None"))).unwrap();
        assert_eq!(vm.cpu_template().unwrap(), None);
        assert_eq!(serde_json::to_value(&vm.config.machine_config).unwrap().get("cpu_template"), None);
        // An unknown name is refused and changes nothing.
        vm.set_machine_config(mc(Some("C3"))).unwrap();
        let e = vm.set_machine_config(mc(Some("c3"))).unwrap_err();
        assert!(e.0.starts_with("cpu_template: unknown variant `c3`"), "{e:?}");
        assert_eq!(vm.config.machine_config.cpu_template.as_deref(), Some("C3"));
    }

    #[test]
    fn the_config_files_section_is_a_template_or_its_files_path() {
        let mut vm = Vm::new("t".into());
        let e = vm.set_cpu_config_section(serde_json::json!({"cpuid_modifiers": [{"leaf": "0x1"}]})).unwrap_err();
        assert!(e.0.starts_with("cpu-config: missing field"), "{e:?}");
        let e = vm.set_cpu_config_section(serde_json::json!("/nonexistent/template.json")).unwrap_err();
        assert!(e.0.contains("cannot read the CPU template /nonexistent/template.json"), "{e:?}");
        let e = vm.set_cpu_config_section(serde_json::json!(7)).unwrap_err();
        assert!(e.0.contains("a CPU template is a JSON object"), "{e:?}");
        vm.set_cpu_config_section(serde_json::json!({})).unwrap();
        assert_eq!(vm.cpu_template().unwrap(), Some(CpuTemplate::Custom(CustomTemplate::default())));
    }
}
