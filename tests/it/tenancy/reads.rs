//! ExportHistory, ListMessages, ListProviderCalls (also with the owner's
//! page tokens) and ExportTranscript on another tenant's session.

use super::*;

crate::backend_tests!(another_tenants_session_is_unknown_to_reads_and_exports);

async fn another_tenants_session_is_unknown_to_reads_and_exports(backend: Backend) {
    let mut scene = Scene::set_up(backend).await;
    let client = &mut scene.client;
    let messages_token = messages_page_token(client).await;
    let calls_token = calls_page_token(client).await;

    probe!(stream client, "ExportHistory", export_history, |id| {
        pb::ExportHistoryRequest {
            session_id: id.to_owned(),
            include_system_prompt: true,
            ..Default::default()
        }
    });
    probe!(
        stream client,
        "ExportHistory (from_summary, after_sequence, max_messages)",
        export_history,
        |id| pb::ExportHistoryRequest {
            session_id: id.to_owned(),
            include_system_prompt: false,
            from_summary: true,
            after_sequence: Some(0),
            max_messages: 1, target: None
        }
    );
    probe!(client, "ListMessages", list_messages, |id| {
        pb::ListMessagesRequest {
            session_id: id.to_owned(),
            ..Default::default()
        }
    });
    probe!(
        same_id client,
        "ListMessages (the owner's page token)",
        list_messages,
        |id| pb::ListMessagesRequest {
            session_id: id.to_owned(),
            after_sequence: None,
            page_size: 1,
            page_token: messages_token.clone(),
            ..Default::default()
        }
    );
    probe!(client, "ListProviderCalls", list_provider_calls, |id| {
        pb::ListProviderCallsRequest {
            session_id: id.to_owned(),
            ..Default::default()
        }
    });
    probe!(
        same_id client,
        "ListProviderCalls (the owner's page token)",
        list_provider_calls,
        |id| pb::ListProviderCallsRequest {
            session_id: id.to_owned(),
            page_size: 1,
            page_token: calls_token.clone(),
        }
    );
    probe!(
        stream client,
        "ExportTranscript (Markdown)",
        export_transcript,
        |id| pb::ExportTranscriptRequest {
            session_id: id.to_owned(),
            format: pb::TranscriptFormat::Markdown.into(), target: None
        }
    );
    probe!(
        stream client,
        "ExportTranscript (OpenAI JSON)",
        export_transcript,
        |id| pb::ExportTranscriptRequest {
            session_id: id.to_owned(),
            format: pb::TranscriptFormat::OpenaiJson.into(), target: None
        }
    );

    scene.assert_untouched().await;
    scene.stop().await;
}
