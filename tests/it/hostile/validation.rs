//! Request validation: arbitrary, mostly invalid requests get a status
//! from the error table and write nothing.

use super::*;

// ---------------------------------------------------------------------------
// 2. Request validation

/// Which session a request names.
#[derive(Clone, Debug)]
enum Sid {
    /// The case's session (created with three messages).
    Live,
    /// A well-formed id no session has.
    Missing,
    Raw(String),
}

/// Which message a request names.
#[derive(Clone, Debug)]
enum Mid {
    /// The live session's message at this index (modulo its length).
    Live(usize),
    Raw(String),
}

/// A page token: raw text, or a forged one in the server's own encoding
/// (`{live}` in a part stands for the live session id).
#[derive(Clone, Debug)]
enum Token {
    Raw(String),
    Forged(String, Vec<String>),
}

#[derive(Clone, Debug)]
enum Req {
    Create {
        id: String,
        history: Vec<pb::Message>,
        metadata: BTreeMap<String, String>,
    },
    Get(Sid),
    ListSessions {
        page_size: i32,
        token: Token,
        user: String,
    },
    Update {
        sid: Sid,
        title: String,
        summary: Option<Mid>,
        paths: Option<Vec<String>>,
        metadata: BTreeMap<String, String>,
    },
    Delete(Sid),
    Append {
        sid: Sid,
        messages: Vec<pb::Message>,
        full_history: Vec<pb::Message>,
        call: Option<Box<pb::ProviderCall>>,
        responses: Vec<pb::Message>,
        expected: Option<i64>,
        request_id: String,
        run_id: String,
    },
    Export {
        sid: Sid,
        include_system_prompt: bool,
        from_summary: bool,
        after: Option<i64>,
        max: i64,
    },
    ListMessages {
        sid: Sid,
        after: Option<i64>,
        page_size: i32,
        token: Token,
    },
    ListCalls {
        sid: Sid,
        page_size: i32,
        token: Token,
    },
    Watch {
        sid: Sid,
        after_revision: i64,
    },
    Delta {
        sid: Sid,
        run_id: String,
        index: i64,
        delta: Option<pb::publish_delta_request::Delta>,
    },
    Discard {
        sid: Sid,
        run_id: String,
    },
    Begin {
        sid: Sid,
        run_id: String,
        lease: Option<prost_types::Duration>,
    },
    End {
        sid: Sid,
        run_id: String,
    },
    Rollback {
        sid: Sid,
        after: i64,
        run_id: String,
    },
    Edit {
        sid: Sid,
        mid: Mid,
        message: Option<pb::Message>,
        reason: String,
        run_id: String,
    },
    Redact {
        sid: Sid,
        mid: Mid,
        reason: String,
        run_id: String,
    },
    Fork {
        sid: Sid,
        at: i64,
        new_id: String,
    },
    Transcript {
        sid: Sid,
        format: i32,
    },
    SetState {
        sid: Sid,
        key: String,
        value: String,
        expected: Option<i64>,
    },
    GetState {
        sid: Sid,
        key: String,
    },
    ListState {
        sid: Sid,
        page_size: i32,
        token: Token,
    },
    DeleteState {
        sid: Sid,
        key: String,
        expected: Option<i64>,
    },
    Search {
        query: String,
        user: String,
        page_size: i32,
        token: Token,
    },
}

/// Session ids a caller might send: empty, over-long, control characters,
/// injection attempts, or merely unusual.
fn raw_id() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        Just("x".repeat(128)),
        Just("y".repeat(129)),
        Just("z".repeat(5000)),
        Just("ses_\0".to_owned()),
        Just("../../etc/passwd".to_owned()),
        Just("ses x".to_owned()),
        text(),
        "[a-zA-Z0-9_.:-]{1,20}",
    ]
}

fn sid() -> impl Strategy<Value = Sid> {
    prop_oneof![
        6 => Just(Sid::Live),
        1 => Just(Sid::Missing),
        3 => raw_id().prop_map(Sid::Raw),
    ]
}

fn mid() -> impl Strategy<Value = Mid> {
    prop_oneof![
        3 => (0..8usize).prop_map(Mid::Live),
        1 => Just(Mid::Raw(String::new())),
        1 => Just(Mid::Raw("m".repeat(300))),
        1 => text().prop_map(Mid::Raw),
    ]
}

/// Mostly small, sometimes extreme.
fn int64() -> impl Strategy<Value = i64> {
    prop_oneof![
        4 => -3..8i64,
        1 => Just(i64::MIN),
        1 => Just(i64::MAX),
        1 => any::<i64>(),
    ]
}

fn page_size() -> impl Strategy<Value = i32> {
    prop_oneof![
        6 => Just(0),
        3 => -3..5i32,
        1 => Just(i32::MIN),
        1 => Just(i32::MAX),
        1 => 990..1010i32,
        1 => any::<i32>(),
    ]
}

