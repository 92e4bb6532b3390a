//! Producing a run's live output: [`Run`].

use std::time::Duration;

use crate::client::Client;
use crate::error::{Error, Result};
use crate::requests::Exchange;
use crate::v1;

/// One run of a model on a session, as its producer sees it: publish the
/// output as it streams, learn when someone pressed Stop (from any client,
/// on any replica), then store the answer — whole, or the partial one
/// marked [`incomplete`](v1::Message::incomplete) — and end the run.
///
/// ```no_run
/// use sessionstore_client::{Client, Exchange};
/// use sessionstore_client::v1::{Message, ProviderCall};
///
/// # async fn demo(client: Client, tokens: Vec<String>) -> Result<(), sessionstore_client::Error> {
/// let mut run = client.begin_run("ses_1", "run_42", std::time::Duration::from_secs(60)).await?;
/// for token in tokens {
///     if run.publish_text(token).await? {
///         break; // CancelRun: stop generating
///     }
/// }
/// let exchange = Exchange::new("ses_1")
///     .message(Message::user("Tell me a story"))
///     .provider_call(ProviderCall::new("openai", "gpt-4o").with_tokens(12, 80));
/// let stored = if run.cancel_requested() {
///     run.finish_incomplete(exchange).await? // the partial text, marked incomplete
/// } else {
///     let answer = Message::assistant(run.partial_text());
///     run.finish(exchange.response(answer)).await?
/// };
/// println!("stored at revision {}", stored.revision);
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Run {
    client: Client,
    session_id: String,
    run_id: String,
    next_index: i64,
    text: String,
    cancel_requested: bool,
    leased: bool,
}

impl Client {
    /// A run that publishes deltas without taking the session's lease
    /// (other writers are not held off). It is active from its first
    /// delta.
    pub fn run(&self, session_id: impl Into<String>, run_id: impl Into<String>) -> Run {
        Run {
            client: self.clone(),
            session_id: session_id.into(),
            run_id: run_id.into(),
            next_index: 0,
            text: String::new(),
            cancel_requested: false,
            leased: false,
        }
    }

    /// A run holding the session's lease for `lease` (`BeginRun`): other
    /// runs' writes are refused until it ends; renew it with
    /// [`Run::renew`]. [`Run::finish`] and [`Run::discard`] end it.
    pub async fn begin_run(
        &self,
        session_id: impl Into<String>,
        run_id: impl Into<String>,
        lease: Duration,
    ) -> Result<Run> {
        let mut run = self.run(session_id, run_id);
        run.renew(lease).await?;
        run.leased = true;
        Ok(run)
    }

    /// Asks a run to stop (`CancelRun`), from any client: its producer's
    /// next delta answers `cancel_requested`, and watchers get
    /// `run_cancel_requested`. Answers the cancel's revision — the first
    /// cancel's, for a run cancelled before. A run that is not active is
    /// [`Error::RunNotActive`](crate::Error::RunNotActive). Retried (a
    /// repeat writes nothing).
    pub async fn cancel_run(
        &self,
        session_id: impl Into<String>,
        run_id: impl Into<String>,
        reason: impl Into<String>,
    ) -> Result<i64> {
        let request = v1::CancelRunRequest {
            session_id: session_id.into(),
            run_id: run_id.into(),
            reason: reason.into(),
        };
        let response = self
            .unary("CancelRun", request, true, |mut raw, request| async move {
                raw.cancel_run(request).await
            })
            .await?;
        Ok(response.revision)
    }
}

impl Run {
    /// The run's id.
    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    /// The session it runs on.
    pub fn session_id(&self) -> &str {
        &self.session_id
    }

    /// The text published so far, concatenated.
    pub fn partial_text(&self) -> &str {
        &self.text
    }

    /// Whether `CancelRun` asked this run to stop (seen on a publish).
    pub fn cancel_requested(&self) -> bool {
        self.cancel_requested
    }

    /// Publishes the next piece of text; answers whether the run was asked
    /// to stop. Retried: a repeated index is delivered once.
    pub async fn publish_text(&mut self, text: impl Into<String>) -> Result<bool> {
        let text = text.into();
        self.publish(v1::publish_delta_request::Delta::Text(text.clone()))
            .await?;
        self.text.push_str(&text);
        Ok(self.cancel_requested)
    }

    /// Publishes a content block (a tool call forming, a thinking block…);
    /// answers whether the run was asked to stop.
    pub async fn publish_block(&mut self, block: v1::ContentBlock) -> Result<bool> {
        self.publish(v1::publish_delta_request::Delta::Block(block))
            .await?;
        Ok(self.cancel_requested)
    }

    async fn publish(&mut self, delta: v1::publish_delta_request::Delta) -> Result<()> {
        let request = v1::PublishDeltaRequest {
            session_id: self.session_id.clone(),
            run_id: self.run_id.clone(),
            index: self.next_index,
            delta: Some(delta),
        };
        let response = self
            .client
            .unary(
                "PublishDelta",
                request,
                true,
                |mut raw, request| async move { raw.publish_delta(request).await },
            )
            .await?;
        self.next_index += 1;
        self.cancel_requested |= response.cancel_requested;
        Ok(())
    }

