//! The gRPC edge: each handler validates and converts its request, calls one
//! store or domain operation, and converts the answer (through
//! [`crate::wire`], which the store shares for the event log).

use std::pin::Pin;
use std::sync::Arc;

use futures_core::Stream;
use futures_util::StreamExt as _;
use sessionstore_client::v1 as pb;
use sessionstore_client::v1::session_store_server::SessionStore as SessionStoreRpc;
use tonic::{Request, Response, Status};
use tracing::Instrument as _;

use crate::admission::WatchPermits;
use crate::domain::bodies::Body;
use crate::domain::control::{
    self, check_expected_version, check_shared_scope, require_run_id, validate_delta,
};
use crate::domain::erase::Erasure;
use crate::domain::fields::{
    check_state_entry, check_state_key, check_state_scopes, require_session_id,
};
use crate::domain::filter::SessionFilter;
use crate::domain::paging::Pages;
use crate::domain::target::ExportTarget;
use crate::domain::usage::UsageQuery;
use crate::domain::{
    ControlOp, Ephemeral, EphemeralKind, Error, Fork, Message, Result, Role, SessionCursor,
    SessionPatch, SessionQuery, StoredMessage, Timestamp,
};
use crate::metrics::Metrics;
use crate::read_ahead::{ReadAhead, ReadPage, Share, StreamBudget};
use crate::store::{
    EncodedMessage, ExportStart, MessageRow, SearchQuery, SessionHandle, SharedStateWrite, Store,
};
use crate::watch::{self, Hub, WatchItem, WatchOptions, WatchRequest};
use crate::wire;

mod approvals;
mod encoded_streams;
mod export_chunks;
mod limits;
mod queue;
mod targeted;
mod transcript;

mod status;

pub use encoded_streams::EncodedStreams;
pub use limits::Limits;
pub use status::{ERROR_DOMAIN, limit_exceeded};

use crate::auth::tenant_of;

/// Export chunks stay below this many encoded bytes (a single larger
/// message travels alone).
pub const EXPORT_CHUNK_BYTES: usize = 1024 * 1024;

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

/// The messages an export sends, as the store (or a target's rules) gives them.
type Messages = Pin<Box<dyn Stream<Item = Result<StoredMessage>> + Send + 'static>>;

/// The `SessionStore` service over a store.
pub struct SessionStoreService<S> {
    store: S,
    hub: Arc<Hub>,
    options: ServiceOptions,
    /// What the streams' read-ahead may hold, all together.
    stream_budget: Arc<StreamBudget>,
}

/// How the service behaves, beyond its store.
#[derive(Clone)]
pub struct ServiceOptions {
    pub watch: WatchOptions,
    pub limits: Limits,
    pub watch_permits: Arc<WatchPermits>,
    pub metrics: Arc<Metrics>,
}

impl<S: Store> SessionStoreService<S> {
    /// Checks an ExportHistory call and opens its stream of chunks, each a
    /// framed `ExportHistoryResponse` (`export_chunks`). Served through
    /// [`encoded_streams`] on the network; the generated service's
    /// `export_history` decodes the same chunks.
    pub(crate) async fn open_export(
        &self,
        request: Request<pb::ExportHistoryRequest>,
    ) -> Result<BoxStream<bytes::Bytes>, Status> {
        let tenant = tenant_of(&request);
        let req = request.into_inner();
        streaming("ExportHistory", &req.session_id.clone(), async {
            require_session_id("session_id", &req.session_id)?;
            let target = wire::target_from_pb(req.target)?;
            let session = self.store.resolve(&tenant, &req.session_id).await?;
            // With a target, max_messages windows what the target's rules
            // leave, so the range starts where the request allows.
            let window = if target.is_some() {
                0
            } else {
                req.max_messages
            };
            let start = ExportStart::compute(
                &self.store,
                &session,
                req.from_summary,
                req.after_sequence,
                window,
            )
            .await?;
            let prompt = (req.include_system_prompt
                && req.after_sequence.is_none()
                && !session.system_prompt.is_empty())
            .then(|| Message::text(Role::System, session.system_prompt.clone()));
            let share = self.stream_budget.admit()?;
            let encodings: export_chunks::Encodings = match target {
                None => Box::pin(encoded_messages(
                    self.store.clone(),
                    session.clone(),
                    start.after,
                    share,
                )),
                // A target's rules change what is sent: those messages are
                // encoded from what the rules leave.
                Some(target) => Box::pin(
                    targeted::targeted(
                        self.store.clone(),
                        session.clone(),
                        start.after,
                        target,
                        usize::try_from(req.max_messages).unwrap_or(usize::MAX),
                        share,
                        Arc::clone(&self.stream_budget),
                    )
                    .map(|sent| sent.and_then(targeted::Targeted::into_encoding)),
                ),
            };
            Ok(export_chunks::chunks(encodings, prompt))
        })
        .await
        .map(Response::into_inner)
    }

