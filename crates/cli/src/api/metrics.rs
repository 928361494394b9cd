//! Metrics as Firecracker writes them: one JSON object per line, to a file or FIFO given
//! by `--metrics-path` or `PUT /metrics`, every minute and on `FlushMetrics`. exitless's
//! lines carry the exit profile (exit counts by reason and device, VMM ns medians).

use std::fs::File;
use std::io::Write;
use std::sync::Mutex;

pub const PERIOD: std::time::Duration = std::time::Duration::from_secs(60);

#[derive(Default)]
pub struct Metrics {
    file: Mutex<Option<File>>,
}

impl Metrics {
    pub fn open(&self, path: &str) -> Result<(), String> {
        let file = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(path)
            .map_err(|e| format!("Cannot open the metrics file {path}: {e}"))?;
        *self.file.lock().unwrap_or_else(|e| e.into_inner()) = Some(file);
        Ok(())
    }

    pub fn is_open(&self) -> bool {
        self.file.lock().unwrap_or_else(|e| e.into_inner()).is_some()
    }

    /// Writes one line: a timestamp and `body`'s fields.
    pub fn write(&self, mut body: serde_json::Value) -> Result<(), String> {
        let mut file = self.file.lock().unwrap_or_else(|e| e.into_inner());
        let Some(file) = file.as_mut() else { return Err("No metrics file: PUT /metrics first.".into()) };
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        body["utc_timestamp_ms"] = (now.as_millis() as u64).into();
        file.write_all((body.to_string() + "\n").as_bytes()).map_err(|e| format!("Cannot write metrics: {e}"))
    }
}
