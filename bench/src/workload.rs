//! What every benchmark writes: an exchange of one user and one assistant
//! message of about 1 KB each, produced by one provider call; the append
//! and peer benchmarks also write a smaller [`Shape`].

use anyhow::Context as _;
use sessionstore_client::SessionStoreClient;
use sessionstore_client::v1 as pb;
use tonic::transport::Channel;

/// The size of each message's text.
pub const MESSAGE_BYTES: usize = 1000;

/// The sizes of an appended exchange's two messages, shared by
/// sessionstore's append runs and the peers (`bench/peers/peers.py
/// --shapes`, which knows the same names and sizes). Either way one
/// provider call produced the answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, clap::ValueEnum)]
pub enum Shape {
    /// A 64-byte user message and a 512-byte answer: a chat turn.
    Small,
    /// Two messages of [`MESSAGE_BYTES`] each (every other benchmark's).
    #[value(name = "1kb")]
    Kb1,
}

impl Shape {
    /// The name in the CLI, in figure names and in `peers.py`.
    pub fn name(self) -> &'static str {
        match self {
            Shape::Small => "small",
            Shape::Kb1 => "1kb",
        }
    }

    /// The user message's and the answer's size in bytes.
    pub fn bytes(self) -> (usize, usize) {
        match self {
            Shape::Small => (64, 512),
            Shape::Kb1 => (MESSAGE_BYTES, MESSAGE_BYTES),
        }
    }

    /// What a figure's case says of it: `small exchange (64 B + 512 B)`.
    pub fn label(self) -> String {
        let (user, answer) = self.bytes();
        format!("{} exchange ({user} B + {answer} B)", self.name())
    }
}

/// Now, in microseconds since the Unix epoch (the stored times' unit).
pub fn now_micros() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

/// Microseconds since the Unix epoch as a protobuf timestamp.
pub fn timestamp(micros: i64) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: micros.div_euclid(1_000_000),
        nanos: (micros.rem_euclid(1_000_000) * 1000) as i32,
    }
}

/// Deterministic prose of about `len` bytes from a vocabulary of 2,048
/// made-up words, different for every `seed`, so the full-text indexes see
/// realistic variety.
pub fn text(seed: u64, len: usize) -> String {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = String::with_capacity(len + 16);
    while out.len() < len {
        // xorshift64
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let word = state % 2048;
        if !out.is_empty() {
            out.push(' ');
        }
        out.push_str(&word_of(word));
    }
    out.truncate(len);
    out
}

fn word_of(n: u64) -> String {
    const SYLLABLES: [&str; 16] = [
        "ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "zen", "dar", "pel", "qua", "ris", "tum",
        "bex", "gol",
    ];
    let mut word = String::new();
    let mut n = n;
    for _ in 0..3 {
        word.push_str(SYLLABLES[(n % 16) as usize]);
        n /= 16;
    }
    word
}

pub fn user(seed: u64) -> pb::Message {
    pb::Message {
        role: pb::Role::User.into(),
        content: text(seed, MESSAGE_BYTES),
        ..Default::default()
    }
}

pub fn assistant(seed: u64) -> pb::Message {
    pb::Message {
        role: pb::Role::Assistant.into(),
        content: text(seed ^ 0xA55A, MESSAGE_BYTES),
        ..Default::default()
    }
}

pub fn provider_call(seed: u64) -> pb::ProviderCall {
    pb::ProviderCall {
        request_id: format!("gw-{seed}"),
        provider: "anthropic".into(),
        model: "claude-sonnet-4-5".into(),
        prompt_tokens: 350,
        completion_tokens: 260,
        cost_micros_usd: 4_950,
        ..Default::default()
    }
}

/// The AppendExchange every append benchmark sends, with a fresh
/// idempotency key as `sessionstore_client::Client` sends.
pub fn exchange(session_id: &str, seed: u64) -> pb::AppendExchangeRequest {
    shaped_exchange(session_id, seed, Shape::Kb1)
}

/// [`exchange`] with messages of `shape`'s sizes.
pub fn shaped_exchange(session_id: &str, seed: u64, shape: Shape) -> pb::AppendExchangeRequest {
    let (user_bytes, answer_bytes) = shape.bytes();
    pb::AppendExchangeRequest {
        session_id: session_id.to_owned(),
        messages: vec![pb::Message {
            role: pb::Role::User.into(),
            content: text(seed, user_bytes),
            ..Default::default()
        }],
        provider_call: Some(provider_call(seed)),
        response_messages: vec![pb::Message {
            role: pb::Role::Assistant.into(),
            content: text(seed ^ 0xA55A, answer_bytes),
            ..Default::default()
        }],
        request_id: uuid::Uuid::now_v7().to_string(),
        ..Default::default()
    }
}

/// Creates a session with `initial` messages of `bytes` each.
pub async fn create_session(
    client: &mut SessionStoreClient<Channel>,
    id: &str,
    user_name: &str,
    initial: usize,
    bytes: usize,
) -> anyhow::Result<()> {
    create_tagged_session(client, id, user_name, initial, bytes, Default::default()).await
}

/// As [`create_session`], with `metadata`.
pub async fn create_tagged_session(
    client: &mut SessionStoreClient<Channel>,
    id: &str,
    user_name: &str,
    initial: usize,
    bytes: usize,
    metadata: std::collections::BTreeMap<String, String>,
) -> anyhow::Result<()> {
    let initial_history = (0..initial)
        .map(|i| pb::Message {
            role: if i % 2 == 0 {
                pb::Role::User
            } else {
                pb::Role::Assistant
            }
            .into(),
            content: text(i as u64, bytes),
            ..Default::default()
        })
        .collect();
    client
        .create_session(pb::CreateSessionRequest {
            session_id: id.to_owned(),
            title: format!("bench {id}"),
            user: user_name.to_owned(),
            metadata,
            initial_history,
            ..Default::default()
        })
        .await
        .with_context(|| format!("CreateSession {id}"))?;
    Ok(())
}

/// Appends `messages` messages of ~1 KB to a session, `per_call` at a time
/// (not measured: this builds the sessions the read benchmarks read).
pub async fn fill(
    client: &mut SessionStoreClient<Channel>,
    id: &str,
    messages: usize,
    per_call: usize,
) -> anyhow::Result<()> {
    let mut written = 0;
    while written < messages {
        let n = per_call.min(messages - written);
        let batch = (written..written + n)
            .map(|i| {
                if i % 2 == 0 {
                    user(i as u64)
                } else {
                    assistant(i as u64)
                }
            })
            .collect();
        client
            .append_exchange(pb::AppendExchangeRequest {
                session_id: id.to_owned(),
                messages: batch,
                ..Default::default()
            })
            .await
            .with_context(|| format!("fill {id}"))?;
        written += n;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::text;

    #[test]
    fn text_is_deterministic_sized_and_varied() {
        assert_eq!(text(7, 1000), text(7, 1000));
        assert_eq!(text(7, 1000).len(), 1000);
        assert_ne!(text(7, 1000), text(8, 1000));
    }
}