    /// Checks a WatchSession call and opens its stream of items. The
    /// stream holds the call's watch permit and gauge until it is dropped.
    /// Served through [`encoded_streams`] on the network; the generated
    /// service's `watch_session` converts the same items.
    pub(crate) async fn open_watch(
        &self,
        request: Request<pb::WatchSessionRequest>,
    ) -> Result<impl Stream<Item = Result<WatchItem, Status>> + Send + 'static, Status> {
        let tenant = tenant_of(&request);
        let req = request.into_inner();
        let span = span("WatchSession", &req.session_id);
        let (events, permit) = async {
            require_session_id("session_id", &req.session_id)?;
            if req.after_revision < 0 {
                return Err(Error::invalid("after_revision", "must not be negative"));
            }
            let session = self.store.resolve(&tenant, &req.session_id).await?;
            let permit = self.options.watch_permits.acquire(&tenant)?;
            // Only a replay reads ahead: a watcher at the head needs no share.
            let share = if req.after_revision < session.revision {
                Some(self.stream_budget.admit()?)
            } else {
                None
            };
            let request = WatchRequest {
                after_revision: req.after_revision,
                include_active_deltas: req.include_active_deltas,
                delta_cursors: wire::delta_cursors_from_pb(&req.delta_cursors)?,
            };
            let events = watch::watch(
                self.store.clone(),
                Arc::clone(&self.hub),
                session,
                request,
                self.options.watch,
                Arc::clone(&self.stream_budget),
                share,
            )?;
            Ok((events, permit))
        }
        .instrument(span)
        .await?;
        // Both live exactly as long as the stream.
        let held = (permit, self.options.metrics.watch_stream());
        Ok(events.map(move |item| {
            let _held = &held;
            item.map_err(Status::from)
        }))
    }
}

/// One watch stream item as the protocol's `SessionEvent`.
fn item_to_pb(item: &WatchItem) -> Result<pb::SessionEvent, Status> {
    use pb::session_event::Event;
    Ok(match item {
        WatchItem::Event(event) => event.to_pb()?,
        WatchItem::CaughtUp { revision } => {
            wire::marker_to_pb(*revision, Event::CaughtUp(pb::CaughtUp {}))
        }
        WatchItem::Progress { revision } => {
            wire::marker_to_pb(*revision, Event::Progress(pb::Progress {}))
        }
        WatchItem::Ephemeral(ephemeral) => wire::ephemeral_to_pb(ephemeral),
    })
}

impl<S: Store> SessionStoreService<S> {
    pub fn new(store: S, hub: Arc<Hub>, options: ServiceOptions) -> Self {
        let stream_budget = StreamBudget::new(options.limits.max_stream_buffer_bytes);
        let gauge = Arc::clone(&stream_budget);
        options
            .metrics
            .set_stream_buffer_probe(move || gauge.buffered());
        SessionStoreService {
            store,
            hub,
            options,
            stream_budget,
        }
    }
}

fn span(method: &'static str, session_id: &str) -> tracing::Span {
    crate::metrics::note_session(session_id);
    tracing::info_span!("rpc", method, session_id = %session_id)
}

/// Runs a server-streaming handler's setup inside its span and answers
/// with the stream it opens, each item's error as a `Status`.
async fn streaming<T, St>(
    method: &'static str,
    session_id: &str,
    setup: impl Future<Output = Result<St>>,
) -> Result<Response<BoxStream<T>>, Status>
where
    St: Stream<Item = Result<T>> + Send + 'static,
{
    let stream = setup.instrument(span(method, session_id)).await?;
    Ok(Response::new(Box::pin(
        stream.map(|item| item.map_err(Status::from)),
    )))
}

/// Runs a unary handler's work inside its span and answers with its result.
async fn unary<T>(
    method: &'static str,
    session_id: &str,
    work: impl Future<Output = Result<T>>,
) -> Result<Response<T>, Status> {
    work.instrument(span(method, session_id))
        .await
        .map(Response::new)
        .map_err(Status::from)
}

impl<S: Store> SessionStoreService<S> {
    /// Applies a control change to a session named by `session_id`.
    async fn control<C: ControlOp>(
        &self,
        tenant: &str,
        session_id: &str,
        control: C,
    ) -> Result<C::Reply> {
        require_session_id("session_id", session_id)?;
        control.validate()?;
        self.store.control(tenant, session_id, control).await
    }

    /// Publishes a delta after the lease check and the run's byte limits;
    /// answers the revision and whether CancelRun asked the run to stop.
    async fn publish_delta(
        &self,
        tenant: &str,
        session_id: &str,
        kind: EphemeralKind,
    ) -> Result<(i64, bool)> {
        let (session, cancelled) = self
            .store
            .resolve_run(tenant, session_id, kind.run_id())
            .await?;
        session.check_lease(kind.run_id(), Timestamp::now())?;
        if let EphemeralKind::Delta { content, .. } = &kind {
            self.hub
                .check_run_room(session.key, kind.run_id(), content.size())?;
        }
        let revision = self.publish(&session, kind).await?;
        Ok((revision, cancelled))
    }

    /// Publishes an ephemeral change to the session's watchers, here and
    /// on every replica; answers the revision it carries.
    async fn publish(&self, session: &SessionHandle, kind: EphemeralKind) -> Result<i64> {
        let now = Timestamp::now();
        let revision = session.revision;
        let ephemeral = Ephemeral {
            revision,
            time: now,
            kind,
        };
        self.store.publish_ephemeral(session, ephemeral).await?;
        Ok(revision)
    }
}

