//! The protobuf field reader and writer the wire code shares: reading an
//! encoded message field by field without decoding it (a replay reads
//! some twenty fields an event), and writing a field's head.

use bytes::BytesMut;
use prost::encoding::{WireType, decode_varint, encoded_len_varint};

/// One field of an encoded message: its number, its bytes whole (key
/// included) and, for a length-delimited one, its payload.
pub(super) struct Field<'a> {
    pub(super) tag: u32,
    pub(super) whole: &'a [u8],
    pub(super) payload: &'a [u8],
}

/// The fields of an encoded message, in the order they are stored.
pub(super) struct Fields<'a>(pub(super) &'a [u8]);

impl<'a> Iterator for Fields<'a> {
    type Item = std::result::Result<Field<'a>, BadField>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.0.is_empty() {
            return None;
        }
        let field = next_field(self.0);
        // After an error, nothing more.
        self.0 = match &field {
            Ok(field) => self.0.get(field.whole.len()..).unwrap_or_default(),
            Err(_) => &[],
        };
        Some(field)
    }
}

/// The field at the start of `encoding`, read as `prost`'s decoder
/// reads a key and what follows it, without going through its `Buf`
/// (a replay reads some twenty fields an event; BENCHMARKS.md).
fn next_field(encoding: &[u8]) -> std::result::Result<Field<'_>, BadField> {
    let (key, key_len) = varint(encoding)?;
    let tag = u32::try_from(key >> 3)
        .ok()
        .filter(|tag| *tag > 0 && key <= u64::from(u32::MAX))
        .ok_or(BadField("a field key out of range"))?;
    let rest = encoding.get(key_len..).unwrap_or_default();
    // The payload's offset in `rest` (past a length) and its length.
    let (offset, len) = match key & 0x07 {
        0 => (0, varint(rest)?.1),
        1 => (0, 8),
        2 => {
            let (len, len_len) = varint(rest)?;
            let len = usize::try_from(len).map_err(|_| BadField("a field longer than memory"))?;
            (len_len, len)
        }
        5 => (0, 4),
        3 | 4 => return Err(BadField("a group, which no message here has")),
        _ => return Err(BadField("a field of an unknown wire type")),
    };
    let whole = offset
        .checked_add(len)
        .and_then(|end| end.checked_add(key_len))
        .and_then(|end| encoding.get(..end))
        .ok_or(BadField("a field cut short"))?;
    Ok(Field {
        tag,
        whole,
        payload: whole.get(key_len + offset..).unwrap_or_default(),
    })
}

/// The varint at the start of `buf`: its value and its length in bytes.
#[inline]
pub(super) fn varint(buf: &[u8]) -> std::result::Result<(u64, usize), BadField> {
    match buf.first() {
        Some(&byte) if byte < 0x80 => Ok((u64::from(byte), 1)),
        _ => {
            let mut rest = buf;
            let value = decode_varint(&mut rest).map_err(|_| BadField("an invalid varint"))?;
            Ok((value, buf.len() - rest.len()))
        }
    }
}

/// What is wrong with a field that cannot be read: small, as a field is
/// read in a loop and its result moved about (a stored event's error).
#[derive(Clone, Copy, Debug)]
pub(super) struct BadField(pub(super) &'static str);

/// Writes the key of length-delimited field `tag` and the length `len`,
/// in one copy.
pub(super) fn put_delimited_head(buf: &mut BytesMut, tag: u32, len: usize) {
    // A key takes at most 5 bytes, a length at most 10.
    let mut head = [0u8; 15];
    let mut at = 0;
    for mut value in [
        u64::from(tag) << 3 | WireType::LengthDelimited as u64,
        len as u64,
    ] {
        while let Some(byte) = head.get_mut(at) {
            at += 1;
            if value < 0x80 {
                *byte = value as u8;
                break;
            }
            *byte = value as u8 | 0x80;
            value >>= 7;
        }
    }
    buf.extend_from_slice(head.get(..at).unwrap_or_default());
}

/// The bytes of a field's key.
pub(super) fn key_len(tag: u32) -> usize {
    prost::encoding::key_len(tag)
}

/// The bytes a length-delimited payload of `len` bytes takes, its length
/// included.
pub(super) fn delimited_len(len: usize) -> usize {
    encoded_len_varint(len as u64) + len
}
