//! The queued-input handlers: SubmitInput, TakeQueuedInput,
//! ListQueuedInputs, WithdrawQueuedInput, and EndRun's `take_next`. Each
//! checks and converts its request (through [`crate::wire`]) and calls one
//! store operation.

use sessionstore_client::v1 as pb;

use super::{SessionStoreService, limits};
use crate::domain::ControlOp as _;
use crate::domain::Result;
use crate::domain::control::EndRun;
use crate::domain::fields::require_session_id;
use crate::domain::paging::Pages;
use crate::domain::queue::require_input_id;
use crate::store::Store;
use crate::wire;

impl<S: Store> SessionStoreService<S> {
    pub(super) async fn submit_input_in(
        &self,
        tenant: &str,
        req: pb::SubmitInputRequest,
    ) -> Result<pb::SubmitInputResponse> {
        require_session_id("session_id", &req.session_id)?;
        for (i, message) in req.messages.iter().enumerate() {
            limits::check_message(&self.options.limits, &format!("messages[{i}]"), message)?;
        }
        let session_id = req.session_id.clone();
        let input = wire::submit_input_from_pb(req)?;
        input.validate()?;
        let submitted = self.store.submit_input(tenant, &session_id, input).await?;
        Ok(pb::SubmitInputResponse {
            queued: submitted.queued,
            input: submitted.input.map(wire::queued_input_to_pb),
            messages: submitted
                .messages
                .into_iter()
                .map(wire::stored_message_to_pb)
                .collect(),
            revision: submitted.revision,
        })
    }

    pub(super) async fn take_queued_input_in(
        &self,
        tenant: &str,
        req: pb::TakeQueuedInputRequest,
    ) -> Result<pb::TakeQueuedInputResponse> {
        require_session_id("session_id", &req.session_id)?;
        EndRun {
            run_id: req.run_id.clone(),
        }
        .validate()?;
        let taken = self
            .store
            .take_queued_input(tenant, &req.session_id, &req.run_id)
            .await?;
        Ok(pb::TakeQueuedInputResponse {
            input: Some(wire::queued_input_to_pb(taken.input)),
            messages: taken
                .messages
                .into_iter()
                .map(wire::stored_message_to_pb)
                .collect(),
            revision: taken.revision,
            next_sequence: taken.next_sequence,
        })
    }

    pub(super) async fn end_run_taking_next_in(
        &self,
        tenant: &str,
        req: &pb::EndRunRequest,
        control: EndRun,
    ) -> Result<pb::EndRunResponse> {
        require_session_id("session_id", &req.session_id)?;
        control.validate()?;
        let (revision, taken) = self
            .store
            .end_run_taking_next(tenant, &req.session_id, &control.run_id)
            .await?;
        Ok(pb::EndRunResponse {
            revision,
            taken_input: taken.map(wire::queued_input_to_pb),
        })
    }

    pub(super) async fn list_queued_inputs_in(
        &self,
        tenant: &str,
        req: pb::ListQueuedInputsRequest,
    ) -> Result<pb::ListQueuedInputsResponse> {
        require_session_id("session_id", &req.session_id)?;
        let pages = Pages::of_session(
            "queued_inputs",
            &req.session_id,
            req.page_size,
            self.options.limits.max_page_size,
        )?;
        let after = pages.after_int(&req.page_token)?.unwrap_or(0);
        let mut inputs = self
            .store
            .list_queued_inputs(tenant, &req.session_id, after, pages.fetch())
            .await?;
        let next_page_token = pages.next(&mut inputs, |last| vec![last.position.to_string()]);
        Ok(pb::ListQueuedInputsResponse {
            inputs: inputs.into_iter().map(wire::queued_input_to_pb).collect(),
            next_page_token,
        })
    }

    pub(super) async fn withdraw_queued_input_in(
        &self,
        tenant: &str,
        req: pb::WithdrawQueuedInputRequest,
    ) -> Result<pb::WithdrawQueuedInputResponse> {
        require_session_id("session_id", &req.session_id)?;
        require_input_id(&req.input_id)?;
        let revision = self
            .store
            .withdraw_queued_input(tenant, &req.session_id, &req.input_id)
            .await?;
        Ok(pb::WithdrawQueuedInputResponse { revision })
    }
}