#[tonic::async_trait]
impl<S: Store> SessionStoreRpc for SessionStoreService<S> {
    async fn create_session(
        &self,
        request: Request<pb::CreateSessionRequest>,
    ) -> Result<Response<pb::Session>, Status> {
        let tenant = tenant_of(&request);
        let req = request.into_inner();
        unary("CreateSession", &req.session_id.clone(), async {
            limits::check_history(
                &self.options.limits,
                "initial_history",
                &req.initial_history,
            )?;
            limits::check_metadata(&self.options.limits, "metadata", &req.metadata)?;
            let new = wire::new_session_from_pb(req, "")?;
            new.validate()?;
            let (session, state) = self.store.create_session(&tenant, new).await?;
            Ok(pb::Session {
                state: state.into_iter().map(wire::state_entry_to_pb).collect(),
                ..wire::session_to_pb(session)
            })
        })
        .await
    }

    async fn submit_input(
        &self,
        request: Request<pb::SubmitInputRequest>,
    ) -> Result<Response<pb::SubmitInputResponse>, Status> {
        let tenant = tenant_of(&request);
        let req = request.into_inner();
        let session_id = req.session_id.clone();
        unary("SubmitInput", &session_id, async {
            self.submit_input_in(&tenant, req).await
        })
        .await
    }

    async fn take_queued_input(
        &self,
        request: Request<pb::TakeQueuedInputRequest>,
    ) -> Result<Response<pb::TakeQueuedInputResponse>, Status> {
        let tenant = tenant_of(&request);
        let req = request.into_inner();
        let session_id = req.session_id.clone();
        unary("TakeQueuedInput", &session_id, async {
            self.take_queued_input_in(&tenant, req).await
        })
        .await
    }

    async fn list_queued_inputs(
        &self,
        request: Request<pb::ListQueuedInputsRequest>,
    ) -> Result<Response<pb::ListQueuedInputsResponse>, Status> {
        let tenant = tenant_of(&request);
        let req = request.into_inner();
        let session_id = req.session_id.clone();
        unary("ListQueuedInputs", &session_id, async {
            self.list_queued_inputs_in(&tenant, req).await
        })
        .await
    }

    async fn withdraw_queued_input(
        &self,
        request: Request<pb::WithdrawQueuedInputRequest>,
    ) -> Result<Response<pb::WithdrawQueuedInputResponse>, Status> {
        let tenant = tenant_of(&request);
        let req = request.into_inner();
        let session_id = req.session_id.clone();
        unary("WithdrawQueuedInput", &session_id, async {
            self.withdraw_queued_input_in(&tenant, req).await
        })
        .await
    }

    async fn request_approval(
        &self,
        request: Request<pb::RequestApprovalRequest>,
    ) -> Result<Response<pb::RequestApprovalResponse>, Status> {
        let tenant = tenant_of(&request);
        let req = request.into_inner();
        let session_id = req.session_id.clone();
        unary("RequestApproval", &session_id, async {
            self.request_approval_in(&tenant, req).await
        })
        .await
    }

    async fn decide_approval(
        &self,
        request: Request<pb::DecideApprovalRequest>,
    ) -> Result<Response<pb::DecideApprovalResponse>, Status> {
        let tenant = tenant_of(&request);
        let req = request.into_inner();
        let session_id = req.session_id.clone();
        unary("DecideApproval", &session_id, async {
            self.decide_approval_in(&tenant, req).await
        })
        .await
    }

    async fn get_approval(
        &self,
        request: Request<pb::GetApprovalRequest>,
    ) -> Result<Response<pb::Approval>, Status> {
        let tenant = tenant_of(&request);
        let req = request.into_inner();
        let session_id = req.session_id.clone();
        unary("GetApproval", &session_id, async {
            self.get_approval_in(&tenant, req).await
        })
        .await
    }

    async fn list_approvals(
        &self,
        request: Request<pb::ListApprovalsRequest>,
    ) -> Result<Response<pb::ListApprovalsResponse>, Status> {
        let tenant = tenant_of(&request);
        let req = request.into_inner();
        let session_id = req.session_id.clone();
        unary("ListApprovals", &session_id, async {
            self.list_approvals_in(&tenant, req).await
        })
        .await
    }

    async fn get_session(
        &self,
        request: Request<pb::GetSessionRequest>,
    ) -> Result<Response<pb::Session>, Status> {
        let tenant = tenant_of(&request);
        let req = request.into_inner();
        unary("GetSession", &req.session_id, async {
            require_session_id("session_id", &req.session_id)?;
            if req.state_scopes.is_empty() {
                let session = self.store.get_session(&tenant, &req.session_id).await?;
                return Ok(wire::session_to_pb(session));
            }
            check_state_scopes("state_scopes", &req.state_scopes)?;
            let (session, state) = self
                .store
                .get_session_with_state(&tenant, &req.session_id, &req.state_scopes)
                .await?;
            Ok(pb::Session {
                state: state.into_iter().map(wire::state_entry_to_pb).collect(),
                ..wire::session_to_pb(session)
            })
        })
        .await
    }

