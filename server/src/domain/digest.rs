//! A SHA-256 digest of any `Serialize` value, taken straight from its serde
//! form: no text made, nothing escaped, every string's bytes hashed where
//! they lie.
//!
//! The form hashed is self-delimiting (each value opens with a tag, every
//! string and byte string carries its length, every sequence, map and
//! struct is closed by a tag of its own, and a struct's fields are hashed
//! with their names), so two values hash the same form only when serde
//! sees them the same: same fields, same values, same skipped fields.

use serde::Serialize;
use serde::ser;
use sha2::{Digest as _, Sha256};

/// The SHA-256 of `value`'s serde form; `None` if its `Serialize` failed.
pub fn sha256<T: Serialize + ?Sized>(value: &T) -> Option<[u8; 32]> {
    let mut digest = Digester::default();
    value.serialize(&mut digest).ok()?;
    digest.flush();
    Some(digest.sha.finalize().into())
}

/// The first byte of a fingerprint of today's form: the SHA-256 of the
/// request's serde form ([`sha256`]) follows it.
pub const FINGERPRINT_FORM: u8 = 2;

/// The idempotency key of a call other than AppendExchange (whose
/// fingerprint is its own, [`super::exchange::NewExchange::fingerprint`]):
/// the caller's `request_id` and a fingerprint of the call's body, made
/// with the call's name, so one key sent to two kinds of call never
/// matches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestKey {
    /// The caller's key, as errors name it.
    pub request_id: String,
    /// The key as stored: `request_id`, or it within a narrower namespace
    /// ([`RequestKey::within`]).
    pub stored_id: String,
    pub fingerprint: Vec<u8>,
}

impl RequestKey {
    /// The key of `call` (e.g. `"CreateSession"`) with `body`, whose serde
    /// form must leave out `request_id`; `None` without a `request_id`.
    pub fn of<T: Serialize + ?Sized>(call: &str, request_id: &str, body: &T) -> Option<RequestKey> {
        if request_id.is_empty() {
            return None;
        }
        let sha = sha256(&(call, body)).unwrap_or_default();
        let mut fingerprint = Vec::with_capacity(1 + sha.len());
        fingerprint.push(FINGERPRINT_FORM);
        fingerprint.extend_from_slice(&sha);
        Some(RequestKey {
            request_id: request_id.to_owned(),
            stored_id: request_id.to_owned(),
            fingerprint,
        })
    }

    /// The key kept within `namespace` (e.g. one session's): the same
    /// caller's key elsewhere is another key.
    pub fn within(mut self, namespace: &str) -> RequestKey {
        self.stored_id = format!("{namespace}\u{1f}{}", self.request_id);
        self
    }
}

/// Small pieces gather in `staged` and reach the hash together; a long
/// string goes to it directly.
struct Digester {
    sha: Sha256,
    staged: [u8; STAGED],
    len: usize,
}

const STAGED: usize = 256;
/// A string at least this long is hashed where it lies.
const DIRECT: usize = 64;

impl Default for Digester {
    fn default() -> Self {
        Self {
            sha: Sha256::new(),
            staged: [0; STAGED],
            len: 0,
        }
    }
}

mod tag {
    pub const FALSE: u8 = b'0';
    pub const TRUE: u8 = b'1';
    pub const SIGNED: u8 = b'i';
    pub const UNSIGNED: u8 = b'u';
    pub const FLOAT: u8 = b'f';
    pub const STR: u8 = b's';
    pub const BYTES: u8 = b'y';
    pub const NONE: u8 = b'n';
    pub const SOME: u8 = b'S';
    pub const UNIT: u8 = b'U';
    pub const VARIANT: u8 = b'v';
    pub const SEQ: u8 = b'[';
    pub const SEQ_END: u8 = b']';
    pub const MAP: u8 = b'{';
    pub const MAP_END: u8 = b'}';
    pub const STRUCT: u8 = b'(';
    pub const STRUCT_END: u8 = b')';
}

impl Digester {
    fn flush(&mut self) {
        self.sha.update(&self.staged[..self.len]);
        self.len = 0;
    }

    fn put(&mut self, bytes: &[u8]) {
        if self.len + bytes.len() > STAGED {
            self.flush();
        }
        if bytes.len() >= DIRECT {
            self.sha.update(bytes);
        } else {
            self.staged[self.len..self.len + bytes.len()].copy_from_slice(bytes);
            self.len += bytes.len();
        }
    }

