//! A device's own part of a snapshot: a typed struct with a version ([`DeviceState`]),
//! kept in the state file as [`Saved`] (the version beside the state's JSON), and read
//! back through one path, [`Saved::decode`]. A state of another version, a field that does
//! not parse, or one that contradicts the device is a [`StateFault`]; the device manager
//! names the device ([`StateError`]), so a refusal is one line: the device, then the field.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// A device's snapshot state: plain serialisable data, and its version.
pub trait DeviceState: Serialize + DeserializeOwned {
    /// Bumped on every change of what the state holds (a field added, removed or changing
    /// meaning): a state of another version is refused by name, never half-read.
    const VERSION: u32;
}

/// One device's state as the state file holds it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Saved {
    pub version: u32,
    pub state: serde_json::Value,
}

/// What is wrong with a saved state (whose, the caller says: [`StateError`]).
#[derive(Debug, thiserror::Error)]
pub enum StateFault {
    #[error("its state is version {found}; this exitless reads version {reads}")]
    Version { found: u32, reads: u32 },
    #[error("its state's field `{field}` does not parse")]
    Field {
        field: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("its state's field `{field}` does not fit this device: {why}")]
    Invalid { field: String, why: String },
    #[error("the snapshot saved no state for it, and it keeps some")]
    Missing,
    #[error("the snapshot saved a state for it, and it keeps none")]
    Unexpected,
    #[error("its state cannot be written")]
    Encode(#[source] serde_json::Error),
}

impl StateFault {
    /// A state whose `field` contradicts the device: `why`.
    pub fn invalid(field: impl Into<String>, why: impl Into<String>) -> StateFault {
        StateFault::Invalid { field: field.into(), why: why.into() }
    }

    /// This fault, for device `device`.
    pub fn of(self, device: &str) -> StateError {
        StateError { device: device.into(), fault: self }
    }
}

/// A device's state refused (or not saved): which device, and what.
#[derive(Debug, thiserror::Error)]
#[error("{device}: {fault}")]
pub struct StateError {
    pub device: String,
    #[source]
    pub fault: StateFault,
}

impl Saved {
    /// `state` at its version.
    pub fn encode<T: DeviceState>(state: &T) -> Result<Saved, StateFault> {
        let state = serde_json::to_value(state).map_err(StateFault::Encode)?;
        Ok(Saved { version: T::VERSION, state })
    }

    /// The typed state, if this is its version and every field parses; a field that does
    /// not is named by its path (`queues[1].size`).
    pub fn decode<T: DeviceState>(&self) -> Result<T, StateFault> {
        if self.version != T::VERSION {
            return Err(StateFault::Version { found: self.version, reads: T::VERSION });
        }
        serde_path_to_error::deserialize(&self.state).map_err(|e| {
            let field = match e.path().to_string() {
                path if path == "." => "(all of it)".to_string(),
                path => path,
            };
            StateFault::Field { field, source: e.into_inner() }
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Regs {
        a: u8,
        queues: Vec<Queue>,
    }

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Queue {
        size: u16,
    }

    impl DeviceState for Regs {
        const VERSION: u32 = 3;
    }

    /// The whole chain on one line, as the API answers it (`exitless::with_causes`).
    pub fn line(e: &dyn std::error::Error) -> String {
        let mut text = e.to_string();
        let mut cause = e.source();
        while let Some(c) = cause {
            let said = c.to_string();
            if !text.contains(&said) {
                text = format!("{text}: {said}");
            }
            cause = c.source();
        }
        text
    }

    #[test]
    fn a_state_round_trips_and_a_bad_one_names_its_field() {
        let regs = Regs { a: 1, queues: vec![Queue { size: 8 }, Queue { size: 16 }] };
        let saved = Saved::encode(&regs).unwrap();
        assert_eq!(saved.version, 3);
        assert_eq!(saved.decode::<Regs>().unwrap(), regs);
        let mut other = saved.clone();
        other.version = 4;
        let e = line(&other.decode::<Regs>().unwrap_err().of("dev"));
        assert_eq!(e, "dev: its state is version 4; this exitless reads version 3");
        let mut damaged = saved.clone();
        damaged.state["queues"][1]["size"] = "big".into();
        let e = line(&damaged.decode::<Regs>().unwrap_err().of("dev"));
        assert!(e.starts_with("dev: its state's field `queues[1].size` does not parse: invalid type"), "{e}");
        assert!(!e.contains('\n'));
        let e = line(&Saved { version: 3, state: 5.into() }.decode::<Regs>().unwrap_err().of("dev"));
        assert!(e.contains("(all of it)"), "{e}");
    }
}