/// A role as a raw enum value: valid, unspecified, or unknown.
fn any_role() -> impl Strategy<Value = i32> {
    prop_oneof![
        6 => 1..=5i32,
        1 => Just(0),
        1 => Just(6),
        1 => Just(99),
        1 => Just(-1),
        1 => any::<i32>(),
    ]
}

/// A message that may have a bad role or an empty content block.
fn loose_message() -> impl Strategy<Value = pb::Message> {
    (
        any_role(),
        message(),
        prop_oneof![5 => Just(false), 1 => Just(true)],
    )
        .prop_map(|(role, mut message, empty_block)| {
            message.role = role;
            if empty_block {
                message
                    .content_blocks
                    .push(pb::ContentBlock { block: None });
            }
            message
        })
}

fn loose_messages() -> impl Strategy<Value = Vec<pb::Message>> {
    prop_oneof![
        2 => Just(Vec::new()),
        3 => vec(loose_message(), 1..3),
    ]
}

/// Any counts at all, negative ones included; and ignored fields set.
fn loose_call() -> impl Strategy<Value = pb::ProviderCall> {
    (
        provider_call(),
        [int64(), int64(), int64(), int64()],
        text(),
    )
        .prop_map(|(mut call, [prompt, completion, total, cost], id)| {
            call.prompt_tokens = prompt;
            call.completion_tokens = completion;
            call.total_tokens = total;
            call.cost_micros_usd = cost;
            call.id = id;
            call.create_time = Some(prost_types::Timestamp {
                seconds: i64::MIN,
                nanos: -1,
            });
            call
        })
}

fn run_id() -> impl Strategy<Value = String> {
    prop_oneof![
        2 => Just(String::new()),
        2 => "[a-z]{1,4}",
        1 => text(),
        1 => Just("r".repeat(257)),
    ]
}

fn state_key() -> impl Strategy<Value = String> {
    prop_oneof![
        1 => Just(String::new()),
        3 => "[a-z]{1,3}",
        2 => text(),
        1 => Just("\0".to_owned()),
        1 => Just("k".repeat(257)),
    ]
}

fn expected_version() -> impl Strategy<Value = Option<i64>> {
    prop_oneof![2 => Just(None), 1 => int64().prop_map(Some)]
}

/// Minimal base64url without padding, the page tokens' alphabet.
fn base64url(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | (u32::from(*b) << (16 - 8 * i)));
        for i in 0..=chunk.len() {
            out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
        }
    }
    out
}

const TOKEN_KINDS: &[&str] = &[
    "messages", "calls", "sessions", "state", "search", "nope", "",
];

const MASK_PATHS: &[&str] = &[
    "title",
    "system_prompt",
    "metadata",
    "summary_message_id",
    "*",
    "",
    "nope",
    "title.x",
];

fn token() -> impl Strategy<Value = Token> {
    prop_oneof![
        8 => Just(Token::Raw(String::new())),
        2 => text().prop_map(Token::Raw),
        2 => vec(any::<u8>(), 0..40).prop_map(|b| Token::Raw(base64url(&b))),
        3 => (
            proptest::sample::select(TOKEN_KINDS),
            vec(
                prop_oneof![
                    Just("{live}".to_owned()),
                    Just(String::new()),
                    text(),
                    int64().prop_map(|n| n.to_string()),
                ],
                0..4,
            ),
        )
            .prop_map(|(kind, parts)| Token::Forged(kind.to_owned(), parts)),
    ]
}

/// A lease: missing, negative, zero, over a day, or long enough that it
/// never runs out during a case (an expiry would be a revision of its own).
fn lease() -> impl Strategy<Value = Option<prost_types::Duration>> {
    let seconds = prop_oneof![Just(i64::MIN), Just(i64::MAX), -100..=0i64, 60..200_000i64,];
    let nanos = prop_oneof![
        Just(0),
        Just(-1),
        Just(i32::MIN),
        Just(i32::MAX),
        Just(999_999_999),
        Just(1_000_000_000),
    ];
    prop_oneof![
        1 => Just(None),
        3 => (60..3600i64).prop_map(|seconds| Some(prost_types::Duration { seconds, nanos: 0 })),
        4 => (seconds, nanos).prop_map(|(seconds, nanos)| {
            let micros = seconds
                .saturating_mul(1_000_000)
                .saturating_add(i64::from(nanos / 1000));
            let seconds = if (1..30_000_000).contains(&micros) { 60 } else { seconds };
            Some(prost_types::Duration { seconds, nanos })
        }),
    ]
}

fn delta() -> impl Strategy<Value = Option<pb::publish_delta_request::Delta>> {
    use pb::publish_delta_request::Delta;
    prop_oneof![
        1 => Just(None),
        2 => text().prop_map(|t| Some(Delta::Text(t))),
        2 => block().prop_map(|b| Some(Delta::Block(b))),
        1 => Just(Some(Delta::Block(pb::ContentBlock { block: None }))),
    ]
}

