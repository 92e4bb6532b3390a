//! The approvals' handlers: RequestApproval, DecideApproval, GetApproval,
//! ListApprovals. Each checks and converts its request (through
//! [`crate::wire`]) and calls one store operation.

use sessionstore_client::v1 as pb;

use super::SessionStoreService;
use crate::domain::approvals::{ApprovalQuery, require_approval_id};
use crate::domain::fields::require_session_id;
use crate::domain::paging::Pages;
use crate::domain::{Result, Timestamp};
use crate::store::Store;
use crate::wire;

impl<S: Store> SessionStoreService<S> {
    pub(super) async fn request_approval_in(
        &self,
        tenant: &str,
        req: pb::RequestApprovalRequest,
    ) -> Result<pb::RequestApprovalResponse> {
        require_session_id("session_id", &req.session_id)?;
        let session_id = req.session_id.clone();
        let request = wire::request_approval_from_pb(req)?;
        request.validate(Timestamp::now())?;
        let (approval, revision) = self
            .store
            .request_approval(tenant, &session_id, request)
            .await?;
        Ok(pb::RequestApprovalResponse {
            approval: Some(wire::approval_to_pb(approval)),
            revision,
        })
    }

    pub(super) async fn decide_approval_in(
        &self,
        tenant: &str,
        req: pb::DecideApprovalRequest,
    ) -> Result<pb::DecideApprovalResponse> {
        require_session_id("session_id", &req.session_id)?;
        let session_id = req.session_id.clone();
        let decision = wire::decide_approval_from_pb(req)?;
        decision.validate()?;
        let decided = self
            .store
            .decide_approval(tenant, &session_id, decision)
            .await?;
        Ok(pb::DecideApprovalResponse {
            approval: Some(wire::approval_to_pb(decided.approval)),
            revision: decided.revision,
            tool_result: decided.tool_result.map(wire::stored_message_to_pb),
        })
    }

    pub(super) async fn get_approval_in(
        &self,
        tenant: &str,
        req: pb::GetApprovalRequest,
    ) -> Result<pb::Approval> {
        require_session_id("session_id", &req.session_id)?;
        require_approval_id(&req.approval_id)?;
        let approval = self
            .store
            .get_approval(tenant, &req.session_id, &req.approval_id)
            .await?;
        Ok(wire::approval_to_pb(approval))
    }

    pub(super) async fn list_approvals_in(
        &self,
        tenant: &str,
        req: pb::ListApprovalsRequest,
    ) -> Result<pb::ListApprovalsResponse> {
        let state = wire::approval_state_filter_from_pb(req.state)?;
        let state_filter = req.state.to_string();
        let pages = Pages::new(
            "approvals",
            vec![&req.session_id, &req.user, &state_filter],
            "was made for a different session, user or state",
            req.page_size,
            self.options.limits.max_page_size,
        )?;
        let query = ApprovalQuery {
            session_id: (!req.session_id.is_empty()).then(|| req.session_id.clone()),
            user: (!req.user.is_empty()).then(|| req.user.clone()),
            state,
            after: pages
                .after_time_and_id(&req.page_token)?
                .map(|(time, id)| (Timestamp(time), id)),
            limit: pages.fetch(),
        };
        let mut approvals = self.store.list_approvals(tenant, query).await?;
        let next_page_token = pages.next(&mut approvals, |last| {
            vec![last.create_time.0.to_string(), last.approval_id.clone()]
        });
        Ok(pb::ListApprovalsResponse {
            approvals: approvals.into_iter().map(wire::approval_to_pb).collect(),
            next_page_token,
        })
    }
}
