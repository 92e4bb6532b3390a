//! The generated `sessionstore.v1` messages, client stub and (with the
//! `server` feature) server trait.
#![allow(missing_docs, clippy::all, clippy::pedantic)]

tonic::include_proto!("sessionstore.v1");
#[cfg(feature = "server")]
include!(concat!(env!("OUT_DIR"), "/server/sessionstore.v1.rs"));
