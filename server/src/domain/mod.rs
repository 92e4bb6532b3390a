//! The domain: types, rules and errors of sessionstore. No protobuf, no SQL.

pub mod approvals;
pub mod bodies;
pub mod calendar;
pub mod control;
pub mod digest;
pub mod erase;
mod error;
pub mod exchange;
pub mod fields;
pub mod filter;
pub mod ids;
pub mod paging;
pub mod queue;
pub mod search;
pub mod session;
pub mod target;
pub mod transcript;
mod types;
pub mod usage;

pub use control::{ControlOp, Fork};
pub use error::{Error, Result};
pub use exchange::NewExchange;
pub use session::{NewSession, SessionCursor, SessionPatch, SessionQuery};
pub use types::*;
