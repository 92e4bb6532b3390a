//! The export file, `sessionstore.export.v2` (and v1, still read).
//!
//! It holds everything a session holds
//! that the API can restore, ids and times included for reference:
//!
//! ```text
//! {"format": "sessionstore.export.v2",
//!  "session": {"id", "title", "system_prompt", "user", "metadata",
//!              "create_time", "update_time", "forked_from"?},
//!  "messages": [{"sequence", "id", "produced_by_call_id"?, "redacted"?,
//!                "create_time", "message": {…}}, …],
//!  "summary_sequence": N,
//!  "provider_calls": [{"id", "request_id", "provider", "model",
//!                      "requested_provider", "requested_model", "prompt_tokens",
//!                      "completion_tokens", "total_tokens", "cost_micros_usd",
//!                      "create_time"}, …],
//!  "state": [{"key", "value", "update_time"}, …]}
//! ```
//!
//! `message` is a message as version 1 files hold them (the domain
//! `Message`'s JSON). `summary_sequence` (present when the session has a
//! summary marker) names the summary message by sequence, since ids change
//! on import; it follows the messages because the export, which streams
//! page by page in bounded memory, only learns it there. `forked_from`
//! says where a fork came from; it is not restored (a fork's provenance is
//! the server's to record).
//!

use std::path::Path;

use anyhow::Context as _;
use serde::{Deserialize, Serialize};

use sessionstore_client::v1 as pb;

use crate::domain::calendar::{days_from_civil, rfc3339};
use crate::domain::{Message, Timestamp};
use crate::wire;

pub(super) const FORMAT_V1: &str = "sessionstore.export.v1";
pub(super) const FORMAT_V2: &str = "sessionstore.export.v2";

/// The header of an export file.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct ExportedSession {
    pub(super) id: String,
    #[serde(default)]
    pub(super) title: String,
    #[serde(default)]
    pub(super) system_prompt: String,
    #[serde(default)]
    pub(super) user: String,
    #[serde(default)]
    pub(super) metadata: std::collections::BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) create_time: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) update_time: Option<String>,
    /// For a fork: the session and last sequence it was copied from.
    /// Output only: import does not restore it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) forked_from: Option<ForkedFrom>,
}

#[derive(Debug, Serialize, Deserialize)]
pub(super) struct ForkedFrom {
    pub(super) session_id: String,
    pub(super) sequence: i64,
}

/// One message as stored: its place, its producing call, whether it was
/// redacted, and the message itself.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct ExportedMessage {
    pub(super) sequence: i64,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub(super) id: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub(super) produced_by_call_id: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(super) redacted: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) create_time: Option<String>,
    pub(super) message: Message,
}

/// One provider call, every field.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub(super) struct ExportedCall {
    pub(super) id: String,
    pub(super) request_id: String,
    pub(super) provider: String,
    pub(super) model: String,
    pub(super) requested_provider: String,
    pub(super) requested_model: String,
    pub(super) prompt_tokens: i64,
    pub(super) completion_tokens: i64,
    pub(super) total_tokens: i64,
    pub(super) cost_micros_usd: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) create_time: Option<String>,
    // The billing buckets, the provider's usage object and the call's wall
    // time; absent from files written before they existed.
    #[serde(skip_serializing_if = "is_zero")]
    pub(super) cached_input_tokens: i64,
    #[serde(skip_serializing_if = "is_zero")]
    pub(super) cache_creation_input_tokens: i64,
    #[serde(skip_serializing_if = "is_zero")]
    pub(super) reasoning_tokens: i64,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub(super) usage_json: String,
    #[serde(skip_serializing_if = "is_zero")]
    pub(super) duration_micros: i64,
}

