//! What every lab prints and writes besides its own table: the targets, and the
//! JSON and SVG files asked for on the command line.

use exitless_vmm::poll::PollMode;
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

/// What counts as "not slower" between polling modes: the labs' medians move by a few
/// percent from one run of the same mode to the next.
pub const POLL_NOISE: f64 = 0.95;

/// Issue #14's check on a lab's rows: for each polling mode other than off, the worst
/// ratio of a row's rate to the same row (`key`) with polling off. Rows without a polling
/// mode (the host's own) are left out.
pub fn no_row_slower_than_off<R, K: PartialEq>(
    rows: &[R],
    noun: &str,
    poll: impl Fn(&R) -> Option<PollMode>,
    key: impl Fn(&R) -> K,
    rate: impl Fn(&R) -> f64,
    label: impl Fn(&R) -> String,
) -> Vec<Target> {
    let off = |k: K| rows.iter().find(|r| poll(r) == Some(PollMode::Off) && key(r) == k);
    let modes = exitless_vmm::poll::distinct(rows.iter().filter_map(&poll).filter(|&p| p != PollMode::Off));
    modes
        .into_iter()
        .filter_map(|mode| {
            let (x, r) = rows
                .iter()
                .filter(|r| poll(r) == Some(mode))
                .filter_map(|r| off(key(r)).map(|o| (rate(r) / rate(o), r)))
                .min_by(|a, b| a.0.total_cmp(&b.0))?;
            let what = format!("no {noun} slower with polling {mode} than off (>= {POLL_NOISE}x)");
            Some(Target::new(what, format!("{x:.2}x at {}", label(r)), x >= POLL_NOISE))
        })
        .collect()
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

/// What stops a lab that drives VMM processes: what it could not prepare or run, or an
/// output it could not write.
#[derive(Debug, thiserror::Error)]
pub enum LabError {
    #[error("cannot prepare the lab: {0}")]
    Setup(String),
    #[error("{0}")]
    Run(String),
    #[error(transparent)]
    Write(#[from] WriteError),
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
