//! Queued input: what a user types while a run holds the session (or
//! earlier input still waits), kept with the session until the run holding
//! the lease takes it into the history, each input once, in order.

use std::collections::VecDeque;

use crate::client::{BoxStream, Client};
use crate::error::Result;
use crate::requests::NewInput;
use crate::v1;

impl Client {
    /// Submits input to a session (`SubmitInput`). A session is busy while
    /// a run holds its lease or its queue holds a waiting input. Not busy,
    /// the messages are appended at once, in every mode (`queued` false,
    /// the stored `messages` in the response). Busy,
    /// [`Queue`](v1::InputMode::Queue) puts the input at the back of the
    /// session's queue (`queued` true, the `input` with its `inp_…` id and
    /// its `position`; watchers get `input_queued`),
    /// [`Interrupt`](v1::InputMode::Interrupt) does the same and asks the
    /// run holding the lease to stop as [`cancel_run`](Self::cancel_run)
    /// would, and [`Reject`](v1::InputMode::Reject) fails
    /// [`Error::SessionBusy`](crate::Error::SessionBusy). Queued input is
    /// in no read of the history until taken.
    ///
    /// Retry-safe: the input carries its idempotency key (see
    /// [`NewInput`]), the same on every attempt, so it is retried on
    /// transient failures as appends are, and a retry of a submission that
    /// was recorded answers that submission (also after the input was
    /// taken or withdrawn). The same key with other messages or another
    /// mode fails [`Error::RequestIdReused`](crate::Error::RequestIdReused).
    /// A queue holding 100 waiting inputs fails
    /// [`Error::QueueFull`](crate::Error::QueueFull).
    ///
    /// ```no_run
    /// use sessionstore_client::{Client, Error, NewInput};
    /// use sessionstore_client::v1::{InputMode, Message};
    ///
    /// # async fn demo(client: Client) -> Result<(), Error> {
    /// let input = NewInput::new("ses_1")
    ///     .message(Message::user("Stop, use the other file"))
    ///     .mode(InputMode::Interrupt);
    /// let submitted = client.submit_input(&input).await?;
    /// match submitted.input {
    ///     Some(queued) if submitted.queued => {
    ///         println!("queued {} at position {}", queued.input_id, queued.position);
    ///     }
    ///     _ => println!("appended at revision {}", submitted.revision),
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn submit_input(&self, input: &NewInput) -> Result<v1::SubmitInputResponse> {
        let request = input.as_request().clone();
        let keyed = !request.request_id.is_empty();
        self.unary(
            "SubmitInput",
            request,
            keyed,
            |mut raw, request| async move { raw.submit_input(request).await },
        )
        .await
    }

    /// Takes the session's oldest waiting input into the history
    /// (`TakeQueuedInput`), for `run_id`, which must hold the session's
    /// lease ([`Error::LeaseNotHeld`](crate::Error::LeaseNotHeld)
    /// otherwise): its messages are appended, contiguous and in order, in
    /// one revision that watchers see as `input_taken`. Fails
    /// [`Error::QueueEmpty`](crate::Error::QueueEmpty) when no input waits.
    /// Each input is taken once, across clients and replicas.
    ///
    /// Not retried: a repeat of a take that reached the server would take
    /// the next input. [`Run::take_queued_input`](crate::Run::take_queued_input)
    /// is the same for a run's producer.
    ///
    /// ```no_run
    /// use sessionstore_client::{Client, Error};
    ///
    /// # async fn demo(client: Client) -> Result<(), Error> {
    /// match client.take_queued_input("ses_1", "run_42").await {
    ///     Ok(taken) => println!("{} messages more to answer", taken.messages.len()),
    ///     Err(Error::QueueEmpty { .. }) => println!("nothing waits"),
    ///     Err(other) => return Err(other),
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn take_queued_input(
        &self,
        session_id: impl Into<String>,
        run_id: impl Into<String>,
    ) -> Result<v1::TakeQueuedInputResponse> {
        let request = v1::TakeQueuedInputRequest {
            session_id: session_id.into(),
            run_id: run_id.into(),
        };
        self.unary(
            "TakeQueuedInput",
            request,
            false,
            |mut raw, request| async move { raw.take_queued_input(request).await },
        )
        .await
    }

    /// The inputs waiting in the session's queue, by position (the oldest,
    /// which is taken next, first), fetching page after page as the stream
    /// is read. Each page is retried on transient failures; a permanent
    /// error is the stream's last item.
    ///
    /// ```no_run
    /// use futures_util::TryStreamExt as _;
    ///
    /// # async fn demo(client: sessionstore_client::Client) -> Result<(), sessionstore_client::Error> {
    /// let waiting: Vec<_> = client.list_queued_inputs("ses_1").try_collect().await?;
    /// for input in waiting {
    ///     println!("{} at position {}", input.input_id, input.position);
    /// }
    /// # Ok(()) }
    /// ```
    pub fn list_queued_inputs(&self, session_id: impl Into<String>) -> BoxStream<v1::QueuedInput> {
        struct State {
            client: Client,
            request: v1::ListQueuedInputsRequest,
            buffer: VecDeque<v1::QueuedInput>,
            done: bool,
        }
        let state = State {
            client: self.clone(),
            request: v1::ListQueuedInputsRequest {
                session_id: session_id.into(),
                page_size: 0,
                page_token: String::new(),
            },
            buffer: VecDeque::new(),
            done: false,
        };
        let stream = futures_util::stream::unfold(state, |mut state| async move {
            loop {
                if let Some(input) = state.buffer.pop_front() {
                    return Some((Ok(input), state));
                }
                if state.done {
                    return None;
                }
                let page = state
                    .client
                    .unary(
                        "ListQueuedInputs",
                        state.request.clone(),
                        true,
                        |mut raw, request| async move { raw.list_queued_inputs(request).await },
                    )
                    .await;
                match page {
                    Ok(page) => {
                        state.buffer.extend(page.inputs);
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

    /// Takes a waiting input back (`WithdrawQueuedInput`): it is never
    /// taken into the history, and watchers get `input_withdrawn`. Answers
    /// the withdrawal's revision — the first one's, for an input withdrawn
    /// before (nothing is written again), so it is retried on transient
    /// failures. An input already taken fails
    /// [`Error::InputAlreadyTaken`](crate::Error::InputAlreadyTaken); an id
    /// the session never queued,
    /// [`Error::InputNotFound`](crate::Error::InputNotFound).
    ///
    /// ```no_run
    /// use sessionstore_client::{Client, Error};
    ///
    /// # async fn demo(client: Client) -> Result<(), Error> {
    /// match client.withdraw_queued_input("ses_1", "inp_1").await {
    ///     Ok(revision) => println!("withdrawn at revision {revision}"),
    ///     Err(Error::InputAlreadyTaken { .. }) => println!("too late: the run has it"),
    ///     Err(other) => return Err(other),
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn withdraw_queued_input(
        &self,
        session_id: impl Into<String>,
        input_id: impl Into<String>,
    ) -> Result<i64> {
        let request = v1::WithdrawQueuedInputRequest {
            session_id: session_id.into(),
            input_id: input_id.into(),
        };
        let response = self
            .unary(
                "WithdrawQueuedInput",
                request,
                true,
                |mut raw, request| async move { raw.withdraw_queued_input(request).await },
            )
            .await?;
        Ok(response.revision)
    }
}