fn request() -> impl Strategy<Value = Req> {
    Union::new(vec![
        (
            prop_oneof![Just(String::new()), raw_id()],
            vec(loose_message(), 0..3),
            metadata(),
        )
            .prop_map(|(id, history, metadata)| Req::Create {
                id,
                history,
                metadata,
            })
            .boxed(),
        sid().prop_map(Req::Get).boxed(),
        (
            page_size(),
            token(),
            prop_oneof![Just(String::new()), text()],
        )
            .prop_map(|(page_size, token, user)| Req::ListSessions {
                page_size,
                token,
                user,
            })
            .boxed(),
        (
            sid(),
            text(),
            proptest::option::of(mid()),
            proptest::option::of(vec(
                proptest::sample::select(MASK_PATHS).prop_map(str::to_owned),
                0..3,
            )),
            metadata(),
        )
            .prop_map(|(sid, title, summary, paths, metadata)| Req::Update {
                sid,
                title,
                summary,
                paths,
                metadata,
            })
            .boxed(),
        sid().prop_map(Req::Delete).boxed(),
        (
            sid(),
            loose_messages(),
            prop_oneof![3 => Just(Vec::new()), 1 => vec(loose_message(), 0..5)],
            proptest::option::of(loose_call()),
            loose_messages(),
            prop_oneof![Just(None), Just(Some(3)), int64().prop_map(Some)],
            prop_oneof![
                Just(String::new()),
                "[a-z]{1,2}",
                text(),
                Just("i".repeat(257))
            ],
            run_id(),
        )
            .prop_map(
                |(sid, messages, full_history, call, responses, expected, request_id, run_id)| {
                    Req::Append {
                        sid,
                        messages,
                        full_history,
                        call: call.map(Box::new),
                        responses,
                        expected,
                        request_id,
                        run_id,
                    }
                },
            )
            .boxed(),
        // Near-valid appends to the live session: they succeed, or meet a
        // busy session, a stale expected_next_sequence or a reused key.
        (
            vec(message(), 0..3),
            proptest::option::of(provider_call()),
            vec(message(), 0..2),
            prop_oneof![2 => Just(None), 1 => (3..7i64).prop_map(Some)],
            prop_oneof![
                Just(String::new()),
                "[ab]".prop_map(|key| format!("{key}-{{live}}"))
            ],
            prop_oneof![2 => Just(String::new()), 1 => "[ab]"],
        )
            .prop_map(
                |(messages, call, responses, expected, request_id, run_id)| {
                    let call = call.or_else(|| {
                        (messages.is_empty() || !responses.is_empty())
                            .then(pb::ProviderCall::default)
                    });
                    Req::Append {
                        sid: Sid::Live,
                        messages,
                        full_history: Vec::new(),
                        call: call.map(Box::new),
                        responses,
                        expected,
                        request_id,
                        run_id,
                    }
                },
            )
            .boxed(),
        (
            sid(),
            any::<bool>(),
            any::<bool>(),
            proptest::option::of(int64()),
            int64(),
        )
            .prop_map(
                |(sid, include_system_prompt, from_summary, after, max)| Req::Export {
                    sid,
                    include_system_prompt,
                    from_summary,
                    after,
                    max,
                },
            )
            .boxed(),
        (sid(), proptest::option::of(int64()), page_size(), token())
            .prop_map(|(sid, after, page_size, token)| Req::ListMessages {
                sid,
                after,
                page_size,
                token,
            })
            .boxed(),
        (sid(), page_size(), token())
            .prop_map(|(sid, page_size, token)| Req::ListCalls {
                sid,
                page_size,
                token,
            })
            .boxed(),
        (sid(), prop_oneof![int64(), Just(1000), 1..4i64])
            .prop_map(|(sid, after_revision)| Req::Watch {
                sid,
                after_revision,
            })
            .boxed(),
        (sid(), run_id(), int64(), delta())
            .prop_map(|(sid, run_id, index, delta)| Req::Delta {
                sid,
                run_id,
                index,
                delta,
            })
            .boxed(),
        (sid(), run_id())
            .prop_map(|(sid, run_id)| Req::Discard { sid, run_id })
            .boxed(),
        (sid(), run_id(), lease())
            .prop_map(|(sid, run_id, lease)| Req::Begin { sid, run_id, lease })
            .boxed(),
        // A near-valid BeginRun: the live session gets busy.
        ("[ab]", 60..3600i64)
            .prop_map(|(run_id, seconds)| Req::Begin {
                sid: Sid::Live,
                run_id,
                lease: Some(prost_types::Duration { seconds, nanos: 0 }),
            })
            .boxed(),
        (sid(), run_id())
            .prop_map(|(sid, run_id)| Req::End { sid, run_id })
            .boxed(),
        (sid(), int64(), run_id())
            .prop_map(|(sid, after, run_id)| Req::Rollback { sid, after, run_id })
            .boxed(),
        (
            sid(),
            mid(),
            proptest::option::of(loose_message()),
            prop_oneof![text(), Just("w".repeat(1025))],
            run_id(),
        )
            .prop_map(|(sid, mid, message, reason, run_id)| Req::Edit {
                sid,
                mid,
                message,
                reason,
                run_id,
            })
            .boxed(),
        (
            sid(),
            mid(),
            prop_oneof![text(), Just("w".repeat(1025))],
            run_id(),
        )
            .prop_map(|(sid, mid, reason, run_id)| Req::Redact {
                sid,
                mid,
                reason,
                run_id,
            })
            .boxed(),
        (sid(), int64(), prop_oneof![Just(String::new()), raw_id()])
            .prop_map(|(sid, at, new_id)| Req::Fork { sid, at, new_id })
            .boxed(),
        (
            sid(),
            prop_oneof![
                0..4i32,
                Just(-1),
                Just(i32::MIN),
                Just(i32::MAX),
                any::<i32>()
            ],
        )
            .prop_map(|(sid, format)| Req::Transcript { sid, format })
            .boxed(),
        (
            sid(),
            state_key(),
            prop_oneof![4 => text(), 1 => Just("v".repeat(64 * 1024 + 1))],
            expected_version(),
        )
            .prop_map(|(sid, key, value, expected)| Req::SetState {
                sid,
                key,
                value,
                expected,
            })
            .boxed(),
        (sid(), state_key())
            .prop_map(|(sid, key)| Req::GetState { sid, key })
            .boxed(),
        (sid(), page_size(), token())
            .prop_map(|(sid, page_size, token)| Req::ListState {
                sid,
                page_size,
                token,
            })
            .boxed(),
        (sid(), state_key(), expected_version())
            .prop_map(|(sid, key, expected)| Req::DeleteState { sid, key, expected })
            .boxed(),
        (
            prop_oneof![
                Just(String::new()),
                "[a-z]{1,5}( [a-zA-Z]{1,5}){0,3}",
                Just("\0 \0".to_owned()),
                text(),
                Just("w ".repeat(40)),
                Just("q".repeat(1025)),
            ],
            prop_oneof![Just(String::new()), text()],
            page_size(),
            token(),
        )
            .prop_map(|(query, user, page_size, token)| Req::Search {
                query,
                user,
                page_size,
                token,
            })
            .boxed(),
    ])
}