impl From<pb::ProviderCall> for ExportedCall {
    /// A call as `ListProviderCalls` returns it, for the file.
    fn from(call: pb::ProviderCall) -> Self {
        ExportedCall {
            create_time: call.create_time.as_ref().map(time_text),
            id: call.id,
            request_id: call.request_id,
            provider: call.provider,
            model: call.model,
            requested_provider: call.requested_provider,
            requested_model: call.requested_model,
            prompt_tokens: call.prompt_tokens,
            completion_tokens: call.completion_tokens,
            total_tokens: call.total_tokens,
            cost_micros_usd: call.cost_micros_usd,
            cached_input_tokens: call.cached_input_tokens,
            cache_creation_input_tokens: call.cache_creation_input_tokens,
            reasoning_tokens: call.reasoning_tokens,
            usage_json: call.usage_json,
            duration_micros: call.duration.as_ref().map_or(0, wire::duration_micros),
        }
    }
}

impl ExportedCall {
    /// The call to record again on import: every field but the id and the
    /// time, which the server makes.
    pub(super) fn to_record(&self) -> pb::ProviderCall {
        pb::ProviderCall {
            request_id: self.request_id.clone(),
            provider: self.provider.clone(),
            model: self.model.clone(),
            requested_provider: self.requested_provider.clone(),
            requested_model: self.requested_model.clone(),
            prompt_tokens: self.prompt_tokens,
            completion_tokens: self.completion_tokens,
            total_tokens: self.total_tokens,
            cost_micros_usd: self.cost_micros_usd,
            cached_input_tokens: self.cached_input_tokens,
            cache_creation_input_tokens: self.cache_creation_input_tokens,
            reasoning_tokens: self.reasoning_tokens,
            usage_json: self.usage_json.clone(),
            duration: wire::duration_from_micros(self.duration_micros),
            ..Default::default()
        }
    }
}

#[allow(
    clippy::trivially_copy_pass_by_ref,
    reason = "serde passes a reference"
)]
pub(super) fn is_zero(value: &i64) -> bool {
    *value == 0
}

/// One per-session state entry.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct ExportedState {
    pub(super) key: String,
    #[serde(default)]
    pub(super) value: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) update_time: Option<String>,
}

/// A version 2 file, as read.
#[derive(Debug, Deserialize)]
pub(super) struct ImportFile {
    pub(super) session: ExportedSession,
    pub(super) messages: Vec<ExportedMessage>,
    #[serde(default)]
    pub(super) summary_sequence: Option<i64>,
    #[serde(default)]
    pub(super) provider_calls: Vec<ExportedCall>,
    #[serde(default)]
    pub(super) state: Vec<ExportedState>,
}

/// A version 1 file: the header and plain messages.
#[derive(Debug, Deserialize)]
pub(super) struct FileV1 {
    pub(super) session: ExportedSession,
    pub(super) messages: Vec<Message>,
}

impl From<FileV1> for ImportFile {
    fn from(v1: FileV1) -> Self {
        let messages = v1
            .messages
            .into_iter()
            .zip(0..)
            .map(|(message, sequence)| ExportedMessage {
                sequence,
                id: String::new(),
                produced_by_call_id: String::new(),
                redacted: false,
                create_time: None,
                message,
            })
            .collect();
        ImportFile {
            session: v1.session,
            messages,
            summary_sequence: None,
            provider_calls: Vec::new(),
            state: Vec::new(),
        }
    }
}

/// A wire time as RFC 3339 in UTC, to the microsecond.
pub(super) fn time_text(time: &prost_types::Timestamp) -> String {
    let micros = time
        .seconds
        .saturating_mul(1_000_000)
        .saturating_add(i64::from(time.nanos / 1000));
    let seconds = rfc3339(Timestamp(micros));
    let whole = seconds.strip_suffix('Z').unwrap_or(&seconds);
    format!("{whole}.{:06}Z", micros.rem_euclid(1_000_000))
}

