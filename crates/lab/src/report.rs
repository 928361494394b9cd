//! What every lab prints and writes besides its own table: the targets, and the
//! JSON and SVG files asked for on the command line.

use serde_json::{json, Value};
use std::path::PathBuf;

/// One target from an issue, as measured.
pub struct Target {
    pub what: String,
    pub measured: String,
    pub met: bool,
}

impl Target {
    pub fn new(what: impl Into<String>, measured: impl Into<String>, met: bool) -> Self {
        Target { what: what.into(), measured: measured.into(), met }
    }
}

/// The "targets:" block under a lab's table.
pub fn targets_text(targets: &[Target]) -> String {
    let width = targets.iter().map(|t| t.what.len()).max().unwrap_or(0);
    let mut s = String::from("targets:\n");
    for t in targets {
        s += &format!("  {:<width$} {:>10}  {}\n", t.what, t.measured, if t.met { "met" } else { "NOT met" });
    }
    s
}

pub fn targets_json(targets: &[Target]) -> Vec<Value> {
    targets.iter().map(|t| json!({"target": t.what, "measured": t.measured, "met": t.met})).collect()
}

#[derive(Debug, thiserror::Error)]
#[error("cannot write {0}: {1}")]
pub struct WriteError(pub PathBuf, pub std::io::Error);

/// Prints a lab's table; a stdout that cannot take it (a full disk, a closed pipe) is an
/// error with its cause, not a panic.
pub fn print_table(text: &str) -> Result<(), WriteError> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes()).and_then(|()| out.flush()).map_err(|e| WriteError("standard output".into(), e))
}

/// `--json FILE` and `--svg FILE`, both optional.
#[derive(Clone, Debug, Default)]
pub struct Outputs {
    pub json: Option<PathBuf>,
    pub svg: Option<PathBuf>,
}

impl Outputs {
    /// Creates the files asked for now, so a path that cannot be written is found before
    /// minutes of measuring, not after.
    pub fn check(&self) -> Result<(), WriteError> {
        for path in self.json.iter().chain(&self.svg) {
            std::fs::File::create(path).map_err(|e| WriteError(path.clone(), e))?;
        }
        Ok(())
    }

    /// Writes the files asked for; the contents are only built when wanted.
    pub fn write(&self, json: impl FnOnce() -> Value, svg: impl FnOnce() -> String) -> Result<(), WriteError> {
        if let Some(path) = &self.json {
            std::fs::write(path, json().to_string() + "\n").map_err(|e| WriteError(path.clone(), e))?;
        }
        if let Some(path) = &self.svg {
            std::fs::write(path, svg()).map_err(|e| WriteError(path.clone(), e))?;
        }
        Ok(())
    }
}