/// What a case's requests resolve against.
struct Live {
    id: String,
    message_ids: Vec<String>,
}

const MISSING_ID: &str = "ses_hostile_missing";

impl Live {
    fn sid(&self, sid: &Sid) -> String {
        match sid {
            Sid::Live => self.id.clone(),
            Sid::Missing => MISSING_ID.to_owned(),
            Sid::Raw(raw) => raw.clone(),
        }
    }

    fn mid(&self, mid: &Mid) -> String {
        match mid {
            Mid::Live(i) if !self.message_ids.is_empty() => {
                self.message_ids[i % self.message_ids.len()].clone()
            }
            Mid::Live(_) => "msg_none".to_owned(),
            Mid::Raw(raw) => raw.clone(),
        }
    }

    fn token(&self, token: &Token) -> String {
        match token {
            Token::Raw(raw) => raw.clone(),
            Token::Forged(kind, parts) => {
                let mut plain = kind.clone();
                for part in parts {
                    plain.push('\u{1f}');
                    plain.push_str(&part.replace("{live}", &self.id));
                }
                base64url(plain.as_bytes())
            }
        }
    }

    /// The sessions a request could change: its own and any it creates.
    fn touched(&self, req: &Req) -> Vec<String> {
        let ids = match req {
            Req::Create { id, .. } => vec![id.clone()],
            Req::ListSessions { .. } | Req::Search { .. } => Vec::new(),
            Req::Fork { sid, new_id, .. } => vec![self.sid(sid), new_id.clone()],
            Req::Get(sid) | Req::Delete(sid) => vec![self.sid(sid)],
            Req::Update { sid, .. }
            | Req::Append { sid, .. }
            | Req::Export { sid, .. }
            | Req::ListMessages { sid, .. }
            | Req::ListCalls { sid, .. }
            | Req::Watch { sid, .. }
            | Req::Delta { sid, .. }
            | Req::Discard { sid, .. }
            | Req::Begin { sid, .. }
            | Req::End { sid, .. }
            | Req::Rollback { sid, .. }
            | Req::Edit { sid, .. }
            | Req::Redact { sid, .. }
            | Req::Transcript { sid, .. }
            | Req::SetState { sid, .. }
            | Req::GetState { sid, .. }
            | Req::ListState { sid, .. }
            | Req::DeleteState { sid, .. } => vec![self.sid(sid)],
        };
        // Ids no session can have are not worth a look-up.
        ids.into_iter()
            .filter(|id| !id.is_empty() && id.len() <= 128)
            .collect()
    }
}