    async fn list_sessions(
        &self,
        request: Request<pb::ListSessionsRequest>,
    ) -> Result<Response<pb::ListSessionsResponse>, Status> {
        let tenant = tenant_of(&request);
        let req = request.into_inner();
        unary("ListSessions", "", async {
            let pages = Pages::new(
                "sessions",
                vec![&req.user, &req.filter],
                "was made for a different user or filter",
                req.page_size,
                self.options.limits.max_page_size,
            )?;
            let filter = SessionFilter::parse(&req.filter)?;
            let user = match (req.user.as_str(), filter.user) {
                ("", user) => user,
                (user, None) => Some(user.to_owned()),
                (_, Some(_)) => {
                    return Err(Error::invalid(
                        "filter",
                        "names a user, and so does `user`: give one of them",
                    ));
                }
            };
            let after = pages
                .after_time_and_id(&req.page_token)?
                .map(|(update_time, id)| SessionCursor { update_time, id });
            let query = SessionQuery {
                user,
                metadata: filter.metadata,
                after,
                limit: pages.fetch(),
            };
            let mut sessions = self.store.list_sessions(&tenant, query).await?;
            let next_page_token = pages.next(&mut sessions, |last| {
                vec![
                    last.session.update_time.0.to_string(),
                    last.session.id.clone(),
                ]
            });
            Ok(pb::ListSessionsResponse {
                sessions: sessions.into_iter().map(wire::summary_to_pb).collect(),
                next_page_token,
            })
        })
        .await
    }

    async fn update_session(
        &self,
        request: Request<pb::UpdateSessionRequest>,
    ) -> Result<Response<pb::Session>, Status> {
        let tenant = tenant_of(&request);
        let req = request.into_inner();
        let session_id = req
            .session
            .as_ref()
            .map(|s| s.id.clone())
            .unwrap_or_default();
        unary("UpdateSession", &session_id, async {
            let session = req
                .session
                .ok_or_else(|| Error::invalid("session", "is required"))?;
            require_session_id("session.id", &session.id)?;
            let paths = req.update_mask.map(|m| m.paths).unwrap_or_default();
            let patch = SessionPatch {
                title: Some(session.title),
                system_prompt: Some(session.system_prompt),
                metadata: Some(session.metadata),
                summary_message_id: Some(session.summary_message_id),
                expire_time: Some(wire::expire_time_from_pb(
                    "session.expire_time",
                    session.expire_time.as_ref(),
                )?),
            }
            .masked(&paths)?;
            if let Some(metadata) = &patch.metadata {
                limits::check_metadata(&self.options.limits, "session.metadata", metadata)?;
            }
            let updated = self
                .store
                .update_session(&tenant, &session.id, patch)
                .await?;
            Ok(wire::session_to_pb(updated))
        })
        .await
    }

    async fn delete_session(
        &self,
        request: Request<pb::DeleteSessionRequest>,
    ) -> Result<Response<pb::DeleteSessionResponse>, Status> {
        let tenant = tenant_of(&request);
        let req = request.into_inner();
        unary("DeleteSession", &req.session_id, async {
            require_session_id("session_id", &req.session_id)?;
            self.store.delete_session(&tenant, &req.session_id).await?;
            Ok(pb::DeleteSessionResponse {})
        })
        .await
    }

    async fn append_exchange(
        &self,
        request: Request<pb::AppendExchangeRequest>,
    ) -> Result<Response<pb::AppendExchangeResponse>, Status> {
        let tenant = tenant_of(&request);
        let req = request.into_inner();
        unary("AppendExchange", &req.session_id.clone(), async {
            require_session_id("session_id", &req.session_id)?;
            limits::check_exchange(&self.options.limits, &req)?;
            let exchange = wire::new_exchange_from_pb(req)?;
            exchange.validate()?;
            let (revision, appended) = self.store.append_exchange(&tenant, exchange).await?;
            if !appended.replayed {
                self.options
                    .metrics
                    .exchange_appended(appended.messages.len());
            }
            Ok(wire::append_response_to_pb(revision, appended))
        })
        .await
    }

    type ExportHistoryStream = BoxStream<pb::ExportHistoryResponse>;

    async fn export_history(
        &self,
        request: Request<pb::ExportHistoryRequest>,
    ) -> Result<Response<Self::ExportHistoryStream>, Status> {
        let chunks = self.open_export(request).await?;
        Ok(Response::new(Box::pin(chunks.map(|chunk| {
            chunk.and_then(|framed| export_chunks::decode(&framed))
        }))))
    }

    async fn list_messages(
        &self,
        request: Request<pb::ListMessagesRequest>,
    ) -> Result<Response<pb::ListMessagesResponse>, Status> {
        let tenant = tenant_of(&request);
        let req = request.into_inner();
        unary("ListMessages", &req.session_id, async {
            require_session_id("session_id", &req.session_id)?;
            let (after, before) =
                wire::sequence_bounds_from_pb(req.after_sequence, req.before_sequence)?;
            let newest_first = wire::newest_first_from_pb(&req.order_by)?;
            // Each order has tokens of its own: a page token is for the
            // order it was made in.
            let kind = if newest_first {
                "messages-desc"
            } else {
                "messages"
            };
            let pages = Pages::of_session(
                kind,
                &req.session_id,
                req.page_size,
                self.options.limits.max_page_size,
            )?;
            let cursor = pages.after_int(&req.page_token)?;
            let session = self.store.resolve(&tenant, &req.session_id).await?;
            // Keyset pages over the (session, sequence) index from the end
            // the order starts at; the other bound cuts the page short.
            let mut messages = if newest_first {
                let mut page = self
                    .store
                    .read_messages_before(&session, cursor.unwrap_or(before), pages.fetch())
                    .await?;
                page.retain(|m| m.sequence > after);
                page
            } else {
                let mut page = self
                    .store
                    .read_messages(&session, cursor.unwrap_or(after), pages.fetch())
                    .await?;
                page.retain(|m| m.sequence < before);
                page
            };
            let next_page_token = pages.next(&mut messages, |m| vec![m.sequence.to_string()]);
            Ok(pb::ListMessagesResponse {
                messages: messages
                    .into_iter()
                    .map(wire::stored_message_to_pb)
                    .collect(),
                next_page_token,
            })
        })
        .await
    }

