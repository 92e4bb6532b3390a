//! Tool approvals: a decision asked for before a tool call of the history
//! runs, decided once whichever client or replica decides it.

use std::collections::VecDeque;

use crate::client::{BoxStream, Client};
use crate::error::Result;
use crate::requests::{ListApprovals, new_request_id};
use crate::v1;

impl Client {
    /// Asks for a decision on a tool call of the session's current history
    /// (`RequestApproval`): a pending approval, recorded in one revision
    /// that watchers see as `approval_requested`. Answers the approval
    /// (with its server-made `apr_…` id) and the revision.
    ///
    /// Fails [`Error::UnknownToolCall`](crate::Error::UnknownToolCall) if no
    /// message of the history makes the call,
    /// [`Error::ToolCallAnswered`](crate::Error::ToolCallAnswered) if one
    /// already answers it, and
    /// [`Error::ApprovalExists`](crate::Error::ApprovalExists) (naming it)
    /// while the call has a pending or approved approval. Not retried: a
    /// repeat of a request that reached the server would fail
    /// `ApprovalExists`.
    ///
    /// ```no_run
    /// use std::time::{Duration, SystemTime};
    /// use sessionstore_client::{Client, Error, NewApproval};
    ///
    /// # async fn demo(client: Client) -> Result<(), Error> {
    /// let asked = client
    ///     .request_approval(
    ///         NewApproval::new("ses_1", "call_rm")
    ///             .title("Delete /tmp/build?")
    ///             .detail_json(r#"{"path": "/tmp/build", "recursive": true}"#)
    ///             .expire_time(SystemTime::now() + Duration::from_secs(900)),
    ///     )
    ///     .await;
    /// let approval_id = match asked {
    ///     Ok(asked) => asked.approval.unwrap_or_default().approval_id,
    ///     // Someone asked already: wait for that decision instead.
    ///     Err(Error::ApprovalExists { approval_id, .. }) => approval_id,
    ///     Err(other) => return Err(other),
    /// };
    /// println!("waiting for {approval_id}");
    /// # Ok(()) }
    /// ```
    pub async fn request_approval(
        &self,
        approval: impl Into<v1::RequestApprovalRequest>,
    ) -> Result<v1::RequestApprovalResponse> {
        self.unary(
            "RequestApproval",
            approval.into(),
            false,
            |mut raw, request| async move { raw.request_approval(request).await },
        )
        .await
    }

    /// Approves or denies a pending approval (`DecideApproval`), exactly
    /// once across clients and replicas, whatever run holds the session's
    /// lease: one revision, `approval_decided` for watchers. A denial also
    /// appends the call's tool result (a tool error whose content is
    /// `reason`) in that revision; it is in the response's `tool_result`.
    /// `decided_by` is free-form (who decided, for the record).
    ///
    /// Retry-safe: the call carries a fresh idempotency key (a UUIDv7, as
    /// an [`Exchange`](crate::Exchange)'s), the same on every attempt, so
    /// it is retried on transient failures as appends are, and a retry of
    /// a decision that was recorded answers that decision. Any other call
    /// on a decided approval fails
    /// [`Error::ApprovalAlreadyDecided`](crate::Error::ApprovalAlreadyDecided)
    /// (with its state and decider), and one on an expired approval
    /// [`Error::ApprovalExpired`](crate::Error::ApprovalExpired).
    ///
    /// ```no_run
    /// use sessionstore_client::{Client, Error};
    /// use sessionstore_client::v1::ApprovalDecision;
    ///
    /// # async fn demo(client: Client) -> Result<(), Error> {
    /// match client
    ///     .decide_approval("ses_1", "apr_1", ApprovalDecision::Deny, "not on prod", "alice")
    ///     .await
    /// {
    ///     Ok(decided) => println!("recorded at revision {}", decided.revision),
    ///     Err(Error::ApprovalAlreadyDecided { state, decided_by, .. }) => {
    ///         println!("{decided_by} got there first: {}", state.as_str_name());
    ///     }
    ///     Err(other) => return Err(other),
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn decide_approval(
        &self,
        session_id: impl Into<String>,
        approval_id: impl Into<String>,
        decision: v1::ApprovalDecision,
        reason: impl Into<String>,
        decided_by: impl Into<String>,
    ) -> Result<v1::DecideApprovalResponse> {
        self.decide_approval_with(v1::DecideApprovalRequest {
            session_id: session_id.into(),
            approval_id: approval_id.into(),
            decision: decision.into(),
            reason: reason.into(),
            decided_by: decided_by.into(),
            request_id: String::new(),
        })
        .await
    }