/// Sends one request; a streaming answer is read to its end (a watch: to
/// `caught_up`).
async fn send(client: &mut Client, live: &Live, req: &Req) -> Result<(), tonic::Status> {
    match req {
        Req::Create {
            id,
            history,
            metadata,
        } => {
            client
                .create_session(pb::CreateSessionRequest {
                    session_id: id.clone(),
                    title: "hostile".into(),
                    system_prompt: "prompt".into(),
                    user: "mallory".into(),
                    metadata: metadata.clone(),
                    initial_history: history.clone(),
                    ..Default::default()
                })
                .await?;
        }
        Req::Get(sid) => {
            client
                .get_session(pb::GetSessionRequest {
                    session_id: live.sid(sid),
                    ..Default::default()
                })
                .await?;
        }
        Req::ListSessions {
            page_size,
            token,
            user,
        } => {
            client
                .list_sessions(pb::ListSessionsRequest {
                    page_size: *page_size,
                    page_token: live.token(token),
                    user: user.clone(),
                    ..Default::default()
                })
                .await?;
        }
        Req::Update {
            sid,
            title,
            summary,
            paths,
            metadata,
        } => {
            client
                .update_session(pb::UpdateSessionRequest {
                    session: Some(pb::Session {
                        id: live.sid(sid),
                        title: title.clone(),
                        metadata: metadata.clone(),
                        summary_message_id: summary
                            .as_ref()
                            .map(|m| live.mid(m))
                            .unwrap_or_default(),
                        revision: -7,
                        ..Default::default()
                    }),
                    update_mask: paths.clone().map(|paths| prost_types::FieldMask { paths }),
                })
                .await?;
        }
        Req::Delete(sid) => {
            client
                .delete_session(pb::DeleteSessionRequest {
                    session_id: live.sid(sid),
                })
                .await?;
        }
        Req::Append {
            sid,
            messages,
            full_history,
            call,
            responses,
            expected,
            request_id,
            run_id,
        } => {
            client
                .append_exchange(pb::AppendExchangeRequest {
                    session_id: live.sid(sid),
                    messages: messages.clone(),
                    full_history: full_history.clone(),
                    provider_call: call.as_deref().cloned(),
                    response_messages: responses.clone(),
                    expected_next_sequence: *expected,
                    request_id: request_id.replace("{live}", &live.id),
                    run_id: run_id.clone(),
                    ..Default::default()
                })
                .await?;
        }
        Req::Export {
            sid,
            include_system_prompt,
            from_summary,
            after,
            max,
        } => {
            try_export(
                client,
                pb::ExportHistoryRequest {
                    session_id: live.sid(sid),
                    include_system_prompt: *include_system_prompt,
                    from_summary: *from_summary,
                    after_sequence: *after,
                    max_messages: *max,
                    target: None,
                },
            )
            .await?;
        }
        Req::ListMessages {
            sid,
            after,
            page_size,
            token,
        } => {
            client
                .list_messages(pb::ListMessagesRequest {
                    session_id: live.sid(sid),
                    after_sequence: *after,
                    page_size: *page_size,
                    page_token: live.token(token),
                    ..Default::default()
                })
                .await?;
        }
        Req::ListCalls {
            sid,
            page_size,
            token,
        } => {
            client
                .list_provider_calls(pb::ListProviderCallsRequest {
                    session_id: live.sid(sid),
                    page_size: *page_size,
                    page_token: live.token(token),
                })
                .await?;
        }
        Req::Watch {
            sid,
            after_revision,
        } => {
            let mut events = client
                .watch_session(pb::WatchSessionRequest {
                    session_id: live.sid(sid),
                    after_revision: *after_revision,
                    include_active_deltas: true,
                    ..Default::default()
                })
                .await?
                .into_inner();
            let caught_up = async {
                let mut last = 0;
                loop {
                    match events.message().await? {
                        None => {
                            return Err(tonic::Status::data_loss("watch ended before caught_up"));
                        }
                        Some(pb::SessionEvent {
                            event: Some(Event::CaughtUp(_)),
                            ..
                        }) => return Ok(()),
                        Some(event) if event.revision <= last => {
                            return Err(tonic::Status::data_loss(format!(
                                "watch replayed revision {} after {last}",
                                event.revision
                            )));
                        }
                        Some(event) => last = event.revision,
                    }
                }
            };
            tokio::time::timeout(PATIENCE, caught_up)
                .await
                .map_err(|_| tonic::Status::deadline_exceeded("watch never caught up"))??;
        }
        Req::Delta {
            sid,
            run_id,
            index,
            delta,
        } => {
            client
                .publish_delta(pb::PublishDeltaRequest {
                    session_id: live.sid(sid),
                    run_id: run_id.clone(),
                    index: *index,
                    delta: delta.clone(),
                })
                .await?;
        }
        Req::Discard { sid, run_id } => {
            client
                .discard_run(pb::DiscardRunRequest {
                    session_id: live.sid(sid),
                    run_id: run_id.clone(),
                })
                .await?;
        }
        Req::Begin { sid, run_id, lease } => {
            client
                .begin_run(pb::BeginRunRequest {
                    session_id: live.sid(sid),
                    run_id: run_id.clone(),
                    lease: *lease,
                })
                .await?;
        }
        Req::End { sid, run_id } => {
            client
                .end_run(pb::EndRunRequest {
                    session_id: live.sid(sid),
                    run_id: run_id.clone(),
                    ..Default::default()
                })
                .await?;
        }
        Req::Rollback { sid, after, run_id } => {
            client
                .rollback_session(pb::RollbackSessionRequest {
                    session_id: live.sid(sid),
                    after_sequence: *after,
                    run_id: run_id.clone(),
                    ..Default::default()
                })
                .await?;
        }
        Req::Edit {
            sid,
            mid,
            message,
            reason,
            run_id,
        } => {
            client
                .edit_message(pb::EditMessageRequest {
                    session_id: live.sid(sid),
                    message_id: live.mid(mid),
                    message: message.clone(),
                    reason: reason.clone(),
                    run_id: run_id.clone(),
                })
                .await?;
        }
        Req::Redact {
            sid,
            mid,
            reason,
            run_id,
        } => {
            client
                .redact_message(pb::RedactMessageRequest {
                    session_id: live.sid(sid),
                    message_id: live.mid(mid),
                    reason: reason.clone(),
                    run_id: run_id.clone(),
                })
                .await?;
        }
        Req::Fork { sid, at, new_id } => {
            client
                .fork_session(pb::ForkSessionRequest {
                    session_id: live.sid(sid),
                    at_sequence: *at,
                    new_session_id: new_id.clone(),
                })
                .await?;
        }
        Req::Transcript { sid, format } => {
            try_transcript(client, &live.sid(sid), *format).await?;
        }
        Req::SetState {
            sid,
            key,
            value,
            expected,
        } => {
            client
                .set_state(pb::SetStateRequest {
                    session_id: live.sid(sid),
                    key: key.clone(),
                    value: value.clone(),
                    expected_version: *expected,
                    ..Default::default()
                })
                .await?;
        }
        Req::GetState { sid, key } => {
            client
                .get_state(pb::GetStateRequest {
                    session_id: live.sid(sid),
                    key: key.clone(),
                    ..Default::default()
                })
                .await?;
        }
        Req::ListState {
            sid,
            page_size,
            token,
        } => {
            client
                .list_state(pb::ListStateRequest {
                    session_id: live.sid(sid),
                    page_size: *page_size,
                    page_token: live.token(token),
                    ..Default::default()
                })
                .await?;
        }
        Req::DeleteState { sid, key, expected } => {
            client
                .delete_state(pb::DeleteStateRequest {
                    session_id: live.sid(sid),
                    key: key.clone(),
                    expected_version: *expected,
                    ..Default::default()
                })
                .await?;
        }
        Req::Search {
            query,
            user,
            page_size,
            token,
        } => {
            client
                .search_messages(pb::SearchMessagesRequest {
                    query: query.clone(),
                    user: user.clone(),
                    page_size: *page_size,
                    page_token: live.token(token),
                })
                .await?;
        }
    }
    Ok(())
}