/// Microseconds since the epoch from `YYYY-MM-DDTHH:MM:SS[.ffffff]Z`, as
/// [`time_text`] writes it.
pub(super) fn parse_time(text: &str) -> Option<i64> {
    let text = text.strip_suffix('Z')?;
    let (date, clock) = text.split_once('T')?;
    let mut date = date.splitn(3, '-').map(|part| part.parse::<i64>().ok());
    let (year, month, day) = (date.next()??, date.next()??, date.next()??);
    let (clock, fraction) = clock.split_once('.').unwrap_or((clock, ""));
    let mut clock = clock.splitn(3, ':').map(|part| part.parse::<i64>().ok());
    let (hour, minute, second) = (clock.next()??, clock.next()??, clock.next()??);
    if !(1..=12).contains(&month)
        || !(1..=31).contains(&day)
        || hour > 23
        || minute > 59
        || second > 60
        || fraction.len() > 6
        || !fraction.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let micros = format!("{fraction:0<6}").parse::<i64>().ok()?;
    let seconds = days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second;
    Some(seconds * 1_000_000 + micros)
}

/// Reads an export file of either version.
pub(super) fn read_file(path: &Path) -> anyhow::Result<ImportFile> {
    #[derive(Deserialize)]
    struct Probe {
        format: String,
    }
    // Read once (the path may be a pipe), parsed twice: for the format,
    // then as that format.
    let text = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let not_export = || format!("{} is not a sessionstore JSON export", path.display());
    let probe: Probe = serde_json::from_slice(&text).with_context(not_export)?;
    match probe.format.as_str() {
        FORMAT_V2 => serde_json::from_slice(&text).with_context(not_export),
        FORMAT_V1 => {
            let v1: FileV1 = serde_json::from_slice(&text).with_context(not_export)?;
            Ok(v1.into())
        }
        other => anyhow::bail!(
            "{} has format {other:?}; expected {FORMAT_V2:?} (or {FORMAT_V1:?})",
            path.display()
        ),
    }
}

/// A time field of the file, if given; malformed is an error naming it.
pub(super) fn time_field(
    text: Option<&str>,
    field: impl FnOnce() -> String,
) -> anyhow::Result<Option<i64>> {
    text.map(|text| {
        parse_time(text).with_context(|| {
            format!(
                "{} is {text:?}, not a time like 2025-01-31T12:00:00.000000Z",
                field()
            )
        })
    })
    .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_recorded_again_keeps_every_field_but_the_servers() {
        let listed = pb::ProviderCall {
            id: "call_1".into(),
            request_id: "req_1".into(),
            provider: "anthropic".into(),
            model: "claude".into(),
            requested_provider: "openai".into(),
            requested_model: "gpt".into(),
            prompt_tokens: 10,
            completion_tokens: 20,
            total_tokens: 30,
            cost_micros_usd: 40,
            cached_input_tokens: 5,
            cache_creation_input_tokens: 6,
            reasoning_tokens: 7,
            usage_json: r#"{"x":1}"#.into(),
            duration: wire::duration_from_micros(1_500),
            create_time: Some(wire::timestamp(Timestamp(1_738_324_800_123_456))),
            ..Default::default()
        };
        let exported = ExportedCall::from(listed.clone());
        assert_eq!(
            exported.create_time.as_deref(),
            Some("2025-01-31T12:00:00.123456Z")
        );
        let recorded = exported.to_record();
        assert_eq!(
            recorded,
            pb::ProviderCall {
                id: String::new(),
                create_time: None,
                ..listed
            }
        );
    }

    #[test]
    fn times_round_trip_to_the_microsecond() {
        for micros in [0, 1, 1_738_324_800_123_456, 951_782_400_000_001] {
            let stamp = wire::timestamp(Timestamp(micros));
            let text = time_text(&stamp);
            assert_eq!(parse_time(&text), Some(micros), "{text}");
        }
        assert_eq!(
            time_text(&wire::timestamp(Timestamp(1_738_324_800_123_456))),
            "2025-01-31T12:00:00.123456Z"
        );
        assert_eq!(
            parse_time("2025-01-31T12:00:00Z"),
            Some(1_738_324_800_000_000)
        );
        assert_eq!(
            parse_time("2025-01-31T12:00:00.5Z"),
            Some(1_738_324_800_500_000)
        );
        for bad in [
            "",
            "2025-01-31",
            "2025-13-01T00:00:00Z",
            "2025-01-31T12:00:00.x1Z",
        ] {
            assert_eq!(parse_time(bad), None, "{bad:?}");
        }
    }
}
