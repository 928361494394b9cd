//! CPU templates as the command line and the API name them: a static template by
//! Firecracker's name (`machine-config`'s `cpu_template`, `run --cpu-template T2`), or a
//! custom one in Firecracker's JSON schema (`PUT /cpu-config`, the config file's
//! `cpu-config`, `run --cpu-template FILE`). crate::api::cpu_config keeps them in the
//! microVM's configuration.

use exitless_vmm::cpu_template::{CpuTemplate, CustomTemplate, StaticTemplate};

/// A template file is small: this is more than any real one.
const MAX_TEMPLATE_FILE: u64 = 1 << 20;

/// Firecracker's `cpu_template` values: a template, or `None` for none.
pub fn static_template(name: &str) -> Result<Option<StaticTemplate>, String> {
    if name == "None" {
        return Ok(None);
    }
    StaticTemplate::from_name(name)
        .map(Some)
        .ok_or_else(|| format!("unknown variant `{name}`, expected one of `C3`, `T2`, `T2S`, `None`, `T2CL`, `T2A`"))
}

/// A custom template from a JSON file.
pub fn read_file(path: &std::path::Path) -> Result<CustomTemplate, String> {
    use std::io::Read;
    let cannot = |e: std::io::Error| format!("cannot read the CPU template {}: {e}", path.display());
    let mut bytes = Vec::new();
    std::fs::File::open(path).map_err(cannot)?.take(MAX_TEMPLATE_FILE + 1).read_to_end(&mut bytes).map_err(cannot)?;
    if bytes.len() as u64 > MAX_TEMPLATE_FILE {
        return Err(format!("the CPU template {} is over {MAX_TEMPLATE_FILE} bytes", path.display()));
    }
    CustomTemplate::from_json(&bytes).map_err(|e| format!("the CPU template {}: {e}", path.display()))
}

/// `run --cpu-template`: a static template's name, or a custom template's file.
pub fn parse_arg(arg: &str) -> Result<CpuTemplate, String> {
    if let Some(t) = StaticTemplate::from_name(arg) {
        return Ok(CpuTemplate::Static(t));
    }
    let path = std::path::Path::new(arg);
    if !path.exists() {
        return Err(format!("'{arg}' is neither a CPU template (C3, T2, T2S, T2CL, T2A) nor a template file"));
    }
    read_file(path).map(CpuTemplate::Custom)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_files_are_told_apart() {
        assert_eq!(static_template("T2").unwrap(), Some(StaticTemplate::T2));
        assert_eq!(static_template("None").unwrap(), None);
        assert!(static_template("t2").unwrap_err().contains("unknown variant `t2`"));
        assert_eq!(parse_arg("T2A").unwrap(), CpuTemplate::Static(StaticTemplate::T2A));
        assert!(parse_arg("/nonexistent/T3.json").unwrap_err().contains("neither"));
        let dir = std::env::temp_dir().join(format!("exitless-cpu-template-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("t.json");
        std::fs::write(&file, r#"{"cpuid_modifiers": [{"leaf": "0x1", "subleaf": "0x0", "flags": 0, "modifiers": [{"register": "ecx", "bitmap": "0b2"}]}]}"#).unwrap();
        let e = parse_arg(file.to_str().unwrap()).unwrap_err();
        assert!(e.contains("t.json") && e.contains("unknown character"), "{e}");
        std::fs::write(&file, "{}").unwrap();
        assert_eq!(parse_arg(file.to_str().unwrap()).unwrap(), CpuTemplate::Custom(CustomTemplate::default()));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