    fn tag(&mut self, tag: u8) {
        self.put(&[tag]);
    }

    /// A length-prefixed run of bytes (no tag).
    fn sized(&mut self, bytes: &[u8]) {
        self.put(&(bytes.len() as u64).to_le_bytes());
        self.put(bytes);
    }

    fn tagged(&mut self, tag: u8, bytes: &[u8]) {
        self.tag(tag);
        self.sized(bytes);
    }

    fn variant(&mut self, name: &str) {
        self.tagged(tag::VARIANT, name.as_bytes());
    }
}

/// Only a `Serialize` impl's own `custom` error: nothing here fails.
#[derive(Debug)]
pub struct Error;

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the value could not be serialized for its digest")
    }
}

impl std::error::Error for Error {}

impl ser::Error for Error {
    fn custom<T: std::fmt::Display>(_: T) -> Self {
        Error
    }
}

type Done = Result<(), Error>;

impl ser::Serializer for &mut Digester {
    type Ok = ();
    type Error = Error;
    type SerializeSeq = Self;
    type SerializeTuple = Self;
    type SerializeTupleStruct = Self;
    type SerializeTupleVariant = Self;
    type SerializeMap = Self;
    type SerializeStruct = Self;
    type SerializeStructVariant = Self;

    fn serialize_bool(self, v: bool) -> Done {
        self.tag(if v { tag::TRUE } else { tag::FALSE });
        Ok(())
    }

    fn serialize_i8(self, v: i8) -> Done {
        self.serialize_i64(v.into())
    }

    fn serialize_i16(self, v: i16) -> Done {
        self.serialize_i64(v.into())
    }

    fn serialize_i32(self, v: i32) -> Done {
        self.serialize_i64(v.into())
    }

    fn serialize_i64(self, v: i64) -> Done {
        self.tag(tag::SIGNED);
        self.put(&v.to_le_bytes());
        Ok(())
    }

    fn serialize_i128(self, v: i128) -> Done {
        self.tagged(tag::SIGNED, &v.to_le_bytes());
        Ok(())
    }

    fn serialize_u8(self, v: u8) -> Done {
        self.serialize_u64(v.into())
    }

    fn serialize_u16(self, v: u16) -> Done {
        self.serialize_u64(v.into())
    }

    fn serialize_u32(self, v: u32) -> Done {
        self.serialize_u64(v.into())
    }

    fn serialize_u64(self, v: u64) -> Done {
        self.tag(tag::UNSIGNED);
        self.put(&v.to_le_bytes());
        Ok(())
    }

    fn serialize_u128(self, v: u128) -> Done {
        self.tagged(tag::UNSIGNED, &v.to_le_bytes());
        Ok(())
    }

    fn serialize_f32(self, v: f32) -> Done {
        self.serialize_f64(v.into())
    }

    fn serialize_f64(self, v: f64) -> Done {
        self.tag(tag::FLOAT);
        self.put(&v.to_bits().to_le_bytes());
        Ok(())
    }

    fn serialize_char(self, v: char) -> Done {
        self.serialize_str(v.encode_utf8(&mut [0; 4]))
    }

    fn serialize_str(self, v: &str) -> Done {
        self.tagged(tag::STR, v.as_bytes());
        Ok(())
    }

    fn serialize_bytes(self, v: &[u8]) -> Done {
        self.tagged(tag::BYTES, v);
        Ok(())
    }

    fn serialize_none(self) -> Done {
        self.tag(tag::NONE);
        Ok(())
    }

    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Done {
        self.tag(tag::SOME);
        value.serialize(self)
    }

    fn serialize_unit(self) -> Done {
        self.tag(tag::UNIT);
        Ok(())
    }

    fn serialize_unit_struct(self, _name: &'static str) -> Done {
        self.serialize_unit()
    }

    fn serialize_unit_variant(self, _: &'static str, _: u32, variant: &'static str) -> Done {
        self.variant(variant);
        self.tag(tag::UNIT);
        Ok(())
    }

