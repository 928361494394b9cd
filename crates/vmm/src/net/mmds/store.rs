//! The metadata document: what the host PUTs and PATCHes through the API and the guest
//! reads by JSON pointer, as JSON or in EC2's IMDS text form.

use super::token::Tokens;
use serde_json::{Map, Value};

/// The most `--metadata` may hold when the store's limit is smaller.
const MAX_METADATA_FILE: u64 = 64 << 20;

/// How the guest must ask: V1 answers any GET; V2 wants a session token first.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Version {
    #[default]
    V1,
    V2,
}

/// How an answer is written: JSON, or IMDS text (object keys one per line, strings bare).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Json,
    Imds,
}

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum MmdsError {
    #[error("The MMDS data store would be {size} bytes, over its limit of {limit} bytes.")]
    TooLarge { size: usize, limit: usize },
    #[error("The MMDS data store is not initialized: PUT /mmds before PATCH.")]
    NotInitialized,
    #[error("The MMDS resource does not exist.")]
    NotFound,
    #[error("Cannot retrieve value. The value has an unsupported type.")]
    Unsupported,
}

/// The service's state: document, settings and the V2 session tokens handed out.
pub struct Mmds {
    data: Option<Value>,
    limit: usize,
    pub version: Version,
    /// Always answer in IMDS form, whatever the Accept header says.
    pub imds_compat: bool,
    pub tokens: Tokens,
}

/// Settings only: the document and the tokens stay out of logs.
impl std::fmt::Debug for Mmds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mmds").field("version", &self.version).field("limit", &self.limit).finish_non_exhaustive()
    }
}

impl Mmds {
    /// An empty store that refuses documents over `limit` bytes (as serialized JSON).
    pub fn new(limit: usize) -> Self {
        Mmds { data: None, limit, version: Version::V1, imds_compat: false, tokens: Tokens::default() }
    }

    fn check_size(&self, value: &Value) -> Result<(), MmdsError> {
        let size = serde_json::to_vec(value).map_or(usize::MAX, |v| v.len());
        if size > self.limit {
            return Err(MmdsError::TooLarge { size, limit: self.limit });
        }
        Ok(())
    }

    /// The store of a VMM started with `--mmds-size-limit` and `--metadata`: `limit`
    /// bytes at most, holding the JSON document at `metadata` if one is given.
    pub fn load(limit: usize, metadata: Option<&std::path::Path>) -> Result<Mmds, String> {
        let mut mmds = Mmds::new(limit);
        if let Some(path) = metadata {
            // A regular file read to a bound (a FIFO or /dev/zero would hold the VMM's start
            // forever): the store's limit, or more for an indented file of a small store.
            let max = (limit as u64).max(MAX_METADATA_FILE);
            let text = crate::files::read_regular_bounded(path, max).map_err(|e| format!("--metadata: {e}"))?;
            let value: Value = serde_json::from_slice(&text)
                .map_err(|e| format!("--metadata: {} is not JSON: {e}", path.display()))?;
            mmds.put(value).map_err(|e| format!("--metadata: {}: {e}", path.display()))?;
        }
        Ok(mmds)
    }

    /// Replaces the whole document.
    pub fn put(&mut self, value: Value) -> Result<(), MmdsError> {
        self.check_size(&value)?;
        self.data = Some(value);
        Ok(())
    }

    /// Applies a JSON merge patch (RFC 7396); all or nothing.
    pub fn patch(&mut self, patch: &Value) -> Result<(), MmdsError> {
        let mut next = self.data.clone().ok_or(MmdsError::NotInitialized)?;
        merge_patch(&mut next, patch);
        self.check_size(&next)?;
        self.data = Some(next);
        Ok(())
    }

    /// The whole document (`{}` before the first PUT).
    pub fn document(&self) -> Value {
        self.data.clone().unwrap_or_else(|| Value::Object(Map::new()))
    }

    /// The value at `path` (a URI path: repeated and trailing slashes do not matter).
    pub fn get(&self, path: &str, format: Format) -> Result<String, MmdsError> {
        let mut pointer = String::with_capacity(path.len());
        for part in path.split('/').filter(|p| !p.is_empty()) {
            pointer.push('/');
            pointer.push_str(part);
        }
        let value = self.data.as_ref().and_then(|d| d.pointer(&pointer)).ok_or(MmdsError::NotFound)?;
        match (format, value) {
            (Format::Json, v) => Ok(v.to_string()),
            (Format::Imds, Value::String(s)) => Ok(s.clone()),
            (Format::Imds, Value::Object(map)) => {
                let keys: Vec<String> =
                    map.iter().map(|(k, v)| if v.is_object() { format!("{k}/") } else { k.clone() }).collect();
                Ok(keys.join("\n"))
            }
            (Format::Imds, _) => Err(MmdsError::Unsupported),
        }
    }
}

/// RFC 7396: objects merge key by key, `null` removes a key, anything else replaces.
fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(changes) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    if let Value::Object(doc) = target {
        for (key, change) in changes {
            if change.is_null() {
                doc.remove(key);
            } else {
                merge_patch(doc.entry(key.clone()).or_insert(Value::Null), change);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn store() -> Mmds {
        let mut m = Mmds::new(1024);
        m.put(json!({"latest": {"meta-data": {"ami-id": "ami-1", "n": 3, "tags": {"a": "b"}}}})).unwrap();
        m
    }

    #[test]
    fn get_by_path_in_both_formats() {
        let m = store();
        assert_eq!(m.get("/latest/meta-data/ami-id", Format::Imds).unwrap(), "ami-1");
        assert_eq!(m.get("//latest//meta-data/ami-id/", Format::Json).unwrap(), "\"ami-1\"");
        assert_eq!(m.get("/latest/meta-data", Format::Imds).unwrap(), "ami-id\nn\ntags/");
        assert_eq!(m.get("/latest/meta-data/n", Format::Imds), Err(MmdsError::Unsupported));
        assert_eq!(m.get("/latest/meta-data/n", Format::Json).unwrap(), "3");
        assert_eq!(m.get("/latest/nothing", Format::Json), Err(MmdsError::NotFound));
        assert_eq!(Mmds::new(10).get("/", Format::Json), Err(MmdsError::NotFound));
    }

    #[test]
    fn patch_merges_removes_and_respects_the_limit() {
        let mut m = store();
        m.patch(&json!({"latest": {"meta-data": {"ami-id": "ami-2", "n": null}}})).unwrap();
        assert_eq!(m.get("/latest/meta-data", Format::Imds).unwrap(), "ami-id\ntags/");
        let big = json!({"x": "y".repeat(2000)});
        assert!(matches!(m.patch(&big), Err(MmdsError::TooLarge { limit: 1024, .. })));
        assert!(matches!(m.put(big), Err(MmdsError::TooLarge { .. })));
        assert_eq!(
            m.get("/latest/meta-data/ami-id", Format::Imds).unwrap(),
            "ami-2",
            "a refused change changes nothing"
        );
        assert_eq!(Mmds::new(10).patch(&json!({})), Err(MmdsError::NotInitialized));
    }
}
