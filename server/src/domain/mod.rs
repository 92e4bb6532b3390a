//! The domain: types, rules and errors of sessionstore. No protobuf, no SQL.

mod error;
pub mod exchange;
pub mod ids;
pub mod paging;
pub mod session;
mod types;

pub use error::{Error, Result};
pub use exchange::NewExchange;
pub use session::{NewSession, SessionCursor, SessionPatch, SessionQuery};
pub use types::*;