/// The session as GetSession shows it, or `None` if there is none.
async fn snapshot(client: &mut Client, id: &str) -> Result<Option<pb::Session>, TestCaseError> {
    match client
        .get_session(pb::GetSessionRequest {
            session_id: id.to_owned(),
            ..Default::default()
        })
        .await
    {
        Ok(session) => Ok(Some(session.into_inner())),
        Err(status) if status.code() == Code::NotFound => Ok(None),
        Err(status) => Err(failed_call("GetSession (snapshot)", &status)),
    }
}

/// A refused request got an allowed status with its details.
fn check_refusal(req: &Req, status: &tonic::Status) -> Result<(), TestCaseError> {
    let (reason, field) = error_details(status);
    prop_assert!(
        SPEC_CODES.contains(&status.code()),
        "{:?} answered {:?} {:?} (details {:?})",
        req,
        status.code(),
        status.message(),
        (reason, field)
    );
    prop_assert!(
        reason.as_deref().is_some_and(|r| !r.is_empty()),
        "{:?}: status {:?} {:?} carries no ErrorInfo reason",
        req,
        status.code(),
        status.message()
    );
    if status.code() == Code::InvalidArgument {
        prop_assert!(
            field.as_deref().is_some_and(|f| !f.is_empty()),
            "{:?}: INVALID_ARGUMENT {:?} names no field in BadRequest",
            req,
            status.message()
        );
    }
    Ok(())
}