    async fn list_provider_calls(
        &self,
        request: Request<pb::ListProviderCallsRequest>,
    ) -> Result<Response<pb::ListProviderCallsResponse>, Status> {
        let tenant = tenant_of(&request);
        let req = request.into_inner();
        unary("ListProviderCalls", &req.session_id, async {
            require_session_id("session_id", &req.session_id)?;
            let pages = Pages::of_session(
                "calls",
                &req.session_id,
                req.page_size,
                self.options.limits.max_page_size,
            )?;
            let after = pages.after_int(&req.page_token)?.unwrap_or(0);
            let session = self.store.resolve(&tenant, &req.session_id).await?;
            let mut calls = self
                .store
                .read_provider_calls(&session, after, pages.fetch())
                .await?;
            let next_page_token = pages.next(&mut calls, |c| vec![c.ordinal.to_string()]);
            Ok(pb::ListProviderCallsResponse {
                provider_calls: calls
                    .into_iter()
                    .map(|c| wire::provider_call_to_pb(c.call))
                    .collect(),
                next_page_token,
            })
        })
        .await
    }

    type WatchSessionStream = BoxStream<pb::SessionEvent>;

    async fn watch_session(
        &self,
        request: Request<pb::WatchSessionRequest>,
    ) -> Result<Response<Self::WatchSessionStream>, Status> {
        let items = self.open_watch(request).await?;
        Ok(Response::new(Box::pin(
            items.map(|item| item.and_then(|item| item_to_pb(&item))),
        )))
    }

    async fn publish_delta(
        &self,
        request: Request<pb::PublishDeltaRequest>,
    ) -> Result<Response<pb::PublishDeltaResponse>, Status> {
        let tenant = tenant_of(&request);
        let req = request.into_inner();
        unary("PublishDelta", &req.session_id.clone(), async {
            require_session_id("session_id", &req.session_id)?;
            let content = wire::delta_from_pb(req.delta)?;
            validate_delta(&req.run_id, req.index, content.as_ref())?;
            let Some(content) = content else {
                return Err(Error::invalid("text", "a delta needs text or a block"));
            };
            let kind = EphemeralKind::Delta {
                run_id: req.run_id,
                index: req.index,
                merged_from: None,
                content,
            };
            let (revision, cancel_requested) =
                self.publish_delta(&tenant, &req.session_id, kind).await?;
            Ok(pb::PublishDeltaResponse {
                revision,
                cancel_requested,
            })
        })
        .await
    }

    async fn discard_run(
        &self,
        request: Request<pb::DiscardRunRequest>,
    ) -> Result<Response<pb::DiscardRunResponse>, Status> {
        let tenant = tenant_of(&request);
        let req = request.into_inner();
        unary("DiscardRun", &req.session_id.clone(), async {
            require_session_id("session_id", &req.session_id)?;
            require_run_id(&req.run_id)?;
            let session = self.store.resolve(&tenant, &req.session_id).await?;
            let kind = EphemeralKind::RunDiscarded { run_id: req.run_id };
            let revision = self.publish(&session, kind).await?;
            Ok(pb::DiscardRunResponse { revision })
        })
        .await
    }

    async fn begin_run(
        &self,
        request: Request<pb::BeginRunRequest>,
    ) -> Result<Response<pb::BeginRunResponse>, Status> {
        let tenant = tenant_of(&request);
        let req = request.into_inner();
        unary("BeginRun", &req.session_id, async {
            let lease = req
                .lease
                .as_ref()
                .ok_or_else(|| Error::invalid("lease", "is required"))?;
            let control = control::BeginRun {
                run_id: req.run_id.clone(),
                lease_micros: wire::duration_micros(lease),
            };
            let begun = self.control(&tenant, &req.session_id, control).await?;
            Ok(pb::BeginRunResponse {
                revision: begun.revision,
                expire_time: Some(wire::timestamp(begun.expire_time)),
            })
        })
        .await
    }

    async fn cancel_run(
        &self,
        request: Request<pb::CancelRunRequest>,
    ) -> Result<Response<pb::CancelRunResponse>, Status> {
        let tenant = tenant_of(&request);
        let req = request.into_inner();
        unary("CancelRun", &req.session_id, async {
            require_session_id("session_id", &req.session_id)?;
            require_run_id(&req.run_id)?;
            let session = self.store.resolve(&tenant, &req.session_id).await?;
            let control = control::CancelRun {
                publishing: self.hub.run_is_publishing(session.key, &req.run_id),
                run_id: req.run_id.clone(),
                reason: req.reason.clone(),
            };
            let revision = self.control(&tenant, &req.session_id, control).await?;
            Ok(pb::CancelRunResponse { revision })
        })
        .await
    }

