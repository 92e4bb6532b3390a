//! `sessions watch`: one line per event.

use std::io::Write;

use futures_util::StreamExt as _;
use sessionstore_client::Client;
use sessionstore_client::v1 as pb;

use super::{cell, colour, paint, role_colour};
use crate::wire;

/// One line per event: revision, kind and a short summary.
pub(super) async fn watch(
    client: &Client,
    id: &str,
    after_revision: i64,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    use pb::session_event::Event;
    let on = colour();
    // The partial output of runs still open when it catches up, too.
    let mut events = client.watch_with(pb::WatchSessionRequest {
        session_id: id.to_owned(),
        after_revision,
        include_active_deltas: true,
        ..Default::default()
    });
    // The run whose text is being written on the current line, as it streams.
    let mut streaming: Option<String> = None;
    let mut connected = events.connected();
    let mut was_connected = false;
    loop {
        let event = tokio::select! {
            event = events.next() => event,
            Ok(()) = connected.changed() => {
                let now = *connected.borrow_and_update();
                let mut stderr = std::io::stderr();
                if was_connected && !now {
                    let _ = writeln!(stderr, "reconnecting… (the server went away; Ctrl-C to stop)");
                } else if now && events.reconnects() > 0 {
                    let last = events.last_revision();
                    let _ = writeln!(stderr, "reconnected: carrying on after revision {last}");
                }
                was_connected = now;
                continue;
            }
        };
        let Some(event) = event else { break };
        let event = event?;
        let revision = event.revision;
        let Some(kind) = event.event else { continue };
        if let Event::Delta(delta) = &kind
            && let Some(pb::delta::Delta::Text(text)) = &delta.delta
        {
            // Text streams onto one line per run, as it arrives.
            if streaming.as_deref() != Some(delta.run_id.as_str()) {
                if streaming.is_some() {
                    writeln!(out)?;
                }
                write!(out, "{revision:>6}  delta  {}: ", delta.run_id)?;
                streaming = Some(delta.run_id.clone());
            }
            write!(out, "{}", text.replace('\n', " "))?;
            out.flush()?;
            continue;
        }
        if streaming.take().is_some() {
            writeln!(out)?;
        }
        let (name, detail) = match kind {
            Event::SessionCreated(created) => (
                "session_created",
                summarize(
                    on,
                    created.messages.iter().filter_map(|m| m.message.as_ref()),
                ),
            ),
            Event::ExchangeAppended(appended) => (
                "exchange_appended",
                summarize(
                    on,
                    appended.messages.iter().filter_map(|m| m.message.as_ref()),
                ),
            ),
            Event::SessionUpdated(updated) => (
                "session_updated",
                updated.session.map(|s| s.title).unwrap_or_default(),
            ),
            Event::SessionDeleted(_) => {
                writeln!(out, "{revision:>6}  session_deleted")?;
                out.flush()?;
                return Ok(());
            }
            Event::CaughtUp(_) => ("caught_up", String::new()),
            Event::Progress(_) => continue,
            Event::StateChanged(changed) if changed.deleted => {
                ("state_changed", format!("{} deleted", changed.key))
            }
            Event::StateChanged(changed) => (
                "state_changed",
                format!("{} = {}", changed.key, cell(&changed.value, 60)),
            ),
            Event::Delta(delta) => (
                "delta",
                format!("{} #{}: [block]", delta.run_id, delta.index),
            ),
            Event::RunCancelRequested(requested) => (
                "run_cancel_requested",
                format!("{} {}", requested.run_id, cell(&requested.reason, 60)),
            ),
            Event::ApprovalRequested(requested) => {
                let approval = requested.approval.unwrap_or_default();
                (
                    "approval_requested",
                    format!(
                        "{} {} {}",
                        approval.approval_id,
                        approval.tool_call_id,
                        cell(&approval.title, 60)
                    ),
                )
            }
            Event::ApprovalDecided(decided) => {
                let approval = decided.approval.unwrap_or_default();
                let state = approval
                    .state()
                    .as_str_name()
                    .trim_start_matches("APPROVAL_STATE_")
                    .to_lowercase();
                let mut detail = format!("{} {state}", approval.approval_id);
                if !approval.decided_by.is_empty() {
                    detail.push_str(&format!(" by {}", approval.decided_by));
                }
                if !approval.reason.is_empty() {
                    detail.push_str(&format!(": {}", cell(&approval.reason, 60)));
                }
                ("approval_decided", detail)
            }
            Event::InputQueued(queued) => {
                let input = queued.input.unwrap_or_default();
                let mut detail = format!("{} position {}", input.input_id, input.position);
                if input.mode() == pb::InputMode::Interrupt {
                    detail.push_str(" (interrupt)");
                }
                let said = summarize(on, input.messages.iter());
                ("input_queued", format!("{detail}: {said}"))
            }
            Event::InputTaken(taken) => {
                let said = summarize(on, taken.messages.iter().filter_map(|m| m.message.as_ref()));
                (
                    "input_taken",
                    format!(
                        "{} position {} by {}: {said}",
                        taken.input_id, taken.position, taken.run_id
                    ),
                )
            }
            Event::InputWithdrawn(withdrawn) => (
                "input_withdrawn",
                format!("{} position {}", withdrawn.input_id, withdrawn.position),
            ),
            other => (event_name(&other), String::new()),
        };
        writeln!(out, "{revision:>6}  {name}  {detail}")?;
        out.flush()?;
    }
    Ok(())
}

fn event_name(event: &pb::session_event::Event) -> &'static str {
    pb::SessionEvent {
        event: Some(event.clone()),
        ..Default::default()
    }
    .kind()
}

/// `user: first line … | assistant: …`
fn summarize<'a>(on: bool, messages: impl Iterator<Item = &'a pb::Message>) -> String {
    messages
        .map(|m| {
            let role = wire::message_from_pb(m.clone(), "message")
                .map(|m| m.role)
                .ok();
            let name = m
                .role()
                .as_str_name()
                .trim_start_matches("ROLE_")
                .to_lowercase();
            let label = match role {
                Some(role) => paint(on, role_colour(role), &name),
                None => name,
            };
            format!("{label}: {}", cell(&m.content, 60))
        })
        .collect::<Vec<_>>()
        .join(" | ")
}
