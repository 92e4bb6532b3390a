//! The codec of the generated server (the `server` feature): tonic-prost's,
//! except that a request that does not decode (invalid UTF-8 in a string,
//! a bad varint, groups nested past prost's limit, a length past the end)
//! is the caller's error, INVALID_ARGUMENT, where tonic-prost answers
//! INTERNAL. Clients keep tonic-prost's codec: a response that does not
//! decode is not the caller's fault.

use std::collections::HashMap;
use std::marker::PhantomData;

use prost::Message;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic::{Code, Status};
use tonic_prost::ProstEncoder;
use tonic_types::{ErrorDetails, StatusExt as _};

/// The `ErrorInfo.reason` of a request that is not well-formed gRPC or
/// protobuf.
pub const MALFORMED_REQUEST: &str = "MALFORMED_REQUEST";

/// INVALID_ARGUMENT with `message` and an `ErrorInfo` whose reason is
/// [`MALFORMED_REQUEST`] (domain `sessionstore`, as every error the
/// server returns).
pub fn malformed_request(message: impl Into<String>) -> Status {
    Status::with_error_details(
        Code::InvalidArgument,
        message,
        ErrorDetails::with_error_info(MALFORMED_REQUEST, "sessionstore", HashMap::new()),
    )
}

/// Encodes `T` as tonic-prost does; decodes `U` with [`RequestDecoder`].
#[derive(Debug, Clone)]
pub struct ServerCodec<T, U> {
    _types: PhantomData<(T, U)>,
}

impl<T, U> Default for ServerCodec<T, U> {
    fn default() -> Self {
        ServerCodec {
            _types: PhantomData,
        }
    }
}

impl<T, U> Codec for ServerCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = RequestDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder::default()
    }

    fn decoder(&mut self) -> Self::Decoder {
        RequestDecoder::default()
    }
}

/// Decodes a request `U` with prost; a decode error is INVALID_ARGUMENT
/// carrying prost's message (which names the field).
#[derive(Debug, Clone)]
pub struct RequestDecoder<U> {
    _type: PhantomData<U>,
}

impl<U> Default for RequestDecoder<U> {
    fn default() -> Self {
        RequestDecoder { _type: PhantomData }
    }
}

impl<U: Message + Default> Decoder for RequestDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        U::decode(buf)
            .map(Some)
            .map_err(|error| malformed_request(error.to_string()))
    }

    fn buffer_settings(&self) -> BufferSettings {
        BufferSettings::default()
    }
}
