-- Why this exists: a subscriber may say "no more than N requests per
-- second" (`subscriptions create|update --rate-limit N [--rate-burst B]`).
-- The limit holds across every `bridge deliver` replica together, so the
-- bucket lives here, in the subscription's row, and only the delivery claim
-- moves it (under the per-subscription lock the claim already takes; see
-- internal/delivery/store/claim.go).
--
-- rate_limit: requests per second; 0 means unlimited (and the claim does
--   not touch the other three columns).
-- rate_burst: the bucket's size, at least 1 when limited: in any t seconds
--   at most rate_burst + rate_limit * t requests start.
-- rate_tokens, rate_refilled_at: the bucket as of rate_refilled_at; the
--   claim refills it by rate_limit per second since then (capped at
--   rate_burst) and takes one token per delivery it hands out.

-- +goose Up
ALTER TABLE bridge.subscriptions
  ADD COLUMN rate_limit integer NOT NULL DEFAULT 0,
  ADD COLUMN rate_burst integer NOT NULL DEFAULT 0,
  ADD COLUMN rate_tokens double precision NOT NULL DEFAULT 0,
  ADD COLUMN rate_refilled_at timestamptz NOT NULL DEFAULT now(),
  ADD CONSTRAINT subscriptions_rate_limit_check
    CHECK (rate_limit >= 0 AND rate_burst >= 0 AND (rate_limit = 0 OR rate_burst >= 1));

-- +goose Down
ALTER TABLE bridge.subscriptions
  DROP CONSTRAINT subscriptions_rate_limit_check,
  DROP COLUMN rate_limit, DROP COLUMN rate_burst, DROP COLUMN rate_tokens, DROP COLUMN rate_refilled_at;
