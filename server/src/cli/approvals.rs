//! `sessions approvals`, `sessions approve` and `sessions deny`: tool
//! approvals from the terminal (ListApprovals, DecideApproval).

use std::io::Write;

use futures_util::StreamExt as _;
use sessionstore_client::v1 as pb;
use sessionstore_client::{Client, Error as ClientError, ListApprovals};

use super::{ApprovalStateArg, ApprovalsFormat, cell, print_table, time_of};

/// An approval state as the CLI prints it: `pending`, `approved`, …
fn state_name(state: pb::ApprovalState) -> &'static str {
    match state {
        pb::ApprovalState::Pending => "pending",
        pb::ApprovalState::Approved => "approved",
        pb::ApprovalState::Denied => "denied",
        pb::ApprovalState::Expired => "expired",
        pb::ApprovalState::Unspecified => "unknown",
    }
}

/// `sessions approvals [ID]`: every matching approval, oldest first, as a
/// table or one JSON array.
pub(super) async fn list(
    client: &Client,
    session_id: Option<String>,
    state: Option<ApprovalStateArg>,
    user: Option<String>,
    format: ApprovalsFormat,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    let mut query = ListApprovals::new().page_size(1000);
    if let Some(session_id) = session_id {
        query = query.session_id(session_id);
    }
    if let Some(state) = state {
        query = query.state(state.into());
    }
    if let Some(user) = user {
        query = query.user(user);
    }
    let mut stream = client.list_approvals(query);
    let mut approvals = Vec::new();
    while let Some(approval) = stream.next().await {
        approvals.push(approval?);
    }
    match format {
        ApprovalsFormat::Json => {
            serde_json::to_writer(&mut *out, &json(&approvals))?;
            writeln!(out)?;
        }
        ApprovalsFormat::Text => {
            let mut rows = vec![[
                "ID".to_owned(),
                "SESSION".to_owned(),
                "TOOL CALL".to_owned(),
                "STATE".to_owned(),
                "TITLE".to_owned(),
                "DECIDED BY".to_owned(),
                "CREATED".to_owned(),
                "EXPIRES".to_owned(),
            ]];
            rows.extend(approvals.iter().map(|a| {
                [
                    a.approval_id.clone(),
                    a.session_id.clone(),
                    a.tool_call_id.clone(),
                    state_name(a.state()).to_owned(),
                    cell(&a.title, 40),
                    cell(&a.decided_by, 20),
                    time_of(a.create_time.as_ref()),
                    time_of(a.expire_time.as_ref()),
                ]
            }));
            print_table(out, &rows, &[])?;
            if approvals.is_empty() {
                writeln!(out, "(no approvals)")?;
            }
        }
    }
    out.flush()?;
    Ok(())
}

/// The approvals as JSON: each one's fields by name, the state as the CLI
/// names it, times RFC 3339 (null when unset), `detail_json` verbatim as a
/// string.
fn json(approvals: &[pb::Approval]) -> serde_json::Value {
    let time = |t: Option<&prost_types::Timestamp>| t.map(|t| time_of(Some(t)));
    approvals
        .iter()
        .map(|a| {
            serde_json::json!({
                "approval_id": a.approval_id,
                "session_id": a.session_id,
                "run_id": a.run_id,
                "tool_call_id": a.tool_call_id,
                "title": a.title,
                "detail_json": a.detail_json,
                "state": state_name(a.state()),
                "decided_by": a.decided_by,
                "reason": a.reason,
                "create_time": time(a.create_time.as_ref()),
                "decide_time": time(a.decide_time.as_ref()),
                "expire_time": time(a.expire_time.as_ref()),
            })
        })
        .collect()
}

/// `sessions approve` and `sessions deny`: one decision, said in one line.
/// An approval decided before says how and by whom.
pub(super) async fn decide(
    client: &Client,
    session_id: &str,
    approval_id: &str,
    decision: pb::ApprovalDecision,
    reason: String,
    decided_by: String,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    let decided = match client
        .decide_approval(session_id, approval_id, decision, reason, decided_by)
        .await
    {
        Ok(decided) => decided,
        Err(ClientError::ApprovalAlreadyDecided {
            state, decided_by, ..
        }) => {
            let by = if decided_by.is_empty() {
                String::new()
            } else {
                format!(" by {decided_by}")
            };
            anyhow::bail!(
                "approval {approval_id} of {session_id} was already {}{by}",
                state_name(state)
            );
        }
        Err(error) => return Err(error.into()),
    };
    let done = match decision {
        pb::ApprovalDecision::Deny => "denied",
        _ => "approved",
    };
    write!(
        out,
        "{done} {approval_id} of {session_id} (revision {}",
        decided.revision
    )?;
    if let Some(result) = &decided.tool_result {
        write!(out, "; tool result stored at sequence {}", result.sequence)?;
    }
    writeln!(out, ")")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_keeps_every_field_and_nulls_unset_times() {
        let approval = pb::Approval {
            approval_id: "apr_1".into(),
            session_id: "ses_1".into(),
            tool_call_id: "call_1".into(),
            detail_json: "{ \"n\" : 1 }".into(),
            state: pb::ApprovalState::Pending.into(),
            create_time: Some(prost_types::Timestamp {
                seconds: 86_400,
                nanos: 0,
            }),
            ..Default::default()
        };
        let value = json(&[approval]);
        assert_eq!(value[0]["state"], "pending");
        assert_eq!(value[0]["detail_json"], "{ \"n\" : 1 }");
        assert_eq!(value[0]["decide_time"], serde_json::Value::Null);
        assert!(
            value[0]["create_time"]
                .as_str()
                .is_some_and(|t| t.starts_with("1970-01-02T00:00:00"))
        );
    }
}
