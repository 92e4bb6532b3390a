-- Usage that matches the bill: the billing buckets, the provider's usage
-- object and the call's wall time on each provider call; and, for
-- SummarizeUsage, each call's tenant and session owner beside it (a
-- session's owner never changes), indexed by time.
ALTER TABLE provider_calls ADD COLUMN cached_input_tokens INTEGER NOT NULL DEFAULT 0;
ALTER TABLE provider_calls ADD COLUMN cache_creation_input_tokens INTEGER NOT NULL DEFAULT 0;
ALTER TABLE provider_calls ADD COLUMN reasoning_tokens INTEGER NOT NULL DEFAULT 0;
ALTER TABLE provider_calls ADD COLUMN usage_json TEXT NOT NULL DEFAULT '';
ALTER TABLE provider_calls ADD COLUMN duration_micros INTEGER NOT NULL DEFAULT 0;
ALTER TABLE provider_calls ADD COLUMN tenant TEXT NOT NULL DEFAULT '';
ALTER TABLE provider_calls ADD COLUMN user_name TEXT NOT NULL DEFAULT '';

UPDATE provider_calls SET
    tenant = (SELECT s.tenant FROM sessions s WHERE s.key = provider_calls.session_key),
    user_name = (SELECT s.user_name FROM sessions s WHERE s.key = provider_calls.session_key);

CREATE INDEX provider_calls_by_tenant_time ON provider_calls (tenant, create_time);
CREATE INDEX provider_calls_by_user_time ON provider_calls (tenant, user_name, create_time);