    async fn end_run(
        &self,
        request: Request<pb::EndRunRequest>,
    ) -> Result<Response<pb::EndRunResponse>, Status> {
        let tenant = tenant_of(&request);
        let req = request.into_inner();
        unary("EndRun", &req.session_id, async {
            let control = control::EndRun {
                run_id: req.run_id.clone(),
            };
            if req.take_next {
                return self.end_run_taking_next_in(&tenant, &req, control).await;
            }
            let revision = self.control(&tenant, &req.session_id, control).await?;
            Ok(pb::EndRunResponse {
                revision,
                taken_input: None,
            })
        })
        .await
    }

    async fn rollback_session(
        &self,
        request: Request<pb::RollbackSessionRequest>,
    ) -> Result<Response<pb::RollbackSessionResponse>, Status> {
        let tenant = tenant_of(&request);
        let req = request.into_inner();
        unary("RollbackSession", &req.session_id, async {
            let control = control::Rollback {
                after_sequence: req.after_sequence,
                run_id: req.run_id.clone(),
                expected_next_sequence: req.expected_next_sequence,
                return_removed: req.return_removed,
                remove_last: req.remove_last,
                request_id: req.request_id,
            };
            let rolled = self.control(&tenant, &req.session_id, control).await?;
            Ok(pb::RollbackSessionResponse {
                revision: rolled.revision,
                next_sequence: rolled.next_sequence,
                removed_messages: rolled
                    .removed
                    .into_iter()
                    .map(wire::stored_message_to_pb)
                    .collect(),
            })
        })
        .await
    }

    async fn edit_message(
        &self,
        request: Request<pb::EditMessageRequest>,
    ) -> Result<Response<pb::EditMessageResponse>, Status> {
        let tenant = tenant_of(&request);
        let req = request.into_inner();
        let session_id = req.session_id.clone();
        unary("EditMessage", &session_id, async {
            if let Some(message) = &req.message {
                limits::check_message(&self.options.limits, "message", message)?;
            }
            let control = control::Edit {
                message_id: req.message_id,
                message: wire::message_from_pb_field(req.message, "message")?,
                reason: req.reason,
                run_id: req.run_id,
            };
            let edited = self.control(&tenant, &req.session_id, control).await?;
            Ok(pb::EditMessageResponse {
                revision: edited.revision,
                message: Some(wire::stored_message_to_pb(edited.message)),
            })
        })
        .await
    }

    async fn redact_message(
        &self,
        request: Request<pb::RedactMessageRequest>,
    ) -> Result<Response<pb::RedactMessageResponse>, Status> {
        let tenant = tenant_of(&request);
        let req = request.into_inner();
        let session_id = req.session_id.clone();
        unary("RedactMessage", &session_id, async {
            let control = control::Redact {
                message_id: req.message_id,
                reason: req.reason,
                run_id: req.run_id,
            };
            let revision = self.control(&tenant, &req.session_id, control).await?;
            Ok(pb::RedactMessageResponse { revision })
        })
        .await
    }

    async fn fork_session(
        &self,
        request: Request<pb::ForkSessionRequest>,
    ) -> Result<Response<pb::Session>, Status> {
        let tenant = tenant_of(&request);
        let req = request.into_inner();
        let session_id = req.session_id.clone();
        unary("ForkSession", &session_id, async {
            require_session_id("session_id", &req.session_id)?;
            let fork = Fork {
                source_id: req.session_id,
                at_sequence: req.at_sequence,
                new_id: (!req.new_session_id.is_empty()).then_some(req.new_session_id),
            };
            fork.validate()?;
            let (session, _) = self.store.fork_session(&tenant, fork).await?;
            Ok(wire::session_to_pb(session))
        })
        .await
    }

    type ExportTranscriptStream = BoxStream<pb::ExportTranscriptResponse>;

    async fn export_transcript(
        &self,
        request: Request<pb::ExportTranscriptRequest>,
    ) -> Result<Response<Self::ExportTranscriptStream>, Status> {
        let tenant = tenant_of(&request);
        let req = request.into_inner();
        streaming("ExportTranscript", &req.session_id.clone(), async {
            require_session_id("session_id", &req.session_id)?;
            let format = match pb::TranscriptFormat::try_from(req.format) {
                Ok(pb::TranscriptFormat::Markdown) => transcript::Format::Markdown,
                Ok(pb::TranscriptFormat::OpenaiJson) => transcript::Format::OpenAiJson,
                Ok(pb::TranscriptFormat::AnthropicMessages) => {
                    transcript::Format::Body(Body::AnthropicMessages)
                }
                Ok(pb::TranscriptFormat::OpenaiResponses) => {
                    transcript::Format::Body(Body::OpenAiResponses)
                }
                Ok(pb::TranscriptFormat::GeminiContents) => {
                    transcript::Format::Body(Body::GeminiContents)
                }
                Ok(pb::TranscriptFormat::Unspecified) => {
                    return Err(Error::invalid(
                        "format",
                        "is required: a TranscriptFormat such as TRANSCRIPT_FORMAT_MARKDOWN",
                    ));
                }
                Err(_) => {
                    return Err(Error::invalid(
                        "format",
                        format!("{} is not a known transcript format", req.format),
                    ));
                }
            };
            // A provider body without a target follows its own provider's
            // rules.
            let target = match (wire::target_from_pb(req.target)?, format) {
                (None, transcript::Format::Body(body)) => {
                    Some(ExportTarget::provider_default(body.provider()))
                }
                (target, _) => target,
            };
            let handle = self.store.resolve(&tenant, &req.session_id).await?;
            let session = self.store.get_session(&tenant, &req.session_id).await?;
            let share = self.stream_budget.admit()?;
            let session_id = handle.id.clone();
            let messages: Messages = match target {
                None => Box::pin(plain_messages(self.store.clone(), handle, -1, share)),
                Some(target) => Box::pin(
                    targeted::targeted(
                        self.store.clone(),
                        handle,
                        -1,
                        target,
                        0,
                        share,
                        Arc::clone(&self.stream_budget),
                    )
                    .map(move |sent| sent.and_then(|sent| sent.into_stored(&session_id))),
                ),
            };
            Ok(transcript::stream(messages, session, format))
        })
        .await
    }