async fn validation_case(mut client: Client, requests: Vec<Req>) -> Result<(), TestCaseError> {
    let id = fresh_id("val");
    let mut tool_call_message = assistant("");
    tool_call_message.tool_calls.push(pb::ToolCall {
        id: "t1".into(),
        name: "f".into(),
        arguments: "{".into(),
        signature: String::new(),
    });
    rpc(
        "CreateSession",
        client
            .create_session(pb::CreateSessionRequest {
                session_id: id.clone(),
                system_prompt: "prompt".into(),
                user: "mallory".into(),
                initial_history: vec![
                    user("hello"),
                    tool_call_message,
                    pb::Message {
                        role: pb::Role::Tool.into(),
                        content: "result".into(),
                        tool_call_id: "t1".into(),
                        ..Default::default()
                    },
                ],
                ..Default::default()
            })
            .await,
    )?;
    let message_ids = try_list(&mut client, &id, 0)
        .await
        .map_err(|s| failed_call("ListMessages", &s))?
        .into_iter()
        .map(|m| m.id)
        .collect();
    let live = Live { id, message_ids };

    for req in &requests {
        let touched = live.touched(req);
        let mut before = Vec::with_capacity(touched.len());
        for id in &touched {
            before.push(snapshot(&mut client, id).await?);
        }
        let Err(status) = send(&mut client, &live, req).await else {
            continue;
        };
        check_refusal(req, &status)?;
        for (id, before) in touched.iter().zip(before) {
            let after = snapshot(&mut client, id).await?;
            prop_assert_eq!(
                &after,
                &before,
                "{:?} failed with {:?} {:?} but changed session {:?}",
                req,
                status.code(),
                status.message(),
                id
            );
        }
    }

    // Whatever happened, the live session is still one consistent history.
    if snapshot(&mut client, &live.id).await?.is_some() {
        let listed = try_list(&mut client, &live.id, 0)
            .await
            .map_err(|s| failed_call("ListMessages", &s))?;
        for (i, stored) in listed.iter().enumerate() {
            prop_assert_eq!(stored.sequence, i as i64);
        }
        let exported = try_export(
            &mut client,
            pb::ExportHistoryRequest {
                session_id: live.id.clone(),
                ..Default::default()
            },
        )
        .await
        .map_err(|s| failed_call("ExportHistory", &s))?;
        prop_assert_eq!(exported, plain(&listed));
    }
    Ok(())
}

/// The server answers health checks SERVING and serves a plain
/// create + append + export, within [`PATIENCE`].
pub(crate) async fn assert_serving(endpoint: &str, tag: &str) {
    let work = async {
        let channel = Channel::from_shared(endpoint.to_owned())
            .expect("endpoint")
            .connect()
            .await
            .expect("connect after hostile input");
        let mut health = tonic_health::pb::health_client::HealthClient::new(channel.clone());
        for service in ["", "sessionstore.v1.SessionStore"] {
            let answer = health
                .check(tonic_health::pb::HealthCheckRequest {
                    service: service.into(),
                })
                .await
                .expect("health check")
                .into_inner();
            assert_eq!(
                answer.status,
                i32::from(tonic_health::pb::health_check_response::ServingStatus::Serving),
                "health of {service:?} after {tag}"
            );
        }
        let mut client = SessionStoreClient::new(channel);
        let id = fresh_id("sane");
        create(&mut client, &id).await;
        exchange(&mut client, &id, "still there?", "yes").await;
        let exported = export(
            &mut client,
            pb::ExportHistoryRequest {
                session_id: id,
                ..Default::default()
            },
        )
        .await;
        assert_eq!(
            exported,
            vec![user("still there?"), assistant("yes")],
            "after {tag}"
        );
    };
    tokio::time::timeout(PATIENCE, work)
        .await
        .unwrap_or_else(|_| panic!("the server did not serve within {PATIENCE:?} after {tag}"));
}

