//! Idempotency keys of calls other than AppendExchange (CreateSession,
//! RollbackSession), whose keys its bulk path never sees: looked up first,
//! under a lock on the key, and written with the call. They share
//! AppendExchange's table and namespace (per tenant); the fingerprint names
//! the call, so one key sent to two kinds of call is a conflict. Such a key
//! is found for deletion by its session (`found_through_event = 0`, the
//! partial index), and keeps in `reply` what the event log cannot give
//! back.

use super::{Dialect, Tx};
use crate::domain::control::KeptReply;
use crate::domain::digest::RequestKey;
use crate::domain::{Error, Result};
use crate::store::text::escape;
use crate::wire;

/// A key's row: fingerprint, session key, revision, kept answer.
type KeyRow = (Vec<u8>, i64, i64, Option<Vec<u8>>);

/// What the first call with a key left.
pub(super) struct Earlier {
    pub session_key: i64,
    pub revision: i64,
    pub reply: Option<Vec<u8>>,
}

impl Tx<'_> {
    /// The first call's record of `key`, if any, once no other call with
    /// the same key can be between its lookup and its write (on
    /// PostgreSQL a transaction-scoped advisory lock on the key; SQLite
    /// has one writer). The same key with another body is a conflict.
    pub(super) async fn earlier_call(
        &mut self,
        tenant: &str,
        key: &RequestKey,
    ) -> Result<Option<Earlier>> {
        if self.dialect == Dialect::Postgres {
            sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1, 8))")
                .bind(format!(
                    "{}\u{1f}{}",
                    escape(tenant),
                    escape(&key.stored_id)
                ))
                .execute(&mut *self.conn)
                .await?;
        }
        let earlier: Option<KeyRow> = sqlx::query_as(
            "SELECT fingerprint, session_key, revision, reply FROM idempotency_keys \
             WHERE tenant = $1 AND request_id = $2",
        )
        .bind(escape(tenant))
        .bind(escape(&key.stored_id))
        .fetch_optional(&mut *self.conn)
        .await?;
        let Some((fingerprint, session_key, revision, reply)) = earlier else {
            return Ok(None);
        };
        if fingerprint != key.fingerprint {
            return Err(Error::IdempotencyConflict(key.request_id.clone()));
        }
        Ok(Some(Earlier {
            session_key,
            revision,
            reply,
        }))
    }

    /// The answer the first call with `key` kept, or `None` for a key
    /// not seen before ([`Self::earlier_call`]'s lock and conflict rules).
    pub(super) async fn kept_answer(
        &mut self,
        tenant: &str,
        key: &RequestKey,
    ) -> Result<Option<KeptReply>> {
        let Some(earlier) = self.earlier_call(tenant, key).await? else {
            return Ok(None);
        };
        let reply = earlier.reply.ok_or_else(|| {
            Error::storage(std::io::Error::other("idempotency key without its answer"))
        })?;
        wire::decode_kept(&reply).map(Some)
    }

    /// Records `key` for the call that just wrote `revision` of the
    /// session `session_key`, keeping `reply` with it.
    pub(super) async fn keep_key(
        &mut self,
        tenant: &str,
        key: &RequestKey,
        session_key: i64,
        revision: i64,
        reply: Option<Vec<u8>>,
    ) -> Result<()> {
        sqlx::query(
            "INSERT INTO idempotency_keys (tenant, request_id, session_key, fingerprint, \
             revision, found_through_event, reply) VALUES ($1, $2, $3, $4, $5, 0, $6)",
        )
        .bind(escape(tenant))
        .bind(escape(&key.stored_id))
        .bind(session_key)
        .bind(&key.fingerprint)
        .bind(revision)
        .bind(reply)
        .execute(&mut *self.conn)
        .await?;
        Ok(())
    }
}