    async fn set_state(
        &self,
        request: Request<pb::SetStateRequest>,
    ) -> Result<Response<pb::StateEntry>, Status> {
        let tenant = tenant_of(&request);
        let req = request.into_inner();
        let session_id = req.session_id.clone();
        unary("SetState", &session_id, async {
            if !req.scope.is_empty() {
                check_shared_scope(&req.scope, &req.session_id)?;
                check_state_entry("key", &req.key, "value", &req.value)?;
                check_expected_version(req.expected_version)?;
                let write = SharedStateWrite {
                    scope: req.scope,
                    key: req.key,
                    value: req.value,
                    expected_version: req.expected_version,
                };
                let entry = self.store.set_shared_state(&tenant, write).await?;
                return Ok(wire::state_entry_to_pb(entry));
            }
            let control = control::SetState {
                key: req.key,
                value: req.value,
                expected_version: req.expected_version,
            };
            let entry = self.control(&tenant, &req.session_id, control).await?;
            Ok(wire::state_entry_to_pb(entry))
        })
        .await
    }

    async fn get_state(
        &self,
        request: Request<pb::GetStateRequest>,
    ) -> Result<Response<pb::StateEntry>, Status> {
        let tenant = tenant_of(&request);
        let req = request.into_inner();
        unary("GetState", &req.session_id, async {
            if !req.scope.is_empty() {
                check_shared_scope(&req.scope, &req.session_id)?;
                check_state_key(&req.key)?;
                let entry = self
                    .store
                    .get_shared_state(&tenant, &req.scope, &req.key)
                    .await?;
                return Ok(wire::state_entry_to_pb(entry));
            }
            require_session_id("session_id", &req.session_id)?;
            check_state_key(&req.key)?;
            let session = self.store.resolve(&tenant, &req.session_id).await?;
            let entry = self.store.get_state(&session, &req.key).await?;
            Ok(wire::state_entry_to_pb(entry))
        })
        .await
    }

    async fn list_state(
        &self,
        request: Request<pb::ListStateRequest>,
    ) -> Result<Response<pb::ListStateResponse>, Status> {
        let tenant = tenant_of(&request);
        let req = request.into_inner();
        unary("ListState", &req.session_id, async {
            if req.scope.is_empty() {
                require_session_id("session_id", &req.session_id)?;
            } else {
                check_shared_scope(&req.scope, &req.session_id)?;
            }
            let pages = Pages::new(
                "state",
                vec![&req.session_id, &req.scope],
                "was made for a different session or scope",
                req.page_size,
                self.options.limits.max_page_size,
            )?;
            let after = pages.after(&req.page_token)?;
            let mut entries = if req.scope.is_empty() {
                let session = self.store.resolve(&tenant, &req.session_id).await?;
                self.store
                    .list_state(&session, after.as_deref(), pages.fetch())
                    .await?
            } else {
                self.store
                    .list_shared_state(&tenant, &req.scope, after.as_deref(), pages.fetch())
                    .await?
            };
            let next_page_token = pages.next(&mut entries, |last| vec![last.key.clone()]);
            Ok(pb::ListStateResponse {
                entries: entries.into_iter().map(wire::state_entry_to_pb).collect(),
                next_page_token,
            })
        })
        .await
    }

    async fn delete_state(
        &self,
        request: Request<pb::DeleteStateRequest>,
    ) -> Result<Response<pb::DeleteStateResponse>, Status> {
        let tenant = tenant_of(&request);
        let req = request.into_inner();
        let session_id = req.session_id.clone();
        unary("DeleteState", &session_id, async {
            if !req.scope.is_empty() {
                check_shared_scope(&req.scope, &req.session_id)?;
                check_state_key(&req.key)?;
                check_expected_version(req.expected_version)?;
                let write = SharedStateWrite {
                    scope: req.scope,
                    key: req.key,
                    value: String::new(),
                    expected_version: req.expected_version,
                };
                self.store.delete_shared_state(&tenant, write).await?;
                return Ok(pb::DeleteStateResponse { revision: 0 });
            }
            let control = control::DeleteState {
                key: req.key,
                expected_version: req.expected_version,
            };
            let revision = self.control(&tenant, &req.session_id, control).await?;
            Ok(pb::DeleteStateResponse { revision })
        })
        .await
    }