/// Requests at the integer extremes, run before the random ones so a known
/// edge is always covered: cursors and positions at `i64::MAX`/`MIN`,
/// windows of `i64::MAX` messages, counters that would overflow a sum. Each
/// inner list runs against one fresh session.
fn edge_requests() -> Vec<Vec<Req>> {
    let live = Sid::Live;
    let forged = |kind: &str, position: i64| {
        Token::Forged(
            kind.to_owned(),
            vec!["{live}".to_owned(), position.to_string()],
        )
    };
    let mut huge_call = pb::ProviderCall {
        prompt_tokens: i64::MAX,
        completion_tokens: i64::MAX,
        total_tokens: 0,
        cost_micros_usd: i64::MAX,
        ..Default::default()
    };
    huge_call.model = "huge".into();
    let huge_append = Req::Append {
        sid: Sid::Live,
        messages: vec![user("big spender")],
        full_history: Vec::new(),
        call: Some(Box::new(huge_call)),
        responses: vec![assistant("ok")],
        expected: None,
        request_id: String::new(),
        run_id: String::new(),
    };
    let export = |after: Option<i64>, max: i64, from_summary: bool| Req::Export {
        sid: Sid::Live,
        include_system_prompt: true,
        from_summary,
        after,
        max,
    };
    let singles = vec![
        export(Some(i64::MAX - 1), 0, false),
        export(Some(i64::MAX), 0, false),
        export(Some(i64::MAX), 2, false),
        export(None, i64::MAX, false),
        export(Some(-1), i64::MAX, true),
        Req::ListMessages {
            sid: live.clone(),
            after: Some(i64::MAX),
            page_size: i32::MAX,
            token: Token::Raw(String::new()),
        },
        Req::ListMessages {
            sid: live.clone(),
            after: None,
            page_size: 1,
            token: forged("messages", i64::MIN),
        },
        Req::ListMessages {
            sid: live.clone(),
            after: None,
            page_size: 1,
            token: forged("messages", i64::MAX),
        },
        Req::ListCalls {
            sid: live.clone(),
            page_size: i32::MAX,
            token: forged("calls", i64::MIN),
        },
        Req::ListCalls {
            sid: live.clone(),
            page_size: 1,
            token: forged("calls", i64::MAX),
        },
        Req::ListState {
            sid: live.clone(),
            page_size: i32::MAX,
            token: Token::Forged("state".into(), vec!["{live}".into(), "\0".into()]),
        },
        Req::Search {
            query: "big".into(),
            user: String::new(),
            page_size: i32::MAX,
            token: Token::Forged(
                "search".into(),
                vec!["big".into(), String::new(), i64::MAX.to_string()],
            ),
        },
        Req::ListSessions {
            page_size: i32::MAX,
            token: Token::Forged(
                "sessions".into(),
                vec![String::new(), i64::MIN.to_string(), String::new()],
            ),
            user: String::new(),
        },
        Req::Watch {
            sid: live.clone(),
            after_revision: i64::MAX,
        },
        Req::Delta {
            sid: live.clone(),
            run_id: "r".into(),
            index: i64::MAX,
            delta: Some(pb::publish_delta_request::Delta::Text("x".into())),
        },
        Req::Fork {
            sid: live.clone(),
            at: i64::MAX,
            new_id: String::new(),
        },
        Req::SetState {
            sid: live.clone(),
            key: "k".into(),
            value: "v".into(),
            expected: Some(i64::MAX),
        },
        Req::Begin {
            sid: live.clone(),
            run_id: "r".into(),
            lease: Some(prost_types::Duration {
                seconds: i64::MAX,
                nanos: i32::MAX,
            }),
        },
        Req::Begin {
            sid: live.clone(),
            run_id: "r".into(),
            lease: Some(prost_types::Duration {
                seconds: 86_400,
                nanos: 999_999_999,
            }),
        },
        Req::Append {
            sid: live.clone(),
            messages: vec![user("late")],
            full_history: Vec::new(),
            call: None,
            responses: Vec::new(),
            expected: Some(i64::MAX),
            request_id: String::new(),
            run_id: String::new(),
        },
        Req::Rollback {
            sid: live,
            after: i64::MAX,
            run_id: String::new(),
        },
    ];
    let mut edges: Vec<Vec<Req>> = singles.into_iter().map(|req| vec![req]).collect();
    // Two calls whose counts each fill an int64: the session's totals must
    // not overflow into an error, neither on the second write nor in listings.
    edges.push(vec![
        huge_append.clone(),
        huge_append,
        Req::ListSessions {
            page_size: 0,
            token: Token::Raw(String::new()),
            user: "mallory".into(),
        },
        Req::Get(Sid::Live),
    ]);
    edges
}

fn validation(backend: Backend) {
    let runtime = runtime();
    if matches!(backend, Backend::Postgres)
        && !runtime.block_on(postgres_available("hostile::validation_postgres"))
    {
        return;
    }
    let server = runtime.block_on(TestServer::start(backend));
    let client = runtime.block_on(server.client());
    let failures: Vec<String> = edge_requests()
        .into_iter()
        .filter_map(|edge| {
            runtime
                .block_on(validation_case(client.clone(), edge.clone()))
                .err()
                .map(|error| format!("{error}\n  requests: {edge:?}"))
        })
        .collect();
    assert!(
        failures.is_empty(),
        "request validation on {backend:?}, edge requests:\n{}",
        failures.join("\n")
    );
    run_property(
        &runtime,
        &format!("request validation on {backend:?}"),
        vec(request(), 1..6),
        |requests| validation_case(client.clone(), requests),
    );
    drop(client);
    runtime.block_on(assert_serving(&server.endpoint(), "arbitrary requests"));
    runtime
        .block_on(server.stop())
        .expect("the server stops cleanly");
}

#[test]
fn validation_memory() {
    validation(Backend::Memory);
}

#[test]
fn validation_postgres() {
    validation(Backend::Postgres);
}