    fn serialize_newtype_struct<T: Serialize + ?Sized>(self, _: &'static str, value: &T) -> Done {
        value.serialize(self)
    }

    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        value: &T,
    ) -> Done {
        self.variant(variant);
        value.serialize(self)
    }

    fn serialize_seq(self, _len: Option<usize>) -> Result<Self, Error> {
        self.tag(tag::SEQ);
        Ok(self)
    }

    fn serialize_tuple(self, len: usize) -> Result<Self, Error> {
        self.serialize_seq(Some(len))
    }

    fn serialize_tuple_struct(self, _: &'static str, len: usize) -> Result<Self, Error> {
        self.serialize_seq(Some(len))
    }

    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        len: usize,
    ) -> Result<Self, Error> {
        self.variant(variant);
        self.serialize_seq(Some(len))
    }

    fn serialize_map(self, _len: Option<usize>) -> Result<Self, Error> {
        self.tag(tag::MAP);
        Ok(self)
    }

    fn serialize_struct(self, _: &'static str, _len: usize) -> Result<Self, Error> {
        self.tag(tag::STRUCT);
        Ok(self)
    }

    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        len: usize,
    ) -> Result<Self, Error> {
        self.variant(variant);
        self.serialize_struct(variant, len)
    }
}

macro_rules! sequence {
    ($($trait:ident :: $method:ident),*) => {$(
        impl ser::$trait for &mut Digester {
            type Ok = ();
            type Error = Error;

            fn $method<T: Serialize + ?Sized>(&mut self, value: &T) -> Done {
                value.serialize(&mut **self)
            }

            fn end(self) -> Done {
                self.tag(tag::SEQ_END);
                Ok(())
            }
        }
    )*};
}

sequence!(
    SerializeSeq::serialize_element,
    SerializeTuple::serialize_element,
    SerializeTupleStruct::serialize_field,
    SerializeTupleVariant::serialize_field
);

impl ser::SerializeMap for &mut Digester {
    type Ok = ();
    type Error = Error;

    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Done {
        key.serialize(&mut **self)
    }

    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Done {
        value.serialize(&mut **self)
    }

    fn end(self) -> Done {
        self.tag(tag::MAP_END);
        Ok(())
    }
}

macro_rules! fields {
    ($($trait:ident),*) => {$(
        impl ser::$trait for &mut Digester {
            type Ok = ();
            type Error = Error;

            fn serialize_field<T: Serialize + ?Sized>(
                &mut self,
                name: &'static str,
                value: &T,
            ) -> Done {
                self.sized(name.as_bytes());
                value.serialize(&mut **self)
            }

            fn end(self) -> Done {
                self.tag(tag::STRUCT_END);
                Ok(())
            }
        }
    )*};
}

fields!(SerializeStruct, SerializeStructVariant);

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[derive(Serialize)]
    struct Pair {
        #[serde(skip_serializing_if = "String::is_empty")]
        a: String,
        #[serde(skip_serializing_if = "String::is_empty")]
        b: String,
    }

    fn pair(a: &str, b: &str) -> Option<[u8; 32]> {
        sha256(&Pair {
            a: a.into(),
            b: b.into(),
        })
    }

    #[test]
    fn values_serde_sees_apart_digest_apart() {
        // A skipped field is told from an empty one by the field's name.
        assert_ne!(pair("x", ""), pair("", "x"));
        // Lengths keep where one string ends and the next begins.
        assert_ne!(pair("ab", "c"), pair("a", "bc"));
        assert_eq!(pair("ab", "c"), pair("ab", "c"));
        // Long strings (hashed where they lie) and short ones (staged)
        // make one stream.
        let long = "x".repeat(1000);
        assert_ne!(pair(&long, "y"), pair(&long, "z"));
        assert_eq!(pair(&long, &long), pair(&long, &long));
        // Sequences and maps are closed: an element moved across the
        // boundary of a nested list changes the digest.
        assert_ne!(
            sha256(&(vec![vec![1u8, 2], vec![3]])),
            sha256(&(vec![vec![1u8], vec![2, 3]]))
        );
        let map: BTreeMap<&str, &str> = [("k", "v")].into();
        let other: BTreeMap<&str, &str> = [("kv", "")].into();
        assert_ne!(sha256(&map), sha256(&other));
        assert_ne!(sha256(&Some(0u8)), sha256(&None::<u8>));
    }
}