    /// [`decide_approval`](Self::decide_approval) with the wire request,
    /// e.g. to keep your own `request_id` (derived from your own request,
    /// so that a retry after a restart of your process answers the first
    /// decision too). A request without one gets a fresh one; either way
    /// it is retried on transient failures.
    pub async fn decide_approval_with(
        &self,
        mut request: v1::DecideApprovalRequest,
    ) -> Result<v1::DecideApprovalResponse> {
        if request.request_id.is_empty() {
            request.request_id = new_request_id();
        }
        self.unary(
            "DecideApproval",
            request,
            true,
            |mut raw, request| async move { raw.decide_approval(request).await },
        )
        .await
    }

    /// One approval of the session
    /// ([`Error::ApprovalNotFound`](crate::Error::ApprovalNotFound) if the
    /// session has none by that id). An approval whose `expire_time` has
    /// passed reads as expired. Retried on transient failures.
    ///
    /// ```no_run
    /// use sessionstore_client::v1::ApprovalState;
    ///
    /// # async fn demo(client: sessionstore_client::Client) -> Result<(), sessionstore_client::Error> {
    /// let approval = client.get_approval("ses_1", "apr_1").await?;
    /// if approval.state() == ApprovalState::Approved {
    ///     println!("run tool call {}", approval.tool_call_id);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn get_approval(
        &self,
        session_id: impl Into<String>,
        approval_id: impl Into<String>,
    ) -> Result<v1::Approval> {
        let request = v1::GetApprovalRequest {
            session_id: session_id.into(),
            approval_id: approval_id.into(),
        };
        self.unary(
            "GetApproval",
            request,
            true,
            |mut raw, request| async move { raw.get_approval(request).await },
        )
        .await
    }

    /// Every matching approval of the caller's tenant, oldest first
    /// (creation time, then id), fetching page after page as the stream is
    /// read. Each page is retried on transient failures; a permanent error
    /// is the stream's last item.
    ///
    /// ```no_run
    /// use futures_util::TryStreamExt as _;
    /// use sessionstore_client::{Client, ListApprovals};
    /// use sessionstore_client::v1::ApprovalState;
    ///
    /// # async fn demo(client: Client) -> Result<(), sessionstore_client::Error> {
    /// let pending: Vec<_> = client
    ///     .list_approvals(ListApprovals::new().user("alice").state(ApprovalState::Pending))
    ///     .try_collect()
    ///     .await?;
    /// for approval in pending {
    ///     println!("{} in {}: {}", approval.approval_id, approval.session_id, approval.title);
    /// }
    /// # Ok(()) }
    /// ```
    pub fn list_approvals(&self, query: ListApprovals) -> BoxStream<v1::Approval> {
        struct State {
            client: Client,
            request: v1::ListApprovalsRequest,
            buffer: VecDeque<v1::Approval>,
            done: bool,
        }
        let state = State {
            client: self.clone(),
            request: query.into_request(),
            buffer: VecDeque::new(),
            done: false,
        };
        let stream = futures_util::stream::unfold(state, |mut state| async move {
            loop {
                if let Some(approval) = state.buffer.pop_front() {
                    return Some((Ok(approval), state));
                }
                if state.done {
                    return None;
                }
                let page = state
                    .client
                    .unary(
                        "ListApprovals",
                        state.request.clone(),
                        true,
                        |mut raw, request| async move { raw.list_approvals(request).await },
                    )
                    .await;
                match page {
                    Ok(page) => {
                        state.buffer.extend(page.approvals);
                        if page.next_page_token.is_empty() {
                            state.done = true;
                        } else {
                            state.request.page_token = page.next_page_token;
                        }
                    }
                    Err(error) => {
                        state.done = true;
                        return Some((Err(error), state));
                    }
                }
            }
        });
        Box::pin(stream)
    }
}
