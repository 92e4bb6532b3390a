//! AppendExchange on the general path: the steps a bulk run defers, then
//! the decider.

use super::{AppendExchange, Appended, Dialect, Tx, Write};
use crate::domain::exchange::diff_full_history;
use crate::domain::{Change, Error, NewExchange, NewSession, Result};
use crate::store::append;
use crate::store::rows::Content;
use crate::store::text::escape;

impl Tx<'_> {
    /// The first result of an earlier request with this idempotency key, if any.
    pub(super) async fn earlier_result(
        &mut self,
        tenant: &str,
        exchange: &NewExchange,
    ) -> Result<Option<Appended>> {
        let request_id = &exchange.request_id;
        let earlier: Option<(Vec<u8>, i64, i64)> = sqlx::query_as(
            "SELECT fingerprint, session_key, revision FROM idempotency_keys \
             WHERE tenant = $1 AND request_id = $2",
        )
        .bind(escape(tenant))
        .bind(escape(request_id))
        .fetch_optional(&mut *self.conn)
        .await?;
        let Some((earlier_fingerprint, key, revision)) = earlier else {
            return Ok(None);
        };
        if !exchange.has_fingerprint(&earlier_fingerprint) {
            return Err(Error::IdempotencyConflict(request_id.to_owned()));
        }
        let event = self
            .logged_event(key, revision, false)
            .await?
            .ok_or_else(|| {
                Error::storage(std::io::Error::other("idempotency key without its event"))
            })?
            .decode()?;
        let Change::ExchangeAppended(mut first) = event.change else {
            return Err(Error::storage(std::io::Error::other(
                "idempotency key points at a non-append event",
            )));
        };
        first.update_time = event.time;
        first.replayed = true;
        Ok(Some((revision, first)))
    }

    /// An append on the general path: the steps a bulk run defers, then
    /// the decider ([`append::append_loaded`]), the one place the rules of
    /// an append live.
    pub(super) async fn append_exchange(
        &mut self,
        tenant: &str,
        exchange: &NewExchange,
    ) -> Result<Appended> {
        // Idempotency first: a retry gets the first result even if it would
        // now fail another check (a stale expected_next_sequence, say).
        let keyed = !exchange.request_id.is_empty();
        if keyed && let Some(first) = self.earlier_result(tenant, exchange).await? {
            return Ok(first);
        }

        let created = match &exchange.create_if_missing {
            Some(new) => {
                self.create_if_missing(tenant, &exchange.session_id, new)
                    .await?
            }
            None => false,
        };
        // Settles an expired lease first.
        let row = self.load_live(tenant, &exchange.session_id).await?;
        if self.dialect == Dialect::Postgres
            && keyed
            && let Some(first) = self.earlier_result(tenant, exchange).await?
        {
            // A concurrent retry committed while we waited for the row lock.
            return Ok(first);
        }
        let history_from = if exchange.full_history.is_empty() {
            None
        } else {
            // The lease and sequence come before the diff, as for any append.
            append::admit(&row.session, exchange)?;
            let contents: Vec<(String, Option<Vec<u8>>)> = sqlx::query_as(
                "SELECT body, wire FROM messages WHERE session_key = $1 ORDER BY sequence",
            )
            .bind(row.key)
            .fetch_all(&mut *self.conn)
            .await?;
            let stored = contents
                .iter()
                .map(|(body, wire)| Content::of(body, wire.as_deref()).message())
                .collect::<Result<Vec<_>>>()?;
            let from =
                diff_full_history(&exchange.full_history, &row.session.system_prompt, &stored)?;
            if from >= exchange.full_history.len() && exchange.provider_call.is_none() {
                return Err(Error::invalid(
                    "full_history",
                    "holds no message beyond the stored history and there is no provider_call: nothing to write",
                ));
            }
            Some(from)
        };
        if !exchange.state_changes.is_empty() {
            // The lease and sequence come before the state, as for any append.
            append::admit(&row.session, exchange)?;
            self.apply_state_changes(tenant, &row, &exchange.state_changes)
                .await?;
        }
        let loaded = append::Loaded {
            key: row.key,
            session: row.session,
        };
        let applied = append::append_loaded(
            self.conn,
            self.dialect,
            self.search,
            tenant,
            exchange,
            loaded,
            history_from,
            self.now,
        )
        .await?;
        self.events.extend(applied.events);
        let (revision, mut appended) = applied.reply;
        appended.session_created = created;
        Ok((revision, appended))
    }

    /// Creates the session `id` from `new` unless the tenant has it: whether
    /// it did. Creators of one id take turns ([`Tx::lock_session_id`]), so
    /// two first appends racing on replicas create it once.
    async fn create_if_missing(
        &mut self,
        tenant: &str,
        id: &str,
        new: &NewSession,
    ) -> Result<bool> {
        self.lock_session_id(tenant, id).await?;
        let exists: Option<i64> = sqlx::query_scalar(
            "SELECT key FROM sessions WHERE tenant = $1 AND id = $2 AND deleted = 0",
        )
        .bind(escape(tenant))
        .bind(escape(id))
        .fetch_optional(&mut *self.conn)
        .await?;
        if exists.is_some() {
            return Ok(false);
        }
        let new = NewSession {
            id: Some(id.to_owned()),
            ..new.clone()
        };
        self.create_session(tenant, new).await?;
        Ok(true)
    }
}

impl Write for AppendExchange {
    type Reply = Appended;

    async fn apply(self, tx: &mut Tx<'_>, tenant: &str) -> Result<Appended> {
        tx.append_exchange(tenant, &self.0).await
    }
}