    async fn summarize_usage(
        &self,
        request: Request<pb::SummarizeUsageRequest>,
    ) -> Result<Response<pb::SummarizeUsageResponse>, Status> {
        let tenant = tenant_of(&request);
        let req = request.into_inner();
        unary("SummarizeUsage", &req.session_id.clone(), async {
            let group = wire::usage_group_from_pb(req.group_by)?;
            let (start, end) =
                wire::time_range_from_pb(req.start_time.as_ref(), req.end_time.as_ref())?;
            let session_key = if req.session_id.is_empty() {
                None
            } else {
                Some(self.store.resolve(&tenant, &req.session_id).await?.key)
            };
            // A token names the filters it was made for, and the last key.
            let filters = [
                req.group_by.to_string(),
                req.user.clone(),
                req.session_id.clone(),
                start.map(|t| t.to_string()).unwrap_or_default(),
                end.map(|t| t.to_string()).unwrap_or_default(),
            ];
            let pages = Pages::new(
                "usage",
                filters.iter().map(String::as_str).collect(),
                "was made for different filters or grouping",
                req.page_size,
                self.options.limits.max_page_size,
            )?;
            let after = pages.after(&req.page_token)?;
            let query = UsageQuery {
                user: (!req.user.is_empty()).then(|| req.user.clone()),
                session_key,
                start: start.map(Timestamp),
                end: end.map(Timestamp),
                group,
                after,
                limit: pages.fetch(),
            };
            let mut rows = self.store.summarize_usage(&tenant, query).await?;
            // One total row: never a next page.
            let next_page_token = pages.next(&mut rows, |last| vec![last.key.clone()]);
            Ok(pb::SummarizeUsageResponse {
                rows: rows.into_iter().map(wire::usage_row_to_pb).collect(),
                next_page_token,
            })
        })
        .await
    }

    async fn erase_user(
        &self,
        request: Request<pb::EraseUserRequest>,
    ) -> Result<Response<pb::EraseUserResponse>, Status> {
        let tenant = tenant_of(&request);
        let req = request.into_inner();
        unary("EraseUser", "", async {
            let erasure = Erasure::new(req.user, req.scopes)?;
            let erased = self.store.erase_user(&tenant, erasure).await?;
            Ok(pb::EraseUserResponse {
                sessions_deleted: erased.sessions,
                messages_deleted: erased.messages,
                provider_calls_deleted: erased.provider_calls,
            })
        })
        .await
    }

    async fn search_messages(
        &self,
        request: Request<pb::SearchMessagesRequest>,
    ) -> Result<Response<pb::SearchMessagesResponse>, Status> {
        let tenant = tenant_of(&request);
        let req = request.into_inner();
        unary("SearchMessages", "", async {
            let words = crate::domain::search::search_words(&req.query)?;
            let pages = Pages::new(
                "search",
                vec![&req.query, &req.user],
                "was made for a different query or user",
                req.page_size,
                self.options.limits.max_page_size,
            )?;
            let offset = pages.after_offset(&req.page_token)?;
            let query = SearchQuery {
                words,
                user: (!req.user.is_empty()).then(|| req.user.clone()),
                offset,
                limit: pages.fetch(),
            };
            let mut hits = self.store.search(&tenant, query).await?;
            let next_offset = offset + pages.limit;
            let next_page_token = pages.next(&mut hits, |_| vec![next_offset.to_string()]);
            Ok(pb::SearchMessagesResponse {
                hits: hits.into_iter().map(wire::search_hit_to_pb).collect(),
                next_page_token,
            })
        })
        .await
    }
}

/// A session's messages, a page at a time, for [`ReadAhead`].
fn message_pages<S: Store>(
    store: S,
    session: crate::store::SessionHandle,
) -> ReadPage<StoredMessage> {
    Arc::new(move |after, bound| {
        let (store, session) = (store.clone(), session.clone());
        Box::pin(async move { store.read_messages_bounded(&session, after, bound).await })
    })
}

fn sequence_of(stored: &StoredMessage) -> i64 {
    stored.sequence
}

/// The stored messages after `after`, up to the session's length when the
/// export began, read ahead within the stream's byte bounds
/// (`read_ahead`). A stream dropped midway leaves at most its reads in
/// flight to finish.
fn plain_messages<S: Store>(
    store: S,
    session: crate::store::SessionHandle,
    after: i64,
    share: Share,
) -> impl Stream<Item = Result<StoredMessage>> + Send + 'static {
    async_stream::try_stream! {
        let end = session.next_sequence;
        let mut messages = ReadAhead::ranges(message_pages(store, session), sequence_of, share, after, end);
        while let Some(stored) = messages.next().await? {
            yield stored;
        }
    }
}

/// The messages after `after`, each as its stored encoding, up to the
/// session's length when the export began, read ahead as
/// [`plain_messages`] reads them.
fn encoded_messages<S: Store>(
    store: S,
    session: crate::store::SessionHandle,
    after: i64,
    share: Share,
) -> impl Stream<Item = Result<bytes::Bytes>> + Send + 'static {
    async_stream::try_stream! {
        let end = session.next_sequence;
        let read: ReadPage<EncodedMessage> = Arc::new(move |after, bound| {
            let (store, session) = (store.clone(), session.clone());
            Box::pin(async move {
                store.read_message_rows_bounded(&session, after, bound).await?.try_map(MessageRow::into_encoded)
            })
        });
        let mut messages = ReadAhead::ranges(read, |message: &EncodedMessage| message.sequence, share, after, end);
        while let Some(message) = messages.next().await? {
            yield message.encoding;
        }
    }
}