    /// Takes or renews the session's lease for `lease` from now.
    pub async fn renew(&mut self, lease: Duration) -> Result<()> {
        let request = v1::BeginRunRequest {
            session_id: self.session_id.clone(),
            run_id: self.run_id.clone(),
            lease: Some(prost_types::Duration {
                seconds: i64::try_from(lease.as_secs()).unwrap_or(i64::MAX),
                nanos: i32::try_from(lease.subsec_nanos()).unwrap_or(0),
            }),
        };
        self.client
            .unary("BeginRun", request, true, |mut raw, request| async move {
                raw.begin_run(request).await
            })
            .await?;
        self.leased = true;
        Ok(())
    }

    /// Stores the run's exchange (its `run_id` set here; watchers drop
    /// the partial output when it arrives) and ends the run.
    pub async fn finish(self, exchange: Exchange) -> Result<v1::AppendExchangeResponse> {
        let stored = self
            .client
            .append_exchange(&exchange.run_id(self.run_id.clone()))
            .await?;
        self.end().await?;
        Ok(stored)
    }

    /// Stores what was published so far as the assistant's answer, marked
    /// [`incomplete`](v1::Message::incomplete), after the exchange's own
    /// responses (e.g. a finished tool call), and ends the run: what a
    /// producer does when it was asked to stop.
    pub async fn finish_incomplete(self, exchange: Exchange) -> Result<v1::AppendExchangeResponse> {
        let mut partial = v1::Message::assistant(self.text.clone());
        partial.incomplete = true;
        let exchange = exchange.response(partial);
        self.finish(exchange).await
    }

    /// Drops the partial output (watchers are told with `run_discarded`)
    /// and ends the run, storing nothing.
    pub async fn discard(self) -> Result<()> {
        let request = v1::DiscardRunRequest {
            session_id: self.session_id.clone(),
            run_id: self.run_id.clone(),
        };
        self.client
            .unary("DiscardRun", request, true, |mut raw, request| async move {
                raw.discard_run(request).await
            })
            .await?;
        self.end().await
    }

    /// Takes the session's oldest waiting input (see
    /// [`Client::submit_input`]) into the history for this run
    /// (`TakeQueuedInput`): its messages are appended, in one revision
    /// that watchers see as `input_taken`, and are in the response. `None`
    /// when no input waits. The run must hold the session's lease
    /// ([`Error::LeaseNotHeld`] otherwise). Not retried: a repeat of a take
    /// that reached the server would take the next input.
    ///
    /// ```no_run
    /// # async fn demo(run: sessionstore_client::Run) -> Result<(), sessionstore_client::Error> {
    /// // Between two model calls: what did the user add meanwhile?
    /// while let Some(taken) = run.take_queued_input().await? {
    ///     for stored in &taken.messages {
    ///         let text = stored.message.as_ref().map_or("", |m| m.content.as_str());
    ///         println!("#{}: {text}", stored.sequence);
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn take_queued_input(&self) -> Result<Option<v1::TakeQueuedInputResponse>> {
        match self
            .client
            .take_queued_input(self.session_id.clone(), self.run_id.clone())
            .await
        {
            Ok(taken) => Ok(Some(taken)),
            Err(Error::QueueEmpty { .. }) => Ok(None),
            Err(other) => Err(other),
        }
    }

    /// Ends the run (`EndRun` with `take_next`), first taking the session's
    /// oldest waiting input into the history, in one transaction: watchers
    /// see `input_taken`, then `run_ended`. Answers the input taken, `None`
    /// if none waited (or the run held no lease: then nothing is taken and
    /// nothing ends). Store the run's answer first (with
    /// [`Client::append_exchange`] and the run's id); the input taken is
    /// then the next thing to answer, by the next run.
    ///
    /// Not retried, unlike the other ways to end a run: a repeat of a call
    /// whose answer was lost finds the lease freed and would answer `None`
    /// although the first call took an input. After a transient error,
    /// read the history (or watch for `input_taken`) to learn whether it
    /// did.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use sessionstore_client::{Client, Exchange};
    /// use sessionstore_client::v1::{Message, ProviderCall};
    ///
    /// # async fn demo(client: Client) -> Result<(), sessionstore_client::Error> {
    /// let run = client.begin_run("ses_1", "run_1", Duration::from_secs(60)).await?;
    /// // … generate and publish, then store the answer under the run …
    /// let answer = Exchange::new("ses_1")
    ///     .provider_call(ProviderCall::new("openai", "gpt-4o"))
    ///     .response(Message::assistant("Done."))
    ///     .run_id(run.run_id());
    /// client.append_exchange(&answer).await?;
    /// if let Some(next) = run.end_and_take_next().await? {
    ///     println!("answer {} next (position {})", next.input_id, next.position);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn end_and_take_next(self) -> Result<Option<v1::QueuedInput>> {
        if !self.leased {
            return Ok(None);
        }
        let request = v1::EndRunRequest {
            session_id: self.session_id.clone(),
            run_id: self.run_id.clone(),
            take_next: true,
        };
        let response = self
            .client
            .unary("EndRun", request, false, |mut raw, request| async move {
                raw.end_run(request).await
            })
            .await?;
        Ok(response.taken_input)
    }

    async fn end(&self) -> Result<()> {
        if !self.leased {
            return Ok(());
        }
        let request = v1::EndRunRequest {
            session_id: self.session_id.clone(),
            run_id: self.run_id.clone(),
            take_next: false,
        };
        self.client
            .unary("EndRun", request, true, |mut raw, request| async move {
                raw.end_run(request).await
            })
            .await?;
        Ok(())
    }
}
