//! What every endpoint reads from a request: a resource id from the path, a body in the
//! shape the API's model gives it, both refused in Firecracker's words.

use super::model;
use super::vm::Fault;
use serde::de::DeserializeOwned;

/// Resource ids as Firecracker allows them: letters, digits and '_', at most 64.
pub fn check_id(id: &str) -> Result<&str, Fault> {
    if id.is_empty() || id.len() > 64 || !id.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(Fault(format!("Invalid ID: '{id}' must be 1 to 64 letters, digits or underscores.")));
    }
    Ok(id)
}

pub fn parse<T: DeserializeOwned>(body: &[u8]) -> Result<T, Fault> {
    model::from_json(body).map_err(body_fault)
}

/// Firecracker's words for a body it cannot deserialize.
pub fn body_fault(e: impl std::fmt::Display) -> Fault {
    Fault(format!("An error occurred when deserializing the json body of a request: {e}."))
}
